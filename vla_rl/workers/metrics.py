"""Node metrics and their reduction over the DAG workers.

A node reports scalars. Each carries the rule that combines it over the workers, so a reduced
figure does not depend on how the batch was split (identical at DP 1 and DP 2 for identical data):

- a plain ``float``: a mean over the samples of the node's input batch (weight: its size);
- :func:`mean` ``(value, weight)``: a mean over ``weight`` units of its own (decision steps, the
  failures of a batch, minibatches);
- :func:`total`: a sum over the workers (counts, environment steps);
- :func:`same`: already identical on every worker (figures reduced inside the node);
- :func:`maximum`: the largest over the workers (the busiest worker's bytes, a count of
  collectives); :func:`minimum`: the smallest (the shortest response).

Replicated shards (a node at DP size ``d`` < world size ``W`` runs on ``W / d`` workers holding
the same shard) count once: their weights and sums are divided by ``W / d``.

The workers exchange numbers, not names, when they report the same names with the same rules in
the same order (the usual case): one all-gather of a 16-byte header (a digest of the names and
rules, and their count) and one of the values and weights (16 bytes per metric); otherwise the
header is followed by an all-gather of the pickled ``(name, value, weight, rule)`` entries. Each
worker then combines the entries in rank order, as the pickled exchange would: the same figures
either way.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from vla_rl.utils.collectives import (
    all_gather_cost,
    all_gather_into_one,
    all_gather_objects,
    collective_device,
)

Rule = Literal["mean", "sum", "same", "max", "min"]


@dataclass(frozen=True)
class Metric:
    """A scalar and its reduction rule (see the module docstring).

    Attributes:
        value: the worker's value (a mean over ``weight`` units for rule ``mean``).
        weight: for ``mean``: how many units ``value`` averages (>= 0).
        rule: ``mean``, ``sum``, ``same``, ``max`` or ``min``.
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


def maximum(value: float) -> Metric:
    """A quantity whose largest value over the workers is reported."""
    return Metric(float(value), 1.0, "max")


def minimum(value: float) -> Metric:
    """A quantity whose smallest value over the workers is reported."""
    return Metric(float(value), 1.0, "min")


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
        workers: weighted means (names whose total weight is 0 are dropped), sums, maxima, minima,
        or the first reporter's value for ``same``.

    Raises:
        ValueError: a name reported with two different rules.
    """
    triples = [(name, m.value, m.weight / replicas, m.rule) if m.rule == "mean" else
               (name, m.value / replicas if m.rule == "sum" else m.value, 1.0, m.rule)
               for name, m, replicas in local]
    gathered = _gather_entries(triples, group)
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
            elif rule == "max":
                sums[name] = max(sums.get(name, value), value)
                weights[name] = 1.0
            elif rule == "min":
                sums[name] = min(sums.get(name, value), value)
                weights[name] = 1.0
            else:  # a mean over no sample (an empty shard's NaN) weighs nothing, and is no NaN in the sum
                sums[name] = sums.get(name, 0.0) + (value * weight if weight > 0 else 0.0)
                weights[name] = weights.get(name, 0.0) + weight
    return {name: (sums[name] / weights[name] if rules[name] == "mean" else sums[name])
            for name in sorted(sums) if weights[name] > 0}


def reduction_cost(world: int, num_metrics: int) -> list[tuple[int, int]]:
    """``(sent, received)`` bytes of one worker in each collective of :func:`reduce_metrics` when
    every worker reports the same ``num_metrics`` names and rules (the header, then the values)."""
    return [all_gather_cost(world, 16), all_gather_cost(world, 16 * num_metrics)]


def _gather_entries(triples: list[tuple[str, float, float, str]], group) -> list[list[tuple[str, float, float, str]]]:
    """Every worker's ``(name, value, weight, rule)`` entries, by rank (see the module docstring)."""
    world = dist.get_world_size(group)
    device = collective_device(group)
    names = [(name, rule) for name, _, _, rule in triples]
    digest = int.from_bytes(hashlib.blake2b(repr(names).encode(), digest_size=8).digest(), "little") >> 1
    headers = torch.empty(world * 2, dtype=torch.int64, device=device)
    all_gather_into_one(headers, torch.tensor([digest, len(triples)], dtype=torch.int64, device=device), group=group,
                        tag="metrics")
    digests, _ = headers.view(world, 2).cpu().T.tolist()
    if len(set(digests)) > 1:
        return all_gather_objects(triples, group, tag="metrics")
    numbers = torch.tensor([[value, weight] for _, value, weight, _ in triples], dtype=torch.float64).reshape(-1)
    gathered = torch.empty(world * numbers.numel(), dtype=torch.float64, device=device)
    all_gather_into_one(gathered, numbers.to(device), group=group, tag="metrics")
    values = gathered.view(world, len(triples), 2).cpu().tolist()
    return [[(name, value, weight, rule) for (name, rule), (value, weight) in zip(names, values[rank])]
            for rank in range(world)]
