"""The simulator pool: Ray actors hosting vectorised environments for one ``env_interact`` node.

A :class:`SimulatorPool` is created inside a process where Ray is already initialised (a DAG
worker actor, or a test's driver). It starts ``num_actors`` :class:`SimulatorWorker` actors of
``envs_per_actor`` environments each, and exposes them as one batch of
``num_actors * envs_per_actor`` environments. Global env ``g`` lives on actor
``g % num_actors`` (as its env ``g // num_actors``), so a batch smaller than the pool still
spreads evenly over the actors. Each call fans out one Ray call per actor, in parallel.
The actors start creating their environments as soon as the pool is constructed.

Asynchronous chunks: :meth:`SimulatorPool.submit` sends one action chunk to some environments
and returns at once; :meth:`SimulatorPool.collect` waits for the results. The rollout loop
(:func:`vla_rl.rollout.embodied.rollout_episodes`) uses them to pipeline simulation and policy
inference over groups of environments.

Task sets: given a list of configs (``env_config=[...]``, one per task), every environment can
run any of the tasks; :meth:`SimulatorPool.reset` takes each environment's task id (its config's
position) and the observations carry it (:mod:`simulators.worker`).

Faults: an actor whose process dies, or that does not answer a chunk within ``step_timeout_s``,
is killed and replaced by a new actor (its environments are created again). The running
episodes of its environments are lost: :meth:`SimulatorPool.collect` reports them in
``"lost"``, a warning is logged, and the pool serves the next :meth:`SimulatorPool.reset` as
before. An actor found dead by :meth:`SimulatorPool.reset` is replaced and the reset retried
once (no episode was running). Resets have no timeout: they may wait for environments to be
created.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from simulators.registry import SIMULATORS, build_env_config
from simulators.rendering import (
    RENDER_GPU_HINT_VAR,
    current_render_gpu,
    user_rendering_env_vars,
)
from simulators.worker import SimulatorWorker
from vla_rl_core.components import ComponentConfigError
from vla_rl_core.env_spec import EnvSpec
from vla_rl_core.observations import Observations, empty_observations, set_rows

logger = logging.getLogger(__name__)

WORKER_ENV_VARS: dict[str, str] = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}
"""Environment of each worker process: one BLAS thread (small matrices; the pool parallelises
over processes), and the node's GPUs visible for rendering (Ray's default) where the pool's creator
sees none: a CPU DAG worker's actor hides them (``vla_rl.workers.placement.CPU_WORKER_ENV``) and
its actors would inherit that. :func:`worker_env_vars` adds the rendering settings."""


def worker_env_vars() -> dict[str, str]:
    """:data:`WORKER_ENV_VARS`, the rendering variables the user set here
    (:func:`simulators.rendering.user_rendering_env_vars`), and ``VLA_RL_RENDER_GPU``: this
    process's GPU (:func:`simulators.rendering.current_render_gpu`), on which the workers render
    unless Ray gives them GPUs of their own; absent when this process has none."""
    env = {**WORKER_ENV_VARS, **user_rendering_env_vars()}
    gpu = current_render_gpu()
    if gpu is not None:
        env[RENDER_GPU_HINT_VAR] = gpu
    return env


def simulator_actor_options(actor_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Ray actor options of a pool's actors: ``{"num_cpus": 1, "max_restarts": 0}`` updated
    with ``actor_options``, whose ``runtime_env["env_vars"]`` are merged over
    :func:`worker_env_vars`."""
    options: dict[str, Any] = {"num_cpus": 1, "max_restarts": 0, **(actor_options or {})}
    runtime_env = dict(options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**worker_env_vars(), **runtime_env.get("env_vars", {})}
    options["runtime_env"] = runtime_env
    return options


_PER_ENV_DTYPES = {"reward": np.float32, "terminated": bool, "truncated": bool, "success": bool}
"""The per-environment scalars that ``step`` returns besides ``obs`` and ``frames``."""

_CHUNK_DTYPES = {**_PER_ENV_DTYPES, "steps": np.int64, "lost": bool}
"""The per-environment scalars that ``collect`` returns besides ``obs`` and ``frames``."""


def _probe(env_name: str, env_config: Any, module: str | None) -> EnvSpec:
    worker = SimulatorWorker(env_name, env_config, 1, module)
    try:
        return worker.spec()
    finally:
        worker.close()


def registering_module(env_name: str) -> str | None:
    """The module whose import registers simulator ``env_name`` (its class's), for the actors."""
    return getattr(SIMULATORS.get(env_name), "__module__", None)


def probe_specs(requests: Sequence[tuple[str, Any]]) -> list[EnvSpec]:
    """The :meth:`SimulatorPool.spec` of each ``(simulator name, env config)`` (a config, or a
    task set's list of configs), without a pool: each environment is created in a Ray task of its
    own (in parallel, in processes set up as the pool's actors), asked for its spaces, and closed.

    Raises:
        RuntimeError: if Ray is not initialised.
        ray.exceptions.RayTaskError: a simulator could not be created (its error inside).
    """
    if not ray.is_initialized():
        raise RuntimeError("probe_specs needs Ray: call ray.init() in this process first")
    probe = ray.remote(_probe).options(num_cpus=0, runtime_env={"env_vars": worker_env_vars()})
    return ray.get([probe.remote(name, config, registering_module(name)) for name, config in requests])


class SimulatorLostError(RuntimeError):
    """A simulator actor died or hung during :meth:`SimulatorPool.step`; it was restarted and the
    episodes of its environments are lost (call :meth:`SimulatorPool.reset` before stepping again)."""


@dataclass
class _ActorCall:
    """One actor's share of a submitted chunk."""

    slot: int  # index of the actor in the pool
    generation: int  # the slot's actor generation when submitted (restarts increment it)
    rows: np.ndarray  # positions in the chunk's env_indices
    rendered: list[int]  # global indices of the environments rendered
    ref: Any  # the Ray object reference of SimulatorWorker.step_chunk


@dataclass
class PendingChunk:
    """An action chunk submitted with :meth:`SimulatorPool.submit`; pass it to :meth:`SimulatorPool.collect`.

    Attributes:
        env_indices: ``(k,)`` int64 global environment indices, in the order of the submitted actions.
        calls: the Ray call of each actor involved.
        lost_rows: positions in ``env_indices`` not sent: their actor was restarted since the last reset.
    """

    env_indices: np.ndarray
    calls: list[_ActorCall]
    lost_rows: np.ndarray


class SimulatorPool:
    """Vectorised environments spread over Ray actors.

    Args:
        env_name: registered simulator name (e.g. ``"robosuite_lift"``).
        env_config: the simulator's config: ``None``, a mapping or its config dataclass; or a
            list of them, a task set (task ``k`` is ``env_config[k]``; see the module docstring).
        num_actors: number of worker actors (processes).
        envs_per_actor: environments per actor.
        actor_options: Ray actor options (default ``{"num_cpus": 1, "max_restarts": 0}``);
            ``runtime_env["env_vars"]`` is merged over :func:`worker_env_vars`.
        step_timeout_s: seconds :meth:`collect` waits for a chunk before it declares the actors
            that have not answered hung, kills and restarts them; ``None`` waits forever.
        progress: show one progress bar (its first actor's) on the driver's console while the
            environments are created; the pools of a DAG worker's peers pass ``False`` so that
            a phase shows one bar, not one per worker.

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
        step_timeout_s: float | None = 120.0,
        progress: bool = True,
    ) -> None:
        if not ray.is_initialized():
            raise RuntimeError("SimulatorPool needs Ray: call ray.init() in this process first")
        for name, value in (("num_actors", num_actors), ("envs_per_actor", envs_per_actor)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if step_timeout_s is not None and not step_timeout_s > 0:
            raise ValueError(f"step_timeout_s must be a positive number of seconds or None, got {step_timeout_s!r}")
        self.num_tasks = len(env_config) if isinstance(env_config, (list, tuple)) else 1
        # fail here, not inside the actors
        self._services: Any = None  # what the simulator's start_services started (a handle)
        if isinstance(env_config, (list, tuple)):
            if not env_config:
                raise ValueError("a task set (a list of env configs) needs at least one task")
            config: Any = [build_env_config(env_name, c) for c in env_config]
        else:
            config = build_env_config(env_name, env_config)
            start_services = getattr(SIMULATORS.get(env_name), "start_services", None)
            if start_services is not None:  # e.g. the remote environments' hub (kept alive by its handle)
                config, self._services = start_services(config)
        options = simulator_actor_options(actor_options)
        self._env_name = env_name
        self.env_config = config  # as the environments get it (start_services may have set fields)
        self._actor_args = (options, config, envs_per_actor)  # to start an actor again after a fault
        bars = [num_actors if progress and slot == 0 else 0 for slot in range(num_actors)]  # one bar: actor 0's
        self._creations: list[Any] = []  # the actors' make_envs calls (_start_actor), read when spec fails
        self._actors = [self._start_actor(bar_for) for bar_for in bars]
        self._generations = [0] * num_actors
        self.capacity = num_actors * envs_per_actor  # total number of environments
        self.step_timeout_s = step_timeout_s
        self.restarts = 0  # actors restarted after a fault, since the pool was created
        self._spec: EnvSpec | None = None
        self._batch_size: int | None = None
        self._lost: set[int] = set()  # environments of the current batch whose actor was restarted

    @property
    def num_actors(self) -> int:
        """Number of worker actors (processes)."""
        return len(self._live_actors())

    def spec(self) -> EnvSpec:
        """The simulator's :class:`~vla_rl_core.env_spec.EnvSpec` (``num_tasks`` set for a task
        set; see :meth:`SimulatorWorker.spec`), asked of one actor once.

        Raises:
            ComponentConfigError: its environments cannot be created (a plug-in's constructor
                raised: the message names the simulator and the error's last line, Ray prints
                the actor's traceback), or break the simulator contract.
        """
        if self._spec is None:
            try:
                self._spec = ray.get(self._live_actors()[0].spec.remote())
            except Exception as error:
                self._read_failed_creations()
                raise _creation_error(self._env_name, error) from None
            self._creations = []
        return self._spec

    def _read_failed_creations(self) -> None:
        """Read the errors of the actors' environment creations that have failed (a task set whose
        tasks differ fails in each actor's ``make_envs`` as in ``spec``): Ray prints the traceback
        of every failed call whose result nobody reads, beside the one error the caller reports."""
        done, _ = ray.wait(self._creations, num_returns=len(self._creations), timeout=10.0)
        for ref in done:
            try:
                ray.get(ref)
            except Exception:  # the same failure as spec's, reported by the caller
                pass

    def reset(self, init_state_ids: np.ndarray | Sequence[int],
              task_ids: np.ndarray | Sequence[int] | None = None) -> Observations:
        """Reset the first ``n`` environments to the given initial states.

        Args:
            init_state_ids: ``(n,)`` non-negative integer initial-state ids, ``n <= capacity``.
            task_ids: ``(n,)`` integer tasks of a task set (in ``[0, num_tasks)``); ``None``: task 0.

        Returns:
            float32 ``(n, obs_dim)`` initial observations; row ``g`` is environment ``g``. Camera
            observations, or a task set's: a dict of ``n``-row arrays (:mod:`vla_rl_core.observations`).

        Raises:
            ValueError: if ids are not a 1-D integer array of length 1..capacity, or task ids do not
                match them or lie outside the task set.
        """
        ids = np.asarray(init_state_ids)
        if ids.ndim != 1 or not 1 <= len(ids) <= self.capacity or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(
                f"init_state_ids must be a 1-D integer array of length 1..{self.capacity} "
                f"(the pool's capacity), got shape {ids.shape} dtype {ids.dtype}"
            )
        if ids.min() < 0:
            raise ValueError(f"init_state_ids must be non-negative, got {ids[ids < 0].tolist()}")
        tasks = None
        if task_ids is not None:
            tasks = np.asarray(task_ids)
            if tasks.shape != ids.shape or not np.issubdtype(tasks.dtype, np.integer):
                raise ValueError(f"task_ids must be an integer array of shape {ids.shape}, got {tasks.dtype} {tasks.shape}")
            if tasks.min() < 0 or tasks.max() >= self.num_tasks:
                raise ValueError(f"task_ids must lie in [0, {self.num_tasks}) (the pool's tasks), got "
                                 f"{sorted(set(tasks.tolist()))}")
        split = self._split(np.arange(len(ids)))

        def call(slot: int, rows: np.ndarray):
            args = (self._local(rows), ids[rows].tolist())
            return self._actors[slot].reset.remote(*args, None if tasks is None else tasks[rows].tolist())

        refs = [call(slot, rows) for slot, rows in split]
        obs = empty_observations(self.spec(), len(ids))
        self._batch_size = None  # no episode of the previous batch survives a reset
        for (slot, rows), ref in zip(split, refs):
            try:
                set_rows(obs, rows, ray.get(ref))
            except ray.exceptions.RayActorError as error:
                self._restart(slot, f"died before the reset ({type(error).__name__})")
                set_rows(obs, rows, ray.get(call(slot, rows)))
        self._batch_size = len(ids)
        self._lost = set()
        return obs

    def step(
        self, actions: np.ndarray, active: np.ndarray, render_indices: Sequence[int] = ()
    ) -> dict[str, np.ndarray]:
        """Step the active environments of the current batch once each.

        Args:
            actions: ``(n, action_dim)``, ``n`` the batch size of the last :meth:`reset`.
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
            SimulatorLostError: an actor died or hung during the step (it was restarted).
        """
        if self._batch_size is None:
            raise RuntimeError("call reset() before step()")
        n = self._batch_size
        actions = np.asarray(actions, dtype=np.float32)
        active = np.asarray(active)
        if actions.ndim != 2 or actions.shape[0] != n:
            raise ValueError(f"actions must have shape ({n}, action_dim) for the batch of {n}, got {actions.shape}")
        if active.shape != (n,) or active.dtype != bool:
            raise ValueError(f"active must be a bool array of shape ({n},), got {active.dtype} {active.shape}")
        render_indices = [int(g) for g in render_indices]
        not_active = [g for g in render_indices if not (0 <= g < n and active[g])]
        if not_active:
            raise ValueError(f"render_indices {not_active} are not active environments of the batch of {n}")
        result = {"obs": empty_observations(self.spec(), n)}
        result.update({key: np.zeros(n, dtype=dtype) for key, dtype in _PER_ENV_DTYPES.items()})
        rows = np.flatnonzero(active)
        if len(rows) == 0:
            return result
        out = self.collect(self.submit(rows, actions[rows, None], render_indices))
        if out["lost"].any():
            raise SimulatorLostError(
                f"environments {rows[out['lost']].tolist()} lost their episodes (their simulator actor died or hung "
                "and was restarted, or the environment lost the episode); call reset() before stepping again"
            )
        set_rows(result["obs"], rows, out["obs"])
        for key in _PER_ENV_DTYPES:
            result[key][rows] = out[key]
        if render_indices:
            result["frames"] = np.stack([out["frames"][g][0] for g in render_indices])
        return result

    def submit(
        self, env_indices: np.ndarray | Sequence[int], actions: np.ndarray, render_indices: Sequence[int] = ()
    ) -> PendingChunk:
        """Send one action chunk to each of the given environments of the current batch; returns at once.

        Each actor executes the chunks of its environments one environment after another, each
        up to the end of its episode (see :meth:`SimulatorWorker.step_chunk`); chunks submitted
        to one actor run in submission order. Environments lost since the last :meth:`reset`
        (their actor was restarted) are not sent; :meth:`collect` reports them lost.

        Args:
            env_indices: ``(k,)`` distinct environment indices in ``[0, n)``, ``n`` the batch size
                of the last :meth:`reset`, with running episodes.
            actions: ``(k, chunk, action_dim)``; row ``i`` for ``env_indices[i]``.
            render_indices: environments among ``env_indices`` to render after every control step.

        Returns:
            The :class:`PendingChunk` to pass to :meth:`collect`.

        Raises:
            RuntimeError: before the first :meth:`reset`.
            ValueError: on indices outside the batch or repeated, a shape that does not match, or
                render indices outside ``env_indices``.
        """
        if self._batch_size is None:
            raise RuntimeError("call reset() before submit()")
        n = self._batch_size
        env_indices = np.asarray(env_indices, dtype=np.int64).reshape(-1)
        actions = np.asarray(actions, dtype=np.float32)
        if len(env_indices) == 0 or env_indices.min() < 0 or env_indices.max() >= n:
            raise ValueError(f"env_indices must be a non-empty subset of the batch [0, {n}), "
                             f"got {env_indices.tolist()}")
        if len(np.unique(env_indices)) != len(env_indices):
            raise ValueError(f"env_indices must be distinct, got {env_indices.tolist()}")
        if actions.ndim != 3 or actions.shape[0] != len(env_indices):
            raise ValueError(f"actions must have shape ({len(env_indices)}, chunk, action_dim), got {actions.shape}")
        render_indices = [int(g) for g in render_indices]
        outside = sorted(set(render_indices) - set(env_indices.tolist()))
        if outside:
            raise ValueError(f"render_indices {outside} are not among the submitted env_indices")
        lost = np.array([int(g) in self._lost for g in env_indices], dtype=bool)
        calls = []
        for slot, rows in self._split(np.flatnonzero(~lost), env_indices):
            owned = set(env_indices[rows].tolist())
            rendered = [g for g in render_indices if g in owned]
            ref = self._actors[slot].step_chunk.remote(
                self._local(env_indices[rows]), actions[rows], self._local(rendered)
            )
            calls.append(_ActorCall(slot, self._generations[slot], rows, rendered, ref))
        return PendingChunk(env_indices, calls, np.flatnonzero(lost))

    def collect(self, pending: PendingChunk) -> dict[str, Any]:
        """Wait for a submitted chunk; restart the actors that died or did not answer in time.

        Waits at most ``step_timeout_s`` from the call (the calls of one chunk run in parallel
        on different actors). An actor that died, or has not answered by then, is killed and
        replaced (:meth:`_restart`); the episodes of all its environments in the current batch
        are lost.

        Args:
            pending: from :meth:`submit`.

        Returns:
            Rows in the order of ``pending.env_indices`` (``k`` of them): ``{"obs": float32
            (k, obs_dim)`` after the last executed step (camera observations: a dict of ``k``-row
            arrays, as from :meth:`reset`), ``"reward": float32 (k,)`` summed over the
            executed steps, ``"terminated", "truncated": bool (k,)`` of the last executed step,
            ``"success": bool (k,)`` any executed step succeeded, ``"steps": int64 (k,)`` control
            steps executed, ``"lost": bool (k,)`` the episode was lost (its other entries are
            zero), ``"frames": {global index: uint8 (steps, H, W, 3)}`` for the rendered
            environments not lost, ``"sim_seconds": float`` wall time the actors spent inside the
            environments' ``step`` and ``render_frame`` for this chunk (summed over actors), and
            ``"sim_cpu_seconds": float`` the CPU time they used meanwhile}``.

        Raises:
            ray.exceptions.RayTaskError: an environment raised (a bug, not a fault: not restarted).
        """
        k = len(pending.env_indices)
        result: dict[str, Any] = {"obs": empty_observations(self.spec(), k)}
        result.update({key: np.zeros(k, dtype=dtype) for key, dtype in _CHUNK_DTYPES.items()})
        result["lost"][pending.lost_rows] = True
        result["frames"], result["sim_seconds"], result["sim_cpu_seconds"] = {}, 0.0, 0.0
        ready, _ = ray.wait([call.ref for call in pending.calls], num_returns=len(pending.calls),
                            timeout=self.step_timeout_s)
        answered = set(ready)
        for call in pending.calls:
            out = self._answer(call, call.ref in answered)
            if out is None:
                result["lost"][call.rows] = True
                continue
            set_rows(result["obs"], call.rows, out["obs"])
            for key in (*_PER_ENV_DTYPES, "steps"):
                result[key][call.rows] = out[key]
            result["lost"][call.rows] |= out["lost"]  # an environment lost its episode (EpisodeLost)
            result["frames"].update(zip(call.rendered, out["frames"]))
            result["sim_seconds"] += out["sim_seconds"]
            result["sim_cpu_seconds"] += out["sim_cpu_seconds"]
        result["lost"] |= np.isin(pending.env_indices, list(self._lost))  # on a slot restarted meanwhile
        for g in pending.env_indices[result["lost"]]:
            result["frames"].pop(int(g), None)
        return result

    def run_expert(self, init_state_ids: np.ndarray | Sequence[int], task_id: int = 0) -> list[dict[str, Any]]:
        """Run the scripted expert of task ``task_id`` (0 for a single task) once per initial
        state, spread over the actors.

        Uses environment 0 of each actor, i.e. global environments ``0 .. num_actors - 1``
        (ending any episode they were running).

        Args:
            init_state_ids: ``(m,)`` non-negative integer initial-state ids.

        Returns:
            ``m`` episode dicts in the order of ``init_state_ids``: ``{"obs": float32 (T, obs_dim)
            (camera observations, or a task set's: a dict of T-row arrays),
            "actions": float32 (T, action_dim), "success": bool, "init_state_id": int}``.

        Raises:
            RegistryError: (from a worker) if the simulator has no scripted expert.
        """
        ids = np.asarray(init_state_ids, dtype=np.int64).reshape(-1)
        actors = self._live_actors()
        chunks = [chunk for chunk in np.array_split(ids, len(actors)) if len(chunk)]
        refs = [actor.run_expert.remote(chunk.tolist(), int(task_id)) for actor, chunk in zip(actors, chunks)]
        return [episode for episodes in ray.get(refs) for episode in episodes]

    def rendering(self) -> list[dict[str, Any]]:
        """How each worker actor renders, by slot: :func:`simulators.rendering.rendering_report`
        in its process (backend, EGL device, GPU, ``GL_RENDERER``; waits for actors still
        creating environments)."""
        return ray.get([actor.rendering.remote() for actor in self._live_actors()])

    def actor_pids(self) -> list[int]:
        """Process ids of the worker actors, by slot (waits for actors still creating environments)."""
        return [int(pid) for pid in ray.get([actor.pid.remote() for actor in self._live_actors()])]

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

    def _split(self, rows: np.ndarray, env_indices: np.ndarray | None = None) -> list[tuple[int, np.ndarray]]:
        """``(actor slot, its rows)`` for each actor owning some of the environments
        ``env_indices[rows]`` (``env_indices`` defaults to the identity: rows are global indices)."""
        owners = (rows if env_indices is None else env_indices[rows]) % len(self._live_actors())
        return [(int(a), rows[owners == a]) for a in np.unique(owners)]

    def _local(self, global_indices: Sequence[int]) -> list[int]:
        """Indices of global environments within their actor."""
        return [int(g) // len(self._actors) for g in global_indices]

    # ------------------------------------------------------------------------------ faults
    def _start_actor(self, bar_for: int = 0) -> Any:
        """A new simulator actor creating its environments in the background (later calls queue
        behind it); ``bar_for`` > 0: it shows the pool's one progress bar, labelled for that many
        actors (the first actor of a new pool does; a restarted one does not)."""
        options, config, envs_per_actor = self._actor_args
        actor = ray.remote(SimulatorWorker).options(**options).remote(self._env_name, config, envs_per_actor,
                                                                      registering_module(self._env_name))
        self._creations.append(actor.make_envs.remote(progress=bar_for > 0, num_actors=max(bar_for, 1)))
        return actor

    def _answer(self, call: _ActorCall, answered: bool) -> dict[str, Any] | None:
        """The result of one actor's call, or ``None`` if its actor died or hung (then restarted)."""
        if answered:
            try:
                return ray.get(call.ref)
            except ray.exceptions.RayActorError as error:
                reason = f"died ({type(error).__name__})"
        else:
            reason = f"did not answer a chunk within step_timeout_s={self.step_timeout_s} s"
        if call.generation == self._generations[call.slot]:  # else an earlier call found the fault
            self._restart(call.slot, reason)
        return None

    def _restart(self, slot: int, reason: str) -> None:
        """Kill the actor of ``slot`` and start a new one there; every environment of the slot
        in the current batch is lost."""
        ray.kill(self._actors[slot], no_restart=True)
        self._actors[slot] = self._start_actor()
        self._generations[slot] += 1
        self.restarts += 1
        lost = []
        if self._batch_size is not None:
            lost = [g for g in range(slot, self._batch_size, len(self._actors)) if g not in self._lost]
            self._lost.update(lost)
        logger.warning("simulator actor %d of the %r pool %s: restarted it (environments re-created); "
                       "episodes lost in environments %s", slot, self._env_name, reason, lost)


def _creation_error(env_name: str, error: Exception) -> Exception:
    """What :meth:`SimulatorPool.spec` raises for ``error``: a :class:`ComponentConfigError` as
    it is; an actor whose constructor raised (Ray keeps its traceback's text only) or whose
    environments raised while being made, one line naming ``simulator.name`` (the group of DAG
    workers reports it without a traceback); anything else (Ray's own failures) unchanged."""
    cause = error.cause if isinstance(error, ray.exceptions.RayTaskError) else None
    if isinstance(cause, ComponentConfigError):
        return cause
    if isinstance(error, ray.exceptions.RayActorError) and error.actor_init_failed:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        reason = lines[-1] if lines else type(error).__name__
    elif cause is not None:
        reason = f"{type(cause).__name__}: {cause}"
    else:
        return error
    return ComponentConfigError("simulator.name", f"simulator {env_name!r}: its environments cannot be created "
                                f"({reason})")
