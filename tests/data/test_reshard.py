"""Re-sharding between DP sizes over a real gloo process group (spawned processes, loopback),
nested camera observations (uint8 images, a time dimension) included."""

from __future__ import annotations

import itertools
import os
import random

import pytest
import torch
import torch.distributed as dist
from spawned import run_workers
from tensordict import TensorDict

from vla_rl.data.reshard import group_sizes, rebalance_ranges, reshard, route, split_groups
from vla_rl.utils.ray_utils import free_loopback_port

# Groups of uneven sizes, in global order: group g has GROUP_SIZES[g] samples.
GROUP_SIZES = [3, 1, 4, 2, 2, 5, 1, 2]


def _global_batch() -> TensorDict:
    uids = torch.cat([torch.full((n,), g, dtype=torch.int64) for g, n in enumerate(GROUP_SIZES)])
    n = uids.numel()
    idx = torch.arange(n)
    pixel = idx[:, None] * 7 + torch.arange(3)  # (n, time): a value per sample and time step
    images = pixel[:, :, None, None, None].to(torch.uint8).expand(n, 3, 4, 4, 3).clone()
    return TensorDict(
        {
            "uid": uids,
            "obs": TensorDict({"state": idx[:, None, None].float() * torch.ones(n, 3, 2), "agentview_image": images},
                              batch_size=[n, 3]),  # camera observations: (batch, time, ...)
            "success": idx % 2 == 0,
            "actions": (idx[:, None] * 10 + torch.arange(7)).to(torch.float64),
            "finish_step": idx.to(torch.int32),
        },
        batch_size=[n],
    )


def _shard(batch: TensorDict, dp_size: int, dp_rank: int) -> TensorDict:
    """The reference sharding by whole groups, computed independently of the code under test:
    groups are dealt out so that shard k holds groups [k*G/d, (k+1)*G/d) when G divides by d."""
    num_groups = len(GROUP_SIZES)
    per = num_groups // dp_size
    wanted = set(range(dp_rank * per, (dp_rank + 1) * per))
    mask = torch.tensor([int(u) in wanted for u in batch["uid"]])
    return batch[mask]


def _worker(rank: int, world: int, port: int, hops: list[tuple[int, int]]) -> tuple:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    full = _global_batch()
    src = hops[0][0]
    local = _shard(full, src, rank // (world // src))
    shapes = []
    for src_dp, dst_dp in hops:
        local = reshard(local, src_dp, dst_dp)
        shapes.append(local["uid"].tolist())
    dist.destroy_process_group()
    return shapes, local.to_dict(), tuple(local["obs"].batch_size)


def _run(world: int, hops: list[tuple[int, int]]):
    return run_workers(_worker, world, free_loopback_port(), hops, nprocs=world)


def test_group_sizes_and_split():
    assert group_sizes(torch.tensor([5, 5, 2, 9, 9, 9])) == [2, 1, 3]
    with pytest.raises(ValueError, match="contiguous"):
        group_sizes(torch.tensor([1, 2, 1]))
    # 20 samples into 2 pieces: cumulative [0,3,4,8,10,12,17,18,20]; 10 is a boundary (after group 4).
    assert split_groups(GROUP_SIZES, 2) == [0, 4, 8]
    assert split_groups(GROUP_SIZES, 1) == [0, 8]
    # More shards than groups: two shards stay empty, no group is split.
    assert split_groups([4, 4], 4) == [0, 0, 1, 1, 2]


def _expected_uids(dst_dp: int, dp_rank: int) -> list[int]:
    bounds = split_groups(GROUP_SIZES, dst_dp)
    return [g for g in range(bounds[dp_rank], bounds[dp_rank + 1]) for _ in range(GROUP_SIZES[g])]


@pytest.mark.parametrize(
    ("world", "hops"),
    [
        (2, [(2, 1), (1, 2)]),
        (4, [(4, 2), (2, 1), (1, 4), (4, 4)]),
        (4, [(2, 4), (4, 1), (1, 2)]),
    ],
)
def test_reshard_chains_keep_groups_whole_and_data_intact(world, hops):
    results = _run(world, hops)
    full = _global_batch()
    for rank in range(world):
        shapes, final, obs_batch_size = results[rank]
        assert obs_batch_size == (len(shapes[-1]), 3)  # the time dimension survives every hop
        for (src_dp, dst_dp), uids in zip(hops, shapes):
            assert uids == _expected_uids(dst_dp, rank // (world // dst_dp)), (rank, src_dp, dst_dp)
        # Every field of every received row equals the original row of the same sample.
        final_td = TensorDict.from_dict(final)
        idx = final_td["finish_step"].long()
        for key in [("obs", "state"), ("obs", "agentview_image"), "success", "actions", "uid"]:
            torch.testing.assert_close(final_td.get(key), full.get(key)[idx])
        assert final_td["actions"].dtype == torch.float64
        assert final_td["obs", "agentview_image"].dtype == torch.uint8
        assert final_td["success"].dtype == torch.bool
    # Replicas of one destination shard hold identical data.
    last_dp = hops[-1][1]
    block = world // last_dp
    for rank in range(world):
        assert results[rank][0][-1] == results[(rank // block) * block][0][-1]


@pytest.mark.parametrize("rows", [0, 1, 3])
def test_pack_unpack_round_trip_any_row_count(rows):
    """Byte packing keeps every dtype exact, including a single row at an odd byte offset."""
    from vla_rl.data.reshard import _pack, _schema, _unpack

    batch = _global_batch()[:rows]
    batch.set("odd", torch.ones(rows, 3, dtype=torch.uint8))  # makes later fields start unaligned
    schema = _schema(batch)
    out = _unpack(_pack(batch, schema), schema)
    for key in [("obs", "state"), ("obs", "agentview_image"), "success", "actions", "uid", "finish_step", "odd"]:
        torch.testing.assert_close(out.get(key), batch.get(key))


def _single_group_worker(rank: int, world: int, port: int, group_key) -> list[float]:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    one_group = TensorDict({"uid": torch.zeros(5, dtype=torch.int64), "x": torch.arange(5.0)}, batch_size=[5])
    local = one_group if rank == 0 else one_group[:0]  # the DP-1 shard lives on rank 0
    rows = reshard(local, 1, 2, group_key=group_key)["x"].tolist()
    dist.destroy_process_group()
    return rows


@pytest.mark.parametrize(("group_key", "expected"), [("uid", [[], [0, 1, 2, 3, 4]]), (None, [[0, 1], [2, 3, 4]])])
def test_reshard_without_group_key_balances_single_samples(group_key, expected):
    """One group of 5 samples from DP 1 to DP 2: kept whole it leaves a rank empty (a model
    update there would have nothing to train on; the tie at 2.5 samples puts the cut before the
    group); sample by sample the cut at 2.5 goes to the earlier boundary, 2."""
    results = run_workers(_single_group_worker, 2, free_loopback_port(), group_key, nprocs=2)
    assert [results[0], results[1]] == expected


# Counted bytes: rows of uid (int64, 8 bytes) and x (3 float32, 12 bytes) = 20 bytes per row.
ROW_BYTES = 20


def _counting_worker(rank: int, world: int, port: int) -> tuple:
    from vla_rl.utils.collectives import COUNTERS

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    groups = torch.arange(4).repeat_interleave(2)  # 4 groups of 2 samples
    full = TensorDict({"uid": groups, "x": torch.arange(24.0).reshape(8, 3)}, batch_size=[8])
    counts = {}
    local = full[rank * 4:(rank + 1) * 4]  # DP 2: rank r holds groups 2r, 2r + 1
    for name, src, dst, key in (("2->1", 2, 1, "uid"), ("1->2", 1, 2, "uid"), ("rebalance", 2, 2, None)):
        before = COUNTERS.snapshot()
        local = reshard(local, src, dst, group_key=key)
        delta = COUNTERS.since(before)
        counts[name] = {tag: (c.collectives, c.bytes_sent, c.bytes_received) for tag, c in delta.tags.items()}
    # An empty shard whose key has another per-sample shape: the schemas' digests differ, the
    # ranks exchange their schemas, the non-empty shard's wins.
    odd = full[:4] if rank == 0 else TensorDict({"uid": groups[:0], "x": torch.zeros(0, 5)}, batch_size=[0])
    before = COUNTERS.snapshot()
    result = counts, reshard(odd, 2, 1)["x"].tolist(), COUNTERS.since(before).tags["reshard_meta"].collectives
    dist.destroy_process_group()
    return result


def test_reshard_counts_exactly_the_bytes_it_moves():
    results = run_workers(_counting_worker, 2, free_loopback_port(), nprocs=2)
    for rank in (0, 1):
        counts, odd_rows, odd_meta_collectives = results[rank]
        # DP 2 -> 1: each rank receives the other's 4 rows; metadata: the other's 16-byte header,
        # then its 2 group sizes (int64).
        assert counts["2->1"] == {"reshard_meta": (2, 16 + 16, 16 + 16), "reshard_rows": (1, 4 * ROW_BYTES, 4 * ROW_BYTES)}
        # DP 1 -> 2: rank 0 (the owner) sends shard 1's 4 rows to rank 1; rank 1 sends nothing. The
        # group sizes are padded to the owner's 4 groups (rank 1, not an owner, sends zeros).
        rows = (4 * ROW_BYTES, 0) if rank == 0 else (0, 4 * ROW_BYTES)
        assert counts["1->2"] == {"reshard_meta": (2, 16 + 32, 16 + 32), "reshard_rows": (1, *rows)}
        # Equal shards: nothing moves; single samples need the counts only.
        assert counts["rebalance"] == {"reshard_meta": (1, 16, 16), "reshard_rows": (1, 0, 0)}
        assert odd_rows == torch.arange(12.0).reshape(4, 3).tolist()
        assert odd_meta_collectives >= 2  # the headers, then the schemas (in one or two more collectives)


def _fewest_moves(counts: list[int]) -> int:
    """The fewest rows any even-out of ``counts`` into shards of ``n // d`` or ``n // d + 1`` rows
    moves, by trying every choice of the shards that get one more."""
    d = len(counts)
    base, extra = divmod(sum(counts), d)
    best_kept = max(sum(min(c, base + (k in plus)) for k, c in enumerate(counts))
                    for plus in map(set, itertools.combinations(range(d), extra)))
    return sum(counts) - best_kept


@pytest.mark.parametrize("seed", range(40))
def test_a_rebalance_moves_the_fewest_rows_and_keeps_global_order(seed):
    """Random unequal shards of single samples, with replicas (2 ranks per shard): every shard
    ends with n // d or n // d + 1 rows, every row lands in exactly one shard (every replica of
    it), in global order, and the rows that leave their shard are the fewest possible (equal
    contiguous cuts of the global order moved more, e.g. 6 instead of 4 for [0, 6, 6])."""
    rng = random.Random(seed)
    d = rng.randint(2, 5)
    counts = [rng.randint(0, 9) for _ in range(d)]
    world = 2 * d
    ranges = route([[1] * c for c in counts], world, d, d)
    offsets = list(itertools.accumulate([0, *counts]))
    base = sum(counts) // d
    holds = []
    for rank in range(world):
        rows = [offsets[k] + i for k in range(d) for i in range(*ranges[k][rank])]
        assert rows == sorted(rows) and base <= len(rows) <= base + 1
        holds.append(rows)
    assert all(holds[2 * k] == holds[2 * k + 1] for k in range(d))  # replicas hold the same rows
    assert sorted(row for k in range(d) for row in holds[2 * k]) == list(range(sum(counts)))
    moved = sum(stop - start for k in range(d) for j in range(d) if j != k for start, stop in [ranges[k][2 * j]])
    assert moved == _fewest_moves(counts)


def test_a_rebalance_gives_the_extra_rows_to_the_fullest_shards_ties_to_the_lower_index():
    """10 rows over 3 shards of 4, 2 and 4: targets 4, 3, 3 (shard 0, not shard 2, keeps its 4th
    row); the one row that moves is shard 2's last, to shard 1."""
    assert rebalance_ranges([4, 2, 4]) == [[(0, 4), (0, 0), (0, 0)],
                                            [(0, 0), (0, 2), (0, 0)],
                                            [(0, 0), (3, 4), (0, 3)]]


def test_a_rebalance_from_an_empty_shard_moves_only_the_surplus():
    ranges = route([[], [1] * 6, [1] * 6], 3, 3, 3)
    assert [ranges[k][0] for k in range(3)] == [(0, 0), (4, 6), (4, 6)]  # shard 0 gets the others' surplus
    assert [ranges[k][k] for k in range(3)] == [(0, 0), (0, 4), (0, 4)]  # they keep their first 4 rows
    assert ranges[1][2] == ranges[2][1] == (0, 0)


def _rebalance_worker(rank: int, world: int, port: int) -> list[float]:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    offsets, counts = [0, 0, 6], [0, 6, 6]
    x = torch.arange(offsets[rank], offsets[rank] + counts[rank], dtype=torch.float32)
    local = TensorDict({"x": x, "uid": x.long()}, batch_size=[counts[rank]])
    rows = reshard(local, 3, 3, group_key=None)["x"].tolist()
    dist.destroy_process_group()
    return rows


def test_a_rebalance_over_gloo_moves_the_surplus_rows():
    results = run_workers(_rebalance_worker, 3, free_loopback_port(), nprocs=3)
    assert [results[r] for r in range(3)] == [[4.0, 5.0, 10.0, 11.0], [0.0, 1.0, 2.0, 3.0], [6.0, 7.0, 8.0, 9.0]]


def _keyless_empty_worker(rank: int, world: int, port: int, group_key) -> tuple:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    if rank == 0:  # a filter that kept nothing and returned a batch without keys
        local = TensorDict({}, batch_size=[0])
    else:
        x = torch.arange(6, dtype=torch.float32)
        local = TensorDict({"x": x, "uid": torch.tensor([0, 0, 1, 1, 2, 2])}, batch_size=[6])
    out = reshard(local, 2, 2, group_key=group_key) if group_key is None else reshard(local, 2, 1, group_key=group_key)
    dist.destroy_process_group()
    return sorted(out.keys()), out["x"].tolist() if "x" in out.keys() else []


@pytest.mark.parametrize("group_key, expected", [
    (None, {0: (["uid", "x"], [3.0, 4.0, 5.0]), 1: (["uid", "x"], [0.0, 1.0, 2.0])}),  # rebalanced
    ("uid", {0: (["uid", "x"], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]), 1: (["uid", "x"], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])}),
], ids=["rebalance", "to-dp-1"])
def test_an_empty_shard_without_keys_takes_the_others_schema(group_key, expected):
    """The docstring's case (an empty shard whose batch lacks a key) failed on the empty rank in
    group_sizes / _pack ("'NoneType' object has no attribute 'numel'") before the schemas were
    exchanged, and its peer in gloo."""
    results = run_workers(_keyless_empty_worker, 2, free_loopback_port(), group_key, nprocs=2)
    assert {r: results[r] for r in range(2)} == expected


def _mismatched_worker(rank: int, world: int, port: int, case: str) -> str:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dtype = torch.float32 if rank == 0 or case != "dtypes" else torch.float64
    local = TensorDict({"uid": torch.arange(3) + 3 * rank, "x": torch.zeros(3, dtype=dtype)}, batch_size=[3])
    if case == "non-tensor":
        local.set_non_tensor("tag", "hello")
    try:
        reshard(local, 2, 1)
        message = "no error"
    except ValueError as err:
        message = str(err)
    dist.destroy_process_group()
    return message


@pytest.mark.parametrize("case, expected", [
    ("dtypes", "re-shard: shards disagree on their fields: [(('uid', torch.int64, ()), ('x', torch.float32, ()))"),
    ("non-tensor", "re-shard: 'tag' holds non-tensor data, which a re-shard cannot move"),
])
def test_shards_that_cannot_be_moved_are_refused_on_every_rank(case, expected):
    """Two dtypes of one key raised TypeError ('<' between torch.dtype objects) while the message was
    built; a non-tensor leaf was dropped from the batch without a word (a helper audit)."""
    results = run_workers(_mismatched_worker, 2, free_loopback_port(), case, nprocs=2)
    assert all(results[r].startswith(expected) for r in range(2)), results
