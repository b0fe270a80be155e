"""Where the DAG workers run: their accelerators through Ray, one placement-group bundle each.

Every worker asks Ray for its CPUs and, on an accelerator run, its accelerator (``num_gpus`` for
CUDA, the custom resource ``NPU`` for Ascend), in a placement group with one bundle per worker
(``workers.placement_strategy``: ``PACK`` fills a node before the next, ``SPREAD`` puts the
workers on as many nodes as it can). Ray then sets ``CUDA_VISIBLE_DEVICES`` (or
``ASCEND_RT_VISIBLE_DEVICES``) in each worker to the device it granted, so every worker binds
device 0 of what it sees and no two workers share a GPU unless ``workers.gpus_per_worker`` asks
for a fraction. A worker's simulator actors are placed on its own node
(:func:`same_node_strategy`).
"""

from __future__ import annotations

from typing import Any

#: The Ray resource an accelerator kind is requested by.
ACCELERATOR_RESOURCES: dict[str, str] = {"cuda": "GPU", "npu": "NPU"}


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
    """Refuse a group that would put several NCCL (or HCCL) ranks on one accelerator.

    Raises:
        ValueError: ``workers.gpus_per_worker`` below 1 with more than one worker and the
            accelerator's own backend (the message names both fields).
    """
    backend = workers.collective_backend or {"cuda": "nccl", "npu": "hccl"}.get(device, "gloo")
    if device in ACCELERATOR_RESOURCES and world_size > 1 and workers.gpus_per_worker < 1 and (
            "nccl" in backend or "hccl" in backend):
        raise ValueError(
            f"workers.gpus_per_worker={workers.gpus_per_worker} lets {world_size} workers share an accelerator, "
            f"which {backend} refuses (two ranks on one device); set workers.collective_backend=gloo to share "
            "one, or give each worker a whole accelerator")


def worker_bundle(workers, device: str) -> dict[str, float]:
    """The resources of one worker's bundle: its CPUs and, on accelerators, its accelerator share."""
    bundle = {"CPU": workers.num_cpus_per_worker}
    if device in ACCELERATOR_RESOURCES:
        bundle[ACCELERATOR_RESOURCES[device]] = workers.gpus_per_worker
    return bundle


def worker_actor_options(workers, device: str, world_size: int) -> tuple[Any, list[dict[str, Any]]]:
    """A placement group for the workers (created and waited for here; remove it when they are
    done) and the Ray actor options of each rank's worker: its bundle's resources and the bundle.

    Raises:
        RuntimeError: the cluster cannot hold the bundles (naming them and the cluster's resources).
    """
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundle = worker_bundle(workers, device)
    group = placement_group([dict(bundle) for _ in range(world_size)], strategy=workers.placement_strategy)
    if not group.wait(timeout_seconds=workers.placement_timeout_s):
        raise RuntimeError(f"Ray could not place {world_size} workers of {bundle} with strategy "
                           f"{workers.placement_strategy} within {workers.placement_timeout_s} s; the cluster has "
                           f"{ray.cluster_resources()}")
    options = []
    for rank in range(world_size):
        resources = {"num_cpus": bundle["CPU"]}
        if device == "cuda":
            resources["num_gpus"] = bundle["GPU"]
        elif device == "npu":
            resources["resources"] = {"NPU": bundle["NPU"]}
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
