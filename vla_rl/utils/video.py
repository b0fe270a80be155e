"""Writing videos (mp4 through imageio's ffmpeg plugin)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vla_rl.errors import RunStopped


def write_mp4(path: Path, frames: np.ndarray, fps: float) -> None:
    """Write ``frames`` ``(n, H, W, 3)`` uint8 to ``path`` at ``fps`` Hz, atomically (a temporary
    file renamed into place); creates the parent directory.

    Raises:
        RunStopped: ffmpeg stopped (a full disk: it prints why, and imageio raises a broken
            pipe), naming the video; the temporary file is removed.
    """
    import imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    try:
        imageio.mimwrite(tmp, frames, fps=fps, macro_block_size=1)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise RunStopped(f"writing the video {path} failed: ffmpeg stopped ({reason}); its messages above say why "
                         "(e.g. No space left on device)") from None
    tmp.replace(path)
