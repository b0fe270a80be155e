"""The machine a worker computes on, as a run records it (``summary.json``'s ``hosts``).

A run repeats exactly on one machine, but not across machines: MuJoCo's and torch's floating
point follow the CPU (its vector instructions, torch's kernels chosen for them, the threads), so
the same code and seed give other episodes elsewhere (README, "Measured on the project machine":
the main job's seed 0 ended at 74% greedy on one 2-core machine and at 100% on another, with
identical code). Seed sweeps report the hosts their runs ran on, and ``vla-rl compare`` says when
two sweeps ran on different ones (:mod:`vla_rl.sweep`, :mod:`vla_rl.sweep_compare`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PACKAGES = ("torch", "numpy", "mujoco")
"""Packages whose version a host record names: the numerics of the policies and simulators."""


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, str | None]:
    """The CPU's name and instruction set: ``model name`` of ``/proc/cpuinfo`` (else
    ``platform.processor()``, else ``"unknown"``) and the first 12 hex digits of the SHA-256 of its
    sorted ``flags`` (None where there is no ``/proc/cpuinfo``). A virtual machine may name
    CPUs of different generations alike (``Intel(R) Xeon(R) Processor``); their flags differ."""
    model, flags = None, None
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model is None:
                model = value.strip() or None
            elif key.strip() == "flags" and flags is None:
                flags = hashlib.sha256(" ".join(sorted(value.split())).encode()).hexdigest()[:12]
    except OSError:
        pass
    return model or platform.processor() or "unknown", flags


def host_record(device: torch.device | None = None) -> dict[str, object]:
    """This process's machine: ``{"cpu": str, "cpu_flags": str | None (:func:`cpu_model`),
    "cpu_capability": str (torch's CPU kernels: "AVX512", "AVX2", "DEFAULT", ...), "logical_cpus":
    int, "gpu": str | None (the name of ``device`` when it is a CUDA device), "python": str,
    "torch", "numpy", "mujoco": str | None (their versions; None: not installed)}``."""
    import torch

    gpu = None
    if device is not None and device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    cpu, flags = cpu_model()
    return {"cpu": cpu, "cpu_flags": flags, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "logical_cpus": os.cpu_count(), "gpu": gpu, "python": platform.python_version(), **versions}


def describe(record: dict[str, object]) -> str:
    """A host record in one line: ``"Intel(R) Xeon(R) Processor (flags fc7df03f53a7, AVX512, 2
    CPUs), torch 2.13.0+cpu, numpy 1.26.4, mujoco 3.3.0, Python 3.11.7"`` (the GPU's name after
    the CPU when there is one)."""
    parts = [f"{record.get('cpu')} (flags {record.get('cpu_flags')}, {record.get('cpu_capability')}, "
             f"{record.get('logical_cpus')} CPUs)"]
    if record.get("gpu"):
        parts.append(str(record["gpu"]))
    parts += [f"{package} {record.get(package)}" for package in PACKAGES if record.get(package)]
    parts.append(f"Python {record.get('python')}")
    return ", ".join(parts)


def distinct(records: list[dict[str, object]]) -> list[dict[str, object]]:
    """``records`` without repeats, in first-seen order (a run's ranks on one machine: one record)."""
    seen: dict[tuple, dict[str, object]] = {}
    for record in records:
        seen.setdefault(tuple(sorted(record.items())), record)
    return list(seen.values())


def differences(a: list[dict[str, object]], b: list[dict[str, object]]) -> list[str]:
    """The fields in which two sets of host records differ (sorted; [] for the same hosts)."""
    if {tuple(sorted(r.items())) for r in a} == {tuple(sorted(r.items())) for r in b}:
        return []
    fields = sorted({key for record in (*a, *b) for key in record})
    return [key for key in fields if {str(r.get(key)) for r in a} != {str(r.get(key)) for r in b}] or fields
