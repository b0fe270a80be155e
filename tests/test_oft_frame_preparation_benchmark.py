"""benchmarks/oft_frame_preparation.py on a few small frames: it runs both parts and writes its
JSON (the speed-up is reported, not asserted: timings are the benchmark's, not a test's)."""

from __future__ import annotations

from benchmark_runs import run_benchmark


def test_the_frame_preparation_benchmark_writes_both_parts(tmp_path):
    out = tmp_path / "frames.json"
    record, stdout = run_benchmark("oft_frame_preparation.py", "--observations", "2", "--cameras", "1",
                                   "--frame-size", "32", "--repeats", "2", out=out)
    assert "| every_pass |" in stdout and "| memoised |" in stdout
    assert record["settings"]["frames_per_call"] == 2
    for part in ("every_pass", "memoised"):
        assert len(record["parts"][part]["seconds"]) == 2 and record["parts"][part]["median_s"] > 0
    assert record["parts"]["memoised"]["speedup_over_every_pass"] > 0
