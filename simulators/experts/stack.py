"""A scripted expert for robosuite Stack working from the compact state observation.

Stack (robosuite 1.5.2): a red cube A (0.04 m wide) and a green cube B (0.05 m wide) lie on the
table (top at z = 0.8 m) at uniform positions within +-0.08 m of its centre, each with a uniform
random yaw. Success: cube A is above the table by more than 0.04 m, touches cube B, and the
gripper no longer grasps it.

Phases (positions in metres, world frame): move the open gripper above cube A, descend around
it, close the gripper, lift cube A until its bottom clears cube B's top, carry it over cube B,
lower it until it almost rests on cube B, open the gripper, and rise. The carry phases steer cube
A's position (the hand moves by cube A's error), so how far below the hand the cube hangs does
not matter. If cube A slips out of the gripper while carried, the expert starts over. It commands
position deltas only (zero rotation): the fingers square a rotated cube up as they close.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from simulators.experts.measured_steps import ROBOSUITE_STEPS
from simulators.experts.registry import ExpertSteps, register_expert
from simulators.experts.scripting import CLOSE, OPEN, PhasedExpert, osc_action

HOVER_HEIGHT_M = 0.08
"""Height above cube A's centre from which to descend, metres."""
GRASP_DEPTH_M = 0.005
"""How far below cube A's centre the gripper site goes before closing, metres."""
STACKED_OFFSET_M = 0.045
"""Height of cube A's centre above cube B's when resting on it (half widths 0.02 + 0.025), metres."""
CARRY_CLEARANCE_M = 0.03
"""Gap between cube A's bottom and cube B's top while carrying, metres."""
PLACE_GAP_M = 0.005
"""Gap between the cubes at which the gripper lets go, metres."""
RETREAT_HEIGHT_M = 0.1
"""How far the hand rises after letting go, metres."""
ALIGN_TOL_M = 0.01
"""Position error accepted before moving to the next phase, metres."""
PLACE_ALIGN_TOL_M = 0.005
"""Horizontal error of cube A over cube B accepted before lowering it, metres."""
GRASP_STEPS = 6
"""Control steps spent closing the gripper before lifting."""
RELEASE_STEPS = 4
"""Control steps spent opening the gripper before rising."""
SLIP_DIST_M = 0.04
"""Gripper-to-cube-A distance beyond which a grasp counts as lost, metres."""

_APPROACH, _DESCEND, _GRASP, _LIFT, _CARRY, _LOWER, _RELEASE, _RETREAT = range(8)


@register_expert(("robosuite", "robosuite_lift"), "Stack")
class StackExpert(PhasedExpert):
    """Scripted Stack expert; keep one per environment and call :meth:`reset` at each episode start.

    Args:
        obs_layout: where each key lies in the flat observation (``RobosuiteEnv.obs_layout``);
            needs ``robot0_eef_pos``, ``cubeA_pos`` and ``cubeB_pos``.

    Raises:
        ValueError: if a needed observation key is missing.
    """

    measured_steps: ClassVar[dict[str, ExpertSteps]] = ROBOSUITE_STEPS["Stack"]
    """Control steps of its demonstrations per robot (:mod:`simulators.experts.measured_steps`)."""

    needed_keys = ("robot0_eef_pos", "cubeA_pos", "cubeB_pos")

    def __init__(self, obs_layout: Mapping[str, slice]) -> None:
        super().__init__(obs_layout)
        self._eef, self._cube_a, self._cube_b = self.slices

    def reset(self) -> None:
        """Forget the current episode's progress."""
        super().reset()
        self._retreat_z = 0.0

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Action for the current observation.

        Args:
            obs: float ``(obs_dim,)`` flat state observation.

        Returns:
            float32 ``(7,)``: position delta (3, in units of 0.05 m), zero rotation (3), gripper.
        """
        eef = obs[self._eef].astype(np.float64)
        cube_a, cube_b = obs[self._cube_a].astype(np.float64), obs[self._cube_b].astype(np.float64)
        self._phase_steps += 1
        if _GRASP <= self._phase <= _LOWER and np.linalg.norm(cube_a - eef) > SLIP_DIST_M:
            self.reset()
        above_b = cube_b + [0.0, 0.0, STACKED_OFFSET_M]  # cube A's centre when resting on cube B
        if self._phase == _APPROACH:
            target, gripper = cube_a + [0.0, 0.0, HOVER_HEIGHT_M], OPEN
            if np.all(np.abs(target - eef) < [ALIGN_TOL_M, ALIGN_TOL_M, 2 * ALIGN_TOL_M]):
                self._enter(_DESCEND)
        if self._phase == _DESCEND:
            target, gripper = cube_a - [0.0, 0.0, GRASP_DEPTH_M], OPEN
            if abs(target[2] - eef[2]) < ALIGN_TOL_M:
                self._enter(_GRASP)
        if self._phase == _GRASP:
            target, gripper = eef, CLOSE
            if self._phase_steps > GRASP_STEPS:
                self._enter(_LIFT)
        if self._phase == _LIFT:  # straight up, steering cube A
            cube_goal = np.array([cube_a[0], cube_a[1], above_b[2] + CARRY_CLEARANCE_M])
            target, gripper = eef + cube_goal - cube_a, CLOSE
            if cube_goal[2] - cube_a[2] < ALIGN_TOL_M:
                self._enter(_CARRY)
        if self._phase == _CARRY:
            cube_goal = above_b + [0.0, 0.0, CARRY_CLEARANCE_M]
            target, gripper = eef + cube_goal - cube_a, CLOSE
            if np.linalg.norm(cube_goal[:2] - cube_a[:2]) < PLACE_ALIGN_TOL_M:
                self._enter(_LOWER)
        if self._phase == _LOWER:
            cube_goal = above_b + [0.0, 0.0, PLACE_GAP_M]
            target, gripper = eef + cube_goal - cube_a, CLOSE
            if cube_a[2] - cube_goal[2] < PLACE_GAP_M:
                self._enter(_RELEASE)
        if self._phase == _RELEASE:
            target, gripper = eef, OPEN
            if self._phase_steps > RELEASE_STEPS:
                self._enter(_RETREAT)
                self._retreat_z = eef[2] + RETREAT_HEIGHT_M
        if self._phase == _RETREAT:
            target, gripper = np.array([eef[0], eef[1], self._retreat_z]), OPEN
        return osc_action(target - eef, gripper)
