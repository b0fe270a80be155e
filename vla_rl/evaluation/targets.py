"""What ``vla-rl eval`` evaluates: checkpoint directories, or a run directory's checkpoints.

Importing this module imports no torch (the CLI imports :class:`EvalInputError`).
"""

from __future__ import annotations

from pathlib import Path

from vla_rl_core.run_layout import CHECKPOINTS_DIR, RUN_TEMPLATE, SWEEP_FILE

"""The resolved template a training run writes into its run directory (``vla_rl.run_dir``), and
an evaluation into its evaluation directory."""


class EvalInputError(ValueError):
    """A problem with what ``vla-rl eval`` was asked to evaluate (reported as one line, exit 2)."""


def find_checkpoints(targets: list[str], steps: list[int] | None = None) -> tuple[Path, list[Path]]:
    """Resolve ``vla-rl eval``'s targets to one run directory and its checkpoints to evaluate.

    Args:
        targets: run directories (``outputs/<run>``: all complete checkpoints under
            ``checkpoints/``) and/or checkpoint directories (``.../checkpoints/step_00000010``).
        steps: keep only the checkpoints of these training steps (``None``: all).

    Returns:
        ``(run directory, checkpoint directories)``, checkpoints oldest first.

    Raises:
        EvalInputError: a target is neither, a run has no complete checkpoint (or none yet), the targets span
            several runs, the run has no resolved ``template.yaml``, or a selected step is missing.
    """
    from vla_rl.checkpoints.files import NO_CHECKPOINT_YET, complete_checkpoints, is_run_without_checkpoints
    from vla_rl.checkpoints.layout import TRAINER_STATE_FILE

    run_dirs, found = set(), []
    for target in targets:
        path = Path(target).resolve()
        if (path / TRAINER_STATE_FILE).is_file():
            run_dirs.add(path.parent.parent)
            found.append(path)
        elif (path / CHECKPOINTS_DIR).is_dir():
            run_checkpoints = complete_checkpoints(path / CHECKPOINTS_DIR)
            if not run_checkpoints:
                raise EvalInputError(f"{path} has no complete checkpoint under checkpoints/")
            run_dirs.add(path)
            found += run_checkpoints
        elif is_run_without_checkpoints(path):  # in progress, or stopped before its first checkpoint
            raise EvalInputError(f"run {path} {NO_CHECKPOINT_YET}")
        elif (path / SWEEP_FILE).is_file():  # a seed sweep's directory (vla-rl train --seeds)
            raise EvalInputError(f"{target} is a sweep of seeds: evaluate each of its runs, e.g. vla-rl eval "
                                 f"{Path(target) / 'seed_<S>'}")
        else:
            raise EvalInputError(f"{target} is neither a run directory (with checkpoints/) nor a checkpoint "
                                 f"directory (with {TRAINER_STATE_FILE})")
    if len(run_dirs) != 1:
        raise EvalInputError(f"the checkpoints belong to several runs ({', '.join(map(str, sorted(run_dirs)))}); "
                             "evaluate one run at a time")
    run_dir = run_dirs.pop()
    if not (run_dir / RUN_TEMPLATE).is_file():
        raise EvalInputError(f"{run_dir / RUN_TEMPLATE} is missing: the checkpoints must sit in a run directory "
                             "written by `vla-rl train`")
    checkpoints = sorted(set(found), key=lambda p: p.name)
    if steps is not None:
        by_step = {int(p.name.removeprefix("step_")): p for p in checkpoints}
        missing = sorted(set(steps) - set(by_step))
        if missing:
            raise EvalInputError(f"no checkpoint of step(s) {missing} in {run_dir}; available: {sorted(by_step)}")
        checkpoints = [by_step[s] for s in sorted(set(steps))]
    return run_dir, checkpoints
