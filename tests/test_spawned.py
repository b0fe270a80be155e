"""The tests' multi-process helper (tests/spawned.py): what each worker returns comes back by rank,
a worker's exception fails the call, and nothing is forked from the test process (a forked
manager server inherited a dead process group and hung the FSDP tests after a failure)."""

from __future__ import annotations

import os

import pytest
import torch
from spawned import run_workers
from tensordict import TensorDict


def _records(rank: int, scale: float) -> dict:
    if scale < 0:
        raise ValueError(f"rank {rank} was given a negative scale")
    batch = TensorDict({"x": torch.full((2, 3), scale * rank)}, batch_size=[2])
    return {"rank": rank, "tensor": torch.arange(4) * rank, "batch": batch.to_dict(), "names": ["a", str(rank)]}


def test_each_worker_returns_its_records_without_forking_the_test_process(monkeypatch):
    def no_fork():
        raise AssertionError("the test process forked")

    monkeypatch.setattr(os, "fork", no_fork)
    results = run_workers(_records, 2.5, nprocs=2)
    assert sorted(results) == [0, 1]
    for rank in (0, 1):
        assert results[rank]["rank"] == rank and results[rank]["names"] == ["a", str(rank)]
        assert torch.equal(results[rank]["tensor"], torch.arange(4) * rank)
        assert torch.equal(results[rank]["batch"]["x"], torch.full((2, 3), 2.5 * rank))


def test_a_worker_that_raises_fails_the_call_with_its_error():
    with pytest.raises(Exception, match="negative scale"):
        run_workers(_records, -1.0, nprocs=2)
