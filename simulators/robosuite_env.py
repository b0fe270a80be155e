"""robosuite manipulation tasks (Lift by default) as a gymnasium environment on compact state.

Registered as ``robosuite_lift`` (the training default) and ``robosuite`` (the same environment;
pick the task with ``task: Stack``). Each task of :data:`TASK_STATE_KEYS` has a default compact
state: the robot's proprioception (end-effector position, finger positions) and the task's
object state; other robosuite tasks need ``obs_keys``.

Units and conventions of the default Lift observation (robosuite 1.5.2, Panda, world frame):

- ``robot0_eef_pos`` (3): end-effector site position, metres.
- ``robot0_gripper_qpos`` (2): finger joint positions, metres (about +-0.039 open, +-0.025 holding
  the cube).
- ``cube_pos`` (3): cube centre, metres (the table top is at z = 0.8 m).
- ``gripper_to_cube_pos`` (3): ``cube_pos - robot0_eef_pos``, metres.
- ``robot0_eef_quat`` (4): the hand's orientation, quaternion ``(x, y, z, w)`` (last: 15 values
  in all, :data:`LIFT_STATE_KEYS`).

Other robosuite keys (e.g. ``cube_quat``) can be added through ``obs_keys``.

Camera observations are opt-in (``cameras``): the observation is then a ``gymnasium.spaces.Dict``
``{"state": float32 (obs_dim,), "<camera>_image": uint8 (camera_size, camera_size, 3)}``, images
upright. Without cameras it stays the flat ``Box``.
The cameras are rendered when an observation is built (``reset``, ``step``, ``observe``), never
inside robosuite's step: ``step_unobserved`` advances without rendering, which the simulator
workers use for every action of a chunk but the last.

Actions (``OSC_POSE``, 7 values in [-1, 1]): a position delta of up to 0.05 m per control step
and an axis-angle rotation delta of up to 0.5 rad per control step, both in the robot base frame
(aligned with the world frame for the Panda in Lift), then the gripper (-1 open, +1 close).
One control step lasts ``1 / control_freq`` seconds (50 ms at 20 Hz).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simulators.base import MAX_IMAGE_SIZE, SingleEnv, require_int
from simulators.registry import SIMULATORS
from simulators.rendering import CameraRenderer, egl_device_hidden_from_robosuite, setup_headless_rendering
from simulators.robosuite_lean import lean_task_class
from simulators.stepping import UnobservedSteps
from vla_rl_core.components import ComponentConfigError

LIFT_STATE_KEYS: tuple[str, ...] = (
    "robot0_eef_pos",
    "robot0_gripper_qpos",
    "cube_pos",
    "gripper_to_cube_pos",
    "robot0_eef_quat",
)
"""The Lift state (15 values), in observation order: the hand's position and fingers, the cube's
position, the hand-to-cube vector, and last the hand's orientation (quaternion (x, y, z, w)), so
that policies reading the leading proprio features (OpenVLA-OFT's 5, π0's 11) read what they
did without it. The actions turn the hand (OSC pose); without its orientation in the state, SRPO
from a two-demonstration warm start was a lottery over seeds (held-out greedy 40%, 82%, 30% on
seeds 0-2), and RL on 8 fixed initial states did not improve on them; with it and the warm
start's ``obs_std_floor`` of 0.1 it did (docs/seeds/embodied_srpo/diagnosis.md has the runs and
the sweep). The cube's orientation stays out (its yaw does not matter for lifting)."""

_PROPRIO_KEYS: tuple[str, ...] = ("robot0_eef_pos", "robot0_gripper_qpos")

TASK_STATE_KEYS: dict[str, tuple[str, ...]] = {
    "Lift": LIFT_STATE_KEYS,
    # cube A is picked and stacked on cube B: both positions and the relative vectors (20 values)
    "Stack": (*_PROPRIO_KEYS, "cubeA_pos", "cubeB_pos", "gripper_to_cubeA", "gripper_to_cubeB",
              "cubeA_to_cubeB"),
    # the can's pose and its pose relative to the hand (19 values); the bin targets are fixed
    "PickPlaceCan": (*_PROPRIO_KEYS, "Can_pos", "Can_quat", "Can_to_robot0_eef_pos",
                     "Can_to_robot0_eef_quat"),
    # door and handle positions, hand-to-handle vector, hinge and handle angles in rad, and the hand's
    # orientation (quaternion (x, y, z, w); 20 values). The orientation is needed: the hand cannot
    # reach down over the handle (its 0.2 m palm would hit the panel 0.08 m behind it), so it turns
    # to point at the door, grips the lever and rolls with it as it turns, which the scripted
    # expert (simulators/experts/door.py) steers in closed loop and a policy must see too
    "Door": (*_PROPRIO_KEYS, "robot0_eef_quat", "door_pos", "handle_pos", "handle_to_eef_pos", "hinge_qpos",
             "handle_qpos"),
}
"""Default ``obs_keys`` per robosuite task (robosuite 1.5.2 observation names, Panda, metres)."""

PHYSICS_HZ = 500.0
"""robosuite 1.5.2's physics rate (``robosuite.macros.SIMULATION_TIMESTEP`` = 2 ms)."""

SINGLE_ARM_TASKS: tuple[str, ...] = (
    "Door", "Lift", "NutAssembly", "NutAssemblyRound", "NutAssemblySingle", "NutAssemblySquare", "PickPlace",
    "PickPlaceBread", "PickPlaceCan", "PickPlaceCereal", "PickPlaceMilk", "PickPlaceSingle", "Stack", "ToolHang",
    "Wipe",
)
"""robosuite 1.5.2's single-arm tasks (``robosuite.ALL_ENVIRONMENTS`` without the two-arm ones),
listed here so that a config is checked without importing robosuite."""

_OBJECT_PER_RESET = ("robosuite draws its one object at every reset and turns the other objects' observations "
                     "off, so an episode's state has another layout or describes another object than the next's; "
                     "use the task of one object ({})")
UNSUPPORTED_TASKS: dict[str, str] = {
    "Wipe": "robosuite 1.5.2 draws its dirt markers from a generator fixed when the model is built "
            "(WipeArena.rng) and it has no placement sampler, so its resets cannot be seeded",
    "PickPlaceSingle": _OBJECT_PER_RESET.format("PickPlaceBread, PickPlaceCan, PickPlaceCereal or PickPlaceMilk"),
    "NutAssemblySingle": _OBJECT_PER_RESET.format("NutAssemblyRound or NutAssemblySquare"),
}
"""Tasks of :data:`SINGLE_ARM_TASKS` a config refuses, with the reason."""

UNBUILDABLE_CONTROLLERS: dict[str, str] = {
    "JOINT_VELOCITY": "robosuite 1.5.2 cannot build it (JointVelocityController sets the read-only property "
                      "torque_compensation); use JOINT_POSITION or JOINT_TORQUE",
}
"""Controllers of :data:`PART_CONTROLLERS` a config refuses, with the reason (a test checks that
robosuite still fails to build them)."""

IK_ROBOTS: tuple[str, ...] = ("Panda", "Sawyer")
"""The robots of :data:`SINGLE_ARM_ROBOTS` robosuite 1.5.2's ``IK_POSE`` controller drives
(``SUPPORTED_IK_ROBOTS``; a test compares them)."""

SINGLE_ARM_ROBOTS: tuple[str, ...] = (
    "IIWA", "Jaco", "Kinova3", "Panda", "PandaDexLH", "PandaDexRH", "PandaOmron", "Sawyer", "SpotWithArm", "UR5e",
    "XArm7",
)
"""robosuite 1.5.2's single-arm robots that :class:`RobosuiteEnv` drives (``robosuite.robots.ROBOT_CLASS_MAPPING``
with a one-arm model, listed here so that a config is checked without importing robosuite; a test
compares them). Left out: the two-arm robots (Baxter, Tiago, GR1*), whose observation keys are
not ``robot0_*``, and ``SpotWithArmFloating``, which robosuite cannot build with an arm controller
alone. The scripted experts act for the arms with a one-value gripper (:data:`GRIPPER_ARMS`)."""

GRIPPER_ARMS: tuple[str, ...] = ("IIWA", "Jaco", "Kinova3", "Panda", "Sawyer", "UR5e", "XArm7")
"""Fixed-base arms with a one-value gripper action: ``OSC_POSE`` takes 7 values (6 + gripper).
The others take more (PandaDexLH/RH: a 6-value hand, PandaOmron: its base and torso, SpotWithArm:
its legs)."""

EVERY_TASK_CAMERAS: tuple[str, ...] = ("agentview", "birdview", "frontview", "robot0_eye_in_hand", "robot0_robotview")
"""The cameras of every task of :data:`SINGLE_ARM_TASKS` with a one-arm robot (robosuite 1.5.2;
``sideview`` is not among them: the PickPlace tasks lack it). A test compares them."""

PANDA_STATE_ROBOTS: tuple[str, ...] = ("Panda", "Sawyer")
"""Robots whose ``robot0_gripper_qpos`` has 2 values, as :data:`STATE_KEY_SIZES` counts (measured:
the Lift state is 15 values with both, 19 with IIWA, Jaco, Kinova3, UR5e, XArm7)."""

PART_CONTROLLERS: tuple[str, ...] = (
    "JOINT_VELOCITY",
    "JOINT_TORQUE",
    "JOINT_POSITION",
    "OSC_POSITION",
    "OSC_POSE",
    "IK_POSE",
)
"""robosuite 1.5 arm controllers (``robosuite.controllers.ALL_PART_CONTROLLERS``)."""

STATE_KEY_SIZES: dict[str, int] = {
    "robot0_eef_pos": 3, "robot0_eef_quat": 4, "robot0_gripper_qpos": 2, "robot0_gripper_qvel": 2,
    "robot0_joint_pos": 7, "robot0_joint_pos_cos": 7, "robot0_joint_pos_sin": 7, "robot0_joint_vel": 7,
    "cube_pos": 3, "cube_quat": 4, "gripper_to_cube_pos": 3,
    "cubeA_pos": 3, "cubeA_quat": 4, "cubeB_pos": 3, "cubeB_quat": 4, "gripper_to_cubeA": 3, "gripper_to_cubeB": 3,
    "cubeA_to_cubeB": 3, "Can_pos": 3, "Can_quat": 4, "Can_to_robot0_eef_pos": 3, "Can_to_robot0_eef_quat": 4,
    "door_pos": 3, "handle_pos": 3, "handle_to_eef_pos": 3, "hinge_qpos": 1, "handle_qpos": 1,
}
"""Sizes of the robosuite 1.5.2 observation keys (Panda) of the default states and their usual
companions, for sizes known before any environment exists (the planner's traffic estimates);
the environment measures its own layout."""

_ARM_ACTION_SIZES: dict[str, int] = {"OSC_POSE": 6, "IK_POSE": 6, "OSC_POSITION": 3}
"""Arm action values of the controllers whose layout does not depend on the robot's joints."""

TASK_INSTRUCTIONS: dict[str, str] = {
    "Lift": "lift the cube",
    "Stack": "stack the red cube on the green cube",
    "PickPlaceCan": "pick up the can and place it in its bin",
    "Door": "open the door",
}
"""Language instruction of each robosuite task, used when ``RobosuiteEnvConfig.instruction`` is
unset (robosuite tasks carry no instruction of their own; these paraphrase their success tests)."""

MODEL_SEED = 0
"""Seed of robosuite's model-time randomisation (e.g. the cube's size), so that every process
builds the same model; per-episode randomness is seeded in :meth:`RobosuiteEnv.reset`."""


@dataclass(frozen=True)
class RobosuiteEnvConfig:
    """Configuration of :class:`RobosuiteEnv`.

    Raises:
        ValueError: from ``__post_init__``, naming the field and how to fix it.
    """

    task: str = "Lift"
    """robosuite environment name (one of ``robosuite.ALL_ENVIRONMENTS``)."""
    robot: str = "Panda"
    """robosuite single-arm robot name, one of :data:`SINGLE_ARM_ROBOTS`."""
    controller: str = "OSC_POSE"
    """Arm controller, one of :data:`PART_CONTROLLERS`; sets the action layout."""
    horizon: int = 100
    """Time limit in control steps; ``step`` reports ``truncated`` when it is reached."""
    control_freq: float = 20.0
    """Control frequency, Hz (one ``step`` = ``1 / control_freq`` seconds of simulation): it must
    divide robosuite's 500 Hz physics (robosuite runs ``int(500 / control_freq)`` steps of 2 ms)."""
    obs_keys: tuple[str, ...] | None = None
    """robosuite observation keys concatenated, in this order, into the flat observation;
    ``None``: the task's default of :data:`TASK_STATE_KEYS`."""
    render_camera: str | None = None
    """Camera for :meth:`RobosuiteEnv.render_frame` (e.g. ``"agentview"``); ``None``: no renderer."""
    render_size: int = 128
    """Height and width of rendered frames, pixels."""
    cameras: tuple[str, ...] = ()
    """Cameras whose images join the observation (e.g. ``("agentview", "robot0_eye_in_hand")``);
    empty: the flat state ``Box`` observation."""
    camera_size: int = 128
    """Height and width of camera observations, pixels (e.g. 128 or 224)."""
    fast_rendering: bool = False
    """Render camera observations and frames without shadows and reflections (about twice as
    fast on CPU)."""
    instruction: str | None = None
    """Language instruction of the task; ``None``: ``TASK_INSTRUCTIONS[task]``."""

    @property
    def task_name(self) -> str:
        """The robosuite task (``task``)."""
        return self.task

    @property
    def state_dim(self) -> int | None:
        """Length of the state vector, when every key of ``obs_keys`` is in :data:`STATE_KEY_SIZES`
        and the robot is one of :data:`PANDA_STATE_ROBOTS` (else None: only the environment knows)."""
        if self.robot not in PANDA_STATE_ROBOTS or not all(key in STATE_KEY_SIZES for key in self.obs_keys):
            return None
        return sum(STATE_KEY_SIZES[key] for key in self.obs_keys)

    @property
    def action_dim(self) -> int | None:
        """Action length (the arm's, plus one for the gripper) for the controllers of
        :data:`_ARM_ACTION_SIZES` on the arms of :data:`GRIPPER_ARMS` (a Panda's joint
        controllers: 7 + 1); else None."""
        if self.robot not in GRIPPER_ARMS:
            return None
        if self.controller in _ARM_ACTION_SIZES:
            return _ARM_ACTION_SIZES[self.controller] + 1
        return 8 if self.robot == "Panda" else None

    def __post_init__(self) -> None:
        """Raises: ComponentConfigError (a ValueError) naming the setting at fault (``task``,
        ``robot``, ``controller``, ``control_freq``, ``obs_keys``): a template names it as
        ``simulator.env.<setting>``."""
        if self.task not in SINGLE_ARM_TASKS:
            raise ComponentConfigError("task", f"task must be a single-arm robosuite task, one of "
                                               f"{', '.join(SINGLE_ARM_TASKS)}; got {self.task!r}")
        if self.robot not in SINGLE_ARM_ROBOTS:
            raise ComponentConfigError("robot", f"robot must be a single-arm robosuite robot, one of "
                                                f"{', '.join(SINGLE_ARM_ROBOTS)}; got {self.robot!r}")
        if self.task in UNSUPPORTED_TASKS:
            raise ComponentConfigError("task", f"task {self.task!r} is not supported: {UNSUPPORTED_TASKS[self.task]}")
        if self.controller not in PART_CONTROLLERS:
            raise ComponentConfigError("controller", f"controller must be one of {PART_CONTROLLERS}, "
                                                     f"got {self.controller!r}")
        if self.controller in UNBUILDABLE_CONTROLLERS:
            raise ComponentConfigError("controller", f"controller {self.controller!r} is not supported: "
                                                     f"{UNBUILDABLE_CONTROLLERS[self.controller]}")
        if self.controller == "IK_POSE" and self.robot not in IK_ROBOTS:
            raise ComponentConfigError("controller", f"controller 'IK_POSE' drives only {', '.join(IK_ROBOTS)} in "
                                                     f"robosuite 1.5.2, not robot {self.robot!r}; use OSC_POSE")
        require_int("horizon", self.horizon, 1)
        if isinstance(self.control_freq, bool) or not isinstance(self.control_freq, (int, float)) or not (
            self.control_freq > 0
        ):
            raise ComponentConfigError("control_freq", f"control_freq must be a positive number of Hz, got "
                                                       f"{self.control_freq!r}")
        substeps = PHYSICS_HZ / self.control_freq  # robosuite runs int() of this many 2 ms physics steps
        if substeps < 1 or abs(substeps - round(substeps)) > 1e-9:
            valid = ", ".join(f"{PHYSICS_HZ / n:g}" for n in (1, 2, 4, 5, 10, 20, 25, 50))
            raise ComponentConfigError(
                "control_freq", f"control_freq must divide robosuite's {PHYSICS_HZ:g} Hz physics into a whole number "
                f"of steps (one control step = 500 / control_freq steps of 2 ms; got {self.control_freq!r}, which "
                f"robosuite would run as {int(substeps)}): e.g. {valid}")
        if self.obs_keys is None:
            if self.task not in TASK_STATE_KEYS:
                raise ComponentConfigError("obs_keys", f"task {self.task!r} has no default state keys; set obs_keys "
                                                       f"(tasks with defaults: {', '.join(TASK_STATE_KEYS)})")
            object.__setattr__(self, "obs_keys", TASK_STATE_KEYS[self.task])
        if isinstance(self.obs_keys, str) or not all(isinstance(key, str) for key in self.obs_keys):
            raise ComponentConfigError("obs_keys", f"obs_keys must be a sequence of key names, got {self.obs_keys!r}")
        object.__setattr__(self, "obs_keys", tuple(self.obs_keys))  # YAML gives lists
        if not self.obs_keys or len(set(self.obs_keys)) != len(self.obs_keys):
            raise ComponentConfigError("obs_keys", f"obs_keys must be non-empty and without repeats, got "
                                                   f"{self.obs_keys!r}")
        if self.render_camera is not None and (not isinstance(self.render_camera, str) or not self.render_camera):
            raise ComponentConfigError("render_camera", f"render_camera must be a camera name such as 'agentview' or "
                                                        f"None, got {self.render_camera!r}")
        require_int("render_size", self.render_size, 8, MAX_IMAGE_SIZE)
        if isinstance(self.cameras, str) or not all(isinstance(c, str) and c for c in self.cameras):
            raise ComponentConfigError("cameras", f"cameras must be a sequence of camera names such as "
                                                  f"('agentview',), got {self.cameras!r}")
        object.__setattr__(self, "cameras", tuple(self.cameras))  # YAML gives lists
        if len(set(self.cameras)) != len(self.cameras):
            raise ComponentConfigError("cameras", f"cameras must not repeat a camera, got {self.cameras!r}")
        require_int("camera_size", self.camera_size, 8, MAX_IMAGE_SIZE)
        if not isinstance(self.fast_rendering, bool):
            raise ComponentConfigError(
                "fast_rendering", f"fast_rendering must be true or false, got {self.fast_rendering!r}")
        if self.instruction is None:
            if self.task not in TASK_INSTRUCTIONS:
                raise ComponentConfigError(
                    "instruction",
                    f"instruction is unset and task {self.task!r} has no default instruction "
                    f"(known: {sorted(TASK_INSTRUCTIONS)}); set instruction to a sentence such as 'lift the cube'"
                )
            object.__setattr__(self, "instruction", TASK_INSTRUCTIONS[self.task])
        if not isinstance(self.instruction, str) or not self.instruction.strip():
            raise ComponentConfigError(
                "instruction", f"instruction must be a non-empty sentence, got {self.instruction!r}")


@SIMULATORS.register("robosuite")
@SIMULATORS.register("robosuite_lift")
class RobosuiteEnv(UnobservedSteps, SingleEnv):
    """A robosuite task as a ``gymnasium.Env`` with a flat float32 state observation (or, with
    ``config.cameras``, a ``Dict`` of that state and camera images; see the module docstring).

    The task is created once (``hard_reset=False``, about 3-5 s); resets then take milliseconds.
    Reward is 1.0 on success and 0.0 otherwise; an episode terminates on success and is
    truncated after ``config.horizon`` control steps. The environment never resets itself.

    Args:
        config: the environment's configuration.

    Raises:
        TypeError: if ``config`` is not a :class:`RobosuiteEnvConfig`.
        ComponentConfigError: (a ValueError) if an observation key, the render camera or one of
            ``cameras`` does not exist in the task (the message names the field and lists the
            available ones).
    """

    config_class = RobosuiteEnvConfig

    @staticmethod
    def check_config(config: RobosuiteEnvConfig) -> None:
        """Check the names only robosuite knows, before any worker builds the task: ``obs_keys``
        must be observations of the task and ``render_camera`` and ``cameras`` its cameras.
        Instant for the task's default keys (:data:`TASK_STATE_KEYS`) and the cameras of
        :data:`EVERY_TASK_CAMERAS` on an arm of :data:`GRIPPER_ARMS`; else it imports robosuite
        and builds the task without renderers (about 3 s on one core).

        Raises:
            ComponentConfigError: (a ValueError) naming the field (``simulator.env.obs_keys``,
                ``simulator.env.render_camera``, ``simulator.env.cameras``), the names that do not
                exist and the available ones.
        """
        if (config.robot in GRIPPER_ARMS and config.obs_keys == TASK_STATE_KEYS.get(config.task)
                and {config.render_camera, *config.cameras} <= {None, *EVERY_TASK_CAMERAS}):
            return
        setup_headless_rendering()
        env = _make_robosuite_env(dataclasses.replace(config, render_camera=None, cameras=()))
        try:
            _check_names(env, config)
        finally:
            env.close()

    def __init__(self, config: RobosuiteEnvConfig) -> None:
        if not isinstance(config, RobosuiteEnvConfig):
            raise TypeError(f"config must be a RobosuiteEnvConfig, got {type(config).__name__}")
        self.config = config
        self.render_mode = "rgb_array" if config.render_camera is not None else None
        setup_headless_rendering()
        self._env = _make_robosuite_env(config)
        try:
            self._obs_layout = _check_names(self._env, config)
        except ValueError:
            self._env.close()
            raise
        renders = bool(config.cameras) or config.render_camera is not None
        # robosuite's own renderer hides the collision meshes (geom group 0) by default
        self._renderer = CameraRenderer(self._env.sim.model._model, self._env.sim.data._data,
                                        fast=config.fast_rendering, hidden_geom_groups=(0,)) if renders else None
        self._init_spaces(sum(s.stop - s.start for s in self._obs_layout.values()), int(self._env.action_dim))
        self._raw_obs: dict[str, np.ndarray] = {}  # robosuite's observation of the current state
        self._streams_seeded = False  # robosuite's generators start from its fixed MODEL_SEED

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        """Start an episode.

        Args:
            seed: the initial-state id. The same seed gives the same initial state (robot joint
                noise and cube placement), in any process; ``None`` continues the current random
                stream, which a first reset without a seed starts from gymnasium's ``np_random``
                (fresh entropy, as ``robosuite.make(seed=None)``; robosuite's own generators start
                from one fixed seed, so every environment gave the same episodes).
            options: ``None`` or empty (no reset options are supported).

        Returns:
            ``(obs, info)``: obs float32 ``(obs_dim,)`` (or the camera ``Dict``); info
            ``{"success": False, "episode_step": 0}``.

        Raises:
            ValueError: if ``seed`` is not a non-negative integer or ``options`` holds any.
        """
        seed = self._checked_seed(seed, options)
        super().reset(seed=seed)
        if seed is not None or not self._streams_seeded:
            rng = np.random.default_rng(seed if seed is not None else self.np_random.integers(2**63))
            self._env.rng = rng  # drives the robot's initial joint noise
            _seed_placement(self._env.placement_initializer, rng)  # drives the object placement
            self._streams_seeded = True
        self._raw_obs = self._env.reset()
        self._episode_step = 0
        self._episode_over = False
        return self.observe(), {"success": False, "episode_step": 0}

    def step_unobserved(self, action: np.ndarray) -> tuple[float, bool, bool, dict]:
        """Apply one control action for ``1 / control_freq`` seconds, without building the observation.

        Args:
            action: ``(action_dim,)`` values in [-1, 1] (clipped); see the module docstring.

        Returns and raises: as :class:`simulators.stepping.UnobservedSteps` (``step`` is this,
        then :meth:`observe`).
        """
        self._raw_obs, _, _, _ = self._env.step(self._checked_action(action))
        return self._end_of_step(bool(self._env._check_success()))  # robosuite's success test, as robomimic's

    def observe(self) -> Any:
        """The observation of the current state, as :meth:`reset` and :meth:`step` return it
        (camera images rendered now, from the state the last reset or step left)."""
        state = np.concatenate([np.ravel(self._raw_obs[key]) for key in self.config.obs_keys]).astype(np.float32)
        return self._camera_observation(state)

    def _render(self, camera: str, size: int) -> np.ndarray:
        """uint8 ``(size, size, 3)``: ``camera``'s view of the current state, upright (through the
        process's shared renderer: :class:`simulators.rendering.CameraRenderer`)."""
        return self._renderer.render(camera, size)


#: robosuite's console logging level in the simulator processes (its ``CONSOLE_LOGGING_LEVEL`` macro).
ROBOSUITE_CONSOLE_LEVEL = "ERROR"


def quiet_robosuite_imports() -> None:
    """Before robosuite's first import in this process, set its console logger to
    :data:`ROBOSUITE_CONSOLE_LEVEL`: importing it prints five warnings in every simulator process
    (no private macro file, no ``robosuite_models``, no mink IK) and every environment an INFO line
    per controller. robosuite reads its settings from ``robosuite/macros_private.py`` when there is
    one; without one, this registers an in-memory ``robosuite.macros_private`` holding only the
    level. A user's own ``macros_private.py`` decides instead, and a robosuite already imported is
    left as it is."""
    if "robosuite" in sys.modules or "robosuite.macros_private" in sys.modules:
        return
    spec = importlib.util.find_spec("robosuite")  # locates the package, imports nothing
    if spec is None or not spec.submodule_search_locations:
        return
    if any((Path(location) / "macros_private.py").exists() for location in spec.submodule_search_locations):
        return
    macros = types.ModuleType("robosuite.macros_private")
    macros.CONSOLE_LOGGING_LEVEL = ROBOSUITE_CONSOLE_LEVEL
    sys.modules["robosuite.macros_private"] = macros


def _make_robosuite_env(config: RobosuiteEnvConfig) -> Any:
    """Create the robosuite task (imports robosuite; call after ``setup_headless_rendering``).

    An environment that never renders (no ``render_camera``, no ``cameras``) is built without
    visual meshes and textures (:mod:`simulators.robosuite_lean`): a third of the memory, half
    the creation time, identical physics and observations.
    """
    quiet_robosuite_imports()
    with egl_device_hidden_from_robosuite():
        import robosuite
        from robosuite.controllers import load_part_controller_config
        from robosuite.controllers.composite.composite_controller_factory import (
            refactor_composite_controller_config,
        )

    renders = config.render_camera is not None or bool(config.cameras)
    arm_config = load_part_controller_config(default_controller=config.controller)
    controller_configs = refactor_composite_controller_config(arm_config, config.robot, ["right"])
    build = functools.partial(robosuite.make, config.task) if renders else lean_task_class(config.task)
    return build(
        robots=config.robot,
        controller_configs=controller_configs,
        horizon=config.horizon,
        control_freq=config.control_freq,
        has_renderer=False,
        # RobosuiteEnv renders its cameras itself (a renderer shared by the process's environments),
        # only when an observation or a frame is asked for: no per-environment offscreen context
        has_offscreen_renderer=False,
        use_camera_obs=False,
        reward_shaping=False,
        ignore_done=True,  # the time limit is ours (truncated), not robosuite's
        hard_reset=False,
        seed=MODEL_SEED,
    )


def _seed_placement(sampler: Any, rng: np.random.Generator) -> None:
    """Give a placement sampler and, for a composite one (PickPlace's ``SequentialCompositeSampler``),
    each of its samplers the generator ``rng``: they were built with their own reference to the
    environment's first generator."""
    sampler.rng = rng
    for child in getattr(sampler, "samplers", {}).values():
        _seed_placement(child, rng)


def _check_names(env: Any, config: RobosuiteEnvConfig) -> dict[str, slice]:
    """The observation layout of ``config.obs_keys`` in robosuite task ``env``, after checking that
    they and the cameras ``config`` names exist in it.

    Raises:
        ComponentConfigError: naming the field, the missing names and the available ones.
    """
    layout = _obs_layout(env.observation_spec(), config.obs_keys, config.task)
    cameras = list(env.sim.model.camera_names)
    for field, names in (("render_camera", [config.render_camera]), ("cameras", config.cameras)):
        unknown = [name for name in names if name is not None and name not in cameras]
        if unknown:
            raise ComponentConfigError(f"simulator.env.{field}",
                                       f"{unknown} not a camera of {config.task}; available: {cameras}")
    return layout


def _obs_layout(observation_spec: dict[str, np.ndarray], obs_keys: tuple[str, ...], task: str) -> dict[str, slice]:
    """Slices of each key in the flat observation.

    Raises:
        ComponentConfigError: (field ``simulator.env.obs_keys``) if a key is missing (the message
            lists the available keys).
    """
    missing = [key for key in obs_keys if key not in observation_spec]
    if missing:
        raise ComponentConfigError("simulator.env.obs_keys", f"{missing} not an observation of {task}; available: "
                                   f"{sorted(observation_spec)}")
    layout, start = {}, 0
    for key in obs_keys:
        size = int(np.size(observation_spec[key]))
        layout[key] = slice(start, start + size)
        start += size
    return layout
