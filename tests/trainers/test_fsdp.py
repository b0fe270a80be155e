"""The actor under FSDP2 against DDP on two gloo workers (spawned processes, loopback), and the
features large policies need: gradient accumulation over micro-batches, activation
checkpointing, LoRA with frozen vision towers, sharded checkpoints (torch.distributed.checkpoint)
resumed bit for bit.

Every scenario runs in one spawn of two workers (starting the processes costs more than the
scenarios): :func:`_scenarios` records, per worker and scenario, the loss of each update, the
gradient of the first minibatch (gathered whole) and the final weights; the tests compare them.
The workers' shards differ in size (5 and 3 MLP episodes), so FSDP's micro-batch schedule has to
keep the collectives of unequal workers in step.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from fsdp_harness import (
    WORLD,
    _full_grads,
    _max_abs,
    _max_loss_gap,
    _mlp_setup,
    _run,
    _text_batch,
    _trainer_section,
    _weights,
    spawn_workers,
)
from tensordict import TensorDict


def _scenarios(rank: int, lm_dir: str, ckpt_root: str) -> dict:
    from vla_rl.config import AlgorithmSection
    from vla_rl.trainers.actor import embodied_forward, text_forward

    out: dict = {}
    # ---------------------------------------------------------------- the MLP policy
    fresh_mlp, mlp_batch, update_config = _mlp_setup(rank)
    for mode in ("token-mean", "seq-mean-token-mean"):
        algorithm, _ = update_config("ppo_clip", "action", loss_agg_mode=mode)
        for name, fields in {"ddp": {}, "ddp_micro": {"micro_batch_size": 1},
                             "fsdp": {"strategy": "fsdp"},
                             "fsdp_micro": {"strategy": "fsdp", "micro_batch_size": 1},
                             "fsdp_micro_deferred": {"strategy": "fsdp", "micro_batch_size": 1,
                                                     "fsdp": {"sync_every_micro_batch": False}}}.items():
            out[f"mlp/{mode}/{name}"] = _run(fresh_mlp, mlp_batch, algorithm, embodied_forward, **fields)
    algorithm, _ = update_config("ppo_clip", "action")
    for name, fields in {"ddp_gc": {"gradient_checkpointing": True},
                         "fsdp_gc": {"strategy": "fsdp", "gradient_checkpointing": True}}.items():
        out[f"mlp/token-mean/{name}"] = _run(fresh_mlp, mlp_batch, algorithm, embodied_forward, **fields)
    out["resume"] = _resume(fresh_mlp, mlp_batch, algorithm, ckpt_root, rank)
    out["resume_before_first_update"] = _resume_before_first_update(fresh_mlp, mlp_batch, algorithm, ckpt_root)
    out["global"] = _global_minibatch(rank, fresh_mlp, mlp_batch, update_config)

    # ---------------------------------------------------------------- the tiny causal LM
    from policies.causal_lm import CausalLMConfig, CausalLMPolicy

    def fresh_lm():
        torch.manual_seed(0)
        return CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=lm_dir, max_prompt_length=32,
                                                             max_response_length=8))

    text_batch = _text_batch(fresh_lm(), rank)
    algorithm = AlgorithmSection(policy_loss="ppo_clip", ratio_granularity="action", loss_agg_mode="token-mean")
    for name, fields in {"ddp": {}, "fsdp": {"strategy": "fsdp"},
                         "fsdp_micro": {"strategy": "fsdp", "micro_batch_size": 1},
                         "ddp_gc": {"gradient_checkpointing": True},
                         "fsdp_gc": {"strategy": "fsdp", "gradient_checkpointing": True}}.items():
        out[f"lm/{name}"] = _run(fresh_lm, text_batch, algorithm, text_forward, lr=1e-3, **fields)

    def lora_lm():
        policy = fresh_lm()
        policy.apply_lora(rank=4)
        return policy

    for name, fields in {"ddp_lora": {}, "fsdp_lora": {"strategy": "fsdp"}}.items():
        out[f"lm/{name}"] = _run(lora_lm, text_batch, algorithm, text_forward, lr=1e-3, **fields)
    # Worker 0's prompts repeat (two responses each), worker 1's do not: one minibatch each.
    mixed = text_batch if rank == 0 else _text_batch(fresh_lm(), rank, repeats=1)
    for name, fields in {"ddp": {}, "fsdp": {"strategy": "fsdp"}}.items():
        out[f"lm/{name}_mixed_prompts"] = _run(fresh_lm, mixed, algorithm, text_forward, lr=1e-3,
                                               ppo_mini_batch_size=8, **fields)

    out["lm/sft_global"] = _sft_global_minibatch(rank, fresh_lm)

    # ---------------------------------------------------------------- tiny OpenVLA-OFT with LoRA
    out["oft"] = _oft_lora(rank)
    # ---------------------------------------------------------------- tiny π0 (joint layers)
    out["pi0"] = _pi0(rank)
    return out


def _global_minibatch(rank: int, fresh, shard, update_config) -> dict:
    """One minibatch of all 8 episodes: split 5 / 3 over the two workers (35 and 16 decision
    steps), with DDP and with FSDP in micro-batches of 2; and on worker 0 alone, whole, in a
    process group of its own."""
    from test_actor import rollout_batch

    from vla_rl.trainers.actor import embodied_forward

    alone = [dist.new_group([r]) for r in range(WORLD)]  # collective: every worker makes both
    out = {}
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        algorithm, _ = update_config("ppo_clip", "action", loss_agg_mode=mode)
        for name, fields in {"ddp": {}, "fsdp_micro": {"strategy": "fsdp", "micro_batch_size": 2}}.items():
            out[f"{mode}/{name}"] = _run(fresh, shard, algorithm, embodied_forward, steps=1, ppo_mini_batch_size=8,
                                         **fields)
        if rank == 0:
            out[f"{mode}/one_worker"] = _run(fresh, rollout_batch(fresh()), algorithm, embodied_forward, steps=1,
                                             ppo_mini_batch_size=8, group=alone[0])
    return out


def _sft_global_minibatch(rank: int, fresh_lm) -> dict:
    """Supervised fine-tuning, one minibatch of 8 targets: 32 target tokens on worker 0, 14 on
    worker 1 (DDP; FSDP in micro-batches of 3), and on worker 0 alone the whole of it."""
    from vla_rl.trainers.actor import ActorTrainer, text_forward
    from vla_rl_core import keys

    def targets(r: int) -> TensorDict:
        batch = _text_batch(fresh_lm(), r)
        lengths = torch.tensor([8, 8, 8, 8] if r == 0 else [8, 3, 1, 2])
        batch[keys.RESPONSE_MASK] = torch.arange(8)[None, :] < lengths[:, None]
        return batch

    def sft(batch, group=None, **fields) -> dict:
        policy = fresh_lm()
        section = _trainer_section(**fields)
        trainer = ActorTrainer(policy, lr=1e-3, group=group, forward=text_forward, trainer=section)
        grads: dict[str, torch.Tensor] = {}
        trainer.optimizer.register_step_pre_hook(lambda *_: grads.update(_full_grads(trainer.parallel.trained)))
        metrics = trainer.supervised_update(batch, 1, 8, 1.0, torch.Generator().manual_seed(3),
                                            section.micro_batch_size)
        return {"losses": [metrics["sft/loss"]], "grads": grads}

    alone = [dist.new_group([r]) for r in range(WORLD)]  # collective: every worker makes both
    out = {"ddp": sft(targets(rank)), "fsdp_micro": sft(targets(rank), strategy="fsdp", micro_batch_size=3)}
    if rank == 0:
        out["one_worker"] = sft(torch.cat([targets(0), targets(1)]), group=alone[0])
    return out


def _resume(fresh, batch, algorithm, ckpt_root: str, rank: int) -> dict:
    """FSDP: two updates straight through, against one update, a sharded checkpoint (staged,
    manifest, atomic publish), a fresh policy and trainer restored from it as a resume restores
    them, and the second update."""
    from vla_rl.checkpoints import files as ckpt
    from vla_rl.checkpoints.integrity import verify_checkpoint
    from vla_rl.checkpoints.layout import MANIFEST_FILE
    from vla_rl.trainers.actor import ActorTrainer

    section = _trainer_section(strategy="fsdp")

    def update(trainer, step):
        trainer.update(batch, algorithm, section, torch.Generator().manual_seed(10 + step))

    straight = ActorTrainer(fresh(), lr=1e-2, trainer=section)
    update(straight, 0)
    staging = ckpt.staging_dir(ckpt_root, 1)
    straight.save_sharded(staging)
    if rank == 0:
        ckpt.save_trainer_state(staging, 1)
    dist.barrier()
    if rank == 0:
        ckpt.finalize_checkpoint(ckpt_root, 1)
    dist.barrier()
    path = ckpt.checkpoint_dir(ckpt_root, 1)
    verified = verify_checkpoint(path)
    update(straight, 1)

    policy = fresh()
    ckpt.load_policy_weights(path, policy)  # the policy resource, restored before the actor is built
    resumed = ActorTrainer(policy, lr=1e-2, trainer=section)
    resumed.load_sharded(path)
    update(resumed, 1)

    def local_optimizer_state(trainer):
        return [value.to_local().clone() if hasattr(value, "to_local") else value.clone()
                for state in trainer.optimizer.state.values() for value in state.values()]

    return {"verified": verified, "straight": _weights(straight.policy), "resumed": _weights(resumed.policy),
            "straight_optimizer": local_optimizer_state(straight), "resumed_optimizer": local_optimizer_state(resumed),
            "manifest": json.loads((path / MANIFEST_FILE).read_text())["files"]}


def _resume_before_first_update(fresh, batch, algorithm, ckpt_root: str) -> dict:
    """FSDP: a checkpoint written before the optimizer's first step (every group filtered out so
    far). DCP's get_state_dict initialises an empty optimizer by one step at lr 0, which left Adam's
    step count at 1 in the run that saved and in the checkpoint: every later update had another
    bias correction than the run that never saved. Two updates: never saved, saved first, and
    resumed from that checkpoint."""
    from vla_rl.trainers.actor import ActorTrainer

    section = _trainer_section(strategy="fsdp")

    def two_updates(trainer):
        for step in range(2):
            trainer.update(batch, algorithm, section, torch.Generator().manual_seed(10 + step))
        return _weights(trainer.policy)

    never_saved = two_updates(ActorTrainer(fresh(), lr=1e-2, trainer=section))
    saving = ActorTrainer(fresh(), lr=1e-2, trainer=section)
    path = f"{ckpt_root}/before_first_update"
    saving.save_sharded(path)
    dist.barrier()
    saved = two_updates(saving)
    resumed = ActorTrainer(fresh(), lr=1e-2, trainer=section)
    resumed.load_sharded(path)
    return {"never_saved": never_saved, "saved": saved, "resumed": two_updates(resumed)}


def _oft_lora(rank: int) -> dict:
    """Tiny OpenVLA-OFT with LoRA: DDP over two minibatches (the frozen towers' unused block made
    DDP fail on the second one when LoRA re-enabled it) and FSDP."""
    from test_actor import TINY_CONFIGS, rollout_batch, update_config

    from policies import make_policy
    from vla_rl.trainers.actor import embodied_forward

    def fresh():
        torch.manual_seed(0)
        policy = make_policy("openvla_oft", TINY_CONFIGS["openvla_oft"]())
        policy.apply_lora(rank=4)
        return policy

    policy = fresh()
    unused = {id(p) for tower in _towers(policy) for p in tower.unused_parameters()}
    frozen_names = [name for name, p in policy.named_parameters() if id(p) in unused]
    batch = rollout_batch(policy)[4 * rank:4 * rank + 4]
    algorithm, _ = update_config("ppo_clip", "action")
    initial = _weights(policy)
    out = {"frozen_names": frozen_names, "initial": initial}
    for name, fields in {"ddp": {}, "fsdp": {"strategy": "fsdp"}}.items():
        out[name] = _run(fresh, batch, algorithm, embodied_forward, lr=1e-3, **fields)
    from peft.tuners.lora import LoraLayer

    out["lora_in_unused_blocks"] = [name for name, module in policy.named_modules() if isinstance(module, LoraLayer)
                                    and any(id(p) in unused for p in module.get_base_layer().parameters())]
    return out


def _pi0(rank: int) -> dict:
    """Tiny π0 under DDP and FSDP, each with and without activation checkpointing, counting the
    joint-layer computations of the updates: π0 runs its decoder layers' submodules itself, so
    FSDP units of single decoder layers were never unsharded ("mixed torch.Tensor and DTensor")
    and transformers' checkpointing never recomputed them."""
    from test_actor import TINY_CONFIGS, rollout_batch, update_config

    import policies.pi0.backbone_pi0 as backbone
    from policies import make_policy
    from vla_rl.trainers.actor import embodied_forward

    def fresh():
        torch.manual_seed(0)
        return make_policy("pi0", TINY_CONFIGS["pi0"]())

    batch = rollout_batch(fresh())[4 * rank:4 * rank + 4]
    algorithm, _ = update_config("ppo_clip", "action")
    calls = {"joint_layer": 0}
    original = backbone._joint_layer

    def counted(*args, **kwargs):
        calls["joint_layer"] += 1
        return original(*args, **kwargs)

    backbone._joint_layer = counted
    out = {}
    try:
        for name, fields in {"ddp": {}, "fsdp": {"strategy": "fsdp"}, "ddp_gc": {"gradient_checkpointing": True},
                             "fsdp_gc": {"strategy": "fsdp", "gradient_checkpointing": True}}.items():
            calls["joint_layer"] = 0
            out[name] = {**_run(fresh, batch, algorithm, embodied_forward, lr=1e-3, **fields),
                         "joint_layer_calls": calls["joint_layer"]}
    finally:
        backbone._joint_layer = original
    return out


def _towers(policy):
    backbone = policy.vla.vision_backbone
    return [t for t in (backbone.featurizer, backbone.fused_featurizer) if t is not None]


@pytest.fixture(scope="module")
def runs(tiny_lm_dir, tmp_path_factory):
    """Every scenario's records, by worker: ``runs[rank][scenario]``."""
    return spawn_workers(_scenarios, tiny_lm_dir, tmp_path_factory.mktemp("fsdp_checkpoints"))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_fsdp_matches_ddp_on_the_mlp(runs, mode):
    for rank in range(WORLD):
        ddp, fsdp = runs[rank][f"mlp/{mode}/ddp"], runs[rank][f"mlp/{mode}/fsdp"]
        assert _max_loss_gap(ddp, fsdp) < 1e-5
        assert _max_abs(ddp["grads"], fsdp["grads"]) < 1e-6
        assert _max_abs(ddp["weights"], fsdp["weights"]) < 1e-5
        assert max(abs(x - y) for x, y in zip(ddp["norms"], fsdp["norms"], strict=True)) < 1e-5


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("strategy", ["ddp", "fsdp_micro"])
def test_two_workers_update_as_one_worker_on_the_whole_minibatch(runs, mode, strategy):
    """The loss is normalised by the global minibatch (verl's global-batch ``agg_loss``): two
    workers holding 35 and 16 decision steps of one minibatch compute the gradient, the loss and
    the update of one worker holding all 51 (each worker normalising its own minibatch would weigh
    worker 1's steps twice as much under token-mean)."""
    whole = runs[0]["global"][f"{mode}/one_worker"]
    for rank in range(WORLD):
        split = runs[rank]["global"][f"{mode}/{strategy}"]
        assert _max_abs(split["grads"], whole["grads"]) < 1e-6
        assert _max_loss_gap(split, whole) < 1e-6
        assert _max_abs(split["weights"], whole["weights"]) < 1e-6
        # the gradient before clipping (the grads above are clipped to trainer.max_grad_norm, which
        # hid a gradient 1/world too small: each pass's loss scaled by its share, not share * workers)
        assert split["norms"][0] == pytest.approx(whole["norms"][0], rel=1e-5)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp_micro"])
def test_two_workers_fine_tune_as_one_worker_on_the_whole_minibatch(runs, strategy):
    """Supervised fine-tuning's token mean is the global minibatch's too (32 + 14 target tokens)."""
    whole = runs[0]["lm/sft_global"]["one_worker"]
    for rank in range(WORLD):
        split = runs[rank]["lm/sft_global"][strategy]
        assert _max_loss_gap(split, whole) < 1e-6
        assert _max_abs(split["grads"], whole["grads"]) < 1e-6


def test_fsdp_matches_ddp_on_the_causal_lm(runs):
    for rank in range(WORLD):
        ddp, fsdp = runs[rank]["lm/ddp"], runs[rank]["lm/fsdp"]
        assert _max_loss_gap(ddp, fsdp) < 1e-5
        assert _max_abs(ddp["grads"], fsdp["grads"]) < 1e-5
        assert _max_abs(ddp["weights"], fsdp["weights"]) < 1e-5
    # Both workers hold the same policy after the updates (FSDP refreshes it from the shards).
    assert _max_abs(runs[0]["lm/fsdp"]["weights"], runs[1]["lm/fsdp"]["weights"]) == 0.0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "fsdp_deferred"])
def test_micro_batches_give_the_minibatch_update(runs, mode, strategy):
    """Micro-batches of one episode (worker 1's second minibatch holds one episode, worker 0's
    three: worker 1 runs two passes that change nothing) accumulate the minibatch's gradient."""
    whole = "ddp" if strategy == "ddp" else "fsdp"
    micro = {"ddp": "ddp_micro", "fsdp": "fsdp_micro", "fsdp_deferred": "fsdp_micro_deferred"}[strategy]
    for rank in range(WORLD):
        a, b = runs[rank][f"mlp/{mode}/{whole}"], runs[rank][f"mlp/{mode}/{micro}"]
        assert _max_abs(a["grads"], b["grads"]) < 1e-6
        assert _max_loss_gap(a, b) < 1e-6
        assert _max_abs(a["weights"], b["weights"]) < 1e-6


def test_fsdp_trains_the_causal_lm_whether_or_not_a_workers_prompts_repeat(runs):
    """Regression: the causal LM encodes a repeated prompt once and runs its responses on the
    cache (two forward passes), distinct prompts in one pass; under FSDP each pass all-gathers
    the blocks, so a worker with repeated prompts and one without ran mismatched collectives
    (gloo aborted the workers: "Received data size doesn't match expected size"; in the engine,
    llm_grpo and llm_ppo with trainer.micro_batch_size). The training copy now always makes one
    pass, and updates as DDP does."""
    for rank in range(WORLD):
        ddp, fsdp = runs[rank]["lm/ddp_mixed_prompts"], runs[rank]["lm/fsdp_mixed_prompts"]
        assert _max_loss_gap(ddp, fsdp) < 1e-5
        assert _max_abs(ddp["weights"], fsdp["weights"]) < 1e-5


def test_micro_batches_on_the_causal_lm(runs):
    for rank in range(WORLD):
        a, b = runs[rank]["lm/fsdp"], runs[rank]["lm/fsdp_micro"]
        assert _max_abs(a["grads"], b["grads"]) < 1e-6
        assert _max_loss_gap(a, b) < 1e-6


@pytest.mark.parametrize("model", ["mlp/token-mean", "lm"])
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_gradient_checkpointing_gives_the_same_update(runs, model, strategy):
    """The MLP through torch's checkpoint_wrapper around its layers, the LM through transformers'
    own (which gives up the shared-prompt KV cache: the same numbers up to float rounding)."""
    for rank in range(WORLD):
        a, b = runs[rank][f"{model}/{strategy}"], runs[rank][f"{model}/{strategy}_gc"]
        assert _max_loss_gap(a, b) < 1e-6
        assert _max_abs(a["grads"], b["grads"]) < 1e-6


def test_a_sharded_checkpoint_resumes_bit_identically(runs):
    for rank in range(WORLD):
        resume = runs[rank]["resume"]
        assert resume["verified"] is True
        assert _max_abs(resume["straight"], resume["resumed"]) == 0.0
        assert all(torch.equal(a, b) for a, b in zip(resume["straight_optimizer"], resume["resumed_optimizer"],
                                                      strict=True))
    files = runs[0]["resume"]["manifest"]
    assert {"actor_sharded/.metadata", "actor_sharded/__0_0.distcp", "actor_sharded/__1_0.distcp",
            "trainer_state.json"} <= set(files)
    assert all(len(entry["sha256"]) == 64 for entry in files.values())


def test_a_checkpoint_before_the_first_update_changes_no_later_update(runs):
    for rank in range(WORLD):
        run = runs[rank]["resume_before_first_update"]
        assert _max_abs(run["never_saved"], run["saved"]) == 0.0
        assert _max_abs(run["never_saved"], run["resumed"]) == 0.0


def test_lora_keeps_the_frozen_towers_frozen_under_ddp_and_fsdp(runs):
    """Regression: apply_lora re-enabled gradients on the towers' unused last block, and DDP
    failed on the second minibatch. Now the block gets no adapter, its parameters stay frozen
    and unchanged, only adapters train, and two minibatches run under DDP and FSDP alike."""
    for rank in range(WORLD):
        oft = runs[rank]["oft"]
        assert oft["frozen_names"] and not oft["lora_in_unused_blocks"]
        for strategy in ("ddp", "fsdp"):
            run = oft[strategy]
            assert run["trainable"] and all("lora_" in name for name in run["trainable"])
            assert not set(oft["frozen_names"]) & set(run["trainable"])
            for name in oft["frozen_names"]:
                assert torch.equal(run["weights"][name], oft["initial"][name]), name
            assert any(not torch.equal(run["weights"][n], oft["initial"][n]) for n in run["trainable"])
        assert _max_loss_gap(oft["ddp"], oft["fsdp"]) < 1e-5
        assert _max_abs(oft["ddp"]["weights"], oft["fsdp"]["weights"]) < 1e-5


def test_lora_on_the_causal_lm_trains_only_adapters_under_fsdp(runs):
    for rank in range(WORLD):
        ddp, fsdp = runs[rank]["lm/ddp_lora"], runs[rank]["lm/fsdp_lora"]
        assert fsdp["trainable"] and all("lora_" in name for name in fsdp["trainable"])
        assert _max_loss_gap(ddp, fsdp) < 1e-5
        assert _max_abs(ddp["weights"], fsdp["weights"]) < 1e-5


def _split_key_biases(tensors: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """(key-projection biases, the rest). A key bias adds one vector to every key of a head, so
    each row of attention logits shifts by one constant the softmax cancels: its gradient is zero
    in exact arithmetic, float32 rounding noise (≈ 1e-11) in practice, and Adam's step
    m / (√v + ε) turns that noise into steps up to lr, which differ with the summation order of
    DDP's all-reduce and FSDP's reduce-scatter (3.7e-5 after two steps at lr 1e-3 on an AMD EPYC
    host, under 1e-5 on others)."""
    key_biases = {k: v for k, v in tensors.items() if k.endswith("k_proj.bias")}
    return key_biases, {k: v for k, v in tensors.items() if k not in key_biases}


def test_pi0_trains_under_fsdp_as_under_ddp(runs):
    for rank in range(WORLD):
        pi0 = runs[rank]["pi0"]
        ddp, fsdp = pi0["ddp"], pi0["fsdp"]
        assert _max_loss_gap(ddp, fsdp) < 1e-5
        assert _max_abs(ddp["grads"], fsdp["grads"]) < 1e-5
        (ddp_key_biases, ddp_weights), (fsdp_key_biases, fsdp_weights) = map(_split_key_biases,
                                                                             (ddp["weights"], fsdp["weights"]))
        assert len(ddp_key_biases) == 2  # SigLIP's two layers (Gemma's projections have no bias)
        assert max(float(g.abs().max()) for g in _split_key_biases(ddp["grads"])[0].values()) < 1e-9
        assert _max_abs(ddp_weights, fsdp_weights) < 1e-5
        assert _max_abs(ddp_key_biases, fsdp_key_biases) <= 2 * 1e-3 * 1.01  # two Adam steps of at most lr
    assert _max_abs(runs[0]["pi0"]["fsdp"]["weights"], runs[1]["pi0"]["fsdp"]["weights"]) == 0.0


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_pi0_gradient_checkpointing_recomputes_every_joint_layer(runs, strategy):
    """Every joint-layer computation of the updates runs twice with checkpointing (forward and
    recomputation in the backward pass), and the update is the same."""
    for rank in range(WORLD):
        plain, checkpointed = runs[rank]["pi0"][strategy], runs[rank]["pi0"][f"{strategy}_gc"]
        assert plain["joint_layer_calls"] > 0
        assert checkpointed["joint_layer_calls"] == 2 * plain["joint_layer_calls"]
        # the tiny π0's 2 SigLIP layers and 2 depths of joint layers
        assert (plain["checkpointed_blocks"], checkpointed["checkpointed_blocks"]) == (0, 4)
        assert _max_loss_gap(plain, checkpointed) < 1e-6
        assert _max_abs(plain["grads"], checkpointed["grads"]) < 1e-6
