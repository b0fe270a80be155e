"""Supervised fine-tuning of a causal LM policy on prompt/response pairs: the warm start before RL
(the ``supervised_fine_tune`` node of the ``warm_start`` phase, :mod:`vla_rl.nodes.warm_start`).

The loss is the negative log-likelihood of the response tokens only (prompt tokens are context,
not targets), averaged over all response tokens of a minibatch. Like the embodied behaviour
cloning warm start, it is deterministic given its seed, so every DP worker can run it alone on
the same data and start RL from identical weights.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from policies.causal_lm.modeling_causal_lm import CausalLMPolicy
from vla_rl.data.prompt_dataset import PromptRow
from vla_rl.trainers.strategy import refuse_low_precision_adam


@dataclass(frozen=True)
class SFTConfig:
    """Settings of :func:`supervised_fine_tune`.

    Attributes:
        steps: optimizer steps.
        batch_size: examples per step (drawn epoch by epoch without replacement).
        lr: AdamW learning rate (constant).
        weight_decay: AdamW weight decay.
        max_grad_norm: gradient-norm clip.
        seed: seed of the minibatch order.
        micro_batch_size: examples per forward and backward pass (``trainer.micro_batch_size``),
            their gradients accumulated into the step's; None: the whole batch in one pass.
    """

    steps: int = 300
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    micro_batch_size: int | None = None

    def __post_init__(self) -> None:
        """Raises: ValueError: a non-positive step count, batch size, micro-batch size, learning
        rate or clip."""
        for field in ("steps", "batch_size", "lr", "max_grad_norm"):
            if not getattr(self, field) > 0:
                raise ValueError(f"SFTConfig.{field} must be > 0, got {getattr(self, field)!r}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"SFTConfig.micro_batch_size must be >= 1 or None, got {self.micro_batch_size!r}")
        if self.weight_decay < 0:
            raise ValueError(f"SFTConfig.weight_decay must be >= 0, got {self.weight_decay!r}")


@dataclass(frozen=True)
class SFTExamples:
    """Encoded prompt/response pairs (layout of :mod:`policies.causal_lm.processor_causal_lm`).

    Attributes:
        input_ids, attention_mask: ``(n, prompt_len)`` int64, left-padded prompts.
        responses: ``(n, response_len)`` int64, right-padded targets ending in EOS.
        response_mask: ``(n, response_len)`` bool.
    """

    input_ids: Tensor
    attention_mask: Tensor
    responses: Tensor
    response_mask: Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: Tensor) -> SFTExamples:
        """The examples at ``index`` ``(k,)`` int64."""
        return SFTExamples(
            self.input_ids[index], self.attention_mask[index], self.responses[index], self.response_mask[index]
        )


@dataclass(frozen=True)
class SFTResult:
    """What a fine-tuning run did.

    Attributes:
        losses: the loss of every step's minibatch, in order.
        response_tokens: response tokens trained on (over all steps).
        seconds: wall time of the run.
    """

    losses: list[float]
    response_tokens: int
    seconds: float

    def metrics(self) -> dict[str, float]:
        """``sft/loss_first``, ``sft/loss_last``, ``sft/steps``, ``sft/tokens_per_s``."""
        return {
            "sft/loss_first": self.losses[0],
            "sft/loss_last": self.losses[-1],
            "sft/steps": float(len(self.losses)),
            "sft/tokens_per_s": self.response_tokens / max(self.seconds, 1e-9),
        }


def encode_sft_examples(
    policy: CausalLMPolicy, rows: Sequence[PromptRow], response_column: str = "extra_info.answer"
) -> SFTExamples:
    """Encode dataset rows as prompt/target pairs with the policy's chat template and lengths.

    Args:
        policy: gives the processor and ``config.max_prompt_length`` / ``max_response_length``.
        rows: rows read with ``response_column`` among their extra columns.
        response_column: the column holding the target response text.

    Raises:
        KeyError: a row was read without ``response_column``.
        ValueError: a prompt or target is longer than the policy's maximum lengths.
    """
    missing = [row.index for row in rows if response_column not in row.extra]
    if missing:
        raise KeyError(
            f"rows {missing[:5]} have no {response_column!r}; read them with extra_columns=[{response_column!r}]"
        )
    processor, config = policy.processor, policy.config
    input_ids, attention_mask = processor.encode_prompts([row.prompt for row in rows], config.max_prompt_length)
    responses, response_mask = processor.encode_responses(
        [str(row.extra[response_column]) for row in rows], config.max_response_length
    )
    return SFTExamples(input_ids, attention_mask, responses, response_mask)


def supervised_fine_tune(policy: CausalLMPolicy, examples: SFTExamples, config: SFTConfig) -> SFTResult:
    """Fit the policy to the targets with AdamW, minibatches drawn epoch by epoch.

    The policy is in training mode during the run and back in its previous mode afterwards.

    Args:
        policy: the policy to fine-tune in place.
        examples: the encoded pairs (at least one).
        config: the run's settings.

    Returns:
        The per-step losses, the number of response tokens trained on and the wall time.

    Raises:
        ValueError: ``examples`` is empty, or the policy has trainable parameters that are not
            float32 (:func:`~vla_rl.trainers.strategy.refuse_low_precision_adam`).
    """
    if len(examples) == 0:
        raise ValueError("supervised_fine_tune needs at least one example")
    refuse_low_precision_adam(policy, "supervised fine-tuning", "text.sft_steps=0")
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    batch_size = min(config.batch_size, len(examples))
    micro_batch_size = min(config.micro_batch_size or batch_size, batch_size)
    order = torch.randperm(len(examples), generator=generator)
    position, losses, tokens = 0, [], 0
    was_training = policy.training
    policy.train()
    start = time.perf_counter()
    for _ in range(config.steps):
        if position + batch_size > len(order):
            order, position = torch.randperm(len(examples), generator=generator), 0
        batch = examples.select(order[position : position + batch_size])
        position += batch_size
        optimizer.zero_grad(set_to_none=True)
        losses.append(_accumulate_gradients(policy, batch, micro_batch_size))
        torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm)
        optimizer.step()
        tokens += int(batch.response_mask.sum())
    policy.train(was_training)
    return SFTResult(losses, tokens, time.perf_counter() - start)


def _accumulate_gradients(policy: CausalLMPolicy, batch: SFTExamples, micro_batch_size: int) -> float:
    """The batch's token-mean loss, its gradient accumulated micro-batch by micro-batch: each
    micro-batch's token mean weighted by its share of the batch's response tokens, so that the
    gradient is the whole batch's. One pass holds ``micro_batch_size`` rows' float32 logits
    ``(rows, R, V)``, not the batch's: for 32 rows of R = 256 tokens over Qwen's 151,936-token
    vocabulary, 5 GB per such tensor."""
    total = batch.response_mask.sum()
    loss_value = 0.0
    for start in range(0, len(batch), micro_batch_size):
        part = batch.select(torch.arange(start, min(start + micro_batch_size, len(batch))))
        share = part.response_mask.sum() / total
        if share == 0:
            continue
        loss = policy.sft_loss(part.input_ids, part.attention_mask, part.responses, part.response_mask) * share
        loss.backward()
        loss_value += float(loss.detach())
    return loss_value
