"""``(filter, compute)``: drop the groups that carry no learning signal, with the filters of
:mod:`vla_rl.algorithms.group_filters` that ``algorithm.filter_zero_variance_groups`` and
``algorithm.success_rate_band`` enable.

- ``default``: one pass over the node's shard.
- ``dynamic_sampling``: DAPO's dynamic sampling (Yu et al. 2025, §3.2): filter, and while fewer
  than ``data.init_states_per_step`` groups (text: ``text.prompts_per_step``) are kept over all
  workers, every worker rolls out and scores another round of its own shard of new initial
  states (text: fresh prompts of its own rows), up to
  ``algorithm.max_refill_rounds`` rounds. Only the kept-group counts cross the workers
  (all-reduce / all-gather); batch data never leaves its worker.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from tensordict import TensorDict

from vla_rl.algorithms.group_filters import keep_groups
from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.data import keys
from vla_rl.data.task_loader import ShardedTaskLoader
from vla_rl.nodes.reward import episode_rewards, reward_encoder
from vla_rl.nodes.rollout import rollout_groups
from vla_rl.nodes.text import refill_groups as refill_text_groups


def _keep_mask(algo, batch: TensorDict) -> torch.Tensor:
    """(n,) bool: the samples of the groups the enabled filters keep."""
    return keep_groups(batch[keys.REWARDS], batch[keys.SUCCESS], batch[keys.UID],
                       algo.filter_zero_variance_groups, algo.success_rate_band)


def _filters_enabled(algo) -> bool:
    return algo.filter_zero_variance_groups or algo.success_rate_band is not None


def _num_groups(batch: TensorDict) -> int:
    return int(torch.unique(batch[keys.UID]).numel())


@register_node("filter", "compute")
def filter_groups(ctx, batch) -> NodeOutput:
    """Keep the groups that carry signal.

    - ``algorithm.filter_zero_variance_groups``: drop groups whose rewards are all equal (their
      GRPO advantage is 0 and they would only dilute a per-episode mean);
    - ``algorithm.success_rate_band = [low, high]``: keep only groups whose success rate lies in
      the band.
    """
    algo = ctx.config.algorithm
    if not _filters_enabled(algo) or len(batch) == 0:
        return NodeOutput(batch, {"filter/kept_fraction": 1.0})
    keep = _keep_mask(algo, batch)
    return NodeOutput(batch[keep], {"filter/kept_fraction": float(keep.float().mean())})


def _all_reduce(values: list[float], group) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, group=group)
    return tensor.tolist()


def _first_groups(batch: TensorDict, count: int) -> TensorDict:
    """The samples of the first ``count`` groups of ``batch`` (in order of appearance)."""
    uids = batch[keys.UID]
    _, first_seen = torch.unique_consecutive(uids, return_counts=True)
    return batch[: int(first_seen[:count].sum())]


def _refill_episodes(ctx, refill_round: int) -> tuple[TensorDict, int]:
    """Dynamic sampling's extra round for embodied runs: this worker's fresh initial states,
    rolled out and scored; returns the episodes and the control steps executed."""
    data = ctx.config.data
    loader = ShardedTaskLoader(data.num_train_init_states, data.init_states_per_step, ctx.dp_rank, ctx.dp_size,
                               seed=ctx.config.run.seed)
    tasks = loader.batch_for_refill(ctx.step, refill_round)
    episodes, result = rollout_groups(ctx.resources, data.group_size, tasks, greedy=False,
                                      pipeline_stages=ctx.config.simulator.pipeline_stages)
    episodes.set(keys.REWARDS, episode_rewards(ctx.config.algorithm, episodes, reward_encoder(ctx))[0])
    return episodes, result.env_steps


@register_node("filter", "compute", name="dynamic_sampling")
def dynamic_sampling(ctx, batch) -> NodeOutput:
    """Filter groups, refilling from new initial states until the step's batch is full.

    Every worker keeps the groups of its shard that the enabled filters accept; the kept counts
    are all-reduced; while the total is below ``data.init_states_per_step`` and fewer than
    ``algorithm.max_refill_rounds`` extra rounds ran, every worker rolls out its own shard of
    fresh initial states (:meth:`ShardedTaskLoader.batch_for_refill`), scores them with
    the reward node's function and filters them. Surplus groups are dropped so that exactly
    ``init_states_per_step`` groups remain over all workers (lowest ranks first); after the last
    round the batch may hold fewer.

    Must run at the world size's DP size (each worker refills its own shard) right after the
    reward node (the refilled episodes carry the rollout and reward keys only).

    Raises:
        ValueError: at another DP size, or with every filter disabled.
    """
    algo = ctx.config.algorithm
    if ctx.dp_size != ctx.world_size or not _filters_enabled(algo):
        raise ValueError(f"node {ctx.node_id!r}: dynamic sampling needs dp_size = world size ({ctx.world_size}, "
                         f"got {ctx.dp_size}) and algorithm.filter_zero_variance_groups or success_rate_band")
    text = ctx.config.run.workflow == "text"
    groups_per_step = ctx.config.text.prompts_per_step if text else ctx.config.data.init_states_per_step
    refill = refill_text_groups if text else _refill_episodes
    kept = [batch[_keep_mask(algo, batch)]]
    generated, refill_env_steps, rounds = _num_groups(batch), 0, 0
    while True:
        total_kept = _all_reduce([float(sum(_num_groups(part) for part in kept))], ctx.group)[0]
        if total_kept >= groups_per_step or rounds == algo.max_refill_rounds:
            break
        rounds += 1
        episodes, env_steps = refill(ctx, rounds)
        kept.append(episodes[_keep_mask(algo, episodes)])
        generated += _num_groups(episodes)
        refill_env_steps += env_steps
    merged = torch.cat(kept)
    counts: list = [None] * ctx.world_size
    dist.all_gather_object(counts, _num_groups(merged), group=ctx.group)
    quota = max(0, groups_per_step - sum(counts[: ctx.rank]))
    merged = _first_groups(merged, quota)
    generated_total, env_steps_total = _all_reduce([float(generated), float(refill_env_steps)], ctx.group)
    metrics = {
        "filter/refill_rounds": float(rounds),
        "filter/kept_fraction": total_kept / generated_total,
        "filter/kept_groups": min(total_kept, float(groups_per_step)),
        "filter/refill_env_steps": env_steps_total,
    }
    return NodeOutput(merged, metrics)
