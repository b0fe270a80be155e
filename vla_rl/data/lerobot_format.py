"""LeRobot datasets (format ``v3.0``, as ``lerobot`` 0.4.4 writes and reads them) without LeRobot.

LeRobot's own packages (``lerobot``, ``lerobot-dataset``) pin ``torch < 2.11`` and
``huggingface-hub < 0.36`` and cannot be installed beside this project, so the format is written
here and read by :mod:`vla_rl.data.lerobot_reader`, with pyarrow and FFmpeg (``imageio-ffmpeg``'s
binary); compatibility is proven against
LeRobot itself in a separate environment (``scripts/lerobot_reference_env.sh``): the reader reads
datasets LeRobot's API wrote (``tests/fixtures/lerobot/``), and LeRobot's ``LeRobotDataset`` loads
what the writer writes, frame for frame (``tests/fixtures/lerobot/check_with_lerobot.py``). The
layout, field by field: ``tests/fixtures/lerobot/FORMAT.md``.

A dataset root holds ``meta/info.json`` (version, fps, features), ``meta/tasks.parquet`` (task
strings as the pandas index), ``meta/episodes/chunk-000/file-000.parquet`` (one row per
episode), ``meta/stats.json``, ``data/chunk-000/file-000.parquet`` (one row per frame) and, per
video feature, ``videos/<feature>/chunk-000/file-000.mp4`` (the episodes' frames back to back).
The writer puts every episode in one data file and one video file per feature (LeRobot splits
files at 100 / 200 MB; its reader reads any number of files, ours too).
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CODEBASE_VERSION = "v3.0"
INFO_PATH, STATS_PATH, TASKS_PATH = "meta/info.json", "meta/stats.json", "meta/tasks.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DEFAULT_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
"""The columns LeRobot adds to every dataset (``lerobot.datasets.utils.DEFAULT_FEATURES``)."""

VIDEO_CODEC = "libsvtav1"
"""LeRobot's default encoder (AV1), with its settings: yuv420p, crf 30, GOP 2, preset 12."""
VIDEO_OPTIONS = ("-crf", "30", "-g", "2", "-preset", "12")
QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}


class LeRobotFormatError(ValueError):
    """A directory is not a LeRobot v3 dataset we can read, or a feature does not fit (one line)."""


def ffmpeg_executable() -> str:
    """The FFmpeg that imageio-ffmpeg runs: ``IMAGEIO_FFMPEG_EXE`` if set, else its bundled binary.

    Raises:
        LeRobotFormatError: imageio-ffmpeg finds no FFmpeg.
    """
    import imageio_ffmpeg

    try:
        return imageio_ffmpeg.get_ffmpeg_exe()
    except RuntimeError as err:
        raise LeRobotFormatError(f"no FFmpeg for LeRobot's videos: {first_line(err)}") from None


@functools.lru_cache(maxsize=8)
def ffmpeg_codecs(executable: str, kind: str) -> frozenset[str]:
    """What ``executable -hide_banner -<kind>`` lists (``kind``: ``encoders`` or ``decoders``):
    each entry's name and, for entries of another codec's name, ``codec:<codec>`` (``libsvtav1``
    and ``codec:av1`` for SVT-AV1's encoder). Empty when the program cannot be run."""
    try:
        listing = subprocess.run([executable, "-hide_banner", f"-{kind}"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    names: set[str] = set()
    for line in listing.split("------", 1)[-1].splitlines():
        words = line.split()
        if len(words) >= 2:
            names.add(words[1])
            if "(codec " in line:
                names.add("codec:" + line.rsplit("(codec ", 1)[1].split(")", 1)[0])
    return frozenset(names)


def check_video_encoder() -> None:
    """Refuse, before any frame is written, an FFmpeg without :data:`VIDEO_CODEC` (LeRobot's AV1
    encoder): a system FFmpeg built without SVT-AV1, say, or a stand-in that would write another
    codec under the ``av1`` that ``meta/info.json`` states.

    Raises:
        LeRobotFormatError: no FFmpeg, or one that lists no ``libsvtav1`` encoder (naming its path).
    """
    executable = ffmpeg_executable()
    if VIDEO_CODEC not in ffmpeg_codecs(executable, "encoders"):
        raise LeRobotFormatError(f"the FFmpeg at {executable} has no {VIDEO_CODEC} encoder, which LeRobot's AV1 "
                                 "videos need: set IMAGEIO_FFMPEG_EXE to an FFmpeg built with SVT-AV1 "
                                 "(imageio-ffmpeg's own binary is)")


def _pandas_index_metadata() -> bytes:
    """The ``pandas`` schema metadata that makes ``__index_level_0__`` the DataFrame's index
    (LeRobot reads a frame's task as ``tasks.iloc[task_index].name``)."""
    return json.dumps({
        "index_columns": ["__index_level_0__"], "column_indexes": [],
        "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
                     "numpy_type": "int64", "metadata": None},
                    {"name": None, "field_name": "__index_level_0__", "pandas_type": "unicode",
                     "numpy_type": "object", "metadata": None}],
    }).encode()


class LeRobotWriter:
    """Write a LeRobot v3.0 dataset, one episode at a time.

    Args:
        root: the dataset root, a new directory.
        fps: frames per second (an integer, as LeRobot stores it).
        robot_type: LeRobot's ``robot_type``.
        features: ``{name: {"dtype", "shape", "names"}}`` in LeRobot's terms: ``dtype`` ``float32``,
            ``float64``, ``int64``, ``bool`` or ``video`` (``shape`` ``[H, W, 3]``, uint8 frames,
            even ``H`` and ``W``); names without ``/``; not the default columns.

    Raises:
        LeRobotFormatError: ``root`` exists, ``fps`` is not a positive integer, a feature is
            malformed, or a video feature is asked for and FFmpeg has no AV1 encoder
            (:func:`check_video_encoder`).
    """

    def __init__(self, root: str | Path, fps: float, robot_type: str, features: Mapping[str, Mapping[str, Any]]) -> None:
        self.root = Path(root)
        if self.root.exists():
            raise LeRobotFormatError(f"{self.root} exists; write a dataset into a new directory")
        if not float(fps).is_integer() or fps <= 0:
            raise LeRobotFormatError(f"LeRobot datasets have an integer fps, got {fps}")
        for name, feature in features.items():
            if "/" in name or name in DEFAULT_FEATURES:
                raise LeRobotFormatError(f"feature {name!r}: names must not contain '/' nor be a default column")
            if feature["dtype"] not in ("float32", "float64", "int64", "bool", "video"):
                raise LeRobotFormatError(f"feature {name!r}: dtype {feature['dtype']!r} is not supported here")
            if feature["dtype"] == "video" and (len(feature["shape"]) != 3 or feature["shape"][2] != 3
                                                or feature["shape"][0] % 2 or feature["shape"][1] % 2):
                raise LeRobotFormatError(f"video feature {name!r}: shape must be [H, W, 3] with even H and W "
                                         f"(yuv420p), got {feature['shape']}")
        if any(feature["dtype"] == "video" for feature in features.values()):
            check_video_encoder()
        self.fps = int(fps)
        self.robot_type = robot_type
        self.features = {name: {"dtype": f["dtype"], "shape": list(f["shape"]), "names": f.get("names")}
                         for name, f in features.items()}
        self.videos = [name for name, f in self.features.items() if f["dtype"] == "video"]
        self.tasks: dict[str, int] = {}
        self.episodes: list[dict[str, Any]] = []
        self.columns: dict[str, list[np.ndarray]] = {name: [] for name in self.features if name not in self.videos}
        self.episode_stats: list[dict[str, dict[str, Any]]] = []  # per episode: feature -> feature_stats
        self.video_frames = {name: 0 for name in self.videos}
        self.frames = 0
        self._encoders: dict[str, Any] = {}
        self.root.mkdir(parents=True)

    def add_episode(self, frames: Mapping[str, np.ndarray], task: str) -> int:
        """Append one episode: every feature's ``(T, *shape)`` array (uint8 ``(T, H, W, 3)`` for
        videos), all with the same ``T`` >= 1, and the episode's task string.

        Returns:
            the episode index.

        Raises:
            LeRobotFormatError: a feature is missing or extra, or an array has the wrong shape or dtype.
        """
        if set(frames) != set(self.features):
            raise LeRobotFormatError(f"episode features {sorted(frames)} are not the dataset's {sorted(self.features)}")
        lengths = {len(array) for array in frames.values()}
        if len(lengths) != 1 or 0 in lengths:
            raise LeRobotFormatError(f"every feature of an episode needs the same number >= 1 of frames, got "
                                     f"{ {name: len(a) for name, a in frames.items()} }")
        length = lengths.pop()
        episode = len(self.episodes)
        row: dict[str, Any] = {"episode_index": episode, "tasks": [task], "length": length,
                               "data/chunk_index": 0, "data/file_index": 0, "dataset_from_index": self.frames,
                               "dataset_to_index": self.frames + length}
        for name, feature in self.features.items():
            array = np.asarray(frames[name])
            shape = tuple(feature["shape"])
            if array.shape[1:] != shape:
                raise LeRobotFormatError(f"episode {episode}: {name} has frames of shape {array.shape[1:]}, the "
                                         f"feature's is {shape}")
            if feature["dtype"] == "video":
                if array.dtype != np.uint8:
                    raise LeRobotFormatError(f"episode {episode}: video {name} must be uint8, got {array.dtype}")
                start = self.video_frames[name]
                self._encode(name, array)
                self.video_frames[name] += length
                row |= {f"videos/{name}/chunk_index": 0, f"videos/{name}/file_index": 0,
                        f"videos/{name}/from_timestamp": start / self.fps,
                        f"videos/{name}/to_timestamp": (start + length) / self.fps}
            else:
                self.columns[name].append(array.astype(feature["dtype"]))
        task_index = self.tasks.setdefault(task, len(self.tasks))
        defaults = {"timestamp": (np.arange(length) / self.fps).astype(np.float32),
                    "frame_index": np.arange(length, dtype=np.int64),
                    "episode_index": np.full(length, episode, dtype=np.int64),
                    "index": np.arange(self.frames, self.frames + length, dtype=np.int64),
                    "task_index": np.full(length, task_index, dtype=np.int64)}
        for name, values in defaults.items():
            self.columns.setdefault(name, []).append(values)
        # the episode's statistics, as LeRobot's episode writer stores them (stats/<feature>/<stat>):
        # its editing tools (delete_episodes, split_dataset) rebuild meta/stats.json from these
        stats = {name: feature_stats(np.asarray(frames[name]), feature["dtype"]) for name, feature in self.features.items()}
        stats |= {name: feature_stats(values[:, None], DEFAULT_FEATURES[name]["dtype"]) for name, values in defaults.items()}
        row |= {f"stats/{name}/{stat}": value for name, feature in stats.items() for stat, value in feature.items()}
        row |= {"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}
        self.episode_stats.append(stats)
        self.episodes.append(row)
        self.frames += length
        return episode

    def finalize(self) -> Path:
        """Write the data, episode, task, stats and info files and close the videos.

        Returns:
            the dataset root.

        Raises:
            LeRobotFormatError: no episode was added.
        """
        if not self.episodes:
            raise LeRobotFormatError("a LeRobot dataset needs at least one episode")
        for name, encoder in self._encoders.items():
            encoder.close()
            (self.root / VIDEO_PATH.format(video_key=name, chunk_index=0, file_index=0)).chmod(0o644)
        columns = {}
        for name in [*[n for n in self.features if n not in self.videos], *DEFAULT_FEATURES]:
            values = np.concatenate(self.columns[name])
            columns[name] = _arrow_column(values)
        _write_parquet(self.root / DATA_PATH.format(chunk_index=0, file_index=0), pa.table(columns))
        _write_parquet(self.root / EPISODES_PATH.format(chunk_index=0, file_index=0),
                       pa.Table.from_pylist(self.episodes))
        tasks = sorted(self.tasks, key=self.tasks.get)
        table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()),
                          "__index_level_0__": pa.array(tasks, pa.string())})
        _write_parquet(self.root / TASKS_PATH, table.replace_schema_metadata({b"pandas": _pandas_index_metadata()}))
        (self.root / STATS_PATH).write_text(json.dumps(aggregate_stats(self.episode_stats), indent=4))
        features = {name: dict(feature) for name, feature in self.features.items()}
        for name in self.videos:
            height, width, channels = features[name]["shape"]
            features[name]["names"] = ["height", "width", "channels"]
            features[name]["info"] = {"video.height": height, "video.width": width, "video.codec": "av1",
                                      "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": self.fps,
                                      "video.channels": channels, "has_audio": False}
        info = {"codebase_version": CODEBASE_VERSION, "robot_type": self.robot_type,
                "total_episodes": len(self.episodes), "total_frames": self.frames, "total_tasks": len(tasks),
                "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200, "fps": self.fps,
                "splits": {"train": f"0:{len(self.episodes)}"}, "data_path": DATA_PATH,
                "video_path": VIDEO_PATH if self.videos else None, "features": {**features, **DEFAULT_FEATURES}}
        (self.root / INFO_PATH).write_text(json.dumps(info, indent=4, ensure_ascii=False))
        return self.root

    def _encode(self, name: str, frames: np.ndarray) -> None:
        import os

        import imageio_ffmpeg

        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1's own banner and warnings on stderr: errors only
        if name not in self._encoders:
            path = self.root / VIDEO_PATH.format(video_key=name, chunk_index=0, file_index=0)
            path.parent.mkdir(parents=True, exist_ok=True)
            height, width, _ = self.features[name]["shape"]
            encoder = imageio_ffmpeg.write_frames(str(path), (width, height), fps=self.fps, codec=VIDEO_CODEC,
                                                  pix_fmt_in="rgb24", pix_fmt_out="yuv420p", quality=None,
                                                  macro_block_size=1, output_params=list(VIDEO_OPTIONS),
                                                  ffmpeg_log_level="error")
            encoder.send(None)  # start the generator
            self._encoders[name] = encoder
        for frame in frames:
            self._encoders[name].send(np.ascontiguousarray(frame))


def feature_stats(values: np.ndarray, dtype: str) -> dict[str, Any]:
    """LeRobot's statistics of one feature over one episode's frames (``stats/<feature>/<stat>``
    of ``meta/episodes``): ``min``, ``max``, ``mean``, ``std`` (population), ``count`` ``[frames]``
    and the quantiles ``q01`` ... ``q99`` (numpy's linear interpolation), per dimension; videos per
    channel in [0, 1], shaped ``(3, 1, 1)``, over every pixel of every frame. Exact here (LeRobot
    interpolates the quantiles from a histogram of each episode, and samples and downscales video
    frames).

    Args:
        values: ``(frames, *shape)``; uint8 ``(frames, H, W, 3)`` for a video.
        dtype: the feature's LeRobot dtype.
    """
    if dtype == "video":
        return _video_stats(values)
    flat = values.reshape(len(values), -1)
    as_float = flat.astype(np.float64)
    out = {"min": flat.min(0).tolist(), "max": flat.max(0).tolist(), "mean": as_float.mean(0).tolist(),
           "std": as_float.std(0).tolist(), "count": [len(values)]}
    out |= {name: np.quantile(as_float, q, axis=0).tolist() for name, q in QUANTILES.items()}
    return out


def _video_stats(frames: np.ndarray) -> dict[str, Any]:
    """:func:`feature_stats` of uint8 video frames, from each channel's 256-bin histogram (exact:
    the values are the 256 levels; no float copy of the pixels)."""
    levels = np.arange(256, dtype=np.float64) / 255.0
    counts = np.stack([np.bincount(frames[..., c].reshape(-1), minlength=256) for c in range(3)])  # (3, 256)
    total = counts.sum(1, keepdims=True)  # (3, 1)
    mean = (counts * levels).sum(1) / total[:, 0]
    per_channel = {"min": levels[(counts > 0).argmax(1)], "max": levels[255 - (counts[:, ::-1] > 0).argmax(1)],
                   "mean": mean, "std": np.sqrt((counts * (levels - mean[:, None]) ** 2).sum(1) / total[:, 0])}
    below = np.cumsum(counts, axis=1)  # (3, 256): pixels at or below each level
    for name, q in QUANTILES.items():
        position = (total[:, 0] - 1) * q  # in the sorted pixels, as np.quantile's linear method
        low = np.floor(position)
        value_at = [levels[[np.searchsorted(below[c], k[c], side="right") for c in range(3)]]
                    for k in (low, np.minimum(low + 1, total[:, 0] - 1))]
        per_channel[name] = value_at[0] + (position - low) * (value_at[1] - value_at[0])
    out = {name: np.asarray(value).reshape(3, 1, 1).tolist() for name, value in per_channel.items()}
    return {**out, "count": [len(frames)]}


def aggregate_stats(episode_stats: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """``meta/stats.json`` from the episodes' :func:`feature_stats`, as LeRobot 0.4.4's
    ``aggregate_stats`` (``lerobot/datasets/compute_stats.py``) combines them: ``min`` / ``max``
    of the episodes', ``mean`` weighted by the frame counts, ``std`` from the episodes' means and
    variances (the parallel algorithm), ``count`` summed, and each quantile the count-weighted
    mean of the episodes' (an approximation: the quantiles of the pooled frames are not
    recoverable; later LeRobot versions keep the episodes' lowest / highest instead).

    Args:
        episode_stats: per episode, ``{feature: feature_stats(...)}``, the same features in each.
    """
    out: dict[str, dict[str, Any]] = {}
    for name in episode_stats[0]:
        stats = [episode[name] for episode in episode_stats]
        counts = np.array([s["count"][0] for s in stats], dtype=np.float64)
        means = np.array([s["mean"] for s in stats], dtype=np.float64)
        weights = counts.reshape(-1, *[1] * (means.ndim - 1)) / counts.sum()
        mean = (means * weights).sum(0)
        variance = ((np.array([s["std"] for s in stats], dtype=np.float64) ** 2 + (means - mean) ** 2) * weights).sum(0)
        feature = {"min": np.min([s["min"] for s in stats], axis=0).tolist(),
                   "max": np.max([s["max"] for s in stats], axis=0).tolist(),
                   "mean": mean.tolist(), "std": np.sqrt(variance).tolist(), "count": [int(counts.sum())]}
        feature |= {q: (np.array([s[q] for s in stats], dtype=np.float64) * weights).sum(0).tolist()
                    for q in QUANTILES}
        out[name] = feature
    return out


def _arrow_column(values: np.ndarray) -> pa.Array:
    """A feature's column: a scalar column for one value per frame, else a fixed-size list."""
    if values.ndim == 1 or (values.ndim == 2 and values.shape[1] == 1):
        return pa.array(values.reshape(-1))
    if values.ndim != 2:
        raise LeRobotFormatError(f"only scalar and vector features are written as columns, got frames of shape "
                                 f"{values.shape[1:]}")
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


def _write_parquet(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="snappy")


def first_line(err: BaseException) -> str:
    """An error's message up to its first line break (FFmpeg's and Arrow's run over many)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
