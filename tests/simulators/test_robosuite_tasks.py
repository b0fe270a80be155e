"""The robosuite tasks beyond Lift: each creates, resets reproducibly and steps with its default
compact state (robosuite 1.5.2 observation names)."""

from __future__ import annotations

import numpy as np
import pytest

from simulators import make_env
from simulators.robosuite_env import TASK_STATE_KEYS, RobosuiteEnvConfig

EXPECTED_OBS_DIM = {"Stack": 20, "PickPlaceCan": 19, "Door": 20}  # sums of the keys' sizes, by hand


@pytest.mark.parametrize("task", sorted(EXPECTED_OBS_DIM))
def test_task_creates_resets_and_steps(task):
    env = make_env("robosuite", {"task": task, "horizon": 3})
    try:
        assert list(env.obs_layout) == list(TASK_STATE_KEYS[task])
        assert env.observation_space.shape == (EXPECTED_OBS_DIM[task],) and env.action_space.shape == (7,)
        first, _ = env.reset(seed=3)
        other, _ = env.reset(seed=4)
        again, _ = env.reset(seed=3)
        np.testing.assert_array_equal(first, again)  # the object placement follows the seed
        assert not np.array_equal(first, other)
        for step in range(3):
            obs, reward, terminated, truncated, info = env.step(np.zeros(7, dtype=np.float32))
            assert obs.shape == first.shape and np.all(np.isfinite(obs))
            assert not terminated and reward == 0.0
        assert truncated and info["episode_step"] == 3
    finally:
        env.close()


def test_default_state_keys_follow_the_task():
    assert RobosuiteEnvConfig().obs_keys == TASK_STATE_KEYS["Lift"]
    assert RobosuiteEnvConfig(task="Door").obs_keys == TASK_STATE_KEYS["Door"]
    assert RobosuiteEnvConfig(task="Door", obs_keys=["door_pos"]).obs_keys == ("door_pos",)
    with pytest.raises(ValueError, match="task 'NutAssembly' has no default state keys; set obs_keys"):
        RobosuiteEnvConfig(task="NutAssembly")


def test_task_names_are_robosuites_single_arm_tasks():
    import robosuite

    from simulators.robosuite_env import SINGLE_ARM_TASKS

    assert set(SINGLE_ARM_TASKS) == {name for name in robosuite.ALL_ENVIRONMENTS if not name.startswith("TwoArm")}
    with pytest.raises(ValueError, match="task must be a single-arm robosuite task.*got 'Stak'"):
        RobosuiteEnvConfig(task="Stak")
