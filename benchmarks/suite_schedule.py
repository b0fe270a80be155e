"""How long ``scripts/gpu_check.sh``'s suite part takes under pytest-xdist's schedulers, simulated
from the tests' own durations: xdist's default ``load`` scheduling (the baseline), ``load`` with
``--maxschedchunk 1``, ``worksteal``, and ``load`` with ``--maxschedchunk 1`` over the tests ordered
longest with shortest by their recorded durations (``--order-by-durations``, tests/durations.py:
what the suite part uses).

The durations come from a JUnit XML (per test: setup, call and teardown). The tests run in
collection order, the order xdist hands them out: that of ``--collected``, a file of the node ids
``pytest --collect-only -q`` lists (a collected test the XML lacks counts as the XML's median),
else the XML's own order (a run one after another lists its tests in collection order; an xdist
run, in the order they ended)::

    VLA_RL_TEST_DEVICE=cpu python -m pytest -m 'not slow' --device-tests-only -p no:cacheprovider \\
        --junitxml=/tmp/device_tests.xml tests
    python benchmarks/suite_schedule.py /tmp/device_tests.xml --workers 8 --out benchmarks/suite_schedule.json

    # gpu_check's own suite.xml, in the collection order of this checkout
    python -m pytest --collect-only -q -p no:cacheprovider -m 'not slow' --device-tests-only tests \\
        | grep :: > /tmp/collected.txt
    python benchmarks/suite_schedule.py OUT/suite.xml --collected /tmp/collected.txt --out ...

The longest-with-shortest order comes from the recorded durations and is kept in the draws below
(as a durations file recorded once orders every later run).

The simulation drives xdist's own scheduler classes (``xdist.scheduler.LoadScheduling`` and
``WorkStealingScheduling``) with stand-in workers that behave as xdist's worker loop
(``xdist/remote.py``) does: a worker starts a test only once it also holds the next one (pytest
needs ``nextitem`` to tear down) or has been told to shut down, and a steal takes only tests the
worker has not yet taken from its queue, all of them or none. Not modelled: worker start-up and
collection, and contention between workers (each test takes its recorded time wherever and
beside whatever it runs; on the GPU host each of 8 workers has 2 of the 16 cores, about what one
test had when the durations were recorded on a 2-core machine).

Beside the recorded durations, ``--draws`` runs multiply each test's duration by an independent
log-normal factor (``--sigma``) and report each scheduler's median and 90th-percentile makespan and
the median of its paired ratio to the baseline's.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from xdist.scheduler import LoadScheduling, WorkStealingScheduling

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from durations import junit_durations, junit_key, longest_with_shortest  # noqa: E402

#: name -> (scheduler class, --maxschedchunk); the first is the baseline.
SCHEDULERS = {
    "load": (LoadScheduling, None),
    "load_maxschedchunk_1": (LoadScheduling, 1),
    "worksteal": (WorkStealingScheduling, None),
}
#: The rows of the table: name -> (scheduler, whether the tests run longest with shortest).
ROWS = {**{name: (name, False) for name in SCHEDULERS},
        "load_maxschedchunk_1_longest_with_shortest": ("load_maxschedchunk_1", True)}


def in_collection_order(recorded: dict[str, float], collected: list[str]) -> dict[str, float]:
    """``{junit key: seconds}`` of the ``collected`` node ids, in their order; a test ``recorded``
    lacks counts as its median."""
    median = statistics.median(recorded.values())
    return {junit_key(nodeid): recorded.get(junit_key(nodeid), median) for nodeid in collected}


def _quiet(*_message) -> None:
    """The schedulers' log (xdist prints it with ``--debug``): left out."""


_LOG = SimpleNamespace(loadsched=_quiet, workstealsched=_quiet)


class _Config:
    """What xdist's schedulers read of pytest's config: the workers (``--tx``) and ``--maxschedchunk``."""

    def __init__(self, workers: int, maxschedchunk: int | None):
        self._values = {"tx": [f"{workers}*popen"], "maxschedchunk": maxschedchunk}

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


def makespan(durations: list[float], workers: int, scheduler: str) -> float:
    """Seconds from the first test's start to the last test's end when ``workers`` xdist workers
    run tests of these ``durations`` (in collection order) under ``scheduler`` (:data:`SCHEDULERS`).

    Raises:
        RuntimeError: the simulation ended with a test not run, or run twice (a defect here).
    """
    kind, maxschedchunk = SCHEDULERS[scheduler]
    sched = kind(_Config(workers, maxschedchunk), log=_LOG)
    nodes = [_Worker(f"gw{i}") for i in range(workers)]
    collection = [str(i) for i in range(len(durations))]
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
                        help="node ids in collection order, one a line (pytest --collect-only -q); "
                             "default: the XML's order")
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
    if args.collected is not None:
        try:
            collected = [line.strip() for line in args.collected.read_text().splitlines() if "::" in line]
        except OSError as error:
            parser.error(f"--collected {args.collected}: {error}")
        if not collected:
            parser.error(f"--collected {args.collected}: no node id (path::name) in it")
        recorded = in_collection_order(recorded, collected)
    durations = list(recorded.values())
    order = longest_with_shortest(durations)
    rng = random.Random(args.seed)
    draws = [[d * rng.lognormvariate(0.0, args.sigma) for d in durations] for _ in range(args.draws)]

    def span(row: str, durations: list[float]) -> float:
        scheduler, ordered = ROWS[row]
        return makespan([durations[index] for index in order] if ordered else durations, args.workers, scheduler)

    baseline = next(iter(ROWS))
    per_draw = {name: [span(name, d) for d in draws] for name in ROWS}
    recorded_spans = {name: span(name, durations) for name in ROWS}
    rows = {}
    for name in ROWS:
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
