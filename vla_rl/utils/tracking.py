"""Metric logging of a run: JSON lines (one object per step) and tensorboard event files."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from vla_rl_core.run_layout import METRICS_FILE, TENSORBOARD_DIR

logger = logging.getLogger(__name__)


class MetricsLogger:
    """Appends step metrics to ``<run_dir>/metrics.jsonl`` and ``<run_dir>/tensorboard/``.

    Args:
        run_dir: the run directory.
        resume_step: when resuming, records with ``step > resume_step`` (written after the
            checkpoint the run continues from) are dropped first, so each step appears once.
    """

    def __init__(self, run_dir: Path, resume_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.path = run_dir / METRICS_FILE
        if resume_step is not None and self.path.exists():
            kept = [record for record in read_metrics(self.path) if record["step"] <= resume_step]
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(record) + "\n" for record in kept))
            tmp.replace(self.path)
        self._file = self.path.open("a")
        self._writer = SummaryWriter(str(run_dir / TENSORBOARD_DIR), purge_step=None if resume_step is None else resume_step + 1)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Write one record ``{"step": step, **metrics}`` (non-finite values are written as null)."""
        record = {"step": step, **{k: (v if math.isfinite(v) else None) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._file.close()
        self._writer.close()


def read_metrics(path: Path) -> list[dict]:
    """All records of a ``metrics.jsonl`` file, in order. A last line that is not JSON (a process
    killed while it wrote it) is left out with a warning.

    Raises:
        ValueError: a line before the last is not JSON (the message names the file and the line).
    """
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number < len(lines):
                raise ValueError(f"{path}: line {number} is not a JSON record ({error})") from None
            logger.warning("%s: its last line is cut short (the run was killed while writing it); left out", path)
    return records
