"""Checks of what a π0 policy loads: its checkpoint directory and tokenizer against its config,
shared by the policy's constructor (:class:`~policies.pi0.policy_pi0.PI0Policy`) and the run's
pre-flight (``vla_rl/preflight/``, through ``PI0Policy.check_pretrained``), so that what passes
the pre-flight loads in the workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from accelerate import init_empty_weights

from policies.checkpoint_files import FieldError, check_tokenizer, load_tokenizer
from policies.pi0.checkpoint_pi0 import check_pi0_weights, load_noise_head, read_checkpoint_config
from policies.pi0.configuration_pi0 import PI0ModelConfig, PI0PolicyConfig
from policies.pi0.flow_noise import NoiseHead
from policies.pi0.modeling_pi0 import PI0Model
from policies.pi0.transforms_pi0 import load_statistics, register_statistics


def load_checked_tokenizer(directory: str) -> Any:
    """The tokenizer of a local directory, checked to encode text (:func:`check_tokenizer`).

    Raises:
        FileNotFoundError, ValueError: no directory, or no usable tokenizer (the message names it).
    """
    tokenizer = load_tokenizer(directory)
    check_tokenizer(tokenizer, directory, chat_template=False)
    return tokenizer


def load_model_tokenizer(config: PI0PolicyConfig) -> Any:
    """The tokenizer of ``config.tokenizer_path``, else of ``config.model_path`` (checked by
    :func:`load_checked_tokenizer`).

    Raises:
        FileNotFoundError, ValueError: no directory, or no usable tokenizer; for the model
            directory the message says to set ``tokenizer_path`` (openpi's converted checkpoints
            hold no tokenizer: theirs is PaliGemma's).
    """
    if config.tokenizer_path is not None:
        return load_checked_tokenizer(config.tokenizer_path)
    try:
        return load_checked_tokenizer(str(config.model_path))
    except ValueError as error:
        raise ValueError(f"{error}; or set tokenizer_path to a directory holding the model's tokenizer "
                         "(PaliGemma's for openpi's checkpoints)") from None


def check_fit(config: PI0PolicyConfig, model: PI0ModelConfig, vocab: int) -> None:
    """The model fits the config's ``action_dim``, ``proprio_dim``, ``executed_actions`` and a
    tokenizer of ``vocab`` tokens.

    Raises:
        ValueError: the first misfit, naming the field.
    """
    if config.action_dim > model.max_action_dim:
        raise ValueError(f"PI0PolicyConfig.action_dim ({config.action_dim}) exceeds the model's max_action_dim "
                         f"({model.max_action_dim})")
    if config.proprio_dim is not None and config.proprio_dim > model.max_state_dim:
        raise ValueError(f"PI0PolicyConfig.proprio_dim ({config.proprio_dim}) exceeds the model's max_state_dim "
                         f"({model.max_state_dim})")
    if config.executed_actions is not None and model.chunk_size % config.executed_actions:
        raise ValueError(f"PI0PolicyConfig.executed_actions ({config.executed_actions}) must divide the model's "
                         f"chunk_size ({model.chunk_size})")
    if vocab > model.vocab_size:
        raise ValueError(f"the tokenizer has {vocab} tokens, more than the model's vocab_size {model.vocab_size}: "
                         "use the checkpoint's tokenizer (PI0PolicyConfig.tokenizer_path)")


def check_pretrained(config: PI0PolicyConfig) -> None:
    """Check ``config.model_path`` and ``config.tokenizer_path`` as the policy's constructor would
    load them, without reading the model's weights: the directories exist; the architecture
    (:func:`~policies.pi0.checkpoint_pi0.read_checkpoint_config`) parses; the weight files'
    safetensors headers are whole and hold every tensor of that architecture, built on the
    ``meta`` device, with its shape; the tokenizer is usable; the model fits ``action_dim``,
    ``proprio_dim``, ``executed_actions`` and the tokenizer's vocabulary; ``norm_stats.json``
    gives the statistics ``normalization`` reads; and, with ``sampler: flow_noise``, a
    ``pi0_noise_head.safetensors`` fits the noise-head settings.

    Raises:
        FileNotFoundError, ValueError: the first problem; the message names the directory or
            file. A problem of ``tokenizer_path``'s directory is a
            :class:`~policies.checkpoint_files.FieldError` with ``field="tokenizer_path"``.
    """
    tokenizer = None
    if config.tokenizer_path is not None:
        try:
            tokenizer = load_checked_tokenizer(config.tokenizer_path)
        except (OSError, ValueError) as error:
            raise FieldError(str(error), "tokenizer_path") from None
    if config.model_path is None:
        if tokenizer is not None:
            try:
                check_fit(config, config.model_config(len(tokenizer)), len(tokenizer))
            except ValueError as error:
                raise FieldError(f"{config.tokenizer_path}: {error}", "tokenizer_path") from None
        return
    directory = Path(config.model_path)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: the model directory does not exist (models load from local paths only)")
    model_config = read_checkpoint_config(directory)
    with init_empty_weights(include_buffers=False):  # as load_pi0_checkpoint builds it
        check_pi0_weights(PI0Model(model_config), directory)
    if tokenizer is None:
        tokenizer = load_model_tokenizer(config)
    try:
        check_fit(config, model_config, len(tokenizer))
        statistics = torch.nn.Module()  # the buffers the constructor fills, on a module of their own
        register_statistics(statistics, config.normalization, config.action_dim, config.proprio_dim or 0)
        load_statistics(statistics, config)
    except ValueError as error:
        message = str(error)
        raise ValueError(message if message.startswith(str(directory)) else f"{directory}: {message}") from None
    if config.sampler == "flow_noise":
        head = NoiseHead(model_config.expert.width, model_config.max_action_dim, config.noise_hidden_dims,
                         config.noise_min_std, config.noise_max_std)
        load_noise_head(head, directory, config.noise_min_std, config.noise_max_std)
