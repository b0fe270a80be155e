"""The robosuite tasks beyond Lift: each creates, resets reproducibly and steps with its default
compact state (robosuite 1.5.2 observation names)."""

from __future__ import annotations

import re

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


def test_robot_names_are_robosuites_single_arm_robots():
    """Every registered one-arm robot except SpotWithArmFloating (robosuite cannot build it with
    an arm controller alone: KeyError 'base'); an unknown name is refused when the config is made."""
    from robosuite.models.robots.robot_model import REGISTERED_ROBOTS
    from robosuite.robots import ROBOT_CLASS_MAPPING

    from simulators.robosuite_env import SINGLE_ARM_ROBOTS

    single_arm = {name for name in ROBOT_CLASS_MAPPING if REGISTERED_ROBOTS[name]().arm_type == "single"}
    assert set(SINGLE_ARM_ROBOTS) == single_arm - {"SpotWithArmFloating"}
    assert RobosuiteEnvConfig(robot="Sawyer").robot == "Sawyer"
    for robot in ("NoSuchRobot", "Baxter", "SpotWithArmFloating"):
        with pytest.raises(ValueError, match=f"must be a single-arm robosuite robot, one of IIWA, .*got '{robot}'"):
            RobosuiteEnvConfig(robot=robot)


@pytest.mark.parametrize(("robot", "state_dim", "action_dim"), [
    ("Panda", 15, 7), ("Sawyer", 15, 7), ("UR5e", None, 7), ("PandaOmron", None, None)])
def test_sizes_known_before_the_environment_follow_the_robot(robot, state_dim, action_dim):
    """Measured with Lift: 15 state values with a Panda or a Sawyer (a 2-value gripper), 19 with the
    other arms; 7 action values for the arms with a one-value gripper, 12 for the PandaOmron."""
    config = RobosuiteEnvConfig(robot=robot)
    assert (config.state_dim, config.action_dim) == (state_dim, action_dim)


def test_robosuite_imports_quietly_in_simulator_processes():
    """Its import printed five warnings in every simulator process (no private macro file, no
    robosuite_models, no mink IK): they go below the console level; robosuite's errors still show."""
    import subprocess
    import sys

    script = ("from simulators.robosuite_env import quiet_robosuite_imports\n"
              "{}\n"
              "import robosuite\n"
              "from robosuite.utils.log_utils import ROBOSUITE_DEFAULT_LOGGER\n"
              "ROBOSUITE_DEFAULT_LOGGER.error('an error still shows')\n")
    quiet = subprocess.run([sys.executable, "-c", script.format("quiet_robosuite_imports()")], capture_output=True,
                           text=True, timeout=120, check=True)
    loud = subprocess.run([sys.executable, "-c", script.format("")], capture_output=True, text=True, timeout=120,
                          check=True)
    assert "No private macro file found" in loud.stdout + loud.stderr
    output = quiet.stdout + quiet.stderr
    assert "WARNING" not in output and "No private macro file" not in output
    assert "an error still shows" in output


def test_names_only_robosuite_knows_are_checked_before_any_worker():
    """``RobosuiteEnv.check_config`` (run by the driver's pre-flight): a typo in ``obs_keys`` or a
    camera name is refused naming the field and the task's names; keys beside the defaults are
    checked against the task itself (cube_quat is Lift's, cube_pos is not Stack's)."""
    from simulators.robosuite_env import RobosuiteEnv
    from vla_rl_core.components import ComponentConfigError

    RobosuiteEnv.check_config(RobosuiteEnvConfig(obs_keys=[*TASK_STATE_KEYS["Lift"], "cube_quat"]))
    RobosuiteEnv.check_config(RobosuiteEnvConfig(cameras=["sideview"], render_camera="frontview"))
    for config, field, wrong in [
        (RobosuiteEnvConfig(obs_keys=["robot0_eef_pos", "cube_poss"]), "obs_keys", "cube_poss"),
        (RobosuiteEnvConfig(task="Stack", obs_keys=["cube_pos"]), "obs_keys", "cube_pos"),
        (RobosuiteEnvConfig(cameras=["agentview", "eye"]), "cameras", "eye"),
        (RobosuiteEnvConfig(task="PickPlaceCan", render_camera="sideview"), "render_camera", "sideview"),
    ]:
        pattern = rf"\['{wrong}'\] not an? .* of {config.task}; available: "
        with pytest.raises(ComponentConfigError, match=pattern) as err:
            RobosuiteEnv.check_config(config)
        assert err.value.field == f"simulator.env.{field}"


def test_the_checks_shortcut_holds_for_the_default_keys_and_the_common_cameras():
    """``check_config`` builds nothing for a task's default keys with the cameras of
    EVERY_TASK_CAMERAS: that shortcut must agree with the task itself (built without renderers),
    here for the tasks with default keys on two arms."""
    from simulators.robosuite_env import EVERY_TASK_CAMERAS, _check_names, _make_robosuite_env

    for task in TASK_STATE_KEYS:
        for robot in ("Panda", "IIWA"):
            config = RobosuiteEnvConfig(task=task, robot=robot, cameras=EVERY_TASK_CAMERAS[1:],
                                        render_camera=EVERY_TASK_CAMERAS[0])
            env = _make_robosuite_env(RobosuiteEnvConfig(task=task, robot=robot))
            try:
                _check_names(env, config)
            finally:
                env.close()


@pytest.mark.slow
def test_every_task_cameras_are_the_cameras_of_every_single_arm_task():
    """The cameras every single-arm task has (built without visual meshes, as check_config builds
    them): 15 tasks, about 40 s on the 2-core machine."""
    from simulators.robosuite_env import EVERY_TASK_CAMERAS, SINGLE_ARM_TASKS
    from simulators.robosuite_lean import lean_task_class

    common = None
    for task in SINGLE_ARM_TASKS:
        env = lean_task_class(task)(robots="Panda", has_renderer=False, has_offscreen_renderer=False,
                                    use_camera_obs=False, ignore_done=True)
        cameras = set(env.sim.model.camera_names)
        env.close()
        common = cameras if common is None else common & cameras
    assert common == set(EVERY_TASK_CAMERAS)


@pytest.mark.parametrize("settings, message", [
    ({"task": "Wipe", "obs_keys": ["robot0_eef_pos"]}, "task 'Wipe' is not supported: robosuite 1.5.2 draws its dirt"),
    ({"controller": "JOINT_VELOCITY"}, "controller 'JOINT_VELOCITY' is not supported: robosuite 1.5.2 cannot build"),
    ({"controller": "IK_POSE", "robot": "UR5e"}, "controller 'IK_POSE' drives only Panda, Sawyer in robosuite 1.5.2, "
                                                 "not robot 'UR5e'"),
    # robosuite picks their object at each reset and switches the others' observations off
    ({"task": "PickPlaceSingle", "obs_keys": ["robot0_eef_pos"]}, "task 'PickPlaceSingle' is not supported: robosuite "
                                                                  "draws its one object at every reset"),
    ({"task": "NutAssemblySingle", "obs_keys": ["robot0_eef_pos"]}, "task 'NutAssemblySingle' is not supported"),
    # robosuite runs int(500 / control_freq) physics steps of 2 ms: 600 Hz ran none, 30 Hz 32 ms
    ({"control_freq": 600}, "control_freq must divide robosuite's 500 Hz physics .* got 600, which robosuite would "
                            "run as 0"),
    ({"control_freq": 30}, "control_freq must divide .* got 30, which robosuite would run as 16"),
])
def test_what_robosuite_cannot_build_or_seed_is_refused_with_the_config(settings, message):
    """They were accepted, then failed at the first reset, in the simulator actors."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as err:
        RobosuiteEnvConfig(**settings)
    # the setting at fault, named (a template's error said only 'simulator.env')
    assert err.value.field == next(k for k in ("controller", "control_freq", "task") if k in settings)
    assert re.match(message.replace("(", r"\("), err.value.message)
    RobosuiteEnvConfig(controller="IK_POSE", robot="Sawyer")  # IK drives these
    for control_freq in (10, 20, 25.0, 500):  # whole numbers of 2 ms physics steps
        RobosuiteEnvConfig(control_freq=control_freq)


def test_the_refusals_still_hold_on_the_installed_robosuite():
    """Each refusal's reason is checked against robosuite itself, so that a robosuite that fixes
    one shows here: JOINT_VELOCITY fails to build, IK_POSE names its robots, Wipe has no sampler."""
    from types import SimpleNamespace

    from robosuite.controllers.parts.arm.ik import SUPPORTED_IK_ROBOTS

    from simulators.robosuite_env import IK_ROBOTS, SINGLE_ARM_ROBOTS, _make_robosuite_env

    assert set(IK_ROBOTS) == set(SUPPORTED_IK_ROBOTS) & set(SINGLE_ARM_ROBOTS)
    unvalidated = {"robot": "Panda", "horizon": 10, "control_freq": 20, "render_camera": None, "cameras": ()}
    with pytest.raises(AttributeError, match="torque_compensation"):
        _make_robosuite_env(SimpleNamespace(task="Lift", controller="JOINT_VELOCITY", **unvalidated))
    wipe = _make_robosuite_env(SimpleNamespace(task="Wipe", controller="OSC_POSE", **unvalidated))
    try:
        assert not hasattr(wipe, "placement_initializer")
    finally:
        wipe.close()
