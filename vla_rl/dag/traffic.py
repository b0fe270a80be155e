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
any even-out moves (at most ``m * (1 - 1 / d)`` rows per worker for the largest shard's ``m``
rows at DP size ``d``, :attr:`HopTraffic.rebalance_bound_per_worker`;
:func:`vla_rl.data.reshard.rebalance_ranges`). Each node's shards hold the groups the data nodes
load (equal shards) and each re-shard cuts (:func:`node_layouts`): uneven where a cut's group
count does not divide its DP size.

Bytes are those of the rows that leave their worker (a rank's rows for itself stay in place),
plus the metadata all-gathers every re-shard runs (:func:`vla_rl.data.reshard.metadata_cost`).
The collectives' counters measure the same quantities at run time (``comm/reshard_rows/*``,
``comm/reshard_meta/*``).
"""

from __future__ import annotations

from dataclasses import dataclass

from vla_rl.dag.planner import PhasePlan, Plan, Reshard, RunNode
from vla_rl.data.key_sizes import StepShape, sample_bytes
from vla_rl.data.reshard import metadata_cost, rebalance_ranges, route, split_groups


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
        max_shard_rows: the rows of ``src``'s largest shard.
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
    max_shard_rows: int = 0

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
        unequal (the largest shard's rows, of which it keeps at least a ``1 / d`` share at DP
        size ``d``: every other shard emptied by a filter)."""
        return (self.max_shard_rows - self.max_shard_rows // self.src_dp_size) * self.row_bytes


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


def node_layouts(phase: PhasePlan, shape: StepShape) -> dict[str, list[list[int]]]:
    """Each node's output, shard by shard at its DP size: the sample count of each group a shard
    holds (every filter keeping all). A data node loads ``groups / d`` rows of one sample in each
    of its ``d`` shards (the planner makes them divide); a rollout node makes ``group_size``
    samples of each; a node after a re-shard holds what :func:`~vla_rl.data.reshard.route` gives it
    (:func:`~vla_rl.data.reshard.split_groups`' cut, or single samples evened out); any other node
    its input's shards. A node with several inputs takes its largest's layout."""
    runs = {task.node_id: task for task in phase.chains[0] if isinstance(task, RunNode)}
    hops = {(hop.src, hop.dst): hop for hop in data_hops(phase)}
    layouts: dict[str, list[list[int]]] = {}
    for node_id in phase.order:
        task, dp_size = runs[node_id], phase.dp_sizes[node_id]
        if task.type == "data_load":
            layouts[node_id] = [[1] * (shape.groups // dp_size) for _ in range(dp_size)]
            continue
        dep = max(task.deps, key=lambda d: sum(map(sum, layouts[d])), default=None)
        shards = [[] for _ in range(dp_size)] if dep is None else layouts[dep]
        hop = hops.get((dep, node_id))
        if hop is not None:
            shards = _cut(shards, hop.dst_dp_size, hop.whole_groups)
        if task.role == "rollout":
            shards = [[size * shape.group_size for size in sizes] for sizes in shards]
        layouts[node_id] = shards
    return layouts


def _cut(shards: list[list[int]], dst_dp_size: int, whole_groups: bool) -> list[list[int]]:
    """The shards a re-shard makes of ``shards`` (group sizes per source shard), as
    :func:`~vla_rl.data.reshard.route` routes them: whole groups cut by
    :func:`~vla_rl.data.reshard.split_groups`; single samples evened out
    (:func:`~vla_rl.data.reshard.rebalance_ranges` at the same DP size) or cut."""
    if not whole_groups:
        counts = [sum(sizes) for sizes in shards]
        if len(shards) == dst_dp_size:
            ranges = rebalance_ranges(counts)
            return [[1] * sum(ranges[k][j][1] - ranges[k][j][0] for k in range(len(shards)))
                    for j in range(dst_dp_size)]
        shards = [[1] * count for count in counts]
    sizes = [size for group_sizes in shards for size in group_sizes]
    bounds = split_groups(sizes, dst_dp_size)
    return [sizes[bounds[k]:bounds[k + 1]] for k in range(dst_dp_size)]


def estimate_traffic(plan: Plan, shape: StepShape, phase: str = "train") -> list[HopTraffic]:
    """Every data hop of ``phase`` with its estimated movement per step (see the module docstring)."""
    phase_plan = plan.phase(phase)
    world = plan.world_size
    rows_by_node = node_rows(phase_plan, shape)
    layouts = node_layouts(phase_plan, shape)
    hops = []
    for hop in data_hops(phase_plan):
        keys = tuple(sorted(phase_plan.keys.get(hop.src, ())))
        key_bytes = {key: sample_bytes(key, shape) for key in keys}
        row_bytes = sum(b for b in key_bytes.values() if b is not None)
        src_rows = rows_by_node[hop.src]
        owner_sizes = layouts[hop.src]
        shard_groups = [len(sizes) for sizes in owner_sizes]
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
            meta_bytes_per_worker=metadata_cost(world, max(shard_groups), hop.whole_groups)[1], world_size=world,
            max_shard_rows=max(sum(sizes) for sizes in owner_sizes)))
    return hops


def format_bytes(count: float) -> str:
    """``count`` bytes in B, KiB, MiB or GiB (three significant digits)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count:.0f} B"
