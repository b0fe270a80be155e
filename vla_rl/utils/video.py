"""Writing videos (mp4 through imageio's ffmpeg plugin)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_mp4(path: Path, frames: np.ndarray, fps: float) -> None:
    """Write ``frames`` ``(n, H, W, 3)`` uint8 to ``path`` at ``fps`` Hz, atomically (a temporary
    file renamed into place); creates the parent directory."""
    import imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    imageio.mimwrite(tmp, frames, fps=fps, macro_block_size=1)
    tmp.replace(path)
