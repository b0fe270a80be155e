"""Resumes that cannot continue a run exactly, through ``vla-rl train --resume``: each is refused
before Ray starts with one red line naming the setting (or the overrides, or the directory) and
the checkpoint at fault, exit status 2, no traceback, and the run directory left byte for byte as
it was (no ``resumes.jsonl`` record either). The checkpoints are written by the checkpoint code
itself, from the runs' own policies, without running the workers."""

from __future__ import annotations

import pytest
import torch
from test_malformed_inputs import snapshot

from vla_rl import driver
from vla_rl.checkpoints import files as checkpoint
from vla_rl.cli import main
from vla_rl.driver import prepare_run_dir
from vla_rl_core.env_spec import EnvSpec

# The arithmetic splits that text runs generate: written once per session (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("generated_prompts_once")

#: (case, run directory (a key of the ``runs`` fixture), CLI arguments after ``train``, texts the
#: error line must contain); ``{run}`` is the run directory, ``{other_lm}`` a model of another width.
RESUME_CASES = [
    ("a model of another shape", "text", ["--resume", "{run}", "text.model_path={other_lm}"],
     ["text.model_path=", "does not fit the policy this override builds", "model.lm_head.weight: (", "step_00000002"]),
    ("adapters the checkpoint lacks", "text", ["--resume", "{run}", "policy.lora.rank=4"],
     ["policy.lora.rank=4: the run's checkpoint", "missing (model.model.layers.0.mlp.down_proj.base_layer.weight"]),
    ("a policy of another width", "srpo", ["--resume", "{run}", "trainer.total_steps=9",
                                           "policy.config.hidden_sizes=[64,64]"],
     ["error: policy.config.hidden_sizes=[64,64]: the run's checkpoint", "this override builds",  # not total_steps
      "mean_net.0.weight: (32, 15) in the checkpoint, (64, 15) in the model"]),
    ("the policy's width deleted", "srpo", ["--resume", "{run}", "~policy.config.hidden_sizes"],
     ["error: ~policy.config.hidden_sizes: the run's checkpoint", "this override builds",  # the default 256 wide
      "mean_net.0.weight: (32, 15) in the checkpoint, (256, 15) in the model"]),
    ("a sharded policy of another width", "fsdp", ["--resume", "{run}", "policy.config.hidden_sizes=[64,64]"],
     ["actor_sharded/.metadata does not fit the policy this override builds",
      "mean_net.0.weight: (32, 15) in the checkpoint, (64, 15) in the model"]),
    ("more generated prompts", "text", ["--resume", "{run}", "text.num_generated_train=500"],
     ["field 'text.num_generated_train'", "the run has 8000, this resume 500", "wrote its arithmetic splits",
      "resume without the override, or start a new run"]),
    ("another warm-start rate", "text", ["--resume", "{run}", "text.sft_lr=0.1"],
     ["field 'text.sft_lr'", "this resume 0.1; the warm start ran when the run started", "step_00000002"]),
    ("more demonstrations", "srpo", ["--resume", "{run}", "warm_start.bc_steps=7"],
     ["field 'warm_start.bc_steps'", "this resume 7; the warm start ran when the run started"]),
    ("a value of the wrong type", "srpo", ["--resume", "{run}", "trainer.lr=abc"],  # the override, not the file, named
     ["template.yaml: field 'trainer.lr': input should be a valid number", "(override 'trainer.lr=abc')"]),
    ("no checkpoint", "empty", ["--resume", "{run}"],
     ["has no checkpoint to resume from", "start a new run instead"]),
    ("fewer workers", "srpo", ["--resume", "{run}", "workers.num_workers=1"],
     ["field 'workers.num_workers'", "written by 2 workers, this resume would start 1",
      "resume with workers.num_workers=2"]),
    ("more workers", "srpo", ["--resume", "{run}", "workers.num_workers=4"],
     ["field 'workers.num_workers'", "written by 2 workers, this resume would start 4"]),
    ("another strategy", "srpo", ["--resume", "{run}", "trainer.strategy=fsdp"],
     ["field 'trainer.strategy'", "resume with trainer.strategy=ddp"]),
    ("no such run directory", "missing", ["llm_grpo", "--resume", "{run}"],
     ["is not a run directory: there is no such directory"]),
    ("no template.yaml", "bare", ["llm_grpo", "--resume", "{run}"],
     ["is not a run directory: it has no template.yaml"]),
]


def write_checkpoint(run, policy, trainer, step: int = 2, ranks: int = 2) -> None:
    """The checkpoint of ``step`` that ``ranks`` workers would write: the policy's weights and the
    optimizer (rank 0's files under DDP; the sharded actor state under ``trainer.strategy:
    fsdp``, here from a one-process group), every rank's RNG states, a manifest."""
    from vla_rl.trainers.actor import ActorTrainer

    root = run.path / "checkpoints"
    sharded = trainer.strategy == "fsdp"
    if sharded:
        ActorTrainer(policy, lr=1e-3, trainer=trainer).save_sharded(checkpoint.staging_dir(root, step))
    for rank in range(ranks):
        checkpoint.save_checkpoint(root, step, rank=rank, model=policy if rank == 0 and not sharded else None,
                                   optimizer=torch.optim.Adam(policy.parameters()) if rank == 0 and not sharded
                                   else None, generator=torch.Generator(), metadata={})
    checkpoint.finalize_checkpoint(root, step)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_lm_dir, process_group):
    """Run directories as runs leave them: ``srpo`` (MLP of width 32, robosuite Lift, 2 workers),
    ``fsdp`` (the same under trainer.strategy fsdp) and ``text`` (the tiny LM) with a checkpoint of
    step 2, ``empty`` without one; ``missing`` does not exist, ``bare`` has no template.yaml;
    ``other_lm`` is a tiny LM of another width."""
    from policies.causal_lm.tiny import TinyQwen2Spec, write_tiny_checkpoint
    from vla_rl.workflows.embodied import robot_policy
    from vla_rl.workflows.text import causal_lm_policy

    out = tmp_path_factory.mktemp("outputs")
    for name, strategy in (("srpo", "ddp"), ("fsdp", "fsdp")):
        run, template, _ = prepare_run_dir("embodied_srpo", [f"run.output_dir={out}", f"run.name={name}",
                                                             "policy.config.hidden_sizes=[32,32]",
                                                             f"trainer.strategy={strategy}"], None)
        run.close()
        config = template.config
        lift = EnvSpec(obs_dim=15, action_dim=7, horizon=50)  # Lift's state and action sizes
        write_checkpoint(run, robot_policy(config, lift), config.trainer)
    text, template, _ = prepare_run_dir("llm_grpo", [f"run.output_dir={out}", "run.name=text",
                                                     f"text.model_path={tiny_lm_dir}"], None)
    text.close()
    write_checkpoint(text, causal_lm_policy(template.config, tiny_lm_dir), template.config.trainer)
    empty, _, _ = prepare_run_dir("embodied_srpo", [f"run.output_dir={out}", "run.name=empty"], None)
    empty.close()
    (out / "bare").mkdir()
    wide = TinyQwen2Spec(hidden_size=96, intermediate_size=192)
    return {"srpo": out / "srpo", "fsdp": out / "fsdp", "text": text.path, "empty": empty.path,
            "missing": out / "missing", "bare": out / "bare",
            "other_lm": write_tiny_checkpoint(tmp_path_factory.mktemp("wide_lm"), wide)}


@pytest.mark.parametrize(("case", "run", "args", "expected"), RESUME_CASES, ids=[c[0] for c in RESUME_CASES])
@pytest.mark.xdist_group("test_malformed_resumes.runs")
def test_a_resume_that_cannot_continue_exactly_is_refused_before_ray(case, run, args, expected, runs, monkeypatch,
                                                                      capsys):
    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started")

    monkeypatch.setattr(driver, "start_ray", no_ray)
    path = runs[run]
    before = snapshot(path) if path.exists() else None
    status = main(["train", *(arg.format(run=path, **runs) for arg in args)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    message = " ".join(err.split())
    assert "Traceback" not in err and str(path) in message, err
    for text in expected:
        assert text in message, (text, message)
    assert (snapshot(path) if path.exists() else None) == before  # nothing written, nothing created


@pytest.mark.xdist_group("test_malformed_resumes.runs")
def test_a_resume_that_fits_its_checkpoint_is_accepted(runs, tiny_lm_dir):
    """The same settings as the checkpoint's, given again, pass the checks (and record nothing yet)."""
    for run, overrides in (("srpo", ["policy.config.hidden_sizes=[32,32]", "workers.num_workers=2"]),
                           ("text", [f"text.model_path={tiny_lm_dir}", "text.temperature=0.5",
                                      "text.num_generated_train=8000"])):
        before = snapshot(runs[run])
        resumed, _, _ = prepare_run_dir(None, overrides, str(runs[run]))
        resumed.close()
        assert snapshot(runs[run]) == before


@pytest.mark.parametrize(("override", "field", "values"), [
    ("policy.config.activation=relu", "policy.config.activation", "has 'tanh', this resume 'relu'"),
    ("policy.config.learn_std=false", "policy.config.learn_std", "has True, this resume False"),
])
@pytest.mark.xdist_group("test_malformed_resumes.runs")
def test_a_resume_that_changes_the_policy_but_fits_its_tensors_is_refused(override, field, values, runs, monkeypatch,
                                                                           capsys):
    """Same tensor names and shapes, another policy: ReLU over weights trained through tanh (it
    trained on, silently), a fixed std (the workers failed on the optimizer state, in a Ray
    traceback). Where a pretrained checkpoint lives (policy.config.model_path) may still change, and
    a setting given again with its value is no change (the test above)."""
    monkeypatch.setattr(driver, "start_ray", lambda *args, **kwargs: pytest.fail("Ray started"))
    before = snapshot(runs["srpo"])
    assert main(["train", "--resume", str(runs["srpo"]), override]) == 2
    err = capsys.readouterr().err
    message = " ".join(err.split())
    assert len(err.strip().splitlines()) == 1 and f"field '{field}'" in message and values in message, err
    assert "resume without the override, or start a new run" in message
    assert snapshot(runs["srpo"]) == before


@pytest.mark.xdist_group("test_malformed_resumes.runs")
def test_a_finished_run_has_nothing_to_resume_an_unfinished_final_evaluation_has(runs, tmp_path, monkeypatch, capsys):
    """A run whose summary.json is written and whose checkpoint is at trainer.total_steps: refused,
    naming trainer.total_steps (it ran the final evaluation again and logged it twice). Without
    the summary (killed during its final evaluation) the resume is accepted: it ends that evaluation;
    so is a resume with an earlier leg's summary, of an earlier step (a resume killed so was refused
    as finished, and its final evaluation and summary never came)."""
    import shutil

    monkeypatch.setattr(driver, "start_ray", lambda *args, **kwargs: pytest.fail("Ray started"))
    run = shutil.copytree(runs["srpo"], tmp_path / "srpo")
    resumed, _, _ = prepare_run_dir(None, ["trainer.total_steps=2"], str(run))  # checkpoint step 2, no summary
    resumed.close()
    (run / "summary.json").write_text('{"last_step": 1}')  # an earlier leg's, then interrupted in its final evaluation
    resumed, _, _ = prepare_run_dir(None, ["trainer.total_steps=2"], str(run))  # accepted: it ends that evaluation
    resumed.close()
    (run / "summary.json").write_text('{"last_step": 2}')
    before = snapshot(run)
    assert main(["train", "--resume", str(run), "trainer.total_steps=2"]) == 2
    message = " ".join(capsys.readouterr().err.split())
    assert "field 'trainer.total_steps'" in message and "the run finished" in message
    assert "raise it to train on, e.g. trainer.total_steps=4" in message
    assert snapshot(run) == before
    resumed, _, _ = prepare_run_dir(None, ["trainer.total_steps=3"], str(run))  # more steps: accepted
    resumed.close()


@pytest.mark.xdist_group("test_malformed_resumes.runs")
def test_a_run_that_spent_its_environment_step_budget_has_nothing_to_resume(runs, tmp_path, monkeypatch, capsys):
    """A run stopped by trainer.total_env_steps (summary.json written, its checkpoint before
    trainer.total_steps): refused, naming trainer.total_env_steps; it used to train one more step
    and log a second final evaluation. A larger budget is accepted."""
    import json
    import shutil

    monkeypatch.setattr(driver, "start_ray", lambda *args, **kwargs: pytest.fail("Ray started"))
    run = shutil.copytree(runs["srpo"], tmp_path / "srpo")  # checkpoint step 2
    records = [{"step": 1, "rollout/total_env_steps": 600.0}, {"step": 2, "rollout/total_env_steps": 1250.0},
               {"step": 2, "eval/greedy/success_rate": 0.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "summary.json").write_text('{"last_step": 2}')
    before = snapshot(run)
    assert main(["train", "--resume", str(run), "trainer.total_steps=9", "trainer.total_env_steps=1200"]) == 2
    message = " ".join(capsys.readouterr().err.split())
    assert "field 'trainer.total_env_steps'" in message and "the run finished" in message
    assert "after 1250 environment steps" in message and "e.g. trainer.total_env_steps=2500" in message
    assert snapshot(run) == before
    resumed, _, _ = prepare_run_dir(None, ["trainer.total_steps=9", "trainer.total_env_steps=1300"], str(run))
    resumed.close()



@pytest.mark.parametrize("damage, named", [
    (lambda ckpt: (ckpt / "optimizer.json").unlink(), "optimizer.json is missing"),
    (lambda ckpt: (ckpt / "model.safetensors").write_bytes(b"\0" * 8), "model.safetensors"),
])
@pytest.mark.xdist_group("test_malformed_resumes.runs")
def test_a_resume_whose_every_checkpoint_is_damaged_is_refused_before_ray(damage, named, runs, tmp_path, monkeypatch,
                                                                        capsys):
    """A checkpoint missing a file or truncated, and no older one: the workers failed on it after
    Ray had started. With an older intact checkpoint the resume is accepted: the workers resume
    from it and set the damaged one aside (README, Resume)."""
    import shutil

    monkeypatch.setattr(driver, "start_ray", lambda *args, **kwargs: pytest.fail("Ray started"))
    run = shutil.copytree(runs["srpo"], tmp_path / "srpo")
    damage(run / "checkpoints" / "step_00000002")
    before = snapshot(run)
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    message = " ".join(err.split())
    assert len(err.strip().splitlines()) == 1 and "no checkpoint of" in message and named in message, err
    assert snapshot(run) == before
    shutil.copytree(runs["srpo"] / "checkpoints" / "step_00000002", run / "checkpoints" / "step_00000001")
    resumed, _, _ = prepare_run_dir(None, [], str(run))
    resumed.close()


@pytest.mark.xdist_group("test_malformed_resumes.runs")
def test_a_damaged_metrics_line_is_refused_before_ray(runs, tmp_path, monkeypatch, capsys):
    """A damaged line of metrics.jsonl before its last stopped the resume after Ray and the workers
    had started, with a traceback, and the resume's overrides were recorded in resumes.jsonl."""
    import json
    import shutil

    monkeypatch.setattr(driver, "start_ray", lambda *args, **kwargs: pytest.fail("Ray started"))
    run = shutil.copytree(runs["srpo"], tmp_path / "srpo")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "rollout/total_env_steps": 600.0}) + "\n{{\"step\": 2\n"
                                       + json.dumps({"step": 2, "rollout/total_env_steps": 1250.0}) + "\n")
    before = snapshot(run)
    assert main(["train", "--resume", str(run), "trainer.total_steps=9"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"{run / 'metrics.jsonl'}: line 2 is not a JSON record" in " ".join(err.split())
    assert "repair or delete that line, then resume" in " ".join(err.split())
    assert snapshot(run) == before
