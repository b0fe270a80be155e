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
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tensordict import TensorDict

from vla_rl.utils.ray_utils import free_loopback_port

WORLD = 2
MLP_SPLIT = (5, 3)  # episodes of the 8 MLP episodes on each worker


def _entry(rank: int, port: int, lm_dir: str, ckpt_root: str, results) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        results[rank] = _scenarios(rank, lm_dir, ckpt_root)
    finally:
        dist.destroy_process_group()


def _trainer_section(**fields):
    from vla_rl.config import TrainerSection

    fsdp = fields.pop("fsdp", {})
    return TrainerSection(**{"ppo_epochs": 1, "ppo_mini_batch_size": 4, "max_grad_norm": 1.0, **fields}, fsdp=fsdp)


def _run(make_policy_fn, batch, algorithm, forward, steps: int = 2, lr: float = 1e-2, **trainer_fields):
    """Train a fresh policy for ``steps`` updates; its per-update losses and grad norms, the first
    minibatch's whole gradient, and the policy's final weights."""
    from vla_rl.trainers.actor import ActorTrainer

    policy = make_policy_fn()
    section = _trainer_section(**trainer_fields)
    trainer = ActorTrainer(policy, lr=lr, forward=forward, trainer=section)
    first_grads: dict[str, torch.Tensor] = {}

    def record(optimizer, args, kwargs):
        if not first_grads:
            first_grads.update(_full_grads(trainer.parallel.trained))

    handle = trainer.optimizer.register_step_pre_hook(record)
    losses, norms = [], []
    for step in range(steps):
        metrics = trainer.update(batch, algorithm, section, torch.Generator().manual_seed(10 + step))
        losses.append(metrics["actor/pg_loss"])
        norms.append(metrics["actor/grad_norm"])
        if step == 0:
            handle.remove()
    return {"losses": losses, "norms": norms, "grads": first_grads, "weights": _weights(policy),
            "trainable": sorted(n for n, p in policy.named_parameters() if p.requires_grad),
            "checkpointed_blocks": trainer.parallel.checkpointed_blocks}


def _full_grads(module) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    grads = {}
    for name, parameter in module.named_parameters():
        if parameter.grad is not None:
            grad = parameter.grad.full_tensor() if isinstance(parameter.grad, DTensor) else parameter.grad
            grads[name.replace("_checkpoint_wrapped_module.", "")] = grad.detach().clone()
    return grads


def _weights(module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def _mlp_setup(rank: int):
    from test_actor import TINY_CONFIGS, rollout_batch, update_config

    from policies import make_policy

    def fresh():
        torch.manual_seed(0)
        return make_policy("mlp", TINY_CONFIGS["mlp"]())

    batch = rollout_batch(fresh())
    start = sum(MLP_SPLIT[:rank])
    return fresh, batch[start:start + MLP_SPLIT[rank]], update_config


def _text_batch(policy, rank: int, repeats: int = 2) -> TensorDict:
    """Four responses per worker to ``4 / repeats`` prompts (``repeats`` sampled responses
    each), with fixed advantages."""
    from vla_rl_core import keys

    count = 4 // repeats
    prompts = [[{"role": "user", "content": f"What is {i} + {2 * i + 1}?"}]
               for i in range(count * rank, count * rank + count)]
    ids, mask = policy.processor.encode_prompts(prompts, max_length=32)
    ids, mask = ids.repeat_interleave(repeats, 0), mask.repeat_interleave(repeats, 0)
    generation = policy.generate(ids, mask, max_new_tokens=8, generator=torch.Generator().manual_seed(rank))
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * generation.response_mask
    return TensorDict({keys.INPUT_IDS: ids, keys.ATTENTION_MASK: mask, keys.RESPONSES: generation.responses,
                       keys.RESPONSE_MASK: generation.response_mask,
                       keys.OLD_LOG_PROBS: generation.log_probs[..., None], keys.ADVANTAGES: advantages},
                      batch_size=[4])


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

    # ---------------------------------------------------------------- tiny OpenVLA-OFT with LoRA
    out["oft"] = _oft_lora(rank)
    # ---------------------------------------------------------------- tiny π0 (joint layers)
    out["pi0"] = _pi0(rank)
    # ---------------------------------------------------------------- the first ratio in bf16
    out["first_ratio"] = _first_ratios(rank, lm_dir)
    out["bf16_rollout"] = _bf16_rollouts(rank)
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


class _Patch:
    """``monkeypatch.setattr`` for the spawned workers, undone by :meth:`undo`."""

    def __init__(self) -> None:
        self.saved: list = []

    def setattr(self, target, name, value) -> None:
        self.saved.append((target, name, getattr(target, name)))
        setattr(target, name, value)

    def undo(self) -> None:
        for target, name, value in reversed(self.saved):
            setattr(target, name, value)
        self.saved.clear()


def _first_ratios(rank: int, lm_dir: str) -> dict:
    """One FSDP update per case whose training copy computes in other dtypes than the float32
    policy the rollout sampled with: bfloat16 mixed precision (CPU admitted as an accelerator:
    the bf16 emulation of a CUDA run's ``mixed_precision: auto``) and bfloat16 master weights
    (a configuration a CPU run can take). Records the first minibatch's log-probs against the
    old ones the loss got, and ``actor/old_log_prob_max_diff`` (the rollout's gap)."""
    from test_actor import TINY_CONFIGS, rollout_batch, spy_on_losses, update_config

    import vla_rl.trainers.strategy as strategy
    from policies import make_policy
    from vla_rl.config import AlgorithmSection
    from vla_rl.trainers.actor import ActorTrainer, embodied_forward, text_forward

    def embodied(name: str, split: tuple[int, int]):
        def fresh():
            torch.manual_seed(0)
            return make_policy(name, TINY_CONFIGS[name]())
        start = sum(split[:rank])
        return fresh, rollout_batch(fresh())[start:start + split[rank]], embodied_forward

    def text():
        from policies.causal_lm import CausalLMConfig, CausalLMPolicy

        def fresh():
            torch.manual_seed(0)
            return CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=lm_dir, max_prompt_length=32,
                                                                 max_response_length=8))
        return fresh, _text_batch(fresh(), rank), text_forward

    mlp = embodied("mlp", MLP_SPLIT)
    cases = {"mlp": (mlp, {}), "mlp_micro": (mlp, {"micro_batch_size": 2}),
             "pi0": (embodied("pi0", (4, 4)), {}), "openvla_oft": (embodied("openvla_oft", (4, 4)), {}),
             "lm": (text(), {}), "mlp_bf16_master": (mlp, {"fsdp": {"master_dtype": "bfloat16"}})}
    out = {}
    for name, ((fresh, batch, forward), fields) in cases.items():
        patch = _Patch()
        if "master" not in name:
            patch.setattr(strategy, "ACCELERATORS", (*strategy.ACCELERATORS, "cpu"))
        calls = spy_on_losses(patch)
        try:
            algorithm = update_config("ppo_clip", "action")[0]
            if forward is text_forward:
                algorithm = AlgorithmSection(policy_loss="ppo_clip", ratio_granularity="action",
                                             loss_agg_mode="token-mean")
            section = _trainer_section(strategy="fsdp", **fields)
            trainer = ActorTrainer(fresh(), lr=1e-3, forward=forward, trainer=section)
            metrics = trainer.update(batch, algorithm, section, torch.Generator().manual_seed(10))
        finally:
            patch.undo()
        log_probs, old_log_probs, mask, first = calls[0]
        out[name] = {"recomputes": trainer.parallel.recomputes_old_log_probs, "log_probs": log_probs[mask],
                     "old_log_probs": old_log_probs[mask], "ratio_mean": first["ratio_mean"],
                     "rollout_gap": metrics["actor/old_log_prob_max_diff"], "dtype": log_probs.dtype,
                     "policy_dtypes": {p.dtype for p in trainer.policy.parameters() if p.is_floating_point()},
                     "buffer_dtypes": {b.dtype for b in trainer.policy.buffers() if b.is_floating_point()},
                     "rolls_out": _rolls_out(trainer.policy, forward)}
    return out


def _bf16_rollouts(rank: int) -> dict:
    """In the bf16 emulation, per policy: references built before and after the actor (which
    casts the policy to bfloat16), then one FSDP update with the KL loss term on the episodes the
    bfloat16 policy rolled out, scored by the reference built first. One minibatch per worker,
    so ``actor/kl_loss`` is the first minibatch's."""
    from types import SimpleNamespace

    from test_actor import TINY_CONFIGS, rollout_batch, update_config

    import vla_rl.trainers.strategy as strategy
    from policies import make_policy
    from vla_rl.nodes.inference import build_reference
    from vla_rl.trainers.actor import ActorTrainer, per_dim_log_probs
    from vla_rl_core import keys

    out = {}
    for name, split in {"mlp": MLP_SPLIT, "pi0": (4, 4), "openvla_oft": (4, 4)}.items():
        patch = _Patch()
        patch.setattr(strategy, "ACCELERATORS", (*strategy.ACCELERATORS, "cpu"))
        try:
            torch.manual_seed(0)
            policy = make_policy(name, TINY_CONFIGS[name]())
            section = _trainer_section(strategy="fsdp", ppo_mini_batch_size=8)
            resources = SimpleNamespace(policy=policy, config=SimpleNamespace(trainer=section),
                                        device=torch.device("cpu"))
            reference_first = build_reference(resources)
            trainer = ActorTrainer(policy, lr=1e-3, trainer=section)
            reference_later = build_reference(resources)
            start = sum(split[:rank])
            batch = rollout_batch(policy)[start:start + split[rank]]  # sampled by the bfloat16 policy
            batch.set(keys.REF_LOG_PROBS, per_dim_log_probs(reference_first, batch))
            algorithm = update_config("ppo_clip", "action", use_kl_loss=True, kl_loss_coef=0.1)[0]
            metrics = trainer.update(batch, algorithm, section, torch.Generator().manual_seed(10))
        finally:
            patch.undo()
        out[name] = {"rollout_gap": metrics["actor/old_log_prob_max_diff"], "kl_loss": metrics["actor/kl_loss"],
                     "num_updates": metrics["actor/num_updates"],
                     "reference_dtypes": [{p.dtype for p in ref.parameters() if p.is_floating_point()}
                                          for ref in (reference_first, reference_later)],
                     "references_equal": all(torch.equal(a, b) for a, b in zip(
                         reference_first.state_dict().values(), reference_later.state_dict().values()))}
    return out


def _rolls_out(policy, forward) -> bool:
    """Whether ``policy`` (the rollout's, after the update) samples with float32 log-probs."""
    from test_actor import rollout_batch

    from vla_rl_core import keys

    if forward.__name__ == "text_forward":
        ids, mask = policy.processor.encode_prompts([[{"role": "user", "content": "What is 1 + 2?"}]], max_length=32)
        return policy.generate(ids, mask, max_new_tokens=4).log_probs.dtype == torch.float32
    return rollout_batch(policy)[keys.OLD_LOG_PROBS].dtype == torch.float32


def _towers(policy):
    backbone = policy.vla.vision_backbone
    return [t for t in (backbone.featurizer, backbone.fused_featurizer) if t is not None]


@pytest.fixture(scope="module")
def runs(tiny_lm_dir, tmp_path_factory):
    """Every scenario's records, by worker: ``runs[rank][scenario]``."""
    results = mp.Manager().dict()
    root = tmp_path_factory.mktemp("fsdp_checkpoints")
    mp.spawn(_entry, args=(free_loopback_port(), str(tiny_lm_dir), str(root), results), nprocs=WORLD, join=True)
    return {rank: results[rank] for rank in range(WORLD)}


def _max_abs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between same-named tensors (NaN where both are NaN: 0,
    e.g. OFT's unset proprio statistics)."""
    assert sorted(a) == sorted(b)
    gaps = [torch.where(a[k].isnan() & b[k].isnan(), 0.0, a[k].double() - b[k].double()).abs().max() for k in a]
    return max(float(gap) for gap in gaps)


def _max_loss_gap(a: dict, b: dict) -> float:
    return max(abs(x - y) for x, y in zip(a["losses"], b["losses"], strict=True))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_fsdp_matches_ddp_on_the_mlp(runs, mode):
    for rank in range(WORLD):
        ddp, fsdp = runs[rank][f"mlp/{mode}/ddp"], runs[rank][f"mlp/{mode}/fsdp"]
        assert _max_loss_gap(ddp, fsdp) < 1e-5
        assert _max_abs(ddp["grads"], fsdp["grads"]) < 1e-6
        assert _max_abs(ddp["weights"], fsdp["weights"]) < 1e-5
        assert max(abs(x - y) for x, y in zip(ddp["norms"], fsdp["norms"], strict=True)) < 1e-5


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


def test_pi0_trains_under_fsdp_as_under_ddp(runs):
    for rank in range(WORLD):
        pi0 = runs[rank]["pi0"]
        ddp, fsdp = pi0["ddp"], pi0["fsdp"]
        assert _max_loss_gap(ddp, fsdp) < 1e-5
        assert _max_abs(ddp["grads"], fsdp["grads"]) < 1e-5
        assert _max_abs(ddp["weights"], fsdp["weights"]) < 1e-5
    assert _max_abs(runs[0]["pi0"]["fsdp"]["weights"], runs[1]["pi0"]["fsdp"]["weights"]) == 0.0


@pytest.mark.parametrize("case", ["mlp", "mlp_micro", "pi0", "openvla_oft", "lm", "mlp_bf16_master"])
def test_the_first_ratio_is_one_when_fsdp_computes_in_bfloat16(runs, case):
    """Regression: FSDP computed the update in bfloat16 while the rollout's log-probs were the
    float32 policy's, so the first minibatch's ratio was not 1 (max |log-ratio| 0.048 on the MLP,
    0.11 on π0 in the CPU bf16 emulation). The trainer now scores the rollout's actions with its
    training copy first; the gap to the rollout's log-probs is reported, not trained on."""
    for rank in range(WORLD):
        record = runs[rank]["first_ratio"][case]
        assert record["recomputes"] is True
        assert record["rollout_gap"] > 1e-4  # the float32 rollout's log-probs are not the trainer's
        assert record["dtype"] == torch.float32
        assert torch.equal(record["log_probs"], record["old_log_probs"])
        assert record["ratio_mean"] == 1.0
        # bfloat16 rollouts under mixed precision (the float32 master weights are the copy's)
        expected = {torch.float32} if case == "mlp_bf16_master" else {torch.bfloat16}
        assert record["policy_dtypes"] == expected and record["rolls_out"] is True
        if case in ("mlp", "pi0"):
            assert record["buffer_dtypes"] == {torch.float32}  # buffers keep their dtype, as under FSDP


@pytest.mark.parametrize("case", ["mlp", "pi0", "openvla_oft"])
def test_under_fsdp_mixed_precision_the_trainer_and_the_reference_score_as_the_bfloat16_rollout(runs, case):
    """Regressions, in the bf16 emulation: FSDP's root cast the policy's inputs to bfloat16, so
    the trainer scored the rollout's continuous actions rounded to bfloat16, actions never taken
    (a gap of 0.020 nats on the MLP, 0.11 on π0 against the bfloat16 rollout's own log-probs);
    and a reference built before the actor stayed float32, so the KL term of the first
    minibatch was the float32/bfloat16 gap. Now the training copy computes exactly what the
    bfloat16 policy computes, and the reference is bfloat16 whenever it is built."""
    for rank in range(WORLD):
        record = runs[rank]["bf16_rollout"][case]
        assert record["num_updates"] == 1.0
        assert record["rollout_gap"] == 0.0
        assert record["reference_dtypes"] == [{torch.bfloat16}, {torch.bfloat16}]
        assert record["references_equal"]
        assert record["kl_loss"] == 0.0


def test_fsdp_in_the_policys_own_dtypes_keeps_the_rollouts_log_probs():
    """FSDP in the policy's own dtypes computes as the rollout: no second scoring pass."""
    from test_actor import TINY_CONFIGS

    from policies import make_policy
    from vla_rl.trainers.strategy import computes_differently

    policy = make_policy("mlp", TINY_CONFIGS["mlp"]())
    assert not computes_differently(policy, None, torch.float32)
    assert computes_differently(policy, None, torch.bfloat16)
    policy.requires_grad_(False)  # frozen parameters keep their dtype without mixed precision
    assert not computes_differently(policy, None, torch.bfloat16)
    # mixed precision casts each unit's inputs, which the plain policy does not, whatever its dtype,
    # and an accelerator's kernels may round otherwise for other batch shapes
    assert computes_differently(policy.to(torch.bfloat16), torch.bfloat16, torch.float32)


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
