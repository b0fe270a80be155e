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
from dataclasses import dataclass
from typing import Any


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_positive_ints(owner: str, obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if not _is_int(value) or value < 1:
            raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}")


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
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"GemmaSpec.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                             f"({self.num_kv_heads})")


#: openpi's Gemma variants (``src/openpi/models/gemma.py``, ``get_config``).
GEMMA_VARIANTS: dict[str, dict[str, int]] = {
    "gemma_2b": {"width": 2048, "depth": 18, "mlp_dim": 16_384, "num_heads": 8, "num_kv_heads": 1, "head_dim": 256},
    "gemma_300m": {"width": 1024, "depth": 18, "mlp_dim": 4096, "num_heads": 8, "num_kv_heads": 1, "head_dim": 256},
}
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
            self.vision = SiglipSpec(**self.vision)
        self.vlm = _gemma_spec("vlm", self.vlm)
        self.expert = _gemma_spec("expert", self.expert)
        _check_positive_ints("PI0ModelConfig", self, ("vocab_size", "chunk_size", "max_state_dim", "max_action_dim",
                                                      "num_steps", "tokenizer_max_length"))
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


def _gemma_spec(field: str, value: GemmaSpec | dict[str, Any] | str) -> GemmaSpec:
    if isinstance(value, GemmaSpec):
        return value
    if isinstance(value, dict):
        return GemmaSpec(**value)
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
