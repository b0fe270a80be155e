"""The communication figures a DAG worker reports for each training step (``comm/*``)."""

from __future__ import annotations

from vla_rl.utils.collectives import CommCounters, all_gather_cost, all_reduce_cost
from vla_rl.workers.dag_worker import comm_metrics


def test_comm_metrics_totals_and_tags_with_their_rules():
    counts = CommCounters()
    counts.add("reshard_rows", 100, 40)
    counts.add("metrics", 16, 16)
    counts.add("metrics", 32, 32)
    metrics = comm_metrics(counts)
    assert {name: (m.value, m.rule) for name, m in metrics.items()} == {
        "comm/bytes_sent": (148.0, "mean"), "comm/bytes_received": (88.0, "mean"),
        "comm/bytes_received_max": (88.0, "max"), "comm/collectives": (3.0, "max"),
        "comm/metrics/bytes_received": (48.0, "mean"), "comm/metrics/collectives": (2.0, "max"),
        "comm/reshard_rows/bytes_received": (40.0, "mean"), "comm/reshard_rows/collectives": (1.0, "max"),
    }


def test_counters_differences_and_ring_costs():
    counts = CommCounters()
    counts.add("a", 1, 2)
    before = counts.snapshot()
    counts.add("a", 10, 20)
    counts.add("b", 5, 5)
    delta = counts.since(before)
    assert (delta.collectives, delta.bytes_sent, delta.bytes_received) == (2, 15, 25)
    assert set(delta.tags) == {"a", "b"} and set(before.tags) == {"a"}
    assert all_gather_cost(4, 100) == (300, 300)  # a ring all-gather forwards the 3 others' shares
    assert all_reduce_cost(4, 100) == (150, 150)  # 2 (W - 1) / W of the tensor
    assert all_gather_cost(1, 100) == all_reduce_cost(1, 100) == (0, 0)
