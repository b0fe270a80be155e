"""Group filters: DAPO's zero-variance (dynamic sampling) criterion and the success-rate band."""

import pytest
import torch

from vla_rl.algorithms.group_filters import (
    in_success_rate_band,
    keep_groups,
    zero_variance_groups,
)


def test_zero_variance_flags_whole_all_equal_groups():
    # group 4 varies, group 9 is constant (0.3 three times), group 2 varies
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.3, 0.3, 0.3, 1.0, 0.0])
    uids = torch.tensor([4, 4, 4, 9, 9, 9, 2, 2])
    assert zero_variance_groups(rewards, uids).tolist() == [False] * 3 + [True] * 3 + [False] * 2


def test_zero_variance_flags_singletons_and_respects_the_tolerance():
    assert zero_variance_groups(torch.tensor([0.7]), torch.tensor([1])).tolist() == [True]
    close = torch.tensor([0.5, 0.5 + 1e-9], dtype=torch.float64)
    assert zero_variance_groups(close, torch.tensor([1, 1])).tolist() == [True, True]
    assert zero_variance_groups(close, torch.tensor([1, 1]), tolerance=0.0).tolist() == [False, False]


def test_success_rate_band_keeps_groups_inside_inclusive_bounds():
    # group 1: 0/4, group 2: 1/4, group 3: 4/4, group 5: 3/4 (rates 0, .25, 1, .75)
    success = torch.tensor([0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 1], dtype=torch.bool)
    uids = torch.tensor([1] * 4 + [2] * 4 + [3] * 4 + [5] * 4)
    keep = in_success_rate_band(success, uids, 0.1, 0.9)
    assert keep.tolist() == [False] * 4 + [True] * 4 + [False] * 4 + [True] * 4
    assert in_success_rate_band(success, uids, 0.25, 0.75).tolist() == keep.tolist()
    assert not in_success_rate_band(success, uids, 0.26, 0.74).any()


def test_band_of_one_over_g_is_the_zero_variance_filter_on_binary_success():
    success = torch.tensor([False, False, True, True, True, True, False, True, False])
    uids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    band = in_success_rate_band(success, uids, 1 / 3, 2 / 3)
    varied = ~zero_variance_groups(success.float(), uids)
    assert band.tolist() == varied.tolist() == [True] * 3 + [False] * 3 + [True] * 3


@pytest.mark.parametrize(
    ("filter_zero_variance", "band", "expected"),
    [
        (False, None, [True] * 9),
        (True, None, [True] * 3 + [False] * 3 + [True] * 3),
        (False, (0.5, 1.0), [False] * 3 + [True] * 3 + [False] * 3),
        (True, (0.5, 1.0), [False] * 9),  # both must pass
    ],
)
def test_keep_groups_composes_the_enabled_filters(filter_zero_variance, band, expected):
    # group 0: rewards vary, 1/3 success; group 1: all equal, all succeed; group 2: vary, 1/3
    rewards = torch.tensor([0.0, 0.2, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.5])
    success = torch.tensor([False, False, True, True, True, True, False, True, False])
    uids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    assert keep_groups(rewards, success, uids, filter_zero_variance, band).tolist() == expected


def test_invalid_inputs_raise():
    with pytest.raises(ValueError, match="uids"):
        zero_variance_groups(torch.zeros(2), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="success"):
        in_success_rate_band(torch.zeros(2), torch.zeros(2, dtype=torch.int64), 0.1, 0.9)


def test_the_zero_variance_filter_on_success_is_dapos_accuracy_filter():
    """DAPO keeps a prompt when 0 < correct < G (eq. 11; verl's filter_groups.metric=acc). With its
    overlong penalty, an all-wrong group of different lengths (group 0) and an all-right group
    with one long answer (group 1) have rewards that differ: the rewards metric keeps them, the
    success metric drops them; a mixed group (2) passes both."""
    rewards = torch.tensor([0.0, -0.5, -1.0, 1.0, 1.0, 0.75, 1.0, 0.0, -0.25])
    success = torch.tensor([False, False, False, True, True, True, True, False, False])
    uids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    assert keep_groups(rewards, success, uids, True, None, "rewards").tolist() == [True] * 9
    assert keep_groups(rewards, success, uids, True, None, "success").tolist() == [False] * 6 + [True] * 3
    with pytest.raises(ValueError, match="zero_variance_metric must be 'rewards' or 'success', got 'acc'"):
        keep_groups(rewards, success, uids, True, None, "acc")


def test_zero_variance_default_tolerance_is_one_in_a_million_and_inclusive():
    uids = torch.tensor([1, 1])
    assert zero_variance_groups(torch.tensor([0.0, 5e-7], dtype=torch.float64), uids).tolist() == [True, True]
    assert zero_variance_groups(torch.tensor([0.0, 1e-4], dtype=torch.float64), uids).tolist() == [False, False]
    # max - min equal to the tolerance counts as all equal (0.5 is exact in float64)
    half = torch.tensor([0.0, 0.5], dtype=torch.float64)
    assert zero_variance_groups(half, uids, tolerance=0.5).tolist() == [True, True]


def test_zero_variance_on_negative_rewards():
    # group 0 is constant at -1, group 1 varies below 0
    rewards = torch.tensor([-1.0, -1.0, -2.0, -3.0])
    assert zero_variance_groups(rewards, torch.tensor([0, 0, 1, 1])).tolist() == [True, True, False, False]
