"""SRPO world-progress reward on small embeddings whose clusters and distances are worked out by
hand; the expected rewards are ``0.6 * sigmoid(10 * (0.5 - n))`` evaluated here with numpy."""

import dataclasses

import numpy as np
import pytest
import torch

from vla_rl.algorithms.srpo import (
    SRPORewardConfig,
    compute_srpo_rewards,
    dbscan_cluster_labels,
    standardize_features,
)


def sigmoid_reward(normalized_distances) -> np.ndarray:
    """The SRPO reference mapping with its default constants s=0.6, k=10, b=0.5."""
    n = np.asarray(normalized_distances, dtype=np.float64)
    return 0.6 / (1.0 + np.exp(-10.0 * (0.5 - n)))


def srpo(points, success, task_ids=None, **config_fields) -> np.ndarray:
    embeddings = torch.tensor(points, dtype=torch.float32)
    task_ids = [0] * len(points) if task_ids is None else task_ids
    rewards = compute_srpo_rewards(embeddings, torch.tensor(success),
                                   torch.tensor(task_ids, dtype=torch.int64),
                                   SRPORewardConfig(**config_fields))
    assert rewards.dtype == torch.float32 and rewards.shape == (len(points),)
    return rewards.numpy()


def test_two_clusters_noise_excluded_min_distance_by_hand():
    # Successes: cluster A {(0,0), (0,0.5)} -> centre (0,0.25); cluster B {(10,0), (10,0.5)}
    # -> centre (10,0.25); (5,20) is > eps from everything: DBSCAN noise, no centre.
    successes = [[0, 0], [0, 0.5], [10, 0], [10, 0.5], [5, 20]]
    # Failures: 3 from A; 6 from B; sqrt(5^2 + 15^2) from either (4.75 if noise were a centre).
    failures = [[0, 3.25], [10, 6.25], [5, 15.25]]
    rewards = srpo(successes + failures, [True] * 5 + [False] * 3,
                   standardize_embeddings=False, dbscan_eps=1.0)
    distances = np.array([3.0, 6.0, np.sqrt(250.0)])
    normalized = (distances - distances.min()) / (distances.max() - distances.min())
    np.testing.assert_array_equal(rewards[:5], np.ones(5, dtype=np.float32))
    np.testing.assert_allclose(rewards[5:], sigmoid_reward(normalized), rtol=1e-5)


@pytest.mark.parametrize(
    ("standardize", "centres"),
    [
        # Standardised y has std ~5.009, so the 0.6 gaps shrink to ~0.12 < eps = 0.5: two
        # clusters, centres y = 0.3 and y = 10.3.
        (True, [0.3, 10.3]),
        # Raw gaps 0.6 > eps = 0.5: every success is noise; fallback centre is their mean 5.3.
        (False, [5.3]),
    ],
)
def test_standardisation_before_dbscan(standardize, centres):
    success_y = np.array([0.0, 0.6, 10.0, 10.6])
    assert 0.6 / success_y.std() < 0.5  # the hand reasoning above
    failure_y = np.array([2.3, 7.3, 5.3])
    points = [[0.0, y] for y in np.concatenate([success_y, failure_y])]  # x constant: unscaled
    rewards = srpo(points, [True] * 4 + [False] * 3, standardize_embeddings=standardize)
    distances = np.min(np.abs(failure_y[:, None] - np.array(centres)[None, :]), axis=1)
    normalized = (distances - distances.min()) / (distances.max() - distances.min())
    np.testing.assert_allclose(rewards[4:], sigmoid_reward(normalized), rtol=1e-5)


def test_closer_failure_gets_higher_reward():
    successes = [[0.0, 0.0], [0.0, 0.1], [0.1, 0.0]]
    failures = [[3.0, 0.0], [0.0, 1.0], [5.0, 5.0], [0.0, 2.0]]  # distances ~3, 1, 7, 2
    rewards = srpo(successes + failures, [True] * 3 + [False] * 4)[3:]
    assert list(np.argsort(-rewards)) == [1, 3, 0, 2]


def test_successes_exactly_one_failures_strictly_inside_unit_interval():
    generator = np.random.default_rng(0)
    points = generator.normal(size=(24, 5))
    success = list(generator.random(24) < 0.4)
    task_ids = [i % 3 for i in range(24)]
    for task in range(3):  # every task holds a success and a failure
        success[task], success[task + 3] = True, False
    rewards = srpo(points, success, task_ids)
    is_success = np.array(success)
    assert np.all(rewards[is_success] == 1.0)
    assert np.all((rewards[~is_success] > 0.0) & (rewards[~is_success] < 1.0))


def test_tasks_are_independent():
    task_a = [[0, 0], [0, 0.2], [1, 1], [3, 0], [0, 5]]
    success_a = [True, True, False, False, False]
    alone = srpo(task_a, success_a)
    # Interleave task 1 (other scale, closer failures) with task 0: task 0 is unchanged.
    task_b = [[100, 100], [101, 100], [100, 102]]
    mixed_points = [task_a[0], task_b[0], task_a[1], task_a[2], task_b[1], task_a[3],
                    task_b[2], task_a[4]]
    mixed_success = [True, True, True, False, False, False, False, False]
    mixed_tasks = [0, 1, 0, 0, 1, 0, 1, 0]
    mixed = srpo(mixed_points, mixed_success, mixed_tasks)
    np.testing.assert_array_equal(mixed[[0, 2, 3, 5, 7]], alone)


def test_task_without_success_gives_failures_zero():
    points = [[0, 0], [1, 0], [0, 0], [5, 5], [6, 6]]
    success = [False, False, True, False, False]
    rewards = srpo(points, success, task_ids=[4, 4, 9, 9, 9])
    assert rewards[0] == 0.0 and rewards[1] == 0.0
    assert rewards[2] == 1.0
    assert 0.0 < rewards[3] < 1.0 and 0.0 < rewards[4] < 1.0


def test_degenerate_distance_range_gives_midpoint_reward():
    # One failure, or failures all equally far: normalised distance 0.5 -> 0.6 * sigmoid(0) = 0.3.
    single = srpo([[0, 0], [0, 0.1], [4, 4]], [True, True, False])
    assert single[2] == pytest.approx(0.3)
    ring = srpo([[0, 0], [0, 0], [3, 4], [-3, 4], [5, 0]], [True, True, False, False, False],
                standardize_embeddings=False)
    np.testing.assert_allclose(ring[2:], [0.3, 0.3, 0.3], rtol=1e-6)
    # a tolerance of 0, which the config accepts: a single failure's span of 0 divided 0 by 0 (NaN)
    exact = srpo([[0, 0], [1, 0], [3, 1]], [True, True, False], degenerate_range_tolerance=0.0)
    assert exact[2] == pytest.approx(0.3)
    spread = srpo([[0, 0], [0, 0], [3, 4], [6, 8]], [True, True, False, False], standardize_embeddings=False,
                  degenerate_range_tolerance=0.0)  # distances 5 and 10: normalised 0 and 1
    np.testing.assert_allclose(spread[2:], sigmoid_reward([0.0, 1.0]), rtol=1e-6)


def test_dbscan_core_border_noise_by_hand():
    # eps = 1, min_samples = 3: point 1 has {0, 1, 2} within eps -> core; 0 and 2 have two
    # points each -> border of point 1's cluster; 10 is noise; {20, 20.5, 21} a second cluster.
    points = np.array([[0.0], [1.0], [2.0], [10.0], [20.0], [20.5], [21.0]])
    labels = dbscan_cluster_labels(points, eps=1.0, min_samples=3)
    np.testing.assert_array_equal(labels, [0, 0, 0, -1, 1, 1, 1])


def test_standardize_features_by_hand():
    points = np.array([[1.0, 7.0], [3.0, 7.0]])  # column 1 constant: centred, not scaled
    np.testing.assert_allclose(standardize_features(points), [[-1.0, 0.0], [1.0, 0.0]])


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("dbscan_eps", 0.0, "dbscan_eps"), ("dbscan_min_samples", 0, "dbscan_min_samples"),
     ("sigmoid_steepness", -1.0, "sigmoid_steepness"), ("sigmoid_offset", 1.5, "sigmoid_offset"),
     ("failure_reward_scale", 1.0, "failure_reward_scale"),
     ("degenerate_range_tolerance", -1.0, "degenerate_range_tolerance"),
     # 0.6 * sigmoid(-150) underflows float32 to 0: a failure could tie a task without success.
     ("sigmoid_steepness", 300.0, "float32")],
)
def test_config_rejects_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(SRPORewardConfig(), **{field: value})


def test_invalid_inputs_raise():
    config = SRPORewardConfig()
    with pytest.raises(ValueError, match="success"):
        compute_srpo_rewards(torch.zeros(2, 3), torch.tensor([1, 0]),
                             torch.zeros(2, dtype=torch.int64), config)
    with pytest.raises(ValueError, match="NaN"):
        compute_srpo_rewards(torch.full((2, 3), float("nan")), torch.tensor([True, False]),
                             torch.zeros(2, dtype=torch.int64), config)


class _EncodedOnCuda(torch.Tensor):
    """CPU data that reports ``cuda:0`` as its device, as a GPU trajectory encoder's embeddings do:
    anything placed on ``embeddings.device`` fails on a CPU-only torch."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def test_rewards_follow_the_batch_device_not_the_encoders():
    # The policy_backbone / vjepa2 encoders embed on the GPU; the rewards join the (CPU) batch.
    embeddings = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 3.0]]).as_subclass(_EncodedOnCuda)
    assert embeddings.device.type == "cuda"
    success = torch.tensor([True, False, False])
    rewards = compute_srpo_rewards(embeddings, success, torch.zeros(3, dtype=torch.int64), SRPORewardConfig())
    assert rewards.device == success.device and type(rewards) is torch.Tensor
    assert rewards[0] == 1.0 and 0.0 < rewards[2] < rewards[1] < 1.0
