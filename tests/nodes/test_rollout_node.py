"""The rollout node with episodes lost to simulator faults: they leave their group without being
scored as failures, the rest of the group keeps its ids, and the loss is counted."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from devices import device_under_test
from tensordict import TensorDict

from policies import make_policy
from policies.mlp import MLPPolicyConfig
from vla_rl.config import RunConfig
from vla_rl.nodes.advantage import compute_advantages
from vla_rl.nodes.reward import compute_rewards
from vla_rl.nodes.rollout import RolloutNodeConfig, interact
from vla_rl.workers.context import NodeContext
from vla_rl.workers.metrics import Metric
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec

OBS_DIM, ACT_DIM = 3, 2


class LosingPool:
    """Environment ``i`` succeeds at its first step if ``succeeds[i]``, else times out after 2
    steps; the episodes of ``lost`` are lost in their first chunk."""

    num_actors = 2

    def __init__(self, succeeds: list[bool], lost: set[int]) -> None:
        self.succeeds, self.lost = np.asarray(succeeds), lost

    def spec(self):
        return EnvSpec(obs_dim=OBS_DIM, action_dim=ACT_DIM, horizon=2)

    def reset(self, ids):
        self.steps = np.zeros(len(ids), dtype=np.int64)
        return np.zeros((len(ids), OBS_DIM), dtype=np.float32)

    def submit(self, env_indices, actions, render_indices=()):
        return np.asarray(env_indices)

    def collect(self, rows):
        self.steps[rows] += 1
        success = self.succeeds[rows] & (self.steps[rows] == 1)
        truncated = ~success & (self.steps[rows] >= 2)
        k = len(rows)
        return {"obs": np.ones((k, OBS_DIM), dtype=np.float32), "reward": success.astype(np.float32),
                "terminated": success, "truncated": truncated, "success": success,
                "steps": np.ones(k, dtype=np.int64), "lost": np.isin(rows, list(self.lost)), "frames": {},
                "sim_seconds": 0.25, "sim_cpu_seconds": 0.125}


class Resources:
    def __init__(self, pool) -> None:
        torch.manual_seed(0)
        self.policy = make_policy("mlp", MLPPolicyConfig(obs_dim=OBS_DIM, action_dim=ACT_DIM,
                                                          hidden_sizes=(4,))).to(device_under_test())
        self.simulator_pool = pool
        self.generator = torch.Generator().manual_seed(0)
        self.config = RunConfig()  # a worker's resources hold the run's config and device
        self.device = self.policy.device


@pytest.mark.parametrize("stages", [1, 2])
def test_a_lost_episode_leaves_its_group_without_counting_as_a_failure(process_group, stages):
    config = RunConfig.model_validate({
        "data": {"group_size": 3},
        "simulator": {"pipeline_stages": stages},
        "algorithm": {"reward": "success", "adv_estimator": "grpo"},
    })
    # Group 0 (uid 10): success, lost, failure. Group 1 (uid 11): success, failure, failure.
    resources = Resources(LosingPool([True, True, False, True, False, False], lost={1}))
    tasks = TensorDict({keys.INIT_STATE_ID: torch.tensor([5, 6]), keys.TASK_ID: torch.tensor([0, 1]),
                        keys.UID: torch.tensor([10, 11])}, batch_size=[2])

    def ctx(node_id, node_config=None):
        return NodeContext(node_id, 0, 0, 1, 0, 1, config, node_config, resources)

    out = interact(ctx("rollout", RolloutNodeConfig()), tasks)
    episodes = out.batch
    metrics = {name: m.value if isinstance(m, Metric) else m for name, m in out.metrics.items()}
    assert episodes[keys.UID].tolist() == [10, 10, 11, 11, 11]
    assert episodes[keys.TASK_ID].tolist() == [0, 0, 1, 1, 1]
    assert episodes[keys.INIT_STATE_ID].tolist() == [5, 5, 6, 6, 6]
    assert episodes[keys.SUCCESS].tolist() == [True, False, True, False, False]
    assert metrics["rollout/lost_episodes"] == 1 and out.metrics["rollout/lost_episodes"].rule == "sum"
    assert metrics["rollout/lost_fraction"] == pytest.approx(1 / 6)
    assert metrics["rollout/success_rate"] == pytest.approx(2 / 5)
    assert out.metrics["rollout/success_rate"].weight == 5  # a mean over the episodes kept
    assert metrics["rollout/env_steps"] == 5 + 3  # first steps (not the lost chunk's), then the 3 failures' second
    assert metrics["rollout/sim_seconds_per_actor"] > 0
    # means over the episodes requested (6: the lost one's steps count) or kept (5), or the groups (2)
    assert metrics["rollout/env_steps_per_episode"] == pytest.approx(8 / 6) and out.metrics[
        "rollout/env_steps_per_episode"].weight == 6 and out.metrics["rollout/lost_fraction"].weight == 6
    assert episodes[keys.FINISH_STEP].tolist() == [1, 2, 1, 2, 2]
    assert metrics["rollout/episode_length"] == pytest.approx(8 / 5)
    assert out.metrics["rollout/episode_length"].weight == 5
    assert metrics["rollout/group_success_any"] == 1.0 and out.metrics["rollout/group_success_any"].weight == 2
    advantages = compute_advantages(ctx("advantage"), compute_rewards(ctx("reward"), episodes).batch).batch
    first = advantages[keys.ADVANTAGES][:, 0]
    # GRPO over the episodes each group has: group 0 is {1, 0} (not {1, 0, 0}: the lost one is
    # no failure): (r - mean) / (std with ddof 1 + 1e-6).
    for rows, rewards in (([0, 1], [1.0, 0.0]), ([2, 3, 4], [1.0, 0.0, 0.0])):
        r = np.array(rewards)
        expected = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
        np.testing.assert_allclose(first[rows].numpy(), expected, rtol=1e-5)


class TaskSetPool(LosingPool):
    """A LosingPool hosting a task set: resets take task ids and observations carry them."""

    def reset(self, ids, task_ids=None):
        assert task_ids is not None, "a task set's rollout resets each environment into its task"
        self.steps, self.task_ids = np.zeros(len(ids), dtype=np.int64), np.asarray(task_ids)
        return {keys.OBS_STATE: np.zeros((len(ids), OBS_DIM), dtype=np.float32), keys.OBS_TASK_ID: self.task_ids}

    def collect(self, rows):
        out = super().collect(rows)
        out["obs"] = {keys.OBS_STATE: out["obs"], keys.OBS_TASK_ID: self.task_ids[rows]}
        return out


def test_a_task_set_rollout_resets_into_each_task_and_reports_each(process_group):
    config = RunConfig.model_validate({
        "simulator": {"name": "metaworld", "tasks": ["reach-v3", "push-v3"], "env": {"horizon": 2}},
        "data": {"group_size": 2, "init_states_per_step": 2},
    })
    resources = Resources(TaskSetPool([True, True, True, False], lost=set()))
    torch.manual_seed(0)
    resources.policy = make_policy("mlp", MLPPolicyConfig(obs_dim=OBS_DIM, action_dim=ACT_DIM, hidden_sizes=(4,),
                                                          num_tasks=2)).to(device_under_test())
    tasks = TensorDict({keys.INIT_STATE_ID: torch.tensor([5, 5]), keys.TASK_ID: torch.tensor([0, 1]),
                        keys.UID: torch.tensor([0, 1])}, batch_size=[2])
    out = interact(NodeContext("rollout", 0, 0, 1, 0, 1, config, RolloutNodeConfig(), resources), tasks)
    assert resources.simulator_pool.task_ids.tolist() == [0, 0, 1, 1]
    assert out.batch[keys.OBS][keys.OBS_TASK_ID][:, 0].tolist() == [0, 0, 1, 1]
    metrics = out.metrics
    assert metrics["rollout/success_rate/reach-v3"].value == 1.0 and metrics["rollout/success_rate/reach-v3"].weight == 2
    assert metrics["rollout/success_rate/push-v3"].value == 0.5
    assert metrics["rollout/episode_length/push-v3"].value == 1.5 and metrics["rollout/success_rate"].value == 0.75
