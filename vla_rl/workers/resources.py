"""A DAG worker's long-lived objects — its **resources** — built from registered builders.

A resource is anything a node function uses across steps: the policy, the simulator pool, the
actor trainer, the frozen reference, the critic, the KL controller, SRPO's trajectory encoder, the
prompt loaders, an evaluation session. Each is registered once, next to the code that owns it,
with the resources it is built from and, where it holds training state, how it is checkpointed::

    @register_resource("reference", needs=("policy",),
                       checkpoint=SharedModuleCheckpoint("reference", "reference", owner="policy"))
    def build_reference(res: Resources):
        ...  # a frozen copy of the policy (vla_rl/nodes/inference.py)

Nodes declare the resources they use (``register_node(..., resources=("reference",))``). A worker
builds exactly the resources its chains declare, with their ``needs`` first, when a phase starts
(:meth:`Resources.ensure`), in a deterministic order; a node reaches only those it declared
(:meth:`Resources.view`). So a template without a critic never builds one, and a node that uses
an undeclared resource fails with a message naming both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from vla_rl.config import RunConfig
from vla_rl.errors import RunStopped
from vla_rl_core.registry import Registry, check_call


class ResourceError(RunStopped):
    """A resource used without being declared, or whose builder is missing: a plug-in's mistake
    whose message names the node and the resource, so the run stops with it alone (no traceback)."""


class ResourceCheckpoint(Protocol):
    """How a resource's training state enters a checkpoint directory. Every rank calls both
    (rank 0, ``resources.rank == 0``, writes the state replicated over the workers). A checkpoint
    whose ``save`` runs collectives (sharded state) sets a class attribute ``collective = True``:
    it is saved before the others."""

    def save(self, resources: Resources, directory: Path) -> dict[str, Any]:
        """Write the state; return metadata for ``trainer_state.json`` (may be empty)."""

    def load(self, resources: Resources, directory: Path, metadata: dict[str, Any]) -> None:
        """Restore the state written by :meth:`save` (``metadata``: the checkpoint's)."""


@dataclass(frozen=True)
class ResourceSpec:
    """A registered resource.

    Attributes:
        name: what nodes declare.
        build: ``build(resources) -> object``; reads the run config and the resources of ``needs``.
        needs: resources built before this one (and available to ``build``).
        close: releases it at shutdown (simulator actors, engines); None: nothing to release.
        checkpoint: how its state is saved and restored; None: it holds no training state.
    """

    name: str
    build: Callable[[Resources], Any]
    needs: tuple[str, ...] = ()
    close: Callable[[Any], None] | None = None
    checkpoint: ResourceCheckpoint | None = None


RESOURCES: Registry[ResourceSpec] = Registry("worker resource")
"""Every resource a node can declare, by name."""


def register_resource(name: str, *, needs: Iterable[str] = (), close: Callable[[Any], None] | None = None,
                      checkpoint: ResourceCheckpoint | None = None) -> Callable[[Callable], Callable]:
    """Decorator registering ``build(resources) -> object`` as resource ``name``; returns ``build``.

    Raises:
        RegistryError: ``name`` is already registered.
        TypeError: ``needs`` is not names (a string would be read one character at a time), or
            ``build`` cannot take ``(resources)`` or ``close`` ``(resource)``: refused at the
            plug-in's import rather than in every worker's setup.
    """
    if isinstance(needs, str) or not isinstance(needs, (tuple, list, set, frozenset)) or not all(
            isinstance(need, str) and need for need in needs):
        raise TypeError(f"worker resource {name!r}: needs must be a tuple of resource names, got {needs!r}")
    needs = tuple(needs)
    if close is not None:
        check_call(f"worker resource {name!r}: its close", close, ("resource",))

    def decorator(build: Callable[[Resources], Any]) -> Callable[[Resources], Any]:
        check_call(f"worker resource {name!r}", build, ("resources",))
        RESOURCES.register(name)(ResourceSpec(name, build, needs, close, checkpoint))
        return build

    return decorator


class Resources:
    """One worker's resources, and the facts every builder and node may read.

    Always available: ``config`` (the run config), ``rank``, ``world_size``, ``run_dir``,
    ``device``, ``group`` (the workers' process group, None: the default one), ``generator`` (the
    worker's sampling and shuffling RNG, saved in checkpoints), ``workflow`` (the run's
    :class:`~vla_rl.workflows.base.Workflow`) and ``rollout_dp_size`` (the DP size of the
    training rollout node, which sizes the simulator pool). Registered resources are attributes
    once :meth:`ensure` built them.

    Args:
        config: the run config.
        rank, world_size: this worker's rank and the number of DAG workers.
        run_dir: the run directory (checkpoints, demonstrations, videos).
        device: the torch device the worker is bound to.
        rollout_dp_size: see above.
        group: the workers' process group.
    """

    def __init__(self, config: RunConfig, rank: int, world_size: int, run_dir: Path, device: torch.device,
                 rollout_dp_size: int, group: dist.ProcessGroup | None = None) -> None:
        from vla_rl.dag.registry import WORKFLOWS

        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.run_dir = run_dir
        self.device = device
        self.rollout_dp_size = rollout_dp_size
        self.group = group
        self.generator = torch.Generator().manual_seed(config.run.seed * 1_000_003 + rank)
        self.workflow = WORKFLOWS.get(config.run.workflow)
        self._built: dict[str, Any] = {}

    # ------------------------------------------------------------------ building
    def ensure(self, names: Iterable[str]) -> list[str]:
        """Build the resources ``names`` (and what they need) that are not built yet, each
        resource's ``needs`` first, otherwise in the order given; returns the names built.

        Raises:
            RegistryError: an unknown resource name (the message lists the registered ones).
        """
        built: list[str] = []

        def visit(name: str, path: tuple[str, ...]) -> None:
            if name in self._built:
                return
            if name in path:
                raise ResourceError(f"resources need each other in a cycle: {' -> '.join((*path, name))}")
            spec = RESOURCES.get(name)
            for need in spec.needs:
                visit(need, (*path, name))
            self._built[name] = spec.build(self)
            built.append(name)

        for name in names:
            visit(name, ())
        return built

    def provide(self, name: str, resource: Any) -> None:
        """Use ``resource`` as resource ``name`` instead of building it (a pool or spec made
        elsewhere, e.g. by a tool or a test).

        Raises:
            RegistryError: an unknown resource name.
        """
        RESOURCES.get(name)
        self._built[name] = resource

    def built(self) -> list[str]:
        """The names of the resources built so far, in build order."""
        return list(self._built)

    def __getattr__(self, name: str) -> Any:
        built = self.__dict__.get("_built", {})
        if name in built:
            return built[name]
        if name in RESOURCES:
            raise ResourceError(f"resource {name!r} is used but no node of this worker's chains declares it "
                                f"(built: {', '.join(built) or 'none'}); add it to the node's "
                                "register_node(resources=...)")
        raise AttributeError(name)

    def view(self, node_id: str, declared: Iterable[str]) -> ResourceView:
        """What node ``node_id`` may reach: the shared facts and the resources it ``declared``."""
        return ResourceView(self, node_id, frozenset(declared))

    # ------------------------------------------------------------------ checkpoints and shutdown
    def save_checkpoint(self, directory: Path) -> dict[str, Any]:
        """Every built resource with a checkpoint writes its state to ``directory``; returns the
        merged metadata. Checkpoints marked ``collective`` (every worker takes part, e.g. sharded
        state) go first, in build order, so that no worker is still inside one when another has
        failed elsewhere; then the others, in build order."""
        metadata: dict[str, Any] = {}
        checkpoints = [RESOURCES.get(name).checkpoint for name in self._built]
        checkpoints = [c for c in checkpoints if c is not None]
        for checkpoint in sorted(checkpoints, key=lambda c: not getattr(c, "collective", False)):
            metadata.update(checkpoint.save(self, directory))
        return metadata

    def load_checkpoint(self, directory: Path, metadata: dict[str, Any], names: Iterable[str] | None = None) -> None:
        """Restore the built resources with a checkpoint (only ``names``, if given) from ``directory``."""
        wanted = None if names is None else set(names)
        for name in self._built:
            checkpoint = RESOURCES.get(name).checkpoint
            if checkpoint is not None and (wanted is None or name in wanted):
                checkpoint.load(self, directory, metadata)

    def close(self) -> None:
        """Release the built resources that hold processes or engines, last built first."""
        for name in reversed(list(self._built)):
            close = RESOURCES.get(name).close
            if close is not None:
                close(self._built[name])
        self._built.clear()


class ResourceView:
    """A node's window on its worker's :class:`Resources`: the shared facts (``config``,
    ``rank``, ``generator``, ``workflow``, ...) and the resources the node declared."""

    _SHARED = frozenset({"config", "rank", "world_size", "run_dir", "device", "group", "generator", "workflow",
                         "rollout_dp_size", "episodes_per_step", "eval_episodes"})

    def __init__(self, resources: Resources, node_id: str, declared: frozenset[str]) -> None:
        self._resources = resources
        self._node_id = node_id
        self._declared = declared

    def __getattr__(self, name: str) -> Any:
        if name in ResourceView._SHARED or name in self._declared:
            return getattr(self._resources, name)
        if name in RESOURCES:
            raise ResourceError(f"node {self._node_id!r} uses resource {name!r} without declaring it; add it to "
                                "its register_node(resources=...)")
        raise AttributeError(name)
