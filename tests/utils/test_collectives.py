"""The one-collective object gather over a real process group with a DAG worker's backend on the
test device (gloo on the CPU; spawned processes, loopback)."""

from __future__ import annotations

import torch.distributed as dist
from devices import device_under_test, pin_collectives_to_loopback, process_group_backend
from spawned import run_workers

from vla_rl.utils.collectives import all_gather_small_objects
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
