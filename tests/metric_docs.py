"""The metric names docs/metrics.md documents, as patterns a logged name is checked against."""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path

METRICS_DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


@cache
def documented_patterns() -> tuple[re.Pattern, ...]:
    """One pattern per name in the first column of docs/metrics.md's tables. Shorthands: ``_min``
    (a suffix of the cell's last full name), ``.../ci_low`` (that name's last part replaced),
    ``<task>`` (one path part), a trailing ``...`` or ``*`` (anything)."""
    patterns = []
    for line in METRICS_DOC.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        base = ""  # the cell's last name written in full
        for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
            if name.startswith("_"):
                name = base + name
            elif name.startswith(".../"):
                name = base.rsplit("/", 1)[0] + name[3:]
            else:
                base = name
            regex = re.escape(name).replace(r"\.\.\.", ".*").replace(r"\*", ".*")
            patterns.append(re.compile(re.sub(r"<[a-z]+>", "[^/]+", regex)))
    return tuple(patterns)


def undocumented(names: Iterable[str]) -> list[str]:
    """The metric names (``step`` aside) that no name of docs/metrics.md stands for."""
    return sorted(name for name in set(names) - {"step"}
                  if not any(pattern.fullmatch(name) for pattern in documented_patterns()))


def row_names(name: str) -> set[str]:
    """The names of the docs/metrics.md table row whose first column holds ``name`` (written in full)."""
    for line in METRICS_DOC.read_text().splitlines():
        names = re.findall(r"`([^`]+)`", line.split("|")[1]) if line.startswith("| `") else []
        if name in names:
            return set(names)
    raise AssertionError(f"docs/metrics.md has no row naming {name}")
