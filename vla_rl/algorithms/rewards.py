"""Trajectory-level rewards for embodied tasks, registered by name in ``EMBODIED_REWARDS``.

Every entry has the same signature, so a reward node can switch between them by name::

    fn(embeddings_or_None, success, task_ids, config) -> rewards  # (batch,) float32

An entry registered with ``embeddings=True`` scores trajectory embeddings: the reward node then
embeds each episode with the run's trajectory encoder (``algorithm.trajectory_encoder``, a worker
resource); ``config`` is its registered config class (``algorithm.<name>``), or None. An entry
that compares an episode with the whole step (``step_reference=True``, SRPO) also takes
``shards``, through which the reward node's DP shards exchange what it needs, so that it runs
at any DP size and gives the whole step's rewards.

- ``"success"``: the sparse binary outcome reward (1 for success, 0 otherwise).
- ``"srpo"``: SRPO's world-progress reward (Fei et al. 2025), see ``vla_rl.algorithms.srpo``.

Also: :func:`overlong_penalty`, DAPO's soft length penalty added to a trajectory's reward, and
:func:`outcome_to_token_rewards`, which places trajectory rewards on their last valid step for
the advantage estimators.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from pydantic import BaseModel, ConfigDict
from torch import Tensor

from vla_rl.algorithms.srpo import SRPORewardConfig, SRPOShards, compute_srpo_rewards
from vla_rl_core.registry import Registry


class RewardTraits(BaseModel):
    """What an embodied reward declares when it registers (checked then, by pydantic).

    Attributes:
        embeddings: it scores the episodes' trajectory embeddings (the reward node builds the
            run's ``algorithm.trajectory_encoder`` and passes them).
        step_reference: its reference set may span the whole step (its config's ``reference_set:
            step``, e.g. ``algorithm.srpo.reference_set``): the reward node's DP shards exchange
            what it needs (:class:`SRPOShards`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    embeddings: bool = False
    step_reference: bool = False


def _reward_call(traits: RewardTraits | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """How the reward node calls an embodied reward (``shards`` for one whose reference set may
    span the step)."""
    keywords = ("shards",) if traits is not None and traits.step_reference else ()
    return ("embeddings", "success", "task_ids", "config"), keywords


EMBODIED_REWARDS: Registry[Callable[..., Tensor]] = Registry("embodied reward", traits=RewardTraits,
                                                             calls=_reward_call)


@EMBODIED_REWARDS.register("success")
def compute_success_rewards(
    embeddings: Tensor | None,
    success: Tensor,
    task_ids: Tensor,
    config: object | None = None,
) -> Tensor:
    """Binary outcome reward: ``R = 1`` if the episode reached the goal else ``0`` (the sparse
    terminal reward ``R(z_{0:T}, l)`` that SRPO, Fei et al. 2025 §3, starts from).

    Args:
        embeddings: unused (may be None); accepted for the common signature.
        success: (batch,) bool.
        task_ids: (batch,) int64; unused beyond the shape check.
        config: unused; accepted for the common signature.

    Returns:
        (batch,) float32 on ``success``' device.

    Raises:
        ValueError: if ``success`` is not (batch,) bool or ``task_ids`` does not match it.
    """
    if success.dim() != 1 or success.dtype != torch.bool:
        raise ValueError(f"success must be a (batch,) bool tensor; got {success.dtype} of shape "
                         f"{tuple(success.shape)}")
    if task_ids.shape != success.shape:
        raise ValueError(f"task_ids shape {tuple(task_ids.shape)} must equal success shape "
                         f"{tuple(success.shape)}")
    return success.to(torch.float32)


@EMBODIED_REWARDS.register("srpo", config=SRPORewardConfig, embeddings=True, step_reference=True)
def compute_srpo_progress_rewards(
    embeddings: Tensor | None,
    success: Tensor,
    task_ids: Tensor,
    config: SRPORewardConfig,
    shards: SRPOShards | None = None,
) -> Tensor:
    """SRPO world-progress reward; see ``vla_rl.algorithms.srpo.compute_srpo_rewards``.

    Args:
        embeddings: (batch, dim) float trajectory embeddings; required.
        success: (batch,) bool.
        task_ids: (batch,) int64.
        config: SRPO reward settings.
        shards: for a batch split over workers, how its shards share successes and distance
            spans (``SRPOShards``); None: the batch is whole here.

    Returns:
        (batch,) float32: 1.0 for successes, (0, 1) for failures of tasks with a success in the
        batch, 0.0 for failures of tasks without one.

    Raises:
        ValueError: if ``embeddings`` is None, or from ``compute_srpo_rewards``.
    """
    if embeddings is None:
        raise ValueError("the 'srpo' reward needs trajectory embeddings; encode the trajectories "
                         "first (e.g. with a registered trajectory encoder) or use 'success'")
    return compute_srpo_rewards(embeddings, success, task_ids, config, shards)


def overlong_penalty(lengths: Tensor, max_length: int, buffer_length: int, penalty_factor: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", §3.4, eq. 13), scaled by
    ``penalty_factor`` (verl's ``overlong_penalty_factor``)::

        R_length(y) = 0                                         |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache       L_max - L_cache < |y| <= L_max
                    = -1                                        L_max < |y|

    with ``L_max = max_length`` and ``L_cache = buffer_length``. For embodied episodes ``|y|`` is
    the number of decision steps and ``L_max`` the decision budget, so long episodes pay a
    penalty growing linearly to ``-penalty_factor`` at the budget.

    Args:
        lengths: (batch,) int64, each trajectory's length.
        max_length: L_max >= 1.
        buffer_length: L_cache, in [1, max_length].
        penalty_factor: >= 0.

    Returns:
        (batch,) float32, in [-penalty_factor, 0].

    Raises:
        ValueError: on out-of-range settings or a non-integer ``lengths``.
    """
    if lengths.dim() != 1 or lengths.is_floating_point():
        raise ValueError(f"lengths must be a (batch,) integer tensor; got {lengths.dtype} of shape "
                         f"{tuple(lengths.shape)}")
    if not 1 <= buffer_length <= max_length:
        raise ValueError(f"need 1 <= buffer_length <= max_length (got {buffer_length}, {max_length})")
    if penalty_factor < 0:
        raise ValueError(f"penalty_factor must be >= 0 (got {penalty_factor})")
    expected = max_length - buffer_length
    lengths = lengths.to(torch.float64)
    ramp = (expected - lengths) / buffer_length  # (B,)
    penalty = torch.where(lengths <= expected, 0.0, torch.where(lengths <= max_length, ramp, -1.0))
    return (penalty_factor * penalty).to(torch.float32)


def outcome_to_token_rewards(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """Place each trajectory-level reward on its row's last valid step (verl's convention for
    outcome rewards: the reward arrives with the final token / action).

    Args:
        rewards: (batch,) float.
        response_mask: (batch, seq_len) bool, True on valid steps.

    Returns:
        (batch, seq_len) of ``rewards``' dtype: ``rewards[i]`` at the last True position of row
        ``i``, 0 elsewhere; a row without valid steps is all 0.

    Raises:
        ValueError: on mismatched shapes.
    """
    if rewards.dim() != 1 or response_mask.dim() != 2 or response_mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"need rewards (batch,) and response_mask (batch, seq_len); got "
                         f"{tuple(rewards.shape)} and {tuple(response_mask.shape)}")
    mask = response_mask if response_mask.dtype == torch.bool else response_mask != 0
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)  # (B, T)
    last = torch.where(mask, positions, -1).max(dim=-1).values  # (B,), -1 without valid steps
    at_last = (positions == last[:, None]) & mask  # (B, T)
    return torch.where(at_last, rewards[:, None], 0.0).to(rewards.dtype)
