"""Run directories owned by one run: unique names, a lock, resumes that validate first and never
rewrite the run's template (vla_rl/run_dir.py, vla_rl/driver.py::prepare_run_dir)."""

from __future__ import annotations

import multiprocessing

import pytest
import yaml

from vla_rl.dag.errors import TemplateError
from vla_rl.driver import prepare_run_dir
from vla_rl.run_dir import RunDirectory, RunDirError


def _new_run(out, *overrides):
    run, template, worker_overrides = prepare_run_dir("embodied_srpo", [f"run.output_dir={out}", *overrides], None)
    return run, template, worker_overrides


def test_an_existing_run_name_is_refused_and_left_alone(tmp_path):
    run, _, _ = _new_run(tmp_path, "run.name=mine")
    run.close()
    before = (run.path / "template.yaml").read_bytes()
    with pytest.raises(RunDirError, match=r"already exists: continue it with `vla-rl train --resume"):
        _new_run(tmp_path, "run.name=mine", "trainer.total_steps=7")
    assert (run.path / "template.yaml").read_bytes() == before
    assert sorted(p.name for p in run.path.iterdir()) == [".lock", "template.yaml"]


def test_default_names_started_in_the_same_second_are_distinct(tmp_path):
    runs = [RunDirectory.create(tmp_path, None, "t") for _ in range(3)]
    assert len({run.path for run in runs}) == 3
    assert runs[1].path.name == runs[0].path.name + "_2"
    for run in runs:
        run.close()


def _try_lock(path, queue):
    try:
        RunDirectory.reopen(path).lock()
        queue.put("locked")
    except RunDirError as error:
        queue.put(str(error))


def test_a_run_directory_in_use_is_refused_with_the_owners_pid(tmp_path):
    run, _, _ = _new_run(tmp_path, "run.name=busy")
    queue = multiprocessing.get_context("spawn").Queue()
    process = multiprocessing.get_context("spawn").Process(target=_try_lock, args=(run.path, queue))
    process.start()
    process.join(60)
    message = queue.get(timeout=5)
    assert "in use by another process" in message and str(__import__("os").getpid()) in message
    run.close()  # released: the next owner gets it
    process = multiprocessing.get_context("spawn").Process(target=_try_lock, args=(run.path, queue))
    process.start()
    process.join(60)
    assert queue.get(timeout=5) == "locked"


def test_resume_validates_first_and_records_its_overrides(tmp_path):
    run, _, _ = _new_run(tmp_path, "run.name=r", "trainer.total_steps=2")
    run.close()
    template_before = (run.path / "template.yaml").read_bytes()
    with pytest.raises(TemplateError, match="trainer.total_step"):
        prepare_run_dir(None, ["trainer.total_step=6"], str(run.path))  # a typo: nothing written
    assert sorted(p.name for p in run.path.iterdir()) == [".lock", "template.yaml"]

    resumed, template, worker_overrides = prepare_run_dir(None, ["trainer.total_steps=6"], str(run.path))
    resumed.close()
    assert template.config.trainer.total_steps == 6 and worker_overrides == ["trainer.total_steps=6"]
    assert (run.path / "template.yaml").read_bytes() == template_before  # never rewritten
    assert yaml.safe_load(template_before)["config"]["trainer"]["total_steps"] == 2

    again, template, worker_overrides = prepare_run_dir(None, ["eval.num_episodes=4"], str(run.path))
    again.close()
    assert template.config.trainer.total_steps == 6 and template.config.eval.num_episodes == 4
    assert worker_overrides == ["trainer.total_steps=6", "eval.num_episodes=4"]
    assert [r["overrides"] for r in map(yaml.safe_load, (run.path / "resumes.jsonl").read_text().splitlines())] == [
        ["trainer.total_steps=6"], ["eval.num_episodes=4"]]


def test_resume_of_something_that_is_not_a_run(tmp_path):
    with pytest.raises(RunDirError, match="is not a run directory: it has no template.yaml"):
        prepare_run_dir(None, [], str(tmp_path))
