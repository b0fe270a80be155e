"""What the MuJoCo environments share about a control step: the action check, and the split of
``step`` into ``step_unobserved`` (advance, no observation) and ``observe`` (build the current
observation, rendering its cameras), which lets the simulator workers render once per action chunk.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def checked_action(action: Any, action_dim: int, episode_over: bool) -> np.ndarray:
    """``action`` as float64, clipped to [-1, 1], once checked.

    Args:
        action: ``(action_dim,)`` values.
        action_dim: the environment's action length.
        episode_over: whether the environment has no running episode.

    Returns:
        float64 ``(action_dim,)`` in [-1, 1].

    Raises:
        RuntimeError: if ``episode_over`` (before ``reset`` or after the episode ended).
        ValueError: if ``action`` does not have shape ``(action_dim,)`` or is not finite.
    """
    if episode_over:
        raise RuntimeError("no episode is running: call reset() first (the environment never auto-resets)")
    action = np.asarray(action, dtype=np.float64)
    if action.shape != (action_dim,):
        raise ValueError(f"action must have shape ({action_dim},), got {action.shape}")
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


class EpisodeLost(RuntimeError):
    """An episode that ended without an outcome to score: the environment lost it (a remote
    environment disconnected or did not answer in time, or its side marked the episode invalid,
    e.g. a person stopped the robot). The simulator workers report its row as lost, as they do
    for a simulator actor that died: counted, never scored as a failure. The environment needs
    a ``reset`` before it steps again."""


class ChunkedSteps:
    """Mixin (before ``gymnasium.Env`` in the bases) of environments that execute a whole action
    chunk themselves, elsewhere (a remote environment: one round trip per chunk, not per action).
    The subclass defines ``send_actions(actions)``, which hands over ``actions`` ``(chunk,
    action_dim)`` (one control step each, until the episode ends) and returns at once, and
    ``receive_outcome() -> (obs, reward, terminated, truncated, info, steps)``, which waits for
    its outcome: the observation after the last executed step, the reward summed over the
    executed steps, ``terminated`` / ``truncated`` of the last one, info ``{"success": bool}``
    (any executed step succeeded) and the executed steps (1..chunk), or raises
    :class:`EpisodeLost`. The simulator workers send the chunks of all their environments before
    waiting for any, so that remote environments run their chunks at the same time (see
    :mod:`simulators.registry`)."""

    def step_actions(self, actions: np.ndarray) -> tuple[Any, float, bool, bool, dict, int]:
        """:meth:`send_actions`, then :meth:`receive_outcome`."""
        self.send_actions(actions)
        return self.receive_outcome()

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict]:
        """One control step: a chunk of one action."""
        obs, reward, terminated, truncated, info, _ = self.step_actions(np.asarray(action)[None])
        return obs, reward, terminated, truncated, info
