"""The global run configuration of a DAG template (its ``config:`` section), validated with pydantic.

Every section forbids unknown keys, so a typo in a template or a dotted override
(``trainer.total_steps=5``) is an error naming the field, never a silently ignored value.
Defaults live here and only here; runtime code reads attributes, never ``.get(key, default)``.
Per-node settings (the ``config:`` of one DAG node) are validated by the model that the node's
registered function declares (see :mod:`vla_rl.dag.registry`).

One module per group of sections, :class:`RunConfig` (which checks what spans sections) here:

- :mod:`~vla_rl.config.sections`: ``run``, ``workers``, ``data``, ``eval``
- :mod:`~vla_rl.config.simulator`: ``simulator`` and its task sets
- :mod:`~vla_rl.config.policy`: ``policy`` (with ``policy.lora``), ``warm_start``
- :mod:`~vla_rl.config.text`: ``text``
- :mod:`~vla_rl.config.algorithm`: ``algorithm`` (with ``algorithm.kl_ctrl``), ``critic``
- :mod:`~vla_rl.config.trainer`: ``trainer`` (with ``trainer.fsdp``)
- :mod:`~vla_rl.config.base`: the base every section derives from
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from vla_rl.config.algorithm import (
    ALGORITHM_COMPONENTS,
    AlgorithmSection,
    CriticSection,
    KLControlSection,
    component_registry,
)
from vla_rl.config.base import _Section
from vla_rl.config.policy import (
    ENV_DERIVED_POLICY_FIELDS,
    LoraSection,
    PolicySection,
    WarmStartSection,
    _check_lora_support,
    takes_lora,
)
from vla_rl.config.sections import DataSection, EvalSection, RunSection, WorkersSection
from vla_rl.config.simulator import SimulatorSection
from vla_rl.config.text import TextSection
from vla_rl.config.trainer import FSDPSection, TrainerSection
from vla_rl_core.components import ComponentConfigError

__all__ = [
    "ALGORITHM_COMPONENTS", "EMBODIED_ONLY_SETTINGS", "ENV_DERIVED_POLICY_FIELDS",
    "AlgorithmSection", "CriticSection", "DataSection", "EvalSection", "FSDPSection", "KLControlSection",
    "LoraSection", "PolicySection", "RunConfig", "RunSection", "SimulatorSection", "TextSection", "TrainerSection",
    "WarmStartSection", "WorkersSection",
    "component_registry",
]


MAX_SAMPLES_PER_STEP = 1_000_000
"""The most samples (episodes, responses) a step may roll out over all workers: over a hundred
times a large GRPO step (the DAPO recipe of verl: 512 prompts x 16 responses). Planning holds a
list entry per sample for its re-shard estimate: 10**8 did not finish."""

#: Settings only the embodied workflow reads, with what a text run reads instead. A text run
#: refuses them, and an embodied run refuses every ``text.`` setting (:meth:`RunConfig._check_workflow_settings`):
#: ignored, ``policy.config.model_path`` trained the tiny model built in the run directory.
EMBODIED_ONLY_SETTINGS: dict[str, str] = {
    "simulator": "a text run has no simulator",
    "warm_start": "a text run warm-starts by supervised fine-tuning: text.sft_steps and the other text.sft_ settings",
    "policy.name": "a text run's policy is the causal LM of text.model_path",
    "policy.config": "a text run's causal LM is set by text.model_path, text.dtype, text.temperature, "
    "text.max_prompt_length and text.max_response_length",
    "data.init_states_per_step": "prompts per step are text.prompts_per_step",
    "data.num_train_init_states": "a text run's prompts are the rows of text.train_file",
    "trainer.total_env_steps": "a text run simulates nothing; stop it with trainer.total_steps",
    "algorithm.reward": "a text run scores responses with the rule verifiers (text.correct_score, "
    "text.format_score)",
    "algorithm.trajectory_encoder": "it embeds embodied episodes for SRPO's reward",
    "critic.hidden_sizes": "a text run's critic is the language model's body with a value head",
    "eval.temperature": "a text run's 'sampled' protocol samples at text.temperature",
    "eval.init_state_offset": "a text run evaluates the rows of text.test_file",
    **{f"eval.{name}": "vla-rl eval evaluates embodied runs only"
       for name in ("benchmark", "tasks", "checkpoints", "store_episodes")},
    **{f"eval.{name}": "a text run records no videos"
       for name in ("video_episodes", "video_camera", "video_size", "video_fps")},
}


def _set_settings(data: dict, path: str) -> list[str]:
    """The dotted paths of the settings at or under ``path`` (a section, or a setting) that the raw
    config ``data`` sets, down to each mapping's leaves (``simulator.env.horizon``; an empty
    mapping sets nothing)."""
    value: Any = data
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return []
        value = value[part]
    if isinstance(value, dict):
        return [f"{path}.{name}" for key in value for name in _set_settings(value, key)]
    return [path]


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

    def parameter_dtype(self) -> tuple[str, str]:
        """The field that sets the dtype the policy's parameters are loaded in, and its value:
        ``text.dtype`` in a text run, else ``policy.config.dtype`` (``float32`` for a policy
        without one: the MLP)."""
        if self.run.workflow == "text":
            return "text.dtype", self.text.dtype
        return "policy.config.dtype", str(getattr(self.policy.policy_config(), "dtype", "float32"))

    def unread_settings(self) -> dict[str, str]:
        """``{dotted setting: why}`` for the settings this config holds that the run never reads and
        a template may still carry (the settings of an algorithm component it does not select:
        :meth:`AlgorithmSection.unselected_settings`; the KL loss's and the KL penalty's while they
        are off; the text section's own (:meth:`TextSection.unread_settings`); the minibatch size under a number
        of minibatches; FSDP's under DDP, and its micro-batch sync without micro-batches);
        :func:`vla_rl.dag.loader.load_template` refuses an override that sets one."""
        algorithm, trainer = self.algorithm, self.trainer
        unread = algorithm.unselected_settings()
        for switch, names in (("use_kl_loss", ("kl_loss_coef", "kl_loss_type")),
                              ("use_kl_in_reward", ("kl_penalty", "kl_ctrl"))):
            if not getattr(algorithm, switch):
                unread |= {f"algorithm.{name}": f"read only with algorithm.{switch}=true (and a reference node), "
                           f"which is false: set it too, or drop the override" for name in names}
        unread |= self._unread_evaluation_settings() | self._unread_warm_start_settings()
        if self.run.workflow == "text":
            unread |= self.text.unread_settings()
        if trainer.ppo_num_mini_batches is not None:
            unread["trainer.ppo_mini_batch_size"] = (
                f"replaced by trainer.ppo_num_mini_batches ({trainer.ppo_num_mini_batches}): set that to null too, "
                "or drop the override")
        if trainer.strategy != "fsdp":
            unread["trainer.fsdp"] = (f"read only with trainer.strategy=fsdp, and it is {trainer.strategy!r}: set it "
                                      "too, or drop the override")
        elif trainer.micro_batch_size is None:
            unread["trainer.fsdp.sync_every_micro_batch"] = (
                "read only with micro-batches (trainer.micro_batch_size), which is null: each minibatch is one "
                "backward pass; set trainer.micro_batch_size too, or drop the override")
        return unread

    def _unread_evaluation_settings(self) -> dict[str, str]:
        """Every ``eval.`` setting without episodes (``eval.num_episodes: 0``), and the sampled
        protocol's temperature without that protocol."""
        ev = self.eval
        if ev.num_episodes == 0:
            return {f"eval.{name}": "no evaluation runs with eval.num_episodes=0: give it episodes too, or drop the override"
                    for name in type(ev).model_fields if name != "num_episodes"}
        if "sampled" not in ev.protocols:
            return {"eval.temperature": f"read only by the 'sampled' protocol, and eval.protocols is {ev.protocols}: "
                    "add it, or drop the override"}
        return {}

    def _unread_warm_start_settings(self) -> dict[str, str]:
        """Behaviour cloning's settings without demonstrations (``warm_start.num_demos: 0``), the
        scripted expert's when a dataset is cloned instead, and the dataset's key map without one."""
        ws = self.warm_start
        if ws.num_demos == 0:
            return {f"warm_start.{name}": "read only with demonstrations to clone, and warm_start.num_demos is 0: give "
                    "it demonstrations too, or drop the override"
                    for name in ("bc_steps", "bc_lr", "bc_batch_size", "demo_init_state_offset", "demo_store",
                                 "dataset", "dataset_keys")}
        if ws.dataset is not None:
            return {f"warm_start.{name}": f"read only by the scripted expert's demonstrations, and warm_start.dataset "
                    f"({ws.dataset}) is cloned instead: drop the override"
                    for name in ("demo_init_state_offset", "demo_store")}
        return {"warm_start.dataset_keys": "read only with warm_start.dataset, which is unset: set it too, or drop "
                "the override"}

    def low_precision_trained(self) -> tuple[str, str] | None:
        """``(field, dtype)`` of :meth:`parameter_dtype` when the policy's parameters are not
        float32 and training updates some of them: no LoRA (``policy.lora``), or LoRA with
        ``trainable_modules``, which train in the policy's dtype; None otherwise (float32
        parameters, or float32 LoRA adapters alone)."""
        field, dtype = self.parameter_dtype()
        lora = self.policy.lora
        if dtype == "float32" or (lora is not None and not lora.trainable_modules):
            return None
        return field, dtype

    def lora_way_out(self) -> str:
        """How the run could train float32 LoRA adapters instead, for refusals: '' for a policy
        that takes none."""
        if not self.takes_lora():
            return ""
        if self.policy.lora is not None:
            return ("LoRA adapters alone (policy.lora.trainable_modules=[]: the modules it lists train in the "
                    "policy's dtype)")
        return "LoRA adapters (policy.lora, float32)"

    def takes_lora(self) -> bool:
        """Whether the run's policy takes LoRA adapters (``policy.lora``): the text workflow's causal
        LM does, and the embodied policies with an ``apply_lora`` (OpenVLA, OpenVLA-OFT)."""
        return self.run.workflow == "text" or takes_lora(self.policy.name)

    @model_validator(mode="before")
    @classmethod
    def _check_workflow_settings(cls, data: Any) -> Any:
        """A setting the run's workflow never reads is refused, naming what it reads instead
        (:data:`EMBODIED_ONLY_SETTINGS`; ``text.`` in an embodied run). Checked on the template's
        own keys, before the sections validate: a text run's ``policy.config`` would otherwise be
        refused as the MLP policy's."""
        if not isinstance(data, dict):
            return data
        run = data.get("run")
        workflow = run.get("workflow", "embodied") if isinstance(run, dict) else "embodied"
        if workflow == "text":
            for path, instead in EMBODIED_ONLY_SETTINGS.items():
                for name in _set_settings(data, path):
                    raise ComponentConfigError(name, f"read by embodied runs only (run.workflow: embodied), and this "
                                               f"is a text run: {instead}")
            algorithm = data.get("algorithm")
            for kind in ("reward", "trajectory_encoder"):  # their components' settings: algorithm.srpo.dbscan_eps
                for name in (algorithm if isinstance(algorithm, dict) else ()):
                    if name in component_registry(kind):
                        instead = EMBODIED_ONLY_SETTINGS[f"algorithm.{kind}"]
                        raise ComponentConfigError(f"algorithm.{name}", f"the settings of the embodied {kind} "
                                                   f"{name!r}; a text run has none: {instead}")
        elif workflow == "embodied":
            for name in _set_settings(data, "text"):
                raise ComponentConfigError(name, "read by text runs only (run.workflow: text), and this is an embodied "
                                           "run: its policy, data and evaluation are set in the sections policy, "
                                           "data, simulator and eval")
        return data

    @model_validator(mode="after")
    def _check_shards(self) -> RunConfig:
        text = self.text
        groups, what = ((text.prompts_per_step, "text.prompts_per_step") if self.run.workflow == "text" else
                        (self.data.init_states_per_step, "data.init_states_per_step"))
        if groups * self.data.group_size > MAX_SAMPLES_PER_STEP:
            raise ValueError(f"{what} x data.group_size = {groups} x {self.data.group_size} samples per step, more "
                             f"than the {MAX_SAMPLES_PER_STEP:,} a run can roll out in a step")
        if self.run.workflow == "text" and text.prompts_per_step % self.workers.num_workers:
            raise ValueError(f"text.prompts_per_step ({text.prompts_per_step}) must be a multiple of "
                             f"workers.num_workers ({self.workers.num_workers}): each worker reads its own prompts")
        num_tasks = len(self.simulator.task_names()) if self.simulator.multi_task else 1
        if self.run.workflow == "embodied" and self.data.init_states_per_step % num_tasks:
            raise ValueError(f"data.init_states_per_step ({self.data.init_states_per_step}) must be a multiple of the "
                             f"{num_tasks} tasks of simulator.tasks: every step draws as many initial states of each task")
        trainer = self.trainer
        if trainer.mixed_precision == "bf16" and self.workers.device == "cpu":
            raise ValueError("trainer.mixed_precision bf16 needs accelerator workers (workers.device cuda, npu or auto): "
                             "CPU workers train in float32; use trainer.mixed_precision=auto, which picks bf16 on "
                             "accelerators and float32 on the CPU")
        if self.policy.lora is not None and self.run.workflow == "embodied":
            _check_lora_support(self.policy.name)
        if self.data.num_train_init_states < self.data.init_states_per_step:
            raise ValueError(
                "data.num_train_init_states must be at least data.init_states_per_step "
                f"({self.data.num_train_init_states} < {self.data.init_states_per_step})"
            )
        return self

    @model_validator(mode="after")
    def _check_held_out_states(self) -> RunConfig:
        """The held-out evaluation's initial states (ids ``eval.init_state_offset + i``) are not
        training's (ids ``0 .. data.num_train_init_states - 1``): the report would hold episodes
        of states the policy was trained on."""
        ev, data = self.eval, self.data
        if self.run.workflow != "embodied" or ev.num_episodes == 0:
            return self
        if ev.init_state_offset < data.num_train_init_states:
            raise ComponentConfigError(
                "eval.init_state_offset",
                f"{ev.init_state_offset} makes the held-out evaluation's initial states (ids {ev.init_state_offset}.."
                f"{ev.init_state_offset + ev.num_episodes - 1}) training's (ids 0..{data.num_train_init_states - 1}, "
                "data.num_train_init_states); start it at data.num_train_init_states or above")
        return self

    @model_validator(mode="after")
    def _check_fsdp_collectives(self) -> RunConfig:
        """FSDP on accelerator workers needs the accelerator's own backend for their tensors:
        FSDP2's all-gathers and reduce-scatters of CUDA tensors over gloo kill the workers with a
        segmentation fault (pytorch/pytorch#132471; on one H200, 2026-12-04, two workers sharing
        it over gloo died so at their first update). ``workers.device: auto`` is checked by the
        workers, which read the run's config with the device they bound."""
        device = self.workers.device
        if self.trainer.strategy != "fsdp" or device not in ("cuda", "npu"):
            return self
        if self.workers.tensor_backend(device) == "gloo":
            default = {"cuda": "nccl", "npu": "hccl"}[device]
            raise ComponentConfigError(
                "workers.collective_backend",
                f"{self.workers.collective_backend!r} reduces {device} tensors with gloo, on which trainer.strategy "
                f"fsdp crashes (a segmentation fault: pytorch/pytorch#132471); leave it null ('cpu:gloo,{device}:"
                f"{default}') with a whole accelerator per worker (workers.gpus_per_worker=1), or use "
                "trainer.strategy=ddp to share one accelerator over gloo")
        return self

    @model_validator(mode="after")
    def _check_accelerator_sharing(self) -> RunConfig:
        """Several NCCL (or HCCL) ranks on one accelerator (``workers.gpus_per_worker`` below 1)
        are refused with the template when the device is explicit (it failed after the run
        directory and Ray, as a traceback); ``auto`` is checked once the device has resolved."""
        problem = self.workers.accelerator_sharing_problem(self.workers.device, self.workers.num_workers)
        if problem is not None:
            raise ComponentConfigError("workers.gpus_per_worker", problem)
        return self

    @model_validator(mode="after")
    def _check_text_only_settings(self) -> RunConfig:
        """Settings about text responses are refused in embodied runs, where they would mean
        something else: an episode at its time limit (``truncated``) is a failure the loss learns from."""
        if self.run.workflow != "text" and self.algorithm.mask_truncated_responses:
            raise ComponentConfigError("algorithm.mask_truncated_responses", "applies to text responses (run.workflow: "
                                       "text); an embodied episode that reaches its time limit is a failure the loss "
                                       "must see")
        return self

    @model_validator(mode="after")
    def _check_cameras(self) -> RunConfig:
        """An embodied policy's cameras (``policy.config.cameras``: it reads ``<camera>_image`` of
        each) are among those the simulator renders (``simulator.env.cameras``); without this the
        workers would find out at their first rollout, after building their simulators."""
        if self.run.workflow != "embodied":
            return self
        wanted = tuple(getattr(self.policy.policy_config(), "cameras", None) or ())
        rendered = tuple(getattr(self.simulator.env_config(), "cameras", None) or ())
        missing = [camera for camera in wanted if camera not in rendered]
        if missing:
            raise ComponentConfigError("policy.config.cameras", f"the policy reads {missing}, which the simulator "
                                       f"does not render (simulator.env.cameras: {list(rendered)}); add them to "
                                       "simulator.env.cameras, or give the policy the simulator's cameras")
        return self
