"""Action protocols: the protocol, not the caller, decides greedy or sampled and the temperature."""

from __future__ import annotations

import torch

from policies import make_policy
from policies.mlp import MLPPolicyConfig
from vla_rl.config import EvalSection
from vla_rl.evaluation.protocol import Protocol, ProtocolPolicy, eval_protocols


def test_protocols_of_the_eval_section():
    protocols = eval_protocols(EvalSection(protocols=["sampled", "greedy"], temperature=0.7))
    assert protocols == [Protocol("sampled", False, 0.7), Protocol("greedy", True, 0.0)]
    assert [p.label for p in protocols] == ["sampled@0.7", "greedy"]


def test_protocol_policy_forwards_the_temperature():
    policy = make_policy("mlp", MLPPolicyConfig(obs_dim=3, action_dim=2, hidden_sizes=(4,)))
    obs = torch.randn(5, 3)
    sampled = ProtocolPolicy(policy, Protocol("sampled", False, 0.5))
    assert sampled.chunk_size == 1
    got = sampled.sample_actions(obs, greedy=True, generator=torch.Generator().manual_seed(1))
    want = policy.sample_actions(obs, generator=torch.Generator().manual_seed(1), temperature=0.5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    greedy, _ = ProtocolPolicy(policy, Protocol("greedy", True, 0.0)).sample_actions(obs, greedy=False)
    torch.testing.assert_close(greedy[:, 0], policy.action_mean(obs), rtol=0, atol=0)
