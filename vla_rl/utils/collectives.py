"""Collectives over the DAG workers' process group that torch.distributed lacks."""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist

#: Bytes of pickled object each rank may send in :func:`all_gather_small_objects`'s single
#: collective; larger objects take ``all_gather_object``'s two.
SMALL_OBJECT_BYTES = 16 * 1024

_HEADER_BYTES = 8  # the pickle's length, or 2**63 - 1 when it does not fit


def all_gather_small_objects(obj: Any, group: dist.ProcessGroup | None = None,
                             capacity: int = SMALL_OBJECT_BYTES) -> list[Any]:
    """``dist.all_gather_object`` in one collective when every rank's object is small.

    ``all_gather_object`` first all-gathers the pickles' sizes, then the pickles: two
    collectives, each a round of latency (on gloo over loopback, measured 0.3-1.5 ms per
    collective on the 2-core machine). Metadata and metrics are a few hundred bytes, so each
    rank instead sends a fixed ``capacity``-byte buffer holding its pickle in one
    ``all_gather_single``; if any rank's pickle does not fit, every rank learns it from the
    same collective and they all fall back to ``all_gather_object``.

    Called collectively by every rank of ``group``.

    Args:
        obj: a picklable object (only exchanged between the project's own workers).
        group: the process group (default: the default group).
        capacity: bytes of pickle that travel in the single collective.

    Returns:
        Every rank's object, by rank.
    """
    world = dist.get_world_size(group)
    payload = pickle.dumps(obj)
    fits = len(payload) <= capacity
    send = torch.zeros(_HEADER_BYTES + capacity, dtype=torch.uint8)
    send[:_HEADER_BYTES] = torch.tensor([len(payload) if fits else 2**63 - 1], dtype=torch.int64).view(torch.uint8)
    if fits:
        send[_HEADER_BYTES : _HEADER_BYTES + len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    device = _collective_device(group)
    received = torch.empty(world * (_HEADER_BYTES + capacity), dtype=torch.uint8, device=device)
    all_gather_into_one(received, send.to(device), group=group)
    received = received.cpu().view(world, _HEADER_BYTES + capacity)
    lengths = received[:, :_HEADER_BYTES].contiguous().view(torch.int64).squeeze(-1).tolist()
    if any(length > capacity for length in lengths):
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, obj, group=group)
        return gathered
    return [pickle.loads(received[rank, _HEADER_BYTES : _HEADER_BYTES + length].numpy().tobytes())
            for rank, length in enumerate(lengths)]


def all_gather_into_one(output: torch.Tensor, tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
    """Every rank's ``tensor``, concatenated by rank into ``output`` (``dist.all_gather_single``;
    torch < 2.13, which lacks it, ``dist.all_gather_into_tensor``)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, tensor, group=group)


def _collective_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where ``group``'s small collectives take their tensors: the CPU when the group has gloo
    (a CPU group, or an accelerator group created ``cpu:gloo,cuda:nccl``), else this process's
    accelerator (the device the worker bound)."""
    if "gloo" in str(dist.get_backend(group)):
        return torch.device("cpu")
    accelerator = torch.accelerator.current_accelerator()
    return torch.device(accelerator.type, torch.accelerator.current_device_index())
