"""Node-function registration and dispatch."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from vla_rl.dag.registry import (
    NODE_FUNCTIONS,
    NodeOutput,
    get_node_function,
    register_node,
)
from vla_rl_core.registry import RegistryError

from .helpers import DUMMY, DUMMY_WITH_CONFIG, DummyRewardConfig


def test_get_returns_the_registered_function():
    function = get_node_function("reward", "compute", DUMMY_WITH_CONFIG)
    assert (function.role, function.type, function.name) == ("reward", "compute", DUMMY_WITH_CONFIG)
    assert function.config_model is DummyRewardConfig
    output = function.fn(None, None)
    assert output == NodeOutput(batch=None, metrics={})
    assert ("reward", "compute", DUMMY) in NODE_FUNCTIONS


def test_unknown_name_lists_the_same_role_and_type():
    with pytest.raises(RegistryError) as info:
        get_node_function("reward", "compute", "nope")
    message = str(info.value)
    assert "'nope'" in message and "(reward, compute): " in message
    assert DUMMY in message and DUMMY_WITH_CONFIG in message


def test_unknown_role_and_type_lists_everything():
    with pytest.raises(RegistryError) as info:
        get_node_function("evaluator", "model_train", "default")
    message = str(info.value)
    assert "none registered for (evaluator, model_train)" in message
    assert f"reward/compute/{DUMMY_WITH_CONFIG}" in message


def test_register_rejects_bad_declarations():
    with pytest.raises(ValueError, match="unknown node role 'judge'"):
        register_node("judge", "compute")
    with pytest.raises(ValueError, match="unknown node type 'think'"):
        register_node("reward", "think")
    with pytest.raises(TypeError, match="pydantic model class"):
        register_node("reward", "compute", "test_bad_config", config=dict)
    with pytest.raises(RegistryError, match="already registered"):
        register_node("reward", "compute", DUMMY)(lambda ctx, batch: NodeOutput())


def test_register_returns_the_function_unchanged():
    class Config(BaseModel):
        x: int = 1

    def fn(ctx, batch):
        return NodeOutput(metrics={"x": 1.0})

    assert register_node("evaluator", "model_inference", "test_returns", config=Config)(fn) is fn
    assert get_node_function("evaluator", "model_inference", "test_returns").fn is fn
