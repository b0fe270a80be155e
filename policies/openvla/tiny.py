"""Tiny Prismatic architectures and a tiny BOS-adding tokenizer built in-process: the models of
the tests (no hub, no downloads)."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from policies.openvla.configuration_openvla import (
    PrismaticArchitecture,
    VisionTowerConfig,
)
from policies.openvla.processor_openvla import encode_prompts, make_observation

#: Instructions the tiny tokenizer is trained on (LIBERO-style).
TINY_CORPUS = (
    "In: What action should the robot take to pick up the black bowl and place it on the plate?\nOut:",
    "In: What action should the robot take to open the top drawer of the cabinet?\nOut:",
    "In: What action should the robot take to put the cream cheese in the bowl?\nOut:",
    "In: What action should the robot take to turn on the stove?\nOut:",
)


def build_tiny_tokenizer(vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (``<pad>`` 0, ``<s>`` 1, ``</s>`` 2) that starts every
    sequence with ``<s>``, as Llama's does; every byte sequence encodes.

    Args:
        vocab_size: vocabulary size target (>= 259: 256 bytes and 3 special tokens).
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TINY_CORPUS, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def tiny_architecture(action_vocab_end: int, fused: bool = True, image_size: int = 28) -> PrismaticArchitecture:
    """A few-thousand-parameter Prismatic model: DINOv2 (2 registers) + SigLIP towers of width
    32/24 and depth 3 (or DINOv2 alone when not ``fused``), patch 14, and a 2-layer Llama of
    width 48 whose vocabulary is ``action_vocab_end`` rounded up to a multiple of 64 (as
    OpenVLA pads its 32000 tokens to 32064).

    Args:
        action_vocab_end: the tokenizer's vocabulary size (``len(tokenizer)``).
        fused: two towers (``dinosiglip``) or one.
        image_size: tower input side (a multiple of 14).
    """
    towers = [
        VisionTowerConfig("dinov2", image_size, 14, 32, 3, 2, 64, num_register_tokens=2),
        VisionTowerConfig("siglip", image_size, 14, 24, 3, 2, 48),
    ]
    vocab_size = -(-action_vocab_end // 64) * 64
    text_config = dict(
        vocab_size=vocab_size,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return PrismaticArchitecture(tuple(towers if fused else towers[:1]), text_config, action_vocab_end)


def tiny_observation(
    tokenizer: PreTrainedTokenizerFast,
    instructions: list[str],
    num_images: int = 1,
    image_size: int = 32,
    proprio_dim: int | None = None,
    seed: int = 0,
) -> TensorDict:
    """A random observation for the tiny models: uint8 images ``(batch, num_images, image_size,
    image_size, 3)``, encoded prompts of ``instructions`` and, if ``proprio_dim``, a standard
    normal ``(batch, proprio_dim)`` proprio state."""
    generator = torch.Generator().manual_seed(seed)
    batch = len(instructions)
    shape = (batch, num_images, image_size, image_size, 3)
    images = torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)
    input_ids, attention_mask = encode_prompts(tokenizer, instructions)
    proprio = None if proprio_dim is None else torch.randn(batch, proprio_dim, generator=generator)
    return make_observation(images, input_ids, attention_mask, proprio)


def tiny_preset(fused: bool = True, image_size: int = 28) -> tuple[PrismaticArchitecture, PreTrainedTokenizerFast]:
    """The ``"tiny"`` architecture preset (``policies.openvla.configuration_openvla.ARCHITECTURE_PRESETS``):
    :func:`tiny_architecture` sized for :func:`build_tiny_tokenizer`, and that tokenizer."""
    tokenizer = build_tiny_tokenizer()
    return tiny_architecture(len(tokenizer), fused=fused, image_size=image_size), tokenizer
