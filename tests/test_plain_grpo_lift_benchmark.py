"""benchmarks/plain_grpo_lift.py, the plain loop the engine is compared with: its per-episode
loss is the engine's PPO-clip objective (action ratios, seq-mean-token-mean) on the same episodes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from policies.mlp import MLPPolicy, MLPPolicyConfig
from vla_rl.algorithms.policy_loss import POLICY_LOSSES, PPOClipConfig

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "plain_grpo_lift.py"


def load_script():
    spec = importlib.util.spec_from_file_location("plain_grpo_lift", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_plain_loss_is_the_engines_ppo_clip_objective():
    plain = load_script()
    torch.manual_seed(0)
    policy = MLPPolicy(MLPPolicyConfig(obs_dim=4, action_dim=3, hidden_sizes=(8,)))
    lengths, advantages = [5, 2, 7], [1.3, -0.4, -0.9]
    episodes = []
    for length in lengths:
        obs = torch.randn(length, 4)
        actions, log_probs = policy.sample_actions(obs)
        episodes.append((obs, actions[:, 0], log_probs[:, 0]))
    episodes[2] = (*episodes[2][:2], episodes[2][2] - 6.0)  # ratios above 3 at A < 0: the dual clip acts
    with torch.no_grad():  # move the policy so that ratios differ from 1 and some are clipped
        for parameter in policy.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    plain_loss = torch.stack([plain.episode_loss(policy, ep, adv)[0] for ep, adv in zip(episodes, advantages)]).mean()

    horizon = max(lengths)
    log_probs = torch.zeros(3, horizon)
    old = torch.zeros(3, horizon)
    mask = torch.zeros(3, horizon, dtype=torch.bool)
    for i, (obs, actions, old_log_probs) in enumerate(episodes):
        per_dim = policy.log_prob_and_entropy_per_dim(obs, actions[:, None, :])[0]
        log_probs[i, : len(obs)] = per_dim.sum(-1)[:, 0]
        old[i, : len(obs)] = old_log_probs
        mask[i, : len(obs)] = True
    config = PPOClipConfig(clip_ratio_low=plain.CLIP_LOW, clip_ratio_high=plain.CLIP_HIGH)
    engine_loss, metrics = POLICY_LOSSES.get("ppo_clip")(log_probs, old, torch.tensor(advantages), mask, config,
                                                         "seq-mean-token-mean")
    assert metrics["pg_clipfrac"] > 0 and metrics["pg_clipfrac_lower"] > 0  # the case exercises both clips
    torch.testing.assert_close(plain_loss, engine_loss, rtol=1e-5, atol=1e-6)
