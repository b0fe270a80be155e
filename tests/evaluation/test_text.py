"""How the held-out prompts are dealt over workers whose shards differ in size."""

import pytest

from vla_rl.evaluation.text import eval_quotas


@pytest.mark.parametrize(
    ("num_episodes", "shard_sizes", "expected"),
    [
        (50, [32, 18], [32, 18]),  # 50 rows in row groups of 16: the short shard is used up
        (40, [32, 18], [22, 18]),
        (43, [32, 18], [25, 18]),
        (51, [100, 100], [26, 25]),  # exactly the number asked, not ceil(51 / 2) * 2
        (256, [128, 128], [128, 128]),
        (10, [0, 7, 7], [0, 5, 5]),
        (100, [3, 4], [3, 4]),  # fewer rows than asked: all of them
        (0, [5, 5], [0, 0]),
    ],
)
def test_quotas_reach_the_number_asked_within_each_shard(num_episodes, shard_sizes, expected):
    quotas = eval_quotas(num_episodes, shard_sizes)
    assert quotas == expected
    assert sum(quotas) == min(num_episodes, sum(shard_sizes))
    assert all(q <= s for q, s in zip(quotas, shard_sizes))
