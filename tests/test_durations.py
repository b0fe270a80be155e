"""tests/durations.py: the longest-with-shortest order, the JUnit XML names it matches tests by,
the ``--order-by-durations`` option (after ``-m`` and ``-k`` have chosen the tests) and its
one-line refusal of a bad file, and its command line (tests/test_gpu_check.py checks the recorded
file gpu_check's suite part uses)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import durations
import pytest
from child_env import child_env

ROOT = Path(__file__).resolve().parents[1]


def test_the_longest_alternate_with_the_shortest():
    # benchmarks/suite_schedule.py's tests trace what this order does under xdist: [1, 1, 6, 6] takes 12 s on
    # 2 workers in collection order and 7 s (the least) in this one, [6, 1, 6, 1]
    assert durations.longest_with_shortest([1.0, 1.0, 6.0, 6.0]) == [2, 1, 3, 0]
    assert durations.longest_with_shortest([3.0, 9.0, 1.0, 5.0, 7.0]) == [1, 2, 4, 0, 3]
    assert durations.longest_with_shortest([5.0, 5.0, 1.0, 1.0]) == [0, 3, 1, 2]  # ties: collection order
    assert durations.longest_with_shortest([2.0]) == [0] and durations.longest_with_shortest([]) == []


def test_under_loadgroup_each_worker_starts_with_a_long_unit_then_a_short_one():
    """xdist's loadgroup hands each worker one unit, then a second, at the start: the workers'
    first units are the longest, their second the shortest; a group is one unit as long as its
    tests together, its tests in collection order."""
    seconds = [10.0, 1.0, 20.0, 2.0, 30.0, 3.0, 5.0, 4.0]
    assert durations.loadgroup_order(seconds, [None] * 8, workers=2) == [4, 2, 1, 3, 0, 5, 6, 7]
    # groups a (tests 1 and 3: 3 s) and b (6 and 7: 9 s)
    groups = [None, "a", None, "a", None, None, "b", "b"]
    assert durations.loadgroup_order(seconds, groups, workers=2) == [4, 2, 5, 1, 3, 0, 6, 7]
    assert durations.loadgroup_order([1.0, 2.0], [None, None], workers=8) == [1, 0]
    assert durations.loadgroup_order([], [], workers=2) == []


GROUPED_TESTS = '''
import os

import pytest


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    with open(os.environ["SETUPS"], "a") as setups:
        setups.write("run\\n")
    return 1


@pytest.mark.xdist_group("mod.run")
def test_uses_the_run_first(run):
    pass


def test_other():
    pass


@pytest.mark.xdist_group("mod.run")
def test_uses_the_run_second(run):
    pass


def test_short():
    pass
'''


def test_under_loadgroup_a_groups_tests_share_one_worker_and_one_setup(tmp_path):
    """Two real xdist workers with gpu_check's kind of options, the group's two tests the longest
    (5 and 4 s by the durations file, test_other 1 s, test_short 0.1 s). Where xdist groups
    (:func:`durations.xdist_groups_work`), the group is one 9 s unit: one worker runs both tests,
    its module fixture set up once, and test_other starts on the other worker. On pytest 9.2 with
    xdist 3.8 each test goes out alone (pytest-xdist#1386), and in :func:`durations.loadgroup_order`
    the two longest start on different workers, so that the fixture is set up twice, as under
    ``load``. Either way the run passes."""
    (tmp_path / "test_mod.py").write_text(GROUPED_TESTS)
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\nimport durations\n\n\n"
        f"def pytest_configure(config):\n"
        f"    config.pluginmanager.register(durations.DurationOrder({str(tmp_path / 'durations.json')!r}))\n")
    (tmp_path / "durations.json").write_text(json.dumps({"seconds": {
        "test_mod::test_uses_the_run_first": 5.0, "test_mod::test_other": 1.0,
        "test_mod::test_uses_the_run_second": 4.0, "test_mod::test_short": 0.1}}))
    setups = tmp_path / "setups.txt"
    done = subprocess.run([sys.executable, "-m", "pytest", "-c", "/dev/null", "--rootdir", str(tmp_path),
                           "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder", "-v",
                           "test_mod.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**child_env(), "SETUPS": str(setups)})
    assert done.returncode == 0 and "4 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    ran = {line.split("::")[-1].split()[0].split("@")[0]: line.split()[0] for line in done.stdout.splitlines()
           if line.startswith("[gw") and " PASSED " in line}
    assert len(ran) == 4, done.stdout[-3000:]
    if durations.xdist_groups_work():
        assert ran["test_uses_the_run_first"] == ran["test_uses_the_run_second"] != ran["test_other"], ran
        assert setups.read_text() == "run\n"
    else:
        # each worker: a long test, then a short one (first with short, second with other)
        assert ran["test_uses_the_run_first"] == ran["test_short"] != ran["test_uses_the_run_second"], ran
        assert ran["test_uses_the_run_second"] == ran["test_other"], ran
        assert setups.read_text() == "run\nrun\n"


TESTS = '''
import pytest

def test_plain():
    pass

@pytest.mark.parametrize("x, word", [(1, "a-b"), (2, "c d")])
def test_with_parameters(x, word):
    pass

class TestGroup:
    @pytest.mark.parametrize("n", [3])
    def test_in_a_class(self, n):
        pass
'''


def test_a_node_id_gives_the_name_pytests_junit_xml_writes(tmp_path):
    """Matched against pytest's own XML: a module in a sub-directory, parameters with a dash and
    a space, a test method of a class."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_mod.py").write_text(TESTS)

    def pytest_run(*options: str) -> str:
        done = subprocess.run([sys.executable, "-m", "pytest", "-c", "/dev/null", "--rootdir", str(tmp_path),
                               "-p", "no:cacheprovider", *options, "sub"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    node_ids = [line for line in pytest_run("--collect-only", "-q").splitlines() if "::" in line]
    pytest_run(f"--junitxml={tmp_path / 'run.xml'}")
    recorded = durations.junit_durations(tmp_path / "run.xml")
    assert len(node_ids) == 4 and [durations.junit_key(node_id) for node_id in node_ids] == list(recorded)
    assert "sub.test_mod.TestGroup::test_in_a_class[3]" in recorded


BENCHMARK_TESTS = "tests/test_suite_schedule_benchmark.py"


def collected(*options: str) -> tuple[int, list[str], str]:
    """``pytest --collect-only -q`` of tests/test_suite_schedule_benchmark.py: status, node ids, output."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *options,
                           BENCHMARK_TESTS], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return done.returncode, [line for line in done.stdout.splitlines() if "::" in line], done.stdout + done.stderr


def test_the_option_orders_the_chosen_tests_longest_with_shortest(tmp_path):
    """The order is taken over the tests ``-k`` left: the refusal tests it leaves out do not take
    the places of short tests; a test the file does not name counts as the recorded median."""
    _, every, _ = collected()
    chosen = [node_id for node_id in every if "refused" not in node_id]
    assert len(chosen) >= 5 and len(chosen) < len(every)
    seconds = {durations.junit_key(node_id): float(10 * index) for index, node_id in enumerate(every)}
    seconds[durations.junit_key(chosen[1])] = 2.0
    unnamed = chosen[2]
    del seconds[durations.junit_key(unnamed)]
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"recorded": "by hand", "seconds": seconds}))
    status, ordered, output = collected("-k", "not refused", "--order-by-durations", str(path))
    assert status == 0, output
    median = statistics.median(seconds.values())
    expected_seconds = [seconds.get(durations.junit_key(node_id), median) for node_id in chosen]
    assert ordered == [chosen[index] for index in durations.longest_with_shortest(expected_seconds)]
    assert ordered[0] == chosen[-1] and sorted(ordered) == sorted(chosen)
    assert f"{len(chosen) - 1} of the {len(chosen)} tests have a recorded duration" in output


@pytest.mark.parametrize("content, reason", [(None, "FileNotFoundError"), ("{", "JSONDecodeError"),
                                             ('{"seconds": {}}', "no {test: seconds}"),
                                             ('{"seconds": {"a::b": "long"}}', "no {test: seconds}"),
                                             ('{"tests": {}}', "KeyError")])
def test_a_bad_durations_file_is_refused_naming_it(tmp_path, content, reason):
    path = tmp_path / "durations.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(pytest.UsageError, match=rf"^--order-by-durations {path}: not a durations file \(.*{reason}"):
        durations.load(path)


def test_pytest_refuses_a_bad_durations_file_in_one_line(tmp_path):
    path = tmp_path / "durations.json"
    path.write_text('{"seconds": {}}')
    status, ordered, output = collected("--order-by-durations", str(path))
    lines = [line for line in output.splitlines() if line.strip()]
    assert status == 4 and not ordered and "Traceback" not in output
    assert lines == [f"ERROR: --order-by-durations {path}: not a durations file "
                     "(ValueError(\"no {test: seconds} under 'seconds'\"))"], output


def test_the_command_line_writes_a_file_the_option_reads(tmp_path):
    junit = tmp_path / "suite.xml"
    junit.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest">'
                     '<testcase classname="tests.test_x" name="test_a" time="12.34"/>'
                     '<testcase classname="tests.test_x" name="test_b[1]" time="0.5"/></testsuite></testsuites>')
    done = subprocess.run([sys.executable, "tests/durations.py", str(junit), "one H200, gpu_check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    written = tmp_path / "durations.json"
    written.write_text(done.stdout)
    assert durations.load(written) == {"tests.test_x::test_a": 12.3, "tests.test_x::test_b[1]": 0.5}
    assert json.loads(done.stdout)["recorded"] == "one H200, gpu_check"
    for argv, message in [([str(junit)], "usage: python tests/durations.py SUITE_XML"),
                          ([str(tmp_path / "none.xml"), "x"], "none.xml: not a readable JUnit XML"),
                          ([str(written), "x"], "durations.json: not a readable JUnit XML")]:
        done = subprocess.run([sys.executable, "tests/durations.py", *argv], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
