"""The DAG planner: validate a loaded template and compile it into one task chain per worker.

Execution model
---------------
There are ``W`` DAG workers (the world size), ranks ``0 .. W-1``. A node runs at a DP size ``d``
(its ``dp_size``, default ``W``), which must divide ``W``. Its batch is split into ``d`` shards and
the world is cut into ``d`` contiguous blocks of ``W // d`` ranks; rank ``r`` holds shard
``dp_rank = r // (W // d)``. The ranks of one block hold the same shard, like tensor-parallel
replicas, and all of them run the node. So every rank runs every node, in the same deterministic
topological order (ties broken by the order of the template file), and the chains of two ranks
differ only in their ``dp_rank`` values.

For every edge ``dep -> node`` whose DP sizes differ, a :class:`Reshard` task is inserted right
before the node's :class:`RunNode` task: a collective over all workers that regroups the dep's
output from ``src_dp_size`` shards into ``dst_dp_size`` shards, after which the worker holds shard
``dst_dp_rank``. Edges between nodes of equal DP size need no data movement: the consumer reads the
producer's output on the same worker. The distinct DP-size changes are listed as the plan's
:class:`Hop` entries.

Planning starts nothing (no Ray, no processes); the workers execute the chains.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from pathlib import Path
from pydantic import BaseModel, ValidationError

from vla_rl.dag.errors import TemplateError, from_validation_error
from vla_rl.dag.loader import Template
from vla_rl.dag.registry import get_node_function, load_builtin_nodes
from vla_rl.dag.schema import NodeSpec
from vla_rl.utils.registry import RegistryError


@dataclass(frozen=True)
class RunNode:
    """Run a node's function on this worker's shard.

    Attributes:
        node_id: the node's id.
        role: the node's role.
        type: the node's type.
        fn: the registered function's name for (role, type).
        dp_size: the node's DP size.
        dp_rank: the shard this worker holds, ``rank // (world_size // dp_size)``.
        deps: ids of the nodes whose outputs are merged into the function's input batch.
        config: the node's validated config (``None`` if its function declares no config model).
    """

    node_id: str
    role: str
    type: str
    fn: str
    dp_size: int
    dp_rank: int
    deps: tuple[str, ...]
    config: BaseModel | None


@dataclass(frozen=True)
class Reshard:
    """Collective over all workers: regroup ``src``'s output from its DP size to ``dst``'s.

    Attributes:
        src: the producing node.
        dst: the consuming node.
        src_dp_size: ``src``'s DP size (shards before).
        dst_dp_size: ``dst``'s DP size (shards after).
        src_dp_rank: the shard of ``src``'s output this worker holds before the collective.
        dst_dp_rank: the shard this worker holds after it.
        whole_groups: keep each group on one rank (``dst``'s function needs whole groups); when
            ``False`` the samples are balanced one by one.
    """

    src: str
    dst: str
    src_dp_size: int
    dst_dp_size: int
    src_dp_rank: int
    dst_dp_rank: int
    whole_groups: bool = True


Task = RunNode | Reshard
"""One step of a worker's chain."""


@dataclass(frozen=True)
class Hop:
    """A dependency edge across which the DP size changes."""

    src: str
    dst: str
    src_dp_size: int
    dst_dp_size: int


@dataclass(frozen=True)
class Plan:
    """A validated template compiled for a world size.

    Attributes:
        template: the template's name.
        world_size: the number of DAG workers.
        order: node ids in execution order.
        dp_sizes: node id -> its resolved DP size.
        chains: rank -> that worker's tasks, in execution order.
        hops: the edges whose DP sizes differ, in execution order.
        node_configs: node id -> its validated config (``None`` without a config model).
    """

    template: str
    world_size: int
    order: tuple[str, ...]
    dp_sizes: dict[str, int]
    chains: dict[int, tuple[Task, ...]]
    hops: tuple[Hop, ...]
    node_configs: dict[str, BaseModel | None]


def plan(template: Template, world_size: int | None = None) -> Plan:
    """Validate ``template`` and compile one task chain per worker rank.

    Args:
        template: a loaded template.
        world_size: number of DAG workers; default ``template.config.workers.num_workers``.

    Raises:
        TemplateError: a missing or repeated dependency, a dependency cycle, a DP size that does
            not divide the world size, an unregistered node function, or a node config that its
            function's config model rejects; the error names the node and the field.
        ValueError: if ``world_size`` is below 1.
    """
    if world_size is None:
        world_size = template.config.workers.num_workers
    if world_size < 1:
        raise ValueError(f"world size must be at least 1 (got {world_size})")
    file = template.path
    _check_deps(template.nodes, file)
    order = _topological_order(template.nodes, file)
    dp_sizes = {node.id: _dp_size(node, world_size, file) for node in template.nodes}
    load_builtin_nodes()
    node_configs = {node.id: _node_config(node, file) for node in template.nodes}
    nodes = {node.id: node for node in template.nodes}
    hops = tuple(
        Hop(dep, node_id, dp_sizes[dep], dp_sizes[node_id])
        for node_id in order
        for dep in nodes[node_id].deps
        if dp_sizes[dep] != dp_sizes[node_id]
    )
    chains = {}
    for rank in range(world_size):
        chain: list[Task] = []
        for node_id in order:
            node, dp_size = nodes[node_id], dp_sizes[node_id]
            dp_rank = rank // (world_size // dp_size)
            for dep in node.deps:
                if dp_sizes[dep] != dp_size:
                    src_rank = rank // (world_size // dp_sizes[dep])
                    whole_groups = get_node_function(node.role, node.type, node.fn).whole_groups
                    chain.append(Reshard(dep, node_id, dp_sizes[dep], dp_size, src_rank, dp_rank, whole_groups))
            chain.append(
                RunNode(node_id, node.role, node.type, node.fn, dp_size, dp_rank, node.deps, node_configs[node_id])
            )
        chains[rank] = tuple(chain)
    return Plan(template.name, world_size, order, dp_sizes, chains, hops, node_configs)


def _check_deps(nodes: tuple[NodeSpec, ...], file: Path) -> None:
    """Every dep names an existing node, at most once."""
    ids = {node.id for node in nodes}
    for node in nodes:
        seen: set[str] = set()
        for i, dep in enumerate(node.deps):
            if dep not in ids:
                raise TemplateError(
                    f"unknown dependency {dep!r}; nodes: {', '.join(n.id for n in nodes)}",
                    file=file,
                    node=node.id,
                    field=f"deps[{i}]",
                )
            if dep in seen:
                raise TemplateError(f"dependency {dep!r} listed twice", file=file, node=node.id, field=f"deps[{i}]")
            seen.add(dep)


def _topological_order(nodes: tuple[NodeSpec, ...], file: Path) -> tuple[str, ...]:
    """Kahn's algorithm, always taking the ready node that comes first in the file."""
    position = {node.id: i for i, node in enumerate(nodes)}
    missing = {node.id: len(node.deps) for node in nodes}
    consumers: dict[str, list[str]] = {node.id: [] for node in nodes}
    for node in nodes:
        for dep in node.deps:
            consumers[dep].append(node.id)
    ready = [position[node_id] for node_id, count in missing.items() if count == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        node_id = nodes[heapq.heappop(ready)].id
        order.append(node_id)
        for consumer in consumers[node_id]:
            missing[consumer] -= 1
            if missing[consumer] == 0:
                heapq.heappush(ready, position[consumer])
    if len(order) < len(nodes):
        cycle = _find_cycle([node for node in nodes if missing[node.id] > 0])
        path = " -> ".join([*cycle, cycle[0]])
        raise TemplateError(f"dependency cycle: {path}", file=file, node=cycle[0], field="deps")
    return tuple(order)


def _find_cycle(blocked: list[NodeSpec]) -> list[str]:
    """A cycle among nodes Kahn's algorithm could not order (each has a blocked dep), in data-flow
    order (each node feeds the next)."""
    blocked_ids = {node.id for node in blocked}
    deps = {node.id: [d for d in node.deps if d in blocked_ids] for node in blocked}
    walk = [blocked[0].id]
    while deps[walk[-1]][0] not in walk:
        walk.append(deps[walk[-1]][0])
    cycle = walk[walk.index(deps[walk[-1]][0]) :]  # consumer -> producer order
    return cycle[::-1]


def _dp_size(node: NodeSpec, world_size: int, file: Path) -> int:
    """The node's DP size, which must be at least 1 and divide the world size."""
    dp_size = world_size if node.dp_size is None else node.dp_size
    if dp_size < 1 or world_size % dp_size:
        raise TemplateError(
            f"must divide the world size {world_size} (got {dp_size})", file=file, node=node.id, field="dp_size"
        )
    return dp_size


def _node_config(node: NodeSpec, file: Path) -> BaseModel | None:
    """The node's ``config:`` validated by its registered function's config model."""
    try:
        function = get_node_function(node.role, node.type, node.fn)
    except RegistryError as exc:
        raise TemplateError(str(exc), file=file, node=node.id, field="fn") from None
    if function.config_model is None:
        if node.config:
            raise TemplateError(
                f"function {node.role}/{node.type}/{node.fn} takes no config (got keys: {', '.join(node.config)})",
                file=file,
                node=node.id,
                field="config",
            )
        return None
    try:
        return function.config_model.model_validate(node.config)
    except ValidationError as exc:
        raise from_validation_error(
            exc, model=function.config_model, file=file, node=node.id, prefix=("config",)
        ) from None


def describe_plan(plan: Plan) -> str:
    """A human-readable listing of the plan: order, DP-size hops and every worker's chain."""
    lines = [
        f"plan {plan.template!r}: world size {plan.world_size}, {len(plan.order)} nodes",
        f"order: {' -> '.join(plan.order)}",
        "DP-size hops:" if plan.hops else "DP-size hops: none (every node runs at one DP size)",
    ]
    lines += [f"  {h.src} (dp {h.src_dp_size}) -> {h.dst} (dp {h.dst_dp_size})" for h in plan.hops]
    runs = [task for chain in plan.chains.values() for task in chain if isinstance(task, RunNode)]
    widths = (max(len(t.node_id) for t in runs), max(len(_function_name(t)) for t in runs))
    for rank, chain in plan.chains.items():
        lines.append(f"worker {rank}:")
        for i, task in enumerate(chain, start=1):
            lines.append(f"  {i:>2}. {_describe_task(task, widths)}")
    return "\n".join(lines)


def _function_name(task: RunNode) -> str:
    return f"{task.role}/{task.type}/{task.fn}"


def _describe_task(task: Task, widths: tuple[int, int]) -> str:
    """One line of a chain listing; ``widths`` pads the node id and function name columns."""
    if isinstance(task, Reshard):
        return (
            f"reshard {task.src} -> {task.dst}: dp {task.src_dp_size} -> {task.dst_dp_size}, "
            f"shard {task.src_dp_rank} -> {task.dst_dp_rank}"
            + ("" if task.whole_groups else ", samples balanced (groups may split)")
        )
    deps = f" <- {', '.join(task.deps)}" if task.deps else ""
    node_width, function_width = widths
    return (
        f"run {task.node_id:<{node_width}}  {_function_name(task):<{function_width}}  "
        f"dp_rank {task.dp_rank}/{task.dp_size}{deps}"
    )
