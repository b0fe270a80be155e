"""Minibatch schedules of the data-parallel updates (actor and critic)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import Tensor

from vla_rl.algorithms.aggregation import aggregation_weight
from vla_rl.utils.collectives import all_gather_small_objects


def minibatch_indices(
    num_samples: int,
    ppo_mini_batch_size: int,
    epochs: int,
    generator: torch.Generator,
    group: dist.ProcessGroup | None = None,
    num_mini_batches: int | None = None,
) -> Iterator[Tensor]:
    """Shuffled minibatch index tensors of this worker's shard, ``epochs`` passes over it.

    Each pass makes ``ceil(total samples over the workers / ppo_mini_batch_size)`` minibatches
    (verl's ``ppo_mini_batch_size``: a small filtered batch makes fewer updates instead of being
    overfitted), or ``num_mini_batches`` when given (CleanRL's ``num_minibatches``: as many
    updates whatever the batch's size, each minibatch a fixed share of it), fewer if some worker's
    shard has fewer samples than that: every worker runs the same number of minibatches, so that
    the gradient all-reduces of their backward passes match. When some shard is empty nobody
    updates.

    Args:
        num_samples: samples in this worker's shard.
        ppo_mini_batch_size: samples per minibatch, summed over the workers (unused with
            ``num_mini_batches``).
        epochs: passes over the shard.
        generator: shuffles the samples (seeded per worker, saved in checkpoints).
        group: the DAG workers' process group (None: the default group).
        num_mini_batches: minibatches per pass (None: from ``ppo_mini_batch_size``).

    Yields:
        (minibatch size,) int64 indices into the shard, epoch after epoch.
    """
    for micro_batches in minibatch_schedule(num_samples, ppo_mini_batch_size, epochs, generator, group,
                                            num_mini_batches=num_mini_batches):
        yield micro_batches[0]


def minibatch_schedule(
    num_samples: int,
    ppo_mini_batch_size: int,
    epochs: int,
    generator: torch.Generator,
    group: dist.ProcessGroup | None = None,
    micro_batch_size: int | None = None,
    num_mini_batches: int | None = None,
) -> Iterator[list[Tensor]]:
    """:func:`minibatch_indices`, each minibatch split into micro-batches (gradient accumulation).

    Every worker splits every minibatch into the same number ``K`` of micro-batches: the largest
    minibatch of any worker divided by ``micro_batch_size``, rounded up, so that each worker runs
    as many forward and backward passes as the others (FSDP gathers parameters in each one; a
    worker must not skip one). A worker whose minibatch holds fewer than ``K`` samples gets empty
    micro-batches (the trainer runs them as passes that contribute nothing). The shuffling, and
    so the minibatches, are those of :func:`minibatch_indices`.

    Args:
        num_samples, ppo_mini_batch_size, epochs, generator, group, num_mini_batches: see
            :func:`minibatch_indices`.
        micro_batch_size: at most this many samples per micro-batch; None: one micro-batch, the
            whole minibatch.

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


def micro_batch_passes(mask: Tensor, micro_batches: list[Tensor], agg_mode: str
                       ) -> Iterator[tuple[Tensor, float | None, bool]]:
    """The forward/backward passes of one minibatch of :func:`minibatch_schedule`:
    ``(indices, scale, sync)`` per micro-batch.

    ``scale`` is the micro-batch's share of the minibatch's aggregation denominator
    (:func:`~vla_rl.algorithms.aggregation.aggregation_weight`; None for a minibatch in one piece:
    its loss is used as it is, bit for bit), so that the accumulated gradient is the minibatch's;
    ``sync`` is True for the last pass, whose backward reduces the accumulated gradients. An empty
    micro-batch (this worker's minibatch is smaller than another's) becomes the minibatch's first
    sample with scale 0: a pass that changes no gradient but keeps the workers' collectives in step.

    Args:
        mask: ``(n, T)`` the shard's ``response_mask``.
        micro_batches: index tensors into the shard (one minibatch).
        agg_mode: the loss aggregation mode.

    Raises:
        ValueError: more than one micro-batch with a mode that is not built in.
    """
    if len(micro_batches) == 1:
        yield micro_batches[0], None, True
        return
    whole = torch.cat(micro_batches)
    total = aggregation_weight(mask[whole], agg_mode)
    for i, index in enumerate(micro_batches):
        sync = i == len(micro_batches) - 1
        if len(index) == 0:
            yield whole[:1], 0.0, sync
        else:
            yield index, aggregation_weight(mask[index], agg_mode) / total if total > 0 else 0.0, sync
