"""Installing vla-rl never replaces a torch it did not install (README, "On a GPU machine").

A GPU user's environment is imitated by a throwaway venv holding a stand-in distribution named
``torch`` at another version than CI's pin (``2.11.0+cu130``: metadata and an empty package; PyPI's
real torch 2.11 is a multi-GB CUDA build). The fast tests run offline: pip reads only a folder of
such stand-in wheels (torch at CI's pin among them, so pip could replace the installed one) and a
copy of the project whose ``pyproject.toml`` keeps the real torch requirement and nothing else.
The slow tests resolve the real ``pyproject.toml`` against the package indexes (network, 30 to 45 s
each here). ``scripts/bootstrap.sh`` runs its pip installs as dry runs under ``VLA_RL_PIP_DRY_RUN``.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
USER_TORCH = "2.11.0+cu130"  # a GPU user's torch: in pyproject's range, not CI's pin
PIN = re.search(r"^torch==(\S+)$", (REPO / "scripts/constraints-cpu.txt").read_text(), re.M)[1]
TORCH_REQUIREMENT = next(
    d for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    if re.match(r"torch\b", d)
)


def write_wheel(directory, name, version, metadata=""):
    """A wheel of distribution ``name`` with an empty package and METADATA plus ``metadata``.
    Self-contained (imports inside): it is also the offline copy's build backend."""
    import base64
    import hashlib
    import zipfile
    from pathlib import Path

    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    files = {
        f"{name.replace('-', '_')}/__init__.py": "",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{metadata}",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},{len(text)}"
        for path, text in files.items()
    ]
    files[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n"
    path = Path(directory) / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in files.items():
            wheel.writestr(member, text)
    return path.name


# The offline copy's build backend (no build requirements, so pip fetches nothing to build it).
BACKEND = textwrap.dedent(inspect.getsource(write_wheel)) + textwrap.dedent(f"""
    def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
        return write_wheel(wheel_directory, "vla-rl", "0.1.0",
                           "Requires-Dist: {TORCH_REQUIREMENT}\\nProvides-Extra: test\\n")

    build_wheel = build_editable
""")
OFFLINE_PYPROJECT = f"""\
[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]

[project]
name = "vla-rl"
version = "0.1.0"
dependencies = ["{TORCH_REQUIREMENT}"]

[project.optional-dependencies]
test = []
"""


@pytest.fixture(scope="session")
def wheels(tmp_path_factory):
    """The offline package index: stand-in torch at CI's pin (a CPU build, as on the project
    machines), at the user's version and at the others the tests install, and a torchvision."""
    directory = tmp_path_factory.mktemp("wheels")
    for version in (f"{PIN}+cpu", USER_TORCH, "2.10.0+cu126", "2.12.0+cpu", "2.12.0+cu126"):
        write_wheel(directory, "torch", version)
    write_wheel(directory, "torchvision", "0.26.0+cu130")
    return directory


@pytest.fixture(scope="session")
def bare_venv(tmp_path_factory):
    """A venv with only pip (copied by each test: creating one takes seconds)."""
    path = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([base_python(), "-m", "venv", str(path)], check=True)
    return path


def base_python():
    return getattr(sys, "_base_executable", sys.executable)


def pip_env(wheels, **extra):
    """This process's environment without pip settings or vla-rl's, pip reading only ``wheels``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VLA_RL_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels),
               PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def checkout(tmp_path, offline=True):
    """A copy of what bootstrap reads: its script, CI's constraints and a pyproject.toml (offline:
    the real torch requirement only, built by an in-tree backend)."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    for name in ("scripts/bootstrap.sh", "scripts/constraints-cpu.txt"):
        shutil.copy(REPO / name, root / name)
    if offline:
        (root / "pyproject.toml").write_text(OFFLINE_PYPROJECT)
        (root / "backend.py").write_text(BACKEND)
    else:
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(REPO / name, root / name)
    return root


def venv_with(path, bare_venv, wheels, *wheel_specs):
    """Copy the bare venv to ``path`` and install the named stand-in wheels into it (unpacked into
    site-packages, as pip installs a pure-Python wheel, without pip's second of start-up)."""
    shutil.copytree(bare_venv, path, symlinks=True)
    (site_packages,) = path.glob("lib/python3.*/site-packages")
    for name, version in wheel_specs:
        with zipfile.ZipFile(wheels / f"{name}-{version}-py3-none-any.whl") as wheel:
            wheel.extractall(site_packages)
    return path


def installed(python, name, env):
    result = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({name!r}))"],
                            capture_output=True, text=True, env=env)
    return result.stdout.strip() or None


def bootstrap(root, env, dry_run=True):
    if dry_run:
        env = {**env, "VLA_RL_PIP_DRY_RUN": str(root / "reports")}
    return subprocess.run(["bash", str(root / "scripts/bootstrap.sh")], capture_output=True, text=True, env=env)


def to_install(report_path):
    """{name: version} of what a pip ``--report`` would install."""
    report = json.loads(Path(report_path).read_text())
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in report["install"]}


def test_pip_install_keeps_an_installed_torch_in_range(tmp_path, bare_venv, wheels):
    """The documented GPU install, ``pip install -e .``, over torch 2.11: pip leaves it although
    CI's pin is on offer and newer."""
    root = checkout(tmp_path)
    venv = venv_with(tmp_path / "venv", bare_venv, wheels, ("torch", USER_TORCH))
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--dry-run", "--report",
                    str(tmp_path / "report.json"), "-e", str(root)], check=True, env=pip_env(wheels))
    assert to_install(tmp_path / "report.json") == {"vla-rl": "0.1.0"}


def test_bootstrap_keeps_a_users_torch_and_torchvision(tmp_path, bare_venv, wheels):
    root = checkout(tmp_path)
    venv_with(root / ".venv", bare_venv, wheels, ("torch", USER_TORCH), ("torchvision", "0.26.0+cu130"))
    result = bootstrap(root, pip_env(wheels))
    assert result.returncode == 0, result.stderr
    assert f"keeping this environment's torch {USER_TORCH}" in result.stdout
    assert not (root / "reports/torch.json").exists()
    assert to_install(root / "reports/project.json") == {"vla-rl": "0.1.0"}
    constraints = (root / "reports/constraints.txt").read_text().splitlines()
    assert f"torch=={USER_TORCH}" in constraints and "torchvision==0.26.0+cu130" in constraints
    assert f"torch=={PIN}" not in constraints
    assert "transformers==" in "\n".join(constraints)  # the rest stays at CI's versions


@pytest.mark.parametrize(
    ("torch", "record", "old_stamp", "replaced"),
    [
        ("2.12.0+cpu", "2.12.0+cpu", False, True),  # bootstrap installed it: follow the moved pin
        ("2.12.0+cu126", "2.12.0+cpu", False, False),  # the user swapped it after bootstrap
        ("2.12.0+cpu", None, True, True),  # a .venv of the bootstrap before the record
        ("2.12.0+cu126", None, True, False),
        ("2.12.0+cpu", None, False, False),  # a user's CPU torch (Ascend's torch_npu runs on one)
    ],
)
def test_bootstrap_replaces_only_the_torch_it_installed(tmp_path, bare_venv, wheels, torch, record, old_stamp, replaced):
    root = checkout(tmp_path)
    venv = venv_with(root / ".venv", bare_venv, wheels, ("torch", torch))
    if record:
        (venv / ".vla_rl_torch").write_text(record + "\n")
    if old_stamp:
        (venv / ".vla_rl_installed").write_text("an older pyproject.toml\n")
    result = bootstrap(root, pip_env(wheels))
    assert result.returncode == 0, result.stderr
    if replaced:
        assert to_install(root / "reports/torch.json") == {"torch": f"{PIN}+cpu"}
    else:
        assert not (root / "reports/torch.json").exists()
        assert "torch" not in to_install(root / "reports/project.json")


def test_bootstrap_stops_on_a_users_torch_outside_the_range(tmp_path, bare_venv, wheels):
    root = checkout(tmp_path)
    venv_with(root / ".venv", bare_venv, wheels, ("torch", "2.10.0+cu126"))
    result = bootstrap(root, pip_env(wheels))
    assert result.returncode == 2
    assert "torch 2.10.0+cu126" in result.stderr and "outside vla-rl's range" in result.stderr
    assert not (root / "reports").exists()


def test_bootstrap_uses_the_system_torch_when_asked(tmp_path, bare_venv, wheels):
    """VLA_RL_USE_SYSTEM_TORCH=1 makes .venv see PYTHON's packages (here torch 2.11 on PYTHONPATH,
    standing in for the GPU image's site-packages) and keeps that torch."""
    root = checkout(tmp_path)
    env = pip_env(wheels, PYTHON=base_python(), VLA_RL_USE_SYSTEM_TORCH="1")
    result = bootstrap(root, env)
    assert result.returncode == 2 and "has no torch" in result.stderr
    assert not (root / ".venv").exists()

    system = tmp_path / "system-site-packages"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(system),
                    str(wheels / f"torch-{USER_TORCH}-py3-none-any.whl")], check=True, env=pip_env(wheels))
    result = bootstrap(root, {**env, "PYTHONPATH": str(system)})
    assert result.returncode == 0, result.stderr
    assert "include-system-site-packages = true" in (root / ".venv/pyvenv.cfg").read_text()
    assert f"keeping this environment's torch {USER_TORCH}" in result.stdout
    assert "torch" not in to_install(root / "reports/project.json")


def test_bootstrap_uses_a_virtual_environments_torch_when_asked(tmp_path, bare_venv, wheels):
    """PYTHON a virtual environment's interpreter, as the GPU image's python3 is
    (/opt/torch/.venv/bin/python3): a venv made from it saw the base interpreter's site-packages,
    found no torch, and installed CI's pin (on a GPU host, PyPI's multi-GB CUDA build)."""
    root = checkout(tmp_path)
    outer = venv_with(tmp_path / "image-venv", bare_venv, wheels, ("torch", USER_TORCH))
    env = pip_env(wheels, PYTHON=str(outer / "bin/python"), VLA_RL_USE_SYSTEM_TORCH="1")
    result = bootstrap(root, env)
    assert result.returncode == 0, result.stderr
    assert f"keeping this environment's torch {USER_TORCH}" in result.stdout
    assert "torch" not in to_install(root / "reports/project.json") and not (root / "reports/torch.json").exists()
    assert installed(root / ".venv/bin/python", "torch", env) == USER_TORCH
    assert "is a virtual environment's" in result.stdout


@pytest.mark.parametrize("user_torch", [True, False], ids=["users-torch", "ci-fresh-machine"])
def test_bootstrap_installs_then_is_a_no_op(tmp_path, bare_venv, wheels, user_torch):
    """Real (offline) runs: the first installs and records, the second installs nothing. Without a
    torch it is CI's path, unchanged: bootstrap creates .venv, installs torch at the pin, then the
    rest."""
    root = checkout(tmp_path)
    venv = root / ".venv"
    if user_torch:
        venv_with(venv, bare_venv, wheels, ("torch", USER_TORCH))
    env = pip_env(wheels, PYTHON=base_python())
    first = bootstrap(root, env, dry_run=False)
    assert first.returncode == 0, first.stderr
    assert ("keeping" in first.stdout) is user_torch
    assert installed(venv / "bin/python", "torch", env) == (USER_TORCH if user_torch else f"{PIN}+cpu")
    assert installed(venv / "bin/python", "vla-rl", env) == "0.1.0"
    record = venv / ".vla_rl_torch"  # the torch bootstrap installed, which it may replace later
    assert not record.exists() if user_torch else record.read_text() == f"{PIN}+cpu\n"
    second = bootstrap(root, env, dry_run=False)
    assert second.returncode == 0, second.stderr
    assert second.stdout == ""


@pytest.mark.slow
def test_real_gpu_install_keeps_torch_2_11(tmp_path, bare_venv, wheels):
    """``pip install -e .`` of the real project over torch 2.11, resolved against the real indexes
    (this machine's pip settings): every dependency is found and torch is not among them."""
    venv = venv_with(tmp_path / "venv", bare_venv, wheels, ("torch", USER_TORCH))
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--dry-run", "--report",
                    str(tmp_path / "report.json"), "-e", f"{REPO}[test]"], check=True)
    plan = to_install(tmp_path / "report.json")
    assert "torch" not in plan and not any(name.startswith("nvidia-") for name in plan)
    assert {"vla-rl", "transformers", "accelerate", "peft", "pytest"} <= plan.keys()


@pytest.mark.slow
def test_real_bootstrap_keeps_torch_2_11(tmp_path, bare_venv, wheels):
    """scripts/bootstrap.sh's pip installs on the real project over torch 2.11 (dry runs, real
    indexes): torch stays, the rest comes at CI's versions."""
    root = checkout(tmp_path, offline=False)
    venv_with(root / ".venv", bare_venv, wheels, ("torch", USER_TORCH))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLA_RL_", "VIRTUAL_ENV"))}
    result = bootstrap(root, env)
    assert result.returncode == 0, result.stderr
    assert not (root / "reports/torch.json").exists()
    plan = to_install(root / "reports/project.json")
    assert "torch" not in plan and not any(name.startswith("nvidia-") for name in plan)
    pins = dict(line.split("==") for line in (REPO / "scripts/constraints-cpu.txt").read_text().splitlines()
                if "==" in line and not line.startswith("torch=="))
    assert {name: plan[name] for name in pins} == pins
