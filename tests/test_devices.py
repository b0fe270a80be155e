"""The test harness's device settings (tests/devices.py, the ``process_group`` fixture)."""

from __future__ import annotations

import os

import psutil
import torch
import torch.distributed as dist
from devices import LOOPBACK_COLLECTIVES
from listeners import is_loopback


def test_the_tests_process_group_listens_on_loopback_only(process_group, device):
    """The fixture's group is on loopback as a local run's workers are: gloo's listener and, on
    CUDA, NCCL's bootstrap ones. On the H200 (2026-12-04) a test process held a listener on the
    host's own address; here the host name resolves to 127.0.0.1, so the environment the fixture
    sets is checked too."""
    for key, value in LOOPBACK_COLLECTIVES.items():
        assert os.environ.get(key) == value, key
    dist.all_reduce(torch.ones(1))  # gloo's connections exist now
    dist.all_reduce(torch.ones(1, device=device))  # and on CUDA, NCCL's communicator
    listening = [conn.laddr.ip for conn in psutil.Process().net_connections(kind="inet")
                 if conn.status == psutil.CONN_LISTEN]
    assert listening, "gloo's listener was not found"
    assert all(map(is_loopback, listening)), listening
