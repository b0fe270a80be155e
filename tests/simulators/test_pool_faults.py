"""Simulator faults during rollouts: an actor process killed (SIGKILL) or hung (SIGSTOP) in the
middle of a pipelined rollout on a real pool of robosuite Lift environments (2 actors x 2 envs).
The rollout completes with the other actor's episodes, the lost ones are flagged and logged,
the actor is replaced, and the pool works afterwards."""

from __future__ import annotations

import logging
import os
import signal
import time

import numpy as np
import pytest
import torch

from policies import make_policy
from policies.mlp import MLPPolicyConfig
from simulators.pool import SimulatorPool
from vla_rl.rollout.embodied import rollout_episodes

HORIZON = 12
TIMEOUT_S = 4.0
IDS = np.array([20, 21, 22, 23])  # env g runs on actor g % 2


@pytest.fixture(scope="module")
def pool(ray_on_loopback):
    with SimulatorPool("robosuite_lift", {"horizon": HORIZON}, num_actors=2, envs_per_actor=2,
                       actor_options={"num_cpus": 0}, step_timeout_s=TIMEOUT_S) as pool:
        yield pool


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return make_policy("mlp", MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(16,)))


class SignalAtCall:
    """Wraps a policy; before its ``at_call``-th ``sample_actions`` call, sends ``signum`` to the
    process of simulator actor ``slot`` (so the chunks in flight meet a dead or frozen actor)."""

    def __init__(self, policy, pool: SimulatorPool, slot: int, signum: int, at_call: int) -> None:
        self.policy, self.chunk_size, self.device = policy, policy.chunk_size, policy.device
        self.has_action_distribution, self.own_action_dim = policy.has_action_distribution, policy.own_action_dim
        self.pid = pool.actor_pids()[slot]
        self.signum, self.at_call, self.calls = signum, at_call, 0

    def sample_actions(self, obs, greedy=False, generator=None):
        self.calls += 1
        if self.calls == self.at_call:
            os.kill(self.pid, self.signum)
        return self.policy.sample_actions(obs, greedy=greedy, generator=generator)

    def env_actions(self, actions, obs=None):
        return self.policy.env_actions(actions, obs)

    def eval(self):
        self.policy.eval()
        return self


def reference(policy, pool):
    """A greedy rollout without faults."""
    result = rollout_episodes(policy, pool, IDS, greedy=True, pipeline_stages=2)
    assert not result.lost.any()
    return result.batch


def assert_same_episodes(batch, expected):
    for key in expected.keys():
        assert torch.equal(batch[key], expected[key]), key


def test_killed_actor_loses_only_its_episodes_and_is_replaced(pool, policy, caplog):
    expected = reference(policy, pool)
    restarts = pool.restarts
    killer = SignalAtCall(policy, pool, slot=1, signum=signal.SIGKILL, at_call=5)  # stage 0's 3rd decision
    with caplog.at_level(logging.WARNING, logger="simulators.pool"):
        result = rollout_episodes(killer, pool, IDS, greedy=True, pipeline_stages=2)
    assert result.lost.tolist() == [False, True, False, True]
    assert pool.restarts == restarts + 1
    assert "died" in caplog.text and "episodes lost in environments [1, 3]" in caplog.text
    # The surviving episodes are complete and identical to those of a rollout without faults.
    assert_same_episodes(result.batch, expected[torch.tensor([0, 2])])
    assert killer.pid not in pool.actor_pids()
    # The pool works afterwards, with a fresh actor in the slot.
    assert_same_episodes(reference(policy, pool), expected)


def test_hung_actor_times_out_and_is_replaced(pool, policy, caplog):
    expected = reference(policy, pool)
    freezer = SignalAtCall(policy, pool, slot=0, signum=signal.SIGSTOP, at_call=4)
    started = time.perf_counter()
    try:
        with caplog.at_level(logging.WARNING, logger="simulators.pool"):
            result = rollout_episodes(freezer, pool, IDS, greedy=True, pipeline_stages=2)
    finally:
        try:
            os.kill(freezer.pid, signal.SIGKILL)  # Ray kills it too, a few seconds later
        except ProcessLookupError:
            pass
    assert time.perf_counter() - started >= TIMEOUT_S
    assert result.lost.tolist() == [True, False, True, False]
    assert "did not answer a chunk within step_timeout_s=4.0 s" in caplog.text
    assert_same_episodes(result.batch, expected[torch.tensor([1, 3])])
    assert_same_episodes(reference(policy, pool), expected)


def test_actor_dead_before_a_reset_is_replaced_without_losses(pool, policy):
    expected = reference(policy, pool)
    os.kill(pool.actor_pids()[0], signal.SIGKILL)
    time.sleep(0.5)
    assert_same_episodes(reference(policy, pool), expected)


def test_step_reports_a_lost_environment(pool):
    from simulators.pool import SimulatorLostError

    pool.reset(IDS)
    os.kill(pool.actor_pids()[1], signal.SIGKILL)
    with pytest.raises(SimulatorLostError, match=r"environments \[1, 3\]"):
        pool.step(np.zeros((4, 7), dtype=np.float32), np.ones(4, dtype=bool))
    pool.reset(IDS)
    assert pool.step(np.zeros((4, 7), dtype=np.float32), np.ones(4, dtype=bool))["obs"].shape == (4, 15)
