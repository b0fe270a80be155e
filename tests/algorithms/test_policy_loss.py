"""Policy objectives (PPO clip / clip-higher / dual-clip, GSPO, GSPO-token, CPGD) against
hand-computed values."""

import math

import pytest
import torch

from vla_rl.algorithms.aggregation import LOSS_AGG_MODES
from vla_rl.algorithms.policy_loss import (
    POLICY_LOSSES,
    CPGDConfig,
    GSPOConfig,
    PPOClipConfig,
)
from vla_rl_core.components import config_fields

NAN = float("nan")
INF = float("inf")


def loss_of(name, log_probs, old_log_probs, advantages, mask, loss_agg_mode="token-mean", loss_agg_normalizer=None,
            **settings):
    """Objective ``name`` with its registered config: the clip range 0.2 / 0.28 the hand-computed
    values assume, then ``settings`` (those it takes)."""
    config_class = POLICY_LOSSES.config_class(name)
    merged = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, **settings}
    config = config_class(**{key: value for key, value in merged.items() if key in config_fields(config_class)})
    return POLICY_LOSSES.get(name)(log_probs, old_log_probs, advantages, mask, config, loss_agg_mode,
                                   loss_agg_normalizer)


def one_token(name, log_ratio: float, advantage: float, **config):
    """Loss, metrics and d loss / d log_prob for a single valid token."""
    log_probs = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)
    loss, metrics = loss_of(name, log_probs, torch.zeros(1, 1, dtype=torch.float64),
                                            torch.tensor([advantage], dtype=torch.float64),
                                            torch.ones(1, 1, dtype=torch.bool), **config)
    loss.backward()
    return loss.item(), metrics, log_probs.grad.item()


def test_registry_names():
    assert POLICY_LOSSES.names() == ["cpgd", "gspo", "gspo_token", "ppo_clip"]


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "gspo_token"])
def test_ratio_one_gives_minus_mean_advantage(name):
    log_probs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -4.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    advantages = torch.tensor([2.0, -1.0])  # (batch,), broadcast over seq_len
    loss, metrics = loss_of(name, log_probs, log_probs.clone(), advantages, mask)
    # valid tokens carry advantages 2, 2, -1 -> token-mean loss = -(2 + 2 - 1) / 3
    assert loss.item() == pytest.approx(-1.0)
    assert metrics["pg_clipfrac"] == 0.0 and metrics["approx_kl"] == 0.0 and metrics["ratio_mean"] == 1.0


# --- PPO clip, clip-higher, dual-clip ---------------------------------------------------------


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
    loss, metrics, grad = one_token("ppo_clip", math.log(ratio), advantage, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert loss == pytest.approx(expected_loss)
    assert metrics["pg_clipfrac"] == (1.0 if clipped else 0.0)
    # d(-A * ratio)/d log_prob = -A * ratio where unclipped; the clipped branch is flat.
    assert grad == pytest.approx(0.0 if clipped else -advantage * ratio)


def test_asymmetric_bounds_differ():
    # ratio 1.25 with A > 0 is inside 1 + 0.28 but outside a symmetric 1 + 0.2.
    assert one_token("ppo_clip", math.log(1.25), 1.0, clip_ratio_high=0.28)[0] == pytest.approx(-1.25)
    assert one_token("ppo_clip", math.log(1.25), 1.0, clip_ratio_high=0.2)[0] == pytest.approx(-1.2)


@pytest.mark.parametrize(
    ("ratio", "advantage", "expected_loss", "dual_clipped"),
    [
        # A < 0 and ratio 5 > c = 3: the loss is bounded at -A * c, and flat.
        (5.0, -2.0, 2.0 * 3.0, True),
        # A < 0 and ratio 2 < c: plain PPO (unclipped branch).
        (2.0, -2.0, 2.0 * 2.0, False),
        # A > 0: dual-clip never acts, whatever the ratio.
        (5.0, 2.0, -2.0 * 1.28, False),
        (0.1, 2.0, -2.0 * 0.1, False),
    ],
)
def test_dual_clip_only_acts_on_negative_advantages(ratio, advantage, expected_loss, dual_clipped):
    """On by default at c = 3, verl's clip_ratio_c, which its PPO loss always applies."""
    loss, metrics, grad = one_token("ppo_clip", math.log(ratio), advantage)
    without, _, grad_without = one_token("ppo_clip", math.log(ratio), advantage, dual_clip_c=None)
    assert loss == pytest.approx(expected_loss)
    assert metrics["pg_clipfrac_lower"] == (1.0 if dual_clipped else 0.0)
    if dual_clipped:
        assert grad == 0.0 and without > loss
    else:
        assert loss == pytest.approx(without) and grad == pytest.approx(grad_without)


def test_approx_kl_k3_and_ratio_mean_by_hand():
    log_probs = torch.tensor([[0.1, -0.2, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    _, metrics = loss_of("ppo_clip", log_probs, torch.zeros(1, 3, dtype=torch.float64),
                                               torch.tensor([1.0], dtype=torch.float64), mask)
    k3 = [(math.exp(d) - 1 - d) for d in (0.1, -0.2)]
    assert metrics["approx_kl"] == pytest.approx(sum(k3) / 2)
    assert metrics["ratio_mean"] == pytest.approx((math.exp(0.1) + math.exp(-0.2)) / 2)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "gspo_token", "cpgd"])
def test_log_ratio_is_clamped_before_exp(name):
    # log ratio 100 would overflow float32 exp; clamped at 20 it is exp(20) ~ 4.85e8.
    log_probs = torch.tensor([[100.0]], requires_grad=True)
    dual_clip = {"dual_clip_c": None} if name == "ppo_clip" else {}  # its loss would be -A * c = 3
    loss, metrics = loss_of(name, log_probs, torch.zeros(1, 1), torch.tensor([-1.0]),
                                            torch.ones(1, 1, dtype=torch.bool), log_ratio_clamp=20.0, **dual_clip)
    assert math.isfinite(loss.item())
    assert metrics["approx_kl"] == pytest.approx(math.exp(20.0) - 1 - 20.0, rel=1e-5)
    if name != "cpgd":
        assert loss.item() == pytest.approx(math.exp(20.0), rel=1e-5)


# --- GSPO ------------------------------------------------------------------------------------


def test_gspo_uses_the_valid_token_count():
    # Row 0: valid log-ratios 0.2 and 0.4 (a third, padded position holds NaN): s = exp(0.3),
    # not exp(0.6 / 3). A = 1 and eps_high = 0.5 leave it unclipped: loss = -exp(0.3).
    log_probs = torch.tensor([[0.2, 0.4, NAN]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False]])
    loss, metrics = loss_of("gspo", log_probs, torch.zeros(1, 3, dtype=torch.float64),
                            torch.tensor([1.0], dtype=torch.float64), mask, "seq-mean-token-mean", clip_ratio_high=0.5)
    assert loss.item() == pytest.approx(-math.exp(0.3))
    assert metrics["ratio_mean"] == pytest.approx(math.exp(0.3))
    loss.backward()
    # d(-exp(mean of the two log-ratios))/d log_prob_t = -exp(0.3) / 2 on each valid token.
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-math.exp(0.3) / 2] * 2 + [0.0]], dtype=torch.float64))


def test_gspo_clips_the_sequence_ratio():
    # s = exp(0.3) = 1.35 > 1 + 0.28 with A = 2 > 0: clipped, flat.
    log_probs = torch.tensor([[0.2, 0.4]], dtype=torch.float64, requires_grad=True)
    loss, metrics = loss_of("gspo", log_probs, torch.zeros(1, 2, dtype=torch.float64),
                                              torch.tensor([2.0], dtype=torch.float64),
                                              torch.ones(1, 2, dtype=torch.bool))
    loss.backward()
    assert loss.item() == pytest.approx(-2.0 * 1.28)
    assert metrics["pg_clipfrac"] == 1.0
    assert torch.equal(log_probs.grad, torch.zeros(1, 2, dtype=torch.float64))


def test_gspo_token_equals_gspo_for_sequence_advantages():
    torch.manual_seed(0)
    old = torch.randn(3, 4, dtype=torch.float64)
    new = (old + 0.05 * torch.randn(3, 4, dtype=torch.float64))
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    advantages = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    results = []
    for name in ("gspo", "gspo_token"):
        log_probs = new.clone().requires_grad_(True)
        loss, _ = loss_of(name, log_probs, old, advantages, mask, "seq-mean-token-mean", clip_ratio_low=0.03,
                          clip_ratio_high=0.04)
        loss.backward()
        results.append((loss.detach(), log_probs.grad))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])


def test_gspo_token_has_no_gradient_beyond_the_log_ratio_clamp_as_gspo():
    """Log-ratios of 25, beyond the clamp of 20: gspo's gradient is 0, gspo_token's was -A e^20 per
    token (its sequence log-ratio, clamped first, sat on the second clamp's bound; an audit against verl)."""
    for name in ("gspo", "gspo_token"):
        log_probs = torch.full((2, 3), 25.0, dtype=torch.float64, requires_grad=True)
        loss, _ = loss_of(name, log_probs, torch.zeros(2, 3, dtype=torch.float64),
                          torch.tensor([-1.0, 1.0], dtype=torch.float64), torch.ones(2, 3, dtype=torch.bool),
                          "seq-mean-token-mean")
        loss.backward()
        assert loss.item() == pytest.approx(math.exp(20) / 2 - 1.28 / 2), name  # -A s for A = -1, clipped for A = 1
        assert torch.equal(log_probs.grad, torch.zeros(2, 3, dtype=torch.float64)), name


def test_gspo_token_with_token_advantages_by_hand():
    # One sequence of two tokens, log-ratios 0.1 and -0.1: s = exp(0) = 1 for both tokens,
    # advantages (1, -3): token-mean loss = -(1 * 1 - 3 * 1) / 2 = 1; grads -A_t * s / 2.
    log_probs = torch.tensor([[0.1, -0.1]], dtype=torch.float64, requires_grad=True)
    loss, _ = loss_of("gspo_token", log_probs, torch.zeros(1, 2, dtype=torch.float64),
                                              torch.tensor([[1.0, -3.0]], dtype=torch.float64),
                                              torch.ones(1, 2, dtype=torch.bool))
    loss.backward()
    assert loss.item() == pytest.approx(1.0)
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-0.5, 1.5]], dtype=torch.float64))


def test_gspo_refuses_token_level_advantages():
    with pytest.raises(ValueError, match="gspo_token"):
        loss_of("gspo", torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1.0, 2.0]]),
                                  torch.ones(1, 2, dtype=torch.bool))


# --- CPGD ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("log_ratio", "advantage", "clipped_log_ratio"),
    [
        (0.5, 2.0, math.log(1.28)),   # A > 0: the log-ratio is capped at log(1 + eps_high)
        (-0.5, 2.0, -0.5),            # A > 0: no lower bound
        (-0.5, -2.0, math.log(0.8)),  # A < 0: the log-ratio is floored at log(1 - eps_low)
        (0.5, -2.0, 0.5),             # A < 0: no upper bound
    ],
)
def test_cpgd_clips_the_log_ratio_by_the_sign_of_the_advantage(log_ratio, advantage, clipped_log_ratio):
    coef = 0.1
    loss, metrics, grad = one_token("cpgd", log_ratio, advantage, policy_drift_coef=coef)
    drift = math.exp(log_ratio) - 1 - log_ratio
    assert loss == pytest.approx(-advantage * clipped_log_ratio + coef * drift)
    clipped = clipped_log_ratio != log_ratio
    assert metrics["pg_clipfrac"] == (1.0 if clipped else 0.0)
    assert metrics["policy_drift"] == pytest.approx(drift)
    # Gradient: -A where unclipped (the plain policy gradient), plus the drift's coef * (r - 1).
    assert grad == pytest.approx((0.0 if clipped else -advantage) + coef * (math.exp(log_ratio) - 1))


@pytest.mark.parametrize("ratio", [1.5, 3.0, 10.0, 100.0])
def test_cpgd_drift_pulls_back_no_harder_than_at_ratio_3(ratio):
    """siiRL's CPGD (``((r - 1).clamp(max=2.0) * log_prob``): the drift's gradient weight r - 1 is
    capped at 2; its value (the loss, policy_drift) stays k3. Uncapped, ratio 100 pulled back with
    weight 99. A > 0 with the log-ratio above the clip: the policy-gradient term adds nothing."""
    coef = 0.1
    loss, metrics, grad = one_token("cpgd", math.log(ratio), 1.0, policy_drift_coef=coef)
    drift = ratio - 1 - math.log(ratio)
    assert loss == pytest.approx(-math.log(1.28) + coef * drift) and metrics["policy_drift"] == pytest.approx(drift)
    assert grad == pytest.approx(coef * min(ratio - 1, 2.0))


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_cpgd_keeps_the_policy_gradient_of_a_token_beyond_the_log_ratio_clamp(advantage):
    """siiRL's CPGD takes no exp in the policy-gradient term and clamps nothing there: a token whose
    probability fell by e^25 under a positive advantage keeps the gradient -A that pushes it back
    (the clamp to +-20 before exp zeroed it). The drift's value and weight still see the clamp:
    r - 1 = expm1(-20), about -1. With A < 0 the floor log(1 - eps_low) clips it: no gradient."""
    coef = 0.1
    loss, metrics, grad = one_token("cpgd", -25.0, advantage, policy_drift_coef=coef)
    drift = math.exp(-20.0) - 1 + 20.0
    pg = -advantage * (-25.0 if advantage > 0 else math.log(0.8))
    assert loss == pytest.approx(pg + coef * drift) and metrics["policy_drift"] == pytest.approx(drift)
    assert grad == pytest.approx((-advantage if advantage > 0 else 0.0) + coef * math.expm1(-20.0))


def test_cpgd_on_policy_is_the_plain_policy_gradient():
    log_probs = torch.tensor([[-0.3, -1.2]], dtype=torch.float64, requires_grad=True)
    loss, metrics = loss_of("cpgd", log_probs, log_probs.detach().clone(),
                                              torch.tensor([[1.5, -0.5]], dtype=torch.float64),
                                              torch.ones(1, 2, dtype=torch.bool))
    loss.backward()
    assert loss.item() == 0.0 and metrics["policy_drift"] == 0.0
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-1.5 / 2, 0.5 / 2]], dtype=torch.float64))


# --- masks and aggregation -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "gspo_token", "cpgd"])
@pytest.mark.parametrize("mode", sorted(LOSS_AGG_MODES.names()))
def test_masked_positions_never_reach_loss_metrics_or_gradient(name, mode):
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    clean_log_probs = torch.tensor([[-1.0, -0.5, -1.0, -1.0], [-2.0, -1.0, -1.0, -1.0]])
    clean_old = torch.tensor([[-1.2, -0.4, -1.0, -1.0], [-1.5, -1.0, -1.0, -1.0]])
    clean_adv = torch.tensor([[0.5, 0.5, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]])
    dirty_log_probs = clean_log_probs.clone()
    dirty_log_probs[~mask] = torch.tensor([NAN, 1e30, -1e30, NAN, NAN])
    dirty_old = clean_old.clone()
    dirty_old[~mask] = torch.tensor([INF, NAN, 5e29, -INF, 0.0])
    dirty_adv = clean_adv.clone()
    dirty_adv[~mask] = torch.tensor([NAN, 1e38, NAN, -1e38, INF])
    clean_loss, clean_metrics = loss_of(name, clean_log_probs, clean_old, clean_adv, mask, mode, dual_clip_c=3.0)
    dirty = dirty_log_probs.clone().requires_grad_(True)
    dirty_loss, dirty_metrics = loss_of(name, dirty, dirty_old, dirty_adv, mask, mode, dual_clip_c=3.0)
    dirty_loss.backward()
    assert dirty_loss.item() == pytest.approx(clean_loss.item())
    assert dirty_metrics == pytest.approx(clean_metrics)
    assert torch.isfinite(dirty.grad).all()
    assert torch.equal(dirty.grad[~mask], torch.zeros(int((~mask).sum())))


def test_metrics_are_means_over_the_valid_tokens_by_hand():
    """Each metric over the 3 valid tokens of a half-masked batch (an unmasked mean would count the
    5 masked ones, whose log-ratio the objectives zero, as ratio 1, unclipped)."""
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    log_ratio = [0.4, -0.1, 1.5]  # the valid tokens'; A = 0.5 for row 0, -2 for row 1
    log_probs = torch.zeros(2, 4, dtype=torch.float64)
    log_probs[mask] = torch.tensor(log_ratio, dtype=torch.float64)
    old, advantages = torch.zeros(2, 4, dtype=torch.float64), torch.tensor([0.5, -2.0], dtype=torch.float64)
    k3 = sum(math.expm1(x) - x for x in log_ratio) / 3
    ratio_mean = sum(math.exp(x) for x in log_ratio) / 3

    _, ppo = loss_of("ppo_clip", log_probs, old, advantages, mask, dual_clip_c=3.0)
    # token 0: ratio 1.49 > 1.28 with A > 0, clipped; token 2: ratio 4.48, A < 0: -A r = 8.96 > -A c = 6
    assert ppo == pytest.approx({"pg_clipfrac": 1 / 3, "approx_kl": k3, "ratio_mean": ratio_mean,
                                 "pg_clipfrac_lower": 1 / 3})
    _, cpgd = loss_of("cpgd", log_probs, old, advantages, mask)
    assert cpgd == pytest.approx({"pg_clipfrac": 1 / 3, "approx_kl": k3, "ratio_mean": ratio_mean,
                                  "policy_drift": k3})  # token 0: log-ratio 0.4 > log 1.28 with A > 0
    _, gspo = loss_of("gspo", log_probs, old, advantages, mask)
    sequence_ratios = [math.exp((0.4 - 0.1) / 2), math.exp(1.5)]  # 1.16 within the range; 4.48 with A < 0
    assert gspo == pytest.approx({"pg_clipfrac": 0.0, "approx_kl": k3, "ratio_mean": sum(sequence_ratios) / 2})


def test_aggregation_mode_and_normaliser_are_passed_through():
    log_probs = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    advantages = torch.tensor([1.0, 4.0])
    # row sums of -A: -3 and -4
    loss, _ = loss_of("ppo_clip", log_probs, log_probs, advantages, mask, "seq-mean-token-sum")
    assert loss.item() == pytest.approx(-3.5)
    loss, _ = loss_of("ppo_clip", log_probs, log_probs, advantages, mask, "seq-mean-token-sum-norm", 10.0)
    assert loss.item() == pytest.approx(-0.35)


def test_invalid_arguments_raise():
    x = torch.zeros(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="advantages"):
        loss_of("ppo_clip", x, x, torch.zeros(3), mask)
    with pytest.raises(ValueError, match="old_log_probs"):
        loss_of("ppo_clip", x, x[:, :2], torch.zeros(2), mask)
    with pytest.raises(ValueError, match="clip_ratio_low"):
        PPOClipConfig(clip_ratio_low=1.0)
    with pytest.raises(ValueError, match="dual_clip_c"):
        PPOClipConfig(dual_clip_c=1.0)
    with pytest.raises(ValueError, match="policy_drift_coef"):
        CPGDConfig(policy_drift_coef=-0.1)


def test_each_objective_registers_its_own_settings():
    assert POLICY_LOSSES.config_class("ppo_clip") is PPOClipConfig
    assert POLICY_LOSSES.config_class("cpgd") is CPGDConfig
    # GSPO's default clip range is the paper's (Zheng et al. 2025, §5.1), not PPO's
    assert (GSPOConfig().clip_ratio_low, GSPOConfig().clip_ratio_high) == (3e-4, 4e-4)
    assert "dual_clip_c" not in config_fields(GSPOConfig) and "policy_drift_coef" not in config_fields(PPOClipConfig)


def test_gspo_averages_over_the_losss_units_as_docs_algorithms_says():
    """docs/algorithms.md: at ratio_granularity action a unit sums an action's A dimensions, so
    log s_i is A times the per-dimension mean; A = 7, a per-dimension log-ratio of 1e-4 and
    positive advantages: every sequence is clipped (no gradient) at action, none at token."""
    config = GSPOConfig(clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    old = torch.randn(4, 5 * 7, generator=torch.Generator().manual_seed(0))
    for granularity in ("token", "action"):
        new = (old + 1e-4).requires_grad_()
        units = (new, old) if granularity == "token" else (new.view(4, 5, 7).sum(-1), old.view(4, 5, 7).sum(-1))
        mask = torch.ones_like(units[0], dtype=torch.bool)
        loss, metrics = POLICY_LOSSES.get("gspo")(*units, torch.ones(4), mask, config, "seq-mean-token-mean")
        loss.backward()
        if granularity == "token":
            assert metrics["pg_clipfrac"] == 0.0 and metrics["ratio_mean"] == pytest.approx(1.0001, abs=1e-6)
            assert new.grad.norm() > 0
        else:
            assert metrics["pg_clipfrac"] == 1.0 and metrics["ratio_mean"] == pytest.approx(1.0007, abs=1e-6)
            assert new.grad.norm() == 0
