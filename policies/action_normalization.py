"""OpenVLA's action normalisation (``bounds_q99``) and the LIBERO gripper post-processing.

Sources (openvla/openvla): ``prismatic/vla/datasets/rlds/utils/data_utils.py``
(``normalize_action_and_proprio``, ``NormalizationType.BOUNDS_Q99``:
``clip(2 (x - q01) / (q99 - q01 + 1e-8) - 1, -1, 1)`` where ``mask``, ``x`` elsewhere),
``prismatic/extern/hf/modeling_prismatic.py`` (``predict_action``:
``0.5 (a + 1) (q99 - q01) + q01`` where ``mask``) and ``experiments/robot/robot_utils.py``
(``normalize_gripper_action(binarize=True)``: ``sign(2 g - 1)``; ``invert_gripper_action``:
``-g``), which the LIBERO evaluation applies in that order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

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
        try:
            q01 = torch.tensor(stats["q01"], dtype=torch.float32)
            q99 = torch.tensor(stats["q99"], dtype=torch.float32)
        except KeyError as missing:
            raise ValueError(f"{source}: action statistics have no {missing} field") from None
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
        if actions.shape[-1:] != (self.action_dim,) or not actions.is_floating_point():
            raise ValueError(
                f"actions must be floating (..., {self.action_dim}), got {tuple(actions.shape)} {actions.dtype}"
            )


def load_action_statistics(
    norm_stats: dict[str, Any], unnorm_key: str | None, source: str
) -> ActionStatistics:
    """Pick one dataset's action statistics from OpenVLA's ``norm_stats`` mapping
    (``{unnorm_key: {"action": {"q01": [...], "q99": [...], "mask": [...]}, ...}}``, as in
    ``config.json`` and ``dataset_statistics.json``).

    Args:
        norm_stats: the mapping.
        unnorm_key: the dataset, e.g. ``"libero_spatial_no_noops"``; may be None when the
            mapping holds exactly one dataset.
        source: file name for error messages.

    Raises:
        ValueError: no or several datasets and no key, an unknown key, or bad statistics.
    """
    if unnorm_key is None:
        if len(norm_stats) != 1:
            raise ValueError(
                f"{source} holds statistics of {sorted(norm_stats)}; set unnorm_key to one of them"
            )
        unnorm_key = next(iter(norm_stats))
    if unnorm_key not in norm_stats:
        raise ValueError(f"unnorm_key {unnorm_key!r} is not in {source}; choose one of {sorted(norm_stats)}")
    entry = norm_stats[unnorm_key]
    if "action" not in entry:
        raise ValueError(f"{source}: statistics of {unnorm_key!r} have no 'action' entry")
    return ActionStatistics.from_dict(entry["action"], f"{source}[{unnorm_key!r}]")


def libero_unnorm_key(norm_stats: dict[str, Any], suite: str, source: str) -> str:
    """The statistics key of a LIBERO suite, as OpenVLA-OFT's evaluation picks it
    (moojink/openvla-oft ``experiments/robot/libero/run_libero_eval.py``, ``check_unnorm_key``):
    the suite's name, or ``<suite>_no_noops`` when only that one is in ``norm_stats`` (the
    fine-tuning datasets with no-op actions removed).

    Args:
        norm_stats: OpenVLA's ``{unnorm_key: statistics}`` mapping.
        suite: the LIBERO suite, e.g. ``"libero_spatial"``.
        source: file name for error messages.

    Returns:
        the key.

    Raises:
        ValueError: neither key is in ``norm_stats`` (the message lists the keys there and names
            ``policy.config.unnorm_key``, which picks one explicitly).
    """
    for key in (suite, f"{suite}_no_noops"):
        if key in norm_stats:
            return key
    raise ValueError(f"{source} has no statistics of LIBERO suite {suite!r} (neither {suite!r} nor "
                     f"{suite + '_no_noops'!r}; it holds {sorted(norm_stats)}): set policy.config.unnorm_key to "
                     "the dataset whose statistics de-normalise this suite's actions")


def read_dataset_statistics(path: str | Path) -> dict[str, Any]:
    """Read ``dataset_statistics.json``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: it is not a JSON object.
    """
    path = Path(path)
    with path.open() as f:
        stats = json.load(f)
    if not isinstance(stats, dict):
        raise ValueError(f"{path} must hold a JSON object {{unnorm_key: statistics}}")
    return stats


def libero_gripper_postprocess(actions: Tensor) -> Tensor:
    """OpenVLA's LIBERO gripper handling on the last dimension: ``[0, 1] → [-1, 1]``
    (``2 g - 1``), binarise with ``sign``, invert (LIBERO closes at +1, the datasets at 0).

    Args:
        actions: ``(..., action_dim)`` raw actions whose last dimension is the gripper in [0, 1].

    Returns:
        float32 copy with the gripper dimension in ``{-1, 0, +1}`` (0 only for exactly 0.5).
    """
    actions = actions.float().clone()
    actions[..., -1] = -torch.sign(2 * actions[..., -1] - 1)
    return actions
