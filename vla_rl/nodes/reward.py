"""``(reward, compute)``: the episode reward — binary success, or SRPO's progress reward that
scores failures by their trajectory embedding's distance to the batch's successes."""

from __future__ import annotations

from vla_rl.algorithms.rewards import EMBODIED_REWARDS
from vla_rl.algorithms.srpo import SRPORewardConfig
from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.data import keys
from vla_rl.rewards.trajectory_encoders import TRAJECTORY_ENCODERS


@register_node("reward", "compute")
def compute_rewards(ctx, batch) -> NodeOutput:
    """Set ``rewards`` ``(n,)`` float32 from ``algorithm.reward``.

    With SRPO the reference set is this node's shard: at DP size 1 (the default templates) it is
    every trajectory of the step, gathered worker to worker by the re-shard before this node.
    """
    algo = ctx.config.algorithm
    embeddings = None
    if algo.reward == "srpo":
        encoder = TRAJECTORY_ENCODERS.get(algo.trajectory_encoder)
        embeddings = encoder(batch[keys.OBS], batch[keys.FINISH_STEP] + 1, num_points=algo.encoder_points)
    reward_fn = EMBODIED_REWARDS.get(algo.reward)
    rewards = reward_fn(embeddings, batch[keys.SUCCESS], batch[keys.TASK_ID], SRPORewardConfig(**algo.srpo))
    batch.set(keys.REWARDS, rewards.float())
    failures = ~batch[keys.SUCCESS]
    metrics = {"reward/mean": float(rewards.mean())}
    if failures.any():
        metrics["reward/failure_mean"] = float(rewards[failures].mean())
    return NodeOutput(batch, metrics)
