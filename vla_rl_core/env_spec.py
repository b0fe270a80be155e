"""What a simulator's environments observe and take: :class:`EnvSpec`, the typed seam between a
simulator, the engine and the policy.

A simulator states it (``VectorSimulator.spec()``, :meth:`simulators.worker.SimulatorWorker.spec`,
``SimulatorPool.spec()``); the engine builds the policy from it (``obs_dim``, ``action_dim``,
``num_tasks``), sizes episode buffers and stores with it (``horizon``, ``images``), and compares a
task's with the policy's before evaluating (``obs_layout``).

What the gymnasium environments the engine drives (a registered simulator's, a remote
environment's client's) take and report: actions checked finite and clipped to their action
space (:func:`executed_actions`), success in ``step``'s ``info`` (:func:`info_success`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """The observation and action layout of a simulator's environments.

    Attributes:
        obs_dim: float32 state features per observation (the flat observation, or the ``state``
            of a dict observation).
        action_dim: values per environment action (the built-in simulators' lie in [-1, 1]).
        horizon: control steps after which an episode is truncated.
        obs_layout: where each named part of the state lies, ``{key: (start, stop)}`` (may be
            empty: a state without named parts).
        images: ``None`` for observations that are the bare state vector; otherwise the
            observation is a dict of ``state``, these uint8 camera images ``{"<camera>_image":
            (H, W, 3)}`` (may be empty) and the encoded instruction.
        num_tasks: the size of the task set the environments belong to (the observation then
            holds a ``task_id``), or ``None`` for a single task.

    Raises:
        ValueError: a size is not a positive integer, a layout part is not ``0 <= start < stop
            <= obs_dim``, or an image shape is not ``(H, W, 3)`` (naming the field).
    """

    obs_dim: int
    action_dim: int
    horizon: int
    obs_layout: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    images: Mapping[str, tuple[int, int, int]] | None = None
    num_tasks: int | None = None

    def __post_init__(self) -> None:
        for name in ("obs_dim", "action_dim", "horizon", "num_tasks"):
            value = getattr(self, name)
            if value is None and name == "num_tasks":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EnvSpec.{name} must be a positive integer, got {value!r}")
        layout = {str(key): (int(part[0]), int(part[1])) for key, part in dict(self.obs_layout).items()}
        for key, (start, stop) in layout.items():
            if not 0 <= start < stop <= self.obs_dim:
                raise ValueError(f"EnvSpec.obs_layout[{key!r}] must lie in the state of {self.obs_dim} values "
                                 f"(0 <= start < stop <= obs_dim), got [{start}, {stop})")
        object.__setattr__(self, "obs_layout", layout)
        if self.images is not None:
            images = {str(key): tuple(int(n) for n in shape) for key, shape in dict(self.images).items()}
            for key, shape in images.items():
                if len(shape) != 3 or shape[2] != 3 or min(shape) < 1:
                    raise ValueError(f"EnvSpec.images[{key!r}] must be an (H, W, 3) shape, got {shape}")
            object.__setattr__(self, "images", images)

    @property
    def dict_observations(self) -> bool:
        """Whether an observation is a dict (camera images, or a task set's ``task_id``), not the
        bare float32 state vector."""
        return self.images is not None or self.num_tasks is not None

    def with_tasks(self, num_tasks: int) -> EnvSpec:
        """This spec for a task set of ``num_tasks`` tasks sharing it."""
        return dataclasses.replace(self, num_tasks=num_tasks)

    def differences(self, other: EnvSpec) -> list[str]:
        """The names of the fields in which ``other`` differs from this spec, in field order."""
        return [field.name for field in dataclasses.fields(self)
                if getattr(self, field.name) != getattr(other, field.name)]


#: The keys of a gymnasium ``step``'s ``info`` that say whether the task is done, in the order
#: read: the engine's simulators' ``success`` (robosuite's adapters, MetaWorld's
#: ``info["success"]``), then gymnasium-robotics' and Stable-Baselines3's ``is_success``.
SUCCESS_INFO_KEYS = ("success", "is_success")


def info_success(info: Mapping[str, Any]) -> bool:
    """Whether a step's ``info`` reports the task done (the first of :data:`SUCCESS_INFO_KEYS`
    it holds).

    Raises:
        ValueError: it holds neither (the engine's rewards are success: an environment without it
            would score every episode a failure), naming the keys it has.
    """
    for key in SUCCESS_INFO_KEYS:
        if key in info:
            return bool(info[key])
    raise ValueError(f"step() returned an info without {' or '.join(repr(k) for k in SUCCESS_INFO_KEYS)} (it has "
                     f"{sorted(map(str, info))}): report whether the task is done, as a bool")


def executed_actions(actions: Any, low: Any, high: Any) -> np.ndarray:
    """Actions as an environment receives them: clipped to its action space's bounds, as
    Stable-Baselines3 does (a Gaussian policy's samples are unbounded; the log-probabilities stay
    those of the samples).

    Args:
        actions: ``(..., action_dim)`` values.
        low, high: the ``Box``'s bounds (``(action_dim,)`` or scalars; ``±inf``: unbounded).

    Returns:
        the clipped actions (the bounds' dtype where it is wider).

    Raises:
        ValueError: a value is not finite (clipping would turn ``inf`` into a bound, silently).
    """
    return np.clip(finite_actions(actions), low, high)


def finite_actions(actions: Any) -> np.ndarray:
    """``actions`` as an array, checked finite (what every environment takes, a chunked one too).

    Raises:
        ValueError: a value is not finite.
    """
    actions = np.asarray(actions)
    if not np.all(np.isfinite(actions)):
        raise ValueError(f"actions must be finite, got {actions.tolist()}")
    return actions
