"""Starting Ray bound to the loopback interface only.

Ray 2.60 listens on every interface by default, even with ``_node_ip_address="127.0.0.1"``;
measured on the project machine, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` in the environment before
Ray starts keeps every listener on 127.0.0.1 (see ../shared/MACHINE_FACTS.md). Usage statistics
are off and the dashboard is off unless asked for.
"""

from __future__ import annotations

import math
import os

LOOPBACK = "127.0.0.1"

#: Environment every Ray process of a run gets: loopback-only networking for Ray and gloo,
#: one thread per process (2-core machines), headless MuJoCo rendering.
WORKER_ENV: dict[str, str] = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "GLOO_SOCKET_IFNAME": "lo",
    "MASTER_ADDR": LOOPBACK,
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"),
    "PYOPENGL_PLATFORM": os.environ.get("PYOPENGL_PLATFORM", "egl"),
    "TOKENIZERS_PARALLELISM": "false",
}


def init_ray(num_cpus: float | None = None, include_dashboard: bool = False) -> None:
    """Start a local Ray instance whose every listener is on 127.0.0.1 (no-op if already started).

    Args:
        num_cpus: logical CPU resources Ray may hand out (actors reserve from it), rounded up to
            a whole number; None lets Ray count the machine's cores. Ray hands
            ``min(cpu_count, num_cpus)`` to the raylet as an int32 flag
            (``--maximum_startup_concurrency``): a float such as ``5.0`` on a machine with more
            than 5 cores makes the raylet exit at start-up, and ``ray.init`` then fails after
            30 s with "The current node timed out during startup".
        include_dashboard: start the dashboard (on 127.0.0.1); off by default.
    """
    # Ray reads these when it is imported and when it starts its processes: set them first.
    for key in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_USAGE_STATS_ENABLED", "GLOO_SOCKET_IFNAME"):
        os.environ[key] = WORKER_ENV[key]
    import ray
    from ray._private import ray_constants

    if ray.is_initialized():
        return
    # Ray reads the variable once, when ray_constants is imported; a Ray imported before this
    # function ran (by a test runner, a notebook) gets the same setting here.
    ray_constants.ENABLE_RAY_CLUSTER = False
    ray.init(
        _node_ip_address=LOOPBACK,
        include_dashboard=include_dashboard,
        dashboard_host=LOOPBACK,
        num_cpus=None if num_cpus is None else math.ceil(num_cpus),
        log_to_driver=True,
        configure_logging=True,
        logging_level="WARNING",
        runtime_env={"env_vars": dict(WORKER_ENV)},
    )


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for the torch.distributed rendezvous)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])
