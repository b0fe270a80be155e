"""The LIBERO suites as evaluation benchmarks: every task of the suite with its own horizon, as
OpenVLA-OFT's ``run_libero_eval.py`` runs them, and trial ``i`` on initial state ``i``."""

from __future__ import annotations

import pytest

from simulators.libero_env import SUITE_NUM_TASKS, LiberoEnvConfig
from vla_rl.dag.loader import load_template
from vla_rl.evaluation.benchmarks import BENCHMARKS, resolve_tasks
from vla_rl_core.env_spec import EnvSpec


@pytest.mark.parametrize(("suite", "num_tasks", "horizon"), [
    ("libero_spatial", 10, 220), ("libero_object", 10, 280), ("libero_goal", 10, 300), ("libero_10", 10, 520),
    ("libero_90", 90, 400),
])
def test_each_suite_is_a_benchmark_of_all_its_tasks_with_the_suite_horizon(suite, num_tasks, horizon):
    config = load_template("embodied_grpo_oft_libero", ["simulator.env.horizon=16"]).config
    tasks = BENCHMARKS.get(suite)(config)
    assert SUITE_NUM_TASKS[suite] == num_tasks
    assert [t.name for t in tasks] == [f"{suite}_{i}" for i in range(num_tasks)]
    assert all(t.simulator == "libero" and t.env["suite"] == suite for t in tasks)
    assert [t.env["task_id"] for t in tasks] == list(range(num_tasks))
    # the run's other settings carry over; its training horizon does not
    assert tasks[0].env["cameras"] == ["agentview"] and tasks[0].env["camera_size"] == 128
    assert LiberoEnvConfig(**tasks[3].env).horizon == horizon


def test_eval_tasks_selects_tasks_of_a_suite():
    config = load_template("eval_rollout", ["eval.benchmark=libero_goal", "eval.tasks=[libero_goal_2]"]).config
    assert [t.name for t in resolve_tasks(config)] == ["libero_goal_2"]
    assert resolve_tasks(config)[0].env == {"suite": "libero_goal", "task_id": 2}  # not a LIBERO run: defaults


@pytest.mark.parametrize(("overrides", "message"), [
    (["eval.benchmark=libero_goal", "eval.tasks=[Foo]"], r"eval.tasks \['Foo'\] must select tasks of benchmark "
                                                         "'libero_goal': libero_goal_0, "),
    (["eval.tasks=[Foo]"], r"eval.tasks \['Foo'\] must select tasks of the run's simulator: robosuite_lift$"),
])
def test_unknown_tasks_are_refused_naming_the_tasks_to_pick_from(overrides, message):
    config = load_template("eval_rollout", overrides).config
    with pytest.raises(ValueError, match=message):
        resolve_tasks(config)


@pytest.mark.parametrize(("override", "field"), [("eval.init_state_offset=1000000007", "init_state_offset"),
                                                 ("eval.num_episodes=51", "num_episodes")])
def test_trials_that_would_not_start_from_states_0_to_49_are_refused(override, field):
    config = load_template("embodied_grpo_oft_libero", [override]).config
    with pytest.raises(ValueError, match=f"eval.{field}"):
        BENCHMARKS.get("libero_spatial")(config)


def test_a_libero_run_and_each_evaluated_suite_pick_their_statistics(tmp_path):
    """The worker's policy takes the run's suite's statistics when built; an evaluation task of
    another suite acts with that suite's, and the run's come back after it (what EmbodiedEvaluation
    does around each task's rollouts)."""
    import torch
    from libero_statistics import libero_checkpoint

    from vla_rl.evaluation.benchmarks import use_run_tasks
    from vla_rl.workflows.embodied import robot_policy

    out = libero_checkpoint(tmp_path / "oft", ["libero_spatial_no_noops", "libero_goal"], chunk_size=8)
    config = load_template("embodied_grpo_oft_libero", ["policy.config.architecture=null",
                                                         f"policy.config.model_path={out}",
                                                         "simulator.env.suite=libero_goal"]).config
    policy = robot_policy(config, EnvSpec(obs_dim=8, action_dim=7, horizon=520))
    zero = torch.zeros(1, 8, 7)
    assert policy.unnorm_key == "libero_goal" and policy.action_statistics.q01[0].item() == 1.0
    task = BENCHMARKS.get("libero_spatial")(config)[0]
    policy.use_tasks(task.simulator, [task.env_config()])
    assert policy.action_statistics.q01[0].item() == 0.0
    use_run_tasks(policy, config)
    assert policy.action_statistics.q01[0].item() == 1.0 and policy.env_actions(zero).shape == (1, 8, 7)
