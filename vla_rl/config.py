"""The global run configuration of a DAG template (its ``config:`` section), validated with pydantic.

Every section forbids unknown keys, so a typo in a template or a dotted override
(``trainer.total_steps=5``) is an error naming the field, never a silently ignored value.
Defaults live here and only here; runtime code reads attributes, never ``.get(key, default)``.
Per-node settings (the ``config:`` of one DAG node) are validated by the model that the node's
registered function declares (see :mod:`vla_rl.dag.registry`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunSection(_Section):
    """Where a run writes and how it is seeded."""

    output_dir: str = Field("outputs", description="Parent directory of run directories.")
    name: str | None = Field(None, description="Run directory name; default: <template>_<timestamp>.")
    seed: int = Field(0, ge=0, description="Global seed; each worker derives its own from it.")
    workflow: Literal["embodied", "text"] = Field(
        "embodied",
        description="'embodied': a robot policy in simulator pools (sections simulator, data, policy, "
        "warm_start); 'text': a causal LM on prompts (section text). Picks the model each worker builds "
        "and how the actor scores a batch; the template's nodes pick the node functions (fn: text).",
    )


class WorkersSection(_Section):
    """The DAG workers: one Ray actor per device slot."""

    num_workers: int = Field(2, ge=1, description="World size: number of DAG workers.")
    device: Literal["cpu", "cuda", "npu"] = Field("cpu", description="Device kind of each worker.")
    num_cpus_per_worker: float = Field(1.0, gt=0, description="Ray CPU resource per DAG worker.")
    torch_threads: int = Field(1, ge=1, description="torch intra-op threads in each worker.")


class SimulatorSection(_Section):
    """The simulator pool that each worker's ``env_interact`` node drives."""

    name: str = Field("robosuite_lift", description="Registered simulator name.")
    env: dict[str, Any] = Field(
        default_factory=dict, description="Fields of the simulator's config dataclass (e.g. horizon)."
    )
    actors_per_worker: int = Field(1, ge=1, description="Simulator actors (processes) per DAG worker.")
    num_cpus_per_actor: float = Field(1.0, ge=0, description="Ray CPU resource per simulator actor.")
    pipeline_stages: int = Field(
        1, ge=1, description="Groups of each worker's environments pipelined against the policy: while one "
        "group simulates, the policy computes the next action chunk of another (1: lockstep). Greedy rollouts "
        "do not depend on it; sampled ones are reproducible for a fixed value (docs/simulators.md).",
    )
    step_timeout_s: float = Field(
        120.0, gt=0, description="Seconds to wait for an action chunk of the simulator actors; an actor that "
        "has not answered by then is killed and restarted, and its running episodes are dropped as lost.",
    )


class DataSection(_Section):
    """The task list: initial-state ids, sharded across workers."""

    num_train_init_states: int = Field(
        100_000, ge=1, description="Training initial states are ids 0..N-1 (each id seeds a reset)."
    )
    init_states_per_step: int = Field(8, ge=1, description="Groups per step (global, all workers).")
    group_size: int = Field(8, ge=1, description="Rollouts per initial state (the GRPO/SRPO group).")


class PolicySection(_Section):
    """The policy: a registered name and the fields of its config class."""

    name: str = Field("mlp", description="Registered policy name.")
    config: dict[str, Any] = Field(default_factory=dict, description="Policy config fields.")


class WarmStartSection(_Section):
    """Behaviour cloning from scripted demonstrations before RL (0 demos: no warm start)."""

    num_demos: int = Field(2, ge=0, description="Demonstrations used for behaviour cloning.")
    demo_init_state_offset: int = Field(
        2_000_000_000, ge=0, description="Demonstration initial-state ids start here (disjoint from training)."
    )
    bc_steps: int = Field(1500, ge=0, description="Gradient steps of behaviour cloning.")
    bc_lr: float = Field(1e-3, gt=0, description="Adam learning rate for behaviour cloning.")
    bc_batch_size: int = Field(256, ge=1, description="Transitions per behaviour-cloning minibatch.")
    norm_init_states: int = Field(
        0, ge=0,
        description="First observations of this many training initial states join the demonstrations "
        "in the observation-normalisation statistics (0: demonstrations only), so that features a "
        "few demonstrations leave nearly constant (e.g. the cube's y) get the scale they vary by.",
    )
    demo_store: str | None = Field(
        None, description="zarr store of demonstrations (created if missing); default: in the run dir."
    )


class TextSection(_Section):
    """The text workflow (``run.workflow: text``): the causal LM, its prompts, the rule rewards
    and the supervised warm start. Prompt files are verl/siiRL-format parquet or JSONL
    (``prompt``, ``data_source``, ``reward_model.ground_truth``); each worker reads only its own
    row groups."""

    model_path: str | None = Field(
        None, description="Local HF model directory or .gguf file; null: a tiny Qwen2 built in the run dir."
    )
    gguf_file: str | None = Field(None, description="GGUF file name inside the directory model_path.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Parameter dtype.")
    tiny_hidden_size: int = Field(64, ge=8, description="Tiny model (model_path null): residual width.")
    tiny_num_layers: int = Field(2, ge=1, description="Tiny model (model_path null): transformer blocks.")
    train_file: str | None = Field(
        None, description="Training prompts (.parquet/.jsonl); null: arithmetic problems generated in the run dir."
    )
    test_file: str | None = Field(
        None, description="Held-out prompts for evaluation; null: the generated arithmetic test split."
    )
    num_generated_train: int = Field(4000, ge=1, description="Rows of the generated arithmetic train split.")
    num_generated_test: int = Field(256, ge=1, description="Rows of the generated arithmetic test split.")
    arithmetic_levels: list[Literal["add_small", "add_2x1digit", "add_2digit", "sub_2digit"]] | None = Field(
        None, description="Levels of vla_rl.data.arithmetic.LEVELS the generated splits draw from (null: all "
        "four); e.g. [add_small] (sums up to 20 + 9, 210 problems) for a model that misses the harder ones."
    )
    prompts_per_step: int = Field(16, ge=1, description="Prompts per step over all workers (groups per step).")
    group_size: int = Field(4, ge=1, description="Responses sampled per prompt (the GRPO group).")
    max_prompt_length: int = Field(64, ge=1, description="Prompt tokens after the chat template (left-padded).")
    max_response_length: int = Field(24, ge=1, description="Most tokens sampled per response.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature; the loss scores at the same one.")
    rollout_backend: Literal["hf", "vllm"] = Field(
        "hf", description="What samples the training responses: 'hf', the policy's own KV-cache decoding; "
        "'vllm', a vLLM engine on the worker's device with the trainer's weights loaded after every update "
        "(needs the vllm package, see docs/llm.md). Evaluation always decodes with the policy."
    )
    vllm_memory_fraction: float = Field(
        0.3, gt=0, le=1, description="rollout_backend 'vllm' on a GPU: share of GPU memory vLLM may take "
        "(weights + KV cache; the trainer shares the device)."
    )
    vllm_kv_cache_gib: float = Field(
        1.0, gt=0, description="rollout_backend 'vllm' on CPU: memory of the KV cache in GiB."
    )
    correct_score: float = Field(1.0, description="Reward of a correct final answer.")
    format_score: float = Field(0.0, description="Reward added for a well-formatted final answer.")
    answer_extraction: Literal["strict", "flexible"] = Field(
        "strict",
        description="'strict': only a final answer in the data source's format counts; 'flexible': an "
        "unformatted response is judged by its last number (verl's GSM8K method='flexible'), in "
        "training rewards and evaluation alike.",
    )
    sft_steps: int = Field(0, ge=0, description="Supervised warm-start steps on the train split (0: none).")
    sft_lr: float = Field(1e-3, gt=0, description="AdamW learning rate of the warm start.")
    sft_batch_size: int = Field(32, ge=1, description="Examples per warm-start step.")
    sft_response_column: str = Field(
        "extra_info.answer", description="Column holding the warm start's target responses."
    )


class KLControlSection(_Section):
    """Coefficient of the KL penalty in the reward (Ziegler et al. 2019 for ``adaptive``)."""

    type: Literal["fixed", "adaptive"] = Field("fixed", description="Fixed or adaptive coefficient.")
    kl_coef: float = Field(0.001, ge=0, description="The (initial) coefficient beta.")
    target_kl: float = Field(0.1, gt=0, description="KL the adaptive controller steers towards.")
    horizon: int = Field(10_000, gt=0, description="Samples over which the adaptive controller corrects fully.")


class AlgorithmSection(_Section):
    """Rewards, advantages, group filters and the policy objective (names resolve in
    ``vla_rl.algorithms``; docs/algorithms.md lists them with their sources)."""

    reward: str = Field("srpo", description="Embodied reward: 'srpo' (progress) or 'success' (binary).")
    srpo: dict[str, Any] = Field(default_factory=dict, description="Fields of SRPORewardConfig.")
    trajectory_encoder: str = Field(
        "state_resample",
        description="Trajectory encoder for SRPO: 'state_resample' (the simulator state), 'policy_backbone' (the "
        "policy's own vision backbone on encoder_camera frames) or 'vjepa2' (a V-JEPA 2 video model from a local "
        "directory: trajectory_encoder_options.model_dir).",
    )
    trajectory_encoder_options: dict[str, Any] = Field(
        default_factory=dict, description="Constructor options of a class encoder (vjepa2: model_dir, batch_size)."
    )
    encoder_camera: str = Field(
        "agentview", description="Camera whose frames the image encoders read (its '<camera>_image' observations)."
    )
    encoder_points: int = Field(16, ge=1, description="Frames sampled uniformly over each episode.")
    srpo_reference_set: Literal["local", "step"] = Field(
        "local",
        description="SRPO's reference successes: 'local', the reward node's own shard (at dp_size 1 already the "
        "whole step, gathered by the re-shard); 'step', every shard's trajectories, embeddings gathered worker to "
        "worker (all_gather) when the reward node runs at dp_size > 1.",
    )
    overlong_buffer_len: int = Field(
        0, ge=0, description="DAPO overlong shaping: decision steps before the budget where the penalty ramps (0: off)."
    )
    overlong_penalty_factor: float = Field(1.0, ge=0, description="DAPO overlong shaping: penalty at the budget.")
    adv_estimator: str = Field("grpo", description="Registered advantage estimator.")
    norm_adv_by_std: bool = Field(True, description="GRPO: divide by the group std (False: Dr.GRPO).")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount factor (GAE, REINFORCE++).")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda.")
    filter_zero_variance_groups: bool = Field(
        True, description="Drop groups whose rewards are all equal (they carry no advantage)."
    )
    success_rate_band: tuple[float, float] | None = Field(
        None,
        description="Keep only groups whose success rate lies in [low, high] (SimpleVLA-RL's and "
        "the SRPO recipe's accuracy filter, e.g. [0.1, 0.9]); None keeps every group.",
    )
    max_refill_rounds: int = Field(
        3, ge=0, description="Dynamic sampling: extra rollout rounds per step while too few groups are kept."
    )
    policy_loss: str = Field("ppo_clip", description="Registered policy objective.")
    clip_ratio_low: float = Field(0.2, ge=0, lt=1, description="Clip epsilon_low.")
    clip_ratio_high: float = Field(0.28, ge=0, description="Clip epsilon_high (clip-higher).")
    dual_clip_c: float | None = Field(None, gt=1, description="Dual-clip constant c of 'ppo_clip' (null: off).")
    policy_drift_coef: float = Field(0.1, ge=0, description="'cpgd': weight of the policy-drift regulariser.")
    ratio_granularity: Literal["token", "action", "chunk"] = Field(
        "action", description="One importance ratio per action dimension, per action, or per chunk."
    )
    loss_agg_mode: str = Field("seq-mean-token-mean", description="Loss aggregation mode.")
    loss_agg_normalizer: float | None = Field(
        None, gt=0, description="Constant of 'seq-mean-token-sum-norm' (null: the padded length)."
    )
    entropy_coeff: float = Field(0.0, ge=0, description="Weight of the entropy bonus (aggregated like the loss).")
    use_kl_loss: bool = Field(False, description="Add a KL(policy || reference) term to the actor loss.")
    kl_loss_coef: float = Field(0.001, ge=0, description="Weight of the KL loss term.")
    kl_loss_type: str = Field("k3", description="KL estimator of the loss term (k1, abs, k2, k3).")
    use_kl_in_reward: bool = Field(False, description="Subtract a KL penalty from the rewards.")
    kl_penalty: str = Field("k1", description="KL estimator of the reward penalty (k1, abs, k2, k3).")
    kl_ctrl: KLControlSection = Field(default_factory=KLControlSection)

    @field_validator("success_rate_band")
    @classmethod
    def _check_band(cls, band: tuple[float, float] | None) -> tuple[float, float] | None:
        if band is not None and not 0.0 <= band[0] <= band[1] <= 1.0:
            raise ValueError(f"must satisfy 0 <= low <= high <= 1, got [{band[0]}, {band[1]}]")
        return band

    @model_validator(mode="after")
    def _check_combinations(self) -> AlgorithmSection:
        if self.dual_clip_c is not None and self.policy_loss != "ppo_clip":
            raise ValueError(f"algorithm.dual_clip_c applies to policy_loss 'ppo_clip' only (policy_loss is "
                             f"{self.policy_loss!r}); set it to null")
        if self.loss_agg_normalizer is not None and self.loss_agg_mode != "seq-mean-token-sum-norm":
            raise ValueError("algorithm.loss_agg_normalizer is the constant of loss_agg_mode "
                             f"'seq-mean-token-sum-norm' (loss_agg_mode is {self.loss_agg_mode!r}); set it to null")
        return self


class CriticSection(_Section):
    """The value network of templates with a critic (PPO with GAE)."""

    hidden_sizes: list[int] = Field(default_factory=lambda: [256, 256], description="Hidden layer widths.")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate of the critic.")
    cliprange_value: float | None = Field(
        0.5, gt=0, description="Value clipping around the rollout-time values (null: plain squared error)."
    )
    loss_agg_mode: str = Field("token-mean", description="Aggregation of the value loss over decision steps.")


class TrainerSection(_Section):
    """The RL loop and the actor update."""

    total_steps: int = Field(25, ge=0, description="Training steps (rollout, rewards, update).")
    total_env_steps: int | None = Field(
        None, ge=1,
        description="Environment-step budget: training also stops after the step that brings the "
        "control steps simulated (all workers, dynamic-sampling rounds included) to it (null: none). "
        "Compares algorithms at equal simulation cost.",
    )
    lr: float = Field(3e-4, gt=0, description="Adam learning rate of the actor.")
    ppo_epochs: int = Field(4, ge=1, description="Passes over each step's batch.")
    ppo_mini_batch_size: int = Field(
        16, ge=1,
        description="Episodes per minibatch, summed over the workers (verl's ppo_mini_batch_size): a "
        "step whose filtered batch is small makes fewer updates instead of overfitting it.",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient-norm clip.")
    save_every: int = Field(5, ge=1, description="Checkpoint every k steps (and at the end).")
    keep_last: int = Field(2, ge=1, description="Checkpoints kept on disk.")


class EvalSection(_Section):
    """Evaluation on held-out initial states: before and after training, and by ``vla-rl eval``
    (the ``eval_rollout`` template; docs/evaluation.md)."""

    num_episodes: int = Field(50, ge=0, description="Episodes per protocol and task (0: no evaluation).")
    every_steps: int | None = Field(
        None, ge=1, description="Training runs: also evaluate after every k-th step, so the plot shows a "
        "held-out curve (null: only before and after training)."
    )
    protocols: list[Literal["greedy", "sampled"]] = Field(
        default_factory=lambda: ["greedy", "sampled"], description="Action protocols evaluated."
    )
    temperature: float = Field(
        1.0, gt=0, description="Temperature of the 'sampled' protocol (MLP policy: scales the Gaussian's std)."
    )
    benchmark: str | None = Field(
        None, description="vla-rl eval: registered benchmark (task list); null: the run's own simulator only."
    )
    tasks: list[str] | None = Field(None, description="vla-rl eval: the benchmark's tasks to run (null: all).")
    checkpoints: list[str] = Field(
        default_factory=list, description="vla-rl eval: checkpoint directories (filled in by the command)."
    )
    init_state_offset: int = Field(
        1_000_000_000, ge=0, description="Evaluation initial-state ids start here (never trained on)."
    )
    video_episodes: int = Field(
        3, ge=0, description="Episodes recorded to the evaluation video (vla-rl eval: successes and as many "
        "failures per task and protocol of the last checkpoint)."
    )
    video_camera: str = Field("agentview", description="Simulator camera the videos are rendered from.")
    video_size: int = Field(128, ge=16, description="Video frame height and width in pixels.")
    video_fps: int = Field(20, ge=1, description="Video frame rate in Hz.")


class RunConfig(_Section):
    """The ``config:`` section of a template."""

    run: RunSection = Field(default_factory=RunSection)
    workers: WorkersSection = Field(default_factory=WorkersSection)
    simulator: SimulatorSection = Field(default_factory=SimulatorSection)
    data: DataSection = Field(default_factory=DataSection)
    policy: PolicySection = Field(default_factory=PolicySection)
    text: TextSection = Field(default_factory=TextSection)
    warm_start: WarmStartSection = Field(default_factory=WarmStartSection)
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    critic: CriticSection = Field(default_factory=CriticSection)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    eval: EvalSection = Field(default_factory=EvalSection)

    @model_validator(mode="after")
    def _check_shards(self) -> RunConfig:
        text = self.text
        if self.run.workflow == "text" and text.prompts_per_step % self.workers.num_workers:
            raise ValueError(f"text.prompts_per_step ({text.prompts_per_step}) must be a multiple of "
                             f"workers.num_workers ({self.workers.num_workers}): each worker reads its own prompts")
        if self.data.num_train_init_states < self.data.init_states_per_step:
            raise ValueError(
                "data.num_train_init_states must be at least data.init_states_per_step "
                f"({self.data.num_train_init_states} < {self.data.init_states_per_step})"
            )
        return self
