"""Pre-flight checks of what plug-ins and task sets declare (vla_rl/preflight/): a node's worker
resources that cannot be built, a task set whose tasks differ in size, a trajectory encoder
config without ``points``; each refused before anything starts, in one line naming the node or
the field, with nothing written."""

from __future__ import annotations

import dataclasses
import re

import pytest
from cli_refusals import assert_cli_refuses_and_writes_nothing

from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import load_template
from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.preflight import PreflightError, preflight
from vla_rl.rewards.trajectory_encoders import TRAJECTORY_ENCODERS
from vla_rl.workers.resources import register_resource
from vla_rl_core import keys

# A plug-in node function that declares a worker resource nobody registered, directly or through
# what a registered resource needs (test-only names, registered once in this process).
register_resource("test_needs_unregistered", needs=("test_unregistered_need",))(lambda res: None)
register_resource("test_cycle_a", needs=("test_cycle_b",))(lambda res: None)
register_resource("test_cycle_b", needs=("policy", "test_cycle_a"))(lambda res: None)
for _fn, _resource in (("test_unregistered", "test_no_such_resource"), ("test_needs", "test_needs_unregistered"),
                       ("test_cycle", "test_cycle_a")):
    register_node("reward", "compute", name=_fn, reads=(keys.SUCCESS,), writes=(keys.REWARDS,),
                  resources=(_resource,))(lambda ctx, batch: NodeOutput(batch=batch))


@pytest.mark.parametrize("fn, problem", [
    ("test_unregistered", "'test_no_such_resource': 'test_no_such_resource' is not registered; known: actor,"),
    ("test_needs", "'test_needs_unregistered': 'test_unregistered_need' (needed through test_needs_unregistered -> "
                   "test_unregistered_need) is not registered; known: actor,"),
    ("test_cycle", "'test_cycle_a': the resources it needs need each other in a cycle: test_cycle_a -> test_cycle_b "
                   "-> test_cycle_a"),
])
def test_a_node_declaring_a_resource_that_cannot_be_built_is_refused_before_anything_starts(fn, problem, tmp_path,
                                                                                            capsys):
    """It used to pass ``vla-rl plan`` and stop every worker at its setup, after Ray and the
    simulators started (an unregistered one with a traceback naming no node)."""
    overrides = [f"nodes.reward.fn={fn}"]
    with pytest.raises(TemplateError) as raised:
        preflight(load_template("embodied_srpo", overrides))
    assert (raised.value.node, raised.value.field) == ("reward", "fn")
    assert f"its function (reward/compute, fn: {fn}) declares worker resource {problem}" in str(raised.value)
    assert_cli_refuses_and_writes_nothing(capsys, tmp_path, ["embodied_srpo", *overrides], "'fn'", problem)


@pytest.mark.parametrize("tasks, message", [
    ("[Lift,Stack]", "'Stack' differs from 'Lift' in state_dim: 20 vs 15"),
    ("[Lift,Door]", "'Door' differs from 'Lift' in state_dim: 20 vs 15"),
])
def test_a_task_set_whose_tasks_differ_in_size_is_refused_before_anything_starts(tasks, message, tmp_path, capsys):
    """robosuite's configs declare their state size: a task set of Lift and Stack was refused only
    once every worker had started its simulators (the layout check of the pool's spec())."""
    overrides = [f"simulator.tasks={tasks}"]
    with pytest.raises(PreflightError, match=message) as raised:
        preflight(load_template("embodied_srpo", overrides))
    assert raised.value.field == "simulator.tasks"
    assert_cli_refuses_and_writes_nothing(capsys, tmp_path, ["embodied_srpo", *overrides], "simulator.tasks", message)


def test_a_task_set_of_one_layout_passes():
    preflight(load_template("embodied_grpo_mt10"))  # MetaWorld's ten tasks: 39 state values, 4 actions, 150 steps


@dataclasses.dataclass(frozen=True)
class _NoPointsConfig:
    dim: int = 4


TRAJECTORY_ENCODERS.register("test_no_points", config=_NoPointsConfig)(lambda trajectories, lengths, num_points=1: None)


def test_an_encoder_whose_config_lacks_points_is_refused_before_anything_starts(tmp_path, capsys):
    """The reward node reads the encoder config's ``points``: without one the run failed in the
    workers' first reward (an AttributeError in a Ray traceback, 27 s in, a run directory left)."""
    overrides = ["algorithm.trajectory_encoder=test_no_points"]
    message = "trajectory encoder 'test_no_points': its config (_NoPointsConfig) has no integer 'points' field"
    with pytest.raises(PreflightError, match=re.escape(message)) as raised:
        preflight(load_template("embodied_srpo", overrides))
    assert raised.value.field == "algorithm.trajectory_encoder"
    assert_cli_refuses_and_writes_nothing(capsys, tmp_path, ["embodied_srpo", *overrides],
                                          "algorithm.trajectory_encoder", message)
