"""The embodied workflow's critic: a value network over the state vector of flat or camera
observations, normalised with the policy's statistics (the MLP) or with those of the warm start's
demonstration states (π0, OpenVLA-OFT); task sets refused."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vla_rl.dag.loader import load_template
from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.trainers.critic import CriticTrainer
from vla_rl.workflows.embodied import EmbodiedWorkflow, critic_state_normalization
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec

OBS_DIM, IMAGE = 4, f"agentview{keys.OBS_IMAGE_SUFFIX}"
CAMERA_SPEC = EnvSpec(obs_dim=OBS_DIM, action_dim=7, horizon=6, images={IMAGE: [4, 4, 3]})


def initial_state(ids: np.ndarray) -> np.ndarray:
    """The (fake) first state of initial states ``ids``: ``(n, OBS_DIM)``, feature 3 constant."""
    ids = np.asarray(ids, dtype=np.float32)[:, None]
    return np.concatenate([ids, 2.0 * ids + 1.0, -ids, np.full_like(ids, 0.5)], axis=1)


class FakePool:
    """Resets return camera observations whose state is :func:`initial_state` of the ids."""

    capacity = 2

    def __init__(self):
        self.resets: list[list[int]] = []

    def reset(self, ids):
        self.resets.append([int(i) for i in ids])
        return {keys.OBS_STATE: initial_state(ids), IMAGE: np.zeros((len(ids), 4, 4, 3), np.uint8)}


def write_demos(path, lengths) -> list[np.ndarray]:
    """A camera demonstration store of episodes of ``lengths`` steps; returns their states."""
    store = TrajectoryStore.create(path, {keys.OBS_STATE: ((OBS_DIM,), np.float32), IMAGE: ((4, 4, 3), np.uint8),
                                          "actions": ((7,), np.float32)}, max_steps=max(lengths))
    rng = np.random.default_rng(0)
    states = []
    for i, length in enumerate(lengths):
        state = rng.normal(size=(length, OBS_DIM)).astype(np.float32)
        state[:, 3] = 0.5  # constant over every demonstration and initial state: its scale is floored
        store.append_episode({keys.OBS_STATE: state, IMAGE: rng.integers(0, 256, (length, 4, 4, 3), dtype=np.uint8),
                              "actions": np.zeros((length, 7), np.float32)}, init_state_id=i)
        states.append(state)
    return states


def resources(tmp_path, *overrides, policy=None, spec=CAMERA_SPEC, device="cpu"):
    """What the critic's builder reads of a worker's resources, for the π0 PPO template."""
    store = [] if "warm_start.num_demos=0" in overrides else [f"warm_start.demo_store={tmp_path / 'demos.zarr'}"]
    config = load_template("embodied_ppo_pi0_lift", [*store, *overrides]).config
    return SimpleNamespace(config=config, run_dir=tmp_path, policy=torch.nn.Linear(1, 1) if policy is None else policy,
                           env_spec=spec, simulator_pool=FakePool(), ensure=lambda names: None,
                           device=torch.device(device), group=None)


def test_critic_statistics_are_those_of_the_demonstration_and_initial_states(tmp_path):
    """Without statistics of its own (π0), the critic's are the mean and the standard deviation
    (population, floored at warm_start.obs_std_floor, 0.1) of the first warm_start.num_demos
    demonstrations' states and the first states of warm_start.norm_init_states training initial
    states, computed here with numpy."""
    demo_states = write_demos(tmp_path / "demos.zarr", [3, 5, 2])
    res = resources(tmp_path, "warm_start.num_demos=2", "warm_start.norm_init_states=3")
    mean, std = critic_state_normalization(res)
    states = np.concatenate([*demo_states[:2], initial_state(np.arange(3))]).astype(np.float64)  # the third demo out
    assert len(states) == 11 and res.simulator_pool.resets == [[0, 1], [2]]
    assert mean.dtype == std.dtype == torch.float32 and mean.shape == std.shape == (OBS_DIM,)
    np.testing.assert_allclose(mean.numpy(), states.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(std.numpy(), np.maximum(states.std(0), 0.1), rtol=1e-5, atol=1e-6)
    assert std[3] == pytest.approx(0.1) and (std[:3] > 0.5).all()


def test_critic_statistics_without_warm_start_leave_the_state_raw(tmp_path):
    mean, std = critic_state_normalization(resources(tmp_path, "warm_start.num_demos=0"))
    assert torch.equal(mean, torch.zeros(OBS_DIM)) and torch.equal(std, torch.ones(OBS_DIM))


def test_critic_statistics_without_demonstrations_use_the_initial_states(tmp_path):
    mean, std = critic_state_normalization(resources(tmp_path, "warm_start.num_demos=0",
                                                     "warm_start.norm_init_states=4"))
    states = initial_state(np.arange(4)).astype(np.float64)
    np.testing.assert_allclose(mean.numpy(), states.mean(0), rtol=1e-6)
    np.testing.assert_allclose(std.numpy(), np.maximum(states.std(0), 0.1), rtol=1e-6)


def test_critic_statistics_of_a_policy_with_its_own_are_the_policy_s(tmp_path):
    """The MLP: the statistics its warm start fitted (the same formula, on the same states)."""
    policy = SimpleNamespace(obs_mean=torch.arange(4.0), obs_std=torch.full((4,), 2.0))
    mean, std = critic_state_normalization(resources(tmp_path, "warm_start.num_demos=2", policy=policy))
    assert torch.equal(mean, policy.obs_mean) and torch.equal(std, policy.obs_std)


def test_critic_statistics_need_the_demonstration_store(tmp_path):
    with pytest.raises(FileNotFoundError, match="warm_start.num_demos"):
        critic_state_normalization(resources(tmp_path, "warm_start.num_demos=2"))


def test_critic_builds_over_the_state_of_camera_observations(tmp_path, process_group, device):
    write_demos(tmp_path / "demos.zarr", [3, 5])
    res = resources(tmp_path, "warm_start.num_demos=2", "critic.hidden_sizes=[8]", device=device.type)
    res.device = device
    critic = EmbodiedWorkflow().build_critic(res)
    mean, std = critic_state_normalization(res)
    assert isinstance(critic, CriticTrainer) and critic.device.type == device.type
    assert critic.network.obs_mean.device.type == device.type
    torch.testing.assert_close(critic.network.obs_mean.cpu(), mean)
    torch.testing.assert_close(critic.network.obs_std.cpu(), std)
    assert critic.network.net[0].in_features == OBS_DIM and critic.network.net[0].out_features == 8


def test_critic_refuses_a_task_set(tmp_path):
    res = resources(tmp_path, "warm_start.num_demos=0", spec=CAMERA_SPEC.with_tasks(2))
    with pytest.raises(ValueError, match=r"task set \(simulator.tasks\)"):
        EmbodiedWorkflow().build_critic(res)
