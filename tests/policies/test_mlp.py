"""Tests for policies/mlp: the Gaussian against hand-written formulas, buffers, config checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from policies.mlp import MLPPolicy, MLPPolicyConfig
from policies.mlp.modeling_mlp import BatchInvariantLinear

W1 = np.array([[0.5, -0.3], [0.2, 0.8], [-0.7, 0.1]])  # (hidden 3, obs 2)
B1 = np.array([0.1, -0.2, 0.05])
W2 = np.array([[0.4, -0.6, 0.3], [-0.2, 0.5, 0.9]])  # (action 2, hidden 3)
B2 = np.array([0.02, -0.01])
STD = np.array([0.3, 0.15])
OBS_MEAN = np.array([0.5, -1.0])
OBS_STD = np.array([2.0, 0.5])


@pytest.fixture
def tiny():
    policy = MLPPolicy(MLPPolicyConfig(obs_dim=2, action_dim=2, hidden_sizes=(3,)))
    with torch.no_grad():
        policy.mean_net[0].weight.copy_(torch.tensor(W1))
        policy.mean_net[0].bias.copy_(torch.tensor(B1))
        policy.mean_net[2].weight.copy_(torch.tensor(W2))
        policy.mean_net[2].bias.copy_(torch.tensor(B2))
        policy.log_std.copy_(torch.tensor(np.log(STD)))
    policy.set_obs_normalization(OBS_MEAN, OBS_STD)
    return policy


def numpy_mean(obs: np.ndarray) -> np.ndarray:
    hidden = np.tanh(((obs - OBS_MEAN) / OBS_STD) @ W1.T + B1)
    return hidden @ W2.T + B2


def test_log_density_and_entropy_match_formulas(tiny):
    obs = np.array([[0.3, -0.9], [1.5, 0.2]])
    actions = np.array([[0.1, -0.4], [1.3, 0.7]])  # 1.3 lies outside [-1, 1]: still a density
    log_probs, entropy = tiny.log_prob_and_entropy(
        torch.tensor(obs, dtype=torch.float32), torch.tensor(actions, dtype=torch.float32)[:, None]
    )
    mean = numpy_mean(obs)
    for b in range(2):
        expected = sum(
            -((actions[b, d] - mean[b, d]) ** 2) / (2 * STD[d] ** 2)
            - math.log(STD[d] * math.sqrt(2 * math.pi))
            for d in range(2)
        )
        assert log_probs[b, 0].item() == pytest.approx(expected, abs=1e-5)
    expected_entropy = sum(0.5 * math.log(2 * math.pi * math.e * s**2) for s in STD)
    expected_entropy = np.full((2, 1), expected_entropy)
    np.testing.assert_allclose(entropy.detach().numpy(), expected_entropy, atol=1e-6)


def test_greedy_is_the_mean(tiny):
    obs = np.array([[0.3, -0.9], [1.5, 0.2], [0.0, 0.0]])
    actions, log_probs = tiny.sample_actions(torch.tensor(obs, dtype=torch.float32), greedy=True)
    np.testing.assert_allclose(actions[:, 0].numpy(), numpy_mean(obs), atol=1e-6)
    expected = -np.sum(np.log(STD) + 0.5 * np.log(2 * np.pi))
    np.testing.assert_allclose(log_probs.numpy(), np.full((3, 1), expected), atol=1e-5)


def test_samples_have_the_configured_spread(tiny):
    obs = torch.zeros(4000, 2)
    actions, _ = tiny.sample_actions(obs, generator=torch.Generator().manual_seed(0))
    noise = actions[:, 0] - torch.tensor(numpy_mean(np.zeros((1, 2))), dtype=torch.float32)
    np.testing.assert_allclose(noise.std(dim=0).numpy(), STD, rtol=0.05)
    np.testing.assert_allclose(noise.mean(dim=0).numpy(), 0.0, atol=0.02)


def test_normalization_buffers_are_saved(tiny):
    state = tiny.state_dict()
    np.testing.assert_allclose(state["obs_mean"].numpy(), OBS_MEAN)
    np.testing.assert_allclose(state["obs_std"].numpy(), OBS_STD)
    fresh = MLPPolicy(tiny.config)
    fresh.load_state_dict(state)
    obs = torch.tensor([[0.3, -0.9]])
    torch.testing.assert_close(fresh.action_mean(obs), tiny.action_mean(obs))


@pytest.mark.parametrize(
    ("mean", "std", "message"),
    [
        (np.zeros(3), np.ones(3), "shape"),
        (np.zeros(2), np.array([1.0, 0.0]), r"features \[1\]"),
        (np.array([np.nan, 0.0]), np.ones(2), "finite"),
    ],
)
def test_bad_normalization_raises(tiny, mean, std, message):
    with pytest.raises(ValueError, match=message):
        tiny.set_obs_normalization(mean, std)


def test_bc_loss_trains_the_mean_only(tiny):
    obs = torch.tensor([[0.3, -0.9], [1.5, 0.2]])
    expert = torch.tensor([[[0.5, 0.5]], [[-0.5, 0.1]]])
    loss = tiny.bc_loss(obs, expert)
    expected = np.mean((numpy_mean(obs.double().numpy()) - expert[:, 0].double().numpy()) ** 2)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    assert tiny.log_std.grad is None
    assert tiny.mean_net[0].weight.grad is not None


def test_std_floor_and_fixed_std():
    policy = MLPPolicy(MLPPolicyConfig(obs_dim=2, action_dim=2, min_std=0.05))
    with torch.no_grad():
        policy.log_std.fill_(math.log(0.001))
    np.testing.assert_allclose(policy.action_std().detach().numpy(), [0.05, 0.05], rtol=1e-6)

    fixed = MLPPolicy(MLPPolicyConfig(obs_dim=2, action_dim=2, init_std=0.3, learn_std=False))
    assert "log_std" not in dict(fixed.named_parameters())
    assert "log_std" in fixed.state_dict()
    np.testing.assert_allclose(fixed.action_std().numpy(), [0.3, 0.3], rtol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"obs_dim": 0}, "obs_dim must be a positive int"),
        ({"action_dim": True}, "action_dim must be a positive int"),
        ({"hidden_sizes": (64, 0)}, "hidden_sizes must be positive ints"),
        ({"activation": "swish"}, "activation 'swish' is unknown; use one of tanh"),
        ({"learn_std": 1}, "learn_std must be a bool"),
        ({"min_std": 0.0}, "min_std must be > 0"),
        ({"init_std": 0.001}, "init_std .* must be >= min_std"),
        ({"init_std": "0.2"}, "init_std must be a number"),
        ({"num_tasks": -1}, "num_tasks must be an int >= 0"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MLPPolicyConfig(**{"obs_dim": 3, "action_dim": 2, **kwargs})


def test_config_accepts_yaml_lists():
    assert MLPPolicyConfig(obs_dim=3, action_dim=2, hidden_sizes=[32, 16]).hidden_sizes == (32, 16)



def test_batch_invariant_linear_matches_linear_and_its_gradients():
    torch.manual_seed(0)
    layer = BatchInvariantLinear(5, 3).double()
    reference = torch.nn.Linear(5, 3).double()
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(layer(x), reference(x))
    # The hand-written backward (plain matrix products) against finite differences.
    assert torch.autograd.gradcheck(lambda x, w, b: torch.func.functional_call(layer, {"weight": w, "bias": b}, (x,)),
                                    (x, layer.weight, layer.bias))


def test_temperature_scales_the_std_and_its_log_density(tiny):
    """Sampling at temperature T draws mean + T * std * noise and returns the log-density of
    N(mean, (T * std)^2), written out by hand; T = 1 is the default bit for bit."""
    obs = torch.tensor([[0.3, -0.4], [1.2, 0.7]], dtype=torch.float64)
    mean = numpy_mean(obs.numpy())
    default = tiny.sample_actions(obs, generator=torch.Generator().manual_seed(3))
    at_one = tiny.sample_actions(obs, generator=torch.Generator().manual_seed(3), temperature=1.0)
    for a, b in zip(default, at_one):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    actions, log_probs = tiny.sample_actions(obs, generator=torch.Generator().manual_seed(3), temperature=2.5)
    noise = (default[0][:, 0].numpy() - mean) / STD
    np.testing.assert_allclose(actions[:, 0].numpy(), mean + 2.5 * STD * noise, rtol=1e-5)
    std = 2.5 * STD
    expected = (-0.5 * ((actions[:, 0].numpy() - mean) / std) ** 2 - np.log(std) - 0.5 * math.log(2 * math.pi)).sum(-1)
    np.testing.assert_allclose(log_probs[:, 0].numpy(), expected, rtol=1e-5)
    greedy, _ = tiny.sample_actions(obs, greedy=True, temperature=2.5)
    np.testing.assert_allclose(greedy[:, 0].numpy(), mean, rtol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_temperature_must_be_positive(tiny, temperature):
    with pytest.raises(ValueError, match="temperature must be > 0"):
        tiny.sample_actions(torch.zeros(1, 2, dtype=torch.float64), temperature=temperature)


# --- task sets: a one-hot of the task id after the normalised state ----------------------------


def task_set_policy() -> MLPPolicy:
    torch.manual_seed(0)
    policy = MLPPolicy(MLPPolicyConfig(obs_dim=2, action_dim=2, hidden_sizes=(3,), num_tasks=3)).double()
    policy.set_obs_normalization(OBS_MEAN, OBS_STD)
    return policy


def task_obs(state, task_ids) -> TensorDict:
    state = torch.as_tensor(state, dtype=torch.float64)
    return TensorDict({"state": state, "task_id": torch.as_tensor(task_ids)}, batch_size=[len(state)])


def test_the_one_hot_follows_the_normalised_state_untouched():
    policy = task_set_policy()
    assert policy.mean_net[0].in_features == 2 + 3
    state = np.array([[0.3, -0.4], [1.2, 0.7], [0.3, -0.4]])
    w1, b1 = policy.mean_net[0].weight.detach().numpy(), policy.mean_net[0].bias.detach().numpy()
    w2, b2 = policy.mean_net[2].weight.detach().numpy(), policy.mean_net[2].bias.detach().numpy()
    one_hot = np.eye(3)[[2, 0, 1]]
    expected = np.tanh(np.concatenate([(state - OBS_MEAN) / OBS_STD, one_hot], axis=1) @ w1.T + b1) @ w2.T + b2
    mean = policy.action_mean(task_obs(state, [2, 0, 1]))
    np.testing.assert_allclose(mean.detach().numpy(), expected, rtol=1e-12)
    assert not torch.allclose(mean[0], mean[2])  # same state, other task: another action
    # fitting the normalisation reads the state only; the one-hot stays 0/1
    policy.fit_observation_normalization(task_obs(state, [2, 0, 1]))
    np.testing.assert_allclose(policy.obs_mean.numpy(), state.mean(0))
    np.testing.assert_allclose(policy.obs_std.numpy(), np.maximum(state.std(0), 0.01))


def test_task_set_log_probs_are_the_sampled_ones_and_batch_invariant():
    policy = task_set_policy()
    obs = task_obs(np.random.default_rng(0).normal(size=(5, 2)), [0, 1, 2, 1, 0])
    actions, log_probs = policy.sample_actions(obs, generator=torch.Generator().manual_seed(1))
    assert torch.equal(policy.log_prob_and_entropy(obs, actions)[0], log_probs)
    assert torch.equal(policy.log_prob_and_entropy(obs[3:4], actions[3:4])[0], log_probs[3:4])
    assert policy.bc_loss(obs, actions).requires_grad


def test_a_task_set_policy_needs_task_ids_in_range():
    policy = task_set_policy()
    with pytest.raises(ValueError, match="conditioned on 3 tasks"):
        policy.action_mean(torch.zeros(2, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"task ids must lie in \[0, 3\)"):
        policy.action_mean(task_obs(np.zeros((2, 2)), [0, 3]))


def test_without_tasks_the_policy_is_unchanged():
    """num_tasks 0 (the default) keeps the flat-state network and its parameter names and shapes."""
    policy = MLPPolicy(MLPPolicyConfig(obs_dim=4, action_dim=2, hidden_sizes=(8,)))
    assert policy.mean_net[0].in_features == 4
    assert {k: tuple(v.shape) for k, v in policy.state_dict().items()} == {
        "log_std": (2,), "obs_mean": (4,), "obs_std": (4,), "mean_net.0.weight": (8, 4), "mean_net.0.bias": (8,),
        "mean_net.2.weight": (2, 8), "mean_net.2.bias": (2,)}


def test_model_path_starts_from_a_saved_policy(tiny, tmp_path):
    """``model_path`` (a directory `vla-rl export` writes) gives the saved weights, log-std and
    observation statistics; the saved config.json records what the policy is, not where it came
    from, so a loaded policy saves and loads again."""
    import json

    from policies.checkpoint_files import FieldError

    saved = tiny.save_pretrained(tmp_path / "mlp")
    assert "model_path" not in json.loads((saved / "config.json").read_text())
    loaded = MLPPolicy(MLPPolicyConfig(obs_dim=2, action_dim=2, hidden_sizes=(3,), init_std=0.9,
                                       model_path=str(saved)))
    assert sorted(loaded.state_dict()) == sorted(tiny.state_dict())
    assert all(torch.equal(t, tiny.state_dict()[name]) for name, t in loaded.state_dict().items())
    obs = torch.tensor([[0.3, -0.2], [1.0, 2.0]])
    actions, log_probs = tiny.sample_actions(obs, generator=torch.Generator().manual_seed(1))
    again, again_log_probs = loaded.sample_actions(obs, generator=torch.Generator().manual_seed(1))
    assert torch.equal(again, actions) and torch.equal(again_log_probs, log_probs)
    assert torch.equal(MLPPolicy.from_pretrained(loaded.save_pretrained(tmp_path / "again")).log_std, tiny.log_std)

    with pytest.raises(FieldError, match=r"holds an MLP policy with hidden_sizes \(3,\), the config gives \(4,\)") \
            as other:
        MLPPolicy(MLPPolicyConfig(obs_dim=2, action_dim=2, hidden_sizes=(4,), model_path=str(saved)))
    assert other.value.field == "hidden_sizes"
    with pytest.raises(ValueError, match=r"holds an MLP policy for obs_dim 2, the simulator gives 5"):
        MLPPolicy(MLPPolicyConfig(obs_dim=5, action_dim=2, hidden_sizes=(3,), model_path=str(saved)))
    MLPPolicy.check_pretrained(MLPPolicyConfig(obs_dim=5, action_dim=2, hidden_sizes=(3,), model_path=str(saved)))
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        MLPPolicy(MLPPolicyConfig(obs_dim=2, action_dim=2, model_path=str(tmp_path / "none")))
