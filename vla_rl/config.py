"""The global run configuration of a DAG template (its ``config:`` section), validated with pydantic.

Every section forbids unknown keys, so a typo in a template or a dotted override
(``trainer.total_steps=5``) is an error naming the field, never a silently ignored value.
Defaults live here and only here; runtime code reads attributes, never ``.get(key, default)``.
Per-node settings (the ``config:`` of one DAG node) are validated by the model that the node's
registered function declares (see :mod:`vla_rl.dag.registry`).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vla_rl.components import ComponentConfigError, build_config

#: torch.distributed backends a worker group may be created with.
_COLLECTIVE_BACKENDS = ("gloo", "nccl", "hccl", "mpi", "ucc")


class _Section(BaseModel):
    # Non-finite numbers (inf, nan) are refused everywhere: no setting means anything with them.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class RunSection(_Section):
    """Where a run writes and how it is seeded."""

    output_dir: str = Field("outputs", description="Parent directory of run directories.")
    name: str | None = Field(None, description="Run directory name; default: <template>_<timestamp>.")
    seed: int = Field(0, ge=0, description="Global seed; each worker derives its own from it.")
    imports: list[str] = Field(
        default_factory=list,
        description="Python modules imported before the template is validated, on the driver and on every worker: "
        "they register components of your own (advantage estimators, policy losses, rewards, trajectory encoders, "
        "nodes, resources; docs/extending.md). Each must be importable there (installed, or on PYTHONPATH).",
    )
    workflow: Literal["embodied", "text"] = Field(
        "embodied",
        description="'embodied': a robot policy in simulator pools (sections simulator, data, policy, "
        "warm_start); 'text': a causal LM on prompts (section text). Picks the model each worker builds "
        "and how the actor scores a batch; the template's nodes pick the node functions (fn: text).",
    )


class WorkersSection(_Section):
    """The DAG workers: one Ray actor per device slot."""

    num_workers: int = Field(2, ge=1, description="World size: number of DAG workers.")
    device: Literal["cpu", "cuda", "npu", "auto"] = Field(
        "cpu", description="Device kind of each worker; 'auto': the accelerator present (CUDA, then Ascend NPU), "
        "else the CPU.")
    num_cpus_per_worker: float = Field(1.0, gt=0, description="Ray CPU resource per DAG worker.")
    gpus_per_worker: float = Field(
        1.0, gt=0, le=1, description="Accelerator share of each worker (CUDA GPUs, Ascend NPUs); below 1 lets workers "
        "share one (tests on a single GPU).")
    collective_backend: str | None = Field(
        None, description="torch.distributed backend of the workers' process group; null: gloo on the CPU, "
        "'cpu:gloo,cuda:nccl' on CUDA, 'cpu:gloo,npu:hccl' on Ascend. 'gloo' lets several workers share one GPU "
        "(NCCL refuses two ranks on one device): with gpus_per_worker below 1.")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray placement-group strategy of the workers' bundles: PACK fills a node first, SPREAD "
        "puts the workers on as many nodes as it can.")
    placement_timeout_s: float = Field(300.0, gt=0, description="Seconds to wait for the cluster to place the workers.")
    ray_address: str | None = Field(
        None, description="Address of an existing Ray cluster to join ('auto', 'host:6379', 'ray://...'); null: the "
        "RAY_ADDRESS environment variable if set, else a local Ray on 127.0.0.1 (docs/cluster.md).")
    torch_threads: int = Field(1, ge=1, description="torch intra-op threads in each worker.")

    @field_validator("collective_backend")
    @classmethod
    def _known_backend(cls, value: str | None) -> str | None:
        """'gloo', 'nccl', or per-device 'cpu:gloo,cuda:nccl' (torch.distributed's syntax)."""
        if value is None:
            return value
        for part in value.split(","):
            device, _, backend = part.rpartition(":")
            if backend not in _COLLECTIVE_BACKENDS or device not in ("", "cpu", "cuda", "npu"):
                raise ValueError(f"{value!r} is not a torch.distributed backend: use one of "
                                 f"{sorted(_COLLECTIVE_BACKENDS)}, or device:backend pairs such as 'cpu:gloo,cuda:nccl'")
        return value
    max_restarts: int = Field(
        1, ge=0, description="Times a run restarts its workers after one died (killed, out of memory, crashed): "
        "a fresh group resumes from the last checkpoint that verifies. 0: the run ends at the first death, "
        "with the command that resumes it.",
    )


class SimulatorSection(_Section):
    """The simulator pool that each worker's ``env_interact`` node drives."""

    name: str = Field("robosuite_lift", description="Registered simulator name.")
    env: dict[str, Any] = Field(
        default_factory=dict, description="Fields of the simulator's config dataclass (e.g. horizon)."
    )
    tasks: list[str] | str | None = Field(
        None, description="A task set: one policy trained over several tasks (each task's config is env with its "
        "'task' field set; env must not set task). A list of task names, or a task set the simulator names "
        "(metaworld: mt10, mt50, ml10_train, ml10_test). Every step draws initial states of every task, each "
        "environment is reset into its episode's task, observations carry the task id (obs/task_id) and the "
        "MLP policy a one-hot of it (docs/simulators.md). null: the one task of env.",
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

    @model_validator(mode="after")
    def _check_env(self) -> SimulatorSection:
        self.env_config()
        return self

    def env_config(self) -> Any:
        """The simulator's typed config (its ``config_class``) built from ``env``; with a task
        set, the first task's.

        Raises:
            ComponentConfigError: an unknown simulator, or an ``env`` the config class rejects
                (the error names the field, e.g. ``simulator.env.task``), or a bad task set.
        """
        from simulators.registry import SIMULATORS

        _check_name(SIMULATORS, self.name, "simulator.name")
        config_class = SIMULATORS.get(self.name).config_class
        if self.tasks is None:
            return build_config(config_class, self.env, "simulator.env")
        configs = [build_config(config_class, env, f"simulator.tasks[{i}]") for i, env in enumerate(self.task_envs())]
        return configs[0]

    @property
    def multi_task(self) -> bool:
        """Whether the simulator hosts a task set (``tasks`` is set)."""
        return self.tasks is not None

    def task_names(self) -> list[str]:
        """The tasks: the task set's names in order, or the one task of ``env`` (its config's
        ``task_name``, e.g. ``Lift``)."""
        if self.tasks is None:
            return [self.env_config().task_name]
        return list(_resolve_task_set(self.name, self.tasks))

    def task_envs(self) -> list[dict[str, Any]]:
        """One ``env`` mapping per task of the task set: ``env`` with ``task`` set (``[env]`` without one).

        Raises:
            ComponentConfigError: ``tasks`` names an unknown task set, is empty or repeats a task;
                ``env`` sets ``task`` (or ``instruction``) beside a task set; or the simulator's
                config has no ``task`` field.
        """
        if self.tasks is None:
            return [dict(self.env)]
        from simulators.registry import SIMULATORS
        from vla_rl.components import config_fields

        config_class = SIMULATORS.get(self.name).config_class
        if "task" not in config_fields(config_class):
            raise ComponentConfigError("simulator.tasks", f"simulator {self.name!r} has no 'task' setting "
                                       f"({config_class.__name__}), so it cannot host a task set")
        for field in ("task", "instruction"):
            if field in self.env:
                raise ComponentConfigError(f"simulator.env.{field}", "each task of simulator.tasks sets its own; "
                                           f"remove simulator.env.{field} (or simulator.tasks)")
        return [{**self.env, "task": task} for task in _resolve_task_set(self.name, self.tasks)]


def _resolve_task_set(simulator: str, tasks: list[str] | str) -> tuple[str, ...]:
    """The task names of ``simulator.tasks``: the list itself, or the named set of the simulator
    (its class's ``task_sets``)."""
    from simulators.registry import SIMULATORS

    if isinstance(tasks, str):
        sets = getattr(SIMULATORS.get(simulator), "task_sets", {})
        if tasks not in sets:
            raise ComponentConfigError("simulator.tasks", f"unknown task set {tasks!r} of simulator {simulator!r} "
                                       f"(known: {', '.join(sets) or 'none'}); or give a list of task names")
        return tuple(sets[tasks])
    if not tasks or len(set(tasks)) != len(tasks):
        raise ComponentConfigError("simulator.tasks", f"must name at least one task, each once; got {tasks}")
    return tuple(tasks)


class DataSection(_Section):
    """The task list (initial-state ids, sharded across workers) and the group size of both workflows."""

    num_train_init_states: int = Field(
        100_000, ge=1, description="Training initial states are ids 0..N-1 (each id seeds a reset)."
    )
    init_states_per_step: int = Field(8, ge=1, description="Groups per step (global, all workers).")
    group_size: int = Field(
        8, ge=1, description="Rollouts per group: episodes per initial state, or responses per prompt (text).")


ENV_DERIVED_POLICY_FIELDS: tuple[str, ...] = ("obs_dim", "action_dim", "num_tasks")
"""Policy config fields set from the simulator: its observation and action spaces, and the number
of tasks of its task set (``simulator.tasks``; 0 without one)."""


#: Default LoRA targets: every attention and MLP projection of the Llama/Qwen2 decoders and the
#: SigLIP towers (OpenVLA's LoRA fine-tuning adapts all linear layers).
DEFAULT_LORA_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "out_proj", "gate_proj", "up_proj",
                                         "down_proj")


class LoraSection(_Section):
    """LoRA adapters (Hu et al. 2021, arXiv:2106.09685) injected with peft into the policy's linear
    layers when the policy is built: only the adapters (and ``trainable_modules``) train.

    Supported by the OpenVLA and OpenVLA-OFT policies and the text workflow's causal LM; the
    parameters a policy freezes itself (the vision towers' unused last block) get no adapter.
    """

    rank: int = Field(32, ge=1, description="LoRA rank r (OpenVLA's fine-tuning uses 32).")
    alpha: float | None = Field(
        None, gt=0, description="LoRA scaling numerator: the update is (alpha / rank) * B A (null: min(rank, 16), "
        "OpenVLA's choice).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input.")
    target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_LORA_TARGETS), min_length=1,
        description="Names (last component, e.g. q_proj) of the linear layers that get an adapter; a name no layer "
        "of the policy has is an error when the policy is built.")
    trainable_modules: list[str] = Field(
        default_factory=list, description="Submodules of the policy trained fully besides the adapters, by attribute "
        "name (e.g. [proprio_projector] for OpenVLA-OFT's proprio projector); everything else is frozen.")

    @field_validator("target_modules", "trainable_modules")
    @classmethod
    def _check_names(cls, names: list[str]) -> list[str]:
        bad = [name for name in names if not name or not name.replace("_", "").replace(".", "").isalnum()]
        if bad:
            raise ValueError(f"module names must be non-empty identifiers such as q_proj, got {bad}")
        return names


class PolicySection(_Section):
    """The policy: a registered name and the fields of its config class."""

    name: str = Field("mlp", description="Registered policy name.")
    config: dict[str, Any] = Field(
        default_factory=dict, description="Fields of the policy's config class; its observation and action "
        f"sizes ({', '.join(ENV_DERIVED_POLICY_FIELDS)}) come from the simulator.",
    )
    allow_partial_load: bool = Field(
        False, description="Accept a pretrained checkpoint (policy.config.model_path, text.model_path) whose weight "
        "names or shapes do not match the architecture: the parameters it does not cover keep their "
        "initialisation. Off: such a checkpoint is an error naming the first few tensors.",
    )
    lora: LoraSection | None = Field(
        None, description="LoRA adapters for the policy (OpenVLA, OpenVLA-OFT, the text workflow's causal LM); null: "
        "every parameter trains (docs/large_policies.md).")

    @model_validator(mode="after")
    def _check_config(self) -> PolicySection:
        self.policy_config()
        return self

    def policy_config(self, **from_env: int) -> Any:
        """The policy's typed config (its ``config_class``) built from ``config``.

        Args:
            from_env: the simulator's sizes (``obs_dim``, ``action_dim``, ``num_tasks``) for the
                fields of :data:`ENV_DERIVED_POLICY_FIELDS` the config class declares; omitted (when
                a template loads, before any simulator exists) they take the field's default, or 1.

        Raises:
            ComponentConfigError: an unknown policy, an ``env``-derived field set in ``config``,
                or a ``config`` the config class rejects (the error names the field).
        """
        from policies import POLICIES, available_policies
        from vla_rl.components import config_fields

        available_policies()  # registers the built-in policies
        _check_name(POLICIES, self.name, "policy.name")
        config_class = POLICIES.get(self.name).config_class
        declared = config_fields(config_class)
        for field in ENV_DERIVED_POLICY_FIELDS:
            if field in self.config and field in declared:
                raise ComponentConfigError(f"policy.config.{field}", "is set from the simulator's spaces; remove it")
        defaults = {f.name: f.default for f in dataclasses.fields(config_class)
                    if f.default is not dataclasses.MISSING}
        sizes = {field: from_env.get(field, defaults.get(field, 1))
                 for field in ENV_DERIVED_POLICY_FIELDS if field in declared}
        return build_config(config_class, {**sizes, **self.config}, "policy.config")

    def without_action_distribution(self) -> tuple[str, str] | None:
        """Why the policy has no distribution over its actions (a deterministic head: no sampling,
        no log-probs), or None when it has one (:meth:`policies.base.Policy.without_action_distribution`).

        Returns:
            ``("policy.config.<field>", reason)`` or None.
        """
        from policies import POLICIES

        policy_config = self.policy_config()
        problem = POLICIES.get(self.name).without_action_distribution(policy_config)
        return None if problem is None else (f"policy.config.{problem[0]}", problem[1])


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
    prompt_format: Literal["chat", "raw"] = Field(
        "chat", description="'chat': prompts go through the tokenizer's chat template (which must exist); 'raw': "
        "the messages' contents are encoded as they are (base models without a chat template)."
    )
    allow_pickle: bool = Field(
        False, description="Accept pytorch_model.bin weights (torch's pickle format, which can run code when "
        "loaded) in model_path when it has no safetensors; off: such a directory is refused."
    )
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


#: The ``algorithm`` fields that select a registered component, and where its registry lives.
#: Each component's settings are the mapping ``algorithm.<component name>`` (e.g.
#: ``algorithm.gae: {gamma: 0.99, lam: 0.95}``), validated by the config class registered with it.
ALGORITHM_COMPONENTS: dict[str, tuple[str, str]] = {
    "reward": ("vla_rl.algorithms.rewards", "EMBODIED_REWARDS"),
    "trajectory_encoder": ("vla_rl.rewards.trajectory_encoders", "TRAJECTORY_ENCODERS"),
    "adv_estimator": ("vla_rl.algorithms.advantages", "ADVANTAGE_ESTIMATORS"),
    "policy_loss": ("vla_rl.algorithms.policy_loss", "POLICY_LOSSES"),
}


def component_registry(kind: str):
    """The registry of an ``algorithm`` component kind (:data:`ALGORITHM_COMPONENTS`), imported lazily."""
    module, attribute = ALGORITHM_COMPONENTS[kind]
    return getattr(importlib.import_module(module), attribute)


class AlgorithmSection(_Section):
    """Rewards, advantages, group filters and the policy objective (names resolve in
    ``vla_rl.algorithms``; docs/algorithms.md lists them with their sources).

    The settings of the selected reward, trajectory encoder, advantage estimator and policy
    loss live with those components: ``algorithm.<name>`` is a mapping validated by the config
    class the component registered (``algorithm.ppo_clip.clip_ratio_high=0.28``,
    ``algorithm.gae.lam=0.95``, ``algorithm.srpo.dbscan_eps=0.5``); :meth:`options` returns it.
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True, allow_inf_nan=False)

    reward: str = Field("srpo", description="Embodied reward: 'srpo' (progress) or 'success' (binary).")
    trajectory_encoder: str = Field(
        "state_resample",
        description="Trajectory encoder of rewards that embed episodes (SRPO): 'state_resample' (the simulator "
        "state), 'policy_backbone' (the policy's own vision backbone on camera frames) or 'vjepa2' (a V-JEPA 2 "
        "video model from a local directory: algorithm.vjepa2.model_dir).",
    )
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
    def _check_components(self) -> AlgorithmSection:
        if self.loss_agg_normalizer is not None and self.loss_agg_mode != "seq-mean-token-sum-norm":
            raise ValueError("algorithm.loss_agg_normalizer is the constant of loss_agg_mode "
                             f"'seq-mean-token-sum-norm' (loss_agg_mode is {self.loss_agg_mode!r}); set it to null")
        registries = {kind: component_registry(kind) for kind in ALGORITHM_COMPONENTS}
        for kind, registry in registries.items():
            _check_name(registry, getattr(self, kind), f"algorithm.{kind}")
        for name in ("kl_loss_type", "kl_penalty"):
            _check_name(_kl_estimators(), getattr(self, name), f"algorithm.{name}")
        _check_name(_loss_agg_modes(), self.loss_agg_mode, "algorithm.loss_agg_mode")
        for name, options in (self.model_extra or {}).items():
            owners = [registry for registry in registries.values() if name in registry]
            if not owners:
                components = sorted(str(n) for registry in registries.values() for n in registry.names())
                raise ComponentConfigError(
                    f"algorithm.{name}", f"unknown key; allowed: {', '.join(type(self).model_fields)}, or the "
                    f"settings of a component: {', '.join(components)}")
            config_class = owners[0].config_class(name)
            if config_class is None:
                raise ComponentConfigError(f"algorithm.{name}", f"{owners[0].kind} {name!r} takes no settings")
            if not isinstance(options, dict):
                raise ComponentConfigError(f"algorithm.{name}", f"must be a mapping of {config_class.__name__} "
                                           f"settings, got {options!r}")
            build_config(config_class, options, f"algorithm.{name}")
        for kind in ALGORITHM_COMPONENTS:  # the selected components' settings, defaults included
            self.options(kind)
        return self

    def options(self, kind: str) -> Any:
        """The typed settings of the component selected for ``kind`` (``"adv_estimator"``,
        ``"policy_loss"``, ``"reward"``, ``"trajectory_encoder"``): its config class built from
        ``algorithm.<name>`` (defaults where absent); None for a component without settings."""
        name = getattr(self, kind)
        config_class = component_registry(kind).config_class(name)
        if config_class is None:
            return None
        return build_config(config_class, (self.model_extra or {}).get(name), f"algorithm.{name}")


def _check_name(registry, name: str, field: str) -> None:
    if name not in registry:
        raise ComponentConfigError(field, f"unknown {registry.kind} {name!r}; known: "
                                   f"{', '.join(str(n) for n in registry.names())}")


def _check_lora_support(policy_name: str) -> None:
    """Raise naming ``policy.lora`` when the embodied policy ``policy_name`` cannot take LoRA adapters."""
    from policies import POLICIES, available_policies

    available_policies()
    cls = POLICIES.get(policy_name)
    if not callable(getattr(cls, "apply_lora", None)):
        supported = sorted(name for name in POLICIES.names() if callable(getattr(POLICIES.get(name), "apply_lora", None)))
        raise ComponentConfigError("policy.lora", f"the {policy_name!r} policy takes no LoRA adapters; policies that "
                                   f"do: {', '.join(supported)} (and the text workflow's causal LM)")


def _kl_estimators():
    from vla_rl.algorithms.kl import KL_ESTIMATORS

    return KL_ESTIMATORS


def _loss_agg_modes():
    from vla_rl.algorithms.aggregation import LOSS_AGG_MODES

    return LOSS_AGG_MODES


class CriticSection(_Section):
    """The value network of templates with a critic (PPO with GAE)."""

    hidden_sizes: list[int] = Field(default_factory=lambda: [256, 256], description="Hidden layer widths.")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate of the critic.")
    cliprange_value: float | None = Field(
        0.5, gt=0, description="Value clipping around the rollout-time values (null: plain squared error)."
    )
    loss_agg_mode: str = Field("token-mean", description="Aggregation of the value loss over decision steps.")

    @model_validator(mode="after")
    def _check_mode(self) -> CriticSection:
        _check_name(_loss_agg_modes(), self.loss_agg_mode, "critic.loss_agg_mode")
        return self


class FSDPSection(_Section):
    """Settings of ``trainer.strategy: fsdp`` (torch FSDP2, ``torch.distributed.fsdp.fully_shard``)."""

    master_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype of the sharded parameters (the master weights) and of the optimizer state; "
        "the policy the rollout uses keeps its own dtype (policy.config.dtype, text.dtype) and is refreshed from the "
        "master weights after every update.")
    reduce_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype gradients are reduce-scattered in under mixed precision (MixedPrecisionPolicy's "
        "reduce_dtype).")
    reshard_after_forward: bool = Field(
        True, description="Free each block's gathered parameters after its forward pass and gather them again for the "
        "backward pass (ZeRO-3); false keeps them between the passes (ZeRO-2: less communication, more memory).")
    sync_every_micro_batch: bool = Field(
        True, description="With trainer.micro_batch_size: reduce-scatter the gradients after every micro-batch, "
        "accumulating sharded gradients (the memory of one shard). false: accumulate unsharded gradients and reduce "
        "once per minibatch (set_requires_gradient_sync(False) before the last micro-batch; less communication, the "
        "memory of the whole model's gradients).")


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
    max_skipped_updates: int = Field(
        3, ge=1, description="An update whose gradient norm is not finite (a diverged loss) is skipped and "
        "counted in actor/skipped_updates; after this many in a row the run stops with a message.",
    )
    save_every: int = Field(5, ge=1, description="Checkpoint every k steps (and at the end).")
    keep_last: int = Field(2, ge=1, description="Checkpoints kept on disk.")
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="How the actor trains over the workers: 'ddp', the whole policy and its optimizer on every "
        "worker, gradients all-reduced; 'fsdp', torch FSDP2 (fully_shard): parameters, gradients and optimizer state "
        "sharded over the workers, the policy's blocks all-gathered one at a time, sharded checkpoints "
        "(torch.distributed.checkpoint). docs/large_policies.md.")
    mixed_precision: Literal["auto", "bf16", "none"] = Field(
        "auto", description="fsdp only: the dtype the blocks compute in. 'bf16': parameters all-gathered and computed "
        "in bfloat16, sharded master weights and optimizer state in trainer.fsdp.master_dtype, gradients reduced in "
        "trainer.fsdp.reduce_dtype; needs an accelerator (refused on CPU workers). 'none': the master dtype throughout. "
        "'auto': bf16 on CUDA/NPU workers, none on the CPU.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute the policy's blocks' activations in the backward pass instead of keeping them "
        "(transformers' gradient checkpointing for Hugging Face models, torch.utils.checkpoint around the policy's "
        "blocks otherwise): less memory, about one more forward pass of compute.")
    micro_batch_size: int | None = Field(
        None, ge=1, description="Samples per forward/backward pass on a worker (gradient accumulation): each "
        "minibatch's gradient is accumulated over micro-batches of at most this many samples, scaled so that the "
        "update equals the whole minibatch's (exact for every loss_agg_mode). null: the whole minibatch at once.")
    fsdp: FSDPSection = Field(default_factory=lambda: FSDPSection())


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
        default_factory=list, description="vla-rl eval: checkpoint directories (filled in by the command); empty: "
        "the live policy of a training run."
    )
    store_episodes: bool = Field(
        False, description="Append every evaluation episode to zarr stores (vla-rl eval: on, which lets an "
        "interrupted evaluation continue and its videos replay stored episodes); off in training runs."
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
        num_tasks = len(self.simulator.task_names()) if self.simulator.multi_task else 1
        if self.run.workflow == "embodied" and self.data.init_states_per_step % num_tasks:
            raise ValueError(f"data.init_states_per_step ({self.data.init_states_per_step}) must be a multiple of the "
                             f"{num_tasks} tasks of simulator.tasks: every step draws as many initial states of each task")
        trainer = self.trainer
        if trainer.mixed_precision == "bf16" and trainer.strategy != "fsdp":
            raise ValueError("trainer.mixed_precision bf16 needs trainer.strategy fsdp (DDP trains in the policy's own "
                             "dtype); use trainer.mixed_precision=auto")
        if trainer.mixed_precision == "bf16" and self.workers.device == "cpu":
            raise ValueError("trainer.mixed_precision bf16 needs accelerator workers (workers.device cuda, npu or auto): "
                             "CPU workers train in float32; use trainer.mixed_precision=auto, which picks bf16 on "
                             "accelerators and float32 on the CPU")
        if self.policy.lora is not None and self.run.workflow == "embodied":
            _check_lora_support(self.policy.name)
        if self.policy.lora is not None and self.run.workflow == "text" and self.text.rollout_backend == "vllm":
            raise ValueError("policy.lora with text.rollout_backend vllm: the vLLM engine loads the policy's weights by "
                             "name and knows no LoRA adapters; use text.rollout_backend=hf with LoRA")
        if self.data.num_train_init_states < self.data.init_states_per_step:
            raise ValueError(
                "data.num_train_init_states must be at least data.init_states_per_step "
                f"({self.data.num_train_init_states} < {self.data.init_states_per_step})"
            )
        return self
