"""The one wrapper that puts the single-environment simulators (gymnasium ``Env`` classes:
robosuite, MetaWorld, LIBERO, remote) behind the vectorised contract the simulator workers drive
(:class:`simulators.vector.VectorSimulator`).

:class:`GymVector` hosts ``num_envs`` environments of one registered simulator, created lazily
(on the first call that uses them), and steps them one after another. It imports neither torch
nor any simulator library (the adapters import theirs in their constructors).

Observations leave it as :mod:`vla_rl_core.observations` lays them out: a float32
``(n, obs_dim)`` array, or with cameras a dict of arrays (``state``, ``<camera>_image`` uint8,
and the task's ``instruction`` as uint8 UTF-8 bytes).

Task sets: given a list of configs (one per task), it hosts a **task set**: every environment
slot runs one task at a time, chosen at each reset by a task id (the config's position in the
list), and every observation carries it (``task_id``, int64; a flat state then becomes
``{"state", "task_id"}``). A slot that changes task parks its environment for later reuse (at
most as many parked environments as slots, or as tasks if more; the oldest are closed).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from simulators.experts import make_expert
from simulators.registry import make_env
from simulators.stepping import ChunkedSteps, EpisodeLost, UnobservedSteps
from simulators.vector import ChunkResult
from vla_rl_core import keys
from vla_rl_core.components import ComponentConfigError
from vla_rl_core.env_spec import EnvSpec, executed_actions, finite_actions, info_success
from vla_rl_core.observations import Observations, observation, stack_observations

logger = logging.getLogger(__name__)


def env_spec(env: gym.Env) -> EnvSpec:
    """The :class:`~vla_rl_core.env_spec.EnvSpec` of one gymnasium environment of the simulator
    contract: its state size (the ``Box`` observation, or the ``state`` of a ``Dict``), action size,
    ``horizon``, ``obs_layout`` (``{key: slice}``) and, for a ``Dict`` observation, its
    ``<camera>_image`` shapes."""
    space = env.observation_space
    dict_space = isinstance(space, gym.spaces.Dict)
    state_space = space[keys.OBS_STATE] if dict_space else space
    images = ({key: sub.shape for key, sub in space.spaces.items() if key.endswith(keys.OBS_IMAGE_SUFFIX)}
              if dict_space else None)
    return EnvSpec(obs_dim=int(state_space.shape[0]), action_dim=int(env.action_space.shape[0]),
                   horizon=int(env.horizon),
                   obs_layout={key: (part.start, part.stop) for key, part in env.obs_layout.items()}, images=images)


class GymVector:
    """``num_envs`` environments of the gymnasium simulator ``env_name``, addressed by index, behind
    :class:`simulators.vector.VectorSimulator`.

    Args:
        env_name: registered simulator name (e.g. ``"robosuite_lift"``).
        env_config: the simulator's config (see ``simulators.build_env_config``), or a list of
            configs: a task set (see the module docstring), task ``k`` being ``env_config[k]``.
        num_envs: number of environments hosted.

    Raises:
        ValueError: if ``num_envs`` is not a positive integer, or a task set is empty.
    """

    def __init__(self, env_name: str, env_config: Any, num_envs: int) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        self._env_name = env_name
        self._multi_task = isinstance(env_config, (list, tuple))
        self._configs = list(env_config) if self._multi_task else [env_config]
        if not self._configs:
            raise ValueError("a task set needs at least one task config")
        self._envs: list[gym.Env | None] = [None] * num_envs
        self._env_tasks = [0] * num_envs  # the task of each slot's environment
        self._parked: OrderedDict[int, tuple[int, gym.Env]] = OrderedDict()  # key -> (task, env), oldest first
        self._parked_serial = 0

    def make_envs(self, progress: bool = False, num_actors: int = 1) -> None:
        """Create every hosted environment now (otherwise each is created at its first use). A
        task set's slots get their task at their first reset: it creates one environment per
        task (:meth:`spec`).

        Args:
            progress: show a progress bar on the driver's console (Ray's ``tqdm_ray``); a pool
                asks it of its first actor only, so that a phase shows one bar, not one per actor.
            num_actors: the pool's actors, all creating theirs at the same time (for the bar's label).
        """
        from ray.experimental import tqdm_ray

        if self._multi_task:
            self.spec()
            return
        each = f" in each of {num_actors} simulator actors" if num_actors > 1 else ""
        # the task too: one simulator name hosts many tasks (robosuite_lift builds Door as well)
        task = getattr(self._configs[0], "task_name", None)
        what = f"{self._env_name} ({task})" if task else self._env_name
        bar = tqdm_ray.tqdm(total=len(self._envs), desc=f"creating {what} environments{each}",
                            unit="env") if progress else None
        for index in range(len(self._envs)):
            self._env(index)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()

    def spec(self) -> EnvSpec:
        """The environments' :class:`~vla_rl_core.env_spec.EnvSpec` (``num_tasks`` set for a task
        set); creates env 0 (for a task set, one environment per task).

        Raises:
            ComponentConfigError: (a ValueError) ``simulator.tasks``: the tasks of a task set
                differ in a part of their spec (naming both); the driver reports it in one line.
        """
        if not self._multi_task:
            return env_spec(self._env(0))
        specs = [env_spec(self._any_env(task)) for task in range(len(self._configs))]
        for task, other in enumerate(specs[1:], start=1):
            differs = specs[0].differences(other)
            if differs:
                names = [getattr(config, "task_name", str(config)) for config in self._configs]
                raise ComponentConfigError(
                    "simulator.tasks",
                    f"the tasks of a task set must share their observation and action layout and horizon, but "
                    f"{names[task]!r} differs from {names[0]!r} in {differs}: "
                    + "; ".join(f"{key}: {getattr(other, key)} vs {getattr(specs[0], key)}" for key in differs))
        return specs[0].with_tasks(len(self._configs))

    def reset(self, env_indices: Sequence[int], init_state_ids: Sequence[int],
              task_ids: Sequence[int] | None = None) -> Observations:
        """Reset environments ``env_indices`` to initial states ``init_state_ids`` (the reset seeds),
        each into its task of a task set (``task_ids``, positions in its configs; None: task 0); the
        indices and lengths are checked by the caller (:meth:`simulators.worker.SimulatorWorker.reset`).

        Returns:
            float32 ``(n, obs_dim)`` initial observations (camera observations, or a task set's:
            a dict of ``n``-row arrays, see the module docstring).

        Raises:
            ValueError: ``task_ids`` of another length, or a task outside the set.
        """
        tasks = [0] * len(env_indices) if task_ids is None else [int(t) for t in task_ids]
        if len(tasks) != len(env_indices):
            raise ValueError(f"got {len(tasks)} task_ids for {len(env_indices)} environments")
        bad = sorted({t for t in tasks if not 0 <= t < len(self._configs)})
        if bad:
            raise ValueError(f"task ids {bad} are outside this worker's {len(self._configs)} task(s)")
        observations = [self._observation(i, self._env(i, task).reset(seed=int(s))[0])
                        for i, s, task in zip(env_indices, init_state_ids, tasks)]
        return stack_observations(observations)

    def step_chunk(
        self, env_indices: Sequence[int], actions: np.ndarray, render_indices: Sequence[int] = ()
    ) -> ChunkResult:
        """Execute one action chunk in each of the given environments.

        Environment ``env_indices[k]`` takes the actions ``actions[k, 0], actions[k, 1], ...`` one
        control step each, and stops early when its episode ends (``terminated`` or
        ``truncated``): a success in the middle of a chunk ends the episode and the rest of the
        chunk is not executed. The environments are stepped one after another. An environment
        with ``step_unobserved`` / ``observe`` (:class:`simulators.stepping.UnobservedSteps`) builds
        only the observation the chunk returns: its cameras render once per chunk, not once per action.
        An environment that executes chunks itself (:class:`simulators.stepping.ChunkedSteps`, a
        remote one) gets its chunk before any environment is waited for, so that they run at the
        same time. An environment that raises :class:`~simulators.stepping.EpisodeLost`
        loses its episode: its row is ``lost`` (zeros elsewhere, a zero observation).

        Args:
            env_indices: ``n`` distinct environment indices with running episodes (checked, with
                the shape of ``actions``, by :meth:`simulators.worker.SimulatorWorker.step_chunk`).
            actions: float32 ``(n, chunk, action_dim)`` actions, row ``k`` for ``env_indices[k]``.
            render_indices: environments (a subset of ``env_indices``) to render after every
                control step they execute.

        Returns:
            a :class:`~simulators.vector.ChunkResult` (camera observations: a dict of ``n``-row
            arrays, as from :meth:`reset`); ``frames``: one uint8 ``(steps, H, W, 3)`` array per
            entry of ``render_indices``, in its order (none for a lost episode).

        Raises:
            ValueError: render indices outside ``env_indices``.
            RuntimeError: if an environment has no running episode, or if ``render_indices`` is not
                empty and the simulator has no render camera (checked before stepping).
        """
        if not set(render_indices) <= set(env_indices):
            raise ValueError(f"render_indices {list(render_indices)} must be among the stepped {list(env_indices)}")
        if any(self._env(i).render_mode is None for i in render_indices):
            raise RuntimeError(f"simulator {self._env_name!r} was configured without a render camera")
        n = len(env_indices)
        observations = []
        result: dict[str, Any] = {
            "reward": np.zeros(n, dtype=np.float32),
            "terminated": np.zeros(n, dtype=bool),
            "truncated": np.zeros(n, dtype=bool),
            "success": np.zeros(n, dtype=bool),
            "steps": np.zeros(n, dtype=np.int64),
            "lost": np.zeros(n, dtype=bool),
        }
        rendered = {int(i): [] for i in render_indices}
        sent = set()  # rows whose chunk runs elsewhere, sent before any is waited for
        for row, index in enumerate(env_indices):
            env = self._env(index)
            if isinstance(env, ChunkedSteps):  # clipped on its far side; a non-finite one stops the run here
                env.send_actions(finite_actions(actions[row]))
                sent.add(row)
        for row, index in enumerate(env_indices):
            env = self._env(index)
            try:
                if row in sent:
                    obs = self._outcome(env, env.receive_outcome(), row, result)
                else:
                    obs = self._step_env(env, actions[row], row, result, rendered.get(int(index)))
            except EpisodeLost as err:
                logger.warning("environment %d lost its episode: %s", index, err)
                for key in ("reward", "terminated", "truncated", "success", "steps"):
                    result[key][row] = 0
                result["lost"][row] = True
                rendered.get(int(index), []).clear()
                obs = _zero_observation(env.observation_space)
            observations.append(self._observation(index, obs))
        frames = [np.stack(rendered[int(i)]) if rendered[int(i)] else np.zeros((0, 0, 0, 3), np.uint8)
                  for i in render_indices]  # a lost episode's: none (the pool drops them)
        return ChunkResult(obs=stack_observations(observations), frames=frames, **result)

    @staticmethod
    def _outcome(env: gym.Env, outcome: tuple, row: int, result: dict[str, Any]) -> Any:
        """A chunked environment's outcome (:meth:`ChunkedSteps.receive_outcome`) into row ``row``
        of ``result``; returns its observation."""
        obs, reward, terminated, truncated, info, steps = outcome
        result["reward"][row], result["terminated"][row], result["truncated"][row] = reward, terminated, truncated
        result["success"][row], result["steps"][row] = _success(env, info), steps
        return obs

    @staticmethod
    def _step_env(env: gym.Env, actions: np.ndarray, row: int, result: dict[str, Any], frames: list | None) -> Any:
        """Execute one environment's chunk into row ``row`` of ``result`` (appending rendered
        frames to ``frames``); returns the observation after its last executed step. The actions
        are clipped to the environment's action bounds first
        (:func:`~vla_rl_core.env_spec.executed_actions`; the built-in simulators clip to [-1, 1]
        too). A chunked environment (:class:`ChunkedSteps`, a remote one) gets them as they are:
        its far side clips.

        Raises:
            ValueError: an action is not finite.
        """
        lazy = isinstance(env, UnobservedSteps)  # renders its cameras only for the chunk's last observation
        for action in executed_actions(actions, env.action_space.low, env.action_space.high):
            if lazy:
                reward, terminated, truncated, info = env.step_unobserved(action)
            else:
                obs, reward, terminated, truncated, info = env.step(action)
            if frames is not None:
                frames.append(env.render_frame())
            result["reward"][row] += reward
            result["terminated"][row] = terminated
            result["truncated"][row] = truncated
            result["success"][row] |= _success(env, info)
            result["steps"][row] += 1
            if terminated or truncated:
                break
        return env.observe() if lazy else obs

    def run_expert(self, init_state_ids: Sequence[int], task_id: int = 0) -> list[dict[str, Any]]:
        """Run the scripted expert of task ``task_id`` for one episode per initial state, on env 0.

        Ends whatever episode env 0 was running. Episodes stop at success or at the horizon.

        Args:
            init_state_ids: initial-state ids (reset seeds).
            task_id: the task of a task set (0 for a single task).

        Returns:
            One dict per id, in order: ``{"obs": float32 (T, obs_dim)`` (the observation before
            each action; camera observations, or a task set's: a dict of ``T``-row arrays),
            ``"actions": float32 (T, action_dim), "success": bool, "init_state_id": int}``. The
            expert reads the state.

        Raises:
            NoExpertError: if no scripted expert is registered for the task.
            ValueError: ``task_id`` is not a task of this worker.
        """
        if not 0 <= task_id < len(self._configs):
            raise ValueError(f"task id {task_id} is outside this worker's {len(self._configs)} task(s)")
        env = self._env(0, task_id)
        expert = make_expert(self._env_name, self._configs[task_id].task_name, env.obs_layout)
        episodes = []
        for init_state_id in init_state_ids:
            obs, _ = env.reset(seed=int(init_state_id))
            expert.reset()
            observations, actions = [], []
            done, success = False, False
            while not done:
                action = expert.act(obs[keys.OBS_STATE] if isinstance(obs, dict) else obs)
                observations.append(self._observation(0, obs))
                actions.append(action)
                obs, _, terminated, truncated, info = env.step(action)
                done, success = terminated or truncated, _success(env, info)
            episodes.append(
                {
                    "obs": stack_observations(observations),
                    "actions": np.stack(actions).astype(np.float32, copy=False),
                    "success": bool(success),
                    "init_state_id": int(init_state_id),
                }
            )
        return episodes

    def close(self) -> None:
        """Close the environments created so far."""
        for env in [*self._envs, *(env for _, env in self._parked.values())]:
            if env is not None:
                env.close()
        self._envs = [None] * len(self._envs)
        self._parked.clear()

    def _observation(self, index: int, raw: Any) -> Any:
        """Environment ``index``'s observation with its instruction added (dict observations) and,
        in a task set, its task id."""
        task = self._env_tasks[index] if self._multi_task else None
        return observation(raw, self._env(index).instruction, task)

    def _env(self, index: int, task: int | None = None) -> gym.Env:
        """Environment ``index`` (of ``task``; None: the task it has), created on first use; a slot
        that changes task parks its environment and takes a parked one of the new task if any."""
        current = self._envs[index]
        if task is None:
            task = self._env_tasks[index]
        if current is not None and self._env_tasks[index] == task:
            return current
        if current is not None:
            self._park(self._env_tasks[index], current)
        self._envs[index], self._env_tasks[index] = self._task_env(task), task
        return self._envs[index]

    def _task_env(self, task: int) -> gym.Env:
        """An environment of ``task`` for a slot: a parked one (it leaves the park), else a new one."""
        for key, (parked_task, env) in self._parked.items():
            if parked_task == task:
                del self._parked[key]
                return env
        return make_env(self._env_name, self._configs[task])

    def _any_env(self, task: int) -> gym.Env:
        """An environment of ``task`` to read its spaces: a slot's, a parked one, or a new one (parked)."""
        for env, env_task in zip(self._envs, self._env_tasks):
            if env is not None and env_task == task:
                return env
        env = self._task_env(task)
        self._park(task, env)
        return env

    def _park(self, task: int, env: gym.Env) -> None:
        self._parked[self._parked_serial] = (task, env)
        self._parked_serial += 1
        while len(self._parked) > max(len(self._envs), len(self._configs)):
            _, (_, oldest) = self._parked.popitem(last=False)
            oldest.close()


def _success(env: gym.Env, info: dict) -> bool:
    """Whether ``env``'s step ``info`` reports success (:func:`~vla_rl_core.env_spec.info_success`).

    Raises:
        ComponentConfigError: ``simulator.name``: it reports none, naming the environment's class.
    """
    try:
        return info_success(info)
    except ValueError as err:
        raise ComponentConfigError("simulator.name", f"environment {type(env).__name__}: {err}") from None


def _zero_observation(space: gym.Space) -> Any:
    """An observation of ``space`` (a ``Box``, or a ``Dict`` of them) that is all zeros: a lost
    episode's row."""
    if isinstance(space, gym.spaces.Dict):
        return {key: np.zeros(sub.shape, dtype=sub.dtype) for key, sub in space.spaces.items()}
    return np.zeros(space.shape, dtype=space.dtype)
