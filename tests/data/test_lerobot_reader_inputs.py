"""What the LeRobot reader (vla_rl/data/lerobot_reader.py) meets outside its own writer's output:
datasets split over several files whose columns differ in order and in optional columns (LeRobot
shards them, and its per-episode ``stats/...`` columns are optional), large columns and videos it
must not hold whole, and malformed datasets, each refused in one line naming the file and field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_lerobot_format import FIXTURES, check_video, probe_dataset
from videos import needs_av1

from vla_rl.data.lerobot_demonstrations import check_dataset
from vla_rl.data.lerobot_format import LeRobotFormatError
from vla_rl.data.lerobot_reader import LeRobotReader

LIFT = FIXTURES / "lift_scripted_demos"
DATA, EPISODES = "data/chunk-000/file-000.parquet", "meta/episodes/chunk-000/file-000.parquet"


def copy_of(fixture: Path, tmp_path: Path) -> Path:
    root = tmp_path / fixture.name
    shutil.copytree(fixture, root)
    return root


def split_in_two(root: Path, relative: str, rearrange) -> None:
    """Split a parquet file of ``root`` into file-000 (the first half of its rows) and file-001
    (the rest, through ``rearrange``)."""
    table = pq.read_table(root / relative)
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), root / relative)
    pq.write_table(rearrange(table.slice(half)), root / relative.replace("file-000", "file-001"))


def test_files_whose_columns_differ_in_order_and_optional_columns_read_as_one(tmp_path):
    root = copy_of(LIFT, tmp_path)
    split_in_two(root, DATA, lambda part: part.select(part.column_names[::-1]))
    split_in_two(root, EPISODES, lambda part: part.append_column("stats/action/extra", pa.array([1.5] * part.num_rows)))
    reader = LeRobotReader(root)
    expected = np.load(FIXTURES / "lift_scripted_demos_expected.npz")
    assert reader.num_episodes == 2
    for episode in range(2):
        frames = reader.episode(episode, ["observation.state", "action"])
        for feature in ("observation.state", "action"):
            assert np.array_equal(frames[feature], expected[f"episode_{episode}/{feature}"])


def test_the_reader_reads_only_the_columns_it_is_asked_for(tmp_path, monkeypatch):
    """A dataset with a column of PNG images (LeRobot's ``image`` dtype): loading it, checking it
    and cloning its state and actions never read that column."""
    root = copy_of(LIFT, tmp_path)
    table = pq.read_table(root / DATA)
    pq.write_table(table.append_column("observation.images.front", pa.array([b"\x89PNG" * 50_000] * table.num_rows)),
                   root / DATA)
    info = json.loads((root / "meta/info.json").read_text())
    info["features"]["observation.images.front"] = {"dtype": "image", "shape": [100, 100, 3], "names": None}
    (root / "meta/info.json").write_text(json.dumps(info))
    reads: list = []
    real_read_table = pq.read_table
    monkeypatch.setattr(pq, "read_table", lambda path, columns=None, **kw: reads.append((Path(path), columns))
                        or real_read_table(path, columns=columns, **kw))
    reader = LeRobotReader(root)
    reader.episode(1, ["observation.state", "action"])
    check_dataset(root, {"observation.state": "state", "action": "actions"}, 2)
    data_reads = [columns for path, columns in reads if path == root / DATA]
    assert data_reads and all(columns is not None and "observation.images.front" not in columns
                              for columns in data_reads)


@needs_av1
def test_a_video_is_decoded_for_the_asked_episode_only(tmp_path, monkeypatch):
    """Three episodes of 7, 5 and 9 frames back to back in one video: each read decodes its own
    frames (FFmpeg seeks to the first), not the file's 21, and they are the written ones."""
    import imageio_ffmpeg

    written = probe_dataset(tmp_path / "probe")
    decoded: list[int] = []
    real_read_frames = imageio_ffmpeg.read_frames

    def counting(*args, **kwargs):
        count = 0
        for item in real_read_frames(*args, **kwargs):
            count += isinstance(item, bytes)
            yield item
        decoded.append(count)

    monkeypatch.setattr(imageio_ffmpeg, "read_frames", counting)
    reader = LeRobotReader(tmp_path / "probe")
    for episode in (2, 0, 1):
        frames = reader.episode(episode, ["observation.images.agentview"])["observation.images.agentview"]
        check_video(frames, written[f"episode_{episode}/observation.images.agentview"])
    assert decoded == [9, 7, 5]


def _edit_info(root: Path, **changes) -> None:
    info = json.loads((root / "meta/info.json").read_text())
    for key, value in changes.items():
        if value is None:
            info.pop(key)
        else:
            info[key] = value
    (root / "meta/info.json").write_text(json.dumps(info))


def _drop_column(root: Path, relative: str, column: str) -> None:
    table = pq.read_table(root / relative)
    pq.write_table(table.drop_columns([column]), root / relative)


MALFORMED = {
    "no fps": (LIFT, lambda root: _edit_info(root, fps=None), "meta/info.json: 'fps' must be a positive number"),
    "no features": (LIFT, lambda root: _edit_info(root, features=None), "'features' must be a mapping"),
    "no tasks": (LIFT, lambda root: (root / "meta/tasks.parquet").unlink(), "has no meta/tasks.parquet"),
    "no episode_index in data": (LIFT, lambda root: _drop_column(root, DATA, "episode_index"),
                                 "data/chunk-000/file-000.parquet has no column 'episode_index'"),
    "not parquet": (LIFT, lambda root: (root / DATA).write_bytes(b"not parquet"),
                    "data/chunk-000/file-000.parquet cannot be read: "),
    "video without video_path": (FIXTURES / "video_probe", lambda root: _edit_info(root, video_path=""),
                                 "has video features but no 'video_path'"),
    # an audit: these three were AttributeError / KeyError tracebacks from `vla-rl plan`
    "info.json a list": (LIFT, lambda root: (root / "meta/info.json").write_text("[]"),
                         "meta/info.json must hold a JSON object"),
    "feature a string": (LIFT, lambda root: _edit_feature(root, "action", "float32"),
                         "meta/info.json: feature 'action' must be an object with a 'dtype' string and a 'shape'"),
    "feature without shape": (LIFT, lambda root: _edit_feature(root, "action", {"dtype": "float32"}),
                              "meta/info.json: feature 'action' must be an object with a 'dtype' string"),
}


def _edit_feature(root: Path, name: str, feature) -> None:
    info = json.loads((root / "meta/info.json").read_text())
    _edit_info(root, features={**info["features"], name: feature})


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_dataset_is_refused_in_one_line_naming_the_file_and_field(tmp_path, case):
    fixture, damage, message = MALFORMED[case]
    root = copy_of(fixture, tmp_path)
    damage(root)
    with pytest.raises(LeRobotFormatError, match=message) as refused:
        LeRobotReader(root)
    assert "\n" not in str(refused.value)
    # the planner's check reports it rather than failing itself
    assert message.split(": ")[-1] in check_dataset(root, {"observation.state": "state", "action": "actions"}, 1)


def test_an_episode_the_files_lack_is_refused_naming_it(tmp_path):
    root = copy_of(FIXTURES / "video_probe", tmp_path)
    table = pq.read_table(root / DATA)
    pq.write_table(table.filter(pa.compute.not_equal(table.column("episode_index"), 1)), root / DATA)
    with pytest.raises(LeRobotFormatError, match="episode_index 1 is in meta/episodes but has no frames in data/"):
        LeRobotReader(root).episode(1, ["action"])
    _drop_column(root, EPISODES, "videos/observation.images.agentview/from_timestamp")
    with pytest.raises(LeRobotFormatError, match="meta/episodes has no column "
                                                 "'videos/observation.images.agentview/from_timestamp'"):
        LeRobotReader(root).episode(0, ["observation.images.agentview"])
    shutil.rmtree(root / "videos")
    root = copy_of(FIXTURES / "video_probe", tmp_path / "again")
    next(root.glob("videos/*/*/*.mp4")).write_bytes(b"not a video")
    with pytest.raises(LeRobotFormatError, match="file-000.mp4 cannot be decoded: ") as refused:
        LeRobotReader(root).episode(0, ["observation.images.agentview"])
    assert "\n" not in str(refused.value)
    next(root.glob("videos/*/*/*.mp4")).unlink()
    with pytest.raises(LeRobotFormatError, match="file-000.mp4 is missing .video feature 'observation.images.agentview', "
                                                 "episode_index 0."):
        LeRobotReader(root).episode(0, ["observation.images.agentview"])


@needs_av1
def test_a_channel_first_video_declaration_reads_as_its_decoded_frames(tmp_path):
    """Ported v2.0 datasets declare videos ``[3, H, W]`` named channels, height, width (LeRobot
    reads any layout whose third name is not channel(s) as channel-first): cloning from one was
    refused as "shape [3, 32, 32], the simulator's ... has [32, 32, 3]"."""
    from vla_rl.data.lerobot_demonstrations import dataset_episodes
    from vla_rl_core.env_spec import EnvSpec

    root = copy_of(FIXTURES / "video_probe", tmp_path)
    info = json.loads((root / "meta/info.json").read_text())
    info["features"]["observation.images.agentview"] |= {"shape": [3, 32, 32], "names": ["channels", "height", "width"]}
    (root / "meta/info.json").write_text(json.dumps(info))
    feature = LeRobotReader(root).features["observation.images.agentview"]
    assert feature["shape"] == [32, 32, 3] and feature["names"] == ["height", "width", "channels"]
    keys = {"observation.state": "state", "action": "actions", "observation.images.agentview": "agentview_image"}
    spec = EnvSpec(obs_dim=2, action_dim=2, horizon=10, images={"agentview_image": (32, 32, 3)})
    assert check_dataset(root, keys, 2) is None
    as_declared = dataset_episodes(FIXTURES / "video_probe", keys, 2, spec)
    for episode, same in zip(dataset_episodes(root, keys, 2, spec), as_declared, strict=True):
        assert episode["agentview_image"].shape[1:] == (32, 32, 3)
        assert np.array_equal(episode["agentview_image"], same["agentview_image"])
    info["features"]["observation.images.agentview"]["shape"] = [32, 32]
    (root / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(LeRobotFormatError, match="video feature 'observation.images.agentview' has shape \\[32, 32\\], "
                                                 "not three sizes"):
        LeRobotReader(root)


def _rewrite_column(root: Path, column: str, values: pa.Array) -> None:
    table = pq.read_table(root / DATA)
    pq.write_table(table.set_column(table.column_names.index(column), column, values), root / DATA)


def test_variable_length_list_columns_read_as_the_fixed_size_ones(tmp_path):
    """pandas and Hugging Face datasets write list<float> where LeRobot writes fixed-size lists;
    their reading raised ModuleNotFoundError: pandas (an audit)."""
    root = copy_of(LIFT, tmp_path)
    before = LeRobotReader(root).episode(1, ["action", "observation.state"])
    table = pq.read_table(root / DATA)
    for column in ("action", "observation.state"):
        _rewrite_column(root, column, table.column(column).cast(pa.list_(pa.float32())))
    after = LeRobotReader(root).episode(1, ["action", "observation.state"])
    assert pq.read_schema(root / DATA).field("action").type == pa.list_(pa.float32())
    for name in ("action", "observation.state"):
        np.testing.assert_array_equal(after[name], before[name])
    ragged = [list(row) for row in table.column("action").to_pylist()]
    ragged[0] = ragged[0][:3]
    _rewrite_column(root, "action", pa.array(ragged, pa.list_(pa.float32())))
    with pytest.raises(LeRobotFormatError, match=r"feature 'action' holds lists of 2 lengths \(\[3, 7\]\), not one "
                                                 r"vector a frame"):
        LeRobotReader(root).episode(0, ["action"])


def test_a_column_of_strings_or_of_another_width_and_an_unknown_task_are_refused_naming_them(tmp_path):
    root = copy_of(LIFT, tmp_path)
    rows = pq.read_table(root / DATA).num_rows
    _rewrite_column(root, "action", pa.array(["up"] * rows))
    with pytest.raises(LeRobotFormatError, match=r"feature 'action' holds string values, not numbers"):
        LeRobotReader(root).episode(0, ["action"])
    _edit_feature(root, "action", {"dtype": "string", "shape": [7]})
    assert "feature 'action' is string [7], which cannot be the policy's 'actions'" in check_dataset(
        root, {"observation.state": "state", "action": "actions"}, 1)
    root = copy_of(LIFT, tmp_path / "wide")
    _edit_feature(root, "action", {"dtype": "float32", "shape": [6]})
    with pytest.raises(LeRobotFormatError, match=r"feature 'action' holds 7 values a frame, and meta/info.json gives "
                                                 r"it shape \[6\]"):
        LeRobotReader(root).episode(0, ["action"])
    root = copy_of(LIFT, tmp_path / "task")
    _rewrite_column(root, "task_index", pa.array([5] * rows, pa.int64()))
    with pytest.raises(LeRobotFormatError, match=r"episode_index 0 has task_index 5, which meta/tasks.parquet does "
                                                 r"not hold \(it holds \[0\]\)"):
        LeRobotReader(root).episode(0, ["action"])
