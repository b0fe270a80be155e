"""GRPO / Dr. GRPO outcome advantages against values worked out by hand or with numpy."""

import math

import numpy as np
import pytest
import torch

from vla_rl.algorithms.advantages import ADVANTAGE_ESTIMATORS, compute_grpo_outcome_advantage


def test_registered_under_grpo():
    assert ADVANTAGE_ESTIMATORS.get("grpo") is compute_grpo_outcome_advantage


def test_two_value_group_by_hand():
    # Group {1, 0}: mean 0.5, unbiased std sqrt(((0.5)^2 + (0.5)^2) / 1) = sqrt(0.5).
    rewards = torch.tensor([1.0, 0.0])
    advantages = compute_grpo_outcome_advantage(rewards, torch.tensor([7, 7]), epsilon=1e-6)
    expected = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(advantages, torch.tensor([expected, -expected]))


def test_unbiased_std_convention_matches_numpy_ddof1():
    rewards_np = np.array([0.0, 1.0, 1.0, 0.3], dtype=np.float64)
    expected = (rewards_np - rewards_np.mean()) / (rewards_np.std(ddof=1) + 1e-6)
    biased = (rewards_np - rewards_np.mean()) / (rewards_np.std(ddof=0) + 1e-6)
    advantages = compute_grpo_outcome_advantage(
        torch.tensor(rewards_np, dtype=torch.float32), torch.zeros(4, dtype=torch.int64)
    )
    np.testing.assert_allclose(advantages.numpy(), expected, rtol=1e-6)
    assert not np.allclose(advantages.numpy(), biased, rtol=1e-3)


def test_interleaved_groups_are_independent():
    # Groups 3 and 5 interleaved; each normalised on its own (numpy reference).
    rewards_np = np.array([1.0, 0.2, 0.0, 0.8, 1.0, 0.5], dtype=np.float64)
    groups_np = np.array([3, 5, 3, 5, 3, 5])
    expected = np.empty_like(rewards_np)
    for g in (3, 5):
        r = rewards_np[groups_np == g]
        expected[groups_np == g] = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    advantages = compute_grpo_outcome_advantage(
        torch.tensor(rewards_np, dtype=torch.float32), torch.tensor(groups_np)
    )
    np.testing.assert_allclose(advantages.numpy(), expected, rtol=1e-5, atol=1e-6)
    assert advantages.dtype == torch.float32


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_all_equal_group_is_exactly_zero(norm_by_std):
    # 0.1 * 3 / 3 != 0.1 in floating point: the result must still be exactly 0.
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    advantages = compute_grpo_outcome_advantage(rewards, groups, norm_by_std=norm_by_std)
    assert torch.equal(advantages[:3], torch.zeros(3))
    assert torch.isfinite(advantages).all()


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_singleton_group_is_exactly_zero(norm_by_std):
    rewards = torch.tensor([0.7, 1.0, 0.0])
    groups = torch.tensor([42, 1, 1])
    advantages = compute_grpo_outcome_advantage(rewards, groups, norm_by_std=norm_by_std)
    assert advantages[0].item() == 0.0
    assert torch.isfinite(advantages).all()


def test_dr_grpo_only_centres():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5])
    advantages = compute_grpo_outcome_advantage(rewards, torch.zeros(4, dtype=torch.int64),
                                                norm_by_std=False)
    # mean = 1.5 / 4 = 0.375
    torch.testing.assert_close(advantages, torch.tensor([0.625, -0.375, -0.375, 0.125]))


def test_invalid_inputs_raise():
    with pytest.raises(ValueError, match="group_ids"):
        compute_grpo_outcome_advantage(torch.zeros(3), torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="NaN"):
        compute_grpo_outcome_advantage(torch.tensor([float("nan"), 0.0]),
                                       torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="epsilon"):
        compute_grpo_outcome_advantage(torch.zeros(2), torch.zeros(2, dtype=torch.int64),
                                       epsilon=0.0)
