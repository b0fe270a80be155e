"""benchmarks/model_ready_frames.py on a few observations: it times every part both ways and
writes its JSON (speed-ups are reported, not asserted: timings are the benchmark's, not a test's)."""

from __future__ import annotations

from benchmark_runs import run_benchmark

PARTS = ("pi0_lift_behaviour_cloning", "pi0_lift_update", "pi0_libero_frames_update")


def test_the_model_ready_frames_benchmark_times_every_part_both_ways(tmp_path):
    out = tmp_path / "frames.json"
    record, stdout = run_benchmark("model_ready_frames.py", "--transitions", "8", "--bc-steps", "1", "--episodes", "8",
                                   "--decisions", "1", "--repeats", "1", out=out)
    assert sorted(record["parts"]) == sorted(PARTS)
    for part in PARTS:
        assert f"| {part} | prepared_once |" in stdout
        for frames in ("every_pass", "prepared_once"):
            timing = record["parts"][part][frames]
            assert len(timing["seconds"]) == 1 and timing["median_s"] > 0
        assert record["parts"][part]["every_pass"]["speedup_over_every_pass"] == 1.0
