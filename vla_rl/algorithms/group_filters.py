"""Group filters: which groups of rollouts a step keeps. Each decides per group (all samples of a
group share the answer); the run's settings compose them (:func:`keep_groups`).

- zero variance: DAPO's dynamic-sampling criterion (Yu et al. 2025, "DAPO", §3.2, eq. 11: keep
  a prompt only if ``0 < |{o_i : is_equivalent(a, o_i)}| < G``), on success (DAPO's accuracy,
  verl's ``filter_groups.metric: acc``) or generalised to any reward (verl's ``seq_reward``): a
  group whose values are all equal is dropped; with equal rewards every GRPO advantage of it is
  0 and it would only dilute the batch. A group of size 1 is such a group, as the paper's
  ``0 < count < G`` has it (verl's DAPO trainer keeps one: ``std > 0 or len == 1``; the group
  advantage estimators refuse a group size below 2 at plan time anyway). "All equal" allows
  ``1e-6`` between a group's largest and smallest value, where verl asks for ``std > 0``: on
  continuous rewards (SRPO's) groups within float noise of each other are dropped here.
- success-rate band: the accuracy filter of SimpleVLA-RL (Li et al. 2025) and of the SRPO recipe
  in siiRL (``accuracy_lower_bound`` / ``accuracy_upper_bound``, 0.1 and 0.9): keep a group when
  its success rate lies in ``[low, high]``. With binary success and the band ``[1/G, 1 - 1/G]``
  it is the zero-variance filter.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _group_index(uids: Tensor) -> tuple[Tensor, int]:
    """Dense group index (n,) in [0, G) and the number of groups G.

    Raises:
        ValueError: if ``uids`` is not a (n,) int64 tensor.
    """
    if uids.dim() != 1 or uids.dtype != torch.int64:
        raise ValueError(f"uids must be a (batch,) int64 tensor; got {uids.dtype} of shape {tuple(uids.shape)}")
    _, inverse = torch.unique(uids, return_inverse=True)
    return inverse, int(inverse.max()) + 1 if len(uids) else 0


def zero_variance_groups(rewards: Tensor, uids: Tensor, tolerance: float = 1e-6) -> Tensor:
    """Mask of the samples whose group's rewards are all equal (``max - min <= tolerance``).

    Args:
        rewards: (n,) float.
        uids: (n,) int64 group ids.
        tolerance: >= 0.

    Returns:
        (n,) bool, True for the samples of all-equal (and size-1) groups.

    Raises:
        ValueError: on a shape or dtype mismatch.
    """
    inverse, groups = _group_index(uids)
    if rewards.shape != uids.shape:
        raise ValueError(f"rewards shape {tuple(rewards.shape)} must equal uids shape {tuple(uids.shape)}")
    values = rewards.to(torch.float64)
    high = torch.full((groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, inverse, values, "amax")
    low = torch.full((groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, inverse, values, "amin")
    return (high - low <= tolerance)[inverse]


def in_success_rate_band(success: Tensor, uids: Tensor, low: float, high: float) -> Tensor:
    """Mask of the samples whose group's success rate ``s`` satisfies ``low <= s <= high``.

    Args:
        success: (n,) bool.
        uids: (n,) int64 group ids.
        low, high: rates with ``0 <= low <= high <= 1``.

    Returns:
        (n,) bool.

    Raises:
        ValueError: on a shape or dtype mismatch.
    """
    inverse, groups = _group_index(uids)
    if success.shape != uids.shape or success.dtype != torch.bool:
        raise ValueError(f"success must be a (batch,) bool tensor matching uids; got {success.dtype} of "
                         f"shape {tuple(success.shape)}")
    successes = torch.zeros(groups, dtype=torch.float64).index_add_(0, inverse, success.to(torch.float64))
    sizes = torch.zeros(groups, dtype=torch.float64).index_add_(0, inverse, torch.ones(len(uids), dtype=torch.float64))
    rate = successes / sizes.clamp(min=1)  # (G,)
    return ((rate >= low) & (rate <= high))[inverse]


def keep_groups(
    rewards: Tensor,
    success: Tensor,
    uids: Tensor,
    filter_zero_variance: bool,
    success_rate_band: tuple[float, float] | None,
    zero_variance_metric: str = "rewards",
) -> Tensor:
    """The samples of the groups that pass every enabled filter.

    Args:
        rewards: (n,) float.
        success: (n,) bool.
        uids: (n,) int64 group ids.
        filter_zero_variance: drop groups whose ``zero_variance_metric`` is the same for all
            their samples.
        success_rate_band: ``(low, high)`` to keep only groups with a success rate in the band;
            None for no band.
        zero_variance_metric: ``"rewards"`` or ``"success"`` (DAPO's accuracy).

    Returns:
        (n,) bool.

    Raises:
        ValueError: an unknown ``zero_variance_metric``, or a shape or dtype mismatch.
    """
    keep = torch.ones(len(uids), dtype=torch.bool)
    if filter_zero_variance:
        if zero_variance_metric not in ("rewards", "success"):
            raise ValueError(f"zero_variance_metric must be 'rewards' or 'success', got {zero_variance_metric!r}")
        values = rewards if zero_variance_metric == "rewards" else success.to(torch.float64)
        keep &= ~zero_variance_groups(values, uids)
    if success_rate_band is not None:
        keep &= in_success_rate_band(success, uids, *success_rate_band)
    return keep
