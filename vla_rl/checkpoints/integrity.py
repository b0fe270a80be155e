"""Integrity of training checkpoints (:mod:`vla_rl.checkpoints.files`): sha256 manifests, their
verification, and the fallback to the newest checkpoint that verifies.

* **Checksums.** :func:`write_manifest` records the size and sha256 of every file of a staged
  checkpoint as ``manifest.json`` (written last, by
  :func:`~vla_rl.checkpoints.files.finalize_checkpoint`). :func:`verify_checkpoint` checks each
  file against the manifest (size, then sha256) and raises :class:`CheckpointCorruptError` naming
  every file that is missing, truncated or altered; the loaders name the file they could not read
  too. A checkpoint written before manifests existed has none: it is checked by opening its files
  (each safetensors header and its extent, each JSON file) and, fully, by loading it.
* **Fallback.** :func:`latest_verified_checkpoint` returns the newest checkpoint that verifies
  and the newer ones it skipped, each with the reason (also logged); a resume continues from it
  and sets the skipped ones aside with :func:`reject_checkpoint` (renamed ``*.rejected``, never
  deleted, never read again).
* **Layout.** :func:`checkpoint_ranks`, :func:`checkpoint_strategy` and :func:`stored_policy_shapes`
  say what a checkpoint was written for, from file names and headers alone (no tensor is read):
  the number of workers, the training strategy, the policy's tensor names and shapes. The driver
  checks a resume against them before Ray starts (:func:`vla_rl.run_dir.check_resume`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path

from safetensors import SafetensorError, safe_open

from vla_rl.checkpoints.layout import (
    ACTOR_SHARDED_DIR,
    FORMAT_VERSION,
    MANIFEST_FILE,
    REJECTED_SUFFIX,
    STEP_DIR_RE,
    TRAINER_STATE_FILE,
    CheckpointCorruptError,
    fsync,
    is_sharded_dir,
    write_json,
)

_RNG_FILE_RE = re.compile(r"rng_rank(\d+)\.safetensors")


logger = logging.getLogger(__name__)


def write_manifest(directory: str | Path) -> Path:
    """Write ``<directory>/manifest.json``: the size and sha256 of every other file in it and in its
    subdirectories (torch.distributed.checkpoint directories, e.g. ``actor_sharded/__0_0.distcp``,
    a text run's ``hf_model/``), named by their relative path.

    Rank 0 calls it (from :func:`~vla_rl.checkpoints.files.finalize_checkpoint`) once every rank's files
    are staged.

    Returns:
        the manifest's path.
    """
    directory = Path(directory)
    files = {path.relative_to(directory).as_posix(): {"size": path.stat().st_size, "sha256": _sha256(path)}
             for path in _checkpoint_files(directory) if path.name != MANIFEST_FILE}
    manifest = directory / MANIFEST_FILE
    write_json(manifest, {"format_version": FORMAT_VERSION, "files": files})
    return manifest


def verify_checkpoint(path: str | Path, digests: bool = True) -> bool:
    """Check a checkpoint's files against its manifest (size, then sha256; with ``digests``
    False the sizes only: a missing or truncated file, without reading every byte, for a check
    before the files are loaded and hashed anyway).

    A checkpoint without ``manifest.json`` (written before checkpoints had one) is checked by
    opening its files: every ``.safetensors`` header and the extent it declares, every ``.json``
    file; what that cannot see (altered tensor bytes) only loading it can.

    Returns:
        True if it was checked against its manifest, False if it has none (files opened only).

    Raises:
        CheckpointCorruptError: naming every file that is missing, truncated, altered or
            unreadable (or the manifest itself).
    """
    path = Path(path)
    manifest_file = path / MANIFEST_FILE
    if not manifest_file.is_file():
        _check_structure(path)
        return False
    try:
        files = json.loads(manifest_file.read_text(encoding="utf-8"))["files"]
        entries = [(path / name, int(entry["size"]), str(entry["sha256"])) for name, entry in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointCorruptError(f"checkpoint {path} is corrupted: its manifest {manifest_file} is unreadable "
                                     f"({err})", [manifest_file]) from err
    problems: list[tuple[Path, str]] = []
    for file, size, digest in entries:
        if not file.is_file():
            problems.append((file, "is missing"))
        elif file.stat().st_size != size:
            problems.append((file, f"has {file.stat().st_size} bytes, the manifest says {size} (truncated?)"))
        elif digests and _sha256(file) != digest:
            problems.append((file, "does not match its sha256 in the manifest (altered bytes)"))
    if problems:
        raise CheckpointCorruptError(f"checkpoint {path} is corrupted: "
                                     + "; ".join(f"{file} {why}" for file, why in problems),
                                     [file for file, _ in problems])
    return True


def checkpoint_identity(path: str | Path) -> str | None:
    """What tells a checkpoint from another of the same step (another run's, or a run trained anew
    under the same name): the sha256 of its manifest's entries (every file's relative path, size
    and sha256), the same for its copies wherever they lie. None for a checkpoint without a
    readable manifest (written before checkpoints had one)."""
    try:
        files = json.loads((Path(path) / MANIFEST_FILE).read_text(encoding="utf-8"))["files"]
        entries = sorted((str(name), int(entry["size"]), str(entry["sha256"])) for name, entry in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


def latest_verified_checkpoint(root: str | Path, digests: bool = True,
                               log: bool = True) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest complete checkpoint under ``root`` that passes :func:`verify_checkpoint`
    (with ``digests``, or by size only).

    Every ``step_*`` directory is tried, newest first (one that lost its ``trainer_state.json``
    too: it fails, and is reported instead of being passed over in silence); each one that fails
    is skipped, with a logged warning (``log``) that names it and says why.

    Returns:
        (the checkpoint, or None if none verifies or there is none; the skipped checkpoints,
        newest first, each with the reason).
    """
    root = Path(root)
    steps = {} if not root.is_dir() else {
        int(match.group(1)): path for path in root.iterdir()
        if path.is_dir() and (match := STEP_DIR_RE.fullmatch(path.name))}
    skipped: list[tuple[Path, str]] = []
    for candidate in (steps[step] for step in sorted(steps, reverse=True)):
        try:
            verify_checkpoint(candidate, digests=digests)
        except CheckpointCorruptError as err:
            if log:
                logger.warning("skipping checkpoint %s: %s", candidate, err)
            skipped.append((candidate, str(err)))
            continue
        return candidate, skipped
    return None, skipped


def reject_checkpoint(path: str | Path) -> Path:
    """Set a checkpoint that failed verification aside: rename it ``<name>.rejected`` (``.rejected.2``
    ... if taken), so that it is never read again and its step can be saved anew; nothing is deleted.

    Returns:
        the new path.
    """
    path = Path(path)
    target, n = path.with_name(path.name + REJECTED_SUFFIX), 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}{REJECTED_SUFFIX}.{n}")
    os.replace(path, target)
    fsync(path.parent)
    logger.warning("set checkpoint %s aside as %s", path, target.name)
    return target


def checkpoint_ranks(path: str | Path) -> int:
    """The number of workers that wrote checkpoint ``path``: every rank writes its own RNG states
    (``rng_rank<r>.safetensors``, :func:`~vla_rl.checkpoints.files.save_rng`); 0 if it has none."""
    return len({match.group(1) for file in Path(path).iterdir() if (match := _RNG_FILE_RE.fullmatch(file.name))})


def checkpoint_strategy(path: str | Path) -> str | None:
    """The ``trainer.strategy`` that wrote checkpoint ``path``: ``fsdp`` (the actor's sharded state,
    ``actor_sharded/``), ``ddp`` (``optimizer.json``), or None (it holds no actor state)."""
    path = Path(path)
    if is_sharded_dir(path / ACTOR_SHARDED_DIR):
        return "fsdp"
    return "ddp" if (path / "optimizer.json").is_file() else None


def stored_policy_shapes(path: str | Path) -> tuple[Path, dict[str, tuple[int, ...]]] | None:
    """The policy's tensor names and shapes in checkpoint ``path``, without reading any tensor:
    the header of ``model.safetensors`` (DDP; tied tensors are stored once, under one of their
    names), or the ``model.<name>`` entries of the sharded actor state's DCP ``.metadata`` (FSDP).

    Returns:
        (the file read, name -> shape), or None: the checkpoint holds neither, or the file is
        unreadable (a damaged checkpoint: the resume's verification reports it).
    """
    from policies.checkpoint_files import read_safetensors_header

    path = Path(path)
    model = path / "model.safetensors"
    if model.is_file():
        try:
            return model, {name: tuple(shape) for name, (_, shape) in read_safetensors_header(model).items()}
        except (OSError, ValueError):
            return None
    sharded = path / ACTOR_SHARDED_DIR
    if not is_sharded_dir(sharded):
        return None
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        metadata = FileSystemReader(str(sharded)).read_metadata()
    except Exception:  # noqa: BLE001 - DCP raises many kinds for a damaged file; verification names it
        return None
    return sharded / ".metadata", {
        name.removeprefix("model."): tuple(entry.size) for name, entry in metadata.state_dict_metadata.items()
        if name.startswith("model.") and isinstance(entry, TensorStorageMetadata)}


def _check_structure(path: Path) -> None:
    """Open every safetensors and JSON file of a checkpoint without a manifest; raise
    :class:`CheckpointCorruptError` naming those that cannot be read."""
    problems: list[tuple[Path, Exception | str]] = []
    if not (path / TRAINER_STATE_FILE).is_file():
        problems.append((path / TRAINER_STATE_FILE, "missing"))
    for file in sorted(path.iterdir()):
        try:
            if file.suffix == ".safetensors":
                with safe_open(str(file), framework="pt") as opened:  # reads the header, checks the extent
                    opened.keys()
            elif file.suffix == ".json":
                json.loads(file.read_text(encoding="utf-8"))
        except (SafetensorError, OSError, ValueError) as err:
            problems.append((file, err))
    if problems:
        raise CheckpointCorruptError(f"checkpoint {path} (no manifest) is corrupted: "
                                     + "; ".join(f"{file} is unreadable ({err})" for file, err in problems),
                                     [file for file, _ in problems])


def _checkpoint_files(directory: Path) -> list[Path]:
    """The files of a checkpoint directory, its subdirectories' included (the sharded-state
    directories, a text run's ``hf_model/``, which another run loads as ``text.model_path``)."""
    return sorted(path for path in directory.rglob("*") if path.is_file())


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
