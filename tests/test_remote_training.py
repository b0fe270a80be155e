"""RL on remote environments through the CLI: ``vla-rl train embodied_srpo simulator.name=remote``
with robosuite Lift environments served by RobotClients on loopback (as ``vla-rl remote-env
robosuite_lift`` serves them on another machine), a token, and one client that stalls once: its
episode is lost (counted, not scored), it connects again, and the run finishes its 3 steps."""

from __future__ import annotations

import json
import socket
import threading
import time

import gymnasium as gym
import pytest

from simulators import make_env
from vla_rl.cli import main
from vla_rl.remote import serve_envs

HORIZON, STALL_S, STEP_TIMEOUT_S = 20, 4.0, 2.0


class StallOnce(gym.Wrapper):
    """Lift, but the first training episode any of these environments starts stalls at its first
    step for longer than the trainer waits (evaluation episodes start at ids >= 1e9)."""

    stalled = threading.Event()

    def reset(self, *, seed=None, options=None):
        self.stall = seed < 1_000_000_000 and not StallOnce.stalled.is_set()
        if self.stall:
            StallOnce.stalled.set()
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        if self.stall:
            self.stall = False
            time.sleep(STALL_S)
        return self.env.step(action)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def remote_overrides(port: int, out) -> list[str]:
    return ["simulator.name=remote", "simulator.env.state_dim=15", "simulator.env.action_dim=7",
            f"simulator.env.horizon={HORIZON}", f"simulator.env.port={port}", "simulator.env.task=Lift",
            f"simulator.env.step_timeout_s={STEP_TIMEOUT_S}", "warm_start.num_demos=0", "workers.num_workers=1",
            "data.init_states_per_step=2", "data.group_size=2", "eval.num_episodes=2", "eval.video_episodes=0",
            f"run.output_dir={out}", "run.name=remote"]


def test_srpo_trains_three_steps_on_remote_lift_environments(tmp_path, monkeypatch):
    monkeypatch.setenv("VLA_RL_REMOTE_TOKEN", "s3cret")
    port, stop = free_port(), threading.Event()
    envs = [StallOnce(make_env("robosuite_lift", {"horizon": HORIZON})) for _ in range(4)]
    clients = serve_envs(envs, f"ws://127.0.0.1:{port}", token="s3cret", stop=stop, retry_s=0.2)
    try:
        assert main(["train", "embodied_srpo", *remote_overrides(port, tmp_path), "trainer.total_steps=3"]) == 0
    finally:
        stop.set()
    metrics = [json.loads(line) for line in (tmp_path / "remote" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "rollout/lost_episodes" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert sum(m["rollout/lost_episodes"] for m in steps) == 1  # the stalled episode, not scored
    assert StallOnce.stalled.is_set() and all(client.error is None for client in clients)
    # every rollout and evaluation episode ran on the clients: 3 steps x 4 + 2 evaluations x 4
    assert sum(client.episodes for client in clients) == 20


def test_planning_a_remote_run_refuses_scripted_demonstrations(capsys):
    assert main(["plan", "embodied_srpo", *remote_overrides(8765, "/tmp"), "warm_start.num_demos=2"]) == 2
    assert "warm_start.num_demos" in capsys.readouterr().err


@pytest.mark.parametrize("fields, message", [
    (["horizon=abc"], "robosuite_lift: "),
    (["no_equals"], "simulator config fields are KEY=VALUE"),
])
def test_remote_env_command_errors_are_one_line(fields, message, capsys):
    assert main(["remote-env", "robosuite_lift", *fields, "--connect", "ws://127.0.0.1:9"]) == 2
    assert message in capsys.readouterr().err
