"""Minibatch schedules of the data-parallel updates (actor and critic)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from vla_rl.algorithms.aggregation import AGGREGATION_DENOMINATORS, aggregation_weight
from vla_rl.utils.collectives import all_gather_small_objects, all_reduce, collective_device


def minibatch_schedule(
    num_samples: int,
    ppo_mini_batch_size: int,
    epochs: int,
    generator: torch.Generator,
    group: dist.ProcessGroup | None = None,
    micro_batch_size: int | None = None,
    num_mini_batches: int | None = None,
) -> Iterator[list[Tensor]]:
    """Shuffled minibatches of this worker's shard, ``epochs`` passes over it, each minibatch
    split into micro-batches (gradient accumulation).

    Each pass makes ``ceil(total samples over the workers / ppo_mini_batch_size)`` minibatches
    (verl's ``ppo_mini_batch_size``: a small filtered batch makes fewer updates instead of being
    overfitted), or ``num_mini_batches`` when given (CleanRL's ``num_minibatches``: as many
    updates whatever the batch's size, each minibatch a fixed share of it), fewer if some worker's
    shard has fewer samples than that: every worker runs the same number of minibatches, so that
    the gradient all-reduces of their backward passes match. When some shard is empty nobody
    updates.

    Every worker splits every minibatch into the same number ``K`` of micro-batches: the largest
    minibatch of any worker divided by ``micro_batch_size``, rounded up, so that each worker runs
    as many forward and backward passes as the others (FSDP gathers parameters in each one; a
    worker must not skip one). A worker whose minibatch holds fewer than ``K`` samples gets empty
    micro-batches (the trainer runs them as passes that contribute nothing).

    Args:
        num_samples: samples in this worker's shard.
        ppo_mini_batch_size: samples per minibatch, summed over the workers (unused with
            ``num_mini_batches``).
        epochs: passes over the shard.
        generator: shuffles the samples (seeded per worker, saved in checkpoints).
        group: the DAG workers' process group (None: the default group).
        micro_batch_size: at most this many samples per micro-batch; None: one micro-batch, the
            whole minibatch.
        num_mini_batches: minibatches per pass (None: from ``ppo_mini_batch_size``).

    Yields:
        per minibatch, ``K`` (minibatch size / K,) int64 index tensors into the shard, in order,
        that concatenate to the minibatch.
    """
    counts = all_gather_small_objects(num_samples, group)  # every worker's shard size, in one collective
    wanted = math.ceil(sum(counts) / ppo_mini_batch_size) if num_mini_batches is None else num_mini_batches
    count = min(wanted, min(counts))
    if count == 0:
        return
    pieces = 1 if micro_batch_size is None else math.ceil(math.ceil(max(counts) / count) / micro_batch_size)
    for _ in range(epochs):
        for minibatch in torch.tensor_split(torch.randperm(num_samples, generator=generator), count):
            yield [minibatch] if pieces == 1 else list(torch.tensor_split(minibatch, pieces))


def global_weights(mask: Tensor, schedule: list[list[Tensor]], agg_mode: str,
                   group: dist.ProcessGroup | None = None) -> list[float] | None:
    """Each minibatch's aggregation denominator summed over the workers: the valid tokens (or
    rows) of the global minibatch, the union of every worker's minibatch of the same position.

    Dividing by it (:func:`micro_batch_passes`) makes the update's gradient that of the global
    minibatch aggregated as one, whatever the number of workers and however its rows are split
    between them: verl's global-batch normalisation (``agg_loss(..., dp_size, batch_num_tokens,
    global_batch_size)``, ``verl/trainer/ppo/core_algos.py``). Each worker normalising its own
    minibatch instead weighs a token by the inverse of its own worker's count, so workers
    holding fewer valid tokens (shorter episodes: successes end early) would count more.

    Collective: one all-reduce for the whole update (none on one worker). Called by every worker
    with the same number of minibatches (:func:`minibatch_schedule` guarantees it).

    Args:
        mask: ``(n, L)`` this worker's shard's loss units, as :func:`micro_batch_passes` takes them.
        schedule: :func:`minibatch_schedule`'s minibatches, each a list of micro-batch indices.
        agg_mode: the loss aggregation mode.
        group: the workers' process group.

    Returns:
        One float per minibatch, or None on one worker (the local count is the global one) and
        for a mode that is not built in (its denominator is unknown: each worker normalises its
        own minibatch).
    """
    if dist.get_world_size(group) == 1 or agg_mode not in AGGREGATION_DENOMINATORS:
        return None
    local = [aggregation_weight(mask[torch.cat(minibatch)], agg_mode) for minibatch in schedule]
    totals = torch.tensor(local, dtype=torch.float64, device=collective_device(group))
    all_reduce(totals, "sum", group, tag="loss_normalisation")
    return totals.cpu().tolist()


class Pass(NamedTuple):
    """One forward/backward pass of a minibatch (:func:`micro_batch_passes`).

    Attributes:
        index: ``(b,)`` int64 rows of the shard.
        scale: what the pass's loss is multiplied by before its backward pass (None: used as
            it is, bit for bit: the whole minibatch of the only worker).
        share: the pass's share of the minibatch's loss, for its metrics: summed over the passes
            of every worker it gives the global minibatch's value (1.0 when ``scale`` is None).
        sync: True for the last pass, whose backward reduces the accumulated gradients.
    """

    index: Tensor
    scale: float | None
    share: float
    sync: bool


def micro_batch_passes(mask: Tensor, micro_batches: list[Tensor], agg_mode: str, global_weight: float | None = None,
                       world_size: int = 1) -> Iterator[Pass]:
    """The forward/backward passes of one minibatch of :func:`minibatch_schedule`.

    Each pass's loss is scaled by its share of the minibatch's aggregation denominator
    (:func:`~vla_rl.algorithms.aggregation.aggregation_weight`), so that the accumulated gradient
    is the minibatch's. With ``global_weight`` (:func:`global_weights`) the denominator is the
    global minibatch's and the scale is multiplied by ``world_size``: DDP and FSDP average the
    workers' gradients, and the average is then the global minibatch's gradient, as if one worker
    had aggregated every worker's rows (verl's ``agg_loss`` with ``dp_size``). An empty
    micro-batch (this worker's minibatch is smaller than another's) becomes the minibatch's first
    sample with scale 0: a pass that changes no gradient but keeps the workers' collectives in step.

    Args:
        mask: ``(n, L)`` the shard's loss units (or what counts them up to a factor shared by
            every row: :func:`~vla_rl.algorithms.aggregation.aggregation_weight`).
        micro_batches: index tensors into the shard (one minibatch).
        agg_mode: the loss aggregation mode.
        global_weight: the global minibatch's denominator; None: this worker's own minibatch's.
        world_size: the workers whose gradients are averaged (with ``global_weight``).

    Raises:
        ValueError: more than one micro-batch, or a ``global_weight``, with a mode that is not
            built in.
    """
    if global_weight is None and len(micro_batches) == 1:
        yield Pass(micro_batches[0], None, 1.0, True)
        return
    whole = torch.cat(micro_batches)
    total = aggregation_weight(mask[whole], agg_mode) if global_weight is None else global_weight
    workers = 1 if global_weight is None else world_size
    for i, index in enumerate(micro_batches):
        sync = i == len(micro_batches) - 1
        if len(index) == 0:
            yield Pass(whole[:1], 0.0, 0.0, sync)
            continue
        share = aggregation_weight(mask[index], agg_mode) / total if total > 0 else 0.0
        yield Pass(index, share * workers, share, sync)


def sum_over_workers(metrics: dict[str, float], group: dist.ProcessGroup | None = None) -> dict[str, float]:
    """Collective: ``metrics`` summed over the workers (one all-reduce), e.g. the loss terms'
    shares of the global minibatches (:class:`Pass`), which add up to the global values.

    Every worker must pass the same names in the same order (an empty dict on every worker:
    nothing to reduce, no collective).
    """
    if not metrics:
        return {}
    values = torch.tensor(list(metrics.values()), dtype=torch.float64, device=collective_device(group))
    all_reduce(values, "sum", group, tag="update_metrics")
    return dict(zip(metrics, values.cpu().tolist()))
