"""The environment of a test's child Python process: this process's, with directories put ahead
on ``PYTHONPATH`` and the caller's ``PYTHONPATH`` kept behind them. An offline GPU host's kit
(``../shared/gpu``'s ``gpukit-env.sh``) reaches Ray, robosuite and MuJoCo only through
``PYTHONPATH``, so a child given a ``PYTHONPATH`` of its own could not import them (two cluster
tests failed so on the GPU run of 2026-11-27)."""

from __future__ import annotations

import os
from pathlib import Path


def python_path(*directories: str | Path) -> str:
    """``directories``, then the caller's ``PYTHONPATH`` entries, joined with ``os.pathsep``."""
    return os.pathsep.join(filter(None, [*map(str, directories), os.environ.get("PYTHONPATH")]))


def child_env(*directories: str | Path, **variables: str) -> dict[str, str]:
    """``os.environ`` with ``PYTHONPATH`` = :func:`python_path` of ``directories``, and ``variables``."""
    return {**os.environ, "PYTHONPATH": python_path(*directories), **variables}
