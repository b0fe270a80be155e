"""What the single-environment adapters share (robosuite, MetaWorld, LIBERO): the gymnasium
spaces of a state vector and camera images, seeded resets, the episode's bookkeeping at each
control step, camera observations, rendering and closing. Each adapter keeps only what its
library does differently (building the task, stepping it, its success test, its cameras).

The simulator workers host these one environment per object through
:class:`simulators.gym_vector.GymVector`; a simulator that steps a whole batch implements
:class:`simulators.vector.VectorSimulator` instead.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from simulators.stepping import checked_action
from vla_rl_core.components import ComponentConfigError

#: The largest camera image or video frame a simulator renders, pixels per side: MuJoCo sizes its
#: offscreen buffer to it, and a frame of 2048 x 2048 RGB is 12 MiB (``eval.video_size=100000``
#: asked for 30 GB frames).
MAX_IMAGE_SIZE = 2048


def require_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    """Check a config field that must be an integer (not a bool) from ``minimum`` to ``maximum``
    (None: no maximum).

    Raises:
        ComponentConfigError: (a ValueError) with field ``name`` (a template names it
            ``simulator.env.<name>``), saying what it got.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
            maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise ComponentConfigError(name, f"{name} must be an integer {bounds}, got {value!r}")


def camera_observation_space(state_dim: int, cameras: tuple[str, ...], camera_size: int) -> gym.spaces.Space:
    """The observation space of a state vector plus square RGB camera images.

    Args:
        state_dim: length of the float32 state vector.
        cameras: camera names; empty gives the flat state ``Box``.
        camera_size: image height and width, pixels.

    Returns:
        ``Box(float32, (state_dim,))`` without cameras, else ``Dict({"state": that Box,
        "<camera>_image": Box(uint8, (camera_size, camera_size, 3)), ...})``.
    """
    state_space = gym.spaces.Box(-np.inf, np.inf, shape=(state_dim,), dtype=np.float32)
    if not cameras:
        return state_space
    image_space = gym.spaces.Box(0, 255, shape=(camera_size, camera_size, 3), dtype=np.uint8)
    return gym.spaces.Dict({"state": state_space, **{f"{camera}_image": image_space for camera in cameras}})


class SingleEnv(gym.Env):
    """One simulated task as a ``gymnasium.Env``: a flat float32 state observation (or, with
    ``config.cameras``, a ``Dict`` of it and uint8 camera images), actions in [-1, 1], reward 1.0
    on success, termination on success, truncation after ``config.horizon`` control steps, and no
    reset of its own.

    A subclass sets ``config`` (a dataclass with ``horizon``, ``render_camera``, ``render_size``,
    ``cameras``, ``camera_size`` and ``instruction``, unless it overrides :attr:`instruction`),
    ``render_mode``, ``_env`` (its library's environment, which :meth:`close` closes) and
    ``_obs_layout``, then calls :meth:`_init_spaces`; it defines ``reset`` (beginning with
    :meth:`_checked_seed`) and ``step`` (or ``step_unobserved`` / ``observe`` with
    :class:`simulators.stepping.UnobservedSteps`, ending with :meth:`_end_of_step`), and
    ``_render(camera, size)`` when it renders through :meth:`render_frame` and
    :meth:`_camera_observation`.
    """

    video_camera: ClassVar[str] = "agentview"
    """The camera evaluation videos are rendered from unless ``eval.video_camera`` is set."""
    metadata = {"render_modes": ["rgb_array"]}

    def _init_spaces(self, obs_dim: int, action_dim: int) -> None:
        """Set the sizes, the spaces and an episode not yet started (called once by ``__init__``)."""
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.observation_space = camera_observation_space(obs_dim, self.config.cameras, self.config.camera_size)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(action_dim,), dtype=np.float32)
        self._episode_step = 0
        self._episode_over = True  # until the first reset

    @property
    def obs_layout(self) -> dict[str, slice]:
        """Where each named part lies in the state vector: ``{key: slice}``."""
        return dict(self._obs_layout)

    @property
    def horizon(self) -> int:
        """Time limit, control steps."""
        return self.config.horizon

    @property
    def instruction(self) -> str:
        """The task's language instruction (e.g. ``"lift the cube"``)."""
        return self.config.instruction

    @property
    def episode_step(self) -> int:
        """Control steps taken since the last reset."""
        return self._episode_step

    def _checked_seed(self, seed: Any, options: dict | None) -> int | None:
        """``reset``'s arguments checked: the initial-state id as an int (None: none given).

        Raises:
            ValueError: ``options`` given (an empty dict, which gymnasium's ``check_env``
                passes, is none), or ``seed`` not a non-negative integer.
        """
        if options:
            raise ValueError(f"{type(self).__name__}.reset takes no options, got {options!r}")
        if seed is None:
            return None
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer (an initial-state id), got {seed!r}")
        return int(seed)

    def _checked_action(self, action: Any) -> np.ndarray:
        """``action`` as float64 ``(action_dim,)`` clipped to [-1, 1], for a running episode
        (:func:`simulators.stepping.checked_action`)."""
        return checked_action(action, self.action_dim, self._episode_over)

    def _end_of_step(self, success: bool) -> tuple[float, bool, bool, dict]:
        """Count a control step whose success test gave ``success``; returns ``(reward, terminated,
        truncated, info)``: 1.0 on success, terminated on success, truncated at the horizon
        without it, info ``{"success", "episode_step"}``."""
        self._episode_step += 1
        truncated = self._episode_step >= self.config.horizon and not success
        self._episode_over = success or truncated
        return float(success), success, truncated, {"success": success, "episode_step": self._episode_step}

    def _camera_observation(self, state: np.ndarray) -> Any:
        """``state``, or with ``config.cameras`` the dict of it and each camera's image of the
        current state, rendered now (``_render``)."""
        if not self.config.cameras:
            return state
        size = self.config.camera_size
        images = {f"{camera}_image": self._render(camera, size) for camera in self.config.cameras}
        return {"state": state, **images}

    def render_frame(self) -> np.ndarray:
        """Render the current state from ``config.render_camera``.

        Returns:
            uint8 ``(render_size, render_size, 3)`` RGB image, upright.

        Raises:
            RuntimeError: if the environment was created without a ``render_camera``.
        """
        self._require_render_camera()
        return self._render(self.config.render_camera, self.config.render_size)

    def _require_render_camera(self) -> None:
        if self.config.render_camera is None:
            raise RuntimeError(f"render_frame needs a render_camera in {type(self.config).__name__} "
                               f"(e.g. {self.video_camera!r})")

    def render(self) -> np.ndarray:
        """gymnasium's ``rgb_array`` render: same as :meth:`render_frame`."""
        return self.render_frame()

    def close(self) -> None:
        """Free the simulator (the process's shared renderers stay)."""
        self._env.close()
