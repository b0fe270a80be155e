"""The nodes of the ``evaluate`` phase — the held-out evaluations of a training run and ``vla-rl
eval`` alike (``dag_templates/phases/*_evaluation.yaml``, ``dag_templates/eval_rollout.yaml``).
The evaluation state lives in the worker's ``evaluation`` resource, built by the run's workflow
(:mod:`vla_rl.evaluation.session`):

- ``(data, data_load, eval_episodes)``: this shard's next (task, target, protocol) group of items
  not done yet;
- ``(rollout, env_interact, evaluation)`` / ``(rollout, model_inference, evaluation)``: that
  group's episodes (simulated, or decoded responses) under its target and protocol;
- ``(evaluator, compute)``: marks them done (stores them where the evaluation stores), sums the
  per-group counts over the workers and, once no worker has items left, reports the figures and
  leaves the videos.

Only counts cross the workers; episodes stay with the worker that ran them.
"""

from __future__ import annotations

import torch

from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.utils.collectives import all_reduce
from vla_rl.workers.metrics import mean, same
from vla_rl_core import keys

GROUP_KEYS = (keys.TASK_ID, keys.CHECKPOINT_INDEX, keys.PROTOCOL_INDEX)


def _eval_item_keys(config, node_config) -> tuple[str, ...]:
    """What the evaluation's item batches hold: the group keys and the items' ids, initial states
    of an embodied run or prompt rows (``uid``) of a text run."""
    return (*GROUP_KEYS, keys.UID if config.run.workflow == "text" else keys.INIT_STATE_ID)


@register_node("data", "data_load", name="eval_episodes", writes=_eval_item_keys, resources=("evaluation",),
               phases=("evaluate",))
def load_eval_episodes(ctx, batch) -> NodeOutput:
    """Returns the item ids (``init_state_id``, or ``uid`` for prompt rows), ``task_id``,
    ``checkpoint_index`` (the target) and ``protocol_index``, each ``(k,)`` int64; ``k = 0`` once
    this shard's items are all done."""
    session = ctx.resources.evaluation
    session.begin(ctx.tag, ctx.step)
    return NodeOutput(session.next_batch(ctx.dp_rank, ctx.dp_size), {})


def rollout_eval_episodes(ctx, batch) -> NodeOutput:
    """Run the group of ``batch``; returns its episodes (``success``, ``finish_step``, the rollout
    keys and the input keys) except those lost to a simulator fault (a later step redoes them;
    the session counts them for ``eval/lost_episodes``), or the empty batch unchanged."""
    if len(batch) == 0:
        return NodeOutput(batch, {})
    session = ctx.resources.evaluation
    episodes, env_steps = session.rollout(batch)
    session.lost_here += len(batch) - len(episodes)
    metrics = {}
    if len(episodes):
        metrics["eval/episode_length"] = mean(episodes[keys.FINISH_STEP].float().mean(), len(episodes))
    if env_steps and len(episodes):  # simulated episodes, not all lost
        metrics["eval/env_steps_per_episode"] = mean(env_steps / len(episodes), len(episodes))
    return NodeOutput(episodes, metrics)


def _sampled_needs_action_distribution(config, node_config, dp_size: int, world_size: int):
    """The sampled protocol draws actions from the policy's distribution: a deterministic policy
    (e.g. OpenVLA-OFT's L1-regression head) is evaluated greedily only."""
    problem = config.policy.without_action_distribution()
    if problem is None or "sampled" not in config.eval.protocols:
        return None
    field, reason = problem
    return "eval.protocols", (f"the 'sampled' protocol draws actions from the policy's distribution, and {field} "
                              f"{reason}; set eval.protocols=[greedy]")


def _evaluated_tasks_exist(config):
    """``eval.benchmark`` and ``eval.tasks`` name tasks there are: an unknown one failed in the
    workers' first evaluation, a Ray traceback after the run directory, Ray and the simulators."""
    from vla_rl.evaluation.benchmarks import resolve_tasks
    from vla_rl_core.registry import RegistryError

    if config.eval.benchmark is None and config.eval.tasks is None:
        return None
    try:
        resolve_tasks(config)
    except RegistryError as err:
        return "eval.benchmark", str(err)
    except ValueError as err:  # the message starts with the field when it is not eval.benchmark's own
        message = str(err)
        return (message.split(" ", 1)[0] if message.startswith("eval.") else "eval.benchmark"), message
    return None


def _evaluation_checks(config, node_config, dp_size: int, world_size: int):
    return (_sampled_needs_action_distribution(config, node_config, dp_size, world_size)
            or _evaluated_tasks_exist(config))


register_node("rollout", "env_interact", name="evaluation", reads=GROUP_KEYS, writes=(keys.SUCCESS, keys.FINISH_STEP),
              resources=("evaluation",), check=_evaluation_checks, phases=("evaluate",))(rollout_eval_episodes)
register_node("rollout", "model_inference", name="evaluation", reads=GROUP_KEYS,
              writes=(keys.SUCCESS, keys.FINISH_STEP), resources=("evaluation",),
              phases=("evaluate",))(rollout_eval_episodes)


@register_node("evaluator", "compute", reads=(*GROUP_KEYS, keys.SUCCESS, keys.FINISH_STEP), resources=("evaluation",),
               phases=("evaluate",))
def record_eval_episodes(ctx, batch) -> NodeOutput:
    """Record the episodes; sum the per-group counts and the items still to do over the workers.

    Metrics (the same on every worker): ``eval/recorded``, ``eval/recorded_successes`` and
    ``eval/remaining`` (this step, all workers); once nothing remains, the evaluation's figures
    (:meth:`~vla_rl.evaluation.session.EvaluationSession.metrics`, with the episodes lost during
    it) and what finishing it reports (e.g. ``video/<tag>_successes``).
    """
    session = ctx.resources.evaluation
    counts = torch.as_tensor(session.record(batch), dtype=torch.float64)
    extra = torch.tensor([float(session.remaining()), float(session.lost_here)], dtype=torch.float64)
    session.lost_here = 0
    totals = torch.cat([counts.flatten(), extra]) / ctx.replicas  # replicated shards count once
    all_reduce(totals, group=ctx.group, tag="evaluation")
    totals = totals.round()  # whole counts: the replicas' shares sum to them up to float64 rounding
    step_counts = totals[:-2].reshape(counts.shape).numpy()
    session.add_counts(step_counts, lost=int(totals[-1]))
    remaining = float(totals[-2])
    metrics = {"eval/recorded": same(step_counts[..., 1].sum()), "eval/recorded_successes": same(step_counts[..., 0].sum()),
               "eval/remaining": same(remaining)}
    if remaining == 0:
        metrics.update({name: same(value) for name, value in session.metrics().items()})
        metrics.update(session.finish(ctx.video))
    return NodeOutput(None, metrics)
