"""What a served policy reads, and how a client's observation dict maps onto it.

A served policy takes the observations its simulator gave it in training
(:mod:`vla_rl_core.observations`): a float32 state ``(state_dim,)``, and for camera policies uint8
``(H, W, 3)`` images of named cameras plus the task's instruction; a task set's policy also the
task id. :class:`ServedInputs` describes that; :meth:`ServedInputs.engine_observation` builds one
such observation from what a robot runtime sends, accepting the key layouts openpi's and
LeRobot's clients use (README, "Real robots"):

=================  =========================================  =============================================
role               accepted keys (first found wins)           notes
=================  =========================================  =============================================
state              ``state``, ``observation/state``,          float, exactly ``state_dim`` values, finite in
                   ``observation.state``; DROID:              float32 (the policy's dtype); DROID's joint
                   ``observation/joint_position`` +           and gripper positions are concatenated (both
                   ``observation/gripper_position``           required)
camera ``c``       ``c_image`` (the engine's own key),        uint8, ``(H, W, 3)`` or channels-first
(``i``-th of the   ``observation.images.c``, ``images[c]``;    ``(3, H, W)`` (ALOHA), exactly the size the
policy's cameras)  by position: LIBERO ``observation/image``,  policy was trained on (resize on the client:
                   ``observation/wrist_image``; DROID          ``openpi_client.image_tools.resize_with_pad``)
                   ``observation/exterior_image_1_left``,
                   ``observation/wrist_image_left``; ALOHA
                   ``images`` ``cam_high``, ``cam_left_wrist``,
                   ``cam_right_wrist``
instruction        ``prompt`` (openpi), ``task`` (LeRobot),   a string; default: the training task's
                   ``instruction``                             instruction (single-task runs)
task id            ``task_id``                                 an int in ``[0, num_tasks)`` (task sets only)
=================  =========================================  =============================================

Other keys are ignored (runtimes send more than a policy reads). Anything missing or of the wrong
shape or dtype raises :class:`ObservationError` with one line naming the key, what was sent and
what the policy takes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from vla_rl_core import keys, wire
from vla_rl_core.env_spec import EnvSpec
from vla_rl_core.observations import encode_instruction

STATE_KEYS = ("state", "observation/state", "observation.state")
"""Keys a client's state may come under, in the order they are looked up."""

DROID_STATE_KEYS = ("observation/joint_position", "observation/gripper_position")
"""DROID's proprio parts (openpi's DROID client), concatenated in this order."""

PROMPT_KEYS = ("prompt", "task", keys.OBS_INSTRUCTION)
"""Keys the instruction may come under (openpi's ``prompt``, LeRobot's ``task``)."""

POSITIONAL_IMAGE_KEYS = (
    ("observation/image", "observation/wrist_image"),  # openpi's LIBERO client
    ("observation/exterior_image_1_left", "observation/wrist_image_left"),  # openpi's DROID client
)
"""Client image keys that stand for the policy's first, second, ... camera."""

ALOHA_CAMERAS = ("cam_high", "cam_left_wrist", "cam_right_wrist")
"""Names under ``images`` (openpi's ALOHA client) that stand for the policy's first, second, ... camera."""


class ObservationError(ValueError):
    """A client's observation does not fit the served policy (one line, sent back to the client)."""


@dataclasses.dataclass(frozen=True)
class ServedInputs:
    """The observation a served policy takes.

    Attributes:
        state_dim: state features (float32).
        images: ``{camera: (H, W, 3)}`` uint8 images, in the policy's camera order; empty for a
            state-only policy.
        instruction: the default instruction of a camera policy (its training task's), or None
            (the client must send one).
        num_tasks: tasks of a task set (the client sends ``task_id``), or None.
    """

    state_dim: int
    images: Mapping[str, tuple[int, int, int]] = dataclasses.field(default_factory=dict)
    instruction: str | None = None
    num_tasks: int | None = None

    @classmethod
    def from_spec(cls, spec: EnvSpec, instruction: str | None = None) -> ServedInputs:
        """From a simulator's spec (:meth:`simulators.worker.SimulatorWorker.spec`)."""
        images = {key.removesuffix(keys.OBS_IMAGE_SUFFIX): shape for key, shape in (spec.images or {}).items()}
        return cls(spec.obs_dim, images, instruction if images else None, spec.num_tasks)

    @property
    def flat(self) -> bool:
        """Whether the policy takes the bare state vector (no cameras, no task set)."""
        return not self.images and self.num_tasks is None

    def describe(self) -> dict[str, Any]:
        """The inputs as the server's metadata states them (msgpack-friendly)."""
        out: dict[str, Any] = {"state": [self.state_dim]}
        if self.images:
            out["images"] = {camera: list(shape) for camera, shape in self.images.items()}
            out["prompt"] = self.instruction
        if self.num_tasks is not None:
            out["num_tasks"] = self.num_tasks
        return out

    def engine_observation(self, request: Mapping[str, Any]) -> np.ndarray | dict[str, np.ndarray]:
        """One observation as the policy takes it, from a client's observation dict.

        Returns:
            float32 ``(state_dim,)`` for a flat policy; else a dict with ``state``, each camera's
            ``<camera>_image`` uint8 ``(H, W, 3)``, ``instruction`` (encoded) for camera policies and
            ``task_id`` for a task set (:mod:`vla_rl_core.observations`).

        Raises:
            ObservationError: the request is not a dict, a required entry is missing or has the
                wrong shape or dtype, or a state value is not finite in float32.
        """
        if not isinstance(request, Mapping):
            raise ObservationError(f"an observation must be a dict, got {type(request).__name__}")
        state = self._state(request)
        if self.flat:
            return state
        out: dict[str, np.ndarray] = {keys.OBS_STATE: state}
        for position, (camera, shape) in enumerate(self.images.items()):
            out[f"{camera}{keys.OBS_IMAGE_SUFFIX}"] = self._image(request, camera, position, shape)
        if self.images:
            out[keys.OBS_INSTRUCTION] = self._instruction(request)
        if self.num_tasks is not None:
            out[keys.OBS_TASK_ID] = self._task_id(request)
        return out

    def _state(self, request: Mapping[str, Any]) -> np.ndarray:
        key = next((key for key in STATE_KEYS if key in request), None)
        droid = [part for part in DROID_STATE_KEYS if part in request]
        if key is not None:
            value = _numeric(request[key], key)
        elif len(droid) == len(DROID_STATE_KEYS):
            key = " + ".join(DROID_STATE_KEYS)
            value = np.concatenate([_numeric(request[part], part).reshape(-1) for part in DROID_STATE_KEYS])
        elif droid:
            missing = next(part for part in DROID_STATE_KEYS if part not in request)
            raise ObservationError(f"the observation has {droid[0]} but no {missing}: DROID's state is the two "
                                   f"concatenated ({' + '.join(DROID_STATE_KEYS)}, {self.state_dim} values)")
        else:
            raise ObservationError(f"the observation has no state: send {self.state_dim} float values under "
                                   f"'state' (or {', '.join(repr(k) for k in STATE_KEYS[1:])}); got keys "
                                   f"{sorted(map(str, request))}")
        if value.shape != (self.state_dim,):
            raise ObservationError(f"{key} has shape {value.shape}; the policy takes a state of shape "
                                   f"({self.state_dim},)")
        return value

    def _image(self, request: Mapping[str, Any], camera: str, position: int,
               shape: tuple[int, int, int]) -> np.ndarray:
        candidates = [f"{camera}{keys.OBS_IMAGE_SUFFIX}", f"observation.images.{camera}"]
        candidates += [layout[position] for layout in POSITIONAL_IMAGE_KEYS if position < len(layout)]
        key = next((key for key in candidates if key in request), None)
        value = None if key is None else request[key]
        if key is None and isinstance(request.get("images"), Mapping):
            images = request["images"]
            name = camera if camera in images else ALOHA_CAMERAS[position] if position < len(ALOHA_CAMERAS) else None
            if name in images:
                key, value = f"images[{name!r}]", images[name]
        if key is None:
            raise ObservationError(f"the observation has no image of camera {camera!r}: send uint8 {shape} under "
                                   f"{candidates[0]!r} (or {', '.join(repr(k) for k in candidates[1:])}, or "
                                   f"images[{camera!r}])")
        if not isinstance(value, np.ndarray) or value.dtype != np.uint8:
            sent = f"{value.dtype} array" if isinstance(value, np.ndarray) else type(value).__name__
            raise ObservationError(f"{key} is a {sent}; images are uint8 arrays of shape {shape} "
                                   "(openpi_client.image_tools.convert_to_uint8)")
        if value.ndim == 3 and value.shape[0] == 3 and value.shape[-1] != 3:
            value = np.moveaxis(value, 0, -1)  # channels-first (ALOHA) -> (H, W, 3)
        if value.shape != shape:
            raise ObservationError(f"{key} has shape {value.shape}; camera {camera!r} takes {shape} (H, W, 3) "
                                   "images, the size the policy was trained on (resize_with_pad on the client)")
        return np.ascontiguousarray(value)

    def _instruction(self, request: Mapping[str, Any]) -> np.ndarray:
        key = next((key for key in PROMPT_KEYS if key in request), None)
        text = self.instruction if key is None else request[key]
        if key is None and text is None:
            raise ObservationError("the observation has no instruction: send it as a string under 'prompt'")
        if isinstance(text, np.ndarray) and text.size == 1 and text.dtype.kind in "US":
            text = text.item()  # numpy's string array of one prompt, which openpi takes (transforms.TokenizePrompt)
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        if not isinstance(text, str):
            raise ObservationError(f"{key} must be a string, got {type(text).__name__}")
        try:
            return encode_instruction(text)
        except ValueError as err:
            raise ObservationError(f"{key}: {err}") from None

    def _task_id(self, request: Mapping[str, Any]) -> np.ndarray:
        value = request.get(keys.OBS_TASK_ID)
        if isinstance(value, np.ndarray) and value.size == 1:
            value = value.reshape(()).item()
        if isinstance(value, np.integer):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.num_tasks:
            raise ObservationError(f"{keys.OBS_TASK_ID!r} must be an int in [0, {self.num_tasks}) (the task of the "
                                   f"policy's task set), got {wire.describe(value)}")
        return np.int64(value)


def _numeric(value: Any, key: str) -> np.ndarray:
    """``value`` (an array or a list of numbers) as the float32 array the policy takes.

    Raises:
        ObservationError: not numbers, or a value that is not finite in float32 (inf, NaN, or beyond
            float32's range, which the cast makes inf: checked after the cast).
    """
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        array = None
    if array is None or array.dtype.kind not in "biuf":
        raise ObservationError(f"{key} must be numbers (a float array), got {type(value).__name__}")
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow becomes inf, refused below
        array = array.astype(np.float32)
    if not np.isfinite(array).all():
        raise ObservationError(f"{key} holds non-finite values (inf, NaN, or beyond float32's ±3.4e38)")
    return array
