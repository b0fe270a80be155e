"""Every evaluation episode in zarr: one :class:`~vla_rl.data.trajectory_store.TrajectoryStore` per
task and worker rank, ``<eval_dir>/episodes/<task>/rank<r>.zarr`` (one writer per store; episodes
are committed one by one, so an interrupted evaluation loses no finished episode).

Per decision step ``t < finish_step`` an episode stores ``obs`` (the observation before action
``t``), ``next_obs`` (after it; the last one is the terminal observation), ``actions``
``(chunk, own_action_dim)`` float32 (the policy's own, as sampled: what the RL loss scores, e.g.
OpenVLA-OFT's normalised values, π0's whole denoising chain; ``own_action_dim`` is
``policy.own_action_dim``, the simulator's ``act_dim`` for most policies), ``env_actions``
``(chunk, act_dim)`` float32 (what the
simulator received, ``policy.env_actions(actions)``: de-normalised, gripper post-processed; a
replay executes these) and ``log_probs`` ``(chunk,)`` (not for a policy without an action
distribution, whose log-probs are undefined); its scalars are the :class:`EpisodeKey` fields plus
``success``, ``truncated`` and ``finish_step``. Stores written before ``env_actions`` existed lack
it (:func:`vla_rl.evaluation.replay.episode_env_actions` says when their ``actions`` can stand in).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tensordict import TensorDict

from vla_rl.data import keys
from vla_rl.data.trajectory_store import TrajectoryStore

EPISODES_DIR = "episodes"
VIDEOS_DIR = "videos"


@dataclass(frozen=True, order=True)
class EpisodeKey:
    """What identifies an evaluation episode within one task: the checkpoint (its training step),
    the protocol (greedy, or the sampling temperature) and the initial state."""

    checkpoint_step: int
    greedy: bool
    temperature: float
    init_state_id: int


def task_dir(eval_dir: Path, task: str) -> Path:
    """Directory of a task's stores."""
    return Path(eval_dir) / EPISODES_DIR / task


def episode_keys(store: TrajectoryStore) -> list[EpisodeKey]:
    """The keys of a store's committed episodes, in order."""
    if len(store) == 0:
        return []
    data = store.read_scalars()
    return [EpisodeKey(int(s), bool(g), float(t), int(i)) for s, g, t, i in
            zip(data["checkpoint_step"], data["greedy"], data["temperature"], data["init_state_id"])]


def check_task_settings(eval_dir: Path, task: str, simulator: str, env: dict) -> None:
    """Check that the task's existing stores were written with this simulator and settings.

    Raises:
        ValueError: a store holds episodes of other settings (naming the store and both settings).
    """
    expected = json.loads(json.dumps({"simulator": simulator, "env": env}))
    for path in sorted(task_dir(eval_dir, task).glob("rank*.zarr")):
        attrs = TrajectoryStore.open(path, read_only=True).attrs
        found = {"simulator": attrs["simulator"], "env": attrs["env"]}
        if found != expected:
            raise ValueError(f"{path} holds episodes of task {task!r} with {found}, not {expected}; evaluate "
                             "into another directory (--output) to change the task's settings")


def stored_keys(eval_dir: Path, task: str) -> set[EpisodeKey]:
    """Keys of every committed episode of ``task`` in all ranks' stores (read-only)."""
    return {key for path in sorted(task_dir(eval_dir, task).glob("rank*.zarr"))
            for key in episode_keys(TrajectoryStore.open(path, read_only=True))}


def open_rank_store(eval_dir: Path, task: str, rank: int, spec: dict, chunk: int, attrs: dict,
                    log_probs: bool, own_action_dim: int | None = None) -> TrajectoryStore:
    """This rank's store of ``task``, created on first use.

    Args:
        spec: the simulator's ``obs_dim``, ``act_dim``, ``horizon`` (control steps).
        chunk: the policy's action-chunk length.
        own_action_dim: values per own action of the policy (``policy.own_action_dim``), the
            width of the ``actions`` field; None: the simulator's ``act_dim`` (a policy whose own
            actions are the environment's width).
        attrs: metadata kept with a new store (task, simulator, settings).
        log_probs: a new store has the ``log_probs`` field (the policy has an action distribution).
    """
    path = task_dir(eval_dir, task) / f"rank{rank}.zarr"
    if path.exists():
        return TrajectoryStore.open(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    obs_dim, act_dim = int(spec["obs_dim"]), int(spec["act_dim"])
    own_action_dim = act_dim if own_action_dim is None else int(own_action_dim)
    fields = {
        "obs": ((obs_dim,), np.float32),
        "next_obs": ((obs_dim,), np.float32),
        "actions": ((chunk, own_action_dim), np.float32),
        "env_actions": ((chunk, act_dim), np.float32),
    }
    if log_probs:
        fields["log_probs"] = ((chunk,), np.float32)
    return TrajectoryStore.create(path, fields, max_steps=-(-int(spec["horizon"]) // chunk), attrs=attrs)


def append_episodes(store: TrajectoryStore, episodes: TensorDict, checkpoint_step: int, greedy: bool,
                    temperature: float) -> list[EpisodeKey]:
    """Append rollout episodes (the keys of :func:`vla_rl.rollout.embodied.rollout_episodes` plus
    ``truncated``; ``old_log_probs`` when the policy has them; ``env_actions``
    (:attr:`~vla_rl.rollout.embodied.RolloutResult.env_actions`) when the store has that field, as
    every store created by :func:`open_rank_store` does) one by one, each committed before the
    next; returns their keys.

    Raises:
        ValueError: the store has an ``env_actions`` field and the episodes lack it, or the
            episodes' fields are not the store's (see ``TrajectoryStore.append_episode``).
    """
    env_actions = "env_actions" in store.fields
    if env_actions and keys.ENV_ACTIONS not in episodes.keys():
        raise ValueError(f"{store.path} stores the simulator's actions of each episode (field 'env_actions'), and "
                         f"the episodes have no {keys.ENV_ACTIONS!r}: set it from the rollout's "
                         "RolloutResult.env_actions")
    added = []
    for row in range(len(episodes)):
        length = int(episodes[keys.FINISH_STEP][row])
        obs = episodes[keys.OBS][row]  # camera observations: their state only (images are not stored)
        obs = (obs[keys.OBS_STATE] if isinstance(obs, TensorDict) else obs).numpy()  # (T + 1, obs_dim)
        steps = {"obs": obs[:length], "next_obs": obs[1 : length + 1],
                 "actions": episodes[keys.ACTIONS][row, :length].numpy()}
        if env_actions:
            steps["env_actions"] = episodes[keys.ENV_ACTIONS][row, :length].numpy()
        if keys.OLD_LOG_PROBS in episodes.keys():
            steps["log_probs"] = episodes[keys.OLD_LOG_PROBS][row, :length].numpy()
        store.append_episode(
            steps,
            checkpoint_step=np.int64(checkpoint_step), greedy=np.bool_(greedy), temperature=np.float64(temperature),
            init_state_id=np.int64(episodes[keys.INIT_STATE_ID][row]), success=np.bool_(episodes[keys.SUCCESS][row]),
            truncated=np.bool_(episodes[keys.TRUNCATED][row]), finish_step=np.int64(length),
        )
        added.append(EpisodeKey(checkpoint_step, greedy, temperature, int(episodes[keys.INIT_STATE_ID][row])))
    return added
