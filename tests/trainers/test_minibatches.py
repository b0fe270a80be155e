"""Minibatch schedules and micro-batch passes, with the other workers' shard sizes stubbed."""

from __future__ import annotations

import pytest
import torch

from vla_rl.trainers import minibatches
from vla_rl.trainers.minibatches import micro_batch_passes, minibatch_schedule


@pytest.fixture
def shard_sizes(monkeypatch):
    """Set every worker's shard size as the schedule's collective would gather them."""
    sizes: list[int] = []
    monkeypatch.setattr(minibatches, "all_gather_small_objects", lambda value, group=None: list(sizes))
    return sizes


def test_the_smallest_shard_caps_the_number_of_minibatches(shard_sizes):
    shard_sizes[:] = [6, 2]  # 8 samples, 1 per minibatch: 8 wanted, but the second worker holds only 2
    schedule = list(minibatch_schedule(6, 1, 1, torch.Generator().manual_seed(0)))
    assert len(schedule) == 2 and all(len(mb[0]) == 3 for mb in schedule)
    assert sorted(torch.cat([mb[0] for mb in schedule]).tolist()) == list(range(6))


def test_micro_batches_hold_at_most_micro_batch_size_samples(shard_sizes):
    shard_sizes[:] = [5, 5]  # one minibatch of 5 per worker, micro-batches of at most 2: ceil(5 / 2) = 3
    (micro,) = minibatch_schedule(5, 10, 1, torch.Generator().manual_seed(0), micro_batch_size=2)
    assert [len(index) for index in micro] == [2, 2, 1]


def test_a_minibatch_without_loss_units_scales_every_pass_by_zero():
    mask = torch.zeros(4, 3, dtype=torch.bool)
    passes = list(micro_batch_passes(mask, [torch.tensor([0, 1]), torch.tensor([2, 3])], "token-mean"))
    assert [(p.scale, p.share, p.sync) for p in passes] == [(0.0, 0.0, False), (0.0, 0.0, True)]
