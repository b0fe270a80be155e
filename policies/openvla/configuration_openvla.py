"""Configuration of the OpenVLA policy and of the Prismatic architecture it runs (no torch import:
configs stay light)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.config_checks import check_seed, is_int

#: Vision tower families (transformers' SiglipVisionModel, Dinov2WithRegistersModel).
VISION_FAMILIES = ("siglip", "dinov2")
#: Parameter dtypes the policy loads models in.
DTYPES = ("float32", "bfloat16", "float16")
#: Gripper post-processing of environment actions.
GRIPPER_POSTPROCESS = ("none", "libero")
#: How camera images that are not the vision tower's size are resized before the tower:
#: ``"tower"``: the tower's own bicubic resize; ``"jpeg_lanczos3"``: OpenVLA-OFT's
#: ``resize_image_for_policy`` (JPEG round trip, then Lanczos-3 to the tower's size; see
#: :mod:`policies.openvla.image_preprocessing`).
IMAGE_RESIZES = ("tower", "jpeg_lanczos3")
#: timm's image normalisation of each family (``timm.data.resolve_data_config`` of
#: ``vit_large_patch14_reg4_dinov2.lvd142m``: ImageNet; ``vit_so400m_patch14_siglip_224``: 0.5).
DEFAULT_IMAGE_MEAN = {"dinov2": (0.485, 0.456, 0.406), "siglip": (0.5, 0.5, 0.5)}
DEFAULT_IMAGE_STD = {"dinov2": (0.229, 0.224, 0.225), "siglip": (0.5, 0.5, 0.5)}
#: Built-in architectures (``architecture: tiny`` or ``{preset: tiny, <option>: ...}``) and their
#: options: ``tiny`` is :func:`policies.openvla.tiny.tiny_architecture` with the in-process tiny
#: tokenizer, for tests and CPU runs.
ARCHITECTURE_PRESETS = {"tiny": ("fused", "image_size")}
#: The tiny preset's largest ``image_size`` (4x OpenVLA's 224): a preset for tests and CPU runs.
TINY_MAX_IMAGE_SIZE = 896
#: Cameras of the model's images when ``cameras`` is unset: the third-person view, then the wrist
#: (OpenVLA-OFT's LIBERO inputs).
DEFAULT_CAMERAS = ("agentview", "robot0_eye_in_hand")


@dataclass
class VisionTowerConfig:
    """One ViT of the vision backbone (Prismatic's ``featurizer`` or ``fused_featurizer``).

    Attributes:
        family: ``"siglip"`` or ``"dinov2"`` (DINOv2 with register tokens).
        image_size: square input side in pixels (224 in OpenVLA).
        patch_size: patch side in pixels (14 in OpenVLA).
        hidden_size, num_layers, num_heads, intermediate_size: ViT width, depth, heads, MLP width.
        num_register_tokens: DINOv2 register tokens (4 in ``vit_large_patch14_reg4_dinov2``); 0
            for SigLIP.
        hidden_act: MLP activation in transformers' names (timm's default ``nn.GELU`` is
            ``"gelu"``).
        layer_norm_eps: LayerNorm epsilon (timm's ViTs use 1e-6).
        image_mean, image_std: per-channel normalisation of [0, 1] pixels; default by family.
    """

    family: str
    image_size: int
    patch_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    num_register_tokens: int = 0
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-6
    image_mean: tuple[float, float, float] | None = None
    image_std: tuple[float, float, float] | None = None

    def __post_init__(self) -> None:
        """Fill the family's default normalisation and validate.

        Raises:
            ValueError: a field has an invalid value; the message says how to fix it.
        """
        if self.family not in VISION_FAMILIES:
            raise ValueError(f"VisionTowerConfig.family {self.family!r} is unknown; use one of {VISION_FAMILIES}")
        for name in ("image_size", "patch_size", "hidden_size", "num_layers", "num_heads", "intermediate_size"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"VisionTowerConfig.{name} must be a positive int, got {value!r}")
        if self.num_layers < 2:
            raise ValueError("VisionTowerConfig.num_layers must be >= 2: Prismatic reads the second-to-last block")
        if self.family == "dinov2" and self.intermediate_size % self.hidden_size:
            raise ValueError("VisionTowerConfig.intermediate_size must be a multiple of hidden_size for DINOv2")
        if self.family == "siglip" and self.num_register_tokens:
            raise ValueError("VisionTowerConfig.num_register_tokens must be 0 for SigLIP")
        self.image_mean = tuple(self.image_mean or DEFAULT_IMAGE_MEAN[self.family])
        self.image_std = tuple(self.image_std or DEFAULT_IMAGE_STD[self.family])

    @property
    def num_patches(self) -> int:
        """Patch tokens per image: ``floor(image_size / patch_size)^2`` (the patch convolution
        drops a remainder: 729 for 384 px and patch 14)."""
        return (self.image_size // self.patch_size) ** 2


@dataclass
class PrismaticArchitecture:
    """The Prismatic VLM: vision tower(s) → projector → Llama-style decoder.

    Attributes:
        vision_towers: one tower, or two fused ones (``dinosiglip``: DINOv2 first, SigLIP
            second, patch features concatenated); dicts (from YAML) become
            :class:`VisionTowerConfig`.
        text_config: keyword arguments of ``transformers.LlamaConfig`` (``vocab_size`` is the
            model's padded vocabulary, ``hidden_size``, ``num_hidden_layers``, ...).
        action_vocab_end: the tokenizer's vocabulary size: action tokens are the ``n_action_bins``
            ids below it (OpenVLA: 32000 = ``text_config.vocab_size - pad_to_multiple_of``).
        n_action_bins: number of action bins (256).
    """

    vision_towers: tuple[VisionTowerConfig, ...]
    text_config: dict[str, Any]
    action_vocab_end: int
    n_action_bins: int = 256

    def __post_init__(self) -> None:
        """Convert dict towers and validate.

        Raises:
            ValueError: a field has an invalid value; the message says how to fix it.
        """
        self.vision_towers = tuple(
            tower if isinstance(tower, VisionTowerConfig) else VisionTowerConfig(**tower)
            for tower in self.vision_towers
        )
        if len(self.vision_towers) not in (1, 2):
            raise ValueError(f"PrismaticArchitecture needs 1 or 2 vision towers, got {len(self.vision_towers)}")
        if len(self.vision_towers) == 2:
            first, second = self.vision_towers
            if first.num_patches != second.num_patches:
                raise ValueError("fused vision towers must give the same number of patches per image")
        vocab_size = self.text_config.get("vocab_size")
        if not is_int(vocab_size) or "hidden_size" not in self.text_config:
            raise ValueError("PrismaticArchitecture.text_config needs int vocab_size and hidden_size (LlamaConfig)")
        if not (is_int(self.n_action_bins) and self.n_action_bins >= 2):
            raise ValueError(f"PrismaticArchitecture.n_action_bins must be an int >= 2, got {self.n_action_bins!r}")
        if not is_int(self.action_vocab_end) or not self.n_action_bins <= self.action_vocab_end <= vocab_size:
            raise ValueError(
                f"PrismaticArchitecture.action_vocab_end must be an int in [n_action_bins, text_config.vocab_size] = "
                f"[{self.n_action_bins}, {vocab_size}], got {self.action_vocab_end!r}"
            )

    @property
    def num_patches(self) -> int:
        """Visual tokens per image."""
        return self.vision_towers[0].num_patches

    @property
    def llm_dim(self) -> int:
        return int(self.text_config["hidden_size"])


@dataclass
class OpenVLAPolicyConfig:
    """Settings of :class:`policies.openvla.modeling_openvla.OpenVLAPolicy`.

    Give exactly one of ``model_path`` (a published checkpoint) and ``architecture`` (random
    initialisation, e.g. tiny models in tests).

    Attributes:
        model_path: a local directory in the published Hugging Face layout of OpenVLA
            (``config.json``, safetensors shards, tokenizer files, ``dataset_statistics.json``).
            Never a hub id: nothing is downloaded.
        architecture: the model to build with random weights: a :class:`PrismaticArchitecture`
            (or its dict), or a preset of ``ARCHITECTURE_PRESETS`` (``"tiny"``, or ``{"preset":
            "tiny", "image_size": 56}``), which also brings its tokenizer.
        unnorm_key: dataset whose action statistics de-normalise actions; None: the checkpoint's
            only dataset, or on LIBERO the suite's (``<suite>``, else ``<suite>_no_noops``, as
            OpenVLA-OFT's ``run_libero_eval.py`` ``check_unnorm_key``; ``PrismaticPolicy.use_tasks``).
        action_statistics: ``{"q01": [...], "q99": [...], "mask": [...]}`` for an
            ``architecture`` model (a checkpoint brings its own); None: actions stay normalised.
        temperature: sampling temperature; log-probs for the RL loss use the same one.
        gripper_postprocess: ``"libero"`` applies OpenVLA's LIBERO gripper handling in
            :meth:`env_actions`; ``"none"`` leaves the gripper as de-normalised.
        dtype: parameter dtype, one of ``DTYPES``; log-probs are float32 whatever it is.
        attn_implementation: transformers attention backend (``"sdpa"`` or ``"eager"``).
        seed: seed of the random initialisation of an ``architecture`` model.
        action_dim: values per action (7: end-effector delta pose and gripper); must match the
            action statistics' length.
        cameras: simulator cameras whose images the model sees (``"<camera>_image"`` entries of
            simulator observations); OpenVLA sees one. Default ``("agentview",)``.
        image_resize: one of ``IMAGE_RESIZES``, for simulator images whose size is not the
            tower's (OpenVLA-OFT's LIBERO evaluation: ``"jpeg_lanczos3"``; default ``"tower"``).
        center_crop: crop the centred 90% of each simulator image's area and resize it back
            (OpenVLA-OFT's ``center_crop_image``, for models trained with random-crop
            augmentation; default off here, on for OpenVLA-OFT).
        allow_pickle: accept ``pytorch_model.bin`` weights (torch's pickle format, which can run
            code when loaded) in ``model_path`` when it has no safetensors.
        allow_partial_load: accept ``model_path`` weights whose names or shapes do not match the
            architecture (the parameters they do not cover keep their initialisation); off, such
            a checkpoint is an error naming the first few tensors. Templates set it with
            ``policy.allow_partial_load``.
    """

    model_path: str | None = None
    architecture: PrismaticArchitecture | dict | str | None = None
    unnorm_key: str | None = None
    action_statistics: dict[str, list] | None = None
    temperature: float = 1.0
    gripper_postprocess: str = "none"
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    seed: int = 0
    action_dim: int = 7
    cameras: tuple[str, ...] | None = None
    image_resize: str = "tower"
    center_crop: bool = False
    allow_pickle: bool = False
    allow_partial_load: bool = False

    def __post_init__(self) -> None:
        """Validate the fields.

        Raises:
            ValueError: a field has an invalid value; the message says how to fix it.
        """
        validate_common_fields(self, type(self).__name__)
        self.cameras = resolve_cameras(self.cameras, 1, type(self).__name__)


def resolve_cameras(cameras: Any, num_images: int, owner: str) -> tuple[str, ...]:
    """``cameras`` as a tuple of ``num_images`` distinct names (``DEFAULT_CAMERAS[:num_images]``
    when None).

    Raises:
        ValueError: the names are not distinct strings or not ``num_images`` of them.
    """
    if cameras is None:
        if num_images > len(DEFAULT_CAMERAS):
            raise ValueError(f"{owner}.cameras must name the {num_images} cameras of the model's images")
        return DEFAULT_CAMERAS[:num_images]
    if isinstance(cameras, str) or not all(isinstance(c, str) and c for c in cameras):
        raise ValueError(f"{owner}.cameras must be a list of camera names such as ['agentview'], got {cameras!r}")
    cameras = tuple(cameras)
    if len(cameras) != num_images or len(set(cameras)) != num_images:
        raise ValueError(f"{owner}.cameras must name {num_images} distinct camera(s) (one per model image), "
                         f"got {cameras!r}")
    return cameras


def _resolve_preset(architecture: Any, owner: str) -> Any:
    """A preset architecture as ``{"preset": name, **options}``; anything else unchanged.

    Raises:
        ValueError: an unknown preset or option.
    """
    if isinstance(architecture, str):
        architecture = {"preset": architecture}
    if not isinstance(architecture, dict) or "preset" not in architecture:
        return architecture
    preset = architecture["preset"]
    if preset not in ARCHITECTURE_PRESETS:
        raise ValueError(f"{owner}.architecture preset {preset!r} is unknown; use one of {sorted(ARCHITECTURE_PRESETS)}")
    unknown = sorted(set(architecture) - {"preset", *ARCHITECTURE_PRESETS[preset]})
    if unknown:
        raise ValueError(f"{owner}.architecture preset {preset!r} has no options {unknown}; "
                         f"it takes {list(ARCHITECTURE_PRESETS[preset])}")
    if not isinstance(architecture.get("fused", True), bool):
        raise ValueError(f"{owner}.architecture.fused must be true or false, got {architecture['fused']!r}")
    image_size = architecture.get("image_size")
    if "image_size" in architecture and (not is_int(image_size) or not 14 <= image_size <= TINY_MAX_IMAGE_SIZE):
        raise ValueError(f"{owner}.architecture.image_size must be an int from 14 (the tiny towers' patch) to "
                         f"{TINY_MAX_IMAGE_SIZE}, got {image_size!r}")
    return dict(architecture)


def validate_common_fields(config: Any, owner: str) -> None:
    """Checks shared by the OpenVLA and OpenVLA-OFT configs.

    Raises:
        ValueError: a field has an invalid value; the message names ``owner`` and the field.
    """
    config.architecture = _resolve_preset(config.architecture, owner)
    if isinstance(config.architecture, dict) and "preset" not in config.architecture:
        config.architecture = PrismaticArchitecture(**config.architecture)
    if (config.model_path is None) == (config.architecture is None):
        raise ValueError(f"{owner}: give exactly one of model_path (a local checkpoint) and architecture"
                         + ("; both are set: set architecture to null to load model_path"
                            if config.model_path is not None else ""))
    if config.model_path is not None and (not isinstance(config.model_path, str) or not config.model_path):
        raise ValueError(f"{owner}.model_path must be a local directory, got {config.model_path!r}")
    temperature = config.temperature
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"{owner}.temperature must be a number > 0 (greedy is a sample_actions argument)")
    if config.gripper_postprocess not in GRIPPER_POSTPROCESS:
        raise ValueError(f"{owner}.gripper_postprocess must be one of {GRIPPER_POSTPROCESS}")
    if config.dtype not in DTYPES:
        raise ValueError(f"{owner}.dtype {config.dtype!r} is unknown; use one of {DTYPES}")
    if config.attn_implementation not in ("sdpa", "eager"):
        raise ValueError(f"{owner}.attn_implementation must be 'sdpa' or 'eager'")
    if config.image_resize not in IMAGE_RESIZES:
        raise ValueError(f"{owner}.image_resize must be one of {IMAGE_RESIZES}, got {config.image_resize!r}")
    for name in ("allow_pickle", "allow_partial_load", "center_crop"):
        if not isinstance(getattr(config, name), bool):
            raise ValueError(f"{owner}.{name} must be true or false, got {getattr(config, name)!r}")
    if not is_int(config.action_dim) or config.action_dim < 1:
        raise ValueError(f"{owner}.action_dim must be a positive int, got {config.action_dim!r}")
    check_seed(owner, config.seed)
    stats = config.action_statistics
    if stats is not None and (not isinstance(stats, dict) or len(stats.get("q01", ())) != config.action_dim):
        raise ValueError(f"{owner}.action_statistics must be a dict with q01/q99 (and mask) of length action_dim")
