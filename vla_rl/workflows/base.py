"""The workflow kit interface, and the resources every workflow provides through it: ``policy``
and ``critic``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from tensordict import TensorDict
from torch import Tensor

from vla_rl.checkpoints import files as checkpoint
from vla_rl.data.key_sizes import StepShape
from vla_rl.workers.checkpointing import CRITIC_CHECKPOINT
from vla_rl.workers.resources import register_resource


class Workflow(ABC):
    """What one workflow (``run.workflow``) contributes to the engine.

    Attributes:
        name: the ``run.workflow`` value.
        policy_keys: the batch keys the policy's forward reads (besides ``response_mask``),
            declared by the nodes that score a batch (actor, reference).
        policy_needs: the resources the policy is built from.
    """

    name: ClassVar[str]
    policy_keys: ClassVar[tuple[str, ...]]
    policy_needs: ClassVar[tuple[str, ...]] = ()

    def prepare(self, res) -> None:
        """Collective, before any resource is built (e.g. generate the files a run reads)."""

    @abstractmethod
    def build_policy(self, res) -> Any:
        """The worker's policy on ``res.device`` (the resources of :attr:`policy_needs` are built)."""

    @abstractmethod
    def batch_forward(self, model, batch: TensorDict, with_entropy: bool = True) -> tuple[Tensor, Tensor | None]:
        """Per-dimension log-probs and entropies ``(n, T, chunk, action_dim)`` of the actions of
        ``batch`` under ``model`` (the policy or its data-parallel wrapper), 0 at invalid steps;
        the entropy is None with ``with_entropy`` False (no-gradient scoring)."""

    @abstractmethod
    def build_critic(self, res) -> Any:
        """The :class:`~vla_rl.trainers.critic.CriticTrainer` of templates with critic nodes."""

    @abstractmethod
    def warm_starts(self, config) -> bool:
        """Whether the ``warm_start`` phase trains the policy under ``config`` (else the policy that
        training starts from is its initialisation, or its pretrained checkpoint)."""

    @abstractmethod
    def groups_per_step(self, config) -> int:
        """Groups (initial states, prompts) a training step holds over all workers."""

    @abstractmethod
    def build_evaluation(self, res) -> Any:
        """The held-out evaluation session of the ``evaluate`` phase
        (:mod:`vla_rl.evaluation.session`)."""

    def step_shape(self, config) -> StepShape | None:
        """The sizes of a training step's batches under ``config``, known before anything runs
        (``vla-rl plan``'s byte estimates); None: this workflow does not say."""
        return None

    def save_policy(self, policy, directory: Path) -> None:
        """Write the policy into a checkpoint directory (rank 0): ``model.safetensors``."""
        checkpoint.save_model(directory, policy)

    @abstractmethod
    def standalone_policy(self, config, run_dir: Path) -> Any:
        """The run's policy built in this process on the CPU, without workers or simulator actors,
        with the run's LoRA adapters (``policy.lora``): what ``vla-rl export`` loads a checkpoint
        of the run into. Its weights are the initial ones (load a checkpoint's)."""


class PolicyCheckpoint:
    """The policy's weights in checkpoints, written as its workflow writes them; under
    ``trainer.strategy: fsdp`` the actor's sharded state holds them instead (nothing written here),
    and loading reads them from there (:func:`~vla_rl.checkpoints.files.load_policy_weights`)."""

    def save(self, res, directory: Path) -> dict[str, Any]:
        if "actor" in res.built() and res.actor.sharded:
            return {}
        if res.rank == 0:
            res.workflow.save_policy(res.policy, directory)
        return {}

    def load(self, res, directory: Path, metadata: dict[str, Any]) -> None:
        checkpoint.load_policy_weights(directory, res.policy)


@register_resource("policy", checkpoint=PolicyCheckpoint())
def build_policy(res):
    """The worker's policy, built by the run's workflow (same initial weights on every worker:
    each seeds torch identically before building it), with LoRA adapters when ``policy.lora`` is
    set (drawn from a generator seeded by ``run.seed``, the same on every worker)."""
    res.ensure(res.workflow.policy_needs)
    policy = res.workflow.build_policy(res)
    lora = res.config.policy.lora
    if lora is not None:
        apply_lora(policy, lora, res.config.run.seed)
    return policy


def apply_lora(policy, lora, seed: int) -> list[str]:
    """Inject ``policy.lora``'s adapters into ``policy`` (``policy.apply_lora``), their random
    half drawn from torch's RNG seeded with ``seed`` (restored afterwards).

    Returns:
        the names of the trainable parameters.

    Raises:
        TypeError: the policy takes no adapters (the config refuses such a template first).
        vla_rl_core.components.ComponentConfigError: field ``policy.lora.target_modules``: a name
            that names no trainable linear layer of the policy (none at all for the default list);
            ``policy.lora.trainable_modules``: an entry that is not a submodule. The driver shows
            it in one line.
    """
    import torch

    from vla_rl_core.components import ComponentConfigError

    if not callable(getattr(policy, "apply_lora", None)):
        raise TypeError(f"policy.lora: the {type(policy).__name__} policy takes no LoRA adapters")
    device = next(policy.parameters()).device
    # On the CPU only the CPU generator is forked (devices=[]; torch 2.11 has no device_type=None).
    accelerator = {} if device.type == "cpu" else {"device_type": device.type}
    devices = [] if device.type == "cpu" else [device.index or 0]
    with torch.random.fork_rng(devices=devices, **accelerator):
        torch.manual_seed(seed)
        try:
            return policy.apply_lora(**lora.apply_arguments())
        except ComponentConfigError as err:
            raise ComponentConfigError(f"policy.lora.{err.field}", err.message) from None


@register_resource("critic", needs=("policy",), checkpoint=CRITIC_CHECKPOINT)
def build_critic(res):
    """The critic of PPO with GAE, built by the run's workflow from the warm-started policy."""
    return res.workflow.build_critic(res)


@register_resource("evaluation", needs=("policy",), close=lambda session: session.close())
def build_evaluation(res):
    """The worker's evaluation session (:mod:`vla_rl.evaluation.session`), built by the run's workflow."""
    return res.workflow.build_evaluation(res)
