"""A worker's side of saving and restoring checkpoints (atomic; see :mod:`vla_rl.checkpoints.files`).

Every built resource that holds training state writes it through its registered
:class:`~vla_rl.workers.resources.ResourceCheckpoint` (rank 0 writes what the workers share: the
policy, optimizers, the critic, the reference); every worker stages its RNG states; once every
rank is done, rank 0 publishes the checkpoint: a manifest of sizes and sha256, then an atomic
rename. A save that fails on any rank (a non-finite tensor, a full disk) publishes nothing: the
ranks agree on the failure, rank 0 removes the staging directory and ``latest`` stays as it was.

A resume (:meth:`WorkerCheckpointer.latest`) restores the newest checkpoint that verifies against
its manifest; newer ones that do not are logged and set aside (``step_*.rejected``). The
checkpoint helpers the resources register live here too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from vla_rl.checkpoints import files as checkpoint
from vla_rl.checkpoints import integrity as checkpoint_integrity
from vla_rl.checkpoints.layout import ACTOR_SHARDED_DIR, CRITIC_SHARDED_DIR, RUN_STATE_KEY, NonFiniteTensorError
from vla_rl.errors import ResumeRefused, RunStopped, file_system_error
from vla_rl.utils.collectives import cpu_barrier

logger = logging.getLogger(__name__)


class WorkerCheckpointer:
    """Saves and restores one worker's state under ``root`` (``<run_dir>/checkpoints``).

    Args:
        root: the checkpoints directory.
        resources: the worker's :class:`~vla_rl.workers.resources.Resources`.
    """

    def __init__(self, root: Path, resources) -> None:
        self.root = root
        self.resources = resources
        self.skipped: list[str] = []
        """Names of the checkpoints :meth:`latest` skipped (failed verification), newest first."""

    def save(self, step: int, keep_last: int, run_state: dict | None = None) -> None:
        """Collective: write the checkpoint of ``step`` (``step`` updates done), with the driver's
        ``run_state`` in its metadata under ``run`` (:data:`RUN_STATE_KEY`).

        Raises:
            RunStopped: this rank's part could not be written (a non-finite tensor: the message
                names the file and the tensor; the file system refused it, e.g. a full disk: the
                message names the reason and how to resume); nothing was published.
            Exception: what this rank's writing raised otherwise. A rank whose own part was
                written returns normally when another rank failed (that rank reports).
        """
        res = self.resources
        error: BaseException | None = None
        try:
            directory = checkpoint.staging_dir(self.root, step)
            metadata = res.save_checkpoint(directory)
            if run_state is not None:
                metadata[RUN_STATE_KEY] = dict(run_state)
            checkpoint.save_checkpoint(self.root, step, rank=res.rank, generator=res.generator, metadata=metadata,
                                       device=res.device)
        except (Exception, CheckpointException) as err:  # noqa: BLE001 - every rank must learn of it before anyone
            error = err  # publishes (torch.distributed.checkpoint's CheckpointException is a BaseException)
        # On the CPU (gloo): rank 0 may still be writing the whole model, longer than NCCL's watchdog waits.
        failed = torch.tensor([0 if error is None else 1])
        dist.all_reduce(failed)  # also the barrier: every rank's files are staged
        if int(failed.item()):
            if res.rank == 0:
                checkpoint.discard_staging(self.root, step)
            cpu_barrier()
            if isinstance(error, NonFiniteTensorError):
                latest = checkpoint.latest_checkpoint(self.root)
                raise RunStopped(
                    f"checkpoint of step {step} not written: {error}. Nothing was saved; the last checkpoint is still "
                    f"{latest or 'none'}. Lower the learning rate (trainer.lr) and resume from it "
                    f"(vla-rl train --resume {self.root.parent} trainer.lr=...)") from error
            if (reason := file_system_error(error)) is not None:
                latest = checkpoint.latest_checkpoint(self.root)
                raise RunStopped(
                    f"checkpoint of step {step} not written in {self.root}: {reason}. Nothing was saved; the last "
                    f"checkpoint is still {latest or 'none'}. Free space there (or fix the problem) and resume from "
                    f"it (vla-rl train --resume {self.root.parent})") from error
            if error is not None:
                raise error
            return
        if res.rank == 0:
            checkpoint.finalize_checkpoint(self.root, step, keep_last=keep_last)
        cpu_barrier()

    def latest(self) -> Path:
        """Collective (every rank, when a resume sets up): the newest checkpoint that verifies.

        Rank 0 verifies the checkpoints newest first (sizes and sha256 against each manifest,
        :func:`~vla_rl.checkpoints.integrity.latest_verified_checkpoint`), logs every one it skips
        and why, sets the skipped ones aside as ``step_*.rejected`` (their steps are trained
        and saved again), points ``latest`` at the chosen one, removes leftover staging
        directories, and tells the other ranks its choice (one hash of each file, and every rank
        restores the same checkpoint). :attr:`skipped` names the skipped checkpoints.

        Raises:
            ResumeRefused: the run has no checkpoint, or none that verifies (the message says why
                each failed).
        """
        choice: list[Any] = [None, [], ""]
        if self.resources.rank == 0:
            path, skipped = checkpoint_integrity.latest_verified_checkpoint(self.root)
            problem = "; ".join(reason for _, reason in skipped)
            if path is not None:
                for bad, _ in skipped:
                    checkpoint_integrity.reject_checkpoint(bad)
                if skipped:
                    checkpoint.point_latest(self.root, path)
                    logger.warning("resuming from %s, the newest checkpoint that verifies", path)
                checkpoint.discard_staging(self.root)
            choice = [None if path is None else path.name, [p.name for p, _ in skipped], problem]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(choice, src=0)
        name, self.skipped, problem = choice
        if name is None:
            raise ResumeRefused(f"cannot resume: no checkpoint under {self.root} verifies ({problem})" if problem
                                else f"cannot resume: there is no checkpoint under {self.root}")
        return self.root / name

    def restore(self, path: Path, names=None) -> int:
        """Load the state of the built resources (only ``names``, if given) from ``path``;
        returns its step."""
        state = checkpoint.load_trainer_state(path)
        self.resources.load_checkpoint(path, state["metadata"], names)
        return int(state["step"])

    def restore_rng(self, path: Path) -> None:
        """Restore this rank's RNG states from ``path``."""
        res = self.resources
        checkpoint.restore_rng(checkpoint.load_rng(path, res.rank), generator=res.generator, device=res.device)


@dataclass(frozen=True)
class SharedModuleCheckpoint:
    """Checkpoints a module-valued resource that shares parameters with another resource's
    module (the ``reference`` shares the ``policy``'s frozen parameters) as
    ``<file>.safetensors`` holding only its own tensors: the shared ones are the other
    resource's to save and restore. Under LoRA the file holds the adapters, not a second model.
    A file written whole (before the reference shared anything) loads too.

    Attributes:
        resource: the resource's name.
        file: the file stem.
        owner: the resource whose module holds the shared parameters.
    """

    resource: str
    file: str
    owner: str

    def _shared(self, resources) -> tuple[Any, set[str]]:
        module = getattr(resources, self.resource)
        owned = {id(parameter) for parameter in getattr(resources, self.owner).parameters()}
        return module, {key for key, tensor in module.state_dict(keep_vars=True).items() if id(tensor) in owned}

    def save(self, resources, directory: Path) -> dict[str, Any]:
        if resources.rank == 0:
            module, shared = self._shared(resources)
            checkpoint.save_module_part(directory, module, shared, name=self.file)
        return {}

    def load(self, resources, directory: Path, metadata: dict[str, Any]) -> None:
        module, shared = self._shared(resources)
        checkpoint.load_module_part(directory, module, shared, name=self.file)


@dataclass(frozen=True)
class TrainerCheckpoint:
    """Checkpoints a trainer resource (the ``actor``'s :class:`~vla_rl.trainers.actor.ActorTrainer`,
    the ``critic``'s :class:`~vla_rl.trainers.critic.CriticTrainer`).

    DDP: rank 0 writes the optimizer as ``<optimizer_file>.safetensors`` + ``.json``, and the
    trained module as ``<module_file>.safetensors`` when set (the actor's policy is the ``policy``
    resource's ``model.safetensors``). FSDP: every worker writes its shards of the weights and of
    the optimizer state into ``<sharded_dir>/`` (:mod:`vla_rl.checkpoints.sharded`; no
    safetensors of either). ``collective``: the workers save it before the other resources, so
    that one worker's failure elsewhere cannot leave the others waiting in its collectives.

    Attributes:
        resource: the resource's name.
        optimizer_file: the optimizer's file stem.
        sharded_dir: the DCP directory's name.
        module_attribute, module_file: the trained module's attribute and file stem (None: not saved).
    """

    resource: str
    optimizer_file: str
    sharded_dir: str
    module_attribute: str | None = None
    module_file: str | None = None
    collective = True

    def save(self, resources, directory: Path) -> dict[str, Any]:
        trainer = getattr(resources, self.resource)
        if trainer.sharded:
            trainer.save_sharded(directory)
        elif resources.rank == 0:
            if self.module_file is not None:
                checkpoint.save_model(directory, getattr(trainer, self.module_attribute), name=self.module_file)
            checkpoint.save_optimizer(directory, trainer.optimizer, name=self.optimizer_file)
        return {}

    def load(self, resources, directory: Path, metadata: dict[str, Any]) -> None:
        """Restore the trainer's weights and optimizer state; the optimizer's hyperparameters
        (learning rate, betas, weight decay) stay those the run built it with, so that a resume's
        ``trainer.lr=...`` (``critic.lr=...``) applies: ``load_state_dict`` would otherwise bring
        back the checkpoint's, silently."""
        trainer = getattr(resources, self.resource)
        settings = [{key: value for key, value in group.items() if key != "params"}
                    for group in trainer.optimizer.param_groups]
        self._load_state(trainer, directory)
        for group, own in zip(trainer.optimizer.param_groups, settings, strict=True):
            group.update(own)

    def _load_state(self, trainer, directory: Path) -> None:
        if trainer.sharded:
            trainer.load_sharded(directory)
            return
        if not (directory / f"{self.optimizer_file}.json").is_file() and (directory / self.sharded_dir).is_dir():
            raise FileNotFoundError(f"{directory} was written with trainer.strategy fsdp (sharded {self.resource} "
                                    f"state, no {self.optimizer_file}.json); resume with trainer.strategy=fsdp")
        if self.module_file is not None:
            checkpoint.load_model(directory, getattr(trainer, self.module_attribute), name=self.module_file)
        checkpoint.load_optimizer(directory, trainer.optimizer, name=self.optimizer_file)


#: The ``actor`` resource's checkpoint: ``optimizer.*`` (DDP) or ``actor_sharded/`` (FSDP).
ACTOR_CHECKPOINT = TrainerCheckpoint("actor", "optimizer", ACTOR_SHARDED_DIR)
#: The ``critic`` resource's checkpoint: ``critic.safetensors`` and ``critic_optimizer.*`` (DDP),
#: or ``critic_sharded/`` (FSDP).
CRITIC_CHECKPOINT = TrainerCheckpoint("critic", "critic_optimizer", CRITIC_SHARDED_DIR, "network", "critic")
