"""How many control steps each scripted expert's demonstrations take: the measurements behind
the experts' ``measured_steps``, which the planner compares with ``simulator.env.horizon``
(:func:`simulators.experts.registry.horizon_problem`).

Measured with :mod:`simulators.experts.measure` (2026-11-27, robosuite 1.5.2, MuJoCo 3.3.0,
metaworld 3.1.1; greedy experts, one environment, episodes from the demonstration initial states
2,000,000,000 + [0, n), as the ``demonstrations`` node runs them): robosuite with ``OSC_POSE`` and
a horizon of 400 control steps (Panda, Sawyer: 20 episodes) or 250-300 (the other arms: 5
episodes), MetaWorld with a horizon of 500 (20 episodes of each of the 50 tasks).
"""

from __future__ import annotations

from simulators.experts.registry import ExpertSteps


def _other_action(robot: str, values: int) -> ExpertSteps:
    return ExpertSteps(0, 0, note=f"the robosuite experts give OSC_POSE's 7 action values, an arm and a one-value "
                                  f"gripper; the {robot} takes {values}")


_NOT_ARMS = {"PandaDexLH": _other_action("PandaDexLH", 12), "PandaDexRH": _other_action("PandaDexRH", 12),
             "PandaOmron": _other_action("PandaOmron", 12), "SpotWithArm": _other_action("SpotWithArm", 19)}
"""The single-arm robosuite robots whose ``OSC_POSE`` action is not 7 values (a hand, a mobile base,
legs), measured on Lift."""

ROBOSUITE_STEPS: dict[str, dict[str, ExpertSteps]] = {
    "Lift": {
        "IIWA": ExpertSteps(5, 5, 25, 29, 31),
        "Jaco": ExpertSteps(0, 5),
        "Kinova3": ExpertSteps(5, 5, 31, 34, 66),
        "Panda": ExpertSteps(20, 20, 26, 28, 32),
        "Sawyer": ExpertSteps(17, 20, 38, 49, 58),
        "UR5e": ExpertSteps(5, 5, 39, 41, 44),
        "XArm7": ExpertSteps(5, 5, 39, 40, 44),
        **_NOT_ARMS,
    },
    "Stack": {
        "IIWA": ExpertSteps(5, 5, 53, 59, 64),
        "Jaco": ExpertSteps(0, 5),
        "Kinova3": ExpertSteps(5, 5, 53, 65, 87),
        "Panda": ExpertSteps(20, 20, 54, 60, 68),
        "Sawyer": ExpertSteps(11, 20, 70, 98, 118),
        "UR5e": ExpertSteps(5, 5, 68, 70, 98),
        "XArm7": ExpertSteps(5, 5, 68, 69, 74),
        **_NOT_ARMS,
    },
    "PickPlaceCan": {
        "IIWA": ExpertSteps(4, 5, 97, 112, 120),
        "Jaco": ExpertSteps(0, 5),
        "Kinova3": ExpertSteps(4, 5, 91, 104, 152),
        "Panda": ExpertSteps(20, 20, 89, 107, 131),
        "Sawyer": ExpertSteps(10, 20, 146, 187, 213),
        "UR5e": ExpertSteps(5, 5, 99, 110, 129),
        "XArm7": ExpertSteps(5, 5, 106, 119, 143),
        **_NOT_ARMS,
    },
    "Door": {
        "IIWA": ExpertSteps(5, 5, 82, 83, 84),
        "Jaco": ExpertSteps(3, 5, 81, 167, 167),
        "Kinova3": ExpertSteps(5, 5, 80, 87, 89),
        "Panda": ExpertSteps(20, 20, 77, 81, 89),
        "Sawyer": ExpertSteps(18, 20, 93, 95, 102),
        "UR5e": ExpertSteps(0, 5),
        "XArm7": ExpertSteps(4, 5, 69, 80, 88),
        **_NOT_ARMS,
    },
}
"""``{task: {robot: ExpertSteps}}`` of the robosuite experts, for every robot of
:data:`simulators.robosuite_env.SINGLE_ARM_ROBOTS`."""

METAWORLD_STEPS: dict[str, ExpertSteps] = {
    "assembly-v3": ExpertSteps(20, 20, 83, 89, 97),
    "basketball-v3": ExpertSteps(18, 20, 83, 91, 103),
    "bin-picking-v3": ExpertSteps(20, 20, 95, 127, 195),
    "box-close-v3": ExpertSteps(18, 20, 91, 107, 124),
    "button-press-topdown-v3": ExpertSteps(20, 20, 58, 66, 73),
    "button-press-topdown-wall-v3": ExpertSteps(20, 20, 52, 57, 63),
    "button-press-v3": ExpertSteps(20, 20, 56, 60, 62),
    "button-press-wall-v3": ExpertSteps(19, 20, 59, 64, 70),
    "coffee-button-v3": ExpertSteps(20, 20, 29, 35, 41),
    "coffee-pull-v3": ExpertSteps(20, 20, 71, 80, 86),
    "coffee-push-v3": ExpertSteps(20, 20, 53, 55, 58),
    "dial-turn-v3": ExpertSteps(20, 20, 66, 72, 79),
    "disassemble-v3": ExpertSteps(17, 20, 74, 144, 213),
    "door-close-v3": ExpertSteps(20, 20, 53, 66, 73),
    "door-lock-v3": ExpertSteps(20, 20, 58, 64, 125),
    "door-open-v3": ExpertSteps(19, 20, 71, 75, 108),
    "door-unlock-v3": ExpertSteps(20, 20, 37, 44, 64),
    "hand-insert-v3": ExpertSteps(20, 20, 52, 59, 67),
    "drawer-close-v3": ExpertSteps(20, 20, 78, 78, 79),
    "drawer-open-v3": ExpertSteps(20, 20, 86, 88, 93),
    "faucet-open-v3": ExpertSteps(20, 20, 55, 59, 65),
    "faucet-close-v3": ExpertSteps(20, 20, 61, 65, 68),
    "hammer-v3": ExpertSteps(20, 20, 60, 67, 75),
    "handle-press-side-v3": ExpertSteps(20, 20, 25, 43, 51),
    "handle-press-v3": ExpertSteps(20, 20, 13, 29, 46),
    "handle-pull-side-v3": ExpertSteps(20, 20, 67, 76, 106),
    "handle-pull-v3": ExpertSteps(20, 20, 89, 103, 117),
    "lever-pull-v3": ExpertSteps(20, 20, 65, 80, 91),
    "pick-place-wall-v3": ExpertSteps(20, 20, 75, 82, 109),
    "pick-out-of-hole-v3": ExpertSteps(20, 20, 109, 117, 126),
    "pick-place-v3": ExpertSteps(20, 20, 44, 54, 59),
    "plate-slide-v3": ExpertSteps(20, 20, 48, 51, 54),
    "plate-slide-side-v3": ExpertSteps(20, 20, 46, 48, 53),
    "plate-slide-back-v3": ExpertSteps(20, 20, 46, 80, 85),
    "plate-slide-back-side-v3": ExpertSteps(20, 20, 35, 41, 51),
    "peg-insert-side-v3": ExpertSteps(18, 20, 78, 92, 235),
    "peg-unplug-side-v3": ExpertSteps(20, 20, 75, 109, 161),
    "soccer-v3": ExpertSteps(19, 20, 39, 57, 116),
    "stick-push-v3": ExpertSteps(20, 20, 67, 74, 79),
    "stick-pull-v3": ExpertSteps(20, 20, 93, 119, 184),
    "push-v3": ExpertSteps(20, 20, 53, 60, 69),
    "push-wall-v3": ExpertSteps(20, 20, 67, 76, 86),
    "push-back-v3": ExpertSteps(19, 20, 73, 83, 321),
    "reach-v3": ExpertSteps(20, 20, 31, 49, 63),
    "reach-wall-v3": ExpertSteps(20, 20, 37, 44, 54),
    "shelf-place-v3": ExpertSteps(20, 20, 76, 92, 252),
    "sweep-into-v3": ExpertSteps(16, 20, 46, 54, 66),
    "sweep-v3": ExpertSteps(20, 20, 72, 91, 112),
    "window-open-v3": ExpertSteps(20, 20, 75, 88, 94),
    "window-close-v3": ExpertSteps(20, 20, 76, 80, 86),
}
"""``{task: ExpertSteps}`` of MetaWorld's scripted policies (:class:`~simulators.experts.metaworld.MetaWorldExpert`;
MetaWorld's robot is a Sawyer)."""
