"""Scripted experts that produce demonstrations, registered by simulator and task."""

from simulators.experts.door import DoorExpert
from simulators.experts.lift import LiftExpert
from simulators.experts.metaworld import MetaWorldExpert
from simulators.experts.pick_place_can import PickPlaceCanExpert
from simulators.experts.registry import (
    EXPERTS,
    ExpertSteps,
    NoExpertError,
    config_problem,
    expert_class,
    horizon_problem,
    make_expert,
    measured_steps,
    register_expert,
    tasks_with_expert,
)
from simulators.experts.stack import StackExpert

__all__ = ["EXPERTS", "DoorExpert", "ExpertSteps", "LiftExpert", "MetaWorldExpert", "NoExpertError",
           "PickPlaceCanExpert", "StackExpert", "config_problem", "expert_class", "horizon_problem", "make_expert", "measured_steps",
           "register_expert", "tasks_with_expert"]
