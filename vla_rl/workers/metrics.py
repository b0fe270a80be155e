"""Node metrics and their reduction over the DAG workers.

A node reports scalars. Each carries the rule that combines it over the workers, so a reduced
figure does not depend on how the batch was split (identical at DP 1 and DP 2 for identical data):

- a plain ``float``: a mean over the samples of the node's input batch (weight: its size);
- :func:`mean` ``(value, weight)``: a mean over ``weight`` units of its own (decision steps, the
  failures of a batch, minibatches);
- :func:`total`: a sum over the workers (counts, environment steps);
- :func:`same`: already identical on every worker (figures reduced inside the node).

Replicated shards (a node at DP size ``d`` < world size ``W`` runs on ``W / d`` workers holding
the same shard) count once: their weights and sums are divided by ``W / d``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch.distributed as dist

from vla_rl.utils.collectives import all_gather_small_objects

Rule = Literal["mean", "sum", "same"]


@dataclass(frozen=True)
class Metric:
    """A scalar and its reduction rule (see the module docstring).

    Attributes:
        value: the worker's value (a mean over ``weight`` units for rule ``mean``).
        weight: for ``mean``: how many units ``value`` averages (>= 0).
        rule: ``mean``, ``sum`` or ``same``.
    """

    value: float
    weight: float = 1.0
    rule: Rule = "mean"


def mean(value: float, weight: float) -> Metric:
    """A mean over ``weight`` units of its own (e.g. decision steps), weighted so by the reduction."""
    return Metric(float(value), float(weight), "mean")


def total(value: float) -> Metric:
    """A quantity summed over the workers."""
    return Metric(float(value), 1.0, "sum")


def same(value: float) -> Metric:
    """A figure already identical on every worker."""
    return Metric(float(value), 1.0, "same")


def as_metric(value: float | Metric, batch_size: int) -> Metric:
    """A node's reported value as a :class:`Metric` (a plain float: the mean over its ``batch_size``
    input samples)."""
    return value if isinstance(value, Metric) else Metric(float(value), float(batch_size), "mean")


def reduce_metrics(local: list[tuple[str, Metric, int]], group: dist.ProcessGroup | None = None) -> dict[str, float]:
    """Reduce this worker's metrics with every other worker's (one small all-gather).

    Args:
        local: ``(name, metric, replicas)`` triples of this worker, ``replicas`` the number of
            workers that hold the same shard of the reporting node.
        group: the workers' process group.

    Returns:
        ``{name: reduced value}`` over every worker that reported ``name``, identical on all
        workers: weighted means (names whose total weight is 0 are dropped), sums, or the first
        reporter's value for ``same``.

    Raises:
        ValueError: a name reported with two different rules.
    """
    triples = [(name, m.value, m.weight / replicas, m.rule) if m.rule == "mean" else
               (name, m.value / replicas if m.rule == "sum" else m.value, 1.0, m.rule)
               for name, m, replicas in local]
    gathered = all_gather_small_objects(triples, group)
    rules: dict[str, str] = {}
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for worker in gathered:
        for name, value, weight, rule in worker:
            if rules.setdefault(name, rule) != rule:
                raise ValueError(f"metric {name!r} is reported with the rules {rules[name]!r} and {rule!r}")
            if rule == "same":
                sums.setdefault(name, value)
                weights[name] = 1.0
            elif rule == "sum":
                sums[name] = sums.get(name, 0.0) + value
                weights[name] = 1.0
            else:
                sums[name] = sums.get(name, 0.0) + value * weight
                weights[name] = weights.get(name, 0.0) + weight
    return {name: (sums[name] / weights[name] if rules[name] == "mean" else sums[name])
            for name in sorted(sums) if weights[name] > 0}
