"""The driver side of ``vla-rl eval``: resolve the checkpoints, write the evaluation's resolved
template, check every task against the checkpoints' observation and action layout (tasks that do
not fit are skipped, with the reason, before any rollout), run the ``eval_rollout`` workflow on the
DAG workers until every planned episode is stored, and write the report from the stores on disk
as each task finishes (and once more at the end; an evaluation that fails leaves the last report
written, never a new one). The driver receives only counts.

The evaluation directory (default ``<run_dir>/eval``) holds ``template.yaml``, the episode stores
``episodes/<task>/rank<r>.zarr``, ``videos/``, ``report.json``, ``report.md`` and
``success_vs_checkpoint.png`` (the reports name the machines the episodes ran on). Running the
same command again continues an interrupted evaluation: episodes already stored are not run
again. A store that cannot be read is refused before anything is written, naming the store, the
array and how to set it aside (:class:`~vla_rl.evaluation.episode_store.DamagedStoreError`); so is
a store of the same task under other settings (``simulator.env.horizon=30`` over episodes of 20),
naming both.
"""

from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path

import yaml
from rich.markup import escape

from vla_rl.dag.errors import TemplateError
from vla_rl.eval_output import CHECKPOINTS_FILE, check_output, check_same_evaluation, record_checkpoints
from vla_rl.evaluation.overrides import check_trained_tasks_kept, unread_by_evaluation
from vla_rl.evaluation.targets import EvalInputError, find_checkpoints
from vla_rl_core.dir_lock import DirectoryInUse, hold_directory, lock_directory, release_directory, unlock_directory
from vla_rl_core.file_modes import write_text_atomically
from vla_rl_core.run_layout import EVAL_DIR, LOCK_FILE, RUN_TEMPLATE

EVAL_TEMPLATE = "eval_rollout"


def prepare_eval_dir(targets: list[str], overrides: list[str], steps: list[int] | None = None,
                     output: str | None = None, template: str = EVAL_TEMPLATE, policy_from: str | None = None,
                     holds: list[int] | None = None):
    """Create the evaluation directory and write its resolved template.

    With ``holds``, each checkpoint evaluated is held against its run's pruning
    (``trainer.keep_last``, :func:`hold_checkpoints`) as soon as it is found, its file descriptor
    appended to ``holds`` (the caller releases them).

    With ``policy_from`` (a training template's name or YAML file) instead of ``targets``, the
    policy evaluated is the one that template builds, before any training: its pretrained weights
    (``policy.config.model_path``, e.g. a published OpenVLA-OFT checkpoint; the ``policy.``,
    ``simulator.`` and ``run.`` overrides apply to it), without warm start, reported as training step 0; the
    evaluation template is checked as a run's (:func:`~vla_rl.preflight.preflight`: the model
    directory included) before anything is written, and the default directory is
    ``<run.output_dir>/eval_<model directory name>`` (without a model directory
    ``eval_<template name>``).

    The evaluation template's ``config`` takes the run's ``policy`` and ``simulator`` sections (the
    checkpoints' architecture and tasks; with a task set, one initial state of each task per
    ``data`` step, a setting the evaluation does not read), the run's ``trainer.strategy`` and
    ``trainer.mixed_precision`` (the checkpoints act in the precision the run's rollouts had:
    bfloat16 autocast or bfloat16 parameters on accelerators, float32 with ``none``; the run's
    ``bf16`` becomes ``auto``, the same on accelerators and float32 on CPU workers), the
    checkpoints (``eval.checkpoints``), then ``overrides``.

    Returns:
        ``(evaluation directory, loaded template, run directory)``.

    Raises:
        EvalInputError: bad targets (or both targets and ``policy_from``, a checkpoint removed as it
            was found, or ``steps`` with
            ``policy_from``), a text run or template, an evaluation setting that does not resolve
            (``eval.num_episodes=0`` included), a damaged episode store in the evaluation directory
            (``DamagedStoreError``), one holding episodes of other task settings, or an evaluation
            directory holding an evaluation of another policy, all before anything is written.
        TemplateError: a bad template or override (:class:`~vla_rl.preflight.PreflightError`'s
            message with ``policy_from``: a missing or unusable model directory).
    """
    from vla_rl.dag.loader import load_template, override_of
    from vla_rl.dag.planner import plan
    from vla_rl.evaluation.episode_store import check_stores, check_task_settings
    from vla_rl.preflight import PreflightError, check_local_packages, preflight
    from vla_rl.run_dir import absolute_path_overrides, policy_misfit

    source = [o for o in overrides if o.removeprefix("~").split(".", 1)[0] in (*COPIED_SECTIONS, "run")]
    if policy_from is None:
        run_dir, checkpoints = find_checkpoints(targets, steps)
        if holds is not None:
            hold_checkpoints(checkpoints, holds)
        from vla_rl.run_dir import RunDirectory

        # the run's own template, with the overrides of its resumes
        recorded = RunDirectory.reopen(run_dir).recorded_overrides()
        run_config = load_template(run_dir / RUN_TEMPLATE, recorded=recorded).config
        what, origin = run_dir, run_dir / RUN_TEMPLATE
    else:
        if targets or steps is not None:
            raise EvalInputError(f"--policy-from {policy_from} evaluates the policy that template builds: name no "
                                 f"run or checkpoint directory ({', '.join(targets)}) and no --steps with it"
                                 if targets else f"--steps selects a run's checkpoints; --policy-from {policy_from} "
                                 "evaluates the policy that template builds, before any training")
        run_dir, checkpoints = None, []
        from_template = load_template(policy_from, source)
        run_config, what, origin = from_template.config, f"template {policy_from}", from_template.path
        if run_config.eval.store_episodes or run_config.eval.checkpoints:
            raise EvalInputError(f"--policy-from {policy_from}: that is vla-rl eval's own template; name the training "
                                 "template (vla-rl train's) whose policy to evaluate")
    for override in overrides:
        unread = unread_by_evaluation(override)
        if unread is not None:
            whose = "checkpoints'" if run_dir else "template's"
            raise EvalInputError(f"{override.split('=', 1)[0]}: vla-rl eval runs no {unread} (it rolls out the "
                                 f"{whose} policy); remove it")
        if run_dir is not None:
            check_trained_tasks_kept(override, run_config.simulator)
    if run_config.run.workflow != "embodied":
        raise EvalInputError(f"{what} is a text {'run' if run_dir else 'template'}; vla-rl eval evaluates embodied "
                             "policies")
    if run_dir is not None:  # the policy's pretrained checkpoint, before eval_dir exists; where the command says
        # it is now (policy.config.model_path=NEW: moved since training), which the evaluation's template takes
        # the policy's settings only (the simulator's would meet training's checks: the warm start's horizon); no
        # deletion (the evaluation's copy of the section holds every key, the run's template not)
        settings = [o for o in source if o.startswith("policy.")]
        rebuilt = load_template(run_dir / RUN_TEMPLATE, settings, recorded=recorded)
        preflight(rebuilt)
        misfit = policy_misfit(rebuilt.config, run_dir, checkpoints) if settings else None
        if misfit:  # the workers' strict load would fail, in a Ray traceback, after the simulators started
            these = "this override builds" if len(settings) == 1 else "these overrides build"
            raise EvalInputError(f"{' '.join(settings)}: the checkpoint {misfit[0]} does not fit the policy {these}: "
                                 f"{misfit[1]}; evaluate without {'it' if len(settings) == 1 else 'them'}")
    check_local_packages(run_config)  # the simulator's optional extra
    evaluation_template = load_template(template)
    raw = copy.deepcopy(evaluation_template.raw)
    config = raw.setdefault("config", {})
    config["policy"] = run_config.policy.model_dump(mode="json")
    config["simulator"] = run_config.simulator.model_dump(mode="json")
    if run_config.run.imports:  # the modules registering its simulator or policy: the workers import them too
        run = config.setdefault("run", {})
        run["imports"] = list(dict.fromkeys([*run.get("imports", []), *run_config.run.imports]))
    trainer = run_config.trainer.portable()
    config.setdefault("trainer", {}).update(strategy=trainer.strategy, mixed_precision=trainer.mixed_precision)
    if run_config.simulator.multi_task:  # a step of a task set holds as many initial states of each task
        config.setdefault("data", {})["init_states_per_step"] = len(run_config.simulator.task_names())
    config.setdefault("eval", {})["checkpoints"] = [str(p) for p in checkpoints]
    for name in ("video_camera", "video_fps"):  # the run's own, where it set them (else the simulator's)
        if name in run_config.eval.model_fields_set:
            config["eval"][name] = getattr(run_config.eval, name)
    # absolute: the workers (on a cluster, in other working directories) open its template
    eval_dir = (Path(output) if output else default_eval_dir(run_dir, run_config, policy_from)).absolute()
    check_output(eval_dir, run_dir, output is not None)
    _check_checkpoints(checkpoints)  # a damaged checkpoint, before Ray, workers and simulators start
    check_stores(eval_dir)  # a damaged episode store is refused before anything is written
    resolved = eval_dir / RUN_TEMPLATE
    # the overrides are checked on a copy first: nothing is written into eval_dir (an earlier
    # evaluation's template there included) until they are accepted; an error not of an override
    # names the template its field came from (the run's for its copied sections, else vla-rl eval's)
    with tempfile.TemporaryDirectory() as scratch:
        _write_yaml(Path(scratch) / RUN_TEMPLATE, raw)
        try:
            loaded = load_template(Path(scratch) / RUN_TEMPLATE, overrides)
            absolute = absolute_path_overrides(loaded.config)  # as the workers read them, and as stored
            if absolute:
                loaded = load_template(Path(scratch) / RUN_TEMPLATE, [*overrides, *absolute])
            plan(loaded) if run_dir is not None else preflight(loaded)  # a template's model directory: here
        except PreflightError:  # a file the evaluation reads: the message names it and the field
            raise
        except TemplateError as err:  # an override's (the run's own sections loaded above): named as typed
            given = override_of(overrides, err.field)
            if given is None:
                copied = (err.field or "").split(".", 1)[0] in COPIED_SECTIONS
                raise TemplateError(err.message, file=origin if copied else evaluation_template.path, node=err.node,
                                    field=err.field) from None
            message = err.message if repr(given) in err.message else f"{err.message} (override {given!r})"
            raise TemplateError(message, node=err.node, field=err.field) from None
    if loaded.config.eval.num_episodes == 0:
        raise EvalInputError("eval.num_episodes=0: an evaluation runs at least one episode of each task")
    tasks = resolve_tasks_or_fail(loaded.config)
    check_same_evaluation(eval_dir, loaded, output is not None)
    check_task_simulators(loaded.config, tasks)
    check_video_camera(loaded.config, tasks)
    if loaded.config.eval.store_episodes:  # episodes stored with other task settings: refused before any write
        for task in tasks:
            try:
                check_task_settings(eval_dir, task.name, task.simulator, task.env)
            except ValueError as err:
                raise EvalInputError(str(err)) from None
    try:
        eval_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # what only the write can tell (a read-only mount, /proc, a full disk)
        raise EvalInputError(f"{'--output ' if output is not None else ''}{eval_dir} cannot be created: "
                             f"{err.strerror or err}") from None
    _write_yaml(resolved, loaded.raw)
    record_checkpoints(eval_dir, loaded.config.eval.checkpoints)
    return eval_dir, load_template(resolved), run_dir


COPIED_SECTIONS = ("policy", "simulator")
"""The sections of the evaluated run's (or template's) config the evaluation template takes whole."""


def simulator_pools_per_worker(config) -> int:
    """The simulator pools a worker of the evaluation ``config`` holds at once: its own (the run's
    tasks), and one of another task while it evaluates one (``eval.benchmark``'s tasks that are
    not the run's, :class:`~vla_rl.evaluation.embodied.EmbodiedEvaluation`). Two were asked of
    the cluster for every evaluation: a single-task one was refused on a cluster holding it."""
    from vla_rl.evaluation.benchmarks import run_task_index

    tasks = resolve_tasks_or_fail(config)
    return 2 if any(run_task_index(config, task) is None for task in tasks) else 1


def videos_left_undone(eval_dir: Path, config, tasks, last_step: int) -> bool:
    """Whether an evaluation still owes the videos of its last checkpoint (``last_step``): it
    makes them (``eval.video_episodes`` > 0 of stored episodes, a task whose simulator renders)
    and ``videos/replays.json``, which rank 0 writes once it has rendered them after the last
    episode, names none of that step. An evaluation stopped while they were rendered has its
    episodes stored and no videos: the same command again, which finds no rollout to run, starts
    the workers for them."""
    import json

    from vla_rl.evaluation.video import renders_videos
    from vla_rl_core.run_layout import VIDEOS_DIR

    ev = config.eval
    if not (ev.store_episodes and ev.video_episodes > 0 and any(renders_videos(task.simulator) for task in tasks)):
        return False
    try:
        replays = json.loads((eval_dir / VIDEOS_DIR / "replays.json").read_text())
    except (OSError, ValueError):  # none yet, or cut short
        return True
    return not any(isinstance(entry, dict) and f"/step{last_step}_" in str(entry.get("file", "")) for entry in replays)


def default_eval_dir(run_dir: Path | None, run_config, policy_from: str | None) -> Path:
    """``<run>/eval``; for ``--policy-from``, ``<run.output_dir>/eval_<model directory name>``
    (``eval_<template name>`` for a policy without one)."""
    if run_dir is not None:
        return run_dir / EVAL_DIR
    model_path = run_config.policy.config.get("model_path")
    name = Path(model_path).name if model_path else Path(policy_from).stem
    return Path(run_config.run.output_dir) / f"eval_{name}"


def _check_checkpoints(checkpoints: list[Path]) -> None:
    """Each checkpoint's files against the sizes in its manifest
    (:func:`~vla_rl.checkpoints.integrity.verify_checkpoint` without the digests: the workers
    check those when they load it).

    Raises:
        EvalInputError: a file of one is missing or truncated (one line naming it).
    """
    from vla_rl.checkpoints.integrity import verify_checkpoint
    from vla_rl.checkpoints.layout import CheckpointCorruptError

    for checkpoint in checkpoints:
        try:
            verify_checkpoint(checkpoint, digests=False)
        except CheckpointCorruptError as err:
            raise EvalInputError(str(err)) from None


def hold_checkpoints(checkpoints: list[Path], holds: list[int]) -> None:
    """Hold each of ``checkpoints`` against removal while the evaluation reads them
    (:func:`~vla_rl_core.dir_lock.hold_directory`): a training run still going prunes all but its
    ``trainer.keep_last`` newest checkpoints, and keeps a held one until a later checkpoint. The
    file descriptors are appended to ``holds``, those taken before an error included.

    Raises:
        EvalInputError: a checkpoint was removed since it was found.
    """
    for path in checkpoints:
        try:
            holds.append(hold_directory(path))
        except FileNotFoundError:
            raise EvalInputError(f"checkpoint {path} was removed as the evaluation started (a run still training "
                                 "keeps its trainer.keep_last newest checkpoints): evaluate again") from None


def _lock_evaluation(eval_dir: Path, chosen: bool):
    """Take ``eval_dir``'s lock for the evaluation (:func:`~vla_rl_core.dir_lock.lock_directory`).

    Raises:
        EvalInputError: another evaluation holds it (two would write one report and one store),
            or it cannot be locked (a read-only file system).
    """
    flag = "--output " if chosen else ""
    try:
        return lock_directory(eval_dir)
    except DirectoryInUse as err:
        raise EvalInputError(f"{flag}{eval_dir} is in use by another evaluation (pid {err.pid}); wait for it to end "
                             "or evaluate into another --output") from None
    except OSError as err:
        raise EvalInputError(f"{flag}{eval_dir} cannot be locked for the evaluation: {err.strerror or err}") from None


def _remove_unstarted(eval_dir: Path) -> None:
    """An evaluation that stopped before it stored an episode (Ray refused: a cluster that refuses
    the driver's token, a cluster too small; or the workers did: a model directory that does not
    fit the simulator): its directory holding only the template and the checkpoints' record it
    has just written is removed, as a training run that fails before its first metric leaves no
    run directory; a directory holding anything else (an earlier evaluation's stores and report)
    is left as it is."""
    written = {RUN_TEMPLATE, CHECKPOINTS_FILE, LOCK_FILE}
    if {entry.name for entry in eval_dir.iterdir()} <= written:
        for name in written:
            (eval_dir / name).unlink(missing_ok=True)
        eval_dir.rmdir()


def _write_yaml(path: Path, data: dict) -> None:
    write_text_atomically(path, yaml.safe_dump(data, sort_keys=False))


def skip_incompatible_tasks(eval_dir: Path, loaded):
    """Check every task of the evaluation against the run's policy
    (:func:`~vla_rl.evaluation.compatibility.check_tasks`; Ray must be up) and leave the ones that
    fit in the resolved template's ``eval.tasks``.

    Returns:
        ``(loaded template, the tasks that run, the skipped ones as {"task", "simulator", "env", "reason"})``.
    """
    from vla_rl.dag.loader import load_template
    from vla_rl.evaluation.compatibility import check_tasks

    verdicts = check_tasks(loaded.config, resolve_tasks_or_fail(loaded.config))
    skipped = [{"task": v.task.name, "simulator": v.task.simulator, "env": v.task.env, "reason": v.reason}
               for v in verdicts if v.reason is not None]
    runs = [v.task for v in verdicts if v.reason is None]
    if skipped and runs:
        raw = copy.deepcopy(loaded.raw)
        raw["config"].setdefault("eval", {})["tasks"] = [task.name for task in runs]
        _write_yaml(eval_dir / RUN_TEMPLATE, raw)
        loaded = load_template(eval_dir / RUN_TEMPLATE)
    return loaded, runs, skipped


def check_task_simulators(config, tasks) -> None:
    """For a local evaluation, the optional extra of every simulator its tasks run on: a benchmark
    may be another simulator's (``eval.benchmark=libero_spatial`` of a robosuite run), which the
    run's own check (:func:`~vla_rl.preflight.check_local_packages`) does not see; the workers
    found it after Ray had started, as a Ray traceback.

    Raises:
        EvalInputError: naming ``eval.benchmark`` (or ``eval.tasks``), the simulator and how to
            install it.
    """
    from vla_rl.preflight import simulator_unavailable
    from vla_rl.utils.ray_utils import cluster_address

    if cluster_address(config.workers.ray_address) is not None:  # the cluster's environment runs them
        return
    for name in dict.fromkeys(task.simulator for task in tasks):
        reason = simulator_unavailable(name)
        if reason is not None:
            field = "eval.benchmark" if config.eval.benchmark is not None else "eval.tasks"
            raise EvalInputError(f"{field}: the tasks of simulator {name!r} cannot run here: {reason}")


def check_video_camera(config, tasks) -> None:
    """Check that every task can render its videos from its camera
    (:func:`~vla_rl.evaluation.video.video_camera`): the simulator's config checks the name
    (MetaWorld's does), and for a local evaluation the simulator's ``check_config`` too
    (:func:`simulators.registry.check_env`: robosuite's cameras).

    Raises:
        EvalInputError: naming ``eval.video_camera`` and the task.
    """
    from simulators.registry import check_env
    from vla_rl.evaluation.benchmarks import EvalTask
    from vla_rl.evaluation.video import renders_videos, video_camera
    from vla_rl.utils.ray_utils import cluster_address
    from vla_rl_core.components import ComponentConfigError

    if config.eval.video_episodes == 0:
        return
    local = cluster_address(config.workers.ray_address) is None
    for task in tasks:
        if not renders_videos(task.simulator):  # a remote environment: no videos (its evaluation records none)
            continue
        camera = video_camera(config, task.simulator)
        try:
            EvalTask(task.name, task.simulator, {**task.env, "render_camera": camera}).env_config()
            if local:  # the driver has the simulator library that the workers import
                check_env(task.simulator, {**task.env, "render_camera": camera})
        except ComponentConfigError as err:
            raise EvalInputError(f"eval.video_camera: task {task.name} cannot render videos from camera {camera!r} "
                                 f"({err.message}); set eval.video_camera to one of its cameras, or "
                                 "eval.video_episodes=0") from None


def resolve_tasks_or_fail(config):
    """:func:`~vla_rl.evaluation.benchmarks.resolve_tasks`, its errors as :class:`EvalInputError`."""
    from vla_rl.evaluation.benchmarks import resolve_tasks

    try:
        return resolve_tasks(config)
    except ValueError as err:
        raise EvalInputError(str(err)) from None


def protocol_info(config, run_dir: Path | None, tasks, protocols, steps: list[int],
                  policy_from: str | None = None) -> dict:
    """How the evaluation runs, as the reports state it: ``run_dir`` and its checkpoints, or
    (``policy_from``, ``run_dir`` None) the template whose policy is evaluated untrained, as one
    checkpoint of step 0 without a path."""
    ev = config.eval
    checkpoints = [{"path": p, "step": s} for p, s in zip(ev.checkpoints, steps)]
    return {
        "run_dir": None if run_dir is None else str(run_dir),
        "policy_from": policy_from,
        "model_path": config.policy.config.get("model_path"),
        "checkpoints": checkpoints if ev.checkpoints else [{"path": None, "step": step} for step in steps],
        "tasks": [{"name": t.name, "simulator": t.simulator, "env": t.env} for t in tasks],
        "protocols": [{"label": p.label, "greedy": p.greedy, "temperature": p.temperature} for p in protocols],
        "episodes_per_task": ev.num_episodes,
        # both ends inclusive, as report.md writes them (a half-open [start, stop) read as inclusive
        # claimed one episode more than ran)
        "init_state_ids": {"first": ev.init_state_offset, "last": ev.init_state_offset + ev.num_episodes - 1},
        "seed": config.run.seed,
        "policy": config.policy.name,
        "confidence_interval": "Wilson score, 95%",
        "episode_length_unit": "decision steps",
    }


def evaluate(targets: list[str], overrides: list[str], steps: list[int] | None = None, output: str | None = None,
             template: str = EVAL_TEMPLATE, console=None, policy_from: str | None = None) -> dict:
    """Evaluate checkpoints end to end (see the module docstring).

    Args:
        targets: run and/or checkpoint directories (see :func:`~vla_rl.evaluation.targets.find_checkpoints`).
        overrides: dotted overrides of the evaluation template (``eval.num_episodes=20``).
        steps: only the checkpoints of these training steps.
        output: the evaluation directory (default ``<run_dir>/eval``).
        template: the evaluation template.
        console: a ``rich.console.Console``.
        policy_from: instead of ``targets``, the training template whose policy is evaluated before
            any training (see :func:`prepare_eval_dir`).

    Returns:
        The JSON report (also ``<eval_dir>/report.json``).
    """
    holds: list[int] = []  # the checkpoints evaluated, held against their run's pruning until the end
    try:
        return _evaluate(targets, overrides, steps, output, template, console, policy_from, holds)
    finally:
        for fd in holds:
            release_directory(fd)


def _evaluate(targets, overrides, steps, output, template, console, policy_from, holds: list[int]) -> dict:
    """:func:`evaluate`, holding the checkpoints it evaluates in ``holds``."""
    import numpy as np
    from tqdm import tqdm

    from vla_rl.dag.planner import plan
    from vla_rl.evaluation.embodied import checkpoint_step
    from vla_rl.evaluation.protocol import eval_protocols
    from vla_rl.evaluation.report import ReportProgress, markdown_table
    from vla_rl.utils.console import driver_console
    from vla_rl.workers.group import WorkerGroup, run_evaluation, start_ray

    console = console or driver_console()
    eval_dir, loaded, run_dir = prepare_eval_dir(targets, overrides, steps, output, template, policy_from, holds)
    lock = _lock_evaluation(eval_dir, output is not None)
    try:
        config = loaded.config
        try:
            # the policy as built: the workers evaluate it as their live policy at step 0 (run_evaluation's)
            ckpt_steps = [checkpoint_step(Path(p)) for p in config.eval.checkpoints] or [0]
            device = start_ray(config, plan(loaded).world_size, pools_per_worker=simulator_pools_per_worker(config))
        except BaseException:
            _remove_unstarted(eval_dir)
            raise
        console.print(f"[bold]evaluation directory[/bold] {eval_dir}")
        started = time.perf_counter()
        loaded, tasks, skipped = skip_incompatible_tasks(eval_dir, loaded)
        for s in skipped:
            console.print(f"[yellow]skipping task {escape(s['task'])}: {escape(s['reason'])}[/yellow]")
        if not tasks:  # it reported an empty table and exited 0
            _remove_unstarted(eval_dir)
            raise EvalInputError(f"none of the {len(skipped)} tasks of the evaluation can run with the policy (each "
                                 "skipped, above, saying why): evaluate tasks with its observation and action layout")
        config = loaded.config
        ev = config.eval
        protocols = eval_protocols(ev)
        ids = ev.init_state_offset + np.arange(ev.num_episodes)
        info = protocol_info(config, run_dir, tasks, protocols, ckpt_steps, policy_from)
        progress = ReportProgress(eval_dir, info, tasks, skipped, ckpt_steps, protocols, ids)
        progress.update()  # tasks an interrupted evaluation finished
        workers = None
        rollouts = len(progress.complete) < len(tasks)
        videos = bool(tasks) and not rollouts and videos_left_undone(eval_dir, config, tasks, max(ckpt_steps))
        if tasks and not rollouts:
            console.print("every planned episode is stored already: " + (
                "rendering the videos the evaluation has not made yet (it was stopped while rank 0 rendered them)"
                if videos else "no rollout to run"))
        try:  # a failure leaves the last report written (as of the last finished step), never a new one
            if rollouts or videos:
                from vla_rl.workflows.embodied import remote_clients_note

                the_plan = plan(loaded)
                world = the_plan.world_size
                note = remote_clients_note(config, the_plan, evaluation=True)
                if note is not None:
                    console.print(note)
                total = len(tasks) * len(ckpt_steps) * len(protocols) * ev.num_episodes
                workers = WorkerGroup.launch(world, str(eval_dir / RUN_TEMPLATE), [], eval_dir, config.workers, device)
                workers.start_process_group()
                workers.call("setup", False)
                bar = tqdm(total=total, desc="evaluating", unit="episode", dynamic_ncols=True)

                def advance(metrics: dict) -> None:
                    bar.update(total - int(metrics["eval/remaining"]) - bar.n)
                    progress.update()

                run_evaluation(workers, 0, "eval", True, progress=advance)
                bar.close()
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM: at once (a worker busy setting up would hold shutdown 30 s)
            if workers is not None:
                workers.kill()
                workers = None
            _remove_unstarted(eval_dir)
            raise
        except BaseException:  # a setting only a worker could check (a model directory that does not fit the simulator)
            _remove_unstarted(eval_dir)
            raise
        finally:
            if workers is not None:
                workers.shutdown()
        info.update({"wall_time_s": time.perf_counter() - started,
                     "driver_max_reply_bytes": workers.max_reply_bytes if workers is not None else 0})
        progress.update()
        report = progress.write()
        console.print(markdown_table(report["results"]), soft_wrap=True)
        console.print(f"report {eval_dir / 'report.md'}; plot {eval_dir / 'success_vs_checkpoint.png'}")
        return report
    finally:
        unlock_directory(lock)
