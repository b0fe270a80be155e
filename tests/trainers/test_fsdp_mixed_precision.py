"""FSDP's bfloat16 mixed precision on two gloo workers (the harness of
tests/trainers/fsdp_harness.py, one spawn for the scenarios here), in the bf16 emulation (the CPU
admitted as an accelerator: a CUDA run's ``mixed_precision: auto``): the first ratio is 1 because
the trainer rescores the rollout's actions, the policy rolls out in bfloat16, and the trainer and
the reference score what the bfloat16 rollout scored."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from fsdp_harness import MLP_SPLIT, WORLD, _Patch, _text_batch, _trainer_section, spawn_workers


def _mixed_precision(rank: int, lm_dir: str, ckpt_root: str) -> dict:
    return {"first_ratio": _first_ratios(rank, lm_dir), "bf16_rollout": _bf16_rollouts(rank)}


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

    def embodied(name: str, split: tuple[int, int], **config_updates):
        def fresh():
            torch.manual_seed(0)
            return make_policy(name, dataclasses.replace(TINY_CONFIGS[name](), **config_updates))
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
             # as scripts/gpu_check.sh's pi0_fsdp part runs: Flow-Noise's float32 noise head, checkpointing
             "pi0_flow_noise": (embodied("pi0", (4, 4), sampler="flow_noise"), {"gradient_checkpointing": True}),
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



@pytest.fixture(scope="module")
def runs(tiny_lm_dir, tmp_path_factory):
    """Every scenario's records, by worker: ``runs[rank][scenario]``."""
    return spawn_workers(_mixed_precision, tiny_lm_dir, tmp_path_factory.mktemp("fsdp_mixed_precision"))


@pytest.mark.parametrize("case", ["mlp", "mlp_micro", "pi0", "openvla_oft", "lm", "mlp_bf16_master",
                                  "pi0_flow_noise"])
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

