"""The machine a run records (vla_rl/utils/host.py): the CPU's name and flags read from a
/proc/cpuinfo, the GPU of the worker's device, the versions, and how two sets of records compare."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os

import torch

from vla_rl.utils.host import cpu_model, describe, differences, distinct, host_record

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx2 avx512f
bogomips\t: 4000.00

processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx2 avx512f
"""


def test_the_cpus_name_and_a_digest_of_its_sorted_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO)
    expected = hashlib.sha256(b"avx2 avx512f fpu sse2").hexdigest()[:12]  # sorted, one space apart
    assert cpu_model(cpuinfo) == ("Intel(R) Xeon(R) Processor", expected)
    cpuinfo.write_text(CPUINFO.replace("fpu sse2 avx2 avx512f", "avx512f  fpu avx2 sse2"))
    assert cpu_model(cpuinfo)[1] == expected  # the order of the flags is not the instruction set
    cpuinfo.write_text(CPUINFO.replace("avx512f", "avx512f avx512_bf16"))
    assert cpu_model(cpuinfo)[1] != expected  # one more instruction set: another machine
    assert cpu_model(tmp_path / "absent")[1] is None


def test_the_record_of_this_process():
    record = host_record()
    assert (record["cpu"], record["cpu_flags"]) == cpu_model()
    assert record["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert record["logical_cpus"] == os.cpu_count() and record["gpu"] is None
    assert record["torch"] == torch.__version__ and record["numpy"] == importlib.metadata.version("numpy")
    assert record["mujoco"] == importlib.metadata.version("mujoco")


def test_a_cuda_workers_record_names_its_gpu(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: asked.append(device) or "NVIDIA H200")
    assert host_record(torch.device("cuda", 1))["gpu"] == "NVIDIA H200"
    assert asked == [torch.device("cuda", 1)]  # the worker's own device, not the first GPU
    assert host_record(torch.device("cpu"))["gpu"] is None
    assert "NVIDIA H200" in describe(host_record(torch.device("cuda", 1)))


def test_records_compared_field_by_field():
    here = host_record()
    other = {**here, "cpu_flags": "0123456789ab", "logical_cpus": 8}
    assert distinct([here, dict(here), other]) == [here, other]
    assert differences([here], [dict(here)]) == []
    assert differences([here], [other]) == ["cpu_flags", "logical_cpus"]
    assert differences([here, other], [other, here]) == []  # the same machines, another order
    assert differences([here], [here, other]) == ["cpu_flags", "logical_cpus"]
