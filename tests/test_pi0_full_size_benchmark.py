"""benchmarks/pi0_full_size.py on the tiny preset (seconds, on the test device): it runs its three
parts and writes finite, positive figures; and its builder makes the full-size π0 in bfloat16
without a float32 copy (on the meta device: no memory)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pi0_benchmark():
    spec = importlib.util.spec_from_file_location("pi0_full_size", REPO_ROOT / "benchmarks" / "pi0_full_size.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_out_no_record_is_written(pi0_benchmark, tmp_path, monkeypatch, capsys, torch_one_thread):
    """--out defaulted to the committed benchmarks/pi0_full_size.json (the CPU record the docs
    quote), which a quick run such as --preset tiny overwrote."""
    committed = REPO_ROOT / "benchmarks" / "pi0_full_size.json"
    before = committed.read_bytes()
    monkeypatch.chdir(tmp_path)
    pi0_benchmark.main(["--preset", "tiny", "--device", "cpu", "--warmup", "0", "--repeats", "1", "--parts", "sample"])
    assert committed.read_bytes() == before and not list(tmp_path.iterdir())
    assert "no JSON record written (give --out FILE to keep one)" in capsys.readouterr().out


def test_tiny_preset_writes_finite_positive_figures(pi0_benchmark, device, tmp_path, torch_one_thread):
    out = tmp_path / "pi0.json"
    pi0_benchmark.main(["--preset", "tiny", "--device", str(device), "--warmup", "1", "--repeats", "2",
                        "--cameras", "2", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["preset"] == "tiny" and result["dtype"] == "bfloat16" and result["device"] == str(device)
    assert 0 < result["trainable_parameters"] < result["parameters"]  # the never-used VLM parameters are frozen
    assert result["prefix_tokens"] == 2 * 4 + 8  # 2 cameras of 4 patches, 8 prompt tokens
    assert set(result["parts"]) == {"sample", "bc", "rl"}
    for part, entry in result["parts"].items():
        keys = ["forward_s", "total_s", "peak_memory_gib"] + ([] if part == "sample" else ["backward_s"])
        for key in keys:
            assert math.isfinite(entry[key]) and entry[key] > 0, (part, key, entry[key])
        assert len(entry["calls_s"]) == 2
    assert "backward_s" not in result["parts"]["sample"]
    assert torch.get_default_dtype() == torch.float32  # restored after the build


def test_builder_makes_the_published_size_in_the_requested_dtype(pi0_benchmark):
    from policies.pi0.configuration_pi0 import pi0_model_preset

    model = pi0_benchmark.build_model(pi0_model_preset("pi0"), torch.device("meta"), torch.bfloat16)
    parameters = list(model.parameters())
    assert sum(p.numel() for p in parameters) == 3_238_048_528
    assert {name: p.dtype for name, p in model.named_parameters()} == model.parameter_dtypes(torch.bfloat16)
    kept = sum(p.numel() for p in parameters if p.dtype == torch.float32)  # openpi's float32 exceptions
    assert 0 < kept < 5e6  # SigLIP's embeddings, the RMSNorm weights, the projections: 0.1% of the model
    assert {p.device.type for p in parameters} == {"meta"}


@pytest.mark.parametrize("script", ["pi0_full_size.py", "openvla_oft_full_size.py", "scoring_memory.py"])
def test_cuda_on_a_machine_without_it_is_refused_in_one_line(script):
    """--device cuda on a CPU-only machine was a traceback ("Torch not compiled with CUDA enabled")."""
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = subprocess.run([sys.executable, f"benchmarks/{script}", "--device", "cuda"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"{script}: error: --device cuda: this machine has no CUDA")
