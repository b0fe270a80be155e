"""Seed sweeps: one template trained once per seed, each in a run directory of its own under one
sweep directory, and the report across the seeds.

One training run is one draw: the main job's held-out success differs by tens of points between
seeds. ``vla-rl train TEMPLATE --seeds 0,1,2 [overrides]`` runs the template with ``run.seed=S``
for each seed, one after the other (each run starts and stops its own Ray instance, exactly as
``vla-rl train TEMPLATE run.seed=S`` would), in ``<sweep>/seed_<S>``; after each run it rewrites
the sweep's report:

- ``report.json``: per seed, the held-out figures of each protocol before and after training
  (success rate, episodes, Wilson 95% interval, as the run measured them), environment steps and
  wall time; across the seeds, each figure's mean with a two-sided 95% Student t interval
  (:func:`~vla_rl.utils.stats.mean_interval`, n - 1 degrees of freedom);
- ``report.md``: the same as tables;
- ``success_vs_env_steps.png``: training and held-out success against environment steps, one
  line per seed and their mean with its 95% Student t interval shaded.

``vla-rl train --resume SWEEP`` continues an interrupted sweep: finished runs (those with a
``summary.json``) are kept, an interrupted one resumes from its last checkpoint, the others start.
A run that stopped before its first checkpoint cannot resume: its directory is kept, renamed
``seed_<S>.stopped`` (``.stopped-2``, ... when that exists), and the seed starts again.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from vla_rl.checkpoints.files import latest_checkpoint
from vla_rl.config.sections import MAX_SEED
from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import plan
from vla_rl.errors import CommandLineError
from vla_rl.preflight import preflight
from vla_rl.run_dir import RunDirectory, RunDirError
from vla_rl.utils.host import describe, distinct
from vla_rl.utils.stats import mean_interval
from vla_rl.utils.tracking import read_metrics
from vla_rl_core.file_modes import write_text_atomically
from vla_rl_core.run_layout import CHECKPOINTS_DIR, METRICS_FILE, SUMMARY_FILE, SWEEP_FILE

#: The sweep's own file: what it runs (``template``, ``overrides``, ``seeds``).
REPORT_JSON, REPORT_MD, PLOT_FILE = "report.json", "report.md", "success_vs_env_steps.png"
#: Overrides a sweep sets for each run itself.
_OWN_KEYS = ("run.seed", "run.name", "run.output_dir")
_INTERVAL = ("mean over seeds with a two-sided 95% Student t interval (n - 1 degrees of freedom; a success rate's "
             "clipped to [0%, 100%], a difference of two to [-100, +100] points)")
#: What a success rate, and the difference of two (a gain, B - A), can be: their intervals end there.
RATE_BOUNDS, DIFFERENCE_BOUNDS = (0.0, 1.0), (-1.0, 1.0)


#: More runs than a sweep takes: a typo such as 0-99999 would otherwise plan years of training.
MAX_SEEDS = 1000


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` or ``"0-4"`` (or a mix, ``"0-2,7"``) as a list of distinct seeds ≥ 0, in order.

    Raises:
        CommandLineError: not such a list (``1-`` included), a seed outside [0,
            :data:`~vla_rl.config.sections.MAX_SEED`], a seed given twice, or more than
            :data:`MAX_SEEDS` seeds.
    """
    seeds: list[int] = []
    try:
        for part in text.split(","):
            numbers = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", part)  # int() also read 0_1, +1, ٣
            if numbers is None:
                raise ValueError
            first, last = int(numbers[1]), int(numbers[2] or numbers[1])
            if first > last:
                raise ValueError
            if len(seeds) + last - first + 1 > MAX_SEEDS:  # before a range of 10**20 seeds is made
                break
            seeds += range(first, last + 1)
        else:
            numbers = None
    except ValueError:
        raise CommandLineError(f"--seeds {text!r}: give seeds as 0,1,2 or 0-4") from None
    if numbers is not None:  # the loop stopped at MAX_SEEDS
        raise CommandLineError(f"--seeds {text!r}: more than {MAX_SEEDS} seeds")
    if any(not 0 <= seed <= MAX_SEED for seed in seeds) or len(set(seeds)) != len(seeds):
        raise CommandLineError(f"--seeds {text!r}: seeds are distinct integers in [0, {MAX_SEED}]")
    return seeds


def run_sweep(template_arg: str, overrides: list[str], seeds: list[int], console=None) -> dict:
    """Train ``template_arg`` with ``overrides`` once per seed; returns the report.

    Every seed's run is validated (template, plan, input files) before the sweep directory is
    created: ``run.output_dir`` is where it goes, ``run.name`` its name (default
    ``<template>_seeds_<timestamp>``).

    Raises:
        CommandLineError: ``overrides`` set ``run.seed`` (the sweep sets it).
        TemplateError, RunDirError: as for one run (:func:`vla_rl.driver.prepare_run_dir`).
        RunStopped: a run stopped; ``vla-rl train --resume SWEEP`` continues the sweep.
    """
    for override in overrides:
        if override.split("=", 1)[0].strip() == "run.seed":
            raise CommandLineError(f"{override!r}: --seeds sets run.seed for each run; remove the override")
    template_path = Path(template_arg)
    if template_path.suffix in (".yaml", ".yml") and template_path.exists():
        template_arg = str(template_path.resolve())  # the runs of a resumed sweep find it from anywhere
    loaded = None
    for seed in seeds:
        loaded = load_template(template_arg, [*overrides, f"run.seed={seed}"])
        plan(loaded)
        preflight(loaded)
    config = loaded.config
    sweep = RunDirectory.create(config.run.output_dir, config.run.name, f"{loaded.name}_seeds")
    try:
        spec = {"template": template_arg, "overrides": [o for o in overrides if not o.startswith(_OWN_KEYS)],
                "seeds": seeds}
        (sweep.path / SWEEP_FILE).write_text(json.dumps(spec, indent=2) + "\n")
        return _run_seeds(sweep.path, spec, console)
    finally:
        sweep.close()


def resume_sweep(sweep_dir: str | Path, console=None) -> dict:
    """Continue the sweep in ``sweep_dir``; returns the report.

    Raises:
        RunDirError: ``sweep_dir`` is not a sweep directory, or another process runs it.
        RunStopped: a run stopped.
    """
    path = Path(sweep_dir)
    spec = read_sweep(path)
    sweep = RunDirectory(path)
    sweep.lock()
    try:
        return _run_seeds(sweep.path, spec, console)
    finally:
        sweep.close()


def is_sweep(path: str | Path) -> bool:
    """Whether ``path`` is a sweep directory (it holds ``sweep.json``)."""
    return (Path(path) / SWEEP_FILE).is_file()


def read_sweep(path: Path) -> dict:
    """``sweep.json`` of a sweep directory.

    Raises:
        RunDirError: no such directory, no ``sweep.json``, or one that does not read.
    """
    if not path.is_dir():
        raise RunDirError(f"{path} is not a sweep directory: there is no such directory")
    try:
        spec = json.loads((path / SWEEP_FILE).read_text())
        if not (isinstance(spec["template"], str) and isinstance(spec["overrides"], list)
                and all(isinstance(seed, int) for seed in spec["seeds"])):
            raise ValueError
    except FileNotFoundError:
        raise RunDirError(f"{path} is not a sweep directory: it has no {SWEEP_FILE}") from None
    except (ValueError, KeyError, TypeError):
        raise RunDirError(f"{path / SWEEP_FILE}: damaged (it should hold template, overrides and seeds)") from None
    return spec


def seed_run_dir(sweep_dir: Path, seed: int) -> Path:
    """The run directory of ``seed`` in a sweep."""
    return sweep_dir / f"seed_{seed}"


def _run_seeds(sweep_dir: Path, spec: dict, console) -> dict:
    from vla_rl.driver import train

    seeds = spec["seeds"]
    for index, seed in enumerate(seeds, start=1):
        run = seed_run_dir(sweep_dir, seed)
        if (run / SUMMARY_FILE).is_file():
            continue
        if console is not None:
            console.print(f"[bold]seed {seed}[/bold] ({index} of {len(seeds)}) in {run}")
        if run.exists() and latest_checkpoint(run / CHECKPOINTS_DIR) is None:
            kept = _set_aside(run)
            if console is not None:
                console.print(f"{run.name} stopped before its first checkpoint: kept as {kept.name}, started again")
        if run.exists():
            train(None, [], resume=str(run), console=console)
        else:
            train(spec["template"], [*spec["overrides"], f"run.seed={seed}", f"run.output_dir={sweep_dir}",
                                     f"run.name={run.name}"], console=console)
        _stop_ray()  # the next seed starts as a new command would
        write_report(sweep_dir)
    report = write_report(sweep_dir)
    if console is not None:
        print_report(report, console)
    return report


def _set_aside(run: Path) -> Path:
    """Rename ``run`` to the first free ``<run>.stopped[-N]`` beside it, holding its lock; the new path.

    Raises:
        RunDirError: another process holds the run's lock.
    """
    kept, number = run.with_name(f"{run.name}.stopped"), 1
    while kept.exists():
        number += 1
        kept = run.with_name(f"{run.name}.stopped-{number}")
    directory = RunDirectory(run)
    directory.lock()
    try:
        return run.rename(kept)
    finally:
        directory.close()


def _stop_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


# ---------------------------------------------------------------------------- the report
def seed_figures(run_dir: Path) -> dict[str, Any]:
    """One finished run's figures: ``{"first": {protocol: figures}, "final": {...}, "first_tag",
    "env_steps", "steps", "wall_time_s", "hosts", "budget", "evaluation"}`` where figures are
    ``success_rate``, ``episodes``, ``ci_low``, ``ci_high`` as the run's summary holds them
    (Wilson 95%), ``hosts`` the machines its workers ran on, every start of them included (a resume
    on another machine adds its own; :func:`vla_rl.utils.host.host_record`, without repeats; None
    when the run did not record them all), ``budget`` its ``trainer.total_env_steps`` and
    ``evaluation`` its :func:`evaluation_settings`, as its template and every resume's overrides
    set them (a resume of one seed with another budget is that seed's own; both left out when the
    run's template no longer loads here)."""
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    first_tag = next((key for key in summary if key.endswith("_eval") and key != "final_eval"), None)
    figures: dict[str, Any] = {"first_tag": first_tag and first_tag.removesuffix("_eval")}
    for name, tag in (("first", first_tag), ("final", "final_eval")):
        evaluation = summary.get(tag) or {}
        protocols = sorted({key.split("/")[1] for key in evaluation if key.count("/") == 2
                            and key.endswith("/success_rate")})
        figures[name] = {p: {field: float(evaluation[f"eval/{p}/{field}"])
                             for field in ("success_rate", "episodes", "ci_low", "ci_high")} for p in protocols}
    records = read_metrics(run_dir / METRICS_FILE) if (run_dir / METRICS_FILE).is_file() else []
    totals = [r["rollout/total_env_steps"] for r in records if "rollout/total_env_steps" in r]
    figures["env_steps"] = float(totals[-1]) if totals else None
    figures["steps"] = int(summary.get("last_step", summary.get("steps_run", 0)))
    figures["wall_time_s"] = summary.get("wall_time_s")
    if "run_hosts" in summary:
        figures["hosts"] = None if summary["hosts_unrecorded"] else summary["run_hosts"]
    else:  # an earlier vla-rl: the last start's machines only (None: none recorded)
        figures["hosts"] = distinct(summary["hosts"]) if "hosts" in summary else None
    config = _run_config(run_dir)
    if config is not None:
        figures["budget"] = config.trainer.total_env_steps
        figures["evaluation"] = evaluation_settings(config)
    return figures


def aggregate(per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Across-seed means of each figure of :func:`seed_figures` (over the seeds that have it):
    ``{"first"|"final"|"gain": {protocol: {"mean", "ci_low", "ci_high", "seeds"}}}``, ``gain``
    being final minus first success rate per seed (in [-1, 1]); plus ``env_steps`` and
    ``wall_time_s``. Intervals: :func:`~vla_rl.utils.stats.mean_interval`, a success rate's
    clipped to [0, 1], a gain's to [-1, 1]."""
    def summarise(values: list[float], bounds: tuple[float, float] | None = None) -> dict[str, Any]:
        mean, low, high = mean_interval(values, bounds=bounds)
        return {"mean": mean, "ci_low": low, "ci_high": high, "seeds": len(values)}

    out: dict[str, Any] = {"interval": _INTERVAL}
    for name in ("first", "final"):
        protocols = sorted({p for figures in per_seed.values() for p in figures[name]})
        out[name] = {p: summarise([f[name][p]["success_rate"] for f in per_seed.values() if p in f[name]],
                                 RATE_BOUNDS)
                     for p in protocols}
    out["gain"] = {}
    for p in out["final"]:
        gains = [f["final"][p]["success_rate"] - f["first"][p]["success_rate"] for f in per_seed.values()
                 if p in f["final"] and p in f["first"]]
        if gains:
            out["gain"][p] = summarise(gains, DIFFERENCE_BOUNDS)
    for key in ("env_steps", "wall_time_s"):
        values = [f[key] for f in per_seed.values() if f[key] is not None]
        out[key] = summarise(values) if values else None
    return out


def evaluation_settings(config) -> dict[str, Any]:
    """What makes a run's held-out evaluation the episodes it is, flat ``{setting: value}``: the
    workflow, the episode count and held-out offset, the sampled protocol's temperature (when it
    evaluates it), and an embodied run's simulator (its name, task set and every ``env`` setting,
    defaults written out by :func:`simulators.registry.canonical_env`) or a text run's held-out
    prompts (the test file, or the generated split's levels and size) and what scores them (answer
    extraction, response length). Not the simulator's resources (actors, pipeline stages,
    timeouts): they change no episode. ``vla-rl compare`` pairs two sweeps' differences only over
    the same evaluation."""
    values: dict[str, Any] = {"run.workflow": config.run.workflow, "eval.num_episodes": config.eval.num_episodes,
                              "eval.init_state_offset": config.eval.init_state_offset}
    if "sampled" in config.eval.protocols:
        values["eval.temperature"] = config.eval.temperature
    if config.run.workflow == "embodied":
        from simulators.registry import canonical_env

        env = dict(config.simulator.env)
        try:  # a default written out equals the default left unset
            env = canonical_env(config.simulator.name, env)
        except (LookupError, ValueError, TypeError):  # a simulator not registered here: as given
            pass
        values |= {"simulator.name": config.simulator.name, "simulator.tasks": config.simulator.tasks,
                   **{f"simulator.env.{key}": value for key, value in env.items()}}
    else:
        text = config.text
        values |= {"text.test_file": text.test_file, "text.answer_extraction": text.answer_extraction,
                   "text.max_response_length": text.max_response_length}
        if text.test_file is None:
            values |= {"text.arithmetic_levels": text.arithmetic_levels,
                       "text.num_generated_test": text.num_generated_test}
    return json.loads(json.dumps(values))  # as report.json holds it (tuples as lists)


def _run_config(run_dir: Path):
    """A run's config as its last start ran it: its ``template.yaml`` with every resume's overrides
    (``resumes.jsonl``); None when it no longer loads here (a plug-in not importable now: compare
    then says it cannot tell)."""
    from vla_rl.dag.errors import TemplateError

    try:
        run = RunDirectory.reopen(run_dir)
        return load_template(run.template_path, recorded=run.recorded_overrides()).config
    except (RunDirError, TemplateError):  # no template.yaml, or one that does not load here
        return None


def write_report(sweep_dir: Path) -> dict:
    """Read the sweep's finished runs; write ``report.json``, ``report.md`` and the plot; return
    the report (``seeds`` asked, ``finished`` seeds, ``per_seed``, ``across_seeds``,
    ``evaluation``: :func:`evaluation_settings` of the runs)."""
    spec = read_sweep(sweep_dir)
    finished = [s for s in spec["seeds"] if (seed_run_dir(sweep_dir, s) / SUMMARY_FILE).is_file()]
    per_seed = {seed: seed_figures(seed_run_dir(sweep_dir, seed)) for seed in finished}
    report = {"template": spec["template"], "overrides": spec["overrides"], "seeds": spec["seeds"],
              "finished": finished, "per_seed": {str(s): f for s, f in per_seed.items()},
              "across_seeds": aggregate(per_seed) if per_seed else None}
    if finished and "evaluation" in per_seed[finished[0]]:  # as its first run resolved them
        report["evaluation"] = per_seed[finished[0]]["evaluation"]
    write_text_atomically(sweep_dir / REPORT_JSON, json.dumps(report, indent=2) + "\n")
    write_text_atomically(sweep_dir / REPORT_MD, markdown_report(report))
    if per_seed:
        from vla_rl.utils.plotting import plot_success_vs_env_steps

        runs = {seed: read_metrics(seed_run_dir(sweep_dir, seed) / METRICS_FILE) for seed in finished}
        plot_success_vs_env_steps(runs, sweep_dir / PLOT_FILE, f"{Path(spec['template']).stem}: "
                                  f"{len(finished)} seed(s)")
    return report


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _interval(low: float | None, high: float | None) -> str:
    """A Student t interval as the report shows it: none for one seed, and none for seeds that
    all gave the same figure (its width, 0, says nothing of another seed's)."""
    if low is None:
        return "n/a (one seed)"
    return "n/a (no spread across the seeds)" if low == high else f"[{_percent(low)}, {_percent(high)}]"


def report_rows(report: dict) -> tuple[list[str], list[list[str]]]:
    """The report as a table: a row per finished seed and the across-seed mean, a column pair
    (rate, interval) per protocol before and after training."""
    per_seed, across = report["per_seed"], report["across_seeds"]
    if not per_seed:
        return ["seed"], []
    any_seed = next(iter(per_seed.values()))
    first = any_seed["first_tag"] or "first"
    columns = [(name, p) for name in ("first", "final") for p in sorted({p for f in per_seed.values()
                                                                          for p in f[name]})]
    # text runs simulate nothing: no environment steps column
    env_steps = any(figures["env_steps"] is not None for figures in per_seed.values())
    header = ["seed", *(f"{first if name == 'first' else 'final'} {p}" for name, p in columns),
              *(["env steps"] if env_steps else []), "wall (min)"]
    rows = []
    for seed, figures in per_seed.items():
        cells = [seed]
        for name, p in columns:
            f = figures[name].get(p)
            cells.append("" if f is None else f"{_percent(f['success_rate'])} {_interval(f['ci_low'], f['ci_high'])}")
        if env_steps:
            cells.append("" if figures["env_steps"] is None else f"{figures['env_steps']:,.0f}")
        cells.append("" if figures["wall_time_s"] is None else f"{figures['wall_time_s'] / 60:.1f}")
        rows.append(cells)
    mean = [f"mean of {len(per_seed)}"]
    for name, p in columns:
        m = across[name].get(p)
        mean.append("" if m is None else f"{_percent(m['mean'])} {_interval(m['ci_low'], m['ci_high'])}")
    for key in ("env_steps", "wall_time_s") if env_steps else ("wall_time_s",):
        m = across[key]
        mean.append("" if m is None else (f"{m['mean']:,.0f}" if key == "env_steps" else f"{m['mean'] / 60:.1f}"))
    rows.append(mean)
    return header, rows


def markdown_report(report: dict) -> str:
    """``report.md``: what ran, the per-seed and mean table, and how the intervals are computed."""
    lines = [f"# Seed sweep: {Path(report['template']).stem}", "",
             f"Template `{report['template']}`, overrides `{' '.join(report['overrides']) or 'none'}`, "
             f"seeds {', '.join(map(str, report['seeds']))}; seeds finished: "
             f"{', '.join(map(str, report['finished'])) or 'none'}.", ""]
    header, rows = report_rows(report)
    if rows:
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        gains = report["across_seeds"]["gain"]
        lines += [""] + [f"- {p}: {100 * g['mean']:+.1f} points over the first evaluation, 95% interval "
                         f"{_gain_interval(g)} ({g['seeds']} seed{'s' if g['seeds'] > 1 else ''})"
                         for p, g in gains.items()]
        lines += ["", "Per seed: held-out success with its Wilson 95% interval over the run's episodes. "
                  f"Mean: {_INTERVAL}. Wall: the seed's last start of vla-rl train (its summary.json's "
                  "wall_time_s: a seed resumed after an interruption counts the time after the resume only). "
                  f"Plot: {PLOT_FILE}.", "", *hosts_lines(report["per_seed"])]
    return "\n".join(lines) + "\n"


def hosts_lines(per_seed: dict[str, dict[str, Any]]) -> list[str]:
    """The machines the seeds' runs ran on, a line each with its seeds (a run's figures repeat on
    one kind of machine only: :mod:`vla_rl.utils.host`)."""
    by_host: dict[str, list[str]] = {}
    for seed, figures in per_seed.items():
        for record in figures.get("hosts") or [None]:
            by_host.setdefault("not recorded" if record is None else describe(record), []).append(str(seed))
    return [f"- host of seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}: {host}"
            for host, seeds in by_host.items()]


def _gain_interval(gain: dict) -> str:
    if gain["ci_low"] is None:
        return "n/a (one seed)"
    if gain["ci_low"] == gain["ci_high"]:
        return "n/a (no spread across the seeds)"
    return f"[{100 * gain['ci_low']:+.1f}, {100 * gain['ci_high']:+.1f}]"


def print_report(report: dict, console) -> None:
    """The report's table on a rich console."""
    from rich.table import Table

    header, rows = report_rows(report)
    table = Table(title=f"{Path(report['template']).stem}: held-out success over {len(report['finished'])} seed(s) "
                  "(per seed: Wilson 95%; mean: Student t 95%)")
    for index, column in enumerate(header):  # figures may wrap ("82.0%" over "[72.0%, 92.0%]"), the rest never
        table.add_column(column, no_wrap=index in (0, len(header) - 2, len(header) - 1))
    for row in rows:
        table.add_row(*row)
    console.print(table)
