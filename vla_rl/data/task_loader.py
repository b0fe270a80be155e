"""Distributed loader of the embodied task list: each worker reads only its own shard.

The task list of a single-task benchmark is the set of initial-state ids ``0..N-1`` (each id seeds
one reproducible environment reset). As ``torch.utils.data.DistributedSampler`` does, every epoch
is a seeded permutation of the ids; shard ``k`` of ``d`` takes positions ``k, k+d, k+2d, ...``.
Step ``s`` of an epoch takes the next ``groups_per_step // d`` ids of the worker's shard, so the
``d`` shards of one step are disjoint and together hold ``groups_per_step`` ids.

A task set of ``K`` tasks (``num_tasks``) draws ``groups_per_step / K`` initial states of every
task each step, each task from its own seeded epoch permutations of ``0..N-1``. The step's groups
are laid out task after task, ``r`` rounds of ``K`` (group ``j`` is task ``j mod K``), and shard
``k`` takes the contiguous block ``[k, k + 1) * groups_per_step / d``: so every shard sees the same
tasks in the same rows every step (a simulator slot keeps its task), and each shard covers every
task once ``groups_per_step / d`` is a multiple of ``K``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDict

from vla_rl_core import keys


@dataclass(frozen=True)
class ShardedTaskLoader:
    """Initial states for one DP shard, step by step.

    Args:
        num_init_states: size ``N`` of the task list (ids ``0..N-1``).
        groups_per_step: initial states per step over all shards.
        dp_rank: this shard's index in ``[0, dp_size)``.
        dp_size: number of shards.
        seed: seed of the epoch permutations.
        task_id: the task of every id (single-task benchmarks).
        num_tasks: tasks of a task set (``task_id`` is then each group's task); 1: one task.

    Raises:
        ValueError: if ``groups_per_step`` is not a multiple of ``dp_size`` (and of ``num_tasks``)
            or its share of one task exceeds ``N``.
    """

    num_init_states: int
    groups_per_step: int
    dp_rank: int
    dp_size: int
    seed: int
    task_id: int = 0
    num_tasks: int = 1

    def __post_init__(self) -> None:
        if self.groups_per_step % self.dp_size:
            raise ValueError(
                f"data.init_states_per_step={self.groups_per_step} must be a multiple of the data "
                f"node's DP size {self.dp_size}"
            )
        if self.num_tasks < 1 or self.groups_per_step % self.num_tasks:
            raise ValueError(f"data.init_states_per_step={self.groups_per_step} must be a multiple of the "
                             f"{self.num_tasks} tasks of simulator.tasks")
        if self.groups_per_step // self.num_tasks > self.num_init_states:
            raise ValueError(
                f"data.init_states_per_step={self.groups_per_step} exceeds "
                f"data.num_train_init_states={self.num_init_states}"
            )
        if not 0 <= self.dp_rank < self.dp_size:
            raise ValueError(f"dp_rank {self.dp_rank} outside [0, {self.dp_size})")

    @property
    def steps_per_epoch(self) -> int:
        return self.num_init_states // (self.groups_per_step // self.num_tasks)

    def _shard_of_epoch(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, epoch])
        return rng.permutation(self.num_init_states)[self.dp_rank :: self.dp_size]

    def batch_for_step(self, step: int) -> TensorDict:
        """This shard's initial states of training step ``step`` (0-based).

        Returns:
            TensorDict with batch size ``(groups_per_step // dp_size,)`` and int64 keys
            ``init_state_id``, ``task_id`` and ``uid`` (a step-unique group id).
        """
        per_shard = self.groups_per_step // self.dp_size
        epoch, position = divmod(step, self.steps_per_epoch)
        if self.num_tasks > 1:
            rounds = self.groups_per_step // self.num_tasks
            per_task = [np.random.default_rng([self.seed, epoch, task]).permutation(self.num_init_states)
                        [position * rounds : (position + 1) * rounds] for task in range(self.num_tasks)]
            return self._task_set_batch(per_task, self.dp_rank * per_shard)
        ids = self._shard_of_epoch(epoch)[position * per_shard : (position + 1) * per_shard]
        uid_start = self.dp_rank * per_shard
        return TensorDict(
            {
                keys.INIT_STATE_ID: torch.as_tensor(ids, dtype=torch.int64),
                keys.TASK_ID: torch.full((per_shard,), self.task_id, dtype=torch.int64),
                keys.UID: torch.arange(uid_start, uid_start + per_shard, dtype=torch.int64),
            },
            batch_size=[per_shard],
        )

    def batch_for_refill(self, step: int, refill_round: int) -> TensorDict:
        """This shard's fresh initial states for dynamic sampling's extra round ``refill_round``
        (>= 1) of step ``step``.

        The ids are this shard's part (positions ``dp_rank, dp_rank + dp_size, ...``) of a
        permutation seeded by ``(seed, step, refill_round)``, so the shards of one round are
        disjoint and every round is reproducible. Their ``uid`` values continue after the
        step's own (``refill_round * groups_per_step + ...``), unique within the step.

        Returns:
            TensorDict with batch size ``(groups_per_step // dp_size,)`` and int64 keys
            ``init_state_id``, ``task_id`` and ``uid``.

        Raises:
            ValueError: if ``refill_round < 1``.
        """
        if refill_round < 1:
            raise ValueError(f"refill rounds count from 1 (got {refill_round})")
        per_shard = self.groups_per_step // self.dp_size
        if self.num_tasks > 1:
            rounds = self.groups_per_step // self.num_tasks
            per_task = [np.random.default_rng([self.seed, step, refill_round, task]).permutation(self.num_init_states)
                        [:rounds] for task in range(self.num_tasks)]
            return self._task_set_batch(per_task, refill_round * self.groups_per_step + self.dp_rank * per_shard)
        rng = np.random.default_rng([self.seed, step, refill_round])
        ids = rng.permutation(self.num_init_states)[self.dp_rank :: self.dp_size][:per_shard]
        uid_start = refill_round * self.groups_per_step + self.dp_rank * per_shard
        return TensorDict(
            {
                keys.INIT_STATE_ID: torch.as_tensor(ids, dtype=torch.int64),
                keys.TASK_ID: torch.full((per_shard,), self.task_id, dtype=torch.int64),
                keys.UID: torch.arange(uid_start, uid_start + per_shard, dtype=torch.int64),
            },
            batch_size=[per_shard],
        )

    def _task_set_batch(self, per_task: list[np.ndarray], uid_start: int) -> TensorDict:
        """This shard's block of a task set's step: ``per_task[k]`` holds task ``k``'s ids of the
        step (``groups_per_step / num_tasks`` each), laid out round by round (group ``j`` is task
        ``j mod num_tasks``; see the module docstring)."""
        per_shard = self.groups_per_step // self.dp_size
        tasks = np.tile(np.arange(self.num_tasks), len(per_task[0]))  # (groups_per_step,)
        ids = np.stack(per_task, axis=1).reshape(-1)  # round-major: (groups_per_step,)
        block = slice(self.dp_rank * per_shard, (self.dp_rank + 1) * per_shard)
        return TensorDict(
            {
                keys.INIT_STATE_ID: torch.as_tensor(ids[block], dtype=torch.int64),
                keys.TASK_ID: torch.as_tensor(tasks[block], dtype=torch.int64),
                keys.UID: torch.arange(uid_start, uid_start + per_shard, dtype=torch.int64),
            },
            batch_size=[per_shard],
        )
