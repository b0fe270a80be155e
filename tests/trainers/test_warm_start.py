"""Tests for vla_rl/trainers/warm_start.py: action windows, normalisation statistics, initial observations."""

from __future__ import annotations

import numpy as np
import torch

from policies.mlp import MLPPolicy, MLPPolicyConfig
from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.trainers.warm_start import OBS_STD_FLOOR, action_chunks, behaviour_cloning, initial_observations


def test_action_chunks_repeat_the_last_action_past_the_end():
    actions = np.array([[0.0], [1.0], [2.0]])
    np.testing.assert_array_equal(action_chunks(actions, 2)[..., 0], [[0, 1], [1, 2], [2, 2]])


def _store(tmp_path, obs: np.ndarray) -> TrajectoryStore:
    store = TrajectoryStore.create(tmp_path / "demos.zarr", fields={"obs": ((2,), np.float32), "actions": ((1,), np.float32)},
                                   max_steps=8)
    store.append_episode({"obs": obs, "actions": np.zeros((len(obs), 1), np.float32)}, init_state_id=0)
    return store


def test_normalisation_counts_the_extra_observations(tmp_path):
    """Feature 0 varies over the demonstration, feature 1 is constant there: alone it gets the
    floor; with two initial observations at 0 and 1 its scale is their spread over all 6 rows."""
    demo = np.array([[0.0, 0.5], [1.0, 0.5], [2.0, 0.5], [3.0, 0.5]], dtype=np.float32)
    extra = np.array([[0.0, 0.0], [3.0, 1.0]], dtype=np.float32)
    for extra_obs, mean_1, std_1 in [(None, 0.5, OBS_STD_FLOOR), (extra, 0.5, np.std([0.5] * 4 + [0.0, 1.0]))]:
        policy = MLPPolicy(MLPPolicyConfig(obs_dim=2, action_dim=1, hidden_sizes=(4,)))
        behaviour_cloning(policy, _store(tmp_path / str(extra_obs is None), demo), 1, steps=1, lr=1e-3,
                          batch_size=4, seed=0, extra_norm_obs=extra_obs)
        rows = demo if extra_obs is None else np.concatenate([demo, extra_obs])
        torch.testing.assert_close(policy.obs_mean, torch.tensor([rows[:, 0].mean(), mean_1]))
        torch.testing.assert_close(policy.obs_std, torch.tensor([rows[:, 0].std(), std_1], dtype=torch.float32))


class _CountingPool:
    """Reset returns each id as its observation, in batches of at most ``capacity``."""

    capacity = 3

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def reset(self, ids: np.ndarray) -> np.ndarray:
        self.batches.append(ids.tolist())
        return np.stack([ids, -ids], axis=1).astype(np.float32)

    def spec(self) -> dict[str, int]:
        return {"obs_dim": 2}


def test_initial_observations_reset_training_states_in_pool_sized_batches():
    pool = _CountingPool()
    obs = initial_observations(pool, 7)
    assert pool.batches == [[0, 1, 2], [3, 4, 5], [6]]
    np.testing.assert_array_equal(obs[:, 0], np.arange(7))
    assert initial_observations(_CountingPool(), 0).shape == (0, 2)
