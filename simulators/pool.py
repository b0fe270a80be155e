"""The simulator pool: Ray actors hosting vectorised environments for one ``env_interact`` node.

A :class:`SimulatorPool` is created inside a process where Ray is already initialised (a DAG
worker actor, or a test's driver). It starts ``num_actors`` :class:`SimulatorWorker` actors of
``envs_per_actor`` environments each, and exposes them as one batch of
``num_actors * envs_per_actor`` environments. Global env ``g`` lives on actor
``g % num_actors`` (as its env ``g // num_actors``), so a batch smaller than the pool still
spreads evenly over the actors. Each call fans out one Ray call per actor, in parallel.
The actors start creating their environments as soon as the pool is constructed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import ray

from simulators.registry import build_env_config
from simulators.rendering import headless_rendering_env_vars
from simulators.worker import SimulatorWorker
from vla_rl.data.observations import Observations, empty_observations, set_rows

WORKER_ENV_VARS: dict[str, str] = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    **headless_rendering_env_vars(),
}
"""Environment of each worker process: one BLAS thread (small matrices; the pool parallelises
over processes) and headless EGL rendering. ``actor_options["runtime_env"]["env_vars"]`` overrides."""

_PER_ENV_DTYPES = {"reward": np.float32, "terminated": bool, "truncated": bool, "success": bool}
"""The per-environment scalars that ``step`` returns besides ``obs`` and ``frames``."""


class SimulatorPool:
    """Vectorised environments spread over Ray actors.

    Args:
        env_name: registered simulator name (e.g. ``"robosuite_lift"``).
        env_config: the simulator's config: ``None``, a mapping or its config dataclass.
        num_actors: number of worker actors (processes).
        envs_per_actor: environments per actor.
        actor_options: Ray actor options (default ``{"num_cpus": 1, "max_restarts": 0}``);
            ``runtime_env["env_vars"]`` is merged over :data:`WORKER_ENV_VARS`.

    Raises:
        RuntimeError: if Ray is not initialised.
        ValueError: if a count is not a positive integer, or the config is invalid.
        RegistryError: if ``env_name`` is unknown.
    """

    def __init__(
        self,
        env_name: str,
        env_config: Any,
        num_actors: int,
        envs_per_actor: int,
        actor_options: dict[str, Any] | None = None,
    ) -> None:
        if not ray.is_initialized():
            raise RuntimeError("SimulatorPool needs Ray: call ray.init() in this process first")
        for name, value in (("num_actors", num_actors), ("envs_per_actor", envs_per_actor)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        config = build_env_config(env_name, env_config)  # fail here, not inside the actors
        options: dict[str, Any] = {"num_cpus": 1, "max_restarts": 0, **(actor_options or {})}
        runtime_env = dict(options.get("runtime_env") or {})
        runtime_env["env_vars"] = {**WORKER_ENV_VARS, **runtime_env.get("env_vars", {})}
        options["runtime_env"] = runtime_env
        worker_class = ray.remote(SimulatorWorker)
        self._actors = [
            worker_class.options(**options).remote(env_name, config, envs_per_actor) for _ in range(num_actors)
        ]
        for actor in self._actors:
            actor.make_envs.remote()  # in the background; later calls queue behind it
        self.capacity = num_actors * envs_per_actor  # total number of environments
        self._spec: dict[str, Any] | None = None
        self._batch_size: int | None = None

    def spec(self) -> dict[str, Any]:
        """``{"obs_dim": int, "act_dim": int, "horizon": int (control steps)}``, plus ``"images":
        {"<camera>_image": [H, W, 3]}`` for camera observations (see :meth:`SimulatorWorker.spec`)."""
        if self._spec is None:
            self._spec = ray.get(self._live_actors()[0].spec.remote())
        return dict(self._spec)

    def reset(self, init_state_ids: np.ndarray | Sequence[int]) -> Observations:
        """Reset the first ``n`` environments to the given initial states.

        Args:
            init_state_ids: ``(n,)`` non-negative integer initial-state ids, ``n <= capacity``.

        Returns:
            float32 ``(n, obs_dim)`` initial observations; row ``g`` is environment ``g``. Camera
            observations: a dict of ``n``-row arrays (:mod:`vla_rl.data.observations`).

        Raises:
            ValueError: if ids are not a 1-D integer array of length 1..capacity.
        """
        ids = np.asarray(init_state_ids)
        if ids.ndim != 1 or not 1 <= len(ids) <= self.capacity or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(
                f"init_state_ids must be a 1-D integer array of length 1..{self.capacity} "
                f"(the pool's capacity), got shape {ids.shape} dtype {ids.dtype}"
            )
        if ids.min() < 0:
            raise ValueError(f"init_state_ids must be non-negative, got {ids[ids < 0].tolist()}")
        split = self._split(np.arange(len(ids)))
        refs = [actor.reset.remote(self._local(rows), ids[rows].tolist()) for actor, rows in split]
        obs = empty_observations(self.spec(), len(ids))
        for (_, rows), actor_obs in zip(split, ray.get(refs)):
            set_rows(obs, rows, actor_obs)
        self._batch_size = len(ids)
        return obs

    def step(
        self, actions: np.ndarray, active: np.ndarray, render_indices: Sequence[int] = ()
    ) -> dict[str, np.ndarray]:
        """Step the active environments of the current batch once each.

        Args:
            actions: ``(n, act_dim)``, ``n`` the batch size of the last :meth:`reset`.
            active: bool ``(n,)``; inactive environments are not stepped.
            render_indices: active environments (in ``[0, n)``) to render after the step.

        Returns:
            ``{"obs": float32 (n, obs_dim) (or a dict, as from reset), "reward": float32 (n,),
            "terminated": bool (n,), "truncated": bool (n,), "success": bool (n,)}`` with zero /
            False rows for inactive environments, plus ``"frames"``: uint8 ``(len(render_indices),
            H, W, 3)`` in the order of ``render_indices`` when it is not empty.

        Raises:
            RuntimeError: before the first :meth:`reset`; or, from a worker, when stepping an
                environment whose episode ended, or rendering without a ``render_camera``.
            ValueError: on shapes that do not match, or render indices that are not active.
        """
        if self._batch_size is None:
            raise RuntimeError("call reset() before step()")
        n = self._batch_size
        actions = np.asarray(actions, dtype=np.float32)
        active = np.asarray(active)
        if actions.ndim != 2 or actions.shape[0] != n:
            raise ValueError(f"actions must have shape ({n}, act_dim) for the batch of {n}, got {actions.shape}")
        if active.shape != (n,) or active.dtype != bool:
            raise ValueError(f"active must be a bool array of shape ({n},), got {active.dtype} {active.shape}")
        render_indices = [int(g) for g in render_indices]
        not_active = [g for g in render_indices if not (0 <= g < n and active[g])]
        if not_active:
            raise ValueError(f"render_indices {not_active} are not active environments of the batch of {n}")
        rows_per_actor, rendered_per_actor, refs = [], [], []
        for actor, rows in self._split(np.flatnonzero(active)):
            owned = set(rows.tolist())
            rendered = [g for g in render_indices if g in owned]
            refs.append(actor.step.remote(self._local(rows), actions[rows], self._local(rendered)))
            rows_per_actor.append(rows)
            rendered_per_actor.append(rendered)
        result = {"obs": empty_observations(self.spec(), n)}
        result.update({key: np.zeros(n, dtype=dtype) for key, dtype in _PER_ENV_DTYPES.items()})
        frames: dict[int, np.ndarray] = {}
        for rows, rendered, out in zip(rows_per_actor, rendered_per_actor, ray.get(refs)):
            set_rows(result["obs"], rows, out["obs"])
            for key in _PER_ENV_DTYPES:
                result[key][rows] = out[key]
            frames.update(zip(rendered, out.get("frames", ())))
        if render_indices:
            result["frames"] = np.stack([frames[g] for g in render_indices])
        return result

    def run_expert(self, init_state_ids: np.ndarray | Sequence[int]) -> list[dict[str, Any]]:
        """Run the scripted expert once per initial state, spread over the actors.

        Uses environment 0 of each actor, i.e. global environments ``0 .. num_actors - 1``
        (ending any episode they were running).

        Args:
            init_state_ids: ``(m,)`` non-negative integer initial-state ids.

        Returns:
            ``m`` episode dicts in the order of ``init_state_ids``: ``{"obs": float32 (T, obs_dim)
            (camera observations: a dict of T-row arrays),
            "actions": float32 (T, act_dim), "success": bool, "init_state_id": int}``.

        Raises:
            RegistryError: (from a worker) if the simulator has no scripted expert.
        """
        ids = np.asarray(init_state_ids, dtype=np.int64).reshape(-1)
        actors = self._live_actors()
        chunks = [chunk for chunk in np.array_split(ids, len(actors)) if len(chunk)]
        refs = [actor.run_expert.remote(chunk.tolist()) for actor, chunk in zip(actors, chunks)]
        return [episode for episodes in ray.get(refs) for episode in episodes]

    def close(self) -> None:
        """Kill the worker actors; the pool cannot be used afterwards. Idempotent."""
        for actor in self._actors:
            ray.kill(actor)
        self._actors = []

    def __enter__(self) -> SimulatorPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _live_actors(self) -> list[Any]:
        if not self._actors:
            raise RuntimeError("the SimulatorPool is closed")
        return self._actors

    def _split(self, global_indices: np.ndarray) -> list[tuple[Any, np.ndarray]]:
        """``(actor, its global indices)`` for each actor owning some of ``global_indices``."""
        actors = self._live_actors()
        owners = global_indices % len(actors)
        return [(actors[a], global_indices[owners == a]) for a in np.unique(owners)]

    def _local(self, global_indices: Sequence[int]) -> list[int]:
        """Indices of global environments within their actor."""
        return [int(g) // len(self._actors) for g in global_indices]
