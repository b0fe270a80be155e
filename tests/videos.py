"""FFmpeg for the tests of LeRobot's AV1 videos. CI's imageio-ffmpeg binary encodes (SVT-AV1) and
decodes AV1; an FFmpeg without them (the offline GPU kit's OpenCV stand-in, a system FFmpeg built
without SVT-AV1) skips the tests that write or decode such videos, naming itself, and
:func:`fake_ffmpeg` stands in for one in the tests of that refusal."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from vla_rl.data.lerobot_format import VIDEO_CODEC, LeRobotFormatError, ffmpeg_codecs, ffmpeg_executable


def missing_av1() -> str | None:
    """Why this host's FFmpeg cannot write and read LeRobot's AV1 videos, or None when it can."""
    try:
        executable = ffmpeg_executable()
    except LeRobotFormatError as err:
        return str(err)
    if VIDEO_CODEC not in ffmpeg_codecs(executable, "encoders"):
        return f"the FFmpeg at {executable} has no {VIDEO_CODEC} encoder"
    if not {"av1", "codec:av1"} & ffmpeg_codecs(executable, "decoders"):
        return f"the FFmpeg at {executable} has no AV1 decoder"
    return None


needs_av1 = pytest.mark.skipif(missing_av1() is not None, reason=f"LeRobot's AV1 videos: {missing_av1()}")


def fake_ffmpeg(directory: Path) -> Path:
    """An executable that lists an H.264 encoder and decoder only, as FFmpeg's ``-encoders`` and
    ``-decoders`` do, and fails every conversion: give it as ``IMAGEIO_FFMPEG_EXE``."""
    path = directory / "ffmpeg-without-av1"
    path.write_text(f"""#!{sys.executable}
import sys
if "-encoders" in sys.argv or "-decoders" in sys.argv:
    print("Codecs:\\n V..... = Video\\n ------\\n V..... libx264   libx264 H.264 (codec h264)\\n V....D h264   H.264")
    sys.exit(0)
sys.stderr.write("this FFmpeg converts nothing\\n")
sys.exit(1)
""")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path
