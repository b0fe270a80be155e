"""The device the test suite exercises: ``VLA_RL_TEST_DEVICE`` (``cpu``, the default; ``cuda`` or
``npu`` on an accelerator machine). Unit tests put their policies on :func:`device_under_test` and
their process group on its backend (tests/conftest.py); the end-to-end runs add
:func:`device_overrides` so their DAG workers bind it. On one accelerator the workers of a run
share it (``workers.gpus_per_worker`` below 1) and reduce with gloo, since NCCL refuses two ranks
on one device; FSDP cannot share one that way (:data:`FSDP_NEEDS_AN_ACCELERATOR_PER_WORKER`)."""

from __future__ import annotations

import os

import pytest
import torch

TEST_DEVICE_KIND = os.environ.get("VLA_RL_TEST_DEVICE", "cpu")
KINDS = ("cpu", "cuda", "npu")


def check_test_device() -> str | None:
    """Why ``VLA_RL_TEST_DEVICE`` cannot be used here, or None."""
    if TEST_DEVICE_KIND not in KINDS:
        return f"VLA_RL_TEST_DEVICE={TEST_DEVICE_KIND!r}: use one of {KINDS}"
    if TEST_DEVICE_KIND == "cuda" and not torch.cuda.is_available():
        return "VLA_RL_TEST_DEVICE=cuda but torch.cuda.is_available() is False"
    return None


def device_under_test() -> torch.device:
    """The device of the unit tests' policies and batches (bound as a DAG worker binds it), with
    TF32 off again: a worker computes its float32 matrix products in TF32 (``bind_device``), but
    the unit tests compare float32 results with each other and with hand computations to 1e-5,
    below TF32's rounding (10 mantissa bits: differences of 1e-4 measured on an H200).
    ``scripts/gpu_check.sh`` checks that workers have it on."""
    from vla_rl.utils.device import bind_device

    device = bind_device(TEST_DEVICE_KIND)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return device


#: What a local run's DAG workers set before joining their process group
#: (``DAGWorker.init_process_group``), for the tests' own process groups: gloo and NCCL's bootstrap
#: otherwise listen on the address the host name resolves to or on the first non-loopback
#: interface (a test process on the H200 held a listener on its 192.0.2.2, 2026-12-04; on the CPU
#: machine, with its host name made to resolve to eth0's 192.0.2.2, a gloo group listened there
#: without GLOO_SOCKET_IFNAME and on 127.0.0.1 with ``lo``).
LOOPBACK_COLLECTIVES = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}


def pin_collectives_to_loopback() -> None:
    """Set :data:`LOOPBACK_COLLECTIVES` in this process's environment (gloo reads it when a group
    is made, NCCL once per process, at its first communicator): call it before any process group."""
    os.environ.update(LOOPBACK_COLLECTIVES)


def process_group_backend() -> str:
    """The backend of the tests' process groups: the one a DAG worker on the test device uses."""
    from vla_rl.utils.device import collective_backend

    return collective_backend(TEST_DEVICE_KIND)


def accelerator_count() -> int:
    if TEST_DEVICE_KIND == "cuda":
        return torch.cuda.device_count()
    if TEST_DEVICE_KIND == "npu":
        return torch.npu.device_count()  # type: ignore[attr-defined]
    return 0


def device_overrides(num_workers: int = 2) -> list[str]:
    """Overrides that run a template's ``num_workers`` DAG workers on the test device."""
    if TEST_DEVICE_KIND == "cpu":
        return ["workers.device=cpu"]
    overrides = [f"workers.device={TEST_DEVICE_KIND}"]
    count = accelerator_count()
    if count < num_workers:
        overrides += [f"workers.gpus_per_worker={max(count, 1) / num_workers}", "workers.collective_backend=gloo"]
    return overrides


def _fsdp_skip_reason(num_workers: int = 2) -> str | None:
    if TEST_DEVICE_KIND == "cpu" or accelerator_count() >= num_workers:
        return None
    return (f"FSDP over {num_workers} workers needs {num_workers} accelerators here: sharing one over gloo segfaults "
            "(pytorch/pytorch#132471), and the config refuses it")


#: For end-to-end runs with ``trainer.strategy=fsdp`` over :func:`device_overrides`' two workers:
#: on fewer accelerators than workers they would share one over gloo, which the config refuses.
#: ``scripts/gpu_check.sh`` runs FSDP on one GPU with one worker.
FSDP_NEEDS_AN_ACCELERATOR_PER_WORKER = pytest.mark.skipif(_fsdp_skip_reason() is not None,
                                                          reason=_fsdp_skip_reason() or "")
