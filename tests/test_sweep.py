"""Seed sweeps (vla_rl.sweep, ``vla-rl train TEMPLATE --seeds``): the across-seed figures against
hand-computed values, the report's files, an interrupted sweep resumed, the command line's
refusals; ``-m slow``: a real two-seed sweep of the main job through the CLI."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from vla_rl.cli import main
from vla_rl.errors import CommandLineError
from vla_rl.sweep import (
    PLOT_FILE,
    REPORT_JSON,
    REPORT_MD,
    SWEEP_FILE,
    parse_seeds,
    resume_sweep,
    run_sweep,
    seed_figures,
    seed_run_dir,
    write_report,
)
from vla_rl.utils.host import host_record
from vla_rl.utils.stats import mean_interval

#: Student's t quantile t_{0.975, 2} (two-sided 95%, 2 degrees of freedom), from a table.
T_975_2 = 4.302652729749464


@pytest.mark.parametrize(("text", "seeds"), [("0,1,2", [0, 1, 2]), ("0-4", [0, 1, 2, 3, 4]), ("3", [3]),
                                             ("0-2,7", [0, 1, 2, 7]), (" 1, 2 ", [1, 2])])
def test_seed_lists(text, seeds):
    assert parse_seeds(text) == seeds


# "1-" was taken as seed 1; "0-999999999999" built the whole list (MemoryError) before; a range past
# 2**63 was an OverflowError traceback; int() read "0_1" as seed 1, "+1" as 1 and "٣" (Arabic-Indic 3) as 3
@pytest.mark.parametrize("text", ["", "a", "0,0", "0-2,1", "-1", "3-1", "1.5", "1-", "0-999999999999",
                                  "18446744073709551616,0", "4294967296", "0-99999999999999999999", "0_1", "+1",
                                  "\u0663", "1--2"])
def test_bad_seed_lists(text):
    with pytest.raises(CommandLineError, match="--seeds"):
        parse_seeds(text)


def test_the_largest_seed_runs_its_workers_seeds_and_one_more_is_refused_by_the_template():
    """--seeds 18446744073709551616 (and any run.seed above about 1.8e13) passed and failed in every
    worker with a Ray traceback ("Overflow when unpacking long long")."""
    import torch

    from vla_rl.config.sections import MAX_SEED
    from vla_rl.dag.errors import TemplateError
    from vla_rl.dag.loader import load_template

    assert parse_seeds(str(MAX_SEED)) == [MAX_SEED]
    torch.Generator().manual_seed(MAX_SEED * 1_000_003 + 63)  # a worker's derived seed (resources.py)
    assert load_template("embodied_srpo", [f"run.seed={MAX_SEED}"]).config.run.seed == MAX_SEED
    with pytest.raises(TemplateError, match="run.seed"):
        load_template("embodied_srpo", [f"run.seed={MAX_SEED + 1}"])


def test_mean_interval_is_students_t():
    # The three seeds of the main job: 40%, 82%, 30%.
    # mean 0.50667; s = sqrt(((-.10667)^2 + .31333^2 + (-.20667)^2) / 2) = 0.275923; s/sqrt(3) = 0.159304
    mean, low, high = mean_interval([0.40, 0.82, 0.30])
    assert mean == pytest.approx(0.5066667, abs=1e-6)
    assert (high - low) / 2 == pytest.approx(T_975_2 * 0.159304, abs=1e-5)
    assert low == pytest.approx(0.5066667 - 0.685434, abs=1e-5) and high == pytest.approx(1.192101, abs=1e-5)
    assert mean_interval([0.40, 0.82, 0.30], bounds=(0.0, 1.0)) == pytest.approx((0.5066667, 0.0, 1.0), abs=1e-6)
    assert mean_interval([0.7]) == (0.7, None, None)
    same = mean_interval([0.5, 0.5, 0.5])
    assert same == (0.5, 0.5, 0.5)
    # A report shows no interval for seeds that agree: a width of 0 says nothing of another seed's
    from vla_rl.sweep import _interval
    assert _interval(*same[1:]) == "n/a (no spread across the seeds)" and _interval(None, None) == "n/a (one seed)"
    assert _interval(0.2, 0.5) == "[20.0%, 50.0%]"
    with pytest.raises(ValueError):
        mean_interval([])


HOST = {"cpu": "Intel(R) Xeon(R) Processor", "cpu_flags": "fc7df03f53a7", "cpu_capability": "AVX512",
        "logical_cpus": 2, "gpu": None, "python": "3.11.7", "torch": "2.13.0+cpu", "numpy": "1.26.4", "mujoco": "3.3.0"}


def fake_run(run_dir: Path, seed: int, first: float, final: float, steps: int = 3, per_step: int | None = 1000,
             hosts: list[dict] | None = None) -> None:
    """A finished run's files as the driver writes them: summary.json and metrics.jsonl (with
    ``hosts``, one record per rank, when given: runs before 2026-12-05 wrote none)."""
    run_dir.mkdir(parents=True)
    (run_dir / "template.yaml").write_text("name: embodied_srpo\n")

    def evaluation(rate: float) -> dict:
        return {f"eval/greedy/{k}": v for k, v in
                {"success_rate": rate, "episodes": 50.0, "ci_low": rate - 0.1, "ci_high": rate + 0.1}.items()}

    records = [{"step": 0, **evaluation(first)}]
    for step in range(1, steps + 1):
        records.append({"step": step, "rollout/success_rate": first + (final - first) * step / steps,
                        **({} if per_step is None else {"rollout/total_env_steps": float(step * per_step)})})
    records.append({"step": steps, **evaluation(final)})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"template": "embodied_srpo", "warm_start_eval": evaluation(first), "final_eval": evaluation(final),
               "last_step": steps, "steps_run": steps, "wall_time_s": 600.0 + seed,
               **({} if hosts is None else {"hosts": hosts})}
    (run_dir / "summary.json").write_text(json.dumps(summary))


def test_the_report_of_a_text_sweep_has_no_environment_steps_column(tmp_path):
    """Text runs simulate nothing (no ``rollout/total_env_steps``): the table drops the column, which
    read 0 for every seed, and the plot's x axis is the training step."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / SWEEP_FILE).write_text(json.dumps({"template": "llm_grpo", "overrides": [], "seeds": [0, 1]}))
    for seed, (first, final) in enumerate([(0.69, 0.81), (0.54, 0.76)]):
        fake_run(seed_run_dir(sweep, seed), seed, first, final, per_step=None)
    report = write_report(sweep)
    assert report["across_seeds"]["env_steps"] is None
    md = (sweep / REPORT_MD).read_text()
    assert "| seed | warm_start greedy | final greedy | wall (min) |" in md
    assert "| 1 | 54.0% [44.0%, 64.0%] | 76.0% [66.0%, 86.0%] | 10.0 |" in md
    assert (sweep / PLOT_FILE).stat().st_size > 0


def test_the_report_of_three_seeds(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / SWEEP_FILE).write_text(json.dumps({"template": "embodied_srpo", "overrides": ["trainer.lr=1e-3"],
                                                "seeds": [0, 1, 2, 3]}))
    for seed, (first, final) in enumerate([(0.24, 0.40), (0.18, 0.82), (0.22, 0.30)]):
        fake_run(seed_run_dir(sweep, seed), seed, first, final, per_step=1000 + seed)
    report = write_report(sweep)
    assert report["finished"] == [0, 1, 2] and report["seeds"] == [0, 1, 2, 3]  # seed 3 has not run
    assert json.loads((sweep / REPORT_JSON).read_text()) == json.loads(json.dumps(report))
    across = report["across_seeds"]
    final = across["final"]["greedy"]
    assert final["seeds"] == 3 and final["mean"] == pytest.approx(0.5066667, abs=1e-6)
    assert (final["ci_low"], final["ci_high"]) == (0.0, 1.0)  # 0.5067 ± 0.6854, clipped to a rate's range
    first_sd = math.sqrt(sum((r - 0.64 / 3) ** 2 for r in (0.24, 0.18, 0.22)) / 2)
    assert across["first"]["greedy"]["ci_high"] == pytest.approx(0.64 / 3 + T_975_2 * first_sd / math.sqrt(3))
    assert across["first"]["greedy"]["mean"] == pytest.approx((0.24 + 0.18 + 0.22) / 3)
    gains = [0.40 - 0.24, 0.82 - 0.18, 0.30 - 0.22]
    sd = math.sqrt(sum((g - sum(gains) / 3) ** 2 for g in gains) / 2)
    assert across["gain"]["greedy"]["mean"] == pytest.approx(sum(gains) / 3)
    assert across["gain"]["greedy"]["ci_low"] == pytest.approx(sum(gains) / 3 - T_975_2 * sd / math.sqrt(3))
    assert across["env_steps"]["mean"] == pytest.approx((3000 + 3003 + 3006) / 3)
    assert report["per_seed"]["1"]["final"]["greedy"] == {"success_rate": 0.82, "episodes": 50.0,
                                                          "ci_low": pytest.approx(0.72), "ci_high": pytest.approx(0.92)}
    assert report["per_seed"]["1"]["first_tag"] == "warm_start"
    md = (sweep / REPORT_MD).read_text()
    assert "| 1 | 18.0% [8.0%, 28.0%] | 82.0% [72.0%, 92.0%] | 3,003 | 10.0 |" in md
    assert "| mean of 3 | 21.3% " in md and "50.7% [0.0%, 100.0%]" in md
    assert "greedy: +29.3 points over the first evaluation" in md
    assert (sweep / PLOT_FILE).stat().st_size > 10_000
    assert report["per_seed"]["0"]["hosts"] is None and "- host of seeds 0, 1, 2: not recorded" in md


def test_the_report_names_the_machines_of_the_seeds(tmp_path):
    """A run repeats on one kind of machine only: the report lists each seed's, once per machine
    (two ranks on one machine record it twice)."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / SWEEP_FILE).write_text(json.dumps({"template": "embodied_srpo", "overrides": [], "seeds": [0, 1, 2]}))
    other = {**HOST, "cpu": "AMD EPYC 9B14", "cpu_flags": "0123456789ab"}
    for seed, hosts in enumerate([[HOST, HOST], [HOST, HOST], [other, other]]):
        fake_run(seed_run_dir(sweep, seed), seed, 0.2, 0.8, hosts=hosts)
    report = write_report(sweep)
    assert report["per_seed"]["0"]["hosts"] == [HOST] and report["per_seed"]["2"]["hosts"] == [other]
    md = (sweep / REPORT_MD).read_text()
    assert ("- host of seeds 0, 1: Intel(R) Xeon(R) Processor (flags fc7df03f53a7, AVX512, 2 CPUs), "
            "torch 2.13.0+cpu, numpy 1.26.4, mujoco 3.3.0, Python 3.11.7") in md
    assert "- host of seed 2: AMD EPYC 9B14 (flags 0123456789ab," in md


@pytest.mark.parametrize(("run_hosts", "unrecorded", "expected"), [
    ([HOST, {**HOST, "cpu": "AMD EPYC 9B14"}], False, [HOST, {**HOST, "cpu": "AMD EPYC 9B14"}]),
    ([HOST], True, None),  # a start before machines were recorded: which ones is unknown
])
def test_a_resumed_seed_names_the_machines_of_every_start(tmp_path, run_hosts, unrecorded, expected):
    """Seed 0 was resumed on another machine: its summary's ``hosts`` are the last start's ranks,
    ``run_hosts`` every start's; the sweep names the latter."""
    run_dir = tmp_path / "seed_0"
    fake_run(run_dir, 0, 0.2, 0.8, hosts=[HOST, HOST])
    summary = json.loads((run_dir / "summary.json").read_text())
    summary.update(run_hosts=run_hosts, hosts_unrecorded=unrecorded)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    assert seed_figures(run_dir)["hosts"] == expected


def test_a_resumed_seed_counts_every_step_and_its_first_evaluation_is_not_the_final(tmp_path):
    """A seed resumed at step 2 ran 1 step in its last start (``steps_run``): its steps are the last
    step, 3; and its first evaluation is the warm start's whatever order the summary's keys have."""
    run_dir = tmp_path / "seed_0"
    fake_run(run_dir, 0, 0.2, 0.8)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary = {"final_eval": summary.pop("final_eval"), **summary, "start_step": 2, "steps_run": 1}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    figures = seed_figures(run_dir)
    assert figures["steps"] == 3 and figures["first_tag"] == "warm_start"
    assert figures["first"]["greedy"]["success_rate"] == 0.2 and figures["final"]["greedy"]["success_rate"] == 0.8


def test_a_seed_resumed_with_another_budget_or_evaluation_reports_its_own(tmp_path):
    """`vla-rl train --resume SWEEP/seed_2 trainer.total_env_steps=2000` (what resuming a finished seed
    suggests): the report held the sweep's budget for it, and compare called two sweeps equal in cost."""
    from vla_rl.driver import prepare_run_dir
    from vla_rl.run_dir import RunDirectory

    run, _, _ = prepare_run_dir("embodied_srpo", [f"run.output_dir={tmp_path}", "run.name=seed_0",
                                                  "trainer.total_env_steps=1000"], resume=None)
    run.close()
    template = run.template_path.read_text()
    shutil.rmtree(run.path)
    fake_run(run.path, 0, 0.2, 0.8)
    run.template_path.write_text(template)
    assert (seed_figures(run.path)["budget"], seed_figures(run.path)["evaluation"]["eval.num_episodes"]) == (1000, 50)
    RunDirectory.reopen(run.path).record_resume(["trainer.total_env_steps=2000", "eval.num_episodes=64"])
    figures = seed_figures(run.path)
    assert figures["budget"] == 2000 and figures["evaluation"]["eval.num_episodes"] == 64


def test_a_report_before_any_seed_finished(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / SWEEP_FILE).write_text(json.dumps({"template": "t.yaml", "overrides": [], "seeds": [5]}))
    report = write_report(sweep)
    assert report["finished"] == [] and report["across_seeds"] is None and not (sweep / PLOT_FILE).exists()
    assert "seeds finished: none" in (sweep / REPORT_MD).read_text()


class FakeTrain:
    """Stands in for vla_rl.driver.train: records its calls, writes a finished run, and is
    interrupted (Ctrl-C) in the run of ``interrupt_seed`` after it wrote a metric (and, with
    ``checkpoint``, a complete checkpoint of step 5)."""

    def __init__(self, interrupt_seed: int | None = None, checkpoint: bool = True) -> None:
        self.calls: list[tuple] = []
        self.interrupt_seed = interrupt_seed
        self.checkpoint = checkpoint

    def __call__(self, template, overrides, resume=None, console=None):
        self.calls.append((template, tuple(overrides), resume))
        if resume is not None:
            run = Path(resume)
            seed = int(run.name.removeprefix("seed_"))
            shutil.rmtree(run)
        else:
            values = dict(o.split("=", 1) for o in overrides)
            seed = int(values["run.seed"])
            run = Path(values["run.output_dir"]) / values["run.name"]
            if seed == self.interrupt_seed:
                self.interrupt_seed = None
                run.mkdir()
                (run / "template.yaml").write_text("name: x\n")
                (run / "metrics.jsonl").write_text('{"step": 1}\n')
                if self.checkpoint:
                    (run / "checkpoints" / "step_00000005").mkdir(parents=True)
                    (run / "checkpoints" / "step_00000005" / "trainer_state.json").write_text("{}")
                raise KeyboardInterrupt
        fake_run(run, seed, 0.2, 0.5 + seed / 10)
        return {}


def test_an_interrupted_sweep_resumes_where_it_stopped(tmp_path, monkeypatch, capsys):
    fake = FakeTrain(interrupt_seed=1)
    monkeypatch.setattr("vla_rl.driver.train", fake)
    out = tmp_path / "outputs"
    args = ["train", "embodied_srpo", "--seeds", "0-2", "trainer.total_steps=3", f"run.output_dir={out}",
            "run.name=three"]
    assert main(args) == 130  # Ctrl-C during seed 1
    sweep = out / "three"
    assert json.loads((sweep / SWEEP_FILE).read_text()) == {
        "template": "embodied_srpo", "overrides": ["trainer.total_steps=3"], "seeds": [0, 1, 2]}
    assert [c[2] for c in fake.calls] == [None, None]
    assert fake.calls[0][1] == ("trainer.total_steps=3", "run.seed=0", f"run.output_dir={sweep}", "run.name=seed_0")
    assert json.loads((sweep / REPORT_JSON).read_text())["finished"] == [0]

    assert main(["train", "--resume", str(sweep)]) == 0
    # seed 0 kept; seed 1 resumed from its run directory; seed 2 started
    assert [(c[0], c[2]) for c in fake.calls[2:]] == [(None, str(seed_run_dir(sweep, 1))), ("embodied_srpo", None)]
    report = json.loads((sweep / REPORT_JSON).read_text())
    assert report["finished"] == [0, 1, 2]
    assert report["across_seeds"]["final"]["greedy"]["mean"] == pytest.approx(0.6)
    assert "mean of 3" in capsys.readouterr().out
    calls = len(fake.calls)
    assert main(["train", "--resume", str(sweep)]) == 0 and len(fake.calls) == calls  # nothing left to run


def test_a_seed_stopped_before_its_first_checkpoint_starts_again(tmp_path, monkeypatch, capsys):
    fake = FakeTrain(interrupt_seed=1, checkpoint=False)
    monkeypatch.setattr("vla_rl.driver.train", fake)
    out = tmp_path / "outputs"
    assert main(["train", "embodied_srpo", "--seeds", "0,1", f"run.output_dir={out}", "run.name=two"]) == 130
    sweep = out / "two"
    (sweep / "seed_1.stopped").mkdir()  # an earlier set-aside: the next name is taken
    assert main(["train", "--resume", str(sweep)]) == 0
    # seed 1 started again, not resumed: resuming needs a checkpoint
    assert [(c[0], c[2]) for c in fake.calls[2:]] == [("embodied_srpo", None)]
    assert fake.calls[2][1][-1] == "run.name=seed_1"
    kept = sweep / "seed_1.stopped-2"
    assert (kept / "metrics.jsonl").read_text() == '{"step": 1}\n'  # what it wrote is kept
    assert "seed_1 stopped before its first checkpoint: kept as seed_1.stopped-2" in capsys.readouterr().out
    assert json.loads((sweep / REPORT_JSON).read_text())["finished"] == [0, 1]


@pytest.mark.parametrize(("args", "message"), [
    (["--seeds", "0,0"], "seeds are distinct"),
    (["--seeds", "0,1", "run.seed=3"], "--seeds sets run.seed"),
    (["--seeds", "0,1", "trainer.totl_steps=3"], "trainer.totl_steps"),
])
def test_the_command_line_refuses_a_bad_sweep_before_anything_is_written(args, message, tmp_path, capsys,
                                                                         monkeypatch):
    monkeypatch.setattr("vla_rl.driver.train", FakeTrain())
    assert main(["train", "embodied_srpo", *args, f"run.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_resuming_a_sweep_takes_no_template_override_or_seeds(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("vla_rl.driver.train", FakeTrain())
    run_sweep("embodied_srpo", [f"run.output_dir={tmp_path}", "run.name=s"], [0])
    sweep = tmp_path / "s"
    before = {p: p.stat().st_mtime_ns for p in sweep.rglob("*")}
    for extra, message in ((["--seeds", "4"], "remove --seeds"), (["trainer.total_steps=9"], "takes no template"),
                           (["embodied_srpo"], "takes no template")):
        assert main(["train", "--resume", str(sweep), *extra]) == 2
        assert message in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in sweep.rglob("*")} == before
    with pytest.raises(Exception, match="not a sweep directory: it has no sweep.json"):
        resume_sweep(seed_run_dir(sweep, 0))
    # one run (a seed's) with --seeds: not called a sweep
    assert main(["train", "--resume", str(seed_run_dir(sweep, 0)), "--seeds", "0-1"]) == 2
    assert "is one run, not a sweep (no sweep.json); resume it without --seeds" in " ".join(
        capsys.readouterr().err.split())


@pytest.mark.slow
def test_a_two_seed_sweep_of_the_main_job(tmp_path, capsys):
    """The real thing, shrunk: two seeds of the main job, one training step each."""
    out = tmp_path / "outputs"
    assert main(["train", "embodied_srpo", "--seeds", "0,1", "trainer.total_steps=1", "warm_start.num_demos=2",
                 "warm_start.bc_steps=5", "eval.num_episodes=4", "eval.video_episodes=0", f"run.output_dir={out}",
                 "run.name=two"]) == 0
    report = json.loads((out / "two" / REPORT_JSON).read_text())
    assert report["finished"] == [0, 1]
    for seed in ("0", "1"):
        figures = report["per_seed"][seed]
        assert figures["final"]["greedy"]["episodes"] == 4 and figures["env_steps"] > 0
    assert report["across_seeds"]["final"]["greedy"]["seeds"] == 2
    assert report["per_seed"]["0"]["hosts"] == [host_record()]  # two CPU workers on this machine: one record
    summary = json.loads((out / "two" / "seed_0" / "summary.json").read_text())
    assert (summary["run_hosts"], summary["hosts_unrecorded"]) == ([host_record()], False)
    templates = [(out / "two" / f"seed_{s}" / "template.yaml").read_text() for s in (0, 1)]
    assert "seed: 0" in templates[0] and "seed: 1" in templates[1]
    assert (out / "two" / PLOT_FILE).is_file()


def test_the_report_records_the_evaluation_its_runs_resolved(tmp_path):
    """vla-rl compare judged committed reports with its own checkout's templates and defaults;
    a report now records what its runs evaluated (their template.yaml)."""
    import yaml

    from vla_rl.dag.loader import load_template

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / SWEEP_FILE).write_text(json.dumps({"template": "embodied_srpo", "overrides": [], "seeds": [0]}))
    run = seed_run_dir(sweep, 0)
    fake_run(run, 0, 0.2, 0.4)
    resolved = load_template("embodied_srpo", ["eval.num_episodes=7", "simulator.env.horizon=60"]).raw
    (run / "template.yaml").write_text(yaml.safe_dump(resolved))
    evaluation = write_report(sweep)["evaluation"]
    assert evaluation["eval.num_episodes"] == 7 and evaluation["simulator.env.horizon"] == 60
    assert evaluation["simulator.env.task"] == "Lift" and "simulator.actors_per_worker" not in evaluation
