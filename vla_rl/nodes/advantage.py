"""``(advantage, compute)``: per-step rewards, then advantages and returns with
``algorithm.adv_estimator``."""

from __future__ import annotations

import logging
from typing import Any

import torch

from vla_rl.algorithms.advantages import ADVANTAGE_ESTIMATORS
from vla_rl.algorithms.kl import kl_penalty, make_kl_controller
from vla_rl.algorithms.rewards import outcome_to_token_rewards
from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.trainers.actor import loss_actions
from vla_rl.utils.collectives import all_reduce
from vla_rl.workers.metrics import mean
from vla_rl.workers.resources import register_resource
from vla_rl_core import keys

logger = logging.getLogger(__name__)


class KLCoefficientCheckpoint:
    """The adaptive KL-in-reward coefficient, kept in the checkpoint's metadata (``kl_coef``)."""

    def save(self, res, directory) -> dict[str, Any]:
        return {"kl_coef": res.kl_ctrl.value}

    def load(self, res, directory, metadata: dict[str, Any]) -> None:
        if res.config.algorithm.kl_ctrl.type == "adaptive":  # a fixed coefficient never moves
            res.kl_ctrl.value = metadata["kl_coef"]


@register_resource("kl_ctrl", checkpoint=KLCoefficientCheckpoint())
def build_kl_controller(res):
    """The KL-in-reward coefficient controller of ``algorithm.kl_ctrl``."""
    return make_kl_controller(res.config.algorithm.kl_ctrl)


def _advantage_reads(config, node_config) -> tuple[str, ...]:
    algo = config.algorithm
    reads = (keys.RESPONSE_MASK, keys.REWARDS, keys.UID,
             *ADVANTAGE_ESTIMATORS.traits(algo.adv_estimator).reads)
    return (*reads, keys.OLD_LOG_PROBS, keys.REF_LOG_PROBS) if algo.use_kl_in_reward else reads


def _groups_of_two(config, node_config, dp_size: int, world_size: int):
    """A group-relative estimator compares each sample with its group: a group of one gets advantage 0."""
    estimator = config.algorithm.adv_estimator
    if ADVANTAGE_ESTIMATORS.traits(estimator).groups and config.data.group_size < 2:
        return "data.group_size", (f"advantage estimator {estimator!r} compares the samples of a group, so data.group_size "
                                   f"must be at least 2 (got {config.data.group_size}: every advantage would be 0 and "
                                   "nothing would train)")
    return None


SEQUENCE_ADVANTAGE_LOSSES = ("gspo",)
"""Policy losses that take one advantage per sequence (``A_i``: GSPO's sequence-level objective)."""


def advantages_vary_within_rows(config) -> bool | None:
    """Whether ``config``'s advantage estimator, with its settings, gives the steps of a row
    different advantages, as the advantage node calls it: each row's outcome reward on its last
    step and, with ``algorithm.use_kl_in_reward``, a penalty at every step. Computed on a small
    made-up batch (2 groups of 2 rows of 5 steps, one row shorter, per-step values for estimators
    that read them), so that any estimator, a plug-in's too, is judged by what it computes.
    ``None`` (cannot tell) where the estimator raises on that batch: a plug-in may need more than it has."""
    algo = config.algorithm
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[3, 3:] = False
    rewards = outcome_to_token_rewards(torch.tensor([1.0, 0.0, 0.25, 2.0], dtype=torch.float64), mask)
    if algo.use_kl_in_reward:
        rewards = rewards - 0.01 * torch.arange(1, 6, dtype=torch.float64)
    reads_values = keys.VALUES in ADVANTAGE_ESTIMATORS.traits(algo.adv_estimator).reads
    values = torch.linspace(-0.3, 0.4, 20, dtype=torch.float64).reshape(4, 5) if reads_values else None
    try:
        advantages, _ = ADVANTAGE_ESTIMATORS.get(algo.adv_estimator)(
            rewards, mask, torch.tensor([0, 0, 1, 1]), algo.options("adv_estimator"), values=values)
    except Exception as error:  # noqa: BLE001 - a plug-in's own failure is its to report in the run
        logger.warning("cannot tell whether advantage estimator %r gives each step its own advantage (it raised "
                       "%s on a made-up batch of 4 rows); %r's one-advantage-per-sequence check is left to the "
                       "actor", algo.adv_estimator, type(error).__name__, algo.policy_loss)
        return None
    advantages = advantages.double()
    row_means = torch.where(mask, advantages, 0.0).sum(-1) / mask.sum(-1)
    spread = (advantages - row_means[:, None]).abs() > 1e-9 * (1.0 + row_means.abs()[:, None])
    return bool(spread[mask].any())


def _sequence_loss_gets_one_advantage_per_row(config, node_config, dp_size: int, world_size: int):
    """GSPO's sequence-level loss refused advantages that vary along a row in the actor's first
    update, with a Ray traceback, after the warm start and a rollout: refused when the plan is made."""
    algo = config.algorithm
    if algo.policy_loss not in SEQUENCE_ADVANTAGE_LOSSES or not advantages_vary_within_rows(config):
        return None
    kl = " with algorithm.use_kl_in_reward (a penalty at every step)" if algo.use_kl_in_reward else ""
    return "algorithm.policy_loss", (
        f"{algo.policy_loss!r} takes one advantage per sequence, and advantage estimator {algo.adv_estimator!r} "
        f"(algorithm.adv_estimator){kl} gives each step its own; use policy_loss '{algo.policy_loss}_token', or an "
        "outcome estimator (grpo, rloo, reinforce_plus_plus_baseline)")


def _advantage_checks(config, node_config, dp_size: int, world_size: int):
    return (_groups_of_two(config, node_config, dp_size, world_size)
            or _sequence_loss_gets_one_advantage_per_row(config, node_config, dp_size, world_size))


@register_node("advantage", "compute", reads=_advantage_reads, check=_advantage_checks,
               writes=(keys.TOKEN_LEVEL_REWARDS, keys.ADVANTAGES, keys.RETURNS),
               resources=lambda config, node_config: ("kl_ctrl",) if config.algorithm.use_kl_in_reward else ())
def compute_advantages(ctx, batch) -> NodeOutput:
    """Set ``token_level_rewards``, ``advantages`` and ``returns``, each ``(n, T)``.

    Each episode's reward sits on its last decision step; with ``algorithm.use_kl_in_reward``
    every step also pays ``beta * KL`` between the rollout policy and the reference (needs
    ``ref_log_probs``). Group estimators group by ``uid`` (groups are never split across DP
    shards); ``gae`` reads the critic's ``values``; estimators that whiten over the batch get
    the statistics of every shard (:func:`shard_reduce`), so the node may run at any DP size.
    """
    algo = ctx.config.algorithm
    mask = batch[keys.RESPONSE_MASK]  # (n, T)
    token_level_rewards = outcome_to_token_rewards(batch[keys.REWARDS], mask)  # (n, T)
    metrics: dict[str, float] = {}
    if algo.use_kl_in_reward:
        penalty, metrics = kl_reward_penalty(ctx, batch)
        token_level_rewards = token_level_rewards - penalty
    estimator = ADVANTAGE_ESTIMATORS.get(algo.adv_estimator)
    values = batch.get(keys.VALUES, None)
    extra = {}
    if ADVANTAGE_ESTIMATORS.traits(algo.adv_estimator).batch_statistics and ctx.dp_size > 1:
        extra["reduce"] = shard_reduce(ctx)  # batch-wide statistics over every shard of the step
    advantages, returns = estimator(token_level_rewards, mask, batch[keys.UID], algo.options("adv_estimator"),
                                    values=values, **extra)
    batch.set(keys.TOKEN_LEVEL_REWARDS, token_level_rewards.float())
    batch.set(keys.ADVANTAGES, advantages.float())
    batch.set(keys.RETURNS, returns.float())
    valid = int(mask.sum())
    metrics["advantage/abs_mean"] = mean(advantages.abs().sum() / max(valid, 1), valid)  # over decision steps
    return NodeOutput(batch, metrics)


def shard_reduce(ctx):
    """A :data:`~vla_rl.algorithms.advantages.ShardReduce` over the node's DP shards: all-reduces
    over the workers (replicated shards count once in sums)."""
    def reduce(values: torch.Tensor, op: str) -> torch.Tensor:
        values = values.detach().to(torch.float64).cpu().clone()
        all_reduce(values, op, ctx.group, tag="advantage_statistics")
        return values / ctx.replicas if op == "sum" else values

    return reduce


def kl_reward_penalty(ctx, batch) -> tuple[torch.Tensor, dict[str, float]]:
    """``beta * KL`` per decision step ``(n, T)`` and the metrics; updates the KL controller.

    The KL of a decision is the sum over its executed actions of the ``algorithm.kl_penalty``
    estimate of each action (its log-probability, summed over dimensions, under the rollout policy
    and the reference: the rollout keeps no finer one), the chain rule's KL of the chunk; one
    estimate of the whole chunk's log-ratio would saturate k3's clamp (verl's, sized for one
    token) long before the chunk's KL is large. As verl's ``apply_kl_penalty``, the controller then sees
    the batch's mean over episodes of each episode's mean KL; the means are all-reduced over
    the workers (replicated shards count once: their repeats cancel in the ratio).
    """
    algo = ctx.config.algorithm
    mask = batch[keys.RESPONSE_MASK]  # (n, T)
    old = batch[keys.OLD_LOG_PROBS]  # (n, T, C)
    ref = batch[keys.REF_LOG_PROBS].sum(dim=-1)  # (n, T, C), summed as the rollout sums its own
    kl = kl_penalty(old, ref, algo.kl_penalty, loss_actions(batch, old.shape[2])).sum(dim=-1)  # (n, T)
    controller = ctx.resources.kl_ctrl
    beta = controller.value
    episode_kl = kl.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)  # (n,)
    totals = torch.tensor([float(episode_kl.sum()), float(len(episode_kl))], dtype=torch.float64)
    all_reduce(totals, group=ctx.group, tag="kl_controller")
    current_kl = float(totals[0] / totals[1].clamp(min=1))
    controller.update(current_kl, n_steps=round(float(totals[1]) / ctx.replicas))
    return beta * kl, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
