"""The nodes of ``dag_templates/eval_rollout.yaml`` (``vla-rl eval``); the evaluation state lives in
the worker's :class:`~vla_rl.evaluation.session.EvaluationSession`:

- ``(data, data_load, eval_episodes)``: this shard's next (task, checkpoint, protocol) group of
  episodes not yet stored;
- ``(rollout, env_interact, evaluation)``: those episodes with the checkpoint's weights under the
  protocol, in the task's simulator pool;
- ``(evaluator, compute)``: appends them to this rank's zarr store, all-reduces the counts and,
  once no worker has episodes left, has rank 0 render the videos.

Only counts cross the workers; episodes stay in the stores of the worker that ran them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.data import keys


@register_node("data", "data_load", name="eval_episodes")
def load_eval_episodes(ctx, batch) -> NodeOutput:
    """Returns ``init_state_id``, ``task_id``, ``checkpoint_index``, ``protocol_index``, each ``(k,)``
    int64; ``k = 0`` once this shard's episodes are all stored."""
    return NodeOutput(ctx.resources.evaluation.next_batch(ctx.dp_rank, ctx.dp_size), {})


@register_node("rollout", "env_interact", name="evaluation")
def rollout_eval_episodes(ctx, batch) -> NodeOutput:
    """Roll out the group of ``batch``; returns the episodes (rollout keys, ``truncated``, and the
    input keys) except those lost to a simulator fault (a later step redoes them), or the empty
    batch unchanged."""
    if len(batch) == 0:
        return NodeOutput(batch, {})
    episodes, env_steps = ctx.resources.evaluation.rollout(batch)
    metrics = {"eval/lost_fraction": (len(batch) - len(episodes)) / len(batch)}
    if len(episodes):
        metrics["eval/env_steps_per_episode"] = env_steps / len(episodes)
        metrics["eval/episode_length"] = float(episodes[keys.FINISH_STEP].float().mean())
    return NodeOutput(episodes, metrics)


@register_node("evaluator", "compute")
def record_eval_episodes(ctx, batch) -> NodeOutput:
    """Store the episodes (crash-safe, one commit per episode); all-reduce the episodes recorded,
    their successes and the episodes still missing over the workers.

    Metrics (identical on all workers): ``eval/recorded``, ``eval/recorded_successes`` and
    ``eval/remaining`` (sums over workers). They are weighted by the batch sizes like any node
    metric, so a step in which no worker had an episode reports none of them (then nothing remains).
    """
    session = ctx.resources.evaluation
    successes = session.record(batch)
    totals = torch.tensor([float(len(batch)), float(successes), float(session.remaining())], dtype=torch.float64)
    dist.all_reduce(totals, group=ctx.group)
    recorded, recorded_successes, remaining = totals.tolist()
    if remaining == 0 and ctx.rank == 0 and ctx.config.eval.video_episodes > 0:
        session.write_videos()
    return NodeOutput(None, {"eval/recorded": recorded, "eval/recorded_successes": recorded_successes,
                             "eval/remaining": remaining})
