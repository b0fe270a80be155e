"""``(rollout, env_interact)``: roll out each initial state ``group_size`` times in the worker's
simulator pool with the current policy."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from tensordict import TensorDict

from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.data import keys
from vla_rl.rollout.embodied import RolloutResult, rollout_episodes


class RolloutNodeConfig(BaseModel):
    """Per-node settings of the embodied rollout."""

    model_config = ConfigDict(extra="forbid")
    greedy: bool = Field(False, description="Act with the policy's mode instead of sampling.")


@register_node("rollout", "env_interact", config=RolloutNodeConfig)
def interact(ctx, batch) -> NodeOutput:
    """Expand each initial state into a group of ``data.group_size`` episodes and run them.

    Args:
        batch: ``init_state_id``, ``task_id``, ``uid``, each ``(g,)``.

    Returns:
        ``(g * group_size,)`` episodes (groups contiguous) with the rollout keys of
        :func:`vla_rl.rollout.embodied.rollout_episodes` plus ``uid`` and ``task_id``.
    """
    episodes, result = rollout_groups(ctx.resources, ctx.config.data.group_size, batch, ctx.node_config.greedy)
    metrics = {
        "rollout/success_rate": float(episodes[keys.SUCCESS].float().mean()),
        "rollout/episode_length": float(episodes[keys.FINISH_STEP].float().mean()),
        "rollout/env_steps_per_episode": result.env_steps / max(len(episodes), 1),
        "timing/rollout_policy": result.policy_seconds,
        "timing/rollout_env": result.env_seconds,
        "rollout/group_success_any": float(
            np.mean([episodes[keys.SUCCESS][episodes[keys.UID] == u].any().item() for u in batch[keys.UID]])
        ),
    }
    return NodeOutput(episodes, metrics)


def rollout_groups(resources, group_size: int, tasks: TensorDict, greedy: bool) -> tuple[TensorDict, RolloutResult]:
    """Run ``group_size`` episodes from each initial state of ``tasks`` in the worker's pool.

    Args:
        resources: the worker's :class:`~vla_rl.workers.resources.WorkerResources` (policy,
            simulator pool, generator).
        group_size: episodes per initial state.
        tasks: ``init_state_id``, ``task_id``, ``uid``, each ``(g,)``.
        greedy: act with the policy's mode.

    Returns:
        ``(episodes, result)``: ``(g * group_size,)`` episodes, groups contiguous, with ``uid``
        and ``task_id``; and the rollout's :class:`~vla_rl.rollout.embodied.RolloutResult`
        (``env_steps``: control steps executed; time in the policy and in the simulators).
    """
    repeated = tasks.repeat_interleave(group_size, dim=0)
    result = rollout_episodes(
        resources.policy,
        resources.simulator_pool,
        repeated[keys.INIT_STATE_ID].numpy(),
        greedy=greedy,
        generator=resources.generator,
    )
    episodes = result.batch
    episodes.set(keys.UID, repeated[keys.UID])
    episodes.set(keys.TASK_ID, repeated[keys.TASK_ID])
    return episodes, result
