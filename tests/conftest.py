"""Shared fixtures: a Ray instance on loopback for the tests that need one."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_on_loopback():
    """Ray started the way the project starts it (every listener on 127.0.0.1)."""
    import ray

    from vla_rl.utils.ray_utils import init_ray

    init_ray(num_cpus=8)
    yield ray
    ray.shutdown()
