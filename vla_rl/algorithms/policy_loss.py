"""Policy-gradient objectives, registered by name in ``POLICY_LOSSES``.

``"ppo_clip"``: the PPO clipped surrogate (Schulman et al. 2017, eq. 7) with separate lower and
upper clip ranges (DAPO "clip-higher", Yu et al. 2025, §3.1, eq. 10).

The objective and the loss aggregation (``vla_rl.algorithms.aggregation``) are independent
settings: the objective yields a (batch, seq_len) loss matrix, the aggregation mode reduces it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from vla_rl.algorithms.aggregation import aggregate_loss, masked_mean
from vla_rl.utils.registry import Registry

POLICY_LOSSES: Registry[Callable[..., tuple[Tensor, dict[str, float]]]] = Registry("policy loss")


def _validate_ppo_inputs(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    log_ratio_clamp: float,
) -> None:
    """Raise ValueError unless the inputs fit ``compute_ppo_clip_loss``'s contract."""
    if log_probs.dim() != 2:
        raise ValueError(f"log_probs must be (batch, seq_len); got shape {tuple(log_probs.shape)}")
    for name, tensor in (("old_log_probs", old_log_probs), ("response_mask", response_mask)):
        if tensor.shape != log_probs.shape:
            raise ValueError(f"{name} shape {tuple(tensor.shape)} must equal log_probs shape "
                             f"{tuple(log_probs.shape)}")
    if advantages.shape not in (log_probs.shape, log_probs.shape[:1]):
        raise ValueError(f"advantages must be (batch,) or (batch, seq_len) = "
                         f"{tuple(log_probs.shape)}; got {tuple(advantages.shape)}")
    if not 0.0 <= clip_ratio_low < 1.0:
        raise ValueError(f"clip_ratio_low must be in [0, 1) (got {clip_ratio_low}); the ratio's "
                         "lower clip bound 1 - clip_ratio_low has to stay positive")
    if clip_ratio_high < 0.0:
        raise ValueError(f"clip_ratio_high must be >= 0 (got {clip_ratio_high})")
    if log_ratio_clamp <= 0.0:
        raise ValueError(f"log_ratio_clamp must be > 0 (got {log_ratio_clamp}); 20 is usual")


@POLICY_LOSSES.register("ppo_clip")
def compute_ppo_clip_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    loss_agg_mode: str = "token-mean",
    log_ratio_clamp: float = 20.0,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate loss with asymmetric clipping.

    Per valid token (Schulman et al. 2017, eq. 7, written as a loss to minimise, with DAPO's
    decoupled clip range, Yu et al. 2025, §3.1, eq. 10)::

        log_ratio           = clamp(log_probs - old_log_probs, -log_ratio_clamp, log_ratio_clamp)
        ratio               = exp(log_ratio)
        pg_loss_unclipped   = -A * ratio
        pg_loss_clipped     = -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
        pg_loss             = max(pg_loss_unclipped, pg_loss_clipped)

    so the upper bound only acts where ``A > 0`` and the lower bound only where ``A < 0``. The
    ratio is formed in log space and clamped before ``exp`` so that it cannot overflow.

    Masked positions never reach the loss, its gradient, nor the metrics, whatever they hold
    (NaN, inf): they are replaced with ``torch.where`` before any arithmetic.

    Args:
        log_probs: (batch, seq_len) float, log-probabilities of the taken actions/tokens under
            the policy being optimised (carries the gradient).
        old_log_probs: (batch, seq_len) float, the same under the policy that sampled them.
        advantages: (batch,) or (batch, seq_len) float; (batch,) is broadcast over seq_len.
        response_mask: (batch, seq_len) bool, or float/int where nonzero marks a valid token.
        clip_ratio_low: epsilon_low, in [0, 1); the ratio is clipped below at 1 - epsilon_low.
        clip_ratio_high: epsilon_high, >= 0; the ratio is clipped above at 1 + epsilon_high.
        loss_agg_mode: a name in ``LOSS_AGG_MODES`` (``"token-mean"``, ...).
        log_ratio_clamp: bound, in nats, on |log_probs - old_log_probs| before ``exp``; > 0.

    Returns:
        ``(loss, metrics)``: ``loss`` is a 0-dim tensor to minimise; ``metrics`` holds floats,
        each a mean over the valid tokens:

        - ``pg_clipfrac``: fraction of tokens where clipping is active (the clipped loss is
          strictly larger than the unclipped one, as verl counts it);
        - ``approx_kl``: k3 estimate of KL(pi_old || pi_theta), ``(ratio - 1) - log_ratio``
          (Schulman 2020, "Approximating KL Divergence"), unbiased since samples come from
          pi_old and ``E_old[ratio] = 1``;
        - ``ratio_mean``: mean importance ratio.

    Raises:
        ValueError: on mismatched shapes or out-of-range clip settings.
        RegistryError: if ``loss_agg_mode`` is unknown.
    """
    _validate_ppo_inputs(log_probs, old_log_probs, advantages, response_mask,
                         clip_ratio_low, clip_ratio_high, log_ratio_clamp)
    valid = response_mask if response_mask.dtype == torch.bool else response_mask != 0
    token_advantages = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)
    token_advantages = token_advantages.expand_as(log_probs)  # (B, T)

    zeros = torch.zeros_like(log_probs)
    log_ratio = torch.where(valid, log_probs - old_log_probs, zeros)  # (B, T)
    log_ratio = log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)  # (B, T)
    token_advantages = torch.where(valid, token_advantages, zeros)  # (B, T)

    clipped_ratio = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)  # (B, T)
    pg_loss_unclipped = -token_advantages * ratio  # (B, T)
    pg_loss_clipped = -token_advantages * clipped_ratio  # (B, T)
    pg_loss = torch.maximum(pg_loss_unclipped, pg_loss_clipped)  # (B, T)
    loss = aggregate_loss(pg_loss, valid, loss_agg_mode)

    with torch.no_grad():
        is_clipped = (pg_loss_clipped > pg_loss_unclipped).to(log_probs.dtype)  # (B, T)
        kl_k3 = (ratio - 1.0) - log_ratio  # (B, T)
        metrics = {
            "pg_clipfrac": masked_mean(is_clipped, valid).item(),
            "approx_kl": masked_mean(kl_k3, valid).item(),
            "ratio_mean": masked_mean(ratio, valid).item(),
        }
    return loss, metrics
