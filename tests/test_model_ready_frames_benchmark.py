"""benchmarks/model_ready_frames.py on a few observations: it times every part both ways and
writes its JSON (speed-ups are reported, not asserted: timings are the benchmark's, not a test's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PARTS = ("pi0_lift_behaviour_cloning", "pi0_lift_update", "pi0_libero_frames_update")


def test_the_model_ready_frames_benchmark_times_every_part_both_ways(tmp_path):
    out = tmp_path / "frames.json"
    result = subprocess.run([sys.executable, "benchmarks/model_ready_frames.py", "--transitions", "8", "--bc-steps",
                             "1", "--episodes", "8", "--decisions", "1", "--repeats", "1", "--out", str(out)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert sorted(record["parts"]) == sorted(PARTS)
    for part in PARTS:
        assert f"| {part} | prepared_once |" in result.stdout
        for frames in ("every_pass", "prepared_once"):
            timing = record["parts"][part][frames]
            assert len(timing["seconds"]) == 1 and timing["median_s"] > 0
        assert record["parts"][part]["every_pass"]["speedup_over_every_pass"] == 1.0
