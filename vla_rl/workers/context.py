"""What a DAG node function sees when a worker runs it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch.distributed as dist
from pydantic import BaseModel

from vla_rl.config import RunConfig

if TYPE_CHECKING:
    from tensordict import TensorDict

    from vla_rl.workers.resources import ResourceView


@dataclass(frozen=True)
class NodeContext:
    """Context of one node execution on one worker.

    Attributes:
        node_id: the node's id in the template.
        step: training step (0-based; for an evaluation, the updates done).
        rank: this worker's rank; world_size: number of DAG workers.
        dp_rank: which shard of the node's batch this worker holds; dp_size: the node's DP size.
        config: the run's validated global config.
        node_config: the node's validated ``config:`` (None if its function declares no model).
        resources: the shared facts of the worker (``generator``, ``workflow``, ``device``, ...)
            and the resources the node declared (:class:`~vla_rl.workers.resources.ResourceView`).
        group: the DAG workers' process group (None: the default group).
        tag: the evaluation's name in the ``evaluate`` phase (``warm_start``, ``step_10``,
            ``final``); empty otherwise.
        video: whether this evaluation records videos.
        refill_round: 0 in a step's own pass; ``k >= 1`` when dynamic sampling re-runs the node
            for its ``k``-th extra round (data nodes then load fresh groups).
        rerun_upstream: for a node that refills its input (dynamic sampling): re-runs the nodes
            upstream of it for a refill round and returns their merged output and metrics.
    """

    node_id: str
    step: int
    rank: int
    world_size: int
    dp_rank: int
    dp_size: int
    config: RunConfig
    node_config: BaseModel | None
    resources: ResourceView
    group: dist.ProcessGroup | None = None
    tag: str = ""
    video: bool = False
    refill_round: int = 0
    rerun_upstream: Callable[[int], tuple[TensorDict | None, dict[str, float]]] | None = None

    @property
    def replicas(self) -> int:
        """Workers holding the same shard of this node's batch (``world_size // dp_size``)."""
        return self.world_size // self.dp_size
