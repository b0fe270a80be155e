import numpy as np
import pytest
import torch

from vla_rl.data.task_loader import ShardedTaskLoader


def test_shards_are_disjoint_and_cover_the_step():
    loaders = [ShardedTaskLoader(100, 8, r, 2, seed=3) for r in range(2)]
    seen = set()
    for step in range(loaders[0].steps_per_epoch):
        batches = [loader.batch_for_step(step) for loader in loaders]
        ids = [set(b["init_state_id"].tolist()) for b in batches]
        assert len(ids[0]) == len(ids[1]) == 4 and not ids[0] & ids[1]
        assert set(np.concatenate([b["uid"].numpy() for b in batches])) == set(range(8))
        seen |= ids[0] | ids[1]
    # One epoch visits 96 distinct ids of the 100 (12 steps x 8).
    assert len(seen) == 96 and max(seen) < 100


def test_reproducible_and_epochs_differ():
    a = ShardedTaskLoader(50, 10, 0, 1, seed=0)
    b = ShardedTaskLoader(50, 10, 0, 1, seed=0)
    assert a.batch_for_step(3)["init_state_id"].tolist() == b.batch_for_step(3)["init_state_id"].tolist()
    assert a.batch_for_step(0)["init_state_id"].tolist() != a.batch_for_step(5)["init_state_id"].tolist()


def test_rejects_indivisible_step():
    with pytest.raises(ValueError, match="multiple of the data node's DP size"):
        ShardedTaskLoader(100, 7, 0, 2, seed=0)


def test_refill_rounds_are_fresh_disjoint_reproducible_and_uniquely_grouped():
    loaders = [ShardedTaskLoader(1000, 4, dp_rank=r, dp_size=2, seed=3) for r in range(2)]
    step = [loader.batch_for_step(5) for loader in loaders]
    first = [loader.batch_for_refill(5, 1) for loader in loaders]
    second = [loader.batch_for_refill(5, 2) for loader in loaders]
    ids = [set(b["init_state_id"].tolist()) for b in first]
    assert not ids[0] & ids[1]  # shards of one round are disjoint
    assert first[0]["init_state_id"].tolist() != second[0]["init_state_id"].tolist()
    assert torch.equal(loaders[0].batch_for_refill(5, 1)["init_state_id"], first[0]["init_state_id"])
    uids = torch.cat([b["uid"] for b in step + first + second]).tolist()
    assert len(set(uids)) == len(uids) == 12
    with pytest.raises(ValueError, match="from 1"):
        loaders[0].batch_for_refill(5, 0)


# --- task sets ---------------------------------------------------------------------------------


def task_set_loaders(num_tasks=5, groups=20, dp_size=2, num_init_states=40, seed=1):
    return [ShardedTaskLoader(num_init_states, groups, r, dp_size, seed=seed, num_tasks=num_tasks)
            for r in range(dp_size)]


def test_a_task_set_step_draws_every_task_equally_and_rows_keep_their_task():
    loaders = task_set_loaders()  # 5 tasks x 4 rounds, 10 groups per shard
    layout = None
    for step in range(3):
        batches = [loader.batch_for_step(step) for loader in loaders]
        tasks = torch.cat([b["task_id"] for b in batches])
        assert torch.bincount(tasks).tolist() == [4] * 5  # every task, as often, every step
        # each shard covers every task (10 groups per shard, a multiple of 5)
        assert all(set(b["task_id"].tolist()) == set(range(5)) for b in batches)
        # the same task in the same row of the same shard, every step (a simulator slot keeps its task)
        rows = [b["task_id"].tolist() for b in batches]
        assert layout is None or rows == layout
        layout = rows
        assert sorted(torch.cat([b["uid"] for b in batches]).tolist()) == list(range(20))


def test_each_task_goes_through_its_own_permutation_of_initial_states():
    loaders = task_set_loaders()  # 4 states of each task per step: an epoch is 10 steps
    assert loaders[0].steps_per_epoch == 10
    seen: dict[int, list[int]] = {task: [] for task in range(5)}
    for step in range(10):
        for loader in loaders:
            batch = loader.batch_for_step(step)
            for task, state in zip(batch["task_id"].tolist(), batch["init_state_id"].tolist()):
                seen[task].append(state)
    # one epoch visits every state of every task exactly once, in an order of the task's own
    assert all(sorted(states) == list(range(40)) for states in seen.values())
    assert seen[0] != seen[1]
    again = task_set_loaders()[1].batch_for_step(4)
    assert torch.equal(again["init_state_id"], loaders[1].batch_for_step(4)["init_state_id"])


def test_task_set_refills_keep_the_layout_with_fresh_states():
    loaders = task_set_loaders()
    step = [loader.batch_for_step(2) for loader in loaders]
    refill = [loader.batch_for_refill(2, 1) for loader in loaders]
    for s, r in zip(step, refill):
        assert torch.equal(s["task_id"], r["task_id"])
    uids = torch.cat([b["uid"] for b in step + refill]).tolist()
    assert len(set(uids)) == len(uids) == 40
    for task in range(5):  # the shards of a round never share a state of a task
        states = [set(b["init_state_id"][b["task_id"] == task].tolist()) for b in refill]
        assert not states[0] & states[1]
    second = [loader.batch_for_refill(2, 2) for loader in loaders]  # another round: other states (it drew round 1's)
    assert not all(torch.equal(a["init_state_id"], b["init_state_id"]) for a, b in zip(refill, second))
    assert len(set(torch.cat([b["uid"] for b in step + refill + second]).tolist())) == 60


def test_a_task_set_needs_a_multiple_of_its_tasks_per_step():
    with pytest.raises(ValueError, match="multiple of the 3 tasks"):
        ShardedTaskLoader(100, 8, 0, 2, seed=0, num_tasks=3)
    with pytest.raises(ValueError, match="exceeds"):
        ShardedTaskLoader(3, 8, 0, 2, seed=0, num_tasks=2)  # 4 states of each task, 3 exist
