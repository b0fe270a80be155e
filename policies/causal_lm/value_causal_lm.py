"""A value model for PPO on text: the policy's transformer body (a separate copy) with a scalar
head, read at the positions that predict each response token.

As in verl's critic and TRL's PPO value model, ``V(s_t)`` for response token ``t`` is read from
the last hidden state at the position whose logits sample token ``t`` (the state the policy acted
in: the prompt and the first ``t`` response tokens). The head starts at zero, so PPO's first
advantages are the plain GAE of the rewards.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from policies.base import position_ids_from_mask, transformer_blocks
from policies.causal_lm.modeling_causal_lm import CausalLMPolicy


class CausalLMValueModel(nn.Module):
    """``V(prompt, response[:t])`` for every response token, one forward pass per batch.

    Args:
        policy: the policy whose transformer body (``policy.model.model``, weights copied) the
            value model starts from.
        weights: ``(name, tensor)`` of the policy's parameters, named as in ``policy``, to start
            the body from instead of the policy's own (the actor's float32 master weights once
            FSDP's mixed precision has cast the policy to bfloat16:
            :meth:`~vla_rl.trainers.strategy.FSDPStrategy.master_parameters`); the body's
            parameters take their dtype. None: the policy's.

    Raises:
        ValueError: ``weights`` lacks one of the body's parameters (named).
    """

    def __init__(self, policy: CausalLMPolicy, weights: Iterable[tuple[str, Tensor]] | None = None) -> None:
        super().__init__()
        decoder = policy.model.get_decoder()
        self.body = copy.deepcopy(decoder)
        if weights is not None:
            _load_parameters(self.body, weights, prefix=_module_name(policy, decoder))
        self.body.requires_grad_(True)
        self.head = nn.Linear(policy.model.config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def fsdp_units(self) -> list[nn.Module]:
        """The body's transformer blocks (FSDP2 shards each; the head stays with the root)."""
        return transformer_blocks(self)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, responses: Tensor, response_mask: Tensor) -> Tensor:
        """Values of the state before each response token.

        Args:
            input_ids, attention_mask: ``(n, P)`` left-padded prompts.
            responses, response_mask: ``(n, R)`` right-padded responses.

        Returns:
            ``(n, R)`` float32, 0 where ``response_mask`` is False.
        """
        device = self.head.weight.device
        mask = response_mask.to(device).bool()
        if responses.shape[0] == 0:
            return torch.zeros(responses.shape, device=device)
        start = int(attention_mask.bool().any(0).long().argmax())  # skip padding columns shared by all rows
        prompt_ids = input_ids[:, start:].to(device)
        sequences = torch.cat([prompt_ids, responses.to(device)], dim=1)  # (n, P' + R)
        full_mask = torch.cat([attention_mask[:, start:].to(device).long(), mask.long()], dim=1)
        hidden = self.body(input_ids=sequences, attention_mask=full_mask,
                           position_ids=position_ids_from_mask(full_mask), use_cache=False).last_hidden_state
        prompt_len = prompt_ids.shape[1]
        states = hidden[:, prompt_len - 1 : prompt_len - 1 + responses.shape[1]]  # (n, R, H): predict token t
        # the head keeps its own dtype (float32) over a body in another (``text.dtype: bfloat16``,
        # scored without autocast: trainer.mixed_precision none, or CPU workers)
        values = self.head(states.to(self.head.weight.dtype))
        return values.squeeze(-1).float().masked_fill(~mask, 0.0)


def _module_name(root: nn.Module, module: nn.Module) -> str:
    """The qualified name of ``module`` inside ``root``, with a trailing dot ('' for ``root``)."""
    name = next(name for name, candidate in root.named_modules() if candidate is module)
    return f"{name}." if name else ""


@torch.no_grad()
def _load_parameters(module: nn.Module, weights: Iterable[tuple[str, Tensor]], prefix: str) -> None:
    """Replace each parameter of ``module`` by a copy of the tensor ``weights`` names
    ``prefix + name`` (its dtype too); the other tensors are read and passed over."""
    own = dict(module.named_parameters())
    loaded = set()
    for name, tensor in weights:
        local = name.removeprefix(prefix) if name.startswith(prefix) else None
        if local in own:
            own[local].data = tensor.detach().to(own[local].device, copy=True)
            loaded.add(local)
    missing = sorted(set(own) - loaded)
    if missing:
        raise ValueError(f"the value model's weights lack {len(missing)} of the body's parameters, "
                         f"first {prefix}{missing[0]}")
