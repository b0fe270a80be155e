"""Read and write π0 checkpoints in their published PyTorch layouts.

Two layouts hold the same tensors under the same names, up to a prefix:

- ``"openpi"``: openpi's converted PyTorch checkpoints (``examples/convert_jax_model_to_pytorch.py``
  writes ``safetensors.torch.save_model(PI0Pytorch)`` to ``model.safetensors``): names of
  ``PI0Pytorch.state_dict()``, e.g. ``paligemma_with_expert.paligemma.model.language_model.layers.0
  .self_attn.q_proj.weight``, ``paligemma_with_expert.gemma_expert.model.layers.0.mlp.up_proj
  .weight``, ``action_in_proj.weight``;
- ``"lerobot"``: LeRobot's ``PI0Policy`` (``src/lerobot/policies/pi0/modeling_pi0.py``, the model
  under ``self.model``; e.g. ``lerobot/pi0_base``): the same names prefixed ``model.``.

Our :class:`~policies.pi0.modeling_pi0.PI0Model` uses these names, except where transformers 5
builds other modules (file name → ours):

- ``...paligemma.model.vision_tower.vision_model.<rest>`` → ``...paligemma.model.vision_tower.<rest>``
  (transformers 4.x's ``SiglipVisionModel`` nests a ``vision_model``; 5.x does not; both read);
- ``paligemma_with_expert.paligemma.lm_head.weight`` → ``...paligemma.model.language_model
  .embed_tokens.weight``: PaliGemma ties its LM head to the token embeddings, and ``save_model``
  keeps one name of tied tensors, the first in sorted order, ``lm_head`` (LeRobot's
  ``_fix_pytorch_state_dict_keys`` and transformers' ``pi0`` conversion mapping copy it back the
  same way); a file holding ``embed_tokens`` itself is read too;
- ``paligemma_with_expert.gemma_expert.lm_head.weight`` ``(vocab, expert width)``: the expert's LM
  head, never used by π0 (openpi builds it with ``GemmaForCausalLM`` and leaves it at its random
  initialisation), is skipped on reading; :func:`save_pi0_checkpoint` writes zeros there so that
  strict loaders (openpi's ``safetensors.torch.load_model``, LeRobot's ``load_state_dict``) accept
  the file.

Beside the weights, :func:`save_pi0_checkpoint` writes ``pi0_architecture.json`` (our
:class:`PI0ModelConfig`); :func:`read_checkpoint_config` reads it, or else the ``config.json`` of a
LeRobot (``"type": "pi0"``) or openpi (``action_horizon``, ``action_dim``) checkpoint.

Flow-Noise's learned noise head (an RL sampler's, not the model's) is written, by
:meth:`~policies.pi0.policy_pi0.PI0Policy.save_pretrained`, to a file of its own,
``pi0_noise_head.safetensors`` (:func:`write_noise_head`, :func:`load_noise_head`): openpi and
LeRobot never read it, and their strict loaders still accept ``model.safetensors``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal

import torch
from accelerate import init_empty_weights
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from policies.checkpoint_files import (
    SAFETENSORS_FILE,
    WeightFiles,
    WeightMismatch,
    checkpoint_shapes,
    compare_shapes,
    find_weight_files,
    read_json_file,
    read_safetensors_header,
    staged_directory,
)
from policies.pi0.configuration_pi0 import PI0ModelConfig, SiglipSpec
from policies.pi0.modeling_pi0 import PI0Model

Layout = Literal["lerobot", "openpi"]
LAYOUTS = ("lerobot", "openpi")
ARCHITECTURE_FILE = "pi0_architecture.json"
#: Flow-Noise's learned noise head, beside the model (ours; not in openpi's or LeRobot's layout).
NOISE_HEAD_FILE = "pi0_noise_head.safetensors"
CONFIG_FILE = "config.json"
#: Prefixes of the normalisation buffers that LeRobot saved in ``model.safetensors`` before 0.4
#: (``lerobot/processor/migrate_policy_normalization.py`` moves them into processor files).
LEGACY_LEROBOT_STATISTICS = ("normalize_inputs.", "normalize_targets.", "unnormalize_outputs.")

#: Prefix of every name in the LeRobot layout.
LEROBOT_PREFIX = "model."
_VISION = "paligemma_with_expert.paligemma.model.vision_tower."
_EMBED = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
_PALIGEMMA_HEAD = "paligemma_with_expert.paligemma.lm_head.weight"
#: The expert's unused LM head (see the module docstring).
EXPERT_HEAD = "paligemma_with_expert.gemma_expert.lm_head.weight"


def checkpoint_name(name: str, layout: Layout) -> str:
    """The file name of one of our parameter names in ``layout`` (see the module docstring)."""
    if name == _EMBED:
        name = _PALIGEMMA_HEAD
    elif name.startswith(_VISION):
        name = _VISION + "vision_model." + name[len(_VISION):]
    return (LEROBOT_PREFIX if layout == "lerobot" else "") + name


def model_name(file_name: str) -> str:
    """Our parameter name of a file's tensor name, in either layout (the expert's LM head maps to
    :data:`EXPERT_HEAD`, which the model lacks)."""
    name = file_name.removeprefix(LEROBOT_PREFIX)  # openpi names never start with "model."
    if name == _PALIGEMMA_HEAD:
        return _EMBED
    return re.sub(r"^(paligemma_with_expert\.paligemma\.model\.vision_tower\.)vision_model\.", r"\1", name)


def detect_layout(names: Iterable[str]) -> Layout:
    """``"lerobot"`` when the names carry the ``model.`` prefix, else ``"openpi"``."""
    return "lerobot" if any(name.startswith(LEROBOT_PREFIX + "paligemma_with_expert.") for name in names) else "openpi"


def load_pi0_weights(model: PI0Model, directory: str | Path, dtypes: dict[str, torch.dtype] | None = None,
                     device: torch.device | str | None = None) -> Layout:
    """Load a checkpoint's tensors into ``model``, after checking from the safetensors headers
    alone that every parameter is there with its shape: copied into a materialised model (cast to
    each parameter's dtype), or, for a model whose parameters are on the meta device
    (:func:`load_pi0_checkpoint`), moved to ``device`` and cast to its dtype of ``dtypes``
    (default: the parameter's) one tensor at a time, and assigned.

    Args:
        model: a model of the checkpoint's architecture.
        directory: holds ``model.safetensors`` (or its shards and index) in either layout.
        dtypes: per parameter name, the dtype the loaded parameters of a meta-device model take
            (:meth:`PI0Model.parameter_dtypes`).
        device: where the loaded parameters of a meta-device model go (None: the CPU).

    Returns:
        the layout found.

    Raises:
        FileNotFoundError: no weights in ``directory``.
        ValueError: pickle-only weights, or tensors missing, unexpected or of another shape
            (the message names the file and the first names of each kind).
    """
    weights, sources = check_pi0_weights(model, directory)
    wanted = {file_name: name for name, file_name in sources.items()}
    state = model.state_dict()
    on_meta = any(tensor.is_meta for tensor in state.values())
    loaded = {}
    with torch.no_grad():
        for path in weights.files:
            with safe_open(str(path), framework="pt", device="cpu") as file:
                for file_name in file.keys():  # noqa: SIM118 (safe_open is not a dict)
                    if file_name not in wanted:
                        continue
                    target = state[wanted[file_name]]
                    if on_meta:
                        name = wanted[file_name]
                        loaded[name] = file.get_tensor(file_name).to(device, (dtypes or {}).get(name, target.dtype))
                    else:
                        target.copy_(file.get_tensor(file_name))
    if on_meta:
        model.load_state_dict(loaded, strict=True, assign=True)
    return detect_layout(sources.values())


def check_pi0_weights(model: PI0Model, directory: str | Path) -> tuple[WeightFiles, dict[str, str]]:
    """Check from the safetensors headers alone (no tensor is read) that a checkpoint directory
    holds every parameter and buffer of ``model`` (which may be on the meta device) with its
    shape, and nothing else but the expert's unused LM head.

    Returns:
        the weight files, and the file's name of each of ``model``'s state-dict entries.

    Raises:
        FileNotFoundError: no weights in ``directory``.
        ValueError: pickle-only weights, unreadable or truncated files, LeRobot's statistics
            tensors of before 0.4 (the message names LeRobot's migration script), or tensors
            missing, unexpected or of another shape (the message names the file and the first
            names of each kind).
    """
    weights = find_weight_files(directory, allow_pickle=True)
    if weights.format == "pickle":  # find_weight_files' advice, allow_pickle, is not a π0 setting
        raise ValueError(f"{weights.files[0]}: pickle weights are refused (loading a pickle file can run arbitrary "
                         "code); convert them to safetensors (openpi's and LeRobot's π0 checkpoints are safetensors)")
    found = checkpoint_shapes(weights)  # file name -> shape, from the headers
    legacy = sorted(name for name in found if name.startswith(LEGACY_LEROBOT_STATISTICS))
    if legacy:
        names = ", ".join(legacy[:3]) + (", ..." if len(legacy) > 3 else "")
        raise ValueError(f"{weights.files[0] if len(weights.files) == 1 else Path(directory)}: holds LeRobot's "
                         f"normalisation statistics as tensors ({names}), "
                         "as LeRobot saved its policies before 0.4; convert the checkpoint with LeRobot's "
                         "src/lerobot/processor/migrate_policy_normalization.py, which moves them into "
                         "policy_preprocessor.json and policy_postprocessor.json (read here)")
    sources: dict[str, str] = {}  # our name -> file name
    for file_name in found:
        name = model_name(file_name)
        if name == EXPERT_HEAD:
            continue
        if name in sources and file_name.endswith("lm_head.weight"):
            continue  # an untied file holds embed_tokens too: the embeddings win over the LM head
        sources[name] = file_name
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    mismatch = compare_shapes(expected, {name: found[file_name] for name, file_name in sources.items()})
    if mismatch:
        layout = detect_layout(found)
        mismatch = WeightMismatch(  # in the file's names
            missing=tuple(checkpoint_name(name, layout) for name in mismatch.missing),
            unexpected=tuple(sources[name] for name in mismatch.unexpected),
            mismatched=tuple((sources[name], *shapes) for name, *shapes in mismatch.mismatched),
        )
        source = weights.files[0] if len(weights.files) == 1 else Path(directory)
        raise ValueError(f"{source}: the weights do not fit this π0 architecture: {mismatch.describe()}; load a "
                         "checkpoint of this architecture (pi0_architecture.json or config.json in the directory "
                         "says which), or give the matching PI0ModelConfig")
    return weights, sources


def save_pi0_checkpoint(model: PI0Model, out_dir: str | Path, layout: Layout = "lerobot") -> Path:
    """Write ``model`` as a checkpoint directory in a published layout (:func:`write_pi0_checkpoint`),
    atomically (a half-written directory is never visible).

    Args:
        model: the model.
        out_dir: a new directory.
        layout: see :func:`write_pi0_checkpoint`.

    Returns:
        ``out_dir``.

    Raises:
        ValueError: an unknown layout.
        FileExistsError: ``out_dir`` exists.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown π0 checkpoint layout {layout!r}; use one of {LAYOUTS}")
    with staged_directory(out_dir) as staging:
        write_pi0_checkpoint(model, staging, layout)
    return Path(out_dir)


def write_pi0_checkpoint(model: PI0Model, directory: Path, layout: Layout = "lerobot") -> None:
    """Write ``model``'s checkpoint files into the existing directory ``directory``:
    ``model.safetensors`` (tensors in their own dtypes, on the CPU; with the unused expert LM head
    as zeros, ``(vocab_size, expert.width)``, 263M values at full size, so that strict loaders
    accept the file) and ``pi0_architecture.json``.

    Args:
        model: the model.
        directory: an existing directory (e.g. a staging directory of :func:`staged_directory`).
        layout: ``"lerobot"`` (names prefixed ``model.``) or ``"openpi"``.

    Raises:
        ValueError: an unknown layout.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown π0 checkpoint layout {layout!r}; use one of {LAYOUTS}")
    tensors = {checkpoint_name(name, layout): tensor.detach().to("cpu").contiguous()
               for name, tensor in model.state_dict().items()}
    config, dtype = model.config, model.action_out_proj.weight.dtype
    tensors[checkpoint_name(EXPERT_HEAD, layout)] = torch.zeros(config.vocab_size, config.expert.width, dtype=dtype)
    save_file(tensors, str(Path(directory) / SAFETENSORS_FILE), metadata={"format": "pt"})
    (Path(directory) / ARCHITECTURE_FILE).write_text(json.dumps(dataclasses.asdict(model.config), indent=2) + "\n")


def write_noise_head(head: nn.Module, directory: Path, min_std: float, max_std: float) -> None:
    """Write Flow-Noise's noise head (not part of openpi's or LeRobot's layout) as
    ``pi0_noise_head.safetensors`` in ``directory``: its state dict (CPU tensors) and, as
    metadata, the std bounds it was trained with (not parameters, so not in the state dict)."""
    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in head.state_dict().items()}
    save_file(tensors, str(Path(directory) / NOISE_HEAD_FILE),
              metadata={"format": "pt", "noise_min_std": repr(float(min_std)), "noise_max_std": repr(float(max_std))})


def load_noise_head(head: nn.Module, directory: str | Path, min_std: float, max_std: float) -> bool:
    """Load ``<directory>/pi0_noise_head.safetensors`` (:func:`write_noise_head`) into ``head``.

    Returns:
        whether the file exists (without it ``head`` is unchanged).

    Raises:
        ValueError: not a whole safetensors file, its tensors do not fit ``head`` (another
            ``noise_hidden_dims`` or model width), or it was trained with other std bounds than
            ``min_std`` / ``max_std``; the message names the file and the settings to use.
    """
    path = Path(directory) / NOISE_HEAD_FILE
    if not path.is_file():
        return False
    shapes = {name: shape for name, (_, shape) in read_safetensors_header(path).items()}  # checks the file
    mismatch = compare_shapes({name: tuple(t.shape) for name, t in head.state_dict().items()}, shapes)
    if mismatch:
        raise ValueError(f"{path}: the noise head does not fit PI0PolicyConfig.noise_hidden_dims and the model's "
                         f"widths: {mismatch.describe()}; set noise_hidden_dims to the exported policy's")
    with safe_open(str(path), framework="pt", device="cpu") as file:
        metadata = file.metadata() or {}
        tensors = {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118 (safe_open is not a dict)
    saved = tuple(float(metadata.get(key, "nan")) for key in ("noise_min_std", "noise_max_std"))
    if saved != (float(min_std), float(max_std)):
        raise ValueError(f"{path}: the noise head was trained with noise_min_std, noise_max_std = {saved}, the "
                         f"config has {(min_std, max_std)}; set PI0PolicyConfig.noise_min_std / noise_max_std to "
                         "the exported policy's")
    head.load_state_dict(tensors)
    return True


def read_checkpoint_config(directory: str | Path) -> PI0ModelConfig:
    """The architecture of a checkpoint directory: its ``pi0_architecture.json``; else its
    ``config.json``, LeRobot's ``PI0Config`` (``"type": "pi0"``: ``paligemma_variant``,
    ``action_expert_variant``, ``chunk_size``, ``max_state_dim``, ``max_action_dim``,
    ``num_inference_steps``, ``tokenizer_max_length``, ``image_resolution``, ``min_period``,
    ``max_period``, ``time_sampling_*``) or openpi's (``action_dim``, ``action_horizon``,
    ``paligemma_variant``, ``action_expert_variant``), on the full-size π0 sizes.

    Raises:
        FileNotFoundError: neither file exists.
        ValueError: a config of another model, or settings this model cannot take.
    """
    directory = Path(directory)
    if (directory / ARCHITECTURE_FILE).is_file():
        path = directory / ARCHITECTURE_FILE
        fields = read_json_file(path)
        if not isinstance(fields, dict):
            raise ValueError(f"{path}: not a JSON object of PI0ModelConfig fields")
        return _usable(path, lambda: PI0ModelConfig(**fields))
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory} has neither {ARCHITECTURE_FILE} nor {CONFIG_FILE}: give the "
                                "PI0ModelConfig of its weights")
    raw = read_json_file(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a JSON object")
    return _usable(path, lambda: _published_architecture(path, raw))


def _usable(path: Path, build: Callable[[], PI0ModelConfig]) -> PI0ModelConfig:
    """``build()``, its errors (an unknown field, a value of the wrong type, a setting the model
    cannot take) as one ``ValueError`` naming ``path``."""
    try:
        return build()
    except (TypeError, ValueError, KeyError, IndexError) as error:
        message = str(error)
        raise ValueError(message if message.startswith(str(path)) else
                         f"{path}: not a usable π0 architecture ({type(error).__name__}: {message})") from None


def _published_architecture(path: Path, raw: dict) -> PI0ModelConfig:
    """The architecture of a LeRobot or openpi ``config.json`` (see :func:`read_checkpoint_config`)."""
    if raw.get("type") == "pi0":
        if raw.get("time_sampling_beta_beta", 1.0) != 1.0:
            raise ValueError(f"{path}: time_sampling_beta_beta {raw['time_sampling_beta_beta']} is not 1: "
                             "PI0ModelConfig samples training times from Beta(alpha, 1)")
        side = raw.get("image_resolution", [224, 224])
        if side[0] != side[1]:
            raise ValueError(f"{path}: image_resolution {side} is not square")
        return PI0ModelConfig(
            vision=SiglipSpec(image_size=side[0]), vlm=raw.get("paligemma_variant", "gemma_2b"),
            expert=raw.get("action_expert_variant", "gemma_300m"), chunk_size=raw.get("chunk_size", 50),
            max_state_dim=raw.get("max_state_dim", 32), max_action_dim=raw.get("max_action_dim", 32),
            num_steps=raw.get("num_inference_steps", 10), tokenizer_max_length=raw.get("tokenizer_max_length", 48),
            min_period=raw.get("min_period", 4e-3), max_period=raw.get("max_period", 4.0),
            time_beta_alpha=raw.get("time_sampling_beta_alpha", 1.5), time_scale=raw.get("time_sampling_scale", 0.999),
            time_offset=raw.get("time_sampling_offset", 0.001),
        )
    if "action_horizon" in raw and "action_dim" in raw:
        return PI0ModelConfig(vlm=raw.get("paligemma_variant", "gemma_2b"),
                              expert=raw.get("action_expert_variant", "gemma_300m"), chunk_size=raw["action_horizon"],
                              max_state_dim=raw["action_dim"], max_action_dim=raw["action_dim"])
    raise ValueError(f"{path}: not a π0 config (neither LeRobot's, with \"type\": \"pi0\", nor openpi's, with "
                     "action_horizon and action_dim)")


def load_pi0_checkpoint(directory: str | Path, config: PI0ModelConfig | None = None,
                        dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> PI0Model:
    """Build a π0 model and load a local checkpoint directory into it (no hub access). The
    parameters are built on the meta device and become the checkpoint's tensors, read onto
    ``device`` and cast to ``dtype`` one at a time: no random float32 initialisation of the
    3.2 B parameters first, and no copy of the model in host memory for a GPU worker.

    Args:
        directory: a checkpoint directory in either layout.
        config: its architecture; default :func:`read_checkpoint_config`.
        dtype: the dtype the model runs in, with openpi's float32 exceptions
            (:meth:`PI0Model.parameter_dtypes`); default float32. Its buffers keep theirs: the
            rotary frequencies stay float32, as openpi's JAX π0 (which the checkpoints come from)
            computes them (in bfloat16 the angle at the end of a 3-camera prefix, position 816,
            is off by 1.13 rad).
        device: where the model is (None: the CPU); its buffers are moved there.

    Raises:
        see :func:`read_checkpoint_config` and :func:`load_pi0_weights`.
    """
    config = read_checkpoint_config(directory) if config is None else config
    with init_empty_weights(include_buffers=False):  # the checkpoint's tensors become the parameters
        model = PI0Model(config)
    load_pi0_weights(model, directory, None if dtype is None else model.parameter_dtypes(dtype), device)
    return model.to(device=device)
