"""tests/durations.py: the longest-with-shortest order, the JUnit XML names it matches tests by,
the ``--order-by-durations`` option (after ``-m`` and ``-k`` have chosen the tests) and its
one-line refusal of a bad file, and the recorded file gpu_check's suite part uses."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import durations
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_longest_alternate_with_the_shortest():
    # benchmarks/suite_schedule.py's tests trace what this order does under xdist: [1, 1, 6, 6] takes 12 s on
    # 2 workers in collection order and 7 s (the least) in this one, [6, 1, 6, 1]
    assert durations.longest_with_shortest([1.0, 1.0, 6.0, 6.0]) == [2, 1, 3, 0]
    assert durations.longest_with_shortest([3.0, 9.0, 1.0, 5.0, 7.0]) == [1, 2, 4, 0, 3]
    assert durations.longest_with_shortest([5.0, 5.0, 1.0, 1.0]) == [0, 3, 1, 2]  # ties: collection order
    assert durations.longest_with_shortest([2.0]) == [0] and durations.longest_with_shortest([]) == []


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


def test_the_recorded_durations_name_most_of_the_device_tests():
    """tests/device_test_durations.json (gpu_check's suite order) names at least 90% of the tests
    the suite part runs; when it does not, refresh it from a run's suite.xml (tests/durations.py)."""
    recorded = durations.load(ROOT / "tests" / "device_test_durations.json")
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m",
                           "not slow", "--device-tests-only", "tests"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    device_tests = [durations.junit_key(line) for line in done.stdout.splitlines() if "::" in line]
    named = sum(key in recorded for key in device_tests)
    assert len(device_tests) > 300 and named >= 0.9 * len(device_tests), (named, len(device_tests))
