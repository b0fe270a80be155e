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
