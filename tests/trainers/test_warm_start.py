"""Tests for vla_rl/trainers/warm_start.py: action windows, normalisation statistics, initial observations,
camera demonstrations (zarr fields per observation key) and behaviour cloning of OpenVLA-OFT on them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from policies.mlp import MLPPolicy, MLPPolicyConfig
from policies.openvla_oft import OpenVLAOFTPolicy, OpenVLAOFTPolicyConfig
from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.trainers.warm_start import (
    action_chunks,
    behaviour_cloning,
    demonstrations,
    ensure_demonstrations,
    initial_observations,
)
from vla_rl_core.env_spec import EnvSpec
from vla_rl_core.observations import decode_instruction, encode_instruction


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
    for extra_obs, mean_1, std_1 in [(None, 0.5, 0.25), (extra, 0.5, np.std([0.5] * 4 + [0.0, 1.0]))]:
        policy = MLPPolicy(MLPPolicyConfig(obs_dim=2, action_dim=1, hidden_sizes=(4,)))
        obs, actions = demonstrations(_store(tmp_path / str(extra_obs is None), demo), 1, policy.chunk_size)
        behaviour_cloning(policy, obs, actions, steps=1, lr=1e-3, batch_size=4, seed=0, obs_std_floor=0.25,
                          extra_norm_obs=extra_obs)
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

    def spec(self) -> EnvSpec:
        return EnvSpec(obs_dim=2, action_dim=1, horizon=4)


def test_initial_observations_reset_training_states_in_pool_sized_batches():
    pool = _CountingPool()
    obs = initial_observations(pool, 7)
    assert pool.batches == [[0, 1, 2], [3, 4, 5], [6]]
    np.testing.assert_array_equal(obs[:, 0], np.arange(7))
    assert initial_observations(_CountingPool(), 0).shape == (0, 2)


class _CameraExpertPool:
    """Scripted camera demonstrations: step ``t`` of the episode of id ``i`` has state
    ``[i, t, 2 t]``, an image filled with ``t`` and the instruction; the action is ``t / 10``."""

    capacity = 2

    def spec(self) -> dict:
        return EnvSpec(obs_dim=3, action_dim=7, horizon=6, images={"agentview_image": [8, 8, 3]})

    def run_expert(self, ids) -> list[dict]:
        episodes = []
        for i in ids:
            t = np.arange(4 + i % 2)
            obs = {"state": np.stack([np.full(len(t), i), t, 2 * t], axis=1).astype(np.float32),
                   "agentview_image": np.broadcast_to(t[:, None, None, None], (len(t), 8, 8, 3)).astype(np.uint8),
                   "instruction": np.stack([encode_instruction("lift the cube")] * len(t))}
            episodes.append({"obs": obs, "actions": np.repeat(t[:, None] / 10, 7, axis=1).astype(np.float32),
                             "success": True, "init_state_id": int(i)})
        return episodes


def test_camera_demonstrations_are_stored_per_key_and_cloned(tmp_path, torch_one_thread):
    store = ensure_demonstrations(_CameraExpertPool(), tmp_path / "demos.zarr", num_demos=3, id_offset=100,
                                  env_attrs={"name": "fake", "cameras": ["agentview"]})
    assert store.fields["agentview_image"] == ((8, 8, 3), np.dtype(np.uint8))
    assert set(store.fields) == {"state", "agentview_image", "instruction", "actions"}
    obs, actions = demonstrations(store, 3, chunk_size=2)
    assert isinstance(obs, TensorDict) and obs.batch_size == (4 + 5 + 4,) and actions.shape == (13, 2, 7)
    assert obs["agentview_image"].dtype == torch.uint8 and obs["agentview_image"][5, 0, 0, 0] == 1  # episode 101, t = 1
    assert decode_instruction(obs["instruction"][7].numpy()) == "lift the cube"
    torch.testing.assert_close(actions[3, :, 0], torch.tensor([0.3, 0.3]))  # the window repeats the last action

    policy = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(architecture={"preset": "tiny", "fused": False}, chunk_size=2,
                                                     proprio_dim=2))
    assert policy.proprio_statistics is None  # proprio stays raw until statistics are fitted or loaded
    before = float(policy.bc_loss(obs, actions).detach())
    metrics = behaviour_cloning(policy, obs, actions, steps=40, lr=3e-3, batch_size=8, seed=0, obs_std_floor=0.1)
    assert metrics["warm_start/transitions"] == 13.0
    # OFT's proprio statistics: q01/q99 of the demonstrations' first two state features.
    torch.testing.assert_close(policy.proprio_q01, torch.quantile(obs["state"][:, :2], 0.01, dim=0))
    torch.testing.assert_close(policy.proprio_q99, torch.quantile(obs["state"][:, :2], 0.99, dim=0))
    assert policy.proprio_statistics is not None and bool(policy.proprio_statistics_set)
    policy.eval()
    assert float(policy.bc_loss(obs, actions).detach()) < before


def test_an_extended_store_continues_after_its_last_initial_state_and_num_demos_caps_what_is_cloned(tmp_path):
    attrs = {"name": "fake", "cameras": ["agentview"]}
    ensure_demonstrations(_CameraExpertPool(), tmp_path / "demos.zarr", num_demos=3, id_offset=100, env_attrs=attrs)
    store = ensure_demonstrations(_CameraExpertPool(), tmp_path / "demos.zarr", num_demos=5, id_offset=100,
                                  env_attrs=attrs)
    assert [int(store.read_episode(i)["init_state_id"]) for i in range(len(store))] == [100, 101, 102, 103, 104]
    obs, actions = demonstrations(store, 3, chunk_size=2)  # the first 3 of the 5: 4 + 5 + 4 steps
    assert obs.batch_size == (13,) and actions.shape == (13, 2, 7)
    assert obs["state"][:, 0].unique().tolist() == [100.0, 101.0, 102.0]


def test_behaviour_cloning_maps_the_expert_actions_with_their_observations(tmp_path, torch_one_thread):
    """A π0 whose action values 1 and 2 are relative to the state (openpi's delta actions) and that
    executes 2 of its 4 actions: the demonstrations come in windows of the model's whole chunk
    (``bc_chunk_size``), ``actions_from_env`` gets the demonstrations' observations and subtracts
    each one's state, and ``bc_loss`` clones those rows with their observations."""
    from policies.pi0 import PI0Policy, PI0PolicyConfig

    store = ensure_demonstrations(_CameraExpertPool(), tmp_path / "demos.zarr", num_demos=3, id_offset=100,
                                  env_attrs={"name": "fake", "cameras": ["agentview"]})
    policy = PI0Policy(PI0PolicyConfig(architecture={"preset": "tiny", "max_action_dim": 7}, action_dim=7, proprio_dim=3,
                                       executed_actions=2, delta_action_mask=(False, True, True)))
    assert (policy.chunk_size, policy.bc_chunk_size) == (2, 4)
    obs, actions = demonstrations(store, 3, policy.bc_chunk_size)
    assert actions.shape == (13, 4, 7)
    seen_obs, cloned = [], []

    def actions_from_env(env_actions, obs=None):
        seen_obs.append(obs)
        return PI0Policy.actions_from_env(policy, env_actions, obs)

    def bc_loss(rows_obs, expert_actions):
        cloned.append((rows_obs, expert_actions))
        return PI0Policy.bc_loss(policy, rows_obs, expert_actions)

    policy.actions_from_env, policy.bc_loss = actions_from_env, bc_loss
    behaviour_cloning(policy, obs, actions, steps=2, lr=1e-3, batch_size=4, seed=0, obs_std_floor=0.1)
    assert len(seen_obs) == 1 and seen_obs[0] is obs
    by_hand = actions.clone()  # no statistics: only the state is subtracted, on every position of a window
    by_hand[..., 1:3] -= obs["state"][:, None, 1:3]
    for rows_obs, expert in cloned:
        rows = [int(torch.nonzero((obs["state"] == state).all(dim=1))[0]) for state in rows_obs["state"]]
        torch.testing.assert_close(expert, by_hand[rows], rtol=0, atol=0)


def test_behaviour_cloning_resizes_each_demonstrated_frame_once(tmp_path, torch_one_thread, monkeypatch):
    """π0's camera frames are resized and padded once before the gradient steps
    (``Policy.model_ready_observations``), not in every step's ``bc_loss``."""
    from policies.pi0 import PI0Policy, PI0PolicyConfig
    from tests.policies.test_model_ready_observations import resized_frames

    store = ensure_demonstrations(_CameraExpertPool(), tmp_path / "demos.zarr", num_demos=3, id_offset=100,
                                  env_attrs={"name": "fake", "cameras": ["agentview"]})
    policy = PI0Policy(PI0PolicyConfig(architecture={"preset": "tiny", "max_action_dim": 7}, action_dim=7,
                                       proprio_dim=3))
    obs, actions = demonstrations(store, 3, policy.bc_chunk_size)
    counts = resized_frames(monkeypatch)
    behaviour_cloning(policy, obs, actions, steps=20, lr=1e-3, batch_size=4, seed=0, obs_std_floor=0.1)
    assert sum(counts) == len(obs) == 13  # 80 frames read by the steps
    assert "agentview_image" in obs.keys()  # the caller's observations are kept as they were


class _TaskSetExpertPool:
    """Scripted demonstrations of a task set of 3 tasks: step ``t`` of task ``k``'s episode of id
    ``i`` has state ``[i, t, k]``; task 1's expert fails on odd ids. ``calls`` records (ids, task)."""

    capacity = 4

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], int]] = []

    def spec(self) -> dict:
        return EnvSpec(obs_dim=3, action_dim=2, horizon=8, num_tasks=3)

    def run_expert(self, ids, task_id) -> list[dict]:
        self.calls.append((list(ids), task_id))
        episodes = []
        for i in ids:
            t = np.arange(3)
            obs = {"state": np.stack([np.full(3, i), t, np.full(3, task_id)], axis=1).astype(np.float32),
                   "task_id": np.full(3, task_id, dtype=np.int64)}
            episodes.append({"obs": obs, "actions": np.full((3, 2), task_id / 10, np.float32),
                             "success": not (task_id == 1 and i % 2), "init_state_id": int(i)})
        return episodes

    def reset(self, ids: np.ndarray, task_ids: np.ndarray) -> dict:
        return {"state": np.stack([ids, ids, task_ids], axis=1).astype(np.float32), "task_id": task_ids}


def test_a_task_set_gets_demonstrations_of_every_task_and_clones_them(tmp_path, torch_one_thread):
    pool, path = _TaskSetExpertPool(), tmp_path / "demos.zarr"
    attrs = {"name": "fake", "tasks": ["a", "b", "c"]}
    store = ensure_demonstrations(pool, path, num_demos=2, id_offset=10, env_attrs=attrs, num_tasks=3)
    scalars = store.read_scalars()
    assert scalars["task"].tolist() == [0, 0, 1, 1, 2, 2]
    assert scalars["init_state_id"].tolist() == [10, 11, 10, 12, 10, 11]  # task 1 failed on 11
    # a larger count extends every task from where it stopped, never rewriting
    pool.calls.clear()
    store = ensure_demonstrations(pool, path, num_demos=3, id_offset=10, env_attrs=attrs, num_tasks=3)
    assert [call for call in pool.calls] == [([12, 13], 0), ([13, 14], 1), ([12, 13], 2)]
    assert store.read_scalars()["task"].tolist() == [0, 0, 1, 1, 2, 2, 0, 1, 2]
    obs, actions = demonstrations(store, 2, chunk_size=1)  # the first 2 of every task
    assert isinstance(obs, TensorDict) and obs.batch_size == (18,)
    assert torch.bincount(obs["task_id"]).tolist() == [6, 6, 6]
    assert obs["state"][:, 0].tolist()[:6] == [10.0] * 3 + [11.0] * 3
    policy = MLPPolicy(MLPPolicyConfig(obs_dim=3, action_dim=2, hidden_sizes=(8,), num_tasks=3))
    init_obs = initial_observations(pool, 5, num_tasks=3)
    assert init_obs["task_id"].tolist() == [0, 1, 2, 0, 1]
    behaviour_cloning(policy, obs, actions, steps=300, lr=1e-2, batch_size=18, seed=0, obs_std_floor=0.1,
                      extra_norm_obs=init_obs)
    states = torch.cat([obs["state"], torch.as_tensor(init_obs["state"])])
    torch.testing.assert_close(policy.obs_mean, states.mean(0))
    # one policy, one action per task: the one-hot tells them apart
    torch.testing.assert_close(policy.action_mean(obs)[:, 0], obs["task_id"].float() / 10, atol=0.02, rtol=0)


def test_a_demonstration_store_is_matched_by_its_whole_settings():
    from simulators.registry import canonical_env
    from vla_rl.config.simulator import SimulatorSection
    from vla_rl.nodes.warm_start import demo_env_attrs
    from vla_rl.trainers.warm_start import same_demonstration_settings

    current = demo_env_attrs(SimulatorSection(name="robosuite_lift", env={"horizon": 40}))
    assert current == {"name": "robosuite_lift", **canonical_env("robosuite_lift", {"horizon": 40})}
    # an earlier store recorded the template's own settings: completed with today's defaults
    assert same_demonstration_settings({"name": "robosuite_lift", "horizon": 40}, current)
    assert same_demonstration_settings({"name": "robosuite_lift", "horizon": 40, "control_freq": 20.0}, current)
    assert not same_demonstration_settings({"name": "robosuite_lift", "horizon": 50}, current)
    assert not same_demonstration_settings({**current, "control_freq": 10.0}, current)  # a default that changed
    assert not same_demonstration_settings({**current, "tasks": ["Lift"]}, current)
    assert not same_demonstration_settings({**current, "name": "robosuite"}, current)
    assert not same_demonstration_settings(None, current)
    task_set = demo_env_attrs(SimulatorSection(name="metaworld", env={"horizon": 30}, tasks=["reach-v3", "push-v3"]))
    assert task_set["tasks"] == ["reach-v3", "push-v3"] and "task" not in task_set
    assert same_demonstration_settings({"name": "metaworld", "horizon": 30, "tasks": ["reach-v3", "push-v3"]}, task_set)


def test_behaviour_cloning_refuses_to_run_adam_on_half_precision_weights(tmp_path):
    """Adam outside the actor's strategy keeps no float32 master weights: in float16 its eps
    (1e-8) is 0 and a zero gradient gives NaN weights at the first step, in bfloat16 updates below
    the weights' resolution are lost. Refused before any step, the policy untouched."""
    demo = np.array([[0.0, 0.5], [1.0, 0.5], [2.0, 0.5], [3.0, 0.5]], dtype=np.float32)
    for dtype in (torch.float16, torch.bfloat16):
        policy = MLPPolicy(MLPPolicyConfig(obs_dim=2, action_dim=1, hidden_sizes=(4,))).to(dtype)
        obs, actions = demonstrations(_store(tmp_path / str(dtype), demo), 1, policy.chunk_size)
        before = {name: tensor.clone() for name, tensor in policy.state_dict().items()}
        with pytest.raises(ValueError, match=rf"behaviour cloning would run Adam on the MLPPolicy's {str(dtype)[6:]} "
                                             r"trainable parameters .* or set warm_start\.num_demos=0"):
            behaviour_cloning(policy, obs, actions, steps=2, lr=1e-3, batch_size=4, seed=0, obs_std_floor=0.25)
        assert all(torch.equal(tensor, before[name]) for name, tensor in policy.state_dict().items())
