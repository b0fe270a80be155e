"""The evaluation of a robot policy in simulators (:class:`EmbodiedEvaluation`).

Items are held-out initial states ``eval.init_state_offset + i`` (``i < eval.num_episodes``, never
trained on), the same for every target and protocol (paired comparisons); DP shard ``k`` of ``d``
owns ``i ≡ k (mod d)``. Targets are ``eval.checkpoints`` (``vla-rl eval``), or the live policy of
a training run when that list is empty. Tasks are ``eval.benchmark``'s, or the run's own (its
simulator's task, or each task of its task set). A task of the run's own runs in the worker's own
simulator pool (a task set's: reset into that task); another task gets a pool of its own.

Noise: every target, the live policy of a training run included, samples with a generator seeded
from (run seed, task, protocol, first initial state) (:func:`~vla_rl.evaluation.session.evaluation_generator`):
the same noise for every checkpoint and step (common random numbers), and none drawn from the
training's random streams, so evaluating (or not, or more often) never changes the training, and a
resumed run trains and evaluates as an uninterrupted one.

With ``eval.store_episodes`` every episode is appended to this rank's zarr store of its task
(``<run_dir>/episodes/<task>/rank<r>.zarr``, committed one by one, with the actions the simulator
received and the worker's machine); a restarted evaluation reads every rank's stores and does not
redo an episode, and the videos replay stored episodes (their simulator actions: no policy in the
loop).
Without stores, rank 0 records the live policy's greedy episodes to ``videos/<tag>.mp4``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from ray.experimental import tqdm_ray
from tensordict import TensorDict

from simulators.registry import SETTINGS_FORMAT, canonical_env
from vla_rl.checkpoints import files as ckpt
from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.errors import RunStopped
from vla_rl.evaluation.benchmarks import (
    EvalTask,
    resolve_tasks,
    run_task_index,
    use_run_tasks,
)
from vla_rl.evaluation.compatibility import incompatibility, one_hot_tasks, trained_on
from vla_rl.evaluation.episode_store import (
    STORE_PATTERN,
    EpisodeKey,
    append_episodes,
    check_task_settings,
    open_rank_store,
    reading_store,
    stored_keys,
    task_dir,
)
from vla_rl.evaluation.protocol import ProtocolPolicy
from vla_rl.evaluation.replay import episode_env_actions, replay_episodes
from vla_rl.evaluation.session import EvaluationSession, evaluation_generator
from vla_rl.evaluation.video import record_video, renders_videos, video_camera, video_fps
from vla_rl.rollout.embodied import rollout_episodes
from vla_rl.trainers.strategy import autocast, cast_for_rollouts
from vla_rl.utils.console import worker_bars
from vla_rl.utils.host import host_record
from vla_rl.utils.video import write_mp4
from vla_rl_core import keys
from vla_rl_core.run_layout import VIDEOS_DIR


def checkpoint_step(path: Path) -> int:
    """The training step of a checkpoint directory (its ``trainer_state.json``).

    Raises:
        RunStopped: ``path`` is not a complete checkpoint (:func:`removed_checkpoint`).
    """
    try:
        return int(ckpt.load_trainer_state(path)["step"])
    except FileNotFoundError as err:
        raise removed_checkpoint(path, err) from None


def load_checkpoint_weights(path: Path, policy, task: str) -> None:
    """Load checkpoint ``path``'s policy weights into ``policy`` (evaluated on task ``task``).

    Raises:
        RunStopped: a file of the checkpoint is gone (:func:`removed_checkpoint`).
        ValueError: its weights do not fit ``policy``.
    """
    try:
        ckpt.load_policy_weights(path, policy)
    except FileNotFoundError as err:
        raise removed_checkpoint(path, err) from None
    except RuntimeError as err:
        raise ValueError(f"checkpoint {path} does not fit the run's policy for task {task!r}: {err}") from err


def removed_checkpoint(path: Path, error: FileNotFoundError) -> RunStopped:
    """The one-line stop of an evaluation whose checkpoint was removed while it ran: ``vla-rl eval``
    holds its checkpoints against their run's pruning (:func:`vla_rl.eval_driver.hold_checkpoints`),
    which keeps nothing on a file system without ``flock``, or against a hand's ``rm``."""
    return RunStopped(f"checkpoint {path} was removed while the evaluation ran ({error}); the episodes stored so "
                      "far are kept: evaluate the checkpoints left, into another --output if this evaluation stored "
                      "episodes")


class EmbodiedEvaluation(EvaluationSession):
    """One worker's evaluation of a robot policy (see the module docstring).

    Args:
        res: the worker's resources; its ``run_dir`` is the evaluation directory for ``vla-rl
            eval``, and its policy is built for the run's simulator.

    The policy acts in each task as prepared for it (:meth:`policies.base.Policy.use_tasks`, e.g.
    the dataset statistics of a LIBERO task's suite), and for the run's own tasks again after it.

    Raises:
        ValueError: ``eval.checkpoints`` holds two checkpoints of the same step, stored episodes
            of a task were written with other settings, or the policy cannot act in a task
            (``use_tasks``: e.g. no statistics of a LIBERO suite).
        RunStopped: a checkpoint is gone (:func:`removed_checkpoint`).
    """

    def __init__(self, res) -> None:
        cfg = res.config
        checkpoints = [Path(p) for p in cfg.eval.checkpoints]
        steps = [checkpoint_step(p) for p in checkpoints]
        if len(set(steps)) != len(steps):
            raise ValueError(f"eval.checkpoints holds several checkpoints of one step: {steps}")
        self.tasks: list[EvalTask] = resolve_tasks(cfg)
        for task in self.tasks:  # refuse a task the policy cannot act in before any rollout
            res.policy.use_tasks(task.simulator, [task.env_config()])
        use_run_tasks(res.policy, cfg)
        super().__init__(res, [t.name for t in self.tasks], steps or [None], keys.INIT_STATE_ID)
        self.checkpoints: list[Path | None] = checkpoints or [None]
        self.init_state_ids = cfg.eval.init_state_offset + np.arange(cfg.eval.num_episodes, dtype=np.int64)
        self.eval_dir = Path(res.run_dir)
        if cfg.eval.store_episodes:
            for task in self.tasks:
                check_task_settings(self.eval_dir, task.name, task.simulator, task.env)
        self._pool = None
        self._pool_task: int | None = None
        self._pool_task_id: int | None = None  # the task's id in the worker's own task-set pool
        self._owns_pool = False
        self._video_pool = None  # rank 0's live-video environments, kept from one evaluation to the next
        self._loaded: int | None = None
        self._stores: dict[str, TrajectoryStore] = {}
        self._host: dict | None = None  # this worker's machine, recorded with each stored episode
        self._bar = None

    def begin(self, tag: str, step: int) -> None:
        if tag != self.tag and self.res.rank == 0 and worker_bars():
            self._bar = tqdm_ray.tqdm(total=self.remaining_in_all(), desc=f"held-out evaluation {tag} (rank 0)",
                                      unit="episode")
        super().begin(tag, step)

    def remaining_in_all(self) -> int:
        """Episodes of rank 0's shard in the whole evaluation."""
        return len(self.shard_items(0, self.res.world_size)) * len(self.tasks) * len(self.checkpoints) * len(
            self.protocols)

    def previously_done(self, task: str) -> set[EpisodeKey]:
        return stored_keys(self.eval_dir, task) if self.config.eval.store_episodes else set()

    def shard_items(self, dp_rank: int, dp_size: int) -> np.ndarray:
        return self.init_state_ids[dp_rank::dp_size]

    # --------------------------------------------------------------------- rollouts
    def pool(self, task: int):
        """The simulator pool of task ``task``: the worker's own pool for one of the run's own
        tasks, else a pool of its own (the previous task's is closed first)."""
        if self._pool_task == task:
            return self._pool
        self._close_task_pool()
        spec, sim = self.tasks[task], self.config.simulator
        own = run_task_index(self.config, spec)
        self._owns_pool = own is None
        self._pool_task_id = own if sim.multi_task else None
        if not self._owns_pool:
            pool = self.res.simulator_pool
        else:
            from simulators.pool import SimulatorPool

            per_worker = max(1, math.ceil(self.config.eval.num_episodes / self.res.world_size))
            pool = SimulatorPool(spec.simulator, spec.env, num_actors=sim.actors_per_worker,
                                 envs_per_actor=math.ceil(per_worker / sim.actors_per_worker),
                                 actor_options={"num_cpus": sim.num_cpus_per_actor},
                                 step_timeout_s=sim.step_timeout_s, progress=self.res.rank == 0 and worker_bars())
        self._pool, self._pool_task = pool, task
        return pool

    def policy(self, task: int, target: int):
        """The policy of target ``target`` (a checkpoint's weights are loaded into the worker's
        policy), checked against task ``task``, in the dtype the run's rollouts had: under FSDP's
        mixed precision bfloat16 parameters (a training run's policy already has them; ``vla-rl
        eval`` takes the run's ``trainer.strategy`` and ``mixed_precision``), its own otherwise.

        Raises:
            ValueError: the task's observation layout or action size differs from the policy's,
                or the policy is conditioned on a task set without this task (the message names
                the task, the checkpoint and why: :func:`~vla_rl.evaluation.compatibility.incompatibility`),
                or a checkpoint's weights do not fit the run's policy.
            RunStopped: the checkpoint was removed (:func:`removed_checkpoint`).
        """
        res, path, spec = self.res, self.checkpoints[target], self.tasks[task]
        own = run_task_index(self.config, spec) is not None
        reason = incompatibility(spec, None if own else self.pool(task).spec(), res.env_spec,
                                 trained_on(self.config), one_hot_tasks(self.config), own)
        if reason is not None:
            what = "the policy" if path is None else f"checkpoint {path}"
            raise ValueError(f"task {spec.name!r} cannot be evaluated with {what}: {reason}; evaluate it on tasks "
                             "with its observation and action layout")
        if path is not None and self._loaded != target:
            load_checkpoint_weights(path, res.policy, spec.name)
            self._loaded = target
        cast_for_rollouts(res.policy, self.config.trainer, res.device)  # FSDP mixed precision: bfloat16
        return res.policy.eval()

    def rollout(self, batch: TensorDict) -> tuple[TensorDict, int]:
        t, c, p = self.group_of(batch)
        policy, pool = self.policy(t, c), self.pool(t)
        ids = batch[keys.INIT_STATE_ID].numpy()
        generator = evaluation_generator(self.config.run.seed, t, p, int(ids[0]))
        task_ids = None if self._pool_task_id is None else np.full(len(ids), self._pool_task_id, dtype=np.int64)
        spec, protocol = self.tasks[t], self.protocols[p]
        policy.use_tasks(spec.simulator, [spec.env_config()])
        try:
            with autocast(self.config.trainer, self.res.device):  # the policy computes as in training
                result = rollout_episodes(ProtocolPolicy(policy, protocol), pool, ids, task_ids=task_ids,
                                          greedy=protocol.greedy, generator=generator,
                                          pipeline_stages=self.config.simulator.pipeline_stages)
        finally:  # a training run's live policy goes on acting in its own tasks
            use_run_tasks(policy, self.config)
        episodes = result.batch
        episodes.set(keys.ENV_ACTIONS, result.env_actions)  # what the simulator received: the stores keep it
        # Episodes lost to a simulator fault are not done: the next step rolls them out again.
        episodes.update(batch[torch.as_tensor(~result.lost)].exclude(keys.INIT_STATE_ID))
        if self._bar is not None:
            self._bar.update(len(ids))
        return episodes, result.env_steps

    def store(self, task: int, target: int, protocol: int, episodes: TensorDict) -> None:
        if not self.config.eval.store_episodes:
            return
        spec, p = self.tasks[task], self.protocols[protocol]
        if spec.name not in self._stores:
            attrs = {"task": spec.name, "simulator": spec.simulator, "env": canonical_env(spec.simulator, spec.env),
                     "settings_format": SETTINGS_FORMAT}
            self._stores[spec.name] = open_rank_store(self.eval_dir, spec.name, self.res.rank, self.pool(task).spec(),
                                                      self.res.policy.chunk_size, attrs,
                                                      self.res.policy.has_action_distribution,
                                                      self.res.policy.own_action_dim)
        if self._host is None:
            self._host = host_record(self.res.device)
        append_episodes(self._stores[spec.name], episodes, self.step_of(target), p.greedy, p.temperature, self._host)

    # --------------------------------------------------------------------- videos
    def finish(self, video: bool) -> dict[str, float]:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.res.rank != 0 or self.config.eval.video_episodes == 0:
            return {}
        if self.config.eval.store_episodes:
            self.write_videos()
            return {}
        if video and self.checkpoints == [None] and renders_videos(self.config.simulator.name):
            return self._record_live_video()
        return {}

    def _record_live_video(self) -> dict[str, float]:
        """Greedy episodes of the live policy on the first evaluation states, to ``videos/<tag>.mp4``,
        in rendering environments of their own: created at the first evaluation and kept for the
        next ones (creating them took 6.6-7.1 s of each evaluation on the 2-core machine), closed
        with the session or when a video fails (a fault leaves them in an unknown state)."""
        from simulators.pool import SimulatorPool

        ev, sim = self.config.eval, self.config.simulator
        render = {"render_camera": video_camera(self.config, sim.name), "render_size": ev.video_size}
        envs = [{**env, **render} for env in sim.task_envs()]
        if self._video_pool is None:
            self._video_pool = SimulatorPool(sim.name, envs if sim.multi_task else envs[0], num_actors=1,
                                             envs_per_actor=ev.video_episodes, actor_options={"num_cpus": 0},
                                             step_timeout_s=sim.step_timeout_s, progress=False)  # a few: no bar
        ids = ev.init_state_offset + np.arange(ev.video_episodes, dtype=np.int64)
        # a task set's video: episode i in task i mod the number of tasks
        task_ids = np.arange(ev.video_episodes, dtype=np.int64) % len(envs) if sim.multi_task else None
        path, fps = self.eval_dir / VIDEOS_DIR / f"{self.tag}.mp4", video_fps(self.config, sim.name, envs[0])
        generator = evaluation_generator(self.config.run.seed, 0, 0, int(ids[0]))
        try:
            with autocast(self.config.trainer, self.res.device):
                out = record_video(self.res.policy, self._video_pool, ids, path, fps, generator, task_ids=task_ids)
        except BaseException:
            self._close_video_pool()
            raise
        return {f"video/{self.tag}_successes": float(out["video_successes"])}

    def _close_video_pool(self) -> None:
        if self._video_pool is not None:
            self._video_pool.close()
            self._video_pool = None

    def write_videos(self) -> int:
        """Replay and render up to ``eval.video_episodes`` successes and as many failures per task
        and protocol of the last checkpoint, from every rank's stores, to
        ``videos/<task>/step<step>_<protocol>_<success|failure>_<init_state_id>.mp4``.

        A replay executes the episode's stored simulator actions (``env_actions``; a store
        written before that field: its ``actions`` when the policy acts in the simulator's units).
        Each video's stored and replayed success go to ``videos/replays.json`` (they agree when
        the simulator is deterministic).

        Returns:
            The number of replays whose success differs from the stored one.

        Raises:
            ValueError: a picked episode's store has no ``env_actions`` and the policy's actions
                are not the simulator's (:func:`~vla_rl.evaluation.replay.episode_env_actions`).
        """
        ev, step = self.config.eval, max(self.step_of(c) for c in range(len(self.checkpoints)))
        mismatches, replays = 0, []
        for task in self.tasks:
            if not renders_videos(task.simulator):  # a remote environment's
                continue
            picked = self._video_episodes(task, step, ev.video_episodes)
            if not picked:
                continue
            from simulators.pool import SimulatorPool

            env = {**task.env, "render_camera": video_camera(self.config, task.simulator), "render_size": ev.video_size}
            pool = SimulatorPool(task.simulator, env, num_actors=1, envs_per_actor=1, actor_options={"num_cpus": 0},
                                 step_timeout_s=self.config.simulator.step_timeout_s, progress=False)
            try:  # one environment, one episode after the other: rendering dominates anyway
                replayed = [replay_episodes(pool, np.array([int(e["init_state_id"])]), [actions], render=True)
                            for _, e, actions in picked]
            finally:
                pool.close()
            for (label, episode, _), (success, frames) in zip(picked, replayed):
                outcome = "success" if episode["success"] else "failure"
                success, frames = bool(success[0]), frames[0]
                mismatches += int(success != bool(episode["success"]))
                name = f"step{step}_{label.replace('@', '_t')}_{outcome}_{int(episode['init_state_id'])}.mp4"
                write_mp4(self.eval_dir / VIDEOS_DIR / task.name / name, frames,
                          video_fps(self.config, task.simulator, task.env))
                replays.append({"task": task.name, "file": f"{VIDEOS_DIR}/{task.name}/{name}", "protocol": label,
                                "stored_success": bool(episode["success"]), "replayed_success": success})
        tmp = self.eval_dir / VIDEOS_DIR / "replays.json.tmp"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(replays, indent=1))
        tmp.replace(tmp.with_suffix(""))
        return mismatches

    def _video_episodes(self, task: EvalTask, step: int, count: int) -> list[tuple[str, dict, np.ndarray]]:
        """(protocol label, episode, its simulator actions ``(finish_step, chunk, action_dim)``)
        triples: the first ``count`` successes and failures by initial state, per protocol, of
        checkpoint ``step``.

        Raises:
            ValueError: from :func:`~vla_rl.evaluation.replay.episode_env_actions`.
        """
        wanted = set(self.init_state_ids.tolist())
        candidates = []  # (protocol index, failed, init_state_id, store, episode index)
        for path in sorted(task_dir(self.eval_dir, task.name).glob(STORE_PATTERN)):
            with reading_store(path):
                store = TrajectoryStore.open(path, read_only=True)
                data = store.read_scalars() if len(store) else {}
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
                for *_, store, i in chosen:
                    with reading_store(store.path):
                        episode = store.read_episode(i)
                    actions = episode_env_actions(store, episode, self.res.policy.actions_are_env_actions)
                    picked.append((protocol.label, episode, actions))
        return picked

    def close(self) -> None:
        """Close the pool of the current task (if it is not the worker's own) and the live video's."""
        self._close_task_pool()
        self._close_video_pool()

    def _close_task_pool(self) -> None:
        if self._owns_pool:
            self._pool.close()
        self._owns_pool = False
        self._pool, self._pool_task, self._pool_task_id = None, None, None
