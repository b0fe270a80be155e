"""Supervised warm start of the tiny model on the arithmetic data."""

from __future__ import annotations

import math

import pytest
import torch
from metric_docs import row_names

from policies.causal_lm import CausalLMConfig, CausalLMPolicy
from vla_rl.data.arithmetic import write_arithmetic_dataset
from vla_rl.data.prompt_dataset import PromptFile, PromptRow
from vla_rl.errors import RunStopped
from vla_rl.rewards.verifiers import score_responses
from vla_rl.trainers.sft import (
    SFTConfig,
    SFTExamples,
    SFTResult,
    encode_sft_examples,
    supervised_fine_tune,
)
from vla_rl_core.arithmetic import LEVELS

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture()
def policy(tiny_lm_dir):
    return CausalLMPolicy.from_pretrained(
        CausalLMConfig(model_path=str(tiny_lm_dir), max_prompt_length=24, max_response_length=20)
    )


def greedy_accuracy(policy: CausalLMPolicy, rows: list[PromptRow]) -> float:
    """Fraction of rows whose greedy response the rule-based verifier accepts."""
    prompts = policy.processor.encode_prompts([row.prompt for row in rows], policy.config.max_prompt_length)
    out = policy.generate(*prompts, greedy=True)
    texts = policy.processor.decode_responses(out.responses, out.response_mask)
    _, _, metrics = score_responses([r.data_source for r in rows], texts, [r.ground_truth for r in rows])
    return metrics["reward/accuracy"]


def test_encode_sft_examples_needs_the_response_column(policy, tmp_path):
    paths = write_arithmetic_dataset(tmp_path, num_train=8, num_test=2)
    rows = PromptFile(paths["train"]).read_shard(0, 1, ["extra_info.answer"])
    examples = encode_sft_examples(policy, rows)
    assert len(examples) == 8 and examples.responses.shape == (8, 20)
    decoded = policy.processor.decode_responses(examples.responses, examples.response_mask)
    assert decoded[0] == rows[0].extra["extra_info.answer"]
    with pytest.raises(KeyError, match="extra_columns=\\['extra_info.answer'\\]"):
        encode_sft_examples(policy, PromptFile(paths["train"]).read_shard(0, 1))


def test_sft_lowers_the_loss_and_makes_easy_items_solvable(policy, tmp_path):
    """A short SFT on the easiest level: accuracy becomes measurable without saturating.

    Measured with two initialisations: 0.32-0.43 on the training prompts (those GRPO samples)
    and 3-5 of 40 held-out problems.
    """
    easy = LEVELS[:1]
    paths = write_arithmetic_dataset(tmp_path, num_train=128, num_test=40, seed=0, levels=easy)
    train = PromptFile(paths["train"]).read_shard(0, 1, ["extra_info.answer"])
    held_out = PromptFile(paths["test"]).read_shard(0, 1)
    assert greedy_accuracy(policy, train) == greedy_accuracy(policy, held_out) == 0.0  # untrained
    config = SFTConfig(steps=200, batch_size=32, lr=3e-3)
    result = supervised_fine_tune(policy, encode_sft_examples(policy, train), config)
    assert len(result.losses) == 200 and not policy.training
    first, last = sum(result.losses[:10]) / 10, sum(result.losses[-10:]) / 10
    assert last < 0.1 * first, (first, last)
    assert 0.1 <= greedy_accuracy(policy, train) <= 0.9
    assert 0 < greedy_accuracy(policy, held_out) <= 0.9
    assert set(result.metrics()) == {"sft/loss_first", "sft/loss_last", "sft/steps", "sft/tokens_per_s"}


def test_sft_checks_its_inputs(policy):
    with pytest.raises(ValueError, match="SFTConfig.lr must be > 0"):
        SFTConfig(lr=0)
    ids = torch.zeros((0, 4), dtype=torch.int64)
    empty = SFTExamples(ids, ids, ids, ids.bool())
    with pytest.raises(ValueError, match="at least one example"):
        supervised_fine_tune(policy, empty, SFTConfig(steps=1))


def test_the_sft_nodes_loss_is_the_likelihood_at_temperature_1_whatever_the_sampling_temperature(
        tiny_lm_dir, tmp_path, process_group):
    """llm_sft's update (ActorTrainer.supervised_update) and the warm start (sft_loss) minimise
    the same loss: the targets' likelihood at temperature 1, with text.temperature 0.5 too (the
    update used the sampling temperature)."""
    from tensordict import TensorDict

    from vla_rl.dag.registry import WORKFLOWS
    from vla_rl.trainers.actor import ActorTrainer
    from vla_rl_core import keys

    policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(tiny_lm_dir), max_prompt_length=24,
                                                           max_response_length=20, temperature=0.5))
    paths = write_arithmetic_dataset(tmp_path, num_train=8, num_test=2)
    examples = encode_sft_examples(policy, PromptFile(paths["train"]).read_shard(0, 1, ["extra_info.answer"]))
    with torch.no_grad():
        expected = float(policy.sft_loss(examples.input_ids, examples.attention_mask, examples.responses,
                                         examples.response_mask))
    batch = TensorDict({keys.INPUT_IDS: examples.input_ids, keys.ATTENTION_MASK: examples.attention_mask,
                        keys.RESPONSES: examples.responses, keys.RESPONSE_MASK: examples.response_mask.bool()},
                       batch_size=[len(examples)])
    trainer = ActorTrainer(policy, lr=0.0, forward=WORKFLOWS.get("text").batch_forward)  # as the workers build it
    metrics = trainer.supervised_update(batch, 1, 8, 1.0, torch.Generator().manual_seed(0))
    assert metrics["sft/loss"] == pytest.approx(expected, rel=1e-5)


def test_a_non_finite_sft_gradient_is_skipped_as_the_actors(tiny_lm_dir, tmp_path, process_group, monkeypatch):
    """llm_sft's update stepped whatever its gradient: one NaN loss wrote NaN into every weight
    (verl skips such a step). Now it is skipped and counted, and the weights stay as they were."""
    from tensordict import TensorDict

    import vla_rl.trainers.actor as actor_module
    from vla_rl.dag.registry import WORKFLOWS
    from vla_rl.trainers.actor import ActorTrainer
    from vla_rl_core import keys

    policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(tiny_lm_dir), max_prompt_length=24,
                                                           max_response_length=20))
    paths = write_arithmetic_dataset(tmp_path, num_train=8, num_test=2)
    examples = encode_sft_examples(policy, PromptFile(paths["train"]).read_shard(0, 1, ["extra_info.answer"]))
    batch = TensorDict({keys.INPUT_IDS: examples.input_ids, keys.ATTENTION_MASK: examples.attention_mask,
                        keys.RESPONSES: examples.responses, keys.RESPONSE_MASK: examples.response_mask.bool()},
                       batch_size=[len(examples)])
    real_forward = actor_module.text_forward
    monkeypatch.setattr(actor_module, "text_forward",
                        lambda *args, **kwargs: (real_forward(*args, **kwargs)[0] * float("nan"), None))
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    trainer = ActorTrainer(policy, lr=1e-2, forward=WORKFLOWS.get("text").batch_forward)
    metrics = trainer.supervised_update(batch, 1, 8, 1.0, torch.Generator().manual_seed(0), max_skipped_updates=2)
    assert metrics["sft/num_updates"] == 0.0 and metrics["sft/skipped_updates"] == 1.0
    assert all(torch.equal(p, before[name]) for name, p in policy.named_parameters())
    with pytest.raises(RunStopped, match="the sft update diverged: 2 updates in a row"):
        trainer.supervised_update(batch, 1, 8, 1.0, torch.Generator().manual_seed(0), max_skipped_updates=2)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sft_refuses_to_run_adam_on_half_precision_weights(tiny_lm_dir, tmp_path, dtype):
    """text.dtype float16 gave NaN in every weight after the first AdamW step (eps 1e-8 is 0 in
    float16); bfloat16 drops the updates below its resolution. Refused before any step, the
    weights untouched; with LoRA (float32 adapters over the half-precision base) it trains."""
    config = CausalLMConfig(model_path=str(tiny_lm_dir), dtype=dtype, max_prompt_length=24, max_response_length=20)
    policy = CausalLMPolicy.from_pretrained(config)
    paths = write_arithmetic_dataset(tmp_path, num_train=8, num_test=2)
    examples = encode_sft_examples(policy, PromptFile(paths["train"]).read_shard(0, 1, ["extra_info.answer"]))
    before = {name: tensor.clone() for name, tensor in policy.state_dict().items()}
    with pytest.raises(ValueError, match=rf"supervised fine-tuning would run Adam on the CausalLMPolicy's {dtype} "
                                         r"trainable parameters .* or set text\.sft_steps=0"):
        supervised_fine_tune(policy, examples, SFTConfig(steps=2, batch_size=4, lr=1e-4))
    assert all(torch.equal(tensor, before[name]) for name, tensor in policy.state_dict().items())
    policy.apply_lora(rank=4)
    result = supervised_fine_tune(policy, examples, SFTConfig(steps=2, batch_size=4, lr=1e-3))
    adapters = [p for p in policy.parameters() if p.requires_grad]
    assert adapters and {p.dtype for p in adapters} == {torch.float32} and all(map(math.isfinite, result.losses))
    assert all(bool(torch.isfinite(p).all()) for p in policy.parameters())


def test_micro_batches_accumulate_the_whole_batchs_gradient(tiny_lm_dir, tmp_path, monkeypatch):
    """``trainer.micro_batch_size`` rows per forward pass (the warm start ran a whole batch in one:
    its float32 logits are (rows, R, V)); each micro-batch's token mean weighted by its share of
    the tokens gives the whole batch's loss and update, to float32 rounding."""
    paths = write_arithmetic_dataset(tmp_path, num_train=8, num_test=2)
    results, calls = {}, []
    for micro in (None, 3):
        torch.manual_seed(0)
        policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(tiny_lm_dir), max_prompt_length=24,
                                                               max_response_length=20))
        examples = encode_sft_examples(policy, PromptFile(paths["train"]).read_shard(0, 1, ["extra_info.answer"]))
        real = policy.sft_loss
        monkeypatch.setattr(policy, "sft_loss", lambda *args, real=real: calls.append(len(args[0])) or real(*args))
        result = supervised_fine_tune(policy, examples, SFTConfig(steps=2, batch_size=8, lr=1e-3, micro_batch_size=micro))
        results[micro] = result.losses, {name: p.detach().clone() for name, p in policy.named_parameters()}
    assert calls == [8, 8, 3, 3, 2, 3, 3, 2]  # two steps whole, two steps in micro-batches of 3
    assert results[3][0] == pytest.approx(results[None][0], rel=1e-5)
    for name, tensor in results[None][1].items():
        torch.testing.assert_close(results[3][1][name], tensor, rtol=1e-4, atol=1e-6, msg=name)
    with pytest.raises(ValueError, match="micro_batch_size must be >= 1"):
        SFTConfig(micro_batch_size=0)


def test_the_warm_start_logs_what_docs_metrics_md_says_it_does():
    """docs/metrics.md listed sft/loss, sft/grad_norm, ... (llm_sft's update metrics) among the text
    warm start's, which logs none of them."""
    metrics = SFTResult(losses=[2.0, 1.5, 1.0], response_tokens=30, seconds=1.5).metrics()
    assert set(metrics) == row_names("sft/loss_first")
    assert metrics == {"sft/loss_first": 2.0, "sft/loss_last": 1.0, "sft/steps": 3.0, "sft/tokens_per_s": 20.0}


def test_each_epoch_trains_on_every_example_once(policy, tmp_path, monkeypatch):
    """Batches are drawn epoch by epoch without replacement: 8 examples in batches of 4 (which
    divide them), 4 steps are 2 epochs, each holding every example once."""
    from vla_rl.trainers import sft

    paths = write_arithmetic_dataset(tmp_path, num_train=8, num_test=2)
    examples = encode_sft_examples(policy, PromptFile(paths["train"]).read_shard(0, 1, ["extra_info.answer"]))
    key = {tuple(row.tolist()): i for i, row in enumerate(examples.input_ids)}
    assert len(key) == 8  # every example tells itself apart
    drawn: list[int] = []

    def recorded(policy, batch, micro_batch_size):
        drawn.extend(key[tuple(row.tolist())] for row in batch.input_ids)
        return 0.0

    monkeypatch.setattr(sft, "_accumulate_gradients", recorded)
    supervised_fine_tune(policy, examples, SFTConfig(steps=4, batch_size=4))
    assert sorted(drawn[:8]) == list(range(8)) and sorted(drawn[8:]) == list(range(8))


def test_the_gradient_is_clipped_to_max_grad_norm_and_every_step_counts_its_tokens(tiny_lm_dir, tmp_path):
    """AdamW's first step moves each parameter by about ``lr`` whatever the gradient's scale,
    unless the gradient is far below its epsilon (1e-8): clipped to a norm of 1e-12 the step is
    below 1e-3 * 1e-12 / 1e-8 = 1e-7; unclipped it is about 1e-3. Two epochs of 8 examples train
    on every response token twice."""
    paths = write_arithmetic_dataset(tmp_path, num_train=8, num_test=2)
    moved = {}
    for max_grad_norm in (1e-12, 1e9):
        torch.manual_seed(0)
        policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(tiny_lm_dir), max_prompt_length=24,
                                                               max_response_length=20))
        examples = encode_sft_examples(policy, PromptFile(paths["train"]).read_shard(0, 1, ["extra_info.answer"]))
        before = [p.detach().clone() for p in policy.parameters()]
        config = SFTConfig(steps=1, batch_size=8, lr=1e-3, max_grad_norm=max_grad_norm)
        result = supervised_fine_tune(policy, examples, config)
        moved[max_grad_norm] = max(float((p.detach() - b).abs().max()) for p, b in zip(policy.parameters(), before))
        assert result.response_tokens == int(examples.response_mask.sum())
    assert moved[1e-12] < 2e-7 and 5e-4 < moved[1e9] < 2e-3, moved
    result = supervised_fine_tune(policy, examples, SFTConfig(steps=4, batch_size=4))
    assert result.response_tokens == 2 * int(examples.response_mask.sum()) > 0
