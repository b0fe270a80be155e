"""The training strategies' refusals (vla_rl/trainers/strategy.py)."""

from __future__ import annotations

import pytest
import torch

from policies import make_policy
from policies.mlp import MLPPolicyConfig
from vla_rl.trainers.strategy import DDPStrategy


def test_ddp_refuses_bfloat16_trainable_parameters(process_group):
    """Adam on bfloat16 weights loses small updates (no float32 master copy): FSDP keeps one."""
    policy = make_policy("mlp", MLPPolicyConfig(obs_dim=3, action_dim=2, hidden_sizes=(4,))).to(torch.bfloat16)
    with pytest.raises(ValueError, match="trainer.strategy=fsdp"):
        DDPStrategy(policy, None)
    policy.requires_grad_(False)  # nothing trains in bfloat16: accepted
    policy.log_std.requires_grad_(True)
    policy.log_std.data = policy.log_std.data.float()
    assert DDPStrategy(policy, None).trained is policy


@pytest.mark.parametrize("policy_name", ["mlp", "openvla", "openvla_oft", "pi0"])
def test_no_sharded_policy_returns_a_view(process_group, policy_name):
    """FSDP2 registers its pre-backward all-gather on the root's outputs; an in-place op on an
    output that is a view drops that hook, and FSDP2 warns of every such output (pyproject turns
    the warning into an error). The MLP's entropy of a one-observation batch and OFT's squeezed
    log-probs were views; one observation is the smallest micro-batch a rollout can give."""
    from test_actor import TINY_CONFIGS, rollout_batch

    from vla_rl.config import TrainerSection
    from vla_rl.trainers.strategy import FSDPStrategy
    from vla_rl_core import keys

    torch.manual_seed(0)
    policy = make_policy(policy_name, TINY_CONFIGS[policy_name]())
    batch = rollout_batch(policy)
    valid = batch[keys.RESPONSE_MASK]
    trained = FSDPStrategy(policy, None, TrainerSection(strategy="fsdp")).trained
    for rows in (1, 3):
        outputs = trained(batch[keys.OBS][:, :-1][valid][:rows], batch[keys.ACTIONS][valid][:rows])
        assert [out._is_view() for out in outputs] == [False, False]


def test_the_sharded_critic_returns_no_view(process_group):
    from vla_rl.config import TrainerSection
    from vla_rl.trainers.critic import ValueNetwork
    from vla_rl.trainers.strategy import FSDPStrategy

    network = ValueNetwork(3, [8], torch.zeros(3), torch.ones(3))
    trained = FSDPStrategy(network, None, TrainerSection(strategy="fsdp")).trained
    assert not trained(torch.randn(5, 3))._is_view()
