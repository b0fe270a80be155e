"""Replaying stored episodes of a policy whose actions are not the simulator's (the tiny
OpenVLA-OFT: normalised actions, de-normalised and gripper-binarised by ``env_actions``): the
store keeps what the simulator received, and a replay sends exactly that again, against a
scripted in-process pool whose success needs LIBERO's binarised gripper. The MLP's replays (its
actions are the simulator's) run in tests/evaluation/test_session.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.evaluation.episode_store import append_episodes, open_rank_store
from vla_rl.evaluation.replay import episode_env_actions, replay_episodes, rescore_store
from vla_rl.rollout.embodied import rollout_episodes
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec
from vla_rl_core.observations import encode_instruction

OBS_DIM, ACT_DIM, CHUNK = 2, 3, 2
Q01, Q99 = [-0.5, 0.0, 0.0], [0.5, 4.0, 1.0]


class GripperPool:
    """The pool interface (``spec``, ``reset``, ``submit``/``collect`` as the rollout uses them,
    ``step`` as a replay does) over scripted camera environments.

    Env ``i`` succeeds at control step ``success_at[i]`` (never if 0) only if every action it
    received had a gripper command (last value) of exactly -1, 0 or +1 (LIBERO's binarised
    gripper); otherwise it runs to the horizon (truncated). ``executed[i]`` logs the actions env
    ``i`` executed, one per control step; ``chunks[i]`` the chunks it was sent.
    """

    def __init__(self, success_at, horizon) -> None:
        self.success_at = list(success_at)
        self.horizon = horizon

    def spec(self):
        return EnvSpec(obs_dim=OBS_DIM, action_dim=ACT_DIM, horizon=self.horizon,
                images={"agentview_image": [4, 4, 3]})

    def _obs(self, rows) -> dict:
        state = np.stack([self.steps[rows].astype(np.float32), self.ids[rows]], axis=1)  # (k, 2)
        image = np.broadcast_to(self.steps[rows, None, None, None].astype(np.uint8), (len(rows), 4, 4, 3)).copy()
        return {"state": state, "agentview_image": image,
                "instruction": np.stack([encode_instruction("open the drawer")] * len(rows))}

    def reset(self, ids):
        n = len(ids)
        self.ids = np.asarray(ids, dtype=np.float32)
        self.steps = np.zeros(n, dtype=np.int64)
        self.binarised = np.ones(n, dtype=bool)
        self.executed: list[list[np.ndarray]] = [[] for _ in range(n)]
        self.chunks: list[list[np.ndarray]] = [[] for _ in range(n)]
        return self._obs(np.arange(n))

    def submit(self, env_indices, actions, render_indices=()):
        assert actions.dtype == np.float32 and actions.shape[2] == ACT_DIM
        for row, i in enumerate(env_indices):
            self.chunks[int(i)].append(actions[row].copy())
        return np.asarray(env_indices), actions

    def collect(self, pending):
        env_indices, actions = pending
        k = len(env_indices)
        out = {"reward": np.zeros(k, dtype=np.float32), "terminated": np.zeros(k, dtype=bool),
               "truncated": np.zeros(k, dtype=bool), "success": np.zeros(k, dtype=bool),
               "steps": np.zeros(k, dtype=np.int64), "lost": np.zeros(k, dtype=bool), "frames": {},
               "sim_seconds": 0.0, "sim_cpu_seconds": 0.0}
        for row, i in enumerate(env_indices):
            for action in actions[row]:
                self.executed[i].append(action.copy())
                self.binarised[i] &= bool(action[-1] in (-1.0, 0.0, 1.0))
                self.steps[i] += 1
                out["steps"][row] += 1
                success = self.binarised[i] and self.steps[i] == self.success_at[i]
                out["success"][row] = out["terminated"][row] = success
                out["truncated"][row] = not success and self.steps[i] >= self.horizon
                if out["terminated"][row] or out["truncated"][row]:
                    break
        out["obs"] = self._obs(np.asarray(env_indices))
        return out

    def step(self, actions, active, render_indices=()):
        assert not render_indices
        rows = np.flatnonzero(active)
        out = self.collect(self.submit(rows, actions[rows, None]))
        result = {}
        for key in ("success", "terminated", "truncated"):
            result[key] = np.zeros(len(active), dtype=bool)
            result[key][rows] = out[key]
        return result


@pytest.fixture(scope="module")
def oft_policy():
    """The tiny OpenVLA-OFT with the L1-regression head, de-normalising its first two values and
    binarising its gripper as on LIBERO."""
    from policies.openvla_oft.configuration_openvla_oft import OpenVLAOFTPolicyConfig
    from policies.openvla_oft.modeling_openvla_oft import OpenVLAOFTPolicy

    statistics = {"q01": Q01, "q99": Q99, "mask": [True, True, False]}
    return OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(
        architecture="tiny", action_dim=ACT_DIM, chunk_size=CHUNK, action_head="l1_regression",
        action_statistics=statistics, gripper_postprocess="libero"))


@pytest.fixture(scope="module")
def stored(oft_policy, tmp_path_factory):
    """A greedy rollout of the tiny OFT (env 0 succeeds at control step 3, in its second chunk;
    env 1 would at step 6, the horizon) stored as ``vla-rl eval`` stores it: the rollout's pool, the
    result and the store."""
    pool = GripperPool(success_at=[3, 6], horizon=6)
    result = rollout_episodes(oft_policy, pool, np.array([4, 5]), greedy=True)
    batch = result.batch
    batch.set(keys.ENV_ACTIONS, result.env_actions)
    path = tmp_path_factory.mktemp("eval")
    store = open_rank_store(path, "task", 0, pool.spec(), CHUNK, {"task": "task", "simulator": "s", "env": {}},
                            oft_policy.has_action_distribution)
    append_episodes(store, batch, 0, True, 0.0, {"cpu": "test"})
    return pool, result, store


def test_the_store_keeps_the_actions_the_simulator_received(oft_policy, stored):
    pool, result, store = stored
    assert not oft_policy.actions_are_env_actions
    assert result.batch[keys.SUCCESS].tolist() == [True, True]
    assert result.batch[keys.FINISH_STEP].tolist() == [2, 3]  # success mid-chunk: 2 decisions
    for i in range(2):
        episode = store.read_episode(i)
        received = np.stack(pool.chunks[i])  # (finish_step, chunk, action_dim), as submitted
        assert episode["env_actions"].dtype == np.float32
        assert np.array_equal(episode["env_actions"], received)
        expected = oft_policy.env_actions(torch.as_tensor(episode["actions"])).numpy()
        assert np.array_equal(episode["env_actions"], expected)
        assert not np.allclose(episode["actions"], episode["env_actions"])  # not the policy's own
        assert set(episode["env_actions"][..., -1].ravel().tolist()) <= {-1.0, 0.0, 1.0}


def test_a_replay_sends_the_stored_simulator_actions_and_reproduces_the_outcome(stored):
    rollout_pool, _, store = stored
    pool = GripperPool(success_at=[3, 6], horizon=6)
    check = rescore_store(pool, store)
    assert check["stored_success"].tolist() == [True, True]
    np.testing.assert_array_equal(check["replayed_success"], check["stored_success"])
    for i in range(2):
        assert np.array_equal(np.stack(pool.executed[i]), np.stack(rollout_pool.executed[i]))
        assert math.ceil(pool.steps[i] / CHUNK) == store.read_episode(i)["finish_step"]
    # executing the policy's own (normalised, unbinarised) actions, as replays did, fails both
    own = [store.read_episode(i)["actions"] for i in range(2)]
    assert replay_episodes(GripperPool(success_at=[3, 6], horizon=6), np.array([4, 5]), own)[0].tolist() == [
        False, False]


def legacy_store(path, stored_actions: np.ndarray) -> TrajectoryStore:
    """A store in the layout before ``env_actions`` existed, with one episode (id 4) whose
    ``actions`` are ``stored_actions``."""
    store = TrajectoryStore.create(path, {"obs": ((OBS_DIM,), np.float32), "next_obs": ((OBS_DIM,), np.float32),
                                          "actions": ((CHUNK, ACT_DIM), np.float32)}, max_steps=3)
    steps = len(stored_actions)
    store.append_episode({"obs": np.zeros((steps, OBS_DIM), np.float32),
                          "next_obs": np.zeros((steps, OBS_DIM), np.float32), "actions": stored_actions},
                         checkpoint_step=np.int64(0), greedy=np.bool_(True), temperature=np.float64(0.0),
                         init_state_id=np.int64(4), success=np.bool_(True), truncated=np.bool_(False),
                         finish_step=np.int64(steps))
    return store


def test_an_older_store_replays_its_actions_only_for_a_policy_acting_in_simulator_units(stored, tmp_path):
    from policies import make_policy
    from policies.mlp import MLPPolicyConfig

    _, result, _ = stored
    assert make_policy("mlp", MLPPolicyConfig(obs_dim=OBS_DIM, action_dim=ACT_DIM)).actions_are_env_actions
    # an MLP's store: its actions are what the simulator received
    mlp = legacy_store(tmp_path / "mlp.zarr", result.env_actions[0, :2].numpy())
    episode = mlp.read_episode(0)
    assert np.array_equal(episode_env_actions(mlp, episode, actions_are_env_actions=True), episode["actions"])
    check = rescore_store(GripperPool(success_at=[3], horizon=6), mlp, actions_are_env_actions=True)
    assert check["replayed_success"].tolist() == [True]
    # a VLA's store: its actions are the policy's own, which never reached the simulator
    vla = legacy_store(tmp_path / "vla.zarr", result.batch[keys.ACTIONS][0, :2].numpy())
    with pytest.raises(ValueError, match=r"vla\.zarr has no 'env_actions' field .* cannot be replayed"):
        rescore_store(GripperPool(success_at=[3], horizon=6), vla)


class ScriptedPool:
    """A pool whose ``step`` answers the ``reports`` in turn (``{"success", "terminated",
    "truncated"}`` lists, one value per env, whatever the env's state), recording the active masks
    it is sent and its resets."""

    def __init__(self, reports) -> None:
        self.reports, self.masks, self.resets = list(reports), [], []

    def reset(self, ids, task_ids=None) -> None:
        self.resets.append((ids.tolist(), None if task_ids is None else task_ids.tolist()))

    def step(self, actions, active, render_indices=()):
        self.masks.append(active.tolist())
        report = self.reports.pop(0) if self.reports else {}
        return {k: np.array(report.get(k, [False] * len(active))) for k in ("success", "terminated", "truncated")}


def actions(steps: int) -> np.ndarray:
    return np.zeros((steps, 1, 2), np.float32)


def test_a_success_reported_after_an_episodes_actions_ran_out_is_not_its_own():
    pool = ScriptedPool([{}, {"success": [True, False]}])  # env 0 has stopped by the second step
    success, _ = replay_episodes(pool, np.array([3, 4]), [actions(1), actions(3)])
    assert success.tolist() == [False, False]
    assert pool.masks == [[True, True], [False, True], [False, True]]


def test_a_truncated_episode_is_stepped_no_further():
    pool = ScriptedPool([{"truncated": [True, False]}, {"success": [True, False]}])
    success, _ = replay_episodes(pool, np.array([3, 4]), [actions(3), actions(3)])
    assert success.tolist() == [False, False]
    assert pool.masks == [[True, True], [False, True], [False, True]]


def test_a_replay_resets_each_episode_to_its_task_and_initial_state():
    pool = ScriptedPool([])
    replay_episodes(pool, np.array([3, 4]), [actions(1), actions(1)], task_ids=np.array([1, 0]))
    replay_episodes(pool, np.array([5]), [actions(1)])
    assert pool.resets == [([3, 4], [1, 0]), ([5], None)]


def test_a_replay_needs_one_action_sequence_per_initial_state():
    with pytest.raises(ValueError, match="got 1 action sequences for 2 initial states"):
        replay_episodes(ScriptedPool([]), np.array([3, 4]), [actions(1)])
