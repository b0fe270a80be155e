"""What samples the text workflow's training responses (``text.rollout_backend``).

- ``hf``: :class:`PolicyTextRollout`, the policy's own batched KV-cache decoding
  (:meth:`~policies.causal_lm.modeling_causal_lm.CausalLMPolicy.generate`); its log-probs are
  the trainer's exactly.
- ``vllm``: :class:`~vla_rl.rollout.vllm_backend.VLLMTextRollout`, a vLLM engine holding a copy
  of the weights, refreshed after every optimizer step; its log-probs differ slightly from the
  trainer's, so the rollout node recomputes them (``exact_log_probs`` is False).

Both return one :class:`~policies.causal_lm.modeling_causal_lm.Generation` per call with the
groups contiguous, the layout of ``torch.repeat_interleave(prompts, group_size, dim=0)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from policies.causal_lm.modeling_causal_lm import CausalLMPolicy, Generation


class TextRollout(Protocol):
    """A sampler of response groups."""

    #: True when the returned log-probs are the trainer's own (no recomputation needed).
    exact_log_probs: bool

    def sample(self, input_ids: Tensor, attention_mask: Tensor, group_size: int,
               generator: torch.Generator) -> Generation:
        """``group_size`` responses per prompt of ``(g, P)`` left-padded prompts: a
        :class:`Generation` of ``g * group_size`` rows, groups contiguous."""

    def close(self) -> None:
        """Release what the sampler holds (an engine), when the worker shuts down."""


class PolicyTextRollout:
    """Sampling with the policy's own decoding loop (``text.rollout_backend: hf``).

    Args:
        policy: the worker's causal LM policy (the trainer's module: always up to date).
    """

    exact_log_probs = True

    def __init__(self, policy: CausalLMPolicy) -> None:
        self.policy = policy

    def sample(self, input_ids: Tensor, attention_mask: Tensor, group_size: int,
               generator: torch.Generator) -> Generation:
        """See :meth:`TextRollout.sample`; ``generator`` drives the multinomial draws."""
        policy = self.policy.eval()
        return policy.generate(input_ids.repeat_interleave(group_size, dim=0),
                               attention_mask.repeat_interleave(group_size, dim=0), generator=generator)

    def close(self) -> None:
        """Nothing to release: the policy belongs to the worker."""


def make_text_rollout(backend: str, policy: CausalLMPolicy, text_config, seed: int, work_dir: Path,
                      optimizer: torch.optim.Optimizer | None) -> TextRollout:
    """The sampler named by ``text.rollout_backend``.

    Args:
        backend: ``"hf"`` or ``"vllm"``.
        policy: the worker's causal LM policy.
        text_config: the run's ``text`` section (lengths, temperature, vLLM memory settings).
        seed: the engine's seed (vLLM only).
        work_dir: where the vLLM backend writes the model description its engine starts from.
        optimizer: the actor's optimizer; the vLLM backend reloads its weights after each of
            its steps (None: never, e.g. for evaluation only).

    Raises:
        ValueError: an unknown backend.
        ModuleNotFoundError: ``"vllm"`` without the vllm package (the message says how to fix it).
    """
    if backend == "hf":
        return PolicyTextRollout(policy)
    if backend == "vllm":
        from vla_rl.rollout.vllm_backend import VLLMTextRollout

        return VLLMTextRollout(policy, text_config, seed, work_dir, optimizer)
    raise ValueError(f"text.rollout_backend must be 'hf' or 'vllm', got {backend!r}")
