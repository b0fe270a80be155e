"""Scripted experts that produce demonstrations, registered by simulator and task."""

from simulators.experts.lift import LiftExpert
from simulators.experts.metaworld import MetaWorldExpert
from simulators.experts.registry import (
    EXPERTS,
    NoExpertError,
    expert_class,
    make_expert,
    register_expert,
    tasks_with_expert,
)

__all__ = ["EXPERTS", "LiftExpert", "MetaWorldExpert", "NoExpertError", "expert_class", "make_expert",
           "register_expert", "tasks_with_expert"]
