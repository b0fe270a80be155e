"""Ratio granularity for action tokens: which unit of an action chunk carries one importance ratio.

An embodied episode takes ``T`` decisions; each decision samples a chunk of ``C`` actions of
``A`` dimensions, and the policy gives a log-probability per action dimension (for a binned or
language-model policy each dimension is one action token). The loss sees a (batch, L) matrix:

- ``"token"``: one ratio per action dimension, ``L = T * C * A`` (OpenVLA-style token-level PPO);
- ``"action"``: one ratio per action, the log-probs summed over its ``A`` dimensions,
  ``L = T * C`` (the joint probability of one control step's action);
- ``"chunk"``: one ratio per decision, summed over the chunk, ``L = T``.

Entropies are reduced the same way (the dimensions of one step are independent given the
observation, so their joint entropy is the sum). Sums run innermost first (over ``A``, then over
``C``), the order the policies use when they report per-step log-probs, so that a chunk-level
log-prob built from per-dimension values equals one built from per-step values bit for bit.

Only executed actions are units of the loss. An episode that ends inside a chunk (a success, or a
time limit that is not a multiple of ``C``) never executes the rest of that chunk: those actions
never reached the simulator, so they carry no ratio, no advantage, no entropy and no KL, and
their log-probs are 0 (a chunk's log-prob is that of its executed actions, for the policies whose
actions are independent or autoregressive given the observation the exact probability of what
was done). SimpleVLA-RL masks the same way (``response_mask = arange(L) < finish_step *
action_token_len``, ``finish_step`` in control steps), as does RLinf (``compute_loss_mask``, a
mask per action from the per-action dones); :func:`executed_actions` gives that mask,
:func:`unit_mask` the loss's view of it.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

RatioGranularity = Literal["token", "action", "chunk"]
RATIO_GRANULARITIES: tuple[str, ...] = get_args(RatioGranularity)


def _check(granularity: str) -> None:
    if granularity not in RATIO_GRANULARITIES:
        raise ValueError(f"unknown ratio granularity {granularity!r}; known: {', '.join(RATIO_GRANULARITIES)}")


def reduce_per_dim(per_dim: Tensor, granularity: str) -> Tensor:
    """Per-dimension values to the loss's unit.

    Args:
        per_dim: (batch, T, C, A) log-probs or entropies of each action dimension.
        granularity: ``"token"``, ``"action"`` or ``"chunk"``.

    Returns:
        (batch, T*C*A), (batch, T*C) or (batch, T).

    Raises:
        ValueError: on an unknown granularity or a tensor that is not 4-D.
    """
    _check(granularity)
    if per_dim.dim() != 4:
        raise ValueError(f"per-dimension values must be (batch, T, C, A); got shape {tuple(per_dim.shape)}")
    if granularity == "token":
        return per_dim.flatten(start_dim=1)  # (B, T*C*A)
    return reduce_per_action(per_dim.sum(dim=-1), granularity)


def reduce_per_action(per_action: Tensor, granularity: str) -> Tensor:
    """Per-action values (summed over dimensions, as the rollout stores them) to the loss's unit.

    Args:
        per_action: (batch, T, C).
        granularity: ``"action"`` or ``"chunk"``; per-action values cannot be split into tokens.

    Returns:
        (batch, T*C) or (batch, T).

    Raises:
        ValueError: on an unknown granularity, ``"token"``, or a tensor that is not 3-D.
    """
    _check(granularity)
    if granularity == "token":
        raise ValueError("per-action log-probs cannot give token-level ratios; compute "
                         "per-dimension log-probs with the policy")
    if per_action.dim() != 3:
        raise ValueError(f"per-action values must be (batch, T, C); got shape {tuple(per_action.shape)}")
    if granularity == "action":
        return per_action.flatten(start_dim=1)  # (B, T*C)
    return per_action.sum(dim=-1)  # (B, T)


def expand_per_step(per_step: Tensor, chunk_size: int, action_dim: int, granularity: str) -> Tensor:
    """Per-decision values (advantages, the response mask, ...) repeated over the loss's units.

    Args:
        per_step: (batch, T), any dtype.
        chunk_size: C; action_dim: A.
        granularity: ``"token"``, ``"action"`` or ``"chunk"``.

    Returns:
        (batch, T*C*A), (batch, T*C) or (batch, T): each decision's value on all its units.

    Raises:
        ValueError: on an unknown granularity or a tensor that is not 2-D.
    """
    _check(granularity)
    if per_step.dim() != 2:
        raise ValueError(f"per-step values must be (batch, T); got shape {tuple(per_step.shape)}")
    repeats = {"token": chunk_size * action_dim, "action": chunk_size, "chunk": 1}[granularity]
    return per_step.repeat_interleave(repeats, dim=1)


def executed_actions(response_mask: Tensor, control_steps: Tensor, chunk_size: int) -> Tensor:
    """Which actions of each decision reached the simulator.

    Args:
        response_mask: (batch, T) bool, the decisions taken.
        control_steps: (batch,) int64, the actions executed in each episode (``control_steps``;
            every decision but the last executes its whole chunk).
        chunk_size: C, actions per decision.

    Returns:
        (batch, T, C) bool on ``response_mask``'s device: action ``c`` of decision ``t`` is
        ``t * C + c < control_steps`` of a decision taken.

    Raises:
        ValueError: ``control_steps`` is not (batch,).
    """
    batch, decisions = response_mask.shape
    if control_steps.shape != (batch,):
        raise ValueError(f"control_steps must be (batch,) = ({batch},); got shape {tuple(control_steps.shape)}")
    position = torch.arange(decisions * chunk_size, device=response_mask.device).view(decisions, chunk_size)
    return (position < control_steps.to(response_mask.device)[:, None, None]) & response_mask.bool()[..., None]


def unit_mask(executed: Tensor, action_dim: int, granularity: str) -> Tensor:
    """The loss's mask at ``granularity`` from the executed actions (:func:`executed_actions`).

    Args:
        executed: (batch, T, C) bool.
        action_dim: A, dimensions per action (the policy's own).
        granularity: ``"token"``, ``"action"`` or ``"chunk"``.

    Returns:
        (batch, T*C*A) bool: every dimension of an executed action; (batch, T*C): the executed
        actions; (batch, T): the decisions with an executed action.

    Raises:
        ValueError: on an unknown granularity or a tensor that is not 3-D.
    """
    _check(granularity)
    if executed.dim() != 3:
        raise ValueError(f"the executed actions must be (batch, T, C); got shape {tuple(executed.shape)}")
    if granularity == "token":
        return executed[..., None].expand(*executed.shape, action_dim).flatten(start_dim=1)  # (B, T*C*A)
    if granularity == "action":
        return executed.flatten(start_dim=1)  # (B, T*C)
    return executed.any(dim=-1)  # (B, T)
