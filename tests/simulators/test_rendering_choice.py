"""Choosing the OpenGL backend and the EGL device (simulators/rendering.py): the GPU rule, the
EGL device matched by its CUDA index (a fake mujoco/OpenGL in the probe's child process), the
OSMesa fallback, and the report."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from simulators import rendering
from simulators.rendering import (
    AUTO_VARS_VAR,
    EGL_DEVICE_VAR,
    RENDER_GPU_HINT_VAR,
    cuda_index,
    describe_renderers,
    probe_backend,
    render_gpu,
    setup_headless_rendering,
    user_rendering_env_vars,
)


def test_render_gpu_prefers_ray_then_the_pool_hint_then_cuda_visible_devices():
    assert render_gpu(["3", "1"], "2", "0") == "1"  # lowest of Ray's ids (unordered)
    assert render_gpu([2], None, None) == "2"
    assert render_gpu([], "2", "0,1") == "2"  # the pool creator's GPU
    assert render_gpu([], None, "1,0") == "1"  # first visible device
    for visible in (None, "", "-1", "GPU-8f6c1a2b", "MIG-4b1c"):
        assert render_gpu([], None, visible) is None, visible


def test_cuda_index_renumbers_the_visible_devices():
    assert cuda_index("3", "2,3") == 1
    assert cuda_index("3", None) == 3
    assert cuda_index("3", "0,1") == 3  # not listed: taken as an index


FAKE_EGL_EXT = '''
import ctypes
EGLBoolean, EGLint, EGLDeviceEXT = ctypes.c_uint, ctypes.c_int32, ctypes.c_void_p
CUDA = {101: None, 102: 1, 103: 0}  # device handle -> EGL_CUDA_DEVICE_NV (None: not an NVIDIA device)

def eglQueryDevicesEXT(max_devices=10):
    return [ctypes.c_void_p(handle) for handle in CUDA]

@ctypes.CFUNCTYPE(EGLBoolean, EGLDeviceEXT, EGLint, ctypes.POINTER(ctypes.c_ssize_t))
def _query(device, attribute, value):
    if attribute != 0x323A or CUDA[device] is None:
        return 0
    value[0] = CUDA[device]
    return 1

def eglGetProcAddress(name):
    return ctypes.cast(_query, ctypes.c_void_p).value if name == "eglQueryDeviceAttribEXT" else None

def eglGetError():
    return 0x3000
'''

FAKE_EGL_CONTEXT = '''
import os
class GLContext:
    def __init__(self, width, height):
        if os.environ.get("MUJOCO_EGL_DEVICE_ID") == "9":
            raise RuntimeError("The MUJOCO_EGL_DEVICE_ID environment variable must be an integer between 0 and 2")
    def make_current(self):
        pass
    def free(self):
        pass
'''

FAKE_GL = '''
import os
GL_RENDERER = 0x1F01
def glGetString(name):
    return ("Fake GPU on EGL device " + str(os.environ.get("MUJOCO_EGL_DEVICE_ID"))).encode()
'''


@pytest.fixture
def fake_egl(tmp_path, monkeypatch):
    """A mujoco.egl and OpenGL.GL that the probe's child imports first: three EGL devices, the
    second and third NVIDIA GPUs with CUDA indices 1 and 0."""
    for path, text in {"mujoco/__init__.py": "", "mujoco/egl/__init__.py": FAKE_EGL_CONTEXT,
                       "mujoco/egl/egl_ext.py": FAKE_EGL_EXT, "OpenGL/__init__.py": "", "OpenGL/GL.py": FAKE_GL}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(textwrap.dedent(text))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv(EGL_DEVICE_VAR, "")  # records the value to restore
    monkeypatch.delenv(EGL_DEVICE_VAR)


def test_probe_opens_the_egl_device_of_the_wanted_cuda_index(fake_egl):
    probe = probe_backend("egl", cuda=0)
    assert probe["ok"] and probe["device_cuda_indices"] == [None, 1, 0]
    assert probe["device_id"] == "2" and probe["gl_renderer"] == "Fake GPU on EGL device 2"
    assert probe_backend("egl", cuda=1)["device_id"] == "1"
    # No EGL device has CUDA index 5, or no GPU wanted: MuJoCo's default device.
    assert probe_backend("egl", cuda=5)["device_id"] is None
    assert probe_backend("egl")["gl_renderer"] == "Fake GPU on EGL device None"


def test_probe_keeps_the_users_device_and_reports_its_failure(fake_egl, monkeypatch):
    monkeypatch.setenv(EGL_DEVICE_VAR, "1")
    assert probe_backend("egl", cuda=0)["device_id"] == "1"  # the user's, not remapped
    monkeypatch.setenv(EGL_DEVICE_VAR, "9")
    failed = probe_backend("egl", cuda=0)
    assert not failed["ok"] and "must be an integer between 0 and 2" in failed["error"]


@pytest.fixture
def fresh_process(monkeypatch):
    """setup_headless_rendering as in a new process with no rendering variable set (restored after)."""
    monkeypatch.setattr(rendering, "_REPORT", None)
    for name in (*rendering.RENDERING_VARS, AUTO_VARS_VAR, RENDER_GPU_HINT_VAR, "CUDA_VISIBLE_DEVICES"):
        monkeypatch.setenv(name, "")  # records the value to restore (delenv of an unset name records nothing)
        monkeypatch.delenv(name)
    monkeypatch.setattr(rendering, "_ray_gpu_ids", list)


def fake_probe(monkeypatch, results):
    """Replace probe_backend by one answering ``results[backend]``; returns the calls made."""
    calls = []

    def probe(backend, cuda=None, timeout_s=60.0):
        calls.append((backend, cuda))
        ok = results[backend]
        return {"ok": ok, "error": None if ok else f"{backend} context creation failed: no display",
                "gl_renderer": f"{backend} renderer" if ok else None,
                "device_id": "3" if ok and cuda is not None else None, "device_cuda_indices": []}

    monkeypatch.setattr(rendering, "probe_backend", probe)
    return calls


def test_egl_on_the_gpu_ray_assigned(fresh_process, monkeypatch):
    calls = fake_probe(monkeypatch, {"egl": True})
    monkeypatch.setattr(rendering, "_ray_gpu_ids", lambda: [5, 4])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert setup_headless_rendering() == "egl"
    assert calls == [("egl", 0)]  # GPU 4 is CUDA index 0 in this process
    assert os.environ["MUJOCO_GL"] == os.environ["PYOPENGL_PLATFORM"] == "egl"
    assert os.environ[EGL_DEVICE_VAR] == "3"  # the probe's EGL device
    assert os.environ[AUTO_VARS_VAR] == f"{EGL_DEVICE_VAR}=3,MUJOCO_GL=egl,PYOPENGL_PLATFORM=egl"
    assert user_rendering_env_vars() == {}  # chosen here: not passed on as the user's choice
    report = rendering.rendering_report()
    assert report == {"backend": "egl", "source": "automatic", "device_id": "3", "gpu": "4",
                      "gl_renderer": "egl renderer", "egl_error": None}
    assert setup_headless_rendering() == "egl" and len(calls) == 1  # once per process


def test_pool_hint_without_ray_gpus_and_no_gpu_at_all(fresh_process, monkeypatch):
    calls = fake_probe(monkeypatch, {"egl": True})
    monkeypatch.setenv(RENDER_GPU_HINT_VAR, "2")
    setup_headless_rendering()
    assert calls == [("egl", 2)]
    monkeypatch.setattr(rendering, "_REPORT", None)
    monkeypatch.delenv(RENDER_GPU_HINT_VAR)
    monkeypatch.delenv(EGL_DEVICE_VAR)
    setup_headless_rendering()  # a CPU machine: MuJoCo's default EGL device (llvmpipe)
    assert calls[-1] == ("egl", None) and EGL_DEVICE_VAR not in os.environ


def test_egl_failure_falls_back_to_osmesa_with_one_message(fresh_process, monkeypatch, caplog):
    calls = fake_probe(monkeypatch, {"egl": False, "osmesa": True})
    assert setup_headless_rendering() == "osmesa"
    messages = [r.getMessage() for r in caplog.records if r.name == "simulators.rendering"]
    assert len(messages) == 1 and [r.levelname for r in caplog.records] == ["WARNING"]
    assert "egl context creation failed: no display" in messages[0] and "rendering with OSMesa" in messages[0]
    assert calls == [("egl", None), ("osmesa", None)]
    assert os.environ["MUJOCO_GL"] == os.environ["PYOPENGL_PLATFORM"] == "osmesa"
    report = rendering.rendering_report()
    assert report["backend"] == "osmesa" and report["source"] == "fallback"
    assert report["egl_error"] == "egl context creation failed: no display"


def test_neither_backend_works_keeps_egl(fresh_process, monkeypatch, caplog):
    fake_probe(monkeypatch, {"egl": False, "osmesa": False})
    assert setup_headless_rendering() == "egl"
    assert os.environ["MUJOCO_GL"] == "egl"
    assert [r.getMessage() for r in caplog.records if "nor with OSMesa" in r.getMessage()]


def test_the_users_choice_wins_and_a_parents_choice_does_not(fresh_process, monkeypatch):
    calls = fake_probe(monkeypatch, {"egl": True, "osmesa": True})
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    monkeypatch.setenv(EGL_DEVICE_VAR, "1")
    assert setup_headless_rendering() == "osmesa" and calls == []  # not probed, not changed
    assert user_rendering_env_vars() == {"MUJOCO_GL": "osmesa", EGL_DEVICE_VAR: "1"}
    assert rendering.rendering_report()["source"] == "MUJOCO_GL set by the user"
    # Set by a parent for itself, then changed (by the user): the user's.
    monkeypatch.setattr(rendering, "_REPORT", None)
    monkeypatch.setenv(AUTO_VARS_VAR, f"MUJOCO_GL=egl,{EGL_DEVICE_VAR}=0")
    assert setup_headless_rendering() == "osmesa" and calls == []
    # Inherited unchanged from a parent that chose them for itself: chosen again here.
    monkeypatch.setattr(rendering, "_REPORT", None)
    monkeypatch.setenv(AUTO_VARS_VAR, f"MUJOCO_GL=osmesa,{EGL_DEVICE_VAR}=1")
    monkeypatch.setenv(RENDER_GPU_HINT_VAR, "0")
    assert setup_headless_rendering() == "egl" and calls == [("egl", 0)]


def test_the_users_egl_renders_on_the_processes_gpu(fresh_process, monkeypatch, caplog):
    """``MUJOCO_GL=egl`` alone (the offline GPU kit exports it) kept the backend and skipped the
    device choice: every simulator rendered on MuJoCo's first EGL device, whatever its GPU. Now the
    device is chosen for the process's GPU (the backend still the user's, even when the probe
    fails); without a GPU nothing is probed, and a user's MUJOCO_EGL_DEVICE_ID is used as is."""
    calls = fake_probe(monkeypatch, {"egl": True})
    monkeypatch.setenv("MUJOCO_GL", "egl")
    monkeypatch.setenv(RENDER_GPU_HINT_VAR, "5")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert setup_headless_rendering() == "egl" and calls == [("egl", 1)]  # GPU 5: CUDA index 1 here
    assert os.environ[EGL_DEVICE_VAR] == "3" and user_rendering_env_vars() == {"MUJOCO_GL": "egl"}
    assert rendering.rendering_report() == {"backend": "egl", "source": "MUJOCO_GL set by the user; EGL device chosen",
                                            "device_id": "3", "gpu": "5", "gl_renderer": "egl renderer",
                                            "egl_error": None}
    monkeypatch.setattr(rendering, "_REPORT", None)  # the probe fails: the user's backend stays
    monkeypatch.delenv(EGL_DEVICE_VAR)
    failing = fake_probe(monkeypatch, {"egl": False})
    assert setup_headless_rendering() == "egl" and failing == [("egl", 1)] and EGL_DEVICE_VAR not in os.environ
    assert rendering.rendering_report()["egl_error"] == "egl context creation failed: no display"
    assert any("set by the user) on GPU 5" in r.getMessage() for r in caplog.records)
    for unset in (RENDER_GPU_HINT_VAR, "CUDA_VISIBLE_DEVICES"):  # no GPU: not probed
        monkeypatch.delenv(unset)
    monkeypatch.setattr(rendering, "_REPORT", None)
    assert setup_headless_rendering() == "egl" and failing == [("egl", 1)]
    monkeypatch.setattr(rendering, "_REPORT", None)  # the user's device: not probed either
    monkeypatch.setenv(RENDER_GPU_HINT_VAR, "5")
    monkeypatch.setenv(EGL_DEVICE_VAR, "0")
    assert setup_headless_rendering() == "egl" and failing == [("egl", 1)] and os.environ[EGL_DEVICE_VAR] == "0"


def test_describe_renderers_counts_each_renderer():
    gpu = {"backend": "egl", "source": "automatic", "device_id": "1", "gpu": "0",
           "gl_renderer": "NVIDIA H100 80GB HBM3/PCIe/SSE2", "egl_error": None}
    fallback = {"backend": "osmesa", "source": "fallback", "device_id": None, "gpu": None,
                "gl_renderer": "llvmpipe", "egl_error": "egl context creation failed: x"}
    assert describe_renderers([gpu, gpu, fallback]) == (
        "egl (EGL device 1 for GPU 0): NVIDIA H100 80GB HBM3/PCIe/SSE2 x 2; "
        "osmesa (fallback; EGL failed: egl context creation failed: x): llvmpipe x 1")
    assert describe_renderers([]) == "no simulator process"


ROBOSUITE_ON_GPU_1 = '''
import os, sys
import simulators.rendering as rendering

def probe(backend, cuda=None, timeout_s=60.0):  # an NVIDIA EGL that lists the visible GPU only
    return {"ok": True, "error": None, "gl_renderer": "NVIDIA", "device_cuda_indices": [0],
            "device_id": "0" if backend == "egl" and cuda == 0 else None}

rendering.probe_backend = probe
rendering.setup_headless_rendering()
assert os.environ["MUJOCO_EGL_DEVICE_ID"] == "0"
if sys.argv[1] == "robosuite":
    import robosuite
else:
    from simulators import make_env
    make_env("robosuite", {"horizon": 5}).close()
print("built; MUJOCO_EGL_DEVICE_ID =", os.environ["MUJOCO_EGL_DEVICE_ID"])
'''


@pytest.mark.parametrize("how, built", [("robosuite", False), ("make_env", True)])
def test_robosuite_builds_on_gpu_1_whose_egl_device_is_0(how, built):
    """CUDA_VISIBLE_DEVICES=1 (a Ray actor's GPU, `CUDA_VISIBLE_DEVICES=1 vla-rl eval`) and an EGL
    that numbers that GPU 0: robosuite's import-time assert (MUJOCO_EGL_DEVICE_ID among
    CUDA_VISIBLE_DEVICES' ids) failed every robosuite environment, state-only ones included. A
    plain `import robosuite` still fails there; the environments hide the device from that check
    and MuJoCo still gets it."""
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items()
           if key not in ("MUJOCO_GL", "PYOPENGL_PLATFORM", EGL_DEVICE_VAR, AUTO_VARS_VAR, "VLA_RL_RENDER_GPU")}
    env["CUDA_VISIBLE_DEVICES"] = "1"
    done = subprocess.run([sys.executable, "-c", ROBOSUITE_ON_GPU_1, how], capture_output=True, text=True, env=env,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    if built:
        assert done.returncode == 0 and "built; MUJOCO_EGL_DEVICE_ID = 0" in done.stdout, done.stderr[-2000:]
    else:
        assert done.returncode != 0 and "MUJOCO_EGL_DEVICE_ID needs to be set" in done.stderr
