"""The one-collective object gather over a real process group with a DAG worker's backend on the
test device (gloo on the CPU; spawned processes, loopback)."""

from __future__ import annotations

import pickle

import torch
import torch.distributed as dist
from devices import device_under_test, pin_collectives_to_loopback, process_group_backend
from spawned import run_workers

from vla_rl.utils.collectives import (
    COUNTERS,
    SMALL_OBJECT_BYTES,
    CommCounters,
    all_gather_small_objects,
    all_reduce,
    all_reduce_cost,
)
from vla_rl.utils.ray_utils import free_loopback_port

CAPACITY = 256


def _object(rank: int, case: str):
    if case == "small":
        return {"rank": rank, "sizes": [rank] * (rank + 1), "name": f"worker {rank}", "none": None}
    # "large": rank 1's pickle exceeds the capacity, rank 0's fits; everybody must fall back together.
    return list(range(1000)) if rank == 1 else ("fits", rank)


def _worker(rank: int, world: int, port: int, case: str) -> list:
    pin_collectives_to_loopback()
    device_under_test()
    dist.init_process_group(process_group_backend(), init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    gathered = all_gather_small_objects(_object(rank, case), capacity=CAPACITY)
    dist.destroy_process_group()
    return gathered


def _run(world: int, case: str) -> dict:
    return run_workers(_worker, world, free_loopback_port(), case, nprocs=world)


def test_every_rank_receives_every_object_by_rank():
    world = 3
    results = _run(world, "small")
    expected = [_object(rank, "small") for rank in range(world)]
    assert [results[rank] for rank in range(world)] == [expected] * world


def test_an_object_over_the_capacity_falls_back_on_every_rank():
    world = 2
    results = _run(world, "large")
    expected = [_object(rank, "large") for rank in range(world)]
    assert [results[rank] for rank in range(world)] == [expected] * world


def test_the_engine_waits_for_other_ranks_through_gloo_never_dist_barrier():
    """``dist.barrier`` of a ``cpu:gloo,cuda:nccl`` group runs on NCCL, whose watchdog aborts the
    workers after 10 minutes while rank 0 writes a 15-45 GB checkpoint or generates
    demonstrations: the engine's barriers are ``cpu_barrier`` (an all-reduce of a CPU value)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "vla_rl"
    offenders = [str(path.relative_to(root)) for path in root.rglob("*.py")
                 if re.search(r"\bdist\.(monitored_)?barrier\(", path.read_text())]
    assert offenders == []


def test_cpu_barrier_reduces_a_cpu_tensor(monkeypatch):
    import torch.distributed as dist

    from vla_rl.utils.collectives import cpu_barrier

    seen = []
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, group=None: seen.append((tensor.device.type, group)))
    cpu_barrier("the group")
    assert seen == [("cpu", "the group")]


def _reduce_worker(rank: int, world: int, port: int) -> dict:
    """Each op of ``all_reduce`` over rank-dependent values, and an object whose pickle is exactly
    the single collective's capacity."""
    pin_collectives_to_loopback()
    device_under_test()
    dist.init_process_group(process_group_backend(), init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    out = {}
    for op in ("sum", "max", "min"):
        values = torch.tensor([float(rank), 10.0 - rank], dtype=torch.float64)
        all_reduce(values, op, tag="test")
        out[op] = values.tolist()
    exactly_full = (b"x" if rank == 0 else b"y") * 49  # pickled: 64 bytes, SMALL_OBJECT_BYTES
    before = COUNTERS.snapshot()
    gathered = all_gather_small_objects(exactly_full, tag="full")
    out["full"] = (gathered, COUNTERS.since(before).tags["full"].collectives)
    dist.destroy_process_group()
    return out


def test_all_reduce_ops_and_an_object_of_exactly_the_capacity():
    assert len(pickle.dumps(b"x" * 49)) == SMALL_OBJECT_BYTES
    world = 2
    results = run_workers(_reduce_worker, world, free_loopback_port(), nprocs=world)
    for rank in range(world):
        assert results[rank]["sum"] == [1.0, 19.0] and results[rank]["max"] == [1.0, 10.0]
        assert results[rank]["min"] == [0.0, 9.0]
        assert results[rank]["full"] == ([b"x" * 49, b"y" * 49], 1)  # it fits: one collective, no fallback


def test_counters_since_a_snapshot_and_merged():
    """``since`` keeps the tags that moved after the snapshot (the phase's ``comm/*`` metrics name
    no idle exchange); ``merged`` adds every count of both."""
    counters = CommCounters()
    counters.add("metrics", 16, 16)
    counters.add("reshard_rows", 100, 40)
    before = counters.snapshot()
    counters.add("reshard_rows", 10, 4)
    counters.add("evaluation", *all_reduce_cost(4, 8))
    delta = counters.since(before)
    assert set(delta.tags) == {"reshard_rows", "evaluation"}
    assert (delta.tags["reshard_rows"].collectives, delta.tags["reshard_rows"].bytes_sent,
            delta.tags["reshard_rows"].bytes_received) == (1, 10, 4)
    assert all_reduce_cost(4, 8) == (12, 12)  # 2 n (W - 1) / W
    both = delta.merged(before)
    assert (both.collectives, both.bytes_sent, both.bytes_received) == (4, 16 + 110 + 12, 16 + 44 + 12)
    assert both.tags["reshard_rows"].bytes_received == 44
