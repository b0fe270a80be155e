"""Re-running stored evaluation episodes: the stored simulator actions from the same initial
state, in a simulator pool. Re-scores episodes (the simulator decides success again) and renders
videos.

The simulators reset reproducibly from an initial-state id, and a store keeps the actions the
simulator received (``env_actions``: the policy's actions through ``policy.env_actions``, e.g.
OpenVLA-OFT's de-normalised values with the gripper post-processed), so a replay retraces the
episode without the policy: the same success and length.
"""

from __future__ import annotations

import numpy as np

from vla_rl.data.trajectory_store import TrajectoryStore


def replay_episodes(
    pool, init_state_ids: np.ndarray, actions: list[np.ndarray], render: bool = False,
    task_ids: np.ndarray | None = None,
) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Execute stored action chunks, one episode per initial state, as the rollout loop does.

    An episode ends at success or at its time limit, or when its stored actions run out; a
    success in the middle of a chunk ends it (the rest of the chunk is not executed).

    Args:
        pool: a :class:`simulators.pool.SimulatorPool` with capacity ≥ n (with a render camera
            when ``render``).
        init_state_ids: ``(n,)`` int64 initial-state ids.
        actions: ``n`` float32 arrays ``(T_i, chunk, action_dim)``: each episode's decisions in
            the simulator's units (a store's ``env_actions``: :func:`episode_env_actions`).
        render: record a camera frame after every control step of every episode.
        task_ids: ``(n,)`` int64 tasks of a task-set pool; None: the pool's only task.

    Returns:
        ``success`` ``(n,)`` bool, and for ``render`` each episode's frames ``(steps, H, W, 3)``
        uint8 by index.

    Raises:
        ValueError: ``actions`` does not hold one array per initial state.
    """
    n = len(init_state_ids)
    if len(actions) != n:
        raise ValueError(f"got {len(actions)} action sequences for {n} initial states")
    lengths = np.array([len(a) for a in actions])
    chunk, action_dim = actions[0].shape[1:]
    ids = np.asarray(init_state_ids, dtype=np.int64)
    if task_ids is None:
        pool.reset(ids)
    else:
        pool.reset(ids, np.asarray(task_ids, dtype=np.int64))
    active = np.ones(n, dtype=bool)
    success = np.zeros(n, dtype=bool)
    frames: dict[int, list[np.ndarray]] = {i: [] for i in range(n)} if render else {}
    for t in range(int(lengths.max())):
        active &= t < lengths
        for j in range(chunk):
            if not active.any():
                break
            step_actions = np.zeros((n, action_dim), dtype=np.float32)
            for i in np.flatnonzero(active):
                step_actions[i] = actions[i][t, j]
            rendered = tuple(np.flatnonzero(active)) if render else ()
            out = pool.step(step_actions, active, render_indices=rendered)
            for k, i in enumerate(rendered):
                frames[int(i)].append(out["frames"][k])
            success |= out["success"] & active
            active &= ~(out["terminated"] | out["truncated"])
    return success, {i: np.stack(f) for i, f in frames.items() if f}


def episode_env_actions(store: TrajectoryStore, episode: dict, actions_are_env_actions: bool = False) -> np.ndarray:
    """The simulator's actions of a stored episode, to replay it.

    Args:
        store: the evaluation episode store (:mod:`vla_rl.evaluation.episode_store`) that holds
            ``episode``.
        episode: one of its episodes (``store.read_episode``).
        actions_are_env_actions: the policy that wrote the store acts in the simulator's units
            (:attr:`policies.base.Policy.actions_are_env_actions`, e.g. the MLP), so that its
            ``actions`` can stand in for the ``env_actions`` of a store written before that field.

    Returns:
        ``(finish_step, chunk, action_dim)`` float32: the episode's ``env_actions`` (never a policy's own
        actions wider than the simulator's, e.g. π0's denoising chains), or for a
        store without that field its ``actions`` when ``actions_are_env_actions``.

    Raises:
        ValueError: the store has no ``env_actions`` field and ``actions_are_env_actions`` is
            False (its ``actions`` are a policy's own, e.g. normalised VLA actions, which the
            simulator never received).
    """
    if "env_actions" in store.fields:
        return episode["env_actions"]
    if actions_are_env_actions:
        return episode["actions"]
    raise ValueError(f"{store.path} has no 'env_actions' field (it was written before evaluations stored the "
                     "simulator's actions), and its 'actions' are the policy's own, not the simulator's (a policy "
                     "whose env_actions is not the identity, e.g. OpenVLA or OpenVLA-OFT): its episodes cannot be "
                     "replayed; evaluate again into another directory (--output) to replay them")


def rescore_store(pool, store: TrajectoryStore, indices: list[int] | None = None,
                  actions_are_env_actions: bool = False) -> dict[str, np.ndarray]:
    """Replay stored episodes (their ``env_actions``) and compare the simulator's new verdict with
    the stored one.

    Args:
        pool: a pool of the store's task (its ``attrs`` name the simulator and settings), with
            capacity ≥ the number of episodes replayed.
        store: an evaluation episode store (:mod:`vla_rl.evaluation.episode_store`).
        indices: the episodes to replay (default: all).
        actions_are_env_actions: see :func:`episode_env_actions` (only for a store without
            ``env_actions``).

    Returns:
        ``{"stored_success": (m,) bool, "replayed_success": (m,) bool}``.

    Raises:
        ValueError: the store has no ``env_actions`` and ``actions_are_env_actions`` is False.
    """
    indices = list(range(len(store))) if indices is None else indices
    episodes = [store.read_episode(i) for i in indices]
    ids = np.array([int(e["init_state_id"]) for e in episodes], dtype=np.int64)
    replayed, _ = replay_episodes(pool, ids, [episode_env_actions(store, e, actions_are_env_actions)
                                              for e in episodes])
    return {"stored_success": np.array([bool(e["success"]) for e in episodes]), "replayed_success": replayed}
