"""OpenVLA's dataset statistics (``norm_stats`` / ``dataset_statistics.json``: which dataset's
action statistics de-normalise a task's actions) and the LIBERO gripper post-processing; the
``bounds_q99`` formula itself is :class:`policies.normalization.ActionStatistics`.

Source of the gripper handling (openvla/openvla ``experiments/robot/robot_utils.py``):
``normalize_gripper_action(binarize=True)``: ``sign(2 g - 1)``; ``invert_gripper_action``:
``-g``, which the LIBERO evaluation applies in that order.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from policies.normalization import ActionStatistics


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
