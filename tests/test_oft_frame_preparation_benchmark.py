"""benchmarks/oft_frame_preparation.py on a few small frames: it runs both parts and writes its
JSON (the speed-up is reported, not asserted: timings are the benchmark's, not a test's)."""

from __future__ import annotations

from benchmark_runs import REPO_ROOT, run_benchmark


def test_the_frame_preparation_benchmark_writes_both_parts(tmp_path):
    out = tmp_path / "frames.json"
    record, stdout = run_benchmark("oft_frame_preparation.py", "--observations", "2", "--cameras", "1",
                                   "--frame-size", "32", "--repeats", "2", out=out)
    assert "| every_pass |" in stdout and "| memoised |" in stdout
    assert record["settings"]["frames_per_call"] == 2
    for part in ("every_pass", "memoised"):
        assert len(record["parts"][part]["seconds"]) == 2 and record["parts"][part]["median_s"] > 0
    assert record["parts"]["memoised"]["speedup_over_every_pass"] > 0


def test_no_repeats_is_refused_in_one_line_and_one_thread_is_recorded(tmp_path):
    """--repeats 0 ended in statistics.StatisticsError; the benchmark ran torch's default threads, unrecorded
    in the docs (a DAG worker on 2 cores runs 1)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "benchmarks/oft_frame_preparation.py", "--repeats", "0"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().endswith("error: --repeats must be >= 1, got 0")
    record, _ = run_benchmark("oft_frame_preparation.py", "--observations", "1", "--cameras", "1", "--frame-size",
                              "32", "--repeats", "1", out=tmp_path / "frames.json")
    assert record["settings"]["threads"] == record["machine"]["torch_threads"] == 1
