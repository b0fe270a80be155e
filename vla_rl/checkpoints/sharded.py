"""Sharded training state with ``torch.distributed.checkpoint`` (DCP), for ``trainer.strategy: fsdp``.

Inside a checkpoint directory (:mod:`vla_rl.checkpoints.files`) the actor's state is one DCP
directory::

    actor_sharded/.metadata          the global layout (written by the group's rank 0)
    actor_sharded/__<rank>_0.distcp  each worker's shards: "model.<name>" (the policy's weights in
                                     trainer.fsdp.master_dtype) and "optimizer.state.<name>.<key>",
                                     "optimizer.param_groups..." (Adam's state)

written with ``get_state_dict`` / ``dcp.save`` and read with ``dcp.load`` / ``set_state_dict``
(``torch.distributed.checkpoint.state_dict``, as torchtitan's ``CheckpointManager`` and verl's
``FSDPCheckpointManager`` do). The files sit in the checkpoint's staging directory like every
other file, so the manifest (size and sha256 of every file,
:func:`~vla_rl.checkpoints.integrity.write_manifest`) and the atomic rename cover them. DCP
reshards on load: the weights alone load into an unsharded module on any number of processes
(:func:`load_sharded_model`), which is how evaluation, a resume's policy and ``vla-rl export`` read
them. The critic of PPO with GAE, under FSDP too, has its own DCP directory of the same form,
``critic_sharded/`` (``model.<name>``: the value model's weights).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from vla_rl.checkpoints.layout import (
    ACTOR_SHARDED_DIR,
    DCP_METADATA,
    NonFiniteTensorError,
    all_finite,
    is_sharded_dir,
)


def save_sharded(directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                 group: dist.ProcessGroup | None = None, name: str = ACTOR_SHARDED_DIR) -> Path:
    """Collective: write ``model``'s (sharded) weights and ``optimizer``'s state into
    ``<directory>/<name>`` (``actor_sharded``, or ``critic_sharded`` for the critic).

    Every worker first checks its own shards; the workers agree (one all-reduce) before anything
    is written, so that either all write or all raise.

    Returns:
        the DCP directory.

    Raises:
        NonFiniteTensorError: some worker's shard of a weight or of the optimizer state holds inf
            or NaN (every worker raises; nothing is written).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    target = Path(directory) / name
    optimizer_started = bool(optimizer.state)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    if not optimizer_started:
        _count_back_initialising_step(optimizer)
    bad = _first_non_finite({"model": model_state, "optimizer": optimizer_state})
    device = next(model.parameters()).device
    flag = torch.tensor([0 if bad is None else 1], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if int(flag.item()):
        where = f"tensor {bad!r} of this worker's shard" if bad is not None else "another worker's shard"
        raise NonFiniteTensorError(f"refusing to write {target}: {where} holds non-finite values (inf/NaN); the "
                                   "training state diverged")
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(target), process_group=group)
    return target


def load_sharded(directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                 group: dist.ProcessGroup | None = None, name: str = ACTOR_SHARDED_DIR) -> None:
    """Collective: restore what :func:`save_sharded` wrote into ``<directory>/<name>`` into
    ``model`` and ``optimizer`` (sharded as they are now; DCP reshards if the checkpoint was
    written by another number of workers).

    Raises:
        FileNotFoundError: ``directory`` holds no ``<name>`` checkpoint (e.g. it was written with
            ``trainer.strategy: ddp``: resume with the strategy that wrote it).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    source = Path(directory) / name
    if not is_sharded_dir(source):
        raise FileNotFoundError(f"{directory} holds no sharded {name.removesuffix('_sharded')} state ({name}/): it was "
                                "written with trainer.strategy ddp; resume with trainer.strategy=ddp, or start a new "
                                "run from its weights (vla-rl export)")
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(source), process_group=group)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


@torch.no_grad()
def load_sharded_model(directory: str | Path, module: nn.Module) -> None:
    """Load the weights of ``<directory>/actor_sharded`` into an unsharded ``module`` (this
    process reads every shard it needs itself: no collective), cast to ``module``'s dtypes.

    Raises:
        FileNotFoundError: no ``actor_sharded`` checkpoint in ``directory``.
        RuntimeError: a weight of ``module`` is missing from the checkpoint, or shapes differ
            (the message names the directory).
    """
    import torch.distributed.checkpoint as dcp

    source = Path(directory) / ACTOR_SHARDED_DIR
    if not is_sharded_dir(source):
        raise FileNotFoundError(f"checkpoint file {source / DCP_METADATA} is missing")
    state = {"model": module.state_dict()}  # views of the module's tensors: DCP copies into them
    try:
        with warnings.catch_warnings():  # DCP warns that it loads in one process even when asked to
            warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
            dcp.load(state, checkpoint_id=str(source), no_dist=True)
    except Exception as err:  # DCP raises CheckpointException wrapping the per-rank failures
        raise RuntimeError(f"{source}: the sharded weights do not fit the policy: {err}") from err


def _count_back_initialising_step(optimizer: torch.optim.Optimizer) -> None:
    """Undo the step count of the step ``get_state_dict`` takes to initialise an optimizer that
    has not stepped yet (torch's ``_init_optim_state``: zero gradients at lr 0). Adam's moments
    stay zero in that step but its count becomes 1, which changed the bias correction of every
    later update of the run that saved (and of a resume from its checkpoint); at count 0 the state
    is the one Adam starts from. The state dict shares these tensors, so the checkpoint holds 0 too.
    """
    for state in optimizer.state.values():
        step = state.get("step")
        if isinstance(step, torch.Tensor):
            step.zero_()
        elif step is not None:
            state["step"] = 0


def _first_non_finite(state: dict) -> str | None:
    """The name of the first floating tensor of nested ``state`` whose local values are not all
    finite (DTensors: this worker's shard), or None."""
    from torch.distributed.tensor import DTensor

    stack = [("", state)]
    while stack:
        prefix, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{prefix}.{key}" if prefix else str(key), item) for key, item in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((f"{prefix}.{i}", item) for i, item in enumerate(value))
        elif isinstance(value, torch.Tensor):
            local = value.to_local() if isinstance(value, DTensor) else value
            if not all_finite(local):
                return prefix
    return None
