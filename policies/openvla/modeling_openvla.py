"""OpenVLA policy: one action of ``action_dim`` tokens decoded autoregressively, each a
categorical over the 256 action bins only, at the sampling temperature.

Sampling decodes with a KV cache and returns the log-probs of the drawn tokens from that same
pass: no second forward (the rollout's cost is the decoding alone). The training forward
(:meth:`OpenVLAPolicy.log_prob_and_entropy_per_dim`) is teacher-forced over the sampled tokens,
without a cache; the two passes differ only by float rounding (cached attention over the same
keys), so the PPO ratio on-policy is 1 up to that rounding (about 1e-6 relative in float32 on
the tiny model; bf16 weights give more), as with verl and RLinf, whose rollouts also score their
own samples.

Not batch-invariant: transformers' CPU/GPU kernels pick other summation orders for other batch
shapes, so a row's log-probs can change in the last bits when the batch around it changes;
recompute old log-probs with the trainer's batches when exactness matters (see
docs/vla_policies.md).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torch import Tensor
from torch.nn import functional as F
from transformers import DynamicCache

from policies import register_policy
from policies.action_tokenizer import bin_log_softmax
from policies.base import position_ids_from_mask
from policies.openvla.configuration_openvla import OpenVLAPolicyConfig
from policies.openvla.policy_base import PrismaticPolicy
from policies.openvla.processor_openvla import check_observation
from policies.sampling import sample_categorical


@register_policy
class OpenVLAPolicy(PrismaticPolicy):
    """OpenVLA (Kim et al. 2024, arXiv:2406.09246) as an RL policy.

    Actions are normalised bin values (``(batch, 1, action_dim)`` float32, see
    :mod:`policies.action_tokenizer`); :meth:`env_actions` turns them into environment actions.

    Args:
        config: the policy's :class:`OpenVLAPolicyConfig`.

    Raises:
        TypeError: ``config`` is not an :class:`OpenVLAPolicyConfig`.
        FileNotFoundError, ValueError: see :class:`~policies.openvla.policy_base.PrismaticPolicy`.
    """

    name = "openvla"
    config_class = OpenVLAPolicyConfig
    sampled_log_probs_recomputed = False  # scored in the cached decoding pass (module docstring)

    def __init__(self, config: OpenVLAPolicyConfig, device: torch.device | str | None = None) -> None:
        if type(config) is not OpenVLAPolicyConfig:  # an OpenVLA-OFT config (a subclass) builds OpenVLAOFTPolicy
            raise TypeError(f"OpenVLAPolicy needs an OpenVLAPolicyConfig, got {type(config).__name__}")
        super().__init__(config, device)
        self.to(device)

    @property
    def chunk_size(self) -> int:
        """Always 1: one action per observation."""
        return 1

    def _bin_logits(self, obs: TensorDict, bins: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher-forced pass over ``[prefix, action tokens of bins[:, :-1]]``.

        Returns:
            ``(batch, action_dim, vocab)`` logits at the positions predicting each action token,
            and the action token ids ``(batch, action_dim)``.
        """
        obs = self.model_inputs(obs)
        check_observation(obs, 1, None)
        prefix, mask = self._prefix(obs)
        tokens = self.action_tokenizer.tokens_from_bins(bins.to(self.device))  # (B, A)
        embeddings = torch.cat([prefix, self.vla.embed_tokens(tokens[:, :-1])], dim=1)
        mask = torch.cat([mask, mask.new_ones(tokens.shape[0], tokens.shape[1] - 1)], dim=1)
        hidden = self.vla.language_model.model(
            inputs_embeds=embeddings, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False
        ).last_hidden_state
        logits = self.vla.language_model.lm_head(hidden[:, -self.action_dim :])  # (B, A, V)
        return logits, tokens

    @torch.no_grad()
    def sample_actions(
        self,
        obs: TensorDict,
        greedy: bool = False,
        generator: torch.Generator | None = None,
        temperature: float | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Decode one action token per dimension, sampling from the 256-bin softmax at
        ``temperature`` (or taking the argmax bin if ``greedy``).

        Args:
            obs: observation TensorDict (model inputs or simulator observations, see
                :class:`~policies.openvla.policy_base.PrismaticPolicy`).
            greedy: take the most likely bin of each dimension.
            generator: random generator (on any device: :func:`policies.sampling.draw`); the global one if ``None``.
            temperature: default ``config.temperature``; the log-probs are at this temperature.

        Returns:
            ``actions`` ``(batch, 1, action_dim)`` float32 bin values and ``log_probs``
            ``(batch, 1)`` float32 (summed over dimensions), those of the decoding pass (see the
            module docstring).

        Raises:
            ValueError: a malformed observation (the message names the key) or temperature.
        """
        temperature = self.config.temperature if temperature is None else temperature
        obs = self.model_inputs(obs)
        check_observation(obs, 1, None)
        language_model = self.vla.language_model
        prefix, mask = self._prefix(obs)
        batch = prefix.shape[0]
        positions = position_ids_from_mask(mask)
        cache = DynamicCache(config=language_model.config)
        hidden = language_model.model(
            inputs_embeds=prefix, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
        ).last_hidden_state[:, -1]
        next_position = positions[:, -1:] + 1  # (B, 1)
        bins = torch.empty((batch, self.action_dim), dtype=torch.long, device=prefix.device)
        chosen = torch.empty((batch, self.action_dim), dtype=torch.float32, device=prefix.device)
        for dim in range(self.action_dim):
            log_probs = bin_log_softmax(self.action_tokenizer.bin_logits(language_model.lm_head(hidden)), temperature)
            if greedy:
                bins[:, dim] = log_probs.argmax(-1)
            else:
                bins[:, dim] = sample_categorical(log_probs.exp(), generator)
            chosen[:, dim] = log_probs.gather(-1, bins[:, dim : dim + 1]).squeeze(-1)
            if dim == self.action_dim - 1:
                break
            tokens = self.action_tokenizer.tokens_from_bins(bins[:, dim : dim + 1])  # (B, 1)
            mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)
            hidden = language_model.model(
                inputs_embeds=self.vla.embed_tokens(tokens), attention_mask=mask, position_ids=next_position,
                past_key_values=cache, use_cache=True,
            ).last_hidden_state[:, -1]  # fmt: skip
            next_position = next_position + 1
        actions = self.action_tokenizer.actions_from_bins(bins)[:, None]  # (B, 1, A)
        return actions, chosen.sum(-1, keepdim=True)

    def log_prob_and_entropy_per_dim(
        self, obs: TensorDict, actions: Tensor, temperature: float | None = None
    ) -> tuple[Tensor, Tensor]:
        """Log-probability and entropy of each action token under the 256-bin softmax.

        ``log_probs[b, 0, d] = log_softmax(bin_logits / T)[bin(actions[b, 0, d])]``, ``entropy =
        -sum_bins p log p`` of the same distribution; one teacher-forced forward.

        Args:
            obs: observation TensorDict.
            actions: ``(batch, 1, action_dim)`` bin values (any value tokenizes to its bin).
            temperature: default ``config.temperature``.

        Returns:
            ``log_probs`` and ``entropy``, each ``(batch, 1, action_dim)`` float32, differentiable.

        Raises:
            ValueError: malformed ``obs`` or ``actions``, or a non-positive temperature.
        """
        temperature = self.config.temperature if temperature is None else temperature
        self._check_actions(actions, obs.batch_size[0], "actions")
        bins = self.action_tokenizer.bins_from_actions(actions[:, 0])  # (B, A)
        logits, _ = self._bin_logits(obs, bins)
        log_softmax = bin_log_softmax(self.action_tokenizer.bin_logits(logits), temperature)  # (B, A, bins)
        log_probs = log_softmax.gather(-1, bins.to(log_softmax.device)[..., None]).squeeze(-1)
        entropy = -(log_softmax.exp() * log_softmax).sum(-1)
        # copies, not views: FSDP2 warns of a sharded module returning a view (an in-place op on
        # it would skip the module's pre-backward all-gather)
        return log_probs[:, None].clone(), entropy[:, None].clone()

    def bc_loss(self, obs: TensorDict, expert_actions: Tensor) -> Tensor:
        """OpenVLA's fine-tuning loss: cross-entropy of the expert's action tokens over the whole
        vocabulary at temperature 1 (``finetune.py`` of openvla/openvla trains the LM loss on
        the action tokens), averaged over batch and dimensions.

        Args:
            obs: observation TensorDict.
            expert_actions: ``(batch, 1, action_dim)`` normalised actions in [-1, 1] (see
                :meth:`policies.normalization.ActionStatistics.normalize`).

        Returns:
            a differentiable scalar.

        Raises:
            ValueError: malformed ``obs`` or ``expert_actions``.
        """
        self._check_actions(expert_actions, obs.batch_size[0], "expert_actions")
        bins = self.action_tokenizer.bins_from_actions(expert_actions[:, 0])
        logits, tokens = self._bin_logits(obs, bins)
        return F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
