"""Ratio granularity: token / action / chunk reductions and per-step expansion, by hand."""

import pytest
import torch

from vla_rl.algorithms.granularity import (
    expand_per_step,
    reduce_per_action,
    reduce_per_dim,
)

# One episode, T = 2 decisions, chunks of C = 2 actions of A = 3 dimensions; value = 100t + 10c + d.
PER_DIM = torch.tensor([[[[100.0 * t + 10 * c + d for d in range(3)] for c in range(2)] for t in range(2)]])


def test_token_level_keeps_every_dimension_in_order():
    result = reduce_per_dim(PER_DIM, "token")
    assert result.shape == (1, 12)
    assert result[0, :4].tolist() == [0.0, 1.0, 2.0, 10.0]


def test_action_level_sums_the_dimensions_of_each_action():
    assert reduce_per_dim(PER_DIM, "action").tolist() == [[3.0, 33.0, 303.0, 333.0]]


def test_chunk_level_sums_the_whole_chunk():
    assert reduce_per_dim(PER_DIM, "chunk").tolist() == [[36.0, 636.0]]


def test_per_action_values_match_per_dimension_sums_exactly():
    per_action = PER_DIM.sum(dim=-1)  # what the rollout stores
    for granularity in ("action", "chunk"):
        assert torch.equal(reduce_per_action(per_action, granularity), reduce_per_dim(PER_DIM, granularity))
    with pytest.raises(ValueError, match="token"):
        reduce_per_action(per_action, "token")


def test_expand_per_step_repeats_each_decision_over_its_units():
    mask = torch.tensor([[True, False]])
    assert expand_per_step(mask, 2, 3, "token").tolist() == [[True] * 6 + [False] * 6]
    assert expand_per_step(mask, 2, 3, "action").tolist() == [[True, True, False, False]]
    assert expand_per_step(mask, 2, 3, "chunk").tolist() == [[True, False]]


def test_unknown_granularity_raises():
    with pytest.raises(ValueError, match="known: token, action, chunk"):
        reduce_per_dim(PER_DIM, "step")
