"""Paths reach the workers absolute (vla_rl/run_dir.py): on a cluster started with `ray start` the
workers' working directory is where `ray start` ran, not the driver's, so a relative
``run.output_dir`` or input path would name another place there (end to end:
tests/test_ray_start_cluster.py)."""

from __future__ import annotations

import json

import pytest

from vla_rl.dag.loader import load_template
from vla_rl.driver import prepare_run_dir
from vla_rl.run_dir import RunDirectory, absolute_path_overrides


def test_a_run_directory_under_a_relative_output_dir_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run, _, _ = prepare_run_dir("embodied_srpo", ["run.output_dir=runs", "run.name=r"], None)
    run.close()
    assert run.path == tmp_path / "runs" / "r" and run.template_path.is_absolute()
    assert RunDirectory.reopen("runs/r").path == tmp_path / "runs" / "r"


@pytest.mark.parametrize("value", ["demos/lift.zarr", "a b/c: d/é.zarr", "../shared/demos.zarr"])
def test_relative_input_paths_become_absolute_overrides_the_workers_load(value, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    quoted = json.dumps(value, ensure_ascii=False)
    overrides = absolute_path_overrides(load_template("embodied_srpo", [f"warm_start.demo_store={quoted}"]).config)
    assert len(overrides) == 1 and overrides[0].startswith("warm_start.demo_store=")
    expected = str((work / value).resolve())
    assert load_template("embodied_srpo", overrides).config.warm_start.demo_store == expected


def test_absolute_and_unset_paths_need_no_override(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_path_overrides(load_template("embodied_srpo").config) == []
    absolute = load_template("embodied_srpo", [f"warm_start.demo_store={tmp_path / 'd.zarr'}"]).config
    assert absolute_path_overrides(absolute) == []
    text = load_template("llm_grpo", ["text.train_file=prompts/train.jsonl", "text.test_file=~/test.jsonl"]).config
    assert sorted(absolute_path_overrides(text)) == [
        f'text.test_file="{(tmp_path.home() / "test.jsonl")}"', f'text.train_file="{tmp_path / "prompts/train.jsonl"}"']
