"""Environment observations as the engine moves them: a flat state vector, or a dict of the state,
camera images and the task's language instruction.

A simulator observes either a float32 state ``(obs_dim,)`` (a ``Box``) or, with cameras, a dict
``{"state": float32 (obs_dim,), "<camera>_image": uint8 (H, W, 3), ...}``. The simulator worker
adds the task's instruction to dict observations as UTF-8 bytes (``"instruction"``: uint8
``(INSTRUCTION_BYTES,)``, zero-padded), so that every leaf has a fixed shape and dtype: a batch of
observations is one numpy array per key, and the rollout's TensorDict of them crosses Ray and the
worker-to-worker re-shard (which moves tensors only) as it is. Images stay uint8 all the way to
the policy's processor (a 128² RGB frame is 48 KiB; float32 would be four times that).

A simulator worker hosting a task set (``simulator.tasks``) adds each observation's task id
(``"task_id"``: int64 scalar, the task's position in the set), so its observations are dicts even
for flat states (``{"state", "task_id"}``): a policy conditioned on the task reads it there, as a
VLA reads the instruction.

Key names: :data:`vla_rl_core.keys.OBS_STATE`, ``<camera>`` + :data:`~vla_rl_core.keys.OBS_IMAGE_SUFFIX`,
:data:`~vla_rl_core.keys.OBS_INSTRUCTION`, :data:`~vla_rl_core.keys.OBS_TASK_ID`. This module imports
numpy only (simulator workers use it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec

INSTRUCTION_BYTES = 256
"""Bytes reserved for an instruction (LIBERO's longest is about 100 characters)."""

Observations = np.ndarray | dict[str, np.ndarray]
"""A batch of observations: float32 ``(n, obs_dim)``, or a dict of arrays with ``n`` rows each."""


def encode_instruction(text: str) -> np.ndarray:
    """A task instruction as uint8 ``(INSTRUCTION_BYTES,)``: its UTF-8 bytes, then zeros.

    Raises:
        ValueError: the instruction is empty, holds a NUL character or has more than
            ``INSTRUCTION_BYTES`` bytes.
    """
    data = text.encode("utf-8")
    if not data or b"\0" in data or len(data) > INSTRUCTION_BYTES:
        shown = repr(text) if len(text) <= 80 else f"{text[:60]!r}... ({len(data)} bytes)"  # one line, however long
        raise ValueError(f"an instruction must be 1..{INSTRUCTION_BYTES} UTF-8 bytes without NUL, got {shown}")
    code = np.zeros(INSTRUCTION_BYTES, dtype=np.uint8)
    code[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    return code


def decode_instruction(code: np.ndarray) -> str:
    """Inverse of :func:`encode_instruction` for one uint8 ``(INSTRUCTION_BYTES,)`` row.

    Raises:
        ValueError: the row is not uint8 ``(INSTRUCTION_BYTES,)`` or holds no instruction.
    """
    code = np.asarray(code)
    if code.shape != (INSTRUCTION_BYTES,) or code.dtype != np.uint8:
        raise ValueError(f"an encoded instruction is uint8 ({INSTRUCTION_BYTES},), got {code.dtype} {code.shape}")
    data = code.tobytes().rstrip(b"\0")
    if not data:
        raise ValueError("the encoded instruction is empty (all zeros): was the observation filled in?")
    return data.decode("utf-8")


def observation(raw: Any, instruction: str, task_id: int | None = None) -> Any:
    """One environment observation as the engine carries it: a state vector unchanged, a dict
    with the encoded ``instruction`` added; with a ``task_id`` (a task set's worker), a dict that
    holds it too (a state vector becomes ``{"state": ..., "task_id": ...}``)."""
    if isinstance(raw, Mapping):
        out = {**raw, keys.OBS_INSTRUCTION: encode_instruction(instruction)}
    elif task_id is None:
        return raw
    else:
        out = {keys.OBS_STATE: raw}
    if task_id is not None:
        out[keys.OBS_TASK_ID] = np.int64(task_id)
    return out


def stack_observations(observations: Sequence[Any]) -> Observations:
    """Stack single observations (arrays, or dicts with the same keys) into one batch.

    Returns:
        float32 ``(n, obs_dim)``, or a dict of ``(n, ...)`` arrays (state float32, the rest as given).
    """
    if isinstance(observations[0], Mapping):
        return {key: np.stack([obs[key] for obs in observations]) for key in observations[0]}
    return np.stack(observations).astype(np.float32, copy=False)


def empty_observations(spec: EnvSpec, n: int) -> Observations:
    """Zero observations for ``n`` environments of a simulator with ``spec``, laid out as the
    simulator workers return them: float32 ``(n, obs_dim)``, or a dict of it (``state``), the
    camera images (uint8 ``(n, H, W, 3)``) and the encoded instruction (uint8 ``(n,
    INSTRUCTION_BYTES)``) when ``spec.images`` is set, and ``task_id`` (int64 ``(n,)``) for a task set."""
    state = np.zeros((n, spec.obs_dim), dtype=np.float32)
    if not spec.dict_observations:
        return state
    out: dict[str, np.ndarray] = {keys.OBS_STATE: state}
    if spec.images is not None:
        out.update({key: np.zeros((n, *shape), dtype=np.uint8) for key, shape in spec.images.items()})
        out[keys.OBS_INSTRUCTION] = np.zeros((n, INSTRUCTION_BYTES), dtype=np.uint8)
    if spec.num_tasks is not None:
        out[keys.OBS_TASK_ID] = np.zeros(n, dtype=np.int64)
    return out


def set_rows(dest: Observations, rows: np.ndarray | Sequence[int], src: Observations) -> None:
    """``dest[rows] = src``, key by key for dict observations (in place)."""
    if isinstance(dest, Mapping):
        for key, value in dest.items():
            value[rows] = src[key]
    else:
        dest[rows] = src


def to_torch(obs: Observations):
    """A batch of observations as torch: a float32 ``(n, obs_dim)`` tensor, or a ``TensorDict``
    of batch size ``(n,)`` with the same keys (the arrays are shared, not copied)."""
    import torch
    from tensordict import TensorDict

    if isinstance(obs, Mapping):
        rows = len(next(iter(obs.values())))
        return TensorDict({key: torch.from_numpy(np.asarray(value)) for key, value in obs.items()}, batch_size=[rows])
    return torch.as_tensor(obs, dtype=torch.float32)
