"""LeRobot v3.0 datasets without LeRobot: the reader reads what LeRobot's own API wrote
(tests/fixtures/lerobot/, made in the reference environment of scripts/lerobot_reference_env.sh),
the writer writes what the reader and LeRobot's ``LeRobotDataset`` read back (the latter in the
slow test, which builds that environment)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from videos import fake_ffmpeg, needs_av1

from vla_rl.data.lerobot_format import (
    QUANTILES,
    LeRobotFormatError,
    LeRobotWriter,
    aggregate_stats,
    feature_stats,
)
from vla_rl.data.lerobot_reader import LeRobotReader

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
REPO = FIXTURES.parents[2]
MAX_VIDEO_MAE = 10.0  # grey levels of 255: LeRobot's own AV1 / crf 30 gives 2-3 on the probe, our writer the same


def frame_errors(decoded: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Mean absolute error of each decoded frame against each expected one, ``(T, T)``."""
    return np.abs(decoded[:, None].astype(np.float64) - expected[None].astype(np.float64)).mean(axis=(2, 3, 4))


def check_video(decoded: np.ndarray, expected: np.ndarray) -> None:
    errors = frame_errors(decoded, expected)
    assert decoded.shape == expected.shape and decoded.dtype == np.uint8
    assert np.diag(errors).max() <= MAX_VIDEO_MAE
    assert (np.argmin(errors, axis=1) == np.arange(len(decoded))).all()  # each frame is its own, not a neighbour


def test_the_reader_reads_lerobots_own_lift_dataset_bit_for_bit():
    reader = LeRobotReader(FIXTURES / "lift_scripted_demos")
    expected = np.load(FIXTURES / "lift_scripted_demos_expected.npz")
    assert reader.num_episodes == 2 and reader.fps == 20
    for episode in range(2):
        frames = reader.episode(episode, ["observation.state", "action"])
        for feature in ("observation.state", "action"):
            want = expected[f"episode_{episode}/{feature}"]
            assert frames[feature].dtype == np.float32 and np.array_equal(frames[feature], want)
        assert str(frames["task"]) == "lift the cube"


@needs_av1
def test_the_reader_decodes_lerobots_av1_video_frame_for_frame():
    reader = LeRobotReader(FIXTURES / "video_probe")
    expected = np.load(FIXTURES / "video_probe_expected.npz")
    for episode in range(2):
        frames = reader.episode(episode, ["observation.images.agentview", "next.done", "action"])
        check_video(frames["observation.images.agentview"], expected[f"episode_{episode}/observation.images.agentview"])
        assert np.array_equal(frames["next.done"].reshape(-1), expected[f"episode_{episode}/next.done"].reshape(-1))
        assert str(frames["task"]) == str(expected[f"episode_{episode}/task"])


def probe_dataset(root: Path) -> dict[str, np.ndarray]:
    """Three episodes (lengths 7, 5, 9; two tasks) of state, action, bool, reward and a 32x32
    video written with :class:`LeRobotWriter`; returns what was written, keyed as
    check_with_lerobot.py expects."""
    rng = np.random.default_rng(0)
    features = {"observation.state": {"dtype": "float32", "shape": [11], "names": None},
                "action": {"dtype": "float32", "shape": [7], "names": None},
                "next.done": {"dtype": "bool", "shape": [1], "names": None},
                "next.reward": {"dtype": "float32", "shape": [1], "names": None},
                "observation.images.agentview": {"dtype": "video", "shape": [32, 32, 3], "names": None}}
    writer = LeRobotWriter(root, 20, "panda", features)
    written = {"fps": np.int64(20)}
    yy, xx = np.mgrid[0:32, 0:32]
    for episode, (length, task) in enumerate([(7, "lift the cube"), (5, "stack the cubes"), (9, "lift the cube")]):
        video = np.stack([np.stack([(xx * 8 + t * 10 + episode * 40) % 256, (yy * 8) % 256,
                                    np.full_like(xx, 60 * episode + 5 * t)], -1) for t in range(length)])
        frames = {"observation.state": rng.normal(size=(length, 11)).astype(np.float32),
                  "action": rng.normal(size=(length, 7)).astype(np.float32),
                  "next.done": (np.arange(length) == length - 1)[:, None],
                  "next.reward": rng.random((length, 1)).astype(np.float32),
                  "observation.images.agentview": video.astype(np.uint8)}
        assert writer.add_episode(frames, task) == episode
        written |= {f"episode_{episode}/{name}": value for name, value in frames.items()}
        written[f"episode_{episode}/task"] = np.array(task)
    writer.finalize()
    return written


@needs_av1
def test_the_writer_round_trips_and_lays_out_lerobots_files(tmp_path):
    root = tmp_path / "probe"
    written = probe_dataset(root)
    reader = LeRobotReader(root)
    assert reader.num_episodes == 3
    for episode in range(3):
        frames = reader.episode(episode, ["observation.state", "action", "next.done", "next.reward",
                                          "observation.images.agentview"])
        for name in ("observation.state", "action", "next.done", "next.reward"):
            assert np.array_equal(frames[name], written[f"episode_{episode}/{name}"]), name
        check_video(frames["observation.images.agentview"], written[f"episode_{episode}/observation.images.agentview"])
        assert str(frames["task"]) == str(written[f"episode_{episode}/task"])

    info = json.loads((root / "meta/info.json").read_text())
    assert (info["codebase_version"], info["total_episodes"], info["total_frames"], info["total_tasks"], info["fps"]) \
        == ("v3.0", 3, 21, 2, 20)
    assert list(info["features"])[-5:] == ["timestamp", "frame_index", "episode_index", "index", "task_index"]
    assert info["features"]["observation.images.agentview"]["info"]["video.codec"] == "av1"
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [(e["dataset_from_index"], e["dataset_to_index"], e["length"]) for e in episodes] == \
        [(0, 7, 7), (7, 12, 5), (12, 21, 9)]
    assert [e["videos/observation.images.agentview/from_timestamp"] for e in episodes] == [0.0, 7 / 20, 12 / 20]
    data = pq.read_table(root / "data/chunk-000/file-000.parquet")
    assert str(data.schema.field("observation.state").type) == "fixed_size_list<element: float>[11]"
    assert str(data.schema.field("next.done").type) == "bool"  # a shape-[1] feature is a scalar column
    assert data.column("index").to_pylist() == list(range(21))
    tasks = pq.read_table(root / "meta/tasks.parquet")
    assert tasks.column("__index_level_0__").to_pylist() == ["lift the cube", "stack the cubes"]
    assert b"pandas" in tasks.schema.metadata  # the task string is the pandas index, as LeRobot reads it

    stats = json.loads((root / "meta/stats.json").read_text())
    actions = np.concatenate([written[f"episode_{e}/action"] for e in range(3)]).astype(np.float64)
    np.testing.assert_allclose(stats["action"]["mean"], actions.mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats["action"]["std"], actions.std(0), rtol=1e-12)
    # a quantile: the episodes' weighted by their frames, as LeRobot 0.4.4 aggregates them
    medians = [np.median(written[f"episode_{e}/action"].astype(np.float64), 0) for e in range(3)]
    np.testing.assert_allclose(stats["action"]["q50"], (7 * medians[0] + 5 * medians[1] + 9 * medians[2]) / 21,
                               rtol=1e-12)
    assert stats["action"]["count"] == [21] and stats["next.done"]["min"] == [False]
    assert np.array(stats["observation.images.agentview"]["mean"]).shape == (3, 1, 1)


def test_feature_stats_against_hand_computed_values():
    stats = feature_stats(np.array([[1.0, 10.0], [3.0, 10.0], [5.0, 40.0]], dtype=np.float32), "float32")
    assert stats["min"] == [1.0, 10.0] and stats["max"] == [5.0, 40.0] and stats["count"] == [3]
    np.testing.assert_allclose(stats["mean"], [3.0, 20.0])
    np.testing.assert_allclose(stats["std"], [np.sqrt(8 / 3), np.sqrt(200)])
    np.testing.assert_allclose(stats["q50"], [3.0, 10.0])
    video = np.zeros((2, 2, 2, 3), dtype=np.uint8)
    video[..., 0] = 255
    assert feature_stats(video, "video")["mean"] == [[[1.0]], [[0.0]], [[0.0]]]


def test_video_stats_are_those_of_the_pixels_in_0_1():
    video = np.random.default_rng(0).integers(0, 256, (4, 6, 10, 3), dtype=np.uint8)
    video[..., 2] = np.clip(video[..., 2], 40, 90)
    pixels = video.reshape(-1, 3).astype(np.float64) / 255
    stats = feature_stats(video, "video")
    expected = {"min": pixels.min(0), "max": pixels.max(0), "mean": pixels.mean(0), "std": pixels.std(0),
                **{name: np.quantile(pixels, q, axis=0) for name, q in QUANTILES.items()}}
    for name, value in expected.items():
        np.testing.assert_allclose(np.array(stats[name]).reshape(3), value, rtol=1e-12, atol=1e-15, err_msg=name)
    assert stats["count"] == [4]


def stats_of_episodes(root: Path) -> list[dict]:
    """Each episode's ``stats/<feature>/<stat>`` columns of meta/episodes, as nested dicts."""
    rows = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    episodes = []
    for row in rows:
        stats: dict = {}
        for column, value in row.items():
            if column.startswith("stats/"):
                feature, stat = column[len("stats/"):].rsplit("/", 1)
                stats.setdefault(feature, {})[stat] = value
        episodes.append(stats)
    return episodes


@pytest.mark.parametrize("fixture", ["lift_scripted_demos", "video_probe"])
def test_the_episodes_stats_aggregate_to_lerobots_own_stats_json(fixture):
    """LeRobot 0.4.4 wrote both the episodes' stats columns and meta/stats.json of these fixtures:
    aggregate_stats gives its stats.json from its columns."""
    root = FIXTURES / fixture
    lerobot = json.loads((root / "meta/stats.json").read_text())
    ours = aggregate_stats(stats_of_episodes(root))
    assert set(ours) == set(lerobot)
    for feature, stats in lerobot.items():
        for stat, value in stats.items():
            np.testing.assert_allclose(np.array(ours[feature][stat], dtype=np.float64),
                                       np.array(value, dtype=np.float64), rtol=1e-7, atol=1e-9,  # LeRobot's
                                       err_msg=f"{feature}/{stat}")  # float32 steps: std off by ~1e-8


@needs_av1
def test_the_writer_stores_each_episodes_stats_as_lerobot_does(tmp_path):
    """LeRobot's delete_episodes / split_dataset rebuild meta/stats.json from these columns: a
    dataset without them came out of those tools with no statistics."""
    written = probe_dataset(tmp_path / "probe")
    episodes = stats_of_episodes(tmp_path / "probe")
    lerobot_columns = {column for column in pq.read_schema(FIXTURES / "video_probe/meta/episodes/chunk-000/"
                                                                      "file-000.parquet").names}
    ours = pq.read_schema(tmp_path / "probe/meta/episodes/chunk-000/file-000.parquet")
    for column in (f"stats/{feature}/{stat}" for feature in ("action", "timestamp", "frame_index", "index")
                   for stat in ("min", "max", "mean", "std", "count", *QUANTILES)):
        assert column in ours.names
    assert {c for c in ours.names if c.startswith("stats/observation.images.agentview/")} == \
        {c for c in lerobot_columns if c.startswith("stats/observation.images.agentview/")}
    assert str(ours.field("stats/observation.images.agentview/mean").type) == \
        "list<element: list<element: list<element: double>>>"
    assert str(ours.field("stats/next.done/min").type) == "list<element: bool>"
    for episode, stats in enumerate(episodes):
        assert stats["action"] == feature_stats(written[f"episode_{episode}/action"], "float32")
        assert stats["observation.images.agentview"]["count"] == [[7, 5, 9][episode]]
    assert json.loads((tmp_path / "probe/meta/stats.json").read_text()) == aggregate_stats(episodes)


@pytest.mark.parametrize("features, message", [
    ({"a/b": {"dtype": "float32", "shape": [2]}}, "must not contain '/'"),
    ({"index": {"dtype": "int64", "shape": [1]}}, "default column"),
    ({"x": {"dtype": "string", "shape": [1]}}, "not supported"),
    ({"cam": {"dtype": "video", "shape": [31, 32, 3]}}, "even H and W"),
])
def test_the_writer_refuses_malformed_features(tmp_path, features, message):
    with pytest.raises(LeRobotFormatError, match=message):
        LeRobotWriter(tmp_path / "d", 20, "panda", features)


def test_the_writer_refuses_bad_episodes_and_existing_roots(tmp_path):
    writer = LeRobotWriter(tmp_path / "d", 20, "panda", {"s": {"dtype": "float32", "shape": [2]},
                                                         "a": {"dtype": "float32", "shape": [1]}})
    with pytest.raises(LeRobotFormatError, match="same number >= 1 of frames"):
        writer.add_episode({"s": np.zeros((3, 2)), "a": np.zeros((2, 1))}, "t")
    with pytest.raises(LeRobotFormatError, match=r"s has frames of shape \(3,\)"):
        writer.add_episode({"s": np.zeros((2, 3)), "a": np.zeros((2, 1))}, "t")
    with pytest.raises(LeRobotFormatError, match="are not the dataset's"):
        writer.add_episode({"s": np.zeros((2, 2))}, "t")
    with pytest.raises(LeRobotFormatError, match="at least one episode"):
        writer.finalize()
    with pytest.raises(LeRobotFormatError, match="exists"):
        LeRobotWriter(tmp_path / "d", 20, "panda", {})
    with pytest.raises(LeRobotFormatError, match="integer fps"):
        LeRobotWriter(tmp_path / "e", 12.5, "panda", {})


def test_an_ffmpeg_without_av1_is_refused_before_the_dataset_is_made(tmp_path, monkeypatch):
    """An FFmpeg without SVT-AV1 (the offline GPU kit's stand-in wrote MPEG-4 under the 'av1' of
    info.json) is refused naming it, before the root exists; a state-only dataset needs none."""
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(fake_ffmpeg(tmp_path)))
    with pytest.raises(LeRobotFormatError, match=r"ffmpeg-without-av1 has no libsvtav1 encoder.*IMAGEIO_FFMPEG_EXE"):
        LeRobotWriter(tmp_path / "d", 20, "panda", {"cam": {"dtype": "video", "shape": [32, 32, 3]}})
    assert not (tmp_path / "d").exists()
    LeRobotWriter(tmp_path / "e", 20, "panda", {"s": {"dtype": "float32", "shape": [2]}})


def test_a_video_the_ffmpeg_cannot_decode_names_the_ffmpeg(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(fake_ffmpeg(tmp_path)))
    reader = LeRobotReader(FIXTURES / "video_probe")
    with pytest.raises(LeRobotFormatError, match=r"file-000.mp4 cannot be decoded: .*ffmpeg-without-av1 lists no "
                                                 r"AV1 decoder"):
        reader.episode(0, ["observation.images.agentview"])


def test_the_reader_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(LeRobotFormatError, match="no meta/info.json"):
        LeRobotReader(tmp_path)
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta/info.json").write_text(json.dumps({"codebase_version": "v2.1", "features": {}, "fps": 10}))
    with pytest.raises(LeRobotFormatError, match="format v2.1; only v3.x"):
        LeRobotReader(tmp_path)
    reader = LeRobotReader(FIXTURES / "lift_scripted_demos")
    with pytest.raises(LeRobotFormatError, match="no feature 'observation.images.front'"):
        reader.episode(0, ["observation.images.front"])
    with pytest.raises(LeRobotFormatError, match="has 2 episodes, not episode 2"):
        reader.episode(2, ["action"])


def lerobot_python() -> Path:
    """The reference environment's python (scripts/lerobot_reference_env.sh, built if missing)."""
    venv = Path(os.environ.get("VLA_RL_LEROBOT_VENV", "/tmp/lerobot-ref-venv"))
    subprocess.run(["bash", str(REPO / "scripts/lerobot_reference_env.sh"), str(venv)], check=True, timeout=1800)
    return venv / "bin" / "python"


def check_with_lerobot(root: Path, expected: dict[str, np.ndarray], tmp_path: Path) -> dict:
    """Run LeRobot's own reader over ``root`` against ``expected`` (check_with_lerobot.py)."""
    np.savez(tmp_path / "expected.npz", **expected)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run([str(lerobot_python()), str(FIXTURES / "check_with_lerobot.py"), str(root),
                             str(tmp_path / "expected.npz")], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_lerobot_itself_loads_what_the_writer_writes(tmp_path):
    written = probe_dataset(tmp_path / "probe")
    summary = check_with_lerobot(tmp_path / "probe", written, tmp_path)
    assert summary["ok"] and summary["episodes"] == 3 and summary["lengths"] == [7, 5, 9]
    assert summary["video_mae"]["observation.images.agentview"]["max"] <= MAX_VIDEO_MAE


_DELETE_WITH_LEROBOT = """
import json, sys
from pathlib import Path
from lerobot.datasets.dataset_tools import delete_episodes
from lerobot.datasets.lerobot_dataset import LeRobotDataset
delete_episodes(LeRobotDataset("local/probe", root=sys.argv[1]), episode_indices=[1], output_dir=sys.argv[2],
                repo_id="local/probe_edited")
print(json.dumps(json.loads((Path(sys.argv[2]) / "meta/stats.json").read_text())))
"""


@pytest.mark.slow
def test_lerobots_delete_episodes_keeps_the_statistics_of_what_the_writer_writes(tmp_path):
    """LeRobot rebuilds meta/stats.json from the episodes' stats columns: without them (before),
    the edited dataset's stats.json was empty."""
    rng = np.random.default_rng(0)
    writer = LeRobotWriter(tmp_path / "probe", 20, "panda", {"action": {"dtype": "float32", "shape": [2], "names": None}})
    actions = [rng.normal(size=(length, 2)).astype(np.float32) for length in (6, 4, 8)]
    for episode in actions:
        writer.add_episode({"action": episode}, "lift the cube")
    writer.finalize()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run([str(lerobot_python()), "-c", _DELETE_WITH_LEROBOT, str(tmp_path / "probe"),
                             str(tmp_path / "edited")], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    kept = np.concatenate([actions[0], actions[2]]).astype(np.float64)
    assert stats["action"]["count"] == [14]
    np.testing.assert_allclose(stats["action"]["mean"], kept.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats["action"]["min"], kept.min(0), rtol=1e-6)
