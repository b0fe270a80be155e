"""``(filter, compute)``: drop groups that carry no learning signal."""

from __future__ import annotations

import torch

from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.data import keys


def zero_variance_groups(rewards: torch.Tensor, uids: torch.Tensor, tolerance: float = 1e-6) -> torch.Tensor:
    """Mask ``(n,)`` bool of samples whose group's rewards are all equal (max - min ≤ tolerance).

    Args:
        rewards: ``(n,)`` float rewards; uids: ``(n,)`` int64 group ids.
    """
    _, inverse = torch.unique(uids, return_inverse=True)
    groups = int(inverse.max()) + 1 if len(uids) else 0
    high = torch.full((groups,), -torch.inf).scatter_reduce(0, inverse, rewards.float(), reduce="amax")
    low = torch.full((groups,), torch.inf).scatter_reduce(0, inverse, rewards.float(), reduce="amin")
    return (high - low <= tolerance)[inverse]


@register_node("filter", "compute")
def filter_groups(ctx, batch) -> NodeOutput:
    """Keep only groups with reward variance (when ``algorithm.filter_zero_variance_groups``).

    All-equal groups have zero advantage under GRPO and would only dilute a per-episode mean.
    """
    n = len(batch)
    if not ctx.config.algorithm.filter_zero_variance_groups or n == 0:
        return NodeOutput(batch, {"filter/kept_fraction": 1.0})
    keep = ~zero_variance_groups(batch[keys.REWARDS], batch[keys.UID])
    return NodeOutput(batch[keep], {"filter/kept_fraction": float(keep.float().mean())})
