"""The algorithm settings of the run config: combinations rejected with the field named, and
every registered name resolved before a run starts."""

from __future__ import annotations

import pytest

from vla_rl.config_checks import check_component_names, check_required_nodes, check_rollout_backend
from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import load_template


def _error(template: str, *overrides: str) -> TemplateError:
    with pytest.raises(TemplateError) as info:
        loaded = load_template(template, list(overrides))
        check_component_names(loaded.config, loaded.path)
    return info.value


@pytest.mark.parametrize("template", ["embodied_srpo", "embodied_grpo", "embodied_ppo", "embodied_dapo", "llm_grpo",
                                      "llm_dapo", "llm_gspo", "llm_cpgd", "llm_ppo", "llm_sft",
                                      "embodied_srpo_oft_lift", "embodied_grpo_oft_lift", "embodied_srpo_oft_libero",
                                      "embodied_grpo_oft_libero"])
def test_templates_resolve_every_name(template):
    loaded = load_template(template)
    check_component_names(loaded.config, loaded.path)


def test_oft_templates_extend_the_srpo_workflow_with_a_camera_policy():
    """The OFT templates keep embodied_srpo's nodes and filter, switch the policy and cameras, and
    select LIBERO's suite by override; the MLP template still builds the MLP from its defaults."""
    base = load_template("embodied_srpo")
    assert base.config.policy.name == "mlp" and base.config.policy.config == {}
    lift = load_template("embodied_srpo_oft_lift")
    assert [n.id for n in lift.nodes] == [n.id for n in base.nodes]
    assert lift.config.algorithm.success_rate_band == base.config.algorithm.success_rate_band
    assert lift.config.policy.name == "openvla_oft" and lift.config.simulator.env["cameras"] == ["agentview"]
    assert lift.config.policy.config["proprio_dim"] == 5
    assert load_template("embodied_grpo_oft_lift").config.algorithm.reward == "success"
    libero = load_template("embodied_grpo_oft_libero", ["simulator.env.suite=libero_10"])
    assert libero.config.simulator.name == "libero" and libero.config.simulator.env["suite"] == "libero_10"
    assert libero.config.algorithm.reward == "success" and libero.config.warm_start.num_demos == 0


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        (["algorithm.kl_loss_type=k4"], "algorithm.kl_loss_type", "known: abs, k1, k2, k3"),
        (["algorithm.kl_penalty=full"], "algorithm.kl_penalty", "known:"),
        (["algorithm.policy_loss=grpo"], "algorithm.policy_loss", "cpgd, gspo, gspo_token, ppo_clip"),
        (["algorithm.adv_estimator=vtrace"], "algorithm.adv_estimator", "gae, grpo"),
        (["critic.loss_agg_mode=sum"], "critic.loss_agg_mode", "seq-mean-token-sum-norm"),
    ],
)
def test_unknown_names_are_errors_naming_the_field(overrides, field, message):
    err = _error("embodied_grpo", *overrides)
    assert err.field == field and message in str(err)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.dual_clip_c=3.0", "algorithm.policy_loss=cpgd"], "dual_clip_c applies to policy_loss 'ppo_clip'"),
        (["algorithm.dual_clip_c=1.0"], "greater than 1"),
        (["algorithm.loss_agg_normalizer=100"], "loss_agg_normalizer is the constant"),
        (["algorithm.success_rate_band=[0.9,0.1]"], "low <= high"),
        (["algorithm.ratio_granularity=step"], "'token', 'action' or 'chunk'"),
        (["algorithm.kl_ctrl.type=pid"], "'fixed' or 'adaptive'"),
        (["algorithm.clip_ratio_low=1.0"], "less than 1"),
    ],
)
def test_bad_algorithm_settings_are_rejected(overrides, message):
    assert message in str(_error("embodied_grpo", *overrides))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["algorithm.use_kl_loss=true"], "algorithm.use_kl_loss"),
        (["algorithm.use_kl_in_reward=true"], "algorithm.use_kl_in_reward"),
        (["algorithm.adv_estimator=gae"], "algorithm.adv_estimator"),
    ],
)
def test_settings_that_need_a_reference_or_a_critic_node(overrides, field):
    loaded = load_template("embodied_grpo", overrides)
    with pytest.raises(TemplateError) as info:
        check_required_nodes(loaded.config, {node.role for node in loaded.nodes}, loaded.path)
    assert info.value.field == field and "node" in str(info.value)
    ppo = load_template("embodied_ppo")
    check_required_nodes(ppo.config, {node.role for node in ppo.nodes}, ppo.path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["text.prompts_per_step=5"], "text.prompts_per_step (5) must be a multiple of workers.num_workers (2)"),
        (["text.temperature=0"], "greater than 0"),
        (["text.max_lenght=3"], "max_lenght"),
        (["run.workflow=speech"], "'embodied' or 'text'"),
        (["text.rollout_backend=sglang"], "text.rollout_backend"),
        (["text.vllm_memory_fraction=1.5"], "text.vllm_memory_fraction"),
    ],
)
def test_bad_text_settings_are_rejected(overrides, message):
    assert message in str(_error("llm_grpo", *overrides))


def test_rollout_backend_defaults_to_hf_and_accepts_vllm():
    assert load_template("llm_grpo").config.text.rollout_backend == "hf"
    assert load_template("llm_grpo", ["text.rollout_backend=vllm"]).config.text.rollout_backend == "vllm"


def test_vllm_rollout_must_run_on_every_worker():
    loaded = load_template("llm_grpo", ["text.rollout_backend=vllm"])
    check_rollout_backend(loaded.config, loaded.nodes, loaded.path)
    narrowed = [node.model_copy(update={"dp_size": 1}) if node.role == "rollout" else node for node in loaded.nodes]
    with pytest.raises(TemplateError) as info:
        check_rollout_backend(loaded.config, narrowed, loaded.path)
    assert info.value.node == "rollout" and info.value.field == "dp_size"
    assert "text.rollout_backend=vllm" in str(info.value)
    hf = load_template("llm_grpo")
    check_rollout_backend(hf.config, narrowed, hf.path)  # the policy's own sampling runs at any dp_size

