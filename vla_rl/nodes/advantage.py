"""``(advantage, compute)``: group-relative advantages of the episode rewards."""

from __future__ import annotations

from vla_rl.algorithms.advantages import ADVANTAGE_ESTIMATORS
from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.data import keys


@register_node("advantage", "compute")
def compute_advantages(ctx, batch) -> NodeOutput:
    """Set ``advantages`` ``(n,)`` with ``algorithm.adv_estimator`` over the groups (``uid``)."""
    algo = ctx.config.algorithm
    estimator = ADVANTAGE_ESTIMATORS.get(algo.adv_estimator)
    advantages = estimator(batch[keys.REWARDS], batch[keys.UID], norm_by_std=algo.norm_adv_by_std)
    batch.set(keys.ADVANTAGES, advantages.float())
    return NodeOutput(batch, {"advantage/abs_mean": float(advantages.abs().mean())})
