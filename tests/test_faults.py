"""Faults during a real run (Ray on loopback, two DAG workers, gloo, simulator actors, the SRPO
template on tiny settings): a DAG worker killed in the middle of a step, with and without a
restart left, and a corrupted latest checkpoint. Every interrupted run must end with the weights
of the uninterrupted one, byte for byte."""

from __future__ import annotations

import json
import re
import shlex
import threading
import time

import pytest
from devices import device_overrides

from vla_rl.checkpoints import integrity as checkpoint_integrity
from vla_rl.checkpoints.layout import CheckpointCorruptError
from vla_rl.cli import main
from vla_rl.driver import train
from vla_rl.errors import RunStopped
from vla_rl.run_loop import RunLoop
from vla_rl.workers.group import WorkerGroup

TINY = [
    "trainer.total_steps=3",
    "trainer.save_every=1",
    "trainer.ppo_mini_batch_size=4",
    "trainer.ppo_epochs=2",
    "data.init_states_per_step=2",
    "data.group_size=3",
    "simulator.env.horizon=40",
    "eval.num_episodes=0",
    "warm_start.bc_steps=30",
    "policy.config.hidden_sizes=[32,32]",
    *device_overrides(),
]
FINAL = "checkpoints/step_00000003/model.safetensors"


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    return tmp_path_factory.mktemp("demos") / "lift_demos.zarr"


@pytest.fixture(scope="module")
def uninterrupted(ray_on_loopback, tmp_path_factory, demo_store):
    """The run without faults: its directory."""
    out = tmp_path_factory.mktemp("runs")
    train("embodied_srpo", [*TINY, f"run.output_dir={out}", "run.name=full", f"warm_start.demo_store={demo_store}"])
    return out / "full"


def kill_during_step(monkeypatch, step: int, rank: int, delay_s: float = 0.3) -> list:
    """Test-only hook: ``delay_s`` after the driver submits training step ``step`` (0-based) for
    the first time, ``ray.kill`` the DAG worker actor of ``rank`` (from a timer thread, while
    the step runs). Returns the list of killed actors."""
    import ray

    killed: list = []
    submit = WorkerGroup.submit

    def submit_and_kill(self, method, *args):
        call = submit(self, method, *args)
        if method == "run_step" and args[0] == step and not killed:
            killed.append(self.actors[rank])
            threading.Timer(delay_s, ray.kill, args=(self.actors[rank],)).start()
        return call

    monkeypatch.setattr(WorkerGroup, "submit", submit_and_kill)
    return killed


def train_steps(run_dir) -> list[int]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if "rollout/success_rate" in r]


@pytest.mark.xdist_group("test_faults.uninterrupted")
def test_killed_worker_restarts_from_the_last_checkpoint(uninterrupted, tmp_path, demo_store, monkeypatch, capsys):
    killed = kill_during_step(monkeypatch, step=1, rank=1)
    # the first group's checkpoint of step 1 takes 2 s more, and each group's training loop is timed
    call, train_loop, group_loops, slowed = WorkerGroup.call, RunLoop._train, [], []

    def slow_first_checkpoint(self, method, *args):
        if method == "save_checkpoint" and not slowed:
            slowed.append(args[0])
            time.sleep(2.0)
        return call(self, method, *args)

    def timed_train_loop(self, *args):
        start = time.perf_counter()
        try:
            return train_loop(self, *args)
        finally:
            group_loops.append(time.perf_counter() - start)

    monkeypatch.setattr(WorkerGroup, "call", slow_first_checkpoint)
    monkeypatch.setattr(RunLoop, "_train", timed_train_loop)
    summary = train("embodied_srpo", [*TINY, f"run.output_dir={tmp_path}", "run.name=killed",
                                      f"warm_start.demo_store={demo_store}"])
    run_dir = tmp_path / "killed"
    assert len(killed) == 1 and slowed == [1] and len(group_loops) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "DAG worker rank 1 died during 'run_step': pid " in out
    assert "restarting the workers from the last checkpoint (restart 1 of workers.max_restarts=1)" in out
    assert "resuming from the checkpoint of step 1" in out
    assert summary["restarts"] == 1 and summary["restarted_from_steps"] == [1]
    assert summary["start_step"] == 0 and summary["last_step"] == 3 and summary["steps_run"] == 3
    assert train_steps(run_dir) == [1, 2, 3]  # the records of the lost step were dropped
    assert (run_dir / FINAL).read_bytes() == (uninterrupted / FINAL).read_bytes()
    # the training time of both groups, as steps_run counts both (it was the restarted group's alone,
    # shorter than its training loop)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert summary["train_time_s"] >= sum(r["timing/step"] for r in records if "timing/step" in r)
    assert summary["train_time_s"] >= group_loops[1] + 1.0
    # both groups of workers recorded their machines (this one): named once
    assert len((run_dir / "hosts.jsonl").read_text().splitlines()) == 2
    assert summary["run_hosts"] == [summary["hosts"][0]] and summary["hosts_unrecorded"] is False


@pytest.mark.xdist_group("test_faults.uninterrupted")
def test_death_without_restarts_names_rank_and_resume_command(uninterrupted, tmp_path, demo_store, monkeypatch,
                                                              capsys):
    """``workers.max_restarts=0``: the run stops with one message; then the latest checkpoint is
    corrupted, and the command of the message resumes from the one before and finishes."""
    kill_during_step(monkeypatch, step=2, rank=1)
    run_dir = tmp_path / "stopped"
    with pytest.raises(RunStopped) as err:
        train("embodied_srpo", [*TINY, "workers.max_restarts=0", f"run.output_dir={tmp_path}", "run.name=stopped",
                                f"warm_start.demo_store={demo_store}"])
    message = str(err.value)
    assert message.startswith("DAG worker rank 1 died during 'run_step': pid ")
    assert "killed by `ray.kill`" in message and "after 0 restart(s) (workers.max_restarts=0)" in message
    assert message.endswith(f"its last checkpoint is step_00000002. Resume it with: vla-rl train --resume {run_dir}")
    assert train_steps(run_dir) == [1, 2]

    latest = run_dir / "checkpoints" / "step_00000002"
    data = (latest / "model.safetensors").read_bytes()
    (latest / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointCorruptError, match=f"{latest / 'model.safetensors'} has"):
        checkpoint_integrity.verify_checkpoint(latest)

    command = shlex.split(re.search(r"Resume it with: (.*)$", message).group(1))
    assert command[:3] == ["vla-rl", "train", "--resume"]
    assert main(command[1:]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["start_step"] == 1 and summary["steps_run"] == 2
    assert "resuming from the checkpoint of step 1" in capsys.readouterr().out
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [  # keep_last=2, the corrupted one kept
        "latest", "step_00000002", "step_00000002.rejected", "step_00000003"]
    assert train_steps(run_dir) == [1, 2, 3]
    assert (run_dir / FINAL).read_bytes() == (uninterrupted / FINAL).read_bytes()
