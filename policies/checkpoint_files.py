"""Checks of checkpoint files before (and while) they load: custom code a model directory names
(``auto_map``), safetensors headers, pickle weights, GGUF headers, tokenizer usability, and a
checkpoint's tensor names and shapes against an architecture's.

No code from a model directory ever runs: every transformers ``from_pretrained`` of the project
passes ``trust_remote_code=False``, and :func:`refuse_custom_code` refuses a directory whose
configuration files map an Auto class to a module of its own (``auto_map``), which transformers
would otherwise offer to import (asking on stdin when it is not told).

Shared by the policies' loaders (at run time) and the run's pre-flight (:mod:`vla_rl.preflight`,
before anything starts). Reading a safetensors header costs a few bytes of the file, never its
tensors; torch and transformers are imported only by the functions that need them. Every error is
a ``ValueError`` (``FileNotFoundError`` for a missing file) whose message starts with the file at
fault.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vla_rl_core.file_modes import apply_default_modes

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
PICKLE_INDEX_FILE = "pytorch_model.bin.index.json"
#: First four bytes of every GGUF file.
GGUF_MAGIC = b"GGUF"
#: Files through which transformers' Auto classes reach code in a model directory (their ``auto_map``).
CUSTOM_CODE_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json",
                     "video_preprocessor_config.json")
#: Largest safetensors header the format allows (safetensors' ``MAX_HEADER_SIZE``).
MAX_SAFETENSORS_HEADER = 100_000_000
#: Text every usable tokenizer encodes to at least one known token.
PROBE_TEXT = "What is 12 + 7?"
#: Files a Hugging Face tokenizer is read from (fast, sentencepiece, BPE and WordPiece vocabularies).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt", "spiece.model")

Shapes = Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class WeightFiles:
    """The weight files of a checkpoint directory.

    Attributes:
        format: ``"safetensors"``, or ``"pickle"`` (``pytorch_model.bin``: torch's pickle format).
        files: the files, in order (one, or the shards of an index).
    """

    format: Literal["safetensors", "pickle"]
    files: tuple[Path, ...]


@contextlib.contextmanager
def staged_directory(out_dir: str | Path) -> Iterator[Path]:
    """Write a model directory atomically: yields a private staging directory beside ``out_dir``
    and renames it to ``out_dir`` when the block ends without an error (removed otherwise), so a
    reader never sees a half-written directory. Before the rename, the directory and everything
    in it get the permissions the umask gives a new file or directory
    (:func:`vla_rl_core.file_modes.apply_default_modes`: safetensors writes its files 0600).

    Raises:
        FileExistsError: ``out_dir`` exists (nothing is written).
    """
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists; write to a new directory")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        yield staging
        apply_default_modes(staging)  # mkdtemp's directory is private, safetensors' files too
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class FieldError(ValueError):
    """A checkpoint check's error about another config field than the checkpoint's own path
    (``field``, e.g. ``"tokenizer_path"``), so that the pre-flight names that field."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self):  # pickled with both arguments: a worker's error reaches the driver intact
        return type(self), (str(self), self.field)


def read_json_file(path: str | Path) -> Any:
    """The JSON value in ``path`` (a checkpoint's configuration or statistics file).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not valid JSON (not UTF-8, truncated, ...); the message names the file.
    """
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None


def find_weight_files(directory: str | Path, allow_pickle: bool = False) -> WeightFiles:
    """The weights of a Hugging Face-layout directory: ``model.safetensors``, or the shards of
    ``model.safetensors.index.json``; with ``allow_pickle``, else ``pytorch_model.bin`` (or its
    index's shards).

    Raises:
        FileNotFoundError: no weights, or an index that lists a missing shard.
        ValueError: an unreadable index, or only pickle weights without ``allow_pickle`` (pickle
            files can run code when loaded); the message names the file.
    """
    directory = Path(directory)
    for fmt, single, index in (("safetensors", SAFETENSORS_FILE, SAFETENSORS_INDEX_FILE),
                               ("pickle", PICKLE_FILE, PICKLE_INDEX_FILE)):
        files = _index_shards(directory / index) if (directory / index).is_file() else None
        if files is None and (directory / single).is_file():
            files = (directory / single,)
        if files is None:
            continue
        if fmt == "pickle" and not allow_pickle:
            raise ValueError(
                f"{files[0]}: pickle weights are refused (loading a pickle file can run arbitrary code); convert "
                "them to safetensors (save_pretrained(..., safe_serialization=True)) or set allow_pickle: true"
            )
        return WeightFiles(fmt, files)
    raise FileNotFoundError(f"{directory} has no weights: neither {SAFETENSORS_FILE} nor {SAFETENSORS_INDEX_FILE}"
                            f" (nor {PICKLE_FILE})")


def _index_shards(index: Path) -> tuple[Path, ...]:
    """The shards listed by a sharded checkpoint's index file, checked to exist."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{index}: not a weight index (a JSON object with a 'weight_map'): {error}") from None
    for shard in shards:
        if not (index.parent / shard).is_file():
            raise FileNotFoundError(f"{index} lists {shard}, which does not exist")
    return tuple(index.parent / shard for shard in shards)


def read_safetensors_header(path: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The tensors a safetensors file declares, from its header alone, checked against the file's
    size: ``{name: (dtype, shape)}``.

    Raises:
        ValueError: not a safetensors file (an impossible header length, a header that is not
            JSON), or a file shorter than its header says (truncated); the message names it.
    """
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as file:
        prefix = file.read(8)
        if len(prefix) < 8:
            raise ValueError(f"{path}: not a safetensors file ({size} bytes, shorter than its 8-byte header length)")
        (header_length,) = struct.unpack("<Q", prefix)
        if header_length > MAX_SAFETENSORS_HEADER or 8 + header_length > size:
            raise ValueError(f"{path}: not a safetensors file, or a truncated one: its header length says "
                             f"{header_length} bytes, the file has {size}")
        raw = file.read(header_length)
    try:
        header = json.loads(raw)
    except ValueError as error:
        raise ValueError(f"{path}: not a safetensors file: its header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a safetensors file: its header is not a JSON object")
    tensors, end = {}, 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = entry["dtype"], tuple(int(n) for n in entry["shape"])
            start, stop = (int(offset) for offset in entry["data_offsets"])
        except (TypeError, KeyError, ValueError):
            start, stop = 1, 0
        if not 0 <= start <= stop:
            raise ValueError(f"{path}: not a safetensors file: bad header entry for {name!r}")
        tensors[name] = (dtype, shape)
        end = max(end, stop)
    if 8 + header_length + end > size:
        raise ValueError(f"{path}: truncated: its header places tensor data up to byte {8 + header_length + end}, "
                         f"the file has {size} bytes; copy or download it again")
    return tensors


def checkpoint_shapes(weights: WeightFiles) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape, by name, without reading tensor data: safetensors headers (checked,
    see :func:`read_safetensors_header`), or a pickle file mapped onto the ``meta`` device.

    Raises:
        ValueError: an unreadable or truncated file (named).
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for path in weights.files:
        if weights.format == "safetensors":
            shapes.update({name: shape for name, (_, shape) in read_safetensors_header(path).items()})
            continue
        shapes.update({name: tuple(tensor.shape) for name, tensor in load_pickled_tensors(path, "meta").items()})
    return shapes


def load_pickled_tensors(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """The tensors of a pickle weight file (``torch.save`` of a state dict: ``pytorch_model.bin``,
    OFT's ``*--checkpoint.pt``), by name, loaded with ``weights_only=True`` (no object other than
    tensors and plain containers is built, so no code in the file runs) and memory-mapped (a file
    of torch's legacy format, which cannot be mapped, is read).

    Args:
        path: the file.
        map_location: where the tensors go (``"meta"``: shapes only, no data read).

    Raises:
        ValueError: a damaged or truncated file, one holding other objects than tensors, or one
            whose content is not a mapping of names to tensors; the message starts with the file.
    """
    import pickle

    import torch

    try:
        try:
            state = torch.load(path, map_location=map_location, weights_only=True, mmap=True)
        except RuntimeError as error:
            if "mmap can only be used" not in str(error):
                raise
            state = torch.load(path, map_location=map_location, weights_only=True)  # torch's legacy format
    except pickle.UnpicklingError:  # torch's message suggests weights_only=False, which would run the file's code
        raise ValueError(f"{path}: unreadable pickle weights: not a torch file, or it holds objects other than "
                         "tensors, which are never loaded (only tensors are: weights_only)") from None
    except (OSError, RuntimeError, EOFError, ValueError) as error:  # torch raises many kinds for a damaged file
        reason = str(error).split(". ", 1)[0].strip() or type(error).__name__
        raise ValueError(f"{path}: unreadable pickle weights, damaged or truncated ({type(error).__name__}: "
                         f"{reason}); copy or download it again") from None
    if not isinstance(state, Mapping) or not all(isinstance(name, str) and isinstance(tensor, torch.Tensor)
                                                 for name, tensor in state.items()):
        raise ValueError(f"{path}: holds a {type(state).__name__}, not a state dict (names to tensors)")
    return dict(state)


def custom_code_references(directory: str | Path, auto_classes: tuple[str, ...] | None = None
                           ) -> list[tuple[Path, str, str]]:
    """The custom code a model directory's configuration files name: ``(file, Auto class,
    reference)`` for each ``auto_map`` entry of :data:`CUSTOM_CODE_FILES` (only those of
    ``auto_classes`` when given), e.g. ``(dir/config.json, "AutoConfig",
    "configuration_evil.EvilConfig")``. A file that is not JSON is skipped (its own check names
    it); a tokenizer's legacy list-valued ``auto_map`` counts as ``AutoTokenizer``'s.
    """
    found = []
    for name in CUSTOM_CODE_FILES:
        path = Path(directory) / name
        if not path.is_file():
            continue
        try:
            auto_map = json.loads(path.read_text()).get("auto_map")
        except (ValueError, UnicodeDecodeError, AttributeError):  # not JSON, or not an object
            continue
        if not auto_map:
            continue
        entries = auto_map.items() if isinstance(auto_map, dict) else [("AutoTokenizer", auto_map)]
        for auto_class, reference in entries:
            references = reference if isinstance(reference, (list, tuple)) else [reference]
            if auto_classes is None or auto_class in auto_classes:
                found += [(path, str(auto_class), str(ref)) for ref in references if ref is not None]
    return found


def refuse_custom_code(directory: str | Path, auto_classes: tuple[str, ...] | None = None) -> None:
    """Refuse a model directory that names code of its own (see :func:`custom_code_references`).

    Raises:
        ValueError: the first file with an ``auto_map`` entry, naming the entry.
    """
    found = custom_code_references(directory, auto_classes)
    if not found:
        return
    path, auto_class, reference = found[0]
    more = sum(1 for entry in found if entry[0] == path) - 1
    raise ValueError(
        f"{path}: auto_map names custom code ({auto_class} -> {reference}{f', and {more} more' if more else ''}); "
        "vla-rl never runs code from a model directory: use a checkpoint of an architecture transformers ships "
        "(if its model_type is one, delete the auto_map entry)"
    )


@dataclass(frozen=True)
class GGUFHeader:
    """What a GGUF file declares, as ``gguf``'s reader reads it.

    Attributes:
        version: the format version (2 or 3).
        metadata: the key-value section's scalar and string values (arrays are left out).
        tensors: ``{name: (ggml type, shape)}`` (GGUF's dimension order, innermost first).
        data_end: the byte at which the last tensor's data ends (at most the file's size).
    """

    version: int
    metadata: dict[str, Any]
    tensors: dict[str, tuple[int, tuple[int, ...]]]
    data_end: int


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """The header of a GGUF file, read by ``gguf``'s ``GGUFReader`` (which memory-maps the file
    and views, never copies, its tensor data); any failure of the reader is reported against the
    file.

    Raises:
        FileNotFoundError: the file does not exist (or is not a file).
        ValueError: another format, an unsupported version, a damaged header or a truncated
            file; the message names the file and what the reader found.
    """
    from gguf import GGUFReader, GGUFValueType

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    with path.open("rb") as file:
        magic = file.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise ValueError(f"{path}: not a GGUF file: it starts with {magic!r}, not {GGUF_MAGIC!r} (truncated, or "
                         "another format)")
    try:
        reader = GGUFReader(path)
        metadata = {name: field.contents() for name, field in reader.fields.items()
                    if field.types and field.types[0] != GGUFValueType.ARRAY}
        tensors = {tensor.name: (int(tensor.tensor_type), tuple(int(n) for n in tensor.shape))
                   for tensor in reader.tensors}
        data_end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, UnicodeDecodeError) as error:
        # The reader's messages ("cannot reshape array of size 454 into shape (284,64)") name no file.
        raise ValueError(f"{path}: a damaged or truncated GGUF file (the gguf reader: {error}); copy or convert it "
                         "again") from None
    version = int(metadata.pop("GGUF.version"))
    metadata.pop("GGUF.tensor_count", None), metadata.pop("GGUF.kv_count", None)
    return GGUFHeader(version, metadata, tensors, data_end)


def check_gguf_file(path: str | Path) -> GGUFHeader:
    """A GGUF file whose header reads (see :func:`read_gguf_header`), with tensors and the
    ``general.architecture`` that transformers builds the model from.

    Returns:
        Its header.

    Raises:
        FileNotFoundError: it does not exist (or is not a file).
        ValueError: see :func:`read_gguf_header`; no tensors (a vocabulary-only file); no
            architecture.
    """
    header = read_gguf_header(path)
    if not header.tensors:
        raise ValueError(f"{path}: the GGUF file holds no tensors (a vocabulary-only file?); give the model's "
                         "weights")
    if not isinstance(header.metadata.get("general.architecture"), str):
        raise ValueError(f"{path}: the GGUF file has no general.architecture, which transformers builds the model "
                         "from")
    return header


@dataclass(frozen=True)
class WeightMismatch:
    """How a checkpoint's tensors differ from an architecture's parameters.

    Attributes:
        missing: parameter names the checkpoint lacks (sorted).
        unexpected: checkpoint tensor names the architecture has no parameter for (sorted).
        mismatched: ``(name, checkpoint shape, model shape)`` of tensors whose shapes differ.
    """

    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    mismatched: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.mismatched)

    def describe(self, limit: int = 3) -> str:
        """The first ``limit`` names of each kind, e.g. ``2 missing (model.norm.weight, ...); 1
        with another shape (lm_head.weight: (10, 4) in the checkpoint, (12, 4) in the model)``."""
        parts = []
        for label, names in (("missing", self.missing), ("unexpected", self.unexpected)):
            if names:
                more = ", ..." if len(names) > limit else ""
                parts.append(f"{len(names)} {label} ({', '.join(names[:limit])}{more})")
        if self.mismatched:
            shown = ", ".join(f"{name}: {tuple(ckpt)} in the checkpoint, {tuple(model)} in the model"
                              for name, ckpt, model in self.mismatched[:limit])
            parts.append(f"{len(self.mismatched)} with another shape ({shown}"
                         f"{', ...' if len(self.mismatched) > limit else ''})")
        return "; ".join(parts)


def compare_shapes(expected: Shapes, found: Shapes) -> WeightMismatch:
    """Compare an architecture's parameter shapes (``expected``) with a checkpoint's (``found``)."""
    return WeightMismatch(
        missing=tuple(sorted(set(expected) - set(found))),
        unexpected=tuple(sorted(set(found) - set(expected))),
        mismatched=tuple((name, tuple(found[name]), tuple(expected[name])) for name in sorted(set(expected) & set(found))
                         if tuple(found[name]) != tuple(expected[name])),
    )


def weight_mismatch_error(source: str | Path, mismatch: WeightMismatch) -> ValueError:
    """The error of a checkpoint whose weights do not fit its architecture (says how to override)."""
    return ValueError(f"{source}: the weights do not match the architecture: {mismatch.describe()}; load a "
                      "checkpoint of this architecture, or set policy.allow_partial_load: true to keep the "
                      "architecture's initialisation where they do not fit")


def load_tokenizer(directory: str | Path, gguf_file: str | None = None) -> Any:
    """The tokenizer of a local model directory (or GGUF file), local files only, never with
    code from the directory (``trust_remote_code=False``).

    Raises:
        FileNotFoundError: ``directory`` is not a directory.
        ValueError: the directory maps ``AutoTokenizer`` to code of its own (``auto_map``), or
            transformers cannot build a tokenizer (the message names the directory or file).
    """
    from transformers import AutoTokenizer

    if not Path(directory).is_dir():  # transformers would take the path for a hub id and say so
        raise FileNotFoundError(f"{directory}: the tokenizer directory does not exist (tokenizers load from local "
                                "paths only)")
    refuse_custom_code(directory, ("AutoTokenizer",))
    source = Path(directory) / gguf_file if gguf_file else directory
    # AutoTokenizer reads config.json as a plain PretrainedConfig where its model_type is one
    # transformers does not ship (a VLA's "openvla"), warning "You are using a model of type
    # openvla to instantiate a model of type ``": true, and beside the point for a tokenizer.
    config_logger = logging.getLogger("transformers.configuration_utils")
    level = config_logger.level
    config_logger.setLevel(logging.ERROR)
    try:
        return AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file, local_files_only=True,
                                             trust_remote_code=False)
    except Exception as error:  # transformers raises OSError, ValueError, KeyError, ... for bad files
        reason = " ".join(str(error).split())  # one line: some of transformers' messages span several
        raise ValueError(f"{source}: no usable tokenizer ({type(error).__name__}: {reason})") from None
    finally:
        config_logger.setLevel(level)


def check_tokenizer(tokenizer: Any, source: str | Path, chat_template: bool, vocab_size: int | None = None) -> None:
    """A tokenizer fit to encode prompts: it encodes :data:`PROBE_TEXT` to known tokens (a
    directory without its tokenizer files loads an almost empty fallback vocabulary that encodes
    every text to nothing), has an EOS token, (``chat_template``) a chat template that renders,
    and (``vocab_size``) no more tokens than the model has embedding rows (a larger embedding, as
    Qwen2.5's 151,936 rows for 151,665 tokens, is fine; a smaller one fails at the first prompt
    holding a token past it, with an index error, a device-side assert on CUDA).

    Args:
        tokenizer: a transformers tokenizer.
        source: the model directory or file, for the messages.
        chat_template: whether prompts go through the chat template.
        vocab_size: the model's input embedding rows (its config's ``vocab_size``); None: not checked.

    Raises:
        ValueError: the first problem, naming ``source``.
    """
    ids = tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    if not ids or all(token == tokenizer.unk_token_id for token in ids):
        path = Path(source)
        present = [name for name in TOKENIZER_FILES if (path / name).is_file()] if path.is_dir() else []
        raise ValueError(
            f"{source}: no usable tokenizer: it encodes {PROBE_TEXT!r} to {ids} (a vocabulary of {len(tokenizer)} "
            f"tokens; tokenizer files present: {', '.join(present) or 'none'}); copy the model's tokenizer files "
            "(tokenizer.json, or its vocabulary files) into the directory"
        )
    if tokenizer.eos_token_id is None:
        raise ValueError(f"{source}: the tokenizer has no EOS token; responses could never end")
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise ValueError(f"{source}: the tokenizer has {len(tokenizer)} tokens, more than the model's vocab_size "
                         f"{vocab_size}: ids from {vocab_size} on have no embedding; use the model's own tokenizer")
    if not chat_template:
        return
    if tokenizer.chat_template is None:
        raise ValueError(f"{source}: the tokenizer has no chat template, and prompts are chat messages; add one "
                         "(chat_template.jinja) or set text.prompt_format: raw to encode the prompt text as is")
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": PROBE_TEXT}], tokenize=False,
                                      add_generation_prompt=True)
    except Exception as error:  # a template is user code: jinja raises its own errors
        raise ValueError(f"{source}: the chat template does not render ({type(error).__name__}: {error})") from None
