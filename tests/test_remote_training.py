"""RL on remote environments through the CLI, on loopback: ``vla-rl train embodied_srpo
simulator.name=remote`` with robosuite Lift environments in two client processes
(``vla-rl remote-env robosuite_lift``) presenting the run's token.

- 3 SRPO steps on remote environments give the metrics the local simulator pool gives at the
  same seed (the environments are the same; only where they run differs);
- a client process that ends mid-step (tests/remote_dying_client.py: ``os._exit``, as ``kill -9``)
  loses its running episodes, which are counted, and the run goes on with the other process;
- a client with a wrong token is refused (it exits with one line);
- a run no client connects to stops in one line saying where to connect.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vla_rl.cli import main

pytestmark = pytest.mark.e2e

HORIZON, TOKEN = 20, "s3cret"
COMPACT_STATE = "[robot0_eef_pos,robot0_gripper_qpos,cube_pos,gripper_to_cube_pos]"
DATASET = Path(__file__).parent / "fixtures" / "lerobot" / "lift_scripted_demos"  # 2 demos, that 11-value state
COMPARED = {"rollout/success_rate", "rollout/env_steps", "rollout/total_env_steps", "rollout/episode_length",
            "rollout/lost_episodes", "rollout/group_success_any"}
COMPARED_PREFIXES = ("reward/", "filter/", "advantage/", "actor/", "eval/greedy", "eval/sampled")
"""Metrics that depend on the episodes and the updates, not on where or how fast they ran."""
DYING_CLIENT = Path(__file__).with_name("remote_dying_client.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def overrides(out: Path, name: str, horizon: int = HORIZON) -> list[str]:
    return ["trainer.total_steps=3", "workers.num_workers=1", "data.init_states_per_step=2", "data.group_size=2",
            "eval.num_episodes=2", "eval.video_episodes=0", f"simulator.env.horizon={horizon}",
            f"run.output_dir={out}", f"run.name={name}"]


def cloned(horizon: int) -> list[str]:
    """A warm start that succeeds now and then: the LeRobot fixture's two demonstrations (of the
    11-value state, which the local pool's and the clients' Lift then observe)."""
    return [f"warm_start.dataset={DATASET}", f"simulator.env.horizon={horizon}"]


def remote(port: int, state_dim: int = 15) -> list[str]:
    return ["simulator.name=remote", f"simulator.env.state_dim={state_dim}", "simulator.env.action_dim=7",
            f"simulator.env.port={port}", "simulator.env.task=Lift", "simulator.env.step_timeout_s=30",
            "simulator.env.connect_timeout_s=90"]


def client(port: int, *args: str, token: str = TOKEN, horizon: int = HORIZON) -> subprocess.Popen:
    """``vla-rl remote-env robosuite_lift horizon=H [args] --connect ... --token ...`` (args: more
    fields, or options)."""
    return subprocess.Popen([sys.executable, "-m", "vla_rl.cli", "remote-env", "robosuite_lift", f"horizon={horizon}",
                             *args, "--connect", f"ws://127.0.0.1:{port}", "--token", token],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def stop(process: subprocess.Popen) -> str:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
    try:
        _, err = process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, err = process.communicate()
    return err


def step_metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k == "step" or k in COMPARED or k.startswith(COMPARED_PREFIXES)}
            for row in rows]


CLONED_HORIZON = 60


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("local")
    assert main(["train", "embodied_srpo", *overrides(out, "local"), *cloned(CLONED_HORIZON),
                 f"simulator.env.obs_keys={COMPACT_STATE}"]) == 0
    return out / "local"


def test_remote_environments_train_as_the_local_pool_and_a_wrong_token_is_refused(local_run, tmp_path,
                                                                                  monkeypatch):
    """The same run (seed 0, warm-started from the LeRobot fixture) with its four environments in
    two client processes: every step's and evaluation's metrics equal the local pool's."""
    monkeypatch.setenv("VLA_RL_REMOTE_TOKEN", TOKEN)
    port = free_port()
    fields = (f"obs_keys={COMPACT_STATE}", "--num-envs", "2")  # fields, then options
    clients = [client(port, *fields, horizon=CLONED_HORIZON) for _ in range(2)]
    intruder = client(port, token="guess")
    try:
        assert main(["train", "embodied_srpo", *overrides(tmp_path, "remote"), *cloned(CLONED_HORIZON),
                     *remote(port, state_dim=11)]) == 0
        assert intruder.wait(timeout=60) == 2  # refused: the user's input
    finally:
        errors = [stop(process) for process in (*clients, intruder)]
    assert "refused the token" in errors[2] and "Traceback" not in errors[2]
    local, remote_metrics = step_metrics(local_run), step_metrics(tmp_path / "remote")
    assert any(row.get("rollout/success_rate", 0) > 0 for row in local)  # not all-zero metrics
    assert len(local) == len(remote_metrics) and any(row.get("step") == 3 for row in local)
    for mine, theirs in zip(remote_metrics, local, strict=True):
        assert mine.keys() == theirs.keys() and mine == pytest.approx(theirs, rel=0, abs=1e-6), mine.get("step")


def test_a_client_process_that_dies_mid_step_loses_its_episodes_and_the_run_goes_on(tmp_path, monkeypatch):
    """Two client processes of four Lift environments each; the run's four environments are the
    first one's (it connected first), which ends itself at its 30th training chunk (step 1,
    episodes running): those episodes are lost and counted, and the run goes on with the other."""
    monkeypatch.setenv("VLA_RL_REMOTE_TOKEN", TOKEN)
    port = free_port()
    dying = subprocess.Popen([sys.executable, "-P", str(DYING_CLIENT), f"ws://127.0.0.1:{port}", TOKEN,
                              "--num-envs", "4", "--horizon", str(HORIZON), "--die-after", "30"],
                             start_new_session=True, stderr=subprocess.PIPE, text=True)
    healthy = []

    def start_the_other_once_the_first_is_connected() -> None:
        connected = 0
        for line in dying.stderr:
            connected += line.startswith("connected to")
            if connected == 4:
                healthy.append(client(port, "--num-envs", "4"))
                break
        dying.stderr.read()  # drain until it ends

    watcher = threading.Thread(target=start_the_other_once_the_first_is_connected)
    watcher.start()
    try:
        assert main(["train", "embodied_srpo", *overrides(tmp_path, "remote"), "warm_start.num_demos=0",
                     *remote(port)]) == 0
    finally:
        if dying.poll() is None:  # its stderr is the watcher's to read
            os.killpg(dying.pid, signal.SIGKILL)
        dying.wait()
        watcher.join(timeout=60)
        for process in healthy:
            stop(process)
    assert dying.returncode == 3 and healthy  # it ended itself, mid-step; the other one went on
    steps = [row for row in step_metrics(tmp_path / "remote") if "rollout/lost_episodes" in row]
    assert [row["step"] for row in steps] == [1, 2, 3]
    assert steps[0]["rollout/lost_episodes"] >= 1 and steps[1]["rollout/lost_episodes"] == 0  # counted, not scored


def test_planning_a_remote_run_refuses_scripted_demonstrations(capsys):
    assert main(["plan", "embodied_srpo", *remote(8765), "warm_start.num_demos=2"]) == 2
    assert "warm_start.num_demos" in capsys.readouterr().err


@pytest.mark.parametrize("fields, message", [
    (["horizon=abc"], "robosuite_lift: "),
    (["no_equals"], "simulator config fields are KEY=VALUE"),
])
def test_remote_env_command_errors_are_one_line(fields, message, capsys):
    assert main(["remote-env", "robosuite_lift", *fields, "--connect", "ws://127.0.0.1:9"]) == 2
    assert message in capsys.readouterr().err


def test_a_run_no_client_connects_to_stops_in_one_line_saying_where_to_connect(tmp_path, capsys):
    """The reset's timeout came to the driver as a Ray traceback of 88 lines (exit status 1), the
    sentence that says what to do at its end."""
    port = free_port()
    args = [a for a in remote(port) if not a.startswith("simulator.env.connect_timeout_s=")]
    assert main(["train", "embodied_srpo", *overrides(tmp_path, "alone"), "warm_start.num_demos=0", *args,
                 "simulator.env.connect_timeout_s=2"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: no remote environment was free within simulator.env.connect_timeout_s=2 s: connect clients "
        f"(vla_rl.remote.RobotClient) to ws://127.0.0.1:{port}, at least as many as the episodes rolled out at once"]
