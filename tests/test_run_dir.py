"""Run directories owned by one run: unique names, a lock, resumes that validate first, never
rewrite the run's template and record their overrides once the workers loaded the checkpoint with
them, and starts that fail before their first step leave no directory (vla_rl/run_dir.py,
vla_rl/driver.py)."""

from __future__ import annotations

import json
import multiprocessing

import pytest
import yaml

from vla_rl.dag.errors import TemplateError
from vla_rl.driver import prepare_run_dir
from vla_rl.run_dir import RunDirectory, RunDirError


def snapshot(directory):
    """Every file below ``directory`` (the lock's text aside) and its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def _new_run(out, *overrides):
    run, template, worker_overrides = prepare_run_dir("embodied_srpo", [f"run.output_dir={out}", *overrides], None)
    return run, template, worker_overrides


def test_an_existing_run_name_is_refused_and_left_alone(tmp_path):
    """Without a checkpoint there is nothing to resume: the refusal said to resume it, which the
    resume refused ("no checkpoint to resume from"), after the run itself had said "start it again"."""
    run, _, _ = _new_run(tmp_path, "run.name=mine")
    run.close()
    before = (run.path / "template.yaml").read_bytes()
    with pytest.raises(RunDirError, match=r"already exists and holds no checkpoint to resume from: remove it to start "
                                          "the run again under this name, or choose another run.name"):
        _new_run(tmp_path, "run.name=mine", "trainer.total_steps=7")
    assert (run.path / "template.yaml").read_bytes() == before
    assert sorted(p.name for p in run.path.iterdir()) == [".lock", "template.yaml"]
    step = run.path / "checkpoints" / "step_00000002"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text('{"step": 2, "metadata": {}}')
    with pytest.raises(RunDirError, match=r"already exists: continue it with `vla-rl train --resume"):
        _new_run(tmp_path, "run.name=mine", "trainer.total_steps=7")


def test_paths_that_cannot_be_run_directories_are_one_error_naming_the_field(tmp_path):
    """A file where run.output_dir goes, or a run.name under a missing directory: FileExistsError
    and FileNotFoundError tracebacks before."""
    (tmp_path / "a_file").write_text("mine")
    with pytest.raises(RunDirError, match="run.output_dir .*a_file cannot be made a directory") as refused:
        RunDirectory.create(tmp_path / "a_file", None, "embodied_grpo")
    assert refused.value.field == "run.output_dir" and (tmp_path / "a_file").read_text() == "mine"
    with pytest.raises(RunDirError, match="run.name 'missing/sub': .* cannot be made") as refused:
        RunDirectory.create(tmp_path, "missing/sub", "embodied_grpo")
    assert refused.value.field == "run.name"


@pytest.mark.parametrize("name", ["ro", None], ids=["named", "default-name"])
def test_an_output_dir_that_takes_no_new_directory_is_blamed_not_the_name(tmp_path, monkeypatch, name):
    """A read-only run.output_dir was reported as "field 'run.name': run.name 'ro': ... Read-only
    file system"; an unnamed run there was a traceback. (Simulated: this machine's tests run as
    root, whom permissions do not stop.)"""
    import errno
    from pathlib import Path

    make = Path.mkdir

    def read_only(self, *args, **kwargs):
        if self.parent == tmp_path:
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return make(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(RunDirError, match=f"run.output_dir {tmp_path}: the run directory .* cannot be made there: "
                                          "Read-only file system") as refused:
        RunDirectory.create(tmp_path, name, "embodied_grpo")
    assert refused.value.field == "run.output_dir"


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
    assert (run.path / ".lock").read_text() == ""  # a finished run's names no process (it kept the dead pid)
    process = multiprocessing.get_context("spawn").Process(target=_try_lock, args=(run.path, queue))
    process.start()
    process.join(60)
    assert queue.get(timeout=5) == "locked"


def test_a_run_going_on_before_its_first_checkpoint_is_refused_as_in_use(tmp_path):
    """A second start under the same name, or a resume, of a run still in its warm start (no
    checkpoint yet) said the run had stopped and to remove its directory."""
    import os

    run, _, _ = _new_run(tmp_path, "run.name=live")  # holds the lock, as the running driver does
    before = snapshot(run.path)
    in_use = rf"run directory {run.path} is in use by another process \(pid {os.getpid()}\): a run is going on there"
    with pytest.raises(RunDirError, match=in_use) as err:
        _new_run(tmp_path, "run.name=live")
    assert err.value.field == "run.name"
    with pytest.raises(RunDirError, match=in_use):
        prepare_run_dir(None, [], str(run.path))
    assert snapshot(run.path) == before
    run.close()
    with pytest.raises(RunDirError, match="already exists and holds no checkpoint to resume from"):
        _new_run(tmp_path, "run.name=live")


def test_a_run_directory_that_cannot_be_locked_is_one_error(tmp_path, monkeypatch):
    """On a read-only mount the lock file could not be opened: an OSError traceback."""
    import errno

    import vla_rl.run_dir as run_dir_module

    def read_only(path):
        raise OSError(errno.EROFS, "Read-only file system")

    run, _, _ = _new_run(tmp_path, "run.name=ro")
    run.close()
    monkeypatch.setattr(run_dir_module, "lock_directory", read_only)
    with pytest.raises(RunDirError, match=r"cannot be locked for this run \(\.lock: Read-only file system\)"):
        RunDirectory.reopen(run.path).lock()


def _checkpoint(run_dir, step=2, ranks=2):
    """A checkpoint's layout as the resume checks read it (the names of its files, each readable,
    as a checkpoint without a manifest is checked; no weights)."""
    import torch
    from safetensors.torch import save_file

    path = run_dir / "checkpoints" / f"step_{step:08d}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"step": step, "metadata": {}}))
    for rank in range(ranks):
        save_file({"state": torch.zeros(1)}, path / f"rng_rank{rank}.safetensors")
    return path


def test_resume_validates_first_and_changes_nothing(tmp_path):
    run, _, _ = _new_run(tmp_path, "run.name=r", "trainer.total_steps=2")
    run.close()
    _checkpoint(run.path)
    template_before = (run.path / "template.yaml").read_bytes()
    with pytest.raises(TemplateError, match="trainer.total_step"):
        prepare_run_dir(None, ["trainer.total_step=6"], str(run.path))  # a typo: nothing written
    assert sorted(p.name for p in run.path.iterdir()) == [".lock", "checkpoints", "template.yaml"]

    resumed, template, worker_overrides = prepare_run_dir(None, ["trainer.total_steps=6"], str(run.path))
    resumed.close()
    assert template.config.trainer.total_steps == 6 and worker_overrides == ["trainer.total_steps=6"]
    assert (run.path / "template.yaml").read_bytes() == template_before  # never rewritten
    assert yaml.safe_load(template_before)["config"]["trainer"]["total_steps"] == 2
    assert not (run.path / "resumes.jsonl").exists()  # recorded once the workers loaded the checkpoint


@pytest.mark.parametrize("override", ["run.name=other", "run.output_dir=/tmp/elsewhere"])
def test_a_resume_that_would_place_the_run_elsewhere_is_refused(tmp_path, override):
    """It trained on where the run is, and recorded the override for later resumes (an audit)."""
    run, _, _ = _new_run(tmp_path, "run.name=r", "trainer.total_steps=2")
    run.close()
    _checkpoint(run.path)
    with pytest.raises(RunDirError, match=rf"{override}: a resume continues {run.path} where it is") as refused:
        prepare_run_dir(None, ["trainer.total_steps=6", override], str(run.path))
    assert refused.value.field == override.split("=")[0]
    assert not (run.path / "resumes.jsonl").exists()


def test_resume_applies_the_recorded_overrides(tmp_path):
    run, _, _ = _new_run(tmp_path, "run.name=r", "trainer.total_steps=2")
    run.close()
    _checkpoint(run.path)
    run.record_resume(["trainer.total_steps=6"])
    again, template, worker_overrides = prepare_run_dir(None, ["eval.num_episodes=4"], str(run.path))
    again.close()
    assert template.config.trainer.total_steps == 6 and template.config.eval.num_episodes == 4
    assert worker_overrides == ["trainer.total_steps=6", "eval.num_episodes=4"]


@pytest.mark.parametrize("line", ["not json", '{"time": "t"}', '{"overrides": "trainer.total_steps=6"}', "[1, 2]"])
def test_a_damaged_resume_record_is_named_in_one_line(tmp_path, capsys, line):
    """A resumes.jsonl line that is no record stopped a resume, vla-rl eval and export with a
    JSONDecodeError or KeyError traceback."""
    from vla_rl.cli import main

    run, _, _ = _new_run(tmp_path, "run.name=r", "trainer.total_steps=2")
    run.close()
    _checkpoint(run.path)
    run.record_resume(["trainer.total_steps=4"])
    with (run.path / "resumes.jsonl").open("a") as records:
        records.write(line + "\n")
    with pytest.raises(RunDirError, match=r"resumes.jsonl: line 2 is not a resume record"):
        RunDirectory.reopen(run.path).recorded_overrides()
    assert main(["train", "--resume", str(run.path)]) == 2
    assert "resumes.jsonl: line 2 is not a resume record" in capsys.readouterr().err


class FakeWorkers:
    """Stands in for the DAG workers of :func:`vla_rl.driver.train` (no Ray): ``setup`` replies
    ``setup`` (rank 0's metrics) or raises it, every later call fails as a worker's error would."""

    max_reply_bytes = 0

    def __init__(self, setup) -> None:
        self.setup = setup

    def node_ids(self):
        return ["node", "node"]

    def hosts(self):
        return [{"cpu": "fake"}, {"cpu": "fake"}]

    def start_process_group(self) -> None:
        pass

    def call(self, method, *args):
        if method != "setup":
            raise RuntimeError(f"worker failed in {method}")
        if isinstance(self.setup, Exception):
            raise self.setup
        return [dict(self.setup), {}]

    def submit(self, method, *args):
        raise RuntimeError(f"worker failed in {method}")

    def rendering(self):
        return [[], []]

    def shutdown(self) -> None:
        pass

    def kill(self) -> None:
        pass


@pytest.fixture
def fake_workers(monkeypatch):
    """``set(setup)``: the next runs of ``train`` get :class:`FakeWorkers` (and start no Ray)."""
    from vla_rl import driver

    launched = []

    def use(setup):
        monkeypatch.setattr(driver, "start_ray", lambda config, world: "cpu")
        monkeypatch.setattr(driver.WorkerGroup, "launch",
                            lambda *args, **kwargs: launched.append(FakeWorkers(setup)) or launched[-1])
        return launched

    return use


def test_a_resume_is_recorded_only_once_the_workers_loaded_the_checkpoint(tmp_path, fake_workers):
    from vla_rl.driver import train

    run, _, _ = _new_run(tmp_path, "run.name=r", "eval.num_episodes=0")
    run.close()
    _checkpoint(run.path)
    fake_workers(RuntimeError("size mismatch for mean_net.0.weight"))  # the checkpoint does not load
    before = snapshot(run.path)
    with pytest.raises(RuntimeError, match="size mismatch"):
        train(None, ["trainer.total_steps=9"], resume=str(run.path))
    assert snapshot(run.path) == before  # no resumes.jsonl: the next resume does not inherit the override

    fake_workers({"start_step": 2.0})  # loaded; the first step fails
    with pytest.raises(RuntimeError, match="worker failed in run_step"):
        train(None, ["trainer.total_steps=9"], resume=str(run.path))
    records = [json.loads(line) for line in (run.path / "resumes.jsonl").read_text().splitlines()]
    assert [record["overrides"] for record in records] == [["trainer.total_steps=9"]]
    # the machines of the group that loaded it; the run's start before it recorded none (its checkpoint)
    hosts = [json.loads(line)["hosts"] for line in (run.path / "hosts.jsonl").read_text().splitlines()]
    assert hosts == [None, [{"cpu": "fake"}, {"cpu": "fake"}]]
    assert RunDirectory.reopen(run.path).recorded_hosts() == ([{"cpu": "fake"}], True)


def test_every_start_of_a_run_records_its_machines(tmp_path):
    """A run resumed on another machine names both (a seed's figures depend on the machine:
    vla_rl/utils/host.py); the same machine again is named once."""
    run, _, _ = _new_run(tmp_path, "run.name=r")
    assert run.recorded_hosts() == ([], False)
    run.record_hosts([{"cpu": "a"}, {"cpu": "a"}])  # a new run: no progress yet, nothing unknown
    _checkpoint(run.path)
    run.record_hosts([{"cpu": "b"}, {"cpu": "a"}])  # resumed, one rank elsewhere
    run.record_hosts([{"cpu": "a"}, {"cpu": "a"}])
    assert run.recorded_hosts() == ([{"cpu": "a"}, {"cpu": "b"}], False)
    run.close()


def test_a_start_that_fails_before_its_first_step_leaves_nothing(tmp_path, fake_workers, capsys):
    from vla_rl.driver import train

    command = ["embodied_srpo", [f"run.output_dir={tmp_path}", "run.name=first"]]
    fake_workers(RuntimeError("worker setup failed"))
    for _ in range(2):  # the same command again: not refused for an existing run.name
        with pytest.raises(RuntimeError, match="worker setup failed"):
            train(*command)
        assert not (tmp_path / "first").exists()
        assert "removed the run directory" in " ".join(capsys.readouterr().out.split())


def test_a_start_that_fails_after_step_0_wrote_metrics_keeps_its_directory(tmp_path, fake_workers, capsys):
    """Kept for its metrics, saying that it cannot be resumed and what to do to run it again (the
    same command was refused: 'already exists and holds no checkpoint', with no word when kept)."""
    from vla_rl.driver import train

    fake_workers({"start_step": 0.0, "warm_start/bc_loss": 0.5})  # warm-started; the first evaluation fails
    with pytest.raises(RuntimeError, match="worker failed in"):
        train("embodied_srpo", [f"run.output_dir={tmp_path}", "run.name=kept"])
    assert (f"kept the run directory {tmp_path / 'kept'} for the metrics it wrote; it holds no checkpoint to resume "
            "from: remove it to start the run again under this name") in " ".join(capsys.readouterr().out.split())
    records = [json.loads(line) for line in (tmp_path / "kept" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 0 and records[0]["warm_start/bc_loss"] == 0.5
    assert RunDirectory.reopen(tmp_path / "kept").recorded_hosts() == ([{"cpu": "fake"}], False)


def test_resume_of_something_that_is_not_a_run(tmp_path):
    with pytest.raises(RunDirError, match="is not a run directory: it has no template.yaml"):
        prepare_run_dir(None, [], str(tmp_path))


def test_a_checkpoints_environment_step_count_is_what_a_resume_counts_from(tmp_path):
    """The count a checkpoint records (trainer_state.json's run state); an older checkpoint's, from
    metrics.jsonl. metrics.jsonl alone lost the steps of metric lines a crash did not flush."""
    from vla_rl.run_dir import checkpoint_env_steps

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "rollout/total_env_steps": 600.0}) + "\n")  # step 2's line lost
    for name, metadata, expected in (("step_00000002", {"run": {"env_steps": 1250.0}}, 1250.0),
                                     ("step_00000003", {}, 600.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "trainer_state.json").write_text(json.dumps({"step": int(name[5:]), "metadata": metadata}))
        assert checkpoint_env_steps(tmp_path / name, metrics) == expected
