"""The suite's three runs (README, "Set-up"): the default one, ``-m e2e`` (runs on Ray or
training runs through the command line) and ``-m slow`` hold each test exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from child_env import child_env
from conftest import mark_end_to_end, pytest_collection_finish, pytest_collection_modifyitems, pytest_terminal_summary

ROOT = Path(__file__).resolve().parents[1]

PROBE = textwrap.dedent("""
    import json, os

    def pytest_collection_finish(session):
        marks = {item.nodeid: sorted({m.name for m in item.iter_markers()} & {"e2e", "slow"}) for item in session.items}
        with open(os.environ["TIERS_PROBE_OUT"], "w") as f:
            json.dump(marks, f)
""")


def test_each_test_is_in_one_run(tmp_path):
    """Collected with every mark (``-m ''``): a test taking the Ray fixture is e2e unless slow, a
    module marked e2e is, a unit test is neither, and no test is both."""
    (tmp_path / "tiers_probe.py").write_text(PROBE)
    files = ["tests/trainers/test_actor.py", "tests/test_templates.py", "tests/test_cluster.py",
             "tests/test_vla_templates.py"]
    out = tmp_path / "marks.json"
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "", "-p", "tiers_probe",
                             *files], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env=child_env(tmp_path, TIERS_PROBE_OUT=str(out)))
    assert listed.returncode == 0, listed.stdout + listed.stderr
    marks = json.loads(out.read_text())

    def tiers(file: str) -> set[tuple[str, ...]]:
        found = {tuple(m) for nodeid, m in marks.items() if nodeid.startswith(file + "::")}
        assert found, file
        return found

    assert tiers("tests/trainers/test_actor.py") == {()}
    assert tiers("tests/test_templates.py") == {("e2e",)}  # the ray_on_loopback fixture
    assert tiers("tests/test_cluster.py") == {("e2e",)}  # the module's mark
    assert tiers("tests/test_vla_templates.py") == {("e2e",), ("slow",)}  # a slow test is not e2e too


class _Item:
    def __init__(self, nodeid: str, fixtures: tuple[str, ...], marks: tuple[str, ...] = ()):
        self.nodeid, self.fixturenames, self.marks = nodeid, fixtures, list(marks)

    def iter_markers(self):
        return iter([getattr(pytest.mark, name).mark for name in self.marks])

    def add_marker(self, marker):
        self.marks.append(marker.name)

    def get_closest_marker(self, name: str):
        return getattr(pytest.mark, name).mark if name in self.marks else None


def test_engine_fixtures_mark_e2e_and_a_test_marked_slow_and_e2e_is_refused():
    engine, unit = _Item("a", ("ray_on_loopback",)), _Item("b", ("device",))
    slow = _Item("c", ("evaluated_lift_run",), ("slow",))
    mark_end_to_end([engine, unit, slow])
    assert (engine.marks, unit.marks, slow.marks) == (["e2e"], [], ["slow"])
    with pytest.raises(pytest.UsageError, match="tests/x.py::t is marked both slow and e2e"):
        mark_end_to_end([_Item("tests/x.py::t", (), ("slow", "e2e"))])


def test_a_run_that_leaves_out_end_to_end_tests_says_how_to_run_them():
    items = [_Item("a", ("ray_on_loopback",)), _Item("b", ("ray_on_loopback",)), _Item("c", ())]
    config = SimpleNamespace(stash=pytest.Stash(), getoption=lambda name: False,
                             option=SimpleNamespace(markexpr="not slow and not e2e"))
    pytest_collection_modifyitems(config, items)
    lines: list[str] = []
    reporter = SimpleNamespace(write_line=lines.append)
    pytest_collection_finish(SimpleNamespace(items=[items[1], items[2]], config=config))  # "a" deselected
    pytest_terminal_summary(reporter, config)
    assert lines == ["1 end-to-end tests not run (marked e2e): add -m e2e, or -m 'not slow' for every test but the "
                     "slow ones"]
    pytest_collection_finish(SimpleNamespace(items=items, config=config))  # every one selected: nothing said
    pytest_terminal_summary(reporter, config)
    assert len(lines) == 1
    config.option.markexpr = "e2e"  # -m e2e -k ...: left out by -k, nothing to add
    pytest_collection_finish(SimpleNamespace(items=[items[1]], config=config))
    pytest_terminal_summary(reporter, config)
    assert len(lines) == 1
