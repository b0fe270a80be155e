"""What the OpenVLA and OpenVLA-OFT policies share: building or loading the Prismatic VLM, the
action tokenizer and statistics, environment actions, LoRA and saving."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from accelerate import init_empty_weights
from accelerate.utils import set_module_tensor_to_device
from tensordict import TensorDict
from torch import Tensor

from policies.action_normalization import (
    libero_gripper_postprocess,
    libero_unnorm_key,
    load_action_statistics,
)
from policies.action_tokenizer import ActionTokenizer
from policies.base import Policy, cast_parameters
from policies.checkpoint_files import (
    FieldError,
    WeightMismatch,
    check_tokenizer,
    compare_shapes,
    find_weight_files,
    load_tokenizer,
    weight_mismatch_error,
)
from policies.image_resize import with_model_frames
from policies.normalization import ActionStatistics
from policies.openvla.checkpoint_prismatic import (
    CONFIG_FILE,
    architecture_from_config,
    checkpoint_parameter_shapes,
    read_checkpoint,
    read_config,
    read_norm_stats,
    statistics_file,
    write_checkpoint,
)
from policies.openvla.modeling_prismatic import PrismaticVLM
from policies.openvla.processor_openvla import (
    ATTENTION_MASK,
    IMAGES,
    INPUT_IDS,
    SimulatorObservationProcessor,
    encode_prompts,
)

logger = logging.getLogger(__name__)

#: Parameters of transformers modules that Prismatic checkpoints lack and the forward never uses.
_UNUSED_PARAMETERS = re.compile(r".*\.embeddings\.mask_token$")
#: Default LoRA targets: every attention and MLP projection of the decoder and the towers
#: (OpenVLA's LoRA fine-tuning adapts all linear layers).
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "out_proj", "gate_proj", "up_proj", "down_proj")


class PrismaticPolicy(Policy, abstract=True):
    """Base of the OpenVLA policies: ``self.vla`` (:class:`PrismaticVLM`), ``self.tokenizer``
    (the checkpoint's or the preset's, or None for an ``architecture`` model), ``self.action_tokenizer``
    and ``self.action_statistics`` (None: :meth:`env_actions` stays normalised).

    Dataset statistics: ``self.norm_stats`` holds every dataset's (``{unnorm_key: {"action",
    "proprio"}}``); ``self.unnorm_key`` is the policy's own dataset: ``config.unnorm_key``, else
    the checkpoint's only dataset, else (several datasets, no key) the one :meth:`use_tasks` picks
    for the run's LIBERO tasks. Until a checkpoint with several datasets has one,
    :meth:`env_actions` refuses to guess. On LIBERO with ``config.unnorm_key`` unset, each task's
    suite picks the statistics it acts with (:meth:`use_tasks`, OpenVLA-OFT's ``check_unnorm_key``).

    Observations are either the model's inputs (``images``, ``input_ids``, ``attention_mask``,
    ``proprio``; see :mod:`policies.openvla.processor_openvla`) or simulator observations
    (``state``, ``<camera>_image``, ``instruction``), which ``self.processor`` turns into model
    inputs (:meth:`model_inputs`); the engine hands over simulator observations.

    Args:
        config: an ``OpenVLAPolicyConfig`` or ``OpenVLAOFTPolicyConfig``.
        device: where the policy is built (None: the CPU): a checkpoint's weights are read
            straight onto it, one tensor at a time (a GPU worker's host never holds the model);
            what is initialised instead is built on the CPU and moved.

    Raises:
        FileNotFoundError, ValueError: the checkpoint cannot be read (see
            :func:`policies.openvla.checkpoint_prismatic.read_checkpoint`), its weights do not
            fit the architecture (unless ``config.allow_partial_load``), its tokenizer files give
            no usable tokenizer, or the statistics do not match ``config.action_dim``.
    """

    batch_invariant = False  # transformers kernels: see docs/vla_policies.md
    builds_on_device = True

    def __init__(self, config: Any, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = config
        tokenizer = None
        if config.model_path is not None:
            architecture, weights, norm_stats = read_checkpoint(config.model_path, config.allow_pickle, device)
            source = str(Path(config.model_path) / CONFIG_FILE)
            statistics_source = str(statistics_file(config.model_path))
        else:
            architecture, weights, statistics_source = config.architecture, None, "config.action_statistics"
            norm_stats = {"config": {"action": config.action_statistics}} if config.action_statistics else {}
            if isinstance(architecture, dict):  # a preset (validated by the config)
                from policies.openvla.tiny import tiny_preset

                options = {key: value for key, value in architecture.items() if key != "preset"}
                architecture, tokenizer = tiny_preset(**options)
        # With a checkpoint, the parameters are built on the meta device and the checkpoint's
        # tensors become them (no random initialisation of 7.5 B float32 values in host memory);
        # buffers are built as usual (rotary frequencies). allow_partial_load keeps the
        # initialisation of what the checkpoint lacks, so it builds everything.
        empty = weights is not None and not config.allow_partial_load
        with torch.random.fork_rng(devices=[]), (init_empty_weights(include_buffers=False) if empty else nullcontext()):
            torch.manual_seed(config.seed)
            self.vla = PrismaticVLM(architecture, config.attn_implementation)
        if weights is not None:
            self._load_vla_weights(weights, source)
            del weights  # the parameters hold the tensors now: each is freed as the cast replaces it
        # the parameters in config.dtype; the buffers (rotary frequencies, image mean/std) stay float32
        self.vla.to(device=device)
        cast_parameters(self.vla, getattr(torch, config.dtype))
        self.architecture = architecture
        self.tokenizer = tokenizer if tokenizer is not None else self._load_tokenizer(config.model_path)
        self.processor = (
            None if self.tokenizer is None
            else SimulatorObservationProcessor(self.tokenizer, config.cameras, getattr(config, "proprio_dim", None),
                                               architecture.vision_towers[0].image_size, config.image_resize,
                                               config.center_crop)
        )  # fmt: skip
        self.action_tokenizer = ActionTokenizer(architecture.action_vocab_end, architecture.n_action_bins)
        self.norm_stats = norm_stats
        self._statistics_source = statistics_source
        self.action_statistics: ActionStatistics | None = None
        self.unnorm_key: str | None = None
        key = statistics_key(config.unnorm_key if config.model_path is not None else None, norm_stats,
                             statistics_source)
        if key is not None:
            self._load_action_statistics(key)
        self.eval()

    @property
    def action_dim(self) -> int:
        """Values per action (``config.action_dim``)."""
        return self.config.action_dim

    @property
    def device(self) -> torch.device:
        return self.vla.language_model.device

    @property
    def discrete_actions(self) -> bool:
        """Whether actions are bin values (True) or continuous regression outputs."""
        return True

    def use_tasks(self, simulator: str, env_configs: Sequence[Any]) -> None:
        """Pick the dataset statistics of LIBERO tasks: with ``config.unnorm_key`` unset and a
        checkpoint's statistics, the tasks' suite picks the key (:func:`libero_unnorm_key`,
        moojink/openvla-oft ``run_libero_eval.py``'s ``check_unnorm_key``): the policy's own key
        when it has none yet, else the statistics it acts with until the next call. Nothing on
        other simulators, with an explicit ``config.unnorm_key``, without a checkpoint or without
        statistics in it (actions stay normalised).

        Args:
            simulator: the registered simulator name.
            env_configs: the tasks' typed configs (``LiberoEnvConfig``: ``suite``).

        Raises:
            ValueError: a suite's statistics are not in the checkpoint (the message lists those
                that are), or the tasks' suites pick different statistics.
        """
        if (simulator != "libero" or self.config.unnorm_key is not None or self.config.model_path is None
                or not self.norm_stats):
            return
        source = self._statistics_source
        keys = sorted({libero_unnorm_key(self.norm_stats, env.suite, source) for env in env_configs})
        if len(keys) != 1:
            raise ValueError(f"these LIBERO tasks de-normalise with different statistics of {source} ({keys}), "
                             "but one batch acts with one: set policy.config.unnorm_key, or use one suite")
        self._use_statistics(keys[0])

    def _use_statistics(self, key: str) -> None:
        """Act with dataset ``key``'s statistics (:meth:`use_tasks`); OpenVLA-OFT adds its proprio's."""
        self._load_action_statistics(key)

    def _load_action_statistics(self, key: str) -> None:
        """Act with dataset ``key``'s action statistics (it becomes the policy's own key when there is none).

        Raises:
            ValueError: ``key`` is not in ``norm_stats``, its statistics are malformed or do not
                match ``config.action_dim``.
        """
        source = self._statistics_source
        statistics = load_action_statistics(self.norm_stats, key, source)
        if statistics.action_dim != self.config.action_dim:
            raise ValueError(f"{source}: action statistics of {key!r} have {statistics.action_dim} dimensions, "
                             f"config.action_dim is {self.config.action_dim}")
        self.action_statistics = statistics
        if self.unnorm_key is None:
            self.unnorm_key = key

    def _require_statistics(self) -> None:
        """Raise when the checkpoint holds several datasets' statistics and none was picked."""
        if self.norm_stats and self.action_statistics is None:
            raise ValueError(f"{self._statistics_source} holds statistics of {sorted(self.norm_stats)}: set "
                             "policy.config.unnorm_key to one of them (on LIBERO, unset, the task's suite picks it)")

    def encode_instructions(self, instructions: list[str]) -> tuple[Tensor, Tensor]:
        """OpenVLA prompts of task instructions → ``input_ids``, ``attention_mask`` int64
        ``(batch, prompt_len)`` (see :func:`policies.openvla.processor_openvla.encode_prompts`).

        Raises:
            ValueError: the policy has no tokenizer (an ``architecture`` model: pass one's
                ids yourself), or see ``encode_prompts``.
        """
        if self.tokenizer is None:
            raise ValueError("this policy has no tokenizer (built from an architecture, or its model_path has no "
                             "tokenizer files); tokenize prompts yourself")
        return encode_prompts(self.tokenizer, instructions)

    def model_inputs(self, obs: TensorDict) -> TensorDict:
        """The model's observation TensorDict: ``obs`` itself if it holds ``input_ids``, else
        ``self.processor(obs)`` of simulator observations.

        Raises:
            ValueError: simulator observations without a tokenizer (an ``architecture`` model), or
                see :class:`~policies.openvla.processor_openvla.SimulatorObservationProcessor`.
        """
        if INPUT_IDS in obs.keys():
            return obs
        if self.processor is None:
            raise ValueError("this policy has no tokenizer (built from an architecture): give it model inputs, "
                             "or use a checkpoint or the 'tiny' preset to read simulator observations")
        return self.processor(obs)

    def model_ready_observations(self, obs: TensorDict, mask: Tensor | None = None) -> TensorDict:
        """``obs`` with each camera's frames prepared once as the model reads them: OpenVLA-OFT's
        preparation (the processor's, memoised), then, when the towers take one size, the towers'
        8-bit resize on the policy's device, as the forward pass resizes them; see
        ``Policy.model_ready_observations``. ``obs`` itself for model inputs or without a
        processor."""
        if not isinstance(obs, TensorDict) or self.processor is None or INPUT_IDS in obs.keys():
            return obs
        backbone = self.vla.vision_backbone

        def prepare(frames: Tensor) -> Tensor:  # uint8 (n, H, W, 3) -> (n, S, S, 3)
            frames = self.processor.preprocess_images(frames[:, None])[:, 0]
            if backbone.image_size is None:  # towers of different sizes: each resizes in the forward
                return frames
            return backbone.featurizer.resize(frames.to(self.device)).permute(0, 2, 3, 1).contiguous()

        return with_model_frames(obs, self.processor.cameras, prepare, mask)

    @torch.no_grad()
    def frame_features(self, frames: Tensor) -> Tensor:
        """The vision backbone's feature of each frame, patch features averaged: the
        ``frame_features`` of SRPO's ``policy_backbone`` trajectory encoder.

        Args:
            frames: uint8 ``(n, H, W, 3)`` RGB.

        Returns:
            float32 ``(n, embed_dim)`` (``embed_dim``: the towers' widths summed).
        """
        features = [self.vla.vision_backbone(frames[start:start + 256].to(self.device)).float().mean(dim=1)
                    for start in range(0, frames.shape[0], 256)]  # (b, embed_dim) each
        return torch.cat(features) if features else torch.zeros(0, self.vla.vision_backbone.embed_dim)

    def env_actions(self, actions: Tensor, obs: TensorDict | None = None) -> Tensor:
        """Policy actions → environment actions (``obs`` is not read: absolute actions).

        Bin values decode as OpenVLA's ``predict_action`` (last bin → the centre before it), are
        de-normalised with the q01/q99 statistics (dimensions with ``mask`` False pass through),
        then the gripper is post-processed (``config.gripper_postprocess == "libero"``: see
        :func:`policies.action_normalization.libero_gripper_postprocess`).

        Args:
            actions: ``(batch, chunk_size, action_dim)`` as returned by :meth:`sample_actions`.

        Returns:
            float32 ``(batch, chunk_size, action_dim)`` in the environment's units.

        Raises:
            ValueError: wrong shape, or several datasets' statistics and none picked
                (``config.unnorm_key``).
        """
        self._check_actions(actions, actions.shape[0], "actions")
        self._require_statistics()
        normalized = actions.float()
        if self.discrete_actions:
            normalized = self.action_tokenizer.decode_for_env(self.action_tokenizer.bins_from_actions(normalized))
        raw = normalized if self.action_statistics is None else self.action_statistics.denormalize(normalized)
        return libero_gripper_postprocess(raw) if self.config.gripper_postprocess == "libero" else raw

    def actions_from_env(self, env_actions: Tensor, obs: TensorDict | None = None) -> Tensor:
        """Environment actions → normalised policy actions, for demonstrations (``obs`` is not
        read): the LIBERO gripper post-processing undone (``g = (1 - g_env) / 2``, back to the
        datasets' [0, 1] with 1 open) with ``gripper_postprocess="libero"``, then
        ``ActionStatistics.normalize`` (bounds_q99) when the policy has statistics. ``bc_loss``
        tokenizes the result into bins.

        Args:
            env_actions: ``(..., action_dim)`` in the environment's units.

        Returns:
            float32, same shape.

        Raises:
            ValueError: several datasets' statistics and none picked (``config.unnorm_key``).
        """
        self._require_statistics()
        raw = env_actions.float()
        if self.config.gripper_postprocess == "libero":
            raw = raw.clone()
            raw[..., -1] = (1 - raw[..., -1]) / 2
        return raw if self.action_statistics is None else self.action_statistics.normalize(raw)

    def apply_lora(
        self, rank: int = 32, alpha: float | None = None, dropout: float = 0.0,
        target_modules: Sequence[str] | None = None, trainable_modules: Sequence[str] = (),
    ) -> list[str]:  # fmt: skip
        """Wrap the VLA's linear layers with peft LoRA adapters and train only the adapters (and
        ``trainable_modules``).

        ``peft.inject_adapter_in_model`` replaces the matching ``nn.Linear`` modules in place
        (module names keep working); every other parameter (OFT heads included, unless named in
        ``trainable_modules``) is frozen. Layers the constructor froze (the towers' unused last
        block) get no adapter and stay frozen (:func:`policies.lora.inject_lora`).

        Args:
            rank: LoRA rank (OpenVLA's fine-tuning default 32).
            alpha: LoRA scaling numerator (default ``min(rank, 16)``, OpenVLA's choice).
            dropout: dropout on the adapter input.
            target_modules: last name components of the layers to adapt, each of which must name
                a trainable linear layer; None: :data:`LORA_TARGET_MODULES`, those the VLA has.
            trainable_modules: submodules of the policy trained fully (e.g. ``proprio_projector``).

        Returns:
            names of the trainable parameters.

        Raises:
            ModuleNotFoundError: peft is not installed.
            vla_rl_core.components.ComponentConfigError: a ``target_modules`` name matches no
                trainable linear layer, or a ``trainable_modules`` entry is not a submodule (its
                ``field`` names the argument).
        """
        from policies.lora import inject_lora, set_trainable

        inject_lora(self.vla, rank, alpha, dropout, LORA_TARGET_MODULES if target_modules is None else target_modules,
                    every_target=target_modules is not None)
        return set_trainable(self, trainable_modules)

    def merge_lora(self) -> int:
        """Fold the LoRA adapters into their base layers and remove them (peft's
        ``LoraLayer.merge`` then ``get_base_layer``), e.g. before :meth:`save_pretrained`.

        Returns:
            the number of merged layers (0 without adapters).
        """
        from policies.lora import merge_lora

        return merge_lora(self.vla)

    def save_pretrained(self, out_dir: str | Path, vision_backbone_id: str | None = None) -> Path:
        """Write the VLA in the published layout (see
        :func:`policies.openvla.checkpoint_prismatic.write_checkpoint`) with the tokenizer;
        ``vision_backbone_id`` None records the published id of the towers.

        Raises:
            FileExistsError: ``out_dir`` exists.
            ValueError: LoRA adapters are injected (call :meth:`merge_lora` first), or see
                ``write_checkpoint`` (a ``vision_backbone_id`` of other towers).
        """
        return self._write_pretrained(out_dir, vision_backbone_id, self.norm_stats, {})

    def _write_pretrained(self, out_dir: str | Path, vision_backbone_id: str | None, norm_stats: dict[str, Any],
                          extra_files: dict) -> Path:
        state = self.vla.state_dict()
        if any("lora_" in name for name in state):
            raise ValueError("LoRA adapters are injected: call merge_lora() before saving in the published layout")
        return write_checkpoint(state, self.architecture, out_dir, norm_stats, vision_backbone_id, self.tokenizer,
                                extra_files=extra_files)

    def _prefix(self, obs: TensorDict, extra_tokens: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Multimodal prefix embeddings ``(batch, L, llm_dim)`` and mask ``(batch, L)``."""
        device = self.device
        return self.vla.multimodal_prefix(
            obs[IMAGES].to(device), obs[INPUT_IDS].to(device), obs[ATTENTION_MASK].to(device), extra_tokens
        )

    def _check_actions(self, actions: Tensor, batch: int, what: str) -> None:
        expected = (batch, self.chunk_size, self.action_dim)
        if tuple(actions.shape) != expected or not actions.is_floating_point():
            raise ValueError(f"{what} must be floating {expected}, got {tuple(actions.shape)} {actions.dtype}")

    def _load_vla_weights(self, weights: dict[str, Tensor], source: str) -> None:
        """Load the checkpoint's (our-named) weights, strictly unless ``config.allow_partial_load``
        (then only the tensors whose names and shapes fit; the rest keep their initialisation).
        Parameters on the meta device take the checkpoint's tensors themselves (their dtype, no
        copy); the ones Prismatic checkpoints never hold (:data:`_UNUSED_PARAMETERS`) become zeros.

        Raises:
            ValueError: names or shapes that do not fit; the message names ``source`` and the
                first few tensors.
        """
        mismatch = vla_weight_mismatch(self.vla, {name: tuple(tensor.shape) for name, tensor in weights.items()})
        if mismatch and not self.config.allow_partial_load:
            raise weight_mismatch_error(Path(source).parent, mismatch)
        if mismatch:
            logger.warning("%s: loading only the weights that fit (allow_partial_load): %s", source, mismatch.describe())
            skipped = {name for name, _, _ in mismatch.mismatched}
            weights = {name: tensor for name, tensor in weights.items() if name not in skipped}
        on_meta = any(parameter.is_meta for parameter in self.vla.parameters())
        self.vla.load_state_dict(weights, strict=False, assign=on_meta)
        device = next(iter(weights.values())).device if weights else torch.device("cpu")
        for name, parameter in list(self.vla.named_parameters()):
            if parameter.is_meta:  # only unused ones: the mismatch check above covers the others
                set_module_tensor_to_device(self.vla, name, device, value=torch.zeros(parameter.shape,
                                                                                      dtype=parameter.dtype))

    @staticmethod
    def _load_tokenizer(model_path: str | None):
        """The checkpoint's tokenizer, or None without tokenizer files (or without a checkpoint).

        Raises:
            ValueError: tokenizer files that give no usable tokenizer (named).
        """
        if model_path is None or not (Path(model_path) / "tokenizer_config.json").is_file():
            return None
        tokenizer = load_tokenizer(model_path)
        check_tokenizer(tokenizer, model_path, chat_template=False)
        return tokenizer

    @classmethod
    def meta_policy(cls, config: Any) -> PrismaticPolicy:
        """The policy ``config`` describes, built on the ``meta`` device without reading any weights
        (a ``model_path`` gives its architecture, from its ``config.json``): its module tree, on
        which :meth:`apply_lora` checks its settings as the workers' policy would.

        Raises:
            FileNotFoundError, ValueError: ``model_path``'s ``config.json`` is missing or describes
                no architecture we build.
        """
        if config.model_path is not None:
            directory = Path(config.model_path)
            architecture = architecture_from_config(read_config(directory), str(directory / CONFIG_FILE))
            config = dataclasses.replace(config, model_path=None, architecture=architecture, unnorm_key=None)
        with torch.device("meta"):
            return cls(config)

    @classmethod
    def check_pretrained(cls, config: Any, require_tokenizer: bool = True) -> None:
        """Check ``config.model_path`` as the constructor would load it, without loading weights:
        ``config.json`` parses to an architecture, the weight files exist with whole safetensors
        headers and (unless ``config.allow_partial_load``) names and shapes that fit the
        architecture, built on the ``meta`` device; with ``require_tokenizer`` (simulator
        observations need one) a usable tokenizer; an explicit ``config.unnorm_key`` names
        statistics of the checkpoint's (when it has any) of ``config.action_dim`` values. Nothing
        to check without a ``model_path``.

        Raises:
            FileNotFoundError, ValueError: the first problem; the message names the file
                (:class:`~policies.checkpoint_files.FieldError` ``unnorm_key`` or ``action_dim``
                for the statistics).
        """
        if config.model_path is None:
            return
        directory = Path(config.model_path)
        if not directory.is_dir():
            raise FileNotFoundError(f"{directory}: the model directory does not exist (models load from local "
                                    "paths only)")
        architecture = architecture_from_config(read_config(directory), str(directory / CONFIG_FILE))
        shapes = checkpoint_parameter_shapes(directory, architecture, config.allow_pickle)
        if require_tokenizer:
            tokenizer = cls._load_tokenizer(str(directory))
            if tokenizer is None:
                raise ValueError(f"{directory}: no tokenizer (tokenizer_config.json and its files): the policy "
                                 "cannot encode the task instructions of simulator observations")
        if not config.allow_partial_load:
            mismatch = vla_weight_mismatch(cls.meta_policy(config).vla, shapes)
            if mismatch:
                files = find_weight_files(directory, config.allow_pickle).files
                raise weight_mismatch_error(files[0] if len(files) == 1 else directory, mismatch)
        norm_stats, source = read_norm_stats(directory), str(statistics_file(directory))
        key = statistics_key(config.unnorm_key, norm_stats, source)  # as the constructor picks them
        if key is not None:
            try:
                statistics = load_action_statistics(norm_stats, key, source)
            except ValueError as error:
                raise FieldError(str(error), "unnorm_key") from None
            if statistics.action_dim != config.action_dim:
                raise FieldError(f"{source}: action statistics of {key!r} have {statistics.action_dim} dimensions, "
                                 f"config.action_dim is {config.action_dim}", "action_dim")


def statistics_key(unnorm_key: str | None, norm_stats: dict[str, Any], source: str) -> str | None:
    """The dataset whose action statistics a policy de-normalises with: ``unnorm_key``, else the
    only dataset of ``norm_stats`` (the constructor's own ``{"config": ...}`` for
    ``config.action_statistics``); None when several are there and none is named (on LIBERO,
    the task's suite picks one later: :meth:`PrismaticPolicy.use_tasks`) or there are none.

    Raises:
        FieldError: ``unnorm_key`` is set and ``source`` holds no statistics at all (field
            ``unnorm_key``).
    """
    if unnorm_key is not None and not norm_stats:
        raise FieldError(f"{source}: holds no action statistics, so unnorm_key {unnorm_key!r} names none; unset "
                         "policy.config.unnorm_key (actions then go to the simulator as the policy gives them)",
                         "unnorm_key")
    if unnorm_key is None and len(norm_stats) == 1:
        return next(iter(norm_stats))
    return unnorm_key


def vla_weight_mismatch(vla: PrismaticVLM, shapes: dict[str, tuple[int, ...]]) -> WeightMismatch:
    """How a checkpoint's tensors (our names -> shapes) differ from ``vla``'s parameters, the
    parameters Prismatic checkpoints never hold (:data:`_UNUSED_PARAMETERS`) left out."""
    expected = {name: tuple(tensor.shape) for name, tensor in vla.state_dict().items()}
    mismatch = compare_shapes(expected, shapes)
    return WeightMismatch(tuple(name for name in mismatch.missing if not _UNUSED_PARAMETERS.fullmatch(name)),
                          mismatch.unexpected, mismatch.mismatched)
