"""A worker's side of saving and restoring checkpoints (atomic; see :mod:`vla_rl.trainers.checkpoint`).

Every built resource that holds training state writes it through its registered
:class:`~vla_rl.workers.resources.ResourceCheckpoint` (rank 0 writes what the workers share: the
policy, optimizers, the critic, the reference); every worker stages its RNG states; after a
barrier rank 0 publishes the checkpoint with an atomic rename. The checkpoint helpers the
resources register live here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from vla_rl.trainers import checkpoint


class WorkerCheckpointer:
    """Saves and restores one worker's state under ``root`` (``<run_dir>/checkpoints``).

    Args:
        root: the checkpoints directory.
        resources: the worker's :class:`~vla_rl.workers.resources.Resources`.
    """

    def __init__(self, root: Path, resources) -> None:
        self.root = root
        self.resources = resources

    def save(self, step: int, keep_last: int) -> None:
        """Collective: write the checkpoint of ``step`` (``step`` updates done)."""
        res = self.resources
        directory = checkpoint.staging_dir(self.root, step)
        metadata = res.save_checkpoint(directory)
        checkpoint.save_checkpoint(self.root, step, rank=res.rank, generator=res.generator, metadata=metadata)
        dist.barrier()
        if res.rank == 0:
            checkpoint.finalize_checkpoint(self.root, step, keep_last=keep_last)
        dist.barrier()

    def latest(self) -> Path:
        """The last complete checkpoint.

        Raises:
            FileNotFoundError: if the run has none.
        """
        path = checkpoint.latest_checkpoint(self.root)
        if path is None:
            raise FileNotFoundError(f"no complete checkpoint under {self.root} to resume from")
        return path

    def restore(self, path: Path, names=None) -> int:
        """Load the state of the built resources (only ``names``, if given) from ``path``;
        returns its step."""
        state = checkpoint.load_trainer_state(path)
        self.resources.load_checkpoint(path, state["metadata"], names)
        return int(state["step"])

    def restore_rng(self, path: Path) -> None:
        """Restore this rank's RNG states from ``path``."""
        checkpoint.restore_rng(checkpoint.load_rng(path, self.resources.rank), generator=self.resources.generator)


@dataclass(frozen=True)
class ModuleCheckpoint:
    """Checkpoints a module-valued resource (or a module attribute of it) as ``<file>.safetensors``.

    Attributes:
        resource: the resource's name.
        file: the file stem (``model``, ``reference``, ``critic``).
        attribute: the module's attribute on the resource (None: the resource is the module).
    """

    resource: str
    file: str
    attribute: str | None = None

    def _module(self, resources):
        obj = getattr(resources, self.resource)
        return obj if self.attribute is None else getattr(obj, self.attribute)

    def save(self, resources, directory: Path) -> dict[str, Any]:
        if resources.rank == 0:
            checkpoint.save_model(directory, self._module(resources), name=self.file)
        return {}

    def load(self, resources, directory: Path, metadata: dict[str, Any]) -> None:
        checkpoint.load_model(directory, self._module(resources), name=self.file)


@dataclass(frozen=True)
class OptimizerCheckpoint:
    """Checkpoints the ``optimizer`` of a trainer resource as ``<file>.safetensors`` (+ ``.json``),
    and its module as ``<module_file>.safetensors`` when ``module_file`` is set."""

    resource: str
    file: str
    module_attribute: str | None = None
    module_file: str | None = None

    def save(self, resources, directory: Path) -> dict[str, Any]:
        trainer = getattr(resources, self.resource)
        if resources.rank == 0:
            if self.module_file is not None:
                checkpoint.save_model(directory, getattr(trainer, self.module_attribute), name=self.module_file)
            checkpoint.save_optimizer(directory, trainer.optimizer, name=self.file)
        return {}

    def load(self, resources, directory: Path, metadata: dict[str, Any]) -> None:
        trainer = getattr(resources, self.resource)
        if self.module_file is not None:
            checkpoint.load_model(directory, getattr(trainer, self.module_attribute), name=self.module_file)
        checkpoint.load_optimizer(directory, trainer.optimizer, name=self.file)
