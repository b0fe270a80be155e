"""Running a benchmark script of ``benchmarks/`` as a user does, for the tests that check its
output (its figures are reported by the benchmark, never asserted as timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, *args: str, out: Path, timeout: int = 300) -> tuple[Any, str]:
    """``python benchmarks/<script> <args> --out <out>`` from the repository root.

    Returns:
        the JSON the benchmark wrote to ``out`` and its stdout (the table).

    Raises:
        AssertionError: it exited with a non-zero status (the message ends its output's tails).
    """
    result = subprocess.run([sys.executable, f"benchmarks/{script}", *args, "--out", str(out)], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(out.read_text()), result.stdout
