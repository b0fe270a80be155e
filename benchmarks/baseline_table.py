"""What the benchmarks that time each part two ways in one run (a baseline and a change) share:
the timing of calls, and the report: a Markdown table with each row's speed-up over its part's
baseline row, and the JSON record."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch


def parse_arguments(parser: argparse.ArgumentParser, argv: list[str] | None,
                    counts: Sequence[str]) -> argparse.Namespace:
    """``parser``'s arguments of ``argv``; each option of ``counts`` (``"repeats"`` for
    ``--repeats``) must be at least 1, else the parser exits with a one-line error (a 0 was a
    StatisticsError at the end of the run)."""
    args = parser.parse_args(argv)
    for name in counts:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def write_record(out: Path, result: dict) -> None:
    """Write the JSON record ``result`` to ``out``, its folder made where missing."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def seconds(call, repeats: int) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls of ``call``, after one untimed warm-up call."""
    call()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def report(parts: dict[str, dict[str, list[float]]], baseline: str, column: str, title: str,
           args: argparse.Namespace) -> dict:
    """Print the table of ``parts`` and write their JSON to ``args.out`` (when set).

    Args:
        parts: ``{part: {row: seconds of each call}}``; every part has a ``baseline`` row.
        baseline: the baseline row's name (``speedup_over_<baseline>`` of each row: the baseline's
            median over the row's).
        column: the table's heading of the row names.
        title: printed above the table.
        args: the benchmark's parsed arguments (recorded as its settings; ``args.out``: a path or None).

    Returns:
        The JSON record: ``settings``, ``machine`` and ``parts`` (``median_s``, ``min_s``,
        ``max_s``, ``seconds`` and the speed-up of each row).
    """
    result = {"settings": {**vars(args), "out": str(args.out) if args.out else None},
              "machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
              "parts": {}}
    print(title)
    print(f"| part | {column} | median s | min s | max s | speed-up over {baseline} |")
    print("|---|---|---|---|---|---|")
    for part, rows in parts.items():
        reference = statistics.median(rows[baseline])
        result["parts"][part] = {}
        for name, values in rows.items():
            median = statistics.median(values)
            record = {"median_s": median, "min_s": min(values), "max_s": max(values), "seconds": values,
                      f"speedup_over_{baseline}": reference / median}
            result["parts"][part][name] = record
            print(f"| {part} | {name} | {median:.4g} | {min(values):.4g} | {max(values):.4g} | "
                  f"{reference / median:.2f}x |")
    if args.out is not None:
        write_record(args.out, result)
    return result
