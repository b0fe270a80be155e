"""The run config: every registered name and every component's settings (simulator, policy,
advantage estimator, policy loss, reward, trajectory encoder) validated when a template loads,
with the field named; what the nodes need from each other checked by the planner."""

from __future__ import annotations

import pytest

from vla_rl.config import RunConfig
from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import plan


def _error(template: str, *overrides: str) -> TemplateError:
    with pytest.raises(TemplateError) as info:
        plan(load_template(template, list(overrides)))
    return info.value


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


@pytest.mark.parametrize("template", ["embodied_ppo", "embodied_ppo_pi0_lift"])
def test_critic_nodes_refuse_a_task_set(template):
    """The value network reads the state vector alone, not the task id of a task set."""
    err = _error(template, "simulator.tasks=[Lift]")
    assert err.node == "values" and err.field == "simulator.tasks" and "algorithm.adv_estimator=grpo" in str(err)


@pytest.mark.parametrize("template", ["embodied_srpo_pi0_lift", "embodied_grpo_pi0_lift", "embodied_ppo_pi0_lift"])
def test_token_ratios_are_refused_for_pi0_naming_both_fields(template):
    """π0's own actions hold never-scored elements (initial noise, padded values): a token-level
    mean would count them; action- and chunk-level ratios sum them exactly."""
    err = _error(template, "algorithm.ratio_granularity=token")
    assert err.field == "algorithm.ratio_granularity" and "policy.name" in str(err) and "'pi0'" in str(err)
    plan(load_template(template, ["algorithm.ratio_granularity=chunk"]))
    plan(load_template("embodied_grpo_oft_lift", ["algorithm.ratio_granularity=token"]))  # OFT scores every token


@pytest.mark.parametrize("template, budget, unit", [("embodied_dapo", 100, "decision steps"),
                                                   ("embodied_srpo_oft_lift", 10, "decision steps"),
                                                   ("llm_dapo", 24, "tokens (text.max_response_length)")])
def test_an_overlong_buffer_longer_than_the_budget_is_refused_at_plan_time(template, budget, unit):
    """The reward refused it only at the first step (after the workers, simulators and warm start);
    an episode's budget is its decision steps (OFT on Lift: 80 control steps / chunks of 8)."""
    err = _error(template, f"algorithm.overlong_buffer.len={budget + 1}")
    assert err.field == "algorithm.overlong_buffer.len" and err.node == "reward"
    assert f"longer than the {budget} {unit}" in str(err)
    plan(load_template(template, [f"algorithm.overlong_buffer.len={budget}"]))


def test_metaworld_demonstrations_with_a_hidden_goal_are_refused_at_plan_time():
    """MetaWorld's scripted policies read the goal: the expert refused it inside the simulator
    actor, after Ray and the environments had started (an 81-line RayTaskError)."""
    metaworld = ["simulator.name=metaworld", "simulator.env.goal_observable=false"]
    err = _error("embodied_srpo", *metaworld)
    assert err.field == "simulator.env.goal_observable" and err.node == "demonstrations"
    assert "warm_start.num_demos=0" in str(err)
    plan(load_template("embodied_srpo", [*metaworld, "warm_start.num_demos=0"]))


@pytest.mark.parametrize("override", ["trainer.total_steps=[1,2", "trainer={a: 1"])
def test_an_override_that_is_not_yaml_is_one_error_naming_it(override):
    """OmegaConf parses an override's value as YAML: its yaml.ParserError came out as a traceback."""
    with pytest.raises(TemplateError, match="malformed override") as refused:
        load_template("embodied_grpo", [override])
    assert refused.value.field == override.partition("=")[0] and "\n" not in str(refused.value)


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
        (["algorithm.cpgd.dual_clip_c=3.0"], "unknown key for CPGDConfig"),
        (["algorithm.ppo_clip.dual_clip_c=1.0"], "dual_clip_c must be > 1"),
        (["algorithm.loss_agg_normalizer=100"], "loss_agg_normalizer is the constant"),
        (["algorithm.filter_groups.success_rate_band=[0.9,0.1]"], "low <= high"),
        (["algorithm.ratio_granularity=step"], "'token', 'action' or 'chunk'"),
        (["algorithm.kl_ctrl.type=pid"], "'fixed' or 'adaptive'"),
        (["algorithm.ppo_clip.clip_ratio_low=1.0"], "clip_ratio_low must be in [0, 1)"),
        (["algorithm.clip_ratio_low=0.1"], "or the settings of a component: cpgd, gae"),
        (["algorithm.grpo=3"], "must be a mapping of GRPOConfig settings"),
        (["algorithm.rloo.x=1"], "advantage estimator 'rloo' takes no settings"),
    ],
)
def test_bad_algorithm_settings_are_rejected(overrides, message):
    assert message in str(_error("embodied_grpo", *overrides))


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        (["simulator.env.task=Stak"], "simulator.env.task", "task must be a single-arm robosuite task"),
        (["simulator.env.controller=JOINT_VELOCITY"], "simulator.env.controller",
         "controller 'JOINT_VELOCITY' is not supported"),
        (["simulator.env.controller=IK_POSE", "simulator.env.robot=UR5e"], "simulator.env.controller",
         "controller 'IK_POSE' drives only"),
        (["simulator.env.horizon=zero"], "simulator.env.horizon", "valid integer"),
        (["simulator.env.tsk=Lift"], "simulator.env.tsk", "unknown key for RobosuiteEnvConfig; allowed: task"),
        (["simulator.name=robosuit"], "simulator.name", "unknown simulator 'robosuit'"),
        (["policy.config.hiden_sizes=[8]"], "policy.config.hiden_sizes", "allowed: obs_dim, action_dim, hidden_sizes"),
        (["policy.config.activation=swish"], "policy.config", "activation 'swish' is unknown"),
        (["policy.config.obs_dim=3"], "policy.config.obs_dim", "set from the simulator"),
        (["algorithm.srpo.dbscan_eps=-1"], "algorithm.srpo", "dbscan_eps must be a finite number > 0"),
        (["algorithm.srpo.eps=1"], "algorithm.srpo.eps", "unknown key for SRPORewardConfig"),
        (["algorithm.gae.lam=2"], "algorithm.gae", "lam must be in [0, 1]"),
        (["algorithm.state_resample.points=1"], "algorithm.state_resample", "points must be >= 2"),
        (["algorithm.trajectory_encoder=vjepa2"], "algorithm.vjepa2", "model_dir is required"),
    ],
)
def test_component_settings_are_validated_when_the_template_loads(overrides, field, message):
    with pytest.raises(TemplateError) as info:
        load_template("embodied_srpo", overrides)
    assert info.value.field == field and message in str(info.value)


def test_component_settings_reach_the_runtime_typed():
    config = load_template("embodied_ppo", ["algorithm.gae.lam=0.9"]).config
    gae = config.algorithm.options("adv_estimator")
    assert type(gae).__name__ == "GAEConfig" and (gae.gamma, gae.lam) == (0.99, 0.9)
    assert config.algorithm.options("policy_loss").clip_ratio_high == 0.28
    assert config.simulator.env_config().horizon == 100
    mlp = config.policy.policy_config(obs_dim=11, action_dim=7)
    assert (mlp.obs_dim, mlp.action_dim, mlp.hidden_sizes) == (11, 7, (256, 256))


@pytest.mark.parametrize(
    ("template", "overrides", "node", "key", "writer"),
    [
        ("embodied_grpo", ["algorithm.use_kl_loss=true"], "actor_update", "ref_log_probs", "reference/model_inference"),
        ("embodied_grpo", ["algorithm.use_kl_in_reward=true"], "advantage", "ref_log_probs",
         "reference/model_inference"),
        ("embodied_grpo", ["algorithm.adv_estimator=gae"], "advantage", "values", "critic/model_inference"),
        ("llm_grpo", ["algorithm.adv_estimator=gae"], "advantage", "values", "critic/model_inference"),
    ],
)
def test_settings_that_need_a_reference_or_a_critic_node(template, overrides, node, key, writer):
    err = _error(template, *overrides)
    assert err.node == node and err.field == "deps" and f"reads batch key {key!r}" in str(err) and writer in str(err)
    plan(load_template("embodied_ppo"))  # has its critic


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


@pytest.mark.parametrize(
    ("overrides", "field", "instead"),
    [
        (["policy.config.model_path=/models/qwen"], "policy.config.model_path", "text.model_path"),
        (["policy.name=openvla"], "policy.name", "text.model_path"),
        (["trainer.total_env_steps=1"], "trainer.total_env_steps", "trainer.total_steps"),
        (["data.init_states_per_step=64"], "data.init_states_per_step", "text.prompts_per_step"),
        (["data.num_train_init_states=10"], "data.num_train_init_states", "text.train_file"),
        (["warm_start.num_demos=5"], "warm_start.num_demos", "text.sft_steps"),
        (["simulator.env.horizon=5"], "simulator.env.horizon", "no simulator"),
        (["algorithm.reward=success"], "algorithm.reward", "rule verifiers"),
        (["algorithm.srpo.dbscan_eps=0.3"], "algorithm.srpo", "rule verifiers"),
        (["algorithm.trajectory_encoder=policy_backbone"], "algorithm.trajectory_encoder", "embodied episodes"),
        (["critic.hidden_sizes=[8]"], "critic.hidden_sizes", "value head"),
        (["eval.temperature=0.5"], "eval.temperature", "text.temperature"),
        (["eval.video_episodes=2"], "eval.video_episodes", "no videos"),
    ],
)
def test_a_text_run_refuses_the_settings_only_embodied_runs_read(overrides, field, instead):
    """They were accepted and ignored: ``policy.config.model_path`` trained the tiny model."""
    error = _error("llm_grpo", *overrides)
    assert error.field == field, str(error)
    assert "text run" in str(error) and instead in str(error)


def test_an_embodied_run_refuses_text_settings():
    error = _error("embodied_srpo", "text.model_path=/models/qwen")
    assert error.field == "text.model_path" and "text runs only" in str(error)


def test_a_text_run_still_takes_the_shared_settings():
    config = load_template("llm_grpo", ["data.group_size=4", "policy.lora.rank=4", "policy.allow_partial_load=true",
                                        "eval.num_episodes=8", "eval.every_steps=2"]).config
    assert (config.data.group_size, config.policy.lora.rank, config.eval.num_episodes) == (4, 4, 8)


@pytest.mark.parametrize(
    ("template", "override", "field", "selected"),
    [
        ("embodied_srpo", "algorithm.gae.lam=0.9", "algorithm.gae.lam", "algorithm.adv_estimator is 'grpo'"),
        ("embodied_grpo", "algorithm.srpo.dbscan_eps=0.3", "algorithm.srpo.dbscan_eps",
         "algorithm.reward is 'success'"),
        ("llm_gspo", "algorithm.ppo_clip.clip_ratio_high=0.3", "algorithm.ppo_clip.clip_ratio_high",
         "algorithm.policy_loss is 'gspo'"),
        ("embodied_grpo", "algorithm.kl_loss_coef=0.5", "algorithm.kl_loss_coef", "algorithm.use_kl_loss=true"),
        ("embodied_grpo", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.type",
         "algorithm.use_kl_in_reward=true"),
    ],
)
def test_an_override_of_an_unselected_components_settings_is_refused(template, override, field, selected):
    """Typed on the command line, it would change nothing (verl's ``lam`` under GRPO does not either)."""
    error = _error(template, override)
    assert error.field == field and selected in str(error) and "never read" in str(error)


def test_a_template_may_carry_the_settings_of_components_it_switched_away_from():
    """embodied_grpo extends embodied_srpo (its algorithm.srpo settings) and selects the success reward."""
    config = load_template("embodied_grpo").config
    assert config.algorithm.reward == "success" and "algorithm.srpo" in config.unread_settings()
    selected = load_template("embodied_grpo", ["algorithm.reward=srpo", "algorithm.srpo.dbscan_eps=0.3"]).config
    assert selected.algorithm.options("reward").dbscan_eps == 0.3 and "algorithm.srpo" not in selected.unread_settings()


def test_rollout_backend_defaults_to_hf_and_accepts_vllm():
    assert load_template("llm_grpo").config.text.rollout_backend == "hf"
    assert load_template("llm_grpo", ["text.rollout_backend=vllm"]).config.text.rollout_backend == "vllm"
    # with LoRA, the engine loads merged weights (it was refused before)
    plan(load_template("llm_grpo", ["text.rollout_backend=vllm", "policy.lora.rank=4"]))


def test_vllm_rollout_must_run_on_every_worker():
    plan(load_template("llm_grpo", ["text.rollout_backend=vllm"]))
    err = _error("llm_grpo", "text.rollout_backend=vllm", "nodes.rollout.dp_size=1")
    assert err.node == "rollout" and err.field == "dp_size" and "text.rollout_backend=vllm" in str(err)
    plan(load_template("llm_grpo", ["nodes.rollout.dp_size=1"]))  # the policy's own sampling runs at any dp_size


def test_dynamic_sampling_layout_is_checked_at_plan_time():
    err = _error("embodied_dapo", "nodes.group_filter.dp_size=1")
    assert err.node == "group_filter" and err.field == "dp_size"
    err = _error("embodied_dapo", "algorithm.filter_groups.zero_variance=false")
    assert err.node == "group_filter" and "needs a group filter" in str(err)


def test_the_dapo_templates_filter_on_accuracy_as_dapo_does():
    """DAPO's dynamic sampling keeps groups with 0 < correct < G (verl's recipe: metric=acc), not
    groups whose overlong-shaped rewards differ; the other templates compare rewards."""
    for name in ("llm_dapo", "embodied_dapo"):
        assert load_template(name).config.algorithm.filter_groups.metric == "success", name
    assert load_template("llm_grpo").config.algorithm.filter_groups.metric == "rewards"
    assert _error("llm_dapo", "algorithm.filter_groups.metric=acc").field == "algorithm.filter_groups.metric"



# --- task sets and warm starts --------------------------------------------------------------------

MT = ["simulator.name=metaworld", "simulator.env={horizon: 50}"]


def test_a_task_set_by_name_or_list_gives_each_task_its_config():
    config = load_template("embodied_srpo_mt10").config
    sim = config.simulator
    assert sim.multi_task and sim.task_names()[:2] == ["reach-v3", "push-v3"] and len(sim.task_names()) == 10
    assert sim.task_envs()[3] == {**sim.env, "task": "door-open-v3"}
    assert config.data.init_states_per_step % 10 == 0
    listed = load_template("embodied_srpo", [*MT, "simulator.tasks=[push-v3,reach-v3]", "data.init_states_per_step=4"])
    assert listed.config.simulator.task_names() == ["push-v3", "reach-v3"]
    single = load_template("embodied_srpo").config.simulator
    assert not single.multi_task and single.task_names() == ["Lift"] and single.task_envs() == [single.env]


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        (["simulator.tasks=mt11"], "simulator.tasks", "unknown task set 'mt11' of simulator 'metaworld' (known: mt10"),
        (["simulator.tasks=[reach-v3,reach-v3]"], "simulator.tasks", "each once"),
        (["simulator.tasks=[reach-v3,pushy-v3]"], "simulator.tasks[1]", "got 'pushy-v3'"),
        (["simulator.tasks=[reach-v3]", "simulator.env.task=push-v3"], "simulator.env.task", "each task of simulator.tasks"),
        (["simulator.tasks=[reach-v3]", "simulator.env.instruction=go"], "simulator.env.instruction",
         "each task of simulator.tasks"),
    ],
)
def test_bad_task_sets_are_errors_naming_the_field(overrides, field, message):
    with pytest.raises(TemplateError) as info:
        load_template("embodied_srpo", [*MT, "data.init_states_per_step=2", *overrides])
    assert info.value.field == field and message in str(info.value)


def test_every_step_draws_each_task_of_a_task_set_as_often():
    with pytest.raises(TemplateError, match=r"init_states_per_step \(8\) must be a multiple of the 10 tasks"):
        load_template("embodied_srpo_mt10", ["data.init_states_per_step=8"])


def test_a_warm_start_without_an_expert_is_refused_at_plan_time():
    """The task has no scripted expert: the planner names it and the tasks that have one (and
    accepts the same task without demonstrations)."""
    task = ["simulator.name=robosuite", "simulator.env.task=NutAssemblySquare",
            "simulator.env.obs_keys=[robot0_eef_pos]", "simulator.env.instruction=fit the nut"]
    err = _error("embodied_srpo", *task)
    assert err.node == "demonstrations" and err.field == "warm_start.num_demos"
    assert "no scripted expert for task 'NutAssemblySquare'" in str(err)
    assert "tasks with one: Door, Lift, PickPlaceCan, Stack" in str(err)
    assert "warm-start from a LeRobot dataset (warm_start.dataset), set warm_start.num_demos=0" in str(err)
    plan(load_template("embodied_srpo", [*task, "warm_start.num_demos=0"]))


@pytest.mark.parametrize(
    ("template", "overrides", "message"),
    [
        ("llm_grpo", ["trainer.strategy=zero3"], "'ddp' or 'fsdp'"),
        ("llm_grpo", ["trainer.mixed_precision=bf16"], "trainer.mixed_precision bf16 needs accelerator workers"),
        ("llm_grpo", ["trainer.strategy=fsdp", "trainer.mixed_precision=bf16"],
         "trainer.mixed_precision bf16 needs accelerator workers"),
        ("llm_grpo", ["trainer.mixed_precision=fp8"], "trainer.mixed_precision"),
        ("llm_grpo", ["trainer.micro_batch_size=0"], "trainer.micro_batch_size"),
        ("llm_grpo", ["trainer.fsdp.master_dtype=float16"], "trainer.fsdp.master_dtype"),
        ("llm_grpo", ["trainer.fsdp.reshard=true"], "reshard"),
        ("llm_grpo", ["policy.lora.rank=0"], "policy.lora.rank"),
        ("llm_grpo", ["policy.lora.rank=4", "policy.lora.target_modules=[]"], "policy.lora.target_modules"),
        ("llm_grpo", ["policy.lora.rank=4", "policy.lora.dropout=1.0"], "policy.lora.dropout"),
        ("llm_grpo", ["policy.lora.ranks=4"], "ranks"),
        ("embodied_grpo", ["policy.lora.rank=4"], "field 'policy.lora': the 'mlp' policy takes no LoRA adapters"),
    ],
)
def test_bad_large_policy_settings_are_rejected(template, overrides, message):
    assert message in str(_error(template, *overrides))


def test_large_policy_settings_load():
    config = load_template("embodied_grpo_oft_lift", [
        "trainer.strategy=fsdp", "trainer.gradient_checkpointing=true", "trainer.micro_batch_size=2",
        "workers.device=cuda", "trainer.mixed_precision=bf16", "policy.lora.rank=32",
        "policy.lora.trainable_modules=[proprio_projector]"]).config
    assert config.trainer.strategy == "fsdp" and config.trainer.micro_batch_size == 2
    assert config.policy.lora.rank == 32 and config.policy.lora.trainable_modules == ["proprio_projector"]
    assert config.policy.lora.alpha is None and "q_proj" in config.policy.lora.target_modules
    ddp = load_template("embodied_srpo", ["workers.device=cuda", "trainer.mixed_precision=bf16"]).config.trainer
    assert (ddp.strategy, ddp.mixed_precision) == ("ddp", "bf16")  # DDP's bfloat16 autocast
    default = load_template("embodied_srpo").config.trainer
    assert (default.strategy, default.mixed_precision, default.micro_batch_size) == ("ddp", "auto", None)
    assert not default.gradient_checkpointing and load_template("embodied_srpo").config.policy.lora is None


@pytest.mark.parametrize("backend", ["nccl", "hccl", "cuda:nccl", "cpu:nccl,cuda:nccl"])
def test_a_collective_backend_without_gloo_for_cpu_tensors_is_refused(backend):
    """NCCL alone would accept the run and fail at its first CPU-tensor collective (advantages,
    group filters, evaluation, re-shards): refused when the config is read, naming the fix."""
    from pydantic import ValidationError

    from vla_rl.config import WorkersSection

    with pytest.raises(ValidationError, match="cpu:gloo,cuda:nccl"):
        WorkersSection(device="cuda", collective_backend=backend)


@pytest.mark.parametrize(("device", "backend"), [("cuda", "gloo"), ("cuda", "cpu:gloo,cuda:gloo"),
                                                ("npu", "gloo")])
def test_fsdp_over_gloo_on_accelerator_tensors_is_refused(device, backend):
    """FSDP2's collectives on CUDA tensors over gloo segfault the workers (pytorch/pytorch#132471;
    seen on an H200 with two workers sharing it): refused when the config is read, naming the
    field and both ways out. DDP may share an accelerator over gloo, and FSDP on CPU workers
    reduces CPU tensors with gloo as it should."""
    overrides = [f"workers.device={device}", f"workers.collective_backend={backend}", "workers.gpus_per_worker=0.5"]
    err = _error("llm_grpo", *overrides, "trainer.strategy=fsdp")
    assert "workers.collective_backend" in str(err) and "segmentation fault" in str(err)
    assert "workers.gpus_per_worker=1" in str(err) and "trainer.strategy=ddp" in str(err)
    load_template("llm_grpo", overrides)  # ddp
    load_template("llm_grpo", [f"workers.device={device}", "trainer.strategy=fsdp"])  # the default backend
    load_template("llm_grpo", ["workers.device=cpu", "workers.collective_backend=gloo", "trainer.strategy=fsdp"])


@pytest.mark.parametrize(("device", "backend", "expected"), [
    ("cuda", None, "nccl"), ("npu", None, "hccl"), ("cpu", None, "gloo"), ("cuda", "gloo", "gloo"),
    ("cpu", "cpu:gloo,cuda:nccl", "gloo"), ("cuda", "cpu:gloo,cuda:nccl", "nccl"), ("cuda", "cpu:gloo", None)])
def test_the_backend_of_each_devices_tensors(device, backend, expected):
    from vla_rl.config import WorkersSection

    assert WorkersSection(collective_backend=backend).tensor_backend(device) == expected


@pytest.mark.parametrize(("flat", "section", "key", "value"), [
    ("filter_zero_variance_groups", "filter_groups", "zero_variance", False),
    ("success_rate_band", "filter_groups", "success_rate_band", (0.2, 0.8)),
    ("max_refill_rounds", "filter_groups", "max_refill_rounds", 1),
    ("overlong_buffer_len", "overlong_buffer", "len", 4),
    ("overlong_penalty_factor", "overlong_buffer", "penalty_factor", 0.5),
])
def test_a_flat_key_of_earlier_versions_is_read_into_its_section(flat, section, key, value):
    with pytest.warns(FutureWarning, match=f"algorithm.{flat} is now algorithm.{section}.{key}"):
        config = RunConfig.model_validate({"algorithm": {flat: list(value) if isinstance(value, tuple) else value}})
    assert getattr(getattr(config.algorithm, section), key) == value
    with pytest.raises(ValueError, match=f"algorithm.{flat}: moved to algorithm.{section}.{key}, which is also set"):
        RunConfig.model_validate({"algorithm": {flat: value, section: {key: value}}})


def test_srpo_reference_set_lives_with_the_srpo_reward():
    with pytest.warns(FutureWarning, match="algorithm.srpo_reference_set is now algorithm.srpo.reference_set"):
        config = RunConfig.model_validate({"algorithm": {"srpo_reference_set": "step", "srpo": {"dbscan_eps": 0.4}}})
    assert config.algorithm.options("reward").reference_set == "step"
    assert config.algorithm.options("reward").dbscan_eps == 0.4
    assert RunConfig.model_validate({}).algorithm.options("reward").reference_set == "local"
    with pytest.raises(ValueError, match="algorithm.srpo.reference_set"):
        RunConfig.model_validate({"algorithm": {"srpo": {"reference_set": "global"}}})


@pytest.mark.parametrize("template, dtype_field, warm_start, warm_node", [
    ("llm_grpo", "text.dtype", "text.sft_steps=5", "sft"),
    ("embodied_srpo_oft_lift", "policy.config.dtype", "warm_start.num_demos=2", "behaviour_cloning"),
    ("embodied_srpo_pi0_lift", "policy.config.dtype", "warm_start.num_demos=2", "behaviour_cloning"),
])
def test_adam_on_half_precision_parameters_is_refused_at_plan_time(template, dtype_field, warm_start, warm_node):
    """A warm start (Adam before the actor's strategy exists) or DDP on parameters loaded in
    float16/bfloat16 keeps no float32 master weights: refused before any worker loads a model (the
    workers refused DDP only after loading and warm-starting; the warm starts ran, float16 into NaN
    weights). LoRA's float32 adapters, FSDP's float32 masters or float32 parameters plan."""
    for dtype in ("float16", "bfloat16"):
        err = _error(template, f"{dtype_field}={dtype}", warm_start)
        assert (err.field, err.node) == (dtype_field, warm_node) and f"policy's {dtype} parameters" in str(err)
        err = _error(template, f"{dtype_field}={dtype}", warm_start.split("=")[0] + "=0")
        assert (err.field, err.node) == ("trainer.strategy", "actor_update") and "trainer.strategy=fsdp" in str(err)
        assert ("policy.lora" in str(err)) == (template != "embodied_srpo_pi0_lift")  # π0 takes no LoRA
    plan(load_template(template, [f"{dtype_field}=bfloat16", warm_start.split("=")[0] + "=0", "trainer.strategy=fsdp"]))
    if template != "embodied_srpo_pi0_lift":
        plan(load_template(template, [f"{dtype_field}=bfloat16", warm_start, "policy.lora.rank=4"]))
    if template == "embodied_srpo_oft_lift":  # modules LoRA trains whole train in the policy's dtype
        err = _error(template, f"{dtype_field}=bfloat16", warm_start, "policy.lora.rank=4",
                     "policy.lora.trainable_modules=[proprio_projector]")
        assert err.field == dtype_field and "policy.lora.trainable_modules=[]" in str(err)
    plan(load_template(template, [f"{dtype_field}=float32", warm_start]))



def test_a_half_precision_value_model_under_ddp_is_refused_at_plan_time():
    """The text critic trains a whole copy of the policy's body in text.dtype, LoRA or not: DDP
    would step Adam on bfloat16 weights (its strategy refused it after the actor was built)."""
    err = _error("llm_ppo", "text.dtype=bfloat16", "text.sft_steps=0", "policy.lora.rank=4")
    assert (err.field, err.node) == ("trainer.strategy", "critic_update") and "value model" in str(err)
    plan(load_template("llm_ppo", ["text.dtype=bfloat16", "text.sft_steps=0", "policy.lora.rank=4",
                                   "trainer.strategy=fsdp"]))


def test_a_policy_class_that_leaves_methods_abstract_is_refused_when_the_template_loads(monkeypatch):
    """A plug-in policy without log_prob_and_entropy_per_dim planned, and its run failed with a
    Ray traceback once a worker built it."""
    import abc

    from policies import POLICIES
    from policies.mlp.modeling_mlp import MLPPolicy

    class Partial(MLPPolicy):  # makes one of Policy's methods abstract again, as a class lacking it is
        name = "partial_toy"

        @abc.abstractmethod
        def log_prob_and_entropy_per_dim(self, *args): ...

    POLICIES.load_builtins()
    monkeypatch.setitem(POLICIES._entries, "partial_toy", Partial)
    err = _error("embodied_srpo", "policy.name=partial_toy")
    assert err.field == "policy.name"
    assert "'partial_toy' (test_config.test_a_policy_class_that_leaves_methods_abstract_is_refused_when_the_template_" \
           "loads.<locals>.Partial) does not define log_prob_and_entropy_per_dim of policies.base.Policy" in str(err)


def test_a_plug_in_simulator_without_config_class_names_simulator_name(monkeypatch):
    """It was an AttributeError traceback at plan time."""
    from simulators.registry import SIMULATORS

    SIMULATORS.get("robosuite_lift")  # the builtins, registered before the plug-in

    class NoConfigClass:
        pass

    monkeypatch.setitem(SIMULATORS._entries, "no_config_class", NoConfigClass)
    error = _error("embodied_grpo", "simulator.name=no_config_class", "warm_start.num_demos=0")
    assert error.field == "simulator.name" and "has no config_class, the dataclass of its simulator.env" in str(error)


@pytest.mark.parametrize("module, body, message", [
    ("toy_dup_node", "from vla_rl.dag.registry import NodeOutput, register_node\n"
     "register_node('reward', 'compute', reads=('success',), writes=('rewards',))(lambda ctx, batch: NodeOutput())\n",
     "node function ('reward', 'compute', 'default') is already registered (by vla_rl.nodes.reward); toy_dup_node "
     "registers another"),
    ("toy_dup_resource", "from vla_rl.workers.resources import register_resource\n"
     "register_resource('policy')(lambda res: None)\n",
     "worker resource 'policy' is already registered (by vla_rl.workflows.base); toy_dup_resource registers another"),
])
def test_a_plug_in_taking_a_built_in_name_is_the_one_refused(module, body, message, tmp_path, monkeypatch):
    """Imported before the built-ins had loaded, the plug-in took the name, and the built-in's
    module was then blamed for registering "another" (the error named an unrelated node)."""
    (tmp_path / f"{module}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TemplateError) as raised:
        load_template("embodied_srpo", [f"run.imports=[{module}]"])
    err = raised.value
    assert err.field == "run.imports" and f"cannot import '{module}': RegistryError: {message}" in err.message
