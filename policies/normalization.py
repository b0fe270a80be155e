"""The one place every normalisation formula lives: the policies' observation and action
statistics and the critic's state normalisation.

- **Mean and standard deviation** (z-score): :func:`mean_std_normalize` ``(x - mean) / (std + eps)``
  and its inverse. The MLP policy and the critic use it with ``eps = 0`` and a floored scale
  (:func:`fit_mean_std` with ``std_floor``, the warm start's ``obs_std_floor``); π0 with openpi's
  ``eps = 1e-6`` and no floor (:class:`MeanStdStatistics`; Physical-Intelligence/openpi
  ``src/openpi/transforms.py`` ``Normalize._normalize`` 137–139, ``Unnormalize._unnormalize``
  170–173, read at ``15a9616``; the statistics as openpi's ``RunningStats``: mean and population
  standard deviation).
- **Quantile bounds** (``bounds_q99``): :class:`ActionStatistics` maps the 1st..99th percentile
  range onto [-1, 1], clipped, on the dimensions of ``mask`` (openvla/openvla
  ``prismatic/vla/datasets/rlds/utils/data_utils.py`` ``normalize_action_and_proprio``,
  ``NormalizationType.BOUNDS_Q99``: ``clip(2 (x - q01) / (q99 - q01 + 1e-8) - 1, -1, 1)``;
  ``prismatic/extern/hf/modeling_prismatic.py`` ``predict_action``: ``0.5 (a + 1) (q99 - q01) +
  q01``). OpenVLA and OpenVLA-OFT normalise actions (and OFT its proprio) this way, π0 when
  ``normalization: bounds_q99``; :func:`fit_bounds_q99` fits them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


def mean_std_normalize(x: Tensor, mean: Tensor, std: Tensor, eps: float = 0.0) -> Tensor:
    """``(x - mean) / (std + eps)``, in the dtype the operands promote to (the callers cast).

    Args:
        x: ``(..., dim)`` raw values.
        mean, std: ``(dim,)``; ``std + eps`` > 0.
        eps: denominator guard (openpi's 1e-6 for π0; 0 where ``std`` is floored when fitted).
    """
    return (x - mean) / (std + eps)


def mean_std_denormalize(x: Tensor, mean: Tensor, std: Tensor, eps: float = 0.0) -> Tensor:
    """``x * (std + eps) + mean``, the inverse of :func:`mean_std_normalize`."""
    return x * (std + eps) + mean


def fit_mean_std(values: Tensor, std_floor: float = 0.0) -> tuple[Tensor, Tensor]:
    """Per-feature mean and population standard deviation of ``values`` ``(N, dim)``, the
    standard deviation floored at ``std_floor`` (units of the values: a feature the data leave
    constant must not blow up the normalised input): two ``(dim,)`` tensors."""
    return values.mean(0), values.std(0, unbiased=False).clamp(min=std_floor)


def fit_bounds_q99(values: Tensor) -> tuple[Tensor, Tensor]:
    """Per-feature 1st and 99th percentiles of ``values`` ``(N, dim)`` (``torch.quantile``,
    linear interpolation): ``q01``, ``q99``, two ``(dim,)`` tensors."""
    return torch.quantile(values, 0.01, dim=0), torch.quantile(values, 0.99, dim=0)


#: Denominator guard of OpenVLA's bounds_q99 normalisation.
_EPS = 1e-8


@dataclass(frozen=True)
class ActionStatistics:
    """Per-dimension action statistics of one dataset (one ``unnorm_key``).

    Attributes:
        q01, q99: ``(action_dim,)`` float32 1st and 99th percentiles, raw action units.
        mask: ``(action_dim,)`` bool; False on dimensions left unnormalised (the gripper).
    """

    q01: Tensor
    q99: Tensor
    mask: Tensor

    @classmethod
    def from_dict(cls, stats: dict[str, Any], source: str) -> ActionStatistics:
        """Read the ``"action"`` entry of a dataset's statistics (``q01``, ``q99``, optional
        ``mask``, default all True).

        Raises:
            ValueError: a field is missing or the lengths differ; the message names ``source``.
        """
        q01, q99 = _float_fields(stats, ("q01", "q99"), f"{source}: action statistics")
        mask = torch.tensor(stats.get("mask", [True] * len(q01)), dtype=torch.bool)
        if q01.ndim != 1 or q99.shape != q01.shape or mask.shape != q01.shape:
            raise ValueError(
                f"{source}: q01, q99 and mask must be equally long lists, got lengths "
                f"{tuple(q01.shape)}, {tuple(q99.shape)}, {tuple(mask.shape)}"
            )
        return cls(q01, q99, mask)

    @property
    def action_dim(self) -> int:
        return self.q01.shape[0]

    def normalize(self, actions: Tensor) -> Tensor:
        """Raw actions → normalised ``[-1, 1]`` (bounds_q99, see the module docstring).

        Args:
            actions: ``(..., action_dim)`` floating, raw units.

        Returns:
            float32, same shape.

        Raises:
            ValueError: the last dimension is not ``action_dim``.
        """
        self._check(actions)
        q01, q99, mask = (t.to(actions.device) for t in (self.q01, self.q99, self.mask))
        scaled = (2 * (actions.float() - q01) / (q99 - q01 + _EPS) - 1).clamp(-1.0, 1.0)
        return torch.where(mask, scaled, actions.float())

    def denormalize(self, actions: Tensor) -> Tensor:
        """Normalised actions → raw units: ``0.5 (a + 1) (q99 - q01) + q01`` where ``mask``.

        Args:
            actions: ``(..., action_dim)`` floating, normalised units.

        Returns:
            float32, same shape.

        Raises:
            ValueError: the last dimension is not ``action_dim``.
        """
        self._check(actions)
        q01, q99, mask = (t.to(actions.device) for t in (self.q01, self.q99, self.mask))
        raw = 0.5 * (actions.float() + 1) * (q99 - q01) + q01
        return torch.where(mask, raw, actions.float())

    def _check(self, actions: Tensor) -> None:
        _check_features(actions, self.action_dim, "actions")


#: Denominator guard of openpi's ``Normalize`` / ``Unnormalize`` (``transforms.py`` 139, 173).
MEAN_STD_EPS = 1e-6


@dataclass(frozen=True)
class MeanStdStatistics:
    """Per-feature mean and standard deviation, openpi's z-score normalisation (every feature, no
    clipping, no mask).

    Attributes:
        mean, std: ``(dim,)`` float32, raw units.
    """

    mean: Tensor
    std: Tensor

    @classmethod
    def from_dict(cls, stats: dict[str, Any], source: str) -> MeanStdStatistics:
        """Read ``{"mean": [...], "std": [...]}``.

        Raises:
            ValueError: a field is missing or the lengths differ; the message names ``source``.
        """
        mean, std = _float_fields(stats, ("mean", "std"), f"{source}: statistics")
        if mean.ndim != 1 or std.shape != mean.shape:
            raise ValueError(f"{source}: mean and std must be equally long lists, got lengths {tuple(mean.shape)}, "
                             f"{tuple(std.shape)}")
        return cls(mean, std)

    @property
    def dim(self) -> int:
        return self.mean.shape[0]

    def normalize(self, x: Tensor) -> Tensor:
        """Raw → normalised: ``(x - mean) / (std + 1e-6)``.

        Args:
            x: ``(..., dim)`` floating, raw units.

        Returns:
            float32, same shape.

        Raises:
            ValueError: the last dimension is not ``dim``.
        """
        self._check(x)
        return mean_std_normalize(x.float(), self.mean.to(x.device), self.std.to(x.device), MEAN_STD_EPS)

    def denormalize(self, x: Tensor) -> Tensor:
        """Normalised → raw: ``x * (std + 1e-6) + mean``.

        Args:
            x: ``(..., dim)`` floating, normalised units.

        Returns:
            float32, same shape.

        Raises:
            ValueError: the last dimension is not ``dim``.
        """
        self._check(x)
        return mean_std_denormalize(x.float(), self.mean.to(x.device), self.std.to(x.device), MEAN_STD_EPS)

    def _check(self, x: Tensor) -> None:
        _check_features(x, self.dim, "values")


def _float_fields(stats: dict[str, Any], names: tuple[str, ...], what: str) -> list[Tensor]:
    """``stats[name]`` as float32 tensors, in ``names``' order.

    Raises:
        ValueError: a field is missing (``"<what> have no '<name>' field"``).
    """
    try:
        return [torch.tensor(stats[name], dtype=torch.float32) for name in names]
    except KeyError as missing:
        raise ValueError(f"{what} have no {missing} field") from None


def _check_features(x: Tensor, dim: int, what: str) -> None:
    """Raise ValueError unless ``x`` is floating with ``dim`` features in its last dimension."""
    if x.shape[-1:] != (dim,) or not x.is_floating_point():
        raise ValueError(f"{what} must be floating (..., {dim}), got {tuple(x.shape)} {x.dtype}")
