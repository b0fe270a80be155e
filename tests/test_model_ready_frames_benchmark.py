"""benchmarks/model_ready_frames.py on a few observations: it times every part both ways and
writes its JSON (speed-ups are reported, not asserted: timings are the benchmark's, not a test's),
and its process group listens on loopback only."""

from __future__ import annotations

from benchmark_runs import run_benchmark
from listeners import ListenerWatch, is_loopback, outward_interface

PARTS = ("pi0_lift_behaviour_cloning", "pi0_lift_update", "pi0_libero_frames_update")


def test_the_model_ready_frames_benchmark_times_every_part_both_ways(tmp_path, monkeypatch):
    """Run with ``GLOO_SOCKET_IFNAME`` naming an outward interface where the host has one, as a shell
    might have it: the benchmark's one-process group still listens on loopback only (a local run's
    setting; before, its gloo listener was on eth0's address)."""
    if (interface := outward_interface()) is not None:
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", interface)
    out = tmp_path / "frames.json"
    with ListenerWatch(period_s=0.2) as watch:
        record, stdout = run_benchmark("model_ready_frames.py", "--transitions", "8", "--bc-steps", "1",
                                       "--episodes", "8", "--decisions", "1", "--repeats", "1", out=out)
    assert watch.seen, "the benchmark's gloo listener was not seen"
    outside = [(*seen, watch.owners.get(seen[1:])) for seen in watch.seen if not is_loopback(seen[1])]
    assert not outside, f"listening outside 127.0.0.0/8: {outside}"
    assert sorted(record["parts"]) == sorted(PARTS)
    for part in PARTS:
        assert f"| {part} | prepared_once |" in stdout
        for frames in ("every_pass", "prepared_once"):
            timing = record["parts"][part][frames]
            assert len(timing["seconds"]) == 1 and timing["median_s"] > 0
        assert record["parts"][part]["every_pass"]["speedup_over_every_pass"] == 1.0
