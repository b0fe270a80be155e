"""Minibatch schedules of the data-parallel updates (actor and critic)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import Tensor

from vla_rl.utils.collectives import all_gather_small_objects


def minibatch_indices(
    num_samples: int,
    ppo_mini_batch_size: int,
    epochs: int,
    generator: torch.Generator,
    group: dist.ProcessGroup | None = None,
) -> Iterator[Tensor]:
    """Shuffled minibatch index tensors of this worker's shard, ``epochs`` passes over it.

    Each pass makes ``ceil(total samples over the workers / ppo_mini_batch_size)`` minibatches
    (verl's ``ppo_mini_batch_size``: a small filtered batch makes fewer updates instead of being
    overfitted), fewer if some worker's shard has fewer samples than that: every worker runs the
    same number of minibatches, so that the gradient all-reduces of their backward passes match.
    When some shard is empty nobody updates.

    Args:
        num_samples: samples in this worker's shard.
        ppo_mini_batch_size: samples per minibatch, summed over the workers.
        epochs: passes over the shard.
        generator: shuffles the samples (seeded per worker, saved in checkpoints).
        group: the DAG workers' process group (None: the default group).

    Yields:
        (minibatch size,) int64 indices into the shard, epoch after epoch.
    """
    counts = all_gather_small_objects(num_samples, group)  # every worker's shard size, in one collective
    count = min(math.ceil(sum(counts) / ppo_mini_batch_size), min(counts))
    if count == 0:
        return
    for _ in range(epochs):
        yield from torch.tensor_split(torch.randperm(num_samples, generator=generator), count)
