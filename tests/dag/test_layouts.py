"""The planner's layout rules (:mod:`vla_rl.dag.layouts`): rebalances, ancestors, local rows."""

from __future__ import annotations

import pytest

from vla_rl.dag.errors import TemplateError
from vla_rl.dag.layouts import ancestors
from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import Reshard, plan
from vla_rl.dag.schema import NodeSpec

from .helpers import pipeline


def test_a_single_sample_node_at_dp_size_1_is_not_rebalanced(write_template):
    """One shard has nothing to even out: no re-shard before the update at DP size 1."""
    path = write_template(nodes=pipeline())
    chain = plan(load_template(path), 1).chains[0]
    assert [task.node_id for task in chain] == ["tasks", "rollout", "reward", "adv", "actor"]
    assert not any(isinstance(task, Reshard) for task in chain)


def test_ancestors_lists_each_upstream_node_once():
    """A diamond d <- (b, c) <- a: a is upstream along both paths, listed once."""
    specs = [NodeSpec(id="a", role="data", type="data_load"),
             NodeSpec(id="b", role="rollout", type="env_interact", deps=("a",)),
             NodeSpec(id="c", role="reward", type="compute", deps=("a",)),
             NodeSpec(id="d", role="advantage", type="compute", deps=("b", "c"))]
    by_id = {spec.id: spec for spec in specs}
    upstream = ancestors("d", by_id)
    assert len(upstream) == 3 and set(upstream) == {"a", "b", "c"}
    assert ancestors("a", by_id) == []


def test_a_local_node_is_refused_at_a_larger_dp_size_than_its_source_too(write_template, monkeypatch):
    """test_planner's local_to test has the reward below its data node's DP size; above it, its
    shard again holds rows other workers read."""
    from vla_rl.dag.registry import NODE_FUNCTIONS, NodeOutput, register_node

    monkeypatch.setattr(NODE_FUNCTIONS, "_entries", dict(NODE_FUNCTIONS._entries))  # for this test only
    register_node("reward", "compute", name="test_local", local_to="data")(lambda ctx, batch: NodeOutput(batch))
    nodes = pipeline()
    nodes[0]["dp_size"] = 1
    nodes[2]["fn"] = "test_local"
    with pytest.raises(TemplateError) as info:
        plan(load_template(write_template(nodes=nodes)), 2)
    assert (info.value.node, info.value.field) == ("reward", "dp_size")
    assert "('tasks' at DP 1, 'reward' at DP 2)" in info.value.message
