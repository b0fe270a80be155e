"""Trajectory-level rewards for embodied tasks, registered by name in ``EMBODIED_REWARDS``.

Every entry has the same signature, so a reward node can switch between them by name::

    fn(embeddings_or_None, success, task_ids, config) -> rewards  # (batch,) float32

- ``"success"``: the sparse binary outcome reward (1 for success, 0 otherwise).
- ``"srpo"``: SRPO's world-progress reward (Fei et al. 2025), see ``vla_rl.algorithms.srpo``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from vla_rl.algorithms.srpo import SRPORewardConfig, compute_srpo_rewards
from vla_rl.utils.registry import Registry

EMBODIED_REWARDS: Registry[Callable[..., Tensor]] = Registry("embodied reward")


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


@EMBODIED_REWARDS.register("srpo")
def compute_srpo_progress_rewards(
    embeddings: Tensor | None,
    success: Tensor,
    task_ids: Tensor,
    config: SRPORewardConfig,
) -> Tensor:
    """SRPO world-progress reward; see ``vla_rl.algorithms.srpo.compute_srpo_rewards``.

    Args:
        embeddings: (batch, dim) float trajectory embeddings; required.
        success: (batch,) bool.
        task_ids: (batch,) int64.
        config: SRPO reward settings.

    Returns:
        (batch,) float32: 1.0 for successes, (0, 1) for failures of tasks with a success in the
        batch, 0.0 for failures of tasks without one.

    Raises:
        ValueError: if ``embeddings`` is None, or from ``compute_srpo_rewards``.
    """
    if embeddings is None:
        raise ValueError("the 'srpo' reward needs trajectory embeddings; encode the trajectories "
                         "first (e.g. with a registered trajectory encoder) or use 'success'")
    return compute_srpo_rewards(embeddings, success, task_ids, config)
