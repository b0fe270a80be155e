"""The actor update of a causal LM: no-gradient scoring and the SFT pass compute no entropy, and
responses cut at the length limit (``truncated``) are masked out of the update as if they were
not in the batch (the embodied updates: test_actor.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from test_actor import update_config

from vla_rl.trainers.actor import ActorTrainer, per_dim_log_probs, text_forward
from vla_rl_core import keys


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_one_thread):
    """Small models on the shared machines run fastest on one thread."""


def _text_update(policy, batch, device, **overrides) -> tuple[dict[str, float], list[torch.Tensor], list[torch.Tensor]]:
    """One update of a copy of the causal LM ``policy`` on ``batch`` (one minibatch), in float32
    on any device (``trainer.mixed_precision: none``: the default ``auto`` computes in bfloat16
    autocast on an accelerator); its metrics, parameters and the minibatch's (clipped) gradients,
    which the trainer leaves in place after its one optimizer step."""

    policy = copy.deepcopy(policy).to(device)
    algorithm, trainer = update_config("ppo_clip", "action", **{"mixed_precision": "none", **overrides})
    metrics = ActorTrainer(policy, lr=1e-2, forward=text_forward, trainer=trainer).update(
        batch, algorithm, trainer, torch.Generator().manual_seed(2))
    return (metrics, [p.detach().clone() for p in policy.parameters()],
            [p.grad.detach().clone() for p in policy.parameters()])


@pytest.fixture(scope="module")
def text_batch(tiny_lm_dir):
    """A tiny causal LM and four sampled responses with fixed advantages; responses 1 and 3 are
    marked as cut at the length limit."""
    from fsdp_harness import _text_batch

    from policies.causal_lm import CausalLMConfig, CausalLMPolicy

    torch.manual_seed(0)
    policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(tiny_lm_dir), max_prompt_length=32,
                                                           max_response_length=8))
    batch = _text_batch(policy, 0)
    batch.set(keys.TRUNCATED, torch.tensor([False, True, False, True]))
    return policy, batch


def test_no_grad_scoring_and_the_sft_update_compute_no_entropy(process_group, text_batch, monkeypatch):
    """The reference's and the old policy's log-probs, and the SFT loss, read no entropy: none is
    computed (an LLM's would take one more ``(rows, R, vocab)`` float32 tensor than the
    log-probs), and the log-probs are those of the pass with the entropy."""
    from policies.causal_lm import modeling_causal_lm

    policy, batch = text_batch
    with torch.no_grad():
        expected = text_forward(policy, batch)[0]

    def refused(log_softmax):
        raise AssertionError("an entropy was computed")

    monkeypatch.setattr(modeling_causal_lm, "_entropy", refused)
    torch.testing.assert_close(per_dim_log_probs(policy, batch, text_forward, micro_batch_size=3), expected,
                               rtol=0, atol=0)
    assert text_forward(policy, batch, with_entropy=False)[1] is None
    trainer = ActorTrainer(copy.deepcopy(policy), lr=1e-3, forward=text_forward)
    metrics = trainer.supervised_update(batch, 1, 4, 1.0, torch.Generator().manual_seed(0))
    assert metrics["sft/num_updates"] == 1.0


def test_the_sft_update_takes_a_number_of_minibatches(process_group, text_batch):
    """trainer.ppo_num_mini_batches replaces the minibatch size in the RL update; llm_sft's ignored it."""
    policy, batch = text_batch
    trainer = ActorTrainer(copy.deepcopy(policy), lr=1e-3, forward=text_forward)
    metrics = trainer.supervised_update(batch, 2, len(batch), 1.0, torch.Generator().manual_seed(0), num_mini_batches=2)
    assert metrics["sft/num_updates"] == 4.0  # 2 epochs of 2, not of 1 minibatch of the whole batch


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_masked_truncated_responses_update_as_if_they_were_not_in_the_batch(process_group, bf16_device, text_batch,
                                                                             agg_mode):
    """``algorithm.mask_truncated_responses`` (TRL's ``mask_truncated_completions``): the update is
    the one on the batch without the truncated responses, whatever the loss aggregation (they
    leave its denominator too); without it they count."""
    policy, batch = text_batch
    before = [p.detach().clone() for p in policy.parameters()]
    kept_batch = batch[torch.tensor([0, 2])]
    kept_batch.set(keys.REF_LOG_PROBS, torch.zeros(2, 8, 1, 1))
    batch = batch.clone()
    batch.set(keys.REF_LOG_PROBS, torch.zeros(4, 8, 1, 1))
    masked, masked_params, masked_grads = _text_update(policy, batch, bf16_device, loss_agg_mode=agg_mode,
                                                       mask_truncated_responses=True, entropy_coeff=0.01,
                                                       use_kl_loss=True, kl_loss_coef=0.1)
    kept, _, kept_grads = _text_update(policy, kept_batch, bf16_device, loss_agg_mode=agg_mode, entropy_coeff=0.01,
                                       use_kl_loss=True, kl_loss_coef=0.1)
    counted, counted_params, counted_grads = _text_update(policy, batch, bf16_device, loss_agg_mode=agg_mode,
                                                          entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1)
    for name in ("actor/pg_loss", "actor/entropy", "actor/kl_loss"):
        assert masked[name] == pytest.approx(kept[name], rel=1e-5, abs=1e-7), name
    assert masked["actor/pg_loss"] != pytest.approx(counted["actor/pg_loss"], rel=1e-3)
    step = max(float((m.cpu() - b).abs().max()) for m, b in zip(masked_params, before))
    assert step == pytest.approx(1e-2, rel=1e-3)  # Adam's first step: lr x sign(gradient)
    # The gradients are compared, not the weights after Adam's step (lr x g / (|g| + eps)): a
    # gradient element that cancels to float rounding takes a full +-lr step whose sign is that
    # rounding's. On an H200 the batch of 4 and the batch of 2 sum in different orders, and 8 of
    # the embedding's 18,176 weights stepped the opposite way (2 x lr apart). They are compared in
    # float32: under bfloat16 autocast (``bf16_device``: what ``auto`` means on an accelerator, or
    # the CPU emulation) the two batches' products round differently, 4e-3 of the largest gradient
    # apart on the H200 (2026-12-04) and on this CPU.
    scale = max(float(g.abs().max()) for g in kept_grads)
    for m, k in zip(masked_grads, kept_grads):
        torch.testing.assert_close(m.cpu(), k.cpu(), rtol=0, atol=1e-5 * scale)
    assert max(float((m - c).abs().max()) for m, c in zip(masked_grads, counted_grads)) > 1e-2 * scale
    assert max(float((m - c).abs().max()) for m, c in zip(masked_params, counted_params)) > 5e-3


def test_a_batch_of_truncated_responses_only_changes_nothing(process_group, device, text_batch):
    policy, batch = text_batch
    batch = batch.clone()
    batch.set(keys.TRUNCATED, torch.ones(4, dtype=torch.bool))
    metrics, params, _ = _text_update(policy, batch, device, mask_truncated_responses=True)
    assert metrics["actor/num_updates"] == 1.0 and metrics["actor/pg_loss"] == 0.0
    for p, q in zip(params, policy.parameters()):
        assert torch.equal(p.cpu(), q.detach().cpu())
