"""Two seed sweeps compared seed by seed (vla_rl.sweep_compare, ``vla-rl compare``): the paired
differences and their interval against hand-computed values, the cost check, the refusals."""

from __future__ import annotations

import json
import math

import pytest

from vla_rl.cli import main
from vla_rl.errors import CommandLineError
from vla_rl.sweep import REPORT_JSON
from vla_rl.sweep_compare import COMPARE_JSON, COMPARE_MD, COMPARE_PLOT, compare, compare_sweeps, markdown, read_report

#: Student's t quantile t_{0.975, 2} (two-sided 95%, 2 degrees of freedom), from a table.
T_975_2 = 4.302652729749464


def figures(rate: float) -> dict:
    return {"success_rate": rate, "episodes": 50.0, "ci_low": rate - 0.1, "ci_high": rate + 0.1}


def report(template: str, overrides: list[str], finals: dict[str, float], env_steps: float, first: float = 0.2):
    return {"template": template, "overrides": overrides, "seeds": [int(s) for s in finals],
            "per_seed": {seed: {"first_tag": "warm_start", "first": {"greedy": figures(first)},
                                "final": {"greedy": figures(rate)}, "env_steps": env_steps, "steps": 40,
                                "wall_time_s": 600.0} for seed, rate in finals.items()}}


GRPO = report("embodied_grpo", ["trainer.total_env_steps=80000"], {"0": 0.98, "1": 0.90, "2": 0.92}, 80_500)
SRPO = report("embodied_srpo", ["trainer.total_env_steps=80000"], {"0": 0.92, "1": 1.00, "2": 0.96, "3": 0.5},
              82_110)


def test_paired_differences_and_their_student_t_interval():
    result = compare(GRPO, SRPO)
    assert result["seeds"] == ["0", "1", "2"]  # seed 3 is only in B: not paired
    assert result["equal_budget"] and result["a"]["budget"] == result["b"]["budget"] == 80_000
    diffs = [-0.06, 0.10, 0.04]
    assert [result["per_seed"][s]["greedy"]["difference"] for s in ("0", "1", "2")] == pytest.approx(diffs)
    mean = sum(diffs) / 3
    half = T_975_2 * math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2) / math.sqrt(3)
    difference = result["across_seeds"]["greedy"]["difference"]
    assert difference["mean"] == pytest.approx(mean) and difference["seeds"] == 3
    assert (difference["ci_low"], difference["ci_high"]) == pytest.approx((mean - half, mean + half))
    assert result["across_seeds"]["greedy"]["gain_b"]["mean"] == pytest.approx((0.72 + 0.80 + 0.76) / 3)
    assert result["per_seed"]["1"]["env_steps"] == {"a": 80_500, "b": 82_110, "ratio": pytest.approx(82_110 / 80_500)}


def test_a_seed_resumed_to_another_budget_is_not_at_equal_cost(tmp_path):
    """A's seed 2 resumed to twice the budget: compare read the budget of the sweeps' overrides alone
    and said both stopped at 80,000."""
    a = json.loads(json.dumps(GRPO))
    for seed, goal in (("0", 80_000), ("1", 80_000), ("2", 160_000)):
        a["per_seed"][seed]["budget"] = goal
    a["per_seed"]["2"]["env_steps"] = 160_300
    result = compare(a, SRPO)
    assert not result["equal_budget"] and result["a"]["budget"] is None and result["b"]["budget"] == 80_000
    assert result["a"]["seed_budgets"] == {"0": 80_000, "1": 80_000, "2": 160_000}
    assert "do not stop at the same trainer.total_env_steps (seed 0: A 80,000, B 80,000; seed 1: A 80,000, B " \
           "80,000; seed 2: A 160,000, B 80,000)" in markdown(result)


def test_a_seed_evaluated_otherwise_or_on_another_machine_is_named_per_pair():
    """Evaluation settings and machines are compared pair by pair: pooled over the seeds, A's seed 0
    on one CPU and B's seeds 1, 2 on it read as the same machines; a resume of one seed with more
    held-out episodes was not seen."""
    intel, amd = {"cpu": "Intel Xeon", "torch": "2.13.0"}, {"cpu": "AMD EPYC", "torch": "2.13.0"}
    a, b = json.loads(json.dumps(GRPO)), json.loads(json.dumps(SRPO))
    for seed in ("0", "1", "2"):
        a["per_seed"][seed].update(hosts=[amd if seed == "0" else intel], evaluation={"eval.num_episodes": 50})
        b["per_seed"][seed].update(hosts=[intel if seed == "0" else amd],
                                   evaluation={"eval.num_episodes": 64 if seed == "2" else 50})
    result = compare(a, b)
    assert result["hosts"]["differ_in"] == ["cpu"]
    assert result["evaluation_differs_in"] == ["eval.num_episodes: 50 vs 64"]
    text = markdown(result)
    assert "The sweeps ran on different machines (they differ in cpu)" in text
    assert "**Not the same held-out evaluation**: the sweeps differ in eval.num_episodes: 50 vs 64" in text
    for seed in ("0", "1", "2"):
        b["per_seed"][seed].update(hosts=a["per_seed"][seed]["hosts"], evaluation={"eval.num_episodes": 50})
    result = compare(a, b)
    assert result["hosts"]["differ_in"] == [] and result["evaluation_differs_in"] == []


def test_a_live_sweep_whose_runs_changed_after_its_report_is_refused_as_stale(tmp_path):
    """A seed resumed after the report (other final figures and environment steps), or finished
    after it: compare read the old figures. A copy of the sweep (every file's time new) is not stale."""
    import shutil

    from test_sweep import fake_run

    from vla_rl.sweep import SWEEP_FILE, seed_run_dir, write_report

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / SWEEP_FILE).write_text(json.dumps({"template": "embodied_grpo", "overrides": [], "seeds": [0, 1, 2]}))
    for seed in (0, 1):
        fake_run(seed_run_dir(sweep, seed), seed, 0.2, 0.5 + seed / 10)
    write_report(sweep)
    copy = shutil.copytree(sweep, tmp_path / "copy", copy_function=shutil.copy)  # new times, report first or not
    assert read_report(copy)["per_seed"]["1"]["final"]["greedy"]["success_rate"] == 0.6
    shutil.rmtree(seed_run_dir(copy, 1))
    fake_run(seed_run_dir(copy, 1), 1, 0.2, 0.9, steps=6)  # resumed to a larger budget
    stale = r"report.json does not hold what the runs of seeds {} now end with .*: it is stale; run `vla-rl train " \
            r"--resume .*` to rewrite it from its runs"
    with pytest.raises(CommandLineError, match=stale.format(1)):
        read_report(copy)
    fake_run(seed_run_dir(sweep, 2), 2, 0.2, 0.7)  # finished after the report
    with pytest.raises(CommandLineError, match=stale.format(2)):
        read_report(sweep)


def test_seeds_one_sweep_lacks_and_an_unfinished_sweep_are_named():
    """A finished seeds 0-2, B asked for 1-3 and finished 1 and 2: only "seeds both finished: 1, 2"
    was said, and A's gain over its first evaluation silently moved to the paired seeds."""
    b = report("embodied_srpo", ["trainer.total_env_steps=80000"], {"1": 0.9, "2": 0.95}, 80_300)
    b["seeds"] = [1, 2, 3]
    text = markdown(compare(GRPO, b))
    assert "- seeds both finished: 1, 2\n" in text
    assert "- left out: A's seed(s) 0, which B has not finished (its own report counts them)" in text
    assert "- B is not finished: seed(s) 3 asked for and not run to the end" in text
    assert "left out" not in markdown(compare(GRPO, GRPO))


def test_intervals_of_differences_end_at_plus_and_minus_100_points():
    """Spread seeds: the t interval's half width, 4.30 x s / sqrt(3), passes 100 points; a difference
    of two success rates cannot (the committed 80k comparison read [-110.3, +155.6])."""
    a = report("embodied_grpo", [], {"0": 0.76, "1": 0.58, "2": 0.16}, 80_000, first=0.2)
    b = report("embodied_srpo", [], {"0": 0.54, "1": 0.66, "2": 0.98}, 80_000, first=0.2)
    across = compare(a, b)["across_seeds"]["greedy"]
    diffs = [-0.22, 0.08, 0.82]
    mean = sum(diffs) / 3
    half = T_975_2 * math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2) / math.sqrt(3)
    assert mean - half < -1 and mean + half > 1  # unclipped: [-110.3, +155.6]
    assert (across["difference"]["ci_low"], across["difference"]["ci_high"]) == (-1.0, 1.0)
    assert across["difference"]["mean"] == pytest.approx(mean)
    assert across["gain_b"]["ci_high"] == 1.0 and across["gain_b"]["ci_low"] > -1  # 0.34, 0.46, 0.78 over 0.2


def test_the_report_says_when_the_budgets_differ(tmp_path):
    other = report("embodied_srpo", [], {"0": 0.5, "1": 0.6}, 180_000)
    result = compare(GRPO, other)
    assert not result["equal_budget"] and result["b"]["budget"] is None  # the template sets none
    for name, data in (("a", GRPO), ("b", other)):
        (tmp_path / name).mkdir()
        (tmp_path / name / REPORT_JSON).write_text(json.dumps(data))
    compare_sweeps(tmp_path / "a", tmp_path / "b", tmp_path / "out")
    text = (tmp_path / "out" / COMPARE_MD).read_text()
    assert "do not stop at the same trainer.total_env_steps (A: 80,000, B: n/a)" in text
    assert "| 1 | 90.0% [80.0, 100.0] | 60.0% [50.0, 70.0] | -30.0 |" in text
    assert json.loads((tmp_path / "out" / COMPARE_JSON).read_text())["seeds"] == ["0", "1"]
    assert (tmp_path / "out" / COMPARE_PLOT).stat().st_size > 10_000


def test_the_command_line_writes_the_comparison_beside_the_baseline(tmp_path, capsys):
    for name, data in (("grpo_sweep", GRPO), ("srpo_sweep", SRPO)):
        (tmp_path / name).mkdir()
        (tmp_path / name / REPORT_JSON).write_text(json.dumps(data))
    assert main(["compare", str(tmp_path / "grpo_sweep"), str(tmp_path / "srpo_sweep")]) == 0
    out = capsys.readouterr().out
    assert "Both sweeps stop at the same environment-step budget (trainer.total_env_steps=80,000)" in out
    assert "B - A: +2.7 points, 95% interval [-17.4, +22.7] (3 seeds, paired)" in out
    assert (tmp_path / "compare_grpo_sweep_vs_srpo_sweep" / COMPARE_MD).is_file()


def test_sweeps_without_a_shared_seed_or_report_are_refused(tmp_path, capsys):
    with pytest.raises(CommandLineError, match="the sweeps share no finished seed"):
        compare(GRPO, report("embodied_srpo", [], {"7": 0.5}, 1.0))
    assert main(["compare", str(tmp_path), str(tmp_path)]) == 2
    assert "holds no seed sweep report (report.json)" in capsys.readouterr().err


def test_seeds_that_agree_get_no_interval_and_unpaired_protocols_are_left_out(tmp_path):
    """Equal differences on every seed have a Student t interval of width 0, which says nothing of
    another seed's: the report says so instead of printing [+4.0, +4.0]. A protocol that no seed
    evaluated in both sweeps is left out (compare.md failed on it); with none left, the command
    says why."""
    a = report("embodied_grpo", [], {"0": 0.5, "1": 0.6}, 80_000)
    b = report("embodied_srpo", [], {"0": 0.54, "1": 0.64}, 80_000)
    a["per_seed"]["0"]["final"]["sampled"] = figures(0.3)  # only seed 0 in A, only seed 1 in B
    b["per_seed"]["1"]["final"]["sampled"] = figures(0.4)
    result = compare(a, b)
    assert list(result["across_seeds"]) == ["greedy"]
    text = _written(tmp_path, a, b)
    assert "- B - A: +4.0 points, 95% interval n/a (no spread across the seeds) (2 seeds, paired)" in text
    for side in (a, b):
        for seed in side["per_seed"].values():
            seed["final"].pop("greedy")
    with pytest.raises(CommandLineError, match="share no protocol evaluated at the end of one seed's runs in both"):
        compare(a, b)


def _written(tmp_path, a, b) -> str:
    for name, data in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / REPORT_JSON).write_text(json.dumps(data))
    compare_sweeps(tmp_path / "a", tmp_path / "b", tmp_path / "out")
    return (tmp_path / "out" / COMPARE_MD).read_text()


def test_a_sweep_compared_with_itself_or_written_over_a_file_is_refused(tmp_path, capsys):
    """Both exited 0 with a comparison of a sweep against itself, or a FileExistsError traceback."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / REPORT_JSON).write_text(json.dumps(GRPO))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / REPORT_JSON).write_text(json.dumps(GRPO))
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "a" / REPORT_JSON)]) == 2
    assert "are the same sweep" in capsys.readouterr().err
    (tmp_path / "file").write_text("mine")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--output", str(tmp_path / "file")]) == 2
    assert "--output" in capsys.readouterr().err and (tmp_path / "file").read_text() == "mine"


HOST = {"cpu": "Intel(R) Xeon(R) Processor", "cpu_flags": "fc7df03f53a7", "cpu_capability": "AVX512",
        "logical_cpus": 2, "gpu": None, "python": "3.11.7", "torch": "2.13.0+cpu", "numpy": "1.26.4", "mujoco": "3.3.0"}
OTHER = {**HOST, "cpu": "AMD EPYC 9B14", "cpu_flags": "0123456789ab"}


def with_hosts(data: dict, hosts: dict[str, list[dict]]) -> dict:
    """``data`` with the machines its seeds' runs recorded (reports before 2026-12-05 have none)."""
    out = json.loads(json.dumps(data))
    for seed, records in hosts.items():
        out["per_seed"][seed]["hosts"] = records
    return out


@pytest.mark.parametrize(("b_hosts", "differ_in", "line"), [
    ([HOST], [], "Both sweeps ran on the same kind of machine: Intel(R) Xeon(R) Processor (flags fc7df03f53a7"),
    ([OTHER], ["cpu", "cpu_flags"], "The sweeps ran on different machines (they differ in cpu, cpu_flags)"),
    (None, None, "Hosts: not recorded by B (an earlier vla-rl recorded none, or not those of every start"),
])
def test_the_comparison_says_whether_both_sweeps_ran_on_one_kind_of_machine(b_hosts, differ_in, line, tmp_path):
    """The same code and seed give other figures on another machine (vla_rl/utils/host.py): a
    comparison across machines says so, and one whose runs recorded no machine says it is unknown."""
    a = with_hosts(GRPO, {seed: [HOST] for seed in ("0", "1", "2")})
    b = SRPO if b_hosts is None else with_hosts(SRPO, {seed: b_hosts for seed in ("0", "1", "2", "3")})
    for name, data in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / REPORT_JSON).write_text(json.dumps(data))
    result = compare_sweeps(tmp_path / "a", tmp_path / "b", tmp_path / "out")
    assert result["hosts"]["differ_in"] == differ_in and result["hosts"]["a"] == [HOST]
    assert line in (tmp_path / "out" / COMPARE_MD).read_text()
    if differ_in:  # each side's machine is named
        assert "- B: AMD EPYC 9B14 (flags 0123456789ab" in (tmp_path / "out" / COMPARE_MD).read_text()


def test_one_seed_without_recorded_machines_leaves_the_hosts_unknown():
    """B's seed 1 was resumed from a run that recorded no machine: whether the sweeps ran on the
    same machines is unknown, although the other seeds' runs name the same."""
    a = with_hosts(GRPO, {seed: [HOST] for seed in ("0", "1", "2")})
    b = with_hosts(SRPO, {"0": [HOST], "1": None, "2": [HOST], "3": [HOST]})
    result = compare(a, b)
    assert result["hosts"]["differ_in"] is None and result["hosts"]["b"] is None and result["hosts"]["a"] == [HOST]


def test_a_difference_that_rounds_to_zero_reads_plus_zero():
    from vla_rl.sweep_compare import _points

    assert [_points(v) for v in (-1e-17, -0.0004, 0.0, 0.123, -0.0006)] == ["+0.0", "+0.0", "+0.0", "+12.3", "-0.1"]


@pytest.mark.parametrize("damage, field", [
    (lambda r: r["per_seed"]["0"].pop("final"), "per_seed.0.final: Field required"),
    (lambda r: r["per_seed"]["1"]["first"]["greedy"].update(success_rate="high"),
     "per_seed.1.first.greedy.success_rate: Input should be a valid number"),
    (lambda r: r.update(per_seed=[1, 2]), "per_seed: Input should be a valid dictionary"),
])
def test_a_damaged_report_is_one_line_naming_the_field(tmp_path, capsys, damage, field):
    """A report whose seed lacks ``final`` (or holds a non-number) was a KeyError traceback."""
    damaged = json.loads(json.dumps(GRPO))
    damage(damaged)
    for name, data in (("a", damaged), ("b", SRPO)):
        (tmp_path / name).mkdir()
        (tmp_path / name / REPORT_JSON).write_text(json.dumps(data))
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert f"is not a seed sweep's report: {field}" in err and "Traceback" not in err
    assert not (tmp_path / "compare_a_vs_b").exists()


def test_runs_that_ended_below_the_budget_are_not_at_equal_cost(tmp_path):
    """A sweep stopped by trainer.total_steps at 724 environment steps was reported as "Both sweeps
    stop at the same environment-step budget" beside one that ran 2,324 (equal_budget true)."""
    short = report("embodied_grpo", ["trainer.total_env_steps=80000"], {"0": 0.5, "1": 0.6, "2": 0.7}, 80_500)
    short["per_seed"]["0"]["env_steps"] = 724.0
    result = compare(short, SRPO)
    assert not result["equal_budget"] and result["short_of_budget"] == {"a": {"0": 724.0}, "b": {}}
    short["per_seed"]["0"]["env_steps"] = 80_000.0  # exactly the budget: reached it
    assert compare(short, SRPO)["short_of_budget"]["a"] == {}
    short["per_seed"]["0"]["env_steps"] = 724.0
    evaluation = {"run.workflow": "embodied", "eval.num_episodes": 50}  # as both reports record it
    for name, data in (("a", short), ("b", SRPO)):
        (tmp_path / name).mkdir()
        (tmp_path / name / REPORT_JSON).write_text(json.dumps({**data, "evaluation": evaluation}))
    compare_sweeps(tmp_path / "a", tmp_path / "b", tmp_path / "out")
    text = (tmp_path / "out" / COMPARE_MD).read_text()
    assert ("**Not at equal cost**: runs ended below their trainer.total_env_steps (A: 80,000, B: 80,000), their "
            "trainer.total_steps coming first (A seed 0 at 724 environment steps)") in text
    assert "Both sweeps stop at the same" not in text
    # the evaluation settings both record are equal: said so (compare.md said nothing of them)
    assert "Both sweeps evaluated the same held-out episodes: the evaluation settings their reports record are " \
           "equal." in text


@pytest.mark.parametrize("template, overrides, differs", [
    ("embodied_grpo", ["eval.num_episodes=6", "eval.init_state_offset=500000"],
     ["eval.init_state_offset: 500000 vs 1000000000", "eval.num_episodes: 6 vs 50"]),
    ("embodied_grpo", ["simulator.env.task=Stack"],
     ["simulator.env.obs_keys: ", "simulator.env.task: 'Stack' vs 'Lift'"]),
    ("embodied_grpo", ["simulator.step_timeout_s=900", "simulator.actors_per_worker=2", "simulator.pipeline_stages=2"],
     []),  # resources: the same episodes
    ("llm_grpo", ["text.arithmetic_levels=[add_2digit,sub_2digit]", "text.num_generated_test=128",
                  "text.answer_extraction=flexible", "text.max_response_length=8"],
     ["text.answer_extraction: 'flexible' vs 'strict'", "text.arithmetic_levels: ", "text.max_response_length: 8 vs",
      "text.num_generated_test: 128 vs"]),
])
def test_sweeps_evaluated_on_other_episodes_are_said_so(template, overrides, differs):
    """A GRPO sweep on Stack (or on other held-out states or prompts) compared with SRPO on Lift
    printed a paired B - A and no warning."""
    base = SRPO if template == "embodied_grpo" else report("llm_grpo", [], {"0": 0.5, "1": 0.6}, None)
    other = report(template, [*base["overrides"], *overrides], {"0": 0.5, "1": 0.6}, 80_500)
    found = compare(other, base)["evaluation_differs_in"]
    assert bool(found) == bool(differs), found
    for expected in differs:
        assert any(item.startswith(expected) for item in found), (expected, found)
    assert compare(GRPO, SRPO)["evaluation_differs_in"] == []


def test_a_reports_recorded_evaluation_settings_are_compared_not_todays_defaults():
    """A committed report was judged with this checkout's templates: an 11-value state of its time
    compared equal to today's 15."""
    recorded = {**SRPO, "evaluation": {"run.workflow": "embodied", "simulator.env.obs_keys": ["cube_pos"]}}
    result = compare(GRPO, recorded)
    assert result["evaluation_differs_in"][0].startswith("simulator.env.obs_keys: [") and (
        result["evaluation_differs_in"][0].endswith("vs ['cube_pos']"))
    assert result["evaluation_source"] == "derived"  # A records none
    unloadable = {**GRPO, "template": "no_such_template"}
    result = compare(unloadable, SRPO)
    assert result["evaluation_differs_in"] is None and "no_such_template with its overrides does not load here" in (
        result["evaluation_source"])


def test_a_run_without_recorded_environment_steps_is_not_known_to_reach_the_budget():
    unknown = json.loads(json.dumps(GRPO))
    unknown["per_seed"]["0"]["env_steps"] = None
    result = compare(unknown, SRPO)
    assert not result["equal_budget"] and result["short_of_budget"]["a"] == {"0": None}


def test_a_live_sweeps_report_naming_a_run_that_is_gone_is_refused(tmp_path, capsys):
    """compare used a deleted seed's figures from the stale report.json."""
    from vla_rl_core.run_layout import SUMMARY_FILE, SWEEP_FILE

    sweep = tmp_path / "srpo"
    sweep.mkdir()
    (sweep / SWEEP_FILE).write_text(json.dumps({"template": "embodied_srpo", "overrides": [], "seeds": [0, 1, 2, 3]}))
    (sweep / REPORT_JSON).write_text(json.dumps(SRPO))
    for seed in (0, 2, 3):
        (sweep / f"seed_{seed}").mkdir()
        (sweep / f"seed_{seed}" / SUMMARY_FILE).write_text("{}")
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / REPORT_JSON).write_text(json.dumps(GRPO))  # a committed report: no runs beside it
    assert main(["compare", str(tmp_path / "grpo"), str(sweep)]) == 2
    assert (f"reports seeds 1 whose runs are no longer in {sweep} (no seed_<n>/summary.json): it is stale; run "
            f"`vla-rl train --resume {sweep}`") in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "grpo"), str(sweep / REPORT_JSON), "--output", str(tmp_path / "o")]) == 0
