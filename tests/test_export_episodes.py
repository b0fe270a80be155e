"""``vla-rl export-episodes``: the evaluation episodes of a run become a LeRobot dataset, one
frame per control step, the replayed episode the stored one (states, actions and success), with
camera videos on request; LeRobot's own reader loads it frame for frame (slow test)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from vla_rl.cli import main
from vla_rl.data.lerobot_reader import LeRobotReader
from vla_rl.data.trajectory_store import TrajectoryStore

sys.path.insert(0, str(Path(__file__).parent / "data"))
from test_lerobot_format import check_with_lerobot  # noqa: E402
from videos import fake_ffmpeg, missing_av1  # noqa: E402


def stored_episodes(run_dir: Path) -> list[dict]:
    store = TrajectoryStore.open(run_dir / "eval" / "episodes" / "robosuite_lift" / "rank0.zarr", read_only=True)
    return [store.read_episode(i) for i in range(len(store))]


@pytest.fixture(scope="module")
def exported(evaluated_lift_run, tmp_path_factory):
    if missing_av1():
        pytest.skip(f"LeRobot's AV1 videos: {missing_av1()}")
    out = tmp_path_factory.mktemp("export") / "lift"
    assert main(["export-episodes", str(evaluated_lift_run), str(out), "--cameras", "agentview",
                 "--camera-size", "32"]) == 0
    return out


@pytest.mark.xdist_group("test_export_episodes.exported")
def test_evaluation_episodes_export_as_the_stored_episodes(evaluated_lift_run, exported):
    reader = LeRobotReader(exported)
    episodes = stored_episodes(evaluated_lift_run)
    assert reader.num_episodes == len(episodes) == 3 and reader.fps == 20
    features = ["observation.state", "action", "next.success", "next.done", "next.reward",
                "observation.images.agentview"]
    for index, stored in enumerate(episodes):
        frames = reader.episode(index, features)
        steps = int(stored["finish_step"])
        assert np.array_equal(frames["observation.state"], stored["obs"][:steps])
        # the actions the simulator executed: the policy's, clipped to its action space [-1, 1]
        assert np.array_equal(frames["action"], np.clip(stored["env_actions"][:steps, 0], -1.0, 1.0))
        assert bool(frames["next.success"].any()) == bool(stored["success"])
        assert frames["next.done"].reshape(-1).tolist() == [False] * (steps - 1) + [True]
        video = frames["observation.images.agentview"]
        assert video.shape == (steps, 32, 32, 3) and video.std() > 5  # rendered frames, not blanks
        assert str(frames["task"]) == "lift the cube"
    infos = [json.loads(line) for line in (exported / "meta/vla_rl_episodes.jsonl").read_text().splitlines()]
    assert [(i["init_state_id"], i["success"], i["checkpoint_step"], i["greedy"]) for i in infos] == [
        (int(e["init_state_id"]), bool(e["success"]), 1, True) for e in episodes]


@pytest.mark.xdist_group("test_export_episodes.exported")
def test_export_episodes_errors_are_one_line(evaluated_lift_run, exported, tmp_path, capsys):
    assert main(["export-episodes", str(evaluated_lift_run), str(exported)]) == 2
    assert "exists; export to a new directory" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["export-episodes", str(evaluated_lift_run), str(tmp_path / "file" / "out")]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {tmp_path / 'file' / 'out'} cannot be created: "
                                               f"{tmp_path / 'file'} is not a directory")
    assert main(["export-episodes", str(evaluated_lift_run), "/proc/vla_rl_export"]) == 2  # only the write fails
    assert capsys.readouterr().err.startswith("error: /proc/vla_rl_export cannot be created: ")
    assert main(["export-episodes", str(evaluated_lift_run), str(tmp_path / "out"), "--camera-size", "64"]) == 2
    assert "--camera-size sizes the rendered cameras, and none is named: add --cameras" in capsys.readouterr().err
    assert main(["export-episodes", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["export-episodes", str(tmp_path), str(tmp_path / "out")]) == 2
    assert "holds no episodes" in capsys.readouterr().err
    assert main(["export-episodes", str(evaluated_lift_run), str(tmp_path / "out"), "--cameras", "nocam"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error: --cameras: ['nocam'] not a camera of Lift; available: [" in err  # the option, not a field


def test_videos_without_an_av1_ffmpeg_are_refused_before_any_episode_is_replayed(evaluated_lift_run, tmp_path,
                                                                                 capsys, monkeypatch):
    """On the offline GPU kit's FFmpeg stand-in, the export wrote MPEG-4 videos that meta/info.json
    called AV1, and decoding them failed later."""
    import vla_rl.export_episodes

    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(fake_ffmpeg(tmp_path)))
    monkeypatch.setattr(vla_rl.export_episodes, "replay_store", None)  # a replay would fail otherwise
    assert main(["export-episodes", str(evaluated_lift_run), str(tmp_path / "out"), "--cameras", "agentview"]) == 2
    err = capsys.readouterr().err.strip()
    assert "ffmpeg-without-av1 has no libsvtav1 encoder" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.xdist_group("test_export_episodes.exported")
def test_lerobot_itself_loads_the_exported_episodes(evaluated_lift_run, exported, tmp_path):
    """The frames LeRobot decodes are those a second replay renders (not what our reader decodes)."""
    from vla_rl.export_episodes import find_stores, replay_store

    expected = {"fps": np.int64(20)}
    replays = list(replay_store(find_stores(evaluated_lift_run)[0], ["agentview"], 32))
    for index, (stored, replay) in enumerate(zip(stored_episodes(evaluated_lift_run), replays, strict=True)):
        steps = int(stored["finish_step"])
        expected[f"episode_{index}/observation.state"] = stored["obs"][:steps]
        expected[f"episode_{index}/action"] = np.clip(stored["env_actions"][:steps, 0], -1.0, 1.0)  # executed
        expected[f"episode_{index}/observation.images.agentview"] = replay.frames["agentview"]
        expected[f"episode_{index}/task"] = np.array("lift the cube")
    summary = check_with_lerobot(exported, expected, tmp_path)
    assert summary["ok"] and summary["episodes"] == 3


def two_task_evaluation(evaluated_lift_run: Path, target: Path, **second_env) -> Path:
    """The run's evaluation as one of two tasks: a copy of its store under a second task directory,
    its recorded settings updated with ``second_env`` (the layout of a LIBERO suite's or MT10's
    evaluation: one store per task)."""
    import shutil

    shutil.copytree(evaluated_lift_run / "eval", target / "eval")
    second = target / "eval" / "episodes" / "lift_red"
    shutil.copytree(target / "eval" / "episodes" / "robosuite_lift", second)
    meta = second / "rank0.zarr" / "zarr.json"
    document = json.loads(meta.read_text())
    document["attributes"]["user_attrs"]["env"].update(second_env)
    meta.write_text(json.dumps(document))
    return target


def test_an_evaluation_of_several_tasks_exports_as_one_dataset_of_several_tasks(evaluated_lift_run, tmp_path):
    source = two_task_evaluation(evaluated_lift_run, tmp_path / "run", instruction="lift the red cube")
    assert main(["export-episodes", str(source), str(tmp_path / "out")]) == 0
    reader = LeRobotReader(tmp_path / "out")
    assert reader.num_episodes == 6
    tasks = [str(reader.episode(index, ["observation.state"])["task"]) for index in range(6)]
    assert tasks == ["lift the red cube"] * 3 + ["lift the cube"] * 3  # the task directories in order
    stored = stored_episodes(evaluated_lift_run)
    for index in range(6):
        steps = int(stored[index % 3]["finish_step"])
        executed = np.clip(stored[index % 3]["env_actions"][:steps, 0], -1.0, 1.0)
        assert np.array_equal(reader.episode(index, ["action"])["action"], executed)


def test_one_evaluation_store_exports_its_own_episodes(evaluated_lift_run, tmp_path):
    """It was refused as "not a single-task demonstration store of vla-rl train"."""
    source = two_task_evaluation(evaluated_lift_run, tmp_path / "run", instruction="lift the red cube")
    assert main(["export-episodes", str(source / "eval" / "episodes" / "lift_red" / "rank0.zarr"),
                 str(tmp_path / "out")]) == 0
    reader = LeRobotReader(tmp_path / "out")
    assert reader.num_episodes == 3
    assert {str(reader.episode(index, ["observation.state"])["task"]) for index in range(3)} == {"lift the red cube"}


def test_an_evaluations_episodes_directory_and_one_tasks_directory_are_sources(evaluated_lift_run, tmp_path):
    """``vla-rl export-episodes <run>/eval/episodes OUT`` was refused as holding no episodes."""
    from vla_rl.export_episodes import find_stores

    source = two_task_evaluation(evaluated_lift_run, tmp_path / "run", instruction="lift the red cube")
    everything = find_stores(source)
    assert len({store.path.parent.name for store in everything}) == 2
    assert find_stores(source / "eval" / "episodes") == everything
    red = [store for store in everything if store.path.parent.name == "lift_red"]
    assert red and find_stores(source / "eval" / "episodes" / "lift_red") == red


def test_stores_one_dataset_cannot_hold_are_refused_naming_each(evaluated_lift_run, tmp_path, capsys):
    source = two_task_evaluation(evaluated_lift_run, tmp_path / "run", control_freq=10.0)
    assert main(["export-episodes", str(source), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "several control frequencies" in err and "'lift_red/rank0.zarr': 10.0" in err
    assert not (tmp_path / "out").exists()


def test_a_failed_export_leaves_nothing_behind(evaluated_lift_run, tmp_path, capsys):
    """A replay that does not retrace its episode stops the export; the output directory does not
    exist afterwards (it used to, empty, and the next try was refused: 'exists')."""
    import zarr

    source = two_task_evaluation(evaluated_lift_run, tmp_path / "run")
    success = zarr.open_array(source / "eval" / "episodes" / "robosuite_lift" / "rank0.zarr" / "success", mode="r+")
    success[1] = not success[1]  # the second task's episode 1 says otherwise than its replay will
    assert main(["export-episodes", str(source), str(tmp_path / "out")]) == 2
    assert "episode 1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert [path.name for path in tmp_path.iterdir()] == ["run"]  # no partial dataset beside it either


def test_a_damaged_store_is_refused_before_any_episode_is_replayed(evaluated_lift_run, tmp_path, capsys):
    """A truncated chunk gave a blosc RuntimeError traceback after an episode was replayed."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(evaluated_lift_run, run)
    chunk = run / "eval" / "episodes" / "robosuite_lift" / "rank0.zarr" / "actions" / "c" / "1" / "0" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:20])
    assert main(["export-episodes", str(run), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "rank0.zarr is damaged: array 'actions', episode 1" in err and "nothing was exported" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_demonstration_store_exports_its_expert_episodes(ray_on_loopback, tmp_path):
    """The warm start's demos.zarr, as docs/datasets.md exports it (no test did)."""
    from simulators.pool import SimulatorPool
    from vla_rl.dag.loader import load_template
    from vla_rl.nodes.warm_start import demo_env_attrs
    from vla_rl.trainers.warm_start import ensure_demonstrations

    sim = load_template("embodied_srpo").config.simulator
    store_path = tmp_path / "demos.zarr"
    with SimulatorPool(sim.name, sim.env, num_actors=1, envs_per_actor=2, actor_options={"num_cpus": 0}) as pool:
        ensure_demonstrations(pool, store_path, num_demos=1, id_offset=0, env_attrs=demo_env_attrs(sim))
    stored = TrajectoryStore.open(store_path, read_only=True).read_episode(0)
    assert main(["export-episodes", str(store_path), str(tmp_path / "out")]) == 0
    reader = LeRobotReader(tmp_path / "out")
    assert reader.num_episodes == 1 and reader.fps == 20
    frames = reader.episode(0, ["observation.state", "action", "next.success"])
    steps = int(stored["length"])  # one control step per stored step: a frame each
    assert np.array_equal(frames["observation.state"], stored["obs"][:steps])
    assert np.array_equal(frames["action"], np.clip(stored["actions"][:steps], -1.0, 1.0))
    assert bool(frames["next.success"][-1]) and str(frames["task"]) == "lift the cube"


def test_a_remote_run_s_episodes_are_refused_in_one_line(evaluated_lift_run, tmp_path, capsys):
    """A remote run's evaluation asked for --fps, then the replay raised a RuntimeError traceback
    (no hub outside a simulator pool): a remote environment cannot be replayed here (an audit)."""
    import shutil

    shutil.copytree(evaluated_lift_run / "eval", tmp_path / "run" / "eval")
    meta = tmp_path / "run" / "eval" / "episodes" / "robosuite_lift" / "rank0.zarr" / "zarr.json"
    document = json.loads(meta.read_text())
    document["attributes"]["user_attrs"]["simulator"] = "remote"
    meta.write_text(json.dumps(document))
    assert main(["export-episodes", str(tmp_path / "run"), str(tmp_path / "out"), "--fps", "20"]) == 2
    err = capsys.readouterr().err
    assert "rank0.zarr holds episodes of remote environments (simulator.name=remote), which cannot be replayed" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_full_disk_during_the_export_is_one_line_and_leaves_nothing_behind(evaluated_lift_run, tmp_path, capsys,
                                                                             monkeypatch):
    import errno

    from vla_rl.data.lerobot_format import LeRobotWriter

    written = []
    add_episode = LeRobotWriter.add_episode

    def full_after_one(self, *args, **kwargs):
        if written:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "data.parquet"))
        written.append(add_episode(self, *args, **kwargs))

    monkeypatch.setattr(LeRobotWriter, "add_episode", full_after_one)
    assert main(["export-episodes", str(evaluated_lift_run), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "the file system refused a write: No space left on device" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and written
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []  # no partial dataset beside it
