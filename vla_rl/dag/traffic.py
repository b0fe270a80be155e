"""What a plan's re-shards move each step, estimated before anything runs (``vla-rl plan``).

A *data hop* is an edge ``src -> dst`` of a phase across which the workers run a re-shard
(:class:`~vla_rl.dag.planner.Reshard`): the DP size changes, or ``dst`` takes single samples at
DP size > 1 and its shards are rebalanced. A re-shard moves every key of ``src``'s output
(:attr:`~vla_rl.dag.planner.PhasePlan.keys`), whole rows, with one all-to-all
(:func:`vla_rl.data.reshard.reshard`), after one all-gather of each owner's group sizes.

The estimate routes the step's rows exactly as the re-shard would (:func:`vla_rl.data.reshard.route`)
for full groups spread as the data nodes spread them, with each key's bytes per sample from
:mod:`vla_rl.data.key_sizes` under the workflow's :class:`~vla_rl.data.key_sizes.StepShape`.
Rows counted after a filter are an upper bound (the filter keeps at most all of them); a
rebalance of equal shards moves nothing, and of unequal ones only the surplus rows, the fewest
any even-out moves (at most ``rows / W * (1 - 1 / W)`` per worker,
:attr:`HopTraffic.rebalance_bound_per_worker`; :func:`vla_rl.data.reshard.rebalance_ranges`).

Bytes are those of the rows that leave their worker (a rank's rows for itself stay in place),
plus the metadata all-gathers every re-shard runs (:func:`vla_rl.data.reshard.metadata_cost`).
The collectives' counters measure the same quantities at run time (``comm/reshard_rows/*``,
``comm/reshard_meta/*``).
"""

from __future__ import annotations

from dataclasses import dataclass

from vla_rl.dag.planner import PhasePlan, Plan, Reshard, RunNode
from vla_rl.data.key_sizes import StepShape, sample_bytes
from vla_rl.data.reshard import metadata_cost, route


@dataclass(frozen=True)
class HopTraffic:
    """One data hop's estimated movement per step.

    Attributes:
        src, dst: the edge.
        src_dp_size, dst_dp_size: the DP sizes on both sides.
        rebalance: the DP size is the same (``dst`` takes single samples: its shards are evened out).
        keys: the keys that move (every key of ``src``'s output), sorted.
        key_bytes: key -> bytes per sample (None: unknown size).
        rows: rows of ``src``'s output per step, all shards together.
        rows_upper_bound: ``rows`` is a bound (a filter upstream keeps at most that many).
        row_bytes: bytes per row (the keys of known size).
        rows_moved: rows that leave their worker, all workers together.
        total_bytes: their bytes.
        max_sent, max_received: the busiest worker's row bytes sent, received.
        meta_bytes_per_worker: the metadata all-gathers' bytes received per worker.
        world_size: the number of workers.
    """

    src: str
    dst: str
    src_dp_size: int
    dst_dp_size: int
    rebalance: bool
    keys: tuple[str, ...]
    key_bytes: dict[str, int | None]
    rows: int
    rows_upper_bound: bool
    row_bytes: int
    rows_moved: int
    total_bytes: int
    max_sent: int
    max_received: int
    meta_bytes_per_worker: int
    world_size: int

    @property
    def unknown_keys(self) -> tuple[str, ...]:
        """Keys whose size the config does not give (left out of the bytes)."""
        return tuple(key for key in self.keys if self.key_bytes[key] is None)

    @property
    def bytes_per_worker(self) -> float:
        """Row bytes received per worker, averaged over the workers."""
        return self.total_bytes / self.world_size

    @property
    def rebalance_bound_per_worker(self) -> int:
        """For a rebalance: the most row bytes one worker sends when the shards it evens out are
        unequal (its own ``rows / W`` rows, of which it keeps at least a ``1 / W`` share)."""
        per_worker = self.rows // self.world_size
        return (per_worker - per_worker // self.world_size) * self.row_bytes


@dataclass(frozen=True)
class NodeRows:
    """A node's output rows per step, all shards together.

    Attributes:
        groups: groups of rows.
        per_group: rows per group.
        bound: after a filter: at most this many.
    """

    groups: int
    per_group: int
    bound: bool = False

    @property
    def rows(self) -> int:
        return self.groups * self.per_group


def node_rows(phase: PhasePlan, shape: StepShape) -> dict[str, NodeRows]:
    """Each node's output rows per step: a data node loads ``groups`` rows, a rollout node makes
    ``group_size`` samples of each, a filter keeps at most its input, any other node keeps its
    input's rows."""
    runs = {task.node_id: task for task in phase.chains[0] if isinstance(task, RunNode)}
    rows: dict[str, NodeRows] = {}
    for node_id in phase.order:
        task = runs[node_id]
        inputs = [rows[dep] for dep in task.deps]
        largest = max(inputs, key=lambda r: r.rows, default=NodeRows(0, 1))
        bound = any(r.bound for r in inputs)
        if task.type == "data_load":
            rows[node_id] = NodeRows(shape.groups, 1, bound)
        elif task.role == "rollout":
            rows[node_id] = NodeRows(largest.groups, largest.per_group * shape.group_size, bound)
        else:
            rows[node_id] = NodeRows(largest.groups, largest.per_group, bound or task.role == "filter")
    return rows


def data_hops(phase: PhasePlan) -> list[Reshard]:
    """The phase's re-shard edges, once each, in execution order (rank 0's chain: every rank has
    the same edges)."""
    return [task for task in phase.chains[0] if isinstance(task, Reshard)] if phase.chains else []


def _shard_groups(num_groups: int, dp_size: int) -> list[int]:
    """Groups of each of ``dp_size`` shards: as equal as possible, the first shards one more."""
    return [num_groups // dp_size + (1 if k < num_groups % dp_size else 0) for k in range(dp_size)]


def estimate_traffic(plan: Plan, shape: StepShape, phase: str = "train") -> list[HopTraffic]:
    """Every data hop of ``phase`` with its estimated movement per step (see the module docstring)."""
    phase_plan = plan.phase(phase)
    world = plan.world_size
    rows_by_node = node_rows(phase_plan, shape)
    hops = []
    for hop in data_hops(phase_plan):
        keys = tuple(sorted(phase_plan.keys.get(hop.src, ())))
        key_bytes = {key: sample_bytes(key, shape) for key in keys}
        row_bytes = sum(b for b in key_bytes.values() if b is not None)
        src_rows = rows_by_node[hop.src]
        shard_groups = _shard_groups(src_rows.groups, hop.src_dp_size)
        owner_sizes = [[src_rows.per_group] * count for count in shard_groups]
        if not hop.whole_groups:
            owner_sizes = [[1] * sum(sizes) for sizes in owner_sizes]
        ranges = route(owner_sizes, world, hop.src_dp_size, hop.dst_dp_size)
        src_block = world // hop.src_dp_size
        sent, received = [0] * world, [0] * world
        for owner_index, targets in enumerate(ranges):
            owner = owner_index * src_block
            for rank, (start, stop) in enumerate(targets):
                if rank != owner:
                    sent[owner] += stop - start
                    received[rank] += stop - start
        hops.append(HopTraffic(
            src=hop.src, dst=hop.dst, src_dp_size=hop.src_dp_size, dst_dp_size=hop.dst_dp_size,
            rebalance=hop.src_dp_size == hop.dst_dp_size, keys=keys, key_bytes=key_bytes, rows=src_rows.rows,
            rows_upper_bound=src_rows.bound, row_bytes=row_bytes, rows_moved=sum(sent), total_bytes=sum(sent) * row_bytes,
            max_sent=max(sent) * row_bytes, max_received=max(received) * row_bytes,
            meta_bytes_per_worker=metadata_cost(world, max(shard_groups), hop.whole_groups)[1], world_size=world))
    return hops


def format_bytes(count: float) -> str:
    """``count`` bytes in B, KiB, MiB or GiB (three significant digits)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count:.0f} B"
