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


@pytest.mark.parametrize("declared, message", [
    ({"reads": "rewards"}, r"reads must be a tuple of names \(e.g. reads=\('rewards',\)\)"),
    ({"writes": ("rewards", 3)}, "writes must be a tuple of names"),
    ({"resources": None}, r"resources must be a tuple of names \(e.g. resources=\('name',\)\) .* got None"),
    ({"resources": lambda config: ("policy",)}, r"its resources \(.*\(config\)\) cannot be called as the engine "
                                                r"calls it, \(run_config, node_config\)"),
    ({"check": lambda config: None}, r"its check .* \(run_config, node_config, dp_size, world_size\)"),
])
def test_a_contract_the_planner_cannot_use_is_refused_when_it_registers(declared, message):
    """A string was read as its characters (plan: "reads batch key 'a'"), and a contract function of
    another signature crashed vla-rl plan with a traceback."""
    with pytest.raises(TypeError, match=r"node function \('reward', 'compute', 'test_bad_contract'\): " + message):
        register_node("reward", "compute", "test_bad_contract", **declared)
    assert ("reward", "compute", "test_bad_contract") not in NODE_FUNCTIONS


def test_a_contract_given_as_a_list_is_kept_as_a_tuple_and_an_iterator_is_refused():
    """all() over an iterator used it up: the node declared no writes."""
    register_node("reward", "compute", "test_list_writes", writes=["rewards"])(lambda ctx, batch: NodeOutput())
    assert get_node_function("reward", "compute", "test_list_writes").writes == ("rewards",)
    with pytest.raises(TypeError, match="writes must be a tuple of names"):
        register_node("reward", "compute", "test_iterator_writes", writes=iter(["rewards"]))


def test_the_settings_a_function_alone_reads_are_dotted_names(monkeypatch):
    monkeypatch.setattr(NODE_FUNCTIONS, "_entries", dict(NODE_FUNCTIONS._entries))  # for this test only
    register_node("reward", "compute", "test_settings_list", settings=["critic", "algorithm.filter_groups"])(
        lambda ctx, batch: NodeOutput())
    assert get_node_function("reward", "compute", "test_settings_list").settings == (
        "critic", "algorithm.filter_groups")
    with pytest.raises(TypeError, match=r"settings must be a tuple of dotted settings \(e.g. settings=\('critic',\)\)"):
        register_node("reward", "compute", "test_settings_string", settings="critic")
    with pytest.raises(ValueError, match="settings must be dotted run-config settings .* got 'critic.'"):
        register_node("reward", "compute", "test_settings_bad", settings=("critic.",))
    assert ("reward", "compute", "test_settings_string") not in NODE_FUNCTIONS


def test_the_phases_a_function_runs_in_are_known_phases(monkeypatch):
    monkeypatch.setattr(NODE_FUNCTIONS, "_entries", dict(NODE_FUNCTIONS._entries))  # for this test only
    register_node("actor", "model_train", "test_phases", phases="warm_start")(lambda ctx, batch: NodeOutput())
    assert get_node_function("actor", "model_train", "test_phases").phases == ("warm_start",)
    with pytest.raises(ValueError, match="unknown phase 'warmup' in phases; allowed: warm_start, train, evaluate"):
        register_node("actor", "model_train", "test_phases_bad", phases=("warmup",))


def test_a_function_that_cannot_take_ctx_and_batch_is_refused_when_it_registers():
    """It passed plan and failed in every worker: "badsig() takes 1 positional argument but 2 were given"."""
    with pytest.raises(TypeError, match=r"node function \('reward', 'compute', 'test_one_arg'\) \(.*\(batch\)\) "
                                        r"cannot be called as the engine calls it, \(ctx, batch\)"):
        register_node("reward", "compute", "test_one_arg")(lambda batch: NodeOutput())
    assert ("reward", "compute", "test_one_arg") not in NODE_FUNCTIONS


def test_a_config_model_whose_default_fails_its_own_validation_is_refused_when_it_registers():
    """pydantic does not validate defaults: ``coef: float = Field("lots", ge=0)`` passed plan and
    failed in the workers with a TypeError far from the model."""
    from pydantic import AliasChoices, ConfigDict, Field

    class Sloppy(BaseModel):
        weight: float  # required: no default to check
        coef: float = Field("lots", ge=0)

    with pytest.raises(TypeError, match=r"node function \('reward', 'compute', 'test_sloppy'\): the default of "
                                        r"Sloppy.coef \('lots'\) fails its own validation: Input should be a valid"):
        register_node("reward", "compute", "test_sloppy", config=Sloppy)

    class Fine(BaseModel):
        model_config = ConfigDict(extra="forbid")

        weight: float
        coef: float = Field(0.5, ge=0, validation_alias=AliasChoices("coef", "c"))  # an alias: named by its name

    register_node("reward", "compute", "test_fine_defaults", config=Fine)(lambda ctx, batch: NodeOutput())


def test_register_returns_the_function_unchanged():
    class Config(BaseModel):
        x: int = 1

    def fn(ctx, batch):
        return NodeOutput(metrics={"x": 1.0})

    assert register_node("evaluator", "model_inference", "test_returns", config=Config)(fn) is fn
    assert get_node_function("evaluator", "model_inference", "test_returns").fn is fn


def test_the_role_a_function_is_local_to_is_a_known_role(monkeypatch):
    monkeypatch.setattr(NODE_FUNCTIONS, "_entries", dict(NODE_FUNCTIONS._entries))  # for this test only
    register_node("reward", "compute", "test_local", local_to="data")(lambda ctx, batch: NodeOutput())
    assert get_node_function("reward", "compute", "test_local").local_to == "data"
    with pytest.raises(ValueError, match="unknown node role 'prompts' in local_to; allowed: data,"):
        register_node("reward", "compute", "test_local_bad", local_to="prompts")
