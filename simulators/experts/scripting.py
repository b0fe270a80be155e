"""Shared pieces of the scripted robosuite experts: the ``OSC_POSE`` action, the observation check
and the phase machine (:class:`PhasedExpert`).

An action is 7 values in [-1, 1]: a position delta (3), an axis-angle rotation delta (3), both in
the robot base frame (aligned with the world frame for the Panda in the shipped tasks), and the
gripper command (-1 open, +1 close). robosuite's default ``OSC_POSE`` output range scales 1.0 to
:data:`MAX_DELTA_M` metres and :data:`MAX_ROT_RAD` radians per control step (50 ms at 20 Hz); the
goal is updated from the *achieved* pose, so a zero rotation holds the current orientation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

MAX_DELTA_M = 0.05
"""Position change commanded by an action of 1.0, metres."""
MAX_ROT_RAD = 0.5
"""Rotation commanded by an action of 1.0, radians."""
OPEN, CLOSE = -1.0, 1.0
"""Gripper commands."""


def osc_action(position_error_m: np.ndarray, gripper: float,
               rotation_error_rad: np.ndarray | None = None) -> np.ndarray:
    """The action moving the hand by ``position_error_m`` (and rotating it by ``rotation_error_rad``).

    Args:
        position_error_m: float ``(3,)`` target minus current end-effector position, metres.
        gripper: :data:`OPEN` or :data:`CLOSE`.
        rotation_error_rad: float ``(3,)`` axis-angle rotation to apply, radians; ``None``: none.

    Returns:
        float32 ``(7,)``: each delta divided by its full-scale value and clipped to [-1, 1]
        (so a far target is approached at full speed along the clipped direction), then the gripper.
    """
    action = np.zeros(7, dtype=np.float32)
    action[:3] = np.clip(np.asarray(position_error_m) / MAX_DELTA_M, -1.0, 1.0)
    if rotation_error_rad is not None:
        action[3:6] = np.clip(np.asarray(rotation_error_rad) / MAX_ROT_RAD, -1.0, 1.0)
    action[6] = gripper
    return action


def observation_slices(expert: str, needed_keys: Sequence[str], obs_layout: Mapping[str, slice]) -> list[slice]:
    """The slices of ``needed_keys`` in the flat observation, in that order.

    Raises:
        ValueError: a needed key is missing (the message names the expert and the keys present).
    """
    missing = [key for key in needed_keys if key not in obs_layout]
    if missing:
        raise ValueError(f"{expert} needs observation keys {missing}; the observation has {sorted(obs_layout)}")
    return [obs_layout[key] for key in needed_keys]


def quat_to_matrix(quat_xyzw: np.ndarray) -> np.ndarray:
    """Rotation matrix ``(3, 3)`` of a unit quaternion ``(x, y, z, w)`` (robosuite's order)."""
    x, y, z, w = np.asarray(quat_xyzw, dtype=np.float64) / np.linalg.norm(quat_xyzw)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ])


def rotation_error(target: np.ndarray, current: np.ndarray) -> np.ndarray:
    """The axis-angle rotation ``(3,)``, radians, that turns orientation ``current`` into ``target``
    (both ``(3, 3)`` world-frame matrices), applied in the world frame as ``OSC_POSE`` applies it."""
    delta = target @ current.T
    cos_angle = np.clip((np.trace(delta) - 1.0) / 2.0, -1.0, 1.0)
    angle = np.arccos(cos_angle)
    axis = np.array([delta[2, 1] - delta[1, 2], delta[0, 2] - delta[2, 0], delta[1, 0] - delta[0, 1]])
    norm = np.linalg.norm(axis)
    if norm < 1e-9:  # no rotation, or a half turn (not met by the experts: they never ask for one)
        return np.zeros(3)
    return angle * axis / norm


class PhasedExpert:
    """A scripted expert that runs through numbered phases (0 first) on the flat state
    observation; keep one per environment and call :meth:`reset` at each episode start.

    Subclasses name the observation keys they read (``needed_keys``, whose slices
    :attr:`slices` holds in that order) and implement ``act(obs) -> (7,) float32 action``.

    Args:
        obs_layout: where each key lies in the flat observation (``RobosuiteEnv.obs_layout``).

    Raises:
        ValueError: a needed observation key is missing (the message names the expert).
    """

    needed_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, obs_layout: Mapping[str, slice]) -> None:
        self.slices = observation_slices(type(self).__name__, self.needed_keys, obs_layout)
        self.reset()

    def reset(self) -> None:
        """Forget the current episode's progress: back to phase 0."""
        self._phase = 0
        self._phase_steps = 0

    def _enter(self, phase: int) -> None:
        self._phase, self._phase_steps = phase, 0
