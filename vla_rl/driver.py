"""The Ray driver of a training run: plans, launches, watches and logs — never holds batch data.

It starts Ray on loopback, creates one :class:`~vla_rl.workers.dag_worker.DAGWorker` actor per
device slot, lets them form their process group, then asks every worker to run each step and
receives back only scalar metrics (checked by :class:`WorkerGroup`). Workers write checkpoints,
demonstrations and videos; the driver writes the run's config, metrics, plot and summary.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import yaml

from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import plan
from vla_rl.preflight import preflight
from vla_rl.workers.group import WorkerGroup, start_ray

RESOLVED_TEMPLATE = "template.yaml"


def prepare_run_dir(template_arg: str, overrides: list[str], resume: str | None) -> tuple[Path, object]:
    """Create (or reopen, on resume) the run directory and write the resolved template there.

    On resume the run's own resolved template is reloaded and ``overrides`` are applied on top
    (e.g. ``trainer.total_steps=40`` to train longer).

    Returns:
        (run directory, loaded template).
    """
    if resume:
        run_dir = Path(resume)
        template = load_template(run_dir / RESOLVED_TEMPLATE, overrides)
    else:
        template = load_template(template_arg, overrides)
    plan(template)  # reject a bad graph before anything is written
    preflight(template)  # and unusable input files (prompts, checkpoints)
    if not resume:
        name = template.config.run.name or f"{template.name}_{datetime.now():%Y%m%d_%H%M%S}"
        run_dir = Path(template.config.run.output_dir) / name
        run_dir.mkdir(parents=True, exist_ok=True)
    resolved = dict(template.raw)
    resolved.pop("extends", None)
    tmp = run_dir / (RESOLVED_TEMPLATE + ".tmp")
    tmp.write_text(yaml.safe_dump(resolved, sort_keys=False))
    tmp.replace(run_dir / RESOLVED_TEMPLATE)
    return run_dir, template


def train(template_arg: str, overrides: list[str], resume: str | None = None, console=None) -> dict:
    """Run a training workflow end to end.

    Args:
        template_arg: template name or path (ignored when resuming).
        overrides: dotted overrides.
        resume: a run directory to continue from its last complete checkpoint.
        console: a ``rich.console.Console`` for progress and the summary.

    Returns:
        The run summary (also written to ``<run_dir>/summary.json``).
    """
    from rich.console import Console

    from vla_rl.run_loop import RunLoop

    console = console or Console()
    run_dir, template = prepare_run_dir(template_arg, overrides, resume)
    config = template.config
    the_plan = plan(template)
    world = the_plan.world_size
    start_ray(config, world)
    console.print(f"[bold]run directory[/bold] {run_dir}")
    started = time.perf_counter()
    workers = WorkerGroup.launch(world, str(run_dir / RESOLVED_TEMPLATE), [], run_dir, config.workers.num_cpus_per_worker)
    try:
        workers.start_process_group()
        summary = RunLoop(workers, template, the_plan, run_dir, console).run(resume=resume is not None)
    finally:
        workers.shutdown()
    summary["wall_time_s"] = time.perf_counter() - started
    summary["driver_max_reply_bytes"] = workers.max_reply_bytes
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.replace(run_dir / "summary.json")
    return summary
