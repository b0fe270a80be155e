"""The suite's tests in an order that pytest-xdist shares out well, from durations recorded before
(``--order-by-durations JSON``, tests/conftest.py; scripts/gpu_check.sh's suite part uses
tests/device_test_durations.json).

xdist hands tests out in collection order, and a worker starts a test only once it also holds the
next one (pytest needs ``nextitem`` to tear down): a long test in collection order starts late,
and a long test sent right behind another waits for it. Under ``--dist load``,
:func:`longest_with_shortest` puts the longest test first, then the shortest, then the second
longest, then the second shortest, and so on. Under ``--dist loadgroup`` (gpu_check's, with
``--no-loadscope-reorder``), which sends the tests of one ``xdist_group`` to one worker as one
unit, :func:`loadgroup_order` orders the units for that scheduler's start. The tests marked so
share a module's expensive run fixture (tests/test_driver.py's SRPO run, tests/test_faults.py's
uninterrupted run, ...): on the H200 (2026-12-04, second run, ``load`` one test at a time) the
three tests of that SRPO run went to three workers and each made the run (67-90 s apiece).

Driven with that run's durations (338 tests of this checkout, 2,535 s with those repeated runs,
8 workers; benchmarks/suite_schedule.py, benchmarks/suite_schedule_h200.json), xdist 3.8's own
schedulers end in 317 s under ``load`` one at a time longest with shortest, 317 s under
``loadgroup`` in :func:`loadgroup_order` with each test alone, and between 284 s (each group's
repeated runs taken out, at most: ``--suite-log``) and 333 s (each group counting every repeated
run it recorded; the simulation does not model fixtures) with the groups. On pytest 9.2
xdist 3.8 does not group (:func:`xdist_groups_work`): the tests then go out alone, as fast as under
``load``. The plugins that sort slowest first (pytest-slowest-first, pytest-slow-first) read the
durations of this host's previous run (a new GPU node has none) and sort longest first only.

Refresh the recorded durations from a JUnit XML of the suite (gpu_check writes ``suite.xml``)::

    python tests/durations.py OUT/suite.xml "where and how it ran" > tests/device_test_durations.json
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest


def junit_key(nodeid: str) -> str:
    """A test's name as pytest's JUnit XML writes it, ``classname::name``: the node id's file as a
    dotted module path, then its classes, then the test's name with its parameters
    (``tests/a/test_b.py::TestC::test_d[x-1]`` gives ``tests.a.test_b.TestC::test_d[x-1]``;
    ``_pytest.junitxml.mangle_test_address``)."""
    path, bracket, parameters = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    return ".".join(names[:-1]) + "::" + names[-1] + bracket + parameters


def junit_durations(path: Path) -> dict[str, float]:
    """``{junit_key: seconds}`` of a JUnit XML, in its order (setup + call + teardown per test).

    Raises:
        OSError: the file cannot be read.
        xml.etree.ElementTree.ParseError: it is not XML.
    """
    durations = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        durations[f"{case.get('classname')}::{case.get('name')}"] = float(case.get("time"))
    return durations


def xdist_groups_work() -> bool:
    """Whether pytest-xdist's ``--dist loadgroup`` groups tests with this pytest: from pytest 9.2 on
    (node ids held in a structured form) pytest-xdist 3.8 marks a test's group on a node id field
    pytest no longer reads, and each test goes out alone (pytest-dev/pytest-xdist#1386, its fix
    #1388 not released as of 2026-12-04)."""
    return pytest.version_tuple[:2] < (9, 2)


def xdist_group(item) -> str | None:
    """The group pytest-xdist's ``--dist loadgroup`` sends to one worker with ``item``: its
    ``xdist_group`` marks' names, sorted and joined by ``_`` as xdist/remote.py joins them; None
    for a test without one."""
    names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
             for mark in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) if names else None


def loadgroup_order(durations: list[float], groups: list[str | None], workers: int) -> list[int]:
    """Indices of ``durations`` (seconds, in collection order) for ``workers`` pytest-xdist workers
    under ``--dist loadgroup --no-loadscope-reorder``, which sends the tests of one group
    (``groups``: each test's group, None for none) to one worker as one unit, hands each worker
    one unit and then a second at the start, and later one more whenever a worker is down to two
    tests (xdist/scheduler/loadscope.py). The units (a group as long as its tests together, in
    collection order where the first of them is; each other test alone) come as the ``workers``
    longest, then the ``workers`` shortest (each worker's first unit a long one, its second a
    short one), then the others by :func:`longest_with_shortest`."""
    units: dict[object, list[int]] = {}
    for index, group in enumerate(groups):
        units.setdefault(index if group is None else group, []).append(index)
    members = list(units.values())
    seconds = [sum(durations[index] for index in unit) for unit in members]
    by_length = sorted(range(len(members)), key=lambda unit: -seconds[unit])
    first, second = by_length[:workers], by_length[workers:][::-1][:workers]
    rest = by_length[workers:len(by_length) - len(second)]
    rest = [rest[position] for position in longest_with_shortest([seconds[unit] for unit in rest])]
    return [index for unit in first + second + rest for index in members[unit]]


def longest_with_shortest(durations: list[float]) -> list[int]:
    """Indices of ``durations`` (seconds, in collection order) in the order longest, shortest,
    second longest, second shortest, ...; ties keep collection order."""
    by_length = sorted(range(len(durations)), key=lambda index: -durations[index])
    order, first, last = [], 0, len(by_length) - 1
    while first <= last:
        order.append(by_length[first])
        if first < last:
            order.append(by_length[last])
        first, last = first + 1, last - 1
    return order


def load(path: Path) -> dict[str, float]:
    """The ``{junit_key: seconds}`` of a durations file (``{"seconds": {...}}``, written by this
    module's command line).

    Raises:
        pytest.UsageError: the file cannot be read or holds no durations (one line naming it).
    """
    try:
        seconds = json.loads(Path(path).read_text())["seconds"]
        if not seconds or not all(isinstance(value, (int, float)) for value in seconds.values()):
            raise ValueError("no {test: seconds} under 'seconds'")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise pytest.UsageError(f"--order-by-durations {path}: not a durations file ({error!r})") from None
    return {key: float(value) for key, value in seconds.items()}


class DurationOrder:
    """The plugin ``--order-by-durations`` registers: after the other plugins have chosen the run's
    tests (``-m``, ``-k``, ``--device-tests-only``), it orders them by :func:`longest_with_shortest`,
    or on a pytest-xdist worker of ``--dist loadgroup`` by :func:`loadgroup_order` (the tests of
    one ``xdist_group`` as one unit where xdist groups them, :func:`xdist_groups_work`); a test the
    file does not name counts as the recorded durations' median."""

    def __init__(self, path: Path):
        self.path = path
        self.seconds = load(path)
        self.recorded = 0
        self.total = 0

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items) -> None:
        default = statistics.median(self.seconds.values())
        # an xdist worker of --dist loadgroup (xdist/remote.py): where xdist groups, it has
        # appended "@group" to the node id of each test of an xdist_group already
        workers = getattr(config, "workerinput", {}).get("workercount")
        loadgroup = bool(getattr(config.option, "loadgroup", False)) and workers is not None
        groups = [xdist_group(item) if loadgroup and xdist_groups_work() else None for item in items]
        keys = [junit_key(item.nodeid.removesuffix(f"@{group}") if group else item.nodeid)
                for item, group in zip(items, groups)]
        self.recorded, self.total = sum(key in self.seconds for key in keys), len(items)
        seconds = [self.seconds.get(key, default) for key in keys]
        order = loadgroup_order(seconds, groups, workers) if loadgroup else longest_with_shortest(seconds)
        items[:] = [items[index] for index in order]

    def pytest_report_header(self) -> str:
        return f"test order: longest with shortest, by the {len(self.seconds)} durations of {self.path}"

    def pytest_report_collectionfinish(self) -> str | None:
        if not self.total:  # pytest-xdist's controller collects nothing: its workers order the tests
            return None
        return f"{self.recorded} of the {self.total} tests have a recorded duration (the others count as the median)"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print('usage: python tests/durations.py SUITE_XML "where and how it ran" > tests/device_test_durations.json',
              file=sys.stderr)
        return 2
    try:
        seconds = junit_durations(Path(argv[0]))
    except (OSError, ElementTree.ParseError) as error:
        print(f"{argv[0]}: not a readable JUnit XML ({error})", file=sys.stderr)
        return 2
    if not seconds:
        print(f"{argv[0]}: no <testcase> in it", file=sys.stderr)
        return 2
    print(json.dumps({"recorded": argv[1], "seconds": {key: round(value, 1) for key, value in seconds.items()}},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
