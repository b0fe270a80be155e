"""A worker's evaluation through the registered nodes, in this process (Ray pools on loopback, a
one-process gloo group): an interrupted evaluation continues without redoing an episode, stored
actions replay to the stored outcome, and a checkpoint that does not fit a task is refused before
its rollout (the Stack task's 20 observation values; `vla-rl eval` skips such tasks beforehand:
tests/evaluation/test_eval_tasks.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vla_rl.checkpoints import files as checkpoint
from vla_rl.config import RunConfig
from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.evaluation.episode_store import episode_keys, task_dir
from vla_rl.evaluation.protocol import eval_protocols
from vla_rl.evaluation.replay import replay_episodes, rescore_store
from vla_rl.evaluation.report import summarize
from vla_rl.nodes.evaluation import (
    load_eval_episodes,
    record_eval_episodes,
    rollout_eval_episodes,
)
from vla_rl.workers.context import NodeContext
from vla_rl.workers.metrics import Metric
from vla_rl.workers.resources import Resources

NUM_EPISODES = 2


def make_config(checkpoints=(), **eval_fields) -> RunConfig:
    return RunConfig.model_validate({
        "simulator": {"name": "robosuite_lift", "env": {"horizon": 8}, "num_cpus_per_actor": 0},
        "policy": {"name": "mlp", "config": {"hidden_sizes": [8]}},
        "data": {"init_states_per_step": 1, "group_size": 1},
        "warm_start": {"num_demos": 0},
        "workers": {"num_workers": 1},
        "eval": {"num_episodes": NUM_EPISODES, "protocols": ["greedy", "sampled"], "temperature": 0.5,
                 "video_episodes": 1, "video_size": 32, "checkpoints": list(checkpoints), "store_episodes": True,
                 **eval_fields},
    })


@pytest.fixture(scope="module")
def checkpoints(ray_on_loopback, process_group, torch_one_thread, tmp_path_factory):
    """Two checkpoints (steps 1 and 2, different weights) of the tiny Lift policy (15 observation
    values, 7 actions), written like training's."""
    from policies import make_policy
    from policies.mlp import MLPPolicyConfig

    root = tmp_path_factory.mktemp("run") / "checkpoints"
    policy = make_policy("mlp", MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)))
    for step in (1, 2):
        torch.manual_seed(step)
        for parameter in policy.parameters():
            torch.nn.init.normal_(parameter, std=0.3)
        checkpoint.save_checkpoint(root, step, rank=0, model=policy)
        checkpoint.finalize_checkpoint(root, step)
    return [str(checkpoint.checkpoint_dir(root, step)) for step in (1, 2)]


def worker_resources(config, run_dir) -> Resources:
    """This (only) worker's resources with its evaluation session."""
    resources = Resources(config, 0, 1, run_dir, torch.device("cpu"), 1)
    resources.ensure(["evaluation"])
    return resources


def run_step(resources, step: int) -> dict[str, float]:
    """One pass of the evaluate phase's chain on this (only) worker."""
    batch = None
    for node, fn in (("episodes", load_eval_episodes), ("rollout", rollout_eval_episodes),
                     ("record", record_eval_episodes)):
        ctx = NodeContext(node, step, 0, 1, 0, 1, resources.config, None, resources.view(node, ["evaluation"]),
                          tag="eval", video=True)
        output = fn(ctx, batch)
        batch = output.batch
    return {name: m.value if isinstance(m, Metric) else m for name, m in output.metrics.items()}


@pytest.mark.xdist_group("test_session.checkpoints")
def test_interrupted_evaluation_continues_without_redoing_episodes(checkpoints, tmp_path):
    config = make_config(checkpoints)
    planned = 2 * len(eval_protocols(config.eval)) * NUM_EPISODES
    first = worker_resources(config, tmp_path)
    try:
        metrics = run_step(first, 0)  # then the worker dies
    finally:
        first.close()
    assert metrics["eval/recorded"] == NUM_EPISODES and metrics["eval/remaining"] == planned - NUM_EPISODES
    restarted = worker_resources(config, tmp_path)
    recorded, step = 0.0, 0
    try:
        restarted.evaluation.begin("eval", 0)
        assert restarted.evaluation.remaining() == planned - NUM_EPISODES
        while True:
            metrics = run_step(restarted, step)
            recorded += metrics["eval/recorded"]
            step += 1
            if metrics["eval/remaining"] == 0:
                break
        assert recorded == planned - NUM_EPISODES  # nothing redone
        # the figures of the last pass count this session's episodes (the second worker's)
        assert metrics["eval/step2/greedy/episodes"] == NUM_EPISODES
        store = TrajectoryStore.open(task_dir(tmp_path, "robosuite_lift") / "rank0.zarr", read_only=True)
        stored = episode_keys(store)
        assert len(stored) == planned and len(set(stored)) == planned
        rows = summarize(tmp_path, restarted.evaluation.tasks, [1, 2], restarted.evaluation.protocols,
                         restarted.evaluation.init_state_ids)
        assert [r["episodes"] for r in rows] == [NUM_EPISODES] * 4
        assert {r["protocol"] for r in rows} == {"greedy", "sampled@0.5"}
        check = rescore_store(restarted.simulator_pool, store, indices=list(range(NUM_EPISODES)))
        np.testing.assert_array_equal(check["replayed_success"], check["stored_success"])
    finally:
        restarted.close()
    videos = sorted(p.name for p in (tmp_path / "videos" / "robosuite_lift").glob("*.mp4"))
    assert videos and all(name.startswith("step2_") for name in videos)


def test_replaying_stored_actions_reproduces_the_outcome(ray_on_loopback):
    """The scripted expert's actions replayed from the same initial state succeed again, in a
    pool whose environments ran other episodes before; the same state with idle actions fails."""
    from simulators.pool import SimulatorPool

    with SimulatorPool("robosuite_lift", {"horizon": 60}, num_actors=1, envs_per_actor=1,
                       actor_options={"num_cpus": 0}) as pool:
        expert = pool.run_expert([7])[0]
        assert expert["success"]
        actions = expert["actions"][:, None, :]  # (T, chunk 1, 7)
        assert replay_episodes(pool, np.array([7]), [np.zeros_like(actions)])[0].tolist() == [False]
        assert replay_episodes(pool, np.array([7]), [actions])[0].tolist() == [True]


@pytest.mark.xdist_group("test_session.checkpoints")
def test_checkpoint_that_does_not_fit_the_task_is_refused(checkpoints, tmp_path):
    resources = worker_resources(make_config(checkpoints[:1], benchmark="robosuite", tasks=["Stack"]), tmp_path)
    try:
        with pytest.raises(ValueError, match=r"task 'Stack' cannot be evaluated with checkpoint .*step_00000001: its "
                                             r"observation \[robot0_eef_pos 3, .*\(20 values\) is not the policy's "
                                             r"\[robot0_eef_pos 3, .*\(15 values\) "
                                             r"\(the policy is built for robosuite_lift\)"):
            run_step(resources, 0)
        assert not task_dir(tmp_path, "Stack").exists()  # no episode was run
    finally:
        resources.close()
