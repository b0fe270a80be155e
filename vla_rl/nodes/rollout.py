"""``(rollout, env_interact)``: roll out each initial state ``group_size`` times in the worker's
simulator pool with the current policy."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from tensordict import TensorDict

from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.rollout.embodied import RolloutResult, rollout_episodes
from vla_rl.trainers.strategy import autocast
from vla_rl.workers.metrics import mean, total
from vla_rl_core import keys

logger = logging.getLogger(__name__)


class RolloutNodeConfig(BaseModel):
    """Per-node settings of the embodied rollout."""

    model_config = ConfigDict(extra="forbid")
    greedy: bool = Field(False, description="Act with the policy's mode instead of sampling.")


ROLLOUT_KEYS: tuple[str, ...] = (keys.OBS, keys.ACTIONS, keys.OLD_LOG_PROBS, keys.RESPONSE_MASK, keys.SUCCESS,
                                 keys.TRUNCATED, keys.FINISH_STEP, keys.CONTROL_STEPS)
"""The keys of a rollout's episodes (:func:`vla_rl.rollout.embodied.rollout_episodes`)."""


def _needs_action_distribution(config, node_config, dp_size: int, world_size: int):
    """The RL rollout writes each action's log-prob (``old_log_probs``), which the update's ratio
    and KL terms read: a policy without an action distribution has none."""
    problem = config.policy.without_action_distribution()
    if problem is None:
        return None
    field, reason = problem
    return field, (f"RL rollouts record the log-probs of their actions for the policy update, and {field} {reason}; "
                   "such a policy is evaluated (vla-rl eval, eval.protocols=[greedy]) or trained by behaviour cloning, "
                   "not by RL")


@register_node("rollout", "env_interact", config=RolloutNodeConfig, reads=(keys.INIT_STATE_ID, keys.TASK_ID, keys.UID),
               writes=ROLLOUT_KEYS, resources=("policy", "simulator_pool"), check=_needs_action_distribution)
def interact(ctx, batch) -> NodeOutput:
    """Expand each initial state into a group of ``data.group_size`` episodes and run them.

    Episodes lost to a simulator fault are dropped (see :func:`rollout_groups`).

    Args:
        batch: ``init_state_id``, ``task_id``, ``uid``, each ``(g,)``.

    Returns:
        Up to ``(g * group_size,)`` episodes (groups contiguous) with the rollout keys of
        :func:`vla_rl.rollout.embodied.rollout_episodes` plus ``uid`` and ``task_id``. Metrics
        include ``rollout/env_steps`` (control steps, all workers), ``rollout/lost_episodes``
        (all workers), ``rollout/lost_fraction``, ``rollout/sim_seconds_per_actor`` (wall time
        inside the environments' ``step``), ``rollout/sim_cpu_seconds_per_actor`` (CPU time used
        meanwhile) and ``rollout/sim_share`` (the first over the rollout's wall time); with a task
        set (``simulator.tasks``) also ``rollout/success_rate/<task>`` and
        ``rollout/episode_length/<task>`` (:func:`per_task_metrics`), the episodes reset into
        their ``task_id``.
    """
    started = time.perf_counter()
    sim = ctx.config.simulator
    episodes, result = rollout_groups(ctx.resources, ctx.config.data.group_size, batch, ctx.node_config.greedy,
                                      sim.pipeline_stages, task_set=sim.multi_task)
    wall = time.perf_counter() - started
    requested = len(result.lost)
    num_actors = ctx.resources.simulator_pool.num_actors
    metrics = {
        "rollout/env_steps": total(result.env_steps),
        "rollout/env_steps_per_episode": mean(result.env_steps / max(requested, 1), requested),
        "rollout/lost_episodes": total(result.lost.sum()),
        "rollout/lost_fraction": mean(result.lost.mean() if requested else 0.0, requested),
        "rollout/sim_seconds_per_actor": result.sim_seconds / num_actors,
        "rollout/sim_cpu_seconds_per_actor": result.sim_cpu_seconds / num_actors,
        "rollout/sim_share": result.sim_seconds / (num_actors * wall),
        "timing/rollout_policy": result.policy_seconds,
        "timing/rollout_env": result.env_seconds,
    }
    if len(episodes):
        metrics["rollout/success_rate"] = mean(episodes[keys.SUCCESS].float().mean(), len(episodes))
        metrics["rollout/episode_length"] = mean(episodes[keys.FINISH_STEP].float().mean(), len(episodes))
        groups = episodes[keys.UID].unique()
        metrics["rollout/group_success_any"] = mean(
            np.mean([episodes[keys.SUCCESS][episodes[keys.UID] == u].any().item() for u in groups]), len(groups))
        if sim.multi_task:
            metrics.update(per_task_metrics(episodes, sim.task_names()))
    return NodeOutput(episodes, metrics)


def per_task_metrics(episodes: TensorDict, task_names: list[str]) -> dict:
    """``rollout/success_rate/<task>`` and ``rollout/episode_length/<task>`` of the tasks that have
    episodes here, each a mean over its episodes (so the reduction over workers weighs them)."""
    metrics = {}
    for task in episodes[keys.TASK_ID].unique().tolist():
        mine = episodes[keys.TASK_ID] == task
        count = int(mine.sum())
        metrics[f"rollout/success_rate/{task_names[task]}"] = mean(episodes[keys.SUCCESS][mine].float().mean(), count)
        metrics[f"rollout/episode_length/{task_names[task]}"] = mean(
            episodes[keys.FINISH_STEP][mine].float().mean(), count)
    return metrics


def rollout_groups(resources, group_size: int, tasks: TensorDict, greedy: bool,
                   pipeline_stages: int, task_set: bool = False) -> tuple[TensorDict, RolloutResult]:
    """Run ``group_size`` episodes from each initial state of ``tasks`` in the worker's pool, the
    policy's forward passes in the trainer's autocast context
    (:func:`~vla_rl.trainers.strategy.autocast`: bfloat16 under DDP's mixed precision).

    An episode lost to a simulator fault is dropped from its group; the rest of the group is
    kept (group advantage estimators normalise over the episodes a group has, so a lost episode
    is never scored as a failure; a group left with one episode gets no advantage). A group
    whose episodes were all lost disappears. The loss is logged.

    Args:
        resources: the node's view of the worker's resources (policy, simulator pool, generator).
        group_size: episodes per initial state.
        tasks: ``init_state_id``, ``task_id``, ``uid``, each ``(g,)``.
        greedy: act with the policy's mode.
        pipeline_stages: see :func:`vla_rl.rollout.embodied.rollout_episodes`.
        task_set: the pool hosts a task set: each episode is reset into its ``task_id``.

    Returns:
        ``(episodes, result)``: up to ``(g * group_size,)`` episodes, groups contiguous, with
        ``uid`` and ``task_id``; and the rollout's :class:`~vla_rl.rollout.embodied.RolloutResult`
        (``env_steps``: control steps executed; ``lost`` over the ``g * group_size`` requested
        episodes; time in the policy and in the simulators).
    """
    repeated = tasks.repeat_interleave(group_size, dim=0)
    with autocast(resources.config.trainer, resources.device):  # the policy computes as in the trainer
        result = rollout_episodes(
            resources.policy,
            resources.simulator_pool,
            repeated[keys.INIT_STATE_ID].numpy(),
            task_ids=repeated[keys.TASK_ID].numpy() if task_set else None,
            greedy=greedy,
            generator=resources.generator,
            pipeline_stages=pipeline_stages,
        )
    kept = torch.as_tensor(~result.lost)
    episodes = result.batch
    episodes.set(keys.UID, repeated[keys.UID][kept])
    episodes.set(keys.TASK_ID, repeated[keys.TASK_ID][kept])
    if result.lost.any():
        logger.warning("rollout: %d of %d episodes lost to simulator faults (initial states %s); training "
                       "goes on without them", int(result.lost.sum()), len(result.lost),
                       repeated[keys.INIT_STATE_ID][~kept].tolist())
    return episodes, result
