"""Where workers run: the device kind from the cluster's resources, each worker's bundle, and
the refusal of NCCL ranks sharing one GPU (vla_rl/workers/placement.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from vla_rl.config import WorkersSection
from vla_rl.workers.placement import (
    check_accelerator_sharing,
    resolve_device,
    worker_bundle,
)


@pytest.mark.parametrize(("kind", "resources", "expected"), [
    ("auto", {"CPU": 16.0, "GPU": 8.0}, "cuda"),
    ("auto", {"CPU": 16.0, "NPU": 8.0}, "npu"),
    ("auto", {"CPU": 16.0, "GPU": 0.0}, "cpu"),
    ("cpu", {"CPU": 16.0, "GPU": 8.0}, "cpu"),
    ("cuda", {"CPU": 2.0}, "cuda"),  # asked for: Ray's placement names the missing GPU
])
def test_auto_picks_the_accelerator_the_cluster_has(kind, resources, expected):
    assert resolve_device(kind, resources) == expected


def test_a_worker_bundle_holds_its_cpus_and_its_accelerator_share():
    workers = WorkersSection(num_cpus_per_worker=4, gpus_per_worker=0.5)
    assert worker_bundle(workers, "cpu") == {"CPU": 4.0}
    assert worker_bundle(workers, "cuda") == {"CPU": 4.0, "GPU": 0.5}
    assert worker_bundle(workers, "npu") == {"CPU": 4.0, "NPU": 0.5}


def test_nccl_ranks_sharing_a_gpu_are_refused_with_the_fields_to_change():
    shared = WorkersSection(gpus_per_worker=0.5)
    with pytest.raises(ValueError, match=r"workers.gpus_per_worker=0.5 .* workers.collective_backend=gloo"):
        check_accelerator_sharing(shared, "cuda", world_size=2)
    with pytest.raises(ValueError, match="hccl"):
        check_accelerator_sharing(shared, "npu", world_size=2)
    check_accelerator_sharing(shared, "cuda", world_size=1)
    check_accelerator_sharing(shared, "cpu", world_size=2)
    check_accelerator_sharing(WorkersSection(gpus_per_worker=0.5, collective_backend="gloo"), "cuda", world_size=2)
    check_accelerator_sharing(WorkersSection(gpus_per_worker=1.0), "cuda", world_size=8)


@pytest.mark.parametrize("backend", ["gloo", "nccl", "cpu:gloo,cuda:nccl", "cpu:gloo,cuda:gloo", "cpu:gloo,npu:hccl"])
def test_collective_backend_accepts_torch_backend_strings(backend):
    assert WorkersSection(collective_backend=backend).collective_backend == backend


@pytest.mark.parametrize("backend", ["glo", "cuda:nccl,tpu:xla", "cpu:", ""])
def test_collective_backend_refuses_anything_else(backend):
    with pytest.raises(ValidationError, match="collective_backend"):
        WorkersSection(collective_backend=backend)
