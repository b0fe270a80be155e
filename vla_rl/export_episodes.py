"""``vla-rl export-episodes SOURCE OUT``: stored episodes as a LeRobot dataset.

Sources: an evaluation directory of ``vla-rl eval`` (its ``episodes/<task>/rank*.zarr``; or its
``episodes/`` itself), a run directory (its ``eval/``), one task's directory of an evaluation
(``episodes/<task>/``: its workers' stores) or one of its stores (that rank's episodes of that
task), or a demonstration store (``demos.zarr``). Stores keep the policy's
actions in the simulator's units (``env_actions``, per decision; the simulator workers clip them
to the action space's bounds before each step, and so does the replay) and the state at each
decision; a LeRobot
dataset holds one frame per control step, cameras included. So every episode is **replayed** in
this process, in one environment made from the settings its store records (plus ``cameras``):
reset from its initial-state id, its actions stepped one control step at a time. The replay
retraces the episode (:mod:`vla_rl.evaluation.replay`); its success must be the stored one, or the
export stops naming the episode. The stores of an evaluation of several tasks (one per task)
make one dataset of several tasks.

Each frame: ``observation.state`` float32 ``(obs_dim,)``, ``action`` float32 ``(action_dim,)`` (the
action taken in that state, in the simulator's units, as the environment received it), ``next.reward`` float32 ``(1,)``,
``next.done`` and ``next.success`` bool ``(1,)`` (LeRobot's names for the step's outcome), and with
cameras ``observation.images.<camera>`` (video, ``(H, W, 3)``); the task is the simulator's
instruction. ``meta/vla_rl_episodes.jsonl`` (ignored by LeRobot) keeps each episode's source:
store, initial-state id, success, and for evaluation episodes the checkpoint step and protocol.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vla_rl_core import keys
from vla_rl_core.env_spec import executed_actions, info_success
from vla_rl_core.file_modes import uncreatable
from vla_rl_core.run_layout import EVAL_DIR

logger = logging.getLogger(__name__)

EPISODE_INFO_FILE = "meta/vla_rl_episodes.jsonl"


class EpisodesExportError(ValueError):
    """What ``vla-rl export-episodes`` was given cannot be exported (one line, exit 2)."""


@dataclass(frozen=True)
class SourceStore:
    """One store of episodes to export: its path, simulator name and settings, and whether it holds
    evaluation episodes (decisions of ``chunk`` actions) or demonstrations (one action per step)."""

    path: Path
    simulator: str
    env: dict[str, Any]
    evaluation: bool


def find_stores(source: str | Path) -> list[SourceStore]:
    """The stores of ``source`` (module docstring), in a stable order.

    Raises:
        EpisodesExportError: ``source`` is none of these, or holds no episodes.
    """
    from vla_rl.data.trajectory_store import TrajectoryStore
    from vla_rl.evaluation.episode_store import STORE_PATTERN
    from vla_rl_core.run_layout import EPISODES_DIR

    path = Path(source).resolve()
    if not path.exists():
        raise EpisodesExportError(f"{path} does not exist: name an evaluation directory, a run directory or a "
                                  "demonstration store (demos.zarr)")
    if (path / EVAL_DIR / EPISODES_DIR).is_dir() and not (path / EPISODES_DIR).is_dir():
        path = path / EVAL_DIR  # a run directory
    elif path.name == EPISODES_DIR and any(path.glob(f"*/{STORE_PATTERN}")):
        path = path.parent  # an evaluation's episodes/ itself
    stores = []
    if (path / EPISODES_DIR).is_dir() or (path.suffix != ".zarr" and any(path.glob(STORE_PATTERN))):
        # an evaluation's tasks, or one task's directory (episodes/<task>/): the stores of its workers
        pattern = f"{EPISODES_DIR}/*/{STORE_PATTERN}" if (path / EPISODES_DIR).is_dir() else STORE_PATTERN
        for store_path in sorted(path.glob(pattern)):
            attrs = TrajectoryStore.open(store_path, read_only=True).attrs
            stores.append(SourceStore(store_path, attrs["simulator"], dict(attrs["env"]), evaluation=True))
    elif path.suffix == ".zarr":
        try:
            attrs = TrajectoryStore.open(path, read_only=True).attrs
        except Exception as err:  # zarr raises several kinds for a directory that is not a store
            raise EpisodesExportError(f"{path} is not a trajectory store ({type(err).__name__}: {err})") from None
        if "simulator" in attrs:  # one rank's store of one task of an evaluation (vla-rl eval)
            return [SourceStore(path, attrs["simulator"], dict(attrs["env"]), evaluation=True)]
        env = dict(attrs.get("env") or {})
        if "name" not in env or "tasks" in env:
            raise EpisodesExportError(f"{path} is not a single-task demonstration store of vla-rl train (its attrs "
                                      f"record no simulator name, or a task set)")
        stores.append(SourceStore(path, env.pop("name"), env, evaluation=False))
    else:
        raise EpisodesExportError(f"{path} holds no episodes: name an evaluation directory (with {EPISODES_DIR}/), a run "
                                  "directory that was evaluated, or a demonstration store (demos.zarr)")
    if not stores:
        raise EpisodesExportError(f"{path}/{EPISODES_DIR} holds no episode store")
    return stores


@dataclass
class ReplayedEpisode:
    """One episode, one row per control step."""

    states: np.ndarray  # float32 (T, obs_dim)
    actions: np.ndarray  # float32 (T, action_dim)
    frames: dict[str, np.ndarray]  # camera -> uint8 (T, H, W, 3)
    rewards: np.ndarray  # float32 (T,), the simulator's reward of each step
    step_success: np.ndarray  # bool (T,), the simulator's success after each step
    dones: np.ndarray  # bool (T,), the episode ended with this step
    success: bool
    instruction: str
    info: dict[str, Any]


def replay_store(store: SourceStore, cameras: Sequence[str], camera_size: int | None,
                 greedy_only: bool = False) -> Iterator[ReplayedEpisode]:
    """Replay every episode of ``store`` (module docstring).

    Raises:
        EpisodesExportError: an episode's replayed success differs from the stored one, or the
            simulator refuses ``cameras`` / ``camera_size``.
    """
    from simulators.registry import SIMULATORS, make_env
    from vla_rl.data.trajectory_store import TrajectoryStore
    from vla_rl_core.components import ComponentConfigError, build_config

    env_settings = dict(store.env)
    if cameras:
        env_settings["cameras"] = list(cameras)
        if camera_size is not None:
            env_settings["camera_size"] = camera_size
    # a refusal of the settings the command line adds names its option, not the simulator's field
    options = {"simulator.env.cameras": "--cameras", "simulator.env.camera_size": "--camera-size"} if cameras else {}
    try:
        config = build_config(SIMULATORS.get(store.simulator).config_class, env_settings, "simulator.env")
    except ComponentConfigError as err:
        if err.field in options:
            raise EpisodesExportError(f"{options[err.field]}: {err.message}") from None
        raise EpisodesExportError(f"{store.path}: {err}") from None
    data = TrajectoryStore.open(store.path, read_only=True)
    try:
        env = make_env(store.simulator, config)
    except ComponentConfigError as err:
        if err.field in options:
            raise EpisodesExportError(f"{options[err.field]}: {err.message} (for {store.simulator})") from None
        raise EpisodesExportError(f"{store.path}: the {store.simulator} simulator refuses these settings: {err}") from None
    except ValueError as err:
        raise EpisodesExportError(f"{store.path}: the {store.simulator} simulator refuses these settings: {err}") from None
    try:
        for index in range(len(data)):
            episode = data.read_episode(index)
            if store.evaluation and greedy_only and not bool(episode["greedy"]):
                continue
            yield _replay(env, episode, store, index, list(cameras))
    finally:
        env.close()


def _replay(env, episode: dict, store: SourceStore, index: int, cameras: list[str]) -> ReplayedEpisode:
    if store.evaluation:
        decisions = episode["env_actions"][: int(episode["finish_step"])]  # (T, chunk, action_dim)
        stored_success = bool(episode["success"])
    else:
        decisions = episode["actions"][:, None, :]  # a demonstration: one action per control step
        stored_success = True  # the expert's store keeps successful episodes only
    init_state_id = int(episode["init_state_id"])
    obs, _ = env.reset(seed=init_state_id)
    states, actions, frames = [], [], {camera: [] for camera in cameras}
    rewards, step_success, dones = [], [], []
    success = done = False
    for chunk in decisions:
        for action in chunk:
            state = obs[keys.OBS_STATE] if isinstance(obs, dict) else obs
            states.append(np.asarray(state, dtype=np.float32))
            for camera in cameras:
                frames[camera].append(obs[f"{camera}{keys.OBS_IMAGE_SUFFIX}"])
            action = executed_actions(action, env.action_space.low, env.action_space.high)  # as the workers do
            actions.append(np.asarray(action, dtype=np.float32))
            obs, reward, terminated, truncated, info = env.step(action)
            succeeded = info_success(info)
            success, done = success or succeeded, terminated or truncated
            rewards.append(reward)
            step_success.append(succeeded)
            dones.append(done)
            if done:
                break
        if done:
            break
    if success != stored_success:
        raise EpisodesExportError(f"{store.path} episode {index} (initial state {init_state_id}): the replay "
                                  f"{'succeeded' if success else 'failed'}, the stored episode "
                                  f"{'succeeded' if stored_success else 'failed'}; the simulator does not retrace it "
                                  "(were its settings changed?)")
    info: dict[str, Any] = {"store": str(store.path), "index": index, "init_state_id": init_state_id,
                            "success": success, "steps": len(actions)}
    if store.evaluation:
        info |= {"checkpoint_step": int(episode["checkpoint_step"]), "greedy": bool(episode["greedy"]),
                 "temperature": float(episode["temperature"])}
    dones[-1] = True  # the stored actions ran out: the episode ends here
    return ReplayedEpisode(np.stack(states), np.stack(actions), {c: np.stack(f) for c, f in frames.items()},
                           np.asarray(rewards, dtype=np.float32), np.asarray(step_success), np.asarray(dones),
                           success, env.instruction, info)


def export_episodes(source: str | Path, out: str | Path, cameras: Sequence[str] = (), camera_size: int | None = None,
                    fps: float | None = None, greedy_only: bool = False, robot_type: str | None = None) -> Path:
    """Write the episodes of ``source`` as a LeRobot dataset in the new directory ``out``.

    Args:
        source: an evaluation directory, a run directory or a demonstration store.
        out: the dataset root to create.
        cameras: cameras to render into ``observation.images.<camera>`` videos (none: state only).
        camera_size: their square size in pixels (the simulator's default without it).
        fps: frames per second; default: the simulator's ``control_freq``.
        greedy_only: evaluation episodes of the greedy protocol only.
        robot_type: LeRobot's ``robot_type``; default: the simulator's ``robot`` setting, else its name.

    Returns:
        ``out``.

    An evaluation of several tasks (a LIBERO suite, MT10: one store per task) becomes one dataset
    of several tasks (LeRobot's ``meta/tasks.parquet`` and each frame's ``task_index``). The
    dataset is written beside ``out`` and renamed to it once complete: an export that fails
    leaves nothing behind.

    Raises:
        EpisodesExportError: ``out`` exists or cannot be created, ``camera_size`` comes without
            ``cameras``, ``source`` holds no episodes or episodes of remote environments, the stores mix
            simulators, control frequencies or (without ``robot_type``) robots, a replay does not
            retrace its episode, no fps is known, or ``cameras`` are asked for and FFmpeg has no
            AV1 encoder (checked first).
    """
    out = Path(out)
    if out.exists():
        raise EpisodesExportError(f"{out} exists; export to a new directory")
    if problem := uncreatable(out):
        raise EpisodesExportError(f"{out} cannot be created: {problem}")
    if camera_size is not None and not cameras:
        raise EpisodesExportError("--camera-size sizes the rendered cameras, and none is named: add --cameras "
                                  "(e.g. --cameras agentview)")
    if cameras:
        from vla_rl.data.lerobot_format import LeRobotFormatError, check_video_encoder

        try:
            check_video_encoder()
        except LeRobotFormatError as err:
            raise EpisodesExportError(str(err)) from None
    stores = find_stores(source)
    _check_readable(stores)
    first = stores[0]
    if remote := [store.path for store in stores if store.simulator == "remote"]:
        raise EpisodesExportError(f"{remote[0]} holds episodes of remote environments (simulator.name=remote), which "
                                  "cannot be replayed here: the export replays each episode in a local simulator to "
                                  "record its frames; record them on the robot's side instead")
    per_store = {store.path: (store.simulator, _control_freq(store),
                              str(store.env.get("robot", store.simulator))) for store in stores}
    for position, what in ((0, "simulators"), (1, "control frequencies"), (2, "robots")):
        values = {str(path.relative_to(path.parents[1])): value[position] for path, value in per_store.items()}
        if len(set(values.values())) > 1 and not (what == "robots" and robot_type):
            hint = "; give --robot-type" if what == "robots" else "; export them separately"
            raise EpisodesExportError(f"the stores of {source} hold episodes of several {what} ({values}), "
                                      f"which one LeRobot dataset cannot{hint}")
    fps = fps if fps is not None else per_store[first.path][1]
    if fps is None:
        raise EpisodesExportError(f"the {first.simulator} simulator states no control frequency: give --fps")
    robot = robot_type or per_store[first.path][2]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        scratch = tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.")
    except OSError as err:  # what only the write can tell (a read-only mount, /proc, a full disk)
        raise EpisodesExportError(f"{out} cannot be created: {err.strerror or err}") from None
    with scratch as partial:
        _write_dataset(stores, Path(partial) / out.name, float(fps), robot, cameras, camera_size, greedy_only, source)
        os.replace(Path(partial) / out.name, out)
    return out


def _write_dataset(stores: list[SourceStore], root: Path, fps: float, robot: str, cameras: Sequence[str],
                   camera_size: int | None, greedy_only: bool, source: str | Path) -> None:
    """Replay the stores' episodes into a new LeRobot dataset at ``root``."""
    from vla_rl.data.lerobot_format import LeRobotFormatError, LeRobotWriter

    writer, count = None, 0
    info_lines = []
    try:
        for store in stores:
            for episode in replay_store(store, cameras, camera_size, greedy_only):
                if writer is None:
                    writer = LeRobotWriter(root, fps=fps, robot_type=robot, features=_features(episode))
                writer.add_episode(_frames(episode), episode.instruction)
                info_lines.append(json.dumps(episode.info))
                count += 1
                logger.info("episode %d: %d steps, %s", count, len(episode.actions),
                            "success" if episode.success else "failure")
        if writer is None:
            raise EpisodesExportError(f"{source} holds no episode to export"
                                      + (" of the greedy protocol" if greedy_only else ""))
        writer.finalize()
    except LeRobotFormatError as err:
        raise EpisodesExportError(str(err)) from None
    (root / EPISODE_INFO_FILE).write_text("\n".join(info_lines) + "\n")


def _check_readable(stores: list[SourceStore]) -> None:
    """Read every store whole before any episode is replayed
    (:func:`~vla_rl.evaluation.episode_store.check_store`).

    Raises:
        EpisodesExportError: a store that cannot be read, naming it and its damaged array.
    """
    from vla_rl.evaluation.episode_store import DamagedStoreError, check_store

    for store in stores:
        try:
            check_store(store.path)
        except DamagedStoreError as err:
            raise EpisodesExportError(f"store {err.store} is damaged: {err.what} cannot be read ({err.cause}); "
                                      "nothing was exported") from None


def _control_freq(store: SourceStore) -> float | None:
    """The control frequency its settings give the simulator of ``store``, Hz (None: not stated).

    Raises:
        EpisodesExportError: settings this version cannot build, naming the store.
    """
    from simulators.registry import control_freq

    try:
        return control_freq(store.simulator, store.env)
    except (ValueError, TypeError, KeyError) as err:  # KeyError: RegistryError, an unknown simulator
        raise EpisodesExportError(f"{store.path}: {err}") from None


def _features(episode: ReplayedEpisode) -> dict[str, dict]:
    features = {
        "observation.state": {"dtype": "float32", "shape": [episode.states.shape[1]], "names": None},
        "action": {"dtype": "float32", "shape": [episode.actions.shape[1]], "names": None},
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "next.done": {"dtype": "bool", "shape": [1], "names": None},
        "next.success": {"dtype": "bool", "shape": [1], "names": None},
    }
    for camera, frames in episode.frames.items():
        features[f"observation.images.{camera}"] = {"dtype": "video", "shape": list(frames.shape[1:]),
                                                    "names": ["height", "width", "channels"]}
    return features


def _frames(episode: ReplayedEpisode) -> dict[str, np.ndarray]:
    frames = {"observation.state": episode.states, "action": episode.actions,
              "next.reward": episode.rewards[:, None], "next.done": episode.dones[:, None],
              "next.success": episode.step_success[:, None]}
    frames |= {f"observation.images.{camera}": images for camera, images in episode.frames.items()}
    return frames
