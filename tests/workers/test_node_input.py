"""A node with several deps gets their outputs merged, row for row: outputs that do not hold the
same rows are refused, naming the node and the deps (they were joined silently, or failed deep in
TensorDict)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from vla_rl.dag.planner import RunNode
from vla_rl.dag.registry import NodeOutput
from vla_rl.workers.dag_worker import DAGWorker
from vla_rl_core import keys

NODE = RunNode("join", "compute", "compute", "fn", 1, 0, ("rollout", "reward"), None)


def batch(uids, **fields) -> TensorDict:
    return TensorDict({keys.UID: torch.tensor(uids), **fields}, batch_size=[len(uids)])


def test_outputs_of_the_same_rows_are_merged_key_by_key():
    rollout = batch([0, 0, 1], obs=torch.arange(3.0))
    reward = batch([0, 0, 1], obs=torch.arange(3.0), rewards=torch.tensor([1.0, 0.0, 0.5]))
    merged = DAGWorker._node_input(NODE, {"rollout": rollout, "reward": reward}, {})
    assert set(merged.keys()) == {keys.UID, "obs", "rewards"}
    torch.testing.assert_close(merged["rewards"], torch.tensor([1.0, 0.0, 0.5]))
    assert "rewards" not in rollout.keys()  # the dependency's own output is left as it was


def test_a_node_setting_a_key_of_its_input_leaves_its_dependencys_output_as_it_was():
    """docs/extending.md's node sets `rewards` on its input: with one dep, that input was the dep's
    own output, so a node that did not depend on it (planned after it) read the changed rewards."""
    reward = batch([0, 0, 1], rewards=torch.tensor([1.0, 0.0, 0.5]))
    node = RunNode("bump", "compute", "compute", "fn", 1, 0, ("reward",), None)
    given = DAGWorker._node_input(node, {"reward": reward}, {})
    given.set("rewards", given["rewards"] + 1)
    del given[keys.UID]
    torch.testing.assert_close(reward["rewards"], torch.tensor([1.0, 0.0, 0.5]))
    assert keys.UID in reward.keys()


def test_an_edges_resharded_input_replaces_the_output():
    rollout = batch([0, 1], obs=torch.zeros(2))
    reward = batch([5, 6], obs=torch.zeros(2), rewards=torch.ones(2))
    edge = {("rollout", "join"): batch([5, 6], obs=torch.zeros(2))}
    merged = DAGWorker._node_input(NODE, {"rollout": rollout, "reward": reward}, edge)
    assert merged[keys.UID].tolist() == [5, 6]


@pytest.mark.parametrize("reward, message", [
    (batch([0, 1], rewards=torch.ones(2)), "node join: its deps rollout and reward hold 3 and 2 rows on this worker"),
    (batch([0, 1, 2], rewards=torch.ones(3)), f"node join: its deps rollout and reward both output '{keys.UID}' "
                                              "with other values"),
    (batch([0, 0, 1], obs=torch.tensor([0.0, 1.0, 3.0])), "node join: its deps rollout and reward both output 'obs' with other values"),
])
def test_outputs_of_other_rows_are_refused_naming_the_node_and_the_deps(reward, message):
    from vla_rl.errors import RunStopped

    rollout = batch([0, 0, 1], obs=torch.arange(3.0))
    with pytest.raises(RunStopped, match=re.escape(message)):  # one line, not a Ray traceback
        DAGWorker._node_input(NODE, {"rollout": rollout, "reward": reward}, {})


def test_a_node_whose_output_lacks_a_key_it_declares_stops_the_run_naming_it():
    """A plug-in declaring writes=(rewards,) without writing it was found by the next node, as a
    KeyError naming neither the node nor its function."""
    import dataclasses

    from vla_rl.errors import RunStopped
    from vla_rl.workers.dag_worker import check_declared_writes

    node = dataclasses.replace(NODE, node_id="reward", role="reward", type="compute", fn="bonus",
                               writes=frozenset({keys.REWARDS, keys.SUCCESS}))
    written = TensorDict({keys.SUCCESS: torch.ones(2, dtype=torch.bool)}, batch_size=[2])
    with pytest.raises(RunStopped, match=re.escape("node 'reward' (function 'bonus' of (reward, compute)) declares "
                                                   f"it writes ['{keys.REWARDS}'], which its output lacks")):
        check_declared_writes(node, written)
    written.set(keys.REWARDS, torch.zeros(2))
    check_declared_writes(node, written)
    check_declared_writes(dataclasses.replace(node, writes=frozenset()), None)  # a node with side effects only
    # it blamed the next node: "'NoneType' object is not subscriptable ... raised in node 'advantage'"
    with pytest.raises(RunStopped, match=re.escape("node 'reward' (function 'bonus' of (reward, compute)) declares "
                                                   f"it writes ['{keys.REWARDS}', '{keys.SUCCESS}'] and returned no "
                                                   "batch")):
        check_declared_writes(node, None)


def _returns_the_batch(ctx, batch):
    return batch


def _raises(ctx, batch):
    raise RuntimeError("boom from my node")


#: Node functions returning a NodeOutput the engine cannot take: each failed later, in the engine's
#: own code, with a Ray traceback that named neither the node nor its module (found by an audit).
_BAD_OUTPUTS = {
    "test_dict_batch": lambda ctx, batch: NodeOutput({key: batch[key] for key in batch.keys()}, {}),
    "test_tensor_metric": lambda ctx, batch: NodeOutput(batch, {"x/vec": torch.ones(2)}),
    "test_str_metric": lambda ctx, batch: NodeOutput(batch, {"x/str": "hello"}),
    "test_list_metrics": lambda ctx, batch: NodeOutput(batch, [("x/a", 1.0)]),
    # trained the next nodes on the rows it kept, silently
    "test_fewer_rows": lambda ctx, batch: NodeOutput(batch[:1], {}),
    "test_scalar_metrics": lambda ctx, batch: NodeOutput(batch, {"x/t": torch.tensor(2.0), "x/a": np.array([1.5]),
                                                                 "x/i": 3, "x/b": True, "x/n": np.float32(0.5)}),
}


@pytest.mark.parametrize("fn, error, message", [
    ("test_returns_the_batch", "RunStopped", "node 'penalty' (function 'test_returns_the_batch' of (reward, compute), "
     f"from {__name__}) returned a TensorDict; a node function returns NodeOutput(batch, metrics)"),
    ("test_raises", "RuntimeError", "boom from my node"),
    ("test_dict_batch", "RunStopped", "(function 'test_dict_batch' of (reward, compute), from "
     f"{__name__}) returned a NodeOutput whose batch is a dict; its batch is a TensorDict"),
    ("test_tensor_metric", "RunStopped", "returned metric 'x/vec': a Tensor of shape (2,), not a scalar; a metric is"),
    ("test_str_metric", "RunStopped", "returned metric 'x/str': a str, not a number"),
    ("test_list_metrics", "RunStopped", "returned a NodeOutput whose metrics are a list; they are a dict"),
    ("test_fewer_rows", "RunStopped", "returned a batch of length 1 for an input of length 2; a reward node returns "
     "one row per row of its input (rollout and filter nodes drop episodes and groups)"),
    ("test_scalar_metrics", None, ""),
])
def test_a_node_function_that_fails_is_named_in_its_error(fn, error, message):
    """A plug-in node returning its batch was an AttributeError ("'TensorDict' object has no
    attribute 'batch'") and one that raised a Ray traceback; neither named the node or its module."""
    import dataclasses
    import traceback

    from vla_rl.dag.registry import NODE_FUNCTIONS, register_node
    from vla_rl.workers.dag_worker import run_node_function

    for name, function in (("test_returns_the_batch", _returns_the_batch), ("test_raises", _raises),
                           *_BAD_OUTPUTS.items()):
        if ("reward", "compute", name) not in NODE_FUNCTIONS:
            register_node("reward", "compute", name=name)(function)
    node = dataclasses.replace(NODE, node_id="penalty", role="reward", type="compute", fn=fn)
    if error is None:  # the scalars a metric may be: numbers, one-element tensors and arrays
        run_node_function(node, None, batch([0, 1]))
        return
    with pytest.raises(Exception) as raised:
        run_node_function(node, None, batch([0, 1]))
    assert type(raised.value).__name__ == error and message in str(raised.value)
    shown = "".join(traceback.format_exception(raised.value))  # what a Ray traceback shows
    if error == "RuntimeError":
        assert f"raised in node 'penalty' (function 'test_raises' of (reward, compute), from {__name__})" in shown
