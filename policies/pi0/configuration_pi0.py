"""Configuration of the π0 model (Black et al. 2024, "π0: A Vision-Language-Action Flow Model for
General Robot Control", arXiv 2410.24164): a PaliGemma backbone (SigLIP vision tower, linear
projector, Gemma decoder) and a smaller Gemma "action expert" sharing its attention, trained by flow
matching. No torch import: configs stay light.

Sizes follow openpi (``src/openpi/models/gemma.py``, ``get_config``: ``gemma_2b``, ``gemma_300m``;
``src/openpi/models_pytorch/gemma_pytorch.py``, ``PaliGemmaWithExpertModel.__init__``: SigLIP
so400m/14 at 224 px with MLP width 4304, projection to 2048, vocabulary 257152;
``src/openpi/models/pi0_config.py``, ``Pi0Config``: ``action_dim`` 32, ``action_horizon`` 50,
``max_token_len`` 48) and LeRobot (``src/lerobot/policies/pi0/configuration_pi0.py``, ``PI0Config``:
``chunk_size`` 50, ``max_state_dim`` / ``max_action_dim`` 32, ``num_inference_steps`` 10, Beta(1.5, 1)
time sampling scaled by 0.999 and offset by 0.001, ``min_period`` 4e-3, ``max_period`` 4.0,
``tokenizer_max_length`` 48).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from policies.config_checks import check_seed, is_int


def _check_positive_ints(owner: str, obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if not is_int(value) or value < 1:
            raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}")


def _check_numbers(owner: str, obj: object, names: tuple[str, ...], positive: bool = True) -> None:
    """Each of ``names`` is a finite number (not a boolean), and (``positive``) above 0."""
    for name in names:
        value = getattr(obj, name)
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not number or (positive and value <= 0):
            raise ValueError(f"{owner}.{name} must be a finite number{' > 0' if positive else ''}, got {value!r}")


@dataclass
class SiglipSpec:
    """The SigLIP vision tower (transformers' ``SiglipVisionModel``, without its pooling head).

    Attributes:
        image_size: square input side in pixels (224 in π0).
        patch_size: patch side in pixels (14).
        hidden_size: ViT width (1152 for so400m).
        num_layers: ViT depth (27).
        num_heads: attention heads (16).
        intermediate_size: MLP width (4304).
        layer_norm_eps: LayerNorm epsilon (1e-6).
    """

    image_size: int = 224
    patch_size: int = 14
    hidden_size: int = 1152
    num_layers: int = 27
    num_heads: int = 16
    intermediate_size: int = 4304
    layer_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        """Raises:
            ValueError: a size is not a positive int, the width is not a multiple of the heads,
                or the image is smaller than a patch."""
        _check_positive_ints("SiglipSpec", self, ("image_size", "patch_size", "hidden_size", "num_layers",
                                                  "num_heads", "intermediate_size"))
        _check_numbers("SiglipSpec", self, ("layer_norm_eps",))
        if self.hidden_size % self.num_heads:
            raise ValueError(f"SiglipSpec.hidden_size ({self.hidden_size}) must be a multiple of num_heads "
                             f"({self.num_heads})")
        if self.image_size < self.patch_size:
            raise ValueError(f"SiglipSpec.image_size ({self.image_size}) must be at least patch_size "
                             f"({self.patch_size})")

    @property
    def num_patches(self) -> int:
        """Image tokens per camera: ``(image_size // patch_size) ** 2`` (256 at 224 px, patch 14)."""
        return (self.image_size // self.patch_size) ** 2


@dataclass
class GemmaSpec:
    """One Gemma decoder stack (openpi's ``gemma.Config``).

    Attributes:
        width: hidden size (``hidden_size``).
        depth: number of decoder layers.
        mlp_dim: gated-GELU MLP width (``intermediate_size``).
        num_heads: query heads.
        num_kv_heads: key/value heads (multi-query attention: 1).
        head_dim: per-head width (256; not ``width / num_heads`` in Gemma).
        rms_norm_eps: RMSNorm epsilon (1e-6).
        rope_theta: rotary base (10000).
    """

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0

    def __post_init__(self) -> None:
        """Raises:
            ValueError: a size is not a positive int, or the heads do not group."""
        _check_positive_ints("GemmaSpec", self, ("width", "depth", "mlp_dim", "num_heads", "num_kv_heads", "head_dim"))
        _check_numbers("GemmaSpec", self, ("rms_norm_eps", "rope_theta"))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"GemmaSpec.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                             f"({self.num_kv_heads})")


#: openpi's Gemma variants (``src/openpi/models/gemma.py``, ``get_config``). Its ``*_lora`` variants
#: (the low-memory fine-tuning configs, e.g. ``pi0_libero_low_mem_finetune``) have the same sizes;
#: their LoRA adapters are openpi's training setting, not part of this architecture (a checkpoint
#: still holding adapter tensors is refused by the weight check, naming them).
GEMMA_VARIANTS: dict[str, dict[str, int]] = {
    "gemma_2b": {"width": 2048, "depth": 18, "mlp_dim": 16_384, "num_heads": 8, "num_kv_heads": 1, "head_dim": 256},
    "gemma_300m": {"width": 1024, "depth": 18, "mlp_dim": 4096, "num_heads": 8, "num_kv_heads": 1, "head_dim": 256},
}
GEMMA_VARIANTS.update({f"{name}_lora": sizes for name, sizes in list(GEMMA_VARIANTS.items())})
#: PaliGemma's vocabulary (openpi ``gemma.PALIGEMMA_VOCAB_SIZE``).
PALIGEMMA_VOCAB_SIZE = 257_152


@dataclass
class PI0ModelConfig:
    """The π0 model: PaliGemma (``vision`` → projector → ``vlm``) plus the action ``expert``.

    The expert shares the backbone's attention in every layer, so both stacks must have the same
    depth, heads, key/value heads and head width (openpi's ``PaliGemmaWithExpertModel`` concatenates
    their queries, keys and values per layer).

    Attributes:
        vision: the SigLIP tower (a :class:`SiglipSpec` or its dict).
        vlm: the PaliGemma language model (a :class:`GemmaSpec`, its dict, or a name of
            ``GEMMA_VARIANTS``: ``"gemma_2b"``).
        expert: the action expert (same forms; ``"gemma_300m"``).
        vocab_size: language vocabulary (PaliGemma: 257152).
        chunk_size: actions per chunk (openpi ``action_horizon``: 50).
        max_state_dim: state features, zero-padded to this width (32).
        max_action_dim: action features, zero-padded to this width (32).
        num_steps: Euler steps of the deterministic sampler (10).
        tokenizer_max_length: prompt tokens (openpi ``max_token_len``: 48 for π0).
        min_period, max_period: periods of the sinusoidal time embedding (4e-3, 4.0).
        time_beta_alpha: training times are ``Beta(time_beta_alpha, 1) * time_scale + time_offset``
            (openpi ``PI0Pytorch.sample_time``: Beta(1.5, 1) * 0.999 + 0.001).
        time_scale, time_offset: see ``time_beta_alpha``.
    """

    vision: SiglipSpec | dict[str, Any] = dataclasses.field(default_factory=SiglipSpec)
    vlm: GemmaSpec | dict[str, Any] | str = "gemma_2b"
    expert: GemmaSpec | dict[str, Any] | str = "gemma_300m"
    vocab_size: int = PALIGEMMA_VOCAB_SIZE
    chunk_size: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    num_steps: int = 10
    tokenizer_max_length: int = 48
    min_period: float = 4e-3
    max_period: float = 4.0
    time_beta_alpha: float = 1.5
    time_scale: float = 0.999
    time_offset: float = 0.001

    def __post_init__(self) -> None:
        """Convert dicts and variant names, and validate.

        Raises:
            ValueError: a field has an invalid value; the message says how to fix it.
        """
        if isinstance(self.vision, dict):
            self.vision = _spec(SiglipSpec, "PI0ModelConfig.vision", self.vision)
        self.vlm = _gemma_spec("vlm", self.vlm)
        self.expert = _gemma_spec("expert", self.expert)
        _check_positive_ints("PI0ModelConfig", self, ("vocab_size", "chunk_size", "max_state_dim", "max_action_dim",
                                                      "num_steps", "tokenizer_max_length"))
        _check_numbers("PI0ModelConfig", self, ("min_period", "max_period", "time_beta_alpha", "time_scale"))
        _check_numbers("PI0ModelConfig", self, ("time_offset",), positive=False)
        for name in ("depth", "num_heads", "num_kv_heads", "head_dim"):
            if getattr(self.vlm, name) != getattr(self.expert, name):
                raise ValueError(
                    f"PI0ModelConfig: the expert's {name} ({getattr(self.expert, name)}) must equal the vlm's "
                    f"({getattr(self.vlm, name)}): both stacks attend jointly in every layer"
                )
        if self.expert.width % 2:
            raise ValueError(f"PI0ModelConfig.expert.width ({self.expert.width}) must be even: the sinusoidal "
                             "time embedding has a sine and a cosine half")
        if not 0 < self.min_period < self.max_period:
            raise ValueError(f"PI0ModelConfig needs 0 < min_period < max_period, got {self.min_period}, "
                             f"{self.max_period}")
        if self.time_beta_alpha <= 0:
            raise ValueError(f"PI0ModelConfig.time_beta_alpha must be > 0, got {self.time_beta_alpha}")
        if not (self.time_scale > 0 and self.time_offset >= 0 and self.time_scale + self.time_offset <= 1):
            raise ValueError("PI0ModelConfig needs time_scale > 0, time_offset >= 0 and time_scale + time_offset "
                             f"<= 1 (training times in (0, 1]), got {self.time_scale}, {self.time_offset}")

    @property
    def num_image_tokens(self) -> int:
        """Prefix tokens per camera image (``vision.num_patches``)."""
        return self.vision.num_patches


def _spec(spec_class: type, field: str, settings: dict[str, Any]) -> Any:
    """``spec_class(**settings)``, an unknown or missing setting a ValueError naming ``field`` (a
    TypeError went through pydantic's validation as a traceback)."""
    try:
        return spec_class(**settings)
    except TypeError as error:
        raise ValueError(f"{field}: {error} (its settings: {', '.join(f.name for f in dataclasses.fields(spec_class))})"
                         ) from None


def _gemma_spec(field: str, value: GemmaSpec | dict[str, Any] | str) -> GemmaSpec:
    if isinstance(value, GemmaSpec):
        return value
    if isinstance(value, dict):
        return _spec(GemmaSpec, f"PI0ModelConfig.{field}", value)
    if isinstance(value, str) and value in GEMMA_VARIANTS:
        return GemmaSpec(**GEMMA_VARIANTS[value])
    raise ValueError(f"PI0ModelConfig.{field} must be a GemmaSpec, its dict, or one of {sorted(GEMMA_VARIANTS)}, "
                     f"got {value!r}")


def tiny_pi0_config(**overrides: Any) -> PI0ModelConfig:
    """A ~150k-parameter π0 for tests and CPU runs: SigLIP of width 32 and depth 2 on 28 px images
    (patch 14: 4 tokens per camera), a 2-layer Gemma of width 64 (4 heads, 1 key/value head, head
    width 16, vocabulary 256) and a 2-layer expert of width 32 with the same heads; chunks of 4
    actions of 5 values, states of 6 values (distinct sizes, so that a swapped dimension fails
    loudly), 3 Euler steps, prompts of 8 tokens.

    Args:
        overrides: fields of :class:`PI0ModelConfig` to change.
    """
    fields: dict[str, Any] = {
        "vision": SiglipSpec(image_size=28, patch_size=14, hidden_size=32, num_layers=2, num_heads=2,
                             intermediate_size=64),
        "vlm": GemmaSpec(width=64, depth=2, mlp_dim=128, num_heads=4, num_kv_heads=1, head_dim=16),
        "expert": GemmaSpec(width=32, depth=2, mlp_dim=64, num_heads=4, num_kv_heads=1, head_dim=16),
        "vocab_size": 256,
        "chunk_size": 4,
        "max_state_dim": 6,
        "max_action_dim": 5,
        "num_steps": 3,
        "tokenizer_max_length": 8,
    }
    fields.update(overrides)
    return PI0ModelConfig(**fields)


#: Built-in model presets: ``"pi0"`` (PaliGemma 3B + Gemma 300M expert, the published π0) and
#: ``"tiny"`` (:func:`tiny_pi0_config`).
MODEL_PRESETS = ("pi0", "tiny")


def pi0_model_preset(name: str, **overrides: Any) -> PI0ModelConfig:
    """The config of a built-in preset (``MODEL_PRESETS``), with fields overridden.

    Raises:
        ValueError: an unknown preset (the message lists the known ones).
    """
    if name == "pi0":
        return PI0ModelConfig(**overrides)
    if name == "tiny":
        return tiny_pi0_config(**overrides)
    raise ValueError(f"unknown π0 model preset {name!r}; use one of {MODEL_PRESETS}")


# --------------------------------------------------------------------------------------- the RL policy
#: Stochastic samplers of the RL policy (:mod:`policies.pi0.flow_sampling`): πRL's Flow-SDE and
#: Flow-Noise. Greedy actions always come from the deterministic ODE.
SAMPLERS = ("flow_sde", "flow_noise")
#: Which denoising steps are stochastic (see ``PI0PolicyConfig.stochastic_steps``).
STOCHASTIC_STEPS = ("all",)
#: Parameter dtypes of the model (the noise head and the log-probs stay float32).
POLICY_DTYPES = ("float32", "bfloat16", "float16")
#: Gripper post-processing of environment actions (as OpenVLA's policies).
POLICY_GRIPPER_POSTPROCESS = ("none", "libero")
#: Normalisation of the state and actions (see ``PI0PolicyConfig.normalization``).
NORMALIZATIONS = ("bounds_q99", "mean_std")
#: The statistics each normalisation reads (required keys; ``bounds_q99`` also takes a ``mask``).
NORMALIZATION_FIELDS = {"bounds_q99": ("q01", "q99"), "mean_std": ("mean", "std")}
#: Default prompt length of the ``"tiny"`` preset inside the policy (the model preset's 8 tokens are
#: too few for a tokenised instruction).
TINY_POLICY_PROMPT_TOKENS = 48


@dataclass
class PI0PolicyConfig:
    """Settings of :class:`policies.pi0.policy_pi0.PI0Policy`, π0 as an RL policy.

    Give exactly one of ``model_path`` and ``architecture``.

    Attributes:
        model_path: a local π0 checkpoint directory (openpi's or LeRobot's PyTorch layout, read by
            :func:`policies.pi0.checkpoint_pi0.load_pi0_checkpoint`; never a hub id). Its
            ``norm_stats.json`` (openpi's ``{"norm_stats": {"actions": {"mean", "std", "q01",
            "q99"}, "state": {...}}}``), when present, gives the statistics the config leaves unset
            (those ``normalization`` reads); its ``pi0_noise_head.safetensors`` (written by
            ``PI0Policy.save_pretrained`` / ``vla-rl export`` of a Flow-Noise policy), when
            present, gives the noise head of ``sampler: flow_noise``.
        architecture: the model to build with random weights: a :class:`PI0ModelConfig`, its
            dict, a preset name of ``MODEL_PRESETS`` (``"tiny"``) or ``{"preset": name,
            <PI0ModelConfig field>: value, ...}``. The ``"tiny"`` preset brings the in-process
            tiny tokenizer (:func:`policies.openvla.tiny.build_tiny_tokenizer`); unless given, its
            ``vocab_size`` becomes the tokenizer's vocabulary rounded up to a multiple of 64 and
            its ``tokenizer_max_length`` ``TINY_POLICY_PROMPT_TOKENS``.
        tokenizer_path: a local directory with the tokenizer files (PaliGemma's for a real
            checkpoint); default ``model_path``. Not used by the ``"tiny"`` preset; another
            ``architecture`` needs it.
        action_dim: the environment's values per action (7 for LIBERO), the first ``action_dim``
            of the model's ``max_action_dim``; only these are executed and scored.
        executed_actions: actions of the model's chunk executed per decision (openpi's LIBERO
            ``replan_steps``: 5 of 50; RLinf's ``action_chunk`` / ``num_action_chunks``): the
            policy's ``chunk_size``. The own actions still hold the whole model chunk's chains
            (packed, see :mod:`policies.pi0.policy_pi0`); only the executed positions are scored.
            Must divide the model's ``chunk_size``. None: the whole model chunk.
        proprio_dim: leading state features given to the model (normalised with the proprio
            statistics, zero-padded to ``max_state_dim``); None: the state token reads zeros.
        cameras: simulator cameras of the model's images, in order (``"<camera>_image"`` entries).
        sampler: one of ``SAMPLERS``: ``"flow_sde"`` (πRL's Flow-SDE, noise ``noise_level``) or
            ``"flow_noise"`` (Flow-Noise: a learned noise head on the action expert's features,
            stds in ``[noise_min_std, noise_max_std]``).
        noise_level: Flow-SDE's ``a`` (> 0; RLinf's default 0.5).
        stochastic_steps: ``"all"``: every denoising step is stochastic and scored. RLinf's
            ``"one"`` (a single drawn step per chain) is refused: the stored chain does not say
            which step was drawn, so its log-probs could not be recomputed exactly.
        noise_min_std, noise_max_std: Flow-Noise's std bounds (RLinf: 0.08, 0.16).
        noise_hidden_dims: Flow-Noise's noise-head hidden sizes (RLinf: ``(128, 64)``).
        num_steps: denoising steps of every sampler; default the model's ``num_steps``.
        temperature: > 0, scales the std of every stochastic transition (means unchanged) when
            sampling and scoring; 1 is the sampler's own distribution.
        normalization: one of ``NORMALIZATIONS``, of the state and the actions:
            ``"bounds_q99"`` (OpenVLA's: ``clip(2 (x - q01) / (q99 - q01 + 1e-8) - 1, -1, 1)`` where
            the action mask is True, :class:`policies.normalization.ActionStatistics`) or
            ``"mean_std"`` (openpi's for π0: ``(x - mean) / (std + 1e-6)`` on every feature, no
            clipping, :class:`policies.normalization.MeanStdStatistics`; openpi's π0
            checkpoints need it).
        action_statistics: the statistics ``normalization`` reads, lists of length ``action_dim``:
            ``{"q01", "q99"}`` (and optionally ``"mask"``) for bounds_q99, ``{"mean", "std"}`` for
            mean_std; None (and none in the checkpoint): actions stay in the simulator's units.
        proprio_statistics: the same for the ``proprio_dim`` state features (no mask); None:
            unset until the checkpoint's or ``fit_observation_normalization`` sets them (raw state
            until then).
        delta_action_mask: openpi's ``DeltaActions`` mask (``make_bool_mask(6, -1)`` is six true
            then one false; ``pi0_libero``'s ``extra_delta_transform``): the model's action value
            ``i < len(mask)`` with ``mask[i]`` True is relative to the raw state's value ``i`` (the
            observation's first ``proprio_dim`` features, not normalised); ``env_actions`` adds the
            state back after de-normalising, ``actions_from_env`` subtracts it before normalising.
            Needs ``len(mask) <= action_dim`` and ``<= proprio_dim``. None: absolute actions.
        gripper_postprocess: one of ``POLICY_GRIPPER_POSTPROCESS`` (``"libero"``: OpenVLA's LIBERO
            gripper handling after de-normalisation; robosuite: ``"none"``).
        dtype: parameter dtype of the model (``POLICY_DTYPES``).
        seed: seed of the random initialisation (model and noise head).
    """

    model_path: str | None = None
    # dict first: a template's mapping stays a dict (PI0ModelConfig's fields all have defaults, so
    # pydantic would otherwise turn {preset: tiny, ...} into the full-size model, dropping 'preset').
    architecture: dict[str, Any] | PI0ModelConfig | str | None = None
    tokenizer_path: str | None = None
    action_dim: int = 7
    executed_actions: int | None = None
    proprio_dim: int | None = None
    cameras: tuple[str, ...] = ("agentview",)
    sampler: str = "flow_sde"
    noise_level: float = 0.5
    stochastic_steps: str = "all"
    noise_min_std: float = 0.08
    noise_max_std: float = 0.16
    noise_hidden_dims: tuple[int, ...] = (128, 64)
    num_steps: int | None = None
    temperature: float = 1.0
    normalization: str = "bounds_q99"
    action_statistics: dict[str, list] | None = None
    proprio_statistics: dict[str, list] | None = None
    delta_action_mask: tuple[bool, ...] | None = None
    gripper_postprocess: str = "none"
    dtype: str = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        """Validate the fields (and the architecture against ``action_dim`` / ``proprio_dim``).

        Raises:
            ValueError: a field has an invalid value; the message names it and says how to fix it.
        """
        owner = "PI0PolicyConfig"
        if (self.model_path is None) == (self.architecture is None):
            raise ValueError(f"{owner}: give exactly one of model_path (a local checkpoint) and architecture"
                             + ("; both are set: set architecture to null to load model_path"
                                if self.model_path is not None else ""))
        for name in ("model_path", "tokenizer_path"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{owner}.{name} must be a local directory, got {value!r}")
        if isinstance(self.architecture, str):
            self.architecture = {"preset": self.architecture}
        model = self.model_config()
        if self.architecture is not None and not self.is_tiny_preset and self.tokenizer_path is None:
            raise ValueError(f"{owner}.tokenizer_path is needed with an architecture other than the 'tiny' preset "
                             "(a local directory with the tokenizer files)")
        _check_positive_ints(owner, self, ("action_dim",))
        if self.proprio_dim is not None:
            _check_positive_ints(owner, self, ("proprio_dim",))
        if model is not None and self.action_dim > model.max_action_dim:
            raise ValueError(f"{owner}.action_dim ({self.action_dim}) must be at most the model's max_action_dim "
                             f"({model.max_action_dim})")
        if model is not None and self.proprio_dim is not None and self.proprio_dim > model.max_state_dim:
            raise ValueError(f"{owner}.proprio_dim ({self.proprio_dim}) must be at most the model's max_state_dim "
                             f"({model.max_state_dim})")
        if isinstance(self.cameras, str) or not self.cameras or not all(isinstance(c, str) and c for c in self.cameras) \
                or len(set(self.cameras)) != len(self.cameras):
            raise ValueError(f"{owner}.cameras must be a non-empty list of distinct camera names such as "
                             f"['agentview'], got {self.cameras!r}")
        self.cameras = tuple(self.cameras)
        if self.sampler not in SAMPLERS:
            raise ValueError(f"{owner}.sampler {self.sampler!r} is unknown; use one of {SAMPLERS} (greedy actions "
                             "come from the ODE)")
        if self.stochastic_steps not in STOCHASTIC_STEPS:
            raise ValueError(f"{owner}.stochastic_steps {self.stochastic_steps!r} is not supported; use 'all' (a "
                             "stored chain does not record which single step 'one' made stochastic, so its "
                             "log-probs could not be recomputed exactly)")
        for name in ("noise_level", "temperature", "noise_min_std", "noise_max_std"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                raise ValueError(f"{owner}.{name} must be a finite number > 0, got {value!r}")
        if not self.noise_min_std < self.noise_max_std:
            raise ValueError(f"{owner} needs noise_min_std < noise_max_std, got {self.noise_min_std}, "
                             f"{self.noise_max_std}")
        dims = self.noise_hidden_dims
        if isinstance(dims, (str, int)) or not all(is_int(h) and h >= 1 for h in dims):
            raise ValueError(f"{owner}.noise_hidden_dims must be a list of positive ints, got {self.noise_hidden_dims!r}")
        self.noise_hidden_dims = tuple(self.noise_hidden_dims)
        if self.num_steps is not None:
            _check_positive_ints(owner, self, ("num_steps",))
        if self.executed_actions is not None:
            _check_positive_ints(owner, self, ("executed_actions",))
            if model is not None and model.chunk_size % self.executed_actions:
                raise ValueError(f"{owner}.executed_actions ({self.executed_actions}) must divide the model's chunk_size "
                                 f"({model.chunk_size}): the own actions pack the model chunk's positions into "
                                 "executed_actions slots")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"{owner}.normalization {self.normalization!r} is unknown; use one of {NORMALIZATIONS} "
                             "(openpi's π0 checkpoints: mean_std)")
        fields = NORMALIZATION_FIELDS[self.normalization]
        for name, length in (("action_statistics", self.action_dim), ("proprio_statistics", self.proprio_dim)):
            stats = getattr(self, name)
            if stats is None:
                continue
            if length is None:
                raise ValueError(f"{owner}.{name} needs proprio_dim (statistics of which features?)")
            if not isinstance(stats, dict) or any(len(stats.get(key, ())) != length for key in fields):
                optional = " (and optionally mask)" if self.normalization == "bounds_q99" else ""
                raise ValueError(f"{owner}.{name} must be a dict with {' and '.join(fields)}{optional} lists of "
                                 f"length {length} (normalization: {self.normalization}), got {stats!r}")
        if self.delta_action_mask is not None:
            mask = self.delta_action_mask
            if isinstance(mask, (str, bool)) or not isinstance(mask, (list, tuple)) or not mask \
                    or not all(isinstance(flag, bool) for flag in mask):
                raise ValueError(f"{owner}.delta_action_mask must be a non-empty list of booleans (openpi's "
                                 f"make_bool_mask(6, -1): six true then false) or null, got {mask!r}")
            if len(mask) > self.action_dim or self.proprio_dim is None or len(mask) > self.proprio_dim:
                raise ValueError(f"{owner}.delta_action_mask has {len(mask)} values: it needs at most action_dim "
                                 f"({self.action_dim}) and proprio_dim ({self.proprio_dim}) values (the actions are "
                                 "relative to the state's first values)")
            self.delta_action_mask = tuple(mask)
        if self.gripper_postprocess not in POLICY_GRIPPER_POSTPROCESS:
            raise ValueError(f"{owner}.gripper_postprocess must be one of {POLICY_GRIPPER_POSTPROCESS}, got "
                             f"{self.gripper_postprocess!r}")
        if self.dtype not in POLICY_DTYPES:
            raise ValueError(f"{owner}.dtype {self.dtype!r} is unknown; use one of {POLICY_DTYPES}")
        check_seed(owner, self.seed)

    @property
    def is_tiny_preset(self) -> bool:
        """Whether ``architecture`` is the ``"tiny"`` preset (which brings its tokenizer)."""
        return isinstance(self.architecture, dict) and self.architecture.get("preset") == "tiny"

    def model_config(self, tokenizer_vocab: int | None = None) -> PI0ModelConfig | None:
        """The :class:`PI0ModelConfig` of ``architecture`` (None with ``model_path``: the
        checkpoint's own).

        Args:
            tokenizer_vocab: the tiny tokenizer's vocabulary size, which sizes the tiny preset's
                ``vocab_size`` unless the preset overrides it.

        Raises:
            ValueError: an unknown preset or field (the message names ``architecture``).
        """
        architecture = self.architecture
        if architecture is None or isinstance(architecture, PI0ModelConfig):
            return architecture
        if not isinstance(architecture, dict):
            raise ValueError(f"PI0PolicyConfig.architecture must be a PI0ModelConfig, its dict, a preset name of "  # noqa: TRY004
                             f"{MODEL_PRESETS} or {{'preset': name, ...}}, got {architecture!r}")
        options = {key: value for key, value in architecture.items() if key != "preset"}
        try:
            if "preset" not in architecture:
                return PI0ModelConfig(**options)
            if architecture["preset"] == "tiny":
                options.setdefault("tokenizer_max_length", TINY_POLICY_PROMPT_TOKENS)
                if tokenizer_vocab is not None:
                    options.setdefault("vocab_size", -(-tokenizer_vocab // 64) * 64)
            return pi0_model_preset(architecture["preset"], **options)
        except TypeError as error:
            raise ValueError(f"PI0PolicyConfig.architecture: {error}") from None
        except ValueError as error:
            raise ValueError(f"PI0PolicyConfig.architecture: {error}") from None
