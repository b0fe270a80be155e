"""write_mp4: an mp4 of the frames, written atomically; ffmpeg stopping (a full disk) is one line."""

from __future__ import annotations

import imageio
import numpy as np
import pytest

from vla_rl.errors import RunStopped
from vla_rl.utils.video import write_mp4


def test_frames_become_an_mp4_of_as_many_frames(tmp_path):
    frames = np.random.default_rng(0).integers(0, 255, (5, 16, 16, 3), dtype=np.uint8)
    write_mp4(tmp_path / "v" / "a.mp4", frames, fps=10)
    assert len(imageio.mimread(tmp_path / "v" / "a.mp4")) == 5
    assert sorted(p.name for p in (tmp_path / "v").iterdir()) == ["a.mp4"]


def test_ffmpeg_stopping_is_one_line_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    """On a full disk ffmpeg printed "No space left on device" and imageio raised a broken pipe:
    a Ray traceback of about 100 lines from the final evaluation, and videos/final.tmp.mp4 left."""

    def full_disk(path, frames, **kwargs):
        path.write_bytes(b"\0" * 10)  # what ffmpeg had written
        raise OSError("[Errno 32] Broken pipe\n\nFFMPEG COMMAND:\nffmpeg -y ...\n\nFFMPEG STDERR OUTPUT:\n")

    monkeypatch.setattr(imageio, "mimwrite", full_disk)
    with pytest.raises(RunStopped, match=r"^writing the video .*final\.mp4 failed: ffmpeg stopped \(\[Errno 32\] "
                                         r"Broken pipe\); its messages above say why") as err:
        write_mp4(tmp_path / "final.mp4", np.zeros((2, 16, 16, 3), np.uint8), fps=10)
    assert "\n" not in str(err.value) and list(tmp_path.iterdir()) == []
