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
``dst_dp_rank``. Edges between nodes of equal DP size need no data movement — the consumer reads
the producer's output on the same worker — except into a node that takes single samples (a model
update, ``whole_groups=False``) at DP size > 1, whose shards are rebalanced to equal sizes (only
the surplus rows move: nothing between equal shards). The distinct DP-size changes are listed as the plan's :class:`Hop`
entries.

Each phase of the template (``warm_start``, ``train``, ``evaluate``; see
:mod:`vla_rl.dag.schema`) is planned on its own, with its own chains.

Contracts: every node function declares the batch keys it reads and writes
(:mod:`vla_rl.dag.registry`). Along each phase's edges the planner checks that every key a node
reads is written by a node upstream of it, and names both the node and the key (and who could
write it) when not: a template that forgets the critic of GAE, or the reference of a KL term,
fails here, before anything starts.

Planning starts nothing (no Ray, no processes); the workers execute the chains.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ValidationError

from vla_rl.dag.errors import TemplateError, from_validation_error
from vla_rl.dag.layouts import ancestors, check_joined_layouts, check_local_rows, rebalances
from vla_rl.dag.loader import Template, override_settings
from vla_rl.dag.registry import (
    NODE_FUNCTIONS,
    get_node_function,
    resolve,
)
from vla_rl.dag.schema import PHASES, NodeSpec
from vla_rl_core.registry import RegistryError


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
        resources: the worker resources its function declares under this template's settings.
        writes: the batch keys its function declares it adds to its output (checked when it returns).
    """

    node_id: str
    role: str
    type: str
    fn: str
    dp_size: int
    dp_rank: int
    deps: tuple[str, ...]
    config: BaseModel | None
    resources: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()


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
class PhasePlan:
    """One phase of a template compiled for a world size.

    Attributes:
        phase: ``warm_start``, ``train`` or ``evaluate``.
        order: node ids in execution order.
        dp_sizes: node id -> its resolved DP size.
        chains: rank -> that worker's tasks, in execution order.
        hops: the edges whose DP sizes differ, in execution order.
        keys: node id -> the batch keys of its output (its input's and the ones it writes).
    """

    phase: str
    order: tuple[str, ...]
    dp_sizes: dict[str, int]
    chains: dict[int, tuple[Task, ...]]
    hops: tuple[Hop, ...]
    keys: dict[str, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """A validated template compiled for a world size.

    Attributes:
        template: the template's name.
        world_size: the number of DAG workers.
        phases: phase name -> its plan, for the phases the template has nodes in (in the order
            of :data:`~vla_rl.dag.schema.PHASES`).
        node_configs: node id -> its validated config (``None`` without a config model).
    """

    template: str
    world_size: int
    phases: dict[str, PhasePlan]
    node_configs: dict[str, BaseModel | None]

    def phase(self, name: str) -> PhasePlan:
        """The plan of phase ``name``; an empty one if the template has no node in it."""
        return self.phases.get(name, PhasePlan(name, (), {}, {r: () for r in range(self.world_size)}, ()))

    @property
    def order(self) -> tuple[str, ...]:
        """The ``train`` phase's execution order."""
        return self.phase("train").order

    @property
    def dp_sizes(self) -> dict[str, int]:
        """Every node's DP size."""
        return {node: size for p in self.phases.values() for node, size in p.dp_sizes.items()}

    @property
    def chains(self) -> dict[int, tuple[Task, ...]]:
        """The ``train`` phase's chains."""
        return self.phase("train").chains

    @property
    def hops(self) -> tuple[Hop, ...]:
        """The ``train`` phase's DP-size hops."""
        return self.phase("train").hops

    def rollout_dp_size(self, rank: int) -> int:
        """The DP size of the ``train`` phase's ``env_interact`` node on worker ``rank`` (which
        sizes its simulator pool); the world size when it runs none."""
        return next((task.dp_size for task in self.chains[rank] if isinstance(task, RunNode)
                     and task.type == "env_interact"), self.world_size)


def plan(template: Template, world_size: int | None = None) -> Plan:
    """Validate ``template`` and compile one task chain per worker rank and phase.

    Args:
        template: a loaded template.
        world_size: number of DAG workers; default ``template.config.workers.num_workers``.

    Raises:
        TemplateError: a missing, repeated or cross-phase dependency, a dependency cycle, a DP
            size that does not divide the world size, an unregistered node function, a node
            config that its function's config model rejects, a layout a node's check refuses, a
            key a node reads that no upstream node writes, or a train phase without a
            model_train node; the error names the node and the field.
        ValueError: if ``world_size`` is below 1.
    """
    if world_size is None:
        world_size = template.config.workers.num_workers
    if world_size < 1:
        raise ValueError(f"world size must be at least 1 (got {world_size})")
    file = template.path
    _check_deps(template.nodes, file)
    node_configs = {node.id: _node_config(node, file) for node in template.nodes}
    phases = {}
    for phase in PHASES:
        nodes = tuple(node for node in template.nodes if node.phase == phase)
        if nodes:
            phases[phase] = _plan_phase(phase, nodes, world_size, template.config, node_configs, file)
    trains = [node for node in template.nodes if node.phase == "train"]
    if trains and not any(node.type == "model_train" for node in trains):
        raise TemplateError("the train phase has no model_train node (e.g. {role: actor, type: model_train}): it "
                            "would train nothing", file=file, field="nodes")
    if trains and not any(node.type == "model_train" and node.role == "actor" for node in trains):
        raise TemplateError("the train phase updates no policy: its model_train nodes are "
                            f"{[node.id for node in trains if node.type == 'model_train']}, none of role actor (e.g. "
                            "{id: actor_update, role: actor, type: model_train}); the run would train the "
                            "others and leave the policy as it started", file=file, field="nodes")
    _check_overrides_read_by_nodes(template, node_configs)
    _check_rl_settings_read(template)
    return Plan(template.name, world_size, phases, node_configs)


RL_ROLES = ("rollout", "reward", "advantage", "filter", "critic", "reference")
"""The roles of the nodes that read ``algorithm.*`` and ``data.group_size`` (with the built-in
policy-gradient update, ``actor/model_train/default``): what sampled groups and scores them."""


def _check_rl_settings_read(template: Template) -> None:
    """Refuse an override of ``algorithm.*`` or ``data.group_size`` on a template whose training
    runs no RL node (:data:`RL_ROLES`), no policy-gradient update and no plug-in's function (which
    may read them): ``llm_sft``'s supervised update reads neither.

    Raises:
        TemplateError: naming the override and the template's update.
    """
    overrides = [(item, key) for item, key in override_settings(template.overrides)
                 if key.split(".")[0] == "algorithm" or key == "data.group_size"]
    train = [node for node in template.nodes if node.phase == "train"]
    if not overrides or any(node.role in RL_ROLES or (node.role, node.fn) == ("actor", "default") or getattr(
            get_node_function(node.role, node.type, node.fn).fn, "__module__", "").split(".")[0] != "vla_rl"
                            for node in train):
        return
    item, key = overrides[0]
    updates = ", ".join(f"{node.role}/{node.type}/{node.fn}" for node in train if node.type == "model_train")
    raise TemplateError(f"override {item!r} is never read: {key} is read by the RL nodes ({', '.join(RL_ROLES)}) and "
                        f"the policy-gradient update, and this template trains with {updates} alone; drop the override",
                        file=template.path, field=key)


def _check_overrides_read_by_nodes(template: Template, node_configs: dict[str, BaseModel | None]) -> None:
    """Refuse an override of a setting that only nodes the template lacks read: it would change
    nothing (``critic.lr`` without critic nodes, ``algorithm.filter_groups.max_refill_rounds``
    without dynamic sampling). A setting's readers are the functions declaring it, a setting under
    it or a section above it in their ``settings``, and the functions that use a resource one of
    those uses and that is named after the setting's section (a plug-in critic node reads
    ``critic`` through the ``critic`` resource; the ``policy`` resource reads no ``text.sft_lr``). A template
    may carry such settings itself (one extending another that has the nodes), and only the
    command's own overrides are checked (:attr:`Template.overrides`: not those an earlier resume
    recorded).

    Raises:
        TemplateError: naming the override, the functions that read it and, where the template
            has a node of the same role and type, the ``fn`` override that selects one.
    """
    overrides = override_settings(template.overrides)
    if not overrides:
        return
    nodes = {node.id: get_node_function(node.role, node.type, node.fn) for node in template.nodes}
    used = {(f.role, f.type, f.name) for f in nodes.values()}
    used_resources = set().union(*(resolve(f.resources, template.config, node_configs[node_id])
                                   for node_id, f in nodes.items()))
    declared = {key: NODE_FUNCTIONS.get(key) for key in NODE_FUNCTIONS if NODE_FUNCTIONS.get(key).settings}
    for item, key in overrides:
        readers = [name for name, function in declared.items() if any(
            key == setting or key.startswith(f"{setting}.") or setting.startswith(f"{key}.")
            for setting in function.settings)]
        if not readers:
            continue
        through = {r for name in readers if not callable(declared[name].resources) for r in declared[name].resources
                   if r == key.split(".")[0]}
        if used.intersection(readers) or used_resources & through:
            continue
        names = " or ".join("/".join(f[:2] if f[2] == "default" else f) for f in readers)
        selectable = [(node.id, f[2]) for f in readers for node in template.nodes
                      if (node.role, node.type) == f[:2] and node.phase in (declared[f].phases or (node.phase,))]
        instead = f"select one with nodes.{selectable[0][0]}.fn={selectable[0][1]}" if selectable else \
            "use a template with one"
        resources = f" (or nodes using their resource {', '.join(sorted(through))})" if through else ""
        raise TemplateError(f"override {item!r} is never read: {key} is read only by {names} nodes{resources}, and "
                            f"this template has none; {instead}, or drop the override", file=template.path, field=key)


def _named(function) -> str:
    """A node function's callable as a message names it: its qualified name and module."""
    return f"{getattr(function, '__qualname__', function)} (from {getattr(function, '__module__', '?')})"


def _raised(node: NodeSpec, what: str, function, error: Exception, file: Path) -> TemplateError:
    """The one-line refusal of a node whose ``what`` (its check, a contract function) raised ``error``."""
    return TemplateError(f"{node.role}/{node.type}/{node.fn}: its {what} {_named(function)} raised "
                         f"{type(error).__name__}: {error}", file=file, node=node.id, field="fn")


def _plan_phase(phase: str, nodes: tuple[NodeSpec, ...], world_size: int, config, node_configs: dict,
                file: Path) -> PhasePlan:
    order = _topological_order(nodes, file)
    dp_sizes = {node.id: _dp_size(node, world_size, file) for node in nodes}
    for node in nodes:  # a plug-in's contract functions: refused here, naming the node, not resolved later
        function = get_node_function(node.role, node.type, node.fn)
        for declared in (function.reads, function.writes, function.resources):
            try:
                resolve(declared, config, node_configs[node.id])
            except TypeError as err:
                raise TemplateError(f"{node.role}/{node.type}/{node.fn}: {err}", file=file, node=node.id,
                                    field="fn") from None
            except Exception as err:  # a plug-in's bug, in one line naming its function
                raise _raised(node, "contract function", declared, err, file) from None
        if function.phases and phase not in function.phases:
            raise TemplateError(f"{node.role}/{node.type}/{node.fn} runs in phase {' or '.join(function.phases)} "
                                f"only, not {phase}: set the node's phase, or select another function with fn",
                                file=file, node=node.id, field="phase")
    by_id = {node.id: node for node in nodes}
    check_joined_layouts(nodes, dp_sizes, file)
    check_local_rows(nodes, dp_sizes, file)
    for node in nodes:
        check = get_node_function(node.role, node.type, node.fn).check
        try:
            problem = None if check is None else check(config, node_configs[node.id], dp_sizes[node.id], world_size)
        except Exception as err:  # a plug-in's bug, in one line naming its check
            raise _raised(node, "check", check, err, file) from None
        if problem is not None and not (isinstance(problem, tuple) and len(problem) == 2
                                        and all(isinstance(part, str) for part in problem)):
            raise TemplateError(f"{node.role}/{node.type}/{node.fn}: its check {_named(check)} returned {problem!r}, "
                                "not None or a (field, message) pair of strings", file=file, node=node.id, field="fn")
        if problem is not None:
            raise TemplateError(problem[1], file=file, node=node.id, field=problem[0])
    output_keys = _check_key_flow(order, by_id, config, node_configs, file)
    hops = tuple(
        Hop(dep, node_id, dp_sizes[dep], dp_sizes[node_id])
        for node_id in order
        for dep in by_id[node_id].deps
        if dp_sizes[dep] != dp_sizes[node_id]
    )
    chains = {}
    for rank in range(world_size):
        chain: list[Task] = []
        for node_id in order:
            node, dp_size = by_id[node_id], dp_sizes[node_id]
            function = get_node_function(node.role, node.type, node.fn)
            dp_rank = rank // (world_size // dp_size)
            for dep in node.deps:
                if dp_sizes[dep] != dp_size or rebalances(function, dp_size):
                    src_rank = rank // (world_size // dp_sizes[dep])
                    chain.append(Reshard(dep, node_id, dp_sizes[dep], dp_size, src_rank, dp_rank,
                                         function.whole_groups))
            chain.append(RunNode(node_id, node.role, node.type, node.fn, dp_size, dp_rank, node.deps,
                                 node_configs[node_id], resolve(function.resources, config, node_configs[node_id]),
                                 resolve(function.writes, config, node_configs[node_id])))
        chains[rank] = tuple(chain)
    return PhasePlan(phase, order, dp_sizes, chains, hops, output_keys)


def _check_key_flow(order: tuple[str, ...], nodes: dict[str, NodeSpec], config, node_configs: dict,
                    file: Path) -> dict[str, frozenset[str]]:
    """Every key a node reads is written by a node upstream of it (its output carries its input's
    keys and the ones it writes). Returns each node's output keys."""
    available: dict[str, frozenset[str]] = {}
    for node_id in order:
        node = nodes[node_id]
        function = get_node_function(node.role, node.type, node.fn)
        inputs = frozenset().union(*(available[dep] for dep in node.deps))
        missing = sorted(resolve(function.reads, config, node_configs[node_id]) - inputs)
        if missing:
            key = missing[0]
            upstream = ", ".join(ancestors(node_id, nodes)) or "none"
            raise TemplateError(
                f"reads batch key {key!r}, which no node upstream of it writes (upstream: {upstream}); "
                f"{_writers_hint(key, config)}", file=file, node=node_id, field="deps")
        available[node_id] = inputs | resolve(function.writes, config, node_configs[node_id])
    return available


def _writers_hint(key: str, config) -> str:
    """Which registered node functions write ``key`` (with default node settings)."""
    writers = []
    for role, type_, name in NODE_FUNCTIONS:
        function = NODE_FUNCTIONS.get((role, type_, name))
        try:
            default_config = function.config_model() if function.config_model is not None else None
            writes = resolve(function.writes, config, default_config)
        except (ValidationError, ValueError, TypeError):
            continue
        if key in writes:
            writers.append(f"{role}/{type_}" + ("" if name == "default" else f" (fn: {name})"))
    return f"add a node that writes it before this one: {', '.join(writers)}" if writers else "no registered node writes it"


def _check_deps(nodes: tuple[NodeSpec, ...], file: Path) -> None:
    """Every dep names an existing node of the same phase, at most once."""
    ids = {node.id for node in nodes}
    phases = {node.id: node.phase for node in nodes}
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
            if phases[dep] != node.phase:
                raise TemplateError(f"dependency {dep!r} runs in phase {phases[dep]!r}, this node in {node.phase!r}; "
                                    "a node's deps lie in its own phase", file=file, node=node.id, field=f"deps[{i}]")
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
    model = function.config_model
    allowed = [key for name, field in model.model_fields.items() for key in _field_keys(name, field)]
    unknown = [key for key in node.config if key not in allowed]
    if unknown and model.model_config.get("extra") != "allow":  # also for a model that would ignore it
        raise TemplateError(f"unknown key for {model.__name__}; allowed: {', '.join(allowed) or 'none'}", file=file,
                            node=node.id, field=f"config.{unknown[0]}")
    try:
        return model.model_validate(node.config)
    except ValidationError as exc:
        raise from_validation_error(
            exc, model=function.config_model, file=file, node=node.id, prefix=("config",)
        ) from None


def _field_keys(name: str, field) -> list[str]:
    """The keys a pydantic field is given by: its name, its alias, its validation alias(es)."""
    from pydantic import AliasChoices

    keys = [name, *(alias for alias in (field.alias,) if alias)]
    validation = field.validation_alias
    choices = validation.choices if isinstance(validation, AliasChoices) else [validation]
    return keys + [choice for choice in choices if isinstance(choice, str)]


def describe_plan(plan: Plan) -> str:
    """A human-readable listing of the plan: per phase, order, DP-size hops and every worker's chain."""
    lines = [f"plan {plan.template!r}: world size {plan.world_size}, "
             f"{sum(len(p.order) for p in plan.phases.values())} nodes"]
    for phase in plan.phases.values():
        lines += [f"phase {phase.phase}:", f"order: {' -> '.join(phase.order)}",
                  "DP-size hops:" if phase.hops else "DP-size hops: none (every node runs at one DP size)"]
        lines += [f"  {h.src} (dp {h.src_dp_size}) -> {h.dst} (dp {h.dst_dp_size})" for h in phase.hops]
        runs = [task for chain in phase.chains.values() for task in chain if isinstance(task, RunNode)]
        widths = (max(len(t.node_id) for t in runs), max(len(_function_name(t)) for t in runs))
        for rank, chain in phase.chains.items():
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
