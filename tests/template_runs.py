"""Shared by the end-to-end template tests: train a template for one step on tiny settings."""

from __future__ import annotations

import json
from pathlib import Path

from metric_docs import undocumented

from vla_rl.driver import train


def run_one_step(template: str, tiny: list[str], out: Path, *overrides: str) -> tuple[dict, Path]:
    """Train ``template`` with the ``tiny`` overrides, then ``overrides``, into ``out/run``; check
    that exactly one training step ran and that docs/metrics.md documents every metric it logged,
    and return its metrics record and the run directory."""
    summary = train(template, [*tiny, f"run.output_dir={out}", "run.name=run", *overrides])
    run_dir = out / "run"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "rollout/success_rate" in r]
    assert summary["steps_run"] == 1 and [r["step"] for r in steps] == [1]
    missing = undocumented(name for record in records for name in record)
    assert not missing, f"logged metrics docs/metrics.md does not document: {missing}"
    return steps[0], run_dir
