"""The embodied rollout loop: a policy drives a simulator pool through whole episodes.

Each decision step the policy samples an action chunk for every still-running environment; the
pool executes the chunk's actions one control step at a time. An environment stops at success
(``terminated``) or at its time limit (``truncated``); a success reached in the middle of a chunk
ends the episode as a success and the rest of that chunk is not executed. The terminal observation
is kept (``obs[:, finish_step]``). Finished environments are not stepped again.

Observations are what the simulator gives (:mod:`vla_rl.data.observations`): a flat state, or
with cameras a ``TensorDict`` of the state, uint8 images and the encoded instruction; the policy's
``sample_actions`` reads them as they are (a VLA's processor builds its inputs), and the pool
receives ``policy.env_actions(actions)`` while the batch keeps the policy's own actions.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tensordict import TensorDict

from vla_rl.data import keys
from vla_rl.data.observations import to_torch


@dataclass
class RolloutResult:
    """Episodes of one rollout call.

    Attributes:
        batch: one row per episode: ``obs`` ``(n, T + 1, obs_dim)`` (camera observations: a
            TensorDict of batch size ``(n, T + 1)``, see :mod:`vla_rl.data.keys`), ``actions``
            ``(n, T, chunk, action_dim)``, ``old_log_probs`` ``(n, T, chunk)``, ``response_mask``
            ``(n, T)``, ``success`` ``(n,)``, ``finish_step`` ``(n,)`` (decision steps taken), where
            ``T = ceil(horizon / chunk)``.
        frames: for each rendered environment index, its frames ``(steps, H, W, 3)`` uint8, one
            after each control step.
        env_steps: control steps executed (all environments together).
        policy_seconds: wall time spent in ``policy.sample_actions`` and ``policy.env_actions``.
        env_seconds: wall time spent in the pool's ``reset`` and ``step`` (physics, rendering, Ray).
    """

    batch: TensorDict
    frames: dict[int, np.ndarray] = field(default_factory=dict)
    env_steps: int = 0
    policy_seconds: float = 0.0
    env_seconds: float = 0.0


@torch.no_grad()
def rollout_episodes(
    policy,
    pool,
    init_state_ids: np.ndarray,
    *,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    render_indices: tuple[int, ...] = (),
) -> RolloutResult:
    """Run one episode per initial state in ``init_state_ids`` (shape ``(n,)``, int64).

    Args:
        policy: a :class:`policies.base.Policy` (its ``sample_actions`` is called on the
            running environments' observations, its ``env_actions`` on the sampled actions).
        pool: a :class:`simulators.pool.SimulatorPool` with capacity ≥ n.
        greedy: take the policy's mode instead of sampling.
        generator: torch generator for sampling (reproducibility).
        render_indices: environment indices whose camera frames are recorded.

    Raises:
        ValueError: from the pool if ``n`` exceeds its capacity.
    """
    spec = pool.spec()
    horizon, act_dim = int(spec["horizon"]), int(spec["act_dim"])
    chunk = int(policy.chunk_size)
    n = len(init_state_ids)
    decisions = math.ceil(horizon / chunk)

    start = time.perf_counter()
    obs = to_torch(pool.reset(np.asarray(init_state_ids, dtype=np.int64)))
    env_seconds = time.perf_counter() - start
    obs_buf = _time_buffer(obs, decisions + 1)  # (n, T + 1, ...)
    act_buf = torch.zeros(n, decisions, chunk, act_dim)
    logp_buf = torch.zeros(n, decisions, chunk)
    mask_buf = torch.zeros(n, decisions, dtype=torch.bool)
    success = torch.zeros(n, dtype=torch.bool)
    finish = torch.zeros(n, dtype=torch.int64)
    frames: dict[int, list[np.ndarray]] = {i: [] for i in render_indices}

    obs_buf[:, 0] = obs
    active = np.ones(n, dtype=bool)
    env_steps = 0
    policy_seconds = 0.0
    for t in range(decisions):
        idx = torch.as_tensor(np.flatnonzero(active))
        start = time.perf_counter()
        actions, log_probs = policy.sample_actions(obs_buf[idx, t], greedy=greedy, generator=generator)
        env_actions = policy.env_actions(actions)  # (k, chunk, act_dim) in the simulator's units
        policy_seconds += time.perf_counter() - start
        act_buf[idx, t] = actions
        logp_buf[idx, t] = log_probs
        mask_buf[idx, t] = True
        finish[idx] = t + 1
        full_actions = np.zeros((n, chunk, act_dim), dtype=np.float32)
        full_actions[idx.numpy()] = env_actions.numpy()
        for j in range(chunk):
            if not active.any():
                break
            render = tuple(i for i in render_indices if active[i])
            start = time.perf_counter()
            out = pool.step(full_actions[:, j], active, render_indices=render)
            env_seconds += time.perf_counter() - start
            env_steps += int(active.sum())
            for k, i in enumerate(render):
                frames[i].append(out["frames"][k])
            running = torch.as_tensor(active)
            obs_buf[running, t + 1] = to_torch(out["obs"])[running]
            success[running] |= torch.as_tensor(out["success"][active])
            active &= ~(out["terminated"] | out["truncated"])
        if not active.any():
            break
    # Episodes that ended mid-chunk keep their terminal observation at index finish_step.
    batch = TensorDict(
        {
            keys.OBS: obs_buf,
            keys.ACTIONS: act_buf,
            keys.OLD_LOG_PROBS: logp_buf,
            keys.RESPONSE_MASK: mask_buf,
            keys.SUCCESS: success,
            keys.FINISH_STEP: finish,
            keys.INIT_STATE_ID: torch.as_tensor(np.asarray(init_state_ids), dtype=torch.int64),
        },
        batch_size=[n],
    )
    return RolloutResult(batch, {i: np.stack(f) for i, f in frames.items() if f}, env_steps, policy_seconds,
                         env_seconds)


def _time_buffer(first: torch.Tensor | TensorDict, steps: int) -> torch.Tensor | TensorDict:
    """Zeros for ``steps`` observations per row, shaped like the batch ``first`` (``(n, ...)``):
    ``(n, steps, ...)`` (a TensorDict of batch size ``(n, steps)`` for camera observations)."""
    n = first.shape[0]
    if isinstance(first, TensorDict):
        return TensorDict({key: torch.zeros((n, steps, *value.shape[1:]), dtype=value.dtype)
                           for key, value in first.items()}, batch_size=[n, steps])
    return torch.zeros((n, steps, *first.shape[1:]), dtype=first.dtype)
