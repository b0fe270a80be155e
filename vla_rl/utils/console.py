"""The driver's console: rich output that Ray's progress bars do not overwrite.

Ray draws the bars of its actors (``ray.experimental.tqdm_ray``) on the driver's terminal and
patches ``print`` to clear them around each call; rich writes to its file directly, so a line
printed while a bar is drawn lands inside the bar ("simulator rendering: ..." in the middle of
"creating environments"). :func:`driver_console` gives rich a stdout that asks Ray's bar manager
to clear its bars before each write and to draw them again after it, as Ray's own ``safe_print``
does.
"""

from __future__ import annotations

import io
import os
import sys

from rich.console import Console


class BelowRayBars(io.TextIOBase):
    """``sys.stdout`` (looked up at each call, so that a test's capture applies), written between
    Ray's progress bars when this process is a Ray driver."""

    def write(self, text: str) -> int:
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized():
            return sys.stdout.write(text)
        from ray.experimental import tqdm_ray

        bars = tqdm_ray.instance()
        bars.hide_bars()
        try:
            written = sys.stdout.write(text)
            sys.stdout.flush()
            return written
        finally:
            bars.unhide_bars()

    def flush(self) -> None:
        sys.stdout.flush()

    def isatty(self) -> bool:
        return sys.stdout.isatty()

    def fileno(self) -> int:
        return sys.stdout.fileno()


def driver_console() -> Console:
    """A rich console on :class:`BelowRayBars` (colour and width as for ``sys.stdout``). Lines are
    not wrapped (``soft_wrap``): rich would otherwise fold a path at the console's width (80
    columns in a log file: nohup, SLURM, a Ray job's log), and a run directory, plot or resume
    command could no longer be copied; tables still fit the width."""
    return Console(file=BelowRayBars(), soft_wrap=True)


WORKER_BARS = "VLA_RL_WORKER_BARS"
"""The variable :func:`vla_rl.utils.ray_utils.init_ray` gives every Ray process: ``"1"`` when the
driver's stderr is a terminal, ``"0"`` when it goes to a file or a pipe."""


def worker_bars() -> bool:
    """Whether a Ray worker draws progress bars (``tqdm_ray``): only for a driver on a terminal. In
    a log file each redraw of a worker's bar became a fragment of its own, twice, with colour codes,
    all on one line thousands of characters long; the driver's own bar and lines stay."""
    return os.environ.get(WORKER_BARS, "1") != "0"
