"""Two seed sweeps compared seed by seed: ``vla-rl compare SWEEP_A SWEEP_B``.

An algorithm beats another only over seeds, and only at equal cost. The comparison pairs the runs
of the two sweeps by seed (the seeds both finished), and for each held-out protocol gives, per
seed, each run's final success rate (Wilson 95%, as the run measured it) and the difference B - A;
across the seeds, the mean difference with a two-sided 95% Student t interval over the paired
differences (n - 1 degrees of freedom; :func:`~vla_rl.utils.stats.mean_interval`; clipped to
[-100, +100] points, what a difference of two success rates can be), and the same for each sweep's
own gain over its first evaluation. It also says whether the runs are comparable in
cost: each seed's environment steps in both sweeps and their ratio, and whether both sweeps set
the same ``trainer.total_env_steps`` budget and every run reached it; whether they evaluated the
same held-out episodes (:func:`vla_rl.sweep.evaluation_settings`, as each report recorded them,
or derived from this checkout's templates for a report that records none); and whether they ran
on the same machines (the hosts their runs recorded, :mod:`vla_rl.utils.host`): the same code and
seed give other figures on another machine, so a difference between sweeps of two machines is
partly the machines'.

It reads each sweep's ``report.json`` (written by :func:`vla_rl.sweep.write_report`), so committed
reports compare as well as live sweep directories (whose report must still be their runs':
one naming a run that is gone is refused); it writes ``compare.json``, ``compare.md`` and
``compare.png`` (each seed's final success in A and in B, per protocol).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import load_template
from vla_rl.errors import CommandLineError
from vla_rl.sweep import DIFFERENCE_BOUNDS, REPORT_JSON, evaluation_settings, seed_figures, seed_run_dir
from vla_rl.utils.host import describe, differences, distinct
from vla_rl.utils.stats import mean_interval
from vla_rl_core.run_layout import METRICS_FILE, SUMMARY_FILE, SWEEP_FILE

COMPARE_JSON, COMPARE_MD, COMPARE_PLOT = "compare.json", "compare.md", "compare.png"
_BUDGET_KEY = "trainer.total_env_steps"


class _Figures(BaseModel):
    """One protocol's evaluation in a report (rates in [0, 1]); other fields are kept unread."""

    model_config = ConfigDict(extra="allow")
    success_rate: float
    ci_low: float
    ci_high: float


class _SeedFigures(BaseModel):
    model_config = ConfigDict(extra="allow")
    first: dict[str, _Figures]
    final: dict[str, _Figures]
    env_steps: float | None = None
    hosts: list[dict[str, Any]] | None = None


class _Report(BaseModel):
    """The fields of :func:`vla_rl.sweep.write_report`'s ``report.json`` that a comparison reads."""

    model_config = ConfigDict(extra="allow")
    template: str
    overrides: list[str]
    per_seed: dict[str, _SeedFigures]


def read_report(path: str | Path) -> dict[str, Any]:
    """A sweep's report: ``path`` is a sweep directory or its ``report.json``.

    Raises:
        CommandLineError: no report there, or it is not a sweep's report (naming the path, and the
            first field that is missing or of the wrong type).
    """
    path = Path(path)
    file = path / REPORT_JSON if path.is_dir() else path
    if not file.is_file():
        raise CommandLineError(f"{path} holds no seed sweep report ({REPORT_JSON}): compare takes the directories "
                               "of two `vla-rl train TEMPLATE --seeds ...` sweeps")
    try:
        report = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise CommandLineError(f"{file} is not JSON ({err})") from None
    if not isinstance(report, dict) or not {"template", "overrides", "per_seed"} <= set(report):
        raise CommandLineError(f"{file} is not a seed sweep's report (it lacks template, overrides or per_seed)")
    try:
        _Report.model_validate(report)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise CommandLineError(f"{file} is not a seed sweep's report: {field}: {first['msg']}") from None
    if path.is_dir() and (path / SWEEP_FILE).is_file():  # a live sweep (not a committed report): still its runs'
        gone = [seed for seed in report["per_seed"] if not (seed_run_dir(path, int(seed)) / SUMMARY_FILE).is_file()]
        if gone:
            raise CommandLineError(f"{file} reports seeds {', '.join(gone)} whose runs are no longer in {path} (no "
                                   f"seed_<n>/{SUMMARY_FILE}): it is stale; run `vla-rl train --resume {path}` to "
                                   "finish the sweep and rewrite it, or compare the report file itself")
        changed = [str(seed) for seed in report.get("seeds", report["per_seed"]) if _run_changed(path, report, seed)]
        if changed:  # a seed's run resumed (e.g. with a larger budget) or finished after the report
            raise CommandLineError(f"{file} does not hold what the runs of seeds {', '.join(changed)} now end with "
                                   f"(their {SUMMARY_FILE} and {METRICS_FILE}): it is stale; run `vla-rl train "
                                   f"--resume {path}` to rewrite it from its runs")
    return report


def _run_changed(sweep_dir: Path, report: dict[str, Any], seed: int | str) -> bool:
    """Whether seed ``seed``'s run ends otherwise than ``report`` says: resumed since (other final
    figures, steps or environment steps), or finished and not in it. Read from the run's files, not
    their times (a copied sweep has new ones)."""
    run_dir = seed_run_dir(sweep_dir, int(seed))
    if not (run_dir / SUMMARY_FILE).is_file():
        return False
    reported = report["per_seed"].get(str(seed))
    if reported is None:
        return True
    now = json.loads(json.dumps(seed_figures(run_dir)))  # as the report holds it
    return any(now.get(key) != reported.get(key) for key in ("first", "final", "steps", "env_steps"))


def budget(report: dict[str, Any]) -> int | None:
    """The ``trainer.total_env_steps`` of a sweep's runs (its template with its overrides), or
    None: no budget, or the template cannot be loaded here (then only an override counts)."""
    try:
        return load_template(report["template"], recorded=list(report["overrides"])).config.trainer.total_env_steps
    except TemplateError:
        values = [item.partition("=")[2] for item in report["overrides"] if item.partition("=")[0] == _BUDGET_KEY]
        return int(values[-1]) if values and values[-1] not in ("null", "None", "~") else None


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The paired comparison of two sweep reports (see the module docstring).

    Returns:
        ``{"a", "b": {"template", "overrides", "budget", "seed_budgets", "finished", "unfinished"},
        "seeds": [...],
        "equal_budget": bool (each paired seed's runs have one ``trainer.total_env_steps``, a resume
        of one run with another included, and every paired run reached it), "short_of_budget":
        {"a", "b": {seed: env steps}} (runs that ended below their budget: ``trainer.total_steps``
        came first; None: not recorded), "evaluation_differs_in": ["setting: A vs B", ...] ([]: each
        paired seed's runs evaluated alike) or None (unknown), "evaluation_source": "recorded",
        "derived" or why unknown, "per_seed": {seed: {"env_steps": {"a", "b", "ratio"}, protocol:
        {"a", "b", "difference"}}},
        "across_seeds": {protocol: {"difference", "gain_a", "gain_b": {"mean", "ci_low", "ci_high",
        "seeds"}}}, "hosts": {"a", "b": [record, ...] or None (a paired run recorded none),
        "differ_in": [field, ...] ([]: each paired seed's runs on the same hosts) or None (unknown)}}``;
        rates in [0, 1], ``ratio`` B's environment steps over A's.

    Raises:
        CommandLineError: the sweeps share no finished seed, or no protocol finally evaluated on
            one seed in both.
    """
    seeds = [s for s in a["per_seed"] if s in b["per_seed"]]
    if not seeds:
        raise CommandLineError(f"the sweeps share no finished seed (A: {', '.join(a['per_seed']) or 'none'}; "
                               f"B: {', '.join(b['per_seed']) or 'none'}): a comparison pairs the runs seed by seed")
    protocols = sorted(set.intersection(*({p for s in seeds for p in r["per_seed"][s]["final"]} for r in (a, b))))
    per_seed: dict[str, Any] = {}
    for seed in seeds:
        fa, fb = a["per_seed"][seed], b["per_seed"][seed]
        steps_a, steps_b = fa.get("env_steps"), fb.get("env_steps")
        row: dict[str, Any] = {"env_steps": {"a": steps_a, "b": steps_b,
                                             "ratio": steps_b / steps_a if steps_a and steps_b else None}}
        for p in protocols:
            ra, rb = fa["final"].get(p), fb["final"].get(p)
            if ra is not None and rb is not None:
                row[p] = {"a": ra, "b": rb, "difference": rb["success_rate"] - ra["success_rate"]}
        per_seed[seed] = row
    across: dict[str, Any] = {}
    for p in protocols:
        rows = [per_seed[s] for s in seeds if p in per_seed[s]]
        if not rows:  # each sweep evaluated it, never both on one seed: nothing to pair
            continue
        across[p] = {"difference": _summary([row[p]["difference"] for row in rows]),
                     "gain_a": _summary(_gains(a, seeds, p)), "gain_b": _summary(_gains(b, seeds, p))}
    if not across:
        raise CommandLineError(f"the sweeps share no protocol evaluated at the end of one seed's runs in both "
                               f"(seeds {', '.join(seeds)}): a comparison pairs final evaluations seed by seed")
    sides = {name: _side(r, seeds) for name, r in (("a", a), ("b", b))}
    short = {name: {seed: steps for seed in seeds  # below the budget, or not recorded (None): not known to reach it
                    if (goal := sides[name]["seed_budgets"][seed]) is not None
                    and ((steps := per_seed[seed]["env_steps"][name]) is None or steps < goal)}
             for name in ("a", "b")}
    hosts = {name: _hosts(r, seeds) for name, r in (("a", a), ("b", b))}
    hosts["differ_in"] = _paired_host_differences(a, b, seeds)
    evaluation, evaluation_source = _paired_evaluation_differences(a, b, seeds)
    same_budget = all(sides["a"]["seed_budgets"][seed] is not None
                      and sides["a"]["seed_budgets"][seed] == sides["b"]["seed_budgets"][seed] for seed in seeds)
    return {**sides, "seeds": seeds, "equal_budget": same_budget and not short["a"] and not short["b"],
            "short_of_budget": short, "evaluation_differs_in": evaluation,
            "evaluation_source": evaluation_source, "per_seed": per_seed,
            "across_seeds": across, "hosts": hosts}


def _side(report: dict[str, Any], seeds: list[str]) -> dict[str, Any]:
    """One sweep in a comparison: its template and overrides, each paired seed's
    ``trainer.total_env_steps`` (``seed_budgets``: as its run's report figures record it, a resume
    of one seed with another budget included; else the sweep's) and ``budget``, the one they all
    have (None: none, or not the same); the seeds it ``finished`` and those it asked for and has
    not (``unfinished``)."""
    sweep_budget = budget(report)
    seed_budgets = {seed: report["per_seed"][seed].get("budget", sweep_budget) for seed in seeds}
    common = set(seed_budgets.values())
    finished = list(report["per_seed"])
    return {"template": report["template"], "overrides": report["overrides"],
            "budget": common.pop() if len(common) == 1 else None, "seed_budgets": seed_budgets,
            "finished": finished, "unfinished": [str(s) for s in report.get("seeds", []) if str(s) not in finished]}


def _paired_evaluation_differences(a: dict[str, Any], b: dict[str, Any], seeds: list[str]
                                   ) -> tuple[list[str] | None, str]:
    """The evaluation settings in which some paired seed's runs differ (``"setting: A vs B"``; []:
    none; None: unknown), each run's as its report figures record them (a resume with, say, more
    episodes included), else its sweep's (:func:`_evaluation_settings`); and where they come from."""
    def per_seed(report: dict[str, Any]) -> tuple[dict[str, dict[str, Any] | None], str]:
        if all("evaluation" in report["per_seed"][seed] for seed in seeds):
            return {seed: report["per_seed"][seed]["evaluation"] for seed in seeds}, "recorded"
        settings, source = _evaluation_settings(report)  # a report of an earlier vla-rl: its sweep's
        return {seed: report["per_seed"][seed].get("evaluation", settings) for seed in seeds}, source

    (settings_a, source_a), (settings_b, source_b) = per_seed(a), per_seed(b)
    source = "; ".join(dict.fromkeys(s for s in (source_a, source_b) if s != "recorded")) or "recorded"
    differs: dict[str, None] = {}
    for seed in seeds:
        ea, eb = settings_a[seed], settings_b[seed]
        if ea is None or eb is None:
            return None, source
        differs |= dict.fromkeys(f"{key}: {ea[key]!r} vs {eb[key]!r}"  # a setting of one side only pairs nothing
                                 for key in sorted(set(ea) & set(eb)) if ea[key] != eb[key])
    return list(differs), source


def _paired_host_differences(a: dict[str, Any], b: dict[str, Any], seeds: list[str]) -> list[str] | None:
    """The host fields in which some paired seed's runs ran on different machines ([]: each pair
    on the same; None: a run recorded none). Pooled over the seeds, A's seed 0 on one CPU and B's
    seeds 1 and 2 on it read as the same machines."""
    records = [(a["per_seed"][seed].get("hosts"), b["per_seed"][seed].get("hosts")) for seed in seeds]
    if any(ha is None or hb is None for ha, hb in records):
        return None
    return sorted({field for ha, hb in records for field in differences(ha, hb)})


def _evaluation_settings(report: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """A sweep's :func:`~vla_rl.sweep.evaluation_settings`: as its report recorded them, else (a
    report written before reports recorded them) as this checkout's template and defaults give
    them; and where they come from, or why they are unknown (settings None)."""
    if isinstance(report.get("evaluation"), dict):
        return report["evaluation"], "recorded"
    try:
        loaded = load_template(report["template"], recorded=list(report["overrides"]))
        return evaluation_settings(loaded.config), "derived"
    except TemplateError as err:
        return None, f"{Path(report['template']).stem} with its overrides does not load here ({err.message})"


def _hosts(report: dict[str, Any], seeds: list[str]) -> list[dict[str, Any]] | None:
    """The machines the paired seeds' runs of one sweep ran on; None if one of them recorded none."""
    records = [report["per_seed"][seed].get("hosts") for seed in seeds]
    return None if any(r is None for r in records) else distinct([h for r in records for h in r])


def _gains(report: dict[str, Any], seeds: list[str], protocol: str) -> list[float]:
    gains = []
    for seed in seeds:
        figures = report["per_seed"][seed]
        first, final = figures["first"].get(protocol), figures["final"].get(protocol)
        if first is not None and final is not None:
            gains.append(final["success_rate"] - first["success_rate"])
    return gains


def _summary(values: list[float]) -> dict[str, Any] | None:
    """Mean and interval of differences of success rates (clipped to [-1, 1], what they can be)."""
    if not values:
        return None
    mean, low, high = mean_interval(values, bounds=DIFFERENCE_BOUNDS)
    return {"mean": mean, "ci_low": low, "ci_high": high, "seeds": len(values)}


def _points(value: float) -> str:
    """Signed points to one decimal; a difference that rounds to zero reads +0.0 (not -0.0)."""
    return f"{round(100 * value, 1) + 0.0:+.1f}"


def _interval(summary: dict[str, Any]) -> str:
    if summary["ci_low"] is None:
        return "n/a (one seed)"
    if summary["ci_low"] == summary["ci_high"]:
        return "n/a (no spread across the seeds)"
    return f"[{_points(summary['ci_low'])}, {_points(summary['ci_high'])}]"


def _name(side: dict[str, Any]) -> str:
    return f"{Path(side['template']).stem} ({' '.join(side['overrides']) or 'no overrides'})"


def markdown(result: dict[str, Any]) -> str:
    """``compare.md``: what is compared, the cost check, a table per protocol, the mean differences."""
    a, b = result["a"], result["b"]
    lines = [f"# {Path(b['template']).stem} vs {Path(a['template']).stem} over seeds", "",
             f"- A: {_name(a)}", f"- B: {_name(b)}",
             f"- seeds both finished: {', '.join(result['seeds'])}", *_left_out_lines(result), ""]
    short = result.get("short_of_budget", {"a": {}, "b": {}})
    if result["equal_budget"]:
        lines.append(f"Both sweeps stop at the same environment-step budget ({_BUDGET_KEY}={a['budget']:,}); "
                     "each run ends with the training step that reaches it.")
    elif short["a"] or short["b"]:
        ended = "; ".join(f"{side.upper()} seed {seed} at {_count(steps)}" for side in ("a", "b")
                          for seed, steps in short[side].items())
        lines.append(f"**Not at equal cost**: runs ended below their {_BUDGET_KEY} (A: {_count(a['budget'])}, B: "
                     f"{_count(b['budget'])}), their trainer.total_steps coming first ({ended} environment steps): "
                     "they are compared at the environment steps each took, listed below.")
    else:
        uniform = all(len(set(side["seed_budgets"].values())) == 1 for side in (a, b))
        budgets = ("neither sets one" if set(a["seed_budgets"].values()) | set(b["seed_budgets"].values()) == {None}
                   else f"A: {_count(a['budget'])}, B: {_count(b['budget'])}" if uniform
                   else "; ".join(f"seed {seed}: A {_count(a['seed_budgets'][seed])}, "  # a resume changed one
                                  f"B {_count(b['seed_budgets'][seed])}" for seed in result["seeds"]))
        lines.append(f"The sweeps do not stop at the same {_BUDGET_KEY} ({budgets}): their runs are compared at "
                     "the environment steps each took, listed below.")
    differs, source = result.get("evaluation_differs_in"), result.get("evaluation_source", "recorded")
    derived = "" if source == "recorded" else " (as this checkout's templates and defaults give the settings of a "
    derived += "report that records none)" if source == "derived" else ""
    if differs:
        lines += ["", f"**Not the same held-out evaluation**{derived}: the sweeps differ in {'; '.join(differs)}. "
                  "Their success rates are not of the same episodes, so B - A mixes the algorithms with the "
                  "evaluations."]
    elif differs is None:
        lines += ["", f"Whether both sweeps evaluated the same held-out episodes is unknown: {source}."]
    elif source == "derived":
        lines += ["", "Both sweeps evaluated the same held-out episodes, as far as this checkout's templates and "
                  "defaults tell for reports that record no evaluation settings."]
    else:
        lines += ["", "Both sweeps evaluated the same held-out episodes: the evaluation settings their reports "
                  "record are equal."]
    lines += ["", *_hosts_lines(result["hosts"])]
    lines += ["", "| seed | env steps A | env steps B | B / A |", "|---|---|---|---|"]
    for seed, row in result["per_seed"].items():
        steps = row["env_steps"]
        ratio = "n/a" if steps["ratio"] is None else f"{steps['ratio']:.3f}"
        lines.append(f"| {seed} | {_count(steps['a'])} | {_count(steps['b'])} | {ratio} |")
    for p, across in result["across_seeds"].items():
        lines += ["", f"## {p}", "", "| seed | A final | B final | B - A (points) |", "|---|---|---|---|"]
        for seed, row in result["per_seed"].items():
            if p in row:
                lines.append(f"| {seed} | {_rate(row[p]['a'])} | {_rate(row[p]['b'])} | "
                             f"{_points(row[p]['difference'])} |")
        diff = across["difference"]
        lines += ["", f"- B - A: {_points(diff['mean'])} points, 95% interval {_interval(diff)} "
                  f"({diff['seeds']} seeds, paired)"]
        for side in ("a", "b"):
            gain = across[f"gain_{side}"]
            if gain is not None:
                lines.append(f"- {side.upper()} over its first evaluation: {_points(gain['mean'])} points, 95% "
                             f"interval {_interval(gain)}")
    lines += ["", "Per seed: final held-out success with its Wilson 95% interval over the run's episodes. Across "
              "seeds: mean of the per-seed differences with a two-sided 95% Student t interval (n - 1 degrees "
              f"of freedom). Plot: {COMPARE_PLOT}."]
    return "\n".join(lines) + "\n"


def _left_out_lines(result: dict[str, Any]) -> list[str]:
    """The seeds a sweep finished that the other did not (left out of every figure here, the gains
    over the first evaluation included), and the seeds a sweep asked for and has not finished."""
    lines = []
    for side, other in (("a", "b"), ("b", "a")):
        alone = [seed for seed in result[side]["finished"] if seed not in result["seeds"]]
        if alone:
            lines.append(f"- left out: {side.upper()}'s seed(s) {', '.join(alone)}, which {other.upper()} has not "
                         "finished (its own report counts them)")
        if result[side]["unfinished"]:
            lines.append(f"- {side.upper()} is not finished: seed(s) {', '.join(result[side]['unfinished'])} asked for "
                         "and not run to the end (`vla-rl train --resume` goes on)")
    return lines


def _hosts_lines(hosts: dict[str, Any]) -> list[str]:
    """Whether the two sweeps ran on the same machines, in words."""
    if hosts["differ_in"] is None:
        unknown = " and ".join(side.upper() for side in ("a", "b") if hosts[side] is None)
        return [f"Hosts: not recorded by {unknown} (an earlier vla-rl recorded none, or not those of every start of a resumed run), so whether both sweeps ran "
                "on one kind of machine is unknown; the same code and seed give other figures on another machine."]
    if not hosts["differ_in"]:
        return [f"Both sweeps ran on the same kind of machine: {'; '.join(describe(h) for h in hosts['a'])}."]
    return [f"The sweeps ran on different machines (they differ in {', '.join(hosts['differ_in'])}): the same code and "
            "seed give other figures on another machine, so B - A holds the machines' difference too.",
            *(f"- {side.upper()}: {'; '.join(describe(h) for h in hosts[side])}" for side in ("a", "b"))]


def _count(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def _rate(figures: dict[str, Any]) -> str:
    return (f"{100 * figures['success_rate']:.1f}% [{100 * figures['ci_low']:.1f}, "
            f"{100 * figures['ci_high']:.1f}]")


def plot(result: dict[str, Any], path: Path) -> None:
    """Each seed's final success in A and in B (a line per seed), one panel per protocol."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    protocols = list(result["across_seeds"])
    fig, axes = plt.subplots(1, len(protocols), figsize=(4.5 * len(protocols), 4), sharey=True, squeeze=False)
    labels = [Path(result[side]["template"]).stem + f" ({side.upper()})" for side in ("a", "b")]
    for ax, p in zip(axes[0], protocols):
        for seed, row in result["per_seed"].items():
            if p in row:
                ax.plot([0, 1], [row[p]["a"]["success_rate"], row[p]["b"]["success_rate"]], "o-", alpha=0.7,
                        label=f"seed {seed}")
        diff = result["across_seeds"][p]["difference"]
        ax.set_title(f"{p}: B - A {_points(diff['mean'])} points ({diff['seeds']} seeds)")
        ax.set_xticks([0, 1], labels)
        ax.set_xlim(-0.3, 1.3)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("final held-out success rate")
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def compare_sweeps(a: str | Path, b: str | Path, out: str | Path) -> dict[str, Any]:
    """Compare the sweeps ``a`` and ``b`` and write ``compare.json``, ``compare.md`` and
    ``compare.png`` into ``out`` (created); return the comparison.

    Raises:
        CommandLineError: a path holds no sweep report, both name the same one, the sweeps share
            no finished seed, or ``out`` cannot be made a directory.
    """
    reports = [Path(p) / REPORT_JSON if Path(p).is_dir() else Path(p) for p in (a, b)]
    if reports[0].exists() and reports[0].resolve() == reports[1].resolve():
        raise CommandLineError(f"{a} and {b} are the same sweep: compare two sweeps (e.g. one per algorithm)")
    result = compare(read_report(a), read_report(b))
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CommandLineError(f"--output {out} cannot be made a directory: {err.strerror or err}") from None
    (out / COMPARE_JSON).write_text(json.dumps(result, indent=2) + "\n")
    (out / COMPARE_MD).write_text(markdown(result))
    plot(result, out / COMPARE_PLOT)
    return result
