"""A scripted expert for robosuite Door (with its latch) working from the compact state observation.

Door (robosuite 1.5.2, ``use_latch=True``): a door in a frame stands to the robot's right, its
panel roughly in the world x-z plane (yaw uniform over a 0.25 rad range, position +-0.01 m). It
swings open towards the robot about a vertical hinge at its far edge from the latch. A lever
handle, 0.1 m in front of the panel's mid-plane, turns about the door's normal (the latch axis);
the latch holds the door shut until the lever is turned down by about 1.25 rad (measured; the
joint stops at 1.57 rad, and a 1 N m/rad spring turns it back). Success: hinge angle above 0.3 rad.

The hand cannot reach down over the lever: its palm, 0.2 m long across the fingers, would hit
the panel. So the expert points the hand at the door, fingers apart vertically, and turns the
lever as a wrist would. Phases (metres, radians, world frame):

1. turn the hand to point along the latch axis into the door, fingers open one above the other,
   while moving the gripper site 0.08 m in front of the ``handle`` site (on the lever, 0.125 m
   from the latch axis);
2. move in until the site reaches the handle site, the lever between the fingers;
3. close the gripper on the lever;
4. turn the lever down: the site follows the handle site's arc about the latch axis, and the hand
   rolls with the lever, a little ahead of the lever's angle;
5. once the lever is past the latch's release angle, pull the hand along the door's opening arc
   about the hinge, still holding the lever turned.

If the lever slips out of the gripper, the expert starts over.

Geometry read from the observation, with the door's MJCF (``door_lock.xml``): in the door's
frame, the handle site lies at ``(-0.175 + 0.125 cos(q), -0.10, -0.025 - 0.125 sin(q))`` for the
lever angle ``q`` (``handle_qpos``) and the hinge at ``(0.255, 0, 0)``, so ``door_pos``,
``handle_pos`` and ``q`` give the door's yaw (its hinge angle included), the latch axis and the
hinge. ``robot0_eef_quat`` gives the hand's orientation, steered in closed loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from simulators.experts.measured_steps import ROBOSUITE_STEPS
from simulators.experts.registry import ExpertSteps, register_expert
from simulators.experts.scripting import (
    CLOSE,
    OPEN,
    PhasedExpert,
    osc_action,
    quat_to_matrix,
    rotation_error,
)

LEVER_RADIUS_M = 0.125
"""Distance of the ``handle`` site from the latch axis, metres."""
LATCH_X_M = -0.175
"""The latch axis's position along the door's x axis (door frame), metres."""
HANDLE_Y_M = -0.10
"""The handle site's position along the latch axis (door frame; negative: in front of the panel,
towards the robot), metres."""
HINGE_X_M = 0.255
"""The hinge axis's position along the door's x axis (door frame), metres."""
RELEASE_RAD = 1.35
"""Lever angle at which the expert starts pulling (the latch releases from about 1.25 rad), radians."""
HOLD_RAD = 1.45
"""Least lever angle the hand steers to while pulling, radians (the joint stops at 1.57 rad)."""
TURN_LEAD_RAD = 0.3
"""How far ahead of the lever's angle the hand's position and roll are steered, radians."""
PULL_STEP_M = 0.05
"""Hand advance commanded per control step along the door's opening arc, metres."""
PREGRASP_M = 0.08
"""Distance in front of the handle site from which the hand moves in, metres."""
ROTATION_GAIN = 3.0
"""Rotation commanded per radian of orientation error (the controller achieves about an eighth
of a commanded rotation per control step), radians per radian."""
ALIGN_TOL_M = 0.01
"""Position error accepted before moving to the next phase, metres."""
ALIGN_TOL_RAD = 0.1
"""Orientation error accepted before moving in, radians."""
GRASP_STEPS = 6
"""Control steps spent closing the gripper before turning."""
SLIP_DIST_M = 0.05
"""Gripper-to-handle-site distance beyond which the grasp counts as lost, metres."""

_UP = np.array([0.0, 0.0, 1.0])
_APPROACH, _INSERT, _GRASP, _TURN, _PULL = range(5)


class _DoorFrame:
    """The door's geometry at one instant, from the observed door, handle site and lever angle.

    Attributes:
        lever_dir: (3,) unit, horizontal: where the lever points at angle 0 (the door's x axis).
        latch_dir: (3,) unit, horizontal: the latch axis, into the door (the door's y axis).
        latch: (3,) the latch axis's point in the handle site's plane, metres.
        hinge: (3,) a point of the hinge axis, metres.
    """

    def __init__(self, door: np.ndarray, handle: np.ndarray, lever: float) -> None:
        local = np.array([LATCH_X_M + LEVER_RADIUS_M * np.cos(lever), HANDLE_Y_M])
        seen = handle[:2] - door[:2]
        yaw = np.arctan2(seen[1], seen[0]) - np.arctan2(local[1], local[0])
        self.lever_dir = np.array([np.cos(yaw), np.sin(yaw), 0.0])
        self.latch_dir = np.array([-np.sin(yaw), np.cos(yaw), 0.0])
        self.latch = handle - self._lever_offset(lever)
        self.hinge = door + HINGE_X_M * self.lever_dir

    def _lever_offset(self, angle: float) -> np.ndarray:
        # a positive angle turns the lever's end down
        return LEVER_RADIUS_M * (np.cos(angle) * self.lever_dir - np.sin(angle) * _UP)

    def handle_at(self, angle: float) -> np.ndarray:
        """Where the handle site is with the lever at ``angle``, metres (3,)."""
        return self.latch + self._lever_offset(angle)

    def hand_at(self, angle: float) -> np.ndarray:
        """The hand orientation ``(3, 3)`` (columns: the hand's x, y, z axes in the world, as
        ``robot0_eef_quat``) gripping the lever at ``angle``: pointing into the door, fingers
        apart across the lever."""
        across = np.sin(angle) * self.lever_dir + np.cos(angle) * _UP
        return np.column_stack([np.cross(across, self.latch_dir), across, self.latch_dir])


@register_expert(("robosuite", "robosuite_lift"), "Door")
class DoorExpert(PhasedExpert):
    """Scripted Door expert; keep one per environment and call :meth:`reset` at each episode start.

    Args:
        obs_layout: where each key lies in the flat observation (``RobosuiteEnv.obs_layout``);
            needs ``robot0_eef_pos``, ``robot0_eef_quat``, ``door_pos``, ``handle_pos`` and
            ``handle_qpos``.

    Raises:
        ValueError: if a needed observation key is missing.
    """

    measured_steps: ClassVar[dict[str, ExpertSteps]] = ROBOSUITE_STEPS["Door"]
    """Control steps of its demonstrations per robot (:mod:`simulators.experts.measured_steps`)."""

    needed_keys = ("robot0_eef_pos", "robot0_eef_quat", "door_pos", "handle_pos", "handle_qpos")

    def __init__(self, obs_layout: Mapping[str, slice]) -> None:
        super().__init__(obs_layout)
        self._eef, self._quat, self._door, self._handle, self._lever = self.slices

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Action for the current observation.

        Args:
            obs: float ``(obs_dim,)`` flat state observation.

        Returns:
            float32 ``(7,)``: position delta (3, in units of 0.05 m), rotation delta (3, axis-angle
            in units of 0.5 rad), gripper.
        """
        eef, hand = obs[self._eef].astype(np.float64), quat_to_matrix(obs[self._quat])
        handle, lever = obs[self._handle].astype(np.float64), float(obs[self._lever][0])
        frame = _DoorFrame(obs[self._door].astype(np.float64), handle, lever)
        self._phase_steps += 1
        if self._phase >= _TURN and np.linalg.norm(handle - eef) > SLIP_DIST_M:
            self.reset()
        hand_angle = 0.0  # the lever angle the hand's orientation is steered to
        if self._phase == _APPROACH:
            target, gripper = handle - PREGRASP_M * frame.latch_dir, OPEN
            aligned = np.linalg.norm(rotation_error(frame.hand_at(0.0), hand)) < ALIGN_TOL_RAD
            if aligned and np.linalg.norm(target - eef) < ALIGN_TOL_M:
                self._enter(_INSERT)
        if self._phase == _INSERT:
            target, gripper = handle, OPEN
            if np.linalg.norm(target - eef) < ALIGN_TOL_M:
                self._enter(_GRASP)
        if self._phase == _GRASP:
            target, gripper = handle, CLOSE
            if self._phase_steps > GRASP_STEPS:
                self._enter(_TURN)
        if self._phase == _TURN:
            hand_angle = min(lever + TURN_LEAD_RAD, np.pi / 2)
            target, gripper = frame.handle_at(hand_angle), CLOSE
            if lever >= RELEASE_RAD:
                self._enter(_PULL)
        if self._phase == _PULL:
            hand_angle = min(max(lever + TURN_LEAD_RAD, HOLD_RAD), np.pi / 2)
            opening = np.cross(_UP, eef - frame.hinge)  # the hand's direction of travel as the door opens
            opening /= max(np.linalg.norm(opening), 1e-9)
            target, gripper = frame.handle_at(hand_angle) + PULL_STEP_M * opening, CLOSE
        rotation = ROTATION_GAIN * rotation_error(frame.hand_at(hand_angle), hand)
        return osc_action(target - eef, gripper, rotation)
