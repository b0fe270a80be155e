"""`vla-rl eval` end to end through the engine (Ray on loopback, a DAG worker, simulator actors)
on a tiny run written by the training code paths; run again, it redoes nothing. Its checkpoints,
held against the run's pruning while it reads them."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from devices import TEST_DEVICE_KIND, device_overrides
from safetensors.torch import load_file

from policies import make_policy
from policies.mlp import MLPPolicyConfig
from vla_rl.checkpoints import files as checkpoint
from vla_rl.cli import main
from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.driver import prepare_run_dir
from vla_rl.errors import RunStopped
from vla_rl.eval_driver import hold_checkpoints, prepare_eval_dir
from vla_rl.evaluation.embodied import checkpoint_step, load_checkpoint_weights
from vla_rl.evaluation.targets import EvalInputError
from vla_rl.utils.host import cpu_model
from vla_rl_core.dir_lock import release_directory

EVAL = [*device_overrides(num_workers=1), "workers.num_workers=1", "eval.num_episodes=2", "eval.video_episodes=1", "eval.video_size=32",
        "simulator.env.horizon=8", "simulator.num_cpus_per_actor=0"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A run directory as `vla-rl train` leaves it: its resolved template and two checkpoints."""
    return _tiny_run(tmp_path_factory.mktemp("outputs"))


def _tiny_run(out):
    run, _, _ = prepare_run_dir("embodied_srpo", [f"run.output_dir={out}", "run.name=tiny",
                                                  "policy.config.hidden_sizes=[8]"], resume=None)
    run.close()
    run_dir = run.path
    policy = make_policy("mlp", MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)))
    for step in (1, 2):
        torch.manual_seed(step)
        for parameter in policy.parameters():
            torch.nn.init.normal_(parameter, std=0.3)
        checkpoint.save_checkpoint(run_dir / "checkpoints", step, rank=0, model=policy)
        checkpoint.finalize_checkpoint(run_dir / "checkpoints", step)
    return run_dir


@pytest.fixture(scope="module")
def evaluated(ray_on_loopback, tiny_run):
    assert main(["eval", str(tiny_run), *EVAL]) == 0
    return tiny_run / "eval"


@pytest.mark.xdist_group("test_eval_command.tiny_run")
def test_eval_command_reports_every_checkpoint(evaluated):
    eval_dir = evaluated
    report = json.loads((eval_dir / "report.json").read_text())
    rows = report["results"]
    assert [(r["checkpoint_step"], r["protocol"]) for r in rows] == [
        (1, "greedy"), (1, "sampled@1"), (2, "greedy"), (2, "sampled@1")]
    assert all(r["episodes"] == 2 and 1 <= r["mean_episode_length"] <= 8 for r in rows)
    assert all(r["ci_low"] <= r["success_rate"] <= r["ci_high"] for r in rows)
    assert report["protocol"]["episodes_per_task"] == 2
    ids = report["protocol"]["init_state_ids"]  # both ends inclusive in both reports: 2 episodes
    assert ids["last"] - ids["first"] == 1 and f"initial states {ids['first']} .. {ids['last']} " in \
        (eval_dir / "report.md").read_text()
    assert 0 < report["protocol"]["driver_max_reply_bytes"] < 2_000  # counts only, never episodes
    assert "| 2 | sampled@1 | robosuite_lift |" in (eval_dir / "report.md").read_text()
    # the machine the episodes ran on, as the worker saw it (vla_rl/utils/host.py): this one, on CUDA its GPU
    [host] = report["protocol"]["hosts"]
    assert (host["cpu"], host["cpu_flags"]) == cpu_model() and host["torch"] == torch.__version__
    assert host["gpu"] == (torch.cuda.get_device_name(0) if TEST_DEVICE_KIND == "cuda" else None)
    assert (report["protocol"]["host_episodes"], report["protocol"]["hosts_unrecorded"]) == ([8], 0)
    assert f"- machine: {host['cpu']} (flags {host['cpu_flags']}" in (eval_dir / "report.md").read_text()
    assert (eval_dir / "success_vs_checkpoint.png").stat().st_size > 0
    videos = report["videos"]
    assert videos and all((eval_dir / v["file"]).stat().st_size > 0 for v in videos)
    assert all(v["stored_success"] == v["replayed_success"] for v in videos)
    store = TrajectoryStore.open(eval_dir / "episodes" / "robosuite_lift" / "rank0.zarr", read_only=True)
    assert len(store) == 8 and store.attrs["hosts"] == [host]  # each episode names it (its "host" scalar)
    assert store.read_scalars()["host"].tolist() == [0] * 8


@pytest.mark.slow
@pytest.mark.xdist_group("test_eval_command.tiny_run")
def test_eval_command_again_redoes_nothing(evaluated, tiny_run, tmp_path, monkeypatch, capsys):
    import shutil

    import vla_rl.workers.group as group_module

    # on a copy: the module's run's report stays as the other tests read it
    run_dir = tmp_path / "tiny"
    shutil.copytree(tiny_run, run_dir)
    rows = json.loads((evaluated / "report.json").read_text())["results"]
    capsys.readouterr()
    # every episode is stored already: no DAG worker starts (it took 35 s on this 2-core machine)
    monkeypatch.setattr(group_module.WorkerGroup, "launch", lambda *a, **k: pytest.fail("workers were launched"))
    assert main(["eval", str(run_dir), *EVAL]) == 0
    assert "every planned episode is stored already" in capsys.readouterr().out
    assert len(TrajectoryStore.open(run_dir / "eval" / "episodes" / "robosuite_lift" / "rank0.zarr",
                                    read_only=True)) == 8
    again = json.loads((run_dir / "eval" / "report.json").read_text())
    assert again["results"] == rows
    # the machine of the 8 episodes, stored by the first evaluation, named once
    assert (again["protocol"]["hosts"], again["protocol"]["host_episodes"]) == (
        json.loads((evaluated / "report.json").read_text())["protocol"]["hosts"], [8])
    # a selection that leaves checkpoints out would drop their rows from this report: another --output
    assert main(["eval", str(run_dir), *EVAL, "--steps", "2"]) == 2
    assert "its report would drop rows of that one's; name another --output" in capsys.readouterr().err


@pytest.mark.xdist_group("test_eval_command.tiny_run")
def test_videos_an_interrupted_evaluation_did_not_make_are_made_by_the_same_command(evaluated, tiny_run, tmp_path,
                                                                                    capsys):
    """Stopped while rank 0 rendered the videos (its last episode stored), an evaluation had every
    episode and no videos, and the same command again found no rollout to run: it never made them."""
    import shutil

    run_dir = tmp_path / "tiny"
    shutil.copytree(tiny_run, run_dir)
    videos = run_dir / "eval" / "videos"
    made = sorted(p.relative_to(videos) for p in videos.rglob("*.mp4"))
    assert made
    shutil.rmtree(videos)
    capsys.readouterr()
    assert main(["eval", str(run_dir), *EVAL]) == 0
    assert "rendering the videos the evaluation has not made yet" in " ".join(capsys.readouterr().out.split())
    assert sorted(p.relative_to(videos) for p in videos.rglob("*.mp4")) == made
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    assert report["videos"] and report["results"] == json.loads((evaluated / "report.json").read_text())["results"]
    assert main(["eval", str(run_dir), *EVAL]) == 0  # now nothing is left to do
    assert "every planned episode is stored already: no rollout to run" in " ".join(capsys.readouterr().out.split())


@pytest.mark.xdist_group("test_eval_command.tiny_run")
def test_eval_of_a_missing_step_is_a_one_line_error(tiny_run, capsys):
    assert main(["eval", str(tiny_run), "--steps", "7"]) == 2
    assert "no checkpoint of step(s) [7]" in capsys.readouterr().err


@pytest.mark.xdist_group("test_eval_command.tiny_run")
def test_a_damaged_store_is_refused_then_set_aside_and_its_episodes_run_again(evaluated, tiny_run, tmp_path, capsys):
    """A truncated chunk of an evaluated run's store: `vla-rl eval` refuses in one line naming the
    store and the array, keeps the report; moved aside as the message says, the same command runs
    the store's episodes again and reports the same figures."""
    import shutil

    run_dir = tmp_path / "tiny"
    shutil.copytree(tiny_run, run_dir)
    eval_dir, store = run_dir / "eval", run_dir / "eval" / "episodes" / "robosuite_lift" / "rank0.zarr"
    chunk = store / "length" / "c" / "3"
    chunk.write_bytes(chunk.read_bytes()[:8])
    report = (eval_dir / "report.json").read_bytes(), (eval_dir / "report.md").read_bytes()
    assert main(["eval", str(run_dir), *EVAL]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"evaluation store {store} is damaged: array 'length', episode 3 (chunk length/c/3)" in err
    assert ((eval_dir / "report.json").read_bytes(), (eval_dir / "report.md").read_bytes()) == report
    command = err[err.index("mv "):].split()
    assert command == ["mv", str(store), f"{store}.damaged"]
    store.rename(command[2])
    assert main(["eval", str(run_dir), *EVAL]) == 0
    assert len(TrajectoryStore.open(store, read_only=True)) == 8
    rows = json.loads(report[0])["results"]
    again = json.loads((eval_dir / "report.json").read_text())["results"]
    assert [{k: r[k] for k in ("checkpoint_step", "protocol", "episodes")} for r in again] == [
        {k: r[k] for k in ("checkpoint_step", "protocol", "episodes")} for r in rows]


@pytest.mark.xdist_group("test_eval_command.tiny_run")
def test_a_refused_override_writes_nothing_into_the_output(tiny_run, tmp_path, capsys):
    """The evaluation's template was written into --output before its overrides were checked: a
    typo replaced the template.yaml of whatever directory --output named."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "template.yaml").write_text("name: mine\n")
    assert main(["eval", str(tiny_run), "eval.num_episodes=abc", "--output", str(victim)]) == 2
    err = capsys.readouterr().err  # named as typed, not as a file the user never wrote
    assert "error: field 'eval.num_episodes': " in err and "(override 'eval.num_episodes=abc')" in err
    assert (victim / "template.yaml").read_text() == "name: mine\n"
    assert main(["eval", str(tiny_run), "eval.num_episodes=abc", "--output", str(tmp_path / "new")]) == 2
    assert not (tmp_path / "new").exists()


@pytest.mark.xdist_group("test_eval_command.tiny_run")
def test_output_that_is_a_file_or_a_training_run_is_refused(tiny_run, tmp_path, capsys):
    template = (tiny_run / "template.yaml").read_text()
    assert main(["eval", str(tiny_run), "--output", str(tiny_run)]) == 2
    assert "is a training run's directory (it holds checkpoints/)" in capsys.readouterr().err
    assert (tiny_run / "template.yaml").read_text() == template
    (tmp_path / "file").write_text("x")
    assert main(["eval", str(tiny_run), "--output", str(tmp_path / "file")]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main(["eval", str(tiny_run), "--output", str(tmp_path / "file" / "eval")]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --output {tmp_path / 'file' / 'eval'} cannot be created: "
                                               f"{tmp_path / 'file'} is not a directory")
    assert main(["eval", str(tiny_run), "--output", "/proc/vla_rl_eval"]) == 2  # only the write fails there
    assert capsys.readouterr().err.startswith("error: --output /proc/vla_rl_eval cannot be created: ")


@pytest.mark.xdist_group("test_eval_command.tiny_run")
def test_a_truncated_checkpoint_is_refused_before_ray_starts(tiny_run, tmp_path, capsys, monkeypatch):
    import shutil

    import ray

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    weights = run / "checkpoints" / "step_00000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: pytest.fail("Ray started"))
    assert main(["eval", str(run), "--output", str(tmp_path / "eval")]) == 2
    assert "model.safetensors has 100 bytes" in capsys.readouterr().err
    assert not (tmp_path / "eval").exists()


@pytest.mark.xdist_group("test_eval_command.tiny_run")
def test_a_policy_override_that_does_not_fit_the_checkpoints_is_refused_before_ray_starts(tiny_run, tmp_path, capsys,
                                                                                           monkeypatch):
    """It failed in the workers' strict load, a Ray traceback of ~90 lines after the simulators
    started (an audit); a resume with it was refused in one line already."""
    import ray

    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: pytest.fail("Ray started"))
    assert main(["eval", str(tiny_run), "policy.config.hidden_sizes=[64]", "--output", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err
    message = " ".join(err.split())
    assert len(err.strip().splitlines()) == 1 and "policy.config.hidden_sizes=[64]: the checkpoint " in message
    assert "step_00000001/model.safetensors does not fit the policy this override builds: " in message
    assert "mean_net.0.weight: (8, 15) in the checkpoint, (64, 15) in the model" in message
    assert "evaluate without it" in message and not (tmp_path / "eval").exists()


@pytest.mark.xdist_group("test_eval_command.tiny_run")
def test_a_run_whose_base_model_moved_is_looked_for_where_the_command_says(tiny_run, tmp_path, capsys):
    """`vla-rl eval RUN policy.config.model_path=NEW` (the base model moved since training) was
    refused naming the old place: the pretrained files were checked on the run's template alone."""
    from vla_rl.export import export_checkpoint

    base = export_checkpoint(tiny_run / "checkpoints" / "step_00000002", tmp_path / "base")
    run, _, _ = prepare_run_dir("embodied_srpo", [f"run.output_dir={tmp_path}", "run.name=from_base",
                                                  f"policy.config.model_path={base}", "policy.config.hidden_sizes=[8]"],
                                resume=None)
    run.close()
    checkpoint.save_checkpoint(run.path / "checkpoints", 1, rank=0,
                               model=make_policy("mlp", MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,))))
    checkpoint.finalize_checkpoint(run.path / "checkpoints", 1)
    base.rename(tmp_path / "moved")
    capsys.readouterr()
    assert main(["eval", str(run.path), *EVAL]) == 2
    assert f"field 'policy.config.model_path': {base}/config.json is missing" in capsys.readouterr().err
    assert main(["eval", str(run.path), *EVAL, f"policy.config.model_path={tmp_path / 'elsewhere'}"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'elsewhere'}/config.json is missing" in err and str(base) not in err
    assert not (run.path / "eval").exists()


def test_the_checkpoints_evaluated_are_held_against_the_runs_pruning(tmp_path):
    run_dir = _tiny_run(tmp_path)
    root, holds = run_dir / "checkpoints", []
    prepare_eval_dir([str(run_dir)], EVAL, holds=holds)
    try:
        checkpoint.save_checkpoint(root, 3, rank=0)  # the run trains on while the evaluation reads
        checkpoint.finalize_checkpoint(root, 3, keep_last=1)
        assert [p.name for p in checkpoint.complete_checkpoints(root)] == ["step_00000001", "step_00000002",
                                                                            "step_00000003"]
    finally:
        for fd in holds:
            release_directory(fd)
    checkpoint.save_checkpoint(root, 4, rank=0)
    checkpoint.finalize_checkpoint(root, 4, keep_last=1)
    assert [p.name for p in checkpoint.complete_checkpoints(root)] == ["step_00000004"]
    taken = []
    with pytest.raises(EvalInputError, match=r"checkpoint .*step_00000003 was removed as the evaluation started"):
        hold_checkpoints([root / "step_00000004", root / "step_00000003"], taken)
    assert len(taken) == 1  # the one taken before, for the caller to release
    release_directory(taken[0])


def test_a_checkpoint_removed_while_the_evaluation_runs_stops_it_in_one_line(tmp_path):
    run_dir = _tiny_run(tmp_path)
    first, second = checkpoint.complete_checkpoints(run_dir / "checkpoints")
    policy = make_policy("mlp", MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)))
    assert checkpoint_step(first) == 1
    load_checkpoint_weights(second, policy, "lift")
    saved = load_file(second / "model.safetensors")
    assert all(torch.equal(value, saved[name]) for name, value in policy.state_dict().items())
    wide = make_policy("mlp", MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(16,)))
    with pytest.raises(ValueError, match=r"step_00000002 does not fit the run's policy for task 'lift'"):
        load_checkpoint_weights(second, wide, "lift")
    for file in second.iterdir():
        if file.suffix == ".safetensors":
            file.unlink()  # a hand's rm, or a prune on a file system without flock
    with pytest.raises(RunStopped, match=r"checkpoint .*step_00000002 was removed while the evaluation ran"):
        load_checkpoint_weights(second, policy, "lift")
    shutil.rmtree(first)
    with pytest.raises(RunStopped, match=r"checkpoint .*step_00000001 was removed while the evaluation ran"):
        checkpoint_step(first)
