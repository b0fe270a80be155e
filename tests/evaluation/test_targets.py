"""Resolving `vla-rl eval` targets to a run and its checkpoints."""

from __future__ import annotations

import pytest

from vla_rl.evaluation.targets import EvalInputError, find_checkpoints


def make_run(root, steps, template=True):
    run = root / "run"
    for step in steps:
        directory = run / "checkpoints" / f"step_{step:08d}"
        directory.mkdir(parents=True)
        (directory / "trainer_state.json").write_text('{"step": %d, "metadata": {}}' % step)
    (run / "checkpoints" / ".step_00000009.tmp").mkdir()  # staging: never evaluated
    if template:
        (run / "template.yaml").write_text("name: x\n")
    return run


def test_run_dir_gives_all_complete_checkpoints(tmp_path):
    run = make_run(tmp_path, [10, 5, 20])
    run_dir, checkpoints = find_checkpoints([str(run)])
    assert run_dir == run.resolve()
    assert [p.name for p in checkpoints] == ["step_00000005", "step_00000010", "step_00000020"]
    _, selected = find_checkpoints([str(run)], steps=[20, 5])
    assert [p.name for p in selected] == ["step_00000005", "step_00000020"]
    _, one = find_checkpoints([str(run / "checkpoints" / "step_00000010")])
    assert [p.name for p in one] == ["step_00000010"]


@pytest.mark.parametrize("case, message", [
    ("missing_step", r"no checkpoint of step\(s\) \[7\].*available: \[5\]"),
    ("not_a_run", "neither a run directory"),
    ("no_template", "template.yaml is missing"),
    ("two_runs", "several runs"),
])
def test_bad_targets(tmp_path, case, message):
    run = make_run(tmp_path, [5], template=case != "no_template")
    targets, steps = [str(run)], None
    if case == "missing_step":
        steps = [7]
    elif case == "not_a_run":
        targets = [str(tmp_path)]
    elif case == "two_runs":
        other = make_run(tmp_path / "other", [5])
        targets.append(str(other / "checkpoints" / "step_00000005"))
    with pytest.raises(EvalInputError, match=message):
        find_checkpoints(targets, steps)


def test_a_sweep_of_seeds_is_pointed_to_its_runs(tmp_path):
    """It said "neither a run directory nor a checkpoint directory" of a directory vla-rl made."""
    sweep = tmp_path / "srpo_seeds"
    make_run(sweep / "seed_0", [5])
    (sweep / "sweep.json").write_text('{"template": "embodied_srpo", "overrides": [], "seeds": [0]}')
    with pytest.raises(EvalInputError) as refused:
        find_checkpoints([str(sweep)])
    assert str(refused.value) == f"{sweep} is a sweep of seeds: evaluate each of its runs, e.g. vla-rl eval " \
                                 f"{sweep / 'seed_<S>'}"


def test_a_run_that_has_written_no_checkpoint_yet_is_named_so(tmp_path):
    """A run in progress (or stopped before its first checkpoint) was "neither a run directory
    (with checkpoints/) nor a checkpoint directory"."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("template.yaml", "metrics.jsonl"):
        (run / name).write_text("")
    with pytest.raises(EvalInputError) as refused:
        find_checkpoints([str(run)])
    assert str(refused.value) == (f"run {run} has no checkpoint yet (a run writes its first after "
                                  "trainer.save_every steps, and at its end)")
