"""Child processes of the tests keep the caller's ``PYTHONPATH`` (tests/child_env.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from child_env import child_env, python_path

TESTS = Path(__file__).resolve().parent

#: Tests that give a child a ``PYTHONPATH`` of its own on purpose: the import floors lint a copy of
#: the project (not the installed one), the install tests build a stand-in system site.
OWN_PYTHONPATH = {"test_import_floors.py", "test_install.py"}


def test_directories_go_ahead_of_the_callers_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/kit/site", "/kit/project"]))
    assert python_path("/docs", Path("/repo")) == os.pathsep.join(["/docs", "/repo", "/kit/site", "/kit/project"])
    env = child_env("/docs", HOME="/home/x")
    assert env["PYTHONPATH"].split(os.pathsep)[-2:] == ["/kit/site", "/kit/project"] and env["HOME"] == "/home/x"
    monkeypatch.delenv("PYTHONPATH")
    assert python_path("/docs") == "/docs"


def test_no_test_replaces_the_pythonpath_of_its_children():
    """An offline GPU host's kit reaches Ray, robosuite and MuJoCo through ``PYTHONPATH`` only: a
    child given a path of its own (``{**os.environ, "PYTHONPATH": ...}``) cannot import them."""
    pattern = re.compile(r"""["']PYTHONPATH["']\s*:""")
    offenders = [f"{path.relative_to(TESTS)}:{number}" for path in sorted(TESTS.rglob("*.py"))
                 if path.name not in OWN_PYTHONPATH | {"child_env.py", Path(__file__).name}
                 for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not offenders, f"use child_env.child_env: {offenders}"
