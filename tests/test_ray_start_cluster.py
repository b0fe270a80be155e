"""Joining a cluster started the way users start one: ``ray start`` (docs/cluster.md, "Rehearse on
one machine"), driven through the ``vla-rl`` command line.

A head and a worker node start with ``ray start`` on this machine, with token authentication
(``RAY_AUTH_MODE=token``, the token from ``ray get-auth-token --generate`` in ``RAY_AUTH_TOKEN``),
each with its own CPUs; ``vla-rl train embodied_srpo workers.ray_address=127.0.0.1:PORT`` runs
from another directory than the nodes', with a relative ``run.output_dir``. Also: a cluster too
small for the run is refused in one line; a driver without the cluster's token is refused in one
line saying where the token comes from; a driver that finds the token in ``~/.ray/auth_token``
joins without ``RAY_AUTH_MODE``; Ctrl-C stops a run waiting for resources within seconds.

Isolation from other Ray instances on the machine (concurrent tests): free ports, a ``HOME`` and a
``--temp-dir`` of the test's own, and teardown by killing the processes of the two ``ray start``
sessions (never ``ray stop``, which stops every Ray of the user).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from vla_rl.dag.loader import REPO_ROOT

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent
RAY, VLA_RL = str(BIN / "ray"), str(BIN / "vla-rl")
CPUS_PER_NODE = 2  # one DAG worker (1 CPU) and its simulator actor (1 CPU) per node
TINY = ["trainer.total_steps=1", "trainer.ppo_mini_batch_size=3", "trainer.ppo_epochs=1",
        "data.init_states_per_step=2", "data.group_size=3", "simulator.env.horizon=40", "eval.num_episodes=2",
        "warm_start.num_demos=2", "warm_start.bc_steps=10", "policy.config.hidden_sizes=[16]"]
MAIN_JOB = [*TINY, "workers.placement_strategy=SPREAD", "run.output_dir=runs", "run.name=run"]


def head_args(port: int, client_port: int, temp_dir: str) -> list[str]:
    return ["start", "--head", f"--port={port}", f"--num-cpus={CPUS_PER_NODE}", "--include-dashboard=false",
            f"--ray-client-server-port={client_port}", "--disable-usage-stats", f"--temp-dir={temp_dir}"]


def worker_args(address: str, temp_dir: str) -> list[str]:
    return ["start", f"--address={address}", f"--num-cpus={CPUS_PER_NODE}", "--disable-usage-stats",
            f"--temp-dir={temp_dir}"]


def train_args(address: str, *overrides: str) -> list[str]:
    return ["train", "embodied_srpo", f"workers.ray_address={address}", *overrides]


#: What the test environment must not pass on: another Ray to join, another token setting, and
#: the loopback-only settings an in-process test's init_ray leaves in os.environ (a worker node
#: refuses to start under RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0).
CLEARED = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "VLA_RL_RAY_CLUSTER",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "GLOO_SOCKET_IFNAME", "MASTER_ADDR")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _kill_session(sid: int) -> None:
    """Kill every process of session ``sid`` (a ``ray start`` started in a session of its own, and
    the Ray processes it left running: GCS, raylet, agents, workers)."""
    for _ in range(3):
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":  # field 6 of stat: the session id
                pids.append(int(entry.name))
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(1)


class RayStartCluster:
    """Two nodes started with ``ray start``; ``env`` is the shell of docs/cluster.md's commands
    (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"  # ray get-auth-token --generate writes ~/.ray/auth_token here
        self.nodes_dir = root / "nodes"  # where `ray start` runs: the workers' working directory
        self.driver_dir = root / "driver"  # where `vla-rl train` runs
        for path in (self.home, self.nodes_dir, self.driver_dir):
            path.mkdir()
        self.temp_dir = tempfile.mkdtemp(prefix="vr", dir="/tmp")  # short: Ray's socket paths live in it
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.base_env = {k: v for k, v in os.environ.items() if k not in CLEARED} | {"HOME": str(self.home)}
        self.base_env.pop("PYTHONPATH", None)  # the venv's editable install is what every node imports
        token = subprocess.run([RAY, "get-auth-token", "--generate"], env=self.base_env, capture_output=True,
                               text=True, timeout=120, check=True).stdout.strip()
        assert token and (self.home / ".ray" / "auth_token").read_text().strip() == token
        self.env = {**self.base_env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
        self.sessions: list[int] = []

    def ray(self, args: list[str]) -> None:
        process = subprocess.Popen([RAY, *args], cwd=self.nodes_dir, env=self.env, start_new_session=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.sessions.append(process.pid)
        output, _ = process.communicate(timeout=180)
        assert process.returncode == 0, output[-3000:]

    def start(self) -> None:
        self.ray(head_args(self.port, _free_port(), self.temp_dir))  # ephemeral: outside Ray's worker ports
        self.ray(worker_args(self.address, self.temp_dir))

    def stop(self) -> None:
        for sid in self.sessions:
            _kill_session(sid)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def train(self, *overrides: str, env: dict[str, str] | None = None, timeout: float = 600
              ) -> subprocess.CompletedProcess[str]:
        """``vla-rl train embodied_srpo`` on the cluster, from the driver's directory."""
        return subprocess.run([VLA_RL, *train_args(self.address, *overrides)], cwd=self.driver_dir,
                              env=self.env if env is None else env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    nodes = RayStartCluster(tmp_path_factory.mktemp("ray_start"))
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()


def _one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


def test_main_job_runs_on_a_ray_start_cluster_through_the_cli(cluster):
    done = cluster.train(*MAIN_JOB)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    run_dir = cluster.driver_dir / "runs" / "run"  # relative to the driver, not to the nodes' directory
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "rollout/success_rate" in r] == [1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps_run"] == 1
    assert len(set(summary["worker_nodes"])) == 2  # SPREAD: one worker per node
    assert (run_dir / "checkpoints").is_dir() and not (cluster.nodes_dir / "runs").exists()


def test_a_cluster_too_small_is_refused_in_one_line(cluster):
    """3 simulator actors per worker (each worker's pool runs 3 environments): 2 x (1 + 3) = 8
    CPUs, the cluster has 4. The driver finds
    the token in ~/.ray/auth_token and joins without RAY_AUTH_MODE (as with a head that `ray start`
    put in token mode by itself because a token existed)."""
    env = {k: v for k, v in cluster.env.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    started = time.monotonic()
    done = cluster.train(*TINY, "simulator.actors_per_worker=3", "run.output_dir=runs", env=env, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    message = _one_line_error(done)
    assert (f"the Ray cluster at {cluster.address} has 4 CPUs in all; this run needs 8 (2 DAG workers x 1 CPU + "
            "6 simulator actors x 1 CPU)") in message, message
    assert "--num-cpus" in message and "simulator.actors_per_worker" in message
    assert time.monotonic() - started < 120


@pytest.mark.parametrize("token", [None, "not-the-clusters-token"])
def test_a_driver_without_the_clusters_token_is_told_where_it_comes_from(cluster, tmp_path, token):
    """No token anywhere: refused before ray.init; another token: Ray refuses it (after its retries)."""
    env = {**cluster.base_env, "HOME": str(tmp_path)}
    if token is not None:
        env["RAY_AUTH_TOKEN"] = token
    done = cluster.train(*TINY, "run.output_dir=runs", env=env, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    message = _one_line_error(done)
    assert message.startswith(f"error: the Ray cluster at {cluster.address} refused this process's authentication "
                              "token"), message
    assert "ray get-auth-token" in message and "RAY_AUTH_TOKEN" in message


HOLD_ALL_CPUS = textwrap.dedent("""
    import sys, time, ray
    ray.init(address=sys.argv[1], logging_level="WARNING")
    group = ray.util.placement_group([{"CPU": float(sys.argv[2])}] * 2, strategy="SPREAD")
    assert group.wait(timeout_seconds=120)
    print("held", flush=True)
    time.sleep(600)
""")


def test_ctrl_c_stops_a_run_waiting_for_resources_within_seconds(cluster):
    """Another job holds every CPU: the run says it waits, and SIGINT ends it in seconds."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_ALL_CPUS, cluster.address, str(CPUS_PER_NODE)],
                              cwd=cluster.driver_dir, env=cluster.env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        # The driver writes to files, not pipes: a pipe nobody reads fills up (Ray's warnings while
        # it waits) and blocks the driver's next write, its Ctrl-C message included. It starts
        # with SIGINT unblocked and at its default, as from a terminal: a child inherits its
        # parent's signal mask and ignored signals, and earlier tests in this pytest process may
        # leave SIGINT blocked (Ray blocks it in the processes it starts).
        out, err = Path(cluster.driver_dir) / "ctrl_c.out", Path(cluster.driver_dir) / "ctrl_c.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            driver = subprocess.Popen([VLA_RL, *train_args(cluster.address, *TINY, "run.output_dir=runs")],
                                      cwd=cluster.driver_dir, env=cluster.env, stdout=stdout, stderr=stderr,
                                      preexec_fn=_as_from_a_terminal)
        try:
            deadline = time.monotonic() + 180
            while "waits for other jobs" not in err.read_text() and time.monotonic() < deadline:
                if driver.poll() is not None:
                    break
                time.sleep(0.5)
            assert "waits for other jobs to release them (Ctrl-C stops)" in err.read_text(), err.read_text()[-3000:]
            time.sleep(3)  # into the placement group's wait
            signals = _signal_state(driver.pid)
            interrupted = time.monotonic()
            driver.send_signal(signal.SIGINT)
            try:
                driver.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the driver still runs 30 s after SIGINT ({signals}); its stderr ends: "
                            f"{err.read_text()[-3000:]}")
            assert time.monotonic() - interrupted < 10, err.read_text()[-3000:]
            assert driver.returncode != 0
        finally:
            if driver.poll() is None:
                driver.kill()
    finally:
        holder.kill()
        holder.wait()


def _as_from_a_terminal() -> None:
    """In the child before exec: SIGINT unblocked and at its default action."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_state(pid: int) -> str:
    """Whether ``pid`` blocks or ignores SIGINT, from /proc (for a failure's message)."""
    fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if line.startswith(("SigBlk", "SigIgn")))
    bit = 1 << (signal.SIGINT - 1)
    return ", ".join(f"{name} {'has' if int(value, 16) & bit else 'lacks'} SIGINT" for name, value in fields.items())


def _doc_commands() -> list[list[str]]:
    """The shell commands of docs/cluster.md's "Rehearse on one machine", split into words."""
    text = (REPO_ROOT / "docs" / "cluster.md").read_text()
    section = text[text.index("## Rehearse on one machine"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


def test_the_docs_give_the_commands_this_test_runs():
    """docs/cluster.md's rehearsal is what the tests above run, with their ports and temp dir."""
    address, temp_dir = "127.0.0.1:6390", "/tmp/vla-rl-ray"
    assert _doc_commands() == [
        ["export", "RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN=$(.venv/bin/ray get-auth-token --generate)"],
        [".venv/bin/ray", *head_args(6390, 20001, temp_dir)],
        [".venv/bin/ray", *worker_args(address, temp_dir)],
        [".venv/bin/vla-rl", *train_args(address, *MAIN_JOB)],
        [".venv/bin/ray", "stop"],
    ]
