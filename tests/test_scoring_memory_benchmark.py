"""benchmarks/scoring_memory.py on a small vocabulary: both rows run, each in its own process, score
the same log-probs and are written to its JSON (peaks and timings are reported, not asserted)."""

from __future__ import annotations

from benchmark_runs import REPO_ROOT, run_benchmark


def test_the_scoring_memory_benchmark_measures_both_rows(tmp_path):
    record, stdout = run_benchmark("scoring_memory.py", "--vocab", "2048", "--response", "16", "--repeats", "1",
                                   out=tmp_path / "scoring.json")
    rows = record["rows"]
    assert sorted(rows) == ["batched_with_entropy", "rows_no_entropy"]
    assert rows["batched_with_entropy"]["log_probs_sum"] == rows["rows_no_entropy"]["log_probs_sum"] < 0
    assert rows["batched_with_entropy"]["peak_ratio_to_batched_with_entropy"] == 1.0
    assert all(len(row["seconds"]) == 1 and row["median_s"] > 0 for row in rows.values())
    assert "| rows_no_entropy |" in stdout and record["one_float32_logits_mib"] == 2 * 16 * 2048 * 4 / 2**20


def test_a_pass_s_peak_is_measured_above_the_memory_in_use_before_it_not_the_process_s_peak():
    """The CPU peak subtracted the process's peak so far (what loading the model reached) instead
    of the memory in use before the pass: each row was understated by that gap (38 MiB at Qwen2.5's
    vocabulary; a helper audit)."""
    import importlib.util

    import numpy as np
    import torch

    spec = importlib.util.spec_from_file_location("scoring_memory", REPO_ROOT / "benchmarks" / "scoring_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pass_peak_mib = module.pass_peak_mib

    earlier = np.ones(200 * 2**20 // 8)  # the process's peak rises by 200 MiB, then falls back
    del earlier

    def pass_of_64_mib():
        block = np.ones(64 * 2**20 // 8)  # written: resident
        return float(block[-1])

    out, peak = pass_peak_mib(pass_of_64_mib, torch.device("cpu"))
    assert out == 1.0 and 60 <= peak <= 100, peak  # the old measure gave about 0 here
