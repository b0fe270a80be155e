"""Where ``vla-rl eval`` writes: an output directory it may write an evaluation into
(:func:`check_output`), and whether the evaluation already there may be continued by this one
(:func:`check_same_evaluation`): the same policy, seed and checkpoints (by their files, not only
their names: another run's ``step_00000002`` is another checkpoint), and report rows that cover
the earlier ones. :func:`record_checkpoints` writes what identifies the evaluated checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from vla_rl.checkpoints.integrity import checkpoint_identity
from vla_rl.evaluation.targets import EvalInputError
from vla_rl_core.dir_lock import directory_in_use
from vla_rl_core.file_modes import uncreatable, write_text_atomically
from vla_rl_core.run_layout import CHECKPOINTS_DIR, EPISODES_DIR, EVAL_DIR, RUN_TEMPLATE

EVALUATION_FILES = (RUN_TEMPLATE, EPISODES_DIR, "report.json", "report.md", "results")
"""What tells a directory an evaluation wrote (its template, episode stores or report) from another."""

CHECKPOINTS_FILE = "checkpoints.json"
"""An evaluation directory's record of the checkpoints it evaluated: ``{name: {"path", "identity"}}``
(:func:`~vla_rl.checkpoints.integrity.checkpoint_identity`), written by :func:`record_checkpoints`."""


def record_checkpoints(eval_dir: Path, checkpoints: list[str]) -> None:
    """Add ``checkpoints`` (their directories) to ``eval_dir``'s :data:`CHECKPOINTS_FILE`."""
    recorded = _recorded_checkpoints(eval_dir)
    recorded.update({Path(path).name: {"path": str(path), "identity": checkpoint_identity(path)}
                     for path in checkpoints})
    write_text_atomically(eval_dir / CHECKPOINTS_FILE, json.dumps(recorded, indent=1))


def _recorded_checkpoints(eval_dir: Path) -> dict[str, dict]:
    """``eval_dir``'s :data:`CHECKPOINTS_FILE` (empty: none, or unreadable)."""
    try:
        recorded = json.loads((eval_dir / CHECKPOINTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {name: entry for name, entry in recorded.items() if isinstance(entry, dict)} if isinstance(
        recorded, dict) else {}


def _earlier_locations(eval_dir: Path, earlier_paths: list) -> dict[str, Path]:
    """Where the earlier evaluation's checkpoints were, by name (its record, else its template's
    ``eval.checkpoints``, made absolute as the evaluation made them then)."""
    from vla_rl.run_dir import absolute

    where = {Path(path).name: absolute(path) for path in earlier_paths if isinstance(path, str) and path}
    where.update({name: absolute(entry["path"]) for name, entry in _recorded_checkpoints(eval_dir).items()
                  if isinstance(entry.get("path"), str) and entry["path"]})
    return where


def _check_same_checkpoints(eval_dir: Path, earlier_paths: list, paths: list[str], flag: str) -> None:
    """Each checkpoint of this evaluation that the earlier one evaluated under the same name
    (``step_<N>``) must be that checkpoint: its identity as recorded (or, for an evaluation before
    the record, of the checkpoint its template names, if still there).

    Raises:
        EvalInputError: naming the checkpoint, where the earlier one was, and ``--output``.
    """
    recorded, where = _recorded_checkpoints(eval_dir), _earlier_locations(eval_dir, earlier_paths)
    for path in map(Path, paths):
        earlier = where.get(path.name)
        was = (recorded.get(path.name) or {}).get("identity")
        if was is None and earlier is not None and earlier != path:
            was = checkpoint_identity(earlier)
        now = checkpoint_identity(path)
        if was is not None and now is not None and was != now:
            raise EvalInputError(f"{flag}{eval_dir} holds an evaluation of another {path.name} ({earlier}, whose "
                                 f"files differ from those of {path}): its episodes would be reported as this one's; "
                                 "name another --output")


def check_same_evaluation(eval_dir: Path, loaded, chosen: bool) -> None:
    """An existing evaluation in ``eval_dir`` (its ``template.yaml``) must be of the same policy
    section and ``run.seed`` (the seed of the sampled protocol and of a template's initial
    weights), so that a continued evaluation never pools episodes of two policies or two seeds,
    and of the same checkpoints, protocols and benchmark tasks, whose rows its report holds (an
    evaluation of step 3 alone replaced the report of steps 1 and 2, whose checkpoint of step 1
    was gone). Its model paths count as absolute (an evaluation before 2026-12-06 stored them as
    given).

    Raises:
        EvalInputError: naming the first differing field and both values, or both selections.
    """
    from vla_rl.config.sections import EvalSection, RunSection
    from vla_rl.evaluation.benchmarks import candidate_tasks
    from vla_rl.run_dir import absolute

    resolved = eval_dir / RUN_TEMPLATE
    if not resolved.is_file():
        return
    earlier_config = (yaml.safe_load(resolved.read_text()) or {}).get("config", {})
    earlier, policy = earlier_config.get("policy"), loaded.raw["config"]["policy"]
    flag = "--output " if chosen else ""
    if earlier is not None:
        paths = earlier.get("config") or {}
        for key in ("model_path", "tokenizer_path"):
            if isinstance(paths.get(key), str) and paths[key]:
                paths[key] = str(absolute(paths[key]))
        if earlier != {key: policy.get(key) for key in earlier}:  # a section field added since: the same
            field, was, now = _first_difference(earlier, policy, "policy")
            raise EvalInputError(f"{flag}{eval_dir} holds an evaluation of another policy ({field}: {was!r} there, "
                                 f"{now!r} here); name another --output")
    seed = (earlier_config.get("run") or {}).get("seed", RunSection.model_fields["seed"].default)
    if seed != loaded.config.run.seed:
        raise EvalInputError(f"{flag}{eval_dir} holds an evaluation under run.seed {seed!r}, here "
                             f"{loaded.config.run.seed!r} (it seeds the sampled protocol and a template's initial "
                             "weights); name another --output")
    earlier_paths = (earlier_config.get("eval") or {}).get("checkpoints") or []
    _check_same_checkpoints(eval_dir, earlier_paths, loaded.config.eval.checkpoints, flag)
    try:
        earlier_section = EvalSection.model_validate(earlier_config.get("eval") or {})
    except ValueError:  # an evaluation section this version does not read: compared by the fields above only
        return
    every = tuple(task.name for task in candidate_tasks(loaded.config))  # eval.tasks null: all of these
    rows, earlier_rows = _report_rows(loaded.config.eval), _report_rows(earlier_section)
    if not _covers(rows, earlier_rows, every):
        # the usual cause: training on pruned the evaluated checkpoints (trainer.keep_last)
        root = Path(loaded.config.eval.checkpoints[0]).parent if loaded.config.eval.checkpoints else None
        where = _earlier_locations(eval_dir, earlier_paths)
        elsewhere = sorted({str(where[name].parent) for name in earlier_rows[0] if name in where} - {str(root)})
        gone = [name for name in earlier_rows[0] if name not in rows[0] and root is not None
                and not (root / name).is_dir() and not elsewhere]
        pruned = (f" ({', '.join(gone)} no longer in {root}: training on pruned it, trainer.keep_last; raise "
                  "trainer.keep_last before training on to extend an evaluation in place)") if gone else ""
        if elsewhere and root is not None:
            pruned = f" (that one's checkpoints are in {', '.join(elsewhere)}; this one's in {root})"
        raise EvalInputError(
            f"{flag}{eval_dir} holds an evaluation of {_describe_rows(earlier_rows, rows, every)}, and this one "
            f"evaluates {_describe_rows(rows, rows, every)}{pruned}: its report would drop rows of that one's; name "
            "another --output (the same selection, or one that adds checkpoints, protocols or tasks, continues that "
            "evaluation)")


def _report_rows(section) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...] | None, str | None]:
    """What the rows of an evaluation's report are: its checkpoints (by name, ``step_<N>``: a run
    directory copied or moved elsewhere holds the same), protocols (``sampled@T``), tasks (None:
    all of its benchmark's, or of the run's own) and benchmark."""
    from vla_rl.evaluation.protocol import eval_protocols

    protocols = tuple(p.name if p.greedy else f"{p.name}@{p.temperature:g}" for p in eval_protocols(section))
    return (tuple(Path(c).name for c in section.checkpoints), protocols,
            None if section.tasks is None else tuple(section.tasks), section.benchmark)


def _covers(rows, earlier, every: tuple[str, ...]) -> bool:
    """Whether a report of ``rows`` (:func:`_report_rows`) holds every row of one of ``earlier``:
    the same benchmark, and every earlier checkpoint, protocol and task among its own (``every``:
    the benchmark's tasks, which null selects)."""
    checkpoints, protocols, tasks, benchmark = rows
    was_checkpoints, was_protocols, was_tasks, was_benchmark = earlier
    return (benchmark == was_benchmark and set(was_checkpoints) <= set(checkpoints)
            and bool(was_checkpoints) == bool(checkpoints)  # a template's policy (no checkpoint) is a row too
            and set(was_protocols) <= set(protocols) and set(was_tasks or every) <= set(tasks or every))


def _describe_rows(rows, current, every: tuple[str, ...]) -> str:
    """``step_00000001, step_00000002 (greedy, sampled@1, benchmark B, tasks [...])``: the tasks
    when selected, unless they are ``every`` one of the ``current`` evaluation's benchmark."""
    checkpoints, protocols, tasks, benchmark = rows
    steps = ", ".join(checkpoints) or "the template's policy"
    every_task = tasks is None or (benchmark == current[3] and set(tasks) == set(every))
    where = ("" if benchmark is None else f", benchmark {benchmark}") + ("" if every_task else f", tasks {list(tasks)}")
    return f"{steps} ({', '.join(protocols)}{where})"


def _first_difference(a, b, path: str) -> tuple[str, object, object]:
    """The dotted path of the first value that differs between two YAML trees, and both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{path}.{key}")
    return path, a, b


def check_output(eval_dir: Path, run_dir: Path | None, chosen: bool) -> None:
    """``--output`` (``chosen``) or the run's ``eval/``: a directory to write an evaluation into.

    Raises:
        EvalInputError: it is a file or cannot be created (a file on its path), a directory
            holding files but no evaluation (a dataset: the evaluation would mix its files in),
            or (``--output``) a training run's directory (it holds ``checkpoints/``: its template
            would be replaced), naming the path.
    """
    flag = "--output " if chosen else ""
    if eval_dir.exists() and not eval_dir.is_dir():
        raise EvalInputError(f"{flag}{eval_dir} is a file; the evaluation writes a directory there")
    if not eval_dir.exists() and (problem := uncreatable(eval_dir)):
        raise EvalInputError(f"{flag}{eval_dir} cannot be created: {problem}")
    if (owner := directory_in_use(eval_dir)) is not None:  # before anything there is read or written
        raise EvalInputError(f"{flag}{eval_dir} is in use by another evaluation (pid {owner}); wait for it to end or "
                             "evaluate into another --output")
    if eval_dir.is_dir() and not (eval_dir / CHECKPOINTS_DIR).is_dir() and any(eval_dir.iterdir()) and not any(
            (eval_dir / name).exists() for name in EVALUATION_FILES):
        raise EvalInputError(f"{flag}{eval_dir} holds files but no evaluation (no {RUN_TEMPLATE}, {EPISODES_DIR}/ or "
                             "report): name a new or empty directory, or one an evaluation wrote")
    if (eval_dir / CHECKPOINTS_DIR).is_dir() or (run_dir is not None and eval_dir.resolve() == run_dir.resolve()):
        raise EvalInputError(f"{flag}{eval_dir} is a training run's directory (it holds checkpoints/); an "
                             "evaluation would replace its template.yaml: name a new directory"
                             + (f", or leave --output out ({run_dir / EVAL_DIR})" if run_dir is not None else ""))
