"""Settings of large-policy training, validated when a template loads or plans: the strategy and
mixed precision, the collective backend of each device's tensors, Adam on half-precision weights."""

from __future__ import annotations

import pytest
from template_errors import plan_error as _error

from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import plan


@pytest.mark.parametrize(
    ("template", "overrides", "message"),
    [
        ("llm_grpo", ["trainer.strategy=zero3"], "'ddp' or 'fsdp'"),
        ("llm_grpo", ["trainer.mixed_precision=bf16"], "trainer.mixed_precision bf16 needs accelerator workers"),
        ("llm_grpo", ["trainer.strategy=fsdp", "trainer.mixed_precision=bf16"],
         "trainer.mixed_precision bf16 needs accelerator workers"),
        ("llm_grpo", ["trainer.mixed_precision=fp8"], "trainer.mixed_precision"),
        ("llm_grpo", ["trainer.micro_batch_size=0"], "trainer.micro_batch_size"),
        ("llm_grpo", ["trainer.fsdp.master_dtype=float16"], "trainer.fsdp.master_dtype"),
        ("llm_grpo", ["trainer.fsdp.reshard=true"], "reshard"),
        ("llm_grpo", ["policy.lora.rank=0"], "policy.lora.rank"),
        ("llm_grpo", ["policy.lora.rank=4", "policy.lora.target_modules=[]"], "policy.lora.target_modules"),
        ("llm_grpo", ["policy.lora.rank=4", "policy.lora.dropout=1.0"], "policy.lora.dropout"),
        ("llm_grpo", ["policy.lora.ranks=4"], "ranks"),
        ("embodied_grpo", ["policy.lora.rank=4"], "field 'policy.lora': the 'mlp' policy takes no LoRA adapters"),
    ],
)
def test_bad_large_policy_settings_are_rejected(template, overrides, message):
    assert message in str(_error(template, *overrides))


def test_large_policy_settings_load():
    config = load_template("embodied_grpo_oft_lift", [
        "trainer.strategy=fsdp", "trainer.gradient_checkpointing=true", "trainer.micro_batch_size=2",
        "workers.device=cuda", "trainer.mixed_precision=bf16", "policy.lora.rank=32",
        "policy.lora.trainable_modules=[proprio_projector]"]).config
    assert config.trainer.strategy == "fsdp" and config.trainer.micro_batch_size == 2
    assert config.policy.lora.rank == 32 and config.policy.lora.trainable_modules == ["proprio_projector"]
    assert config.policy.lora.alpha is None and config.policy.lora.target_modules is None  # the policy's default
    ddp = load_template("embodied_srpo", ["workers.device=cuda", "trainer.mixed_precision=bf16"]).config.trainer
    assert (ddp.strategy, ddp.mixed_precision) == ("ddp", "bf16")  # DDP's bfloat16 autocast
    default = load_template("embodied_srpo").config.trainer
    assert (default.strategy, default.mixed_precision, default.micro_batch_size) == ("ddp", "auto", None)
    assert not default.gradient_checkpointing and load_template("embodied_srpo").config.policy.lora is None


@pytest.mark.parametrize("backend", ["nccl", "hccl", "cuda:nccl", "cpu:nccl,cuda:nccl"])
def test_a_collective_backend_without_gloo_for_cpu_tensors_is_refused(backend):
    """NCCL alone would accept the run and fail at its first CPU-tensor collective (advantages,
    group filters, evaluation, re-shards): refused when the config is read, naming the fix."""
    from pydantic import ValidationError

    from vla_rl.config import WorkersSection

    with pytest.raises(ValidationError, match="cpu:gloo,cuda:nccl"):
        WorkersSection(device="cuda", collective_backend=backend)


@pytest.mark.parametrize(("device", "backend"), [("cuda", "gloo"), ("cuda", "cpu:gloo,cuda:gloo"),
                                                ("npu", "gloo")])
def test_fsdp_over_gloo_on_accelerator_tensors_is_refused(device, backend):
    """FSDP2's collectives on CUDA tensors over gloo segfault the workers (pytorch/pytorch#132471;
    seen on an H200 with two workers sharing it): refused when the config is read, naming the
    field and both ways out. DDP may share an accelerator over gloo, and FSDP on CPU workers
    reduces CPU tensors with gloo as it should."""
    overrides = [f"workers.device={device}", f"workers.collective_backend={backend}", "workers.gpus_per_worker=0.5"]
    err = _error("llm_grpo", *overrides, "trainer.strategy=fsdp")
    assert "workers.collective_backend" in str(err) and "segmentation fault" in str(err)
    assert "workers.gpus_per_worker=1" in str(err) and "trainer.strategy=ddp" in str(err)
    load_template("llm_grpo", overrides)  # ddp
    load_template("llm_grpo", [f"workers.device={device}", "trainer.strategy=fsdp"])  # the default backend
    load_template("llm_grpo", ["workers.device=cpu", "workers.collective_backend=gloo", "trainer.strategy=fsdp"])


@pytest.mark.parametrize(("device", "backend", "expected"), [
    ("cuda", None, "nccl"), ("npu", None, "hccl"), ("cpu", None, "gloo"), ("cuda", "gloo", "gloo"),
    ("cpu", "cpu:gloo,cuda:nccl", "gloo"), ("cuda", "cpu:gloo,cuda:nccl", "nccl"), ("cuda", "cpu:gloo", None)])
def test_the_backend_of_each_devices_tensors(device, backend, expected):
    from vla_rl.config import WorkersSection

    assert WorkersSection(collective_backend=backend).tensor_backend(device) == expected


@pytest.mark.parametrize("template, dtype_field, warm_start, warm_node", [
    ("llm_grpo", "text.dtype", "text.sft_steps=5", "sft"),
    ("embodied_srpo_oft_lift", "policy.config.dtype", "warm_start.num_demos=2", "behaviour_cloning"),
    ("embodied_srpo_pi0_lift", "policy.config.dtype", "warm_start.num_demos=2", "behaviour_cloning"),
])
def test_adam_on_half_precision_parameters_is_refused_at_plan_time(template, dtype_field, warm_start, warm_node):
    """A warm start (Adam before the actor's strategy exists) or DDP on parameters loaded in
    float16/bfloat16 keeps no float32 master weights: refused before any worker loads a model (the
    workers refused DDP only after loading and warm-starting; the warm starts ran, float16 into NaN
    weights). LoRA's float32 adapters, FSDP's float32 masters or float32 parameters plan."""
    for dtype in ("float16", "bfloat16"):
        err = _error(template, f"{dtype_field}={dtype}", warm_start)
        assert (err.field, err.node) == (dtype_field, warm_node) and f"policy's {dtype} parameters" in str(err)
        err = _error(template, f"{dtype_field}={dtype}", warm_start.split("=")[0] + "=0")
        assert (err.field, err.node) == ("trainer.strategy", "actor_update") and "trainer.strategy=fsdp" in str(err)
        assert ("policy.lora" in str(err)) == (template != "embodied_srpo_pi0_lift")  # π0 takes no LoRA
    plan(load_template(template, [f"{dtype_field}=bfloat16", warm_start.split("=")[0] + "=0", "trainer.strategy=fsdp"]))
    if template != "embodied_srpo_pi0_lift":
        plan(load_template(template, [f"{dtype_field}=bfloat16", warm_start, "policy.lora.rank=4"]))
    if template == "embodied_srpo_oft_lift":  # modules LoRA trains whole train in the policy's dtype
        err = _error(template, f"{dtype_field}=bfloat16", warm_start, "policy.lora.rank=4",
                     "policy.lora.trainable_modules=[proprio_projector]")
        assert err.field == dtype_field and "policy.lora.trainable_modules=[]" in str(err)
    plan(load_template(template, [f"{dtype_field}=float32", warm_start]))


def test_a_half_precision_value_model_under_ddp_is_refused_at_plan_time():
    """The text critic trains a whole copy of the policy's body in text.dtype, LoRA or not: DDP
    would step Adam on bfloat16 weights (its strategy refused it after the actor was built)."""
    err = _error("llm_ppo", "text.dtype=bfloat16", "text.sft_steps=0", "policy.lora.rank=4")
    assert (err.field, err.node) == ("trainer.strategy", "critic_update") and "value model" in str(err)
    plan(load_template("llm_ppo", ["text.dtype=bfloat16", "text.sft_steps=0", "policy.lora.rank=4",
                                   "trainer.strategy=fsdp"]))


@pytest.mark.parametrize("override, sizes", [("nodes.prompts.dp_size=1", "'prompts' at DP 1, 'reward' at DP 2"),
                                             ("nodes.reward.dp_size=1", "'prompts' at DP 2, 'reward' at DP 1")])
def test_the_text_reward_must_run_at_the_dp_size_of_its_prompts(override, sizes):
    # It scores each row with the answer its worker's data node read; the plan passed and the
    # run stopped at its first training step, after the warm start.
    err = _error("llm_grpo", override)
    assert (err.node, err.field) == ("reward", "dp_size")
    assert "what the data node 'prompts' kept on the worker that read the row" in err.message and sizes in err.message
