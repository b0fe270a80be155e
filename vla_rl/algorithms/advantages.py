"""Advantage estimators, registered by name in ``ADVANTAGE_ESTIMATORS`` (as verl does).

``"grpo"``: group-relative outcome advantage (GRPO, Shao et al. 2024; Dr. GRPO, Liu et al. 2025).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from vla_rl.utils.registry import Registry

ADVANTAGE_ESTIMATORS: Registry[Callable[..., Tensor]] = Registry("advantage estimator")


@ADVANTAGE_ESTIMATORS.register("grpo")
def compute_grpo_outcome_advantage(
    rewards: Tensor,
    group_ids: Tensor,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> Tensor:
    """Group-relative outcome advantage, one value per trajectory.

    GRPO with outcome supervision (Shao et al. 2024, "DeepSeekMath", §4.1.2) gives every sample
    ``i`` of a group ``g`` (the rollouts sharing a prompt or initial state)::

        A_i = (r_i - mean_g(r)) / (std_g(r) + epsilon)        if norm_by_std
        A_i =  r_i - mean_g(r)                                 otherwise (Dr. GRPO, Liu et al. 2025)

    ``std_g`` is the unbiased sample standard deviation (Bessel's correction, divisor ``n - 1``),
    the convention of ``torch.std`` used by verl's and TRL's GRPO; the paper leaves the estimator
    unspecified, and using the same one keeps ``epsilon`` and learning rates comparable with those
    implementations.

    Two cases are exactly 0, never NaN:

    - a group whose rewards are all equal (no sample is better than another, so no signal);
    - a group of size 1: one sample carries no baseline information (its own reward would be its
      baseline). verl instead returns the raw reward for such a sample; we do not.

    Args:
        rewards: (batch,) float, one scalar reward per trajectory.
        group_ids: (batch,) int64, the group of each trajectory (any integers; groups need not
            be contiguous or sorted).
        norm_by_std: divide by the group standard deviation (GRPO) or not (Dr. GRPO).
        epsilon: added to the standard deviation before dividing; must be > 0.

    Returns:
        (batch,) advantages with the dtype of ``rewards`` (statistics computed in float64).

    Raises:
        ValueError: on a shape or dtype mismatch, non-finite rewards, or ``epsilon <= 0``.
    """
    if rewards.dim() != 1 or not rewards.is_floating_point():
        raise ValueError(f"rewards must be a (batch,) float tensor; got {rewards.dtype} "
                         f"of shape {tuple(rewards.shape)}")
    if group_ids.shape != rewards.shape or group_ids.dtype != torch.int64:
        raise ValueError(f"group_ids must be a (batch,) int64 tensor matching rewards; got "
                         f"{group_ids.dtype} of shape {tuple(group_ids.shape)}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf; check the reward function")
    if epsilon <= 0:
        raise ValueError(f"epsilon must be > 0 (got {epsilon}); use e.g. 1e-6")

    values = rewards.to(torch.float64)  # (B,)
    _, group_index = torch.unique(group_ids, return_inverse=True)  # (B,) in [0, G)
    num_groups = int(group_index.max().item()) + 1 if values.numel() else 0

    def group_sum(x: Tensor) -> Tensor:  # (B,) -> (G,)
        return torch.zeros(num_groups, dtype=x.dtype).index_add_(0, group_index, x)

    group_size = group_sum(torch.ones_like(values))  # (G,)
    group_mean = group_sum(values) / group_size  # (G,)
    centered = values - group_mean[group_index]  # (B,)

    group_max = torch.full((num_groups,), -torch.inf, dtype=torch.float64)
    group_max = group_max.scatter_reduce(0, group_index, values, reduce="amax")  # (G,)
    group_min = torch.full((num_groups,), torch.inf, dtype=torch.float64)
    group_min = group_min.scatter_reduce(0, group_index, values, reduce="amin")  # (G,)
    # All-equal groups (size-1 groups included) carry no signal: exactly 0, whatever rounding
    # the mean above introduced.
    is_informative = (group_max > group_min)[group_index]  # (B,)

    if norm_by_std:
        bessel_divisor = (group_size - 1).clamp(min=1)  # (G,); size-1 groups are masked below
        group_std = (group_sum(centered**2) / bessel_divisor).sqrt()  # (G,)
        scaled = centered / (group_std[group_index] + epsilon)  # (B,)
    else:
        scaled = centered  # (B,)
    advantages = torch.where(is_informative, scaled, torch.zeros_like(scaled))  # (B,)
    return advantages.to(rewards.dtype)
