"""benchmarks/camera_resize.py on a few observations: it times every part with both resizes and
writes its JSON (speed-ups are reported, not asserted: timings are the benchmark's, not a test's)."""

from __future__ import annotations

from benchmark_runs import run_benchmark

PARTS = ("pi0_resize_with_pad_128_to_56", "pi0_resize_with_pad_256_to_224", "openvla_towers_256_to_224",
         "pi0_lift_update_pass")


def test_the_camera_resize_benchmark_times_both_resizes_of_every_part(tmp_path):
    out = tmp_path / "resize.json"
    record, stdout = run_benchmark("camera_resize.py", "--observations", "2", "--repeats", "2", out=out)
    assert sorted(record["parts"]) == sorted(PARTS)
    for part in PARTS:
        assert f"| {part} | uint8 |" in stdout
        for resize in ("float32", "uint8"):
            timing = record["parts"][part][resize]
            assert len(timing["seconds"]) == 2 and timing["median_s"] > 0
        assert record["parts"][part]["float32"]["speedup_over_float32"] == 1.0
