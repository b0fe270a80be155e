"""The simulator worker: hosts the environments of one simulator in its own process.

:class:`SimulatorWorker` is a plain class; :class:`simulators.pool.SimulatorPool` runs it as a
Ray actor. It drives one :class:`simulators.vector.VectorSimulator`: the registered simulator
itself when it steps its environments as a batch, or, for a gymnasium ``Env`` class (robosuite,
MetaWorld, LIBERO, remote), :class:`simulators.gym_vector.GymVector`, which hosts them one by
one (lazily created, so that the simulator library and its OpenGL context load inside this
process only). The worker checks every call's arguments, times the simulator and reports how it
renders. This module imports neither torch nor any simulator library.

Observations leave the worker as :mod:`vla_rl_core.observations` lays them out: a float32
``(n, obs_dim)`` array, or with cameras a dict of arrays (``state``, ``<camera>_image`` uint8,
and the task's ``instruction`` as uint8 UTF-8 bytes); a task set's carry their task id
(:mod:`simulators.gym_vector`).
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from simulators.experts import NoExpertError
from simulators.gym_vector import GymVector
from simulators.registry import SIMULATORS
from simulators.rendering import rendering_report
from simulators.vector import ChunkResult, VectorSimulator, check_chunk_call
from vla_rl_core import keys
from vla_rl_core.components import ComponentConfigError
from vla_rl_core.env_spec import EnvSpec
from vla_rl_core.observations import Observations


class SimulatorWorker:
    """Hosts ``num_envs`` environments of simulator ``env_name``, addressed by index.

    Args:
        env_name: registered simulator name (e.g. ``"robosuite_lift"``).
        env_config: the simulator's config (see ``simulators.build_env_config``), or, for a
            gymnasium simulator, a list of configs: a task set (:mod:`simulators.gym_vector`).
        num_envs: number of environments hosted.
        module: the module that registers ``env_name``, imported first (a pool's actors are new
            processes: a plug-in simulator whose config class lives in another module would be
            unknown there); None: only the built-ins and what unpickling ``env_config`` imports.

    Raises:
        ValueError: ``num_envs`` is not a positive integer, a task set is empty, or a task set is
            given to a vectorised simulator (it hosts one task).
        TypeError: the registered class is neither a gymnasium ``Env`` nor a
            :class:`~simulators.vector.VectorSimulator`.
    """

    def __init__(self, env_name: str, env_config: Any, num_envs: int, module: str | None = None) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        if module is not None:
            importlib.import_module(module)
        self._env_name = env_name
        self._num_envs = num_envs
        self._obs_dim: int | None = None  # the spec's, read at the first reset
        simulator = SIMULATORS.get(env_name)
        if issubclass(simulator, gym.Env):
            self._sim: VectorSimulator = GymVector(env_name, env_config, num_envs)
        elif isinstance(env_config, (list, tuple)):
            raise ValueError(f"simulator {env_name!r} steps its environments as one batch and hosts one task; "
                             "it cannot host a task set (simulator.tasks)")
        else:
            self._sim = simulator(env_config, num_envs)
            if not isinstance(self._sim, VectorSimulator):
                raise TypeError(f"simulator {env_name!r} ({simulator.__name__}) is neither a gymnasium Env nor a "
                                "VectorSimulator (spec, reset, step_chunk, close): see simulators/vector.py")

    def make_envs(self, progress: bool = False, num_actors: int = 1) -> None:
        """Create every hosted environment now (otherwise each is created at its first use), if the
        simulator creates them lazily.

        Args:
            progress: show a progress bar on the driver's console; a pool asks it of its first
                actor only, so that a phase shows one bar, not one per actor.
            num_actors: the pool's actors, all creating theirs at the same time (for the bar's label).
        """
        make_envs = getattr(self._sim, "make_envs", None)
        if make_envs is not None:
            make_envs(progress=progress, num_actors=num_actors)

    def spec(self) -> EnvSpec:
        """The simulator's :class:`~vla_rl_core.env_spec.EnvSpec` (``num_tasks`` set for a task set).

        Raises:
            ValueError: the tasks of a task set differ in a part of their spec (naming both).
            TypeError: the simulator's ``spec()`` is not an ``EnvSpec`` (naming the simulator).
        """
        spec = self._sim.spec()
        if not isinstance(spec, EnvSpec):
            raise TypeError(f"simulator {self._env_name!r}: spec() must return a vla_rl_core.env_spec.EnvSpec, "
                            f"got {type(spec).__name__}")
        return spec

    def reset(self, env_indices: Sequence[int], init_state_ids: Sequence[int],
              task_ids: Sequence[int] | None = None) -> Observations:
        """Reset the given environments to the given initial states.

        Args:
            env_indices: ``n`` distinct environment indices in ``[0, num_envs)``.
            init_state_ids: ``n`` non-negative initial-state ids (the reset seeds).
            task_ids: ``n`` tasks of a task set (positions in its configs); ``None``: task 0.

        Returns:
            float32 ``(n, obs_dim)`` initial observations (camera observations, or a task set's:
            a dict of ``n``-row arrays).

        Raises:
            ValueError: on bad or repeated indices, lengths that differ, or a task outside the set.
        """
        check_chunk_call(self._num_envs, env_indices)
        if len(init_state_ids) != len(env_indices):
            raise ValueError(f"got {len(init_state_ids)} init_state_ids for {len(env_indices)} environments")
        observations = self._sim.reset(env_indices, init_state_ids, task_ids)
        self._check_states(observations, len(env_indices), "reset")
        return observations

    def step_chunk(
        self, env_indices: Sequence[int], actions: np.ndarray, render_indices: Sequence[int] = ()
    ) -> dict[str, Any]:
        """Execute one action chunk in each of the given environments
        (:meth:`simulators.vector.VectorSimulator.step_chunk`; the gymnasium simulators:
        :meth:`simulators.gym_vector.GymVector.step_chunk`).

        Args:
            env_indices: ``n`` distinct environment indices with running episodes.
            actions: ``(n, chunk, action_dim)`` actions, row ``k`` for ``env_indices[k]``.
            render_indices: environments (a subset of ``env_indices``) to render after every
                control step they execute.

        Returns:
            :meth:`simulators.vector.ChunkResult.as_dict` (``obs``, ``reward``, ``terminated``,
            ``truncated``, ``success``, ``steps``, ``lost``, ``frames``) plus ``"sim_seconds":
            float`` the wall time the simulator took, and ``"sim_cpu_seconds": float`` the CPU
            time this process (all its threads) used meanwhile.

        Raises:
            ValueError: on bad indices, an ``actions`` shape that does not match, render indices
                outside ``env_indices``, or a result of another number of rows.
            RuntimeError: an environment has no running episode, or ``render_indices`` is not
                empty and the simulator has no render camera (checked before stepping).
        """
        actions = np.asarray(actions, dtype=np.float32)
        check_chunk_call(self._num_envs, env_indices, actions)
        if render_indices and not isinstance(self._sim, GymVector) and getattr(self._sim, "render_mode", None) is None:
            raise RuntimeError(f"simulator {self._env_name!r} renders no frames (it has no render_mode)")
        started, cpu_started = time.perf_counter(), time.process_time()
        result = self._sim.step_chunk(env_indices, actions, render_indices)
        sim_seconds, sim_cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        if not isinstance(result, ChunkResult) or len(result.reward) != len(env_indices):
            raise ValueError(f"simulator {self._env_name!r} answered a chunk of {len(env_indices)} environments with "
                             f"{getattr(result, 'reward', result)!r}, not a ChunkResult of as many rows")
        self._check_states(result.obs, len(env_indices), "step_chunk")
        return {**result.as_dict(), "sim_seconds": sim_seconds, "sim_cpu_seconds": sim_cpu_seconds}

    def _check_states(self, observations: Observations, rows: int, call: str) -> None:
        """The state rows a call returned have the spec's size (a plug-in whose ``spec()`` says 2
        values and whose observations hold 3 failed deep in the rollout, in a traceback).

        Raises:
            ComponentConfigError: ``simulator.name``, naming the simulator, the call and both shapes.
        """
        states = observations.get(keys.OBS_STATE) if isinstance(observations, dict) else observations
        if self._obs_dim is None:
            self._obs_dim = self.spec().obs_dim
        expected = (rows, self._obs_dim)
        if getattr(states, "shape", None) != expected:
            raise ComponentConfigError("simulator.name", f"simulator {self._env_name!r}: {call}() returned states of "
                                       f"shape {getattr(states, 'shape', type(states).__name__)}, its spec() "
                                       f"says {expected} ({rows} environments x obs_dim)")

    def pid(self) -> int:
        """The id of this worker's process."""
        return os.getpid()

    def rendering(self) -> dict[str, Any]:
        """How this process renders: :func:`simulators.rendering.rendering_report` (the backend,
        EGL device and ``GL_RENDERER`` chosen before the first environment was created)."""
        return rendering_report()

    def run_expert(self, init_state_ids: Sequence[int], task_id: int = 0) -> list[dict[str, Any]]:
        """Scripted demonstrations, one episode per initial state
        (:meth:`simulators.gym_vector.GymVector.run_expert`).

        Raises:
            NoExpertError: no scripted expert is registered for the task, or the simulator has no
                ``run_expert``.
        """
        run_expert = getattr(self._sim, "run_expert", None)
        if run_expert is None:
            raise NoExpertError(f"simulator {self._env_name!r} has no scripted expert (no run_expert): set "
                                "warm_start.num_demos=0")
        return run_expert(init_state_ids, task_id)

    def close(self) -> None:
        """Close the environments created so far."""
        self._sim.close()
