"""Contract tests run on every registered simulator (one environment per simulator, in-process)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulators import SIMULATORS, make_env
from simulators.experts import EXPERTS, make_expert

HORIZON = 40  # control steps: the Lift expert needs about 30
HORIZONS = {"metaworld": 100}  # MetaWorld's reach-v3 expert needs 36-73 control steps (seeds 0-49)


# remote environments run in other processes' clients: tests/simulators/test_remote_env.py
@pytest.fixture(scope="module", params=[name for name in SIMULATORS.names() if name != "remote"])
def env(request):
    name = request.param
    unavailable_reason = getattr(SIMULATORS.get(name), "unavailable_reason", lambda: None)()
    if unavailable_reason is not None:
        pytest.skip(unavailable_reason)
    horizon = HORIZONS.get(name, HORIZON)
    env = make_env(name, dataclasses.replace(SIMULATORS.get(name).config_class(), horizon=horizon))
    assert env.horizon == horizon
    env.simulator_name = name
    yield env
    env.close()


def _rollout(env, seed: int, actions: np.ndarray) -> np.ndarray:
    """Observations ``(1 + len(actions), obs_dim)`` of the episode from ``seed`` under ``actions``."""
    observations = [env.reset(seed=seed)[0]]
    observations += [env.step(action)[0] for action in actions]
    return np.stack(observations)


def test_spaces_and_reset_observation(env):
    obs, info = env.reset(seed=0)
    assert obs.dtype == np.float32 and obs.shape == env.observation_space.shape
    assert env.observation_space.contains(obs)
    assert env.action_space.shape == (env.action_dim,) and env.action_space.dtype == np.float32
    assert info == {"success": False, "episode_step": 0}
    assert sum(s.stop - s.start for s in env.obs_layout.values()) == obs.shape[0]


def test_same_seed_same_trajectory_after_another_episode(env):
    actions = np.random.default_rng(0).uniform(-1, 1, size=(8, env.action_dim))
    first = _rollout(env, seed=11, actions=actions)
    other = _rollout(env, seed=12, actions=actions)
    again = _rollout(env, seed=11, actions=actions)
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first[0], other[0])


def test_different_seeds_give_different_initial_states(env):
    initial = np.stack([env.reset(seed=seed)[0] for seed in range(5)])
    for i in range(5):
        for j in range(i + 1, 5):
            assert not np.allclose(initial[i], initial[j]), (i, j)


def test_unseeded_first_resets_of_two_environments_differ(env):
    """gymnasium's convention, and robosuite.make(seed=None)'s: without a seed an environment
    starts from fresh entropy. robosuite's own generators start from one fixed seed, so every
    robosuite environment reset without a seed gave the same episodes (a vector of them, N
    copies of one)."""
    config = dataclasses.replace(SIMULATORS.get(env.simulator_name).config_class(), horizon=env.horizon)
    first, second = make_env(env.simulator_name, config), make_env(env.simulator_name, config)
    try:
        assert not np.allclose(first.reset()[0], second.reset()[0])
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("bad_shape", [(6,), (1, 7), (8,)])
def test_step_rejects_wrong_action_shape(env, bad_shape):
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(bad_shape))


def test_step_rejects_non_finite_actions_and_clips_large_ones(env):
    env.reset(seed=0)
    with pytest.raises(ValueError, match="finite"):
        env.step(np.full(env.action_dim, np.nan))
    big = _rollout(env, seed=3, actions=np.full((2, env.action_dim), 5.0))
    unit = _rollout(env, seed=3, actions=np.full((2, env.action_dim), 1.0))
    np.testing.assert_array_equal(big, unit)


def test_truncated_at_horizon_and_no_auto_reset(env):
    env.reset(seed=1)
    zero = np.zeros(env.action_dim)
    for t in range(1, env.horizon):
        obs, reward, terminated, truncated, info = env.step(zero)
        assert (reward, terminated, truncated) == (0.0, False, False), t
        assert info == {"success": False, "episode_step": t}
    obs, reward, terminated, truncated, info = env.step(zero)
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info == {"success": False, "episode_step": env.horizon}
    assert obs.shape == env.observation_space.shape  # the terminal observation, not a reset one
    with pytest.raises(RuntimeError, match="reset"):
        env.step(zero)
    assert env.reset(seed=1)[1]["episode_step"] == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scripted_expert_succeeds_and_terminates(env, seed):
    task = env.config.task_name
    if (env.simulator_name, task) not in EXPERTS:
        pytest.skip(f"no scripted expert registered for task {task!r} of {env.simulator_name!r}")
    expert = make_expert(env.simulator_name, task, env.obs_layout)
    obs, _ = env.reset(seed=seed)
    expert.reset()
    done = False
    while not done:
        action = expert.act(obs)
        assert action.shape == (env.action_dim,) and action.dtype == np.float32
        obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert info["episode_step"] < env.horizon
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(env.action_dim))


def test_render_frame_without_camera_raises(env):
    if env.render_mode is not None:
        pytest.skip("this simulator's default config renders")
    with pytest.raises(RuntimeError, match="render_camera"):
        env.render_frame()


@pytest.mark.filterwarnings("ignore:.*A Box observation space (minimum|maximum) value is:UserWarning")
def test_gymnasiums_own_environment_checker_passes(env):
    """``reset(options={})``, which gymnasium's ``check_env`` passes, was refused ("takes no
    options, got {}"). (Its advice against unbounded observations does not apply: states are.)"""
    from gymnasium.utils.env_checker import check_env

    check_env(env, skip_render_check=True)
