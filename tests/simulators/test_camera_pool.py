"""A SimulatorPool of robosuite Lift with camera observations: dict observations (state, uint8
agentview image, encoded instruction) through reset, step with inactive environments, action
chunks (submit / collect), and the scripted expert (skipped where EGL is unavailable)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulators.pool import SimulatorPool
from simulators.rendering import egl_unavailable_reason
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec
from vla_rl_core.observations import INSTRUCTION_BYTES, decode_instruction

SIZE, OBS_DIM, ACT_DIM, HORIZON = 32, 15, 7, 40
IMAGE = "agentview_image"


@pytest.fixture(scope="module")
def camera_pool(ray_on_loopback):
    reason = egl_unavailable_reason()
    if reason is not None:
        pytest.skip(f"headless EGL rendering is unavailable: {reason}")
    config = {"horizon": HORIZON, "cameras": ["agentview"], "camera_size": SIZE, "fast_rendering": True}
    with SimulatorPool("robosuite_lift", config, num_actors=2, envs_per_actor=1,
                       actor_options={"num_cpus": 0}) as pool:
        yield pool


def check_layout(obs: dict, n: int) -> None:
    assert set(obs) == {keys.OBS_STATE, IMAGE, keys.OBS_INSTRUCTION}
    assert obs[keys.OBS_STATE].shape == (n, OBS_DIM) and obs[keys.OBS_STATE].dtype == np.float32
    assert obs[IMAGE].shape == (n, SIZE, SIZE, 3) and obs[IMAGE].dtype == np.uint8
    assert obs[keys.OBS_INSTRUCTION].shape == (n, INSTRUCTION_BYTES) and obs[keys.OBS_INSTRUCTION].dtype == np.uint8


def test_spec_lists_the_images(camera_pool):
    spec = camera_pool.spec()
    assert spec.obs_layout["cube_pos"] == (5, 8)
    assert dataclasses.replace(spec, obs_layout={}) == EnvSpec(obs_dim=OBS_DIM, action_dim=ACT_DIM, horizon=HORIZON,
                                                               images={IMAGE: (SIZE, SIZE, 3)})


def test_reset_and_step_give_dict_observations(camera_pool):
    obs = camera_pool.reset(np.array([3, 4]))
    check_layout(obs, 2)
    assert [decode_instruction(code) for code in obs[keys.OBS_INSTRUCTION]] == ["lift the cube"] * 2
    assert obs[IMAGE].std() > 5.0 and not np.array_equal(obs[IMAGE][0], obs[IMAGE][1])
    out = camera_pool.step(np.zeros((2, ACT_DIM), dtype=np.float32), np.array([True, False]))
    check_layout(out["obs"], 2)
    assert out["obs"][IMAGE][0].std() > 5.0
    assert not out["obs"][IMAGE][1].any() and not out["obs"][keys.OBS_INSTRUCTION][1].any()  # inactive: zeros


def test_a_chunk_gives_the_dict_observation_of_its_last_step(camera_pool):
    actions = np.random.default_rng(0).uniform(-1, 1, size=(3, ACT_DIM)).astype(np.float32)
    camera_pool.reset(np.array([3, 4]))
    for action in actions:  # lockstep, environment 1 only
        stepped = camera_pool.step(np.stack([action, action]), np.array([False, True]))["obs"]
    camera_pool.reset(np.array([3, 4]))
    out = camera_pool.collect(camera_pool.submit([1], actions[None]))
    check_layout(out["obs"], 1)
    assert out["steps"].tolist() == [3] and not out["lost"].any()
    for key in (keys.OBS_STATE, IMAGE, keys.OBS_INSTRUCTION):
        np.testing.assert_array_equal(out["obs"][key][0], stepped[key][1])


def test_run_expert_records_camera_observations(camera_pool):
    (episode,) = camera_pool.run_expert([0])
    steps = len(episode["actions"])
    assert episode["success"] and 0 < steps < HORIZON
    check_layout(episode["obs"], steps)
    first = camera_pool.reset(np.array([0]))
    np.testing.assert_array_equal(first[keys.OBS_STATE][0], episode["obs"][keys.OBS_STATE][0])
    np.testing.assert_array_equal(first[IMAGE][0], episode["obs"][IMAGE][0])
