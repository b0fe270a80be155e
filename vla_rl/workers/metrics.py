"""Reducing node metrics over the DAG workers."""

from __future__ import annotations

import torch.distributed as dist

from vla_rl.utils.collectives import all_gather_small_objects


def reduce_metrics(local: list[tuple[str, float, float]], group: dist.ProcessGroup | None = None) -> dict[str, float]:
    """Weighted means of scalar metrics over all workers.

    Args:
        local: ``(name, value, weight)`` triples of this worker; a node's value is a mean over
            its local shard and its weight is ``shard size / replicas`` so that replicated shards
            (DP size < world size) count once.
        group: the workers' process group.

    Returns:
        ``{name: Σ value·weight / Σ weight}`` over every worker that reported ``name`` (names
        whose total weight is 0 are dropped); identical on every worker.
    """
    gathered = all_gather_small_objects(local, group)
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for triples in gathered:
        for name, value, weight in triples:
            sums[name] = sums.get(name, 0.0) + value * weight
            weights[name] = weights.get(name, 0.0) + weight
    return {name: sums[name] / weights[name] for name in sorted(sums) if weights[name] > 0}
