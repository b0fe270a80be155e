"""The EMBODIED_REWARDS registry: common signature, binary success reward, SRPO entry."""

import pytest
import torch

from vla_rl.algorithms.rewards import EMBODIED_REWARDS
from vla_rl.algorithms.srpo import SRPORewardConfig

SUCCESS = torch.tensor([True, False, True, False])
TASK_IDS = torch.tensor([0, 0, 1, 1])
EMBEDDINGS = torch.tensor([[0.0, 0.0], [1.0, 0.0], [5.0, 5.0], [5.0, 7.0]])


def test_registry_names():
    assert EMBODIED_REWARDS.names() == ["srpo", "success"]


@pytest.mark.parametrize("name", ["success", "srpo"])
def test_common_contract(name):
    rewards = EMBODIED_REWARDS.get(name)(EMBEDDINGS, SUCCESS, TASK_IDS, SRPORewardConfig())
    assert rewards.shape == (4,) and rewards.dtype == torch.float32
    assert torch.equal(rewards[SUCCESS], torch.ones(2))
    assert bool(((rewards >= 0) & (rewards < 1))[~SUCCESS].all())


def test_success_reward_is_binary_and_needs_no_embeddings():
    rewards = EMBODIED_REWARDS.get("success")(None, SUCCESS, TASK_IDS, None)
    assert torch.equal(rewards, torch.tensor([1.0, 0.0, 1.0, 0.0]))


def test_srpo_reward_requires_embeddings():
    with pytest.raises(ValueError, match="embeddings"):
        EMBODIED_REWARDS.get("srpo")(None, SUCCESS, TASK_IDS, SRPORewardConfig())
