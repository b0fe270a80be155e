"""The contract the simulator workers drive: a batch of environments stepped one action chunk at a
time, all of them at once.

A :class:`VectorSimulator` hosts ``num_envs`` environments addressed by index and answers
:meth:`~VectorSimulator.reset` and :meth:`~VectorSimulator.step_chunk` for any subset of them
(the rollout pipelines groups of environments, so a call may name only some). The simulator
worker (:class:`simulators.worker.SimulatorWorker`) runs one per Ray actor and checks the
arguments before it calls it.

Two kinds implement it:

* today's single-environment adapters (gymnasium ``Env`` classes: robosuite, MetaWorld, LIBERO,
  remote), all through one wrapper, :class:`simulators.gym_vector.GymVector`, which steps them one
  after another;
* a simulator that steps its environments as one batch (ManiSkill3, MuJoCo Warp, Isaac, or numpy
  arrays) implements it directly: a class with the methods below, a ``config_class`` (a dataclass
  with ``horizon`` and a ``task_name`` property, as for the gym adapters) and a constructor
  ``(config, num_envs)``, registered in :data:`simulators.registry.SIMULATORS` like any simulator.
  tests/simulators/test_vector_simulator.py trains SRPO on a batched point-mass reach written this
  way, through the unchanged engine.

Optional, for a class that can: ``run_expert(init_state_ids, task_id) -> episodes`` (scripted
demonstrations, see :meth:`simulators.gym_vector.GymVector.run_expert`; without it a run needs
``warm_start.num_demos: 0``), ``make_envs(progress, num_actors)`` (create everything now rather
than at the first call), ``render_mode`` (``"rgb_array"`` when ``step_chunk`` can return frames
for ``render_indices``; otherwise evaluation videos are refused before any rollout) and the class
attributes the gym adapters may declare (``video_camera``, ``unavailable_reason``,
``start_services``; :mod:`simulators.registry`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from vla_rl_core.env_spec import EnvSpec
from vla_rl_core.observations import Observations


@dataclass(frozen=True)
class ChunkResult:
    """What one action chunk did to ``n`` environments (row ``k``: the ``k``-th stepped one).

    Attributes:
        obs: the observation after each environment's last executed step (the terminal one of an
            episode that ended; zeros for a lost episode): float32 ``(n, obs_dim)``, or a dict of
            ``n``-row arrays (:mod:`vla_rl_core.observations`).
        reward: float32 ``(n,)``, summed over the executed steps.
        terminated, truncated: bool ``(n,)``, of the last executed step.
        success: bool ``(n,)``, whether any executed step succeeded.
        steps: int64 ``(n,)``, control steps executed (1..chunk; an environment stops at the end
            of its episode, mid-chunk).
        lost: bool ``(n,)``, the episode was lost (counted, never scored;
            :class:`simulators.stepping.EpisodeLost`).
        frames: one uint8 ``(steps, H, W, 3)`` array per rendered environment, in the order of
            the call's ``render_indices`` (empty when none were asked for).

    Raises:
        ValueError: a per-environment array that is not ``(n,)`` of its dtype.
    """

    obs: Observations
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    success: np.ndarray
    steps: np.ndarray
    lost: np.ndarray
    frames: list[np.ndarray] = field(default_factory=list)

    DTYPES = {"reward": np.float32, "terminated": np.bool_, "truncated": np.bool_, "success": np.bool_,
              "steps": np.int64, "lost": np.bool_}

    def __post_init__(self) -> None:
        n = len(self.reward)
        for name, dtype in self.DTYPES.items():
            value = getattr(self, name)
            if not isinstance(value, np.ndarray) or value.shape != (n,) or value.dtype != dtype:
                raise ValueError(f"ChunkResult.{name} must be a {np.dtype(dtype)} array of shape ({n},), got "
                                 f"{getattr(value, 'dtype', type(value).__name__)} {getattr(value, 'shape', '')}")

    def as_dict(self) -> dict[str, Any]:
        """The result as the simulator worker returns it over Ray (``obs``, the per-environment
        arrays, ``frames``)."""
        return {"obs": self.obs, **{name: getattr(self, name) for name in self.DTYPES}, "frames": list(self.frames)}


@runtime_checkable
class VectorSimulator(Protocol):
    """``num_envs`` environments stepped in batches (see the module docstring).

    Every method takes ``env_indices``: ``n`` distinct indices in ``[0, num_envs)`` (checked by
    the caller); row ``k`` of its arguments and results belongs to environment ``env_indices[k]``.
    Environments never reset themselves: after an episode ends, an environment waits for
    :meth:`reset`.
    """

    def spec(self) -> EnvSpec:
        """The environments' observation and action layout and horizon
        (:class:`~vla_rl_core.env_spec.EnvSpec`; ``num_tasks`` set for a task set)."""

    def reset(self, env_indices: Sequence[int], init_state_ids: Sequence[int],
              task_ids: Sequence[int] | None = None) -> Observations:
        """Start an episode in each of ``env_indices`` from initial state ``init_state_ids[k]`` (the
        same id gives the same initial state in any process); returns the ``n`` first observations.
        ``task_ids``: the task of each environment in a task set (None: a single task)."""

    def step_chunk(self, env_indices: Sequence[int], actions: np.ndarray,
                   render_indices: Sequence[int] = ()) -> ChunkResult:
        """Execute ``actions`` float32 ``(n, chunk, action_dim)``: environment ``env_indices[k]`` takes
        ``actions[k, 0], actions[k, 1], ...``, one control step each, until its episode ends.
        ``render_indices``: environments (among ``env_indices``) whose frames to return."""

    def close(self) -> None:
        """Release the environments."""


def check_chunk_call(num_envs: int, env_indices: Sequence[int], actions: np.ndarray | None = None) -> None:
    """Check a call's ``env_indices`` (and ``actions`` float32 ``(n, chunk, action_dim)``) against a
    simulator of ``num_envs`` environments.

    Raises:
        ValueError: empty, repeated or out-of-range indices, or an ``actions`` shape that does
            not match.
    """
    if len(env_indices) == 0:
        raise ValueError("env_indices must not be empty")
    if len(set(env_indices)) != len(env_indices):
        raise ValueError(f"env_indices must be distinct, got {list(env_indices)}")
    bad = [i for i in env_indices if not 0 <= i < num_envs]
    if bad:
        raise ValueError(f"env_indices {bad} are out of range [0, {num_envs})")
    if actions is not None and (actions.ndim != 3 or actions.shape[0] != len(env_indices) or actions.shape[1] < 1):
        raise ValueError(f"actions must have shape ({len(env_indices)}, chunk, action_dim), got {actions.shape}")
