"""Starting Ray bound to the loopback interface only, or joining an existing Ray cluster.

Ray 2.60 listens on every interface by default, even with ``_node_ip_address="127.0.0.1"``;
measured on the project machine, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` in the environment before
Ray starts keeps every listener on 127.0.0.1 (see ../shared/MACHINE_FACTS.md). Usage statistics
are off and the dashboard is off unless asked for.
"""

from __future__ import annotations

import math
import os

LOOPBACK = "127.0.0.1"

#: Environment every Ray process of a local run gets: loopback-only networking for Ray and gloo,
#: one thread per process (2-core machines). A run that joins a cluster keeps all but the loopback
#: settings (:data:`LOOPBACK_ONLY`). The rendering variables the user set (``MUJOCO_GL``,
#: ``PYOPENGL_PLATFORM``, ``MUJOCO_EGL_DEVICE_ID``) are added by :func:`init_ray`; unset, each
#: simulator process chooses its backend and GPU itself (``simulators/rendering.py``).
WORKER_ENV: dict[str, str] = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "GLOO_SOCKET_IFNAME": "lo",
    "MASTER_ADDR": LOOPBACK,
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
LOOPBACK_ONLY = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "GLOO_SOCKET_IFNAME", "MASTER_ADDR")
"""The settings of :data:`WORKER_ENV` that pin a local run to loopback."""


def cluster_address(configured: str | None) -> str | None:
    """The Ray cluster a run joins: ``workers.ray_address``, else ``RAY_ADDRESS``, else None (local)."""
    return configured or os.environ.get("RAY_ADDRESS") or None


def joined_cluster() -> bool:
    """Whether this process's Ray is a cluster it joined (not a local instance it started)."""
    return os.environ.get("VLA_RL_RAY_CLUSTER") == "1"


def init_ray(num_cpus: float | None = None, include_dashboard: bool = False, address: str | None = None) -> None:
    """Start a local Ray instance whose every listener is on 127.0.0.1, or join a cluster
    (no-op if Ray is already initialised).

    Args:
        num_cpus: logical CPU resources Ray may hand out (actors reserve from it), rounded up to
            a whole number; None lets Ray count the machine's cores. Ray hands
            ``min(cpu_count, num_cpus)`` to the raylet as an int32 flag
            (``--maximum_startup_concurrency``): a float such as ``5.0`` on a machine with more
            than 5 cores makes the raylet exit at start-up, and ``ray.init`` then fails after
            30 s with "The current node timed out during startup". Ignored when joining.
        include_dashboard: start the dashboard (on 127.0.0.1); off by default.
        address: a Ray cluster to join (``auto``, ``host:port``, ``ray://host:port``); its
            nodes' addresses are used, so the loopback settings do not apply (except to a
            cluster on 127.0.0.1, such as the tests' nodes on one machine). The workers then get
            ``VLA_RL_RAY_CLUSTER=1`` (:func:`joined_cluster`). Without it, a new local instance
            starts even when another run's Ray is up on the machine.
    """
    loopback = address is None or _is_loopback(address)
    if loopback:
        # Ray reads these when it is imported and when it starts its processes: set them first.
        for key in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_USAGE_STATS_ENABLED", "GLOO_SOCKET_IFNAME"):
            os.environ[key] = WORKER_ENV[key]
    import ray
    from ray._private import ray_constants

    from simulators.rendering import user_rendering_env_vars

    if ray.is_initialized():
        return
    worker_env = {**WORKER_ENV, **user_rendering_env_vars()}
    if loopback:
        # Ray reads the variable once, when ray_constants is imported; a Ray imported before this
        # function ran (by a test runner, a notebook) gets the same setting here.
        ray_constants.ENABLE_RAY_CLUSTER = False
    if address is not None:
        env = worker_env if loopback else {k: v for k, v in worker_env.items() if k not in LOOPBACK_ONLY}
        os.environ["VLA_RL_RAY_CLUSTER"] = "1"
        ray.init(address=address, _node_ip_address=LOOPBACK if loopback else None, log_to_driver=True,
                 configure_logging=True, logging_level="WARNING",
                 runtime_env={"env_vars": {**env, "VLA_RL_RAY_CLUSTER": "1"}})
        return
    ray.init(
        address="local",  # a new instance, never another run's cluster found in /tmp/ray
        _node_ip_address=LOOPBACK,
        include_dashboard=include_dashboard,
        dashboard_host=LOOPBACK,
        num_cpus=None if num_cpus is None else math.ceil(num_cpus),
        log_to_driver=True,
        configure_logging=True,
        logging_level="WARNING",
        runtime_env={"env_vars": worker_env},
    )


def _is_loopback(address: str) -> bool:
    """Whether a Ray address points at this machine's loopback (a test cluster of local nodes)."""
    host = address.split("://")[-1].rsplit(":", 1)[0]
    return host in (LOOPBACK, "localhost")


def rendezvous_address() -> str:
    """Where rank 0 hosts the process group's TCP store: 127.0.0.1 in a local run, its node's
    address in a cluster it joined (the other ranks may be on other nodes)."""
    if not joined_cluster():
        return LOOPBACK
    import ray

    return ray.util.get_node_ip_address()


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for the torch.distributed rendezvous)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])
