"""What a DAG node function sees when a worker runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch.distributed as dist
from pydantic import BaseModel

from vla_rl.config import RunConfig

if TYPE_CHECKING:
    from vla_rl.workers.resources import WorkerResources


@dataclass(frozen=True)
class NodeContext:
    """Context of one node execution on one worker.

    Attributes:
        node_id: the node's id in the template.
        step: training step (0-based).
        rank: this worker's rank; world_size: number of DAG workers.
        dp_rank: which shard of the node's batch this worker holds; dp_size: the node's DP size.
        config: the run's validated global config.
        node_config: the node's validated ``config:`` (None if its function declares no model).
        resources: the worker's long-lived objects (policy, trainer, simulator pool, RNG).
        group: the DAG workers' process group (None: the default group).
    """

    node_id: str
    step: int
    rank: int
    world_size: int
    dp_rank: int
    dp_size: int
    config: RunConfig
    node_config: BaseModel | None
    resources: WorkerResources
    group: dist.ProcessGroup | None = None

    @property
    def replicas(self) -> int:
        """Workers holding the same shard of this node's batch (``world_size // dp_size``)."""
        return self.world_size // self.dp_size
