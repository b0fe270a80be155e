"""The shipped templates compose as they say: the π0, OpenVLA-OFT and DAPO templates extend their
workflows with their recipes' settings, and every name a template uses resolves."""

from __future__ import annotations

import pytest
from template_errors import plan_error as _error

from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import plan


@pytest.mark.parametrize("template", ["embodied_srpo", "embodied_grpo", "embodied_ppo", "embodied_dapo", "llm_grpo",
                                      "llm_dapo", "llm_gspo", "llm_cpgd", "llm_ppo", "llm_sft",
                                      "embodied_srpo_oft_lift", "embodied_grpo_oft_lift", "embodied_srpo_oft_libero",
                                      "embodied_grpo_oft_libero", "embodied_srpo_mt10", "embodied_grpo_mt10",
                                      "embodied_srpo_pi0_lift", "embodied_grpo_pi0_lift", "embodied_ppo_pi0_lift",
                                      "embodied_srpo_pi0_libero", "embodied_grpo_pi0_libero"])
def test_templates_resolve_every_name(template):
    plan(load_template(template))


def test_pi0_templates_extend_the_srpo_workflow_with_the_tiny_pi0():
    base = load_template("embodied_srpo")
    lift = load_template("embodied_srpo_pi0_lift")
    assert [n.id for n in lift.nodes] == [n.id for n in base.nodes]
    assert lift.config.policy.name == "pi0" and lift.config.simulator.env["cameras"] == ["agentview"]
    policy = lift.config.policy.policy_config(action_dim=7)
    assert policy.is_tiny_preset and policy.sampler == "flow_sde" and policy.noise_level == 0.3
    assert policy.proprio_dim == 11  # the first 11 Lift state values (robosuite_env.LIFT_STATE_KEYS, no orientation)
    model = policy.model_config()
    assert (model.chunk_size, model.max_action_dim, model.max_state_dim, model.num_steps) == (8, 7, 11, 3)
    assert model.vision.image_size == 56
    assert lift.config.warm_start.num_demos > 0 and lift.config.algorithm.ratio_granularity == "action"
    assert load_template("embodied_grpo_pi0_lift").config.algorithm.reward == "success"


def test_pi0_libero_templates_follow_openpis_libero_protocol():
    """openpi's LIBERO example for π0 (examples/libero/main.py, libero_policy.py): agentview as the
    base image and the wrist camera as the wrist image, the 8-value state, the model's 7 action
    values sent unchanged, 5 actions executed per decision (replan_steps), mean/std normalisation, the task
    seeded with 7;
    the suite's horizon and task by override; the π0 Lift template's workflow and sampler otherwise."""
    from simulators.libero_env import LiberoEnvConfig

    srpo, lift = load_template("embodied_srpo_pi0_libero"), load_template("embodied_srpo_pi0_lift")
    assert [n.id for n in srpo.nodes] == [n.id for n in lift.nodes]
    config = srpo.config
    assert config.simulator.name == "libero" and config.simulator.env["horizon"] is None
    cameras = ["agentview", "robot0_eye_in_hand"]
    assert config.simulator.env["cameras"] == cameras and config.warm_start.num_demos == 0
    env = LiberoEnvConfig(**config.simulator.env)
    assert (env.suite, env.task_id, env.horizon, env.state_dim, env.action_dim) == ("libero_spatial", 0, 220, 8, 7)
    assert (env.task_seed, env.num_steps_wait) == (7, 10)  # main.py: args.seed, args.num_steps_wait
    policy = config.policy.policy_config(action_dim=env.action_dim)
    assert config.policy.name == "pi0" and policy.is_tiny_preset and list(policy.cameras) == cameras
    assert (policy.proprio_dim, policy.action_dim, policy.gripper_postprocess) == (8, 7, "none")
    # openpi's π0 normalises with mean/std; the tiny model acts absolutely on its whole chunk of 5
    # (the header's checkpoint override adds executed_actions and the delta mask).
    assert (policy.normalization, policy.delta_action_mask, policy.executed_actions) == ("mean_std", None, None)
    assert policy.sampler == lift.config.policy.policy_config(action_dim=7).sampler == "flow_sde"
    model = policy.model_config()
    assert (model.chunk_size, model.max_action_dim, model.max_state_dim) == (5, 7, 8)
    assert config.algorithm.ratio_granularity == "action" and config.algorithm.reward == "srpo"
    grpo = load_template("embodied_grpo_pi0_libero", ["simulator.env.suite=libero_10", "simulator.env.task_id=9"])
    assert grpo.config.algorithm.reward == "success" and grpo.config.policy == config.policy
    assert LiberoEnvConfig(**grpo.config.simulator.env).horizon == 520 and grpo.config.simulator.env["task_id"] == 9


@pytest.mark.parametrize("template", ["embodied_srpo_pi0_libero", "embodied_grpo_pi0_libero"])
def test_vla_rl_plan_validates_the_pi0_libero_templates(template, capsys):
    from vla_rl.cli import main

    assert main(["plan", template, "simulator.env.suite=libero_goal"]) == 0
    assert f"plan {template!r}" in capsys.readouterr().out
    err = _error(template, "algorithm.ratio_granularity=token")  # as the π0 Lift templates
    assert err.field == "algorithm.ratio_granularity"


def test_pi0_ppo_template_composes_the_ppo_workflow_with_the_pi0_lift_settings():
    """embodied_ppo's nodes (the critic's, no group filter) with the settings the π0 Lift templates
    share (bases/pi0_lift.yaml); the MLP PPO template still builds the MLP from its defaults."""
    ppo, srpo = load_template("embodied_ppo"), load_template("embodied_srpo_pi0_lift")
    assert ppo.config.policy.name == "mlp" and ppo.config.policy.config == {}
    lift = load_template("embodied_ppo_pi0_lift")
    assert [n.id for n in lift.nodes] == [n.id for n in ppo.nodes] and "group_filter" not in [n.id for n in lift.nodes]
    for section in ("simulator", "data", "policy", "warm_start", "trainer", "eval"):
        assert getattr(lift.config, section) == getattr(srpo.config, section), section
    algorithm = lift.config.algorithm
    assert (algorithm.reward, algorithm.adv_estimator, algorithm.ratio_granularity) == ("success", "gae", "action")
    assert lift.config.critic == ppo.config.critic


def test_oft_templates_extend_the_srpo_workflow_with_a_camera_policy():
    """The OFT templates keep embodied_srpo's nodes and filter, switch the policy and cameras, and
    select LIBERO's suite by override; the MLP template still builds the MLP from its defaults."""
    base = load_template("embodied_srpo")
    assert base.config.policy.name == "mlp" and base.config.policy.config == {}
    lift = load_template("embodied_srpo_oft_lift")
    assert [n.id for n in lift.nodes] == [n.id for n in base.nodes]
    assert lift.config.algorithm.filter_groups.success_rate_band == base.config.algorithm.filter_groups.success_rate_band
    assert lift.config.policy.name == "openvla_oft" and lift.config.simulator.env["cameras"] == ["agentview"]
    assert lift.config.policy.config["proprio_dim"] == 5
    assert load_template("embodied_grpo_oft_lift").config.algorithm.reward == "success"
    libero = load_template("embodied_grpo_oft_libero", ["simulator.env.suite=libero_10"])
    assert libero.config.simulator.name == "libero" and libero.config.simulator.env["suite"] == "libero_10"
    assert libero.config.algorithm.reward == "success" and libero.config.warm_start.num_demos == 0


def test_the_dapo_templates_filter_on_accuracy_as_dapo_does():
    """DAPO's dynamic sampling keeps groups with 0 < correct < G (verl's recipe: metric=acc), not
    groups whose overlong-shaped rewards differ; the other templates compare rewards."""
    for name in ("llm_dapo", "embodied_dapo"):
        assert load_template(name).config.algorithm.filter_groups.metric == "success", name
    assert load_template("llm_grpo").config.algorithm.filter_groups.metric == "rewards"
    assert _error("llm_dapo", "algorithm.filter_groups.metric=acc").field == "algorithm.filter_groups.metric"
