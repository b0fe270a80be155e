"""The embodied rollout loop: a policy drives a simulator pool through whole episodes.

Each decision step the policy samples an action chunk for every still-running environment; the
pool executes the chunk's actions one control step at a time. An environment stops at success
(``terminated``) or at its time limit (``truncated``); a success reached in the middle of a chunk
ends the episode as a success and the rest of that chunk is not executed. The terminal observation
is kept (``obs[:, finish_step]``). Finished environments are not stepped again.

Observations are what the simulator gives (:mod:`vla_rl_core.observations`): a flat state, or
with cameras a ``TensorDict`` of the state, uint8 images and the encoded instruction; the policy's
``sample_actions`` reads them as they are (a VLA's processor builds its inputs), and the pool
receives ``policy.env_actions(actions, obs)``, given the observations the actions were sampled
from (π0's state-relative actions add the state back), while the batch keeps the policy's own
actions (the environment actions are returned beside it, :attr:`RolloutResult.env_actions`, so
that stored episodes can be replayed exactly). Own actions are ``policy.own_action_dim`` values
per chunk position (``action_dim`` for most policies; π0: its whole denoising chains), environment
actions the simulator's ``action_dim``.

A policy without an action distribution (``policy.has_action_distribution`` False: OpenVLA-OFT's
L1-regression head) acts only greedily, through ``policy.predict_action_chunk``; its episodes
carry no log-probs (``old_log_probs`` is absent from the batch: they are undefined, not zero).

Pipelining (RLinf's pipeline stages): the batch's environments are split into
``pipeline_stages`` contiguous groups. A stage's chunk is submitted to the pool without waiting
(:meth:`simulators.pool.SimulatorPool.submit`); while it simulates, the policy computes the next
chunk of the next stage; then the loop collects the oldest stage in flight and gives it its next
chunk. Each simulator actor holds environments of every stage and runs the chunks it receives
in order, so it always has the next stage's chunk queued while the policy works. With one stage,
simulation and inference alternate (lockstep, as siiRL does).

Determinism: the policy is called stage after stage in a fixed round-robin order that depends on
the episodes' ends, never on timing, so a rollout is reproducible for a given generator and number
of stages. The number of stages decides which rows the policy samples together, hence which random
numbers each episode gets: greedy rollouts are identical for any number of stages, sampled ones
are equal in distribution (and identical for the same number of stages).

Faults: the episodes of a simulator actor that died or hung are lost (the pool restarts the
actor); they are dropped from the returned batch and flagged in :attr:`RolloutResult.lost`.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch
from tensordict import TensorDict

from vla_rl.algorithms.granularity import executed_actions
from vla_rl_core import keys
from vla_rl_core.observations import to_torch


@dataclass
class RolloutResult:
    """Episodes of one rollout call.

    Attributes:
        batch: one row per episode that was not lost, in the order of the requested initial
            states: ``obs`` ``(m, T + 1, obs_dim)`` (camera observations: a TensorDict of batch
            size ``(m, T + 1)``, see :mod:`vla_rl_core.keys`), ``actions``
            ``(m, T, chunk, own_action_dim)`` (the policy's own actions, ``policy.own_action_dim``
            values each), ``old_log_probs`` ``(m, T, chunk)`` (only for a policy
            with an action distribution), ``response_mask``
            ``(m, T)``, ``success`` ``(m,)``, ``truncated`` ``(m,)`` (ended by the time limit
            without success), ``finish_step`` ``(m,)`` (decision steps taken), ``control_steps``
            ``(m,)`` (actions executed: the last chunk may end early, and its actions that never
            ran have log-prob 0, :mod:`vla_rl.algorithms.granularity`), ``init_state_id``
            ``(m,)``, where ``T = ceil(horizon / chunk)``.
        env_actions: ``(m, T, chunk, action_dim)`` float32, the rows of ``batch``: what the pool
            received, ``policy.env_actions(actions, obs)`` in the simulator's units (zeros after
            ``finish_step``). Not in ``batch``: training does not read them.
        frames: for each rendered environment index whose episode was not lost, its frames
            ``(steps, H, W, 3)`` uint8, one after each control step.
        env_steps: control steps executed (all environments together; a lost episode's count up to
            the chunk it was lost in, whose steps are unknown).
        lost: ``(n,)`` bool over the requested initial states: the episode was lost to a
            simulator fault and is not in ``batch``.
        policy_seconds: wall time spent choosing actions (``policy.sample_actions`` or
            ``predict_action_chunk``) and in ``policy.env_actions``.
        env_seconds: wall time spent in the pool's ``reset``, ``submit`` and ``collect`` (waiting
            for physics and rendering not hidden behind the policy, and Ray).
        sim_seconds: wall time the simulator actors spent inside the environments' ``step`` and
            ``render_frame`` (summed over actors), seconds.
        sim_cpu_seconds: CPU time the simulator actors used meanwhile (summed), seconds: below
            ``sim_seconds`` when other processes share the cores.
    """

    batch: TensorDict
    env_actions: torch.Tensor
    frames: dict[int, np.ndarray] = field(default_factory=dict)
    env_steps: int = 0
    lost: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    policy_seconds: float = 0.0
    env_seconds: float = 0.0
    sim_seconds: float = 0.0
    sim_cpu_seconds: float = 0.0


class EpisodeBook:
    """Buffers and bookkeeping of ``n`` episodes of at most ``decisions`` decision steps.

    Args:
        first_obs: the ``n`` initial observations, ``(n, obs_dim)`` float32 or a TensorDict of
            batch size ``(n,)`` (:func:`vla_rl_core.observations.to_torch` of the pool's reset).
        decisions, chunk: decision steps and actions per chunk.
        own_action_dim: values per own action of the policy (``policy.own_action_dim``).
        action_dim: values per environment action (the simulator's ``action_dim``).
        render_indices: environment indices whose frames are recorded.
        log_probs: keep log-probs (False for a policy without an action distribution).

    Attributes:
        obs: ``(n, decisions + 1, obs_dim)`` (or a TensorDict of batch size ``(n, decisions + 1)``);
            ``obs[i, t]`` is what decision ``t`` saw, and ``obs[i, finish_step]`` the terminal
            observation.
        actions: ``(n, decisions, chunk, own_action_dim)``, the policy's own actions;
            env_actions: ``(n, decisions, chunk, action_dim)``, what the pool received; log_probs:
            ``(n, decisions, chunk)``;
        mask: ``(n, decisions)`` bool, the decisions taken.
        success, truncated: ``(n,)`` bool; finish: ``(n,)`` int64, decisions taken;
        control_steps: ``(n,)`` int64, actions executed.
        running: ``(n,)`` bool numpy, episodes still running; lost: ``(n,)`` bool numpy.
        policy_seconds, env_seconds, sim_seconds, sim_cpu_seconds: as in :class:`RolloutResult`.
    """

    def __init__(self, first_obs: torch.Tensor | TensorDict, decisions: int, chunk: int, own_action_dim: int,
                 action_dim: int, render_indices: tuple[int, ...], log_probs: bool = True) -> None:
        n = first_obs.shape[0]
        self.obs = _time_buffer(first_obs, decisions + 1)  # (n, T + 1, ...)
        self.obs[:, 0] = first_obs
        self.actions = torch.zeros(n, decisions, chunk, own_action_dim)
        self.env_actions = torch.zeros(n, decisions, chunk, action_dim)
        self.log_probs = torch.zeros(n, decisions, chunk) if log_probs else None
        self.mask = torch.zeros(n, decisions, dtype=torch.bool)
        self.success = torch.zeros(n, dtype=torch.bool)
        self.truncated = torch.zeros(n, dtype=torch.bool)
        self.finish = torch.zeros(n, dtype=torch.int64)
        self.control_steps = torch.zeros(n, dtype=torch.int64)
        self.chunk = chunk
        self.running = np.ones(n, dtype=bool)
        self.lost = np.zeros(n, dtype=bool)
        self.frames: dict[int, list[np.ndarray]] = {int(i): [] for i in render_indices}
        self.env_steps = 0
        self.policy_seconds = self.env_seconds = self.sim_seconds = self.sim_cpu_seconds = 0.0

    def record_decision(self, rows: np.ndarray, t: int, actions: torch.Tensor, env_actions: torch.Tensor,
                        log_probs: torch.Tensor | None) -> None:
        """Decision ``t`` of episodes ``rows``: the policy's own ``actions`` ``(k, chunk,
        own_action_dim)``, the ``env_actions`` sent to the pool ``(k, chunk, action_dim)``, and
        ``log_probs`` ``(k, chunk)`` (None for a book without log-probs)."""
        idx = torch.as_tensor(rows)
        self.actions[idx, t] = actions
        self.env_actions[idx, t] = env_actions
        if self.log_probs is not None:
            self.log_probs[idx, t] = log_probs
        self.mask[idx, t] = True
        self.finish[idx] = t + 1

    def record_chunk(self, rows: np.ndarray, t: int, out: dict) -> None:
        """The pool's result (:meth:`simulators.pool.SimulatorPool.collect`) of decision ``t``'s
        chunk in episodes ``rows``: the observation after the chunk (the terminal one if the
        episode ended in it) goes to ``obs[:, t + 1]``; a success anywhere in the chunk counts."""
        lost, kept = out["lost"], ~out["lost"]
        done = rows[kept]
        idx = torch.as_tensor(done)
        self.obs[idx, t + 1] = to_torch(out["obs"])[torch.as_tensor(kept)]
        self.success[idx] |= torch.as_tensor(out["success"][kept])
        self.truncated[idx] = torch.as_tensor(out["truncated"][kept]) & ~self.success[idx]
        self.running[done[out["terminated"][kept] | out["truncated"][kept]]] = False
        self.running[rows[lost]] = False
        self.lost[rows[lost]] = True
        self.control_steps[idx] += torch.as_tensor(out["steps"][kept], dtype=torch.int64)
        self.env_steps += int(out["steps"][kept].sum())
        self.sim_seconds += float(out["sim_seconds"])
        self.sim_cpu_seconds += float(out["sim_cpu_seconds"])
        for i, frames in out["frames"].items():
            self.frames[int(i)].append(frames)

    def result(self, init_state_ids: np.ndarray) -> RolloutResult:
        """The episodes not lost, as a :class:`RolloutResult` (the log-probs of the actions that
        never ran, after an episode's end inside its last chunk, set to 0)."""
        kept = torch.as_tensor(~self.lost)
        batch = TensorDict(
            {
                keys.OBS: self.obs[kept],
                keys.ACTIONS: self.actions[kept],
                keys.RESPONSE_MASK: self.mask[kept],
                keys.SUCCESS: self.success[kept],
                keys.TRUNCATED: self.truncated[kept],
                keys.FINISH_STEP: self.finish[kept],
                keys.CONTROL_STEPS: self.control_steps[kept],
                keys.INIT_STATE_ID: torch.as_tensor(np.asarray(init_state_ids), dtype=torch.int64)[kept],
            },
            batch_size=[int(kept.sum())],
        )
        if self.log_probs is not None:
            executed = executed_actions(self.mask[kept], self.control_steps[kept], self.chunk)  # (m, T, C)
            batch.set(keys.OLD_LOG_PROBS, torch.where(executed, self.log_probs[kept], 0.0))
        frames = {i: np.concatenate(f) for i, f in self.frames.items() if f and not self.lost[i]}
        return RolloutResult(batch, self.env_actions[kept], frames, self.env_steps, self.lost.copy(),
                             self.policy_seconds, self.env_seconds, self.sim_seconds, self.sim_cpu_seconds)


@torch.no_grad()
def rollout_episodes(
    policy,
    pool,
    init_state_ids: np.ndarray,
    *,
    task_ids: np.ndarray | None = None,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    render_indices: tuple[int, ...] = (),
    pipeline_stages: int = 1,
) -> RolloutResult:
    """Run one episode per initial state in ``init_state_ids`` (shape ``(n,)``, int64).

    Args:
        policy: a :class:`policies.base.Policy`, put in eval mode (its ``sample_actions``, or its
            ``predict_action_chunk`` when it has no action distribution, is called on the running
            environments' observations, moved to its ``device``, one pipeline stage at a time, its
            ``env_actions`` on the chosen actions and those observations). The returned batch is on
            the CPU.
        pool: a :class:`simulators.pool.SimulatorPool` with capacity ≥ n (or any object with
            its ``spec``, ``reset``, ``submit`` and ``collect``).
        task_ids: ``(n,)`` int64, each episode's task in the pool's task set (``None``: the
            pool's only task); the observations then carry it (``obs/task_id``).
        greedy: take the policy's mode instead of sampling (required for a policy without an
            action distribution).
        generator: torch generator for sampling (reproducibility).
        render_indices: environment indices whose camera frames are recorded.
        pipeline_stages: number of environment groups pipelined against the policy (1: lockstep;
            more stages than environments act as one stage per environment).

    Raises:
        ValueError: from the pool if ``n`` exceeds its capacity; if ``pipeline_stages < 1``; a
            sampled rollout (``greedy`` False) of a policy without an action distribution.
    """
    if isinstance(pipeline_stages, bool) or not isinstance(pipeline_stages, int) or pipeline_stages < 1:
        raise ValueError(f"pipeline_stages must be a positive integer, got {pipeline_stages!r}")
    if not greedy and not policy.has_action_distribution:
        raise ValueError("a sampled rollout needs a policy with an action distribution; this policy has none "
                         "(it acts only greedily: pass greedy=True)")
    policy.eval()  # the update leaves it in train mode: no dropout (LoRA's), and KV caches, while acting
    spec = pool.spec()
    horizon, action_dim = spec.horizon, spec.action_dim
    chunk = int(policy.chunk_size)
    n = len(init_state_ids)
    decisions = math.ceil(horizon / chunk)
    start = time.perf_counter()
    ids = np.asarray(init_state_ids, dtype=np.int64)
    first_obs = to_torch(pool.reset(ids) if task_ids is None else pool.reset(ids, np.asarray(task_ids, dtype=np.int64)))
    book = EpisodeBook(first_obs, decisions, chunk, int(policy.own_action_dim), action_dim, tuple(render_indices),
                       policy.has_action_distribution)
    book.env_seconds += time.perf_counter() - start
    stages = np.array_split(np.arange(n), min(pipeline_stages, n))
    run_pipeline(policy, pool, book, stages, decisions, greedy, generator, tuple(render_indices))
    return book.result(init_state_ids)


def run_pipeline(policy, pool, book: EpisodeBook, stages: list[np.ndarray], decisions: int, greedy: bool,
                 generator: torch.Generator | None, render_indices: tuple[int, ...]) -> None:
    """Drive the episodes of ``book`` to their ends, ``stages`` (arrays of episode rows) pipelined.

    Every stage gets its first chunk, then, oldest first, a stage in flight is collected and
    given its next chunk (sampled while the other stages simulate), until no stage has a running
    episode or each has taken ``decisions`` decisions.
    """
    in_flight: deque = deque()

    def launch(stage: np.ndarray, t: int) -> None:
        rows = stage[book.running[stage]]
        if len(rows) == 0 or t == decisions:
            return
        start = time.perf_counter()
        obs = book.obs[torch.as_tensor(rows), t].to(policy.device)  # (k, ...) on the policy's device
        if policy.has_action_distribution:
            actions, log_probs = policy.sample_actions(obs, greedy=greedy, generator=generator)
            log_probs = log_probs.cpu()
        else:  # a deterministic policy's greedy chunk; its log-probs are undefined
            actions, log_probs = policy.predict_action_chunk(obs), None
        env_actions = policy.env_actions(actions, obs).cpu()  # (k, chunk, action_dim) in the simulator's units
        actions = actions.cpu()  # the batch lives on the CPU between nodes
        book.policy_seconds += time.perf_counter() - start
        book.record_decision(rows, t, actions, env_actions, log_probs)
        running = set(rows.tolist())
        rendered = [i for i in render_indices if i in running]
        start = time.perf_counter()
        in_flight.append((stage, rows, t, pool.submit(rows, env_actions.numpy(), rendered)))
        book.env_seconds += time.perf_counter() - start

    for stage in stages:
        launch(stage, 0)
    while in_flight:
        stage, rows, t, pending = in_flight.popleft()
        start = time.perf_counter()
        out = pool.collect(pending)
        book.env_seconds += time.perf_counter() - start
        book.record_chunk(rows, t, out)
        launch(stage, t + 1)


def _time_buffer(first: torch.Tensor | TensorDict, steps: int) -> torch.Tensor | TensorDict:
    """Zeros for ``steps`` observations per row, shaped like the batch ``first`` (``(n, ...)``):
    ``(n, steps, ...)`` (a TensorDict of batch size ``(n, steps)`` for camera observations)."""
    n = first.shape[0]
    if isinstance(first, TensorDict):
        return TensorDict({key: torch.zeros((n, steps, *value.shape[1:]), dtype=value.dtype)
                           for key, value in first.items()}, batch_size=[n, steps])
    return torch.zeros((n, steps, *first.shape[1:]), dtype=first.dtype)
