"""Re-sharding a batch between two DP sizes, worker to worker, keeping groups whole.

Execution model (see :mod:`vla_rl.dag.planner`): with world size ``W`` a node at DP size ``d``
cuts the world into ``d`` contiguous blocks of ``W // d`` ranks; every rank of block ``k`` holds
shard ``k`` (ranks of one block are replicas). Between two nodes whose DP sizes differ, the batch
is re-sharded with one ``all_to_all_single`` over the worker process group:

1. the first rank of each source block is the *owner* of that shard and the only rank that sends;
2. every rank announces its shard's number of groups (owners) and a digest of its batch's schema
   (keys, dtypes, per-sample shapes) in one all-gather of 16 bytes per rank; when the destination
   keeps groups whole, the owners' group sizes follow in a second all-gather (8 bytes per group,
   padded to the largest shard's count). Metadata only, never sample data, and a few bytes per
   rank: what every rank receives grows with the world size by 16 bytes (+ 8 per group) per rank.
   When the digests differ (an empty shard whose batch lacks a key, say), the ranks exchange
   their schemas instead (:func:`~vla_rl.utils.collectives.all_gather_small_objects`), and the
   non-empty shards must agree;
3. the global sequence of groups (source shard 0, then 1, ...) is cut into ``d_dst`` contiguous
   pieces with sample counts as equal as group boundaries allow; a group is never split, unless
   the destination node does not compare a group's samples (a model update: its function is
   registered with ``whole_groups=False``), where every sample counts as its own group. At the
   same DP size (a *rebalance* before a model update) the shards are evened out moving the
   fewest rows instead: a shard keeps what its share allows, and only the surplus moves;
4. every sample row of every key is packed into one byte row, and one ``all_to_all_single``
   moves each owner's rows to every rank of the destination block that needs them.

Nested TensorDicts (e.g. camera observations under ``obs``, batch size ``(batch, T + 1)``) keep
their keys, dtypes (uint8 images move as bytes, unconverted) and batch dimensions.

The Ray driver is not involved: data moves only between the workers' processes (gloo over
loopback on CPU, nccl/hccl on accelerators).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from tensordict import TensorDict

from vla_rl.utils.collectives import (
    all_gather_cost,
    all_gather_into_one,
    all_gather_small_objects,
    all_to_all_rows,
    collective_device,
)
from vla_rl_core import keys


@dataclass(frozen=True)
class _FieldSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]  # per-sample shape

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def row_bytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


def group_sizes(uids: torch.Tensor) -> list[int]:
    """Sizes of the runs of equal consecutive values in ``uids`` (shape ``(batch,)``).

    Raises:
        ValueError: if a group id appears in two separate runs (groups must be contiguous).
    """
    if uids.numel() == 0:
        return []
    values, counts = torch.unique_consecutive(uids, return_counts=True)
    if values.unique().numel() != values.numel():
        raise ValueError("re-shard needs each group's samples to be contiguous in the batch")
    return counts.tolist()


def split_groups(sizes: list[int], num_parts: int) -> list[int]:
    """Cut a sequence of groups into ``num_parts`` contiguous pieces of near-equal sample counts.

    Args:
        sizes: sample count of each group, in global order.
        num_parts: number of destination shards.

    Returns:
        ``num_parts + 1`` group boundaries ``b``: piece ``k`` holds groups ``b[k]:b[k+1]``. Each
        boundary is the group boundary nearest to ``k * total / num_parts`` samples (ties go
        to the earlier boundary), so pieces differ by at most about one group.
    """
    cumulative = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    total = int(cumulative[-1])
    bounds = [0]
    for part in range(1, num_parts):
        target = part * total / num_parts
        nearest = int(np.argmin(np.abs(cumulative - target)))
        bounds.append(max(nearest, bounds[-1]))
    bounds.append(len(sizes))
    return bounds


def route(owner_group_sizes: list[list[int]], world: int, src_dp_size: int, dst_dp_size: int
          ) -> list[list[tuple[int, int]]]:
    """Which rows each source owner sends to each rank in a re-shard (no data needed: the
    planner's traffic estimates use it too, :mod:`vla_rl.dag.traffic`).

    Between two DP sizes, destination shard ``k`` gets the ``k``-th of ``dst_dp_size`` contiguous
    cuts of the global group order (:func:`split_groups`). A rebalance (the same DP size, single
    samples) moves the fewest rows (:func:`rebalance_ranges`).

    Args:
        owner_group_sizes: for each source shard, in order, the sample counts of its groups
            (every sample its own group of 1 when the destination balances single samples).
        world: the world size.
        src_dp_size, dst_dp_size: the DP sizes before and after (both divide ``world``).

    Returns:
        ``ranges[k][t] = (start, stop)``: the rows of source shard ``k`` (local indices) that rank
        ``t`` receives; ``(0, 0)`` for none. Every rank of a destination block receives its
        shard's rows (replicas), from the owner of each source shard (rank ``k * W / src_dp_size``).
        A rank receives its rows in global order (by source shard, then row).
    """
    dst_block = world // dst_dp_size
    counts = [sum(sizes) for sizes in owner_group_sizes]
    if src_dp_size == dst_dp_size and all(size == 1 for sizes in owner_group_sizes for size in sizes):
        by_shard = rebalance_ranges(counts)
    else:
        all_sizes = [size for sizes in owner_group_sizes for size in sizes]
        bounds = split_groups(all_sizes, dst_dp_size)
        group_starts = np.concatenate([[0], np.cumsum(all_sizes, dtype=np.int64)])
        # Global sample range of every destination shard, and of every owner's local shard.
        dst_ranges = [(int(group_starts[bounds[k]]), int(group_starts[bounds[k + 1]])) for k in range(dst_dp_size)]
        owner_offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        by_shard = []
        for owner_index in range(len(owner_group_sizes)):
            own_lo, own_hi = int(owner_offsets[owner_index]), int(owner_offsets[owner_index + 1])
            row = []
            for lo, hi in dst_ranges:
                start, stop = max(lo, own_lo), min(hi, own_hi)
                row.append((start - own_lo, stop - own_lo) if stop > start else (0, 0))
            by_shard.append(row)
    return [[row[rank // dst_block] for rank in range(world)] for row in by_shard]


def rebalance_ranges(counts: list[int]) -> list[list[tuple[int, int]]]:
    """Even out ``d`` shards of single samples moving the fewest rows.

    Each shard's target is ``n // d`` rows, plus one for the ``n % d`` shards holding the most
    (ties to the lower index), where ``n = sum(counts)``: no other assignment of equal targets
    moves fewer rows. A shard keeps its first ``min(count, target)`` rows; the surplus shards'
    remaining rows, in global order, fill the short shards in shard order, so exactly
    ``sum(max(0, count - target))`` rows move and each shard's rows stay in global order.

    Args:
        counts: each shard's row count, in shard order.

    Returns:
        ``ranges[k][j] = (start, stop)``: the rows of shard ``k`` (local indices) that shard ``j``
        holds afterwards; ``(0, 0)`` for none.
    """
    d = len(counts)
    base, extra = divmod(sum(counts), d)
    targets = [base] * d
    for k in sorted(range(d), key=lambda k: (-counts[k], k))[:extra]:
        targets[k] += 1
    short = [[k, targets[k] - counts[k]] for k in range(d) if counts[k] < targets[k]]
    ranges = [[(0, 0)] * d for _ in range(d)]
    for k, count in enumerate(counts):
        start = min(count, targets[k])
        ranges[k][k] = (0, start) if start else (0, 0)
        while start < count:
            receiver = short[0]
            stop = start + min(receiver[1], count - start)
            ranges[k][receiver[0]] = (start, stop)
            receiver[1] -= stop - start
            start = stop
            if receiver[1] == 0:
                short.pop(0)
    return ranges


def _schema(batch: TensorDict) -> list[_FieldSpec]:
    """Every tensor leaf's name, dtype and shape after the batch dimension.

    Raises:
        ValueError: a leaf holds non-tensor data (``NonTensorData``: strings, objects), which
            the all-to-all cannot move (it was left out of the batch, silently).
    """
    from tensordict import is_non_tensor

    other = [key for key, value in batch.items(include_nested=True) if is_non_tensor(value)]
    if other:
        raise ValueError(f"re-shard: {other[0]!r} holds non-tensor data, which a re-shard cannot move: every leaf "
                         "must be a tensor (encode strings as token ids, or keep them on the worker that read them)")
    return [
        _FieldSpec(name, value.dtype, tuple(value.shape[1:]))
        for name, value in sorted(batch.items(include_nested=True, leaves_only=True), key=lambda item: str(item[0]))
    ]


def _nested_batch_dims(batch: TensorDict) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    """``(key, batch dims after the first)`` of every nested TensorDict, shallowest first."""
    nested = [(key if isinstance(key, tuple) else (key,), tuple(value.batch_size[1:]))
              for key, value in batch.items(include_nested=True) if isinstance(value, TensorDict)]
    return sorted(nested, key=lambda item: (len(item[0]), item[0]))


def _restore_nested_batch_dims(out: TensorDict, nested: list[tuple[tuple[str, ...], tuple[int, ...]]]) -> None:
    for key, dims in nested:
        out.get(key).batch_size = [out.batch_size[0], *dims]


def _pack(batch: TensorDict, schema: list[_FieldSpec]) -> torch.Tensor:
    """All fields of each sample as one uint8 row: ``(batch, sum of row bytes)``."""
    n = batch.batch_size[0]
    parts = [batch.get(f.name).detach().contiguous().reshape(n, f.numel).view(torch.uint8) for f in schema]
    return torch.cat(parts, dim=1)


def _unpack(rows: torch.Tensor, schema: list[_FieldSpec]) -> TensorDict:
    n = rows.shape[0]
    out = TensorDict({}, batch_size=[n], device=rows.device)
    offset = 0
    for f in schema:
        chunk = rows[:, offset : offset + f.row_bytes].clone()  # fresh, aligned storage
        offset += f.row_bytes
        out.set(f.name, chunk.view(-1).view(f.dtype).reshape((n, *f.shape)))
    return out


def _batch_device(batch: TensorDict) -> torch.device:
    leaves = list(batch.values(include_nested=True, leaves_only=True))
    return leaves[0].device if leaves else torch.device("cpu")


def _digest(schema: list[_FieldSpec], nested: list) -> int:
    """A 63-bit digest of a batch's fields and nested batch dimensions."""
    text = repr(([(f.name, str(f.dtype), f.shape) for f in schema], nested)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def _metadata(batch: TensorDict, owners: list[int], is_owner: bool, group_key: str | None,
              group: dist.ProcessGroup | None) -> tuple[list[list[int]], list[_FieldSpec], list]:
    """Each owner's group sizes (in owner order), the batch's fields and its nested batch dims, as
    every rank learns them (step 2 of the module docstring)."""
    world = dist.get_world_size(group)
    device = collective_device(group)
    schema, nested = _schema(batch), _nested_batch_dims(batch)
    sizes = [] if not is_owner or len(batch) == 0 else (  # an empty shard may lack every key
        [1] * len(batch) if group_key is None else group_sizes(batch.get(group_key)))
    headers = torch.empty(world * 2, dtype=torch.int64, device=device)
    header = torch.tensor([len(sizes), _digest(schema, nested)], dtype=torch.int64, device=device)
    all_gather_into_one(headers, header, group=group, tag="reshard_meta")
    counts, digests = headers.view(world, 2).cpu().T.tolist()
    if len(set(digests)) > 1:
        return _metadata_by_objects(batch, owners, sizes if is_owner else None, group)
    if group_key is None:
        return [[1] * counts[r] for r in owners], schema, nested
    longest = max(counts[r] for r in owners)
    if longest == 0:
        return [[] for _ in owners], schema, nested
    padded = torch.zeros(longest, dtype=torch.int64)
    padded[: len(sizes)] = torch.tensor(sizes, dtype=torch.int64)
    gathered = torch.empty(world * longest, dtype=torch.int64, device=device)
    all_gather_into_one(gathered, padded.to(device), group=group, tag="reshard_meta")
    gathered = gathered.view(world, longest).cpu()
    return [gathered[r, : counts[r]].tolist() for r in owners], schema, nested


def metadata_cost(world: int, largest_shard_groups: int, whole_groups: bool) -> tuple[int, int]:
    """``(sent, received)`` bytes of one rank in a re-shard's metadata exchange when the ranks'
    fields agree: the 16-byte headers, and with whole groups each owner's group sizes (8 bytes
    each, padded to ``largest_shard_groups``)."""
    sent, received = all_gather_cost(world, 16)
    if whole_groups and largest_shard_groups:
        more = all_gather_cost(world, 8 * largest_shard_groups)
        sent, received = sent + more[0], received + more[1]
    return sent, received


def _metadata_by_objects(batch: TensorDict, owners: list[int], sizes: list[int] | None,
                         group: dist.ProcessGroup | None) -> tuple[list[list[int]], list[_FieldSpec], list]:
    """:func:`_metadata` when the ranks' batches differ in their fields: every owner sends its
    group sizes and fields; the fields of the first owner with samples are everyone's.

    Raises:
        ValueError: owners with samples disagree on their fields.
    """
    local = None if sizes is None else (sizes, [(f.name, f.dtype, f.shape) for f in _schema(batch)],
                                        _nested_batch_dims(batch))
    gathered = all_gather_small_objects(local, group, tag="reshard_meta")
    schemas = {tuple(gathered[r][1]) for r in owners if gathered[r][0]}
    if len(schemas) > 1:
        raise ValueError(f"re-shard: shards disagree on their fields: {sorted(schemas, key=repr)}")
    source = next((r for r in owners if gathered[r][0]), owners[0])
    schema = [_FieldSpec(name, dtype, tuple(shape)) for name, dtype, shape in gathered[source][1]]
    return [gathered[r][0] for r in owners], schema, gathered[source][2]


def reshard(
    batch: TensorDict,
    src_dp_size: int,
    dst_dp_size: int,
    group: dist.ProcessGroup | None = None,
    group_key: str | None = keys.UID,
) -> TensorDict:
    """Move ``batch`` from a ``src_dp_size`` sharding to a ``dst_dp_size`` sharding.

    Called collectively by every rank of ``group`` (all DAG workers) with its local batch.

    Args:
        batch: this rank's shard, batch dimension first, with int64 ``group_key`` of shape
            ``(batch,)`` whose equal values are contiguous (a group's samples side by side).
            Every leaf must be a tensor; all owners must share keys, dtypes and per-sample shapes.
        src_dp_size: DP size the batch is sharded at now (divides the world size).
        dst_dp_size: DP size wanted (divides the world size).
        group: process group of the DAG workers (default: the default group).
        group_key: key of the group ids; ``None`` treats every sample as its own group, so the
            destination shards are balanced sample by sample (for nodes that no longer compare
            a group's samples, such as a model update).

    Returns:
        This rank's shard at ``dst_dp_size``: whole groups (single samples with ``group_key``
        ``None``), in global order (:func:`route`).

    Raises:
        ValueError: if a DP size does not divide the world size, groups are not contiguous,
            or owners disagree on the schema.
    """
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    for name, size in (("src_dp_size", src_dp_size), ("dst_dp_size", dst_dp_size)):
        if size < 1 or world % size:
            raise ValueError(f"{name}={size} must divide the world size {world}")
    src_block = world // src_dp_size
    is_owner = rank % src_block == 0
    device = _batch_device(batch)

    owners = [r for r in range(world) if r % src_block == 0]
    owner_sizes, schema, nested = _metadata(batch, owners, is_owner, group_key, group)
    ranges = route(owner_sizes, world, src_dp_size, dst_dp_size)
    row_bytes = sum(f.row_bytes for f in schema)
    if is_owner:
        packed = _pack(batch, schema) if len(batch) else torch.empty(0, row_bytes, dtype=torch.uint8, device=device)
        pieces = [packed[slice(*ranges[rank // src_block][t])] for t in range(world)]
        send = torch.cat(pieces) if pieces else packed[:0]
        send_counts = [p.shape[0] for p in pieces]
    else:
        send = torch.empty(0, row_bytes, dtype=torch.uint8, device=device)
        send_counts = [0] * world
    recv_counts = [0] * world
    for owner_index, owner in enumerate(owners):
        start, stop = ranges[owner_index][rank]
        recv_counts[owner] = stop - start
    recv = torch.empty(sum(recv_counts), row_bytes, dtype=torch.uint8, device=device)
    all_to_all_rows(recv, send, recv_counts, send_counts, group=group)
    out = _unpack(recv, schema)
    _restore_nested_batch_dims(out, nested)
    return out
