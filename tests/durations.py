"""The suite's tests in an order that pytest-xdist shares out well, from durations recorded before
(``--order-by-durations JSON``, tests/conftest.py; scripts/gpu_check.sh's suite part uses
tests/device_test_durations.json).

xdist hands tests out in collection order, and a worker starts a test only once it also holds the
next one (pytest needs ``nextitem`` to tear down): a long test in collection order starts late,
and a long test sent right behind another waits for it. :func:`longest_with_shortest` puts the
longest test first, then the shortest, then the second longest, then the second shortest, and so
on: the long tests start first, each followed by a short one. Fed the H200's device-test
durations (2026-12-04: the 337 tests of this checkout's collection, 2,312 s, 8 workers, one test
at a time), xdist's scheduler ends in 290 s in this order (the least possible: 289 s) against
317 s in collection order and 338 s longest first alone (benchmarks/suite_schedule.py,
benchmarks/suite_schedule_h200.json). The plugins that sort slowest first (pytest-slowest-first,
pytest-slow-first) read the durations of this host's previous run (a new GPU node has none)
and sort longest first only.

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
    tests (``-m``, ``-k``, ``--device-tests-only``), it orders them by :func:`longest_with_shortest`;
    a test the file does not name counts as the recorded durations' median."""

    def __init__(self, path: Path):
        self.path = path
        self.seconds = load(path)
        self.recorded = 0
        self.total = 0

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items) -> None:
        default = statistics.median(self.seconds.values())
        keys = [junit_key(item.nodeid) for item in items]
        self.recorded, self.total = sum(key in self.seconds for key in keys), len(items)
        order = longest_with_shortest([self.seconds.get(key, default) for key in keys])
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
