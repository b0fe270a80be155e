"""Read and write OpenVLA checkpoints in their published Hugging Face layout, without
``trust_remote_code``.

A checkpoint directory (e.g. ``openvla/openvla-7b``) holds ``config.json`` (``OpenVLAConfig``,
``prismatic/extern/hf/configuration_prismatic.py`` of openvla/openvla: ``vision_backbone_id``,
``llm_backbone_id``, ``image_sizes``, ``text_config``, ``pad_to_multiple_of``,
``n_action_bins``, ``norm_stats``), safetensors weights (``model.safetensors`` or shards listed
in ``model.safetensors.index.json``), tokenizer files and ``dataset_statistics.json``.

Parameter names. ``projector.*`` and ``language_model.*`` (transformers' ``LlamaForCausalLM``)
are ours unchanged. The towers ``vision_backbone.featurizer.*`` / ``fused_featurizer.*`` are timm
``VisionTransformer`` modules (``timm/models/vision_transformer.py``: ``patch_embed.proj``,
``cls_token``, ``reg_token``, ``pos_embed``, ``blocks.N.{norm1, attn.qkv, attn.proj, ls1, norm2,
mlp.fc1, mlp.fc2, ls2}``, ``norm``, and SigLIP's ``attn_pool``), with LayerScale's ``gamma``
renamed ``scale_factor`` by OpenVLA's ``ls_apply_patch``. They map onto transformers'
``Dinov2WithRegistersModel`` and ``SiglipVisionModel`` (under ``<tower>.model.``) by
:func:`timm_to_transformers`:

Per tower, ``timm name → DINOv2 (ours) | SigLIP (ours)``:

- ``patch_embed.proj.*`` → ``embeddings.patch_embeddings.projection.*`` |
  ``embeddings.patch_embedding.*``
- ``pos_embed`` ``(1, N, D)`` → ``embeddings.position_embeddings`` ``(1, 1 + N, D)`` with a zero
  CLS row (timm's ``no_embed_class``: the CLS token gets no position) |
  ``embeddings.position_embedding.weight`` ``(N, D)``
- ``cls_token``, ``reg_token`` → ``embeddings.cls_token``, ``embeddings.register_tokens`` | —
- ``blocks.N.norm1`` / ``norm2`` → ``encoder.layer.N.norm1`` / ``norm2`` |
  ``encoder.layers.N.layer_norm1`` / ``layer_norm2``
- ``blocks.N.attn.qkv`` ``(3 D, D)`` → rows split in q, k, v order into
  ``encoder.layer.N.attention.{q,k,v}_proj`` | ``encoder.layers.N.self_attn.{q,k,v}_proj``
- ``blocks.N.attn.proj`` → ``attention.o_proj`` | ``self_attn.out_proj``
- ``blocks.N.mlp.fc1`` / ``fc2`` → ``mlp.fc1`` / ``fc2`` (both)
- ``blocks.N.ls1`` / ``ls2`` ``.scale_factor`` → ``layer_scale1`` / ``layer_scale2`` ``.lambda1`` | —
- ``norm`` → ``layernorm`` | ``post_layernorm``
- ``attn_pool.*`` → — | dropped (unused: Prismatic reads block ``L - 2``)

DINOv2's attention names are those of transformers ≥ 5.23 (``attention.{q,k,v,o}_proj``);
earlier 5.x releases (5.17 measured) name them ``attention.attention.{query,key,value}`` and
``attention.output.dense``. :func:`installed_dinov2_names` reads which layout the installed
transformers builds, and both conversions go through it, so either version loads and writes the
same published files.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor
from transformers import (
    Dinov2WithRegistersConfig,
    Dinov2WithRegistersModel,
    LlamaConfig,
    PreTrainedTokenizerBase,
)

from policies.checkpoint_files import (
    SAFETENSORS_INDEX_FILE,
    checkpoint_shapes,
    find_weight_files,
    load_pickled_tensors,
    read_json_file,
    read_safetensors_header,
    staged_directory,
)
from policies.openvla.configuration_openvla import (
    PrismaticArchitecture,
    VisionTowerConfig,
)

CONFIG_FILE = "config.json"
WEIGHTS_INDEX_FILE = SAFETENSORS_INDEX_FILE
STATISTICS_FILE = "dataset_statistics.json"
#: Our extension of config.json for tower sizes that no published ``vision_backbone_id`` has.
TOWER_SPECS_FIELD = "vla_rl_vision_towers"
_TOWER_PREFIXES = ("vision_backbone.featurizer.", "vision_backbone.fused_featurizer.")
#: Bookkeeping keys of a serialised transformers config that are not LlamaConfig settings.
_CONFIG_BOOKKEEPING = ("model_type", "architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype")

_DINOV2_L = dict(family="dinov2", patch_size=14, hidden_size=1024, num_layers=24, num_heads=16,
                 intermediate_size=4096, num_register_tokens=4)  # fmt: skip
_SIGLIP_SO400M = dict(family="siglip", patch_size=14, hidden_size=1152, num_layers=27, num_heads=16,
                      intermediate_size=4304)  # fmt: skip
#: Towers of the published ``vision_backbone_id`` values that OpenVLA checkpoints use, from
#: ``VISION_BACKBONE_TO_TIMM_ID`` (configuration_prismatic.py) and timm's model definitions
#: (``vit_large_patch14_reg4_dinov2``, ``vit_so400m_patch14_siglip_224/384``).
PUBLISHED_VISION_BACKBONES: dict[str, tuple[dict[str, Any], ...]] = {
    "dinov2-vit-l": (_DINOV2_L,),
    "siglip-vit-so400m": (_SIGLIP_SO400M,),
    "siglip-vit-so400m-384px": (_SIGLIP_SO400M,),
    "dinosiglip-vit-so-224px": (_DINOV2_L, _SIGLIP_SO400M),
    "dinosiglip-vit-so-384px": (_DINOV2_L, _SIGLIP_SO400M),
}


def published_backbone_id(architecture: PrismaticArchitecture) -> str:
    """The published ``vision_backbone_id`` of ``architecture``'s towers: the one of
    :data:`PUBLISHED_VISION_BACKBONES` with the same tower families in the same order, its
    ``-384px`` variant when there is one and every tower takes 384-pixel images. It is what
    openvla/openvla's ``PrismaticConfig`` builds the towers from (our loader reads the sizes
    from ``vla_rl_vision_towers``).

    Raises:
        ValueError: no published id has these families (naming them).
    """
    families = [tower.family for tower in architecture.vision_towers]
    matches = [name for name, specs in PUBLISHED_VISION_BACKBONES.items()
               if [spec["family"] for spec in specs] == families]
    if not matches:
        raise ValueError(f"no published vision_backbone_id has towers {families}; known: "
                         f"{sorted(PUBLISHED_VISION_BACKBONES)}")
    large = all(tower.image_size == 384 for tower in architecture.vision_towers)
    return next((name for name in matches if name.endswith("-384px") == large), matches[0])


#: DINOv2 attention names of transformers < 5.23 → ≥ 5.23 (this module's canonical names).
_LEGACY_DINOV2_ATTENTION = {
    ".attention.attention.query.": ".attention.q_proj.",
    ".attention.attention.key.": ".attention.k_proj.",
    ".attention.attention.value.": ".attention.v_proj.",
    ".attention.output.dense.": ".attention.o_proj.",
}


@functools.cache
def _dinov2_attention_is_legacy() -> bool:
    """Whether the installed transformers names DINOv2's attention the < 5.23 way (read from a
    one-layer model built on the ``meta`` device)."""
    config = Dinov2WithRegistersConfig(hidden_size=2, num_hidden_layers=1, num_attention_heads=1,
                                       intermediate_size=2, image_size=1, patch_size=1)
    with torch.device("meta"):
        names = Dinov2WithRegistersModel(config).state_dict()
    return "encoder.layer.0.attention.attention.query.weight" in names


def installed_dinov2_names(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Canonical (transformers ≥ 5.23) DINOv2 attention names → those of the installed version;
    other names unchanged."""
    if not _dinov2_attention_is_legacy():
        return state_dict
    legacy = {new: old for old, new in _LEGACY_DINOV2_ATTENTION.items()}
    return {_replace_any(name, legacy): tensor for name, tensor in state_dict.items()}


def canonical_dinov2_names(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of :func:`installed_dinov2_names`."""
    return {_replace_any(name, _LEGACY_DINOV2_ATTENTION): tensor for name, tensor in state_dict.items()}


def _replace_any(name: str, renames: dict[str, str]) -> str:
    for old, new in renames.items():
        if old in name:
            return name.replace(old, new, 1)
    return name


def _tower_map(family: str, ours: str) -> list[tuple[str, str]]:
    """(timm regex, our replacement) pairs of one tower, non-qkv parameters."""
    if family == "dinov2":
        return [
            (r"patch_embed\.proj\.", f"{ours}embeddings.patch_embeddings.projection."),
            (r"cls_token$", f"{ours}embeddings.cls_token"),
            (r"reg_token$", f"{ours}embeddings.register_tokens"),
            (r"blocks\.(\d+)\.norm(\d)\.", rf"{ours}encoder.layer.\1.norm\2."),
            (r"blocks\.(\d+)\.attn\.proj\.", rf"{ours}encoder.layer.\1.attention.o_proj."),
            (r"blocks\.(\d+)\.mlp\.", rf"{ours}encoder.layer.\1.mlp."),
            (r"blocks\.(\d+)\.ls(\d)\.(?:scale_factor|gamma)$", rf"{ours}encoder.layer.\1.layer_scale\2.lambda1"),
            (r"norm\.", f"{ours}layernorm."),
        ]
    return [
        (r"patch_embed\.proj\.", f"{ours}embeddings.patch_embedding."),
        (r"blocks\.(\d+)\.norm(\d)\.", rf"{ours}encoder.layers.\1.layer_norm\2."),
        (r"blocks\.(\d+)\.attn\.proj\.", rf"{ours}encoder.layers.\1.self_attn.out_proj."),
        (r"blocks\.(\d+)\.mlp\.", rf"{ours}encoder.layers.\1.mlp."),
        (r"norm\.", f"{ours}post_layernorm."),
    ]


def timm_to_transformers(state_dict: dict[str, Tensor], architecture: PrismaticArchitecture) -> dict[str, Tensor]:
    """Published (timm-named) parameters → our module names (see the module docstring).

    Args:
        state_dict: the checkpoint's tensors.
        architecture: the model they belong to (families and register counts of the towers).

    Returns:
        a new dict keyed by :class:`~policies.openvla.modeling_prismatic.PrismaticVLM` names
        (DINOv2 attention named as the installed transformers does); SigLIP's ``attn_pool.*``
        is dropped.

    Raises:
        ValueError: a tower parameter has no mapping (the message names it).
    """
    converted: dict[str, Tensor] = {}
    towers = dict(zip(_TOWER_PREFIXES, architecture.vision_towers))
    for name, tensor in state_dict.items():
        prefix = next((p for p in _TOWER_PREFIXES if name.startswith(p)), None)
        if prefix is None:
            converted[name] = tensor
            continue
        tower = towers.get(prefix)
        if tower is None:
            raise ValueError(f"checkpoint parameter {name} belongs to a tower the architecture does not have")
        ours, local = f"{prefix}model.", name[len(prefix) :]
        if tower.family == "siglip" and local.startswith("attn_pool."):
            continue
        qkv = re.fullmatch(r"blocks\.(\d+)\.attn\.qkv\.(weight|bias)", local)
        if qkv:
            layer, kind = qkv.groups()
            if tower.family == "dinov2":
                block = f"encoder.layer.{layer}.attention"
            else:
                block = f"encoder.layers.{layer}.self_attn"
            for part, chunk in zip("qkv", tensor.chunk(3, dim=0)):
                converted[f"{ours}{block}.{part}_proj.{kind}"] = chunk.clone()
            continue
        if local == "pos_embed":
            if tower.family == "dinov2":  # no_embed_class: CLS gets no position → a zero row
                cls_row = torch.zeros_like(tensor[:, :1])
                converted[f"{ours}embeddings.position_embeddings"] = torch.cat([cls_row, tensor], 1)
            else:
                converted[f"{ours}embeddings.position_embedding.weight"] = tensor[0]
            continue
        for pattern, replacement in _tower_map(tower.family, ours):
            if re.match(pattern, local):
                converted[re.sub(pattern, replacement, local, count=1)] = tensor
                break
        else:
            raise ValueError(f"checkpoint parameter {name} has no mapping onto a transformers {tower.family} tower")
    return installed_dinov2_names(converted)


def transformers_to_timm(state_dict: dict[str, Tensor], architecture: PrismaticArchitecture) -> dict[str, Tensor]:
    """Our parameter names → the published timm layout: the inverse of
    :func:`timm_to_transformers` (SigLIP's unused ``attn_pool`` is not written; DINOv2's unused
    ``mask_token`` is dropped; DINOv2's CLS position embedding, which timm does not have, is
    added into ``cls_token``: the CLS input ``cls + pos_0`` is unchanged).
    """
    out: dict[str, Tensor] = {}
    towers = dict(zip(_TOWER_PREFIXES, architecture.vision_towers))
    state_dict = canonical_dinov2_names(state_dict)
    for name, tensor in state_dict.items():
        prefix = next((p for p in _TOWER_PREFIXES if name.startswith(f"{p}model.")), None)
        if prefix is None:
            out[name] = tensor.contiguous()
            continue
        family, local = towers[prefix].family, name[len(prefix) + len("model.") :]
        if local == "embeddings.mask_token":
            continue
        if local == "embeddings.position_embeddings":
            out[f"{prefix}pos_embed"] = tensor[:, 1:].contiguous()
            continue
        if local == "embeddings.cls_token":  # timm's CLS has no position: fold ours into the token
            position = state_dict[f"{prefix}model.embeddings.position_embeddings"][:, :1]
            out[f"{prefix}cls_token"] = (tensor + position).contiguous()
            continue
        if local == "embeddings.position_embedding.weight":
            out[f"{prefix}pos_embed"] = tensor[None].contiguous()
            continue
        qkv = re.fullmatch(r"encoder\.layers?\.(\d+)\.(?:attention|self_attn)\.q_proj\.(weight|bias)", local)
        if qkv:
            layer, kind = qkv.groups()
            parts = [state_dict[name.replace(".q_proj.", f".{p}_proj.")] for p in "qkv"]
            out[f"{prefix}blocks.{layer}.attn.qkv.{kind}"] = torch.cat(parts, 0).contiguous()
            continue
        if re.fullmatch(r"encoder\.layers?\.\d+\.(?:attention|self_attn)\.[kv]_proj\.(weight|bias)", local):
            continue
        out[f"{prefix}{_to_timm_local(family, local)}"] = tensor.contiguous()
    return out


def _to_timm_local(family: str, local: str) -> str:
    rules = [
        (r"embeddings\.patch_embeddings?(?:\.projection)?\.", "patch_embed.proj."),
        (r"embeddings\.cls_token$", "cls_token"),
        (r"embeddings\.register_tokens$", "reg_token"),
        (r"encoder\.layers?\.(\d+)\.(?:norm|layer_norm)(\d)\.", r"blocks.\1.norm\2."),
        (r"encoder\.layers?\.(\d+)\.(?:attention\.o_proj|self_attn\.out_proj)\.", r"blocks.\1.attn.proj."),
        (r"encoder\.layers?\.(\d+)\.mlp\.", r"blocks.\1.mlp."),
        (r"encoder\.layer\.(\d+)\.layer_scale(\d)\.lambda1$", r"blocks.\1.ls\2.scale_factor"),
        (r"(?:layernorm|post_layernorm)\.", "norm."),
    ]
    for pattern, replacement in rules:
        if re.match(pattern, local):
            return re.sub(pattern, replacement, local, count=1)
    raise ValueError(f"{family} tower parameter {local} has no timm name")


def read_safetensors_dir(directory: Path, allow_pickle: bool = False,
                         device: torch.device | str | None = None) -> dict[str, Tensor]:
    """All tensors of ``model.safetensors`` or of the shards in ``model.safetensors.index.json``
    (with ``allow_pickle``, else of ``pytorch_model.bin``, read with torch's weights-only
    unpickler). Safetensors headers are checked first, so a truncated file is named.

    Args:
        directory: the checkpoint directory.
        allow_pickle: accept ``pytorch_model.bin`` weights when there are no safetensors.
        device: where the tensors are put (None: the CPU). Safetensors are read one tensor at a
            time and moved at once, so the host never holds more than one tensor of a GPU
            worker's weights; pickle files are mapped onto ``device`` by torch.

    Raises:
        FileNotFoundError: no weights, or a listed shard is missing.
        ValueError: a damaged file, or pickle weights without ``allow_pickle`` (named).
    """
    weights = find_weight_files(directory, allow_pickle)
    device = torch.device("cpu") if device is None else torch.device(device)
    tensors: dict[str, Tensor] = {}
    for path in weights.files:
        if weights.format == "safetensors":
            read_safetensors_header(path)
            with safe_open(str(path), framework="pt", device="cpu") as file:
                for name in file.keys():  # noqa: SIM118 (safe_open is not a dict)
                    tensors[name] = file.get_tensor(name).to(device)
        else:
            tensors.update(load_pickled_tensors(path, device))
    return tensors


def checkpoint_parameter_shapes(directory: Path, architecture: PrismaticArchitecture,
                                allow_pickle: bool = False) -> dict[str, tuple[int, ...]]:
    """The shapes of a checkpoint's tensors under our parameter names, without reading tensor data:
    the safetensors headers' shapes converted by :func:`timm_to_transformers` on ``meta`` tensors.

    Raises:
        FileNotFoundError, ValueError: see :func:`read_safetensors_dir` and
            :func:`timm_to_transformers` (an unmappable tower parameter).
    """
    shapes = checkpoint_shapes(find_weight_files(directory, allow_pickle))
    meta = {name: torch.empty(shape, device="meta") for name, shape in shapes.items()}
    return {name: tuple(tensor.shape) for name, tensor in timm_to_transformers(meta, architecture).items()}


def read_config(directory: Path) -> dict[str, Any]:
    """``config.json`` of a checkpoint directory.

    Raises:
        FileNotFoundError: it does not exist.
        ValueError: it is not a JSON object (the message names it).
    """
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{config_path} does not exist: model_path must be a local OpenVLA checkpoint directory"
        )
    config = read_json_file(config_path)
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: not a JSON object")
    return config


def architecture_from_config(config: dict[str, Any], source: str) -> PrismaticArchitecture:
    """Our architecture from a published ``config.json`` (``OpenVLAConfig`` fields).

    Tower sizes come from :data:`PUBLISHED_VISION_BACKBONES` by ``vision_backbone_id`` with
    ``image_sizes`` from the config, or from our ``vla_rl_vision_towers`` field when present
    (checkpoints written by :func:`write_checkpoint` for other sizes). The decoder is
    ``LlamaConfig(**text_config)`` (unset fields take LlamaConfig's defaults, those of
    Llama-2-7B, as ``PrismaticConfig`` does); action tokens end at ``text_config.vocab_size -
    pad_to_multiple_of`` (``OpenVLAForActionPrediction.vocab_size``).

    Raises:
        ValueError: a required field is missing or the backbone id is unknown; the message names
            ``source``.
    """
    if TOWER_SPECS_FIELD in config:
        towers = tuple(VisionTowerConfig(**tower) for tower in config[TOWER_SPECS_FIELD])
    else:
        backbone = config.get("vision_backbone_id")
        if backbone not in PUBLISHED_VISION_BACKBONES:
            raise ValueError(
                f"{source}: vision_backbone_id {backbone!r} is not supported; "
                f"known: {sorted(PUBLISHED_VISION_BACKBONES)}"
            )
        sizes = config.get("image_sizes")
        specs = PUBLISHED_VISION_BACKBONES[backbone]
        if not isinstance(sizes, list) or len(sizes) != len(specs):
            raise ValueError(f"{source}: image_sizes must list {len(specs)} sizes for {backbone}, got {sizes!r}")
        towers = tuple(VisionTowerConfig(image_size=size, **spec) for spec, size in zip(specs, sizes))
    if "text_config" not in config:
        raise ValueError(f"{source} has no text_config")
    text = {k: v for k, v in config["text_config"].items() if k not in _CONFIG_BOOKKEEPING}
    text_config = {k: v for k, v in LlamaConfig(**text).to_dict().items() if k not in _CONFIG_BOOKKEEPING}
    pad_to = int(config.get("pad_to_multiple_of", 64))
    return PrismaticArchitecture(
        vision_towers=towers,
        text_config=text_config,
        action_vocab_end=int(text_config["vocab_size"]) - pad_to,
        n_action_bins=int(config.get("n_action_bins", 256)),
    )


def read_checkpoint(directory: str | Path, allow_pickle: bool = False, device: torch.device | str | None = None,
                    ) -> tuple[PrismaticArchitecture, dict[str, Tensor], dict[str, Any]]:
    """Architecture, our-named weights and ``norm_stats`` of a published checkpoint directory.

    ``norm_stats`` come from ``dataset_statistics.json`` when present, else from the config.

    Args:
        directory: the checkpoint directory.
        allow_pickle: accept ``pytorch_model.bin`` weights when there are no safetensors.
        device: where the weights are read to (:func:`read_safetensors_dir`; None: the CPU).

    Raises:
        FileNotFoundError: the directory, ``config.json`` or weights are missing.
        ValueError: the config or a parameter name is not understood (see
            :func:`architecture_from_config`, :func:`timm_to_transformers`), a damaged weight
            file, or pickle weights without ``allow_pickle``.
    """
    directory = Path(directory)
    config = read_config(directory)
    architecture = architecture_from_config(config, str(directory / CONFIG_FILE))
    weights = timm_to_transformers(read_safetensors_dir(directory, allow_pickle, device), architecture)
    return architecture, weights, read_norm_stats(directory, config)


def statistics_file(directory: str | Path) -> Path:
    """The file :func:`read_norm_stats` reads a checkpoint's statistics from: its
    ``dataset_statistics.json`` when present, else its ``config.json``."""
    directory = Path(directory)
    return directory / STATISTICS_FILE if (directory / STATISTICS_FILE).is_file() else directory / CONFIG_FILE


def read_norm_stats(directory: str | Path, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A checkpoint directory's ``norm_stats`` (``{unnorm_key: {"action": {...}, ...}}``): its
    ``dataset_statistics.json`` when present, else its config's (``config``: ``config.json``,
    read here when None); ``{}`` without statistics.

    Raises:
        FileNotFoundError, ValueError: the file read is missing or not valid JSON.
    """
    directory = Path(directory)
    statistics_path = directory / STATISTICS_FILE
    if statistics_path.is_file():
        return read_json_file(statistics_path)
    return (read_config(directory) if config is None else config).get("norm_stats") or {}


def write_checkpoint(
    state_dict: dict[str, Tensor],
    architecture: PrismaticArchitecture,
    out_dir: str | Path,
    norm_stats: dict[str, Any],
    vision_backbone_id: str | None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    max_shard_size: int | str = "5GB",
    extra_files: Mapping[str, Callable[[Path], None]] | None = None,
) -> Path:
    """Write our weights as a checkpoint in the published layout (timm names, safetensors shards
    with an index when there are several, ``config.json``, ``dataset_statistics.json``).

    ``config.json`` carries the published fields plus ``vla_rl_vision_towers`` (the tower
    sizes, so that non-published sizes reload). The directory appears atomically (written
    next to ``out_dir``, then renamed).

    Args:
        state_dict: :class:`~policies.openvla.modeling_prismatic.PrismaticVLM` weights.
        architecture: their architecture.
        out_dir: the new directory (must not exist).
        norm_stats: ``{unnorm_key: {"action": {...}}}`` statistics.
        vision_backbone_id: the published id to record, e.g. ``"dinosiglip-vit-so-224px"``; None:
            the one of the towers (:func:`published_backbone_id`).
        tokenizer: saved into the directory too when given.
        max_shard_size: largest shard (bytes or a string like ``"5GB"``).
        extra_files: further files of the directory, by name: each function writes its file at the
            path it is given (OpenVLA-OFT's ``<module>--checkpoint.pt`` head modules).

    Raises:
        FileExistsError: ``out_dir`` exists.
        ValueError: ``vision_backbone_id`` names other towers than ``architecture``'s, or is None
            and no published id has them.
    """
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists; write to a new directory")
    families = [tower.family for tower in architecture.vision_towers]
    if vision_backbone_id is None:
        vision_backbone_id = published_backbone_id(architecture)
    elif [spec["family"] for spec in PUBLISHED_VISION_BACKBONES.get(vision_backbone_id, ())] != families:
        raise ValueError(f"vision_backbone_id {vision_backbone_id!r} is not one of the published ids of towers "
                         f"{families}: pass None to record the one that is")
    tensors = transformers_to_timm(state_dict, architecture)
    text = dict(architecture.text_config)
    config = {
        "model_type": "openvla",
        "architectures": ["OpenVLAForActionPrediction"],
        "vision_backbone_id": vision_backbone_id,
        "llm_backbone_id": "llama2-7b-pure",
        "arch_specifier": "no-align+fused-gelu-mlp" if len(architecture.vision_towers) == 2 else "no-align+gelu-mlp",
        "use_fused_vision_backbone": len(architecture.vision_towers) == 2,
        "image_sizes": [tower.image_size for tower in architecture.vision_towers],
        "text_config": {"model_type": "llama", **text},
        "pad_to_multiple_of": int(text["vocab_size"]) - architecture.action_vocab_end,
        "n_action_bins": architecture.n_action_bins,
        "norm_stats": norm_stats,
        TOWER_SPECS_FIELD: [_tower_dict(tower) for tower in architecture.vision_towers],
    }
    with staged_directory(out_dir) as staging:
        split = split_torch_state_dict_into_shards(tensors, max_shard_size=max_shard_size)
        for filename, names in split.filename_to_tensors.items():
            save_file({name: tensors[name] for name in names}, staging / filename, metadata={"format": "pt"})
        if split.is_sharded:
            index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
                     "weight_map": split.tensor_to_filename}  # fmt: skip
            (staging / WEIGHTS_INDEX_FILE).write_text(json.dumps(index, indent=2))
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2))
        (staging / STATISTICS_FILE).write_text(json.dumps(norm_stats, indent=2))
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        for name, write in (extra_files or {}).items():
            write(staging / name)
    return out_dir


def _tower_dict(tower: VisionTowerConfig) -> dict[str, Any]:
    fields = ("family", "image_size", "patch_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
              "num_register_tokens", "hidden_act", "layer_norm_eps")  # fmt: skip
    return {name: getattr(tower, name) for name in fields} | {
        "image_mean": list(tower.image_mean),
        "image_std": list(tower.image_std),
    }
