"""Re-sharding a batch between two DP sizes, worker to worker, keeping groups whole.

Execution model (see :mod:`vla_rl.dag.planner`): with world size ``W`` a node at DP size ``d``
cuts the world into ``d`` contiguous blocks of ``W // d`` ranks; every rank of block ``k`` holds
shard ``k`` (ranks of one block are replicas). Between two nodes whose DP sizes differ, the batch
is re-sharded with one ``all_to_all_single`` over the worker process group:

1. the first rank of each source block is the *owner* of that shard and the only rank that sends;
2. owners announce their shard's group sizes and the batch schema (one all-gather of a few
   hundred bytes of metadata, never sample data: :func:`~vla_rl.utils.collectives.all_gather_small_objects`);
3. the global sequence of groups (source shard 0, then 1, ...) is cut into ``d_dst`` contiguous
   pieces with sample counts as equal as group boundaries allow; a group is never split, unless
   the destination node does not compare a group's samples (a model update: its function is
   registered with ``whole_groups=False``), where every sample counts as its own group;
4. every sample row of every key is packed into one byte row, and one ``all_to_all_single``
   moves each owner's rows to every rank of the destination block that needs them.

Nested TensorDicts (e.g. camera observations under ``obs``, batch size ``(batch, T + 1)``) keep
their keys, dtypes (uint8 images move as bytes, unconverted) and batch dimensions.

The Ray driver is not involved: data moves only between the workers' processes (gloo over
loopback on CPU, nccl/hccl on accelerators).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from tensordict import TensorDict

from vla_rl.data import keys
from vla_rl.utils.collectives import all_gather_small_objects


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


def _schema(batch: TensorDict) -> list[_FieldSpec]:
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
        ``None``), in global order.

    Raises:
        ValueError: if a DP size does not divide the world size, groups are not contiguous,
            or owners disagree on the schema.
    """
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    for name, size in (("src_dp_size", src_dp_size), ("dst_dp_size", dst_dp_size)):
        if size < 1 or world % size:
            raise ValueError(f"{name}={size} must divide the world size {world}")
    src_block, dst_block = world // src_dp_size, world // dst_dp_size
    is_owner = rank % src_block == 0
    device = _batch_device(batch)

    local_meta = None
    if is_owner:
        sizes = [1] * len(batch) if group_key is None else group_sizes(batch.get(group_key))
        local_meta = (sizes, [(f.name, f.dtype, f.shape) for f in _schema(batch)], _nested_batch_dims(batch))
    gathered = all_gather_small_objects(local_meta, group)
    owners = [r for r in range(world) if r % src_block == 0]
    schemas = {tuple(gathered[r][1]) for r in owners if gathered[r][0]}
    if len(schemas) > 1:
        raise ValueError(f"re-shard: shards disagree on their fields: {sorted(schemas)}")
    source = next((r for r in owners if gathered[r][0]), owners[0])
    schema = [_FieldSpec(name, dtype, tuple(shape)) for name, dtype, shape in gathered[source][1]]

    all_sizes = [size for r in owners for size in gathered[r][0]]
    bounds = split_groups(all_sizes, dst_dp_size)
    group_starts = np.concatenate([[0], np.cumsum(all_sizes, dtype=np.int64)])
    # Global sample range of every destination shard, and of every owner's local shard.
    dst_ranges = [(int(group_starts[bounds[k]]), int(group_starts[bounds[k + 1]])) for k in range(dst_dp_size)]
    owner_offsets = np.concatenate([[0], np.cumsum([sum(gathered[r][0]) for r in owners], dtype=np.int64)])

    def rows_between(owner_index: int, dst_rank: int) -> tuple[int, int]:
        lo, hi = dst_ranges[dst_rank // dst_block]
        own_lo, own_hi = int(owner_offsets[owner_index]), int(owner_offsets[owner_index + 1])
        start, stop = max(lo, own_lo), min(hi, own_hi)
        return (start - own_lo, stop - own_lo) if stop > start else (0, 0)

    row_bytes = sum(f.row_bytes for f in schema)
    if is_owner:
        packed = _pack(batch, schema)
        pieces = [packed[slice(*rows_between(rank // src_block, t))] for t in range(world)]
        send = torch.cat(pieces) if pieces else packed[:0]
        send_counts = [p.shape[0] for p in pieces]
    else:
        send = torch.empty(0, row_bytes, dtype=torch.uint8, device=device)
        send_counts = [0] * world
    recv_counts = [0] * world
    for owner_index, owner in enumerate(owners):
        start, stop = rows_between(owner_index, rank)
        recv_counts[owner] = stop - start
    recv = torch.empty(sum(recv_counts), row_bytes, dtype=torch.uint8, device=device)
    dist.all_to_all_single(recv, send, recv_counts, send_counts, group=group)
    out = _unpack(recv, schema)
    _restore_nested_batch_dims(out, gathered[source][2])
    return out
