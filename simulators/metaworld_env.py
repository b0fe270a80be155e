"""MetaWorld v3 tasks (Yu et al. 2019, arXiv 1910.10897; ``metaworld`` 3.1.1) as a gymnasium environment.

Registered as ``metaworld``; pick the task with ``task`` (one of :data:`METAWORLD_V3_TASKS`, e.g.
``reach-v3``). Task sets: :data:`MT10_TASKS`, :data:`ML10_TRAIN_TASKS`, :data:`ML10_TEST_TASKS`
(MetaWorld's benchmark splits, v3 names); every task on its own is an MT1 benchmark.

Observation (float32, 39 values, :data:`METAWORLD_OBS_LAYOUT`): MetaWorld's own observation, so
that its scripted policies read it unchanged. World frame, metres:

- ``hand_pos`` (3): end-effector position.
- ``gripper_opening`` (1): distance between the two fingers / 0.1 m, clipped to [0, 1] (1: open).
- ``obj1_pos`` (3), ``obj1_quat`` (4), ``obj2_pos`` (3), ``obj2_quat`` (4): the task's main
  object(s) (e.g. the puck, the drawer handle, the peg and the hole); zeros where a task has
  fewer objects. The quaternion convention is the task's own: most tasks give scipy's
  ``(x, y, z, w)``, some MuJoCo's ``(w, x, y, z)``, and some report zeros.
- ``prev_*`` (18): the same 18 values one control step earlier (MetaWorld's frame stacking; at
  reset, a copy of the current values).
- ``goal_pos`` (3): the goal position (``goal_observable=True``, MetaWorld's MT convention), or
  zeros under the key ``goal_pos_hidden`` (``goal_observable=False``, its ML convention).

Actions (4 values in [-1, 1]): a mocap position delta of up to 0.01 m per control step along x, y,
z, then the gripper effort (-1 open, +1 close). One control step is 5 MuJoCo steps of 2.5 ms
(12.5 ms).

Initial states: ``reset(seed=init_state_id)`` draws the task variation (MetaWorld's
``rand_vec``: object and goal positions, uniform over the task's ``_random_reset_space`` with the
task's own rejection rules) from ``numpy.random.default_rng(init_state_id)`` through MetaWorld's
seeded path (``seeded_rand_vec``), so an id gives the same variation in every process and distinct
ids give independent variations, without building MetaWorld's benchmark task lists.

Camera observations are opt-in (``cameras``): the observation is then a ``gymnasium.spaces.Dict``
``{"state": float32 (39,), "<camera>_image": uint8 (camera_size, camera_size, 3)}``. MetaWorld's
``corner*`` cameras are mounted upside down; their images are rotated by 180 degrees so that they
come out upright. They are rendered when an observation is built (``reset``, ``step``,
``observe``): ``step_unobserved`` advances without rendering, which the simulator workers use for
every action of a chunk but the last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from simulators.base import MAX_IMAGE_SIZE, SingleEnv, require_int
from simulators.registry import SIMULATORS
from simulators.rendering import CameraRenderer, setup_headless_rendering
from simulators.stepping import UnobservedSteps
from vla_rl_core.components import ComponentConfigError

METAWORLD_V3_TASKS: tuple[str, ...] = (
    "assembly-v3", "basketball-v3", "bin-picking-v3", "box-close-v3", "button-press-topdown-v3",
    "button-press-topdown-wall-v3", "button-press-v3", "button-press-wall-v3", "coffee-button-v3",
    "coffee-pull-v3", "coffee-push-v3", "dial-turn-v3", "disassemble-v3", "door-close-v3", "door-lock-v3",
    "door-open-v3", "door-unlock-v3", "hand-insert-v3", "drawer-close-v3", "drawer-open-v3",
    "faucet-open-v3", "faucet-close-v3", "hammer-v3", "handle-press-side-v3", "handle-press-v3",
    "handle-pull-side-v3", "handle-pull-v3", "lever-pull-v3", "pick-place-wall-v3", "pick-out-of-hole-v3",
    "pick-place-v3", "plate-slide-v3", "plate-slide-side-v3", "plate-slide-back-v3",
    "plate-slide-back-side-v3", "peg-insert-side-v3", "peg-unplug-side-v3", "soccer-v3", "stick-push-v3",
    "stick-pull-v3", "push-v3", "push-wall-v3", "push-back-v3", "reach-v3", "reach-wall-v3",
    "shelf-place-v3", "sweep-into-v3", "sweep-v3", "window-open-v3", "window-close-v3",
)
"""The 50 MetaWorld v3 tasks, in the order of ``metaworld.env_dict.ALL_V3_ENVIRONMENTS`` (MT50);
a test checks this copy against metaworld's list, so config validation needs no metaworld import."""

MT10_TASKS: tuple[str, ...] = (
    "reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
    "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3",
)
"""MetaWorld's MT10 benchmark (``metaworld.env_dict.MT10_V3``), in its order."""

ML10_TRAIN_TASKS: tuple[str, ...] = (
    "reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-close-v3", "button-press-topdown-v3",
    "peg-insert-side-v3", "window-open-v3", "sweep-v3", "basketball-v3",
)
"""The training tasks of MetaWorld's ML10 benchmark (``metaworld.env_dict.ML10_V3["train"]``)."""

ML10_TEST_TASKS: tuple[str, ...] = (
    "drawer-open-v3", "door-close-v3", "shelf-place-v3", "sweep-into-v3", "lever-pull-v3",
)
"""The held-out test tasks of MetaWorld's ML10 benchmark (``metaworld.env_dict.ML10_V3["test"]``)."""

TASK_INSTRUCTIONS: dict[str, str] = {
    "assembly-v3": "pick up the nut and place it onto the peg",
    "basketball-v3": "dunk the basketball into the hoop",
    "bin-picking-v3": "move the cube from one bin to the other bin",
    "box-close-v3": "pick up the lid and close the box",
    "button-press-topdown-v3": "press the button from the top",
    "button-press-topdown-wall-v3": "reach over the wall and press the button from the top",
    "button-press-v3": "press the button from the front",
    "button-press-wall-v3": "reach past the wall and press the button",
    "coffee-button-v3": "press the button on the coffee machine",
    "coffee-pull-v3": "pull the mug out of the coffee machine",
    "coffee-push-v3": "push the mug under the coffee machine",
    "dial-turn-v3": "turn the dial",
    "disassemble-v3": "pick the nut up off the peg",
    "door-close-v3": "close the door",
    "door-lock-v3": "turn the door lock to lock the door",
    "door-open-v3": "open the door",
    "door-unlock-v3": "turn the door lock to unlock the door",
    "hand-insert-v3": "insert the gripper into the hole",
    "drawer-close-v3": "push the drawer closed",
    "drawer-open-v3": "pull the drawer open",
    "faucet-open-v3": "turn the faucet handle to open the faucet",
    "faucet-close-v3": "turn the faucet handle to close the faucet",
    "hammer-v3": "hammer the nail into the wall",
    "handle-press-side-v3": "press the handle down from the side",
    "handle-press-v3": "press the handle down",
    "handle-pull-side-v3": "pull the handle up from the side",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up",
    "pick-place-wall-v3": "pick up the puck and place it at the goal behind the wall",
    "pick-out-of-hole-v3": "pick the peg out of the hole",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "plate-slide-v3": "slide the plate into the cabinet",
    "plate-slide-side-v3": "slide the plate sideways into the cabinet",
    "plate-slide-back-v3": "slide the plate back out of the cabinet",
    "plate-slide-back-side-v3": "slide the plate sideways out of the cabinet",
    "peg-insert-side-v3": "insert the peg into the hole from the side",
    "peg-unplug-side-v3": "unplug the peg sideways",
    "soccer-v3": "kick the ball into the goal",
    "stick-push-v3": "grasp the stick and push the box with it",
    "stick-pull-v3": "grasp the stick and pull the box with it",
    "push-v3": "push the puck to the goal",
    "push-wall-v3": "push the puck around the wall to the goal",
    "push-back-v3": "pull the puck back to the goal",
    "reach-v3": "reach the goal position",
    "reach-wall-v3": "reach over the wall to the goal position",
    "shelf-place-v3": "pick up the puck and place it on the shelf",
    "sweep-into-v3": "sweep the puck into the hole",
    "sweep-v3": "sweep the puck off the table",
    "window-open-v3": "slide the window open",
    "window-close-v3": "slide the window closed",
}
"""Language instruction of each task, used when ``MetaWorldEnvConfig.instruction`` is unset.
MetaWorld has none of its own; these paraphrase the task descriptions of the MetaWorld paper's
appendix and its success tests."""

_STATE_PARTS: tuple[tuple[str, int], ...] = (
    ("hand_pos", 3), ("gripper_opening", 1),
    ("obj1_pos", 3), ("obj1_quat", 4), ("obj2_pos", 3), ("obj2_quat", 4),
)


def _layout(goal_key: str) -> dict[str, slice]:
    parts = [*_STATE_PARTS, *((f"prev_{name}", size) for name, size in _STATE_PARTS), (goal_key, 3)]
    starts = np.cumsum([0, *(size for _, size in parts)])
    return {name: slice(int(starts[i]), int(starts[i + 1])) for i, (name, _) in enumerate(parts)}


METAWORLD_OBS_LAYOUT: dict[str, slice] = _layout("goal_pos")
"""Where each part lies in the 39-value observation with the goal observable (see the module
docstring); with ``goal_observable=False`` the last key is ``goal_pos_hidden`` instead."""

OBS_DIM = 39
"""Length of MetaWorld's observation."""

ACT_DIM = 4
"""Action length: xyz position delta and gripper effort."""

ROBOT = "Sawyer"
"""The robot arm of every MetaWorld task (``MetaWorldEnvConfig.robot``)."""

CONTROL_FREQ = 80.0
"""MetaWorld's control frequency, Hz: one ``step`` runs ``frame_skip`` = 5 MuJoCo steps of 2.5 ms
(MetaWorld's ``metadata["render_fps"]``, which gymnasium checks against ``1 / dt``)."""

MAX_PATH_LENGTH = 500
"""MetaWorld's own episode length (``SawyerXYZEnv.max_path_length``), control steps."""

METAWORLD_CAMERAS: tuple[str, ...] = (
    "topview", "corner", "corner2", "corner3", "corner4", "behindGripper", "gripperPOV",
)
"""Cameras of MetaWorld's Sawyer scenes (a test checks them against the model)."""

UPSIDE_DOWN_CAMERAS: frozenset[str] = frozenset({"corner", "corner2", "corner3", "corner4"})
"""Cameras whose up axis points downwards in the world: their images are rotated by 180 degrees."""


def _require_camera(name: str, value: Any) -> None:
    if value not in METAWORLD_CAMERAS:
        raise ComponentConfigError(
            name, f"{name} must be a MetaWorld camera, one of {METAWORLD_CAMERAS}; got {value!r}")


@dataclass(frozen=True)
class MetaWorldEnvConfig:
    """Configuration of :class:`MetaWorldEnv`.

    Raises:
        ValueError: from ``__post_init__``, naming the field and how to fix it.
    """

    task: str = "reach-v3"
    """MetaWorld v3 task name, one of :data:`METAWORLD_V3_TASKS` (e.g. ``"pick-place-v3"``)."""
    horizon: int = MAX_PATH_LENGTH
    """Time limit in control steps (MetaWorld's own is 500); ``step`` reports ``truncated`` when
    it is reached. MetaWorld's scripted policies solve the MT10 tasks in 36-250 steps."""
    goal_observable: bool = True
    """Whether the goal position is part of the observation (MetaWorld's MT benchmarks) or
    zeros (its ML benchmarks); the scripted experts need it."""
    render_camera: str | None = None
    """Camera for :meth:`MetaWorldEnv.render_frame`, one of :data:`METAWORLD_CAMERAS` (e.g.
    ``"corner"``); ``None``: no renderer."""
    render_size: int = 128
    """Height and width of rendered frames, pixels."""
    cameras: tuple[str, ...] = ()
    """Cameras whose images join the observation (e.g. ``("corner",)``); empty: the flat state
    ``Box`` observation."""
    camera_size: int = 128
    """Height and width of camera observations, pixels."""
    fast_rendering: bool = False
    """Render without shadows and reflections (faster on CPU)."""
    instruction: str | None = None
    """Language instruction of the task; ``None``: ``TASK_INSTRUCTIONS[task]``."""

    @property
    def task_name(self) -> str:
        """The MetaWorld task (``task``, e.g. ``"reach-v3"``)."""
        return self.task

    @property
    def robot(self) -> str:
        """The robot arm: MetaWorld's tasks all use a Sawyer (:data:`ROBOT`)."""
        return ROBOT

    @property
    def control_freq(self) -> float:
        """Control frequency, Hz (:data:`CONTROL_FREQ`)."""
        return CONTROL_FREQ

    @property
    def state_dim(self) -> int:
        """Length of MetaWorld's observation (:data:`OBS_DIM`)."""
        return OBS_DIM

    @property
    def action_dim(self) -> int:
        """Action length (:data:`ACT_DIM`)."""
        return ACT_DIM

    def __post_init__(self) -> None:
        if self.task not in METAWORLD_V3_TASKS:
            close = [name for name in METAWORLD_V3_TASKS if str(self.task).split("-")[0] in name]
            hint = f" (similar: {', '.join(close)})" if close else ""
            raise ComponentConfigError(
                "task", f"task must be a MetaWorld v3 task name such as 'reach-v3', got {self.task!r}{hint}; "
                f"all tasks: {', '.join(METAWORLD_V3_TASKS)}")
        require_int("horizon", self.horizon, 1)
        if not isinstance(self.goal_observable, bool):
            raise ComponentConfigError(
                "goal_observable", f"goal_observable must be true or false, got {self.goal_observable!r}")
        if self.render_camera is not None:
            _require_camera("render_camera", self.render_camera)
        require_int("render_size", self.render_size, 8, MAX_IMAGE_SIZE)
        if isinstance(self.cameras, str) or not all(isinstance(c, str) for c in self.cameras):
            raise ComponentConfigError(
                "cameras", f"cameras must be a sequence of camera names such as ('corner',), got {self.cameras!r}")
        object.__setattr__(self, "cameras", tuple(self.cameras))  # YAML gives lists
        for camera in self.cameras:
            _require_camera("cameras", camera)
        if len(set(self.cameras)) != len(self.cameras):
            raise ComponentConfigError("cameras", f"cameras must not repeat a camera, got {self.cameras!r}")
        require_int("camera_size", self.camera_size, 8, MAX_IMAGE_SIZE)
        if not isinstance(self.fast_rendering, bool):
            raise ComponentConfigError(
                "fast_rendering", f"fast_rendering must be true or false, got {self.fast_rendering!r}")
        if self.instruction is None:
            object.__setattr__(self, "instruction", TASK_INSTRUCTIONS[self.task])
        if not isinstance(self.instruction, str) or not self.instruction.strip():
            raise ComponentConfigError(
                "instruction", f"instruction must be a non-empty sentence, got {self.instruction!r}")


@SIMULATORS.register("metaworld")
class MetaWorldEnv(UnobservedSteps, SingleEnv):
    """One MetaWorld v3 task as a ``gymnasium.Env`` with MetaWorld's flat 39-value float32
    observation (or, with ``config.cameras``, a ``Dict`` of it and camera images; see the module
    docstring).

    The task is created once (about 0.1-0.2 s); a reset draws the task variation of its seed and
    settles the hand (about 100 control steps of simulation inside MetaWorld). Reward is 1.0 on
    success (MetaWorld's ``info["success"]``) and 0.0 otherwise; an episode terminates on success
    and is truncated after ``config.horizon`` control steps. The environment never resets itself.

    Args:
        config: the environment's configuration.

    Raises:
        TypeError: if ``config`` is not a :class:`MetaWorldEnvConfig`.
    """

    config_class = MetaWorldEnvConfig
    task_sets: ClassVar[dict[str, tuple[str, ...]]] = {
        "mt10": MT10_TASKS, "mt50": METAWORLD_V3_TASKS, "ml10_train": ML10_TRAIN_TASKS, "ml10_test": ML10_TEST_TASKS,
    }
    """Task sets ``simulator.tasks`` may name (MetaWorld's benchmark splits)."""
    video_camera: ClassVar[str] = "corner"
    """The camera evaluation videos are rendered from unless ``eval.video_camera`` is set."""

    def __init__(self, config: MetaWorldEnvConfig) -> None:
        if not isinstance(config, MetaWorldEnvConfig):
            raise TypeError(f"config must be a MetaWorldEnvConfig, got {type(config).__name__}")
        self.config = config
        self.render_mode = "rgb_array" if config.render_camera is not None else None
        setup_headless_rendering()
        self._env = _make_metaworld_env(config)
        self._renderer = CameraRenderer(self._env.model, self._env.data, fast=config.fast_rendering)
        self._obs_layout = _layout("goal_pos" if config.goal_observable else "goal_pos_hidden")
        self._init_spaces(OBS_DIM, ACT_DIM)
        self._raw_obs = np.zeros(self.obs_dim)  # MetaWorld's observation of the current state

    @property
    def variation(self) -> np.ndarray:
        """The current episode's task variation: float64 ``(k,)`` MetaWorld ``rand_vec`` (object
        and goal positions, metres; the layout is the task's ``_random_reset_space``)."""
        if self._env._last_rand_vec is None:
            raise RuntimeError("no variation yet: call reset() first")
        return np.array(self._env._last_rand_vec, dtype=np.float64)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        """Start an episode.

        Args:
            seed: the initial-state id. The same seed gives the same task variation and initial
                observation, in any process (see the module docstring); ``None`` continues the
                environment's current random stream.
            options: ``None`` or empty (no reset options are supported).

        Returns:
            ``(obs, info)``: obs float32 ``(39,)`` (or the camera ``Dict``); info
            ``{"success": False, "episode_step": 0}``.

        Raises:
            ValueError: if ``seed`` is not a non-negative integer or ``options`` holds any.
        """
        seed = self._checked_seed(seed, options)
        super().reset(seed=seed)
        if seed is not None:
            # MetaWorld's seeded variations: with seeded_rand_vec, _get_state_rand_vec draws from
            # env.np_random (each draw of the task's rejection loop too).
            self._env.np_random = np.random.default_rng(seed)
        self._raw_obs, _ = self._env.reset()
        # MetaWorld's reset_model moves sites and bodies (the goal marker, a drawer, a window) in
        # the model after its last mj_forward, and nothing recomputes their world positions before
        # the first step: the reset's camera images drew them where the previous episode left them
        # (2-38 cm off on 28 of the 50 tasks). Positions only: the dynamics, and the state
        # observation (MetaWorld's own, as it returns it), are unchanged.
        import mujoco

        mujoco.mj_kinematics(self._env.model, self._env.data)
        self._episode_step = 0
        self._episode_over = False
        return self.observe(), {"success": False, "episode_step": 0}

    def step_unobserved(self, action: np.ndarray) -> tuple[float, bool, bool, dict]:
        """Apply one control action (12.5 ms of simulation), without building the observation.

        Args:
            action: ``(4,)`` values in [-1, 1] (clipped): xyz position delta in units of 0.01 m,
                gripper effort.

        Returns and raises: as :class:`simulators.stepping.UnobservedSteps` (``step`` is this,
        then :meth:`observe`).
        """
        self._raw_obs, _, _, _, mw_info = self._env.step(self._checked_action(action))
        return self._end_of_step(bool(mw_info["success"]))

    def observe(self) -> Any:
        """The observation of the current state, as :meth:`reset` and :meth:`step` return it
        (camera images rendered now, from the state the last reset or step left)."""
        return self._camera_observation(np.asarray(self._raw_obs, dtype=np.float32))

    def _render(self, camera: str, size: int) -> np.ndarray:
        image = self._renderer.render(camera, size)  # the process's shared renderer; rows top-down
        if camera in UPSIDE_DOWN_CAMERAS:
            image = image[::-1, ::-1]
        return np.ascontiguousarray(image)


def _make_metaworld_env(config: MetaWorldEnvConfig) -> Any:
    """Create the MetaWorld task (imports metaworld; call after ``setup_headless_rendering``).

    Set up as MetaWorld's MT benchmarks set up their environments (``_set_task_called``, goal
    observability), but with variations drawn from ``env.np_random`` at every reset
    (``seeded_rand_vec``) instead of a frozen task's ``rand_vec``.
    """
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    env = ALL_V3_ENVIRONMENTS[config.task]()
    env._partially_observable = not config.goal_observable
    # sawyer_observation_space is a cached property; step() clips observations to it, so it must
    # be recomputed for the new observability (MetaWorld's own set_task does the same)
    env.__dict__.pop("sawyer_observation_space", None)
    env._set_task_called = True
    env._freeze_rand_vec = False
    env.seeded_rand_vec = True
    env.max_path_length = config.horizon  # MetaWorld refuses steps beyond it; our time limit is the same
    return env
