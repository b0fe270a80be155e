"""LIBERO tasks (Liu et al. 2023, arXiv 2306.03310) as a gymnasium environment.

One environment is one task of one suite (``libero_spatial``, ``libero_object``, ``libero_goal``,
``libero_10``: ten tasks each; ``libero_90``: ninety), created offline through
:mod:`simulators.libero_offline`. Episodes follow OpenVLA-OFT's LIBERO evaluation
(moojink/openvla-oft ``experiments/robot/libero/run_libero_eval.py``, ``run_task`` and
``run_episode``): ``reset``, ``set_init_state`` with the task's fixed initial state
(``task_suite.get_task_init_states(task_id)``, 50 per task; trial ``i`` uses state ``i``, see
:func:`init_state_index`), then ``num_steps_wait`` steps of the dummy action
(``libero_utils.get_libero_dummy_action``: arm still, gripper open) while the objects settle;
those steps are neither shown to the policy nor counted towards the horizon (the reference's
``max_steps + num_steps_wait`` loop).

Observations: the state vector of ``obs_keys`` (float32; by default OpenVLA-OFT's 8-value
proprio, ``run_libero_eval.prepare_observation``: ``robot0_eef_pos`` (3, metres, world frame),
``robot0_eef_axis_angle`` (3, radians: the axis-angle of ``robot0_eef_quat``, see
:func:`quat2axisangle`), ``robot0_gripper_qpos`` (2, metres)); with ``cameras`` a
``gymnasium.spaces.Dict`` ``{"state": ..., "<camera>_image": uint8 (camera_size, camera_size, 3)}``
whose images are rotated by 180 degrees (``image[::-1, ::-1]``, ``libero_utils.get_libero_image``
and ``get_libero_wrist_image``). Resizing to the policy's input (JPEG round trip, Lanczos-3) and
the centre crop are the policy's (``policies/openvla/image_preprocessing.py``), as in the
reference.

Actions (7 values in [-1, 1]): LIBERO's ``OSC_POSE`` deltas (position up to 0.05 m and axis-angle
rotation up to 0.5 rad per control step), then the gripper (-1 open, +1 close); 20 Hz.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulators.base import MAX_IMAGE_SIZE, SingleEnv, require_int
from simulators.registry import SIMULATORS
from simulators.rendering import (
    disable_shadows_and_reflections,
    egl_device_hidden_from_robosuite,
    setup_headless_rendering,
)
from simulators.robosuite_env import (
    STATE_KEY_SIZES,
    quiet_robosuite_imports,
)
from vla_rl_core.components import ComponentConfigError

SUITE_HORIZONS: dict[str, int] = {
    "libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400,
}
"""Control steps per episode for each suite: ``TASK_MAX_STEPS`` of OpenVLA-OFT's
``run_libero_eval.py`` (also SRPO's), policy steps only (the settling steps come on top)."""

SUITE_NUM_TASKS: dict[str, int] = {
    "libero_spatial": 10, "libero_object": 10, "libero_goal": 10, "libero_10": 10, "libero_90": 90,
}
"""Tasks per suite (``task_suite.n_tasks``; the reference evaluates every one)."""

AXIS_ANGLE_KEY = "robot0_eef_axis_angle"
"""Observation key computed here: :func:`quat2axisangle` of ``robot0_eef_quat`` (3 values, rad)."""

LIBERO_STATE_KEYS: tuple[str, ...] = ("robot0_eef_pos", AXIS_ANGLE_KEY, "robot0_gripper_qpos")
"""Default state: OpenVLA-OFT's LIBERO proprio (``run_libero_eval.prepare_observation``, 8 values;
``PROPRIO_DIM = 8`` of ``prismatic/vla/constants.py``)."""

LIBERO_STATE_KEY_SIZES: dict[str, int] = {**STATE_KEY_SIZES, AXIS_ANGLE_KEY: 3}
"""Sizes of the state keys known before an environment exists (robosuite's and the axis-angle)."""

NUM_TRIALS_PER_TASK = 50
"""Fixed initial states per task, ``num_trials_per_task`` of ``run_libero_eval.py``."""

NOOP_ACTION = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0])
"""Action of the settling steps after a reset: no arm motion, gripper open
(``libero_utils.get_libero_dummy_action``)."""

ENV_IMAGE_SIZE = 256
"""Rendered camera side of the reference (``run_libero_eval.py``'s ``env_img_res``), pixels."""

CONTROL_FREQ = 20.0
"""LIBERO's control frequency, Hz."""


def quat2axisangle(quat: np.ndarray) -> np.ndarray:
    """Unit quaternion ``(x, y, z, w)`` → axis-angle ``axis * angle`` (radians), exactly as
    OpenVLA-OFT's ``libero_utils.quat2axisangle`` (copied there from robosuite's
    ``transform_utils``): ``w`` clipped to [-1, 1], ``den = sqrt(1 - w^2)``, zeros when ``den``
    is exactly 0 (``math.isclose(den, 0.0)`` with its zero absolute tolerance), else
    ``xyz * 2 acos(w) / den``. No sign canonicalisation: ``w < 0`` gives angles above pi.

    Args:
        quat: ``(4,)`` float, ``(x, y, z, w)``; not modified (the reference clips in place).

    Returns:
        float64 ``(3,)``.

    Raises:
        ValueError: ``quat`` does not have shape ``(4,)``.
    """
    quat = np.array(quat, dtype=np.float64)
    if quat.shape != (4,):
        raise ValueError(f"quat must have shape (4,) (x, y, z, w), got {quat.shape}")
    quat[3] = np.clip(quat[3], -1.0, 1.0)
    den = np.sqrt(1.0 - quat[3] * quat[3])
    if den == 0.0:
        return np.zeros(3)
    return (quat[:3] * 2.0 * np.arccos(quat[3])) / den


def init_state_index(init_state_id: int, num_init_states: int) -> int:
    """The task's initial state an episode id starts from: ``init_state_id % num_init_states``.

    The reference runs trial ``i`` (``0 <= i < 50``) from ``initial_states[i]``
    (``run_libero_eval.run_task``); evaluation ids ``eval.init_state_offset + i`` do the same when
    the offset is a multiple of 50 (the default, 1,000,000,000, is).
    """
    return int(init_state_id) % int(num_init_states)


def _require_names(name: str, value: Any, allow_empty: bool) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(item, str) and item for item in value):
        raise ComponentConfigError(name, f"{name} must be a sequence of names, got {value!r}")
    names = tuple(value)  # YAML gives lists
    if (not names and not allow_empty) or len(set(names)) != len(names):
        raise ComponentConfigError(
            name, f"{name} must be {'' if allow_empty else 'non-empty and '}without repeats, got {value!r}")
    return names


@dataclass(frozen=True)
class LiberoEnvConfig:
    """Configuration of :class:`LiberoEnv`.

    Raises:
        ValueError: from ``__post_init__``, naming the field and how to fix it.
    """

    suite: str = "libero_spatial"
    """Task suite, one of :data:`SUITE_HORIZONS`."""
    task_id: int = 0
    """Task index within the suite (0-9), in the suite's default task order."""
    horizon: int | None = None
    """Time limit in control steps; ``None``: the suite's :data:`SUITE_HORIZONS` entry."""
    task_seed: int = 0
    """Seed given to LIBERO's ``env.seed`` and to numpy's global generator before every reset
    (the scene's placement is drawn from it: ``LiberoEnv._seed_placements``; "seed seems to affect
    object positions even when using fixed initial state"):
    OpenVLA-OFT's ``run_libero_eval.get_libero_env`` seeds 0; openpi's LIBERO example
    (``examples/libero/main.py``, ``_get_libero_env``) seeds its ``--seed``, 7."""
    num_steps_wait: int = 10
    """Dummy-action control steps after each reset while objects settle, neither observed by the
    policy nor counted in ``horizon`` (``run_libero_eval.py``'s ``num_steps_wait``, 10)."""
    obs_keys: tuple[str, ...] = LIBERO_STATE_KEYS
    """LIBERO observation keys concatenated, in this order, into the state vector (default:
    OpenVLA-OFT's 8-value proprio); :data:`AXIS_ANGLE_KEY` is computed from ``robot0_eef_quat``."""
    cameras: tuple[str, ...] = ()
    """Cameras whose images join the observation: ``("agentview",)``, optionally with the wrist
    camera ``"robot0_eye_in_hand"``; empty: the flat state ``Box`` observation."""
    camera_size: int = ENV_IMAGE_SIZE
    """Height and width of rendered camera observations, pixels (the reference renders 256 and
    the policy resizes to 224; training templates use 128 for speed)."""
    fast_rendering: bool = False
    """Render camera observations and frames without shadows and reflections (about twice as
    fast on CPU)."""
    render_camera: str | None = None
    """Camera for :meth:`LiberoEnv.render_frame` (e.g. ``"agentview"``); ``None``: no renderer."""
    render_size: int = 128
    """Height and width of rendered frames, pixels."""

    @property
    def task_name(self) -> str:
        """``<suite>_<task_id>``, e.g. ``libero_spatial_0``."""
        return f"{self.suite}_{self.task_id}"

    @property
    def control_freq(self) -> float:
        """Control frequency, Hz (:data:`CONTROL_FREQ`)."""
        return CONTROL_FREQ

    @property
    def state_dim(self) -> int | None:
        """Length of the state vector when every key of ``obs_keys`` has a known size (else None)."""
        if not all(key in LIBERO_STATE_KEY_SIZES for key in self.obs_keys):
            return None
        return sum(LIBERO_STATE_KEY_SIZES[key] for key in self.obs_keys)

    @property
    def action_dim(self) -> int:
        """Action length: LIBERO's OSC_POSE delta (6) and the gripper."""
        return 7

    def __post_init__(self) -> None:
        if self.suite not in SUITE_HORIZONS:
            raise ComponentConfigError("suite", f"suite must be one of {sorted(SUITE_HORIZONS)}, got {self.suite!r}")
        require_int("task_id", self.task_id, 0)
        if self.task_id >= SUITE_NUM_TASKS[self.suite]:  # known without LIBERO: found at plan time
            raise ComponentConfigError(
                "task_id", f"task_id must be in [0, {SUITE_NUM_TASKS[self.suite] - 1}] for {self.suite}, "
                f"got {self.task_id}")
        require_int("task_seed", self.task_seed, 0)
        if self.horizon is None:
            object.__setattr__(self, "horizon", SUITE_HORIZONS[self.suite])
        require_int("horizon", self.horizon, 1)
        require_int("num_steps_wait", self.num_steps_wait, 0)
        object.__setattr__(self, "obs_keys", _require_names("obs_keys", self.obs_keys, allow_empty=False))
        object.__setattr__(self, "cameras", _require_names("cameras", self.cameras, allow_empty=True))
        require_int("camera_size", self.camera_size, 8, MAX_IMAGE_SIZE)
        if not isinstance(self.fast_rendering, bool):
            raise ComponentConfigError(
                "fast_rendering", f"fast_rendering must be true or false, got {self.fast_rendering!r}")
        if self.render_camera is not None and (not isinstance(self.render_camera, str) or not self.render_camera):
            raise ComponentConfigError(
                "render_camera",
                f"render_camera must be a camera name such as 'agentview' or None, got {self.render_camera!r}")
        require_int("render_size", self.render_size, 8, MAX_IMAGE_SIZE)


@SIMULATORS.register("libero")
class LiberoEnv(SingleEnv):
    """One LIBERO task as a ``gymnasium.Env``.

    Reward is 1.0 on success (LIBERO's goal predicates, ``env.check_success()``) and 0.0
    otherwise; an episode terminates on success and is truncated after ``config.horizon`` control
    steps. The environment never resets itself. It is created once with ``hard_reset=False`` and
    seeded with ``config.task_seed`` before every reset (0 by default, as OpenVLA-OFT's evaluation;
    openpi's LIBERO example seeds 7); ``reset`` restores one of the task's fixed initial states.

    Args:
        config: the environment's configuration.

    Raises:
        TypeError: if ``config`` is not a :class:`LiberoEnvConfig`.
        RuntimeError: if LIBERO is not installed (see :func:`unavailable_reason`).
        ValueError: if ``task_id`` is out of range for the suite, or an observation key or camera
            does not exist in the task (the message lists the available ones).
    """

    config_class = LiberoEnvConfig

    @staticmethod
    def unavailable_reason() -> str | None:
        """Why LIBERO cannot be created in this Python environment, or ``None`` if it can."""
        from simulators.libero_offline import libero_unavailable_reason

        return libero_unavailable_reason()

    def __init__(self, config: LiberoEnvConfig) -> None:
        if not isinstance(config, LiberoEnvConfig):
            raise TypeError(f"config must be a LiberoEnvConfig, got {type(config).__name__}")
        self.config = config
        self.render_mode = "rgb_array" if config.render_camera is not None else None
        setup_headless_rendering()
        from simulators.libero_offline import prepare_libero_offline

        prepare_libero_offline()
        task, bddl_file, self._init_states = _load_task(config.suite, config.task_id)
        self._instruction = task.language
        self._env = _make_libero_env(config, bddl_file)
        self._seed_placements()
        observation_spec = self._env.env.observation_spec()
        try:
            self._check_names(observation_spec)
        except ValueError:
            self._env.close()
            raise
        if self._renders and config.fast_rendering:
            disable_shadows_and_reflections(self._env.sim._render_context_offscreen)
        sizes = [3 if key == AXIS_ANGLE_KEY else int(np.size(observation_spec[key])) for key in config.obs_keys]
        starts = np.cumsum([0, *sizes])
        self._obs_layout = {key: slice(int(starts[i]), int(starts[i + 1])) for i, key in enumerate(config.obs_keys)}
        self._init_spaces(int(starts[-1]), int(self._env.env.action_dim))

    def _seed_placements(self) -> None:
        """Seed what LIBERO's reset draws the scene's placement from, before every reset.

        The reset places the fixtures (a cabinet, a stove: model data, which ``set_init_state``
        does not restore) with its region samplers, which draw from numpy's global generator.
        run_libero_eval.get_libero_env calls ``env.seed(0)`` once per task ("seed seems to affect
        object positions even when using fixed initial state"), which on robosuite 1.4 seeded that
        generator; on robosuite 1.5 (rpent-libero) ``env.seed`` is an attribute, and the wrapper
        only sets robosuite's own ``rng``, so the global generator was never seeded: the same
        initial-state id got a cabinet up to 1 cm and 0.7 degrees elsewhere from one reset to the
        next. Seeded before every reset, an id gets the scenery of a freshly seeded environment
        (SimpleVLA-RL's per-episode environments, OpenVLA-OFT's first trial) whatever ran before.
        Then :func:`_draw_robot_reset_noise_as_robosuite_14` takes the draws robosuite 1.4's robot
        reset takes from that generator before the fixtures are placed.
        """
        self._env.seed(self.config.task_seed)  # robosuite 1.5: its rng; 1.4: numpy's global generator
        np.random.seed(self.config.task_seed)  # noqa: NPY002 (LIBERO's region samplers draw from it)
        _draw_robot_reset_noise_as_robosuite_14(self._env.env)

    @property
    def instruction(self) -> str:
        """The task's language instruction, as the benchmark gives it to policies
        (e.g. ``"pick up the alphabet soup and place it in the basket"``)."""
        return self._instruction

    @property
    def num_init_states(self) -> int:
        """Fixed initial states of this task (50, :data:`NUM_TRIALS_PER_TASK`, for every suite)."""
        return len(self._init_states)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        """Start an episode from a fixed initial state of the task.

        Args:
            seed: the initial-state id; the episode starts from the task's initial state
                :func:`init_state_index` ``(seed, num_init_states)`` (so ids of disjoint ranges may
                share a state: LIBERO has only 50 per task). ``None`` picks one from gymnasium's
                ``np_random``.
            options: ``None`` or empty (no reset options are supported).

        Returns:
            ``(obs, info)``: obs float32 ``(obs_dim,)`` or the camera ``Dict`` (see the module
            docstring); info ``{"success": False, "episode_step": 0}``.

        Raises:
            ValueError: if ``seed`` is not a non-negative integer or ``options`` holds any.
        """
        seed = self._checked_seed(seed, options)
        super().reset(seed=seed)
        if seed is None:
            index = int(self.np_random.integers(self.num_init_states))
        else:
            index = init_state_index(seed, self.num_init_states)
        self._select_render_context()
        self._seed_placements()
        self._env.reset()
        raw_obs = self._env.set_init_state(self._init_states[index])
        for _ in range(self.config.num_steps_wait):
            raw_obs, _, _, _ = self._env.step(NOOP_ACTION)
        self._episode_step = 0
        self._episode_over = False
        return self._observation(raw_obs), {"success": False, "episode_step": 0}

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict]:
        """Apply one control action for 50 ms.

        Args:
            action: ``(action_dim,)`` values in [-1, 1] (clipped); see the module docstring.

        Returns:
            ``(obs, reward, terminated, truncated, info)``: obs as in :meth:`reset`; reward 1.0 on
            success else 0.0; terminated = success; truncated = horizon reached without success;
            info ``{"success": bool, "episode_step": int}``.

        Raises:
            ValueError: if ``action`` does not have shape ``(action_dim,)`` or is not finite.
            RuntimeError: if no episode is running (before ``reset`` or after it ended).
        """
        action = self._checked_action(action)
        self._select_render_context()
        raw_obs, _, _, _ = self._env.step(action)
        reward, terminated, truncated, info = self._end_of_step(bool(self._env.check_success()))
        return self._observation(raw_obs), reward, terminated, truncated, info

    def render_frame(self) -> np.ndarray:
        """Render the current state from ``config.render_camera``.

        Returns:
            uint8 ``(render_size, render_size, 3)`` RGB image, rotated like the observations.

        Raises:
            RuntimeError: if the environment was created without a ``render_camera``.
        """
        self._require_render_camera()
        size = self.config.render_size
        self._env.sim._render_context_offscreen.gl_ctx.make_current()
        image = self._env.sim.render(width=size, height=size, camera_name=self.config.render_camera)
        return np.ascontiguousarray(image[::-1, ::-1])

    @property
    def _renders(self) -> bool:
        return bool(self.config.cameras) or self.config.render_camera is not None

    def _check_names(self, observation_spec: dict[str, np.ndarray]) -> None:
        available = {*observation_spec, *([AXIS_ANGLE_KEY] if "robot0_eef_quat" in observation_spec else [])}
        missing = [key for key in self.config.obs_keys if key not in available]
        if missing:
            raise ComponentConfigError("simulator.env.obs_keys",
                                       f"observation keys {missing} do not exist; available: {sorted(available)}")
        camera_names = list(self._env.sim.model.camera_names)
        if self.config.render_camera is not None and self.config.render_camera not in camera_names:
            raise ComponentConfigError("simulator.env.render_camera", f"render_camera {self.config.render_camera!r} "
                                       f"is not a camera; available: {camera_names}")

    def _observation(self, raw_obs: dict[str, np.ndarray]) -> Any:
        parts = [quat2axisangle(raw_obs["robot0_eef_quat"]) if key == AXIS_ANGLE_KEY else np.ravel(raw_obs[key])
                 for key in self.config.obs_keys]
        state = np.concatenate(parts).astype(np.float32)
        if not self.config.cameras:
            return state
        # libero_utils.get_libero_image: rotate 180 degrees to match the training data.
        images = {
            f"{camera}_image": np.ascontiguousarray(raw_obs[f"{camera}_image"][::-1, ::-1])
            for camera in self.config.cameras
        }
        return {"state": state, **images}

    def _select_render_context(self) -> None:
        # Camera observations render inside reset/step; with several environments in one
        # process, this one's OpenGL context must be current first.
        if self.config.cameras:
            self._env.sim._render_context_offscreen.gl_ctx.make_current()


def _draw_robot_reset_noise_as_robosuite_14(env: Any) -> None:
    """Take from numpy's global generator what robosuite 1.4's robot reset takes from it.

    LIBERO's reset (``_reset_internal``) resets the robots, then samples the fixtures' placement
    from numpy's global generator. On robosuite 1.4, which the published LIBERO checkpoints were
    trained and evaluated on, ``Robot.reset`` first draws its joint noise from that same generator
    (``np.random.randn(len(self.init_qpos))`` for gaussian noise, ``np.random.uniform(-1, 1, n)``
    for uniform; drawn even when the magnitude is 0); on robosuite 1.5 (``Robot.reset(...,
    rng=...)``) it draws from robosuite's own generator, so the fixtures took the generator's first
    numbers and landed elsewhere (libero_spatial task 0's cabinet 14.0 mm from where robosuite
    1.4.1 with the original LIBERO puts it, seed 0). Taking the same draws here, on robosuite 1.5
    only, puts them where robosuite 1.4 does (measured: within 1.5e-6 m, the recorded figures'
    rounding, see
    ``tests/simulators/test_libero_env.py::test_fixtures_stand_where_robosuite_14_puts_them``).
    The robots' own noise is unchanged (robosuite 1.5's generator).

    Args:
        env: LIBERO's robosuite environment (``ControlEnv.env``), with ``robots``.
    """
    if getattr(env, "deterministic_reset", False):
        return  # robosuite 1.4 resets the robots without noise then
    for robot in env.robots:
        if "rng" not in inspect.signature(robot.reset).parameters:
            return  # robosuite 1.4: the reset draws from numpy's global generator itself
        size, kind = len(robot.init_qpos), robot.initialization_noise["type"]
        if kind == "gaussian":
            np.random.randn(size)  # noqa: NPY002
        elif kind == "uniform":
            np.random.uniform(-1.0, 1.0, size)  # noqa: NPY002


def _load_task(suite: str, task_id: int) -> tuple[Any, str, np.ndarray]:
    """The benchmark task, its BDDL file and its initial states ``(n, state_size)`` float64.

    Raises:
        ValueError: if ``task_id`` is out of range for ``suite``.
    """
    quiet_robosuite_imports()  # LIBERO imports robosuite
    with egl_device_hidden_from_robosuite():
        from libero.libero import benchmark

    task_suite = benchmark.get_benchmark_dict()[suite]()
    if task_id >= task_suite.get_num_tasks():
        raise ComponentConfigError("simulator.env.task_id", f"task_id must be in [0, {task_suite.get_num_tasks() - 1}] "
                                                            f"for {suite}, got {task_id}")
    init_states = np.asarray(task_suite.get_task_init_states(task_id))
    return task_suite.get_task(task_id), task_suite.get_task_bddl_file_path(task_id), init_states


def _make_libero_env(config: LiberoEnvConfig, bddl_file: str) -> Any:
    """Create LIBERO's ``ControlEnv`` for the task (call after ``prepare_libero_offline``).

    Raises:
        ValueError: if a camera of ``config.cameras`` does not exist in the scene.
    """
    quiet_robosuite_imports()
    with egl_device_hidden_from_robosuite():
        from libero.libero.envs.env_wrapper import ControlEnv

    renders = bool(config.cameras) or config.render_camera is not None
    try:
        return ControlEnv(
            bddl_file_name=bddl_file,
            use_camera_obs=bool(config.cameras),
            has_offscreen_renderer=renders,
            camera_names=list(config.cameras) or ["agentview"],
            camera_heights=config.camera_size,
            camera_widths=config.camera_size,
            control_freq=CONTROL_FREQ,
            ignore_done=True,  # the time limit is ours (truncated)
            hard_reset=False,
        )
    except ValueError as error:
        if not config.cameras:
            raise
        raise ComponentConfigError(
            "simulator.env.cameras", f"LIBERO could not observe cameras {config.cameras} (robosuite's log above lists "
            f"the scene's camera names, e.g. agentview, robot0_eye_in_hand): {error}") from error
