"""A DAG worker's evaluation state: the tasks, protocols and checkpoints to evaluate, which of its
episodes are already stored, its simulator pool for the current task and its episode stores.

Work order: task, then checkpoint, then protocol; the initial states ``eval.init_state_offset + i``
(``i < eval.num_episodes``) are the same for every checkpoint and protocol (paired comparisons),
and DP shard ``k`` of ``d`` owns ``i ≡ k (mod d)``. One step handles one (task, checkpoint,
protocol) group of the shard: all of its episodes still missing from the stores. On a restart
the stores (every rank's, read from disk) say which episodes exist, so none is redone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict

from vla_rl.data import keys
from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.evaluation.benchmarks import EvalTask, resolve_tasks
from vla_rl.evaluation.episode_store import (
    EpisodeKey,
    append_episodes,
    check_task_settings,
    open_rank_store,
    stored_keys,
    task_dir,
)
from vla_rl.evaluation.protocol import ProtocolPolicy, eval_protocols
from vla_rl.evaluation.replay import replay_episodes
from vla_rl.rollout.embodied import rollout_episodes
from vla_rl.trainers import checkpoint as ckpt
from vla_rl.utils.video import write_mp4

VIDEOS_DIR = "videos"


def checkpoint_step(path: Path) -> int:
    """The training step of a checkpoint directory (its ``trainer_state.json``).

    Raises:
        FileNotFoundError: ``path`` is not a complete checkpoint.
    """
    return int(ckpt.load_trainer_state(path)["step"])


def check_task_fits(task: EvalTask, task_spec: dict, checkpoint: Path, trained_spec: dict, trained_on: str) -> None:
    """Check that a task's observations and actions have the sizes the checkpoint's policy takes.

    Args:
        task_spec, trained_spec: ``obs_dim`` and ``act_dim`` of the task's simulator and of the
            simulator the checkpoint was trained on (``trained_on``).

    Raises:
        ValueError: naming the task, the checkpoint and both sizes.
    """
    for dim in ("obs_dim", "act_dim"):
        if trained_spec[dim] != task_spec[dim]:
            raise ValueError(
                f"task {task.name!r} ({task.simulator}) has {dim} {task_spec[dim]}, but checkpoint {checkpoint} "
                f"takes {dim} {trained_spec[dim]} (trained on {trained_on}); evaluate it on tasks with its "
                "observation and action layout")


class EvaluationSession:
    """One worker's evaluation (built by ``WorkerResources.evaluation`` on first use).

    Args:
        resources: the worker's :class:`~vla_rl.workers.resources.WorkerResources`; its
            ``run_dir`` is the evaluation directory and its policy is built for the run's simulator.

    Raises:
        ValueError: ``eval.checkpoints`` is empty or holds two checkpoints of the same step.
        FileNotFoundError: a checkpoint is incomplete.
    """

    def __init__(self, resources) -> None:
        cfg = resources.config
        self.resources = resources
        self.config = cfg
        self.eval_dir = Path(resources.run_dir)
        self.tasks: list[EvalTask] = resolve_tasks(cfg)
        self.protocols = eval_protocols(cfg.eval)
        self.checkpoints = [Path(p) for p in cfg.eval.checkpoints]
        if not self.checkpoints:
            raise ValueError("eval.checkpoints is empty: `vla-rl eval RUN_DIR` fills it with the run's checkpoints")
        self.steps = [checkpoint_step(p) for p in self.checkpoints]
        if len(set(self.steps)) != len(self.steps):
            raise ValueError(f"eval.checkpoints holds several checkpoints of one step: {self.steps}")
        self.init_state_ids = cfg.eval.init_state_offset + np.arange(cfg.eval.num_episodes, dtype=np.int64)
        for task in self.tasks:
            check_task_settings(self.eval_dir, task.name, task.simulator, task.env)
        self.done: dict[str, set[EpisodeKey]] = {t.name: stored_keys(self.eval_dir, t.name) for t in self.tasks}
        self.shard = (0, 1)  # (dp_rank, dp_size) of the data node, set by next_batch
        self._pool = None
        self._pool_task: int | None = None
        self._owns_pool = False
        self._loaded: int | None = None
        self._stores: dict[str, TrajectoryStore] = {}

    # --------------------------------------------------------------------- which episodes
    def key(self, task: int, checkpoint: int, protocol: int, init_state_id: int) -> EpisodeKey:
        p = self.protocols[protocol]
        return EpisodeKey(self.steps[checkpoint], p.greedy, p.temperature, int(init_state_id))

    def _groups(self):
        dp_rank, dp_size = self.shard
        mine = self.init_state_ids[dp_rank::dp_size]
        for t, task in enumerate(self.tasks):
            for c in range(len(self.checkpoints)):
                for p in range(len(self.protocols)):
                    ids = [i for i in mine if self.key(t, c, p, i) not in self.done[task.name]]
                    if ids:
                        yield t, c, p, np.asarray(ids, dtype=np.int64)

    def next_batch(self, dp_rank: int, dp_size: int) -> TensorDict:
        """The shard's first (task, checkpoint, protocol) group with episodes not yet stored.

        Returns:
            ``init_state_id``, ``task_id``, ``checkpoint_index``, ``protocol_index``, each
            ``(k,)`` int64 (``k = 0`` when the shard is complete).
        """
        self.shard = (dp_rank, dp_size)
        t, c, p, ids = next(self._groups(), (0, 0, 0, np.zeros(0, dtype=np.int64)))
        return TensorDict({
            keys.INIT_STATE_ID: torch.as_tensor(ids),
            keys.TASK_ID: torch.full((len(ids),), t, dtype=torch.int64),
            keys.CHECKPOINT_INDEX: torch.full((len(ids),), c, dtype=torch.int64),
            keys.PROTOCOL_INDEX: torch.full((len(ids),), p, dtype=torch.int64),
        }, batch_size=[len(ids)])

    def remaining(self) -> int:
        """Episodes of the shard not yet stored."""
        return sum(len(ids) for *_, ids in self._groups())

    # --------------------------------------------------------------------- rollouts
    def pool(self, task: int):
        """The simulator pool of task ``task``: the worker's own pool for the run's simulator,
        else a pool of its own (the previous task's is closed first)."""
        if self._pool_task == task:
            return self._pool
        self._close_task_pool()
        spec, sim = self.tasks[task], self.config.simulator
        self._owns_pool = not (spec.simulator == sim.name and spec.env == sim.env)
        if not self._owns_pool:
            pool = self.resources.simulator_pool
        else:
            from simulators.pool import SimulatorPool

            per_worker = max(1, math.ceil(self.config.eval.num_episodes / self.resources.world_size))
            pool = SimulatorPool(spec.simulator, spec.env, num_actors=sim.actors_per_worker,
                                 envs_per_actor=math.ceil(per_worker / sim.actors_per_worker),
                                 actor_options={"num_cpus": sim.num_cpus_per_actor},
                                 step_timeout_s=sim.step_timeout_s)
        self._pool, self._pool_task = pool, task
        return pool

    def policy(self, task: int, checkpoint: int):
        """The worker's policy with checkpoint ``checkpoint``'s weights, checked against task ``task``.

        Raises:
            ValueError: the task's observation or action size differs from the checkpoint's (the
                message names the task and the checkpoint), or the checkpoint's weights do not fit
                the run's policy.
        """
        res, path, spec = self.resources, self.checkpoints[checkpoint], self.tasks[task]
        check_task_fits(spec, self.pool(task).spec(), path, res.env_spec, self.config.simulator.name)
        if self._loaded != checkpoint:
            try:
                ckpt.load_model(path, res.policy)
            except RuntimeError as err:
                raise ValueError(f"checkpoint {path} does not fit the run's policy for task {spec.name!r}: "
                                 f"{err}") from err
            self._loaded = checkpoint
        return res.policy.eval()

    def rollout(self, batch: TensorDict) -> tuple[TensorDict, int]:
        """Roll out the group of ``batch`` (from :meth:`next_batch`, ``k > 0``) under its protocol.

        Returns:
            ``(episodes, env_steps)``: the rollout keys (``truncated`` included) and the batch's
            keys, without the episodes lost to a simulator fault (they stay missing from the stores).
        """
        t, c, p = (int(batch[k][0]) for k in (keys.TASK_ID, keys.CHECKPOINT_INDEX, keys.PROTOCOL_INDEX))
        policy, pool = self.policy(t, c), self.pool(t)
        ids = batch[keys.INIT_STATE_ID].numpy()
        # the same noise for every checkpoint (common random numbers: paired comparisons)
        seed = np.random.SeedSequence([self.config.run.seed, t, p, int(ids[0])]).generate_state(1)[0]
        result = rollout_episodes(ProtocolPolicy(policy, self.protocols[p]), pool, ids,
                                  generator=torch.Generator().manual_seed(int(seed)),
                                  pipeline_stages=self.config.simulator.pipeline_stages)
        episodes = result.batch
        # Episodes lost to a simulator fault are not stored: the next step rolls them out again.
        episodes.update(batch[torch.as_tensor(~result.lost)].exclude(keys.INIT_STATE_ID))
        return episodes, result.env_steps

    def record(self, episodes: TensorDict) -> int:
        """Append the episodes to this rank's store of their task; returns their successes."""
        if len(episodes) == 0:
            return 0
        t, c, p = (int(episodes[k][0]) for k in (keys.TASK_ID, keys.CHECKPOINT_INDEX, keys.PROTOCOL_INDEX))
        task, protocol = self.tasks[t], self.protocols[p]
        if task.name not in self._stores:
            attrs = {"task": task.name, "simulator": task.simulator, "env": task.env}
            self._stores[task.name] = open_rank_store(self.eval_dir, task.name, self.resources.rank,
                                                      self.pool(t).spec(), self.resources.policy.chunk_size, attrs)
        added = append_episodes(self._stores[task.name], episodes, self.steps[c], protocol.greedy, protocol.temperature)
        self.done[task.name].update(added)
        return int(episodes[keys.SUCCESS].sum())

    # --------------------------------------------------------------------- videos
    def write_videos(self) -> int:
        """Replay and render up to ``eval.video_episodes`` successes and as many failures per task
        and protocol of the last checkpoint, from every rank's stores, to
        ``videos/<task>/step<step>_<protocol>_<success|failure>_<init_state_id>.mp4``.

        Each video's stored and replayed success go to ``videos/replays.json`` (they agree when
        the simulator is deterministic).

        Returns:
            The number of replays whose success differs from the stored one.
        """
        ev, step = self.config.eval, max(self.steps)
        mismatches, replays = 0, []
        for task in self.tasks:
            picked = self._video_episodes(task, step, ev.video_episodes)
            if not picked:
                continue
            from simulators.pool import SimulatorPool

            env = {**task.env, "render_camera": ev.video_camera, "render_size": ev.video_size}
            pool = SimulatorPool(task.simulator, env, num_actors=1, envs_per_actor=1, actor_options={"num_cpus": 0},
                                 step_timeout_s=self.config.simulator.step_timeout_s)
            try:  # one environment, one episode after the other: rendering dominates anyway
                replayed = [replay_episodes(pool, np.array([int(e["init_state_id"])]), [e["actions"]], render=True)
                            for _, e in picked]
            finally:
                pool.close()
            for (label, episode), (success, frames) in zip(picked, replayed):
                outcome = "success" if episode["success"] else "failure"
                success, frames = bool(success[0]), frames[0]
                mismatches += int(success != bool(episode["success"]))
                name = f"step{step}_{label.replace('@', '_t')}_{outcome}_{int(episode['init_state_id'])}.mp4"
                write_mp4(self.eval_dir / VIDEOS_DIR / task.name / name, frames, ev.video_fps)
                replays.append({"task": task.name, "file": f"{VIDEOS_DIR}/{task.name}/{name}", "protocol": label,
                                "stored_success": bool(episode["success"]), "replayed_success": success})
        tmp = self.eval_dir / VIDEOS_DIR / "replays.json.tmp"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(replays, indent=1))
        tmp.replace(tmp.with_suffix(""))
        return mismatches

    def _video_episodes(self, task: EvalTask, step: int, count: int) -> list[tuple[str, dict]]:
        """(protocol label, episode) pairs: the first ``count`` successes and failures by
        initial state, per protocol, of checkpoint ``step``."""
        wanted = set(self.init_state_ids.tolist())
        candidates = []  # (protocol index, failed, init_state_id, store, episode index)
        for path in sorted(task_dir(self.eval_dir, task.name).glob("rank*.zarr")):
            store = TrajectoryStore.open(path, read_only=True)
            data = store.read_all() if len(store) else {}
            for i in range(len(store)):
                if int(data["checkpoint_step"][i]) != step or int(data["init_state_id"][i]) not in wanted:
                    continue
                candidates += [(p, not bool(data["success"][i]), int(data["init_state_id"][i]), store, i)
                               for p, protocol in enumerate(self.protocols)
                               if bool(data["greedy"][i]) == protocol.greedy
                               and float(data["temperature"][i]) == protocol.temperature]
        picked = []
        for p, protocol in enumerate(self.protocols):
            for failed in (False, True):
                chosen = sorted((c for c in candidates if c[:2] == (p, failed)), key=lambda c: c[2])[:count]
                picked += [(protocol.label, store.read_episode(i)) for *_, store, i in chosen]
        return picked

    def close(self) -> None:
        """Close the pool of the current task (if it is not the worker's own)."""
        self._close_task_pool()

    def _close_task_pool(self) -> None:
        if self._owns_pool:
            self._pool.close()
        self._owns_pool = False
        self._pool, self._pool_task = None, None
