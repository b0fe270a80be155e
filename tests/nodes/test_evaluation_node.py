"""The evaluation nodes' plan checks (vla_rl/nodes/evaluation.py)."""

from __future__ import annotations

import pytest

from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import plan


@pytest.mark.parametrize(("overrides", "field", "message"), [
    (["eval.benchmark=nope"], "eval.benchmark", "unknown benchmark 'nope'; known: libero_10"),
    (["eval.tasks=[Door]"], "eval.tasks", r"eval.tasks \['Door'\] must select tasks of the run's simulator"),
    (["eval.benchmark=robosuite", "eval.tasks=[Nope]"], "eval.tasks",
     r"must select tasks of benchmark 'robosuite': Lift, Stack, PickPlaceCan, Door"),
    (["eval.benchmark=libero_spatial", "eval.init_state_offset=1000000007"], "eval.init_state_offset",
     "eval.init_state_offset must be a multiple of 50 on LIBERO"),
])
def test_a_training_run_s_evaluated_tasks_are_checked_by_the_plan(overrides, field, message):
    """A training run with an unknown benchmark or task passed the plan, then failed in the
    workers' first evaluation with a Ray traceback and left a run directory (an audit)."""
    with pytest.raises(TemplateError, match=message) as refused:
        plan(load_template("embodied_srpo", overrides))
    assert refused.value.field == field and refused.value.node == "eval_rollout"
    plan(load_template("embodied_srpo", ["eval.benchmark=robosuite", "eval.tasks=[Lift,Door]"]))
