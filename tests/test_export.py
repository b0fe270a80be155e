"""``vla-rl export``: a checkpoint (DDP's ``model.safetensors`` or FSDP's sharded state) becomes
the policy's own model directory, LoRA merged, and the policy's loader reads it back with the
same outputs; bad input is one clear error."""

from __future__ import annotations

import types
import warnings
from pathlib import Path

import pytest
import torch

from vla_rl.checkpoints import files as ckpt
from vla_rl.cli import main
from vla_rl.dag.loader import load_template
from vla_rl.dag.registry import WORKFLOWS
from vla_rl.export import ExportError, export_checkpoint
from vla_rl.run_dir import RunDirectory
from vla_rl_core.env_spec import EnvSpec

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "What is 40 - 17?"}]]


def make_run(tmp_path, template: str, *overrides: str):
    """A run directory holding ``template``'s resolved template (as ``vla-rl train`` writes it)
    and its config."""
    loaded = load_template(template, list(overrides))
    run = RunDirectory.create(tmp_path, "run", loaded.name)
    run.write_template({key: value for key, value in loaded.raw.items() if key != "extends"})
    return run.path, loaded.config


def write_checkpoint(run_dir, step: int, model=None, before_finalize=None):
    root = run_dir / "checkpoints"
    staging = ckpt.save_checkpoint(root, step, model=model)
    if before_finalize is not None:
        before_finalize(staging)
    return ckpt.finalize_checkpoint(root, step)


def perturb_adapters(policy) -> None:
    """Non-zero LoRA B matrices (they start at 0), so that merging them changes the weights."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))


def lm_scores(policy):
    input_ids, attention_mask = policy.processor.encode_prompts(PROMPTS, max_length=32)
    responses, response_mask = policy.processor.encode_responses(["5 #### 5", "23 #### 23"], max_length=12)
    return policy.log_probs(input_ids, attention_mask, responses, response_mask)


@pytest.fixture
def lora_lm_run(tmp_path, tiny_lm_dir):
    run_dir, config = make_run(tmp_path, "llm_grpo", f"text.model_path={tiny_lm_dir}", "policy.lora.rank=4",
                               "policy.lora.alpha=8")
    policy = WORKFLOWS.get("text").standalone_policy(config, run_dir)
    perturb_adapters(policy)
    return run_dir, policy, write_checkpoint(run_dir, 3, model=policy)


def test_export_merges_lora_into_a_hugging_face_directory(lora_lm_run, tmp_path):
    from policies.causal_lm import CausalLMConfig, CausalLMPolicy

    _, policy, checkpoint = lora_lm_run
    out = export_checkpoint(checkpoint, tmp_path / "exported")
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    exported = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(out), max_prompt_length=32))
    assert not any("lora_" in name for name in exported.state_dict())
    torch.testing.assert_close(lm_scores(exported), lm_scores(policy), rtol=0, atol=1e-5)
    assert (lm_scores(exported) - lm_scores(WORKFLOWS.get("text").standalone_policy(
        load_template(checkpoint.parent.parent / "template.yaml").config, checkpoint.parent.parent))).abs().max() > 1e-4


def test_the_export_command_and_its_errors(lora_lm_run, tmp_path, capsys):
    run_dir, _, checkpoint = lora_lm_run
    assert main(["export", str(checkpoint), str(tmp_path / "a")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "a")
    assert main(["export", str(checkpoint), str(tmp_path / "a")]) == 2
    assert "exists; export to a new directory" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["export", str(checkpoint), str(tmp_path / "file" / "out")]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {tmp_path / 'file' / 'out'} cannot be created: "
                                               f"{tmp_path / 'file'} is not a directory")
    assert main(["export", str(checkpoint), "/proc/vla_rl_export"]) == 2  # only the write fails (a full disk too)
    assert capsys.readouterr().err.splitlines()[-1].startswith("error: /proc/vla_rl_export cannot be ")
    assert main(["export", str(run_dir / "checkpoints" / "step_00000009"), str(tmp_path / "b")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["export", str(run_dir / "template.yaml"), str(tmp_path / "b")]) == 2
    assert "template.yaml is a file: name a checkpoint directory or a run directory" in capsys.readouterr().err
    with pytest.raises(ExportError, match="not a complete checkpoint directory"):
        export_checkpoint(checkpoint.parent, tmp_path / "b")
    sweep = tmp_path / "sweep"  # vla-rl train --seeds: "not a complete checkpoint directory"
    sweep.mkdir()
    (sweep / "sweep.json").write_text("{}")
    assert main(["export", str(sweep), str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {sweep} is a sweep of seeds: name one of its runs, e.g. " \
                                              f"{sweep / 'seed_<S>'}"
    weights = checkpoint / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ExportError, match=r"model\.safetensors does not match its sha256"):
        export_checkpoint(checkpoint, tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_a_run_whose_base_model_moved_exports_with_its_new_place(tmp_path, tiny_lm_dir, capsys, monkeypatch):
    """It was a FileNotFoundError traceback, and export took no setting to say where it went."""
    import shutil

    base = Path(shutil.copytree(tiny_lm_dir, tmp_path / "base"))
    run_dir, config = make_run(tmp_path, "llm_grpo", f"text.model_path={base}")
    policy = WORKFLOWS.get("text").standalone_policy(config, run_dir)
    checkpoint = write_checkpoint(run_dir, 1, model=policy)
    moved = base.rename(tmp_path / "moved #2")  # an override's value would end at " #"
    capsys.readouterr()  # transformers' loading bars
    assert main(["export", str(checkpoint), str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the run's policy cannot be built: ") and err.count("\n") == 0
    assert str(base) in err and err.endswith(f"(moved? give its new place: vla-rl export {checkpoint} OUT "
                                             "text.model_path=DIR)")
    for given in ("policy.lora.rank=2", "policy.config.model_path=/x"):
        assert main(["export", str(checkpoint), str(tmp_path / "a"), "text.model_path=/x", given]) == 2
        assert (f"error: '{given}': the export of a text run takes only text.model_path as KEY=DIR"
                in capsys.readouterr().err)
    import vla_rl.export as export_module
    from vla_rl.export import PATH_SETTINGS, PolicyNotBuilt
    from vla_rl.serving.policy import ServeError, load_served_policy

    with pytest.raises(ServeError, match=r"is a checkpoint of a text run; vla-rl serve serves robot policies$"):
        load_served_policy(checkpoint)  # refused before its model is looked for
    with monkeypatch.context() as patched:  # an embodied run's pretrained model that moved
        def moved_model(path, workflow=None):
            raise PolicyNotBuilt("no config.json in /models/openvla", PATH_SETTINGS["embodied"], path)

        patched.setattr(export_module, "load_checkpoint_policy", moved_model)
        with pytest.raises(ServeError, match=r"moved\? export it with its new place, vla-rl export .* OUT "
                                             r"policy.config.model_path=DIR or policy.config.tokenizer_path=DIR, and "
                                             r"serve OUT\)$"):
            load_served_policy(checkpoint)
    assert export_checkpoint(checkpoint, tmp_path / "b", [f"text.model_path={moved}"]).is_dir()
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    moved = moved.rename(home / "models" / "base")
    monkeypatch.setenv("HOME", str(home))  # ~ expanded, as a run's settings are
    out = export_checkpoint(checkpoint, tmp_path / "a", ["text.model_path=~/models/base"])
    exported = WORKFLOWS.get("text").standalone_policy(
        load_template(run_dir / "template.yaml", [f"text.model_path={out}"]).config, run_dir)
    torch.testing.assert_close(lm_scores(exported), lm_scores(policy), rtol=0, atol=1e-6)


@pytest.mark.parametrize(("template", "given"), [("embodied_srpo_oft_lift", "policy.config.model_path=/models/oft"),
                                               ("embodied_srpo", "policy.config.tokenizer_path=/models/tok")])
def test_a_new_place_for_files_the_run_never_read_is_refused_in_one_line(tmp_path, capsys, template, given):
    """A tiny-architecture (or MLP) run given a model_path was told by the policy config to "set
    architecture to null", which export does not take."""
    run_dir, _ = make_run(tmp_path, template)
    checkpoint = write_checkpoint(run_dir, 1, model=torch.nn.Linear(2, 2))
    assert main(["export", str(checkpoint), str(tmp_path / "a"), given]) == 2
    key = given.partition("=")[0]
    assert capsys.readouterr().err.strip() == (f"error: {given!r}: the run read no {key} (its policy was built without "
                                               "pretrained files from there): export it without this KEY=DIR")
    assert not (tmp_path / "a").exists()


def test_a_run_whose_resume_recorded_an_override_it_never_reads_still_exports(tmp_path, capsys):
    """Overrides a resume recorded before they were refused as never read (critic.lr on a run
    without a critic) locked the run out of export, eval and resume: they are not checked again."""
    from policies import make_policy
    from policies.mlp import MLPPolicyConfig

    run_dir, _ = make_run(tmp_path, "embodied_grpo", "policy.config.hidden_sizes=[8]")
    RunDirectory.reopen(run_dir).record_resume(["critic.lr=0.0005", "trainer.fsdp.reshard_after_forward=false"])
    checkpoint = write_checkpoint(run_dir, 1, model=make_policy("mlp", MLPPolicyConfig(obs_dim=15, action_dim=7,
                                                                                      hidden_sizes=(8,))))
    assert main(["export", str(checkpoint), str(tmp_path / "a")]) == 0, capsys.readouterr().err
    assert (tmp_path / "a" / "model.safetensors").is_file()


def test_a_policy_whose_layout_cannot_hold_it_is_refused_in_one_line(lora_lm_run, tmp_path, capsys, monkeypatch):
    """A policy's save_pretrained refusal (a ValueError: an OFT Lift run's proprio statistics
    without action statistics was one) is the user's error: one line naming the checkpoint, exit 2,
    not a traceback."""
    from policies.causal_lm import CausalLMPolicy

    def refuse(self, out_dir):
        raise ValueError("this layout cannot hold the policy")

    monkeypatch.setattr(CausalLMPolicy, "save_pretrained", refuse)
    _, _, checkpoint = lora_lm_run
    assert main(["export", str(checkpoint), str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"error: {checkpoint}: this layout cannot hold the policy"
    assert "Traceback" not in err and not (tmp_path / "a").exists()


def test_a_run_directory_exports_its_newest_complete_checkpoint(lora_lm_run, tmp_path, capsys, caplog):
    """As ``vla-rl serve`` and ``vla-rl eval`` take a run directory: step 5's weights, not step 3's,
    and not the incomplete step 7 (no trainer_state.json); the command names the checkpoint."""
    from policies.causal_lm import CausalLMConfig, CausalLMPolicy

    run_dir, policy, _ = lora_lm_run
    perturb_adapters(policy)
    with torch.no_grad():
        next(p for name, p in policy.named_parameters() if "lora_B" in name).add_(0.5)
    newest = write_checkpoint(run_dir, 5, model=policy)
    (run_dir / "checkpoints" / "step_00000007").mkdir()
    with caplog.at_level("INFO", logger="vla_rl.export"):
        assert main(["export", str(run_dir), str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out") and str(newest) in caplog.text
    exported = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(tmp_path / "out"), max_prompt_length=32))
    torch.testing.assert_close(lm_scores(exported), lm_scores(policy), rtol=0, atol=1e-5)

    empty_run, _ = make_run(tmp_path / "empty", "llm_grpo")
    (empty_run / "checkpoints").mkdir()
    with pytest.raises(ExportError, match=r"has no complete checkpoint"):
        export_checkpoint(empty_run, tmp_path / "none")
    assert not (tmp_path / "none").exists()


def _fsdp_mlp_checkpoint(tmp_path, monkeypatch, **trainer_updates):
    """A tiny MLP run of ``embodied_grpo`` with ``trainer.strategy fsdp`` (one worker), one update
    with ``trainer_updates`` on the trainer section, and its checkpoint: ``(run_dir, config,
    policy, batch, trainer, checkpoint)``."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "trainers"))
    from test_actor import ACT_DIM, OBS_DIM, rollout_batch, update_config

    from vla_rl.trainers.actor import ActorTrainer
    from vla_rl.workflows import embodied

    spec = EnvSpec(obs_dim=OBS_DIM, action_dim=ACT_DIM, horizon=8)
    monkeypatch.setattr(embodied, "simulator_spec", lambda config: spec)
    run_dir, config = make_run(tmp_path, "embodied_grpo", "policy.config.hidden_sizes=[16,16]",
                               "trainer.strategy=fsdp")
    torch.manual_seed(0)
    policy = WORKFLOWS.get("embodied").standalone_policy(config, run_dir)
    batch = rollout_batch(policy)
    algorithm, section = update_config("ppo_clip", "action")
    section = section.model_copy(update={"strategy": "fsdp", **trainer_updates})
    trainer = ActorTrainer(policy, lr=1e-2, trainer=section)
    trainer.update(batch, algorithm, section, torch.Generator().manual_seed(1))
    checkpoint = write_checkpoint(run_dir, 1, before_finalize=trainer.save_sharded)
    return run_dir, config, policy, batch, trainer, checkpoint


def test_export_reads_the_sharded_state_of_an_fsdp_checkpoint(process_group, tmp_path, monkeypatch):
    """An MLP trained with trainer.strategy fsdp (one worker): its checkpoint holds only the
    sharded actor state; the export consolidates it into the MLP's config.json + safetensors."""
    from policies.mlp.modeling_mlp import MLPPolicy
    from vla_rl.trainers.actor import ActorTrainer
    from vla_rl.workers.checkpointing import ACTOR_CHECKPOINT

    run_dir, config, policy, batch, _, checkpoint = _fsdp_mlp_checkpoint(tmp_path, monkeypatch)
    assert not (checkpoint / "model.safetensors").exists() and (checkpoint / "actor_sharded" / ".metadata").is_file()

    ddp = ActorTrainer(WORKFLOWS.get("embodied").standalone_policy(config, run_dir), lr=1e-2)
    with pytest.raises(FileNotFoundError, match="written with trainer.strategy fsdp"):
        ACTOR_CHECKPOINT.load(types.SimpleNamespace(actor=ddp, rank=0), checkpoint, {})

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = export_checkpoint(checkpoint, tmp_path / "mlp")
    assert not [w for w in caught if "torch.distributed" in str(w.message)]  # the one-process load is asked for
    exported = MLPPolicy.from_pretrained(out)
    obs, actions = batch["obs"][:, 0], batch["actions"][:, 0]
    for got, want in zip(exported.log_prob_and_entropy_per_dim(obs, actions),
                         policy.log_prob_and_entropy_per_dim(obs, actions), strict=True):
        assert torch.equal(got, want)


def test_under_fsdp_mixed_precision_the_checkpoint_holds_the_float32_master_weights(process_group, tmp_path,
                                                                                    monkeypatch):
    """bfloat16 mixed precision (the CPU admitted as an accelerator, as ``auto`` on a GPU): the
    policy the rollout uses holds bfloat16 parameters after the update, the checkpoint and its
    export the float32 master weights, whose bfloat16 rounding the policy holds."""
    import vla_rl.trainers.strategy as strategy
    from policies.mlp.modeling_mlp import MLPPolicy

    monkeypatch.setattr(strategy, "ACCELERATORS", (*strategy.ACCELERATORS, "cpu"))
    _, _, policy, _, trainer, checkpoint = _fsdp_mlp_checkpoint(tmp_path, monkeypatch, mixed_precision="auto")
    exported = dict(MLPPolicy.from_pretrained(export_checkpoint(checkpoint, tmp_path / "mlp")).named_parameters())
    master = {name: parameter.full_tensor() for name, parameter in trainer.parallel.trained.named_parameters()}
    assert {p.dtype for p in exported.values()} == {torch.float32}
    for name, parameter in policy.named_parameters():
        assert parameter.dtype == torch.bfloat16
        assert torch.equal(exported[name], master[name])
        assert torch.equal(parameter, master[name].to(torch.bfloat16))
    assert any(not torch.equal(exported[name], exported[name].to(torch.bfloat16).float()) for name in exported)


def test_openvla_oft_layout_keeps_heads_proprio_statistics_and_merged_lora(tmp_path):
    """What the export writes for OpenVLA-OFT: the VLA with LoRA merged, the proprio projector
    and the proprio statistics; loading it as policy.config.model_path gives the same log-probs."""
    from policies.openvla.tiny import tiny_observation
    from policies.openvla_oft import OpenVLAOFTPolicy, OpenVLAOFTPolicyConfig

    statistics = {"q01": [-1.0] * 7, "q99": [1.0] * 7, "mask": [True] * 6 + [False]}
    torch.manual_seed(0)
    policy = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(architecture={"preset": "tiny", "fused": False}, chunk_size=2,
                                                     proprio_dim=3, action_statistics=statistics))
    obs = tiny_observation(policy.tokenizer, ["lift the cube"] * 3, num_images=1, proprio_dim=3)
    policy.fit_observation_normalization(obs)
    policy.apply_lora(rank=4, trainable_modules=["proprio_projector"])
    perturb_adapters(policy)
    actions, _ = policy.sample_actions(obs, generator=torch.Generator().manual_seed(1))
    before = policy.log_prob_and_entropy_per_dim(obs, actions)[0]
    assert policy.merge_lora() > 0
    out = policy.save_pretrained(tmp_path / "oft")
    loaded = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(model_path=str(out), chunk_size=2, proprio_dim=3))
    assert torch.equal(loaded.proprio_q01, policy.proprio_q01)
    torch.testing.assert_close(loaded.log_prob_and_entropy_per_dim(obs, actions)[0], before, rtol=0, atol=1e-5)


def test_pi0_export_after_one_update_loads_as_model_path(process_group, tmp_path, monkeypatch):
    """A tiny π0 (Flow-Noise) run of embodied_grpo_pi0_lift, its proprio statistics fitted and one
    PPO update made: the export is a π0 checkpoint directory (LeRobot's layout, norm_stats.json,
    tokenizer, noise head) that policy.config.model_path alone loads back with the same log-probs."""
    import dataclasses
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "trainers"))
    from test_actor import ACT_DIM, OBS_DIM, rollout_batch, update_config

    from policies.pi0.policy_pi0 import PI0Policy
    from vla_rl.trainers.actor import ActorTrainer
    from vla_rl.workflows import embodied

    monkeypatch.setattr(embodied, "simulator_spec", lambda config: EnvSpec(obs_dim=OBS_DIM, action_dim=ACT_DIM, horizon=8))
    run_dir, config = make_run(tmp_path, "embodied_grpo_pi0_lift", "policy.config.sampler=flow_noise",
                               f"policy.config.proprio_dim={OBS_DIM}")  # test_actor's states
    policy = WORKFLOWS.get("embodied").standalone_policy(config, run_dir)
    batch = rollout_batch(policy)
    obs, actions = batch["obs"][:, 0], batch["actions"][:, 0]
    policy.fit_observation_normalization(obs)
    head = [tensor.clone() for tensor in policy.sampler.noise_head.state_dict().values()]
    trainer = ActorTrainer(policy, lr=1e-2)
    trainer.update(batch, *update_config("ppo_clip", "action"), torch.Generator().manual_seed(1))
    assert any(not torch.equal(a, b) for a, b in zip(head, policy.sampler.noise_head.state_dict().values(), strict=True))
    checkpoint = write_checkpoint(run_dir, 1, model=policy)

    out = export_checkpoint(checkpoint, tmp_path / "pi0")
    assert {"model.safetensors", "pi0_architecture.json", "norm_stats.json", "pi0_noise_head.safetensors",
            "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    exported = PI0Policy(dataclasses.replace(policy.config, model_path=str(out), architecture=None))
    assert torch.equal(exported.proprio_q99, policy.proprio_q99)
    for got, want in zip(exported.log_prob_and_entropy_per_dim(obs, actions),
                         policy.log_prob_and_entropy_per_dim(obs, actions), strict=True):
        assert torch.equal(got, want)


def test_stored_episodes_asked_of_vla_rl_export_are_pointed_to_export_episodes(tmp_path, capsys, monkeypatch):
    """``vla-rl export episodes RUN OUT`` said ``RUN exists; export to a new directory``."""
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["export", "episodes", str(run), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: checkpoint {tmp_path / 'episodes'} does not exist: name a checkpoint directory or a run "
                   "directory (stored episodes: vla-rl export-episodes SOURCE OUT)")
    assert main(["export", str(run), str(tmp_path / "out"), "model"]) == 2
    assert capsys.readouterr().err.startswith("error: 'model' is not KEY=DIR: vla-rl export takes CHECKPOINT OUT")
    assert not (tmp_path / "out").exists()
