"""benchmarks/scaling.py in its tiny mode: it runs, writes its JSON, and the bytes the re-shards
moved (counted at run time) equal ``vla-rl plan``'s estimate."""

from __future__ import annotations

import pytest
from benchmark_runs import run_benchmark


@pytest.mark.slow
def test_tiny_scaling_benchmark(tmp_path):
    out = tmp_path / "scaling.json"
    record, stdout = run_benchmark("scaling.py", "--tiny", out=out, timeout=600)
    assert "weak scaling" in stdout
    runs = {run["workers"]: run for run in record["runs"]}
    assert set(runs) == {1, 2}
    one, two = runs[1], runs[2]
    assert one["bytes_received_per_worker"] == 0  # one worker: nothing crosses
    assert one["planned"]["hops"] == []  # the advantage node's DP 1 is the world size
    # Two workers: the advantage node at DP 1 gathers every row on both workers, then scatters
    # them back; every group is kept, so the rebalance before the update moves nothing.
    assert [hop["dp"] for hop in two["planned"]["hops"]] == [[2, 1], [1, 2], [2, 2]]
    assert two["by_tag"]["reshard_rows"]["bytes_received"] == two["planned"]["rows_bytes_per_worker"] > 0
    assert two["by_tag"]["reshard_meta"]["bytes_received"] == two["planned"]["meta_bytes_per_worker"]
    for run in (one, two):
        assert 0 < run["driver_bytes"] < 4000  # rank 0's scalar metrics and an empty reply per other worker
        assert run["collectives"] >= 1 and run["step_s_median"] > 0
