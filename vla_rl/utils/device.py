"""Device abstraction: which torch device a worker binds to and which collective backends its
process group uses.

A CPU group uses gloo. An accelerator group is created with two backends, ``cpu:gloo,cuda:nccl``
(Ascend: ``cpu:gloo,npu:hccl``): collectives on accelerator tensors (DDP's gradient all-reduce,
FSDP) take the accelerator's backend, collectives on CPU tensors (the re-shards of batches, which
live on the CPU between nodes, and the small metadata and metric exchanges) take gloo — no tensor
is copied to the accelerator only to be reduced.

``torch_npu`` is imported only where it is installed and only when an NPU is asked for.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Literal

import torch

DeviceKind = Literal["cpu", "cuda", "npu", "auto"]

_BACKENDS: dict[str, str] = {"cpu": "gloo", "cuda": "cpu:gloo,cuda:nccl", "npu": "cpu:gloo,npu:hccl"}


def _import_torch_npu() -> None:
    if importlib.util.find_spec("torch_npu") is None:
        raise RuntimeError("workers.device=npu needs the torch_npu package, which is not installed")
    importlib.import_module("torch_npu")


def resolve_kind(kind: DeviceKind) -> str:
    """``auto``: the accelerator this process can use (``cuda``, else ``npu``), else ``cpu``;
    another kind unchanged."""
    if kind != "auto":
        return kind
    if torch.cuda.is_available():
        return "cuda"
    if importlib.util.find_spec("torch_npu") is not None:
        _import_torch_npu()
        if torch.npu.is_available():  # type: ignore[attr-defined]
            return "npu"
    return "cpu"


def collective_backend(kind: DeviceKind) -> str:
    """The torch.distributed backend string for a device kind: ``gloo``, ``cpu:gloo,cuda:nccl`` or
    ``cpu:gloo,npu:hccl`` (see the module docstring; ``auto`` is resolved first).

    Raises:
        ValueError: for an unknown device kind.
    """
    try:
        return _BACKENDS[resolve_kind(kind)]
    except KeyError:
        raise ValueError(f"unknown device kind {kind!r}; known: {sorted(_BACKENDS)}") from None


def use_tf32(device: torch.device) -> None:
    """On CUDA, turn on TF32 tensor cores for this process's float32 matrix products and
    convolutions (``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``:
    10 mantissa bits in the products, float32 accumulation), as verl and torchtitan train; on any
    other device, nothing. What computes in float32 outside autocast (critics, float32 policies)
    then computes alike in a DAG worker (:func:`bind_device`) and in ``vla-rl serve``."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def bind_device(kind: DeviceKind) -> torch.device:
    """Bind this process to its device and return it; on CUDA also turn on TF32 (:func:`use_tf32`).
    An accelerator is the process's first visible one, index 0: Ray sets ``CUDA_VISIBLE_DEVICES``
    (Ascend: ``ASCEND_RT_VISIBLE_DEVICES``) to each actor's own device.

    Args:
        kind: ``cpu``, ``cuda``, ``npu`` or ``auto`` (:func:`resolve_kind`).

    Raises:
        RuntimeError: if the requested accelerator is not available.
    """
    kind = resolve_kind(kind)
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("workers.device=cuda but torch.cuda.is_available() is False")
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
        use_tf32(device)
        return device
    if kind == "npu":
        _import_torch_npu()
        torch.npu.set_device(0)  # type: ignore[attr-defined]
        return torch.device("npu", 0)
    raise ValueError(f"unknown device kind {kind!r}; known: {sorted(_BACKENDS)}")
