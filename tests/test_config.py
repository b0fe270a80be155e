"""The run config: every registered name and every component's settings (simulator, policy,
advantage estimator, policy loss, reward, trajectory encoder) validated when a template loads,
with the field named; what the nodes need from each other checked by the planner."""

from __future__ import annotations

import pytest
from template_errors import plan_error as _error

from vla_rl.config import RunConfig
from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import plan


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
        (["algorithm.policy_loss=cpgd", "algorithm.cpgd.dual_clip_c=3.0"], "unknown key for CPGDConfig"),
        (["algorithm.cpgd.dual_clip_c=3.0"], "the settings of policy loss 'cpgd', which this run does not use"),
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
        (["algorithm.adv_estimator=gae", "algorithm.gae.lam=2"], "algorithm.gae", "lam must be in [0, 1]"),
        (["algorithm.state_resample.points=1"], "algorithm.state_resample", "points must be >= 2"),
        (["algorithm.trajectory_encoder=vjepa2"], "algorithm.vjepa2", "model_dir is required"),
        # text that pydantic reads as a non-finite float passed (a NaN clip range trained on NaN losses)
        (["algorithm.ppo_clip.clip_ratio_high=nan"], "algorithm.ppo_clip.clip_ratio_high",
         "must be a finite number (got 'nan')"),
        (["policy.config.init_std=Infinity"], "policy.config.init_std", "must be a finite number (got 'Infinity')"),
        (["algorithm.srpo.degenerate_range_tolerance=NaN"], "algorithm.srpo.degenerate_range_tolerance",
         "must be a finite number"),
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
        ("embodied_grpo", "algorithm.trajectory_encoder=policy_backbone", "algorithm.trajectory_encoder",
         "algorithm.reward is 'success'"),
        ("embodied_grpo", "algorithm.state_resample.points=4", "algorithm.state_resample.points",
         "algorithm.reward is 'success'"),
        ("embodied_srpo", "algorithm.overlong_buffer.penalty_factor=2", "algorithm.overlong_buffer.penalty_factor",
         "its len is 0"),
        ("embodied_grpo", "trainer.fsdp.reshard_after_forward=false", "trainer.fsdp.reshard_after_forward",
         "trainer.strategy=fsdp, and it is 'ddp'"),
        ("embodied_grpo", "trainer.fsdp={master_dtype: bfloat16}", "trainer.fsdp", "trainer.strategy=fsdp"),
        # a moved flat key is checked as its new place
        ("embodied_grpo", "algorithm.overlong_penalty_factor=2", "algorithm.overlong_buffer.penalty_factor",
         "its len is 0"),
    ],
)
def test_an_override_of_an_unselected_components_settings_is_refused(template, override, field, selected):
    """Typed on the command line, it would change nothing (verl's ``lam`` under GRPO does not either)."""
    error = _error(template, override)
    assert error.field == field and selected in str(error) and "never read" in str(error)


@pytest.mark.parametrize(("template", "override", "readers", "instead"), [
    ("embodied_ppo", "algorithm.filter_groups.zero_variance=false", "filter/compute or filter/compute/dynamic_sampling",
     "use a template with one"),
    ("embodied_grpo", "critic.lr=1e-4", "critic/model_inference or critic/model_train", "use a template with one"),
    ("llm_grpo", "critic.cliprange_value=0.1", "critic/model_inference or critic/model_train",
     "use a template with one"),
    ("embodied_srpo", "algorithm.filter_groups.max_refill_rounds=3", "filter/compute/dynamic_sampling",
     "select one with nodes.group_filter.fn=dynamic_sampling"),
    ("embodied_srpo", "algorithm.max_refill_rounds=3", "filter/compute/dynamic_sampling",
     "select one with nodes.group_filter.fn=dynamic_sampling"),
])
def test_an_override_only_nodes_the_template_lacks_would_read_is_refused(template, override, readers, instead):
    """Each of these trained exactly as without it."""
    message = str(_error(template, override))
    assert f"override {override!r} is never read" in message and f"read only by {readers} nodes" in message
    assert instead in message


@pytest.mark.parametrize(("template", "overrides"), [
    ("embodied_ppo", ["critic.lr=1e-4"]),
    ("llm_ppo", ["critic.lr=1e-5"]),
    ("embodied_srpo", ["algorithm.filter_groups.zero_variance=true"]),
    ("embodied_dapo", ["algorithm.filter_groups.max_refill_rounds=3"]),
    ("embodied_srpo", ["nodes.group_filter.fn=dynamic_sampling", "algorithm.filter_groups.max_refill_rounds=3"]),
])
def test_the_same_overrides_are_taken_where_a_node_reads_them(template, overrides):
    plan(load_template(template, overrides))


@pytest.mark.parametrize(("overrides", "field", "why"), [
    (["eval.num_episodes=0", "eval.every_steps=2"], "eval.every_steps", "no evaluation runs with eval.num_episodes=0"),
    (["eval.num_episodes=0", "eval.video_episodes=5"], "eval.video_episodes", "eval.num_episodes=0"),
    (["eval.protocols=[greedy]", "eval.temperature=0.5"], "eval.temperature", "read only by the 'sampled' protocol"),
    (["warm_start.num_demos=0", "warm_start.bc_steps=10"], "warm_start.bc_steps",
     "read only with demonstrations to clone, and warm_start.num_demos is 0"),
    (["warm_start.num_demos=0", "warm_start.bc_lr=0.1"], "warm_start.bc_lr", "warm_start.num_demos is 0"),
    (["warm_start.dataset_keys.action=actions"], "warm_start.dataset_keys.action",
     "read only with warm_start.dataset, which is unset"),
    (["warm_start.dataset=/data/x", "warm_start.demo_init_state_offset=5"], "warm_start.demo_init_state_offset",
     "read only by the scripted expert's demonstrations"),
])
def test_evaluation_and_warm_start_settings_the_run_never_reads_are_refused(overrides, field, why):
    """Each was accepted and changed nothing (an audit of README's Configuration section)."""
    error = _error("embodied_srpo", *overrides)
    assert error.field == field and why in str(error) and "is never read" in str(error)


@pytest.mark.parametrize(("template", "overrides", "field", "why"), [
    ("llm_sft", ["text.sft_lr=1e-4"], "text.sft_lr", "text.sft_steps is 0: set text.sft_steps too on such a template"),
    ("llm_sft", ["text.sft_batch_size=8"], "text.sft_batch_size", "llm_sft's own fine-tuning takes trainer.lr"),
    ("llm_grpo", ["text.sft_steps=0", "text.sft_lr=1e-4"], "text.sft_lr", "read only by the supervised warm start"),
    ("embodied_srpo", ["trainer.ppo_num_mini_batches=4", "trainer.ppo_mini_batch_size=8"],
     "trainer.ppo_mini_batch_size", "replaced by trainer.ppo_num_mini_batches (4): set that to null too"),
    ("llm_sft", ["algorithm.entropy_coeff=0.01"], "algorithm.entropy_coeff", "read by the RL nodes (rollout, reward, "
     "advantage, filter, critic, reference) and the policy-gradient update, and this template trains with "
     "actor/model_train/sft alone"),
    ("llm_sft", ["data.group_size=4"], "data.group_size", "and this template trains with actor/model_train/sft alone"),
    ("llm_sft", ["text.sft_steps=5"], "text.sft_steps", "text.sft_steps is read only by "
     "actor/model_train/supervised_fine_tune nodes, and this template has none; use a template with one"),
])
def test_settings_replaced_or_read_by_absent_nodes_are_refused(template, overrides, field, why):
    """llm_sft fine-tunes with trainer.lr: text.sft_lr there (the RL templates' warm start's) changed
    nothing, and so did text.sft_steps, which the policy resource its nodes share was taken to read,
    and a minibatch size beside a number of minibatches."""
    error = _error(template, *overrides)
    assert error.field == field and why in str(error) and "is never read" in str(error)


@pytest.mark.parametrize(("overrides", "field", "why"), [
    (["text.model_path=/models/qwen", "text.tiny_hidden_size=128"], "text.tiny_hidden_size",
     "read only to build the tiny model of a run without text.model_path, which is '/models/qwen'"),
    (["text.gguf_file=model.gguf"], "text.gguf_file", "read only with text.model_path, which is null"),
    (["text.train_file=a.jsonl", "text.test_file=b.jsonl", "text.arithmetic_levels=[add_small]"],
     "text.arithmetic_levels", "read only to generate the arithmetic splits"),
    (["text.vllm_kv_cache_gib=8"], "text.vllm_kv_cache_gib",
     "read only with text.rollout_backend=vllm, and it is 'hf'"),
])
def test_text_settings_the_run_never_reads_are_refused(overrides, field, why):
    """Each was accepted and changed nothing: a GGUF file without a model trained the tiny model (an audit)."""
    error = _error("llm_grpo", *overrides)
    assert error.field == field and why in str(error) and "is never read" in str(error)
    plan(load_template("llm_grpo", ["text.rollout_backend=vllm", "text.vllm_kv_cache_gib=8"]))  # read there


def test_held_out_initial_states_are_not_training_ones():
    """eval.init_state_offset=0 evaluated the policy on ids 0..49, training ids, as 'held out' (an audit)."""
    error = _error("embodied_srpo", "eval.init_state_offset=0")
    assert error.field == "eval.init_state_offset" and "(ids 0..49) training's (ids 0..99999" in str(error)
    error = _error("embodied_srpo", "data.num_train_init_states=2000000000")
    assert error.field == "eval.init_state_offset" and "ids 0..1999999999" in str(error)
    load_template("embodied_srpo", ["eval.init_state_offset=100000"])
    load_template("llm_grpo")  # a text run evaluates rows of its test file


def test_the_trajectory_encoder_of_a_reward_without_embeddings_is_not_validated():
    """vjepa2's required model_dir was asked for under the success reward, which never builds an encoder."""
    config = load_template("embodied_grpo", ["algorithm.reward=success"]).config
    assert "algorithm.trajectory_encoder" in config.unread_settings()
    raw_config = {**load_template("embodied_grpo").raw["config"]}
    raw_config["algorithm"] = {**raw_config["algorithm"], "trajectory_encoder": "vjepa2"}
    assert RunConfig.model_validate(raw_config).algorithm.trajectory_encoder == "vjepa2"
    with pytest.raises(ValueError, match="model_dir is required"):
        RunConfig.model_validate({**raw_config, "algorithm": {**raw_config["algorithm"], "reward": "srpo"}})


def test_fsdp_settings_are_read_under_fsdp():
    config = load_template("llm_grpo", ["trainer.strategy=fsdp", "trainer.fsdp.reshard_after_forward=false",
                                        "trainer.micro_batch_size=4", "trainer.fsdp.sync_every_micro_batch=false"]).config
    assert not config.trainer.fsdp.reshard_after_forward and not config.trainer.fsdp.sync_every_micro_batch
    assert not any(name.startswith("trainer.") for name in config.unread_settings())
    error = _error("llm_grpo", "trainer.strategy=fsdp", "trainer.fsdp.sync_every_micro_batch=false")
    assert error.field == "trainer.fsdp.sync_every_micro_batch" and "micro_batch_size), which is null" in str(error)


def test_the_overlong_factor_is_read_with_a_buffer():
    config = load_template("embodied_srpo", ["algorithm.overlong_buffer.len=3",
                                             "algorithm.overlong_buffer.penalty_factor=2"]).config
    assert config.algorithm.overlong_buffer.penalty_factor == 2
    assert "algorithm.overlong_buffer.penalty_factor" not in config.unread_settings()


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
        (["simulator.tasks=[reach-v3]", "simulator.env.horizon=0"], "simulator.env.horizon", "got 0"),  # shared
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




@pytest.mark.parametrize("template, overrides, field, message", [
    # each hung `vla-rl plan` (a list entry per rank or per sample) or crashed it with an OverflowError
    ("embodied_grpo", ["workers.num_workers=1000000000000000000000000000000"], "workers.num_workers",
     "less than or equal to 4096"),
    ("embodied_grpo", ["data.group_size=1000000000000000000000000000000"], None,
     "data.init_states_per_step x data.group_size = 8 x 1000000000000000000000000000000 samples per step, more "
     "than the 1,000,000"),
    ("embodied_grpo", ["data.group_size=100000000"], None, "8 x 100000000 samples per step"),
    ("llm_grpo", ["data.group_size=100000"], None, "text.prompts_per_step x data.group_size = 16 x 100000"),
    ("embodied_grpo", ["workers.torch_threads=1000000000000000000000000000000"], "workers.torch_threads",
     "less than or equal to 1024"),
])
def test_counts_no_run_could_hold_are_refused(template, overrides, field, message):
    err = _error(template, *overrides)
    assert err.field == field and message in err.message


def test_plan_refuses_a_world_size_no_run_could_hold(capsys):
    from vla_rl.cli import main

    assert main(["plan", "embodied_grpo", "--world-size", "100000"]) == 2
    assert capsys.readouterr().err.strip() == "error: --world-size 100000: a run plans for at most 4096 workers"
