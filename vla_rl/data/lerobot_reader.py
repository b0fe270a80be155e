"""The reader of LeRobot datasets (format ``v3.0``; see :mod:`vla_rl.data.lerobot_format` for the
layout and how it is checked against LeRobot itself): ``meta/info.json``'s features, the episodes'
frames of numeric features from the parquet files and of video features decoded with FFmpeg, and
each episode's task string.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vla_rl.data.lerobot_format import (
    INFO_PATH,
    TASKS_PATH,
    LeRobotFormatError,
    ffmpeg_codecs,
    ffmpeg_executable,
    first_line,
)

_INDEX_COLUMNS = ("episode_index", "frame_index", "timestamp", "task_index")
"""The data files' columns the reader loads up front; a feature's column is read when first asked for."""


class LeRobotReader:
    """Read a LeRobot v3 dataset from a local root (``LeRobotDataset(repo_id, root=...)``'s files).

    Loads ``meta/``, and of the data files only the index columns (episode, frame, timestamp,
    task); each feature's column is read from every data file the first time an episode asks for
    it, and a video feature's frames are decoded for the asked episode only (FFmpeg seeks to its
    first frame), so neither image columns nor whole videos are held in memory. Files may differ in
    column order and in optional columns (LeRobot's per-episode ``stats/...``): they are matched
    by name. :attr:`features` is ``info.json``'s, with each video feature's shape as its frames
    decode, ``(H, W, 3)``, whichever layout it declares (LeRobot's rule: :func:`_checked_feature`).

    Args:
        root: the dataset root (``meta/info.json`` inside).

    Raises:
        LeRobotFormatError: ``root`` holds no ``meta/info.json``, another major version, an
            ``info.json`` that is not an object, without ``fps`` or ``features``, with a feature
            that is not an object of a ``dtype`` and a ``shape`` of sizes (or a video feature
            whose shape is not three sizes), or with video features and no ``video_path``; no
            ``meta/tasks.parquet``, or files that cannot be read or lack a column (one line naming
            the file and the field).
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        info_path = self.root / INFO_PATH
        if not info_path.is_file():
            raise LeRobotFormatError(f"{self.root} is not a LeRobot dataset (no {INFO_PATH})")
        try:
            self.info = json.loads(info_path.read_text())
        except (OSError, ValueError) as err:
            raise LeRobotFormatError(f"{info_path} cannot be read: {first_line(err)}") from None
        if not isinstance(self.info, dict):
            raise LeRobotFormatError(f"{info_path} must hold a JSON object (codebase_version, fps, features, ...), "
                                     f"got {type(self.info).__name__}")
        version = str(self.info.get("codebase_version", "?"))
        if not version.startswith("v3."):
            raise LeRobotFormatError(f"{self.root} is a LeRobot dataset of format {version}; only v3.x is read here "
                                     "(convert it with LeRobot's lerobot.datasets.v30 conversion script)")
        features, fps = self.info.get("features"), self.info.get("fps")
        if not isinstance(features, dict):
            raise LeRobotFormatError(f"{info_path}: 'features' must be a mapping of feature names, got {features!r}")
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or fps <= 0:
            raise LeRobotFormatError(f"{info_path}: 'fps' must be a positive number, got {fps!r}")
        self.features: dict[str, dict[str, Any]] = {name: _checked_feature(name, f, info_path)
                                                    for name, f in features.items()}
        if any(f["dtype"] == "video" for f in self.features.values()) and not self.info.get("video_path"):
            raise LeRobotFormatError(f"{info_path}: the dataset has video features but no 'video_path'")
        self.fps = int(fps)
        self._data_files = sorted((self.root / "data").glob("*/*.parquet"))
        self._frames = _read_tables(self._data_files, self.root, "data", _INDEX_COLUMNS)
        self._episodes = _read_tables(sorted((self.root / "meta" / "episodes").glob("*/*.parquet")), self.root,
                                      "meta/episodes", ("episode_index",), every_column=True).to_pylist()
        self._episode_of_frame = self._frames.column("episode_index").to_numpy()
        tasks_path = self.root / TASKS_PATH
        if not tasks_path.is_file():
            raise LeRobotFormatError(f"{self.root} has no {TASKS_PATH} (the episodes' task strings)")
        tasks = _read_tables([tasks_path], self.root, TASKS_PATH, ("task_index",), every_column=True)
        index_name = "__index_level_0__" if "__index_level_0__" in tasks.column_names else "task"
        if index_name not in tasks.column_names:
            raise LeRobotFormatError(f"{tasks_path} has no task strings (no column '__index_level_0__' nor 'task')")
        self.tasks = dict(zip(tasks.column("task_index").to_pylist(), tasks.column(index_name).to_pylist(), strict=True))
        self._columns: dict[str, pa.ChunkedArray] = {}

    @property
    def num_episodes(self) -> int:
        """Episodes in the dataset."""
        return len(self._episodes)

    def episode(self, index: int, features: Sequence[str]) -> dict[str, np.ndarray]:
        """Frames ``features`` of episode ``index``, in frame order: ``(T, *shape)`` arrays (the
        feature's dtype; uint8 ``(T, H, W, 3)`` for videos, decoded with FFmpeg), and ``task``
        (the episode's first frame's task string).

        Raises:
            LeRobotFormatError: no such episode or feature, an episode without frames, a column or
                a video that is missing or cannot be decoded.
        """
        if not 0 <= index < self.num_episodes:
            raise LeRobotFormatError(f"{self.root} has {self.num_episodes} episodes, not episode {index}")
        episode = self._episodes[index]
        rows = np.flatnonzero(self._episode_of_frame == episode["episode_index"])
        if len(rows) == 0:
            raise LeRobotFormatError(f"{self.root}: episode_index {episode['episode_index']} is in meta/episodes but "
                                     "has no frames in data/")
        order = rows[np.argsort(self._frames.column("frame_index").to_numpy()[rows], kind="stable")]
        out: dict[str, np.ndarray] = {}
        for name in features:
            if name not in self.features:
                raise LeRobotFormatError(f"{self.root} has no feature {name!r}; it has {sorted(self.features)}")
            if self.features[name]["dtype"] == "image":
                raise LeRobotFormatError(f"{self.root}: feature {name!r} holds PNG images in the parquet files, which "
                                         "are not read here (only video features)")
            if self.features[name]["dtype"] == "video":
                timestamps = self._frames.column("timestamp").to_numpy()[order].astype(np.float64)
                out[name] = self._video(name, episode, timestamps)
            else:
                values = _numpy_column(self._column(name).take(pa.array(order)), f"{self.root}: feature {name!r}")
                if values.size != len(order) * int(np.prod(self.features[name]["shape"])):
                    raise LeRobotFormatError(f"{self.root}: feature {name!r} holds {values.size // max(len(order), 1)} "
                                             f"values a frame, and meta/info.json gives it shape "
                                             f"{self.features[name]['shape']}")
                out[name] = values.reshape(len(order), *self.features[name]["shape"])
        task_index = self._frames.column("task_index")[int(order[0])].as_py()
        if task_index not in self.tasks:
            raise LeRobotFormatError(f"{self.root}: episode_index {episode['episode_index']} has task_index "
                                     f"{task_index}, which {TASKS_PATH} does not hold (it holds {sorted(self.tasks)})")
        out["task"] = np.array(self.tasks[task_index])
        return out

    def _column(self, name: str) -> pa.ChunkedArray:
        """Feature ``name``'s column over every data file, in the index columns' row order."""
        if name not in self._columns:
            self._columns[name] = _read_tables(self._data_files, self.root, "data", (name,)).column(name)
        return self._columns[name]

    def _video(self, name: str, episode: dict, timestamps: np.ndarray) -> np.ndarray:
        """The episode's frames of video feature ``name`` at ``timestamps`` (seconds from the
        episode's start): frame ``rint((from_timestamp + t) fps)`` of its file, as LeRobot's
        frames are laid out back to back at the dataset's fps."""
        fields = [f"videos/{name}/{field}" for field in ("chunk_index", "file_index", "from_timestamp")]
        absent = [field for field in fields if field not in episode]
        if absent:
            raise LeRobotFormatError(f"{self.root}/meta/episodes has no column {absent[0]!r} (video feature {name!r})")
        chunk, file, start = (episode[field] for field in fields)
        path = self.root / self.info["video_path"].format(video_key=name, chunk_index=chunk, file_index=file)
        if not path.is_file():
            raise LeRobotFormatError(f"{path} is missing (video feature {name!r}, episode_index "
                                     f"{episode['episode_index']})")
        numbers = np.rint((start + timestamps) * self.fps).astype(np.int64)
        first, count = int(numbers.min()), int(numbers.max() - numbers.min() + 1)
        frames = _decode_frames(path, first, count, self.fps)
        if len(frames) < count:
            raise LeRobotFormatError(f"{path} holds {first + len(frames)} frames; episode_index "
                                     f"{episode['episode_index']} needs frame {first + count - 1}")
        return frames[numbers - first]


_CHANNEL_NAMES = ("channel", "channels")


def _checked_feature(name: str, feature: Any, info_path: Path) -> dict[str, Any]:
    """A feature of ``info.json``, a video's with its shape as decoded, ``(H, W, C)``. LeRobot reads a
    visual feature whose third name is ``channel(s)`` as ``(H, W, C)`` and any other as
    ``(C, H, W)`` (``dataset_to_policy_features``, lerobot/datasets/utils.py): ported v2.0
    datasets declare ``["channels", "height", "width"]``. Other features are returned as they are.

    Raises:
        LeRobotFormatError: not an object of a ``dtype`` string and a ``shape`` list of sizes, or a
            video feature whose shape is not three sizes.
    """
    shape = feature.get("shape") if isinstance(feature, dict) else None
    if (not isinstance(feature, dict) or not isinstance(feature.get("dtype"), str) or not isinstance(shape, list)
            or not all(isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in shape)):
        raise LeRobotFormatError(f"{info_path}: feature {name!r} must be an object with a 'dtype' string and a 'shape' "
                                 f"list of sizes, got {feature!r}")
    if feature["dtype"] != "video":
        return feature
    shape, names = feature.get("shape"), feature.get("names")
    if not isinstance(shape, list) or len(shape) != 3:
        raise LeRobotFormatError(f"{info_path}: video feature {name!r} has shape {shape!r}, not three sizes")
    if isinstance(names, list) and len(names) == 3 and names[2] not in _CHANNEL_NAMES:
        return {**feature, "shape": [shape[1], shape[2], shape[0]], "names": [names[1], names[2], names[0]]}
    return feature


def _decode_frames(path: Path, first: int, count: int, fps: int) -> np.ndarray:
    """Frames ``first .. first + count - 1`` of a constant-rate video, uint8 ``(n, H, W, 3)``
    (``n < count`` when the file ends first). FFmpeg seeks (an input ``-ss``: it decodes from the
    keyframe before and drops the frames before the position) to half a frame before frame
    ``first``, so that frame is the first one out, and stops after ``count`` frames.

    Raises:
        LeRobotFormatError: FFmpeg cannot decode the file (its first line of error, and the FFmpeg's
            path when it lists no AV1 decoder).
    """
    import imageio_ffmpeg

    seek = ["-ss", f"{(first - 0.5) / fps:.6f}"] if first > 0 else []
    try:
        reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24", input_params=seek,
                                            output_params=["-frames:v", str(count)])
        width, height = next(reader)["size"]
        frames = [np.frombuffer(frame, np.uint8).reshape(height, width, 3) for frame in reader]
    except (OSError, RuntimeError, StopIteration) as err:
        executable = ffmpeg_executable()
        hint = "" if {"av1", "codec:av1"} & ffmpeg_codecs(executable, "decoders") else \
            f" (the FFmpeg at {executable} lists no AV1 decoder: set IMAGEIO_FFMPEG_EXE to one that has)"
        raise LeRobotFormatError(f"{path} cannot be decoded: {first_line(err)}{hint}") from None
    return np.stack(frames) if frames else np.zeros((0, height, width, 3), np.uint8)


def _read_tables(paths: list[Path], root: Path, place: str, columns: Sequence[str],
                 every_column: bool = False) -> pa.Table:
    """``columns`` (or, with ``every_column``, every column, ``columns`` required) of the parquet
    files ``paths`` (the dataset's ``place``: ``data``, ``meta/episodes``, ...), one table in file
    order; the files' columns are matched by name (their order and their optional columns may
    differ: absent ones are null).

    Raises:
        LeRobotFormatError: no file, a file without one of ``columns``, or a file that cannot be
            read (naming it, relative to ``root``).
    """
    if not paths:
        raise LeRobotFormatError(f"{root}: {place} holds no parquet file")
    tables = []
    for path in paths:
        where = path.relative_to(root)
        try:
            names = pq.read_schema(path).names
            absent = [column for column in columns if column not in names]
            if absent:
                raise LeRobotFormatError(f"{root}: {where} has no column {absent[0]!r}")
            tables.append(pq.read_table(path, columns=None if every_column else list(columns)))
        except (OSError, pa.ArrowException) as err:
            raise LeRobotFormatError(f"{root}: {where} cannot be read: {first_line(err)}") from None
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except pa.ArrowException as err:
        raise LeRobotFormatError(f"{root}: the files of {place} do not fit together: {first_line(err)}") from None


def _numpy_column(column: pa.ChunkedArray, what: str) -> np.ndarray:
    """A numeric column as ``(rows, values)`` (a list column: LeRobot writes fixed-size lists,
    pandas and Hugging Face ``datasets`` variable-size ones) or ``(rows,)``.

    Raises:
        LeRobotFormatError: values that are not numbers or booleans, or lists of unequal lengths
            (``what`` names the feature).
    """
    column = column.combine_chunks()
    is_list = any(check(column.type) for check in (pa.types.is_fixed_size_list, pa.types.is_list,
                                                   pa.types.is_large_list))
    value_type = column.type.value_type if is_list else column.type
    if not any(check(value_type) for check in (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)):
        raise LeRobotFormatError(f"{what} holds {column.type} values, not numbers")
    if not is_list:
        return column.to_numpy(zero_copy_only=False)
    lengths = sorted(set(pc.list_value_length(column).to_pylist()), key=str)
    if len(lengths) > 1:
        raise LeRobotFormatError(f"{what} holds lists of {len(lengths)} lengths ({lengths[:3]}), not one vector a frame")
    return column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), lengths[0] if lengths else 0)
