"""The Ray driver of a training run: plans, launches, watches and logs — never holds batch data.

It starts Ray on loopback, creates one :class:`~vla_rl.workers.dag_worker.DAGWorker` actor per
device slot, lets them form their process group, then asks every worker to run each step and
receives back only scalar metrics (checked by :class:`WorkerGroup`). Workers write checkpoints,
demonstrations and videos; the driver writes the run's config, metrics, plot and summary.
"""

from __future__ import annotations

import json
import time

from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import plan
from vla_rl.preflight import preflight
from vla_rl.run_dir import RunDirectory, absolute_path_overrides
from vla_rl.utils.code_location import code_root, code_version
from vla_rl.workers.group import WorkerDiedError, WorkerGroup, start_ray
from vla_rl.workers.placement import simulator_cpus_per_worker


def prepare_run_dir(template_arg: str | None, overrides: list[str], resume: str | None
                    ) -> tuple[RunDirectory, object, list[str]]:
    """Validate the run, then create (or reopen and lock, on resume) its directory.

    Nothing is created or changed on disk before the template, the overrides and the plan are
    accepted. A new run writes its resolved template; a resume applies the overrides of earlier
    resumes and ``overrides`` on top of the run's own ``template.yaml`` (e.g.
    ``trainer.total_steps=40`` to train longer), and records ``overrides`` in ``resumes.jsonl``
    without rewriting the template (:mod:`vla_rl.run_dir`).

    Returns:
        (the locked run directory, the loaded template, the overrides the workers apply to the
        run directory's ``template.yaml``).

    Raises:
        TemplateError: a bad template, override or plan; RunDirError: a run directory that
            exists (new run), is not a run (resume), or is in use.
    """
    if resume:
        run = RunDirectory.reopen(resume)
        worker_overrides = run.recorded_overrides() + list(overrides)
        template = load_template(run.template_path, worker_overrides)
    else:
        template = load_template(template_arg, overrides)
        worker_overrides = []
    plan(template)  # reject a bad graph before anything is written
    preflight(template)  # and unusable input files (prompts, checkpoints)
    if resume:
        run.lock()
        run.record_resume(list(overrides))
        return run, template, worker_overrides
    run = RunDirectory.create(template.config.run.output_dir, template.config.run.name, template.name)
    resolved = dict(template.raw)
    resolved.pop("extends", None)
    run.write_template(resolved)
    return run, template, worker_overrides


def train(template_arg: str | None, overrides: list[str], resume: str | None = None, console=None) -> dict:
    """Run a training workflow end to end.

    Args:
        template_arg: template name or path (None when resuming: the run's own).
        overrides: dotted overrides.
        resume: a run directory to continue from its last complete checkpoint.
        console: a ``rich.console.Console`` for progress and the summary.

    A DAG worker that dies during the run (Ray reports its actor dead) ends the whole group of
    workers; a fresh group resumes from the newest checkpoint that verifies, up to
    ``workers.max_restarts`` times (:meth:`~vla_rl.run_loop.RunLoop.restart_after` says why the
    whole group). Then, or when no checkpoint exists yet, the run stops with one message naming
    the rank, the error and the resume command. Ctrl-C kills the workers at once (they may be
    blocked waiting for resources or in a collective).

    Returns:
        The run summary (also written to ``<run_dir>/summary.json``).

    Raises:
        RunStopped: a worker died and the run cannot restart; a worker stopped the run.
    """
    from rich.console import Console

    from vla_rl.run_loop import RunLoop

    console = console or Console()
    run, template, worker_overrides = prepare_run_dir(template_arg, overrides, resume)
    run_dir = run.path  # absolute, as every path the workers get (their working directory is not ours)
    worker_overrides = [*worker_overrides, *absolute_path_overrides(template.config)]
    try:
        config = template.config
        the_plan = plan(template)
        world = the_plan.world_size
        device = start_ray(config, world)
        console.print(f"[bold]run directory[/bold] {run_dir}")
        console.print(f"code {code_version()} from {code_root()}; {world} workers on {device}")
        started = time.perf_counter()
        loop = RunLoop(template, the_plan, run_dir, console)
        resuming, groups = resume is not None, []
        while True:  # one pass per group of workers: a worker's death restarts a fresh group
            workers = WorkerGroup.launch(world, str(run.template_path), worker_overrides, run_dir, config.workers,
                                         device, simulator_cpus_per_worker(config))
            groups.append(workers)
            died, interrupted = None, False
            try:
                worker_nodes = workers.node_ids()
                workers.start_process_group()
                summary = loop.run(workers, resume=resuming)
            except WorkerDiedError as error:
                died = error
            except KeyboardInterrupt:
                interrupted = True
                raise
            finally:
                if died is None and not interrupted:
                    workers.shutdown()
                else:  # at once: the others may be blocked in a collective with the dead worker, or
                    workers.kill()  # waiting for their simulator actors (Ctrl-C)
            if died is None:
                break
            loop.restart_after(died)  # or RunStopped, naming the rank and the resume command
            resuming = True
    finally:
        run.close()
    summary["code"] = {"version": code_version(), "location": str(code_root())}
    summary["worker_nodes"] = worker_nodes  # the Ray node of each rank
    summary["wall_time_s"] = time.perf_counter() - started
    summary["driver_max_reply_bytes"] = max(group.max_reply_bytes for group in groups)
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.replace(run_dir / "summary.json")
    return summary
