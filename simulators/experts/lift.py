"""A scripted expert for robosuite Lift working from the compact state observation.

It moves the open gripper above the cube, descends around it, closes the gripper, and lifts,
commanding ``OSC_POSE`` position deltas with zero rotation. If the cube slips out of the
gripper after the grasp, it starts over from above the cube.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from simulators.experts.measured_steps import ROBOSUITE_STEPS
from simulators.experts.registry import ExpertSteps, register_expert

MAX_DELTA_M = 0.05
"""Position change commanded by an action of 1.0 (``OSC_POSE`` default output range), metres."""
HOVER_HEIGHT_M = 0.08
"""Height above the cube centre from which to descend, metres."""
GRASP_DEPTH_M = 0.005
"""How far below the cube centre the gripper site goes before closing, metres."""
LIFT_HEIGHT_M = 0.15
"""How far above the grasp height to lift, metres (success needs 0.04 m above the table)."""
ALIGN_TOL_M = 0.01
"""Position error accepted before moving to the next phase, metres."""
GRASP_STEPS = 6
"""Control steps spent closing the gripper before lifting."""
SLIP_DIST_M = 0.04
"""Gripper-to-cube distance beyond which a grasp counts as lost, metres."""
OPEN, CLOSE = -1.0, 1.0

_APPROACH, _DESCEND, _GRASP, _LIFT = range(4)


@register_expert(("robosuite", "robosuite_lift"), "Lift")
class LiftExpert:
    """Scripted Lift expert; keep one per environment and call :meth:`reset` at each episode start.

    Args:
        obs_layout: where each key lies in the flat observation (``RobosuiteEnv.obs_layout``);
            needs ``robot0_eef_pos`` and ``cube_pos``.

    Raises:
        ValueError: if a needed observation key is missing.
    """

    measured_steps: ClassVar[dict[str, ExpertSteps]] = ROBOSUITE_STEPS["Lift"]
    """Control steps of its demonstrations per robot (:mod:`simulators.experts.measured_steps`)."""

    needed_keys = ("robot0_eef_pos", "cube_pos")

    def __init__(self, obs_layout: Mapping[str, slice]) -> None:
        missing = [key for key in self.needed_keys if key not in obs_layout]
        if missing:
            raise ValueError(
                f"LiftExpert needs observation keys {missing}; the observation has {sorted(obs_layout)}"
            )
        self._eef = obs_layout["robot0_eef_pos"]
        self._cube = obs_layout["cube_pos"]
        self.reset()

    def reset(self) -> None:
        """Forget the current episode's progress."""
        self._phase = _APPROACH
        self._grasp_steps = 0
        self._lift_z = 0.0

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Action for the current observation.

        Args:
            obs: float ``(obs_dim,)`` flat state observation.

        Returns:
            float32 ``(7,)``: position delta (3, in units of 0.05 m), zero rotation (3), gripper.
        """
        eef, cube = obs[self._eef].astype(np.float64), obs[self._cube].astype(np.float64)
        if self._phase in (_GRASP, _LIFT) and np.linalg.norm(cube - eef) > SLIP_DIST_M:
            self.reset()
        if self._phase == _APPROACH:
            target, gripper = cube + [0.0, 0.0, HOVER_HEIGHT_M], OPEN
            if np.all(np.abs(target - eef) < [ALIGN_TOL_M, ALIGN_TOL_M, 2 * ALIGN_TOL_M]):
                self._phase = _DESCEND
        if self._phase == _DESCEND:
            target, gripper = cube - [0.0, 0.0, GRASP_DEPTH_M], OPEN
            if abs(target[2] - eef[2]) < ALIGN_TOL_M:
                self._phase = _GRASP
        if self._phase == _GRASP:
            target, gripper = eef, CLOSE
            self._grasp_steps += 1
            if self._grasp_steps > GRASP_STEPS:
                self._phase, self._lift_z = _LIFT, eef[2] + LIFT_HEIGHT_M
        if self._phase == _LIFT:
            target, gripper = np.array([cube[0], cube[1], self._lift_z]), CLOSE
        action = np.zeros(7, dtype=np.float32)
        action[:3] = np.clip((target - eef) / MAX_DELTA_M, -1.0, 1.0)
        action[6] = gripper
        return action
