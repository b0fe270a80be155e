"""Per-sample sizes of the declared batch keys (:mod:`vla_rl_core.keys`), as functions of a step's
shape: what ``vla-rl plan`` needs to estimate the bytes a re-shard moves before anything runs
(:mod:`vla_rl.dag.traffic`).

Each workflow derives its :class:`StepShape` from a template's config
(:meth:`vla_rl.workflows.base.Workflow.step_shape`); :data:`KEY_LAYOUTS` turns it into each key's
leaves (shape after the batch dimension, dtype), as the nodes that write the keys produce them.
This module imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from vla_rl_core import keys

DTYPE_BYTES: dict[str, int] = {"float32": 4, "int64": 8, "bool": 1, "uint8": 1}
"""Bytes of one element of each dtype the keys use."""

Leaves = dict[str, tuple[tuple[int, ...], str]]
"""A key's leaves (a nested key such as camera observations has several): name -> (per-sample
shape, dtype)."""


@dataclass(frozen=True)
class StepShape:
    """The sizes of one training step's batches, derived from a template's config.

    Attributes:
        groups: groups per step over all workers (initial states, prompts).
        group_size: samples per group (episodes per initial state, responses per prompt).
        decisions: ``T``, decision steps per sample (embodied: ``ceil(horizon / chunk)``; text:
            ``text.max_response_length``, a response token being a one-dimension action).
        chunk: actions per decision (text: 1).
        action_dim: values per environment action (text: 1); None when only the simulator knows.
        own_action_dim: values per chunk position of the policy's own actions (``actions``,
            ``ref_log_probs``): ``action_dim`` for most policies, π0's whole denoising chain
            (:meth:`policies.base.Policy.planned_action_sizes`; text: 1); None when unknown.
        obs: one time step of an observation, ``leaf -> (shape, dtype)`` (:func:`observation_leaves`):
            ``{"": ((obs_dim,), "float32")}`` for a flat state, ``{"state": ..., "<camera>_image":
            ..., "instruction": ...}`` with cameras; None when the state's size is unknown; empty
            for a workflow without observations (text).
        prompt_len: prompt tokens per sample (text; 0 for the embodied workflow).
    """

    groups: int
    group_size: int
    decisions: int
    chunk: int = 1
    action_dim: int | None = 1
    own_action_dim: int | None = 1
    obs: Leaves | None = field(default_factory=dict)
    prompt_len: int = 0

    @property
    def samples(self) -> int:
        """Samples per step over all workers: ``groups * group_size``."""
        return self.groups * self.group_size


def _scalar(dtype: str) -> Callable[[StepShape], Leaves]:
    return lambda shape: {"": ((), dtype)}


def _per_decision(dtype: str) -> Callable[[StepShape], Leaves]:
    return lambda shape: {"": ((shape.decisions,), dtype)}


def _per_own_action_value(shape: StepShape) -> Leaves | None:
    if shape.own_action_dim is None:
        return None
    return {"": ((shape.decisions, shape.chunk, shape.own_action_dim), "float32")}


def _observations(shape: StepShape) -> Leaves | None:
    if shape.obs is None:
        return None
    return {leaf: ((shape.decisions + 1, *leaf_shape), dtype) for leaf, (leaf_shape, dtype) in shape.obs.items()}


KEY_LAYOUTS: dict[str, Callable[[StepShape], Leaves | None]] = {
    keys.UID: _scalar("int64"),
    keys.INIT_STATE_ID: _scalar("int64"),
    keys.TASK_ID: _scalar("int64"),
    keys.INPUT_IDS: lambda shape: {"": ((shape.prompt_len,), "int64")},
    keys.ATTENTION_MASK: lambda shape: {"": ((shape.prompt_len,), "int64")},
    keys.RESPONSES: _per_decision("int64"),
    keys.OBS: _observations,
    keys.ACTIONS: _per_own_action_value,
    keys.OLD_LOG_PROBS: lambda shape: {"": ((shape.decisions, shape.chunk), "float32")},
    keys.RESPONSE_MASK: _per_decision("bool"),
    keys.SUCCESS: _scalar("bool"),
    keys.FINISH_STEP: _scalar("int64"),
    keys.CONTROL_STEPS: _scalar("int64"),
    keys.TRUNCATED: _scalar("bool"),
    keys.CHECKPOINT_INDEX: _scalar("int64"),
    keys.PROTOCOL_INDEX: _scalar("int64"),
    keys.REF_LOG_PROBS: _per_own_action_value,
    keys.VALUES: _per_decision("float32"),
    keys.REWARDS: _scalar("float32"),
    keys.TOKEN_LEVEL_REWARDS: _per_decision("float32"),
    keys.ADVANTAGES: _per_decision("float32"),
    keys.RETURNS: _per_decision("float32"),
}
"""Each declared key's leaves under a step's shape (see :data:`Leaves`; ``""`` names a plain
tensor), or None when a size it needs is unknown."""


def sample_bytes(key: str, shape: StepShape) -> int | None:
    """Bytes of one sample's ``key`` (all its leaves); None for a key without a layout or whose
    size is unknown."""
    layout = KEY_LAYOUTS.get(key)
    leaves = None if layout is None else layout(shape)
    if leaves is None:
        return None
    return sum(math.prod(leaf_shape) * DTYPE_BYTES[dtype] for leaf_shape, dtype in leaves.values())


def observation_leaves(state_dim: int | None, cameras: tuple[str, ...] = (), camera_size: int = 0,
                       instruction_bytes: int = 0) -> Leaves | None:
    """One time step of an embodied observation (:mod:`vla_rl_core.observations`): the flat float32
    state, or with cameras the state, a uint8 ``(camera_size, camera_size, 3)`` image per camera
    and the uint8 instruction; None when the state's size is unknown."""
    if state_dim is None:
        return None
    if not cameras:
        return {"": ((state_dim,), "float32")}
    leaves: Leaves = {keys.OBS_STATE: ((state_dim,), "float32")}
    for camera in cameras:
        leaves[f"{camera}{keys.OBS_IMAGE_SUFFIX}"] = ((camera_size, camera_size, 3), "uint8")
    leaves[keys.OBS_INSTRUCTION] = ((instruction_bytes,), "uint8")
    return leaves
