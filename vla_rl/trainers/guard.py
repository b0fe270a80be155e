"""Optimizer steps that refuse a non-finite gradient instead of applying it.

A loss that diverged (a learning rate far too large, a bad batch) gives a gradient norm that is
inf or NaN. Applying it would fill the weights with inf/NaN, which later steps and checkpoints
would spread. :class:`GuardedStep` skips such an update (the weights stay as they were) and
counts it; after ``max_skipped`` skipped updates in a row it stops the run with a message.

Under data parallelism the gradients are all-reduced before the norm is taken, so every worker
sees the same norm and skips the same updates (a worker whose own loss is NaN makes the reduced
gradient NaN everywhere). Under FSDP each worker holds a shard of every gradient (DTensors): the
norm is the total over the shards (one all-reduce), as torchtitan's ``clip_grad_norm_``
(``torchtitan/distributed/utils.py``) computes it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from vla_rl.errors import RunStopped


class GuardedStep:
    """Clip, check and apply a trainer's gradients.

    Args:
        name: the trainer, for the message (``actor``, ``critic``).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.skipped_in_a_row = 0

    def __call__(self, parameters: Iterable[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                 max_grad_norm: float, max_skipped: int, loss: torch.Tensor) -> tuple[float, bool]:
        """Clip the gradients to ``max_grad_norm`` and step ``optimizer`` if their norm is finite.

        Args:
            parameters: the trained parameters (their ``.grad`` set by a backward pass).
            optimizer: their optimizer.
            max_grad_norm: gradient-norm clip.
            max_skipped: skipped updates in a row after which the run stops.
            loss: the minibatch's loss (for the message).

        Returns:
            (the gradient norm before clipping, whether the update was applied).

        Raises:
            RunStopped: the ``max_skipped``-th skipped update in a row.
        """
        grad_norm = clip_grad_norm(parameters, max_grad_norm)
        if math.isfinite(grad_norm):
            optimizer.step()
            self.skipped_in_a_row = 0
            return grad_norm, True
        optimizer.zero_grad(set_to_none=True)
        self.skipped_in_a_row += 1
        if self.skipped_in_a_row >= max_skipped:
            raise RunStopped(
                f"the {self.name} update diverged: {self.skipped_in_a_row} updates in a row had a non-finite gradient "
                f"norm (last loss {float(loss.detach()):.4g}, gradient norm {grad_norm}); they were skipped and the "
                "weights are those of the last finite update. Lower the learning rate (trainer.lr) and resume from "
                "the last checkpoint (vla-rl train --resume RUN_DIR trainer.lr=...), or raise "
                "trainer.max_skipped_updates")
        return grad_norm, False


def clip_grad_norm(parameters: Iterable[torch.nn.Parameter], max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_`` that also takes sharded (DTensor) gradients: the total
    norm over every worker's shards (collective then: every worker calls it), the gradients
    scaled by ``min(1, max_norm / total)``.

    Returns:
        the total gradient norm before clipping (inf or NaN if a gradient is not finite).
    """
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)
