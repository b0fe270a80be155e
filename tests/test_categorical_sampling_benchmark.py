"""benchmarks/categorical_sampling.py with few rows: it times the three samplers of every part,
writes its JSON, and its exactness figures are the samplers' (speed-ups are reported, not
asserted: timings are the benchmark's, not a test's)."""

from __future__ import annotations

import sys

import torch
from benchmark_runs import REPO_ROOT, run_benchmark

sys.path.insert(0, str(REPO_ROOT))

from benchmarks.categorical_sampling import drawn_distributions, next_token_probs  # noqa: E402

PARTS = ("512_classes", "49152_classes", "151936_classes")


def test_the_benchmark_times_every_sampler_and_records_the_exactness(tmp_path):
    out = tmp_path / "sampling.json"
    record, stdout = run_benchmark("categorical_sampling.py", "--rows", "2", "--repeats", "2", out=out)
    assert sorted(record["parts"]) == sorted(PARTS) and sorted(record["total_variation"]) == sorted(PARTS)
    for part in PARTS:
        for sampler in ("multinomial", "two_stage", "one_float32_cumsum"):
            assert len(record["parts"][part][sampler]["seconds"]) == 2
        assert record["total_variation"][part]["two_stage"] < 1e-8
    assert record["total_variation"]["151936_classes"]["one_float32_cumsum"] > 1e-5


def test_the_two_stage_distribution_is_what_the_sampler_draws():
    """The benchmark's exactness figure computes the two-stage sampler's distribution from its
    sums; drawn, the sampler's frequencies follow it (1,300 classes: three blocks)."""
    from policies.sampling import sample_categorical

    probs = next_token_probs(1, 1300, 0.5)
    drawn = drawn_distributions(probs)["two_stage"][0]
    draws = 40_000
    samples = sample_categorical(probs.expand(draws, -1), torch.Generator().manual_seed(0))
    frequencies = torch.bincount(samples, minlength=1300).double() / draws
    dominant = int(drawn.argmax())
    assert abs(frequencies[dominant] - drawn[dominant]) < 5 * (0.25 / draws) ** 0.5
    assert abs(frequencies[:512].sum() - drawn[:512].sum()) < 5 * (0.25 / draws) ** 0.5


def test_bad_settings_are_one_line_before_anything_runs_and_the_record_s_folder_is_made(tmp_path, capsys):
    """``--repeats 0`` was a StatisticsError at the end of the run, ``--dominant 1.0`` a
    ZeroDivisionError, ``--rows 0`` a table of NaN; an ``--out`` in a missing folder lost every
    measurement to a FileNotFoundError."""
    import pytest

    from benchmarks.categorical_sampling import main

    for argv, message in ((["--repeats", "0"], "--repeats must be >= 1, got 0"),
                          (["--rows", "0"], "--rows must be >= 1, got 0"),
                          (["--dominant", "1.0"], "--dominant must be a probability in (0, 1), got 1.0")):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2 and message in capsys.readouterr().err
    out = tmp_path / "new" / "folder" / "sampling.json"
    assert main(["--rows", "1", "--repeats", "1", "--out", str(out)])["settings"]["out"] == str(out)
    assert out.is_file()
