"""Scripted experts for the MetaWorld v3 tasks: wrappers of MetaWorld's own scripted policies.

``metaworld.policies`` has one hand-written policy per task (``SawyerReachV3Policy``, ...): a
stateless function of MetaWorld's 39-value observation (hand, gripper, objects, goal) returning
``[dx, dy, dz, grip]``. :class:`MetaWorldExpert` wraps it behind the expert contract of
:mod:`simulators.experts.registry`; one subclass per task is registered for simulator
``metaworld``. metaworld is imported when an expert is created, never when this module is.

The policies read the goal from the observation: they need ``goal_observable=True``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from simulators.experts.measured_steps import METAWORLD_STEPS
from simulators.experts.registry import ExpertSteps, register_expert
from simulators.metaworld_env import (
    METAWORLD_OBS_LAYOUT,
    METAWORLD_V3_TASKS,
    OBS_DIM,
    ROBOT,
)
from simulators.rendering import setup_headless_rendering

TASKS_WITH_POLICY: tuple[str, ...] = METAWORLD_V3_TASKS
"""Tasks with a scripted policy in ``metaworld.policies.ENV_POLICY_MAP`` (all 50 in metaworld
3.1.1; a test checks it)."""


class MetaWorldExpert:
    """MetaWorld's scripted policy for :attr:`task`; keep one per environment and call
    :meth:`reset` at each episode start (the policies keep no state, so it does nothing).

    Args:
        obs_layout: where each part lies in the observation (``MetaWorldEnv.obs_layout``); must
            be MetaWorld's full 39-value layout with the goal observable.

    Raises:
        ValueError: if the layout is not MetaWorld's goal-observable layout.
    """

    task: str = ""
    """The MetaWorld task this expert solves (set by each registered subclass)."""
    measured_steps: ClassVar[dict[str, ExpertSteps]] = {}
    """Control steps of its demonstrations, keyed by MetaWorld's robot (``"Sawyer"``; set by each
    registered subclass from :data:`simulators.experts.measured_steps.METAWORLD_STEPS`)."""

    def __init__(self, obs_layout: Mapping[str, slice]) -> None:
        if dict(obs_layout) != METAWORLD_OBS_LAYOUT:
            hint = (" (the goal is hidden: set goal_observable: true, MetaWorld's policies read the goal)"
                    if "goal_pos_hidden" in obs_layout else "")
            raise ValueError(f"the MetaWorld expert for {self.task!r} needs MetaWorld's {OBS_DIM}-value observation "
                             f"with keys {list(METAWORLD_OBS_LAYOUT)}; got {list(obs_layout)}{hint}")
        setup_headless_rendering()  # metaworld.policies imports metaworld, which imports mujoco
        from metaworld.policies import ENV_POLICY_MAP

        self._policy: Any = ENV_POLICY_MAP[self.task]()

    @classmethod
    def config_problem(cls, config: Any) -> tuple[str, str] | None:
        """Plan-time: ``(field, why)`` when a simulator config (``MetaWorldEnvConfig``) gives an
        observation this expert cannot act on (a hidden goal), else None."""
        if not config.goal_observable:
            return "simulator.env.goal_observable", (f"MetaWorld's scripted policy for {config.task_name} reads the "
                                                     "goal from the observation, which goal_observable: false hides; "
                                                     "set it true, or warm_start.num_demos=0")
        return None

    def reset(self) -> None:
        """Start a new episode (MetaWorld's policies are stateless)."""

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Action for the current observation.

        Args:
            obs: float ``(39,)`` MetaWorld observation.

        Returns:
            float32 ``(4,)`` in [-1, 1]: xyz position delta (units of 0.01 m), gripper effort
            (-1 open, +1 close). The policies' proportional terms may exceed 1 and are clipped,
            as the environment would clip them.
        """
        with warnings.catch_warnings():
            # metaworld.policies.policy.move warns whenever a proportional term exceeds 1
            warnings.filterwarnings("ignore", message="Constant", category=UserWarning)
            action = self._policy.get_action(np.asarray(obs, dtype=np.float64))
        return np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)


def _expert_class_name(task: str) -> str:
    """``"pick-place-v3"`` -> ``"MetaWorldPickPlaceV3Expert"``."""
    return "MetaWorld" + "".join(part.capitalize() for part in task.split("-")) + "Expert"


EXPERT_CLASSES: dict[str, type[MetaWorldExpert]] = {}
"""The registered expert class of each task."""

for _task in TASKS_WITH_POLICY:
    EXPERT_CLASSES[_task] = register_expert("metaworld", _task)(
        type(_expert_class_name(_task), (MetaWorldExpert,),
             {"task": _task, "measured_steps": {ROBOT: METAWORLD_STEPS[_task]}, "__module__": __name__})
    )
del _task
