"""Scripted experts that produce demonstrations, registered by simulator and task."""

from simulators.experts.door import DoorExpert
from simulators.experts.lift import LiftExpert
from simulators.experts.pick_place_can import PickPlaceCanExpert
from simulators.experts.stack import StackExpert
from simulators.experts.registry import (
    EXPERTS,
    NoExpertError,
    expert_class,
    make_expert,
    register_expert,
    tasks_with_expert,
)

__all__ = ["EXPERTS", "DoorExpert", "LiftExpert", "NoExpertError", "PickPlaceCanExpert", "StackExpert",
           "expert_class", "make_expert", "register_expert", "tasks_with_expert"]
