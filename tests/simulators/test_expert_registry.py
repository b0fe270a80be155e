"""The scripted-expert registry: keyed by (simulator, task), errors that name the task."""

from __future__ import annotations

import pytest

from simulators.experts import (
    LiftExpert,
    NoExpertError,
    expert_class,
    tasks_with_expert,
)
from simulators.registry import task_name


def test_lift_expert_serves_both_robosuite_names():
    assert expert_class("robosuite_lift", "Lift") is LiftExpert
    assert expert_class("robosuite", "Lift") is LiftExpert
    assert "Lift" in tasks_with_expert("robosuite")


def test_missing_expert_names_the_task_and_those_with_one():
    with pytest.raises(NoExpertError, match=r"task 'Nope' of simulator 'robosuite' \(tasks with one: .*Lift"):
        expert_class("robosuite", "Nope")


def test_task_name_comes_from_the_simulator_config():
    assert task_name("robosuite_lift") == "Lift"
    assert task_name("robosuite", {"task": "Stack"}) == "Stack"
    assert task_name("libero", {"suite": "libero_goal", "task_id": 3}) == "libero_goal_3"
