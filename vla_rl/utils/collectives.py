"""Collectives over the DAG workers' process group, counted.

Every collective a step issues on the engine's data path goes through a function of this module
(the gradient all-reduces inside ``DistributedDataParallel`` excepted: they run in its C++
reducer), so that each worker process can say how many collectives it ran and how many bytes it
moved: :data:`COUNTERS`, read by the DAG worker around every phase it runs and reported as the
``comm/*`` metrics.

Bytes are counted per rank as the collective's algorithm moves them over the wire (what gloo
and NCCL do for these sizes), never the rank's own share that stays in place:

- all-gather of ``n`` bytes per rank (ring): ``(W - 1) * n`` sent and received;
- all-reduce of ``n`` bytes (ring: reduce-scatter, then all-gather): ``2 * n * (W - 1) / W`` sent
  and received;
- all-to-all: exactly the bytes addressed to (received from) the other ranks.

Counting never changes what a collective computes.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

#: Bytes of pickled object each rank may send in :func:`all_gather_small_objects`'s single
#: collective; larger objects take :func:`all_gather_objects`' two. Every rank receives this
#: many bytes from every other, whatever it holds: the counts and spans exchanged this way
#: pickle to 5-40 bytes.
SMALL_OBJECT_BYTES = 64

_HEADER_BYTES = 8  # the pickle's length, or 2**63 - 1 when it does not fit


@dataclass
class TagCounts:
    """Collectives and bytes of one kind of exchange on one rank."""

    collectives: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0


@dataclass
class CommCounters:
    """What this process's collectives moved, in total and by tag (``reshard_rows``,
    ``reshard_meta``, ``metrics``, ``srpo_reference``, ...; see the call sites).

    Attributes:
        tags: tag -> its counts.
    """

    tags: dict[str, TagCounts] = field(default_factory=dict)

    def add(self, tag: str, sent: int, received: int) -> None:
        """Count one collective of ``tag`` that sent and received these bytes on this rank."""
        counts = self.tags.setdefault(tag, TagCounts())
        counts.collectives += 1
        counts.bytes_sent += int(sent)
        counts.bytes_received += int(received)

    def snapshot(self) -> CommCounters:
        """A copy (to subtract later: :meth:`since`)."""
        return CommCounters({tag: TagCounts(c.collectives, c.bytes_sent, c.bytes_received)
                             for tag, c in self.tags.items()})

    def since(self, earlier: CommCounters) -> CommCounters:
        """What was counted after ``earlier`` (a :meth:`snapshot` of these counters)."""
        out = CommCounters()
        for tag, c in self.tags.items():
            before = earlier.tags.get(tag, TagCounts())
            delta = TagCounts(c.collectives - before.collectives, c.bytes_sent - before.bytes_sent,
                              c.bytes_received - before.bytes_received)
            if delta.collectives or delta.bytes_sent or delta.bytes_received:
                out.tags[tag] = delta
        return out

    def merged(self, other: CommCounters) -> CommCounters:
        """These counts plus ``other``'s."""
        out = self.snapshot()
        for tag, c in other.tags.items():
            mine = out.tags.setdefault(tag, TagCounts())
            mine.collectives += c.collectives
            mine.bytes_sent += c.bytes_sent
            mine.bytes_received += c.bytes_received
        return out

    @property
    def collectives(self) -> int:
        return sum(c.collectives for c in self.tags.values())

    @property
    def bytes_sent(self) -> int:
        return sum(c.bytes_sent for c in self.tags.values())

    @property
    def bytes_received(self) -> int:
        return sum(c.bytes_received for c in self.tags.values())


COUNTERS = CommCounters()
"""This process's counts since it started (a DAG worker reports the differences of each phase)."""


def all_gather_cost(world: int, nbytes: int) -> tuple[int, int]:
    """``(sent, received)`` bytes of one rank in a ring all-gather of ``nbytes`` per rank."""
    return (world - 1) * nbytes, (world - 1) * nbytes


def all_reduce_cost(world: int, nbytes: int) -> tuple[int, int]:
    """``(sent, received)`` bytes of one rank in a ring all-reduce of ``nbytes``."""
    moved = 2 * nbytes * (world - 1) // world
    return moved, moved


def all_gather_small_objects(obj: Any, group: dist.ProcessGroup | None = None,
                             capacity: int = SMALL_OBJECT_BYTES, tag: str = "summaries") -> list[Any]:
    """``dist.all_gather_object`` in one collective when every rank's object is small.

    ``all_gather_object`` first all-gathers the pickles' sizes, then the pickles: two
    collectives, each a round of latency (on gloo over loopback, measured 0.3-1.5 ms per
    collective on the 2-core machine). Counts and spans are tens of bytes, so each
    rank instead sends a fixed ``capacity``-byte buffer holding its pickle in one
    ``all_gather_single``; if any rank's pickle does not fit, every rank learns it from the
    same collective and they all fall back to :func:`all_gather_objects`. The fixed buffer is
    what every rank receives from every other: ``(W - 1) * capacity`` bytes per call.

    Called collectively by every rank of ``group``.

    Args:
        obj: a picklable object (only exchanged between the project's own workers).
        group: the process group (default: the default group).
        capacity: bytes of pickle that travel in the single collective.
        tag: the counters' tag of this exchange.

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
    device = collective_device(group)
    received = torch.empty(world * (_HEADER_BYTES + capacity), dtype=torch.uint8, device=device)
    all_gather_into_one(received, send.to(device), group=group, tag=tag)
    received = received.cpu().view(world, _HEADER_BYTES + capacity)
    lengths = received[:, :_HEADER_BYTES].contiguous().view(torch.int64).squeeze(-1).tolist()
    if any(length > capacity for length in lengths):
        return all_gather_objects(obj, group, tag=tag)
    return [pickle.loads(received[rank, _HEADER_BYTES : _HEADER_BYTES + length].numpy().tobytes())
            for rank, length in enumerate(lengths)]


def all_gather_objects(obj: Any, group: dist.ProcessGroup | None = None, tag: str = "summaries") -> list[Any]:
    """Every rank's picklable ``obj``, by rank, as ``dist.all_gather_object`` computes it and with
    its two collectives: the pickles' lengths (8 bytes each), then the pickles padded to the
    longest.

    Called collectively by every rank of ``group``.
    """
    world = dist.get_world_size(group)
    device = collective_device(group)
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    lengths = torch.empty(world, dtype=torch.int64, device=device)
    all_gather_into_one(lengths, torch.tensor([payload.numel()], dtype=torch.int64, device=device), group=group,
                        tag=tag)
    lengths = lengths.cpu().tolist()
    longest = max(lengths)
    send = torch.zeros(longest, dtype=torch.uint8)
    send[: payload.numel()] = payload
    received = torch.empty(world * longest, dtype=torch.uint8, device=device)
    all_gather_into_one(received, send.to(device), group=group, tag=tag)
    received = received.cpu().view(world, longest)
    return [pickle.loads(received[rank, :length].numpy().tobytes()) for rank, length in enumerate(lengths)]


def all_gather_into_one(output: torch.Tensor, tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                        tag: str = "summaries") -> None:
    """Every rank's ``tensor``, concatenated by rank into ``output`` (``dist.all_gather_single``;
    torch < 2.13, which lacks it, ``dist.all_gather_into_tensor``)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, tensor, group=group)
    COUNTERS.add(tag, *all_gather_cost(dist.get_world_size(group), tensor.numel() * tensor.element_size()))


def all_reduce(tensor: torch.Tensor, op: str = "sum", group: dist.ProcessGroup | None = None,
               tag: str = "summaries") -> None:
    """``dist.all_reduce`` of ``tensor`` in place with ``op`` (``sum``, ``max`` or ``min``)."""
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    dist.all_reduce(tensor, op=ops[op], group=group)
    COUNTERS.add(tag, *all_reduce_cost(dist.get_world_size(group), tensor.numel() * tensor.element_size()))


def all_to_all_rows(recv: torch.Tensor, send: torch.Tensor, recv_counts: Sequence[int], send_counts: Sequence[int],
                    group: dist.ProcessGroup | None = None, tag: str = "reshard_rows") -> None:
    """``dist.all_to_all_single`` of the rows of ``send`` (``send_counts[t]`` rows to rank ``t``,
    in rank order) into ``recv`` (``recv_counts[s]`` rows from rank ``s``); rows are the first
    dimension, both tensors share the row size. Counted: the bytes to and from the other ranks."""
    dist.all_to_all_single(recv, send, list(recv_counts), list(send_counts), group=group)
    rank = dist.get_rank(group)
    row = math.prod(send.shape[1:]) * send.element_size()
    sent = sum(count for t, count in enumerate(send_counts) if t != rank) * row
    received = sum(count for s, count in enumerate(recv_counts) if s != rank) * row
    COUNTERS.add(tag, sent, received)


def cpu_barrier(group: dist.ProcessGroup | None = None) -> None:
    """A barrier through gloo: an all-reduce of one CPU value. ``dist.barrier`` of an accelerator
    group (``cpu:gloo,cuda:nccl``) runs on NCCL, whose watchdog aborts the process after 10
    minutes, while the other ranks wait for one writing a large checkpoint or generating
    demonstrations; gloo waits for the group's timeout (torch's default: 30 minutes)."""
    dist.all_reduce(torch.zeros(1), group=group)


def collective_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where ``group``'s small collectives take their tensors: the CPU when the group has gloo
    (a CPU group, or an accelerator group created ``cpu:gloo,cuda:nccl``), else this process's
    accelerator (the device the worker bound)."""
    if "gloo" in str(dist.get_backend(group)):
        return torch.device("cpu")
    accelerator = torch.accelerator.current_accelerator()
    return torch.device(accelerator.type, torch.accelerator.current_device_index())
