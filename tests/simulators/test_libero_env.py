"""LIBERO environment: config validation (always) and the environment itself (skipped, with the
reason, where the optional ``libero`` extra is not installed)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from simulators import SIMULATORS, make_env
from simulators.libero_env import SUITE_HORIZONS, LiberoEnv, LiberoEnvConfig
from simulators.libero_offline import libero_unavailable_reason

needs_libero = pytest.mark.skipif(libero_unavailable_reason() is not None, reason=str(libero_unavailable_reason()))
SIZE = 64


def test_registered_with_its_config_class():
    assert SIMULATORS.get("libero") is LiberoEnv and LiberoEnv.config_class is LiberoEnvConfig


@pytest.mark.parametrize(("suite", "horizon"), [("libero_spatial", 220), ("libero_object", 280),
                                                 ("libero_goal", 300), ("libero_10", 520)])
def test_horizon_defaults_to_the_suite_eval_budget(suite, horizon):
    assert LiberoEnvConfig(suite=suite).horizon == horizon == SUITE_HORIZONS[suite]
    assert LiberoEnvConfig(suite=suite, horizon=50).horizon == 50


@pytest.mark.parametrize(("field", "value"), [("suite", "libero_90"), ("task_id", -1), ("horizon", 0),
                                              ("num_steps_wait", -1), ("cameras", "agentview"),
                                              ("cameras", ("agentview", "agentview")), ("camera_size", 4),
                                              ("obs_keys", ()), ("fast_rendering", 1), ("render_camera", "")])
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        LiberoEnvConfig(**{field: value})


def test_unavailable_reason_says_how_to_install():
    reason = LiberoEnv.unavailable_reason()
    assert reason is None or "VLA_RL_EXTRAS=libero" in reason


@pytest.fixture(scope="module")
def state_env():
    env = make_env("libero", {"suite": "libero_spatial", "task_id": 0, "horizon": 5})
    yield env
    env.close()


@needs_libero
def test_state_env_spaces_instruction_and_initial_states(state_env):
    assert isinstance(state_env.observation_space, gym.spaces.Box) and state_env.observation_space.shape == (9,)
    assert state_env.act_dim == 7 and state_env.num_init_states == 50
    assert state_env.instruction == "pick up the black bowl between the plate and the ramekin and place it on the plate"
    first, info = state_env.reset(seed=3)
    assert info == {"success": False, "episode_step": 0} and first.dtype == np.float32
    other, _ = state_env.reset(seed=4)
    wrapped, _ = state_env.reset(seed=53)  # 53 % 50 = 3
    np.testing.assert_array_equal(wrapped, first)
    assert not np.allclose(first, other)


@needs_libero
def test_state_env_steps_to_the_horizon_without_auto_reset(state_env):
    state_env.reset(seed=0)
    for step in range(1, 6):
        obs, reward, terminated, truncated, info = state_env.step(np.zeros(7))
        assert (reward, terminated, truncated) == (0.0, False, step == 5)
        assert info == {"success": False, "episode_step": step}
    with pytest.raises(RuntimeError, match="reset"):
        state_env.step(np.zeros(7))
    state_env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        state_env.step(np.zeros(6))


@needs_libero
def test_camera_observations_are_rotated_like_openvla():
    env = make_env("libero", {"suite": "libero_goal", "task_id": 2, "cameras": ("agentview", "robot0_eye_in_hand"),
                              "camera_size": SIZE, "fast_rendering": True, "horizon": 5})
    try:
        assert env.instruction and isinstance(env.observation_space, gym.spaces.Dict)
        obs, _ = env.reset(seed=1)
        assert env.observation_space.contains(obs)
        raw = env._env.env._get_observations(force_update=True)  # robosuite's OpenGL-ordered images
        for camera in ("agentview", "robot0_eye_in_hand"):
            image = obs[f"{camera}_image"]
            assert image.shape == (SIZE, SIZE, 3) and image.dtype == np.uint8 and image.std() > 5.0
            rotated, unrotated = raw[f"{camera}_image"][::-1, ::-1], raw[f"{camera}_image"]
            # A second render of the same state differs in a few pixels (llvmpipe); orientation is what matters.
            assert np.abs(image.astype(int) - rotated).mean() < 1.0 < np.abs(image.astype(int) - unrotated).mean()
        obs, *_ = env.step(np.zeros(7))
        assert obs["state"].shape == (9,)
    finally:
        env.close()


@needs_libero
@pytest.mark.slow
@pytest.mark.parametrize("suite", sorted(SUITE_HORIZONS))
def test_every_suite_creates_and_steps(suite):
    env = make_env("libero", {"suite": suite, "task_id": 9, "horizon": 3})
    try:
        env.reset(seed=0)
        for _ in range(3):
            obs, reward, terminated, truncated, info = env.step(np.zeros(7))
        assert truncated and not info["success"] and env.instruction
    finally:
        env.close()
