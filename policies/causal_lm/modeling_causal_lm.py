"""Causal LM policy: sampled responses with their log-probs, and log-probs and entropy of given
responses at the sampling temperature, over any transformers causal LM.

The policy contract of the robot policies (:class:`policies.base.Policy`) carried over to text:
the observation is a chat prompt, the action a response (a token sequence ending in EOS).
Sampling and :meth:`CausalLMPolicy.log_probs_and_entropy` use exactly the same distribution,
``softmax(logits.float() / temperature)`` over the whole vocabulary, so recomputing the
log-probs of sampled responses gives the sampled ones (the PPO ratio is 1 on-policy).

Sampling is our own batched decoding loop over the model's KV cache rather than
``model.generate``: ``generate`` fills every unset option from the checkpoint's
``generation_config.json`` (top-k, top-p, repetition penalty, ...), which would silently sample
from another distribution than the one the loss scores; it has no ``torch.Generator``; and
returning its per-step logits holds ``(batch, response_len, vocab)`` floats where the log-probs
of the sampled tokens need ``(batch, response_len)``. Greedy decoding gives the same tokens as
``generate(do_sample=False)`` (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from policies.base import position_ids_from_mask
from policies.causal_lm.configuration_causal_lm import CausalLMConfig
from policies.causal_lm.loading import load_pretrained, save_pretrained
from policies.causal_lm.processor_causal_lm import CausalLMProcessor
from policies.sampling import sample_categorical

#: The layers LoRA adapts by default: a decoder's attention and MLP projections (Llama, Qwen2).
LORA_TARGET_MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Generation:
    """Sampled responses of a batch of prompts.

    Attributes:
        responses: ``(batch, max_new_tokens)`` int64 token ids, right-padded with the pad id.
        response_mask: ``(batch, max_new_tokens)`` bool, True on each response's tokens up to
            and including its EOS (a response that hit ``max_new_tokens`` has no EOS).
        log_probs: ``(batch, max_new_tokens)`` float32 log-probability of each sampled token at
            the sampling temperature; 0 where ``response_mask`` is False.
    """

    responses: Tensor
    response_mask: Tensor
    log_probs: Tensor


class DistinctPrompts(NamedTuple):
    """The distinct prompts of a batch and, for each row, which one it is.

    Attributes:
        input_ids, attention_mask: ``(distinct, prompt_len)`` int64.
        inverse: ``(batch,)`` int64, row ``b``'s prompt is ``input_ids[inverse[b]]``.
    """

    input_ids: Tensor
    attention_mask: Tensor
    inverse: Tensor

    @classmethod
    def of(cls, input_ids: Tensor, attention_mask: Tensor) -> DistinctPrompts:
        """Group ``(batch, prompt_len)`` prompts (``attention_mask`` int64) by their tokens and mask."""
        width = input_ids.shape[1]
        distinct, inverse = torch.unique(torch.cat([input_ids, attention_mask], dim=1), dim=0, return_inverse=True)
        return cls(distinct[:, :width], distinct[:, width:], inverse)


def decode_step_mask(attention_mask: Tensor, attn_implementation: str, dtype: torch.dtype) -> Tensor:
    """The 4D attention mask of a one-token decoding step, as transformers' ``sdpa_mask`` /
    ``eager_mask`` (``transformers.masking_utils``) would build it: the new token attends to every
    unpadded key (causality is trivial for the last position).

    A model given a 4D mask uses it as it is, so the decoding loop skips transformers' mask
    construction at every token (about 9 % of a decoding step of the tiny model on CPU).

    Args:
        attention_mask: ``(batch, kv_len)`` 0/1 over the cached keys and the new token.
        attn_implementation: ``"sdpa"`` or ``"eager"`` (the model config's ``_attn_implementation``).
        dtype: the model's dtype (the additive mask of ``eager``).

    Returns:
        ``(batch, 1, 1, kv_len)``: bool, True where attended (``sdpa``); or ``dtype`` with 0 where
        attended and ``torch.finfo(dtype).min`` elsewhere (``eager``).

    Raises:
        ValueError: another attention implementation.
    """
    attend = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, L)
    if attn_implementation == "sdpa":
        return attend
    if attn_implementation == "eager":
        return torch.zeros(attend.shape, dtype=dtype, device=attend.device).masked_fill(~attend, torch.finfo(dtype).min)
    raise ValueError(f"no one-token decoding mask for attention implementation {attn_implementation!r}")


def _scaled_log_softmax(logits: Tensor, temperature: float) -> Tensor:
    """``log_softmax(logits / temperature)`` float32 over the last dimension of ``(..., V)`` logits."""
    return (logits.float() / temperature).log_softmax(-1)


def _entropy(log_softmax: Tensor) -> Tensor:
    """``-sum_v p_v log p_v`` over the last dimension of log-probabilities ``(..., V)``."""
    return -(log_softmax.exp() * log_softmax).sum(-1)


def _check_left_padded(input_ids: Tensor, attention_mask: Tensor) -> None:
    if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"input_ids and attention_mask must both be (batch, prompt_len), got {tuple(input_ids.shape)} "
            f"and {tuple(attention_mask.shape)}"
        )
    mask = attention_mask.bool()
    if not mask[:, -1].all() or (mask[:, 1:] < mask[:, :-1]).any():
        raise ValueError("prompts must be left-padded and non-empty: attention_mask is 0...0 1...1 on every row")


def _check_right_padded(responses: Tensor, response_mask: Tensor, batch: int) -> None:
    if responses.ndim != 2 or responses.shape[0] != batch or response_mask.shape != responses.shape:
        raise ValueError(
            f"responses and response_mask must both be ({batch}, response_len), got {tuple(responses.shape)} "
            f"and {tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    if (mask[:, 1:] > mask[:, :-1]).any():
        raise ValueError("responses must be right-padded: response_mask is 1...1 0...0 on every row")


class CausalLMPolicy(nn.Module):
    """A transformers causal LM as an RL policy over responses.

    Args:
        model: any ``AutoModelForCausalLM`` model.
        tokenizer: its tokenizer, with a chat template.
        config: the policy's :class:`CausalLMConfig` (lengths and temperature defaults).

    Raises:
        TypeError: ``config`` is not a :class:`CausalLMConfig`.
        ValueError: the tokenizer has no EOS token, or no chat template with chat prompts.
    """

    config_class = CausalLMConfig

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: CausalLMConfig) -> None:
        if not isinstance(config, CausalLMConfig):
            raise TypeError(f"CausalLMPolicy needs a CausalLMConfig, got {type(config).__name__}")
        super().__init__()
        self.model = model
        self.config = config
        # Chat models often stop on more ids than the tokenizer's EOS (its generation config lists them).
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        self.processor = CausalLMProcessor(tokenizer, [eos] if isinstance(eos, int) else list(eos or []),
                                           prompt_format=config.prompt_format,
                                           chat_template_kwargs=config.chat_template_kwargs)
        self.train(model.training)  # the wrapper's mode mirrors the model's (eval after loading)

    @classmethod
    def from_pretrained(cls, config: CausalLMConfig, device: torch.device | str | None = None) -> CausalLMPolicy:
        """Load ``config.model_path`` (a local directory or GGUF file) as a policy, its weights
        read straight onto ``device`` (None: the CPU).

        Raises:
            FileNotFoundError, ValueError: see :func:`policies.causal_lm.loading.load_pretrained`.
        """
        model, tokenizer = load_pretrained(
            config.model_path, config.gguf_file, config.dtype, config.attn_implementation, config.prompt_format,
            allow_pickle=config.allow_pickle, allow_partial_load=config.allow_partial_load, device=device,
        )
        return cls(model, tokenizer, config)

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Write the model (safetensors) and tokenizer as a Hugging Face directory.

        Raises:
            ValueError: LoRA adapters are injected (call :meth:`merge_lora` first).
        """
        from policies.lora import has_lora

        if has_lora(self.model):
            raise ValueError("LoRA adapters are injected: call merge_lora() before saving as a Hugging Face model")
        return save_pretrained(self.model, self.processor.tokenizer, out_dir)

    def apply_lora(self, rank: int = 32, alpha: float | None = None, dropout: float = 0.0,
                   target_modules: Sequence[str] | None = None, trainable_modules: Sequence[str] = ()) -> list[str]:
        """Inject peft LoRA adapters into the model's linear layers and train only them (and
        ``trainable_modules``, paths under the policy such as ``model.lm_head``); see
        :func:`policies.lora.inject_lora`. ``target_modules``: last name components, each of which
        must name a linear layer; None: :data:`LORA_TARGET_MODULES`, those the model has (a
        decoder's attention and MLP projections).

        Returns:
            names of the trainable parameters.

        Raises:
            vla_rl_core.components.ComponentConfigError: a ``target_modules`` name matches no
                linear layer, or a ``trainable_modules`` entry is not a submodule (its ``field``
                names the argument).
        """
        from policies.lora import inject_lora, set_trainable

        inject_lora(self.model, rank, alpha, dropout, LORA_TARGET_MODULES if target_modules is None else target_modules,
                    every_target=target_modules is not None)
        return set_trainable(self, trainable_modules)

    def merge_lora(self) -> int:
        """Fold the LoRA adapters into the base weights (see :func:`policies.lora.merge_lora`);
        returns the number of merged layers."""
        from policies.lora import merge_lora

        return merge_lora(self.model)

    def fsdp_units(self) -> list[nn.Module]:
        """The decoder layers (FSDP2 shards each; embeddings, final norm and LM head stay with
        the root, which keeps tied embeddings in one group)."""
        from policies.base import transformer_blocks

        return transformer_blocks(self.model)

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.processor.tokenizer

    @property
    def device(self) -> torch.device:
        return self.model.device

    def generate(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> Generation:
        """Sample one response per prompt with a KV cache, all prompts decoded together.

        Each step feeds one token per row; a row stops at its first EOS (in
        ``processor.eos_token_ids``) and is padded afterwards; decoding stops when every row has
        stopped or after ``max_new_tokens`` tokens. Columns of left padding shared by the whole
        batch are skipped, and a prompt repeated in the batch is encoded once
        (:meth:`_forward_prompts`). The caller picks the mode (``model.eval()`` for dropout-free
        sampling). Decoding runs under ``torch.inference_mode`` (measured: about 10 % less time
        per token than ``no_grad`` for the tiny model on CPU); the returned tensors are ordinary
        ones, free to enter a later autograd graph.

        Args:
            input_ids: ``(batch, prompt_len)`` int64, left-padded.
            attention_mask: ``(batch, prompt_len)`` 0/1, left-padded, at least one 1 per row.
            max_new_tokens: response length (default ``config.max_response_length``).
            temperature: sampling temperature (default ``config.temperature``); the returned
                log-probs are at this temperature.
            greedy: take the most likely token instead of sampling (log-probs still at
                ``temperature``).
            generator: random generator (on any device: :func:`policies.sampling.draw`); the global one if ``None``.

        Returns:
            :class:`Generation` with ``(batch, max_new_tokens)`` tensors.

        Raises:
            ValueError: wrong shapes, prompts not left-padded, or a non-positive length or
                temperature.
        """
        max_new_tokens = self.config.max_response_length if max_new_tokens is None else max_new_tokens
        temperature = self.config.temperature if temperature is None else temperature
        if max_new_tokens < 1 or not temperature > 0:
            raise ValueError(f"max_new_tokens must be >= 1 and temperature > 0, got {max_new_tokens}, {temperature}")
        _check_left_padded(input_ids, attention_mask)
        start = int(attention_mask.bool().any(0).long().argmax())  # first column anyone attends to
        with torch.inference_mode():
            generation = self._decode(input_ids[:, start:], attention_mask[:, start:], max_new_tokens, temperature,
                                      greedy, generator)
        # Inference tensors cannot be saved for backward; their clones made outside inference mode can.
        return Generation(generation.responses.clone(), generation.response_mask.clone(), generation.log_probs.clone())

    def _decode(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int, temperature: float,
                greedy: bool, generator: torch.Generator | None) -> Generation:
        """The decoding loop of :meth:`generate` on checked prompts (no all-padding column)."""
        device = self.device
        input_ids = input_ids.to(device)
        attention_mask = attention_mask.to(device=device, dtype=torch.long)
        batch = input_ids.shape[0]
        eos_ids = torch.tensor(self.processor.eos_token_ids, device=device)

        responses = torch.full((batch, max_new_tokens), self.processor.pad_token_id, dtype=torch.long, device=device)
        response_mask = torch.zeros((batch, max_new_tokens), dtype=torch.bool, device=device)
        log_probs = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
        finished = torch.zeros(batch, dtype=torch.bool, device=device)

        cache = DynamicCache(config=self.model.config)
        attn_implementation = self.model.config._attn_implementation
        # A sliding-window layer's cache keeps only the window's keys, which a mask as wide as the
        # sequence does not fit: such models get the 2D mask, from which transformers builds each
        # layer's own (Gemma 2/3, Mistral, Phi-3, Qwen2 with use_sliding_window).
        own_masks = any(cache.is_sliding)
        logits = self._forward_prompts(DistinctPrompts.of(input_ids, attention_mask), cache)  # (B, V)
        next_position = position_ids_from_mask(attention_mask)[:, -1:] + 1  # (B, 1)
        for step in range(max_new_tokens):
            step_log_probs = (logits.float() / temperature).log_softmax(-1)  # (B, V)
            if greedy:
                tokens = step_log_probs.argmax(-1)
            else:
                tokens = sample_categorical(step_log_probs.exp(), generator)  # (B,)
            active = ~finished
            tokens = torch.where(active, tokens, self.processor.pad_token_id)
            responses[:, step] = tokens
            response_mask[:, step] = active
            log_probs[:, step] = step_log_probs.gather(-1, tokens[:, None]).squeeze(-1).masked_fill(finished, 0.0)
            finished |= torch.isin(tokens, eos_ids)
            if step == max_new_tokens - 1 or finished.all():
                break
            attention_mask = torch.cat([attention_mask, active[:, None].long()], dim=1)
            logits = self.model(
                input_ids=tokens[:, None],
                attention_mask=attention_mask if own_masks else decode_step_mask(attention_mask, attn_implementation,
                                                                                 self.model.dtype),
                position_ids=next_position,
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1, :]
            next_position = next_position + 1
        return Generation(responses, response_mask, log_probs)

    def _forward_prompts(self, prompts: DistinctPrompts, cache: DynamicCache) -> Tensor:
        """Run each distinct prompt once and hand its keys, values and last logits to every row
        that repeats it.

        The responses of a GRPO group share their prompt: encoding it once per group instead of
        once per response is Prefix Grouper's shared-prefix forward (Liu et al. 2025, arXiv
        2506.05433), exact up to float rounding, with gradients flowing back through the
        gathered cache to the single encoding (a model with dropout would draw one dropout mask
        per prompt instead of one per row).

        Args:
            prompts: the batch's distinct prompts (:meth:`DistinctPrompts.of`).
            cache: an empty cache, filled with ``(batch, ...)`` keys and values of every row.

        Returns:
            ``(batch, vocab)`` logits of each row's last prompt position (they predict the first
            response token), in the model's dtype.
        """
        prompt_ids, prompt_mask, inverse = prompts
        logits = self.model(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=position_ids_from_mask(prompt_mask),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1, :]  # (U, V)
        cache.reorder_cache(inverse)  # (U, ...) -> (B, ...)
        return logits[inverse]

    def _response_logits(
        self, input_ids: Tensor, attention_mask: Tensor, responses: Tensor, response_mask: Tensor, temperature: float
    ) -> tuple[Tensor, Tensor, int]:
        """Teacher-forced logits at the response positions.

        When some prompt repeats in the batch (a group's responses), each distinct prompt is
        encoded once (:meth:`_forward_prompts`) and the responses then run on its cache;
        otherwise, when gradient checkpointing is on (in training and in no-grad passes alike)
        and in FSDP2's training copy, one forward pass covers prompts and responses.

        Returns:
            the logits ``(batch, kept, vocab)`` in the model's dtype of the first ``kept`` response
            positions (columns after every row's last valid token are not computed), the kept
            response ids ``(batch, kept)``, and ``kept``.

        Raises:
            ValueError: wrong shapes, bad padding, or a non-positive ``temperature``.
        """
        _check_left_padded(input_ids, attention_mask)
        _check_right_padded(responses, response_mask, input_ids.shape[0])
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        device = self.device
        start = int(attention_mask.bool().any(0).long().argmax())
        valid_columns = response_mask.bool().any(0)
        kept = int(valid_columns.nonzero().max()) + 1 if valid_columns.any() else 0
        responses = responses[:, :kept].to(device)
        prompt_ids = input_ids[:, start:].to(device)  # (B, P')
        prompt_mask = attention_mask[:, start:].to(device=device, dtype=torch.long)
        mask = torch.cat([prompt_mask, response_mask[:, :kept].to(device).long()], dim=1)  # (B, P' + kept)
        positions = position_ids_from_mask(mask)
        distinct = DistinctPrompts.of(prompt_ids, prompt_mask)
        # Under gradient checkpointing transformers drops the KV cache in training (the recompute
        # would write it twice), so the shared-prompt path would lose the prompts: one pass instead,
        # in the no-grad passes too (the trainer's rescoring of the old log-probs), so that they
        # compute in the update's arithmetic (bfloat16 rounds the two paths otherwise).
        checkpointing = any(getattr(module, "gradient_checkpointing", False) for module in self.model.modules())
        # FSDP2's training copy all-gathers its blocks in every pass, so every worker must make
        # the same passes: whether a worker's rows repeat a prompt is its data's business, so one
        # pass (two passes on one worker and one on another mismatched the collectives).
        sharded = isinstance(self, FSDPModule)
        if len(distinct.input_ids) < len(prompt_ids) and kept > 0 and not checkpointing and not sharded:
            cache = DynamicCache(config=self.model.config)
            first = self._forward_prompts(distinct, cache)[:, None, :]  # (B, 1, V)
            if kept == 1:
                logits = first
            else:
                width = prompt_ids.shape[1]
                rest = self.model(
                    input_ids=responses[:, :-1],
                    attention_mask=mask[:, :-1],
                    position_ids=positions[:, width:-1],
                    past_key_values=cache,
                    use_cache=True,
                ).logits  # (B, kept - 1, V): column t predicts response token t + 1
                logits = torch.cat([first, rest], dim=1)  # (B, kept, V)
        else:
            sequences = torch.cat([prompt_ids, responses], dim=1)  # (B, P' + kept)
            output = self.model(
                input_ids=sequences, attention_mask=mask, position_ids=positions, use_cache=False, logits_to_keep=kept + 1
            )
            logits = output.logits[:, :-1, :]  # (B, kept, V): column t predicts response token t
        return logits, responses, kept

    def log_probs_and_entropy(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        responses: Tensor,
        response_mask: Tensor,
        temperature: float | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Log-probabilities and entropies of given responses under the sampling distribution.

        ``log_probs[b, t] = log_softmax(logits / temperature)[responses[b, t]]`` and
        ``entropy[b, t] = -sum_v p_v log p_v`` of the same distribution, from one forward pass
        over ``cat([input_ids, responses])``. Differentiable; the caller micro-batches (the
        pass holds ``(batch, response_len, vocab)`` float32 logits). The entropy's graph keeps
        nothing but the log-softmax the log-probs keep (its probabilities are recomputed in the
        backward pass), and a loss without an entropy term never runs that recompute.

        Args:
            input_ids: ``(batch, prompt_len)`` int64, left-padded.
            attention_mask: ``(batch, prompt_len)`` 0/1.
            responses: ``(batch, response_len)`` int64, right-padded.
            response_mask: ``(batch, response_len)`` bool (or 0/1), True on valid tokens.
            temperature: the sampling temperature (default ``config.temperature``).

        Returns:
            ``log_probs`` and ``entropy``, each ``(batch, response_len)`` float32, 0 where
            ``response_mask`` is False.

        Raises:
            ValueError: wrong shapes, bad padding, or a non-positive temperature.
        """
        temperature = self.config.temperature if temperature is None else temperature
        logits, kept_responses, _ = self._response_logits(input_ids, attention_mask, responses, response_mask,
                                                          temperature)
        log_softmax = _scaled_log_softmax(logits, temperature)  # (B, kept, V)
        del logits  # the backward pass keeps the log-softmax, not the logits: not held during the entropy
        log_probs = log_softmax.gather(-1, kept_responses[..., None]).squeeze(-1)  # (B, kept)
        if log_softmax.requires_grad:
            # recomputed in the backward pass (verl's entropy_checkpointing): the probabilities
            # would otherwise be kept, one more (B, kept, V) float32 tensor than the log-probs need
            entropy = checkpoint(_entropy, log_softmax, use_reentrant=False)  # (B, kept)
        else:
            entropy = _entropy(log_softmax)
        return self._pad_to(log_probs, response_mask), self._pad_to(entropy, response_mask)

    def log_probs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        responses: Tensor,
        response_mask: Tensor,
        temperature: float | None = None,
    ) -> Tensor:
        """:meth:`log_probs_and_entropy` without the entropy: ``(batch, response_len)`` float32,
        the same values. Without gradients (the reference's and the old policy's scoring) the
        log-softmax is taken one row at a time, as verl's ``logprobs_from_logits_v2`` does for
        bfloat16 logits: beside the logits, the pass holds two ``(response_len, vocab)`` float32
        tensors, not two ``(batch, response_len, vocab)`` ones (the scaled logits and their
        log-softmax). Each row's log-softmax is the batched one's, bit for bit.
        """
        temperature = self.config.temperature if temperature is None else temperature
        logits, kept_responses, _ = self._response_logits(input_ids, attention_mask, responses, response_mask,
                                                          temperature)
        index = kept_responses[..., None]  # (B, kept, 1)
        if logits.requires_grad or len(logits) == 0:
            log_probs = _scaled_log_softmax(logits, temperature).gather(-1, index).squeeze(-1)  # (B, kept)
        else:
            log_probs = torch.stack([_scaled_log_softmax(row, temperature).gather(-1, ids).squeeze(-1)
                                     for row, ids in zip(logits, index)])  # (B, kept)
        return self._pad_to(log_probs, response_mask)

    def sft_loss(self, input_ids: Tensor, attention_mask: Tensor, responses: Tensor, response_mask: Tensor) -> Tensor:
        """Supervised loss: mean negative log-likelihood of the response tokens (prompts unscored).

        Args:
            input_ids, attention_mask: ``(batch, prompt_len)`` left-padded prompts.
            responses, response_mask: ``(batch, response_len)`` right-padded targets (see
                :meth:`CausalLMProcessor.encode_responses`).

        Returns:
            a differentiable scalar: the token mean over all valid response tokens, at
            temperature 1.

        Raises:
            ValueError: wrong shapes or bad padding, or no valid response token.
        """
        mask = response_mask.to(self.device).float()
        if not mask.any():
            raise ValueError("sft_loss needs at least one valid response token")
        log_probs = self.log_probs(input_ids, attention_mask, responses, response_mask, temperature=1.0)
        return -(log_probs * mask).sum() / mask.sum()

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, responses: Tensor, response_mask: Tensor, temperature: float,
        with_entropy: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """The training forward pass: :meth:`log_probs_and_entropy`; with ``with_entropy`` False,
        :meth:`log_probs` and None (no-gradient scoring: no ``(batch, response_len, vocab)``
        float32 tensor for an entropy nobody reads).

        Going through ``forward`` lets ``DistributedDataParallel`` prepare its gradient
        all-reduce for the backward pass, and FSDP gather the parameters.
        """
        if not with_entropy:
            return self.log_probs(input_ids, attention_mask, responses, response_mask, temperature), None
        return self.log_probs_and_entropy(input_ids, attention_mask, responses, response_mask, temperature)

    @staticmethod
    def _pad_to(values: Tensor, response_mask: Tensor) -> Tensor:
        """``(B, kept)`` values → ``(B, response_len)``, zeroed where the mask is False."""
        mask = response_mask.to(values.device).bool()
        padded = nn.functional.pad(values, (0, mask.shape[1] - values.shape[1]))
        return padded.masked_fill(~mask, 0.0)
