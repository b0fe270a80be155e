"""Trajectory encoders: fixed-size embeddings of variable-length trajectories, registered by
name in ``TRAJECTORY_ENCODERS``, for trajectory-level rewards such as SRPO's progress reward.

``"state_resample"``: a low-dimensional stand-in for SRPO's world-model video embedding. SRPO
(Fei et al. 2025, arXiv 2511.15605) embeds each episode with V-JEPA 2 from frames sampled
uniformly over the whole episode (siiRL's ``VideoEmbeddingModel.get_embeddings`` takes 64
frames at ``linspace(0, T - 1)``); here the states themselves are resampled the same way, by
linear interpolation, and flattened.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from vla_rl.utils.registry import Registry

TRAJECTORY_ENCODERS: Registry[Callable[..., Tensor]] = Registry("trajectory encoder")


@TRAJECTORY_ENCODERS.register("state_resample")
def encode_state_trajectories(states: Tensor, lengths: Tensor, num_points: int = 16) -> Tensor:
    """Resample each trajectory's valid prefix at ``num_points`` uniformly spaced times.

    For trajectory ``i`` with ``L = lengths[i]`` valid steps, sample point ``k`` sits at the
    fractional step ``t_k = k * (L - 1) / (num_points - 1)`` (first and last valid states are
    always included) and is the linear interpolation
    ``(1 - w) * states[i, floor(t_k)] + w * states[i, min(floor(t_k) + 1, L - 1)]`` with
    ``w = t_k - floor(t_k)``. Only steps ``< L`` are ever read, so values past a trajectory's
    end (padding, garbage, NaN) cannot influence its embedding. A length-1 trajectory repeats
    its one state.

    Args:
        states: (batch, time, state_dim) float, trajectories padded to a common ``time``.
        lengths: (batch,) int64, valid steps per trajectory, each in [1, time].
        num_points: samples per trajectory, >= 2.

    Returns:
        (batch, num_points * state_dim), ``states``' dtype and device; sample-major layout
        (the ``state_dim`` values of sample 0, then of sample 1, ...).

    Raises:
        ValueError: on bad shapes or dtypes, a length outside [1, time], or num_points < 2.
    """
    if states.dim() != 3 or not states.is_floating_point():
        raise ValueError(f"states must be a (batch, time, state_dim) float tensor; got "
                         f"{states.dtype} of shape {tuple(states.shape)}")
    batch, time, state_dim = states.shape
    if lengths.shape != (batch,) or lengths.dtype != torch.int64:
        raise ValueError(f"lengths must be a ({batch},) int64 tensor; got {lengths.dtype} of "
                         f"shape {tuple(lengths.shape)}")
    if batch and (lengths.min() < 1 or lengths.max() > time):
        raise ValueError(f"every length must be in [1, {time}]; got min {int(lengths.min())}, "
                         f"max {int(lengths.max())}")
    if num_points < 2:
        raise ValueError(f"num_points must be >= 2 (got {num_points}) to span start and end")

    lengths = lengths.to(states.device)
    last_step = (lengths - 1).to(torch.float64)  # (B,)
    fractions = torch.linspace(0.0, 1.0, num_points, dtype=torch.float64, device=states.device)
    sample_times = last_step[:, None] * fractions[None, :]  # (B, P)
    lower_step = sample_times.floor().long()  # (B, P), <= lengths - 1
    upper_step = torch.minimum(lower_step + 1, (lengths - 1)[:, None])  # (B, P)
    upper_weight = (sample_times - lower_step.to(torch.float64)).to(states.dtype)  # (B, P)

    def gather_steps(steps: Tensor) -> Tensor:  # (B, P) -> (B, P, state_dim)
        return torch.gather(states, 1, steps[:, :, None].expand(-1, -1, state_dim))

    lower_states = gather_steps(lower_step)  # (B, P, D)
    upper_states = gather_steps(upper_step)  # (B, P, D)
    weight = upper_weight[:, :, None]  # (B, P, 1)
    resampled = (1.0 - weight) * lower_states + weight * upper_states  # (B, P, D)
    return resampled.reshape(batch, num_points * state_dim)  # (B, P * D)
