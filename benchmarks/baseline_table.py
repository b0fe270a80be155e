"""What the benchmarks that time each part two ways in one run (a baseline and a change) share:
the timing of calls, and the report: a Markdown table with each row's speed-up over its part's
baseline row, and the JSON record."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch


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
            print(f"| {part} | {name} | {median:.4f} | {min(values):.4f} | {max(values):.4f} | "
                  f"{reference / median:.2f}x |")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result
