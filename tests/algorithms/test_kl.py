"""KL estimators (Schulman 2020) and the coefficient controllers, by hand."""

import math

import numpy as np
import pytest
import torch

from vla_rl.algorithms.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_penalty,
)

NAN = float("nan")
LOG_P = torch.tensor([[-1.0, -0.5, -2.0]], dtype=torch.float64)
LOG_REF = torch.tensor([[-1.5, -0.5, -1.0]], dtype=torch.float64)
MASK = torch.ones(1, 3, dtype=torch.bool)


def test_registry_names_include_verl_aliases():
    assert KL_ESTIMATORS.names() == ["abs", "k1", "k2", "k3", "kl", "low_var_kl", "mse"]
    assert KL_ESTIMATORS.get("kl") is KL_ESTIMATORS.get("k1")
    assert KL_ESTIMATORS.get("mse") is KL_ESTIMATORS.get("k2")
    assert KL_ESTIMATORS.get("low_var_kl") is KL_ESTIMATORS.get("k3")


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        # d = log p - log ref = (0.5, 0, -1)
        ("k1", [0.5, 0.0, -1.0]),
        ("abs", [0.5, 0.0, 1.0]),
        ("k2", [0.125, 0.0, 0.5]),
        # k3 = exp(-d) - 1 + d
        ("k3", [math.exp(-0.5) - 1 + 0.5, 0.0, math.exp(1.0) - 1 - 1.0]),
    ],
)
def test_estimator_values_by_hand(kind, expected):
    result = kl_penalty(LOG_P, LOG_REF, kind, MASK)
    np.testing.assert_allclose(result[0].numpy(), expected, rtol=1e-12, atol=1e-15)


def test_k1_and_k3_are_unbiased_and_k3_has_lower_variance():
    # p = N(0, 1), ref = N(0.3, 1): KL(p || ref) = 0.3^2 / 2 = 0.045.
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    log_p = -0.5 * x**2
    log_ref = -0.5 * (x - 0.3) ** 2
    mask = torch.ones_like(x, dtype=torch.bool)
    k1, k3 = (kl_penalty(log_p, log_ref, kind, mask) for kind in ("k1", "k3"))
    assert k1.mean().item() == pytest.approx(0.045, abs=3e-3)
    assert k3.mean().item() == pytest.approx(0.045, abs=3e-3)
    assert k3.std() < k1.std()


def test_k3_is_clamped_as_verl():
    result = kl_penalty(torch.tensor([[-100.0]]), torch.tensor([[0.0]]), "k3", torch.ones(1, 1, dtype=torch.bool))
    assert result.item() == 10.0


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "k3"])
def test_masked_positions_are_zero_and_never_read(kind):
    log_p = LOG_P.clone().requires_grad_(True)
    dirty_ref = LOG_REF.clone()
    mask = torch.tensor([[True, False, True]])
    dirty_ref[0, 1] = NAN
    result = kl_penalty(log_p, dirty_ref, kind, mask)
    assert result[0, 1].item() == 0.0 and torch.isfinite(result).all()
    result.sum().backward()
    assert log_p.grad[0, 1].item() == 0.0 and torch.isfinite(log_p.grad).all()


def test_fixed_controller_never_moves():
    ctrl = FixedKLController(0.05)
    ctrl.update(current_kl=10.0, n_steps=1000)
    assert ctrl.value == 0.05


def test_adaptive_controller_follows_ziegler_et_al():
    ctrl = AdaptiveKLController(kl_coef=0.1, target_kl=0.02, horizon=1000)
    ctrl.update(current_kl=0.03, n_steps=100)  # error 0.5 clipped to 0.2: x (1 + 0.2 * 0.1)
    assert ctrl.value == pytest.approx(0.1 * 1.02)
    ctrl.update(current_kl=0.019, n_steps=500)  # error -0.05: x (1 - 0.05 * 0.5)
    assert ctrl.value == pytest.approx(0.1 * 1.02 * 0.975)


def test_invalid_settings_raise():
    with pytest.raises(ValueError, match="kl_coef"):
        FixedKLController(-1.0)
    with pytest.raises(ValueError, match="adaptive"):
        AdaptiveKLController(0.1, 0.0, 100)
    with pytest.raises(ValueError, match="shape"):
        kl_penalty(LOG_P, LOG_REF[:, :2], "k1", MASK)


def test_k3_clamps_the_log_ratio_at_twenty_before_the_exponential():
    """log(pi_ref / pi_theta) = -8 is inside verl's [-20, 20]: k3 = exp(-8) - 1 + 8, unclamped."""
    result = kl_penalty(torch.tensor([[0.0]], dtype=torch.float64), torch.tensor([[-8.0]], dtype=torch.float64),
                        "k3", torch.ones(1, 1, dtype=torch.bool))
    assert result.item() == pytest.approx(math.exp(-8.0) + 7.0, rel=1e-12)


def test_a_fixed_coefficient_of_zero_is_allowed():
    assert FixedKLController(0.0).value == 0.0


def test_make_kl_controller_builds_the_configured_kind():
    from types import SimpleNamespace

    from vla_rl.algorithms.kl import make_kl_controller

    adaptive = make_kl_controller(SimpleNamespace(type="adaptive", kl_coef=0.2, target_kl=0.1, horizon=50))
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.value, adaptive.target_kl, adaptive.horizon) == (0.2, 0.1, 50)
    fixed = make_kl_controller(SimpleNamespace(type="fixed", kl_coef=0.3, target_kl=0.1, horizon=50))
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.3
