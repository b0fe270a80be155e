"""benchmarks/llm_grpo_vs_trl.py without the ``trl`` extra: it ran the whole vla-rl side first
(Ray, training), then stopped in a ModuleNotFoundError traceback."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "llm_grpo_vs_trl.py"


def test_without_the_trl_extra_it_stops_before_it_runs_anything(tmp_path):
    if importlib.util.find_spec("trl") is not None and importlib.util.find_spec("datasets") is not None:
        pytest.skip("the trl extra is installed here")
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--steps", "1", "--repeats", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("error: TRL's side needs ") and "pip install -e '.[trl]'" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
