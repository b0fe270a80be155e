"""Policy-gradient objectives, registered by name in ``POLICY_LOSSES``.

Every objective has one signature::

    loss, metrics = fn(log_probs, old_log_probs, advantages, response_mask, config, loss_agg_mode,
                       loss_agg_normalizer=None)

- ``log_probs``: (batch, seq_len) float, log-probabilities of the taken actions/tokens under the
  policy being optimised (carries the gradient);
- ``old_log_probs``: (batch, seq_len) float, the same under the policy that sampled them;
- ``advantages``: (batch,) or (batch, seq_len) float; (batch,) is broadcast over seq_len;
- ``response_mask``: (batch, seq_len) bool, or float/int where nonzero marks a valid token;
- ``config``: the objective's own settings, the config class it is registered with
  (:class:`PPOClipConfig`, :class:`GSPOConfig`, :class:`CPGDConfig`); a template sets them as
  ``algorithm.<name>`` (``algorithm.ppo_clip.clip_ratio_high=0.28``);
- ``loss_agg_mode``, ``loss_agg_normalizer``: the aggregation (``vla_rl.algorithms.aggregation``),
  an independent setting (``algorithm.loss_agg_mode``);
- ``loss``: 0-dim, the aggregated loss to minimise; ``metrics``: floats, means over valid tokens.

Masked positions never reach the loss, its gradient, nor the metrics, whatever they hold (NaN,
inf): they are replaced with ``torch.where`` before any arithmetic. Ratios are formed in log
space and clamped to ``[-log_ratio_clamp, log_ratio_clamp]`` before ``exp``, so that they
cannot overflow.

Registered: ``"ppo_clip"`` (with DAPO clip-higher and optional dual-clip), ``"gspo"``,
``"gspo_token"``, ``"cpgd"``. The objective yields a (batch, seq_len) loss matrix; the
aggregation mode (``vla_rl.algorithms.aggregation``) reduces it, an independent setting.

Metrics of every objective: ``pg_clipfrac`` (fraction of tokens whose clipped branch is active),
``approx_kl`` (k3 estimate of KL(pi_old || pi_theta), ``(ratio - 1) - log_ratio``, Schulman
2020, unbiased since samples come from pi_old) and ``ratio_mean``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from vla_rl.algorithms.aggregation import aggregate_loss, masked_mean
from vla_rl_core.registry import Registry

PolicyLoss = Callable[..., tuple[Tensor, dict[str, float]]]

POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", calls=(
    ("log_probs", "old_log_probs", "advantages", "response_mask", "config", "loss_agg_mode", "loss_agg_normalizer"),
    ()))


@dataclass(frozen=True)
class ClipConfig:
    """The trust region shared by the clipped objectives.

    Attributes:
        clip_ratio_low: epsilon_low in [0, 1); the ratio is clipped below at 1 - epsilon_low
            (CPGD: the log-ratio at log(1 - epsilon_low)).
        clip_ratio_high: epsilon_high >= 0; the ratio is clipped above at 1 + epsilon_high
            (DAPO's clip-higher: 0.28 with epsilon_low 0.2).
        log_ratio_clamp: > 0; log-ratios are clamped to +-this before ``exp`` (20, verl's PPO
            clamp; verl's GSPO clamps its sequence log-ratio at 10).

    Raises:
        ValueError: from ``__post_init__`` when a field is out of range.
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    log_ratio_clamp: float = 20.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_ratio_low < 1.0:
            raise ValueError(f"clip_ratio_low must be in [0, 1) (got {self.clip_ratio_low}); the "
                             "ratio's lower clip bound 1 - clip_ratio_low has to stay positive")
        if self.clip_ratio_high < 0.0:
            raise ValueError(f"clip_ratio_high must be >= 0 (got {self.clip_ratio_high})")
        if self.log_ratio_clamp <= 0.0:
            raise ValueError(f"log_ratio_clamp must be > 0 (got {self.log_ratio_clamp}); 20 is usual")


@dataclass(frozen=True)
class PPOClipConfig(ClipConfig):
    """Settings of ``"ppo_clip"``: the clip range and dual-clip.

    Attributes:
        dual_clip_c: dual-clip constant c > 1 (None: off); 3, verl's ``clip_ratio_c``, which its
            PPO loss always applies.
    """

    dual_clip_c: float | None = 3.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dual_clip_c is not None and not self.dual_clip_c > 1.0:
            raise ValueError(f"dual_clip_c must be > 1 (got {self.dual_clip_c}); 3 is usual, None "
                             "turns dual-clip off")


@dataclass(frozen=True)
class GSPOConfig(ClipConfig):
    """Settings of ``"gspo"`` and ``"gspo_token"``: the clip range of the sequence ratio, by
    default the paper's 3e-4 / 4e-4 (Zheng et al. 2025, §5.1), far narrower than PPO's."""

    clip_ratio_low: float = 3e-4
    clip_ratio_high: float = 4e-4


#: The cap of the CPGD drift's gradient weight ``r - 1`` (siiRL's ``clamp(max=2.0)``).
DRIFT_WEIGHT_MAX = 2.0


@dataclass(frozen=True)
class CPGDConfig(ClipConfig):
    """Settings of ``"cpgd"``.

    Attributes:
        policy_drift_coef: alpha >= 0, weight of the policy-drift regulariser.
    """

    policy_drift_coef: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.policy_drift_coef < 0.0:
            raise ValueError(f"policy_drift_coef must be >= 0 (got {self.policy_drift_coef})")


def _prepare(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Validate the common inputs.

    Returns:
        ``valid`` (B, T) bool; ``log_probs`` with masked positions set to 0 (B, T);
        ``token_advantages`` (B, T), 0 at masked positions; the unclamped ``log_ratio`` (B, T),
        0 at masked positions.

    Raises:
        ValueError: on mismatched shapes.
    """
    if log_probs.dim() != 2:
        raise ValueError(f"log_probs must be (batch, seq_len); got shape {tuple(log_probs.shape)}")
    for name, tensor in (("old_log_probs", old_log_probs), ("response_mask", response_mask)):
        if tensor.shape != log_probs.shape:
            raise ValueError(f"{name} shape {tuple(tensor.shape)} must equal log_probs shape "
                             f"{tuple(log_probs.shape)}")
    if advantages.shape not in (log_probs.shape, log_probs.shape[:1]):
        raise ValueError(f"advantages must be (batch,) or (batch, seq_len) = "
                         f"{tuple(log_probs.shape)}; got {tuple(advantages.shape)}")
    valid = response_mask if response_mask.dtype == torch.bool else response_mask != 0
    zeros = torch.zeros_like(log_probs)
    token_advantages = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)
    token_advantages = torch.where(valid, token_advantages.expand_as(log_probs), zeros)  # (B, T)
    log_probs = torch.where(valid, log_probs, zeros)  # (B, T)
    log_ratio = torch.where(valid, log_probs - old_log_probs, zeros)  # (B, T)
    return valid, log_probs, token_advantages, log_ratio


def _common_metrics(log_ratio: Tensor, valid: Tensor, pg_clipped: Tensor, ratio_mean: float) -> dict[str, float]:
    """``pg_clipfrac``, ``approx_kl`` (k3 of the clamped token log-ratio) and ``ratio_mean``."""
    kl_k3 = torch.expm1(log_ratio) - log_ratio  # (B, T)
    return {
        "pg_clipfrac": masked_mean(pg_clipped.to(log_ratio.dtype), valid).item(),
        "approx_kl": masked_mean(kl_k3, valid).item(),
        "ratio_mean": ratio_mean,
    }


@POLICY_LOSSES.register("ppo_clip", config=PPOClipConfig)
def compute_ppo_clip_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    config: PPOClipConfig,
    loss_agg_mode: str,
    loss_agg_normalizer: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate loss with asymmetric clipping and optional dual-clip.

    Per valid token (Schulman et al. 2017, eq. 7, written as a loss to minimise, with DAPO's
    decoupled clip range, Yu et al. 2025, §3.1, eq. 10)::

        log_ratio           = clamp(log_probs - old_log_probs, -log_ratio_clamp, log_ratio_clamp)
        ratio               = exp(log_ratio)
        pg_loss_unclipped   = -A * ratio
        pg_loss_clipped     = -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
        pg_loss             = max(pg_loss_unclipped, pg_loss_clipped)

    so the upper bound only acts where ``A > 0`` and the lower bound only where ``A < 0``.
    Dual-clip (Ye et al. 2019, "Mastering Complex Control in MOBA Games with Deep Reinforcement
    Learning", arXiv 1912.09729, the dual-clip objective ``max(min(r A, clip(r) A), c A)`` for
    ``A < 0``) bounds the loss of negative-advantage tokens whose ratio exploded::

        pg_loss = min(pg_loss, -A * dual_clip_c)       where A < 0 (unchanged where A >= 0)

    Args:
        log_probs, old_log_probs, advantages, response_mask: see the module docstring.
        config: ``clip_ratio_low``, ``clip_ratio_high``, ``dual_clip_c``, ``log_ratio_clamp``.
        loss_agg_mode, loss_agg_normalizer: the aggregation of the per-token losses.

    Returns:
        ``(loss, metrics)``: the common metrics plus ``pg_clipfrac_lower``, the fraction of
        valid tokens where the dual-clip bound is active (0 when dual-clip is off).

    Raises:
        ValueError: on mismatched shapes.
        RegistryError: if ``loss_agg_mode`` is unknown.
    """
    valid, _, token_advantages, log_ratio = _prepare(log_probs, old_log_probs, advantages, response_mask)
    log_ratio = log_ratio.clamp(-config.log_ratio_clamp, config.log_ratio_clamp)
    ratio = torch.exp(log_ratio)  # (B, T)
    clipped_ratio = ratio.clamp(1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high)  # (B, T)
    pg_loss_unclipped = -token_advantages * ratio  # (B, T)
    pg_loss_clipped = -token_advantages * clipped_ratio  # (B, T)
    pg_loss = torch.maximum(pg_loss_unclipped, pg_loss_clipped)  # (B, T)
    dual_clipped = torch.zeros_like(valid)
    if config.dual_clip_c is not None:
        pg_loss_dual = -token_advantages * config.dual_clip_c  # (B, T)
        negative = token_advantages < 0
        dual_clipped = negative & (pg_loss > pg_loss_dual)
        pg_loss = torch.where(negative, torch.minimum(pg_loss, pg_loss_dual), pg_loss)
    loss = aggregate_loss(pg_loss, valid, loss_agg_mode, loss_agg_normalizer)
    with torch.no_grad():
        metrics = _common_metrics(log_ratio, valid, pg_loss_clipped > pg_loss_unclipped,
                                  masked_mean(ratio, valid).item())
        metrics["pg_clipfrac_lower"] = masked_mean(dual_clipped.to(log_ratio.dtype), valid).item()
    return loss, metrics


def _sequence_log_ratio(log_ratio: Tensor, valid: Tensor, clamp: float) -> tuple[Tensor, Tensor]:
    """GSPO's length-normalised sequence log-ratio ``(1/|y_i|) sum_t log_ratio_it`` (B,), clamped,
    and each row's valid-token count (B,)."""
    counts = valid.sum(dim=-1)  # (B,)
    seq_log_ratio = log_ratio.sum(dim=-1) / counts.clamp(min=1).to(log_ratio.dtype)  # (B,)
    return seq_log_ratio.clamp(-clamp, clamp), counts


def _sequence_ratio_mean(seq_ratio: Tensor, counts: Tensor) -> float:
    has_tokens = counts > 0
    return float(seq_ratio[has_tokens].mean()) if bool(has_tokens.any()) else 1.0


@POLICY_LOSSES.register("gspo", config=GSPOConfig)
def compute_gspo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    config: GSPOConfig,
    loss_agg_mode: str,
    loss_agg_normalizer: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO, sequence-level (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv
    2507.18071, §4.1: the objective J_GSPO and its importance ratio s_i)::

        s_i     = (pi_theta(y_i) / pi_old(y_i)) ^ (1 / |y_i|)
                = exp((1 / |y_i|) * sum_t log_ratio_it)            |y_i| = valid-token count
        l_i     = max(-A_i * s_i, -A_i * clip(s_i, 1 - clip_ratio_low, 1 + clip_ratio_high))

    ``A_i`` is the sequence's advantage: ``advantages`` must be constant over each row's valid
    tokens (outcome advantages: GRPO, RLOO, REINFORCE++-baseline); use ``"gspo_token"`` for
    token-level advantages. ``l_i`` is placed on each of the row's valid tokens and reduced with
    ``loss_agg_mode``: ``"seq-mean-token-mean"`` gives ``mean_i l_i``, the paper's objective
    (verl forces that mode; here the aggregation stays a setting of its own). The paper's clip
    ranges are far narrower than PPO's (3e-4 / 4e-4) and sized for per-token means. ``|y_i|``
    counts the row's valid positions, which are the loss's units: a text's tokens, but for a
    robot policy at ``ratio_granularity`` ``action`` (``chunk``) each unit sums an action's (a
    decision's executed actions') dimensions, so ``log s_i`` is A (C x A) times the mean over the
    dimensions and the ranges are that much tighter; ``ratio_granularity: token`` averages over
    dimensions.

    Args:
        log_probs, old_log_probs, advantages, response_mask: see the module docstring.
        config: ``clip_ratio_low``, ``clip_ratio_high``, ``log_ratio_clamp`` (applied to log s_i).
        loss_agg_mode, loss_agg_normalizer: the aggregation of the per-token losses.

    Returns:
        ``(loss, metrics)``; ``pg_clipfrac`` counts the tokens of clipped sequences, and
        ``ratio_mean`` is the mean of s_i over sequences with >= 1 valid token.

    Raises:
        ValueError: on mismatched shapes, or advantages that vary within a row.
        RegistryError: if ``loss_agg_mode`` is unknown.
    """
    valid, _, token_advantages, log_ratio = _prepare(log_probs, old_log_probs, advantages, response_mask)
    seq_log_ratio, counts = _sequence_log_ratio(log_ratio, valid, config.log_ratio_clamp)  # (B,), (B,)
    seq_advantages = token_advantages.sum(dim=-1) / counts.clamp(min=1).to(log_ratio.dtype)  # (B,)
    spread = torch.where(valid, (token_advantages - seq_advantages[:, None]).abs(), 0.0)
    if bool((spread > 1e-6 * (1.0 + seq_advantages.abs()[:, None])).any()):
        raise ValueError("gspo needs one advantage per sequence, but the advantages vary within a "
                         "row; use policy_loss 'gspo_token' for token-level advantages")
    seq_ratio = torch.exp(seq_log_ratio)  # (B,)
    clipped_ratio = seq_ratio.clamp(1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high)  # (B,)
    pg_loss_unclipped = -seq_advantages * seq_ratio  # (B,)
    pg_loss_clipped = -seq_advantages * clipped_ratio  # (B,)
    seq_loss = torch.maximum(pg_loss_unclipped, pg_loss_clipped)  # (B,)
    pg_loss = seq_loss[:, None].expand_as(log_ratio)  # (B, T)
    loss = aggregate_loss(pg_loss, valid, loss_agg_mode, loss_agg_normalizer)
    with torch.no_grad():
        seq_clipped = (pg_loss_clipped > pg_loss_unclipped)[:, None].expand_as(valid)  # (B, T)
        log_ratio = log_ratio.clamp(-config.log_ratio_clamp, config.log_ratio_clamp)
        metrics = _common_metrics(log_ratio, valid, seq_clipped, _sequence_ratio_mean(seq_ratio, counts))
    return loss, metrics


@POLICY_LOSSES.register("gspo_token", config=GSPOConfig)
def compute_gspo_token_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    config: GSPOConfig,
    loss_agg_mode: str,
    loss_agg_normalizer: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO-token (Zheng et al. 2025, arXiv 2507.18071, §4.3), for token-level advantages::

        s_it    = sg[s_i] * pi_theta(y_it) / sg[pi_theta(y_it)]
        log s_it = sg[log s_i] + log_probs_it - sg[log_probs_it]
        l_it    = max(-A_it * s_it, -A_it * clip(s_it, 1 - clip_ratio_low, 1 + clip_ratio_high))

    ``s_it`` equals ``s_i`` in value (same clipping as ``"gspo"``) and its gradient is
    ``s_i * grad log pi_theta(y_it)``; with advantages constant per row and
    ``"seq-mean-token-mean"`` it matches ``"gspo"`` in value and gradient (the paper's remark),
    beyond the clamp too (no gradient there, as verl's ``compute_policy_loss_gspo``).

    Args:
        log_probs, old_log_probs, advantages, response_mask: see the module docstring.
        config: ``clip_ratio_low``, ``clip_ratio_high``, ``log_ratio_clamp`` (applied to log s_it
            only, once).
        loss_agg_mode, loss_agg_normalizer: the aggregation of the per-token losses.

    Returns:
        ``(loss, metrics)``; ``ratio_mean`` is the mean of s_i over sequences with tokens.

    Raises:
        ValueError: on mismatched shapes.
        RegistryError: if ``loss_agg_mode`` is unknown.
    """
    valid, masked_log_probs, token_advantages, log_ratio = _prepare(
        log_probs, old_log_probs, advantages, response_mask)
    # clamped once, after the stop-gradient sum (verl's compute_policy_loss_gspo): a sequence
    # log-ratio clamped first put log s_it on the clamp's bound, where clamp passes the gradient
    seq_log_ratio, counts = _sequence_log_ratio(log_ratio, valid, math.inf)  # (B,), (B,)
    token_log_ratio = masked_log_probs - masked_log_probs.detach() + seq_log_ratio.detach()[:, None]
    token_log_ratio = token_log_ratio.clamp(-config.log_ratio_clamp, config.log_ratio_clamp)  # (B, T)
    token_ratio = torch.exp(token_log_ratio)  # (B, T)
    clipped_ratio = token_ratio.clamp(1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high)
    pg_loss_unclipped = -token_advantages * token_ratio  # (B, T)
    pg_loss_clipped = -token_advantages * clipped_ratio  # (B, T)
    pg_loss = torch.maximum(pg_loss_unclipped, pg_loss_clipped)  # (B, T)
    loss = aggregate_loss(pg_loss, valid, loss_agg_mode, loss_agg_normalizer)
    with torch.no_grad():
        log_ratio = log_ratio.clamp(-config.log_ratio_clamp, config.log_ratio_clamp)
        seq_ratio = torch.exp(seq_log_ratio.clamp(-config.log_ratio_clamp, config.log_ratio_clamp))
        metrics = _common_metrics(log_ratio, valid, pg_loss_clipped > pg_loss_unclipped,
                                  _sequence_ratio_mean(seq_ratio, counts))
    return loss, metrics


@POLICY_LOSSES.register("cpgd", config=CPGDConfig)
def compute_cpgd_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    config: CPGDConfig,
    loss_agg_mode: str,
    loss_agg_normalizer: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """CPGD: clipped policy gradient with policy drift (Liu et al. 2025, "CPGD: Toward Stable
    Rule-based Reinforcement Learning for Language Models", arXiv 2505.12504, the CPGD
    objective ``min(ln(r) A, clip(ln(r), ln(1 - eps), ln(1 + eps)) A) - alpha * D_KL(pi_old,
    pi_theta)``, per token, with decoupled ``eps_low`` / ``eps_high``)::

        log_ratio         = log_probs - old_log_probs
        clipped_log_ratio = min(log_ratio, log(1 + clip_ratio_high))     where A > 0
                            max(log_ratio, log(1 - clip_ratio_low))      where A < 0
        pg_loss           = -A * clipped_log_ratio
        l                 = clamp(log_ratio, -log_ratio_clamp, log_ratio_clamp)  (before exp only)
        policy_drift      = exp(l) - 1 - l                               k3 of KL(pi_old || pi_theta)
        loss              = aggregate(pg_loss + policy_drift_coef * policy_drift)
        d policy_drift    = min(exp(l) - 1, 2) * d log pi_theta          (the gradient used)

    The clipping acts on the log-ratio, by the sign of the advantage: the policy-gradient term is
    the plain ``-A * log pi_theta`` (up to a constant) until the log-ratio leaves the trust
    region on the side the advantage pushes it to, where its gradient vanishes. The drift term
    is the k3 estimator (Schulman 2020) of KL(pi_old || pi_theta) from samples of pi_old; its
    gradient weight ``r - 1`` is capped at 2 (a ratio above 3 pulls back no harder than 3), as
    siiRL's CPGD does (``siirl/engine/actor/dp_actor.py``: ``((r - 1).clamp(max=2.0) *
    log_prob``); the reported loss and ``policy_drift`` keep the drift's value.

    Args:
        log_probs, old_log_probs, advantages, response_mask: see the module docstring.
        config: ``clip_ratio_low``, ``clip_ratio_high``, ``policy_drift_coef``, ``log_ratio_clamp``.
        loss_agg_mode, loss_agg_normalizer: the aggregation of the per-token losses.

    Returns:
        ``(loss, metrics)``: the common metrics (``approx_kl`` is the mean drift) plus
        ``policy_drift``, the mean k3 drift over valid tokens.

    Raises:
        ValueError: on mismatched shapes.
        RegistryError: if ``loss_agg_mode`` is unknown.
    """
    valid, _, token_advantages, log_ratio = _prepare(log_probs, old_log_probs, advantages, response_mask)
    upper, lower = math.log1p(config.clip_ratio_high), math.log1p(-config.clip_ratio_low)
    positive, negative = token_advantages > 0, token_advantages < 0
    # The policy-gradient term takes no exp: unclamped, a token whose probability fell by more than
    # e^log_ratio_clamp keeps the gradient -A that pushes it back, as in siiRL.
    clipped_log_ratio = torch.where(positive, log_ratio.clamp(max=upper), log_ratio)
    clipped_log_ratio = torch.where(negative, log_ratio.clamp(min=lower), clipped_log_ratio)  # (B, T)
    pg_loss = -token_advantages * clipped_log_ratio  # (B, T)
    bounded = log_ratio.clamp(-config.log_ratio_clamp, config.log_ratio_clamp)  # (B, T), before exp
    policy_drift = torch.expm1(bounded) - bounded  # (B, T)
    # The drift's value, with the gradient weight (r - 1) of its derivative capped at 2 (siiRL).
    drift_weight = torch.expm1(bounded).detach().clamp(max=DRIFT_WEIGHT_MAX)
    drift_term = policy_drift.detach() + drift_weight * (log_ratio - log_ratio.detach())  # (B, T)
    loss = aggregate_loss(pg_loss + config.policy_drift_coef * drift_term, valid,
                          loss_agg_mode, loss_agg_normalizer)
    with torch.no_grad():
        clipped = (positive & (log_ratio > upper)) | (negative & (log_ratio < lower))
        metrics = _common_metrics(bounded, valid, clipped, masked_mean(torch.exp(bounded), valid).item())
        metrics["policy_drift"] = masked_mean(policy_drift, valid).item()
    return loss, metrics
