"""A DAG worker's evaluation state, shared by every evaluation the engine runs: the held-out
evaluations of a training run (before, during and after training, on the live policy) and
``vla-rl eval`` (checkpoints of a run, episodes stored in zarr). One path, one set of nodes
(:mod:`vla_rl.nodes.evaluation`), one session per workflow:
:class:`~vla_rl.evaluation.embodied.EmbodiedEvaluation` and
:class:`~vla_rl.evaluation.text.TextEvaluation`.

An evaluation is a set of **groups** — (task, target, protocol), where a target is a checkpoint
or the live policy — each over the same held-out items (initial-state ids, or test prompts).
Work order: task, then target, then protocol. One step of the ``evaluate`` phase handles one
group of the worker's shard: all of its items not yet done. The evaluator node sums the per-group
counts over the workers each step; once no worker has items left, :meth:`EvaluationSession.metrics`
gives the figures (Wilson 95% intervals), identical on every worker.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch
from tensordict import TensorDict

from vla_rl.errors import RunStopped
from vla_rl.evaluation.episode_store import EpisodeKey
from vla_rl.evaluation.protocol import Protocol, eval_protocols
from vla_rl.utils.stats import wilson_interval
from vla_rl_core import keys

#: Columns of the per-group counts: successes, episodes, sum of episode lengths (decision steps).
SUCCESSES, EPISODES, LENGTH_SUM = range(3)
MAX_FRUITLESS_STEPS = 5
"""Evaluation steps in a row in which the workers lost episodes to simulator faults and finished
none, after which the evaluation stops (:meth:`EvaluationSession.add_counts`): each redid the lost
episodes, forever where the simulator never answered (130 passes over 2 episodes measured)."""


def evaluation_generator(run_seed: int, task: int, protocol: int, first_item: int) -> torch.Generator:
    """The random generator of one evaluation batch: a CPU generator (policies draw from any
    device's, :func:`policies.sampling.draw`) seeded from the run seed, the task, the protocol
    and the batch's first item (initial state, prompt row). Every target, every checkpoint and the
    live policy at every step, draws the same noise for the same items (common random numbers:
    paired comparisons); and an evaluation never draws from the training's random streams, so
    whether, when and how often a run evaluates does not change its training, and a resumed
    run trains as an uninterrupted one whatever its evaluations."""
    seed = np.random.SeedSequence([int(run_seed), int(task), int(protocol), int(first_item)]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(seed))


class EvaluationSession(ABC):
    """Bookkeeping of one worker's evaluation.

    Args:
        res: the worker's :class:`~vla_rl.workers.resources.Resources`.
        task_names: the tasks, by name (store paths, metric names).
        target_steps: per target, its training step (a checkpoint's), or None for the live
            policy (its step is the one :meth:`begin` is given).
        item_key: the batch key of an item id (``init_state_id``, or ``uid`` for prompt rows).
    """

    def __init__(self, res, task_names: list[str], target_steps: list[int | None], item_key: str) -> None:
        self.res = res
        self.config = res.config
        self.task_names = task_names
        self.target_steps = target_steps
        self.protocols: list[Protocol] = eval_protocols(res.config.eval)
        self.item_key = item_key
        self.tag: str | None = None
        self.live_step = 0
        self.done: dict[str, set[EpisodeKey]] = {}
        self.counts = np.zeros((len(task_names), len(target_steps), len(self.protocols), 3))
        self.lost_here = 0  # this worker's episodes lost to a simulator fault since the last record
        self.lost = 0  # every worker's, since the evaluation began (each redone: not in ``counts``)
        self.fruitless = 0  # steps in a row that lost episodes and finished none (all workers)
        self.shard = (0, 1)  # (dp_rank, dp_size) of the data node, set by next_batch

    # --------------------------------------------------------------------- which items
    def begin(self, tag: str, step: int) -> None:
        """Start evaluation ``tag`` (e.g. ``warm_start``, ``step_10``, ``final``; the live policy
        has made ``step`` updates); a no-op while ``tag`` is the current one."""
        if tag == self.tag:
            return
        self.tag, self.live_step = tag, step
        self.done = {name: self.previously_done(name) for name in self.task_names}
        self.counts[:] = 0.0
        self.lost_here = self.lost = self.fruitless = 0

    def previously_done(self, task: str) -> set[EpisodeKey]:
        """Items of ``task`` done before this session started (stored episodes); none by default."""
        return set()

    def step_of(self, target: int) -> int:
        """The training step of target ``target``."""
        step = self.target_steps[target]
        return self.live_step if step is None else step

    def key(self, target: int, protocol: int, item: int) -> EpisodeKey:
        p = self.protocols[protocol]
        return EpisodeKey(self.step_of(target), p.greedy, p.temperature, int(item))

    @abstractmethod
    def shard_items(self, dp_rank: int, dp_size: int) -> np.ndarray:
        """``(k,)`` int64: the item ids shard ``dp_rank`` of ``dp_size`` evaluates."""

    def _groups(self):
        dp_rank, dp_size = self.shard
        mine = self.shard_items(dp_rank, dp_size)
        for t, task in enumerate(self.task_names):
            for c in range(len(self.target_steps)):
                for p in range(len(self.protocols)):
                    items = [i for i in mine if self.key(c, p, i) not in self.done[task]]
                    if items:
                        yield t, c, p, np.asarray(items, dtype=np.int64)

    def next_batch(self, dp_rank: int, dp_size: int) -> TensorDict:
        """The shard's first (task, target, protocol) group with items not done yet.

        Returns:
            ``<item_key>``, ``task_id``, ``checkpoint_index`` (the target), ``protocol_index``,
            each ``(k,)`` int64 (``k = 0`` when the shard is complete).
        """
        self.shard = (dp_rank, dp_size)
        t, c, p, items = next(self._groups(), (0, 0, 0, np.zeros(0, dtype=np.int64)))
        return TensorDict({
            self.item_key: torch.as_tensor(items),
            keys.TASK_ID: torch.full((len(items),), t, dtype=torch.int64),
            keys.CHECKPOINT_INDEX: torch.full((len(items),), c, dtype=torch.int64),
            keys.PROTOCOL_INDEX: torch.full((len(items),), p, dtype=torch.int64),
        }, batch_size=[len(items)])

    def remaining(self) -> int:
        """Items of the shard not done yet."""
        return sum(len(items) for *_, items in self._groups())

    @staticmethod
    def group_of(batch: TensorDict) -> tuple[int, int, int]:
        """(task, target, protocol) of a non-empty batch from :meth:`next_batch`."""
        return tuple(int(batch[k][0]) for k in (keys.TASK_ID, keys.CHECKPOINT_INDEX, keys.PROTOCOL_INDEX))

    # --------------------------------------------------------------------- episodes
    @abstractmethod
    def rollout(self, batch: TensorDict) -> tuple[TensorDict, int]:
        """Run the group of ``batch`` (``k > 0``); returns the finished episodes (``success``,
        ``finish_step`` and the batch's keys; those lost to a simulator fault are left out and
        stay to do) and the environment steps executed."""

    def record(self, episodes: TensorDict) -> np.ndarray:
        """Mark ``episodes`` done (and store them, where the session stores); returns this
        worker's counts of them per group, ``(tasks, targets, protocols, 3)``."""
        local = np.zeros_like(self.counts)
        if len(episodes) == 0:
            return local
        t, c, p = self.group_of(episodes)
        self.store(t, c, p, episodes)
        self.done[self.task_names[t]].update(self.key(c, p, i) for i in episodes[self.item_key].tolist())
        local[t, c, p] = (float(episodes[keys.SUCCESS].sum()), float(len(episodes)),
                          float(episodes[keys.FINISH_STEP].sum()))
        return local

    def store(self, task: int, target: int, protocol: int, episodes: TensorDict) -> None:
        """Keep the episodes (the embodied evaluation's zarr stores); nothing by default."""

    def add_counts(self, totals: np.ndarray, lost: int = 0) -> None:
        """Add one step's counts and lost episodes, summed over the workers (the same on every
        worker: each stops alike).

        Raises:
            RunStopped: the last :data:`MAX_FRUITLESS_STEPS` steps lost episodes and finished none.
        """
        self.counts += totals
        self.lost += lost
        self.fruitless = self.fruitless + 1 if lost and not totals[..., EPISODES].sum() else 0
        if self.fruitless >= MAX_FRUITLESS_STEPS:
            raise RunStopped(f"evaluation {self.tag}: its last {self.fruitless} steps lost every episode to simulator "
                             f"faults ({self.lost} lost in all) and finished none, so it stops: the simulator cannot "
                             "run it (the warnings above say why: an actor that died, an environment that did not "
                             "answer within simulator.step_timeout_s, or remote clients that broke the protocol, "
                             "whose hub logs name the field)")

    def finish(self, video: bool) -> dict[str, float]:
        """Once no worker has items left (every rank calls it): write what the evaluation
        leaves behind (videos where asked); returns extra metrics of rank 0's (may be empty)."""
        return {}

    def close(self) -> None:
        """Release what the session started (simulator pools of other tasks); nothing by default."""

    # --------------------------------------------------------------------- figures
    def metrics(self) -> dict[str, float]:
        """Per target and protocol ``p``, over all tasks: ``eval/{p}/success_rate``,
        ``.../ci_low``, ``.../ci_high`` (Wilson 95%), ``.../episodes`` and ``.../episode_length``
        (mean decision steps, or response tokens); with several tasks the same per task under
        ``eval/{task}/{p}/``; with several targets each under ``eval/step{S}/``. Groups without
        an episode in this session (all done before it, by a stopped evaluation) are left out.
        Also ``eval/lost_episodes``, the episodes lost to simulator faults (and rolled out again)
        during the evaluation, all workers, and ``eval/lost_fraction``, their share of the
        episodes rolled out."""
        recorded = round(float(self.counts[..., EPISODES].sum()))
        out: dict[str, float] = {"eval/lost_episodes": float(self.lost),
                                 "eval/lost_fraction": self.lost / max(self.lost + recorded, 1)}
        for c in range(len(self.target_steps)):
            prefix = "eval" if len(self.target_steps) == 1 else f"eval/step{self.step_of(c)}"
            for p, protocol in enumerate(self.protocols):
                out.update(_figures(f"{prefix}/{protocol.name}", self.counts[:, c, p].sum(axis=0)))
                if len(self.task_names) > 1:
                    for t, task in enumerate(self.task_names):
                        out.update(_figures(f"{prefix}/{task}/{protocol.name}", self.counts[t, c, p]))
        return out


def _figures(prefix: str, counts: np.ndarray) -> dict[str, float]:
    # Counts summed over workers as replicas' shares (1 / replicas each) are whole numbers only up
    # to float64 rounding (six shares of 1/6 sum to 0.9999999999999999): rounded, never truncated.
    successes, episodes = round(float(counts[SUCCESSES])), round(float(counts[EPISODES]))
    length_sum = float(counts[LENGTH_SUM])
    if episodes == 0:
        return {}
    low, high = wilson_interval(successes, episodes)
    return {
        f"{prefix}/success_rate": successes / episodes,
        f"{prefix}/ci_low": low,
        f"{prefix}/ci_high": high,
        f"{prefix}/episodes": float(episodes),
        f"{prefix}/episode_length": length_sum / episodes,
    }
