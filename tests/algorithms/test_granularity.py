"""Ratio granularity: token / action / chunk reductions and per-step expansion, by hand."""

import pytest
import torch

from vla_rl.algorithms.granularity import (
    executed_actions,
    expand_per_step,
    reduce_per_action,
    reduce_per_dim,
    unit_mask,
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


def test_executed_actions_end_inside_the_last_chunk():
    # Chunks of 3: episode 0 took 2 decisions and ran 4 actions (it ended at the 1st of its 2nd
    # chunk), episode 1 took 1 decision and ran all 3, episode 2 took none.
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    executed = executed_actions(mask, torch.tensor([4, 3, 0]), 3)
    assert executed.tolist() == [[[True] * 3, [True, False, False], [False] * 3],
                                 [[True] * 3, [False] * 3, [False] * 3],
                                 [[False] * 3] * 3]
    with pytest.raises(ValueError, match="control_steps"):
        executed_actions(mask, torch.tensor([4, 3]), 3)


def test_unit_mask_keeps_exactly_the_executed_actions_at_every_granularity():
    executed = torch.tensor([[[True, True], [True, False]]])  # T = 2 decisions of C = 2 actions; 3 ran
    assert unit_mask(executed, 3, "token").tolist() == [[True] * 9 + [False] * 3]
    assert unit_mask(executed, 3, "action").tolist() == [[True, True, True, False]]
    assert unit_mask(executed, 3, "chunk").tolist() == [[True, True]]
    # Without an early end the mask is the response mask spread over the units (expand_per_step's).
    whole = torch.ones(1, 2, 2, dtype=torch.bool)
    for granularity in ("token", "action", "chunk"):
        assert torch.equal(unit_mask(whole, 3, granularity),
                           expand_per_step(torch.ones(1, 2, dtype=torch.bool), 2, 3, granularity))


def test_executed_actions_are_computed_on_the_masks_device():
    # The trainer's batch is on the policy's device, a rollout's control steps may still be on the
    # CPU: on the meta device any CPU tensor that reaches an op fails, as it would on a GPU.
    mask = torch.ones(2, 3, dtype=torch.bool, device="meta")
    executed = executed_actions(mask, torch.tensor([4, 3]), 3)
    assert executed.device.type == "meta" and executed.shape == (2, 3, 3)
    assert unit_mask(executed, 7, "token").device.type == "meta"
