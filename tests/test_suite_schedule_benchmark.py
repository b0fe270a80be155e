"""benchmarks/suite_schedule.py: pytest-xdist's own schedulers, driven by stand-in workers, give
the makespans traced by hand below, run every test once, and the benchmark writes its table and
JSON from a JUnit XML."""

from __future__ import annotations

import subprocess
import sys

import pytest
from benchmark_runs import REPO_ROOT, run_benchmark

sys.path.insert(0, str(REPO_ROOT))

from benchmarks.suite_schedule import (  # noqa: E402
    ROWS,
    SCHEDULERS,
    loadgroup_order,
    longest_with_shortest,
    makespan,
    without_repeated_runs,
)

#: 2 workers; 8 tests of 10 s first, then 56 of 1 s (136 s of work, at best 68 s each).
LONG_FIRST = [10.0] * 8 + [1.0] * 56


def test_load_scheduling_hands_out_chunks_that_keep_the_long_tests_on_one_worker():
    """xdist's ``load`` first sends each worker a quarter of its share (64 // 2 // 4 = 8 tests):
    worker 0 gets the eight 10 s tests, and a worker busy with long tests is sent nothing more
    until it is down to one pending test. Worker 1 runs all 56 short tests by 56 s; worker 0
    ends its eight long ones at 80 s."""
    assert makespan(LONG_FIRST, 2, "load") == 80.0


def test_one_test_at_a_time_shares_the_long_tests():
    """``--maxschedchunk 1``: 2 tests per worker at first (xdist's least), then one each time a
    test ends. The long tests alternate between the workers (4 each: 40 s), then the 56 short
    ones split evenly (28 s each): 68 s, the lower bound."""
    assert makespan(LONG_FIRST, 2, "load_maxschedchunk_1") == 68.0


def test_work_stealing_takes_the_queue_tails():
    """``worksteal``: 32 tests per worker at first (worker 0: 104 s of work, worker 1: 32 s).
    Worker 1, idle at 31 s, steals 14 of worker 0's last short tests (ends them at 46 s), then 7
    (11..17, ends 53 s), then 3 (8..10, 56 s), then long test 7 (56..66 s); worker 0 runs long
    tests 0..6 until 70 s."""
    assert makespan(LONG_FIRST, 2, "worksteal") == 70.0


def test_longest_with_shortest_starts_the_long_tests_first_each_with_a_short_one_behind_it():
    """Two workers, one test at a time, [1, 1, 6, 6] (14 s of work, at best 7 s each). In
    collection order worker 0 is sent the two 1 s tests and worker 1 the two 6 s tests: 12 s.
    Longest first, [6, 6, 1, 1]: the same split, 12 s. Longest with shortest, [6, 1, 6, 1]:
    each worker gets a 6 s and a 1 s test: 7 s."""
    durations = [1.0, 1.0, 6.0, 6.0]
    assert makespan(durations, 2, "load_maxschedchunk_1") == 12.0
    assert makespan(sorted(durations, reverse=True), 2, "load_maxschedchunk_1") == 12.0
    assert makespan([durations[i] for i in longest_with_shortest(durations)], 2, "load_maxschedchunk_1") == 7.0


def test_loadgroup_sends_a_groups_tests_to_one_worker_together():
    """``loadgroup``, two workers, [3, 5, 3, 1] with tests 0 and 2 in one group. In
    tests/durations.py's order, [0, 2, 1, 3], worker 0 is sent the group (0 and 2: 6 s) and worker
    1 test 1 (5 s); worker 0, down to two tests, is sent test 3 too: 7 s. Without the group (each
    test alone, as on pytest 9.2), [1, 0, 3, 2]: 5 + 1 s and 3 + 3 s, 6 s."""
    durations, groups = [3.0, 5.0, 3.0, 1.0], ["g", None, "g", None]
    order = loadgroup_order(durations, groups, workers=2)
    assert order == [0, 2, 1, 3]
    assert makespan([durations[i] for i in order], 2, "loadgroup", [groups[i] for i in order]) == 7.0
    order = loadgroup_order(durations, [None] * 4, workers=2)
    assert order == [1, 0, 3, 2] and makespan([durations[i] for i in order], 2, "loadgroup") == 6.0


def test_a_groups_repeated_runs_come_out_at_most():
    """Group g's tests a and b were the first of g on workers gw0 and gw1 (10 s and 12 s): g's run
    was made twice, and g loses the shorter first test's 10 s, at most the set-up, in proportion
    (22 s become 12 s). Group h ran on one worker only and keeps its time; so do tests of no group."""
    nodeids = ["t.py::a", "t.py::b", "t.py::c", "t.py::d", "t.py::e"]
    groups = ["g", "g", None, "h", "h"]
    log = ("[gw0] [ 20%] PASSED t.py::a@g \nnoise [gw1] [ 40%] PASSED t.py::c\n[gw1] [ 60%] PASSED t.py::b@g \n"
           "[gw0] [ 80%] PASSED t.py::d@h \n[gw0] [100%] FAILED t.py::e@h \n")
    lowered = without_repeated_runs([10.0, 12.0, 3.0, 4.0, 5.0], nodeids, groups, log)
    assert lowered == pytest.approx([10 * 12 / 22, 12 * 12 / 22, 3.0, 4.0, 5.0])


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_one_worker_runs_everything_in_turn_and_few_tests_run_at_once(scheduler):
    assert makespan(LONG_FIRST, 1, scheduler) == 136.0
    assert makespan([3.0, 1.0, 2.0], 4, scheduler) == 3.0  # fewer tests than workers: one each


def test_the_benchmark_reads_a_junit_xml_and_writes_its_record(tmp_path):
    cases = "".join(f'<testcase classname="tests.test_x" name="test_{i}" time="{seconds}"/>'
                    for i, seconds in enumerate(LONG_FIRST))
    junit = tmp_path / "suite.xml"
    junit.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    record, stdout = run_benchmark("suite_schedule.py", str(junit), "--workers", "2", "--draws", "5",
                                   out=tmp_path / "s.json")
    assert record["tests"] == 64 and record["serial_s"] == 136.0 and record["lower_bound_s"] == 68.0
    rows = record["schedulers"]
    # no groups in a bare XML: both loadgroup rows send each test alone
    assert [rows[name]["makespan_s"] for name in ROWS] == [80.0, 68.0, 70.0, 68.0, 68.0, 68.0]
    assert rows["load"]["draws_median_speedup_over_load"] == 1.0
    assert all(rows[name]["draws_p90_s"] >= rows[name]["draws_median_s"] > 0 for name in ROWS)
    assert record["longest_tests"][0] == ["tests.test_x::test_0", 10.0]
    assert rows["load_maxschedchunk_1"]["speedup_over_load"] == 80.0 / 68.0
    assert "| load_maxschedchunk_1 | 68 | 1.18 |" in stdout


def test_the_collection_order_comes_from_the_collected_node_ids(tmp_path):
    """``--collected``: the tests run in the listed order; one the XML lacks counts as its median
    (3.5 s of [1, 1, 6, 6]); one the list lacks is left out."""
    cases = "".join(f'<testcase classname="tests.test_x" name="test_{name}" time="{seconds}"/>'
                    for name, seconds in [("a", 1.0), ("b", 1.0), ("c", 6.0), ("gone", 6.0)])
    junit = tmp_path / "suite.xml"
    junit.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    collected = tmp_path / "collected.txt"
    collected.write_text("tests/test_x.py::test_a\ntests/test_x.py::test_new\ntests/test_x.py::test_c\n"
                         "tests/test_x.py::test_b\n\n4 tests collected\n")
    record, _ = run_benchmark("suite_schedule.py", str(junit), "--collected", str(collected), "--workers", "2",
                              "--draws", "2", out=tmp_path / "s.json")
    assert record["tests"] == 4 and record["serial_s"] == 11.5
    # [1, 3.5, 6, 1] in this order: worker 0 runs the first two (4.5 s), worker 1 the 6 s and the 1 s test: 7 s
    assert record["schedulers"]["load_maxschedchunk_1"]["makespan_s"] == 7.0
    # a line may name the test's xdist group as xdist's loadgroup does: test_a and test_b in group g
    collected.write_text("tests/test_x.py::test_a@g\ntests/test_x.py::test_new\ntests/test_x.py::test_c\n"
                         "tests/test_x.py::test_b@g\n")
    record, _ = run_benchmark("suite_schedule.py", str(junit), "--collected", str(collected), "--workers", "2",
                              "--draws", "2", out=tmp_path / "s.json")
    rows = record["schedulers"]
    # in loadgroup order [c, new, a, b]: worker 0 runs c (6 s), then group g (1 + 1 s): 8 s; each test
    # alone, [c, new, b, a]: c and b (7 s), new and a (4.5 s): 7 s
    assert rows["loadgroup_in_loadgroup_order"]["makespan_s"] == 8.0
    assert rows["loadgroup_in_loadgroup_order_ungrouped"]["makespan_s"] == 7.0
    # --suite-log: test_a and test_b each first of g on a worker: g loses 1 s of its 2 (1 + 1 s -> 0.5 + 0.5 s),
    # and worker 0's c then g end at 7 s
    log = tmp_path / "suite.log"
    log.write_text("[gw0] [ 25%] PASSED tests/test_x.py::test_a@g \n[gw1] [ 50%] PASSED tests/test_x.py::test_b@g \n")
    record, _ = run_benchmark("suite_schedule.py", str(junit), "--collected", str(collected), "--suite-log", str(log),
                              "--workers", "2", "--draws", "2", out=tmp_path / "s.json")
    assert record["schedulers"]["loadgroup_in_loadgroup_order_repeats_removed"]["makespan_s"] == 7.0
    done = subprocess.run([sys.executable, "benchmarks/suite_schedule.py", str(junit), "--suite-log", str(log)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--suite-log needs" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run([sys.executable, "benchmarks/suite_schedule.py", str(junit), "--collected",
                           str(tmp_path / "none.txt")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--collected" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("content, message", [(None, "not a readable JUnit XML"),
                                              ("<testsuites", "not a readable JUnit XML"),
                                              ("<testsuites/>", "no <testcase> in it")])
def test_a_missing_or_empty_junit_xml_is_refused_in_one_line(tmp_path, content, message):
    junit = tmp_path / "suite.xml"
    if content is not None:
        junit.write_text(content)
    done = subprocess.run([sys.executable, "benchmarks/suite_schedule.py", str(junit)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"{junit}: {message}" in done.stderr and "Traceback" not in done.stderr
