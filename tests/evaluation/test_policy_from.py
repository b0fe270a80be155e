"""`vla-rl eval --policy-from TEMPLATE`: the policy a training template builds, evaluated before
any training (a published checkpoint through ``policy.config.model_path``), here a tiny
OpenVLA-OFT with OFT's L1-regression head saved in the published layout, which no training
template can train and `vla-rl eval` of a run's checkpoints could therefore not reach."""

from __future__ import annotations

import json

import pytest
import torch
from devices import device_overrides

from vla_rl.cli import main
from vla_rl.dag.loader import load_template
from vla_rl.dag.registry import WORKFLOWS
from vla_rl.eval_driver import prepare_eval_dir

TEMPLATE = "embodied_srpo_oft_lift"


def _model_dir(path, seed: int):
    """A tiny OFT with the L1 head, as the template configures it, saved in the published layout."""
    config = load_template(TEMPLATE, ["policy.config.action_head=l1_regression"]).config
    torch.manual_seed(seed)
    policy = WORKFLOWS.get("embodied").standalone_policy(config, path.parent / f"scratch_{seed}")
    out = policy.save_pretrained(path)
    policy.tokenizer.save_pretrained(str(out))
    return out, policy


@pytest.fixture(scope="module")
def oft_l1(tmp_path_factory):
    return _model_dir(tmp_path_factory.mktemp("models") / "oft_l1", seed=0)


def _overrides(model_dir) -> list[str]:
    return ["policy.config.architecture=null", f"policy.config.model_path={model_dir}",
            "policy.config.action_head=l1_regression", "eval.protocols=[greedy]"]


def test_the_evaluation_builds_the_saved_policy_and_evaluates_it_as_step_0(oft_l1, tmp_path, monkeypatch):
    model_dir, saved = oft_l1
    monkeypatch.chdir(tmp_path)
    eval_dir, loaded, run_dir = prepare_eval_dir([], _overrides(model_dir), policy_from=TEMPLATE)
    assert run_dir is None and eval_dir == tmp_path / "outputs" / "eval_oft_l1"  # named after the model directory
    config = loaded.config
    assert config.eval.checkpoints == [] and config.eval.store_episodes  # the workers' live policy, stored
    assert config.warm_start.num_demos == 0
    built = WORKFLOWS.get("embodied").standalone_policy(config, tmp_path / "scratch")
    got, expected = _fold_cls_position(built.state_dict()), _fold_cls_position(saved.state_dict())
    assert sorted(got) == sorted(expected)
    assert all(torch.equal(tensor, expected[name]) for name, tensor in got.items())


def _fold_cls_position(state: dict) -> dict:
    """The state with the DINOv2 tower's CLS position added into its CLS token, as the published
    (timm) layout stores it (policies/openvla/checkpoint_prismatic.py): the CLS input
    ``cls + pos_0`` is what the tower computes with."""
    prefix = "vla.vision_backbone.featurizer.model.embeddings."
    state = dict(state)
    position = state[prefix + "position_embeddings"]
    state[prefix + "cls_token"] = state[prefix + "cls_token"] + position[:, :1]
    state[prefix + "position_embeddings"] = torch.cat([torch.zeros_like(position[:, :1]), position[:, 1:]], dim=1)
    return state


def test_refusals_name_what_is_wrong_before_anything_is_written(oft_l1, tmp_path, capsys):
    model_dir, _ = oft_l1
    out = tmp_path / "eval"
    cases = [
        (["eval", str(tmp_path), "--policy-from", TEMPLATE], "name no run or checkpoint directory"),
        (["eval", "--steps", "5", "--policy-from", TEMPLATE], "--steps selects a run's checkpoints"),
        (["eval", "--policy-from", "llm_grpo"], "template llm_grpo is a text template"),
        (["eval", "--policy-from", TEMPLATE, *_overrides(tmp_path / "missing")],
         f"error: field 'policy.config.model_path': {tmp_path / 'missing'}"),  # the file read, not one to be written
        (["eval"], "(or --policy-from TEMPLATE)"),
        (["eval", "--policy-from", "eval_rollout"], "that is vla-rl eval's own template; name the training template"),
        (["eval", "--policy-from", TEMPLATE, *_overrides(model_dir), "warm_start.num_demos=5"],
         "warm_start.num_demos: vla-rl eval runs no warm start"),
        (["eval", "--policy-from", TEMPLATE, "algorithm.reward=binary_success"],
         "algorithm.reward: vla-rl eval runs no training algorithm"),
        (["eval", "--policy-from", TEMPLATE, "~warm_start"], "~warm_start: vla-rl eval runs no warm start"),
        (["eval", "--policy-from", TEMPLATE, "trainer.total_steps=5"],
         "trainer.total_steps: vla-rl eval runs no training (it reads trainer.strategy, trainer.mixed_precision, "
         "trainer.fsdp only)"),
        (["eval", "--policy-from", TEMPLATE, "critic.lr=0.1"], "critic.lr: vla-rl eval runs no critic"),
        # the sampled protocol of vla-rl eval's template: it named eval/template.yaml, which was never written
        (["eval", "--policy-from", TEMPLATE, *_overrides(model_dir)[:-1]],
         "dag_templates/eval_rollout.yaml: node 'eval_rollout': field 'eval.protocols': the 'sampled' protocol"),
    ]
    for argv, message in cases:
        assert main([*argv, "--output", str(out)]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()


def test_an_evaluation_directory_of_another_policy_is_refused(oft_l1, tmp_path, capsys):
    """Continuing an evaluation pools its stored episodes with the new ones: those of another
    model directory would be counted as this one's."""
    model_dir, _ = oft_l1
    other, _ = _model_dir(tmp_path / "other_oft", seed=1)
    out = tmp_path / "eval"
    prepare_eval_dir([], _overrides(model_dir), output=str(out), policy_from=TEMPLATE)
    written = (out / "template.yaml").read_text()
    assert main(["eval", "--policy-from", TEMPLATE, *_overrides(other), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out} holds an evaluation of another policy (policy.config.model_path: '{model_dir}' there, " in err
    assert (out / "template.yaml").read_text() == written
    prepare_eval_dir([], _overrides(model_dir), output=str(out), policy_from=TEMPLATE)  # the same one continues
    assert main(["eval", "--policy-from", TEMPLATE, *_overrides(model_dir), "run.seed=1", "--output", str(out)]) == 2
    assert f"{out} holds an evaluation under run.seed 0, here 1" in capsys.readouterr().err


def test_a_relative_model_path_is_stored_absolute(oft_l1, tmp_path, monkeypatch, capsys):
    """`model_path=oft/` names another model in another working directory: stored as given, two
    models' episodes were pooled in one evaluation directory."""
    import shutil

    model_dir, _ = oft_l1
    shutil.copytree(model_dir, tmp_path / "first" / "oft")
    _model_dir(tmp_path / "second" / "oft", seed=1)
    out = tmp_path / "eval"
    monkeypatch.chdir(tmp_path / "first")
    _, loaded, _ = prepare_eval_dir([], _overrides("oft/"), output=str(out), policy_from=TEMPLATE)
    assert loaded.config.policy.config["model_path"] == str(tmp_path / "first" / "oft")
    monkeypatch.chdir(tmp_path / "second")
    assert main(["eval", "--policy-from", TEMPLATE, *_overrides("oft/"), "--output", str(out)]) == 2
    assert "holds an evaluation of another policy (policy.config.model_path: " in capsys.readouterr().err


def test_a_published_l1_checkpoint_is_evaluated_end_to_end(ray_on_loopback, oft_l1, tmp_path):
    """Through the CLI on Ray: greedy episodes of the L1 head (no log-probs), a report of step 0
    naming the template and the model directory, and a video."""
    from vla_rl.data.trajectory_store import TrajectoryStore

    model_dir, _ = oft_l1
    out = tmp_path / "eval"
    assert main(["eval", "--policy-from", TEMPLATE, *_overrides(model_dir), *device_overrides(num_workers=1),
                 "workers.num_workers=1", "eval.num_episodes=2", "eval.video_episodes=1", "eval.video_size=32",
                 "simulator.env.horizon=16", "simulator.num_cpus_per_actor=0", "--output", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert [(r["checkpoint_step"], r["protocol"], r["episodes"]) for r in report["results"]] == [(0, "greedy", 2)]
    assert report["protocol"]["policy_from"] == TEMPLATE and report["protocol"]["model_path"] == str(model_dir)
    assert report["protocol"]["run_dir"] is None
    assert report["protocol"]["checkpoints"] == [{"path": None, "step": 0}]
    assert f"# Evaluation of the policy of template {TEMPLATE} (policy.config.model_path {model_dir})" in (
        out / "report.md").read_text()
    store = TrajectoryStore.open(out / "episodes" / "robosuite_lift" / "rank0.zarr", read_only=True)
    episode = store.read_episode(0)
    assert len(store) == 2 and "log_probs" not in episode and episode["actions"].shape[1:] == (8, 7)
    assert int(episode["checkpoint_step"]) == 0 and bool(episode["greedy"])
    assert len(list((out / "videos" / "robosuite_lift").glob("step0_greedy_*.mp4"))) == 1


def test_an_exported_mlp_evaluates_as_its_checkpoint(ray_on_loopback, tmp_path, capsys):
    """Train → export → evaluate the exported directory: `vla-rl eval --policy-from embodied_srpo
    policy.config.model_path=EXPORTED` runs, action for action, the episodes `vla-rl eval` runs of
    the checkpoint itself (same initial states, same evaluation seeds). On fewer observation
    keys than it was trained on, the export is refused in one line naming its setting, and the
    new evaluation directory is removed (it was a Ray traceback that left it behind)."""
    import numpy as np

    from policies import make_policy
    from policies.mlp import MLPPolicyConfig
    from vla_rl.checkpoints import files as checkpoint
    from vla_rl.data.trajectory_store import TrajectoryStore
    from vla_rl.driver import prepare_run_dir
    from vla_rl.export import export_checkpoint

    run, _, _ = prepare_run_dir("embodied_srpo", [f"run.output_dir={tmp_path}", "run.name=tiny",
                                                  "policy.config.hidden_sizes=[8]"], resume=None)
    run.close()
    policy = make_policy("mlp", MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)))
    torch.manual_seed(3)
    for parameter in policy.parameters():
        torch.nn.init.normal_(parameter, std=0.3)
    policy.set_obs_normalization(torch.linspace(-0.5, 0.5, 15), torch.linspace(0.5, 2.0, 15))
    checkpoint.save_checkpoint(run.path / "checkpoints", 4, rank=0, model=policy)
    checkpoint.finalize_checkpoint(run.path / "checkpoints", 4)
    exported = export_checkpoint(run.path / "checkpoints" / "step_00000004", tmp_path / "exported")

    common = [*device_overrides(num_workers=1), "workers.num_workers=1", "eval.num_episodes=2", "eval.video_episodes=0",
              "simulator.env.horizon=8", "simulator.num_cpus_per_actor=0"]
    assert main(["eval", str(run.path), *common, "--output", str(tmp_path / "of_checkpoint")]) == 0
    assert main(["eval", "--policy-from", "embodied_srpo", f"policy.config.model_path={exported}",
                 "policy.config.hidden_sizes=[8]", *common, "--output", str(tmp_path / "of_export")]) == 0

    def episodes(name: str) -> dict:
        store = TrajectoryStore.open(tmp_path / name / "episodes" / "robosuite_lift" / "rank0.zarr", read_only=True)
        found = {}
        for index in range(len(store)):
            e = store.read_episode(index)
            found[(bool(e["greedy"]), int(e["init_state_id"]))] = (e["actions"], bool(e["success"]), int(e["length"]))
        return found

    of_checkpoint, of_export = episodes("of_checkpoint"), episodes("of_export")
    assert len(of_checkpoint) == 4 and sorted(of_checkpoint) == sorted(of_export)  # greedy and sampled, 2 states
    for key, (actions, success, length) in of_checkpoint.items():
        assert np.array_equal(of_export[key][0], actions) and of_export[key][1:] == (success, length), key

    capsys.readouterr()
    assert main(["eval", "--policy-from", "embodied_srpo", f"policy.config.model_path={exported}",
                 "policy.config.hidden_sizes=[8]", *common, "--output", str(tmp_path / "fewer_keys"),
                 "simulator.env.obs_keys=[robot0_eef_pos,robot0_gripper_qpos,cube_pos,gripper_to_cube_pos]"]) == 1
    err = capsys.readouterr().err
    assert f"error: worker 0: policy.config.model_path: {exported} holds an MLP policy for obs_dim 15, the simulator " \
        "gives 11" in " ".join(err.split()) and "Traceback" not in err
    assert not (tmp_path / "fewer_keys").exists()
