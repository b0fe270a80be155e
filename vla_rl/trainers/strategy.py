"""How the actor's policy trains over the DAG workers (``trainer.strategy``): DDP or FSDP2.

Both strategies give the trainer the same four things: ``module`` (what the training forward
calls), ``trained`` (the module whose parameters the optimizer updates), ``gradient_sync(enabled)``
(a context for gradient accumulation) and ``after_update()``; the update loop does not branch on
the strategy. ``master_parameters()`` gives the policy's weights at full precision to what starts
from them after the actor is built (the text critic's body).

- :class:`DDPStrategy` (default): ``torch.nn.parallel.DistributedDataParallel`` around the policy
  itself; gradients are all-reduced in the backward pass. ``trained`` is the policy. Under mixed
  precision (``trainer.mixed_precision``: ``auto`` on CUDA/NPU, or ``bf16``) the policy keeps its
  float32 weights (Adam's master weights) and every forward pass of the policy, the reference
  and the critic runs in ``torch.autocast(device, bfloat16)`` (:func:`autocast`): matrix
  products in bfloat16, the ops autocast lists in float32, the backward pass in the dtypes the
  forward chose (torch's automatic mixed precision, as accelerate's ``mixed_precision="bf16"``
  for DDP, used by TRL); the rollout samples in the same context, and the actor rescores the
  old log-probs in the trainer's (:attr:`DDPStrategy.recomputes_old_log_probs`).
- :class:`FSDPStrategy`: torch FSDP2 (``torch.distributed.fsdp.fully_shard``, the per-parameter
  DTensor sharding of Zhao et al. 2023 and the torchtitan recipe) on a *training copy* of the
  policy: each block the policy names (:meth:`policies.base.Policy.fsdp_units`: transformer
  layers, the MLP's linear layers) is sharded on its own, then the root; parameters, gradients
  and Adam's state live in shards of ``trainer.fsdp.master_dtype``; under mixed precision the
  blocks are all-gathered and computed in bfloat16 and gradients reduce-scattered in
  ``trainer.fsdp.reduce_dtype`` (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``,
  verl's ``verl/workers/fsdp_workers.py`` default). The policy the rest of the engine uses
  (rollout, reference, evaluation, vLLM weight sync) stays a plain module in its own dtype, as
  verl's rollout engines hold their own weights: :meth:`FSDPStrategy.after_update` copies the
  trained parameters into it after every update (an all-gather of the trainable parameters, one
  tensor at a time), so nothing outside the trainer ever meets a DTensor or an FSDP collective
  whose count differs between workers (the rollout's forward passes do). Under mixed precision
  that policy's parameters are bfloat16 too (bfloat16 rollouts), and the actor takes the old
  log-probs from the copy, not the rollout (:attr:`FSDPStrategy.recomputes_old_log_probs`).

The training copy is built without materialising a second full model: parameters are copied
as ``meta`` tensors, sharded, materialised shard by shard (``to_empty``) and filled from the
policy's weights with ``set_model_state_dict(full_state_dict=True)`` (the meta-device
initialisation of the FSDP2 tutorial, docs.pytorch.org/tutorials/intermediate/FSDP_tutorial.html).

Activation checkpointing (``trainer.gradient_checkpointing``) uses transformers' own for the
Hugging Face models inside a policy and ``torch.utils.checkpoint`` (torch's
``checkpoint_wrapper``, non-reentrant) around the policy's FSDP units otherwise.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from policies.base import FSDPGroup, cast_parameters, enable_transformers_checkpointing
from vla_rl.trainers.parallel import data_parallel

logger = logging.getLogger(__name__)

#: Prefix torch's ``checkpoint_wrapper`` inserts into the names of the modules it wraps.
_CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."
#: Device types with bfloat16 mixed precision (``trainer.mixed_precision: auto`` picks it there).
ACCELERATORS = ("cuda", "npu")


def low_precision_trainable(module: nn.Module) -> list[str]:
    """The dtypes (sorted names: ``bfloat16``, ``float16``) of ``module``'s trainable floating
    parameters that are not float32: an optimizer stepping them directly keeps no float32 master
    weights."""
    return sorted({str(p.dtype).removeprefix("torch.") for p in module.parameters()
                   if p.requires_grad and p.is_floating_point() and p.dtype != torch.float32})


def refuse_low_precision_adam(module: nn.Module, what: str, skip: str) -> None:
    """Refuse to run Adam on ``module``'s non-float32 trainable parameters outside a strategy
    (the warm starts, before the actor's strategy exists): Adam's ``eps=1e-8`` is 0 in float16
    (a zero gradient gives 0/0: NaN weights after one step), and bfloat16 weights drop the
    updates below their resolution (8 bits of mantissa).

    Args:
        what: the training, for the message (``behaviour cloning``).
        skip: the setting that leaves it out (``warm_start.num_demos=0``).

    Raises:
        ValueError: such parameters exist (their dtypes named, with the ways out).
    """
    low = low_precision_trainable(module)
    if low:
        raise ValueError(f"{what} would run Adam on the {type(module).__name__}'s {'/'.join(low)} trainable "
                         "parameters (no float32 master weights: float16 gives NaN weights, bfloat16 drops small "
                         "updates): load the policy in float32 (trainer.mixed_precision auto still computes the RL "
                         f"updates in bfloat16 on accelerators), train LoRA adapters where the policy takes them "
                         f"(policy.lora), or set {skip}")


def make_strategy(policy: nn.Module, group: dist.ProcessGroup | None, trainer=None) -> DDPStrategy | FSDPStrategy:
    """The strategy of ``trainer.strategy`` around ``policy``.

    Args:
        policy: the worker's policy, on its device.
        group: the DAG workers' process group (None: the default group).
        trainer: the run's ``trainer`` section (None: DDP without activation checkpointing).

    Raises:
        ValueError: see :class:`FSDPStrategy` and :func:`enable_gradient_checkpointing`.
    """
    if trainer is None:
        return DDPStrategy(policy, group)
    if trainer.strategy == "ddp":
        return DDPStrategy(policy, group, gradient_checkpointing=trainer.gradient_checkpointing,
                           autocast_dtype=autocast_dtype(trainer, next(policy.parameters()).device))
    return FSDPStrategy(policy, group, trainer)


class DDPStrategy:
    """The policy itself in DDP (see the module docstring).

    Args:
        policy: the policy (its weights are broadcast from rank 0 by DDP at construction).
        group: the workers' process group.
        gradient_checkpointing: recompute the policy's blocks in the backward pass.
        autocast_dtype: the dtype of the training forward's ``torch.autocast`` (bfloat16 under
            mixed precision: :func:`autocast_dtype`), or None (the policy's own dtypes).

    Attributes:
        recomputes_old_log_probs: under autocast, or when the policy holds bfloat16 (any
            non-float32) parameters (a LoRA model's frozen base, ``text.dtype: bfloat16``), True:
            the rollout sampled with the same weights, but bfloat16 kernels may round otherwise
            for other batch shapes (and a causal LM's token-by-token decoding otherwise than one
            forward pass: up to 2e-3 per token on the tiny LM), so the actor scores the rollout's
            actions with the training module before its first update (as
            :attr:`FSDPStrategy.recomputes_old_log_probs`) and the first minibatch's ratio is 1
            (exactly when the minibatch has the shape of the rescoring pass,
            ``trainer.micro_batch_size`` rows or the worker's shard; otherwise within bfloat16's
            rounding, as in verl, whose ``compute_log_prob`` micro-batches differ from the
            update's too). Otherwise False: the trained module is the float32 policy the rollout
            samples with, and the rollout's log-probs are the trainer's.

    Raises:
        ValueError: a trainable parameter is not float32 (a bfloat16 policy without LoRA: Adam
            would update bfloat16 weights); see also :func:`enable_gradient_checkpointing`.
    """

    sharded = False

    def __init__(self, policy: nn.Module, group: dist.ProcessGroup | None, gradient_checkpointing: bool = False,
                 autocast_dtype: torch.dtype | None = None) -> None:
        low = low_precision_trainable(policy)
        if low:
            raise ValueError(f"trainer.strategy ddp would run Adam on the {type(policy).__name__}'s {'/'.join(low)} "
                             "trainable parameters (no float32 master weights): use trainer.strategy=fsdp (float32 "
                             "master weights, bfloat16 compute), LoRA (float32 adapters), or "
                             "policy.config.dtype=float32")
        self.checkpointed_blocks = enable_gradient_checkpointing(policy)[1] if gradient_checkpointing else 0
        if gradient_checkpointing:
            logger.info("DDP: %d blocks checkpointed", self.checkpointed_blocks)
        self.policy = policy
        self.trained = policy
        self.module = data_parallel(policy, group)
        self.autocast_dtype = autocast_dtype
        # bfloat16 (or other low-precision) weights round otherwise in the rollout's passes (a
        # causal LM's token-by-token decoding, other batch shapes) than in the trainer's
        self.recomputes_old_log_probs = autocast_dtype is not None or any(
            p.is_floating_point() and p.dtype != torch.float32 for p in policy.parameters())
        if autocast_dtype is not None:
            logger.info("DDP: float32 weights, forward passes in torch.autocast(%s)", autocast_dtype)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context of the training module's forward passes (not of the backward pass):
        ``torch.autocast`` under mixed precision, else nothing."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(next(self.policy.parameters()).device.type, dtype=self.autocast_dtype)

    def gradient_sync(self, enabled: bool) -> contextlib.AbstractContextManager:
        """The context of one forward and backward pass: DDP's ``no_sync()`` (gradients accumulate
        locally) unless ``enabled``; a backward with ``enabled`` all-reduces the accumulated
        gradients. The forward belongs inside: DDP prepares the backward's all-reduce in its
        forward (``torch.nn.parallel.DistributedDataParallel.no_sync``)."""
        return contextlib.nullcontext() if enabled else self.module.no_sync()

    def after_update(self) -> None:
        """Nothing to do: the trained module is the policy."""

    def master_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of every parameter of the policy (its own: the policy holds the
        master weights)."""
        yield from self.policy.named_parameters()


class FSDPStrategy:
    """A sharded training copy of the policy (see the module docstring).

    Args:
        policy: the policy, on its device (CPU, CUDA or NPU), the same on every worker up to what
            rank 0's broadcast settles.
        group: the workers' process group (None: the default group).
        trainer: the run's ``trainer`` section: ``mixed_precision``, ``gradient_checkpointing``,
            ``fsdp.master_dtype``, ``fsdp.reduce_dtype``, ``fsdp.reshard_after_forward``,
            ``fsdp.sync_every_micro_batch``.

    Attributes:
        recomputes_old_log_probs: the training copy may compute other log-probs than the policy
            the rollout samples with (bfloat16 mixed precision, or ``trainer.fsdp.master_dtype``
            unlike the policy's trainable parameters: :func:`computes_differently`), so the actor
            scores the rollout's actions with the training copy before its first update (verl's
            ``actor.compute_log_prob``) and the first minibatch's ratio is 1.

    Under mixed precision the policy's floating parameters are cast to bfloat16 once the copy
    holds them (:func:`cast_parameters`): rollouts, the reference and evaluations compute in
    bfloat16 and the policy takes half the memory; the float32 master weights are the copy's,
    and checkpoints save those.

    Raises:
        ValueError: ``mixed_precision: bf16`` on a CPU worker; see also
            :func:`enable_gradient_checkpointing`.
    """

    sharded = True

    def __init__(self, policy: nn.Module, group: dist.ProcessGroup | None, trainer) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import (
            MixedPrecisionPolicy,
            fully_shard,
            register_fsdp_forward_method,
        )

        settings = trainer.fsdp
        device = next(policy.parameters()).device
        param_dtype = policy_dtype(trainer, device)
        master_dtype = getattr(torch, settings.master_dtype)
        self.policy = policy
        self.group = group
        self.sync_every_micro_batch = settings.sync_every_micro_batch
        self.param_dtype = param_dtype or master_dtype
        self.recomputes_old_log_probs = computes_differently(policy, param_dtype, master_dtype)
        broadcast_module(policy, group)  # rank 0's weights everywhere, as DDP starts
        trained = meta_copy(policy, master_dtype)
        units = list(trained.fsdp_units())
        self.checkpointed_blocks = 0
        if trainer.gradient_checkpointing:
            units, self.checkpointed_blocks = enable_gradient_checkpointing(trained, units)
        mesh = DeviceMesh.from_group(group if group is not None else dist.group.WORLD, device_type=device.type)
        reduce_dtype = getattr(torch, settings.reduce_dtype) if param_dtype else None
        shard = functools.partial(fully_shard, mesh=mesh, reshard_after_forward=settings.reshard_after_forward,
                                  mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype))
        for unit in _innermost_first(trained, units):
            if isinstance(unit, FSDPGroup):
                shard(list(unit.modules))
                register_fsdp_forward_method(unit.modules[0], unit.forward_method)
            else:
                shard(unit)
        # The root takes its inputs as they are: FSDP would round the rollout's continuous actions
        # to bfloat16 and score actions that were never taken; the policy casts what its layers
        # read, as in a bfloat16 rollout, so both compute the same log-probs.
        shard(trained, mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                                                      cast_forward_inputs=False))
        trained.to_empty(device=device)
        set_model_state_dict(trained, policy.state_dict(), options=StateDictOptions(full_state_dict=True))
        buffers = dict(policy.named_buffers())
        with torch.no_grad():  # non-persistent buffers (rotary frequencies, pixel statistics) too
            for name, buffer in trained.named_buffers():
                buffer.copy_(buffers[name.replace(_CHECKPOINT_PREFIX, "")])
        if param_dtype is not None:  # the rollout computes in the update's dtype: bfloat16 rollouts
            cast_parameters(policy, param_dtype)
        self.trained = trained
        self.module = trained
        logger.info("FSDP2 over %d workers: %d units + root, parameters and optimizer state in %s, computing in %s, "
                    "%d blocks checkpointed", mesh.size(), len(units), master_dtype, self.param_dtype,
                    self.checkpointed_blocks)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Nothing: FSDP's mixed precision casts the parameters it gathers (``MixedPrecisionPolicy``)."""
        return contextlib.nullcontext()

    def gradient_sync(self, enabled: bool) -> contextlib.AbstractContextManager:
        """The context of one backward pass: with ``trainer.fsdp.sync_every_micro_batch`` every
        backward reduce-scatters (sharded gradients accumulate); otherwise gradients accumulate
        unsharded until a backward with ``enabled`` (``set_requires_gradient_sync``)."""
        if enabled or self.sync_every_micro_batch:
            return contextlib.nullcontext()
        return _no_gradient_sync(self.trained)

    @torch.no_grad()
    def after_update(self) -> None:
        """Copy the trained parameters into the policy (collective: every worker, same order),
        cast to the policy's dtypes; frozen parameters never change and are not copied."""
        targets = dict(self.policy.named_parameters())
        for name, full in self._full_parameters(trainable_only=True):
            targets[name].copy_(full)

    def master_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of every parameter of the policy as the training copy holds it,
        named as in the policy: trainable ones in ``trainer.fsdp.master_dtype`` (float32 by
        default), frozen ones in the dtype the policy gave them (:func:`meta_copy`), so what the
        policy held before mixed precision cast it to bfloat16, as trained since. Collective
        (every worker, same order): each parameter is all-gathered in turn, so a worker holds one
        whole parameter at a time beyond what it keeps."""
        yield from self._full_parameters(trainable_only=False)

    @torch.no_grad()
    def _full_parameters(self, trainable_only: bool) -> Iterator[tuple[str, torch.Tensor]]:
        from torch.distributed.tensor import DTensor

        for name, parameter in self.trained.named_parameters():
            if parameter.requires_grad or not trainable_only:
                full = parameter.full_tensor() if isinstance(parameter, DTensor) else parameter
                yield name.replace(_CHECKPOINT_PREFIX, ""), full


@contextlib.contextmanager
def _no_gradient_sync(module) -> Iterator[None]:
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


def compute_dtype(mixed_precision: str, device: torch.device) -> torch.dtype | None:
    """The dtype the policy computes in for ``trainer.mixed_precision`` on ``device`` (FSDP: its
    parameters' in the forward pass; DDP: ``torch.autocast``'s).

    Returns:
        ``torch.bfloat16`` for ``bf16``, and for ``auto`` on an accelerator that computes in
        bfloat16 natively (:func:`native_bfloat16`); None (the master dtype) for ``none``, and for
        ``auto`` on the CPU or on an older GPU.

    Raises:
        ValueError: ``bf16`` on a CPU device: bfloat16 is refused rather than silently dropped.
    """
    accelerator = device.type in ACCELERATORS
    if mixed_precision == "bf16" and not accelerator:
        raise ValueError(f"trainer.mixed_precision bf16 needs an accelerator, but this worker trains on {device}; "
                         "use trainer.mixed_precision=auto (bf16 on CUDA/NPU, float32 on the CPU) or none")
    if mixed_precision == "bf16" or (mixed_precision == "auto" and accelerator and native_bfloat16(device)):
        return torch.bfloat16
    return None


def native_bfloat16(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 natively: a CUDA GPU of compute capability 8.0 or more
    (Ampere on: A100, H100, RTX 30xx); older ones (V100, T4) have no bfloat16 tensor cores
    (``torch.cuda.is_bf16_supported(including_emulation=False)`` is False there), so ``auto``
    keeps float32 on them rather than emulated bfloat16. Other devices: True (Ascend NPUs compute
    bfloat16; the CPU is decided before)."""
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device) >= (8, 0)


def policy_dtype(trainer, device: torch.device) -> torch.dtype | None:
    """The dtype of the policy's floating parameters outside the trainer (rollouts, the reference,
    evaluations) under the run's ``trainer`` section on ``device``: bfloat16 under FSDP's mixed
    precision (:class:`FSDPStrategy` casts the policy, and the reference is cast alike so that
    its log-probs are computed as the trainer's are); None, the policy's own, otherwise.

    Raises:
        ValueError: see :func:`compute_dtype`.
    """
    return compute_dtype(trainer.mixed_precision, device) if trainer.strategy == "fsdp" else None


def autocast_dtype(trainer, device: torch.device) -> torch.dtype | None:
    """The dtype of the ``torch.autocast`` context the policy, the reference and the critic run
    their forward passes in under the run's ``trainer`` section on ``device``: bfloat16 under
    DDP's mixed precision (``auto`` on CUDA/NPU, ``bf16``), the weights staying float32; None
    under FSDP (its parameters are cast: :func:`policy_dtype`) and without mixed precision.

    Raises:
        ValueError: see :func:`compute_dtype`.
    """
    return compute_dtype(trainer.mixed_precision, device) if trainer.strategy == "ddp" else None


def autocast(trainer, device: torch.device) -> contextlib.AbstractContextManager:
    """The context of the forward passes of the policy, the reference and the critic outside the
    trainers (rollouts, evaluations, reference log-probs, values) on ``device``:
    ``torch.autocast(device.type, bfloat16)`` under DDP's mixed precision (:func:`autocast_dtype`),
    so that they compute as the trainer's forward does (:meth:`DDPStrategy.autocast`); nothing
    otherwise. Wrap forward passes only, not backward passes (torch's AMP recipe).

    Raises:
        ValueError: see :func:`compute_dtype`.
    """
    dtype = autocast_dtype(trainer, device)
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def computes_differently(policy: nn.Module, param_dtype: torch.dtype | None, master_dtype: torch.dtype) -> bool:
    """Whether FSDP's training copy of ``policy`` may compute other log-probs than ``policy``
    itself: always under mixed precision (``param_dtype``: the rollout's policy is cast to it too,
    but the copy's units cast their floating inputs, and an accelerator's kernels may round
    otherwise for other batch shapes), and without it when a trainable parameter's master dtype is
    not the policy's (frozen parameters keep their dtype in the copy: :func:`meta_copy`)."""
    if param_dtype is not None:
        return True
    return any(parameter.requires_grad and parameter.is_floating_point() and parameter.dtype != master_dtype
               for parameter in policy.parameters())


@torch.no_grad()
def cast_for_rollouts(module: nn.Module, trainer, device: torch.device) -> None:
    """Give ``module``'s floating parameters, in place, the dtype the run's rollouts compute with
    on ``device`` (:func:`policy_dtype`: bfloat16 under FSDP's mixed precision, as
    :class:`FSDPStrategy` casts the policy); nothing otherwise. For what acts or scores outside
    the trainer: the reference, ``vla-rl eval``'s policy, ``vla-rl serve``'s.

    Raises:
        ValueError: see :func:`compute_dtype`.
    """
    dtype = policy_dtype(trainer, device)
    if dtype is not None:
        cast_parameters(module, dtype)


def meta_copy(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A deep copy of ``module`` whose parameters are ``meta`` tensors with the same
    ``requires_grad``: trainable floating ones of ``dtype`` (the master weights), frozen ones of
    their own dtype (never updated, they need no more precision than the policy has: a LoRA
    run's frozen base stays in bfloat16), unless some trainable parameter is of another dtype
    than ``dtype`` (a whole bfloat16 policy, not a LoRA run's float32 adapters): the frozen ones
    then take ``dtype`` too, so that the copy computes in one dtype (a frozen bfloat16 block fed
    the float32 master layers' outputs fails: "mixed dtype", "expected m1 and m2 to have the same
    dtype"). Buffers and other attributes are copied as they are. Costs no parameter memory: the
    copy is sharded before it is materialised."""
    memo: dict[int, Any] = {}
    recast = any(parameter.requires_grad and parameter.is_floating_point() and parameter.dtype != dtype
                 for parameter in module.parameters())
    for parameter in module.parameters():
        master = parameter.is_floating_point() and (parameter.requires_grad or recast)
        empty = torch.empty(parameter.shape, device="meta", dtype=dtype if master else parameter.dtype)
        memo[id(parameter)] = nn.Parameter(empty, requires_grad=parameter.requires_grad)
    return copy.deepcopy(module, memo)


@torch.no_grad()
def broadcast_module(module: nn.Module, group: dist.ProcessGroup | None, trainable_only: bool = False) -> None:
    """Overwrite ``module``'s parameters and buffers with rank 0's (of ``group``), one tensor at a
    time, as DDP does at construction; with ``trainable_only``, of the parameters only those that
    require gradients (the frozen ones, a LoRA run's whole base model, are the same everywhere)."""
    source = dist.get_global_rank(group, 0) if group is not None else 0
    parameters = [p for p in module.parameters() if p.requires_grad or not trainable_only]
    for tensor in [*parameters, *module.buffers()]:
        dist.broadcast(tensor.data, src=source, group=group)


def enable_gradient_checkpointing(module: nn.Module, units: list | None = None) -> tuple[list, int]:
    """Turn on activation checkpointing in ``module``.

    A policy that checkpoints its own blocks (:meth:`policies.base.Policy.checkpoint_activations`
    returns a count: π0's joint layers) does so. Otherwise every outermost transformers model
    inside ``module`` that supports it gets its own (non-reentrant ``torch.utils.checkpoint``
    around each of its layers; transformers then drops the KV cache in training forwards, which
    the causal-LM policy accounts for). Without any, each module of ``units`` (default:
    ``module.fsdp_units()``) is wrapped in torch's non-reentrant ``checkpoint_wrapper``
    (state-dict names are unchanged: the wrapper strips its prefix).

    Returns:
        the units to shard afterwards (the wrappers in place of wrapped units), and the number of
        blocks that now recompute their activations (logged; > 0).

    Raises:
        ValueError: ``module`` holds no transformers model and no units.
    """
    from transformers import PreTrainedModel

    units = list(module.fsdp_units()) if units is None else units
    own = getattr(module, "checkpoint_activations", None)
    count = own() if own is not None else None
    if count is not None:
        return units, count
    models = [m for m in module.modules() if isinstance(m, PreTrainedModel) and m.supports_gradient_checkpointing]
    outermost = [m for m in models if not any(m is not other and _contains(other, m) for other in models)]
    if outermost:
        return units, sum(enable_transformers_checkpointing(model) for model in outermost)
    modules = [unit for unit in units if isinstance(unit, nn.Module)]
    if not modules:
        raise ValueError(f"trainer.gradient_checkpointing: {type(module).__name__} holds no transformers model and "
                         "declares no blocks to checkpoint (fsdp_units)")
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        CheckpointWrapper,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    wanted = {id(unit) for unit in modules}
    apply_activation_checkpointing(
        module, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda submodule: id(submodule) in wanted)
    wrapped = [m for m in module.modules() if isinstance(m, CheckpointWrapper) and id(m._checkpoint_wrapped_module) in wanted]
    return wrapped, len(wrapped)


def _contains(outer: nn.Module, inner: nn.Module) -> bool:
    return any(m is inner for m in outer.modules())


def _innermost_first(root: nn.Module, units: list) -> list:
    """``units`` (modules and :class:`~policies.base.FSDPGroup` s) ordered so that a unit comes
    after the units nested in it (FSDP2 shards inner modules before the modules holding them); the
    root itself is left out. A group sorts by its deepest module."""
    depth = {id(m): name.count(".") + 1 for name, m in root.named_modules() if name}

    def deepest(unit) -> int:
        modules = unit.modules if isinstance(unit, FSDPGroup) else (unit,)
        return max(depth.get(id(m), 0) for m in modules)

    return sorted((u for u in units if deepest(u) > 0), key=lambda u: -deepest(u))
