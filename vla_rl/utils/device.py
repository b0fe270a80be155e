"""Device abstraction: which torch device a worker binds to and which collective backend its
process group uses (CPU → gloo, CUDA → nccl, Ascend NPU → hccl).

``torch_npu`` is imported only where it is installed and only when an NPU is asked for.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Literal

import torch

DeviceKind = Literal["cpu", "cuda", "npu"]

_BACKENDS: dict[str, str] = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


def _import_torch_npu() -> None:
    if importlib.util.find_spec("torch_npu") is None:
        raise RuntimeError("workers.device=npu needs the torch_npu package, which is not installed")
    importlib.import_module("torch_npu")


def collective_backend(kind: DeviceKind) -> str:
    """The torch.distributed backend for a device kind: ``gloo``, ``nccl`` or ``hccl``.

    Raises:
        ValueError: for an unknown device kind.
    """
    try:
        return _BACKENDS[kind]
    except KeyError:
        raise ValueError(f"unknown device kind {kind!r}; known: {sorted(_BACKENDS)}") from None


def bind_device(kind: DeviceKind, local_index: int = 0) -> torch.device:
    """Bind this process to its device and return it.

    Args:
        kind: ``cpu``, ``cuda`` or ``npu``.
        local_index: which accelerator of this node (ignored on CPU). Ray sets
            ``CUDA_VISIBLE_DEVICES`` per actor, so this is usually 0.

    Raises:
        RuntimeError: if the requested accelerator is not available.
    """
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("workers.device=cuda but torch.cuda.is_available() is False")
        torch.cuda.set_device(local_index)
        return torch.device("cuda", local_index)
    if kind == "npu":
        _import_torch_npu()
        torch.npu.set_device(local_index)  # type: ignore[attr-defined]
        return torch.device("npu", local_index)
    raise ValueError(f"unknown device kind {kind!r}; known: {sorted(_BACKENDS)}")
