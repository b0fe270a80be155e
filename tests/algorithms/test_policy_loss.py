"""PPO clip loss with DAPO clip-higher, against hand-computed values."""

import math

import pytest
import torch

from vla_rl.algorithms.policy_loss import POLICY_LOSSES, compute_ppo_clip_loss

NAN = float("nan")


def one_token(log_ratio: float, advantage: float, **kwargs):
    """Loss, metrics and d loss / d log_prob for a single valid token."""
    log_probs = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)
    old_log_probs = torch.zeros(1, 1, dtype=torch.float64)
    loss, metrics = compute_ppo_clip_loss(log_probs, old_log_probs,
                                          torch.tensor([advantage], dtype=torch.float64),
                                          torch.ones(1, 1, dtype=torch.bool), **kwargs)
    loss.backward()
    return loss.item(), metrics, log_probs.grad.item()


def test_registered_under_ppo_clip():
    assert POLICY_LOSSES.get("ppo_clip") is compute_ppo_clip_loss


def test_ratio_one_gives_minus_mean_advantage():
    log_probs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -4.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    advantages = torch.tensor([2.0, -1.0])  # (batch,), broadcast over seq_len
    loss, metrics = compute_ppo_clip_loss(log_probs, log_probs.clone(), advantages, mask)
    # valid tokens carry advantages 2, 2, -1 -> loss = -(2 + 2 - 1) / 3
    assert loss.item() == pytest.approx(-1.0)
    assert metrics == {"pg_clipfrac": 0.0, "approx_kl": 0.0, "ratio_mean": 1.0}


@pytest.mark.parametrize(
    ("ratio", "advantage", "expected_loss", "clipped"),
    [
        # A > 0: only the upper bound 1 + 0.28 acts.
        (2.0, 1.5, -1.5 * 1.28, True),
        (0.5, 1.5, -1.5 * 0.5, False),
        # A < 0: only the lower bound 1 - 0.2 acts.
        (0.5, -1.5, 1.5 * 0.8, True),
        (2.0, -1.5, 1.5 * 2.0, False),
        # Inside the trust region nothing is clipped.
        (1.1, 1.5, -1.5 * 1.1, False),
        (0.9, -1.5, 1.5 * 0.9, False),
    ],
)
def test_clip_low_and_high_each_act_on_their_side(ratio, advantage, expected_loss, clipped):
    loss, metrics, grad = one_token(math.log(ratio), advantage,
                                    clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert loss == pytest.approx(expected_loss)
    assert metrics["pg_clipfrac"] == (1.0 if clipped else 0.0)
    # d(-A * ratio)/d log_prob = -A * ratio where unclipped; the clipped branch is flat.
    assert grad == pytest.approx(0.0 if clipped else -advantage * ratio)


def test_asymmetric_bounds_differ():
    # ratio 1.25 with A > 0 is inside 1 + 0.28 but outside a symmetric 1 + 0.2.
    loss_high, _, _ = one_token(math.log(1.25), 1.0, clip_ratio_low=0.2, clip_ratio_high=0.28)
    loss_sym, _, _ = one_token(math.log(1.25), 1.0, clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert loss_high == pytest.approx(-1.25)
    assert loss_sym == pytest.approx(-1.2)


def test_approx_kl_k3_and_ratio_mean_by_hand():
    log_probs = torch.tensor([[0.1, -0.2, 0.0]], dtype=torch.float64)
    old = torch.zeros(1, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    _, metrics = compute_ppo_clip_loss(log_probs, old, torch.tensor([1.0], dtype=torch.float64),
                                       mask)
    k3 = [(math.exp(d) - 1 - d) for d in (0.1, -0.2)]
    assert metrics["approx_kl"] == pytest.approx(sum(k3) / 2)
    assert metrics["ratio_mean"] == pytest.approx((math.exp(0.1) + math.exp(-0.2)) / 2)


def test_masked_positions_never_reach_loss_metrics_or_gradient():
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    clean_log_probs = torch.tensor([[-1.0, -0.5, -1.0, -1.0], [-2.0, -1.0, -1.0, -1.0]])
    clean_old = torch.tensor([[-1.2, -0.4, -1.0, -1.0], [-1.5, -1.0, -1.0, -1.0]])
    clean_adv = torch.tensor([[0.5, -1.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]])

    dirty_log_probs = clean_log_probs.clone()
    dirty_log_probs[~mask] = torch.tensor([NAN, 1e30, -1e30, NAN, NAN])
    dirty_old = clean_old.clone()
    dirty_old[~mask] = torch.tensor([float("inf"), NAN, 5e29, -float("inf"), 0.0])
    dirty_adv = clean_adv.clone()
    dirty_adv[~mask] = torch.tensor([NAN, 1e38, NAN, -1e38, float("inf")])

    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        clean_loss, clean_metrics = compute_ppo_clip_loss(clean_log_probs, clean_old, clean_adv,
                                                          mask, loss_agg_mode=mode)
        dirty = dirty_log_probs.clone().requires_grad_(True)
        dirty_loss, dirty_metrics = compute_ppo_clip_loss(dirty, dirty_old, dirty_adv, mask,
                                                          loss_agg_mode=mode)
        dirty_loss.backward()
        assert dirty_loss.item() == pytest.approx(clean_loss.item())
        assert dirty_metrics == pytest.approx(clean_metrics)
        assert torch.isfinite(dirty.grad).all()
        assert torch.equal(dirty.grad[~mask], torch.zeros(int((~mask).sum())))


def test_log_ratio_is_clamped_before_exp():
    # log ratio 100 would overflow float32 exp; clamped at 20 it is exp(20) ~ 4.85e8.
    loss, metrics, _ = one_token(100.0, -1.0, log_ratio_clamp=20.0)
    assert loss == pytest.approx(math.exp(20.0))
    assert math.isfinite(metrics["approx_kl"])
    assert metrics["approx_kl"] == pytest.approx(math.exp(20.0) - 1 - 20.0)


def test_aggregation_mode_is_passed_through():
    log_probs = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    advantages = torch.tensor([1.0, 4.0])
    loss, _ = compute_ppo_clip_loss(log_probs, log_probs, advantages, mask,
                                    loss_agg_mode="seq-mean-token-sum")
    # row sums of -A: -3 and -4, mean -3.5
    assert loss.item() == pytest.approx(-3.5)


def test_invalid_arguments_raise():
    x = torch.zeros(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="advantages"):
        compute_ppo_clip_loss(x, x, torch.zeros(3), mask)
    with pytest.raises(ValueError, match="clip_ratio_low"):
        compute_ppo_clip_loss(x, x, torch.zeros(2), mask, clip_ratio_low=1.0)
    with pytest.raises(ValueError, match="old_log_probs"):
        compute_ppo_clip_loss(x, x[:, :2], torch.zeros(2), mask)
