"""Warm start by behaviour cloning from scripted demonstrations (the one-demo regime of SRPO).

Demonstrations come from the simulator's scripted expert, run inside the simulator actors, and
are stored in a zarr :class:`~vla_rl.data.trajectory_store.TrajectoryStore` (one episode per
chunk, appended atomically) so that later runs reuse them: fields ``obs`` and ``actions`` for
flat state observations; with cameras one field per observation key (``state``, each
``<camera>_image`` as uint8, ``instruction``) and ``actions``. Behaviour cloning is cheap (a few
demonstrations), so every worker runs it from the same seed; the node then gives every worker
rank 0's weights (on GPUs the fits differ in their rounding: :mod:`vla_rl.nodes.warm_start`).

A task set (``simulator.tasks``) gets ``num_demos`` demonstrations of every task, each from the
task's own scripted expert, in one store: observations are then dicts (``state``, ``task_id``,
...) and every episode carries its task as the scalar ``task``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ray.experimental import tqdm_ray
from tensordict import TensorDict

from policies.normalization import fit_mean_std
from simulators.registry import SETTINGS_FORMAT, same_env
from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.trainers.strategy import refuse_low_precision_adam
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec
from vla_rl_core.observations import Observations, empty_observations, to_torch

#: Field of the demonstrated actions; flat-state stores keep observations in ``obs``.
ACTIONS_FIELD, FLAT_OBS_FIELD = "actions", "obs"
#: Per-episode scalar of a task set's demonstrations: the episode's task id.
TASK_SCALAR = "task"


def demo_fields(spec: EnvSpec) -> dict[str, tuple[tuple[int, ...], type]]:
    """Store fields of a simulator's demonstrations (see the module docstring).

    Args:
        spec: the pool's ``spec()``.
    """
    actions = {ACTIONS_FIELD: ((spec.action_dim,), np.float32)}
    if not spec.dict_observations:
        return {FLAT_OBS_FIELD: ((spec.obs_dim,), np.float32), **actions}
    empty = empty_observations(spec, 1)
    return {key: (value.shape[1:], value.dtype.type) for key, value in empty.items()} | actions


def same_demonstration_settings(stored: Any, current: Mapping[str, Any]) -> bool:
    """Whether a demonstration store's recorded simulator (``stored``: ``{"name", <settings>,
    "tasks"?}``, :func:`vla_rl.nodes.warm_start.demo_env_attrs`) is ``current``: the same name and
    tasks, and the same settings as :func:`simulators.registry.same_env` compares them (a store
    written before settings were recorded whole is completed with today's defaults)."""
    if stored == current:
        return True
    if not isinstance(stored, Mapping) or stored.get("name") != current["name"]:
        return False
    if stored.get("tasks") != current.get("tasks"):
        return False
    settings = [{key: value for key, value in attrs.items() if key not in ("name", "tasks")}
                for attrs in (stored, current)]
    return same_env(stored["name"], settings[0], current["name"], settings[1])


DEMONSTRATION_ROUNDS = 10
"""Rounds of expert episodes run to collect the demonstrations asked for before giving up."""


def ensure_demonstrations(
    pool, store_path: Path, num_demos: int, id_offset: int, env_attrs: dict, num_tasks: int | None = None,
) -> TrajectoryStore:
    """Return a store holding at least ``num_demos`` successful expert demonstrations (of every
    task of a task set).

    An existing store with the same ``env_attrs`` is extended, never rewritten. Expert episodes
    run on initial states ``id_offset, id_offset + 1, ...`` (of each task); failed ones are not stored.

    Args:
        num_tasks: the pool's task set size (``num_demos`` of each task, each episode stored with
            its task id as the scalar ``task``); None: a single task.

    Raises:
        ValueError: if ``store_path`` holds demonstrations of another simulator configuration.
        RuntimeError: if the expert does not produce ``num_demos`` successes within
            :data:`DEMONSTRATION_ROUNDS` rounds.
    """
    spec = pool.spec()
    if (store_path / "zarr.json").exists():
        store = TrajectoryStore.open(store_path)
        if int(store.attrs.get("settings_format", 0)) > SETTINGS_FORMAT:
            raise ValueError(f"{store_path} records its settings in form {store.attrs['settings_format']}, newer "
                             f"than this vla-rl's {SETTINGS_FORMAT}; set warm_start.demo_store to another path")
        if not same_demonstration_settings(store.attrs.get("env"), env_attrs):
            raise ValueError(
                f"{store_path} holds demonstrations of {store.attrs.get('env')}, not {env_attrs}; "
                "set warm_start.demo_store to another path"
            )
    else:
        store = TrajectoryStore.create(store_path, fields=demo_fields(spec), max_steps=spec.horizon,
                                       attrs={"env": env_attrs, "settings_format": SETTINGS_FORMAT})
    for task in range(num_tasks or 1):
        count, start = _stored(store, None if num_tasks is None else task, id_offset)
        for _ in range(DEMONSTRATION_ROUNDS):
            missing = num_demos - count
            if missing <= 0:
                break
            ids = list(range(start, start + 2 * missing))
            start += len(ids)
            episodes = pool.run_expert(ids) if num_tasks is None else pool.run_expert(ids, task)
            for episode in episodes:
                if episode["success"] and count < num_demos:
                    obs = episode["obs"]
                    fields = dict(obs) if isinstance(obs, Mapping) else {FLAT_OBS_FIELD: obs}
                    scalars = {} if num_tasks is None else {TASK_SCALAR: np.int64(task)}
                    store.append_episode({**fields, ACTIONS_FIELD: episode["actions"]},
                                         init_state_id=int(episode["init_state_id"]), **scalars)
                    count += 1
        if count < num_demos:
            which = "" if num_tasks is None else f" of task {task}"
            raise RuntimeError(f"the scripted expert produced {count} of {num_demos} demonstrations{which}")
    return store


def _stored(store: TrajectoryStore, task: int | None, id_offset: int) -> tuple[int, int]:
    """How many demonstrations the store holds (of ``task``; None: a single-task store) and the
    initial-state id to continue from (ids are appended in increasing order: after the last)."""
    if task is None:
        return len(store), id_offset if len(store) == 0 else int(store.read_episode(-1)["init_state_id"]) + 1
    if len(store) == 0:
        return 0, id_offset
    data = store.read_scalars()
    ids = data["init_state_id"][data[TASK_SCALAR] == task]
    return len(ids), id_offset if len(ids) == 0 else int(ids[-1]) + 1


def action_chunks(actions: np.ndarray, chunk_size: int) -> np.ndarray:
    """The next ``chunk_size`` actions from every step of one episode.

    Args:
        actions: ``(T, action_dim)``.

    Returns:
        ``(T, chunk_size, action_dim)``; windows running past the end repeat the last action.
    """
    index = np.minimum(np.arange(len(actions))[:, None] + np.arange(chunk_size)[None, :], len(actions) - 1)
    return actions[index]


def initial_observations(pool, count: int, num_tasks: int | None = None) -> Observations:
    """First observations of training initial states ``0 .. count - 1``, reset in pool-sized
    batches (in a task set of ``num_tasks`` tasks, state ``i`` of task ``i mod num_tasks``).

    Every worker gets the same observations (resets are seeded by the initial-state id), so the
    normalisation statistics, hence the cloned weights, agree across workers.

    Returns:
        float32 ``(count, obs_dim)`` (camera observations, or a task set's: a dict of ``count``-row arrays).
    """
    ids = np.arange(count, dtype=np.int64)

    def reset(rows: np.ndarray) -> Observations:
        return pool.reset(rows) if num_tasks is None else pool.reset(rows, rows % num_tasks)

    batches = [reset(ids[start : start + pool.capacity]) for start in range(0, count, pool.capacity)]
    if not batches:
        return empty_observations(pool.spec(), 0)
    if isinstance(batches[0], Mapping):
        return {key: np.concatenate([batch[key] for batch in batches]) for key in batches[0]}
    return np.concatenate(batches)


def _demo_indices(store: TrajectoryStore, num_demos: int) -> list[int]:
    """Episodes of the first ``num_demos`` demonstrations (of every task, for a task set's store)."""
    if TASK_SCALAR in store.scalars:
        tasks = store.read_scalars()[TASK_SCALAR]
        return [int(i) for task in sorted(set(tasks.tolist())) for i in np.flatnonzero(tasks == task)[:num_demos]]
    return list(range(num_demos))


def demonstrations(store: TrajectoryStore, num_demos: int, chunk_size: int) -> tuple[torch.Tensor | TensorDict,
                                                                                     torch.Tensor]:
    """Every step of the first ``num_demos`` demonstrations (of every task, for a task set's store)
    with the expert's next actions.

    Returns:
        observations: float32 ``(N, obs_dim)``, or a TensorDict of batch size ``(N,)`` of the
            stored dict observations; and actions ``(N, chunk_size, action_dim)`` float32.
    """
    episodes = [store.read_episode(i) for i in _demo_indices(store, num_demos)]
    return episode_transitions([{field: e[field] for field in store.fields} for e in episodes], chunk_size)


def episode_transitions(episodes: list[dict[str, np.ndarray]], chunk_size: int) -> tuple[torch.Tensor | TensorDict,
                                                                                        torch.Tensor]:
    """Every step of demonstration episodes laid out as a store's (:func:`demo_fields`: ``obs``,
    or the dict observation's keys, and ``actions`` ``(T, action_dim)``) with the next actions.

    Returns:
        observations: float32 ``(N, obs_dim)``, or a TensorDict of batch size ``(N,)``; and actions
        ``(N, chunk_size, action_dim)`` float32.
    """
    actions = torch.as_tensor(
        np.concatenate([action_chunks(e[ACTIONS_FIELD], chunk_size) for e in episodes]), dtype=torch.float32
    )  # (N, chunk, A)
    if FLAT_OBS_FIELD in episodes[0]:
        return torch.as_tensor(np.concatenate([e[FLAT_OBS_FIELD] for e in episodes]), dtype=torch.float32), actions
    obs_keys = [name for name in episodes[0] if name != ACTIONS_FIELD]
    obs = to_torch({key: np.concatenate([e[key] for e in episodes]) for key in obs_keys})
    return obs, actions


def demonstration_states(store: TrajectoryStore, num_demos: int) -> torch.Tensor:
    """The state vector of every step of the first ``num_demos`` demonstrations (those
    :func:`demonstrations` returns), without reading the images.

    Returns:
        float32 ``(N, obs_dim)``: the flat observations, or the ``state`` of dict observations.
    """
    field = FLAT_OBS_FIELD if FLAT_OBS_FIELD in store.fields else keys.OBS_STATE
    states = [store.read_episode(i, fields=[field])[field] for i in _demo_indices(store, num_demos)]
    return torch.as_tensor(np.concatenate(states), dtype=torch.float32)


def behaviour_cloning(
    policy, obs: torch.Tensor | TensorDict, actions: torch.Tensor, steps: int, lr: float, batch_size: int, seed: int,
    *, obs_std_floor: float, extra_norm_obs: Observations | None = None, progress: bool = False,
) -> dict[str, float]:
    """Fit the policy to demonstrated transitions with ``policy.bc_loss``.

    Also sets the policy's observation normalisation from the demonstrations' observations
    together with ``extra_norm_obs`` (e.g. initial observations of training states, see
    :func:`initial_observations`): for flat states the mean and standard deviation, each scale
    floored at ``obs_std_floor``; for camera observations whatever the policy's
    ``fit_observation_normalization`` fits (OpenVLA-OFT: its proprio q01/q99). The expert's
    actions become the policy's through ``policy.actions_from_env(actions, obs)`` (π0's
    state-relative actions subtract each observation's state).

    Args:
        obs: float32 ``(N, obs_dim)``, or a TensorDict of batch size ``(N,)`` of camera
            observations (:func:`demonstrations`).
        actions: ``(N, chunk, action_dim)`` float32, the expert's next actions (``chunk``:
            ``policy.bc_chunk_size``).
        steps: gradient steps; lr: Adam learning rate; batch_size: transitions per step.
        seed: seed of the minibatch draws.
        extra_norm_obs: ``(m, obs_dim)`` observations (or a dict of ``m``-row arrays) that count
            in the statistics only.
        progress: show a progress bar of the gradient steps (Ray reports it on the driver).
        obs_std_floor: smallest scale of a flat state's feature (``warm_start.obs_std_floor``).

    Returns:
        ``warm_start/bc_loss`` (last minibatch) and ``warm_start/transitions``.

    Raises:
        ValueError: the policy has trainable parameters that are not float32
            (:func:`~vla_rl.trainers.strategy.refuse_low_precision_adam`).
    """
    refuse_low_precision_adam(policy, "behaviour cloning", "warm_start.num_demos=0")
    actions = policy.actions_from_env(actions, obs)
    if isinstance(obs, TensorDict):
        norm_obs = obs if extra_norm_obs is None else torch.cat([obs, to_torch(extra_norm_obs)])
        policy.fit_observation_normalization(norm_obs)
    else:
        norm_obs = obs if extra_norm_obs is None else torch.cat([obs, torch.as_tensor(extra_norm_obs, dtype=obs.dtype)])
        # Features constant over these observations get a floor on their scale (units of the obs).
        policy.set_obs_normalization(*fit_mean_std(norm_obs, obs_std_floor))
    obs = policy.model_ready_observations(obs)  # camera frames resized once, not in every step
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    loss = torch.zeros(())
    policy.train()
    bar = tqdm_ray.tqdm(total=steps, desc="behaviour cloning", unit="step") if progress else None
    for _ in range(steps):
        idx = torch.randint(len(obs), (min(batch_size, len(obs)),), generator=generator)
        loss = policy.bc_loss(obs[idx], actions[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return {"warm_start/bc_loss": float(loss.detach()), "warm_start/transitions": float(len(obs))}
