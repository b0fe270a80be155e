"""A task fits a policy by its observation layout (not only its size), its action size and, for a
policy conditioned on a task one-hot, its membership of the policy's task set."""

from __future__ import annotations

import dataclasses

import pytest

from simulators.registry import build_env_config
from simulators.worker import SimulatorWorker
from vla_rl.config import RunConfig
from vla_rl.evaluation.benchmarks import (
    EvalTask,
    robosuite_benchmark,
    run_task_index,
    run_tasks,
)
from vla_rl.evaluation.compatibility import incompatibility, one_hot_tasks, trained_on
from vla_rl_core.env_spec import EnvSpec


def robosuite_spec(task: str) -> EnvSpec:
    worker = SimulatorWorker("robosuite", build_env_config("robosuite", {"task": task}), 1)
    try:
        return worker.spec()
    finally:
        worker.close()


@pytest.fixture(scope="module")
def specs():
    return {task: robosuite_spec(task) for task in ("Lift", "Stack", "Door")}


def test_same_size_but_another_layout_does_not_fit(specs):
    """Stack and Door both observe 20 values, but not the same ones."""
    door, stack = specs["Door"], specs["Stack"]
    assert door.obs_dim == stack.obs_dim == 20
    reason = incompatibility(EvalTask("Door", "robosuite"), door, stack, "robosuite", None, False)
    assert reason.startswith("its observation [robot0_eef_pos 3, robot0_gripper_qpos 2, robot0_eef_quat 4, door_pos 3")
    assert "is not the policy's [robot0_eef_pos 3, robot0_gripper_qpos 2, cubeA_pos 3" in reason
    assert "(20 values) (the policy is built for robosuite)" in reason
    assert incompatibility(EvalTask("Stack", "robosuite"), stack, stack, "robosuite", None, False) is None
    lift_reason = incompatibility(EvalTask("Stack", "robosuite"), stack, specs["Lift"], "robosuite_lift", None, False)
    assert "(20 values) is not the policy's" in lift_reason and "(15 values)" in lift_reason


def test_action_size_and_images_must_match(specs):
    lift = specs["Lift"]
    assert "its actions have 4 values, the policy's 7" in incompatibility(
        EvalTask("x", "sim"), dataclasses.replace(lift, action_dim=4), lift, "robosuite_lift", None, False)
    camera = dataclasses.replace(lift, images={"agentview_image": (128, 128, 3)})
    assert "camera images none are not the policy's {'agentview_image'" in incompatibility(
        EvalTask("x", "sim"), lift, camera, "robosuite_lift", None, False)


def test_a_one_hot_policy_runs_only_its_own_tasks():
    config = RunConfig.model_validate({"simulator": {"name": "metaworld", "tasks": ["reach-v3", "push-v3"],
                                                     "env": {"horizon": 20}},
                                       "data": {"init_states_per_step": 2}})
    assert one_hot_tasks(config) == ["reach-v3", "push-v3"]
    own = run_tasks(config)
    assert [t.env for t in own] == [{"horizon": 20, "task": "reach-v3"}, {"horizon": 20, "task": "push-v3"}]
    assert run_task_index(config, EvalTask("push", "metaworld", {"task": "push-v3", "horizon": 20})) == 1
    assert run_task_index(config, EvalTask("push", "metaworld", {"task": "push-v3", "horizon": 30})) is None
    reason = incompatibility(EvalTask("door-open-v3", "metaworld"), None, {}, "metaworld", one_hot_tasks(config), False)
    assert reason == ("the policy takes a one-hot of its 2 training tasks (reach-v3, push-v3); task 'door-open-v3' "
                      "(metaworld with these settings) is not one of them")
    assert incompatibility(own[0], None, {}, "metaworld", one_hot_tasks(config), True) is None
    # a single-task run's policy takes no one-hot; a VLA over a task set reads instructions instead
    assert one_hot_tasks(RunConfig.model_validate({})) is None
    lift = RunConfig.model_validate({})
    assert [t.name for t in robosuite_benchmark(lift)] == ["Lift", "Stack", "PickPlaceCan", "Door"]
    assert run_task_index(lift, robosuite_benchmark(lift)[0]) is None  # robosuite, not robosuite_lift: probed


def test_reasons_name_the_task_the_policy_was_trained_on():
    """A Door run of the robosuite_lift simulator is not called a Lift policy."""
    assert trained_on(RunConfig.model_validate({})) == "robosuite_lift"  # its default task
    door = RunConfig.model_validate({"simulator": {"env": {"task": "Door", "horizon": 150}}})
    assert trained_on(door) == "robosuite_lift task Door"
    mt = RunConfig.model_validate({"simulator": {"name": "metaworld", "tasks": ["reach-v3", "push-v3"],
                                                 "env": {"horizon": 150}}})
    assert trained_on(mt) == "metaworld tasks reach-v3, push-v3"
