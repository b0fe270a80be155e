"""The ``trainer`` section of the run config: the RL loop and the actor update, and the settings
of ``trainer.strategy: fsdp`` (``trainer.fsdp``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vla_rl.config.base import _Section


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
        description="Episodes (text: responses) per minibatch, summed over the workers: a step whose filtered "
        "batch is small makes fewer updates instead of overfitting it. verl's ppo_mini_batch_size counts prompts "
        "and multiplies them by rollout.n: its value times data.group_size is this one.",
    )
    ppo_num_mini_batches: int | None = Field(
        None, ge=1,
        description="Minibatches per pass, whatever the batch's size (CleanRL's num_minibatches; replaces "
        "ppo_mini_batch_size when set): every step makes ppo_epochs x this many updates, each on an equal share of "
        "the step's (filtered) batch, fewer only when a worker's shard has fewer episodes. null: ppo_mini_batch_size.",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient-norm clip.")
    max_skipped_updates: int = Field(
        3, ge=1, description="An update whose gradient norm is not finite (a diverged loss) is skipped and "
        "counted in actor/skipped_updates; after this many in a row the run stops with a message.",
    )
    save_every: int = Field(5, ge=1, description="Checkpoint every k steps (and at the end).")
    keep_last: int = Field(
        2, ge=1, description="Checkpoints kept on disk (and those a vla-rl eval reads, until it ends).")
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="How the actor (and the critic, with PPO's GAE) trains over the workers: 'ddp', the whole "
        "policy and its optimizer on every worker, gradients all-reduced; 'fsdp', torch FSDP2 (fully_shard): "
        "parameters, gradients and optimizer state sharded over the workers, the policy's blocks all-gathered one at "
        "a time, sharded checkpoints (torch.distributed.checkpoint). docs/large_policies.md.")
    mixed_precision: Literal["auto", "bf16", "none"] = Field(
        "auto", description="The dtype the policy (and the reference, the critic) computes in. 'bf16' under fsdp: "
        "parameters all-gathered and computed in bfloat16, sharded master weights and optimizer state in "
        "trainer.fsdp.master_dtype, gradients reduced in trainer.fsdp.reduce_dtype, the rollout's policy cast to "
        "bfloat16; under ddp: float32 weights and optimizer state, every forward pass (rollout, evaluation, "
        "reference, critic, update) in torch.autocast(bfloat16). Either way the old log-probs are rescored by the "
        "trainer (the first ratio is 1); needs an accelerator (refused on CPU workers). 'none': the policy's own "
        "dtypes throughout (fsdp: the master dtype). 'auto': bf16 on NPU workers and on GPUs with native bfloat16 (CUDA compute capability 8.0+: A100, "
        "H100, RTX 30xx on), none on the CPU and older GPUs (V100, T4).")
    gradient_checkpointing: bool = Field(
        False, description="Recompute the policy's blocks' activations in the backward pass instead of keeping them "
        "(transformers' gradient checkpointing for Hugging Face models, torch.utils.checkpoint around the policy's "
        "blocks otherwise): less memory, about one more forward pass of compute.")
    micro_batch_size: int | None = Field(
        None, ge=1, description="Samples per forward/backward pass on a worker (gradient accumulation; the actor's "
        "and the critic's updates): each minibatch's gradient is accumulated over micro-batches of at most this many "
        "samples, scaled so that the update equals the whole minibatch's (exact for every loss_agg_mode); the "
        "no-grad scoring passes (reference log-probs, critic values, token-level old log-probs) also run this many "
        "rows at a time. null: the whole "
        "minibatch (shard) at once.")
    fsdp: FSDPSection = Field(default_factory=lambda: FSDPSection())

    def portable(self) -> TrainerSection:
        """This section for the run's policy acting on any device outside its training workers
        (``vla-rl eval``, ``vla-rl serve``): ``mixed_precision: bf16`` becomes ``auto``, the same
        bfloat16 on an accelerator and float32 on a CPU instead of refused there."""
        return self.model_copy(update={"mixed_precision": "auto"}) if self.mixed_precision == "bf16" else self
