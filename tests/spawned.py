"""Run a function on a few spawned worker processes (the tests' process groups over gloo on
loopback) and collect what each returns.

The results travel back through files (``torch.save`` in a temporary directory), not through a
``multiprocessing.Manager``, whose server process is *forked* from the pytest process and inherits
its heap. After a failed test, pytest keeps the traceback's frames, and with them a DDP-wrapped
trainer whose reducer holds a gloo process group; the forked server's garbage collector freed that
copy while pickling the workers' results, and ``ProcessGroupGloo``'s destructor waited forever on
a condition variable whose threads exist only in the parent (seen with py-spy ``--native``):
``tests/trainers/test_fsdp.py``'s fixture hung after a failure in test_ddp_mixed_precision.py
(``pytest tests/trainers/``; under pytest-xdist it hit the 600 s timeout).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp


def _entry(rank: int, fn: Callable[..., Any], args: tuple, out_dir: str) -> None:
    result = fn(rank, *args)
    path = Path(out_dir) / f"{rank}.pt"
    torch.save(result, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").rename(path)  # whole or absent


def run_workers(fn: Callable[..., Any], *args: Any, nprocs: int) -> dict[int, Any]:
    """``fn(rank, *args)`` on ``nprocs`` spawned processes (``fn`` is a module-level function: it
    is pickled); what each returned, by rank. A worker that raises fails the call
    (``torch.multiprocessing.ProcessRaisedException`` with its traceback)."""
    with tempfile.TemporaryDirectory(prefix="spawned_") as out_dir:
        mp.spawn(_entry, args=(fn, args, out_dir), nprocs=nprocs, join=True)
        return {rank: torch.load(Path(out_dir) / f"{rank}.pt", weights_only=False) for rank in range(nprocs)}
