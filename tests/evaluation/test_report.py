"""The report from episode stores: each planned episode counted once, Wilson intervals against
the closed form, Markdown / JSON / plot written."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from vla_rl.evaluation.benchmarks import EvalTask
from vla_rl.evaluation.episode_store import (
    append_episodes,
    open_rank_store,
    stored_keys,
)
from vla_rl.evaluation.protocol import Protocol
from vla_rl.evaluation.report import OVERALL, ReportProgress, earlier_hosts, summarize, write_report
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec

SPEC = EnvSpec(obs_dim=3, action_dim=2, horizon=6)
GREEDY = Protocol("greedy", True, 0.0)
SAMPLED = Protocol("sampled", False, 0.5)


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
    append_episodes(lift, episodes([10, 11, 12], [True, False, True], [3, 6, 4]), 5, True, 0.0)
    append_episodes(lift, episodes([10, 11], [False, False], [6, 6]), 5, False, 0.5)
    other_rank = open_rank_store(tmp_path, "Lift", 1, SPEC, 1, {"task": "Lift", "simulator": "s", "env": {}}, True)
    append_episodes(other_rank, episodes([12, 13], [True, True], [2, 2]), 5, False, 0.5)  # 13: not planned
    append_episodes(other_rank, episodes([12], [False], [6]), 5, True, 0.0)  # a second copy of 12: ignored
    door = open_rank_store(tmp_path, "Door", 0, SPEC, 1, {"task": "Door", "simulator": "s", "env": {}}, True)
    append_episodes(door, episodes([10, 11, 12], [False, False, True], [6, 6, 5]), 5, True, 0.0)
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
            "protocols": [{"label": "greedy"}], "episodes_per_task": 3, "init_state_ids": [10, 13], "seed": 0}
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
            "protocols": [{"label": "greedy"}], "episodes_per_task": 2, "init_state_ids": [10, 12], "seed": 0}
    skipped = [{"task": "Stack", "simulator": "s", "env": {}, "reason": "its observation is not the policy's"}]
    progress = ReportProgress(tmp_path, info, tasks, skipped, [5], protocols, ids)
    assert not progress.update() and not (tmp_path / "report.json").exists()
    attrs = {"simulator": "s", "env": {}}
    lift = open_rank_store(tmp_path, "Lift", 0, SPEC, 1, {"task": "Lift", **attrs}, True)
    door = open_rank_store(tmp_path, "Door", 0, SPEC, 1, {"task": "Door", **attrs}, True)
    append_episodes(lift, episodes([10, 11], [True, False], [3, 6]), 5, True, 0.0)
    append_episodes(door, episodes([10], [True], [2]), 5, True, 0.0)
    assert progress.update()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["task_status"] == {"Lift": "complete", "Door": "incomplete", "Stack": "skipped"}
    assert [(r["task"], r["episodes"]) for r in report["results"]] == [("Lift", 2)]
    assert report["skipped"] == [{"task": "Stack", "simulator": "s", "reason": "its observation is not the policy's"}]
    assert json.loads((tmp_path / "results" / "Lift.json").read_text())["results"] == report["results"]
    markdown = (tmp_path / "report.md").read_text()
    assert "**not finished**: Door" in markdown and "| Stack | s | its observation is not the policy's |" in markdown
    assert not progress.update()  # nothing new
    append_episodes(door, episodes([11], [True], [2]), 5, True, 0.0)
    assert progress.update()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["task_status"] == {"Lift": "complete", "Door": "complete", "Stack": "skipped"}
    overall = next(r for r in report["results"] if r["task"] == OVERALL)
    assert (overall["episodes"], overall["successes"]) == (4, 3)


HOST_A = {"cpu": "Intel(R) Xeon(R) Processor", "cpu_flags": "fc7df03f53a7", "cpu_capability": "AVX512",
          "logical_cpus": 2, "gpu": None, "python": "3.11.7", "torch": "2.13.0+cpu", "numpy": "1.26.4", "mujoco": "3.3.0"}
HOST_B = {**HOST_A, "cpu": "AMD EPYC 9B14", "cpu_flags": "0123456789ab", "cpu_capability": "AVX2"}


@pytest.mark.parametrize("hosts, unrecorded, line", [
    ([HOST_A], False, "- machine: Intel(R) Xeon(R) Processor (flags fc7df03f53a7, AVX512, 2 CPUs), torch 2.13.0+cpu, "
                      "numpy 1.26.4, mujoco 3.3.0, Python 3.11.7 (a machine's CPU may change the episodes"),
    ([HOST_A, HOST_B], False, "- machines: Intel(R) Xeon(R) Processor (flags fc7df03f53a7, AVX512, 2 CPUs), torch "
                              "2.13.0+cpu, numpy 1.26.4, mujoco 3.3.0, Python 3.11.7; AMD EPYC 9B14 (flags 0123456789ab"),
    ([HOST_A], True, "- machines: Intel(R) Xeon(R) Processor (flags fc7df03f53a7, AVX512, 2 CPUs), torch 2.13.0+cpu, "
                     "numpy 1.26.4, mujoco 3.3.0, Python 3.11.7; one that an earlier evaluation into this directory "
                     "did not record ("),
    ([], True, "- machine: one that an earlier evaluation into this directory did not record ("),
    ([], False, None),
])
def test_the_report_names_the_machines_the_episodes_ran_on(eval_dir, hosts, unrecorded, line):
    rows = summarize(eval_dir, [EvalTask("Lift", "s")], [5], [GREEDY], np.array([10, 11, 12]))
    info = {"run_dir": "runs/x", "checkpoints": [{"path": "c", "step": 5}], "tasks": [{"name": "Lift", "simulator": "s"}],
            "protocols": [{"label": "greedy"}], "episodes_per_task": 3, "init_state_ids": [10, 13], "seed": 0,
            "hosts": hosts, "hosts_unrecorded": unrecorded}
    write_report(eval_dir, info, rows)
    markdown = (eval_dir / "report.md").read_text()
    if line is None:
        assert "machine" not in markdown
    else:
        assert line in markdown
    assert earlier_hosts(eval_dir) == (hosts, unrecorded)  # what a continued evaluation starts from


@pytest.mark.parametrize("text, expected", [
    (None, ([], False)),  # no earlier evaluation
    ('{"protocol": {"run_dir": "x"}}', ([], True)),  # written before reports named machines
    ('{"protocol": {"hosts": "x"}}', ([], True)),
    ("{not json", ([], True)),
    ('{"results": []}', ([], True)),
    (json.dumps({"protocol": {"hosts": [HOST_B, 3]}}), ([HOST_B], False)),
])
def test_the_machines_of_earlier_evaluations_into_a_directory(tmp_path, text, expected):
    if text is not None:
        (tmp_path / "report.json").write_text(text)
    assert earlier_hosts(tmp_path) == expected
