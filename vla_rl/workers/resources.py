"""A DAG worker's long-lived objects, built once and shared by the node functions it runs.

Composition, not role flags: the worker owns one ``WorkerResources``; node functions take what
they need from it (the simulator pool for ``env_interact``, the actor trainer for
``model_train``...). Each object is built on first use.
"""

from __future__ import annotations

import dataclasses
import math
from functools import cached_property
from pathlib import Path

import torch
import torch.distributed as dist

from vla_rl.config import RunConfig


class WorkerResources:
    """Per-worker state.

    Args:
        config: the run config.
        rank: worker rank; world_size: number of DAG workers.
        run_dir: the run directory (checkpoints, demonstrations, videos).
        device: the torch device the worker is bound to.
        rollout_dp_size: DP size of the template's ``env_interact`` node (sets pool capacity).
        group: the workers' process group.
    """

    def __init__(
        self,
        config: RunConfig,
        rank: int,
        world_size: int,
        run_dir: Path,
        device: torch.device,
        rollout_dp_size: int,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.run_dir = run_dir
        self.device = device
        self.rollout_dp_size = rollout_dp_size
        self.group = group
        #: Sampling and minibatch-shuffling RNG of this worker (saved in checkpoints).
        self.generator = torch.Generator().manual_seed(config.run.seed * 1_000_003 + rank)
        # Set by the worker once the policy is initialised (see DAGWorker.setup):
        self.actor = None  # the ActorTrainer
        self.reference = None  # frozen copy of the warm-start policy, for templates with a reference node
        self.critic = None  # the CriticTrainer, for templates with critic nodes
        self.kl_ctrl = None  # the KL-in-reward coefficient controller
        self._prompt_loaders: dict[tuple, object] = {}

    @property
    def episodes_per_step(self) -> int:
        """Training episodes this worker rolls out per step."""
        data = self.config.data
        return data.init_states_per_step // self.rollout_dp_size * data.group_size

    @property
    def eval_episodes(self) -> int:
        """Evaluation episodes per protocol on this worker (ids dealt round-robin over workers)."""
        return math.ceil(self.config.eval.num_episodes / self.world_size)

    @cached_property
    def simulator_pool(self):
        """This worker's simulator pool (Ray actors), sized for its training and eval episodes."""
        from simulators.pool import SimulatorPool

        sim = self.config.simulator
        capacity = max(self.episodes_per_step, self.eval_episodes, 1)
        return SimulatorPool(
            sim.name,
            sim.env,
            num_actors=sim.actors_per_worker,
            envs_per_actor=math.ceil(capacity / sim.actors_per_worker),
            actor_options={"num_cpus": sim.num_cpus_per_actor},
            step_timeout_s=sim.step_timeout_s,
        )

    @cached_property
    def env_spec(self) -> dict:
        """``obs_dim``, ``act_dim`` and ``horizon`` of the simulator."""
        return self.simulator_pool.spec()

    @property
    def batch_forward(self):
        """How the actor and the reference score a batch (:data:`vla_rl.trainers.actor.BATCH_FORWARDS`)."""
        from vla_rl.trainers.actor import BATCH_FORWARDS

        return BATCH_FORWARDS[self.config.run.workflow]

    @cached_property
    def text_assets(self):
        """The model and prompt files of a text run (:class:`~vla_rl.workers.text_assets.TextAssets`)."""
        from vla_rl.workers.text_assets import TextAssets

        return TextAssets.resolve(self.config, self.run_dir)

    def prompt_loader(self, dp_rank: int, dp_size: int, extra_columns: tuple[str, ...] = ()):
        """The :class:`~vla_rl.data.prompt_dataset.ShardedPromptLoader` of training shard
        ``dp_rank`` of ``dp_size``, reading ``extra_columns`` too (built once per shard layout;
        it reads only its row groups)."""
        from vla_rl.data.prompt_dataset import ShardedPromptLoader

        key = (dp_rank, dp_size, extra_columns)
        if key not in self._prompt_loaders:
            self._prompt_loaders[key] = ShardedPromptLoader(
                self.text_assets.train_file, self.config.text.prompts_per_step, dp_rank, dp_size,
                seed=self.config.run.seed, extra_columns=extra_columns,
            )
        return self._prompt_loaders[key]

    @cached_property
    def policy(self):
        """The policy: for ``run.workflow: text`` the causal LM of ``config.text``; otherwise built
        from ``config.policy`` with the simulator's dimensions."""
        if self.config.run.workflow == "text":
            return self._causal_lm()
        from policies import POLICIES, available_policies, make_policy

        available_policies()  # registers the built-in policies
        name = self.config.policy.name
        spec = self.env_spec
        config_class = POLICIES.get(name).config_class
        from_env = {"obs_dim": spec["obs_dim"], "action_dim": spec["act_dim"]}  # what the config declares of them
        declared = {f.name for f in dataclasses.fields(config_class)}
        fields = {key: tuple(v) if isinstance(v, list) else v for key, v in self.config.policy.config.items()}
        config = config_class(**{k: v for k, v in from_env.items() if k in declared}, **fields)
        return make_policy(name, config).to(self.device)

    @cached_property
    def trajectory_encoder(self):
        """SRPO's trajectory encoder (``algorithm.trajectory_encoder`` with its options), built
        once: ``policy_backbone`` reads the live policy's vision backbone (its ``frame_features``),
        ``vjepa2`` loads its model on this worker's device.

        Raises:
            ValueError: ``policy_backbone`` with a policy without a vision backbone.
        """
        from vla_rl.rewards.trajectory_encoders import build_trajectory_encoder

        algo = self.config.algorithm
        options = dict(algo.trajectory_encoder_options)
        if algo.trajectory_encoder == "policy_backbone":
            if not hasattr(self.policy, "frame_features"):
                raise ValueError(f"algorithm.trajectory_encoder 'policy_backbone' needs a policy with a vision "
                                 f"backbone (frame_features); policy {self.config.policy.name!r} has none")
            options["frame_features"] = self.policy.frame_features
        elif algo.trajectory_encoder == "vjepa2":
            options.setdefault("device", self.device)
        return build_trajectory_encoder(algo.trajectory_encoder, **options)

    @cached_property
    def text_rollout(self):
        """The sampler of ``text.rollout_backend`` (:mod:`vla_rl.rollout.text_backends`), built on
        first use, after the actor: a vLLM engine reloads the weights after each actor step."""
        from vla_rl.rollout.text_backends import make_text_rollout

        return make_text_rollout(
            self.config.text.rollout_backend, self.policy, self.config.text,
            seed=self.config.run.seed * 1_000_003 + self.rank, work_dir=self.run_dir / "rollout" / f"rank{self.rank}",
            optimizer=None if self.actor is None else self.actor.optimizer,
        )

    def _causal_lm(self):
        from policies.causal_lm.configuration_causal_lm import CausalLMConfig
        from policies.causal_lm.modeling_causal_lm import CausalLMPolicy

        text = self.config.text
        config = CausalLMConfig(
            model_path=str(self.text_assets.model_path),
            gguf_file=text.gguf_file,
            dtype=text.dtype,
            max_prompt_length=text.max_prompt_length,
            max_response_length=text.max_response_length,
            temperature=text.temperature,
        )
        return CausalLMPolicy.from_pretrained(config).to(self.device)

    @cached_property
    def evaluation(self):
        """This worker's :class:`~vla_rl.evaluation.session.EvaluationSession`, for the nodes of
        the ``eval_rollout`` template (``run_dir`` is then the evaluation directory)."""
        from vla_rl.evaluation.session import EvaluationSession

        return EvaluationSession(self)

    def close(self) -> None:
        """Stop the evaluation session, the simulator actors and the text sampler (if they were started)."""
        if "evaluation" in self.__dict__:
            self.evaluation.close()
        if "simulator_pool" in self.__dict__:
            self.simulator_pool.close()
        if "text_rollout" in self.__dict__:
            self.text_rollout.close()
