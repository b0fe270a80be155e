"""A scripted expert for robosuite PickPlaceCan working from the compact state observation.

PickPlaceCan (robosuite 1.5.2): an upright can (0.05 m across, 0.08 m tall) stands at a uniform
position in the left bin (centre (0.1, -0.25) m, floor top at z = 0.82 m, walls up to 0.9 m)
with a uniform random yaw. The right bin (centre (0.1, 0.28) m) is split into four quarters by
0.1 m dividers; success: the can's centre lies in the can's quarter (x in [0.1, 0.295] m,
y in [0.28, 0.525] m, 0.8 m < z < 0.9 m) and the gripper site is more than about 0.042 m from it.

Phases (positions in metres, world frame): move the open gripper above the can, descend around
it, close the gripper, lift the can clear of the bin walls, carry it over the centre of its
quarter, lower it until its bottom is just above the floor, open the gripper, and rise. The
carry phases steer the can's position (the hand moves by the can's error). If the can slips out
of the gripper while carried, the expert starts over. The can is round, so its yaw does not
matter and the expert commands zero rotation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from simulators.experts.measured_steps import ROBOSUITE_STEPS
from simulators.experts.registry import ExpertSteps, register_expert
from simulators.experts.scripting import CLOSE, OPEN, PhasedExpert, osc_action

TARGET_XY_M = np.array([0.1975, 0.4025])
"""Centre of the can's quarter of the right bin (robosuite's ``target_bin_placements`` for the
can with the default ``bin2_pos`` (0.1, 0.28, 0.8) and bin size (0.39, 0.49)), metres."""
HOVER_HEIGHT_M = 0.08
"""Height above the can's centre from which to descend, metres."""
GRASP_HEIGHT_M = 0.01
"""Height of the gripper site above the can's centre when closing, metres (lower, the hand
stalls on the can's top near the far edge of the bin, where the arm is almost stretched out)."""
CARRY_Z_M = 0.98
"""Height of the can's centre while carried: its bottom (0.04 m below) clears the 0.9 m walls
and dividers by 0.04 m, metres."""
PLACE_Z_M = 0.89
"""Height of the can's centre at which the gripper lets go (its bottom 0.03 m above the floor;
success needs the centre below 0.9 m once it rests), metres."""
RETREAT_HEIGHT_M = 0.1
"""How far the hand rises after letting go, metres."""
ALIGN_TOL_M = 0.01
"""Position error accepted before moving to the next phase, metres."""
PLACE_ALIGN_TOL_M = 0.02
"""Horizontal error of the can over the quarter's centre accepted before lowering it, metres."""
GRASP_STEPS = 6
"""Control steps spent closing the gripper before lifting."""
RELEASE_STEPS = 4
"""Control steps spent opening the gripper before rising."""
SLIP_DIST_M = 0.05
"""Gripper-to-can distance beyond which a grasp counts as lost, metres."""

_APPROACH, _DESCEND, _GRASP, _LIFT, _CARRY, _LOWER, _RELEASE, _RETREAT = range(8)


@register_expert(("robosuite", "robosuite_lift"), "PickPlaceCan")
class PickPlaceCanExpert(PhasedExpert):
    """Scripted PickPlaceCan expert; keep one per environment and call :meth:`reset` at each episode start.

    Args:
        obs_layout: where each key lies in the flat observation (``RobosuiteEnv.obs_layout``);
            needs ``robot0_eef_pos`` and ``Can_pos``.

    Raises:
        ValueError: if a needed observation key is missing.
    """

    measured_steps: ClassVar[dict[str, ExpertSteps]] = ROBOSUITE_STEPS["PickPlaceCan"]
    """Control steps of its demonstrations per robot (:mod:`simulators.experts.measured_steps`)."""

    needed_keys = ("robot0_eef_pos", "Can_pos")

    def __init__(self, obs_layout: Mapping[str, slice]) -> None:
        super().__init__(obs_layout)
        self._eef, self._can = self.slices

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
        eef, can = obs[self._eef].astype(np.float64), obs[self._can].astype(np.float64)
        self._phase_steps += 1
        if _GRASP <= self._phase <= _LOWER and np.linalg.norm(can - eef) > SLIP_DIST_M:
            self.reset()
        if self._phase == _APPROACH:
            target, gripper = can + [0.0, 0.0, HOVER_HEIGHT_M], OPEN
            if np.all(np.abs(target - eef) < [ALIGN_TOL_M, ALIGN_TOL_M, 2 * ALIGN_TOL_M]):
                self._enter(_DESCEND)
        if self._phase == _DESCEND:
            target, gripper = can + [0.0, 0.0, GRASP_HEIGHT_M], OPEN
            if abs(target[2] - eef[2]) < ALIGN_TOL_M:
                self._enter(_GRASP)
        if self._phase == _GRASP:
            target, gripper = eef, CLOSE
            if self._phase_steps > GRASP_STEPS:
                self._enter(_LIFT)
        if self._phase == _LIFT:  # straight up, steering the can
            can_goal = np.array([can[0], can[1], CARRY_Z_M])
            target, gripper = eef + can_goal - can, CLOSE
            if can_goal[2] - can[2] < ALIGN_TOL_M:
                self._enter(_CARRY)
        if self._phase == _CARRY:
            can_goal = np.array([*TARGET_XY_M, CARRY_Z_M])
            target, gripper = eef + can_goal - can, CLOSE
            if np.linalg.norm(can_goal[:2] - can[:2]) < PLACE_ALIGN_TOL_M:
                self._enter(_LOWER)
        if self._phase == _LOWER:
            can_goal = np.array([*TARGET_XY_M, PLACE_Z_M])
            target, gripper = eef + can_goal - can, CLOSE
            if can[2] - can_goal[2] < ALIGN_TOL_M:
                self._enter(_RELEASE)
        if self._phase == _RELEASE:
            target, gripper = eef, OPEN
            if self._phase_steps > RELEASE_STEPS:
                self._enter(_RETREAT)
                self._retreat_z = eef[2] + RETREAT_HEIGHT_M
        if self._phase == _RETREAT:
            target, gripper = np.array([eef[0], eef[1], self._retreat_z]), OPEN
        return osc_action(target - eef, gripper)
