"""Starting Ray the project's way, and joining a cluster: the token authentication a driver
uses and the one line a refused join gives (vla_rl.utils.ray_utils; end to end on a `ray start`
cluster: tests/test_ray_start_cluster.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time

import pytest

START_ON_16_CORES = textwrap.dedent("""
    import multiprocessing
    multiprocessing.cpu_count = lambda: 16  # a 16-core workstation or GPU node
    import ray
    from vla_rl.utils.ray_utils import init_ray
    init_ray(num_cpus=2 * (1.0 + 1 * 1.0) + 1)  # what the driver reserves for the main job: 5.0
    print("CPU", ray.cluster_resources()["CPU"])
    ray.shutdown()
""")


def test_ray_starts_on_a_machine_with_more_cores_than_the_run_reserves():
    """Regression: Ray hands ``min(cpu_count, num_cpus)`` to the raylet as an int32 flag; a float
    ``num_cpus`` (5.0) below the core count made the raylet exit and ``ray.init`` time out.
    A fresh interpreter, so that the patched core count is what Ray reads when it starts."""
    done = subprocess.run([sys.executable, "-c", START_ON_16_CORES], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "CPU 5.0" in done.stdout


START_LOCAL = textwrap.dedent("""
    import ray
    from vla_rl.utils.ray_utils import init_ray
    init_ray(num_cpus=1)
    print("CPU", ray.cluster_resources()["CPU"])
    ray.shutdown()
""")


def test_a_local_run_where_a_token_exists_starts_without_rays_token_notice(tmp_path):
    """A user who once ran ``ray get-auth-token --generate`` has ~/.ray/auth_token: Ray then turns
    token authentication on for every local instance and warns about it on the console of a run
    that listens on loopback only."""
    import os

    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("0123456789abcdef" * 4)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {"HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", START_LOCAL], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "CPU 1.0" in done.stdout
    assert "Token authentication" not in done.stderr, done.stderr


def test_a_refused_token_is_reported_in_one_line_saying_where_the_token_comes_from(monkeypatch):
    """Ray's ConnectionError names only the address; its cause holds the authentication error."""
    from vla_rl.utils.ray_utils import join_error_message

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    try:
        try:
            raise RuntimeError("Failed to connect to GCS. Last connection error: ray.exceptions.AuthenticationError: "
                               "RPC error: InvalidAuthToken: Authentication token is missing or incorrect.")
        except RuntimeError as cause:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from cause
    except ConnectionError as error:
        message = join_error_message("10.0.0.1:6379", error)
    assert "\n" not in message
    assert message.startswith("the Ray cluster at 10.0.0.1:6379 refused this process's authentication token "
                              "(RAY_AUTH_MODE=unset)")
    assert "RAY_AUTH_TOKEN" in message and "ray get-auth-token" in message and "~/.ray/auth_token" in message
    other = join_error_message("10.0.0.1:6379", ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379"))
    assert other.startswith("cannot join the Ray cluster at 10.0.0.1:6379: Failed to connect")


def test_an_address_where_nothing_listens_is_refused_at_once_naming_it(monkeypatch):
    """Ray's own join retried for minutes (327 s measured) and then ended the process with status
    15, no message."""
    import ray

    from vla_rl.errors import RunStopped
    from vla_rl.utils.ray_utils import free_loopback_port, init_ray

    port = free_loopback_port()  # nothing listens there
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # whatever Ray another test started
    monkeypatch.setattr(ray, "init", lambda **kwargs: pytest.fail("ray.init was called"))
    started = time.monotonic()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(RunStopped, match=rf"cannot join the Ray cluster at {address}: nothing accepts connections "
                                             r"there \(ConnectionRefusedError: .*check that `ray start` runs there"):
            init_ray(address=address)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("address", ["garbage", "127.0.0.1:99999", "127.0.0.1", "http://127.0.0.1:6379", "local"])
def test_an_address_that_is_none_is_refused_in_one_line(address, monkeypatch):
    """`workers.ray_address=garbage` was a Ray traceback (ValueError: Invalid address format), a
    port out of range a ConnectionRefusedError."""
    import ray

    from vla_rl.errors import RunStopped
    from vla_rl.utils.ray_utils import init_ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: pytest.fail("ray.init was called"))
    with pytest.raises(RunStopped, match=rf"^'{re.escape(address)}' is no Ray cluster address \(workers.ray_address "
                                         r"or RAY_ADDRESS\): give the host:port `ray start --head` printed, "
                                         r"ray://host:port \(Ray Client\) or auto$"):
        init_ray(address=address)


def test_auto_is_resolved_as_ray_does_and_a_cluster_that_is_gone_refused_at_once(monkeypatch, tmp_path):
    """`auto` was left to Ray: with /tmp/ray/ray_current_cluster left by a cluster that is gone,
    Ray waited 11 minutes, deaf to SIGTERM, before failing."""
    import ray
    from ray._private import services

    from vla_rl.errors import RunStopped
    from vla_rl.utils.ray_utils import free_loopback_port, init_ray, resolve_address

    port = free_loopback_port()  # nothing listens there
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # no Ray instance runs on this machine (one that does, e.g. a run beside the tests, is Ray's
    # choice for `auto` over the recorded cluster: it is Ray's "legacy" order)
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: [])
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # Ray's temp dir: where `ray start` records its cluster
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}\n")
    assert resolve_address("auto") == f"127.0.0.1:{port}"
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: pytest.fail("ray.init was called"))
    started = time.monotonic()
    with pytest.raises(RunStopped, match=rf"^cannot join the Ray cluster at auto \(127.0.0.1:{port}\): nothing "
                                         r"accepts connections there \(ConnectionRefusedError"):
        init_ray(address="auto")
    assert time.monotonic() - started < 5
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port + 1}")  # Ray's order: RAY_ADDRESS first
    assert resolve_address("auto") == f"127.0.0.1:{port + 1}"


def test_token_mode_is_left_as_the_user_set_it_and_not_probed_for(monkeypatch):
    from vla_rl.utils import ray_utils

    monkeypatch.setattr(ray_utils, "cluster_requires_token", lambda address: pytest.fail("probed"))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert ray_utils.use_token_auth_if_available("10.0.0.1:6379") is False
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert ray_utils.use_token_auth_if_available("10.0.0.1:6379") is True


def test_only_a_reachable_host_port_is_probed_for_token_authentication():
    from vla_rl.utils.ray_utils import cluster_requires_token, free_loopback_port

    assert cluster_requires_token("auto") is False
    assert cluster_requires_token("ray://10.0.0.1:10001") is False
    started = time.monotonic()
    assert cluster_requires_token(f"127.0.0.1:{free_loopback_port()}") is False  # nothing listens there
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("tty, expected", [(True, "1"), (False, "0")])
def test_workers_draw_progress_bars_only_for_a_driver_on_a_terminal(tty, expected, monkeypatch):
    """In a log file each redraw of a worker's bar was a fragment of its own, twice, with colour
    codes, on one line of up to 8,000 characters (a helper audit of the main job's log)."""
    import io

    import ray

    from vla_rl.utils import console, ray_utils

    class Stderr(io.StringIO):
        def isatty(self) -> bool:
            return tty

    started = {}
    monkeypatch.setattr(sys, "stderr", Stderr())
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # whatever Ray another test started
    monkeypatch.setattr(ray, "init", lambda **kwargs: started.update(kwargs))
    ray_utils.init_ray(num_cpus=1)
    assert started["runtime_env"]["env_vars"][console.WORKER_BARS] == expected
    monkeypatch.setenv(console.WORKER_BARS, expected)  # as a worker sees it
    assert console.worker_bars() is tty
