"""Starting Ray bound to the loopback interface only, or joining an existing Ray cluster.

Ray 2.60 listens on every interface by default, even with ``_node_ip_address="127.0.0.1"``;
measured on the project machine, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` in the environment before
Ray starts keeps every listener on 127.0.0.1 (see ../shared/MACHINE_FACTS.md). Usage statistics
are off and the dashboard is off unless asked for.

A cluster started with ``ray start`` (or KubeRay) is joined at the address it was given; the
driver attaches to whichever of its nodes runs on this machine, whatever address that node
registered (``ray start --node-ip-address=127.0.0.1`` registers the machine's routable address
on Linux). Token authentication (Ray >= 2.52; since 2.59 ``ray start --head`` turns it on when a
token exists): the driver uses ``RAY_AUTH_MODE`` as set, and when it is unset but a token is found
(``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH`` names, or ``~/.ray/auth_token``) and the
cluster requires one, it turns token mode on (:func:`use_token_auth_if_available`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import unittest.mock

from vla_rl.errors import RunStopped
from vla_rl.utils.console import WORKER_BARS

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


def init_ray(num_cpus: float | None = None, address: str | None = None) -> None:
    """Start a local Ray instance whose every listener is on 127.0.0.1, or join a cluster
    (no-op if Ray is already initialised).

    Args:
        num_cpus: logical CPU resources Ray may hand out (actors reserve from it), rounded up to
            a whole number; None lets Ray count the machine's cores. Ray hands
            ``min(cpu_count, num_cpus)`` to the raylet as an int32 flag
            (``--maximum_startup_concurrency``): a float such as ``5.0`` on a machine with more
            than 5 cores makes the raylet exit at start-up, and ``ray.init`` then fails after
            30 s with "The current node timed out during startup". Ignored when joining.
        address: a Ray cluster to join (``auto``, ``host:port``, ``ray://host:port``); its
            nodes' addresses are used, so the loopback settings do not apply (except to a
            cluster reached at 127.0.0.1, whose nodes all run on this machine, such as the
            tests'). The driver attaches to the cluster's node on this machine, and uses token
            authentication when the user has a token (:func:`use_token_auth_if_available`). The
            workers then get ``VLA_RL_RAY_CLUSTER=1`` (:func:`joined_cluster`). Without it, a new
            local instance starts even when another run's Ray is up on the machine.

    Raises:
        RunStopped: the cluster cannot be joined (one line: the address and Ray's reason; for a
            refused authentication token, where the token comes from).
        Terminated: SIGTERM came while Ray started, in a ``vla-rl`` command
            (:func:`~vla_rl.utils.signals.interrupts_deferred`: raised once ``ray.init`` is done).
        KeyboardInterrupt: Ctrl-C came while Ray started, in a ``vla-rl`` command (the same).
    """
    loopback = address is None or _is_loopback(address)
    if loopback:
        # Ray reads these when it is imported and when it starts its processes: set them first.
        for key in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_USAGE_STATS_ENABLED", "GLOO_SOCKET_IFNAME"):
            os.environ[key] = WORKER_ENV[key]
    import ray
    from ray._private import ray_constants

    from vla_rl.utils.signals import interrupts_deferred

    if ray.is_initialized():
        return
    with interrupts_deferred() as deferring, contextlib.ExitStack() as stack:
        if deferring:  # Ray's handler (sys.exit(15)) would end ray.init anywhere: ours records it meanwhile
            stack.enter_context(unittest.mock.patch.object(ray._private.utils, "set_sigterm_handler",
                                                           lambda handler: None))
        _init(ray, ray_constants, address, loopback, num_cpus)


def _init(ray, ray_constants, address: str | None, loopback: bool, num_cpus: float | None) -> None:
    """:func:`init_ray`'s ``ray.init``, Ray not yet initialised."""
    from simulators.rendering import user_rendering_env_vars

    worker_env = {**WORKER_ENV, **user_rendering_env_vars(), WORKER_BARS: "1" if sys.stderr.isatty() else "0"}
    if loopback:
        # Ray reads the variable once, when ray_constants is imported; a Ray imported before this
        # function ran (by a test runner, a notebook) gets the same setting here.
        ray_constants.ENABLE_RAY_CLUSTER = False
    if address is not None:
        env = worker_env if loopback else {k: v for k, v in worker_env.items() if k not in LOOPBACK_ONLY}
        use_token_auth_if_available(check_reachable(address))
        os.environ["VLA_RL_RAY_CLUSTER"] = "1"
        try:
            # No _node_ip_address: Ray finds the node of this machine in the cluster, whatever
            # address it registered (a `ray start` node given 127.0.0.1 registers another one).
            ray.init(address=address, log_to_driver=True, configure_logging=True, logging_level="WARNING",
                     runtime_env={"env_vars": {**env, "VLA_RL_RAY_CLUSTER": "1"}})
        except (ConnectionError, ValueError) as error:  # ValueError: an address Ray cannot parse
            raise RunStopped(join_error_message(address, error)) from None
        except SystemExit as error:  # Ray's driver exits when it loses the cluster's GCS while joining
            raise RunStopped(f"cannot join the Ray cluster at {address}: Ray gave up reaching it (it would have ended "
                             f"this process with status {error.code}); {JOIN_HELP}") from None
        return
    # A new local instance listening on loopback only: Ray's notice that it turned token
    # authentication on (a token exists in ~/.ray) or left it off says nothing to act on here.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    ray.init(
        address="local",  # a new instance, never another run's cluster found in /tmp/ray
        _node_ip_address=LOOPBACK,
        include_dashboard=False,
        dashboard_host=LOOPBACK,
        num_cpus=None if num_cpus is None else math.ceil(num_cpus),
        log_to_driver=True,
        configure_logging=True,
        logging_level="WARNING",
        runtime_env={"env_vars": worker_env},
    )


AUTH_HELP = ("set RAY_AUTH_TOKEN to the cluster's token (`ray get-auth-token` on the head node prints it), or "
             "put it in ~/.ray/auth_token or in the file RAY_AUTH_TOKEN_PATH names; docs/cluster.md")


#: The processes of a local Ray instance without which no Ray call can finish.
_RAY_CORE_PROCESSES = ("gcs_server", "raylet")


def local_ray_lost() -> list[str]:
    """The core processes (GCS, raylet) of the Ray instance this driver started that have died:
    a SIGTERM sent to the whole process group (GNU ``timeout``, Slurm, systemd do) reaches them as
    well as the driver, and a Ray call after it waits for them (killing the workers' actors and
    placement group hung for a minute, then Ray ended the process with status 1). Empty when none
    did, Ray is not initialised, or it was joined (this driver started none of its processes).
    """
    worker = sys.modules.get("ray._private.worker")
    node = getattr(worker, "_global_node", None) if worker is not None else None
    if node is None:
        return []
    return sorted({kind for kind, _ in node.dead_processes() if kind in _RAY_CORE_PROCESSES})


def use_token_auth_if_available(address: str) -> bool:
    """Before joining the cluster at ``address``: turn Ray's token authentication on for this
    process when ``RAY_AUTH_MODE`` is unset, the cluster requires a token
    (:func:`cluster_requires_token`) and one is found (``RAY_AUTH_TOKEN``, the file
    ``RAY_AUTH_TOKEN_PATH`` names, ``~/.ray/auth_token``). A head started with ``ray start --head``
    where a token exists requires it (Ray >= 2.59) while ``ray.init(address=...)`` alone connects
    without one and is refused; token mode is not turned on for a cluster without authentication,
    whose processes would then be refused by this driver's own server. ``RAY_AUTH_MODE`` set
    (``token`` or ``disabled``) is kept as it is.

    Returns:
        Whether this process uses token authentication.

    Raises:
        RunStopped: the cluster requires a token and this process has none (saying where it comes from).
    """
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode:
        return mode.lower() == "token"
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:  # a Ray without token authentication (< 2.52)
        return False
    if not cluster_requires_token(address):
        return False
    try:
        found = AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True)
    except Exception:  # noqa: BLE001  (RAY_AUTH_TOKEN_PATH names a missing file: ray.init says so)
        return False
    if not found:
        raise RunStopped(token_refused_message(address))
    os.environ["RAY_AUTH_MODE"] = "token"
    Config.initialize("")  # Ray caches its config: let this process see token mode
    return True


def cluster_requires_token(address: str, connect_timeout_s: float = 3.0) -> bool:
    """Whether the Ray cluster at ``host:port`` refuses a client without a token (a single GCS
    request, without one). False for ``auto`` and ``ray://`` addresses (Ray applies its own rule),
    and for a GCS that cannot be reached (``ray.init`` then says why)."""
    target = None if "://" in address else _host_port(address)
    if target is None or _connection_error(*target, connect_timeout_s) is not None:
        return False
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        with _quiet_stderr():  # Ray's C++ client logs the refusal it is asked to provoke
            GcsClient(address=address)
    except AuthenticationError:
        return True
    except Exception:  # noqa: BLE001  (anything else: ray.init reports it)
        return False
    return False


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 sent to /dev/null for the block (C++ code writes there directly)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def token_refused_message(address: str) -> str:
    """One line for a cluster that requires a token this process lacks (or has another of)."""
    mode = os.environ.get("RAY_AUTH_MODE") or "unset"
    return (f"the Ray cluster at {address} refused this process's authentication token (RAY_AUTH_MODE={mode}): it "
            f"was started with token authentication and this process has no token or another one; {AUTH_HELP}")


JOIN_HELP = ("check that `ray start` runs there and the address and port are those it printed (workers.ray_address "
             "or RAY_ADDRESS)")
#: Seconds :func:`check_reachable` waits for a TCP connection.
REACHABLE_TIMEOUT_S = 10.0


def check_reachable(address: str, timeout_s: float = REACHABLE_TIMEOUT_S) -> str:
    """Refuse a cluster address where nothing accepts a TCP connection, at once: Ray's own join
    retries for minutes (327 s in one measurement with Ray 2.60 on the 2-core machine, logging
    "Failed to connect to GCS" every few seconds) and then ends the process with status 15 and no
    message; SIGTERM does not stop it meanwhile (Ray waits in native code). ``auto`` is resolved
    as Ray resolves it (:func:`resolve_address`): a ``/tmp/ray/ray_current_cluster`` left by a
    cluster that is gone made the same wait (11 minutes measured).

    Returns:
        The address resolved: ``host:port`` or ``ray://host:port``.

    Raises:
        RunStopped: ``address`` is none of ``auto``, ``host:port`` and ``ray://host:port``, ``auto``
            finds no cluster, or the connection failed (refused, unreachable, unknown host, timed
            out); the message names the address (and what ``auto`` resolved to) and Ray's
            ``ray start``.
    """
    resolved = resolve_address(address)
    error = _connection_error(*_host_port(resolved), timeout_s)
    if error is not None:
        shown = address if resolved == address else f"{address} ({resolved})"
        raise RunStopped(f"cannot join the Ray cluster at {shown}: nothing accepts connections there "
                         f"({type(error).__name__}: {error}); {JOIN_HELP}")
    return resolved


def resolve_address(address: str) -> str:
    """The ``host:port`` (or ``ray://host:port``) of a cluster address: ``auto`` as Ray resolves
    it (``RAY_ADDRESS``, else the latest ``ray start`` of this machine, which
    ``/tmp/ray/ray_current_cluster`` records, else a Ray instance running here:
    ``ray._private.services.get_ray_address_from_environment``); any other as given.

    Raises:
        RunStopped: ``address`` is no ``auto``, ``host:port`` or ``ray://host:port`` with a port
            in [1, 65535] (Ray raised a ValueError traceback), or ``auto`` finds no cluster.
    """
    if address == "auto":
        from ray._private.services import get_ray_address_from_environment

        try:
            resolved = get_ray_address_from_environment("auto", None)
        except ConnectionError as error:
            raise RunStopped(f"cannot join a Ray cluster at auto: {error}") from None
    else:
        resolved = address
    if _host_port(resolved) is None or ("://" in resolved and not resolved.startswith("ray://")):
        raise RunStopped(f"{resolved!r} is no Ray cluster address (workers.ray_address or RAY_ADDRESS): give the "
                         "host:port `ray start --head` printed, ray://host:port (Ray Client) or auto")
    return resolved


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``host:port`` (or ``ray://host:port``) address with a port in
    [1, 65535]; None for anything else (``auto`` included)."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() and 0 < int(port) < 65536 else None


def _connection_error(host: str, port: int, timeout_s: float) -> OSError | None:
    """Why a TCP connection to ``host:port`` failed within ``timeout_s``, or None if it was accepted."""
    import socket

    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as error:
        return error
    return None


def join_error_message(address: str, error: BaseException) -> str:
    """One line for a failed ``ray.init(address=...)``: an authentication failure says where
    the token comes from; anything else names the address and Ray's reason."""
    text, cause = str(error), error
    for _ in range(8):  # Ray's reason is further down the chain
        if (cause := cause.__cause__ or cause.__context__) is None:
            break
        text += f"\n{type(cause).__name__}: {cause}"
    if "InvalidAuthToken" in text or "token is missing or incorrect" in text or "AuthenticationError" in text:
        return token_refused_message(address)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    return f"cannot join the Ray cluster at {address}: {first}; {JOIN_HELP}"


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
