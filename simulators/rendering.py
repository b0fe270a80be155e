"""Headless rendering set-up for MuJoCo-based simulators: which OpenGL backend and which GPU.

MuJoCo and robosuite read ``MUJOCO_GL`` (and PyOpenGL reads ``PYOPENGL_PLATFORM``) once, when they
are first imported, so :func:`setup_headless_rendering` must run before either is imported in a
process. Every environment constructor calls it before its lazy simulator import, so in a
simulator actor it runs before the actor's first environment exists.

What it chooses, once per process (:func:`rendering_report` says what it chose):

- **Backend.** ``MUJOCO_GL`` set by the user wins, never replaced (with ``egl`` on a GPU, the
  device is still chosen and probed, below). Otherwise EGL (no display needed: the GPU driver
  where there is one, Mesa's llvmpipe on a CPU machine), after a probe that opens a
  16x16 EGL context in a child process (:func:`probe_backend`); if that fails, OSMesa, with one
  logged warning naming the EGL error; if OSMesa fails too, EGL is kept (as before) and the warning says
  rendering will fail.
- **Device** (EGL). ``MUJOCO_EGL_DEVICE_ID`` set by the user wins. Otherwise the GPU is
  (:func:`render_gpu`) the lowest-numbered GPU Ray assigned to this process, else the GPU of the
  process that created the simulator pool (``VLA_RL_RENDER_GPU``, set by
  :class:`simulators.pool.SimulatorPool`), else the first entry of ``CUDA_VISIBLE_DEVICES``; the
  probe maps it to the EGL device whose ``EGL_CUDA_DEVICE_NV`` attribute (NVIDIA's
  ``EGL_NV_device_cuda`` extension) is that GPU's CUDA index in this process, and sets
  ``MUJOCO_EGL_DEVICE_ID`` to that device's index: EGL and CUDA may enumerate GPUs in different
  orders (google-deepmind/mujoco issue 3245). With no such device (Mesa, no GPU) the variable
  stays unset and MuJoCo takes the first EGL device that initialises.

``MUJOCO_EGL_DEVICE_ID`` is the variable both MuJoCo (``mujoco/egl/__init__.py``,
``create_initialized_egl_device_display``) and robosuite (``robosuite/renderers/context/
egl_context.py``, same function; ``robosuite/utils/binding_utils.py`` asserts that it appears in
``CUDA_VISIBLE_DEVICES`` when that is set) read; neither reads ``EGL_DEVICE_ID`` (dm_control's
former name), so it is not set.

Values this module sets are listed in ``VLA_RL_AUTO_RENDERING_VARS``; child processes inherit
them and choose again (unless the value was changed since), so only what the user set travels as
a choice (:func:`user_rendering_env_vars`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_GL_BACKEND = "egl"
"""MuJoCo OpenGL backend tried first when ``MUJOCO_GL`` is unset: EGL renders without a display
(Mesa's llvmpipe on CPU machines, the GPU driver elsewhere)."""

FALLBACK_GL_BACKEND = "osmesa"
"""Backend used when no EGL context can be created (software rendering; Debian's ``libosmesa6``)."""

EGL_DEVICE_VAR = "MUJOCO_EGL_DEVICE_ID"
"""The EGL device index MuJoCo and robosuite render on (see the module docstring)."""

RENDER_GPU_HINT_VAR = "VLA_RL_RENDER_GPU"
"""The GPU of the process that created a simulator pool, passed to its actors (which Ray gives no
GPU): the GPU they render on unless Ray assigned them one of their own."""

AUTO_VARS_VAR = "VLA_RL_AUTO_RENDERING_VARS"
"""The rendering variables this module set (not the user), as ``NAME=value`` pairs separated by
commas; a variable whose value has changed since is the user's."""

RENDERING_VARS = ("MUJOCO_GL", "PYOPENGL_PLATFORM", EGL_DEVICE_VAR)
"""The variables a user may set to choose the renderer; set, they win over the automatic choice."""

EGL_CUDA_DEVICE_NV = 0x323A
"""``EGL_CUDA_DEVICE_NV`` (Khronos registry, ``EGL_NV_device_cuda``): an EGL device's CUDA index."""

_PYOPENGL_PLATFORMS = ("egl", "osmesa")

_REPORT: dict[str, Any] | None = None  # this process's choice, set by setup_headless_rendering


def headless_rendering_env_vars(backend: str = DEFAULT_GL_BACKEND) -> dict[str, str]:
    """The environment variables that select a headless OpenGL backend.

    Args:
        backend: ``"egl"`` or ``"osmesa"``.

    Returns:
        ``{"MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}``.

    Raises:
        ValueError: if ``backend`` is not a headless backend.
    """
    if backend not in _PYOPENGL_PLATFORMS:
        raise ValueError(f"headless backend must be one of {_PYOPENGL_PLATFORMS}, got {backend!r}")
    return {"MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}


def _auto_vars() -> dict[str, str]:
    """The variables of ``VLA_RL_AUTO_RENDERING_VARS`` that still hold the value set there."""
    pairs = (item.partition("=") for item in os.environ.get(AUTO_VARS_VAR, "").split(",") if item)
    return {name: value for name, _, value in pairs if os.environ.get(name) == value}


def user_rendering_env_vars() -> dict[str, str]:
    """The rendering variables of :data:`RENDERING_VARS` the user set in this process's
    environment (not those this module chose here or in a parent): what Ray processes should
    inherit as a choice."""
    auto = _auto_vars()
    return {name: os.environ[name] for name in RENDERING_VARS if name in os.environ and name not in auto}


def render_gpu(ray_gpu_ids: Sequence[int | str], hint: str | None, cuda_visible_devices: str | None
               ) -> str | None:
    """The GPU a process renders on: the lowest-numbered of ``ray_gpu_ids``, else ``hint``, else
    the first entry of ``cuda_visible_devices``; ``None`` when none of them names a GPU by an
    integer id (empty, ``"-1"``, or UUIDs such as ``GPU-...``/``MIG-...``, which cannot be matched
    to an EGL device).

    Args:
        ray_gpu_ids: the GPU ids Ray assigned to the process (``ray.get_gpu_ids()``), ints or
            digit strings; physical ids (entries of the raylet's ``CUDA_VISIBLE_DEVICES``).
        hint: ``VLA_RL_RENDER_GPU`` (the pool creator's GPU) or None.
        cuda_visible_devices: the process's ``CUDA_VISIBLE_DEVICES`` or None.

    Returns:
        The GPU id as a digit string, or None.
    """
    ids = sorted(int(i) for i in ray_gpu_ids if str(i).strip().isdigit())
    if ids:
        return str(ids[0])
    for candidate in (hint, (cuda_visible_devices or "").split(",")[0]):
        if candidate is not None and candidate.strip().isdigit():
            return candidate.strip()
    return None


def cuda_index(gpu: str, cuda_visible_devices: str | None) -> int:
    """The CUDA device index of GPU ``gpu`` in a process with this ``CUDA_VISIBLE_DEVICES``: its
    position in the list when the variable is set and lists it (CUDA renumbers the visible
    devices from 0), else ``int(gpu)``.

    Args:
        gpu: a GPU id, a digit string (from :func:`render_gpu`).
        cuda_visible_devices: the process's ``CUDA_VISIBLE_DEVICES`` or None.
    """
    visible = [entry.strip() for entry in (cuda_visible_devices or "").split(",") if entry.strip()]
    return visible.index(gpu) if gpu in visible else int(gpu)


def _ray_gpu_ids() -> list[int | str]:
    """The GPUs Ray assigned to this process; [] outside a Ray task or actor (Ray not imported,
    not initialised, or a driver)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return []
    context = ray.get_runtime_context()
    if context.worker.mode != ray.WORKER_MODE:
        return []
    return list(context.get_accelerator_ids().get("GPU", []))


def current_render_gpu() -> str | None:
    """:func:`render_gpu` of this process: its Ray GPUs, ``VLA_RL_RENDER_GPU``,
    ``CUDA_VISIBLE_DEVICES``."""
    return render_gpu(_ray_gpu_ids(), os.environ.get(RENDER_GPU_HINT_VAR), os.environ.get("CUDA_VISIBLE_DEVICES"))


_PROBE = """
import ctypes, json, os, sys
backend, cuda, attribute, device_var = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
report = {"device_id": None, "device_cuda_indices": []}
if backend == "egl":
    from mujoco.egl import egl_ext as EGL
    devices = EGL.eglQueryDevicesEXT(64)
    address = EGL.eglGetProcAddress("eglQueryDeviceAttribEXT")
    if address:
        query = ctypes.CFUNCTYPE(EGL.EGLBoolean, EGL.EGLDeviceEXT, EGL.EGLint,
                                 ctypes.POINTER(ctypes.c_ssize_t))(address)
        for device in devices:
            value = ctypes.c_ssize_t(-1)
            found = query(device, attribute, ctypes.byref(value))
            EGL.eglGetError()  # clear EGL_BAD_ATTRIBUTE from devices without the extension
            report["device_cuda_indices"].append(int(value.value) if found else None)
    if os.environ.get(device_var) is None and cuda >= 0 and cuda in report["device_cuda_indices"]:
        os.environ[device_var] = str(report["device_cuda_indices"].index(cuda))
    report["device_id"] = os.environ.get(device_var)
    from mujoco.egl import GLContext
else:
    from mujoco.osmesa import GLContext
context = GLContext(16, 16)
context.make_current()
from OpenGL import GL
report["gl_renderer"] = GL.glGetString(GL.GL_RENDERER).decode()
context.free()
print("RENDER_PROBE " + json.dumps(report))
"""


def probe_backend(backend: str, cuda: int | None = None, timeout_s: float = 60.0) -> dict[str, Any]:
    """Open a 16x16 MuJoCo GL context with ``backend`` in a child process (so that this process
    has not imported mujoco or OpenGL yet, and the OpenGL state of environments already rendering
    here is left alone); for EGL, choose the device of CUDA index ``cuda`` first.

    The child inherits this process's environment with ``MUJOCO_GL`` and ``PYOPENGL_PLATFORM``
    set to ``backend``; a ``MUJOCO_EGL_DEVICE_ID`` already set is used as is.

    Args:
        backend: ``"egl"`` or ``"osmesa"``.
        cuda: for EGL, the CUDA index (:func:`cuda_index`) of the GPU to render on; None: MuJoCo's
            default device.
        timeout_s: how long the probe may take, seconds.

    Returns:
        ``{"ok": bool, "error": str | None`` (the last line of the child's error output),
        ``"gl_renderer": str | None`` (OpenGL's ``GL_RENDERER``, e.g. ``"llvmpipe (LLVM 15.0.6,
        256 bits)"``), ``"device_id": str | None`` (the EGL device index the context was opened
        on when one was chosen), ``"device_cuda_indices": list`` (each EGL device's CUDA index
        or None)``}``.

    Raises:
        ValueError: if ``backend`` is not a headless backend.
    """
    env = {**os.environ, **headless_rendering_env_vars(backend)}
    command = [sys.executable, "-c", _PROBE, backend, str(-1 if cuda is None else cuda), str(EGL_CUDA_DEVICE_NV),
               EGL_DEVICE_VAR]
    failed = {"ok": False, "gl_renderer": None, "device_id": None, "device_cuda_indices": []}
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {**failed, "error": f"the {backend} probe took longer than {timeout_s} s"}
    lines = [line for line in result.stdout.splitlines() if line.startswith("RENDER_PROBE ")]
    if result.returncode != 0 or not lines:
        last_line = (result.stderr.strip().splitlines() or ["no error output"])[-1]
        return {**failed, "error": f"{backend} context creation failed: {last_line}"}
    return {"ok": True, "error": None, **json.loads(lines[-1].removeprefix("RENDER_PROBE "))}


def egl_unavailable_reason(timeout_s: float = 60.0) -> str | None:
    """Say why MuJoCo cannot render with EGL here, or return ``None`` if it can
    (:func:`probe_backend` on MuJoCo's default EGL device).

    Args:
        timeout_s: how long the probe may take, seconds.
    """
    return probe_backend("egl", timeout_s=timeout_s)["error"]


def _set_auto(name: str, value: str) -> None:
    os.environ[name] = value
    auto = {**_auto_vars(), name: value}
    os.environ[AUTO_VARS_VAR] = ",".join(f"{key}={auto[key]}" for key in sorted(auto))


@contextlib.contextmanager
def egl_device_hidden_from_robosuite() -> Iterator[None]:
    """Around the first import of robosuite (or of what imports it: LIBERO), hide the EGL device
    this module chose from robosuite's import-time check.

    robosuite asserts that ``MUJOCO_EGL_DEVICE_ID`` appears in ``CUDA_VISIBLE_DEVICES``
    (``robosuite/utils/binding_utils.py``), but EGL numbers the devices its own way (all GPUs, or
    only the visible ones, in its own order: mujoco#3245), so the device that renders on GPU 1 of
    ``CUDA_VISIBLE_DEVICES=1`` may be EGL device 0 and the import failed. MuJoCo reads the variable
    when it makes its first EGL context, after the import: it is restored then. A value the user
    set is left to robosuite's check.
    """
    value = os.environ.get(EGL_DEVICE_VAR)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    hide = (value is not None and visible != "" and _auto_vars().get(EGL_DEVICE_VAR) == value
            and not (value.isdigit() and value in visible))  # robosuite's own test
    if hide:
        del os.environ[EGL_DEVICE_VAR]
    try:
        yield
    finally:
        if hide:
            os.environ[EGL_DEVICE_VAR] = value


def setup_headless_rendering(backend: str = DEFAULT_GL_BACKEND) -> str:
    """Choose MuJoCo's OpenGL backend and EGL device for this process, once, as the module
    docstring says; later calls return the first choice.

    A user's ``MUJOCO_GL`` is kept (and ``PYOPENGL_PLATFORM`` set to it when unset and it is
    ``egl`` or ``osmesa``), with the EGL device chosen for this process's GPU when it is ``egl``
    and ``MUJOCO_EGL_DEVICE_ID`` is unset; otherwise ``backend`` is probed
    (:func:`probe_backend`) on the :func:`render_gpu` and set, or OSMesa when it fails (one log
    warning naming the error). Warns (``RuntimeWarning``) if ``mujoco`` was imported before, since
    the setting then comes too late to take effect.

    Args:
        backend: backend to try when ``MUJOCO_GL`` is unset: ``"egl"`` or ``"osmesa"``.

    Returns:
        The backend in effect (the value of ``MUJOCO_GL``).

    Raises:
        ValueError: if ``backend`` is not a headless backend.
    """
    global _REPORT
    headless_rendering_env_vars(backend)  # validates backend
    if _REPORT is not None:
        return _REPORT["backend"]
    for name in _auto_vars():  # chosen by a parent process for itself: choose again here
        os.environ.pop(name, None)
    os.environ.pop(AUTO_VARS_VAR, None)
    user = user_rendering_env_vars()
    if "MUJOCO_GL" in user and (user["MUJOCO_GL"] != "egl" or EGL_DEVICE_VAR in user):
        _REPORT = {"backend": user["MUJOCO_GL"], "source": "MUJOCO_GL set by the user",
                   "device_id": user.get(EGL_DEVICE_VAR), "gpu": None, "gl_renderer": None, "egl_error": None}
    else:
        if "mujoco" in sys.modules:
            warnings.warn(
                "mujoco was imported before MUJOCO_GL was set; call "
                "simulators.rendering.setup_headless_rendering() before importing mujoco or robosuite",
                RuntimeWarning,
                stacklevel=2,
            )
        if "MUJOCO_GL" in user:  # the user's EGL (the offline GPU kit sets MUJOCO_GL=egl): on this process's GPU
            _REPORT = _egl_device_for_the_users_egl()
        else:
            _REPORT = _choose_backend(backend, user.get(EGL_DEVICE_VAR))
            for name, value in headless_rendering_env_vars(_REPORT["backend"]).items():
                _set_auto(name, value)
    if "PYOPENGL_PLATFORM" not in os.environ and _REPORT["backend"] in _PYOPENGL_PLATFORMS:
        _set_auto("PYOPENGL_PLATFORM", _REPORT["backend"])
    return _REPORT["backend"]


def _egl_device_for_the_users_egl() -> dict[str, Any]:
    """``MUJOCO_GL=egl`` set by the user without ``MUJOCO_EGL_DEVICE_ID``: the backend stays the
    user's, never replaced; the EGL device is still chosen for this process's GPU, as in the
    automatic choice (without it every process renders on MuJoCo's first EGL device). Probed only
    where there is a GPU to render on; a failed probe is reported, the user's backend kept."""
    gpu = current_render_gpu()
    report = {"backend": "egl", "source": "MUJOCO_GL set by the user", "device_id": None, "gpu": gpu,
              "gl_renderer": None, "egl_error": None}
    if gpu is None:
        return report
    probe = probe_backend("egl", cuda_index(gpu, os.environ.get("CUDA_VISIBLE_DEVICES")))
    if not probe["ok"]:
        logger.warning("MuJoCo cannot render with EGL (MUJOCO_GL=egl, set by the user) on GPU %s: %s", gpu,
                       probe["error"])
        return {**report, "egl_error": probe["error"]}
    if probe["device_id"] is not None:
        _set_auto(EGL_DEVICE_VAR, probe["device_id"])
    return {**report, "source": "MUJOCO_GL set by the user; EGL device chosen", "device_id": probe["device_id"],
            "gl_renderer": probe["gl_renderer"]}


def _choose_backend(backend: str, user_device: str | None) -> dict[str, Any]:
    """Probe ``backend`` (EGL on this process's GPU), falling back to OSMesa; sets
    ``MUJOCO_EGL_DEVICE_ID`` when it chose the device. Returns the report."""
    gpu = None if user_device is not None else current_render_gpu()
    cuda = None if backend != "egl" or gpu is None else cuda_index(gpu, os.environ.get("CUDA_VISIBLE_DEVICES"))
    probe = probe_backend(backend, cuda)
    report = {"backend": backend, "source": "automatic", "device_id": probe["device_id"], "gpu": gpu,
              "gl_renderer": probe["gl_renderer"], "egl_error": None}
    if probe["ok"]:
        if user_device is not None:
            report["source"] = f"automatic; {EGL_DEVICE_VAR} set by the user"
        elif probe["device_id"] is not None:
            _set_auto(EGL_DEVICE_VAR, probe["device_id"])
        elif gpu is not None and backend == "egl":
            logger.warning("rendering on GPU %s was wanted, but no EGL device reports its CUDA index %s "
                           "(EGL devices' CUDA indices: %s): MuJoCo's default EGL device is used", gpu, cuda,
                           probe["device_cuda_indices"])
        return report
    if backend == FALLBACK_GL_BACKEND:
        logger.warning("MuJoCo cannot render with %s: %s", backend, probe["error"])
        return report
    fallback = probe_backend(FALLBACK_GL_BACKEND)
    if fallback["ok"]:
        message = (f"MuJoCo cannot render with EGL here ({probe['error']}); rendering with OSMesa (software) "
                   f"instead. Set MUJOCO_GL to choose the backend yourself.")
        report = {**report, "backend": FALLBACK_GL_BACKEND, "source": "fallback", "device_id": None, "gpu": None,
                  "gl_renderer": fallback["gl_renderer"], "egl_error": probe["error"]}
    else:
        message = (f"MuJoCo cannot render with EGL ({probe['error']}) nor with OSMesa ({fallback['error']}): "
                   "keeping MUJOCO_GL=egl; environments that render will fail (state-only ones work)")
        report["egl_error"] = probe["error"]
    logger.warning(message)
    return report


def describe_renderers(reports: Sequence[dict[str, Any]]) -> str:
    """One line for a run's log: each distinct renderer among ``reports`` (from
    :func:`rendering_report`), with how many processes use it, e.g. ``"egl (EGL device 0 for GPU
    0): NVIDIA H100 80GB HBM3/PCIe/SSE2 x 2; osmesa (fallback; EGL failed: ...): llvmpipe x 1"``.

    Args:
        reports: one report per simulator process.

    Returns:
        The line; ``"no simulator process"`` when ``reports`` is empty.
    """
    counts: dict[str, int] = {}
    for report in reports:
        where = [report["source"]] if report["source"] != "automatic" else []
        if report["device_id"] is not None:
            where.append(f"EGL device {report['device_id']}" + (f" for GPU {report['gpu']}" if report["gpu"] else ""))
        if report["egl_error"]:
            where.append(f"EGL failed: {report['egl_error']}")
        line = report["backend"] + (f" ({'; '.join(where)})" if where else "")
        line += f": {report['gl_renderer'] or 'GL renderer not probed'}"
        counts[line] = counts.get(line, 0) + 1
    return "; ".join(f"{line} x {count}" for line, count in counts.items()) or "no simulator process"


def rendering_report() -> dict[str, Any]:
    """What :func:`setup_headless_rendering` chose in this process (it runs it if it has not run).

    Returns:
        ``{"backend": "egl" | "osmesa" | the user's MUJOCO_GL, "source": "automatic" |
        "fallback" | "MUJOCO_GL set by the user" | ..., "device_id": str | None`` (the
        ``MUJOCO_EGL_DEVICE_ID`` in effect; None: MuJoCo's default EGL device), ``"gpu": str |
        None`` (the GPU id wanted, :func:`render_gpu`), ``"gl_renderer": str | None``
        (``GL_RENDERER`` of the probe's context, e.g. ``"NVIDIA H100 80GB HBM3/PCIe/SSE2"`` or
        ``"llvmpipe (...)"``; None when not probed: the user chose the backend, and its device
        unless it is ``egl`` on a GPU), ``"egl_error":
        str | None`` (why EGL failed, when it did)``}`` (a copy).
    """
    setup_headless_rendering()
    return dict(_REPORT or {})


def disable_shadows_and_reflections(render_context: Any) -> None:
    """Turn off MuJoCo's shadow and reflection passes in an offscreen render context.

    On CPU (Mesa llvmpipe) this roughly doubles rendering speed (measured on robosuite Lift at
    128²: about 14 -> 24 steps/s); images lose shadows and mirror-like floor reflections.

    Args:
        render_context: an offscreen render context with a ``scn`` ``mujoco.MjvScene`` (robosuite's
            ``MjRenderContextOffscreen``, ``sim._render_context_offscreen``).
    """
    import mujoco

    render_context.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
    render_context.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0


_SHARED_RENDERERS: dict[tuple[str, int, bool], Any] = {}
"""This process's ``mujoco.Renderer`` per (model digest, image size, fast): see :class:`CameraRenderer`."""


def model_digest(model: Any) -> str:
    """SHA-256 of a compiled MuJoCo model (its ``mj_saveModel`` bytes): equal for models compiled
    from the same description, as every environment of one task is."""
    import mujoco

    buffer = np.zeros(mujoco.mj_sizeModel(model), dtype=np.uint8)
    mujoco.mj_saveModel(model, None, buffer)
    return hashlib.sha256(buffer).hexdigest()


class CameraRenderer:
    """Renders the cameras of one environment (a MuJoCo model and data pair) through renderers
    shared by every environment of the process.

    One ``mujoco.Renderer`` (an OpenGL context, and a ``MjrContext`` holding the model's meshes
    and textures) exists per process for each distinct model (:func:`model_digest` of the model
    as this renderer is built, before the environment's first reset), image size
    and ``fast`` setting: environments of one task render through the same one, each with its
    own model and data (``mjv_updateScene``), so their images are those of a renderer of their
    own. A robosuite Lift environment with its own offscreen context held about 383 MB; without
    one about 128 MB, plus one shared renderer of about 265 MB per process (measured on this
    2-core machine, llvmpipe).

    Args:
        model, data: the environment's ``mujoco.MjModel`` and ``mujoco.MjData``.
        fast: without shadows and reflections (about twice as fast on CPU).
        hidden_geom_groups: geom groups not drawn (robosuite: ``(0,)``, its collision meshes, as
            robosuite's own renderer does with ``render_collision_mesh=False``).
    """

    def __init__(self, model: Any, data: Any, *, fast: bool, hidden_geom_groups: Sequence[int] = ()) -> None:
        import mujoco

        self._model, self._data, self._fast = model, data, fast
        # The model as compiled, before any reset: a reset may move sites and bodies in the model
        # (MetaWorld's goal site), which the shared context (meshes, textures) does not hold.
        self._digest = model_digest(model)
        self._option = mujoco.MjvOption()
        for group in hidden_geom_groups:
            self._option.geomgroup[group] = 0
        self._camera = mujoco.MjvCamera()
        self._camera.type = mujoco.mjtCamera.mjCAMERA_FIXED

    def camera_id(self, camera: str) -> int:
        """The id of camera ``camera`` in the model, or -1 if it has none of that name."""
        import mujoco

        return mujoco.mj_name2id(self._model, mujoco.mjtObj.mjOBJ_CAMERA, camera)

    def render(self, camera: str, size: int) -> np.ndarray:
        """uint8 ``(size, size, 3)``: ``camera``'s view of the data's current state, rows top-down.

        Raises:
            ValueError: if the model has no camera ``camera``.
        """
        import mujoco

        camera_id = self.camera_id(camera)
        if camera_id < 0:
            raise ValueError(f"the model has no camera {camera!r}")
        key = (self._digest, size, self._fast)
        renderer = _SHARED_RENDERERS.get(key)
        if renderer is None:
            # The offscreen buffer is the model's (robosuite's and MetaWorld's: 640 x 480); a larger
            # image enlarges it, as robosuite's own renderer does (binding_utils.update_offscreen_size).
            visual = self._model.vis.global_
            visual.offwidth, visual.offheight = max(visual.offwidth, size), max(visual.offheight, size)
            renderer = _SHARED_RENDERERS[key] = mujoco.Renderer(self._model, height=size, width=size)
            if self._fast:
                renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
                renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        self._camera.fixedcamid = camera_id
        mujoco.mjv_updateScene(self._model, self._data, self._option, None, self._camera,
                               mujoco.mjtCatBit.mjCAT_ALL, renderer.scene)
        return renderer.render()  # makes the renderer's OpenGL context current first
