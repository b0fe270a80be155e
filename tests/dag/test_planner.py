"""The planner: rejections naming node and field, topological order, per-rank chains and hops."""

from __future__ import annotations

import pytest

from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import Hop, Reshard, RunNode, describe_plan, plan

from .helpers import (
    DUMMY,
    DUMMY_CRITIC_UPDATE,
    DUMMY_POLICY_USER,
    DUMMY_REFILLING,
    DUMMY_WARM_START,
    DUMMY_WHOLE_SECTION,
    DUMMY_WITH_CONFIG,
    DummyRewardConfig,
    node,
    pipeline,
)


def _plan_error(path, world_size=2) -> TemplateError:
    template = load_template(path)
    with pytest.raises(TemplateError) as info:
        plan(template, world_size)
    return info.value


def _run(node_id, role, type, dp_size, dp_rank, deps=(), config=None, fn=DUMMY) -> RunNode:
    return RunNode(node_id, role, type, fn, dp_size, dp_rank, tuple(deps), config)


def test_missing_dep(write_template):
    nodes = pipeline()
    nodes[3]["deps"] = ["reward", "critic"]
    err = _plan_error(write_template(nodes=nodes))
    assert (err.node, err.field) == ("adv", "deps[1]")
    assert "unknown dependency 'critic'" in err.message


def test_cycle_names_its_nodes(write_template):
    nodes = pipeline()
    nodes[1]["deps"] = ["tasks", "adv"]  # rollout -> reward -> adv -> rollout
    err = _plan_error(write_template(nodes=nodes))
    assert err.field == "deps"
    assert err.node in {"rollout", "reward", "adv"}
    cycle = err.message.removeprefix("dependency cycle: ").split(" -> ")
    assert cycle[0] == cycle[-1] and set(cycle) == {"rollout", "reward", "adv"}
    i = cycle.index("rollout")
    assert cycle[i : i + 3] in (["rollout", "reward", "adv"], ["rollout", "reward"])


def test_self_dependency_is_a_cycle(write_template):
    nodes = pipeline()
    nodes[0]["deps"] = ["tasks"]
    err = _plan_error(write_template(nodes=nodes))
    assert (err.node, err.message) == ("tasks", "dependency cycle: tasks -> tasks")


def test_dp_size_must_divide_world_size(write_template):
    path = write_template(nodes=pipeline(reward_dp=3))
    err = _plan_error(path)
    assert (err.node, err.field) == ("reward", "dp_size")
    assert str(err) == f"{path}: node 'reward': field 'dp_size': must divide the world size 2 (got 3)"


def test_a_node_joining_a_resharded_dep_and_one_as_it_is_is_refused(write_template):
    """One dep's output re-sharded into near-equal shards, the other's as a filter left it: the
    rows on a worker differed and the run stopped at its first step with a Ray traceback. Deps
    all re-sharded are cut alike (test_w4_chains_for_4_2_1)."""
    nodes = pipeline(reward_dp=1)
    nodes[3]["deps"] = ["rollout", "reward"]  # rollout at DP 2, reward at DP 1
    err = _plan_error(write_template(nodes=nodes))
    assert (err.node, err.field) == ("adv", "deps")
    assert err.message.startswith("its deps reach it in two ways (rollout at DP 2 as it is, reward at DP 1 "
                                  "cut, for DP 2): their rows are cut over the workers differently")
    nodes[4]["deps"] = ["adv", "reward"]  # the update rebalances adv (DP 2) in place and cuts reward (DP 1)
    nodes[3]["deps"] = ["reward"]
    err = _plan_error(write_template(nodes=nodes))
    assert (err.node, err.field) == ("actor", "deps") and "adv at DP 2 rebalanced, reward at DP 1 cut" in err.message
    nodes[2].pop("dp_size")
    plan(load_template(write_template(nodes=nodes)), 2)  # all at 2: joined row by row


def test_unregistered_fn_lists_registered(write_template):
    nodes = pipeline()
    nodes[2]["fn"] = "nope"
    err = _plan_error(write_template(nodes=nodes))
    assert (err.node, err.field) == ("reward", "fn")
    assert "'nope'" in err.message and "'reward'" in err.message and "'compute'" in err.message
    assert DUMMY in err.message and DUMMY_WITH_CONFIG in err.message


def test_node_config_is_validated_by_the_function_model(write_template):
    nodes = pipeline()
    nodes[2].update(fn=DUMMY_WITH_CONFIG, config={"scale": "big"})
    err = _plan_error(write_template(nodes=nodes))
    assert (err.node, err.field) == ("reward", "config.scale")

    nodes[2]["config"] = {"scale": 2}
    good = plan(load_template(write_template(nodes=nodes)), 2)
    assert good.node_configs["reward"] == DummyRewardConfig(scale=2.0)
    assert good.chains[1][2].config == DummyRewardConfig(scale=2.0)
    assert good.node_configs["tasks"] is None


def test_a_misspelt_node_setting_is_refused_even_by_a_model_that_ignores_extra_keys(write_template):
    """A plug-in's config model with pydantic's default ``extra="ignore"`` dropped ``coeff: 2``
    silently (its ``coef`` stayed at the default); unknown keys are errors, whatever the model."""
    from pydantic import AliasChoices, BaseModel, Field

    from vla_rl.dag.registry import NODE_FUNCTIONS, NodeOutput, register_node

    class LenientConfig(BaseModel):
        coef: float = 1.0
        scale: float = Field(1.0, validation_alias=AliasChoices("scale", "s"))

    if ("reward", "compute", "test_lenient") not in NODE_FUNCTIONS:
        register_node("reward", "compute", "test_lenient", config=LenientConfig)(lambda ctx, batch: NodeOutput(batch))
    nodes = pipeline()
    nodes[2].update(fn="test_lenient", config={"coeff": 2})
    err = _plan_error(write_template(nodes=nodes))
    assert (err.node, err.field) == ("reward", "config.coeff")
    assert "unknown key for LenientConfig; allowed: coef, scale, s" in err.message
    nodes[2]["config"] = {"coef": 2, "s": 3}  # a validation alias is a key of the model
    assert plan(load_template(write_template(nodes=nodes)), 2).node_configs["reward"].scale == 3.0


def test_a_contract_function_returning_a_string_is_refused_naming_the_node(write_template):
    """``reads=lambda run_config, node_config: "success"`` was read one character at a time: the
    planner blamed the node's deps for a batch key 'c'."""
    from vla_rl.dag.registry import NODE_FUNCTIONS, NodeOutput, register_node

    if ("reward", "compute", "test_string_reads") not in NODE_FUNCTIONS:
        register_node("reward", "compute", "test_string_reads",
                      reads=lambda run_config, node_config: "success")(lambda ctx, batch: NodeOutput(batch))
    nodes = pipeline()
    nodes[2]["fn"] = "test_string_reads"
    err = _plan_error(write_template(nodes=nodes))
    assert (err.node, err.field) == ("reward", "fn")
    assert "reward/compute/test_string_reads: its contract function " in err.message
    assert f"(from {__name__}) returned 'success', not a tuple of names" in err.message


def test_config_for_a_function_without_config_model(write_template):
    nodes = pipeline()
    nodes[0]["config"] = {"shuffle": True}
    err = _plan_error(write_template(nodes=nodes))
    assert (err.node, err.field) == ("tasks", "config")
    assert "shuffle" in err.message


def test_order_is_topological_with_file_order_ties(write_template, no_builtin_nodes):
    nodes = [
        node("actor", "actor", "model_train", ["adv", "ref"]),
        node("adv", "advantage", "compute", ["rollout"]),
        node("ref", "reward", "compute", ["tasks"]),
        node("rollout", "rollout", "env_interact", ["tasks"]),
        node("tasks", "data", "data_load"),
    ]
    result = plan(load_template(write_template(nodes=nodes)), 2)
    assert result.order == ("tasks", "ref", "rollout", "adv", "actor")
    assert no_builtin_nodes  # the lookups asked the registry to load its built-in functions


def test_world_size_defaults_to_config(write_template):
    result = plan(load_template(write_template(nodes=pipeline(), config={"workers": {"num_workers": 4}})))
    assert result.world_size == 4 and sorted(result.chains) == [0, 1, 2, 3]
    assert result.dp_sizes["reward"] == 4


def test_w2_chains_for_2_1_2(write_template):
    result = plan(load_template(write_template(nodes=pipeline(reward_dp=1))), 2)
    assert result.hops == (Hop("rollout", "reward", 2, 1), Hop("reward", "adv", 1, 2))
    for rank in (0, 1):
        assert result.chains[rank] == (
            _run("tasks", "data", "data_load", 2, rank),
            _run("rollout", "rollout", "env_interact", 2, rank, ["tasks"]),
            Reshard("rollout", "reward", 2, 1, rank, 0),
            _run("reward", "reward", "compute", 1, 0, ["rollout"]),
            Reshard("reward", "adv", 1, 2, 0, rank),
            _run("adv", "advantage", "compute", 2, rank, ["reward"]),
            # the update takes single samples: rebalanced at its own DP size (filters leave shards unequal)
            Reshard("adv", "actor", 2, 2, rank, rank, whole_groups=False),
            _run("actor", "actor", "model_train", 2, rank, ["adv"]),
        )


def test_w4_chains_for_4_2_1(write_template):
    nodes = [
        node("tasks", "data", "data_load", dp_size=4),
        node("rollout", "rollout", "env_interact", ["tasks"], dp_size=2),
        node("reward", "reward", "compute", ["rollout"], dp_size=1),
        node("actor", "actor", "model_train", ["rollout", "reward"]),  # dp 4 by default: both cut alike
    ]
    result = plan(load_template(write_template(nodes=nodes)), 4)
    assert result.hops == (
        Hop("tasks", "rollout", 4, 2),
        Hop("rollout", "reward", 2, 1),
        Hop("rollout", "actor", 2, 4),
        Hop("reward", "actor", 1, 4),
    )
    for rank in range(4):
        half = rank // 2  # the rank's shard at DP size 2
        assert result.chains[rank] == (
            _run("tasks", "data", "data_load", 4, rank),
            Reshard("tasks", "rollout", 4, 2, rank, half),
            _run("rollout", "rollout", "env_interact", 2, half, ["tasks"]),
            Reshard("rollout", "reward", 2, 1, half, 0),
            _run("reward", "reward", "compute", 1, 0, ["rollout"]),
            # The update does not compare a group's samples: they are balanced one by one.
            Reshard("rollout", "actor", 2, 4, half, rank, whole_groups=False),
            Reshard("reward", "actor", 1, 4, 0, rank, whole_groups=False),
            _run("actor", "actor", "model_train", 4, rank, ["rollout", "reward"]),
        )


def test_describe_plan_lists_chains_and_hops(write_template):
    text = describe_plan(plan(load_template(write_template(nodes=pipeline(reward_dp=1))), 2))
    assert "world size 2" in text
    assert "order: tasks -> rollout -> reward -> adv -> actor" in text
    assert "rollout (dp 2) -> reward (dp 1)" in text and "reward (dp 1) -> adv (dp 2)" in text
    assert text.count("reshard rollout -> reward") == 2
    worker1 = text[text.index("worker 1:") :]
    assert "reshard reward -> adv: dp 1 -> 2, shard 0 -> 1" in worker1
    assert "reshard adv -> actor: dp 2 -> 2, shard 1 -> 1, samples balanced (groups may split)" in worker1


def _override_error(path, *overrides) -> TemplateError:
    with pytest.raises(TemplateError) as info:
        plan(load_template(path, list(overrides)))
    return info.value


def test_an_override_of_a_setting_only_absent_nodes_read_is_refused(write_template, settings_readers):
    """critic.lr on a template without critic nodes trained exactly as without it."""
    path = write_template(nodes=pipeline())
    error = _override_error(path, "critic.lr=1e-4")
    assert error.field == "critic.lr" and error.file == path
    assert "override 'critic.lr=1e-4' is never read: critic.lr is read only by " in str(error)
    assert f"critic/model_inference/{DUMMY}" in str(error) and "(or nodes using their resource critic), and this " \
        "template has none; use a template with one" in str(error)
    assert _override_error(path, "critic={lr: 0.1}").field == "critic"  # the section itself
    # a deletion changes nothing either way, a node's field is no run setting, other sections are
    # read by the run whatever its nodes
    carrying = write_template(nodes=pipeline(), config={"critic": {"lr": 0.01}}, name="carrying.yaml")
    plan(load_template(carrying, ["~critic", "nodes.reward.dp_size=1", "trainer.lr=0.1"]))


def test_the_same_override_is_taken_where_a_node_reads_it(write_template, settings_readers):
    with_critic = [*pipeline(), node("values", "critic", "model_inference", ["rollout"])]
    template = load_template(write_template(nodes=with_critic), ["critic.lr=1e-4"])
    assert "values" in plan(template).node_configs and template.config.critic.lr == 1e-4


def test_a_setting_read_by_another_function_of_a_node_names_the_fn_override(write_template, settings_readers):
    """max_refill_rounds on embodied_srpo: its group filter node reads it once it runs dynamic sampling."""
    path = write_template(nodes=pipeline())
    error = _override_error(path, "algorithm.filter_groups.max_refill_rounds=2")
    assert "algorithm.filter_groups.max_refill_rounds is read only by " in str(error)
    assert f"reward/compute/{DUMMY_REFILLING} or reward/compute/{DUMMY_WHOLE_SECTION} nodes" in str(error)
    assert f"select one with nodes.reward.fn={DUMMY_REFILLING}, or drop the override" in str(error)
    # the flat key of earlier versions is checked as its new place
    assert _override_error(path, "algorithm.max_refill_rounds=2").field == "algorithm.filter_groups.max_refill_rounds"
    plan(load_template(path, [f"nodes.reward.fn={DUMMY_REFILLING}", "algorithm.filter_groups.max_refill_rounds=2"]))
    # a function declaring the whole section reads it too, and a section override is read by any reader of a
    # setting under it
    plan(load_template(path, [f"nodes.reward.fn={DUMMY_WHOLE_SECTION}", "algorithm.filter_groups.max_refill_rounds=2"]))
    plan(load_template(path, [f"nodes.reward.fn={DUMMY_REFILLING}", "algorithm.filter_groups={metric: success}"]))


def test_a_node_using_the_resource_of_a_setting_s_readers_reads_it(write_template, settings_readers):
    """A plug-in critic update (resources=("critic",), no settings of its own) reads critic.* through
    the critic resource; its critic.lr was refused as read by no node of the template."""
    nodes = [*pipeline(), node("critic_update", "critic", "model_train", ["adv"], fn=DUMMY_CRITIC_UPDATE)]
    assert plan(load_template(write_template(nodes=nodes), ["critic.lr=1e-4"])).node_configs.keys() >= {"critic_update"}


def test_a_resource_reads_only_the_settings_of_its_own_section(write_template, settings_readers):
    """llm_sft took text.sft_steps, read by the warm start's fine-tuning alone, as read: its own
    update uses the policy resource, as that fine-tuning does. A warm-start function is not offered
    for a train-phase node either."""
    policy_user = node("actor", "actor", "model_train", ["adv"], fn=DUMMY_POLICY_USER)
    path = write_template(nodes=[*pipeline()[:-1], policy_user])
    error = _override_error(path, "trainer.max_grad_norm=0.5")
    assert error.field == "trainer.max_grad_norm"
    assert f"read only by actor/model_train/{DUMMY_WARM_START} nodes, and this template has none; use a template " \
        "with one, or drop the override" in str(error)
    warm_start = [node("sft", "actor", "model_train", fn=DUMMY_WARM_START, phase="warm_start")]
    with_it = write_template(nodes=[*pipeline(), *warm_start], name="with_warm_start.yaml")
    plan(load_template(with_it, ["trainer.max_grad_norm=0.5"]))


def test_a_node_runs_its_function_only_in_the_phases_it_declares(write_template, settings_readers):
    """text.sft_steps of fine-tuning every training step, or an evaluation's nodes in training,
    passed the plan."""
    nodes = [*pipeline()[:-1], node("actor", "actor", "model_train", ["adv"], fn=DUMMY_WARM_START)]
    error = _plan_error(write_template(nodes=nodes))
    assert error.node == "actor" and error.field == "phase"
    assert f"actor/model_train/{DUMMY_WARM_START} runs in phase warm_start only, not train: set the node's " \
        "phase, or select another function with fn" in str(error)


def test_the_overrides_an_earlier_resume_recorded_are_not_checked_again(write_template, settings_readers):
    """A run resumed with critic.lr before the check existed could no longer be resumed, evaluated
    or exported (the recorded override cannot be taken back from the command line)."""
    path = write_template(nodes=pipeline())
    template = load_template(path, ["trainer.lr=0.1"], recorded=["critic.lr=1e-4"])
    assert template.config.critic.lr == 1e-4 and template.overrides == ("trainer.lr=0.1",)
    plan(template)
    assert _override_error(path, "critic.lr=1e-4").field == "critic.lr"


def _reward_node_with(write_template, monkeypatch, **contract) -> TemplateError:
    """The plan's error for the pipeline whose reward node runs a plug-in function of ``contract``."""
    from vla_rl.dag.registry import NODE_FUNCTIONS, NodeOutput, register_node

    monkeypatch.setattr(NODE_FUNCTIONS, "_entries", dict(NODE_FUNCTIONS._entries))  # for this test only
    register_node("reward", "compute", name="test_plugin", **contract)(lambda ctx, batch: NodeOutput(batch))
    nodes = pipeline()
    nodes[2]["fn"] = "test_plugin"
    return _plan_error(write_template(nodes=nodes))


def _raising_check(run_config, node_config, dp_size, world_size):
    raise KeyError("oops in check")


def _sentence_check(run_config, node_config, dp_size, world_size):
    return "bad layout"


def _raising_reads(run_config, node_config):
    return run_config.nope.x


@pytest.mark.parametrize(("contract", "expected"), [
    ({"check": _raising_check}, f"its check _raising_check (from {__name__}) raised KeyError: 'oops in check'"),
    ({"check": _sentence_check}, f"its check _sentence_check (from {__name__}) returned 'bad layout', not "
                                 "None or a (field, message) pair of strings"),
    ({"reads": _raising_reads}, f"its contract function _raising_reads (from {__name__}) raised "
                                "AttributeError: 'RunConfig' object has no attribute 'nope'"),
])
def test_a_plugin_s_check_or_contract_function_that_fails_is_refused_in_one_line(write_template, monkeypatch,
                                                                                 contract, expected):
    """A check that raised, or a contract function raising anything but TypeError, was a traceback
    naming neither node nor module; a check's sentence was read a character at a time
    ("field 'b': a"). A helper audit of docs/extending.md."""
    error = _reward_node_with(write_template, monkeypatch, **contract)
    assert error.node == "reward" and error.field == "fn"
    assert str(error).endswith(f"node 'reward': field 'fn': reward/compute/test_plugin: {expected}")


def test_a_setting_a_plugin_declares_is_read_whatever_the_config_says(write_template, monkeypatch):
    """algorithm.kl_loss_coef, read by a plug-in declaring it, was refused as read only with
    algorithm.use_kl_loss (the fix it suggested turned on a KL loss). The built-in functions'
    declarations do not lift the config's own rules (tests/test_config.py: text.sft_lr)."""
    from vla_rl.dag.registry import NODE_FUNCTIONS, NodeOutput, register_node

    monkeypatch.setattr(NODE_FUNCTIONS, "_entries", dict(NODE_FUNCTIONS._entries))  # for this test only
    register_node("reward", "compute", name="test_kl_reader", settings=("algorithm.kl_loss_coef",))(
        lambda ctx, batch: NodeOutput(batch))
    nodes = pipeline()
    path = write_template(nodes=nodes)
    error = _override_error(path, "algorithm.kl_loss_coef=0.5")
    assert error.field == "algorithm.kl_loss_coef" and "read only with algorithm.use_kl_loss=true" in str(error)
    nodes[2]["fn"] = "test_kl_reader"
    template = load_template(write_template(nodes=nodes, name="reads.yaml"), ["algorithm.kl_loss_coef=0.5"])
    assert template.config.algorithm.kl_loss_coef == 0.5 and "reward" in plan(template).node_configs


def test_a_node_local_to_its_data_node_runs_at_that_node_s_dp_size(write_template, monkeypatch):
    """The text reward reads each row's answer from the prompts its worker's data node read: with
    ``nodes.prompts.dp_size=1`` on llm_grpo the plan passed and the run stopped at its first step,
    after the warm start."""
    from vla_rl.dag.registry import NODE_FUNCTIONS, NodeOutput, register_node

    monkeypatch.setattr(NODE_FUNCTIONS, "_entries", dict(NODE_FUNCTIONS._entries))  # for this test only
    register_node("reward", "compute", name="test_local", local_to="data")(lambda ctx, batch: NodeOutput(batch))
    nodes = pipeline(reward_dp=1)
    nodes[2]["fn"] = "test_local"
    err = _plan_error(write_template(nodes=nodes))
    assert (err.node, err.field) == ("reward", "dp_size")
    assert err.message == ("reward/compute/test_local reads, for each row, what the data node 'tasks' kept on the "
                           "worker that read the row, so it must run at that node's DP size ('tasks' at DP 2, "
                           "'reward' at DP 1): give them one dp_size")
    nodes[0]["dp_size"] = 1  # data and reward at DP 1, the rollout between them at 2: shards go there and back
    plan(load_template(write_template(nodes=nodes)), 2)


def test_a_world_size_below_one_is_refused(write_template):
    template = load_template(write_template(nodes=pipeline()))
    with pytest.raises(ValueError, match=r"world size must be at least 1 \(got 0\)"):
        plan(template, 0)


def test_a_dep_listed_twice_is_refused(write_template):
    """A dep named twice would be re-sharded and merged twice into the node's input."""
    nodes = pipeline()
    nodes[1]["deps"] = ["tasks", "tasks"]
    err = _plan_error(write_template(nodes=nodes))
    assert (err.node, err.field, err.message) == ("rollout", "deps[1]", "dependency 'tasks' listed twice")


def test_a_node_reading_several_missing_keys_names_the_first_in_sorted_order(write_template, monkeypatch):
    from vla_rl.dag.registry import NODE_FUNCTIONS, NodeOutput, register_node

    monkeypatch.setattr(NODE_FUNCTIONS, "_entries", dict(NODE_FUNCTIONS._entries))  # for this test only
    register_node("reward", "compute", name="test_reader", reads=("zeta_key", "alpha_key"))(
        lambda ctx, batch: NodeOutput(batch))
    nodes = pipeline()
    nodes[2]["fn"] = "test_reader"
    err = _plan_error(write_template(nodes=nodes))
    assert (err.node, err.field) == ("reward", "deps")
    assert err.message.startswith("reads batch key 'alpha_key', which no node upstream of it writes (upstream: ")


def test_rollout_dp_size_is_the_env_interact_node_s_or_the_world_size(write_template):
    with_rollout = pipeline()
    with_rollout[1]["dp_size"] = 1
    result = plan(load_template(write_template(nodes=with_rollout)), 2)
    assert [result.rollout_dp_size(rank) for rank in (0, 1)] == [1, 1]
    without = [node("tasks", "data", "data_load"), node("actor", "actor", "model_train", ["tasks"])]
    result = plan(load_template(write_template(nodes=without, name="without.yaml")), 4)
    assert [result.rollout_dp_size(rank) for rank in range(4)] == [4, 4, 4, 4]


def test_dp_sizes_span_every_phase_and_an_absent_phase_has_an_empty_chain_per_rank(write_template):
    nodes = [*pipeline(), node("eval_tasks", "data", "data_load", phase="evaluate", dp_size=1)]
    result = plan(load_template(write_template(nodes=nodes)), 2)
    assert result.dp_sizes == {"tasks": 2, "rollout": 2, "reward": 2, "adv": 2, "actor": 2, "eval_tasks": 1}
    assert result.phase("evaluate").chains == {0: (_run("eval_tasks", "data", "data_load", 1, 0),),
                                               1: (_run("eval_tasks", "data", "data_load", 1, 0),)}
    warm_start = result.phase("warm_start")
    assert (warm_start.order, warm_start.chains, warm_start.hops) == ((), {0: (), 1: ()}, ())
