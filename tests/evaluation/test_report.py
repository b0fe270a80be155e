"""The report from episode stores: each planned episode counted once, Wilson intervals against
the closed form, Markdown / JSON / plot written."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.evaluation import report as report_module
from vla_rl.evaluation.benchmarks import EvalTask
from vla_rl.evaluation.episode_store import (
    HOST_SCALAR,
    HOSTS_ATTR,
    append_episodes,
    open_rank_store,
    stored_keys,
    task_dir,
)
from vla_rl.evaluation.protocol import Protocol
from vla_rl.evaluation.report import OVERALL, ReportProgress, counted_hosts, summarize, write_report
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec

SPEC = EnvSpec(obs_dim=3, action_dim=2, horizon=6)
GREEDY = Protocol("greedy", True, 0.0)
SAMPLED = Protocol("sampled", False, 0.5)
HOST_A = {"cpu": "Intel(R) Xeon(R) Processor", "cpu_flags": "fc7df03f53a7", "cpu_capability": "AVX512",
          "logical_cpus": 2, "gpu": None, "python": "3.11.7", "torch": "2.13.0+cpu", "numpy": "1.26.4", "mujoco": "3.3.0"}
HOST_B = {**HOST_A, "cpu": "AMD EPYC 9B14", "cpu_flags": "0123456789ab", "cpu_capability": "AVX2"}


def episodes(ids, success, lengths) -> TensorDict:
    n, horizon = len(ids), SPEC.horizon
    success = torch.tensor(success)
    finish = torch.tensor(lengths)
    return TensorDict({
        keys.OBS: torch.randn(n, horizon + 1, 3), keys.ACTIONS: torch.randn(n, horizon, 1, 2),
        keys.ENV_ACTIONS: torch.randn(n, horizon, 1, 2),
        keys.OLD_LOG_PROBS: torch.randn(n, horizon, 1), keys.FINISH_STEP: finish, keys.SUCCESS: success,
        keys.TRUNCATED: ~success & (finish == horizon), keys.INIT_STATE_ID: torch.tensor(ids),
    }, batch_size=[n])


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson (1927), closed form."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


@pytest.fixture
def eval_dir(tmp_path):
    lift = open_rank_store(tmp_path, "Lift", 0, SPEC, 1, {"task": "Lift", "simulator": "s", "env": {}}, True)
    append_episodes(lift, episodes([10, 11, 12], [True, False, True], [3, 6, 4]), 5, True, 0.0, HOST_A)
    append_episodes(lift, episodes([10, 11], [False, False], [6, 6]), 5, False, 0.5, HOST_A)
    other_rank = open_rank_store(tmp_path, "Lift", 1, SPEC, 1, {"task": "Lift", "simulator": "s", "env": {}}, True)
    append_episodes(other_rank, episodes([12, 13], [True, True], [2, 2]), 5, False, 0.5, HOST_B)  # 13: not planned
    append_episodes(other_rank, episodes([12], [False], [6]), 5, True, 0.0, HOST_B)  # a second copy of 12: ignored
    door = open_rank_store(tmp_path, "Door", 0, SPEC, 1, {"task": "Door", "simulator": "s", "env": {}}, True)
    append_episodes(door, episodes([10, 11, 12], [False, False, True], [6, 6, 5]), 5, True, 0.0, HOST_A)
    return tmp_path


def test_each_planned_episode_counts_once(eval_dir):
    tasks = [EvalTask("Lift", "s"), EvalTask("Door", "s")]
    rows = summarize(eval_dir, tasks, [5], [GREEDY, SAMPLED], np.array([10, 11, 12]))
    by = {(r["protocol"], r["task"]): r for r in rows}
    lift = by[("greedy", "Lift")]
    assert (lift["episodes"], lift["successes"], lift["truncated"]) == (3, 2, 1)
    assert lift["mean_episode_length"] == pytest.approx(13 / 3)
    assert (lift["ci_low"], lift["ci_high"]) == pytest.approx(wilson(2, 3))
    sampled = by[("sampled@0.5", "Lift")]
    assert (sampled["episodes"], sampled["successes"]) == (3, 1)
    overall = by[("greedy", OVERALL)]
    assert (overall["episodes"], overall["successes"]) == (6, 3)
    assert (overall["ci_low"], overall["ci_high"]) == pytest.approx(wilson(3, 6))
    assert by[("sampled@0.5", "Door")]["episodes"] == 0  # never run: nothing counted
    assert len(stored_keys(eval_dir, "Lift")) == 7  # 8 stored, one of them a repeat


def test_report_files(eval_dir):
    rows = summarize(eval_dir, [EvalTask("Lift", "s")], [5], [GREEDY], np.array([10, 11, 12]))
    info = {"run_dir": "runs/x", "checkpoints": [{"path": "c", "step": 5}],
            "tasks": [{"name": "Lift", "simulator": "s"}],
            "protocols": [{"label": "greedy"}], "episodes_per_task": 3,
            "init_state_ids": {"first": 10, "last": 12}, "seed": 0}
    report = write_report(eval_dir, info, rows)
    assert json.loads((eval_dir / "report.json").read_text()) == json.loads(json.dumps(report))
    markdown = (eval_dir / "report.md").read_text()
    assert "| 5 | greedy | Lift | 66.7% | [20.8%, 93.9%] | 4.3 | 3 |" in markdown
    assert "initial states 10 .. 12" in markdown
    assert (eval_dir / "success_vs_checkpoint.png").stat().st_size > 0


def test_the_report_grows_as_tasks_finish(tmp_path):
    """Lift finishes, then Door is half done when the evaluation stops: the report holds Lift, says
    Door is incomplete and Stack skipped (with its reason); Door's finishing adds it and `overall`."""
    ids, protocols = np.array([10, 11]), [GREEDY]
    tasks = [EvalTask("Lift", "s"), EvalTask("Door", "s")]
    info = {"run_dir": "runs/x", "checkpoints": [{"path": "c", "step": 5}],
            "tasks": [{"name": t.name, "simulator": t.simulator, "env": {}} for t in tasks],
            "protocols": [{"label": "greedy"}], "episodes_per_task": 2,
            "init_state_ids": {"first": 10, "last": 11}, "seed": 0}
    skipped = [{"task": "Stack", "simulator": "s", "env": {}, "reason": "its observation is not the policy's"}]
    progress = ReportProgress(tmp_path, info, tasks, skipped, [5], protocols, ids)
    assert not progress.update() and not (tmp_path / "report.json").exists()
    attrs = {"simulator": "s", "env": {}}
    lift = open_rank_store(tmp_path, "Lift", 0, SPEC, 1, {"task": "Lift", **attrs}, True)
    door = open_rank_store(tmp_path, "Door", 0, SPEC, 1, {"task": "Door", **attrs}, True)
    append_episodes(lift, episodes([10, 11], [True, False], [3, 6]), 5, True, 0.0, HOST_A)
    append_episodes(door, episodes([10], [True], [2]), 5, True, 0.0, HOST_B)
    assert progress.update()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["task_status"] == {"Lift": "complete", "Door": "incomplete", "Stack": "skipped"}
    # the machines of the episodes in the table: not yet Door's
    assert {k: report["protocol"][k] for k in ("hosts", "host_episodes", "hosts_unrecorded")} == {
        "hosts": [HOST_A], "host_episodes": [2], "hosts_unrecorded": 0}
    assert [(r["task"], r["episodes"]) for r in report["results"]] == [("Lift", 2)]
    assert report["skipped"] == [{"task": "Stack", "simulator": "s", "reason": "its observation is not the policy's"}]
    assert json.loads((tmp_path / "results" / "Lift.json").read_text())["results"] == report["results"]
    markdown = (tmp_path / "report.md").read_text()
    assert "**not finished**: Door" in markdown and "| Stack | s | its observation is not the policy's |" in markdown
    assert not progress.update()  # nothing new
    append_episodes(door, episodes([11], [True], [2]), 5, True, 0.0, HOST_B)
    assert progress.update()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["task_status"] == {"Lift": "complete", "Door": "complete", "Stack": "skipped"}
    assert (report["protocol"]["hosts"], report["protocol"]["host_episodes"]) == ([HOST_A, HOST_B], [2, 2])
    overall = next(r for r in report["results"] if r["task"] == OVERALL)
    assert (overall["episodes"], overall["successes"]) == (4, 3)



LINE_A = ("Intel(R) Xeon(R) Processor (flags fc7df03f53a7, AVX512, 2 CPUs), torch 2.13.0+cpu, numpy 1.26.4, "
          "mujoco 3.3.0, Python 3.11.7")
LINE_B = "AMD EPYC 9B14 (flags 0123456789ab, AVX2, 2 CPUs)"


@pytest.mark.parametrize("hosts, counts, unrecorded, line", [
    ([HOST_A], [3], 0, f"- machine: {LINE_A} (a machine's CPU may change the episodes"),
    ([HOST_A, HOST_B], [8, 1], 0, f"- machines: {LINE_A} (8 episodes); {LINE_B}"),
    ([HOST_A], [5], 1, f"- machines: {LINE_A} (5 episodes); not recorded (stored by an earlier vla-rl) (1 episode) ("),
    ([], [], 3, "- machine: not recorded (stored by an earlier vla-rl) (a machine's"),
    ([], [], 0, None),
])
def test_the_report_names_the_machines_the_episodes_ran_on(eval_dir, hosts, counts, unrecorded, line):
    rows = summarize(eval_dir, [EvalTask("Lift", "s")], [5], [GREEDY], np.array([10, 11, 12]))
    info = {"run_dir": "runs/x", "checkpoints": [{"path": "c", "step": 5}], "tasks": [{"name": "Lift", "simulator": "s"}],
            "protocols": [{"label": "greedy"}], "episodes_per_task": 3,
            "init_state_ids": {"first": 10, "last": 12}, "seed": 0,
            "hosts": hosts, "host_episodes": counts, "hosts_unrecorded": unrecorded}
    write_report(eval_dir, info, rows)
    markdown = (eval_dir / "report.md").read_text()
    if line is None:
        assert "machine" not in markdown
    else:
        assert line in markdown


def test_the_machines_are_those_of_the_counted_episodes(eval_dir):
    """Rank 1's store was written on machine B: its sampled episode 12 counts, its second copy of
    greedy episode 12 and its unplanned episode 13 do not, so the greedy table names A only."""
    lift, door = EvalTask("Lift", "s"), EvalTask("Door", "s")
    ids = np.array([10, 11, 12])
    assert counted_hosts(eval_dir, [lift, door], [5], [GREEDY, SAMPLED], ids) == {
        "hosts": [HOST_A, HOST_B], "host_episodes": [8, 1], "hosts_unrecorded": 0}
    assert counted_hosts(eval_dir, [lift, door], [5], [GREEDY], ids) == {
        "hosts": [HOST_A], "host_episodes": [6], "hosts_unrecorded": 0}
    assert counted_hosts(eval_dir, [], [5], [GREEDY], ids) == {"hosts": [], "host_episodes": [], "hosts_unrecorded": 0}


def test_a_continued_evaluation_adds_its_machine_to_the_store(eval_dir):
    lift = open_rank_store(eval_dir, "Lift", 0, SPEC, 1, {"task": "Lift", "simulator": "s", "env": {}}, True)
    append_episodes(lift, episodes([12], [True], [2]), 5, False, 0.5, HOST_B)
    append_episodes(lift, episodes([14], [True], [2]), 5, False, 0.5, HOST_A)
    reopened = TrajectoryStore.open(lift.path, read_only=True)
    assert reopened.attrs[HOSTS_ATTR] == [HOST_A, HOST_B]  # each machine once
    assert reopened.read_scalars()[HOST_SCALAR].tolist() == [0, 0, 0, 0, 0, 1, 0]
    # rank 0's sampled episode 12 (machine B) is now read before rank 1's
    assert counted_hosts(eval_dir, [EvalTask("Lift", "s")], [5], [SAMPLED], np.array([10, 11, 12])) == {
        "hosts": [HOST_A, HOST_B], "host_episodes": [2, 1], "hosts_unrecorded": 0}


def test_the_episodes_of_a_store_from_before_machines_were_recorded_are_counted_unrecorded(tmp_path):
    """A store created without the machines' attribute (by an earlier vla-rl) takes episodes
    without a machine, also those a continued evaluation adds; a new store beside it records its own."""
    fields = {"obs": ((3,), np.float32), "next_obs": ((3,), np.float32), "actions": ((1, 2), np.float32),
              "env_actions": ((1, 2), np.float32), "log_probs": ((1,), np.float32)}
    path = task_dir(tmp_path, "Lift") / "rank0.zarr"
    path.parent.mkdir(parents=True)
    attrs = {"task": "Lift", "simulator": "s", "env": {}}
    old = TrajectoryStore.create(path, fields, max_steps=SPEC.horizon, attrs=attrs)
    append_episodes(old, episodes([10, 11], [True, False], [3, 6]), 5, True, 0.0, HOST_A)
    assert HOST_SCALAR not in old.scalars and HOSTS_ATTR not in old.attrs
    new = open_rank_store(tmp_path, "Lift", 1, SPEC, 1, {"task": "Lift", "simulator": "s", "env": {}}, True)
    append_episodes(new, episodes([12], [True], [2]), 5, True, 0.0, HOST_A)
    assert counted_hosts(tmp_path, [EvalTask("Lift", "s")], [5], [GREEDY], np.array([10, 11, 12])) == {
        "hosts": [HOST_A], "host_episodes": [1], "hosts_unrecorded": 2}


def test_failures_before_the_time_limit_are_not_counted_truncated(tmp_path):
    lift = open_rank_store(tmp_path, "Lift", 0, SPEC, 1, {"task": "Lift", "simulator": "s", "env": {}}, True)
    # horizon 6: episode 10 fails early (not truncated), 11 runs out of time, 12 succeeds
    append_episodes(lift, episodes([10, 11, 12], [False, False, True], [2, 6, 3]), 5, True, 0.0, HOST_A)
    (row,) = summarize(tmp_path, [EvalTask("Lift", "s")], [5], [GREEDY], np.array([10, 11, 12]))
    assert (row["episodes"], row["successes"], row["truncated"]) == (3, 1, 1)
    assert row["mean_episode_length"] == pytest.approx((2 + 6 + 3) / 3)


def test_rows_follow_the_checkpoint_steps_in_increasing_order(tmp_path):
    lift = open_rank_store(tmp_path, "Lift", 0, SPEC, 1, {"task": "Lift", "simulator": "s", "env": {}}, True)
    append_episodes(lift, episodes([10], [True], [3]), 9, True, 0.0, HOST_A)
    append_episodes(lift, episodes([10], [False], [6]), 2, True, 0.0, HOST_A)
    rows = summarize(tmp_path, [EvalTask("Lift", "s")], [9, 2], [GREEDY], np.array([10]))
    assert [(r["checkpoint_step"], r["successes"]) for r in rows] == [(2, 0), (9, 1)]


def report_info(tasks: list[str]) -> dict:
    return {"run_dir": "runs/x", "checkpoints": [{"path": "c", "step": 5}],
            "tasks": [{"name": name, "simulator": "s"} for name in tasks], "protocols": [{"label": "greedy"}],
            "episodes_per_task": 3, "init_state_ids": {"first": 10, "last": 12}, "seed": 0}


def test_a_task_not_started_is_named_not_finished(eval_dir):
    rows = summarize(eval_dir, [EvalTask("Lift", "s")], [5], [GREEDY], np.array([10, 11, 12]))
    write_report(eval_dir, report_info(["Lift", "Door"]), rows, status={"Lift": "complete", "Door": "pending"})
    markdown = (eval_dir / "report.md").read_text()
    assert "- tasks: Lift (s, complete), Door (s, pending)" in markdown
    assert "**not finished**: Door (" in markdown


def test_the_figure_plots_the_overall_rows_when_there_are_several_tasks(eval_dir, monkeypatch):
    plotted = []
    monkeypatch.setattr(report_module, "plot_success_vs_checkpoint", lambda rows, path, title: plotted.append(rows))
    tasks = [EvalTask("Lift", "s"), EvalTask("Door", "s")]
    rows = summarize(eval_dir, tasks, [5], [GREEDY], np.array([10, 11, 12]))
    write_report(eval_dir, report_info(["Lift", "Door"]), rows)
    assert [r["task"] for r in plotted[0]] == [OVERALL]
    write_report(eval_dir, report_info(["Lift"]), [r for r in rows if r["task"] == "Lift"])
    assert [r["task"] for r in plotted[1]] == ["Lift"]  # one task: its own rows


def test_a_replayed_video_that_disagrees_with_its_store_is_flagged(eval_dir):
    (eval_dir / "videos").mkdir()
    videos = [{"file": "a.mp4", "task": "Lift", "protocol": "greedy", "stored_success": True, "replayed_success": True},
              {"file": "b.mp4", "task": "Lift", "protocol": "greedy", "stored_success": False,
               "replayed_success": True}]
    (eval_dir / "videos" / "replays.json").write_text(json.dumps(videos))
    rows = summarize(eval_dir, [EvalTask("Lift", "s")], [5], [GREEDY], np.array([10, 11, 12]))
    report = write_report(eval_dir, report_info(["Lift"]), rows)
    assert report["videos"] == videos
    markdown = (eval_dir / "report.md").read_text()
    assert "- [a.mp4](a.mp4): Lift, greedy, success\n" in markdown
    assert "- [b.mp4](b.mp4): Lift, greedy, failure (replay differs!)\n" in markdown


def test_a_task_whose_first_episodes_are_stored_rewrites_the_report(tmp_path):
    ids = np.array([10, 11])
    tasks = [EvalTask("Lift", "s")]
    info = {**report_info(["Lift"]), "tasks": [{"name": "Lift", "simulator": "s", "env": {}}]}
    progress = ReportProgress(tmp_path, info, tasks, [], [5], [GREEDY], ids)
    assert not progress.update() and not (tmp_path / "report.json").exists()
    lift = open_rank_store(tmp_path, "Lift", 0, SPEC, 1, {"task": "Lift", "simulator": "s", "env": {}}, True)
    append_episodes(lift, episodes([10], [True], [3]), 5, True, 0.0, HOST_A)
    assert not progress.update()  # no task finished, but Lift's state changed: pending -> incomplete
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["task_status"] == {"Lift": "incomplete"} and report["results"] == []
