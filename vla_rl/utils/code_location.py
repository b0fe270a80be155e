"""Which code a run runs: the location and version of the ``vla_rl`` package, and the checks that
the driver and its Ray workers import the same one.

Ray 2.60 puts the driver's working directory first on every worker's ``sys.path`` (before any
``PYTHONPATH`` or job setting), so a driver installed from one checkout and launched from the
directory of another would run the other checkout's code on its workers. The driver refuses to
start from such a directory (:func:`check_launch_directory`), and every worker checks that it
imported the driver's code (:func:`check_same_code`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import vla_rl
from vla_rl.errors import RunStopped

PACKAGES = ("vla_rl", "simulators", "policies")
"""The top-level packages of the project (they live side by side)."""


def code_root() -> Path:
    """The directory holding this process's ``vla_rl`` package (and ``simulators``, ``policies``)."""
    return Path(vla_rl.__file__).resolve().parent.parent


def code_version() -> str:
    """``vla-rl <version>``, with the git commit (and ``+dirty``) when the code is a git checkout."""
    version = f"vla-rl {vla_rl.__version__}"
    try:
        commit = subprocess.run(["git", "-C", str(code_root()), "describe", "--always", "--dirty=+dirty"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return version
    return f"{version} ({commit.stdout.strip()})" if commit.returncode == 0 and commit.stdout.strip() else version


def check_launch_directory(directory: Path | None = None) -> None:
    """Refuse to start Ray from a directory holding another copy of the project's packages.

    Raises:
        RunStopped: ``directory`` (default: the working directory) holds a ``vla_rl``,
            ``simulators`` or ``policies`` package that is not this process's.
    """
    directory = (directory or Path.cwd()).resolve()
    if directory == code_root():
        return
    for package in PACKAGES:
        if (directory / package / "__init__.py").is_file():
            raise RunStopped(f"{directory} holds another copy of the {package!r} package, which Ray's workers would "
                             f"import instead of this driver's code ({code_root()}): launch from another directory, "
                             f"or run that checkout's own vla-rl")


def check_same_code(driver_root: str) -> None:
    """Check, on a worker, that it imported the driver's code.

    Raises:
        RunStopped: naming both locations.
    """
    mine = code_root()
    if mine != Path(driver_root):
        raise RunStopped(f"a worker imported vla_rl from {mine}, the driver from {driver_root} "
                         f"(worker sys.path starts with {sys.path[:3]}): launch the driver from a directory without "
                         "another copy of the code, and on a cluster install the driver's code at the same path on "
                         "every node")
