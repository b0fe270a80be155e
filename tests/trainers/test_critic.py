"""The critic: a zero-initialised value network regressed on returns by the DDP update."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from vla_rl.config import CriticSection, TrainerSection
from vla_rl.trainers.critic import CriticTrainer, ValueNetwork, embodied_values
from vla_rl_core import keys


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


def test_critic_follows_a_fixed_number_of_minibatches(process_group, device):
    """``trainer.ppo_num_mini_batches`` sets the critic's updates per epoch too."""
    n, steps, obs_dim = 12, 3, 4
    batch = TensorDict({keys.OBS: torch.randn(n, steps + 1, obs_dim), keys.RETURNS: torch.randn(n, steps),
                        keys.RESPONSE_MASK: torch.ones(n, steps, dtype=torch.bool)}, batch_size=[n])
    trainer = CriticTrainer(ValueNetwork(obs_dim, [8], torch.zeros(obs_dim), torch.ones(obs_dim)).to(device), lr=1e-3)
    batch.set(keys.VALUES, trainer.values(batch))
    settings = TrainerSection(ppo_epochs=2, ppo_mini_batch_size=1, ppo_num_mini_batches=3, max_grad_norm=1.0)
    metrics = trainer.update(batch, CriticSection(), settings, torch.Generator().manual_seed(0))
    assert metrics["critic/num_updates"] == 6.0  # not 2 x 12 (minibatches of one episode)


def test_critic_grad_norm_and_vf_loss_are_means_over_the_updates(process_group, device, monkeypatch):
    """``critic/grad_norm`` and ``critic/vf_loss``: the means of the updates' pre-clip gradient
    norms and losses (3 minibatches of 4 whole episodes, each one pass), not their sums."""
    from vla_rl.trainers.guard import GuardedStep

    norms: list[float] = []
    losses: list[float] = []
    real = GuardedStep.__call__

    def recorded(self, parameters, optimizer, max_grad_norm, max_skipped, loss):
        norm, applied = real(self, parameters, optimizer, max_grad_norm, max_skipped, loss)
        norms.append(float(norm))
        losses.append(float(loss.detach()))
        return norm, applied

    monkeypatch.setattr(GuardedStep, "__call__", recorded)
    torch.manual_seed(0)
    n, steps, obs_dim = 12, 3, 4
    batch = TensorDict({keys.OBS: torch.randn(n, steps + 1, obs_dim), keys.RETURNS: torch.randn(n, steps),
                        keys.RESPONSE_MASK: torch.ones(n, steps, dtype=torch.bool)}, batch_size=[n])
    trainer = CriticTrainer(ValueNetwork(obs_dim, [8], torch.zeros(obs_dim), torch.ones(obs_dim)).to(device), lr=1e-3)
    batch.set(keys.VALUES, trainer.values(batch))
    metrics = trainer.update(batch, CriticSection(cliprange_value=None, loss_agg_mode="token-mean"),
                             TrainerSection(ppo_epochs=1, ppo_mini_batch_size=4, max_grad_norm=1e-3),
                             torch.Generator().manual_seed(0))
    assert metrics["critic/num_updates"] == 3.0 and len(norms) == 3 and min(norms) > 1e-3  # clipped, pre-clip norms
    assert metrics["critic/grad_norm"] == pytest.approx(sum(norms) / 3, rel=1e-6)
    assert metrics["critic/vf_loss"] == pytest.approx(sum(losses) / 3, rel=1e-6)


def _camera_obs(state: torch.Tensor) -> TensorDict:
    """Camera observations around ``state`` ``(n, T + 1, obs_dim)``: an image and an instruction
    that the critic must not read."""
    n, steps = state.shape[:2]
    return TensorDict({
        keys.OBS_STATE: state,
        f"agentview{keys.OBS_IMAGE_SUFFIX}": torch.randint(0, 256, (n, steps, 8, 8, 3), dtype=torch.uint8),
        keys.OBS_INSTRUCTION: torch.randint(0, 256, (n, steps, 16), dtype=torch.uint8),
    }, batch_size=[n, steps])


def test_critic_values_camera_observations_from_their_state_alone(process_group, device):
    """With camera observations the value network reads ``obs/state`` before each decision:
    the values equal the network's layers applied to the normalised state by hand, whatever the
    image, and those of the same states given as flat observations."""
    torch.manual_seed(0)
    n, steps, obs_dim = 3, 4, 5
    state = torch.randn(n, steps + 1, obs_dim)
    mean, std = torch.randn(obs_dim), torch.rand(obs_dim) + 0.5
    network = ValueNetwork(obs_dim, [6], mean, std)
    torch.nn.init.normal_(network.net[2].weight)  # a non-zero head, so the values depend on the state
    torch.nn.init.normal_(network.net[2].bias)
    trainer = CriticTrainer(network.to(device), lr=1e-2)
    hidden, head = network.net[0], network.net[2]
    x = (state[:, :-1] - mean) / std  # (n, T, obs_dim)
    by_hand = (torch.tanh(x @ hidden.weight.T.cpu() + hidden.bias.cpu()) @ head.weight.T.cpu()
               + head.bias.cpu()).squeeze(-1)  # (n, T)
    camera = TensorDict({keys.OBS: _camera_obs(state)}, batch_size=[n])
    values = trainer.values(camera)
    assert values.shape == (n, steps) and values.device.type == "cpu"
    torch.testing.assert_close(values, by_hand)
    other_images = TensorDict({keys.OBS: _camera_obs(state)}, batch_size=[n])
    torch.testing.assert_close(trainer.values(other_images), values)
    assert torch.equal(trainer.values(TensorDict({keys.OBS: state}, batch_size=[n])), values)


def test_critic_regresses_on_returns_from_camera_observations(process_group, device):
    torch.manual_seed(1)
    n, steps, obs_dim = 16, 5, 4
    state = torch.randn(n, steps + 1, obs_dim)
    returns = state[:, :-1, 0] - 2.0 * state[:, :-1, 2]  # (n, T)
    mask = torch.ones(n, steps, dtype=torch.bool)
    trainer = CriticTrainer(ValueNetwork(obs_dim, [32], torch.zeros(obs_dim), torch.ones(obs_dim)).to(device), lr=1e-2)
    batch = TensorDict({keys.OBS: _camera_obs(state), keys.RETURNS: returns, keys.RESPONSE_MASK: mask}, batch_size=[n])
    batch.set(keys.VALUES, trainer.values(batch))
    metrics = trainer.update(batch, CriticSection(cliprange_value=None, loss_agg_mode="token-mean"),
                             TrainerSection(ppo_epochs=50, ppo_mini_batch_size=8, max_grad_norm=10.0),
                             torch.Generator().manual_seed(0))
    assert metrics["critic/num_updates"] == 100.0 and metrics["critic/skipped_updates"] == 0.0
    error_after = ((trainer.values(batch) - returns) ** 2).mean()
    assert error_after < 0.1 * (returns ** 2).mean()


def test_critic_values_run_micro_batches_of_rows(process_group, device):
    """``values(batch, micro_batch_size=2)``: at most 2 of the 5 rows per forward, the same values,
    on the CPU (the network on the test device: each micro-batch moves there and back)."""
    torch.manual_seed(0)
    network = ValueNetwork(3, [8], torch.zeros(3), torch.ones(3))
    torch.nn.init.normal_(network.net[-1].weight)  # not the zero head: values that differ per state
    network.to(device)
    rows = []

    def forward(net, mb):
        rows.append(mb.batch_size[0])
        return embodied_values(net, mb)

    trainer = CriticTrainer(network, lr=1e-3, forward=forward)
    batch = TensorDict({keys.OBS: torch.randn(5, 4, 3)}, batch_size=[5])
    whole = trainer.values(batch)
    assert rows == [5]
    torch.testing.assert_close(trainer.values(batch, micro_batch_size=2), whole, rtol=0, atol=1e-6)
    assert rows == [5, 2, 2, 1] and whole.shape == (5, 3) and whole.std() > 0 and whole.device.type == "cpu"
