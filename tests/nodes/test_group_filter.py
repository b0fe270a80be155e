import torch

from vla_rl.nodes.group_filter import zero_variance_groups


def test_zero_variance_groups_flags_whole_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.3, 0.3, 0.3, 1.0, 0.0])
    uids = torch.tensor([4, 4, 4, 9, 9, 9, 2, 2])
    # group 4 varies, group 9 is constant, group 2 varies
    assert zero_variance_groups(rewards, uids).tolist() == [False] * 3 + [True] * 3 + [False] * 2


def test_singleton_groups_have_zero_variance():
    assert zero_variance_groups(torch.tensor([0.7]), torch.tensor([1])).tolist() == [True]
