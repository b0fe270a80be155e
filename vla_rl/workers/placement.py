"""Where the DAG workers run: their accelerators through Ray, one placement-group bundle each.

Every worker asks Ray for its CPUs and, on an accelerator run, its accelerator (``num_gpus`` for
CUDA, the custom resource ``NPU`` for Ascend), in a placement group with one bundle per worker
(``workers.placement_strategy``: ``PACK`` fills a node before the next, ``SPREAD`` puts the
workers on as many nodes as it can). Ray then sets ``CUDA_VISIBLE_DEVICES`` (or
``ASCEND_RT_VISIBLE_DEVICES``) in each worker to the device it granted, so every worker binds
device 0 of what it sees and no two workers share a GPU unless ``workers.gpus_per_worker`` asks
for a fraction. CPU workers see no accelerator (:data:`CPU_WORKER_ENV`): Ray leaves the variables
alone for actors that ask for none, and torch, which then sees the node's GPUs, asks the current
CUDA device for its stream in every optimizer step (torch 2.13's
``Optimizer._accelerator_graph_capture_health_check``). A worker's simulator actors are placed
on its own node (:func:`same_node_strategy`), outside the placement group: a node must hold each
of its workers' bundles *and* their simulator actors' CPUs.

Before the driver waits for the cluster it joined, or the Ray instance it started on its own
machine (where what is missing never comes: no node joins it), :func:`check_cluster_fits` compares
what the run needs (:class:`Footprint`) with the nodes' resources and refuses, in one line, a
cluster that can never hold it; after placement, :func:`check_simulator_room` refuses a node that received more
workers than it has CPUs for their simulators. The wait for the placement group polls, so Ctrl-C
stops it within a second.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Any

from vla_rl.errors import RunStopped

#: The Ray resource an accelerator kind is requested by.
ACCELERATOR_RESOURCES: dict[str, str] = {"cuda": "GPU", "npu": "NPU"}

#: The environment of a CPU worker's actor: Ray sets the visible-accelerator variables of an actor
#: that asks for no accelerator to none (``CUDA_VISIBLE_DEVICES=""``, ``ASCEND_RT_VISIBLE_DEVICES=""``)
#: only when this is set (``ray/_private/utils.py``, ``set_visible_accelerator_ids``; unset in Ray
#: 2.60 by default). Actors the worker starts inherit it; its simulator actors set it back
#: (:data:`simulators.pool.WORKER_ENV_VARS`), so that they render on the node's GPU.
CPU_WORKER_ENV: dict[str, str] = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1"}


def resolve_device(kind: str, cluster_resources: dict[str, float]) -> str:
    """The device kind of the run: ``auto`` becomes ``cuda`` or ``npu`` when the Ray cluster has
    that resource (the driver may run on a node without one), else ``cpu``."""
    if kind != "auto":
        return kind
    for device, resource in ACCELERATOR_RESOURCES.items():
        if cluster_resources.get(resource, 0) > 0:
            return device
    return "cpu"


def check_accelerator_sharing(workers, device: str, world_size: int) -> None:
    """Refuse a group that would put several NCCL (or HCCL) ranks on one accelerator, once
    ``workers.device: auto`` has resolved (an explicit device is refused with the template:
    :meth:`~vla_rl.config.sections.WorkersSection.accelerator_sharing_problem`).

    Raises:
        RunStopped: ``workers.gpus_per_worker`` below 1 with more than one worker and the
            accelerator's own backend (the message names both fields).
    """
    problem = workers.accelerator_sharing_problem(device, world_size)
    if problem is not None:
        raise RunStopped(problem)


def worker_bundle(workers, device: str) -> dict[str, float]:
    """The resources of one worker's bundle: its CPUs and, on accelerators, its accelerator share."""
    bundle = {"CPU": workers.num_cpus_per_worker}
    if device in ACCELERATOR_RESOURCES:
        bundle[ACCELERATOR_RESOURCES[device]] = workers.gpus_per_worker
    return bundle


WAIT_POLL_S = 1.0
"""How long one wait for the placement group blocks (Ray's wait does not see Ctrl-C; between two
waits Python does)."""
WAIT_NOTICE_S = 5.0
"""After this long waiting for the placement group, say so (once) on stderr."""


class ClusterTooSmall(RunStopped):
    """The Ray cluster cannot hold the run: the message names what is missing and what to change."""


@dataclass(frozen=True)
class Footprint:
    """What a run asks of the Ray cluster.

    Attributes:
        world_size: DAG workers.
        bundle: one worker's placement-group bundle (:func:`worker_bundle`).
        simulator_actors: simulator actors per worker (on the worker's node, outside the bundle).
        cpus_per_simulator_actor: Ray CPUs of each.
    """

    world_size: int
    bundle: dict[str, float]
    simulator_actors: int = 0
    cpus_per_simulator_actor: float = 0.0

    @property
    def per_worker(self) -> dict[str, float]:
        """What one worker needs on its node: its bundle plus its simulator actors' CPUs."""
        needs = dict(self.bundle)
        needs["CPU"] = needs.get("CPU", 0.0) + self.simulator_actors * self.cpus_per_simulator_actor
        return needs

    def total(self) -> dict[str, float]:
        """What the whole run needs, by Ray resource."""
        return {resource: amount * self.world_size for resource, amount in self.per_worker.items()}

    def breakdown(self, resource: str) -> str:
        """How the run's need of ``resource`` adds up, e.g. ``2 DAG workers x 1 CPU + 2 simulator
        actors x 1 CPU``."""
        parts = [f"{self.world_size} DAG workers x {self.bundle.get(resource, 0):g} {resource}"]
        if resource == "CPU" and self.simulator_actors and self.cpus_per_simulator_actor:
            parts.append(f"{self.world_size * self.simulator_actors} simulator actors x "
                         f"{self.cpus_per_simulator_actor:g} CPU")
        return " + ".join(parts)


def run_footprint(config, world_size: int, device: str, pools_per_worker: int = 1) -> Footprint:
    """The run's :class:`Footprint`: the workers' bundles and, for the embodied workflow (the one
    with simulators), ``pools_per_worker`` pools of ``simulator.actors_per_worker`` actors per worker."""
    sim = config.simulator
    actors = pools_per_worker * sim.actors_per_worker if config.run.workflow == "embodied" else 0
    return Footprint(world_size, worker_bundle(config.workers, device), actors, sim.num_cpus_per_actor)


def simulator_cpus_per_worker(config, pools_per_worker: int = 1) -> float:
    """The CPUs a worker's simulator actors take on its node (0 without simulators)."""
    footprint = run_footprint(config, 1, "cpu", pools_per_worker)
    return footprint.simulator_actors * footprint.cpus_per_simulator_actor


def _amount(amount: float, resource: str) -> str:
    """``4 CPUs``, ``1 GPU``, ``0.5 GPU``."""
    return f"{amount:g} {resource}{'s' if amount > 1 or amount == 0 else ''}"


def _workers_fitting(node: dict[str, float], per_worker: dict[str, float]) -> int:
    """How many workers (each with its simulator actors) one node's resources hold."""
    counts = [math.floor(node.get(resource, 0.0) / amount + 1e-9) for resource, amount in per_worker.items()
              if amount > 0]
    return min(counts) if counts else 1_000_000


def _fewer_workers(footprint: Footprint, resource: str, have: float) -> str:
    """For an accelerator the cluster has too few of: ``"workers.num_workers=N fits its 1 GPU; "``,
    N the most workers its accelerators hold at the run's share each ("" where not one fits, and
    for other resources)."""
    share = footprint.bundle.get(resource, 0.0)
    if resource not in ACCELERATOR_RESOURCES.values() or share <= 0:
        return ""
    fits = math.floor(have / share + 1e-9)
    return f"workers.num_workers={fits} fits its {_amount(have, resource)}; " if fits >= 1 else ""


def check_cluster_fits(footprint: Footprint, nodes: list[dict[str, float]], address: str | None,
                       strategy: str, auto: bool = False) -> None:
    """Refuse, in one line, a cluster whose nodes can never hold the run.

    Args:
        footprint: what the run needs.
        nodes: each alive node's total resources (``ray.nodes()``'s ``Resources``).
        address: the cluster's address, for the message; None for the Ray instance the driver
            started on its own machine (no other node can join it, so what it lacks never comes:
            e.g. ``workers.device=cuda`` where Ray sees no GPU).
        strategy: ``workers.placement_strategy`` (``STRICT_SPREAD`` needs a node per worker,
            ``STRICT_PACK`` one node for all).
        auto: the device kind came from ``workers.device=auto`` (the message says which it chose).

    Raises:
        ClusterTooSmall: a resource the cluster has too little of in all (naming what the run
            needs it for, and how to give it more), or nodes too small to hold a worker beside its
            simulator actors, or too few nodes for the strategy.
    """
    def ways_out(fewer: str = "", offer_auto: bool = True) -> str:
        if address is None:
            device_choice = "workers.device=cpu" if auto or not offer_auto else (
                "workers.device=cpu, or auto, which takes an accelerator only where there is one")
            return ("run it where they are (a machine or a cluster that has them: workers.ray_address; "
                    "CUDA_VISIBLE_DEVICES or ASCEND_RT_VISIBLE_DEVICES decide which accelerators Ray sees here) or "
                    f"ask for less ({fewer}{device_choice}; workers.num_workers, workers.gpus_per_worker)")
        return ("give the nodes more (`ray start --num-cpus=N`, `--num-gpus=N` on each) or ask for less "
                f"({fewer}workers.num_workers, workers.num_cpus_per_worker, workers.gpus_per_worker, "
                "simulator.actors_per_worker, simulator.num_cpus_per_actor)")

    where = "the Ray instance started on this machine" if address is None else f"the Ray cluster at {address}"
    for resource, need in footprint.total().items():
        have = sum(node.get(resource, 0.0) for node in nodes)
        if need > 0 and have + 1e-9 < need:
            chosen = next((f"; workers.device=auto chose {device}" for device, name in ACCELERATOR_RESOURCES.items()
                           if auto and name == resource), "")
            raise ClusterTooSmall(f"{where} has {_amount(have, resource)} in all; this run needs {need:g} "
                                  f"({footprint.breakdown(resource)}{chosen}): "
                                  f"{ways_out(_fewer_workers(footprint, resource, have), offer_auto=have == 0)}")
    per_worker = footprint.per_worker
    fitting = [_workers_fitting(node, per_worker) for node in nodes]
    need_text = " + ".join(_amount(amount, resource) for resource, amount in per_worker.items() if amount > 0)
    what = (f"a worker and its simulator actors need {need_text} on one node" if footprint.simulator_actors
            else f"a worker needs {need_text} on one node")
    if strategy == "STRICT_SPREAD":
        hold, needed = sum(1 for n in fitting if n >= 1), footprint.world_size
        problem = (f"{hold} of its {len(nodes)} nodes can hold one; STRICT_SPREAD puts each of the {needed} workers "
                   "on its own node")
    elif strategy == "STRICT_PACK":
        hold, needed = max(fitting, default=0), footprint.world_size
        problem = f"its largest node holds {hold}; STRICT_PACK puts all {needed} workers on one node"
    else:
        hold, needed = sum(fitting), footprint.world_size
        problem = f"its nodes hold {hold} such workers; this run has {needed}"
    if hold < needed:
        raise ClusterTooSmall(f"{where} cannot hold this run: {what}, and {problem}: {ways_out()}")


def busy_note(footprint: Footprint, free: dict[str, float], address: str) -> str | None:
    """One line saying that the cluster has less free than the run needs (other jobs hold the
    rest, so the run waits for them), or None."""
    short = [f"{_amount(free.get(resource, 0.0), resource)} free of the {need:g} this run needs "
             f"({footprint.breakdown(resource)})"
             for resource, need in footprint.total().items() if free.get(resource, 0.0) + 1e-9 < need]
    if not short:
        return None
    return (f"the Ray cluster at {address} has {', '.join(short)}; the run waits for other jobs to release them "
            f"(Ctrl-C stops)")


def check_simulator_room(group, footprint: Footprint, strategy: str = "PACK") -> None:
    """After placement: refuse a node that received more workers than its CPUs can hold beside
    their simulator actors (which run on their worker's node), instead of letting them wait forever.

    Args:
        group: the workers' placement group, placed.
        footprint: what the run needs.
        strategy: the group's ``workers.placement_strategy``: the way out the message gives
            (``SPREAD``'s is ``STRICT_SPREAD``: Ray's ``SPREAD`` is a preference, which puts the
            workers together where other jobs hold the other nodes' CPUs).

    Raises:
        ClusterTooSmall: naming the node, its ranks, its CPUs, what they need and what to change.
    """
    import ray

    if not footprint.simulator_actors or not footprint.cpus_per_simulator_actor:
        return
    ranks_by_node: dict[str, list[int]] = {}
    for rank, node_id in ray.util.placement_group_table(group)["bundles_to_node_id"].items():
        ranks_by_node.setdefault(node_id, []).append(int(rank))
    nodes = {node["NodeID"]: node for node in ray.nodes() if node.get("Alive")}
    per_worker = footprint.per_worker["CPU"]
    for node_id, ranks in ranks_by_node.items():
        node = nodes.get(node_id, {})
        cpus = node.get("Resources", {}).get("CPU", 0.0)
        if cpus + 1e-9 < per_worker * len(ranks):
            spread = {"SPREAD": "set workers.placement_strategy=STRICT_SPREAD (SPREAD is a preference Ray drops when "
                                "other jobs hold the other nodes' CPUs; STRICT_SPREAD waits for them), or ",
                      "STRICT_SPREAD": ""}.get(strategy, "set workers.placement_strategy=SPREAD (STRICT_SPREAD to "
                                                         "wait for nodes other jobs hold), or ")
            raise ClusterTooSmall(
                f"Ray placed DAG workers {', '.join(map(str, sorted(ranks)))} on node "
                f"{node.get('NodeManagerAddress', node_id)} (Ray node id {node_id[:12]}), which has {cpus:g} CPUs; "
                f"with their simulator actors (on their worker's node) they need {per_worker * len(ranks):g}: "
                f"{spread}start that node with --num-cpus={math.ceil(per_worker * len(ranks))}")


def _wait_for_placement(group, workers, world_size: int, bundle: dict[str, float]) -> None:
    """Wait for the placement group, in short waits (Ctrl-C stops it between two), saying on
    stderr once that it waits; the group is removed if the wait ends any other way than placed.

    Raises:
        ClusterTooSmall: not placed within ``workers.placement_timeout_s`` (naming the bundle and
            the cluster's total and free amounts of its resources).
    """
    import ray

    started = time.monotonic()
    announced = False
    try:
        while not group.wait(timeout_seconds=WAIT_POLL_S):
            waited = time.monotonic() - started
            if waited >= workers.placement_timeout_s:
                # the bundle's resources only (Ray adds its placement groups' own); a used-up
                # resource is absent from available_resources(): 0 free
                total, free = ray.cluster_resources(), ray.available_resources()
                amounts = ", ".join(f"{free.get(r, 0.0):g} of {total.get(r, 0.0):g} {r} free" for r in bundle)
                raise ClusterTooSmall(f"Ray could not place {world_size} DAG workers of {bundle} with strategy "
                                      f"{workers.placement_strategy} within workers.placement_timeout_s="
                                      f"{workers.placement_timeout_s:g} s ({amounts}): another job holds them, or "
                                      "the nodes cannot fit the strategy")
            if not announced and waited >= WAIT_NOTICE_S:
                free = {resource: ray.available_resources().get(resource, 0.0) for resource in bundle}
                print(f"waiting for Ray to place {world_size} DAG workers of {bundle} ({workers.placement_strategy}); "
                      f"free now: {free}; up to workers.placement_timeout_s={workers.placement_timeout_s:g} s, "
                      "Ctrl-C stops", file=sys.stderr, flush=True)
                announced = True
    except BaseException:
        ray.util.remove_placement_group(group)
        raise


def worker_actor_options(workers, device: str, world_size: int, simulator_cpus: float = 0.0
                         ) -> tuple[Any, list[dict[str, Any]]]:
    """A placement group for the workers (created and waited for here; remove it when they are
    done) and the Ray actor options of each rank's worker: its bundle's resources and the bundle,
    and on the CPU :data:`CPU_WORKER_ENV`.

    Args:
        workers: the run's ``workers`` section.
        device: the run's device kind.
        world_size: the number of workers.
        simulator_cpus: the CPUs each worker's simulator actors take on its node
            (:func:`simulator_cpus_per_worker`), checked once the workers are placed.

    Raises:
        RuntimeError: the cluster cannot hold the bundles (naming them and the cluster's resources).
        ClusterTooSmall: a node got more workers than it has CPUs for their simulator actors.
        KeyboardInterrupt: Ctrl-C while waiting (the placement group is removed).
    """
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundle = worker_bundle(workers, device)
    group = placement_group([dict(bundle) for _ in range(world_size)], strategy=workers.placement_strategy)
    _wait_for_placement(group, workers, world_size, bundle)
    try:
        check_simulator_room(group, Footprint(world_size, bundle, 1 if simulator_cpus else 0, simulator_cpus),
                             workers.placement_strategy)
    except ClusterTooSmall:
        ray.util.remove_placement_group(group)
        raise
    options = []
    for rank in range(world_size):
        resources = {"num_cpus": bundle["CPU"]}
        if device == "cuda":
            resources["num_gpus"] = bundle["GPU"]
        elif device == "npu":
            resources["resources"] = {"NPU": bundle["NPU"]}
        else:
            resources["runtime_env"] = {"env_vars": dict(CPU_WORKER_ENV)}
        options.append({**resources, "scheduling_strategy": PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=rank)})
    return group, options


def same_node_strategy():
    """A scheduling strategy that keeps an actor on this process's Ray node (a worker's
    simulator actors next to it), or None outside Ray."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        return None
    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
