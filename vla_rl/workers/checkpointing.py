"""A worker's side of saving and restoring checkpoints (atomic; see :mod:`vla_rl.trainers.checkpoint`).

Every worker stages its RNG states; rank 0 also stages the model and optimizer (identical on all
workers under DDP); after a barrier rank 0 publishes the checkpoint with an atomic rename.
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from vla_rl.trainers import checkpoint


class WorkerCheckpointer:
    """Saves and restores one worker's state under ``root`` (``<run_dir>/checkpoints``)."""

    def __init__(self, root: Path, rank: int, resources) -> None:
        self.root = root
        self.rank = rank
        self.resources = resources
        self._restoring: Path | None = None

    def save(self, step: int, keep_last: int) -> None:
        """Collective: write the checkpoint of ``step`` (``step`` updates done)."""
        res = self.resources
        owner = self.rank == 0
        checkpoint.save_checkpoint(
            self.root,
            step,
            rank=self.rank,
            model=res.policy if owner else None,
            optimizer=res.actor.optimizer if owner else None,
            generator=res.generator,
        )
        dist.barrier()
        if owner:
            checkpoint.finalize_checkpoint(self.root, step, keep_last=keep_last)
        dist.barrier()

    def restore_policy(self) -> int:
        """Load the policy weights of the last complete checkpoint; return its step.

        Raises:
            FileNotFoundError: if the run has no complete checkpoint.
        """
        path = checkpoint.latest_checkpoint(self.root)
        if path is None:
            raise FileNotFoundError(f"no complete checkpoint under {self.root} to resume from")
        checkpoint.load_model(path, self.resources.policy)
        self._restoring = path
        return int(checkpoint.load_trainer_state(path)["step"])

    def restore_optimizer_and_rng(self) -> None:
        """Load the optimizer state and this rank's RNG states (after :meth:`restore_policy`)."""
        checkpoint.load_optimizer(self._restoring, self.resources.actor.optimizer)
        checkpoint.restore_rng(checkpoint.load_rng(self._restoring, self.rank), generator=self.resources.generator)
