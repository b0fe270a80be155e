"""Scripted experts that produce demonstrations, registered by simulator name."""

from simulators.experts.lift import LiftExpert
from simulators.experts.registry import EXPERTS

__all__ = ["EXPERTS", "LiftExpert"]
