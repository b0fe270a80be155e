"""Atomic training checkpoints: saving, publishing and loading model and optimizer state in
safetensors and RNG states per rank (the layout: :mod:`vla_rl.checkpoints.layout`).

Protocol for several ranks: every rank writes its files into ``<root>/.step_{step:08d}.tmp/``
(:func:`save_checkpoint`; rank 0 also writes the model, optimizer and trainer state of a
replicated model); after a barrier the caller runs, rank 0 calls :func:`finalize_checkpoint`,
which writes the manifest of everything staged, fsyncs the files, renames the staging directory
to its final name in one ``os.replace`` and atomically rewrites ``<root>/latest``. A crash at
any point leaves either the previous checkpoints or the new complete one; staging directories
are never read.

Nothing lost, nothing silent:

* **No non-finite state.** :func:`save_model` and :func:`save_optimizer` check every floating
  tensor before they write their file and raise
  :class:`~vla_rl.checkpoints.layout.NonFiniteTensorError` naming the file and the tensor
  (weights full of inf/NaN from a diverged update are never published as ``latest``).
* **Checksums and fallback** (:mod:`vla_rl.checkpoints.integrity`): the manifest is written and
  verified there, a corrupted checkpoint is set aside there, and a resume continues from the
  newest checkpoint that verifies; the loaders here raise
  :class:`~vla_rl.checkpoints.layout.CheckpointCorruptError`, naming the file they could not read.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from safetensors.torch import load_model as _load_model_file
from safetensors.torch import save_model as _save_model_file

from vla_rl.checkpoints.integrity import write_manifest
from vla_rl.checkpoints.layout import (
    ACTOR_SHARDED_DIR,
    FORMAT_VERSION,
    LATEST_FILE,
    RUN_STATE_KEY,
    STAGING_RE,
    STEP_DIR_RE,
    TRAINER_STATE_FILE,
    check_finite,
    existing_file,
    fsync,
    is_sharded_dir,
    load_tensors,
    read_json,
    unreadable,
    write_json,
)
from vla_rl.checkpoints.sharded import load_sharded_model
from vla_rl_core.dir_lock import release_directory, take_for_removal
from vla_rl_core.file_modes import apply_default_modes
from vla_rl_core.run_layout import CHECKPOINTS_DIR, METRICS_FILE, RUN_TEMPLATE, SWEEP_FILE

logger = logging.getLogger(__name__)

# Markers of the JSON encoding of nested state; plain dicts never have keys starting with "__".
_TENSOR, _TUPLE, _DICT, _NDARRAY = "__tensor__", "__tuple__", "__dict__", "__ndarray__"


def checkpoint_dir(root: str | Path, step: int) -> Path:
    """Final directory of the checkpoint of ``step``: ``<root>/step_{step:08d}``."""
    return Path(root) / f"step_{step:08d}"


def staging_dir(root: str | Path, step: int) -> Path:
    """Staging directory ``<root>/.step_{step:08d}.tmp`` of ``step``, created if missing.

    Raises:
        ValueError: ``step`` is not a non-negative int.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"checkpoint step must be a non-negative int, got {step!r}")
    path = Path(root) / f".step_{step:08d}.tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_model(directory: str | Path, module: torch.nn.Module, name: str = "model") -> None:
    """Write ``module``'s state dict to ``<directory>/<name>.safetensors`` (tied weights once).

    Raises:
        NonFiniteTensorError: a floating tensor of the state dict holds inf or NaN (checked
            before anything is written).
    """
    file = Path(directory) / f"{name}.safetensors"
    check_finite(module.state_dict(), file)
    _save_model_file(module, str(file))


def save_module_part(directory: str | Path, module: torch.nn.Module, exclude: Collection[str],
                     name: str) -> None:
    """Write ``module``'s state dict but the entries named in ``exclude`` (tensors another
    checkpointed module holds: the reference's share of the policy's frozen parameters) to
    ``<directory>/<name>.safetensors``; a tensor under several names (tied weights) once, under
    its first. Read back by :func:`load_module_part`.

    Raises:
        NonFiniteTensorError: a floating tensor written holds inf or NaN (checked before
            anything is written).
    """
    file = Path(directory) / f"{name}.safetensors"
    tensors: dict[str, torch.Tensor] = {}
    written: set[int] = set()
    for key, tensor in module.state_dict(keep_vars=True).items():
        if key not in exclude and id(tensor) not in written:
            written.add(id(tensor))
            tensors[key] = tensor.detach().contiguous()
    check_finite(tensors, file)
    save_file(tensors, str(file))


def save_optimizer(directory: str | Path, optimizer: torch.optim.Optimizer, name: str = "optimizer") -> None:
    """Write ``optimizer.state_dict()`` as ``<name>.safetensors`` + ``<name>.json``.

    Raises:
        TypeError: the state dict holds a value that is neither a tensor nor JSON-able.
        NonFiniteTensorError: a floating state tensor (e.g. Adam's ``exp_avg``) holds inf or NaN
            (checked before anything is written).
    """
    directory = Path(directory)
    tensors: dict[str, torch.Tensor] = {}
    json_path = directory / f"{name}.json"
    encoded = _encode(optimizer.state_dict(), tensors, "state_dict", json_path)
    file = directory / f"{name}.safetensors"
    check_finite({key.partition(":")[2]: value for key, value in tensors.items()}, file)
    save_file(tensors, str(file))
    write_json(json_path, {"format_version": FORMAT_VERSION, "state_dict": encoded})


def save_rng(
    directory: str | Path,
    rank: int,
    generator: torch.Generator | None = None,
    np_rng: np.random.Generator | None = None,
    device: torch.device | None = None,
) -> None:
    """Write this rank's RNG states to ``rng_rank{rank}.safetensors`` and ``.json``.

    Saves the torch CPU RNG state always; the default generator of ``device`` (the worker's
    own) when it is an accelerator (CUDA, NPU: what dropout on the device draws from, e.g.
    LoRA dropout), as verl's checkpoints do; ``generator``'s state and ``np_rng``'s
    bit-generator state when given. A CPU worker (``device`` None or the CPU) leaves the
    accelerators alone, even where its process sees some (a process of the user's; the engine's
    CPU workers see none, :data:`vla_rl.workers.placement.CPU_WORKER_ENV`): reading a GPU's
    generator would initialise CUDA in it.
    """
    directory = Path(directory)
    tensors = {"torch_cpu": torch.get_rng_state()}
    accelerator = _accelerator_module(device)
    if accelerator is not None:
        tensors["torch_accelerator"] = accelerator.get_rng_state(device)
    if generator is not None:
        tensors["torch_generator"] = generator.get_state()
    json_path = directory / f"rng_rank{rank}.json"
    numpy_state = None
    if np_rng is not None:
        numpy_state = _encode(np_rng.bit_generator.state, {}, "numpy", json_path)
    save_file(tensors, str(directory / f"rng_rank{rank}.safetensors"))
    write_json(json_path, {"format_version": FORMAT_VERSION, "numpy": numpy_state})


def _accelerator_module(device: torch.device | None):
    """``torch.cuda`` (``torch.npu``, ...) when ``device`` is an accelerator, else None (no
    device, or the CPU)."""
    if device is None or device.type == "cpu":
        return None
    return torch.get_device_module(device.type)


def save_trainer_state(
    directory: str | Path, step: int, metadata: dict[str, Any] | None = None
) -> None:
    """Write ``trainer_state.json``: the step and free-form JSON-able ``metadata``.

    Raises:
        TypeError: ``metadata`` is not JSON-serialisable.
    """
    write_json(Path(directory) / TRAINER_STATE_FILE, {"step": step, "metadata": metadata or {}})


def save_checkpoint(
    root: str | Path,
    step: int,
    *,
    rank: int = 0,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    generator: torch.Generator | None = None,
    np_rng: np.random.Generator | None = None,
    metadata: dict[str, Any] | None = None,
    device: torch.device | None = None,
) -> Path:
    """Write one rank's part of the checkpoint of ``step`` into its staging directory.

    Every rank calls this (its RNG states are saved, ``device``'s generator among them when it is
    an accelerator: :func:`save_rng`); pass ``model`` and ``optimizer`` on the rank(s) that own
    them. Rank 0 also writes ``trainer_state.json``. Then the caller runs a barrier and rank 0
    calls :func:`finalize_checkpoint`.

    Returns:
        the staging directory.

    Raises:
        ValueError: ``step`` or ``rank`` is negative or not an int.
        TypeError: optimizer state or metadata that cannot be stored.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be a non-negative int, got {rank!r}")
    directory = staging_dir(root, step)
    if model is not None:
        save_model(directory, model)
    if optimizer is not None:
        save_optimizer(directory, optimizer)
    save_rng(directory, rank, generator=generator, np_rng=np_rng, device=device)
    if rank == 0:
        save_trainer_state(directory, step, metadata)
    return directory


def finalize_checkpoint(root: str | Path, step: int, keep_last: int | None = None) -> Path:
    """Publish the staged checkpoint of ``step`` (rank 0, after every rank saved and a barrier).

    Gives the staged files and directories the permissions the umask gives new ones
    (:func:`vla_rl_core.file_modes.apply_default_modes`: safetensors writes its files 0600, which
    a server or teammate running as another user cannot read), writes ``manifest.json`` (size
    and sha256 of every staged file, :func:`~vla_rl.checkpoints.integrity.write_manifest`),
    fsyncs the staged files, renames the staging directory to ``step_{step:08d}``, rewrites ``<root>/latest`` atomically, then, if
    ``keep_last`` is given, removes all but the newest ``keep_last`` checkpoints (keeping, until a
    later call, those a ``vla-rl eval`` holds while it reads them) and the staging directories of
    earlier steps.

    Returns:
        the final checkpoint directory.

    Raises:
        FileNotFoundError: nothing is staged for ``step`` or ``trainer_state.json`` is missing.
        FileExistsError: the final directory already exists.
        ValueError: ``keep_last`` is not a positive int.
    """
    if keep_last is not None and (
        isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
    ):
        raise ValueError(f"keep_last must be a positive int or None, got {keep_last!r}")
    root = Path(root)
    staged = root / f".step_{step:08d}.tmp"
    final = checkpoint_dir(root, step)
    if not staged.is_dir():
        raise FileNotFoundError(f"no staged checkpoint at {staged}; call save_checkpoint first")
    if not (staged / TRAINER_STATE_FILE).is_file():
        raise FileNotFoundError(f"{staged / TRAINER_STATE_FILE} is missing: rank 0 saves it")
    if final.exists():
        raise FileExistsError(f"checkpoint {final} already exists")
    apply_default_modes(staged)
    write_manifest(staged)
    for path in staged.iterdir():
        if path.is_dir() and is_sharded_dir(path):
            for file in path.iterdir():
                fsync(file)
        fsync(path)
    fsync(staged)
    os.replace(staged, final)
    fsync(root)
    point_latest(root, final)
    if keep_last is not None:
        _prune(root, keep_last, step)
    return final


def point_latest(root: str | Path, checkpoint: Path) -> None:
    """Atomically rewrite ``<root>/latest`` to name ``checkpoint`` (a directory under ``root``)."""
    root = Path(root)
    latest_tmp = root / f".{LATEST_FILE}.tmp"
    with open(latest_tmp, "w", encoding="utf-8") as f:
        f.write(checkpoint.name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(latest_tmp, root / LATEST_FILE)
    fsync(root)


def discard_staging(root: str | Path, step: int | None = None) -> None:
    """Remove the staging directory of ``step`` (None: of every step): a failed or interrupted save."""
    root = Path(root)
    if not root.is_dir():
        return
    for path in root.iterdir():
        match = STAGING_RE.fullmatch(path.name)
        if match and (step is None or int(match.group(1)) == step):
            shutil.rmtree(path)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or ``None``.

    Reads ``<root>/latest`` and scans the ``step_*`` directories, so a checkpoint published
    just before a crash that prevented the pointer update still counts, and a missing or stale
    ``latest`` is harmless. Staging (``.step_*.tmp``) directories are ignored.
    """
    root = Path(root)
    if not root.is_dir():
        return None
    candidates = [p for p in root.iterdir() if _complete_step(p) is not None]
    latest = root / LATEST_FILE
    if latest.is_file():
        pointed = root / latest.read_text(encoding="utf-8").strip()
        if _complete_step(pointed) is not None:
            candidates.append(pointed)
    return max(candidates, key=_complete_step, default=None)


#: What a run without ``checkpoints/`` lacks, as the commands taking a run's checkpoints say it.
NO_CHECKPOINT_YET = "has no checkpoint yet (a run writes its first after trainer.save_every steps, and at its end)"


def is_run_without_checkpoints(path: Path) -> bool:
    """Whether ``path`` is a run directory that has logged metrics but written no checkpoint
    (``template.yaml`` and ``metrics.jsonl``, no ``checkpoints/``): a run in progress, or one that
    stopped before its first checkpoint."""
    return (path / RUN_TEMPLATE).is_file() and (path / METRICS_FILE).is_file() and not (path / CHECKPOINTS_DIR).is_dir()


def run_checkpoint(path: str | Path) -> Path:
    """``path`` itself, or, when ``path`` is a run directory (it holds ``checkpoints/``), the run's
    newest complete checkpoint (:func:`latest_checkpoint`): what ``vla-rl serve`` and ``vla-rl
    export`` take.

    Raises:
        FileNotFoundError: ``path`` is a run directory without a complete checkpoint (also one
            that has written none yet: ``template.yaml`` and ``metrics.jsonl``, no ``checkpoints/``),
            or a seed sweep's directory (``sweep.json``: its runs are ``seed_<S>/``).
    """
    path = Path(path)
    if (path / SWEEP_FILE).is_file():  # its sweep.json and report.json passed it for an export
        raise FileNotFoundError(f"{path} is a sweep of seeds: name one of its runs, e.g. {path / 'seed_<S>'}")
    if not (path / CHECKPOINTS_DIR).is_dir():
        if is_run_without_checkpoints(path):
            raise FileNotFoundError(f"run {path} {NO_CHECKPOINT_YET}")
        return path
    latest = latest_checkpoint(path / CHECKPOINTS_DIR)
    if latest is None:
        raise FileNotFoundError(f"run {path} has no complete checkpoint")
    return latest


def checkpoint_step(path: str | Path) -> int | None:
    """The step of the complete checkpoint directory ``path`` (``step_00000006``: 6), or None."""
    return _complete_step(Path(path))


def complete_checkpoints(root: str | Path) -> list[Path]:
    """The complete checkpoints under ``root`` (``step_*`` with ``trainer_state.json``), oldest first;
    staging directories are ignored."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if _complete_step(p) is not None), key=_complete_step)


def load_model(path: str | Path, module: torch.nn.Module, strict: bool = True, name: str = "model") -> None:
    """Load ``<path>/<name>.safetensors`` into ``module`` (onto the module's devices).

    Raises:
        FileNotFoundError: the file is missing.
        RuntimeError: missing or unexpected keys (with ``strict``) or mismatched shapes; the
            message names the file.
        CheckpointCorruptError: the file is truncated or its header unreadable.
    """
    file = existing_file(Path(path) / f"{name}.safetensors")
    try:
        _load_model_file(module, str(file), strict=strict)
    except SafetensorError as err:
        raise unreadable(file, err) from err
    except RuntimeError as err:
        raise RuntimeError(f"{file}: {err}") from err


def load_module_part(path: str | Path, module: torch.nn.Module, exclude: Collection[str], name: str) -> None:
    """Load ``<path>/<name>.safetensors`` written by :func:`save_module_part` into ``module``:
    every entry of its state dict but those in ``exclude`` (which are left as they are, also
    when the file holds them: a checkpoint written whole), and but the second names of tied
    tensors.

    Raises:
        FileNotFoundError: the file is missing.
        RuntimeError: entries missing from the file, or in it but not in ``module``, or of
            another shape; the message names the file and the entries.
        CheckpointCorruptError: the file is truncated or its header unreadable.
    """
    file = existing_file(Path(path) / f"{name}.safetensors")
    try:
        tensors = load_file(str(file))
    except SafetensorError as err:
        raise unreadable(file, err) from err
    state = module.state_dict(keep_vars=True)
    present = {id(state[key]) for key in tensors if key in state}
    missing = sorted(key for key, tensor in state.items()
                     if key not in exclude and key not in tensors and id(tensor) not in present)
    unexpected = sorted(set(tensors) - set(state))
    if missing or unexpected:
        raise RuntimeError(f"{file}: does not fit the {type(module).__name__}: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    try:
        module.load_state_dict({key: tensor for key, tensor in tensors.items() if key not in exclude}, strict=False)
    except RuntimeError as err:
        raise RuntimeError(f"{file}: {err}") from err


def load_policy_weights(path: str | Path, module: torch.nn.Module) -> None:
    """Load a checkpoint's policy weights into ``module``, whatever strategy wrote them:
    ``model.safetensors`` (DDP: :func:`load_model`) or, without it, the weights of the sharded
    actor state (FSDP: :func:`vla_rl.checkpoints.sharded.load_sharded_model`, cast to
    ``module``'s dtypes).

    Raises:
        FileNotFoundError: the checkpoint holds neither.
        RuntimeError: missing or unexpected names or mismatched shapes; the message names the file.
        CheckpointCorruptError: a file is truncated or unreadable.
    """
    path = Path(path)
    if not (path / "model.safetensors").is_file() and (path / ACTOR_SHARDED_DIR).is_dir():
        load_sharded_model(path, module)
        return
    load_model(path, module)


def load_optimizer(path: str | Path, optimizer: torch.optim.Optimizer, name: str = "optimizer") -> None:
    """Restore ``optimizer``'s state dict from ``<name>.safetensors`` + ``<name>.json``.

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: the files are inconsistent or do not match the optimizer's parameter groups;
            the message names the file (:class:`CheckpointCorruptError`: a truncated or unreadable file).
    """
    json_file = existing_file(Path(path) / f"{name}.json")
    tensors = load_tensors(Path(path) / f"{name}.safetensors")
    state_dict = _decode(read_json(json_file)["state_dict"], tensors, json_file)
    try:
        optimizer.load_state_dict(state_dict)
    except (ValueError, KeyError) as err:
        raise ValueError(f"{json_file} does not match the optimizer: {err}") from err


def load_rng(path: str | Path, rank: int) -> dict[str, Any]:
    """Read rank ``rank``'s RNG states.

    Returns:
        ``{"torch_cpu": uint8 Tensor, "torch_accelerator": uint8 Tensor | None, "torch_generator":
        uint8 Tensor | None, "numpy": bit-generator state dict | None}``, to pass to :func:`restore_rng`.

    Raises:
        FileNotFoundError: the rank's files are missing (saved with another world size?).
    """
    json_file = existing_file(Path(path) / f"rng_rank{rank}.json")
    tensors = load_tensors(Path(path) / f"rng_rank{rank}.safetensors")
    numpy_state = read_json(json_file)["numpy"]
    return {
        "torch_cpu": tensors["torch_cpu"],
        "torch_accelerator": tensors.get("torch_accelerator"),
        "torch_generator": tensors.get("torch_generator"),
        "numpy": None if numpy_state is None else _decode(numpy_state, {}, json_file),
    }


def restore_rng(
    state: dict[str, Any],
    generator: torch.Generator | None = None,
    np_rng: np.random.Generator | None = None,
    device: torch.device | None = None,
) -> None:
    """Restore the torch CPU RNG, ``device``'s default generator when it is an accelerator and
    the checkpoint holds one (a run resumed from CPU workers on GPUs keeps the GPU's, and the
    reverse ignores it), and, when given, ``generator`` and ``np_rng`` from ``state``.

    Args:
        state: the dict returned by :func:`load_rng`.
        device: this worker's device (:func:`save_rng`).

    Raises:
        ValueError: ``generator`` or ``np_rng`` is given but ``state`` holds no state for it.
    """
    torch.set_rng_state(state["torch_cpu"])
    accelerator = _accelerator_module(device)
    if accelerator is not None and state.get("torch_accelerator") is not None:
        accelerator.set_rng_state(state["torch_accelerator"], device)
    if generator is not None:
        if state["torch_generator"] is None:
            raise ValueError("the checkpoint holds no torch.Generator state for this rank")
        generator.set_state(state["torch_generator"])
    if np_rng is not None:
        if state["numpy"] is None:
            raise ValueError("the checkpoint holds no numpy Generator state for this rank")
        np_rng.bit_generator.state = state["numpy"]


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    """Read ``trainer_state.json``: ``{"step": int, "metadata": dict}``.

    Raises:
        FileNotFoundError: the file is missing.
    """
    return read_json(existing_file(Path(path) / TRAINER_STATE_FILE))


def load_run_state(path: str | Path) -> dict[str, Any]:
    """The driver's state a checkpoint records (its ``trainer_state.json`` metadata under
    :data:`~vla_rl.checkpoints.layout.RUN_STATE_KEY`: ``{"env_steps": ...}``); ``{}`` for a
    checkpoint written before checkpoints recorded it.

    Raises:
        FileNotFoundError: ``trainer_state.json`` is missing.
    """
    return dict(load_trainer_state(path)["metadata"].get(RUN_STATE_KEY) or {})


def _complete_step(path: Path) -> int | None:
    match = STEP_DIR_RE.fullmatch(path.name)
    if match is None or not (path / TRAINER_STATE_FILE).is_file():
        return None
    return int(match.group(1))


def _prune(root: Path, keep_last: int, step: int) -> None:
    """Remove all but the newest ``keep_last`` checkpoints (never ``step``'s) and the staging
    directories of earlier steps. Checkpoints are renamed out of sight before deletion; one an
    evaluation holds (:func:`vla_rl_core.dir_lock.hold_directory`) stays until a later prune."""
    complete = sorted(
        (p for p in root.iterdir() if _complete_step(p) is not None), key=_complete_step
    )
    doomed = [p for p in complete[:-keep_last] if _complete_step(p) != step]
    for path in doomed:
        fd = take_for_removal(path)
        if fd is None:
            logger.warning("keeping checkpoint %s past trainer.keep_last while an evaluation reads it; a later "
                           "checkpoint prunes it", path)
            continue
        hidden = root / f".{path.name}.deleting"
        try:
            os.replace(path, hidden)
        finally:
            release_directory(fd)
        shutil.rmtree(hidden)
    for path in root.iterdir():
        match = STAGING_RE.fullmatch(path.name)
        if (match and int(match.group(1)) < step) or path.name.endswith(".deleting"):
            shutil.rmtree(path)


def _encode(obj: Any, tensors: dict[str, torch.Tensor], where: str, file: Path) -> Any:
    """JSON-able form of nested state; tensors go into ``tensors`` and are referenced by key."""
    if isinstance(obj, torch.Tensor):
        key = f"{len(tensors)}:{where}"
        tensors[key] = obj.detach().cpu().contiguous()
        return {_TENSOR: key}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.ndarray):
        return {_NDARRAY: obj.tolist(), "dtype": obj.dtype.str}
    if isinstance(obj, (list, tuple)):
        items = [_encode(v, tensors, f"{where}.{i}", file) for i, v in enumerate(obj)]
        return {_TUPLE: items} if isinstance(obj, tuple) else items
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, tensors, f"{where}.{k}", file) for k, v in obj.items()}
        if not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in obj):
            raise TypeError(f"{file}: {where} has dict keys other than str/int: {list(obj)!r}")
        return {_DICT: [[k, _encode(v, tensors, f"{where}.{k}", file)] for k, v in obj.items()]}
    raise TypeError(f"{file}: cannot store {type(obj).__name__} at {where}")


def _decode(obj: Any, tensors: dict[str, torch.Tensor], file: Path) -> Any:
    """Inverse of :func:`_encode`."""
    if isinstance(obj, list):
        return [_decode(v, tensors, file) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if _TENSOR in obj:
        if obj[_TENSOR] not in tensors:
            raise ValueError(
                f"{file} refers to tensor {obj[_TENSOR]!r}, missing from its .safetensors"
            )
        return tensors[obj[_TENSOR]]
    if _TUPLE in obj:
        return tuple(_decode(v, tensors, file) for v in obj[_TUPLE])
    if _DICT in obj:
        return {k: _decode(v, tensors, file) for k, v in obj[_DICT]}
    if _NDARRAY in obj:
        return np.array(obj[_NDARRAY], dtype=np.dtype(obj["dtype"]))
    return {k: _decode(v, tensors, file) for k, v in obj.items()}
