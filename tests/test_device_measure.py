"""benchmarks/device_measure.py (the timing and peak memory of the full-size benchmarks), on the
CPU: medians by phase over the measured calls only, a part out of memory reported while other
errors raise, each part stored, printed and written at once, and the CPU's name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is the repository's, not installed
from benchmarks import device_measure  # noqa: E402  (as the benchmarks import it)

CPU = torch.device("cpu")


def test_measure_reports_medians_by_phase_after_the_warmup():
    seconds = iter([{"forward_s": 100.0, "backward_s": 100.0},  # the warmup call: not counted
                    {"forward_s": 1.0, "backward_s": 4.0},
                    {"forward_s": 3.0, "backward_s": 0.5},
                    {"forward_s": 2.0, "backward_s": 2.0}])
    entry = device_measure.measure(lambda: next(seconds), CPU, warmup=1, repeats=3)
    assert list(entry)[:4] == ["forward_s", "backward_s", "total_s", "calls_s"]  # the step's phases first
    assert entry["forward_s"] == 2.0 and entry["backward_s"] == 2.0
    assert entry["calls_s"] == [5.0, 3.5, 4.0] and entry["total_s"] == 4.0  # the median of the sums
    assert entry["peak_memory_gib"] > 0 and entry["memory_kind"] == "peak RSS"
    assert isinstance(entry["peak_reset_before_part"], bool)


def test_timed_returns_the_value_and_its_seconds():
    value, seconds = device_measure.timed(CPU, lambda: 7)
    assert value == 7 and seconds >= 0


def test_a_part_out_of_memory_is_reported_and_other_errors_raise():
    model = torch.nn.Linear(2, 2)
    model(torch.ones(1, 2)).sum().backward()

    def out_of_memory():
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried "
                           "to allocate 4096 bytes")

    def python_out_of_memory():
        raise MemoryError  # no message

    def broken():
        raise RuntimeError("shape mismatch")

    entry = device_measure.measure_or_out_of_memory(out_of_memory, model, CPU, 0, 1)
    assert entry["error"].startswith("out of memory: DefaultCPUAllocator: can't") and entry["peak_memory_gib"] > 0
    assert model.weight.grad is None  # freed for the next part
    entry = device_measure.measure_or_out_of_memory(python_out_of_memory, model, CPU, 0, 1)
    assert entry["error"] == "out of memory: MemoryError"
    with pytest.raises(RuntimeError, match="shape mismatch"):
        device_measure.measure_or_out_of_memory(broken, model, CPU, 0, 1)


def test_the_cpu_has_a_name():
    assert device_measure.device_name(CPU).strip()


def test_record_part_stores_prints_and_writes_each_part(tmp_path, capsys):
    out, result = tmp_path / "bench.json", {"preset": "tiny", "parts": {}}
    device_measure.record_part(result, "sample", {"total_s": 0.25, "peak_memory_gib": 1.5}, out, decimals=3)
    device_measure.record_part(result, "update", {"error": "out of memory: CUDA", "peak_memory_gib": 80.0}, out,
                               decimals=3)
    assert capsys.readouterr().out == "sample: 0.250 s, peak 1.50 GiB\nupdate: out of memory: CUDA\n"
    assert json.loads(out.read_text()) == result and list(result["parts"]) == ["sample", "update"]
