"""The import floors of pyproject.toml ([tool.importlinter]): `lint-imports` keeps them on the
project, and breaks them on a copy with an upward import planted (eager or inside a function)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("vla_rl", "policies", "simulators", "vla_rl_core")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
HOUSE = "The house: the engine stands on policies and simulators, which stand on the ground floor"
ENGINE = "Inside the engine: entry points, drivers, the step, nodes, kits, services, libraries"


def _verdicts(stdout: str) -> str:
    return " ".join(stdout.split())  # lint-imports wraps long contract names


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}  # the copy's packages, not the installed ones
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_project_keeps_its_floors():
    result = _lint(REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{HOUSE} KEPT" in _verdicts(result.stdout) and f"{ENGINE} KEPT" in _verdicts(result.stdout)
    assert "2 kept, 0 broken" in result.stdout


@pytest.fixture(scope="module")
def copy_of_the_project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("house")
    shutil.copy(REPO_ROOT / "pyproject.toml", root)
    for package in PACKAGES:
        shutil.copytree(REPO_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.mark.parametrize(("module", "line", "contract"), [
    # a policy importing the engine: the whole-house floors
    ("policies/base.py", "from vla_rl.data import reshard\n", HOUSE),
    # the ground floor importing a family above it, inside a function (lazy imports count)
    ("vla_rl_core/keys.py", "def late():\n    import simulators.pool\n", HOUSE),
    # a library of the engine importing a node function: the engine's own floors
    ("vla_rl/trainers/actor.py", "def late():\n    from vla_rl.nodes import advantage\n", ENGINE),
    # the worker services importing the workflow kits they run
    ("vla_rl/workers/resources.py", "import vla_rl.workflows.embodied\n", ENGINE),
])
def test_an_upward_import_breaks_a_floor(copy_of_the_project, module, line, contract):
    path = copy_of_the_project / module
    original = path.read_text()
    path.write_text(original + "\n\n" + line)
    try:
        result = _lint(copy_of_the_project)
    finally:
        path.write_text(original)
    assert result.returncode != 0
    assert f"{contract} BROKEN" in _verdicts(result.stdout), result.stdout
    assert "1 kept, 1 broken" in result.stdout


@pytest.fixture(scope="module")
def import_graph():
    """scripts/import_graph.py as a module."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    try:
        import import_graph
    finally:
        sys.path.remove(str(REPO_ROOT / "scripts"))
    return import_graph


def test_the_drawing_of_the_imports_is_up_to_date(import_graph):
    assert import_graph.main(["--check"]) == 0, "docs/imports.md is stale: run python scripts/import_graph.py"
    assert "No arrow runs up; no import loop" in (REPO_ROOT / "docs" / "imports.md").read_text()


def test_the_drawing_finds_a_loop_between_modules(import_graph):
    class Graph:  # a -> b -> c -> a, and d -> a outside the loop
        edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
        modules = set(edges)

        def find_modules_directly_imported_by(self, module):
            return self.edges[module]

    assert import_graph._module_loops(Graph()) == [["a", "b", "c"]]
