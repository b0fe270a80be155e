"""Advantage estimators against values worked out by hand or from the papers' formulas in numpy."""

import math

import numpy as np
import pytest
import torch

from vla_rl.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    GAEConfig,
    GRPOConfig,
    masked_whiten,
)
from vla_rl_core.components import config_fields

NAN = float("nan")
GROUP_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline")


def outcome_batch(rewards, lengths, seq_len):
    """token_level_rewards with each reward on its row's last valid step, and the prefix mask."""
    batch = len(rewards)
    token_level_rewards = torch.zeros(batch, seq_len, dtype=torch.float64)
    mask = torch.zeros(batch, seq_len, dtype=torch.bool)
    for i, (reward, length) in enumerate(zip(rewards, lengths)):
        mask[i, :length] = True
        token_level_rewards[i, length - 1] = reward
    return token_level_rewards, mask


def run(name, token_level_rewards, mask, groups, values=None, **settings):
    """The estimator ``name`` with its registered config built from the ``settings`` it takes (a
    parametrized test passes one set of settings to estimators that take different ones)."""
    config_class = ADVANTAGE_ESTIMATORS.config_class(name)
    config = None if config_class is None else config_class(
        **{key: value for key, value in settings.items() if key in config_fields(config_class)})
    return ADVANTAGE_ESTIMATORS.get(name)(token_level_rewards, mask, torch.tensor(groups), config, values=values)


def whiten_ref(x: np.ndarray, mask: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    valid = x[mask]
    out = (x - valid.mean()) / math.sqrt(valid.var(ddof=1) + eps)
    return np.where(mask, out, 0.0)


def test_registry_names():
    assert ADVANTAGE_ESTIMATORS.names() == ["gae", "grpo", "reinforce_plus_plus",
                                            "reinforce_plus_plus_baseline", "rloo"]


# --- GRPO / Dr. GRPO -------------------------------------------------------------------------


def test_grpo_two_value_group_by_hand():
    # Group {1, 0}: mean 0.5, unbiased std sqrt((0.5^2 + 0.5^2) / 1) = sqrt(0.5).
    rewards, mask = outcome_batch([1.0, 0.0], [3, 2], seq_len=4)
    advantages, returns = run("grpo", rewards, mask, [7, 7], epsilon=1e-6)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    expected = torch.tensor([[a, a, a, 0.0], [-a, -a, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(advantages, expected)
    assert torch.equal(returns, advantages)


def test_grpo_unbiased_std_convention_matches_numpy_ddof1():
    scores = np.array([0.0, 1.0, 1.0, 0.3])
    expected = (scores - scores.mean()) / (scores.std(ddof=1) + 1e-6)
    biased = (scores - scores.mean()) / (scores.std(ddof=0) + 1e-6)
    rewards, mask = outcome_batch(scores, [1, 1, 1, 1], seq_len=1)
    advantages, _ = run("grpo", rewards, mask, [0, 0, 0, 0])
    np.testing.assert_allclose(advantages[:, 0].numpy(), expected, rtol=1e-12)
    assert not np.allclose(advantages[:, 0].numpy(), biased, rtol=1e-3)


def test_grpo_interleaved_groups_are_independent_and_dtype_is_kept():
    scores = np.array([1.0, 0.2, 0.0, 0.8, 1.0, 0.5])
    groups = np.array([3, 5, 3, 5, 3, 5])
    expected = np.empty_like(scores)
    for g in (3, 5):
        r = scores[groups == g]
        expected[groups == g] = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    rewards, mask = outcome_batch(scores, [2] * 6, seq_len=2)
    advantages, _ = ADVANTAGE_ESTIMATORS.get("grpo")(rewards.float(), mask, torch.tensor(groups), GRPOConfig())
    assert advantages.dtype == torch.float32
    np.testing.assert_allclose(advantages[:, 1].numpy(), expected, rtol=1e-5, atol=1e-6)


def test_dr_grpo_only_centres():
    rewards, mask = outcome_batch([1.0, 0.0, 0.0, 0.5], [1] * 4, seq_len=1)
    advantages, _ = run("grpo", rewards, mask, [0] * 4, norm_by_std=False)
    # mean = 1.5 / 4 = 0.375
    torch.testing.assert_close(advantages[:, 0], torch.tensor([0.625, -0.375, -0.375, 0.125], dtype=torch.float64))


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_all_equal_group_is_exactly_zero(name, norm_by_std):
    # 0.1 * 3 / 3 != 0.1 in floating point: the result must still be exactly 0. Every group is
    # all-equal, so even REINFORCE++-baseline's batch whitening leaves exact zeros.
    rewards, mask = outcome_batch([0.1, 0.1, 0.1, 0.7, 0.7], [2, 3, 1, 2, 2], seq_len=3)
    advantages, _ = run(name, rewards, mask, [0, 0, 0, 1, 1], norm_by_std=norm_by_std)
    assert torch.equal(advantages, torch.zeros_like(advantages))


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_all_equal_group_beside_a_varied_one_stays_exactly_zero(name):
    rewards, mask = outcome_batch([0.1, 0.1, 0.1, 1.0, 0.0], [1] * 5, seq_len=1)
    advantages, _ = run(name, rewards, mask, [0, 0, 0, 1, 1])
    assert torch.equal(advantages[:3], torch.zeros(3, 1, dtype=torch.float64))
    assert torch.isfinite(advantages).all() and (advantages[3:] != 0).all()


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_singleton_group_is_exactly_zero(name):
    rewards, mask = outcome_batch([0.7, 1.0, 0.0], [1] * 3, seq_len=1)
    advantages, _ = run(name, rewards, mask, [42, 1, 1])
    assert advantages[0, 0].item() == 0.0
    assert torch.isfinite(advantages).all()


# --- RLOO ------------------------------------------------------------------------------------


def test_rloo_is_leave_one_out_mean():
    scores = np.array([1.0, 0.0, 0.5, 0.25, 1.0, 0.0])
    groups = np.array([0, 0, 0, 0, 9, 9])
    expected = np.array([scores[i] - np.mean([scores[j] for j in range(6) if j != i and groups[j] == groups[i]])
                         for i in range(6)])
    rewards, mask = outcome_batch(scores, [2, 1, 2, 2, 1, 2], seq_len=2)
    advantages, returns = run("rloo", rewards, mask, groups.tolist())
    np.testing.assert_allclose(advantages.numpy(), np.where(mask.numpy(), expected[:, None], 0.0), atol=1e-12)
    assert torch.equal(returns, advantages)


# --- REINFORCE++ -----------------------------------------------------------------------------


def test_reinforce_plus_plus_discounted_returns_and_whitening():
    gamma = 0.9
    token_rewards = np.array([[0.0, 0.5, 1.0, 0.0], [0.2, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 3.0]])
    lengths = [3, 2, 4]
    mask = np.arange(4)[None, :] < np.array(lengths)[:, None]
    # G_t = sum_{k >= 0} gamma^k r_{t+k} over the row's valid steps, written out.
    expected_returns = np.zeros_like(token_rewards)
    for i, length in enumerate(lengths):
        for t in range(length):
            expected_returns[i, t] = sum(gamma ** k * token_rewards[i, t + k] for k in range(length - t))
    advantages, returns = run("reinforce_plus_plus", torch.tensor(token_rewards), torch.tensor(mask),
                              [0, 1, 2], gamma=gamma)
    np.testing.assert_allclose(returns.numpy(), expected_returns, atol=1e-12)
    np.testing.assert_allclose(advantages.numpy(), whiten_ref(expected_returns, mask), rtol=1e-9, atol=1e-9)


def test_reinforce_plus_plus_whitening_ignores_padding():
    token_rewards = torch.tensor([[1.0, 2.0, NAN], [0.5, 1e30, -1e30]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    clean = torch.where(mask, token_rewards, 0.0)
    dirty_advantages, dirty_returns = run("reinforce_plus_plus", token_rewards, mask, [0, 1])
    clean_advantages, clean_returns = run("reinforce_plus_plus", clean, mask, [0, 1])
    assert torch.equal(dirty_advantages, clean_advantages) and torch.equal(dirty_returns, clean_returns)
    # Valid returns (gamma 1): [3, 2] and [0.5]; mean 11/6, unbiased var over the 3 valid steps.
    valid = np.array([3.0, 2.0, 0.5])
    expected = (valid - valid.mean()) / math.sqrt(valid.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(clean_advantages[mask].numpy(), expected, rtol=1e-12)
    assert torch.equal(clean_advantages[~mask], torch.zeros(3, dtype=torch.float64))


def test_reinforce_plus_plus_baseline_centres_in_groups_then_whitens():
    scores = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.5])
    groups = np.array([0, 0, 0, 4, 4, 4])
    lengths = [2, 3, 1, 3, 2, 1]
    centred = scores - np.array([scores[groups == g].mean() for g in groups])
    mask = np.arange(3)[None, :] < np.array(lengths)[:, None]
    expected = whiten_ref(np.where(mask, centred[:, None], 0.0), mask)
    rewards, mask_t = outcome_batch(scores, lengths, seq_len=3)
    advantages, returns = run("reinforce_plus_plus_baseline", rewards, mask_t, groups.tolist())
    np.testing.assert_allclose(advantages.numpy(), expected, rtol=1e-9, atol=1e-12)
    assert torch.equal(returns, advantages)


def test_masked_whiten_degenerate_cases_are_zero():
    x = torch.tensor([[2.0, NAN], [2.0, 5.0]])
    assert torch.equal(masked_whiten(x, torch.tensor([[True, False], [True, False]])), torch.zeros(2, 2))
    assert torch.equal(masked_whiten(x, torch.tensor([[True, False], [False, False]])), torch.zeros(2, 2))


# --- GAE -------------------------------------------------------------------------------------


def gae_reference(rewards, values, length, gamma, lam):
    """Raw GAE of one row from the closed form A_t = sum_l (gamma lam)^l delta_{t+l} (eq. 16)."""
    v = list(values[:length]) + [0.0]  # the value after the last valid step is 0 (terminal)
    deltas = [rewards[t] + gamma * v[t + 1] - v[t] for t in range(length)]
    adv = [sum((gamma * lam) ** l * deltas[t + l] for l in range(length - t)) for t in range(length)]
    return np.array(adv), np.array(adv) + np.array(v[:length])


def test_gae_two_steps_by_hand():
    # One row, two valid steps: r = (0, 1), V = (0.5, 0.8), gamma = 0.9, lam = 0.5.
    # delta_1 = 1 + 0 - 0.8 = 0.2; delta_0 = 0 + 0.9 * 0.8 - 0.5 = 0.22;
    # A_1 = 0.2; A_0 = 0.22 + 0.45 * 0.2 = 0.31; returns = (0.81, 1.0).
    # Whitening two values gives -+ 1 / sqrt(2) scaled: (A - mean) / std_unbiased.
    rewards = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.8, NAN]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    advantages, returns = run("gae", rewards, mask, [0], values=values, gamma=0.9, lam=0.5)
    torch.testing.assert_close(returns, torch.tensor([[0.81, 1.0, 0.0]], dtype=torch.float64))
    half_gap, std = 0.055, math.sqrt(2 * 0.055**2)
    torch.testing.assert_close(advantages, torch.tensor([[half_gap / math.sqrt(std**2 + 1e-8),
                                                          -half_gap / math.sqrt(std**2 + 1e-8), 0.0]],
                                                        dtype=torch.float64))


def test_gae_matches_closed_form_on_ragged_batch():
    gamma, lam = 0.95, 0.8
    rng = np.random.default_rng(0)
    lengths = [5, 2, 4, 1]
    rewards = rng.normal(size=(4, 5))
    values = rng.normal(size=(4, 5))
    mask = np.arange(5)[None, :] < np.array(lengths)[:, None]
    raw = np.zeros((4, 5))
    expected_returns = np.zeros((4, 5))
    for i, length in enumerate(lengths):
        raw[i, :length], expected_returns[i, :length] = gae_reference(rewards[i], values[i], length, gamma, lam)
    advantages, returns = run("gae", torch.tensor(rewards), torch.tensor(mask), [0, 1, 2, 3],
                              values=torch.tensor(values), gamma=gamma, lam=lam)
    np.testing.assert_allclose(returns.numpy(), expected_returns, atol=1e-12)
    np.testing.assert_allclose(advantages.numpy(), whiten_ref(raw, mask), rtol=1e-9, atol=1e-12)


def test_gae_does_not_leak_padded_values_or_rewards():
    rng = np.random.default_rng(1)
    rewards = torch.tensor(rng.normal(size=(3, 6)))
    values = torch.tensor(rng.normal(size=(3, 6)))
    mask = torch.tensor(np.arange(6)[None, :] < np.array([[6], [3], [1]]))
    dirty_values, dirty_rewards = values.clone(), rewards.clone()
    dirty_values[~mask] = NAN
    dirty_rewards[~mask] = 1e30
    clean = run("gae", torch.where(mask, rewards, 0.0), mask, [0, 1, 2], values=torch.where(mask, values, 0.0),
                gamma=0.9, lam=0.7)
    dirty = run("gae", dirty_rewards, mask, [0, 1, 2], values=dirty_values, gamma=0.9, lam=0.7)
    for c, d in zip(clean, dirty):
        assert torch.isfinite(d).all()
        assert torch.equal(c, d)
    # A padded value after the end is never bootstrapped: changing it changes nothing.
    values_after_end = values.clone()
    values_after_end[1, 3] = 123.0
    shifted = run("gae", torch.where(mask, rewards, 0.0), mask, [0, 1, 2], values=values_after_end,
                  gamma=0.9, lam=0.7)
    assert torch.equal(shifted[1], clean[1])


def test_a_masked_step_inside_a_row_gae_skips_and_reinforce_plus_plus_stops_at():
    """A gap in a row's mask (a tool's output between two turns): GAE runs over the valid steps as
    if the gap were not there (verl's ``compute_gae_advantage_return`` carries the next value
    and the running advantage across it); REINFORCE++'s discounted return resets there, as
    verl's ``compute_reinforce_plus_plus_outcome_advantage`` (the return before the gap leaves
    out the rewards after it)."""
    gamma, lam = 0.9, 0.8
    rewards = torch.tensor([[0.5, 7.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.2, NAN, 0.4, 0.3]], dtype=torch.float64)
    mask = torch.tensor([[True, False, True, True]])
    # GAE over the valid steps (0, 2, 3) alone: r = (0.5, 0, 1), V = (0.2, 0.4, 0.3)
    delta = [0.5 + gamma * 0.4 - 0.2, 0.0 + gamma * 0.3 - 0.4, 1.0 - 0.3]
    a3 = delta[2]
    a2 = delta[1] + gamma * lam * a3
    a0 = delta[0] + gamma * lam * a2
    raw = np.array([[a0, 0.0, a2, a3]])
    advantages, returns = run("gae", rewards, mask, [0], values=values, gamma=gamma, lam=lam)
    np.testing.assert_allclose(returns.numpy(), [[a0 + 0.2, 0.0, a2 + 0.4, a3 + 0.3]], atol=1e-12)
    np.testing.assert_allclose(advantages.numpy(), whiten_ref(raw, mask.numpy()), atol=1e-12)
    # REINFORCE++: G_3 = 1, G_2 = 0.9; the gap resets: G_0 = 0.5 (not 0.5 + 0.81)
    _, returns = run("reinforce_plus_plus", rewards, mask, [0], gamma=gamma)
    np.testing.assert_allclose(returns.numpy(), [[0.5, 0.0, 0.9, 1.0]], atol=1e-12)


def test_gae_requires_values():
    rewards, mask = outcome_batch([1.0], [2], seq_len=2)
    with pytest.raises(ValueError, match="critic"):
        run("gae", rewards, mask, [0])


# --- common checks ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_masked_steps_are_zero_and_padding_never_read(name):
    rewards, mask = outcome_batch([1.0, 0.0, 0.5, 1.0], [3, 1, 2, 4], seq_len=4)
    dirty = rewards.clone()
    dirty[~mask] = NAN
    advantages, returns = run(name, dirty, mask, [0, 0, 1, 1], gamma=0.9)
    clean_advantages, clean_returns = run(name, rewards, mask, [0, 0, 1, 1], gamma=0.9)
    assert torch.equal(advantages, clean_advantages) and torch.equal(returns, clean_returns)
    assert torch.equal(advantages[~mask], torch.zeros(int((~mask).sum()), dtype=torch.float64))


def test_invalid_inputs_raise():
    rewards, mask = outcome_batch([1.0, 0.0], [1, 1], seq_len=1)
    with pytest.raises(ValueError, match="group_ids"):
        ADVANTAGE_ESTIMATORS.get("grpo")(rewards, mask, torch.zeros(2, dtype=torch.int32), GRPOConfig())
    with pytest.raises(ValueError, match="NaN"):
        run("grpo", torch.tensor([[NAN], [0.0]]), mask, [0, 0])
    with pytest.raises(ValueError, match="response_mask"):
        run("grpo", rewards, mask[:, :0], [0, 0])
    with pytest.raises(ValueError, match="epsilon"):
        GRPOConfig(epsilon=0.0)
    with pytest.raises(ValueError, match="gamma"):
        GAEConfig(gamma=1.5)
