"""An evaluation's figures from its counts, without Ray: replicated shards' shares sum back to
whole counts, and a batch whose every episode was lost is reported, not divided by."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from vla_rl.evaluation.session import _figures
from vla_rl.nodes.evaluation import rollout_eval_episodes
from vla_rl.utils.stats import wilson_interval


def test_counts_summed_from_replicas_shares_are_whole():
    """With eval_record at a DP size below the world size, each of 6 replicas adds 1/6 of a count:
    1 success of 50 summed to 0.9999999999999999 and was truncated to 0 (a 0% success rate)."""
    shares = np.zeros(3)
    for _ in range(6):
        shares += np.array([1.0, 50.0, 500.0]) / 6
    assert shares[0] < 1.0  # float64: the case that truncated
    figures = _figures("eval/greedy", shares)
    assert figures["eval/greedy/success_rate"] == 0.02 and figures["eval/greedy/episodes"] == 50.0
    assert (figures["eval/greedy/ci_low"], figures["eval/greedy/ci_high"]) == pytest.approx(wilson_interval(1, 50))


def test_a_batch_whose_every_episode_was_lost_reports_its_loss():
    """Its chunks ran (environment steps > 0), then the simulator failed: a later step redoes the
    episodes; the node divided the steps by zero episodes."""
    batch = TensorDict({"init_state_id": torch.arange(3)}, batch_size=[3])
    evaluation = SimpleNamespace(rollout=lambda b: (b[:0], 240))
    output = rollout_eval_episodes(SimpleNamespace(resources=SimpleNamespace(evaluation=evaluation)), batch)
    assert len(output.batch) == 0 and output.metrics == {"eval/lost_fraction": 1.0}
