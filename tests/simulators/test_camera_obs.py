"""Camera observations of robosuite tasks: Dict layout, upright images, state unchanged, and the
flat Box default (skipped where EGL is unavailable)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from simulators import make_env
from simulators.rendering import egl_unavailable_reason
from simulators.robosuite_env import RobosuiteEnvConfig

SIZE = 32
CAMERAS = ("agentview", "robot0_eye_in_hand")


@pytest.fixture(scope="module")
def camera_env():
    reason = egl_unavailable_reason()
    if reason is not None:
        pytest.skip(f"headless EGL rendering is unavailable: {reason}")
    env = make_env(
        "robosuite_lift",
        {"cameras": CAMERAS, "camera_size": SIZE, "render_camera": "agentview", "render_size": SIZE, "horizon": 10},
    )
    yield env
    env.close()


@pytest.fixture(scope="module")
def state_env():
    env = make_env("robosuite_lift", {"horizon": 10})
    yield env
    env.close()


def test_default_observation_stays_a_flat_box(state_env):
    assert isinstance(state_env.observation_space, gym.spaces.Box)
    obs, _ = state_env.reset(seed=0)
    assert isinstance(obs, np.ndarray) and obs.shape == (state_env.obs_dim,)
    assert state_env.instruction == "lift the cube"


def test_dict_observation_layout_and_state_matches_the_state_env(camera_env, state_env):
    space = camera_env.observation_space
    assert isinstance(space, gym.spaces.Dict)
    assert set(space.spaces) == {"state", "agentview_image", "robot0_eye_in_hand_image"}
    actions = np.random.default_rng(0).uniform(-1, 1, size=(3, camera_env.action_dim))
    obs, _ = camera_env.reset(seed=5)
    state, _ = state_env.reset(seed=5)
    for action in actions:
        assert space.contains(obs)
        for camera in CAMERAS:
            image = obs[f"{camera}_image"]
            assert image.shape == (SIZE, SIZE, 3) and image.dtype == np.uint8 and image.std() > 5.0
        np.testing.assert_array_equal(obs["state"], state)
        obs = camera_env.step(action)[0]
        state = state_env.step(action)[0]


def test_agentview_image_is_the_upright_frame(camera_env):
    obs, _ = camera_env.reset(seed=2)
    frame = camera_env.render_frame()  # rendered separately, flipped upright
    np.testing.assert_array_equal(obs["agentview_image"], frame)
    # Upright: the table (bottom half of the agentview image) is brighter than the dark background above it.
    assert frame[SIZE // 2:].mean() > frame[: SIZE // 4].mean()


def test_camera_config_validation():
    with pytest.raises(ValueError, match="cameras"):
        RobosuiteEnvConfig(cameras="agentview")
    with pytest.raises(ValueError, match="repeat"):
        RobosuiteEnvConfig(cameras=("agentview", "agentview"))
    with pytest.raises(ValueError, match="camera_size"):
        RobosuiteEnvConfig(cameras=("agentview",), camera_size=4)
    keys = ("robot0_eef_pos",)  # ToolHang has no default state keys either
    with pytest.raises(ValueError, match="instruction"):
        RobosuiteEnvConfig(task="ToolHang", obs_keys=keys)
    assert RobosuiteEnvConfig(task="ToolHang", obs_keys=keys, instruction="hang the tool").instruction == "hang the tool"
    assert RobosuiteEnvConfig(cameras=["agentview"]).cameras == ("agentview",)


def test_unknown_camera_names_the_field():
    with pytest.raises(ValueError, match="cameras"):
        make_env("robosuite_lift", {"cameras": ("nocam",), "camera_size": SIZE})


def test_fast_rendering_changes_only_the_shading(camera_env):
    fast_env = make_env("robosuite_lift", {"cameras": ("agentview",), "camera_size": SIZE, "fast_rendering": True})
    try:
        fast = fast_env.reset(seed=2)[0]["agentview_image"].astype(int)
    finally:
        fast_env.close()
    normal = camera_env.reset(seed=2)[0]["agentview_image"].astype(int)
    difference = np.abs(fast - normal).mean()
    assert 0.0 < difference < 40.0  # shadows and reflections gone, same scene


def test_step_unobserved_renders_nothing_and_observe_gives_steps_observation(camera_env):
    actions = np.random.default_rng(1).uniform(-1, 1, size=(4, camera_env.action_dim))
    camera_env.reset(seed=3)
    for action in actions:
        stepped, *outcome = camera_env.step(action)
    camera_env.reset(seed=3)
    renders = []
    render = camera_env._render
    camera_env._render = lambda *args: renders.append(args) or render(*args)
    try:
        for action in actions:
            unobserved = camera_env.step_unobserved(action)
        assert renders == []  # neither robosuite's step nor ours rendered a camera
        observed = camera_env.observe()
    finally:
        del camera_env._render
    assert list(unobserved) == outcome
    assert renders == [(camera, SIZE) for camera in CAMERAS]
    for key, value in stepped.items():
        np.testing.assert_array_equal(observed[key], value)


def test_a_chunk_renders_the_cameras_once(camera_env):
    from simulators.worker import SimulatorWorker

    worker = SimulatorWorker("robosuite_lift", {"cameras": ["agentview"], "camera_size": SIZE, "horizon": 10}, 1)
    try:
        worker.reset([0], [4])
        env = worker._sim._env(0)
        renders = []
        render = env._render
        env._render = lambda *args: renders.append(args) or render(*args)
        out = worker.step_chunk([0], np.zeros((1, 5, env.action_dim), dtype=np.float32))
        assert out["steps"].tolist() == [5] and renders == [("agentview", SIZE)]
        np.testing.assert_array_equal(out["obs"]["agentview_image"][0], render("agentview", SIZE))
    finally:
        worker.close()


def test_environments_share_one_renderer_and_render_as_robosuites_own(camera_env):
    """A second environment renders through the first one's renderer (no new OpenGL context), and
    the images are those robosuite's own offscreen renderer makes of the same state."""
    from robosuite.utils.binding_utils import MjRenderContextOffscreen

    from simulators import rendering

    camera_env.reset(seed=2)
    before = set(rendering._SHARED_RENDERERS)
    other = make_env("robosuite_lift", {"cameras": CAMERAS, "camera_size": SIZE, "horizon": 10})
    try:
        obs = other.reset(seed=7)[0]
        assert set(rendering._SHARED_RENDERERS) == before  # same task, size and shading: shared
        assert not np.array_equal(obs["agentview_image"], camera_env.observe()["agentview_image"])  # own state
        sim = other._env.sim
        context = MjRenderContextOffscreen(sim, device_id=-1)
        context.vopt.geomgroup[0] = 0  # as robosuite's environments set it (render_collision_mesh=False)
        sim.add_render_context(context)
        for camera in CAMERAS:
            reference = sim.render(width=SIZE, height=SIZE, camera_name=camera)[::-1]
            np.testing.assert_array_equal(obs[f"{camera}_image"], reference)
    finally:
        other.close()


def test_images_larger_than_the_models_offscreen_buffer_render(camera_env):
    """robosuite's models have a 640 x 480 offscreen buffer: a 512-pixel image failed at the first
    reset ("Image height 512 > framebuffer height 480") after the config had accepted it."""
    env = make_env("robosuite_lift", {"cameras": ["agentview"], "camera_size": 512, "horizon": 10,
                                      "fast_rendering": True})
    try:
        image = env.reset(seed=0)[0]["agentview_image"]
        assert image.shape == (512, 512, 3) and image.std() > 10
    finally:
        env.close()
