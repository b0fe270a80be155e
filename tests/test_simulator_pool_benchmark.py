"""benchmarks/simulator_pool.py in a tiny setting: it runs on Lift and MetaWorld in one run and
writes both simulators' throughput rows (the benchmark calls the rollout like a policy would, so
a change of the policy contract breaks it; this test catches that)."""

from __future__ import annotations

import pytest
from benchmark_runs import run_benchmark


@pytest.mark.slow
def test_tiny_simulator_pool_benchmark(tmp_path):
    out = tmp_path / "simulator_pool.json"
    args = ["--obs", "state", "--processes", "1", "--envs-per-process", "2", "--steps", "3", "--metaworld-steps", "6",
            "--repeats", "1", "--stages", "1", "--train-steps", "0"]
    rows = run_benchmark("simulator_pool.py", *args, out=out, timeout=900)[0]["throughput"]
    assert {row["simulator"] for row in rows} == {"robosuite_lift", "metaworld"}
    for row in rows:
        assert row["one_process"]["steps_per_s"] > 0 and row["limit_steps_per_s"] > 0
        assert all(run["steps_per_s"] > 0 for run in row["async_vector_env"])
