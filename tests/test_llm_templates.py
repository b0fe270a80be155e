"""One step of each text template on the tiny causal LM, through the real engine (Ray on
loopback, two DAG workers, gloo): the same workers, planner, re-shards and actor update loop as
the embodied templates (tests/test_templates.py)."""

from __future__ import annotations

import json

import pytest
from devices import FSDP_NEEDS_AN_ACCELERATOR_PER_WORKER, device_overrides
from template_runs import run_one_step

from vla_rl.driver import train

TINY = [
    "trainer.total_steps=1",
    "trainer.ppo_mini_batch_size=8",
    "trainer.ppo_epochs=2",
    "text.prompts_per_step=4",
    "data.group_size=4",
    "text.max_response_length=24",
    "text.sft_steps=20",
    "text.sft_batch_size=16",
    "workers.torch_threads=1",
    "eval.num_episodes=0",
    *device_overrides(),
]


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from vla_rl.data.arithmetic import write_arithmetic_dataset

    return write_arithmetic_dataset(tmp_path_factory.mktemp("arithmetic"), 256, 32, row_group_size=16)


def run(template: str, out, *overrides: str) -> tuple[dict, object]:
    """One training step of ``template`` on the tiny settings: its step metrics and its run directory."""
    return run_one_step(template, TINY, out, *overrides)


def given_files(tiny_lm_dir, files) -> list[str]:
    return [f"text.model_path={tiny_lm_dir}", f"text.train_file={files['train']}", f"text.test_file={files['test']}"]


def test_grpo_template_builds_its_model_and_data(ray_on_loopback, tmp_path):
    # 18 test rows in row groups of 16: shards of 16 and 2 rows, still 10 held-out prompts in all
    step, run_dir = run("llm_grpo", tmp_path, "text.num_generated_train=256", "text.num_generated_test=18",
                        "text.tiny_hidden_size=32", "algorithm.filter_groups.zero_variance=false",
                        "eval.num_episodes=10")
    assert (run_dir / "tiny_model" / "config.json").exists()
    assert (run_dir / "arithmetic" / "train.parquet").exists()
    assert 0.0 <= step["reward/accuracy"] <= 1.0 and step["rollout/success_rate"] == step["reward/accuracy"]
    assert 1.0 <= step["rollout/response_length_min"] <= step["rollout/response_length"] <= step[
        "rollout/response_length_max"] <= 24.0
    assert "rollout/total_env_steps" not in step  # nothing simulated (the seed tool plotted a sweep at x = 0)
    # Every node runs at DP 2: the only re-shard rebalances the kept responses before the update.
    assert sorted(k for k in step if k.startswith("timing/reshard_")) == ["timing/reshard_group_filter_to_actor_update"]
    assert step["comm/reshard_rows/bytes_received"] == 0  # no group filtered: equal shards, nothing moves
    assert step["actor/num_updates"] == 4.0  # 16 responses / 8 per minibatch, 2 epochs
    assert "actor/grad_norm" in step and "actor/pg_clipfrac" in step
    assert (run_dir / "checkpoints" / "step_00000001" / "model.safetensors").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    for tag in ("warm_start_eval", "final_eval"):  # held-out accuracy before and after training
        assert summary[tag]["eval/greedy/episodes"] == 10.0
        assert 0.0 <= summary[tag]["eval/greedy/success_rate"] <= 1.0
    setup = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert setup["sft/steps"] == 20.0 and setup["sft/loss_last"] < setup["sft/loss_first"]


@pytest.mark.parametrize("template, loss", [("llm_gspo", "gspo"), ("llm_cpgd", "cpgd")])
def test_policy_objective_templates(ray_on_loopback, tmp_path, tiny_lm_dir, arithmetic_files, template, loss):
    step, run_dir = run(template, tmp_path, *given_files(tiny_lm_dir, arithmetic_files),
                        "algorithm.filter_groups.zero_variance=false")
    resolved = (run_dir / "template.yaml").read_text()
    assert f"policy_loss: {loss}" in resolved
    assert step["actor/num_updates"] == 4.0 and "actor/pg_loss" in step
    assert not (run_dir / "tiny_model").exists()  # the given checkpoint and prompts are used


def test_dapo_template_refills_and_shapes_length(ray_on_loopback, tmp_path, tiny_lm_dir, arithmetic_files):
    step, _ = run("llm_dapo", tmp_path, *given_files(tiny_lm_dir, arithmetic_files), "algorithm.filter_groups.max_refill_rounds=2")
    assert 0 <= step["filter/refill_rounds"] <= 2
    assert step["filter/kept_groups"] <= 4 and "reward/overlong_penalty" in step
    assert step["reward/overlong_penalty"] <= 0.0


def test_ppo_template_trains_an_lm_value_model(ray_on_loopback, tmp_path, tiny_lm_dir, arithmetic_files):
    step, run_dir = run("llm_ppo", tmp_path, *given_files(tiny_lm_dir, arithmetic_files))
    assert step["critic/values_mean"] == 0.0  # the value head starts at zero
    assert step["critic/num_updates"] == step["actor/num_updates"] == 4.0
    assert "critic/vf_loss" in step and "advantage/abs_mean" in step
    checkpoint = run_dir / "checkpoints" / "step_00000001"
    assert {"critic.safetensors", "critic_optimizer.safetensors"} <= {p.name for p in checkpoint.iterdir()}


@FSDP_NEEDS_AN_ACCELERATOR_PER_WORKER
def test_ppo_template_trains_and_resumes_its_critic_sharded_under_fsdp(ray_on_loopback, tmp_path, tiny_lm_dir,
                                                                       arithmetic_files):
    """The critic follows trainer.strategy (it trained in DDP whatever the strategy said): with
    FSDP and micro-batches both updates run, the checkpoint holds the critic's sharded state
    under the manifest (no critic.safetensors), and a resume restores it."""
    from vla_rl.checkpoints.integrity import verify_checkpoint

    fsdp = ["trainer.strategy=fsdp", "trainer.micro_batch_size=3"]
    step, run_dir = run("llm_ppo", tmp_path, *given_files(tiny_lm_dir, arithmetic_files), *fsdp)
    assert step["critic/num_updates"] == step["actor/num_updates"] == 4.0
    first = run_dir / "checkpoints" / "step_00000001"
    names = {p.name for p in first.iterdir()}
    assert {"actor_sharded", "critic_sharded"} <= names
    assert not names & {"critic.safetensors", "critic_optimizer.json", "model.safetensors"}
    assert verify_checkpoint(first)
    summary = train(None, ["trainer.total_steps=2"], resume=str(run_dir))
    assert summary["steps_run"] == 1
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["critic/num_updates"] for r in records if "critic/num_updates" in r] == [4.0, 4.0]


def test_sft_template_fits_targets_and_exports_a_model(ray_on_loopback, tmp_path, tiny_lm_dir, arithmetic_files):
    summary = train("llm_sft", [*device_overrides(), *given_files(tiny_lm_dir, arithmetic_files),
                                f"run.output_dir={tmp_path}",
                                "run.name=run", "trainer.total_steps=4", "trainer.save_every=4",
                                "text.prompts_per_step=16", "trainer.ppo_mini_batch_size=16",
                                "text.max_response_length=24", "eval.num_episodes=0"])
    assert summary["steps_run"] == 4
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["sft/loss"] for r in records if "sft/loss" in r]
    assert len(losses) == 4 and losses[-1] < losses[0]
    # Steps 2-4 started while the driver logged the one before: each is logged once, in order.
    assert [r["step"] for r in records if "sft/loss" in r] == [1, 2, 3, 4]
    assert all(r["sft/num_updates"] == 1.0 for r in records if "sft/loss" in r)
    assert (tmp_path / "run" / "checkpoints" / "step_00000004" / "hf_model" / "config.json").exists()
    assert not (tmp_path / "run" / "success_rate.png").exists()  # no success rate to plot


def test_periodic_evaluation_draws_a_held_out_curve(ray_on_loopback, tmp_path, tiny_lm_dir, arithmetic_files):
    summary = train("llm_grpo", [*TINY, *given_files(tiny_lm_dir, arithmetic_files), f"run.output_dir={tmp_path}",
                                 "run.name=run", "trainer.total_steps=3", "eval.every_steps=1",
                                 "eval.num_episodes=8", "algorithm.filter_groups.zero_variance=false"])
    assert summary["steps_run"] == 3
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/greedy/success_rate" in r]
    assert [r["step"] for r in evals] == [0, 1, 2, 3]  # warm start, after steps 1 and 2, final
    assert all(r["eval/greedy/episodes"] == 8.0 for r in evals)
    assert summary["final_eval"]["eval/greedy/success_rate"] == evals[-1]["eval/greedy/success_rate"]
    assert (tmp_path / "run" / "success_rate.png").stat().st_size > 0



@pytest.fixture(scope="module")
def fsdp_run(ray_on_loopback, tmp_path_factory, tiny_lm_dir, arithmetic_files):
    """One llm_grpo step with trainer.strategy=fsdp, micro-batches and gradient checkpointing."""
    fsdp = ["trainer.strategy=fsdp", "trainer.micro_batch_size=3", "trainer.gradient_checkpointing=true"]
    return run("llm_grpo", tmp_path_factory.mktemp("fsdp"), *given_files(tiny_lm_dir, arithmetic_files), *fsdp,
               "algorithm.filter_groups.zero_variance=false")


@FSDP_NEEDS_AN_ACCELERATOR_PER_WORKER
@pytest.mark.xdist_group("test_llm_templates.fsdp_run")
def test_grpo_template_trains_with_fsdp_and_checkpoints_sharded(fsdp_run):
    """Through the engine: the step trains, its checkpoint holds the sharded actor state under
    the manifest, and no model.safetensors (the sharded state holds the weights)."""
    from vla_rl.checkpoints.integrity import verify_checkpoint

    step, run_dir = fsdp_run
    assert step["actor/num_updates"] == 4.0 and "actor/grad_norm" in step
    first = run_dir / "checkpoints" / "step_00000001"
    names = {p.name for p in first.iterdir()}
    assert "actor_sharded" in names and not names & {"model.safetensors", "optimizer.json", "hf_model"}
    assert verify_checkpoint(first)


@FSDP_NEEDS_AN_ACCELERATOR_PER_WORKER
@pytest.mark.xdist_group("test_llm_templates.fsdp_run")
def test_an_fsdp_run_resumes_from_its_sharded_checkpoint_and_exports(fsdp_run, tmp_path):
    from policies.causal_lm import CausalLMConfig, CausalLMPolicy
    from vla_rl.export import export_checkpoint

    _, run_dir = fsdp_run
    summary = train(None, ["trainer.total_steps=2"], resume=str(run_dir))
    assert summary["steps_run"] == 1
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["actor/num_updates"] for r in records if "actor/num_updates" in r] == [4.0, 4.0]
    out = export_checkpoint(run_dir / "checkpoints" / "step_00000002", tmp_path / "exported")
    assert CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(out))).model.config.num_hidden_layers == 2
