"""What the MuJoCo environments share about a control step: the action check, and the split of
``step`` into ``step_unobserved`` (advance, no observation) and ``observe`` (build the current
observation, rendering its cameras), which lets the simulator workers render once per action chunk.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def checked_action(action: Any, act_dim: int, episode_over: bool) -> np.ndarray:
    """``action`` as float64, clipped to [-1, 1], once checked.

    Args:
        action: ``(act_dim,)`` values.
        act_dim: the environment's action length.
        episode_over: whether the environment has no running episode.

    Returns:
        float64 ``(act_dim,)`` in [-1, 1].

    Raises:
        RuntimeError: if ``episode_over`` (before ``reset`` or after the episode ended).
        ValueError: if ``action`` does not have shape ``(act_dim,)`` or is not finite.
    """
    if episode_over:
        raise RuntimeError("no episode is running: call reset() first (the environment never auto-resets)")
    action = np.asarray(action, dtype=np.float64)
    if action.shape != (act_dim,):
        raise ValueError(f"action must have shape ({act_dim},), got {action.shape}")
    if not np.all(np.isfinite(action)):
        raise ValueError(f"action must be finite, got {action}")
    return np.clip(action, -1.0, 1.0)


class UnobservedSteps:
    """Mixin (before ``gymnasium.Env`` in the bases) of environments whose ``step`` is
    ``step_unobserved(action) -> (reward, terminated, truncated, info)`` followed by
    ``observe() -> obs``; the subclass defines both (``step_unobserved`` applies one control
    action without building the observation, ``observe`` builds the current state's observation
    as ``reset`` and ``step`` return it). The simulator workers call the two themselves for action
    chunks (see :mod:`simulators.registry`)."""

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict]:
        """Apply one control action, then build the observation.

        Returns:
            ``(obs, reward, terminated, truncated, info)``: obs as ``reset`` returns it; the rest
            as ``step_unobserved``: reward 1.0 on success else 0.0, terminated = success,
            truncated = horizon reached without success, info ``{"success": bool,
            "episode_step": int}``.

        Raises:
            ValueError, RuntimeError: as :func:`checked_action`.
        """
        reward, terminated, truncated, info = self.step_unobserved(action)
        return self.observe(), reward, terminated, truncated, info
