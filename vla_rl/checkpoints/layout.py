"""What a training checkpoint is on disk: its file and directory names, the errors its readers and
writers raise, and the small file helpers every checkpoint module shares.

A checkpoint is a directory ``<root>/step_{step:08d}/`` holding::

    model.safetensors                     module state dict (parameters and persistent buffers)
    actor_sharded/                        instead of model.safetensors and optimizer.* under
                                          trainer.strategy fsdp: the actor's weights and optimizer
                                          state, sharded (torch.distributed.checkpoint;
                                          vla_rl.checkpoints.sharded)
    optimizer.safetensors, optimizer.json torch optimizer state dict: its tensors, and the JSON-able
                                          rest with references to them (reassembled exactly)
    <name>.safetensors (+ .json)          further modules and optimizers saved under their own name
                                          (e.g. ``critic``, ``critic_optimizer``, ``reference``)
    critic_sharded/                       instead of critic.* and critic_optimizer.* under
                                          trainer.strategy fsdp (PPO with GAE), as actor_sharded/
    rng_rank{r}.safetensors, .json        per rank: torch CPU RNG state, a torch.Generator state,
                                          a numpy Generator's bit-generator state
    trainer_state.json                    {"step": step, "metadata": {...}}; metadata "run": the
                                          driver's state at that step ({"env_steps": float})
    manifest.json                         every other file's size and sha256 (written last)

The package's modules stand on this one and never import each other upwards:
:mod:`~vla_rl.checkpoints.sharded` (the FSDP actor's DCP state) and
:mod:`~vla_rl.checkpoints.integrity` (manifests, verification, fallback) import only this module;
:mod:`~vla_rl.checkpoints.files` (saving, publishing and loading) imports all three.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

FORMAT_VERSION = 1
LATEST_FILE = "latest"
TRAINER_STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
REJECTED_SUFFIX = ".rejected"
#: The key of ``trainer_state.json``'s metadata holding the driver's state at the checkpoint's
#: step (``{"env_steps": ...}``): what a resume continues counting from.
RUN_STATE_KEY = "run"
#: The DCP directory of the actor inside a checkpoint.
ACTOR_SHARDED_DIR = "actor_sharded"
#: The DCP directory of the critic (PPO with GAE) inside a checkpoint, in the same form.
CRITIC_SHARDED_DIR = "critic_sharded"
#: The file DCP's coordinator writes last; a directory holding it is a complete DCP checkpoint.
DCP_METADATA = ".metadata"
STEP_DIR_RE = re.compile(r"step_(\d{8,})")
STAGING_RE = re.compile(r"\.step_(\d{8,})\.tmp")


class NonFiniteTensorError(ValueError):
    """A tensor about to be saved holds inf or NaN; the message names the file and the tensor."""


class CheckpointCorruptError(ValueError):
    """A checkpoint file that is missing, truncated or altered; the message names every such file.

    Attributes:
        files: the offending files.
    """

    def __init__(self, message: str, files: list[Path]) -> None:
        super().__init__(message)
        self.files = files

    def __reduce__(self):  # pickled with both arguments: a worker's error reaches the driver intact
        return type(self), (str(self), self.files)


def check_finite(tensors: Mapping[str, torch.Tensor], file: Path) -> None:
    """Check that every floating (and complex) tensor of ``tensors`` is finite.

    Args:
        tensors: name to tensor (any shape, any device).
        file: the file they are about to be written to (for the message).

    Raises:
        NonFiniteTensorError: naming ``file``, the first non-finite tensor, its shape and how many
            of its values are inf or NaN, and how many tensors are affected in all.
    """
    bad = [name for name, value in tensors.items() if not all_finite(value)]
    if bad:
        value = tensors[bad[0]]
        count = int((~torch.isfinite(value)).sum())
        others = f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""
        raise NonFiniteTensorError(
            f"refusing to write {file}: tensor {bad[0]!r} {tuple(value.shape)} holds {count} non-finite values "
            f"(inf/NaN) of {value.numel()}{others}; the training state diverged")


def all_finite(value: torch.Tensor) -> bool:
    """Whether every value of a floating or complex tensor is finite (other dtypes always are).

    One ``aminmax`` pass (NaN propagates into both, inf into one) is about 40x faster on the CPU
    than ``isfinite(value).all()``, which materialises a boolean tensor the size of ``value``.
    """
    if not (value.is_floating_point() or value.is_complex()) or value.numel() == 0:
        return True
    if value.is_complex():
        return bool(torch.isfinite(value).all())
    try:
        low, high = torch.aminmax(value.detach())
    except (RuntimeError, NotImplementedError):  # a dtype without aminmax on this device
        return bool(torch.isfinite(value).all())
    return bool(torch.isfinite(low) & torch.isfinite(high))


def is_sharded_dir(path: str | Path) -> bool:
    """Whether ``path`` is a torch.distributed.checkpoint directory (it holds DCP's ``.metadata``)."""
    return (Path(path) / DCP_METADATA).is_file()


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path``; raises TypeError naming ``path`` for a value JSON cannot hold."""
    try:
        text = json.dumps(obj, indent=1)
    except TypeError as err:
        raise TypeError(f"{path}: {err}") from err
    path.write_text(text, encoding="utf-8")


def read_json(path: Path) -> Any:
    """The JSON in ``path``; raises :class:`CheckpointCorruptError` naming it when it is not valid JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointCorruptError(f"{path} is not valid JSON (corrupted or truncated?): {err}", [path]) from err


def load_tensors(file: Path) -> dict[str, torch.Tensor]:
    """``load_file`` of a checkpoint file, naming the file when it is missing or unreadable."""
    try:
        return load_file(str(existing_file(file)))
    except SafetensorError as err:
        raise unreadable(file, err) from err


def unreadable(file: Path, err: Exception) -> CheckpointCorruptError:
    """The error for checkpoint ``file`` that ``err`` kept from being read."""
    return CheckpointCorruptError(f"{file} is corrupted or truncated: {err}", [file])


def existing_file(path: Path) -> Path:
    """``path``, or FileNotFoundError naming it when the checkpoint file is missing."""
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file {path} is missing")
    return path


def fsync(path: Path) -> None:
    """Flush a file's or directory's contents (directory entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
