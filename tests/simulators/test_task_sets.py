"""Task sets in the simulator worker and pool: each environment is reset into its episode's task,
observations carry the task id, a slot that changes task parks its environment for reuse (never
more parked than slots), the tasks of a set must share their layout, and each task's scripted
expert records its demonstrations."""

from __future__ import annotations

import numpy as np
import pytest

import simulators.gym_vector as gym_vector_module
from simulators import make_env
from simulators.registry import build_env_config
from simulators.worker import SimulatorWorker
from vla_rl_core import keys
from vla_rl_core.components import ComponentConfigError

TASKS = ["reach-v3", "push-v3", "drawer-close-v3"]
HORIZON = 50


def configs(tasks=TASKS, simulator="metaworld", **env):
    return [build_env_config(simulator, {"task": task, "horizon": HORIZON, **env}) for task in tasks]


def single_task_reset(task: str, seed: int) -> np.ndarray:
    env = make_env("metaworld", {"task": task, "horizon": HORIZON})
    try:
        return env.reset(seed=seed)[0]
    finally:
        env.close()


@pytest.fixture
def counted_envs(monkeypatch):
    """The environments the worker creates, by task."""
    made: list[str] = []

    def make(name, config):
        made.append(config.task)
        return make_env(name, config)

    monkeypatch.setattr(gym_vector_module, "make_env", make)
    return made


def test_each_environment_resets_into_its_task_and_says_which(counted_envs):
    worker = SimulatorWorker("metaworld", configs(), 4)
    try:
        spec = worker.spec()
        assert spec.num_tasks == 3 and spec.obs_dim == 39 and spec.obs_layout["goal_pos"] == (36, 39)
        obs = worker.reset([0, 1, 2, 3], [5, 5, 5, 6], [0, 1, 2, 1])
        assert set(obs) == {keys.OBS_STATE, keys.OBS_TASK_ID} and obs[keys.OBS_TASK_ID].tolist() == [0, 1, 2, 1]
        for row, (task, seed) in enumerate([(0, 5), (1, 5), (2, 5), (1, 6)]):
            np.testing.assert_array_equal(obs[keys.OBS_STATE][row], single_task_reset(TASKS[task], seed))
        out = worker.step_chunk([1, 3], np.zeros((2, 2, 4), dtype=np.float32))
        assert out["obs"][keys.OBS_TASK_ID].tolist() == [1, 1] and out["steps"].tolist() == [2, 2]
        # the spec's environments (one per task) served the first resets: 3 made for 4 slots + 1
        assert sorted(counted_envs) == sorted([*TASKS, "push-v3"])
        with pytest.raises(ValueError, match=r"task ids \[3\] are outside this worker's 3 task"):
            worker.reset([0], [1], [3])
    finally:
        worker.close()


def test_a_slot_that_changes_task_reuses_parked_environments(counted_envs):
    worker = SimulatorWorker("metaworld", configs(), 2)
    try:
        for _ in range(3):  # slots 0 and 1 switch between tasks 0/1 and 2/0
            worker.reset([0, 1], [1, 2], [0, 2])
            worker.reset([0, 1], [1, 2], [1, 0])
        assert sorted(counted_envs) == sorted(["reach-v3", "push-v3", "drawer-close-v3", "reach-v3"])
        np.testing.assert_array_equal(worker.reset([0], [4], [2])[keys.OBS_STATE][0],
                                      single_task_reset("drawer-close-v3", 4))
        assert len(worker._sim._parked) <= max(2, len(TASKS))  # never more parked than slots (or tasks)
    finally:
        worker.close()


def test_tasks_of_a_set_must_share_their_layout():
    """robosuite Lift observes 15 values, Stack 20: not one task set; the error names the setting,
    which the driver reports in one line (a ValueError came back as a Ray traceback)."""
    worker = SimulatorWorker("robosuite", configs(["Lift", "Stack"], "robosuite"), 1)
    try:
        with pytest.raises(ComponentConfigError, match=r"'Stack' differs from 'Lift' in \['obs_dim', 'obs_layout'\]") \
                as error:
            worker.spec()
        assert error.value.field == "simulator.tasks"
    finally:
        worker.close()


def test_a_pool_whose_tasks_differ_reads_every_failed_creation(ray_on_loopback, monkeypatch):
    """Through the pool: the error crosses Ray naming simulator.tasks, and the failed
    ``make_envs`` of every actor is read (Ray printed the traceback of each unread one beside the
    run's one-line error)."""
    import ray

    from simulators.pool import SimulatorPool

    read, get = [], ray.get

    def recording_get(refs, *args, **kwargs):
        read.extend(refs if isinstance(refs, list) else [refs])
        return get(refs, *args, **kwargs)

    monkeypatch.setattr(ray, "get", recording_get)
    with SimulatorPool("robosuite", [{"task": task, "horizon": HORIZON} for task in ("Lift", "Stack")], num_actors=2,
                       envs_per_actor=1, actor_options={"num_cpus": 0}) as pool:
        creations = list(pool._creations)
        with pytest.raises(ComponentConfigError) as error:
            pool.spec()
    assert error.value.field == "simulator.tasks" and len(creations) == 2
    assert all(ref in read for ref in creations)


def test_each_task_has_its_own_expert():
    worker = SimulatorWorker("metaworld", configs(horizon=150), 1)
    try:
        episodes = worker.run_expert([0, 1], task_id=1)
        assert all(e["success"] for e in episodes)  # push-v3's expert, not reach-v3's
        assert set(episodes[0]["obs"][keys.OBS_TASK_ID].tolist()) == {1}
        np.testing.assert_array_equal(episodes[1]["obs"][keys.OBS_STATE][0], single_task_reset("push-v3", 1))
        with pytest.raises(ValueError, match="task id 3"):
            worker.run_expert([0], task_id=3)
    finally:
        worker.close()


def test_a_task_set_pool_over_actors(ray_on_loopback):
    from simulators.pool import SimulatorPool

    with SimulatorPool("metaworld", [{"task": task, "horizon": HORIZON} for task in TASKS], num_actors=2,
                       envs_per_actor=2, actor_options={"num_cpus": 0}) as pool:
        assert pool.num_tasks == 3 and pool.spec().num_tasks == 3
        obs = pool.reset(np.array([5, 5, 5]), np.array([2, 0, 2]))  # envs 0 and 2 on actor 0
        assert obs[keys.OBS_TASK_ID].tolist() == [2, 0, 2]
        np.testing.assert_array_equal(obs[keys.OBS_STATE][0], obs[keys.OBS_STATE][2])
        np.testing.assert_array_equal(obs[keys.OBS_STATE][1], single_task_reset("reach-v3", 5))
        chunk = pool.collect(pool.submit(np.array([0, 1, 2]), np.zeros((3, 1, 4), dtype=np.float32)))
        assert chunk["obs"][keys.OBS_TASK_ID].tolist() == [2, 0, 2]
        with pytest.raises(ValueError, match=r"task_ids must lie in \[0, 3\)"):
            pool.reset(np.array([1]), np.array([3]))


def test_camera_observations_of_a_task_set_carry_each_tasks_instruction(egl_or_skip):
    """What a VLA policy reads: each environment's own instruction, beside the task id."""
    from vla_rl_core.observations import decode_instruction

    worker = SimulatorWorker("metaworld", configs(TASKS[:2], cameras=("corner",), camera_size=16), 2)
    try:
        obs = worker.reset([0, 1], [3, 3], [1, 0])
        assert set(obs) == {keys.OBS_STATE, "corner_image", keys.OBS_INSTRUCTION, keys.OBS_TASK_ID}
        assert [decode_instruction(code) for code in obs[keys.OBS_INSTRUCTION]] == [
            "push the puck to the goal", "reach the goal position"]
        assert obs[keys.OBS_TASK_ID].tolist() == [1, 0] and obs["corner_image"].shape == (2, 16, 16, 3)
    finally:
        worker.close()


@pytest.fixture
def egl_or_skip():
    from simulators.rendering import egl_unavailable_reason

    reason = egl_unavailable_reason()
    if reason:
        pytest.skip(reason)
