"""``(filter, compute)``: drop the groups that carry no learning signal, with the filters of
:mod:`vla_rl.algorithms.group_filters` that ``algorithm.filter_groups.zero_variance`` and
``algorithm.filter_groups.success_rate_band`` enable.

- ``default``: one pass over the node's shard.
- ``dynamic_sampling``: DAPO's dynamic sampling (Yu et al. 2025, §3.2): filter, and while fewer
  than the step's groups (the workflow's ``groups_per_step``: ``data.init_states_per_step``,
  text ``text.prompts_per_step``) are kept over all workers, every worker re-runs the template's
  own nodes upstream of the filter for another round — its data node loads a fresh shard of
  initial states (text: fresh prompts of its own rows), its rollout and reward nodes run on
  them — up to ``algorithm.filter_groups.max_refill_rounds`` rounds. Only the kept-group counts cross the
  workers (all-reduce / all-gather); batch data never leaves its worker.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from vla_rl.algorithms.group_filters import keep_groups
from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.utils.collectives import all_gather_small_objects, all_reduce
from vla_rl.workers.metrics import Metric, same, total
from vla_rl_core import keys

FILTER_READS = (keys.REWARDS, keys.SUCCESS, keys.UID)
#: The run settings only the group filters read (dynamic sampling also its refill rounds).
FILTER_SETTINGS = tuple(f"algorithm.filter_groups.{name}" for name in ("zero_variance", "metric", "success_rate_band"))


def _keep_mask(algo, batch: TensorDict) -> torch.Tensor:
    """(n,) bool: the samples of the groups the enabled filters keep."""
    filters = algo.filter_groups
    return keep_groups(batch[keys.REWARDS], batch[keys.SUCCESS], batch[keys.UID], filters.zero_variance,
                       filters.success_rate_band, filters.metric)


def _num_groups(batch: TensorDict) -> int:
    return int(torch.unique(batch[keys.UID]).numel())


def _groups_have_variance(config, node_config, dp_size: int, world_size: int):
    """The zero-variance filter compares a group's samples: a group of one has nothing to compare."""
    if config.algorithm.filter_groups.zero_variance and config.data.group_size < 2:
        return "algorithm.filter_groups.zero_variance", (
            f"data.group_size is {config.data.group_size}: every group holds one sample, whose values are all "
            "equal, so the zero-variance filter would drop every group and nothing would train; set "
            "algorithm.filter_groups.zero_variance=false or data.group_size of 2 or more")
    return None


@register_node("filter", "compute", reads=FILTER_READS, check=_groups_have_variance, settings=FILTER_SETTINGS)
def filter_groups(ctx, batch) -> NodeOutput:
    """Keep the groups that carry signal.

    - ``algorithm.filter_groups.zero_variance``: drop groups whose rewards (or, with
      ``algorithm.filter_groups.metric: success``, successes) are all equal (with equal rewards
      their GRPO advantage is 0 and they would only dilute a per-episode mean);
    - ``algorithm.filter_groups.success_rate_band = [low, high]``: keep only groups whose success
      rate lies in the band.
    """
    algo = ctx.config.algorithm
    kept = batch[_keep_mask(algo, batch)] if algo.filter_groups.enabled and len(batch) else batch
    return NodeOutput(kept, {"filter/kept_fraction": len(kept) / len(batch) if len(batch) else 1.0,
                             "filter/kept_groups": total(_num_groups(kept) if len(kept) else 0)})


def _all_reduce(values: list[float], group) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    all_reduce(tensor, group=group, tag="dynamic_sampling")
    return tensor.tolist()


def _first_groups(batch: TensorDict, count: int) -> TensorDict:
    """The samples of the first ``count`` groups of ``batch`` (in order of appearance)."""
    uids = batch[keys.UID]
    _, first_seen = torch.unique_consecutive(uids, return_counts=True)
    return batch[: int(first_seen[:count].sum())]


def _rollout_total(metrics: dict, name: str) -> float:
    """This worker's ``name`` (``rollout/env_steps``, ``rollout/lost_episodes``) in a re-run's
    metrics (its rollout node's; 0 in a text run's)."""
    value = metrics.get(name, 0.0)
    return value.value if isinstance(value, Metric) else float(value)


def _refills_its_own_shard(config, node_config, dp_size: int, world_size: int):
    problem = _groups_have_variance(config, node_config, dp_size, world_size)
    if problem is not None:
        return problem
    algo = config.algorithm
    if dp_size != world_size:
        return "dp_size", (f"dynamic sampling runs on every worker (each refills its own shard): dp_size {dp_size} != "
                           f"workers.num_workers ({world_size}); remove its dp_size")
    if not algo.filter_groups.enabled:
        return "fn", ("dynamic sampling needs a group filter: set algorithm.filter_groups.zero_variance or "
                      "algorithm.filter_groups.success_rate_band")
    return None


@register_node("filter", "compute", name="dynamic_sampling", reads=FILTER_READS, check=_refills_its_own_shard,
               settings=(*FILTER_SETTINGS, "algorithm.filter_groups.max_refill_rounds"))
def dynamic_sampling(ctx, batch) -> NodeOutput:
    """Filter groups, refilling from new initial states until the step's batch is full.

    Every worker keeps the groups of its shard that the enabled filters accept; the kept counts
    are all-reduced; while the total is below the workflow's groups per step and fewer than
    ``algorithm.filter_groups.max_refill_rounds`` extra rounds ran, every worker re-runs the nodes upstream of
    this one for a refill round (``ctx.rerun_upstream``: fresh initial states or prompts of its
    own shard, rolled out and scored by the template's own rollout and reward nodes) and filters
    them. Surplus groups are dropped so that exactly the step's groups remain over all workers
    (lowest ranks first); after the last round the batch may hold fewer.

    Runs at the world size's DP size (each worker refills its own shard) with a filter enabled;
    the planner checks both.
    """
    algo = ctx.config.algorithm
    groups_per_step = ctx.resources.workflow.groups_per_step(ctx.config)
    kept = [batch[_keep_mask(algo, batch)]]
    generated, samples, refill_env_steps, refill_lost, rounds = _num_groups(batch), len(batch), 0.0, 0.0, 0
    while True:
        total_kept = _all_reduce([float(sum(_num_groups(part) for part in kept))], ctx.group)[0]
        if total_kept >= groups_per_step or rounds == algo.filter_groups.max_refill_rounds:
            break
        rounds += 1
        episodes, rerun_metrics = ctx.rerun_upstream(rounds)
        kept.append(episodes[_keep_mask(algo, episodes)])
        generated += _num_groups(episodes)
        samples += len(episodes)
        refill_env_steps += _rollout_total(rerun_metrics, "rollout/env_steps")
        refill_lost += _rollout_total(rerun_metrics, "rollout/lost_episodes")
    merged = torch.cat(kept)
    counts = all_gather_small_objects(_num_groups(merged), ctx.group, tag="dynamic_sampling")
    quota = max(0, groups_per_step - sum(counts[: ctx.rank]))
    merged = _first_groups(merged, quota)
    kept_samples = float(sum(len(part) for part in kept))
    samples_total, kept_total, env_steps_total, lost_total = _all_reduce(
        [float(samples), kept_samples, refill_env_steps, refill_lost], ctx.group)
    metrics = {  # all-reduced above: the same on every worker
        "filter/refill_rounds": same(rounds),
        "filter/kept_fraction": same(kept_total / samples_total if samples_total else 1.0),  # as the plain filter's
        "filter/kept_groups": same(min(total_kept, float(groups_per_step))),
    }
    if ctx.config.run.workflow == "embodied":  # a text run simulates nothing
        metrics["filter/refill_env_steps"] = same(env_steps_total)
        metrics["filter/refill_lost_episodes"] = same(lost_total)
    return NodeOutput(merged, metrics)
