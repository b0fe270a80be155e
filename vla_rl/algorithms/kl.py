"""KL penalties between the policy and a frozen reference, and their coefficient controllers.

Per-token estimators of KL(pi_theta || pi_ref) from samples of pi_theta, registered by name in
``KL_ESTIMATORS`` (Schulman 2020, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html;
verl's ``kl_penalty``; verl's alias in brackets), with ``d = log_probs - ref_log_probs``::

    "k1"  ("kl")          d                                 unbiased, high variance, can be < 0
    "abs"                 |d|
    "k2"  ("mse")         d^2 / 2                           biased, low variance, >= 0
    "k3"  ("low_var_kl")  exp(-d) - 1 + d                   unbiased, low variance, >= 0

k3 clamps ``-d`` to [-20, 20] before ``exp`` and its result to [-10, 10], as verl does. Those
bounds are sized for one token: the callers estimate per action dimension (the KL loss) or per
action (the KL in the reward, whose rollout log-probs are per action) and sum the estimates over
a unit (the chain rule's KL of a sequence), never one estimate of a whole chunk's log-ratio, which
the clamp would saturate (zero gradient) at a few nats.

The penalty is used either as a loss term on the current log-probs (``use_kl_loss``, a fixed
``kl_loss_coef``, as verl's actor) or subtracted from the rewards with the rollout log-probs
(``use_kl_in_reward``, coefficient from a :class:`FixedKLController` or an
:class:`AdaptiveKLController`, as verl's ``apply_kl_penalty``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from vla_rl_core.registry import Registry

KLEstimator = Callable[[Tensor, Tensor], Tensor]

KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator", calls=(("log_probs", "ref_log_probs"), ()))


def _register(*names: str) -> Callable[[KLEstimator], KLEstimator]:
    def decorator(fn: KLEstimator) -> KLEstimator:
        for name in names:
            KL_ESTIMATORS.register(name)(fn)
        return fn

    return decorator


@_register("k1", "kl")
def kl_k1(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k1 = log pi_theta - log pi_ref, elementwise, any shape."""
    return log_probs - ref_log_probs


@_register("abs")
def kl_abs(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """|log pi_theta - log pi_ref|, elementwise, any shape."""
    return (log_probs - ref_log_probs).abs()


@_register("k2", "mse")
def kl_k2(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k2 = (log pi_theta - log pi_ref)^2 / 2, elementwise, any shape."""
    return 0.5 * (log_probs - ref_log_probs).square()


@_register("k3", "low_var_kl")
def kl_k3(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k3 = r - 1 - log r with r = pi_ref / pi_theta, elementwise, any shape (clamped as verl)."""
    log_ratio = (ref_log_probs - log_probs).clamp(-20.0, 20.0)
    return (torch.exp(log_ratio) - 1.0 - log_ratio).clamp(-10.0, 10.0)


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, kind: str, mask: Tensor) -> Tensor:
    """The ``kind`` KL estimate per position, 0 where ``mask`` is False.

    Args:
        log_probs: any shape, float: log pi_theta of the sampled actions/tokens.
        ref_log_probs: same shape: log pi_ref of the same actions/tokens.
        kind: a name in ``KL_ESTIMATORS``.
        mask: bool, same shape; masked positions are 0 whatever the inputs hold there.

    Returns:
        Same shape as ``log_probs``.

    Raises:
        RegistryError: if ``kind`` is unknown.
        ValueError: on mismatched shapes.
    """
    if ref_log_probs.shape != log_probs.shape or mask.shape != log_probs.shape:
        raise ValueError(f"log_probs {tuple(log_probs.shape)}, ref_log_probs "
                         f"{tuple(ref_log_probs.shape)} and mask {tuple(mask.shape)} must share a shape")
    estimator = KL_ESTIMATORS.get(kind)
    zeros = torch.zeros_like(log_probs)
    kl = estimator(torch.where(mask, log_probs, zeros), torch.where(mask, ref_log_probs, zeros))
    return torch.where(mask, kl, zeros)


class FixedKLController:
    """A constant KL coefficient.

    Args:
        kl_coef: the coefficient, >= 0.
    """

    def __init__(self, kl_coef: float) -> None:
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0 (got {kl_coef})")
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Keep the coefficient (the signature of :meth:`AdaptiveKLController.update`)."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, "Fine-Tuning Language Models from Human
    Preferences", §2.2), as verl's and TRL's::

        e_t       = clip(KL_t / KL_target - 1, -0.2, 0.2)
        beta_t+1  = beta_t * (1 + e_t * n_steps / horizon)

    Args:
        kl_coef: initial coefficient, > 0.
        target_kl: the KL it steers towards, > 0.
        horizon: samples over which a full proportional correction is applied, > 0.
    """

    def __init__(self, kl_coef: float, target_kl: float, horizon: int) -> None:
        if not (kl_coef > 0 and target_kl > 0 and horizon > 0):
            raise ValueError(f"adaptive KL control needs kl_coef, target_kl and horizon > 0 (got "
                             f"{kl_coef}, {target_kl}, {horizon})")
        self.value = kl_coef
        self.target_kl = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient after a step whose mean KL was ``current_kl`` over ``n_steps``
        samples."""
        error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def make_kl_controller(kl_ctrl) -> FixedKLController | AdaptiveKLController:
    """The controller a run's ``algorithm.kl_ctrl`` section describes (``type``: ``fixed`` or
    ``adaptive``; ``kl_coef``, ``target_kl``, ``horizon``)."""
    if kl_ctrl.type == "adaptive":
        return AdaptiveKLController(kl_ctrl.kl_coef, kl_ctrl.target_kl, kl_ctrl.horizon)
    return FixedKLController(kl_ctrl.kl_coef)
