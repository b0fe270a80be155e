"""benchmarks/scoring_memory.py on a small vocabulary: both rows run, each in its own process, score
the same log-probs and are written to its JSON (peaks and timings are reported, not asserted)."""

from __future__ import annotations

from benchmark_runs import run_benchmark


def test_the_scoring_memory_benchmark_measures_both_rows(tmp_path):
    record, stdout = run_benchmark("scoring_memory.py", "--vocab", "2048", "--response", "16", "--repeats", "1",
                                   out=tmp_path / "scoring.json")
    rows = record["rows"]
    assert sorted(rows) == ["batched_with_entropy", "rows_no_entropy"]
    assert rows["batched_with_entropy"]["log_probs_sum"] == rows["rows_no_entropy"]["log_probs_sum"] < 0
    assert rows["batched_with_entropy"]["peak_ratio_to_batched_with_entropy"] == 1.0
    assert all(len(row["seconds"]) == 1 and row["median_s"] > 0 for row in rows.values())
    assert "| rows_no_entropy |" in stdout and record["one_float32_logits_mib"] == 2 * 16 * 2048 * 4 / 2**20
