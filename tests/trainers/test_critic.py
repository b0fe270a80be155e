"""The critic: a zero-initialised value network regressed on returns by the DDP update."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from vla_rl.config import CriticSection, TrainerSection
from vla_rl.data import keys
from vla_rl.trainers.critic import CriticTrainer, ValueNetwork


def test_critic_starts_at_zero_and_regresses_on_returns(process_group, device):
    torch.manual_seed(0)
    n, steps, obs_dim = 16, 5, 4
    obs = torch.randn(n, steps + 1, obs_dim)
    returns = 2.0 * obs[:, :-1, 0] - obs[:, :-1, 1]  # (n, T), a target the network can fit
    mask = torch.arange(steps)[None, :] < torch.randint(1, steps + 1, (n, 1))  # ragged episodes
    trainer = CriticTrainer(ValueNetwork(obs_dim, [32], torch.zeros(obs_dim), torch.ones(obs_dim)).to(device),
                            lr=1e-2)
    batch = TensorDict({keys.OBS: obs, keys.RETURNS: returns, keys.RESPONSE_MASK: mask}, batch_size=[n])
    values = trainer.values(batch)
    assert torch.equal(values, torch.zeros(n, steps))
    batch.set(keys.VALUES, values)
    critic = CriticSection(cliprange_value=None, loss_agg_mode="token-mean")
    metrics = trainer.update(batch, critic, TrainerSection(ppo_epochs=50, ppo_mini_batch_size=8, max_grad_norm=10.0),
                             torch.Generator().manual_seed(0))
    assert metrics["critic/num_updates"] == 100.0
    error_before = (returns[mask] ** 2).mean()
    error_after = ((trainer.values(batch) - returns)[mask] ** 2).mean()
    assert error_after < 0.1 * error_before
