"""Dispatch of DAG nodes: ``(role, type, name)`` → a registered node function and its contract.

A node function has the signature ``fn(ctx, batch) -> NodeOutput``: ``ctx`` is the worker-side
context (device, process groups, the node's validated config, the resources it declared, ...),
``batch`` the merged outputs of the node's dependencies (``None`` for a node without deps; deps
must output the same rows, and a key two of them output must hold equal values in both, else the
worker stops naming the node and the deps: ``DAGWorker._node_input``). New
algorithms and nodes are added by registering, never by editing the worker::

    class RewardConfig(BaseModel):
        model_config = ConfigDict(extra="forbid")
        scale: float = 1.0

    @register_node("reward", "compute", "scaled", config=RewardConfig,
                   reads=(keys.SUCCESS,), writes=(keys.REWARDS,), resources=())
    def compute_reward(ctx, batch: TensorDict) -> NodeOutput: ...

The **contract** — the batch keys a node reads and writes, and the worker resources it uses — is
data the planner checks before anything starts (a key read that no upstream node writes is an
error naming both) and from which each worker builds exactly the resources its chain needs
(:mod:`vla_rl.workers.resources`). Each entry is a tuple of names, or a function
``(run_config, node_config) -> names`` when it depends on the settings (the advantage node reads
``values`` only under GAE). A node whose layout has rules of its own declares a ``check``
``(run_config, node_config, dp_size, world_size) -> (field, message) | None`` the planner calls.
A function that is the only reader of some run settings declares them (``settings=("critic",)``):
an override of one on a template without such a node would change nothing, and the planner
refuses it (:func:`vla_rl.dag.planner.plan`). A function made for one phase declares it
(``phases=("warm_start",)``: the supervised warm start's fine-tuning); the planner refuses a node
running it in another. A function reading, for each row, state an upstream node kept on the
worker that produced the row declares that node's role (``local_to="data"``: the text reward);
the planner refuses a template that runs the two at different DP sizes.

The built-in functions live in :mod:`vla_rl.nodes`, which :data:`NODE_FUNCTIONS` imports by
name at its first lookup, as every registry loads its built-ins
(:class:`vla_rl_core.registry.Registry`). The workflow kits are registered here too
(:data:`WORKFLOWS`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from pydantic import BaseModel, ValidationError

from vla_rl.dag.schema import NODE_TYPES, PHASES, ROLES
from vla_rl_core.registry import Registry, RegistryError, check_call

if TYPE_CHECKING:  # tensordict pulls in torch; the planner and the CLI do not need it.
    from tensordict import TensorDict

BUILTIN_NODES_PACKAGE = "vla_rl.nodes"

WORKFLOWS: Registry = Registry("workflow", builtins=("vla_rl.workflows.embodied", "vla_rl.workflows.text"))
"""The workflow kits (:mod:`vla_rl.workflows`) by ``run.workflow`` name. The registry sits here,
beside the node functions' (both are what a template names), so that the DAG worker and its
resources find a kit by name without importing the workflows, which stand on them."""


Declared = Union[tuple[str, ...], Callable[[Any, Any], Iterable[str]]]
"""A contract entry: names, or a function ``(run_config, node_config) -> names``."""

LayoutCheck = Callable[[Any, Any, int, int], "tuple[str, str] | None"]
"""``(run_config, node_config, dp_size, world_size) -> (field, message)`` of a layout the node
cannot run in, or None."""


def resolve(declared: Declared, run_config: Any, node_config: Any) -> frozenset[str]:
    """The names a contract entry stands for under the given settings.

    Raises:
        TypeError: a contract function returned something else than names (a string, read one
            character at a time, was the usual mistake).
    """
    names = declared(run_config, node_config) if callable(declared) else declared
    if isinstance(names, str) or not isinstance(names, (tuple, list, set, frozenset)) or not all(
            isinstance(name, str) and name for name in names):
        raise TypeError(f"its contract function {getattr(declared, '__qualname__', declared)} (from "
                        f"{getattr(declared, '__module__', '?')}) returned {names!r}, not a tuple of names")
    return frozenset(names)


@dataclass
class NodeOutput:
    """What a node function returns.

    Attributes:
        batch: the node's output batch (batch dimension first), handed to the nodes that depend on
            it; ``None`` for a node that only has side effects (e.g. a model update).
        metrics: scalar metrics of this step, logged under their own names (prefix them, e.g.
            ``reward/``; a plain value is averaged over the workers, weighted by the node's input
            size: :mod:`vla_rl.workers.metrics`).
    """

    batch: TensorDict | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeFunction:
    """A registered node function and what it declares.

    Attributes:
        role: the node role it serves (see :data:`vla_rl.dag.schema.ROLES`).
        type: the node type it serves (see :data:`vla_rl.dag.schema.NODE_TYPES`).
        name: its name among the functions of that (role, type); a node picks it with ``fn:``.
        fn: the callable ``fn(ctx, batch) -> NodeOutput``.
        config_model: the pydantic model of the node's ``config:`` mapping; ``None`` for a
            function that takes no settings (then the node's ``config:`` must be empty).
        whole_groups: whether the function needs each group's samples on one rank (rewards,
            advantages and filters compare a group's samples); ``False`` lets a re-shard into
            the node balance single samples (a model update, once advantages are known).
        reads: batch keys it reads from its input.
        writes: batch keys it adds to its output (its output also carries its input's keys).
        resources: names of the worker resources it uses (:mod:`vla_rl.workers.resources`).
        check: the planner's check of its layout (see :data:`LayoutCheck`), or None.
        settings: dotted run-config settings (a section, ``"critic"``, or one setting,
            ``"algorithm.filter_groups.max_refill_rounds"``) that only nodes of the functions
            declaring them read, wherever else a run goes.
        phases: the template phases (:data:`~vla_rl.dag.schema.PHASES`) a node of this function
            may run in; every phase when empty.
        local_to: the role of an upstream node whose worker-local state the function reads for
            each of its rows (the text reward reads each row's answer from the prompts its
            worker's data node read: ``local_to="data"``); the planner refuses a template that
            runs the two at different DP sizes (:func:`vla_rl.dag.layouts.check_local_rows`).
            None: the function reads only its input.
    """

    role: str
    type: str
    name: str
    fn: Callable[[Any, Any], NodeOutput]
    config_model: type[BaseModel] | None
    whole_groups: bool = True
    reads: Declared = ()
    writes: Declared = ()
    resources: Declared = ()
    check: LayoutCheck | None = None
    settings: tuple[str, ...] = ()
    phases: tuple[str, ...] = ()
    local_to: str | None = None


NODE_FUNCTIONS: Registry[NodeFunction] = Registry("node function", builtins=(BUILTIN_NODES_PACKAGE,))
"""All node functions, keyed by ``(role, type, name)``; the built-ins load at the first lookup."""


def register_node(
    role: str, type: str, name: str = "default", config: type[BaseModel] | None = None, *,
    whole_groups: bool = True, reads: Declared = (), writes: Declared = (), resources: Declared = (),
    check: LayoutCheck | None = None, settings: Iterable[str] = (), phases: Iterable[str] = (),
    local_to: str | None = None,
) -> Callable[[Callable[[Any, Any], NodeOutput]], Callable[[Any, Any], NodeOutput]]:
    """Decorator registering a node function for ``(role, type, name)``; returns it unchanged.

    Args:
        role: one of :data:`~vla_rl.dag.schema.ROLES`.
        type: one of :data:`~vla_rl.dag.schema.NODE_TYPES`.
        name: the function's name for this (role, type); nodes select it with ``fn: <name>``.
        config: pydantic model validating the node's ``config:`` mapping, or ``None``.
        whole_groups, reads, writes, resources, check, settings, phases, local_to: its contract,
            see :class:`NodeFunction`.

    Raises:
        ValueError: if ``role``, ``type``, ``local_to`` or a name in ``phases`` is unknown (the
            message lists the allowed ones), or a name in ``settings`` is no dotted name (``"critic"``,
            ``"algorithm.filter_groups"``).
        TypeError: if ``config`` is not a pydantic model class, ``settings`` is a string, a
            contract entry is neither names nor a function of ``(run_config, node_config)``,
            ``check`` cannot take ``(run_config, node_config, dp_size, world_size)``, or the
            function cannot take ``(ctx, batch)``.
        RegistryError: if ``(role, type, name)`` is already registered.
    """
    if role not in ROLES:
        raise ValueError(f"unknown node role {role!r}; allowed: {', '.join(ROLES)}")
    if type not in NODE_TYPES:
        raise ValueError(f"unknown node type {type!r}; allowed: {', '.join(NODE_TYPES)}")
    if local_to is not None and local_to not in ROLES:
        raise ValueError(f"unknown node role {local_to!r} in local_to; allowed: {', '.join(ROLES)}")
    if config is not None and not (inspect.isclass(config) and issubclass(config, BaseModel)):
        raise TypeError(f"config of node function {name!r} must be a pydantic model class, got {config!r}")
    what = f"node function ({role!r}, {type!r}, {name!r})"
    if config is not None:
        _check_config_defaults(what, config)
    contracts = {"reads": reads, "writes": writes, "resources": resources}
    for contract, declared in contracts.items():
        if callable(declared):
            check_call(f"{what}: its {contract}", declared, ("run_config", "node_config"))
        elif not isinstance(declared, (tuple, list, frozenset, set)) or not all(
                isinstance(item, str) and item for item in declared):
            example = f"({declared!r},)" if isinstance(declared, str) else "('name',)"
            raise TypeError(f"{what}: {contract} must be a tuple of names (e.g. {contract}={example}) or a function "
                            f"(run_config, node_config) -> names, got {declared!r}")
        else:
            contracts[contract] = tuple(declared)
    if check is not None:
        check_call(f"{what}: its check", check, ("run_config", "node_config", "dp_size", "world_size"))
    if isinstance(settings, str):
        raise TypeError(f"{what}: settings must be a tuple of dotted settings (e.g. settings=({settings!r},)), "
                        f"got {settings!r}")
    settings = tuple(settings)
    for setting in settings:
        if not isinstance(setting, str) or not all(part.isidentifier() for part in setting.split(".")):
            raise ValueError(f"{what}: settings must be dotted run-config settings (e.g. 'critic' or "
                             f"'algorithm.filter_groups.max_refill_rounds'), got {setting!r}")
    phases = (phases,) if isinstance(phases, str) else tuple(phases)
    unknown = [phase for phase in phases if phase not in PHASES]
    if unknown:
        raise ValueError(f"{what}: unknown phase {unknown[0]!r} in phases; allowed: {', '.join(PHASES)}")

    def decorator(fn: Callable[[Any, Any], NodeOutput]) -> Callable[[Any, Any], NodeOutput]:
        check_call(what, fn, ("ctx", "batch"))
        entry = NodeFunction(role=role, type=type, name=name, fn=fn, config_model=config, whole_groups=whole_groups,
                             check=check, settings=settings, phases=phases, local_to=local_to, **contracts)
        NODE_FUNCTIONS.register((role, type, name))(entry)
        return fn

    return decorator


def _check_config_defaults(what: str, config: type[BaseModel]) -> None:
    """The defaults of a node config model must pass its own validation (pydantic does not
    validate defaults: ``coef: float = Field("lots", ge=0)`` failed deep in a worker).

    Raises:
        TypeError: naming the field, the model and pydantic's reason.
    """
    defaults = {name: field.get_default(call_default_factory=True)
                for name, field in config.model_fields.items() if not field.is_required()}
    try:
        config.model_validate(defaults, by_name=True)
    except ValidationError as err:
        wrong = [error for error in err.errors() if error["type"] != "missing"]  # required fields have none
        if wrong:
            field = ".".join(map(str, wrong[0]["loc"]))
            raise TypeError(f"{what}: the default of {config.__name__}.{field} ({wrong[0]['input']!r}) fails its "
                            f"own validation: {wrong[0]['msg']}") from None


def get_node_function(role: str, type: str, name: str = "default") -> NodeFunction:
    """Return the node function registered for ``(role, type, name)``.

    Raises:
        RegistryError: if there is none; the message lists the functions registered for this
            (role, type), or all registered functions when this (role, type) has none.
    """
    key = (role, type, name)
    if key in NODE_FUNCTIONS:
        return NODE_FUNCTIONS.get(key)
    same_kind = [n for r, t, n in NODE_FUNCTIONS if (r, t) == (role, type)]
    if same_kind:
        known = f"registered for ({role}, {type}): {', '.join(same_kind)}"
    else:
        every = [f"{r}/{t}/{n}" for r, t, n in NODE_FUNCTIONS]
        known = f"none registered for ({role}, {type}); registered: {', '.join(every) or 'none'}"
    raise RegistryError(f"no node function {name!r} for role {role!r}, type {type!r}; {known}")

