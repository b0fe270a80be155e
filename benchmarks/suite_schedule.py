"""How long ``scripts/gpu_check.sh``'s suite part takes under pytest-xdist's schedulers, simulated
from the tests' own durations: xdist's default ``load`` scheduling (the baseline), ``load`` with
``--maxschedchunk 1``, ``worksteal``, ``load`` with ``--maxschedchunk 1`` over the tests ordered
longest with shortest by their recorded durations (the suite part's options until 2026-12-04),
and ``loadgroup`` with ``--no-loadscope-reorder`` in tests/durations.py's ``loadgroup_order``, the
tests of one ``xdist_group`` sent to one worker together (what the suite part uses), and the same
with each test alone (what xdist 3.8 does on pytest 9.2, pytest-dev/pytest-xdist#1386).

The durations come from a JUnit XML (per test: setup, call and teardown). The tests run in
collection order, the order xdist hands them out: that of ``--collect`` (this checkout's device
tests, collected here with the suite part's options, and their groups), or of ``--collected``, a
file of the node ids ``pytest --collect-only -q`` lists (a line may end in ``@group``; a collected
test the XML lacks counts as the XML's median), else the XML's own order (a run one after another
lists its tests in collection order; an xdist run, in the order they ended)::

    VLA_RL_TEST_DEVICE=cpu python -m pytest -m 'not slow' --device-tests-only -p no:cacheprovider \\
        --junitxml=/tmp/device_tests.xml tests
    python benchmarks/suite_schedule.py /tmp/device_tests.xml --workers 8 --out benchmarks/suite_schedule.json

    # gpu_check's own suite.xml, over this checkout's device tests and groups, with the bound
    # --suite-log gives (without_repeated_runs)
    python benchmarks/suite_schedule.py OUT/suite.xml --collect --suite-log OUT/logs/suite.log \\
        --out benchmarks/suite_schedule_h200.json

The orders come from the recorded durations and are kept in the draws below (as a durations file
recorded once orders every later run).

The simulation drives xdist's own scheduler classes (``xdist.scheduler.LoadScheduling``,
``WorkStealingScheduling`` and ``LoadGroupScheduling``) with stand-in workers that behave as
xdist's worker loop (``xdist/remote.py``) does: a worker starts a test only once it also holds the
next one (pytest needs ``nextitem`` to tear down) or has been told to shut down, and a steal takes
only tests the worker has not yet taken from its queue, all of them or none. Not modelled: worker
start-up and collection, fixtures (a test takes its recorded time, set-ups included: the fixture a
group shares counts as often as the recorded run made it, so the grouped row is an upper bound),
and contention between workers (each test takes its recorded time wherever and beside whatever it
runs; on the GPU host each of 8 workers has 2 of the 16 cores, about what one test had when the
durations were recorded on a 2-core machine).

Beside the recorded durations, ``--draws`` runs multiply each test's duration by an independent
log-normal factor (``--sigma``) and report each scheduler's median and 90th-percentile makespan and
the median of its paired ratio to the baseline's.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import re
import statistics
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from xdist.scheduler import LoadGroupScheduling, LoadScheduling, WorkStealingScheduling

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from durations import junit_durations, junit_key, loadgroup_order, longest_with_shortest, xdist_group  # noqa: E402

#: name -> (scheduler class, --maxschedchunk); the first is the baseline. ``loadgroup`` runs with
#: ``--no-loadscope-reorder`` (its work units in collection order, as gpu_check runs it).
SCHEDULERS = {
    "load": (LoadScheduling, None),
    "load_maxschedchunk_1": (LoadScheduling, 1),
    "worksteal": (WorkStealingScheduling, None),
    "loadgroup": (LoadGroupScheduling, None),
}
#: The rows of the table: name -> (scheduler, whether the tests run in tests/durations.py's order for
#: that scheduler, whether xdist groups them by their ``xdist_group``: on pytest 9.2 with xdist 3.8
#: it does not, pytest-dev/pytest-xdist#1386).
ROWS = {"load": ("load", False, False),
        "load_maxschedchunk_1": ("load_maxschedchunk_1", False, False),
        "worksteal": ("worksteal", False, False),
        "load_maxschedchunk_1_longest_with_shortest": ("load_maxschedchunk_1", True, False),
        "loadgroup_in_loadgroup_order": ("loadgroup", True, True),
        "loadgroup_in_loadgroup_order_ungrouped": ("loadgroup", True, False)}
#: With ``--suite-log``: the grouped row over :func:`without_repeated_runs`' durations (a lower bound).
REPEATS_REMOVED = "loadgroup_in_loadgroup_order_repeats_removed"


def split_group(nodeid: str) -> tuple[str, str | None]:
    """A listed node id and its ``xdist_group`` (``path::test@group``, as xdist's loadgroup names
    its tests; None without one)."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        nodeid, group = nodeid.rsplit("@", 1)
        return nodeid, group
    return nodeid, None


def in_collection_order(recorded: dict[str, float], collected: list[str]) -> tuple[dict[str, float], list[str | None]]:
    """``{junit key: seconds}`` of the ``collected`` node ids, in their order, and each one's
    ``xdist_group`` (:func:`split_group`); a test ``recorded`` lacks counts as its median."""
    median = statistics.median(recorded.values())
    keys, groups = {}, []
    for nodeid, group in map(split_group, collected):
        keys[junit_key(nodeid)] = recorded.get(junit_key(nodeid), median)
        groups.append(group)
    return keys, groups


def without_repeated_runs(durations: list[float], nodeids: list[str], groups: list[str | None],
                          log: str) -> list[float]:
    """``durations`` with each group's repeated set-ups taken out, at most: in a pytest-xdist run's
    ``-v`` log (``[gwN] [ p%] PASSED node id`` lines), the first test of a group on each worker
    made the module's shared run, so a group first seen on k workers made it k times; the group's
    tests lose k - 1 times the shortest of those first tests (in proportion to their durations),
    which is at least the set-up. The grouped time so given is a lower bound; the durations as
    recorded, an upper one."""
    order = [(match.group(1), split_group(match.group(2))[0]) for match in
             re.finditer(r"^\[(gw\d+)\] \[\s*\d+%\] (?:PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (\S+)", log, re.M)]
    members: dict[str, dict[str, int]] = {}
    for index, group in enumerate(groups):
        if group is not None:
            members.setdefault(group, {})[nodeids[index]] = index
    lowered = list(durations)
    for group, indices in members.items():
        firsts: dict[str, int] = {}
        for worker, nodeid in order:
            if nodeid in indices:
                firsts.setdefault(worker, indices[nodeid])
        total = sum(durations[index] for index in indices.values())
        if len(firsts) < 2 or total <= 0:
            continue
        kept = (total - (len(firsts) - 1) * min(durations[index] for index in firsts.values())) / total
        for index in indices.values():
            lowered[index] = durations[index] * kept
    return lowered


def suite_part_options() -> list[str]:
    """The pytest options of scripts/gpu_check.py's suite part (its ``build_parts``) that choose
    and collect its tests: its selection, paths and the rest, without ``-v``,
    ``--continue-on-collection-errors`` (a collection error fails the listing) and ``--junitxml``;
    serial (no xdist options)."""
    import importlib.util
    import tempfile

    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("_gpu_check_parts", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        parts = module.build_parts(Path(tempfile.gettempdir()), gpus=1, workers_xdist=1)
    finally:
        del sys.modules[spec.name]
    command = next(part.command for part in parts if part.name == "suite")
    return [word for word in command[command.index("pytest") + 1:]
            if word not in ("-v", "--continue-on-collection-errors") and not word.startswith("--junitxml")]


def collect_device_tests(options: Sequence[str] | None = None, quiet: bool = True) -> list[str]:
    """The node ids gpu_check's suite part selects in this checkout, in collection order, each with
    ``@group`` when it has an ``xdist_group`` mark. ``options``: pytest's options and paths
    (default :func:`suite_part_options`, the suite part's own; relative paths are the checkout's);
    ``quiet``: pytest's output left out.

    Raises RuntimeError when pytest's collection fails (exit status other than 0)."""
    import contextlib
    import io
    import os

    import pytest

    class Listing:
        def __init__(self) -> None:
            self.ids: list[str] = []

        def pytest_collection_finish(self, session) -> None:
            self.ids = [item.nodeid + (f"@{group}" if (group := xdist_group(item)) else "") for item in session.items]

    root = Path(__file__).resolve().parents[1]
    # the project's packages as `python -m pytest` in the checkout finds them (a script's path
    # starts with its own folder, and tests/policies/ would pass for the policies package)
    sys.path.insert(0, str(root))
    options = suite_part_options() if options is None else list(options)
    listing = Listing()
    here = os.getcwd()
    os.chdir(root)  # the node ids relative to the checkout, wherever the script is run from
    try:
        with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
            code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *options], plugins=[listing])
    finally:
        os.chdir(here)
    if code != 0:
        raise RuntimeError(f"collecting the device tests failed (pytest exit status {code}): run "
                           f"pytest --collect-only {' '.join(options)} to see why")
    return listing.ids


def _quiet(*_message) -> None:
    """The schedulers' log (xdist prints it with ``--debug``): left out."""


_LOG = SimpleNamespace(loadsched=_quiet, workstealsched=_quiet, loadscopesched=_quiet, loadgroupsched=_quiet)


class _Config:
    """What xdist's schedulers read of pytest's config: the workers (``--tx``), ``--maxschedchunk``
    and ``--no-loadscope-reorder``."""

    def __init__(self, workers: int, maxschedchunk: int | None):
        self._values = {"tx": [f"{workers}*popen"], "maxschedchunk": maxschedchunk}
        self.option = SimpleNamespace(loadscopereorder=False)

    def getvalue(self, name: str):
        return self._values[name]

    getoption = getvalue


@dataclass(eq=False)
class _Worker:
    """A stand-in for xdist's ``WorkerController`` and the worker loop behind it."""

    name: str
    queue: list[int] = field(default_factory=list)  # sent, not yet taken by the worker loop
    held: int | None = None  # taken: the test to run next
    running: int | None = None
    shutting_down: bool = False
    steals: list[list[int]] = field(default_factory=list)  # steal requests, answered after the scheduler's call

    @property
    def gateway(self) -> SimpleNamespace:  # named in xdist's check that the workers collected the same tests
        return SimpleNamespace(id=self.name)

    def send_runtest_some(self, indices) -> None:
        self.queue.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True

    def send_steal(self, indices) -> None:
        self.steals.append(list(indices))


def makespan(durations: list[float], workers: int, scheduler: str, groups: list[str | None] | None = None) -> float:
    """Seconds from the first test's start to the last test's end when ``workers`` xdist workers
    run tests of these ``durations`` (in collection order) under ``scheduler`` (:data:`SCHEDULERS`);
    ``groups``: each test's ``xdist_group`` or None (``loadgroup`` sends a group's tests to one
    worker together; the other schedulers ignore them).

    Raises:
        RuntimeError: the simulation ended with a test not run, or run twice (a defect here).
    """
    kind, maxschedchunk = SCHEDULERS[scheduler]
    sched = kind(_Config(workers, maxschedchunk), log=_LOG)
    nodes = [_Worker(f"gw{i}") for i in range(workers)]
    groups = groups or [None] * len(durations)
    collection = [f"{i}@{group}" if group else str(i) for i, group in enumerate(groups)]
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        sched.add_node_collection(node, collection)
    sched.schedule()
    events: list[tuple[float, int, _Worker]] = []
    counter, ran, now = 0, [], 0.0

    def answer_steals() -> None:
        for node in nodes:
            while node.steals:
                wanted = node.steals.pop(0)
                stolen = wanted if set(wanted) <= set(node.queue) else []
                node.queue[:] = [index for index in node.queue if index not in stolen]
                sched.remove_pending_tests_from_node(node, stolen)

    def start_what_can_start() -> None:
        nonlocal counter
        for node in nodes:
            if node.running is not None:
                continue
            if node.held is None and node.queue:
                node.held = node.queue.pop(0)
            if node.held is not None and (node.queue or node.shutting_down):
                node.running, node.held = node.held, (node.queue.pop(0) if node.queue else None)
                counter += 1
                heapq.heappush(events, (now + durations[node.running], counter, node))

    answer_steals()
    start_what_can_start()
    while events:
        now, _, node = heapq.heappop(events)
        index, node.running = node.running, None
        ran.append(index)
        sched.mark_test_complete(node, index, durations[index])
        answer_steals()
        start_what_can_start()
    if sorted(ran) != list(range(len(durations))):
        raise RuntimeError(f"{scheduler}: {len(set(ran))} of {len(durations)} tests ran ({len(ran)} runs)")
    return now


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", type=Path, help="JUnit XML of the tests' durations")
    parser.add_argument("--collected", type=Path, default=None,
                        help="node ids in collection order, one a line (pytest --collect-only -q; a line may end in "
                             "@group, as xdist's loadgroup names a test of an xdist_group); default: the XML's order")
    parser.add_argument("--collect", action="store_true",
                        help="collect gpu_check's device tests of this checkout with its suite part's options, and their "
                             "xdist groups, in place of --collected")
    parser.add_argument("--suite-log", type=Path, default=None,
                        help="the -v log of the xdist run that recorded the XML (gpu_check: logs/suite.log): adds a "
                             "row with each group's repeated set-ups taken out, at most (a lower bound)")
    parser.add_argument("--workers", type=int, default=8, help="xdist workers (gpu_check: half the cores, at most 8)")
    parser.add_argument("--draws", type=int, default=200, help="runs with perturbed durations")
    parser.add_argument("--sigma", type=float, default=0.3, help="log-normal sigma of each duration's factor")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="JSON record")
    args = parser.parse_args(argv)
    try:
        recorded = junit_durations(args.junit)
    except (OSError, ElementTree.ParseError) as error:
        parser.error(f"{args.junit}: not a readable JUnit XML ({error})")
    if not recorded:
        parser.error(f"{args.junit}: no <testcase> in it")
    listed: list[str] = []
    if args.collect:
        listed = collect_device_tests()
    elif args.collected is not None:
        try:
            listed = [line.strip() for line in args.collected.read_text().splitlines() if "::" in line]
        except OSError as error:
            parser.error(f"--collected {args.collected}: {error}")
        if not listed:
            parser.error(f"--collected {args.collected}: no node id (path::name) in it")
    if args.suite_log is not None and not listed:
        parser.error("--suite-log needs the tests' groups: give --collect or --collected too")
    groups: list[str | None] = [None] * len(recorded)
    if listed:
        recorded, groups = in_collection_order(recorded, listed)
    durations = list(recorded.values())
    ungrouped: list[str | None] = [None] * len(durations)
    rows_run = dict(ROWS)
    kept = [1.0] * len(durations)  # per test: the share of its duration the rows over lowered durations keep
    if args.suite_log is not None:
        try:
            log = args.suite_log.read_text(errors="replace")
        except OSError as error:
            parser.error(f"--suite-log {args.suite_log}: {error}")
        lowered = without_repeated_runs(durations, [split_group(nodeid)[0] for nodeid in listed], groups, log)
        kept = [low / full if full > 0 else 1.0 for low, full in zip(lowered, durations)]
        rows_run[REPEATS_REMOVED] = ("loadgroup", True, True)
    orders = {("load_maxschedchunk_1", False): longest_with_shortest(durations),
              ("loadgroup", True): loadgroup_order(durations, groups, args.workers),
              ("loadgroup", False): loadgroup_order(durations, ungrouped, args.workers),
              REPEATS_REMOVED: loadgroup_order([d * k for d, k in zip(durations, kept)], groups, args.workers)}
    rng = random.Random(args.seed)
    draws = [[d * rng.lognormvariate(0.0, args.sigma) for d in durations] for _ in range(args.draws)]

    def span(row: str, durations: list[float]) -> float:
        scheduler, ordered, grouped = rows_run[row]
        if row == REPEATS_REMOVED:
            durations, order = [d * k for d, k in zip(durations, kept)], orders[row]
        else:  # as tests/durations.py orders them for the scheduler
            order = orders[scheduler, grouped] if ordered else range(len(durations))
        return makespan([durations[index] for index in order], args.workers, scheduler,
                        [(groups if grouped else ungrouped)[index] for index in order])

    baseline = next(iter(rows_run))
    per_draw = {name: [span(name, d) for d in draws] for name in rows_run}
    recorded_spans = {name: span(name, durations) for name in rows_run}
    rows = {}
    for name in rows_run:
        spans = sorted(per_draw[name])
        rows[name] = {
            "makespan_s": recorded_spans[name],
            "speedup_over_load": recorded_spans[baseline] / recorded_spans[name],
            "draws_median_s": statistics.median(spans) if spans else None,
            "draws_p90_s": spans[int(0.9 * (len(spans) - 1))] if spans else None,
            "draws_median_speedup_over_load": statistics.median(
                b / s for b, s in zip(per_draw[baseline], per_draw[name])) if draws else None,
        }
    result = {
        "settings": {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()},
        "tests": len(durations),
        "serial_s": sum(durations),
        "longest_test_s": max(durations),
        "longest_tests": sorted(recorded.items(), key=lambda item: -item[1])[:5],
        "lower_bound_s": max(sum(durations) / args.workers, max(durations)),
        "schedulers": rows,
    }
    print(f"{len(durations)} tests, {sum(durations):.0f} s one after another, longest {max(durations):.0f} s; "
          f"{args.workers} workers, lower bound {result['lower_bound_s']:.0f} s")
    print("\n| scheduler | makespan (s) | speed-up over load | draws: median (s) | draws: p90 (s) | "
          "draws: median speed-up over load |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, row in rows.items():
        drawn = [(row["draws_median_s"], ".0f"), (row["draws_p90_s"], ".0f"),
                 (row["draws_median_speedup_over_load"], ".2f")]
        cells = ["-" if value is None else format(value, spec) for value, spec in drawn]
        print(f"| {name} | {row['makespan_s']:.0f} | {row['speedup_over_load']:.2f} | {' | '.join(cells)} |")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
