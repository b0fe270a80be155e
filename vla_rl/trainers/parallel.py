"""Wrapping a trained module for data parallelism over the DAG workers.

``torch.nn.parallel.DistributedDataParallel`` without a buffer broadcast before every forward:
the modules' buffers (normalisation statistics, rotary frequencies) are set before training,
identically on every worker, and never changed by it.
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

#: Whether this torch's DDP has ``forward_sync_buffers`` (torch 2.13): it keeps the buffer sync at
#: construction and drops the one before every forward; older versions have only
#: ``broadcast_buffers``, whose ``False`` drops both (harmless here: the buffers agree already).
_HAS_FORWARD_SYNC_BUFFERS = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters


def data_parallel(module: torch.nn.Module, group: dist.ProcessGroup | None = None) -> DistributedDataParallel:
    """``module`` wrapped in DDP over ``group`` (its parameters on this worker's device)."""
    if _HAS_FORWARD_SYNC_BUFFERS:
        return DistributedDataParallel(module, process_group=group, forward_sync_buffers=False)
    return DistributedDataParallel(module, process_group=group, broadcast_buffers=False)
