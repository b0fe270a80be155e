"""benchmarks/oft_frame_preparation.py on a few small frames: it runs both parts and writes its
JSON (the speed-up is reported, not asserted: timings are the benchmark's, not a test's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_frame_preparation_benchmark_writes_both_parts(tmp_path):
    out = tmp_path / "frames.json"
    result = subprocess.run([sys.executable, "benchmarks/oft_frame_preparation.py", "--observations", "2",
                             "--cameras", "1", "--frame-size", "32", "--repeats", "2", "--out", str(out)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "| every_pass |" in result.stdout and "| memoised |" in result.stdout
    record = json.loads(out.read_text())
    assert record["settings"]["frames_per_call"] == 2
    for part in ("every_pass", "memoised"):
        assert len(record["parts"][part]["seconds"]) == 2 and record["parts"][part]["median_s"] > 0
    assert record["parts"]["memoised"]["speedup_over_every_pass"] > 0
