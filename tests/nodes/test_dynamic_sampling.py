"""DAPO dynamic sampling as a DAG node: filtering, refill rounds of fresh initial states, quota."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from devices import device_under_test

from policies import make_policy
from policies.mlp import MLPPolicyConfig
from vla_rl.config import RunConfig
from vla_rl.dag.registry import WORKFLOWS
from vla_rl.data.task_loader import ShardedTaskLoader
from vla_rl.nodes.group_filter import dynamic_sampling, filter_groups
from vla_rl.nodes.reward import episode_rewards
from vla_rl.nodes.rollout import rollout_groups
from vla_rl.workers.context import NodeContext
from vla_rl.workers.metrics import Metric, total
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec

OBS_DIM, ACT_DIM = 3, 2


class ParityPool:
    """Initial states with an even id always succeed at once (an all-equal group); odd ids
    succeed at the second step with probability 1/2, else time out after 4 steps."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def spec(self):
        return EnvSpec(obs_dim=OBS_DIM, action_dim=ACT_DIM, horizon=4)

    def reset(self, ids):
        ids = np.asarray(ids)
        self.success_at = np.where(ids % 2 == 0, 1, np.where(self.rng.random(len(ids)) < 0.5, 2, 0))
        self.steps = np.zeros(len(ids), dtype=np.int64)
        return np.zeros((len(ids), OBS_DIM), dtype=np.float32)

    def submit(self, env_indices, actions, render_indices=()):
        return np.asarray(env_indices)  # one action per chunk (the MLP policy)

    def collect(self, rows):
        self.steps[rows] += 1
        success = self.steps[rows] == self.success_at[rows]
        truncated = ~success & (self.steps[rows] >= 4)
        k = len(rows)
        return {"obs": np.ones((k, OBS_DIM), dtype=np.float32), "reward": success.astype(np.float32),
                "terminated": success, "truncated": truncated, "success": success,
                "steps": np.ones(k, dtype=np.int64), "lost": np.zeros(k, dtype=bool), "frames": {},
                "sim_seconds": 0.0, "sim_cpu_seconds": 0.0}


class AlternatingPool(ParityPool):
    """Every other environment succeeds at once, the rest time out: with a group's episodes side
    by side, every group holds a success and a failure."""

    def reset(self, ids):
        observations = super().reset(ids)
        self.success_at = np.where(np.arange(len(ids)) % 2 == 0, 1, 0)
        return observations


class Resources:
    def __init__(self, seed: int = 0, pool=ParityPool) -> None:
        torch.manual_seed(0)
        self.policy = make_policy("mlp", MLPPolicyConfig(obs_dim=OBS_DIM, action_dim=ACT_DIM,
                                                          hidden_sizes=(4,))).to(device_under_test())
        self.simulator_pool = pool(seed)
        self.generator = torch.Generator().manual_seed(0)
        self.workflow = WORKFLOWS.get("embodied")
        self.config = RunConfig()  # a worker's resources hold the run's config and device
        self.device = self.policy.device


def step_batch(max_refill_rounds: int, seed: int = 0, pool=ParityPool):
    config = RunConfig.model_validate({
        "data": {"num_train_init_states": 1000, "init_states_per_step": 6, "group_size": 4},
        "algorithm": {"reward": "success", "filter_groups": {"zero_variance": True, "max_refill_rounds": max_refill_rounds}},
    })
    resources = Resources(seed, pool)
    loader = ShardedTaskLoader(1000, 6, dp_rank=0, dp_size=1, seed=0)

    def upstream(tasks):
        """What the data, rollout and reward nodes upstream of the filter do (the worker re-runs them)."""
        episodes, result = rollout_groups(resources, 4, tasks, greedy=False, pipeline_stages=1)
        episodes.set(keys.REWARDS, episode_rewards(config.algorithm, episodes)[0])
        return episodes, {"rollout/env_steps": total(result.env_steps),
                          "rollout/lost_episodes": total(result.lost.sum())}

    episodes, _ = upstream(loader.batch_for_step(0))
    refills = []  # each refill round's env steps, as the worker's re-run reports them

    def rerun(refill_round):
        refilled, metrics = upstream(loader.batch_for_refill(0, refill_round))
        refills.append(metrics["rollout/env_steps"].value)
        return refilled, metrics

    ctx = NodeContext("group_filter", 0, 0, 1, 0, 1, config, None, resources, rerun_upstream=rerun)
    out = dynamic_sampling(ctx, episodes)
    out.metrics = {name: m.value if isinstance(m, Metric) else m for name, m in out.metrics.items()}
    out.metrics["refills"] = refills
    return episodes, out


@pytest.mark.parametrize(("max_refill_rounds", "seed"), [(0, 0), (1, 0), (5, 0), (5, 3)])
def test_refills_until_full_keeping_only_varied_groups(process_group, max_refill_rounds, seed):
    first, out = step_batch(max_refill_rounds, seed)
    batch, metrics = out.batch, out.metrics
    uids = batch[keys.UID]
    groups = torch.unique(uids)
    assert len(groups) == metrics["filter/kept_groups"] <= 6
    for uid in groups:  # every kept group varies; groups stay whole and contiguous
        rewards = batch[keys.REWARDS][uids == uid]
        assert len(rewards) == 4 and rewards.max() > rewards.min()
    assert len(torch.unique_consecutive(uids)) == len(groups)
    rounds = metrics["filter/refill_rounds"]
    assert rounds <= max_refill_rounds
    assert (metrics["filter/refill_env_steps"] > 0) == (rounds > 0) and metrics["filter/refill_lost_episodes"] == 0
    generated = 6 * (1 + rounds)
    kept_before_quota = metrics["filter/kept_fraction"] * generated
    assert kept_before_quota == pytest.approx(round(kept_before_quota))
    if rounds < max_refill_rounds:
        assert len(groups) == 6  # it stopped because the batch was full
    assert len(metrics["refills"]) == rounds and metrics["filter/refill_env_steps"] == sum(metrics["refills"])
    if seed == 3:  # two refill rounds kept 8 groups: the surplus is dropped, whole groups
        assert rounds == 2 and kept_before_quota == 8 and len(groups) == 6
        assert min(metrics["refills"]) > 0  # both rounds' env steps are counted
    if max_refill_rounds == 0:
        assert torch.equal(batch[keys.UID], first[keys.UID][torch.isin(first[keys.UID], groups)])


def test_a_batch_full_after_filtering_runs_no_refill_round(process_group):
    """Exactly the step's groups kept (6 of 6, all varied): the batch is full, so no refill round
    runs although 5 are allowed."""
    first, out = step_batch(5, pool=AlternatingPool)
    uids = first[keys.UID]
    assert all(first[keys.REWARDS][uids == uid].max() > first[keys.REWARDS][uids == uid].min()
               for uid in torch.unique(uids))  # the case: every group of the first round is kept
    assert out.metrics["filter/refill_rounds"] == 0 and out.metrics["filter/refill_env_steps"] == 0
    assert out.metrics["filter/kept_groups"] == 6 and out.metrics["filter/kept_fraction"] == 1.0
    assert torch.equal(out.batch[keys.UID], uids)


def test_the_plain_filter_counts_the_groups_it_keeps(process_group):
    """``filter_groups`` reports the kept groups (summed over the workers) beside the kept fraction."""
    first, _ = step_batch(0)
    config = RunConfig.model_validate({"algorithm": {"reward": "success", "filter_groups": {"zero_variance": True}}})
    ctx = NodeContext("group_filter", 0, 0, 1, 0, 1, config, None, Resources())
    out = filter_groups(ctx, first)
    uids, rewards = first[keys.UID], first[keys.REWARDS]
    varied = [uid for uid in torch.unique(uids) if rewards[uids == uid].max() > rewards[uids == uid].min()]
    assert out.metrics["filter/kept_groups"] == total(len(varied))
    assert out.metrics["filter/kept_fraction"] == pytest.approx(4 * len(varied) / len(first))
    assert 0 < len(varied) < 6  # the case tests something: some groups dropped, some kept


@pytest.mark.parametrize("metric", ["rewards", "success"])
def test_the_filter_node_compares_the_configured_metric(process_group, metric):
    """With shaped rewards (an episode's reward is not its success) the node drops the groups
    whose ``algorithm.filter_groups.metric`` is all equal: under ``success`` every kept group
    holds a success and a failure, under ``rewards`` all-failed groups of varied rewards stay."""
    first, _ = step_batch(0)
    shaped = first.clone()
    shaped.set(keys.REWARDS, shaped[keys.SUCCESS].float() - 0.01 * torch.arange(len(shaped)))  # all distinct
    config = RunConfig.model_validate({"algorithm": {"reward": "success",
                                                     "filter_groups": {"zero_variance": True, "metric": metric}}})
    out = filter_groups(NodeContext("group_filter", 0, 0, 1, 0, 1, config, None, Resources()), shaped)
    uids, success = shaped[keys.UID], shaped[keys.SUCCESS]
    mixed = [uid for uid in torch.unique(uids) if 0 < int(success[uids == uid].sum()) < 4]
    expected = len(torch.unique(uids)) if metric == "rewards" else len(mixed)
    assert out.metrics["filter/kept_groups"] == total(expected)
    assert 0 < len(mixed) < len(torch.unique(uids))  # the case tells the metrics apart
