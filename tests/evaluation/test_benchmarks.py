"""Benchmarks and the run's own tasks: which tasks an evaluation runs, named and set up how, in
which order, and where a task sits among the run's own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vla_rl.evaluation.benchmarks import BENCHMARKS, EvalTask, resolve_tasks, run_task_index, run_tasks


def config(env: dict, name: str = "robosuite", benchmark: str | None = None, tasks=None, task_envs=None):
    simulator = SimpleNamespace(name=name, env=env, multi_task=task_envs is not None,
                                task_names=lambda: list(task_envs), task_envs=lambda: list(task_envs.values()))
    return SimpleNamespace(simulator=simulator, eval=SimpleNamespace(benchmark=benchmark, tasks=tasks))


def test_the_robosuite_benchmark_shares_the_runs_settings_but_its_task_and_state_keys():
    run = config({"task": "Lift", "horizon": 40, "robot": "Panda", "obs_keys": ["robot0_eef_pos"]})
    tasks = BENCHMARKS.get("robosuite")(run)
    assert [t.name for t in tasks] == ["Lift", "Stack", "PickPlaceCan", "Door"]
    assert tasks[3] == EvalTask("Door", "robosuite", {"horizon": 40, "robot": "Panda", "task": "Door"})


def test_a_metaworld_benchmark_shares_the_runs_settings_but_its_task_and_instruction():
    run = config({"task": "reach-v3", "horizon": 50, "instruction": "reach the goal"}, name="metaworld")
    tasks = BENCHMARKS.get("metaworld_mt10")(run)
    assert len(tasks) == 10 and tasks[1] == EvalTask("push-v3", "metaworld", {"horizon": 50, "task": "push-v3"})


def test_a_single_task_run_names_its_task_after_the_settings_task_else_the_simulator():
    assert run_tasks(config({"task": "Door", "horizon": 40})) == [
        EvalTask("Door", "robosuite", {"task": "Door", "horizon": 40})]
    assert run_tasks(config({"horizon": 40}, name="robosuite_lift")) == [
        EvalTask("robosuite_lift", "robosuite_lift", {"horizon": 40})]


def test_a_task_sits_where_the_run_has_it_among_its_own():
    run = config({}, name="robosuite_lift", task_envs={"short": {"horizon": 30}, "long": {"horizon": 40}})
    assert run_task_index(run, EvalTask("x", "robosuite_lift", {"horizon": 40, "robot": "Panda"})) == 1
    assert run_task_index(run, EvalTask("x", "robosuite_lift", {"horizon": 30})) == 0
    assert run_task_index(run, EvalTask("x", "robosuite_lift", {"horizon": 50})) is None


def test_selected_tasks_keep_the_benchmarks_order():
    run = config({"horizon": 40}, benchmark="robosuite", tasks=["Door", "Lift"])
    assert [t.name for t in resolve_tasks(run)] == ["Lift", "Door"]


def test_a_selection_of_no_task_is_refused():
    with pytest.raises(ValueError, match=r"eval.tasks \[\] must select tasks of benchmark 'robosuite': Lift, "):
        resolve_tasks(config({"horizon": 40}, benchmark="robosuite", tasks=[]))
