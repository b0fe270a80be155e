"""The settings of remote environments (``simulator.env`` of ``simulator.name: remote``), which
both the environments (:mod:`simulators.remote_env`) and their hub (:mod:`simulators.remote_hub`)
read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vla_rl_core import keys, wire
from vla_rl_core.components import ComponentConfigError


@dataclass(frozen=True)
class RemoteEnvConfig:
    """Configuration of :class:`RemoteEnv` (``simulator.env`` of ``simulator.name: remote``).

    Raises:
        ValueError: from ``__post_init__``, naming the field.
    """

    state_dim: int = 0
    """Values of the state the clients send (required, > 0)."""
    action_dim: int = 0
    """Values of one action (required, > 0)."""
    task: str = "remote"
    """The task's name (evaluation reports, the clients' reset requests)."""
    instruction: str | None = None
    """Language instruction of the task (VLA policies); None: the task's name."""
    horizon: int = 100
    """Control steps after which the trainer ends an episode (``truncated``)."""
    cameras: tuple[str, ...] = ()
    """Cameras whose images the clients send (``<camera>_image`` uint8 (camera_size, camera_size, 3))."""
    camera_size: int = 128
    """Height and width of camera images, pixels."""
    host: str = "127.0.0.1"
    """Address the hub binds (another than loopback lets other machines connect: give a token)."""
    port: int = 8765
    """TCP port of the hub (0: a free one, for a single pool, e.g. in tests)."""
    connect_timeout_s: float = 300.0
    """Seconds a reset waits for a client to be free."""
    step_timeout_s: float = 60.0
    """Seconds the trainer waits for a client's answer to an action chunk."""
    reset_timeout_s: float | None = None
    """Seconds the trainer waits for a client's answer to a reset (a robot homing its arm may need
    more than a chunk does); None: ``step_timeout_s``."""
    hub: str | None = None
    """Ray actor name of the hub; set by :meth:`RemoteEnv.start_services` (leave unset)."""

    def __post_init__(self) -> None:
        for name in ("state_dim", "action_dim", "horizon", "camera_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ComponentConfigError(name, f"{name} must be a positive integer (the remote environments' "
                                                 f"{name.replace('_', ' ')}), got {value!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ComponentConfigError("port", f"port must be in [0, 65535], got {self.port!r}")
        for name in ("connect_timeout_s", "step_timeout_s", "reset_timeout_s"):
            if name == "reset_timeout_s" and self.reset_timeout_s is None:
                continue
            if not getattr(self, name) > 0:
                raise ComponentConfigError(name, f"{name} must be a positive number of seconds, got "
                                                 f"{getattr(self, name)!r}")
        if not self.task:
            raise ComponentConfigError("task", "task must name the task")
        object.__setattr__(self, "cameras", tuple(self.cameras))  # YAML gives lists

    @property
    def task_name(self) -> str:
        """The task (``task``)."""
        return self.task

    @property
    def image_shapes(self) -> dict[str, list[int]]:
        """``{"<camera>_image": [H, W, 3]}`` of the cameras."""
        return {f"{camera}{keys.OBS_IMAGE_SUFFIX}": [self.camera_size, self.camera_size, 3] for camera in self.cameras}

    @property
    def max_message_bytes(self) -> int:
        """The largest message the hub accepts from a client, bytes: twice what one answer of this
        run holds (its state as float32 and its camera images, the largest message of the
        protocol), plus 1 MiB for the other fields. A larger one breaks the protocol (the hub
        closes its connection, websocket close code 1009) before the hub holds it in memory."""
        images = sum(height * width * 3 for height, width, _ in self.image_shapes.values())
        return 2 * (4 * self.state_dim + images) + 2**20

    def fit_problem(self, hello: Any) -> str | None:
        """What in a client's hello does not fit this run, or None."""
        if not isinstance(hello, dict) or hello.get("type") != "hello":
            return "the first message must be a hello: {'type': 'hello', 'state_dim', 'action_dim', 'images'}"
        wanted = {"state_dim": self.state_dim, "action_dim": self.action_dim, "images": self.image_shapes}
        differs = []
        for key, want in wanted.items():
            value = hello.get(key)
            if key == "images":
                got = _image_shapes(value)
                if got != want:
                    differs.append(f"images {wire.describe(value) if got is None else got} (this run: {want})")
            elif isinstance(value, bool) or not isinstance(value, int) or value != want:
                differs.append(f"{key} {wire.describe(value)} (this run: {want})")
        return f"the environment does not fit this run: {', '.join(differs)}" if differs else None


def _image_shapes(images: Any) -> dict[str, list[int]] | None:
    """A hello's ``images``, ``{"<camera>_image": [H, W, 3]}`` (none: ``{}``), or None when it is
    no such mapping (of at most 16 cameras, each shape 3 ints)."""
    if images is None:
        return {}
    if not isinstance(images, dict) or len(images) > 16:
        return None
    shapes = {}
    for name, shape in images.items():
        if not isinstance(name, str) or not isinstance(shape, (list, tuple)) or len(shape) != 3 or not all(
                isinstance(size, int) and not isinstance(size, bool) for size in shape):
            return None
        shapes[name] = list(shape)
    return shapes
