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
from vla_rl.evaluation.video import no_videos_note
from vla_rl.preflight import check_local_packages, check_simulator, preflight
from vla_rl.run_dir import RunDirectory, absolute_path_overrides, check_resume
from vla_rl.utils.code_location import code_root, code_version
from vla_rl.workers.group import WorkerDiedError, WorkerGroup, start_ray
from vla_rl.workers.placement import simulator_cpus_per_worker
from vla_rl_core.run_layout import SUMMARY_FILE


def prepare_run_dir(template_arg: str | None, overrides: list[str], resume: str | None
                    ) -> tuple[RunDirectory, object, list[str]]:
    """Validate the run, then create (or reopen and lock, on resume) its directory.

    Nothing is created or changed on disk before the template, the overrides and the plan are
    accepted. A new run writes its resolved template; a resume applies the overrides of earlier
    resumes and ``overrides`` on top of the run's own ``template.yaml`` (e.g.
    ``trainer.total_steps=40`` to train longer), checks them against the run's newest checkpoint
    (:func:`~vla_rl.run_dir.check_resume`) and changes nothing: :func:`train` records ``overrides``
    in ``resumes.jsonl`` once the workers have loaded the checkpoint with them.

    Returns:
        (the locked run directory, the loaded template, the overrides the workers apply to the
        run directory's ``template.yaml``).

    Raises:
        TemplateError: a bad template, override or plan; RunDirError: a run directory that
            exists (new run), is not a run, has no checkpoint the resume can continue exactly
            (resume), or is in use.
    """
    if resume:
        run = RunDirectory.reopen(resume)
        worker_overrides = run.recorded_overrides() + list(overrides)
        template = load_template(run.template_path, list(overrides), recorded=run.recorded_overrides())
    else:
        template = load_template(template_arg, overrides)
        worker_overrides = []
    the_plan = plan(template)  # reject a bad graph before anything is written
    refuse_evaluation_settings(template)
    preflight(template)  # and unusable input files (prompts, checkpoints)
    check_local_packages(template.config)  # and optional packages a local run's workers would lack
    check_simulator(template.config)  # and simulator settings only the simulator library knows
    if resume:
        check_resume(run, template, list(overrides), the_plan.world_size)
        run.lock()
        return run, template, worker_overrides
    run = RunDirectory.create(template.config.run.output_dir, template.config.run.name, template.name)
    resolved = dict(template.raw)
    resolved.pop("extends", None)
    run.write_template(resolved)
    return run, template, worker_overrides


def _check_resolved_device(run: RunDirectory, worker_overrides: list[str], kind: str, device: str) -> None:
    """The run's settings checked with ``workers.device: auto`` resolved to ``device``, as every
    worker checks them (``trainer.mixed_precision: bf16`` with no accelerator in the cluster), so
    that a refusal is one line here rather than every worker's traceback.

    Raises:
        RunStopped: naming the device ``auto`` resolved to and the setting that refuses it.
    """
    from vla_rl.dag.errors import TemplateError
    from vla_rl.errors import RunStopped

    if kind == device:
        return
    try:
        load_template(run.template_path, recorded=[*worker_overrides, f"workers.device={device}"])
    except TemplateError as err:
        field = f"field {err.field!r}: " if err.field else ""
        raise RunStopped(f"workers.device auto resolves to {device} in this Ray cluster (no accelerator it could "
                         f"use), which the run's settings refuse: {field}{err.message}") from None


def refuse_evaluation_settings(template) -> None:
    """``eval.store_episodes`` and ``eval.checkpoints`` are ``vla-rl eval``'s (its template,
    ``eval_rollout``, sets them): a training run evaluates its live policy afresh each time, and
    with stores its final evaluation found every episode stored by the first and reported nothing
    (``vla-rl train eval_rollout`` ended in a KeyError traceback). ``vla-rl plan`` checks them
    on a template with a ``train`` phase.

    Raises:
        TemplateError: naming the field and ``vla-rl eval``.
    """
    from vla_rl.dag.errors import TemplateError

    evaluation = template.config.eval
    for field, value in (("eval.store_episodes", evaluation.store_episodes),
                         ("eval.checkpoints", evaluation.checkpoints)):
        if value:
            raise TemplateError("a setting of vla-rl eval, which evaluates a run's checkpoints (vla-rl eval "
                                "RUN_DIR [KEY=VALUE ...], docs/evaluation.md; eval_rollout is its template); a "
                                "training run evaluates its own policy: leave it unset",
                                file=template.path, field=field)


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

    A new run that fails (or is interrupted) before it wrote a metric or a checkpoint removes its
    run directory: there is nothing to resume, and the same command (the same ``run.name``) can
    run again. A resume records its overrides in ``resumes.jsonl`` once the workers have loaded
    the checkpoint with them, and every group of workers its machines in ``hosts.jsonl`` once it
    has set up (:class:`RecordsStart`).

    Returns:
        The run summary (also written to ``<run_dir>/summary.json``).

    Raises:
        RunStopped: a worker died and the run cannot restart; a worker stopped the run.
    """
    from vla_rl.utils.console import driver_console

    console = console or driver_console()
    run, template, worker_overrides = prepare_run_dir(template_arg, overrides, resume)
    try:
        return _run(run, template, worker_overrides, None if resume is None else list(overrides), console)
    except BaseException:
        if resume is None and not run.has_progress():  # nothing to resume: the same command may run again
            run.remove()
            console.print(f"removed the run directory {run.path}: the run failed before it wrote a metric or a "
                          "checkpoint")
        elif resume is None and not run.has_checkpoint():
            console.print(f"kept the run directory {run.path} for the metrics it wrote; it holds no checkpoint to "
                          "resume from: remove it to start the run again under this name, or choose another run.name")
        raise
    finally:
        run.close()


def _run(run: RunDirectory, template, worker_overrides: list[str], resume_overrides: list[str] | None,
         console) -> dict:
    """Start Ray and the workers and run the loop (see :func:`train`); ``resume_overrides``: this
    resume's own overrides, recorded once the first group of workers has set up (None: a new run)."""
    from vla_rl.run_loop import RunLoop

    run_dir = run.path  # absolute, as every path the workers get (their working directory is not ours)
    worker_overrides = [*worker_overrides, *absolute_path_overrides(template.config)]
    config = template.config
    the_plan = plan(template)
    world = the_plan.world_size
    device = start_ray(config, world)
    _check_resolved_device(run, worker_overrides, config.workers.device, device)
    console.print(f"[bold]run directory[/bold] {run_dir}")
    console.print(f"code {code_version()} from {code_root()}; {world} workers on {device}")
    from vla_rl.workflows.embodied import remote_clients_note

    for note in (no_videos_note(config), remote_clients_note(config, the_plan)):
        if note is not None:
            console.print(note)
    started = time.perf_counter()
    loop = RunLoop(template, the_plan, run_dir, console)
    resuming, groups = resume_overrides is not None, []
    unrecorded = [] if resume_overrides is None else [resume_overrides]
    while True:  # one pass per group of workers: a worker's death restarts a fresh group
        workers = WorkerGroup.launch(world, str(run.template_path), worker_overrides, run_dir, config.workers,
                                     device, simulator_cpus_per_worker(config))
        groups.append(workers)
        died, interrupted = None, False
        try:
            worker_nodes, hosts = workers.node_ids(), workers.hosts()
            workers.start_process_group()
            summary = loop.run(RecordsStart(workers, run, unrecorded, hosts), resume=resuming)
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
    summary["code"] = {"version": code_version(), "location": str(code_root())}
    summary["worker_nodes"] = worker_nodes  # the Ray node of each rank
    summary["hosts"] = hosts  # the machine of each rank: a run repeats on one kind only (vla_rl/utils/host.py)
    # every machine the run's steps ran on, a resumed or restarted one's earlier starts included
    summary["run_hosts"], summary["hosts_unrecorded"] = run.recorded_hosts()
    summary["wall_time_s"] = time.perf_counter() - started
    summary["driver_max_reply_bytes"] = max(group.max_reply_bytes for group in groups)
    tmp = run_dir / f"{SUMMARY_FILE}.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.replace(run_dir / SUMMARY_FILE)
    return summary


class RecordsStart:
    """A group of workers as the run loop sees it, which records, once the workers' ``setup``
    succeeded (they loaded the checkpoint, if any), a resume's overrides in the run's
    ``resumes.jsonl`` and the group's machines in its ``hosts.jsonl``: a start that fails there
    leaves no override behind for the next one, and names no machine that trained nothing.

    Args:
        group: the :class:`~vla_rl.workers.group.WorkerGroup`.
        run: the run directory.
        unrecorded: the resume's overrides while not yet recorded (one list, shared by the groups of
            a run; emptied when recorded), else empty.
        hosts: the machine of each rank of ``group`` (:meth:`WorkerGroup.hosts
            <vla_rl.workers.group.WorkerGroup.hosts>`).
    """

    def __init__(self, group: WorkerGroup, run: RunDirectory, unrecorded: list[list[str]],
                 hosts: list[dict]) -> None:
        self._group, self._run, self._unrecorded, self._hosts = group, run, unrecorded, hosts

    def call(self, method: str, *args) -> list[dict]:
        replies = self._group.call(method, *args)
        if method == "setup":
            if self._unrecorded:
                self._run.record_resume(self._unrecorded.pop())
            self._run.record_hosts(self._hosts)
        return replies

    def __getattr__(self, name: str):
        return getattr(self._group, name)
