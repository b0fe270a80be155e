"""Seconds and peak memory of benchmark calls on one torch device (CUDA or CPU), shared by
benchmarks/pi0_full_size.py and benchmarks/openvla_oft_full_size.py.

A measured *step* is a function of no arguments that runs one call of a part and returns its
seconds by phase, ``{"forward_s": ..., "backward_s": ..., ...}`` (the phases it has; each timed
with :func:`timed`). :func:`measure` runs it ``warmup + repeats`` times and reports the median
seconds of each phase and of their sum, and the peak memory over all the calls.

Units: seconds (``*_s``, wall clock, ``time.perf_counter``, the device synchronised before and
after each timed call), GiB (``*_gib``, 2**30 bytes). Peak memory means:

- on CUDA, ``peak_memory_gib``: ``torch.cuda.max_memory_allocated``, the most bytes torch's
  tensors held at once since :func:`reset_peak_memory` (not the CUDA context, nor blocks the
  caching allocator keeps free); ``peak_reserved_gib``: ``max_memory_reserved``, what the caching
  allocator held from the driver (allocated plus cached free blocks), closer to what
  ``nvidia-smi`` shows;
- on CPU, ``peak_memory_gib``: the peak resident set size of the whole process
  (``resource.getrusage``'s ``ru_maxrss``: Python, libraries and every tensor), reset through
  ``/proc/self/clear_refs`` where Linux allows it, else the process's peak so far
  (``peak_reset_before_part`` says which).

Both include the model's weights when they live on the device.

The scripts also share their measuring options (:func:`add_measuring_arguments`), the recording
of each part in their JSON as soon as it is measured (:func:`record_part`) and their table of
the parts (:func:`print_parts_table`).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vla_rl.errors import out_of_memory_message

#: Bytes per GiB.
GIB = 2**30

#: A measured call: runs once, returns its seconds by phase (``{"forward_s": 0.12, ...}``).
Step = Callable[[], dict[str, float]]


def add_measuring_arguments(parser: argparse.ArgumentParser, parts: tuple[str, ...],
                            repeats_help: str = "measured calls per part") -> None:
    """The options of where and how often each part is measured: ``--device`` (default CUDA where
    there is one), ``--parts`` (of ``parts``, all by default), ``--warmup`` (1), ``--repeats`` (3)
    and ``--threads`` (torch's intra-op threads)."""
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--parts", nargs="+", choices=parts, default=list(parts))
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured calls per part first")
    parser.add_argument("--repeats", type=int, default=3, help=repeats_help)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU); default torch's")


def check_device(parser: argparse.ArgumentParser, device: str) -> None:
    """Refuse ``--device`` in one line (``parser.error``, exit status 2) when it names no torch
    device, or CUDA on a machine without one, before anything is built."""
    try:
        kind = torch.device(device).type
    except RuntimeError:
        parser.error(f"--device {device!r} is no torch device (e.g. cpu, cuda, cuda:1)")
    if kind == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {device}: this machine has no CUDA device torch can use (torch "
                     f"{torch.__version__}); measure on the CPU with --device cpu")


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (CUDA); nothing to wait for on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> bool:
    """Reset the peak-memory counter :func:`peak_memory` reads; False when it cannot be (CPU
    outside Linux, or where ``/proc/self/clear_refs`` is not writable)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM, which getrusage's ru_maxrss reads
    except OSError:
        return False
    return True


def peak_memory(device: torch.device) -> dict:
    """The peak memory since the last :func:`reset_peak_memory`, in GiB (see the module docstring
    for what it counts): ``peak_memory_gib``, on CUDA also ``peak_reserved_gib``, and
    ``memory_kind`` (``"cuda allocated"`` or ``"peak RSS"``)."""
    if device.type == "cuda":
        return {"peak_memory_gib": torch.cuda.max_memory_allocated(device) / GIB,
                "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB, "memory_kind": "cuda allocated"}
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS, KiB on Linux
    return {"peak_memory_gib": max_rss * (1 if sys.platform == "darwin" else 1024) / GIB, "memory_kind": "peak RSS"}


def timed(device: torch.device, fn: Callable[[], object]) -> tuple[object, float]:
    """``fn()`` and its wall-clock seconds, ``device`` synchronised before and after."""
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - start


def measure(step: Step, device: torch.device, warmup: int, repeats: int) -> dict:
    """Run ``step`` ``warmup`` times unmeasured, then ``repeats`` times measured.

    Returns:
        The median seconds of each of ``step``'s phases (its keys, in its order), ``total_s`` (the
        median of the per-call sums), ``calls_s`` (those sums, one per measured call), the
        :func:`peak_memory` fields over all the calls, and ``peak_reset_before_part`` (whether the
        peak counter could be reset first).
    """
    reset = reset_peak_memory(device)
    calls = []
    for call in range(warmup + repeats):
        seconds = step()
        if call >= warmup:
            calls.append(seconds)
    totals = [sum(seconds.values()) for seconds in calls]
    timing = {key: statistics.median(seconds[key] for seconds in calls) for key in calls[0]}
    return {**timing, "total_s": statistics.median(totals), "calls_s": totals, **peak_memory(device),
            "peak_reset_before_part": reset}


def measure_or_out_of_memory(step: Step, model: torch.nn.Module, device: torch.device, warmup: int,
                             repeats: int) -> dict:
    """:func:`measure`, or ``{"error": "out of memory: ...", **peak_memory(device)}`` when the part
    runs out of memory (``torch.OutOfMemoryError``, ``MemoryError`` or the CPU allocator's "can't
    allocate memory"): ``model``'s gradients and CUDA's cached blocks are then freed, so that the
    next part may still fit. Any other error propagates."""
    try:
        return measure(step, device, warmup, repeats)
    except (MemoryError, RuntimeError) as error:  # torch.OutOfMemoryError is a RuntimeError
        first_line = out_of_memory_message(error)
        if first_line is None:
            raise
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return {"error": f"out of memory: {first_line[:300]}", **peak_memory(device)}


def record_part(result: dict, part: str, entry: dict, out: Path | None, decimals: int) -> None:
    """Store ``entry`` (:func:`measure_or_out_of_memory`'s) as ``result["parts"][part]``, print its
    total seconds and peak GiB (``decimals`` digits) or its error, and rewrite the JSON ``out``
    (None: none) with ``result``, so that what is measured survives a later part's failure."""
    result["parts"][part] = entry
    print(f"{part}: " + (entry["error"] if "error" in entry else
                         f"{entry['total_s']:.{decimals}f} s, peak {entry['peak_memory_gib']:.2f} GiB"), flush=True)
    if out is not None:
        out.write_text(json.dumps(result, indent=2) + "\n")


def add_out_argument(parser) -> None:
    """The ``--out FILE`` option of a benchmark: its JSON record, none by default (the committed
    records are rewritten only when named)."""
    parser.add_argument("--out", "--json", dest="out", type=Path, default=None,
                        help="write the JSON record there (default: none; the tables are printed)")


def wrote(out: Path | None) -> None:
    """Print where the JSON record went, or how to keep one."""
    print(f"wrote {out}" if out is not None else "no JSON record written (give --out FILE to keep one)")


def print_parts_table(title: str, parts: dict[str, dict], what: dict[str, str], phases: tuple[str, ...],
                      decimals: int, rates: dict[str, Callable[[dict], str]] | None = None, width: int = 160) -> None:
    """Print a table (rich) of one row per entry of ``parts`` (:func:`measure_or_out_of_memory`'s):
    the part, ``what[part]``, the median seconds of each of ``phases`` (column ``forward s`` for
    ``forward_s``; blank where the part has no such phase) and ``total_s`` to ``decimals`` digits,
    the peak GiB, then one column per entry of ``rates`` (heading: the function of an entry that
    gives its cell). A part that ran out of memory shows its error in the first seconds column."""
    from rich.console import Console
    from rich.table import Table

    rates = rates or {}
    table = Table(title=title)
    for column in ("part", "what", *(f"{phase.removesuffix('_s')} s" for phase in phases), "total s", "peak GiB",
                   *rates):
        table.add_column(column, justify="left" if column in ("part", "what") else "right")
    for part, entry in parts.items():
        peak = f"{entry['peak_memory_gib']:.2f}"
        if "error" in entry:
            table.add_row(part, what[part], entry["error"][:60], *[""] * len(phases), peak, *[""] * len(rates))
            continue
        seconds = [f"{entry[key]:.{decimals}f}" if key in entry else "" for key in (*phases, "total_s")]
        table.add_row(part, what[part], *seconds, peak, *(cell(entry) for cell in rates.values()))
    Console(width=width).print(table)


def device_name(device: torch.device) -> str:
    """The GPU's name on CUDA, else the CPU's model name (``/proc/cpuinfo``, or ``platform``'s)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
