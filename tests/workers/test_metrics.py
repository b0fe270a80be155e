"""Metric reduction over the DAG workers: each metric carries its own weight or rule, so a reduced
figure does not depend on how the batch was split (DP 1 with replicated shards vs DP 2)."""

from __future__ import annotations

import math
import os
import types

import pytest
import torch
import torch.distributed as dist
from spawned import run_workers
from tensordict import TensorDict

from vla_rl.config import RunConfig
from vla_rl.nodes.advantage import compute_advantages
from vla_rl.nodes.group_filter import filter_groups
from vla_rl.nodes.reward import compute_rewards
from vla_rl.workers.context import NodeContext
from vla_rl.workers.metrics import (
    as_metric,
    maximum,
    mean,
    minimum,
    reduce_metrics,
    reduction_cost,
    same,
    total,
)
from vla_rl_core import keys


def test_rules_on_one_worker(process_group):
    local = [("a", mean(2.0, 3), 1), ("a", mean(4.0, 1), 1),  # (2*3 + 4*1) / 4
             ("b", total(5.0), 1), ("b", total(1.0), 1),
             ("c", same(7.0), 1), ("d", as_metric(0.5, 8), 2), ("e", mean(1.0, 0), 1),
             ("f", maximum(3.0), 2), ("f", maximum(9.0), 1), ("g", minimum(3.0), 1), ("g", minimum(-2.0), 2),
             ("h", mean(float("nan"), 0), 1), ("h", mean(0.0, 4), 1),  # an empty shard's mean: NaN over nothing
             ("c", same(8.0), 1), ("f", maximum(1.0), 1), ("d", mean(1.0, 4), 1),  # the first "same"; the largest
             ("i", mean(1.0, 4), 2), ("i", mean(0.0, 2), 1)]  # a replicated shard's weight counts once: 4 / 2
    reduced = reduce_metrics(local)
    # "e" has no weight: dropped; "h" was NaN (a worker that lost every episode made reward/mean null);
    # "d": a plain float weighs its batch, 8 samples over 2 replicas: (0.5 * 4 + 1.0 * 4) / 8
    assert reduced == {"a": 2.5, "b": 6.0, "c": 7.0, "d": 0.75, "f": 9.0, "g": -2.0, "h": 0.0, "i": 0.5}
    with pytest.raises(ValueError, match="rules 'mean' and 'sum'"):
        reduce_metrics([("x", mean(1.0, 1), 1), ("x", total(1.0), 1)])


def step_batch() -> TensorDict:
    """Four groups of three episodes: lengths and outcomes chosen so that per-episode and
    per-step means differ between the groups (and between the two halves of the batch)."""
    lengths = torch.tensor([5, 2, 7, 3, 3, 3, 1, 8, 4, 6, 6, 2])
    success = torch.tensor([1, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0, 1], dtype=torch.bool)
    horizon = 8
    return TensorDict({
        keys.UID: torch.arange(4).repeat_interleave(3),
        keys.TASK_ID: torch.zeros(12, dtype=torch.int64),
        keys.SUCCESS: success,
        keys.FINISH_STEP: lengths,
        keys.RESPONSE_MASK: torch.arange(horizon)[None, :] < lengths[:, None],
    }, batch_size=[12])


def _chain_metrics(rank: int, world: int, dp_size: int) -> dict[str, float]:
    """The reward, advantage and filter nodes on this rank's shard, reduced as the worker does."""
    config = RunConfig.model_validate({"algorithm": {"reward": "success", "adv_estimator": "grpo",
                                                     "filter_groups": {"zero_variance": True}}})
    batch = step_batch()
    dp_rank = rank // (world // dp_size)
    shard = batch[dp_rank * 12 // dp_size:(dp_rank + 1) * 12 // dp_size]  # whole groups
    local = []
    for node in (compute_rewards, compute_advantages, filter_groups):
        ctx = NodeContext(node.__name__, 0, rank, world, dp_rank, dp_size, config, None,
                          types.SimpleNamespace(), group=None)
        size = len(shard)
        out = node(ctx, shard)
        local += [(name, as_metric(value, size), ctx.replicas) for name, value in out.metrics.items()]
        shard = out.batch
    return reduce_metrics(local)


def _worker(rank: int, world: int, store_path: str) -> dict:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    metrics = {dp: _chain_metrics(rank, world, dp) for dp in (1, 2)}
    dist.destroy_process_group()
    return metrics


def test_reduced_metrics_are_identical_at_dp_1_and_dp_2(tmp_path):
    results = run_workers(_worker, 2, str(tmp_path / "store"), nprocs=2)
    dp1, dp2 = results[0][1], results[0][2]
    assert results[1] == results[0]  # every worker holds the same figures
    assert set(dp1) == set(dp2) and {"advantage/abs_mean", "reward/failure_mean", "filter/kept_fraction"} <= set(dp1)
    for name in dp1:  # equal up to the float32 arithmetic of the shards' own means
        assert math.isclose(dp1[name], dp2[name], rel_tol=1e-6, abs_tol=1e-9), (name, dp1[name], dp2[name])
    # advantage/abs_mean is a mean over decision steps: by hand from the whole batch
    batch = step_batch()
    config = RunConfig.model_validate({"algorithm": {"reward": "success", "adv_estimator": "grpo"}})
    ctx = NodeContext("advantage", 0, 0, 1, 0, 1, config, None, types.SimpleNamespace())
    advantages = compute_advantages(ctx, compute_rewards(ctx, batch).batch).batch[keys.ADVANTAGES]
    by_hand = float(advantages.abs().sum() / batch[keys.RESPONSE_MASK].sum())
    assert dp2["advantage/abs_mean"] == pytest.approx(by_hand, rel=1e-6)


def _advantages_worker(rank: int, world: int, store_path: str) -> dict:
    """This rank's REINFORCE++ advantages of the step batch at DP 1 (the whole batch) and DP 2
    (its half): whitened over the batch, whose statistics the shards all-reduce."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    config = RunConfig.model_validate({"algorithm": {"reward": "success", "adv_estimator": "reinforce_plus_plus"}})
    out = {}
    for dp_size in (1, 2):
        dp_rank = rank // (world // dp_size)
        shard = step_batch()[dp_rank * 12 // dp_size:(dp_rank + 1) * 12 // dp_size]
        ctx = NodeContext("advantage", 0, rank, world, dp_rank, dp_size, config, None, types.SimpleNamespace(),
                          group=None)
        out[dp_size] = compute_advantages(ctx, compute_rewards(ctx, shard).batch).batch[keys.ADVANTAGES]
    dist.destroy_process_group()
    return out


def test_batch_whitened_advantages_are_the_same_at_dp_1_and_dp_2(tmp_path):
    """Nothing checked the sharded whitening (the all-reduced count, sum, maximum, minimum and
    variance of GAE's and REINFORCE++'s advantages): with the shards' minima taken for their
    maximum, every advantage of a 0/1 reward was 0 at DP 2, and without the reduction each
    shard was whitened alone."""
    results = run_workers(_advantages_worker, 2, str(tmp_path / "store"), nprocs=2)
    whole = results[0][1]
    assert whole.abs().max() > 0.5  # the batch's rewards vary: its advantages are no zeros
    torch.testing.assert_close(results[1][1], whole)
    torch.testing.assert_close(torch.cat([results[0][2], results[1][2]]), whole, rtol=1e-5, atol=1e-6)


def test_replicated_shards_count_once_in_the_whitening_statistics(tmp_path):
    """4 workers at DP 2: each shard on two of them, whose all-reduced sums count it twice unless
    divided by the replicas (the count and the sum cancel in the mean, not in the unbiased
    variance's divisor n - 1)."""
    results = run_workers(_advantages_worker, 4, str(tmp_path / "store"), nprocs=4)
    whole = results[0][1]
    torch.testing.assert_close(results[1][2], results[0][2])  # replicas hold the same
    torch.testing.assert_close(torch.cat([results[0][2], results[2][2]]), whole, rtol=1e-6, atol=1e-7)


def _local_metrics(rank: int, case: str) -> list:
    local = [("a", mean(0.1 * (rank + 1), 3 + rank), 1), ("a", mean(0.7, 1), 1), ("n", total(rank + 0.5), 1),
             ("s", same(1.0 / 3.0), 1), ("m", maximum(10.0 * rank), 1)]
    if case == "names differ" and rank == 1:
        local.append(("only_rank_1", mean(2.0, 1), 1))
    if case == "as many, other names" and rank == 1:  # the count alone does not tell them apart
        local[-1] = ("m_rank_1", maximum(5.0), 1)
    return local


def _legacy_reduction(case: str, world: int) -> dict[str, float]:
    """What every worker must get: the entries of all ranks combined in rank order by the same
    rules (the pickled exchange's arithmetic)."""
    sums, weights, rules = {}, {}, {}
    for rank in range(world):
        for name, m, _ in _local_metrics(rank, case):
            rules[name] = m.rule
            if m.rule == "mean":
                sums[name] = sums.get(name, 0.0) + m.value * m.weight
                weights[name] = weights.get(name, 0.0) + m.weight
            elif m.rule == "sum":
                sums[name] = sums.get(name, 0.0) + m.value
            elif m.rule == "max":
                sums[name] = max(sums.get(name, m.value), m.value)
            else:
                sums.setdefault(name, m.value)
    return {name: sums[name] / weights[name] if rules[name] == "mean" else sums[name] for name in sorted(sums)}


def _reduction_worker(rank: int, world: int, store_path: str) -> dict:
    from vla_rl.utils.collectives import COUNTERS

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    out = {}
    for case in ("same names", "names differ", "as many, other names"):
        before = COUNTERS.snapshot()
        reduced = reduce_metrics(_local_metrics(rank, case))
        counted = COUNTERS.since(before).tags["metrics"]
        out[case] = (reduced, (counted.collectives, counted.bytes_received))
    dist.destroy_process_group()
    return out


def test_reduction_exchanges_numbers_when_names_agree_with_the_same_figures(tmp_path):
    world = 2
    results = run_workers(_reduction_worker, world, str(tmp_path / "store"), nprocs=world)
    assert results[0] == results[1]
    for case in ("same names", "names differ", "as many, other names"):
        reduced, _ = results[0][case]
        assert reduced == _legacy_reduction(case, world)  # exactly: same entries, same order
    assert results[0]["as many, other names"][0]["m"] == 0.0 and results[0]["as many, other names"][0]["m_rank_1"] == 5
    assert results[0]["same names"][0]["m"] == 10.0 and results[0]["same names"][0]["n"] == 2.0
    # Names agree: a 16-byte header and 16 bytes per entry from the other worker, as predicted.
    expected = reduction_cost(world, len(_local_metrics(0, "same names")))
    assert results[0]["same names"][1] == (2, sum(received for _, received in expected))
    # They differ: the header, then the pickled entries (their lengths, then the pickles).
    collectives, received = results[0]["names differ"][1]
    assert collectives == 3 and received > 16
