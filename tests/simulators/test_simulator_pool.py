"""SimulatorPool over Ray actors: 2 actors x 2 robosuite Lift environments on loopback Ray."""

from __future__ import annotations

import os

import numpy as np
import pytest
import ray

from simulators.pool import SimulatorPool
from simulators.rendering import (
    current_render_gpu,
    egl_unavailable_reason,
    user_rendering_env_vars,
)
from vla_rl_core.env_spec import EnvSpec

HORIZON = 40
OBS_DIM, ACT_DIM = 15, 7
LIFT_LAYOUT = {"robot0_eef_pos": [0, 3], "robot0_gripper_qpos": [3, 5], "cube_pos": [5, 8],
               "gripper_to_cube_pos": [8, 11], "robot0_eef_quat": [11, 15]}


def test_pool_needs_ray_initialised():
    if ray.is_initialized():
        pytest.skip("Ray is already running in this process")
    with pytest.raises(RuntimeError, match="ray.init"):
        SimulatorPool("robosuite_lift", None, num_actors=1, envs_per_actor=1)


@pytest.fixture(scope="module")
def ray_cluster():
    if ray.is_initialized():  # the session's Ray (tests/conftest.py::ray_on_loopback) of an earlier module
        yield
        return
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=4, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def render_camera():
    """``"agentview"`` where EGL works, else ``None`` (the frame test then skips)."""
    return "agentview" if egl_unavailable_reason() is None else None


@pytest.fixture(scope="module")
def pool(ray_cluster, render_camera):
    config = {"horizon": HORIZON, "render_camera": render_camera, "render_size": 32}
    with SimulatorPool("robosuite_lift", config, num_actors=2, envs_per_actor=2) as pool:
        yield pool


def test_spec(pool):
    assert pool.spec() == EnvSpec(obs_dim=OBS_DIM, action_dim=ACT_DIM, horizon=HORIZON, obs_layout=LIFT_LAYOUT)
    assert pool.capacity == 4


def test_reset_shapes_and_reproducibility_across_actors(pool):
    obs = pool.reset(np.array([7, 7, 8]))  # envs 0 and 2 on actor 0, env 1 on actor 1
    assert obs.shape == (3, OBS_DIM) and obs.dtype == np.float32
    np.testing.assert_array_equal(obs[0], obs[1])
    assert not np.allclose(obs[0], obs[2])


def test_reset_rejects_more_envs_than_capacity(pool):
    with pytest.raises(ValueError, match="capacity"):
        pool.reset(np.arange(5))


def test_step_shapes_and_inactive_envs_are_not_stepped(pool):
    actions = np.random.default_rng(0).uniform(-1, 1, size=(3, ACT_DIM)).astype(np.float32)
    actions[2] = actions[0]
    pool.reset(np.array([7, 8, 7]))
    for _ in range(2):
        out = pool.step(actions, np.array([True, False, True]))
        assert out["obs"].shape == (3, OBS_DIM) and out["obs"].dtype == np.float32
        for key in ("reward", "terminated", "truncated", "success"):
            assert out[key].shape == (3,)
        assert out["reward"].dtype == np.float32 and out["terminated"].dtype == bool
        assert not out["obs"][1].any() and not out["terminated"][1] and not out["truncated"][1]
        np.testing.assert_array_equal(out["obs"][0], out["obs"][2])  # same seed, same actions
        assert "frames" not in out
    after_waiting = pool.step(actions, np.array([False, True, False]))["obs"][1]
    pool.reset(np.array([7, 8, 7]))
    first_step = pool.step(actions, np.array([False, True, False]))["obs"][1]
    np.testing.assert_array_equal(after_waiting, first_step)  # env 1 waited untouched


def test_step_validates_its_arguments(pool):
    pool.reset(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="actions"):
        pool.step(np.zeros((2, ACT_DIM)), np.ones(3, dtype=bool))
    with pytest.raises(ValueError, match="active"):
        pool.step(np.zeros((3, ACT_DIM)), np.ones(3, dtype=np.int64))
    with pytest.raises(ValueError, match="render_indices"):
        pool.step(np.zeros((3, ACT_DIM)), np.array([True, False, True]), render_indices=[1])


def test_rendered_frames_follow_render_indices(pool, render_camera):
    if render_camera is None:
        pytest.skip("headless EGL rendering is unavailable")
    pool.reset(np.array([3, 4, 5]))
    active = np.ones(3, dtype=bool)
    frames = pool.step(np.zeros((3, ACT_DIM)), active, render_indices=[2, 0])["frames"]
    assert frames.shape == (2, 32, 32, 3) and frames.dtype == np.uint8
    assert frames.std() > 10.0 and np.any(frames[0] != frames[1])
    swapped = pool.step(np.zeros((3, ACT_DIM)), active, render_indices=[0, 2])["frames"]
    distance = lambda a, b: np.abs(a.astype(np.int16) - b).mean()  # noqa: E731
    assert distance(swapped[0], frames[1]) < distance(swapped[0], frames[0])


def test_each_actor_reports_the_renderer_it_chose(pool, render_camera):
    reports = pool.rendering()
    assert len(reports) == 2
    if "MUJOCO_GL" in user_rendering_env_vars():
        pytest.skip("MUJOCO_GL is set: the actors use it unprobed")
    for report in reports:
        assert report["gpu"] == current_render_gpu()  # the pool creator's GPU (None without one)
        if render_camera is not None:  # EGL works here: chosen after a probe that read GL_RENDERER
            assert report["backend"] == "egl" and report["source"] == "automatic"
            assert report["egl_error"] is None and report["gl_renderer"]


def test_run_expert_over_actors(pool):
    episodes = pool.run_expert([0, 1, 2])
    assert [episode["init_state_id"] for episode in episodes] == [0, 1, 2]
    for episode in episodes:
        steps = len(episode["actions"])
        assert episode["success"] and 0 < steps < HORIZON
        assert episode["obs"].shape == (steps, OBS_DIM) and episode["obs"].dtype == np.float32
        assert episode["actions"].shape == (steps, ACT_DIM) and episode["actions"].dtype == np.float32
    np.testing.assert_array_equal(pool.reset(np.array([2]))[0], episodes[2]["obs"][0])


def test_a_chunk_equals_single_steps_and_stops_at_the_episode_end(pool):
    rng = np.random.default_rng(1)
    actions = rng.uniform(-1, 1, size=(3, HORIZON + 5, ACT_DIM)).astype(np.float32)
    pool.reset(np.array([7, 8, 9]))
    pending = pool.submit(np.array([2, 0]), actions[[2, 0], :3])  # three control steps each, env 1 idle
    chunk = pool.collect(pending)
    assert chunk["steps"].tolist() == [3, 3] and not chunk["lost"].any()
    assert chunk["sim_seconds"] > 0 and chunk["sim_cpu_seconds"] > 0
    pool.reset(np.array([7, 8, 9]))
    for j in range(3):
        single = pool.step(actions[:, j], np.array([True, False, True]))
    np.testing.assert_array_equal(chunk["obs"], single["obs"][[2, 0]])
    # A chunk longer than the episode: the environment stops at its time limit.
    pool.reset(np.array([7, 8, 9]))
    out = pool.collect(pool.submit(np.array([1]), actions[[1]]))
    assert out["steps"].tolist() == [HORIZON] and out["truncated"].tolist() == [True]


def test_submit_validates_its_arguments(pool):
    pool.reset(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="subset of the batch"):
        pool.submit(np.array([3]), np.zeros((1, 1, ACT_DIM)))
    with pytest.raises(ValueError, match="distinct"):
        pool.submit(np.array([1, 1]), np.zeros((2, 1, ACT_DIM)))
    with pytest.raises(ValueError, match="chunk, action_dim"):
        pool.submit(np.array([1, 2]), np.zeros((2, ACT_DIM)))
    with pytest.raises(ValueError, match="render_indices"):
        pool.submit(np.array([1]), np.zeros((1, 1, ACT_DIM)), render_indices=[2])


def test_pipelined_rollout_equals_the_lockstep_rollout(pool):
    import torch

    from policies import make_policy
    from policies.mlp import MLPPolicyConfig
    from vla_rl.rollout.embodied import rollout_episodes

    torch.manual_seed(0)
    policy = make_policy("mlp", MLPPolicyConfig(obs_dim=OBS_DIM, action_dim=ACT_DIM, hidden_sizes=(16,)))
    ids = np.array([11, 12, 13, 14])
    lockstep = rollout_episodes(policy, pool, ids, greedy=True, pipeline_stages=1)
    pipelined = rollout_episodes(policy, pool, ids, greedy=True, pipeline_stages=2)
    assert pipelined.env_steps == lockstep.env_steps > 0
    for key in lockstep.batch.keys():
        assert torch.equal(pipelined.batch[key], lockstep.batch[key]), key


@pytest.mark.parametrize(("progress", "num_actors", "bars"), [
    (False, 1, []),
    (True, 1, ["creating robosuite_lift (Door) environments"]),
    (True, 3, ["creating robosuite_lift (Door) environments in each of 3 simulator actors"]),
])
def test_one_progress_bar_per_pool(progress, num_actors, bars, monkeypatch):
    """A pool asks its first actor alone for a bar: a phase shows one bar, not one per actor. The bar
    names the task (robosuite_lift hosts every robosuite task)."""
    from ray.experimental import tqdm_ray

    from simulators.registry import build_env_config
    from simulators.worker import SimulatorWorker

    shown = []

    class Bar:
        def __init__(self, total, desc, unit):
            shown.append(desc)
            self.total, self.n = total, 0

        def update(self, n):
            self.n += n

        def close(self):
            assert self.n == self.total

    monkeypatch.setattr(tqdm_ray, "tqdm", Bar)
    worker = SimulatorWorker("robosuite_lift", build_env_config("robosuite_lift", {"task": "Door", "horizon": HORIZON}), 2)
    worker.make_envs(progress=progress, num_actors=num_actors)
    assert shown == bars
    assert all(env is not None for env in worker._sim._envs)


@pytest.mark.parametrize(("progress", "bars"), [(True, [3, 0, 0]), (False, [0, 0, 0])])
def test_a_pool_asks_one_actor_for_a_bar(progress, bars, monkeypatch):
    """The first actor of a pool that shows progress draws the bar (labelled for the pool's 3
    actors); a DAG worker's peers (rank > 0) build their pools with progress=False."""
    asked = []
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(SimulatorPool, "_start_actor", lambda self, bar_for=0: asked.append(bar_for))
    SimulatorPool("robosuite_lift", None, num_actors=3, envs_per_actor=2, progress=progress)
    assert asked == bars
