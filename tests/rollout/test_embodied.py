"""Episode bookkeeping and pipelining of the rollout loop, against scripted in-process pools (flat
state and camera observations)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from devices import device_under_test
from tensordict import TensorDict

from policies import make_policy
from policies.mlp import MLPPolicyConfig
from vla_rl.rollout.embodied import rollout_episodes
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec
from vla_rl_core.observations import INSTRUCTION_BYTES, encode_instruction

OBS_DIM, ACT_DIM = 2, 3


class ScriptedPool:
    """The pool interface (``spec``, ``reset``, ``submit``, ``collect``) over scripted environments.

    Env ``i`` succeeds at control step ``success_at[i]`` (never if 0), fails (``terminated``
    without success) at ``fail_at[i]`` (never if 0), and is truncated at the horizon.
    ``lose_at[i] = t`` loses env ``i``'s episode in the chunk of decision ``t`` (as a dead
    simulator actor would). Observations are ``[control steps taken, initial-state id]``; a
    rendered frame after step ``s`` is filled with ``s``. A chunk runs when it is collected, and
    ``events`` logs the submits and collects, so tests see the pipeline's order.
    """

    def __init__(self, success_at, horizon, fail_at=None, lose_at=None) -> None:
        self.success_at = np.asarray(success_at)
        self.fail_at = np.zeros_like(self.success_at) if fail_at is None else np.asarray(fail_at)
        self.lose_at = dict(lose_at or {})
        self.horizon = horizon
        self.events: list[tuple[str, tuple[int, ...]]] = []
        self.submitted_actions: list[np.ndarray] = []
        self.resets = 0

    def spec(self):
        return EnvSpec(obs_dim=OBS_DIM, action_dim=ACT_DIM, horizon=self.horizon)

    def reset(self, ids):
        self.resets += 1
        self.ids = np.asarray(ids, dtype=np.float32)
        self.steps_taken = np.zeros(len(ids), dtype=np.int64)
        self.decisions = np.zeros(len(ids), dtype=np.int64)
        self.ended = np.zeros(len(ids), dtype=bool)
        return np.stack([np.zeros(len(ids), dtype=np.float32), self.ids], axis=1)

    def submit(self, env_indices, actions, render_indices=()):
        assert actions.shape == (len(env_indices), actions.shape[1], ACT_DIM)
        self.events.append(("submit", tuple(int(i) for i in env_indices)))
        self.submitted_actions.append(actions)
        return np.asarray(env_indices), actions, list(render_indices)

    def collect(self, pending):
        env_indices, actions, render_indices = pending
        self.events.append(("collect", tuple(int(i) for i in env_indices)))
        k = len(env_indices)
        out = {"obs": np.zeros((k, OBS_DIM), dtype=np.float32), "reward": np.zeros(k, dtype=np.float32),
               "terminated": np.zeros(k, dtype=bool), "truncated": np.zeros(k, dtype=bool),
               "success": np.zeros(k, dtype=bool), "steps": np.zeros(k, dtype=np.int64),
               "lost": np.zeros(k, dtype=bool), "frames": {}, "sim_seconds": 0.5, "sim_cpu_seconds": 0.25}
        for row, i in enumerate(env_indices):
            assert not self.ended[i], "stepped an environment whose episode ended"
            t = self.decisions[i]
            self.decisions[i] += 1
            if self.lose_at.get(int(i)) == t:
                out["lost"][row] = True
                self.ended[i] = True
                continue
            frames = []
            for _ in range(actions.shape[1]):
                self.steps_taken[i] += 1
                s = self.steps_taken[i]
                success = s == self.success_at[i]
                terminated = success or s == self.fail_at[i]
                truncated = not terminated and s >= self.horizon
                out["obs"][row] = [s, self.ids[i]]
                out["success"][row] |= success
                out["terminated"][row], out["truncated"][row] = terminated, truncated
                out["steps"][row] += 1
                frames.append(np.full((2, 2, 3), s, dtype=np.uint8))
                if terminated or truncated:
                    self.ended[i] = True
                    break
            if int(i) in render_indices:
                out["frames"][int(i)] = np.stack(frames)
        return out


class ConstantPolicy(torch.nn.Module):
    """Acts 1.0 everywhere with log-prob -1 per step; chunk of ``chunk_size`` actions; the
    simulator gets half of them. Keeps the observations it saw and logs its calls in ``events``."""

    device = torch.device("cpu")
    has_action_distribution = True
    own_action_dim = ACT_DIM

    def __init__(self, chunk_size: int, events: list | None = None) -> None:
        super().__init__()
        self.chunk_size = chunk_size
        self.events = events
        self.seen = []

    def sample_actions(self, obs, greedy=False, generator=None):
        self.seen.append(obs)
        b = obs.shape[0]
        if self.events is not None:
            self.events.append(("policy", tuple(int(x) for x in obs[:, 1] - 7)))  # ids are 7 + row
        return torch.ones(b, self.chunk_size, ACT_DIM), -torch.ones(b, self.chunk_size)

    def env_actions(self, actions, obs=None):
        return 0.5 * actions


class ChainPolicy(ConstantPolicy):
    """Own actions wider than the simulator's (as π0's denoising chains): ``own_action_dim =
    ACT_DIM + 4`` values per chunk position counting ``0, 1, ...``; the simulator gets the last
    ``ACT_DIM``."""

    own_action_dim = ACT_DIM + 4

    def sample_actions(self, obs, greedy=False, generator=None):
        self.seen.append(obs)
        b = obs.shape[0]
        own = torch.arange(self.own_action_dim, dtype=torch.float32).expand(b, self.chunk_size, -1)
        return own.clone(), -torch.ones(b, self.chunk_size)

    def env_actions(self, actions, obs=None):
        return actions[..., -ACT_DIM:]


@pytest.mark.parametrize("stages", [1, 2])
def test_own_actions_wider_than_the_simulators_are_stored_at_their_width(stages, tmp_path):
    """The batch keeps the policy's own actions (own_action_dim wide), the pool and
    ``env_actions`` get the simulator's action_dim; an evaluation store keeps both at their widths."""
    from vla_rl.evaluation.episode_store import append_episodes, open_rank_store

    pool = ScriptedPool(success_at=[3, 0], horizon=6)
    policy = ChainPolicy(2)
    result = rollout_episodes(policy, pool, np.array([7, 8]), pipeline_stages=stages)
    batch = result.batch
    assert batch["actions"].shape == (2, 3, 2, ACT_DIM + 4) and result.env_actions.shape == (2, 3, 2, ACT_DIM)
    own = torch.arange(ACT_DIM + 4, dtype=torch.float32)
    assert torch.equal(batch["actions"][0, :2], own.expand(2, 2, -1))  # success at step 3: decisions 0 and 1
    assert not batch["actions"][0, 2].any() and not result.env_actions[0, 2].any()  # after the episode's end
    assert torch.equal(result.env_actions[1], own[-ACT_DIM:].expand(3, 2, -1))
    assert all(np.array_equal(a, np.broadcast_to(own[-ACT_DIM:].numpy(), a.shape)) for a in pool.submitted_actions)
    spec = EnvSpec(obs_dim=OBS_DIM, action_dim=ACT_DIM, horizon=6)
    store = open_rank_store(tmp_path, "task", 0, spec, 2, {"task": "task", "simulator": "s", "env": {}}, True,
                            policy.own_action_dim)
    assert store.fields["actions"][0] == (2, ACT_DIM + 4) and store.fields["env_actions"][0] == (2, ACT_DIM)
    batch.set(keys.INIT_STATE_ID, torch.tensor([7, 8]))
    batch.set(keys.ENV_ACTIONS, result.env_actions)
    append_episodes(store, batch, 0, False, 1.0, {"cpu": "test"})
    episode = store.read_episode(1)
    assert np.array_equal(episode["actions"], batch["actions"][1].numpy())
    assert np.array_equal(episode["env_actions"], result.env_actions[1].numpy())


@pytest.mark.parametrize("stages", [1, 2, 3])
@pytest.mark.parametrize("chunk", [1, 4])
def test_success_mid_chunk_ends_the_episode_as_success(chunk, stages):
    pool = ScriptedPool(success_at=[6, 0, 1], horizon=10)
    result = rollout_episodes(ConstantPolicy(chunk), pool, np.array([7, 8, 9]), pipeline_stages=stages)
    batch = result.batch
    assert all(np.all(actions == 0.5) for actions in pool.submitted_actions)  # env_actions, the batch the policy's
    assert torch.all(batch["actions"][batch["response_mask"]] == 1.0)
    assert batch["success"].tolist() == [True, False, True]
    # Decision steps: ceil(control steps / chunk); the time-out runs the whole horizon.
    expected_finish = [int(np.ceil(6 / chunk)), int(np.ceil(10 / chunk)), 1]
    assert batch["finish_step"].tolist() == expected_finish
    assert pool.steps_taken.tolist() == [6, 10, 1]  # nothing stepped after the episode ended
    assert result.env_steps == 17
    assert result.lost.tolist() == [False, False, False]
    for i, finish in enumerate(expected_finish):
        assert batch["response_mask"][i].tolist() == [t < finish for t in range(batch["response_mask"].shape[1])]
        # The terminal observation is kept at index finish_step and holds the last step count.
        assert batch["obs"][i, finish, 0].item() == pool.steps_taken[i]
        assert batch["obs"][i, 0].tolist() == [0.0, 7.0 + i]
    assert batch["actions"].shape == (3, int(np.ceil(10 / chunk)), chunk, 3)
    # Actions executed: 6 of env 0's 8 (it succeeded at the 2nd action of its 2nd chunk of 4), 10 of env
    # 1's 12 (the horizon cut its 3rd chunk), 1 of env 2's 4; the rest never ran and has log-prob 0.
    assert batch["control_steps"].tolist() == [6, 10, 1]
    executed = torch.arange(batch["old_log_probs"][0].numel()).view(-1, chunk) < batch["control_steps"][:, None, None]
    assert torch.all(batch["old_log_probs"][executed] == -1)
    assert torch.all(batch["old_log_probs"][~executed] == 0)


def test_a_chunk_of_8_runs_open_loop_before_the_policy_is_asked_again():
    # run_libero_eval.run_episode: the policy is queried only when its queue of NUM_ACTIONS_CHUNK = 8
    # actions is empty; every action of a chunk is executed in order.
    pool = ScriptedPool(success_at=[0], horizon=20)
    policy = ConstantPolicy(8)
    result = rollout_episodes(policy, pool, np.array([7]))
    assert len(policy.seen) == 3 == len(pool.submitted_actions)  # ceil(20 / 8) queries for 20 control steps
    assert [a.shape for a in pool.submitted_actions] == [(1, 8, ACT_DIM)] * 3
    assert pool.steps_taken.tolist() == [20] and result.batch["finish_step"].tolist() == [3]
    assert [obs[0, 0].item() for obs in policy.seen] == [0.0, 8.0, 16.0]  # observed after 0, 8, 16 steps


@pytest.mark.parametrize("stages", [1, 2])
def test_truncation_is_told_apart_from_failure_and_success(stages):
    # env 0 succeeds at step 3, env 1 fails (terminated without success) at step 5, env 2 times out.
    pool = ScriptedPool(success_at=[3, 0, 0], fail_at=[0, 5, 0], horizon=8)
    batch = rollout_episodes(ConstantPolicy(2), pool, np.array([7, 8, 9]), pipeline_stages=stages).batch
    assert batch["success"].tolist() == [True, False, False]
    assert batch["truncated"].tolist() == [False, False, True]
    assert batch["finish_step"].tolist() == [2, 3, 4]
    assert pool.steps_taken.tolist() == [3, 5, 8]


def test_no_observation_leaks_across_episodes_or_after_the_end():
    pool = ScriptedPool(success_at=[2, 0], horizon=5)
    policy = ConstantPolicy(1)
    rollout_episodes(policy, pool, np.array([7, 8]))
    batch = rollout_episodes(policy, pool, np.array([7, 8])).batch  # same pool, next episodes
    assert pool.resets == 2
    # The second episodes start from their reset observation, not the first episodes' last one.
    assert batch["obs"][:, 0].tolist() == [[0.0, 7.0], [0.0, 8.0]]
    # After the terminal observation (index finish_step) nothing is written: no auto-reset.
    assert batch["finish_step"].tolist() == [2, 5]
    assert batch["obs"][0, 2].tolist() == [2.0, 7.0]
    assert torch.all(batch["obs"][0, 3:] == 0) and torch.all(batch["actions"][0, 2:] == 0)


@pytest.mark.parametrize("stages", [1, 2])
def test_lost_episodes_are_dropped_and_flagged(stages):
    # Env 1 is lost in the chunk of its decision 2 (after 4 control steps of chunk 2).
    pool = ScriptedPool(success_at=[0, 0, 3], horizon=8, lose_at={1: 2})
    result = rollout_episodes(ConstantPolicy(2), pool, np.array([7, 8, 9]), pipeline_stages=stages)
    assert result.lost.tolist() == [False, True, False]
    assert result.batch["init_state_id"].tolist() == [7, 9]
    assert result.batch["success"].tolist() == [False, True]
    assert pool.decisions.tolist() == [4, 3, 2]  # env 1 was never given a chunk after its loss
    assert result.env_steps == 8 + 4 + 3  # the lost episode's steps before its loss count
    # the simulator's actions of the kept episodes, zero after each one's last decision
    assert result.env_actions.shape == (2, 4, 2, ACT_DIM)
    assert torch.equal(result.env_actions, 0.5 * result.batch["actions"])
    collects = len([e for e in pool.events if e[0] == "collect"])
    assert result.sim_seconds == pytest.approx(0.5 * collects)
    assert result.sim_cpu_seconds == pytest.approx(0.25 * collects)


def test_frames_follow_each_control_step_and_are_dropped_with_lost_episodes():
    pool = ScriptedPool(success_at=[3, 0, 0], horizon=5, lose_at={2: 1})
    result = rollout_episodes(ConstantPolicy(2), pool, np.array([7, 8, 9]), render_indices=(0, 2),
                              pipeline_stages=2)
    assert sorted(result.frames) == [0]
    assert result.frames[0][:, 0, 0, 0].tolist() == [1, 2, 3]


def test_pipelined_stages_overlap_policy_and_simulation_in_a_fixed_order():
    events: list = []
    pool = ScriptedPool(success_at=[0, 0, 2, 0], horizon=3)
    pool.events = events
    rollout_episodes(ConstantPolicy(1, events), pool, np.array([7, 8, 9, 10]), pipeline_stages=2)
    s0, s1 = (0, 1), (2, 3)
    assert events[:8] == [
        ("policy", s0), ("submit", s0),
        ("policy", s1), ("submit", s1),  # stage 1's actions are computed while stage 0 simulates
        ("collect", s0), ("policy", s0), ("submit", s0),  # stage 0's next chunk queued behind stage 1
        ("collect", s1),
    ]
    # Env 2 succeeded at step 2: stage 1 carries on with env 3 only.
    assert ("policy", (3,)) in events and events.count(("collect", s0)) == 3


def mlp_policy() -> torch.nn.Module:
    torch.manual_seed(0)
    return make_policy("mlp", MLPPolicyConfig(obs_dim=OBS_DIM, action_dim=ACT_DIM, hidden_sizes=(8,))).to(device_under_test())


def test_greedy_rollouts_are_identical_for_any_number_of_stages():
    policy = mlp_policy()
    batches = [rollout_episodes(policy, ScriptedPool([0, 4, 0, 2, 0], 6), np.arange(7, 12), greedy=True,
                                pipeline_stages=stages).batch for stages in (1, 2, 3, 5)]
    for batch in batches[1:]:
        for key in batches[0].keys():
            assert torch.equal(batch[key], batches[0][key]), key


def test_sampled_rollouts_are_reproducible_for_a_fixed_number_of_stages():
    policy = mlp_policy()

    def run(seed):
        return rollout_episodes(policy, ScriptedPool([0, 4, 0, 2, 0], 6), np.arange(7, 12), pipeline_stages=2,
                                generator=torch.Generator().manual_seed(seed)).batch

    first, again = run(3), run(3)
    for key in first.keys():
        assert torch.equal(first[key], again[key]), key
    assert not torch.equal(first["actions"], run(4)["actions"])  # the actions are sampled


def test_pipeline_stages_must_be_positive():
    with pytest.raises(ValueError, match="pipeline_stages"):
        rollout_episodes(ConstantPolicy(1), ScriptedPool([0], 2), np.array([7]), pipeline_stages=0)


class CameraPool(ScriptedPool):
    """The scripted pool with camera observations: ``state`` as above, a 4x4 image filled with
    the step count, and the instruction."""

    def spec(self):
        return dataclasses.replace(super().spec(), images={"agentview_image": (4, 4, 3)})

    def _camera(self, state):
        n = len(state)
        image = np.broadcast_to(state[:, :1, None, None].astype(np.uint8), (n, 4, 4, 3)).copy()
        return {"state": state, "agentview_image": image,
                "instruction": np.stack([encode_instruction("lift the cube")] * n)}

    def reset(self, ids):
        return self._camera(super().reset(ids))

    def collect(self, pending):
        out = super().collect(pending)
        return {**out, "obs": self._camera(out["obs"])}


@pytest.mark.parametrize(("stages", "policy_rows"), [(1, [2, 2, 1]), (2, [1, 1, 1, 1, 1])])
def test_camera_observations_are_stored_as_a_uint8_tensordict(stages, policy_rows):
    pool = CameraPool(success_at=[3, 0], horizon=6)
    policy = ConstantPolicy(2)
    batch = rollout_episodes(policy, pool, np.array([4, 5]), pipeline_stages=stages).batch
    obs = batch["obs"]
    assert isinstance(obs, TensorDict) and obs.batch_size == (2, 4)  # T + 1 = ceil(6 / 2) + 1
    assert obs["agentview_image"].dtype == torch.uint8 and obs["agentview_image"].shape == (2, 4, 4, 4, 3)
    assert obs[keys.OBS_INSTRUCTION].shape == (2, 4, INSTRUCTION_BYTES)
    assert obs[keys.OBS_INSTRUCTION][0, 0].tolist() == encode_instruction("lift the cube").tolist()
    # Decision t sees the image after 2 t control steps; the success at step 3 ends episode 0.
    assert batch["finish_step"].tolist() == [2, 3]
    assert obs["agentview_image"][1, :, 0, 0, 0].tolist() == [0, 2, 4, 6]
    assert obs["agentview_image"][0, 2, 0, 0, 0].item() == 3  # the terminal observation
    assert torch.equal(obs["state"][:, :, 0], obs["agentview_image"][:, :, 0, 0, 0].float())
    # The policy got TensorDicts of the running environments (of one stage at a time) only.
    assert [seen.batch_size[0] for seen in policy.seen] == policy_rows
    assert all(isinstance(seen, TensorDict) for seen in policy.seen)


def test_lost_episodes_are_dropped_from_camera_observations():
    pool = CameraPool(success_at=[0, 0, 3], horizon=8, lose_at={1: 2})
    result = rollout_episodes(ConstantPolicy(2), pool, np.array([4, 5, 6]), pipeline_stages=2)
    obs = result.batch["obs"]
    assert result.lost.tolist() == [False, True, False]
    assert isinstance(obs, TensorDict) and obs.batch_size == (2, 5)  # T + 1 = ceil(8 / 2) + 1
    assert obs["state"][:, 0, 1].tolist() == [4.0, 6.0]  # the initial-state ids of the kept episodes
    assert obs["agentview_image"][1, :, 0, 0, 0].tolist() == [0, 2, 3, 0, 0]  # success at step 3, then nothing


@pytest.mark.parametrize("protocol_wrapper", [False, True])
@pytest.mark.parametrize("stages", [1, 2])
def test_env_actions_get_the_observations_their_actions_were_sampled_from(protocol_wrapper, stages, torch_one_thread):
    """A π0 whose first two action values are relative to the state (openpi's delta actions), run
    through the rollout (and the evaluation's protocol wrapper): what the pool receives at decision
    t is the last denoising block of the executed positions plus decision t's own state, so the
    loop hands env_actions the observations the actions came from. It executes 2 of its 4 actions."""
    from policies.pi0 import PI0PolicyConfig
    from vla_rl.evaluation.protocol import Protocol, ProtocolPolicy

    policy = make_policy("pi0", PI0PolicyConfig(architecture="tiny", action_dim=ACT_DIM, proprio_dim=2,
                                                executed_actions=2, delta_action_mask=(True, True)))
    actor = ProtocolPolicy(policy, Protocol("sampled", False, 1.0)) if protocol_wrapper else policy
    pool = CameraPool(success_at=[0, 0], horizon=6)
    result = rollout_episodes(actor, pool, np.array([4, 5]), generator=torch.Generator().manual_seed(0),
                              pipeline_stages=stages)
    batch, received = result.batch, result.env_actions
    assert batch["actions"].shape == (2, 3, 2, 2 * (3 + 1) * 5) and received.shape == (2, 3, 2, ACT_DIM)
    last = policy.num_steps * policy.max_action_dim  # group 0's last block
    for t in range(3):
        state = batch["obs"]["state"][:, t]  # [control steps taken, initial-state id]
        assert state[:, 0].tolist() == [2.0 * t] * 2  # decision t's own observation
        model_actions = batch["actions"][:, t, :, last : last + ACT_DIM]  # no statistics: raw
        torch.testing.assert_close(received[:, t, :, :2], model_actions[..., :2] + state[:, None, :2], rtol=0, atol=0)
        assert torch.equal(received[:, t, :, 2], model_actions[..., 2])
        torch.testing.assert_close(received[:, t], policy.env_actions(batch["actions"][:, t], batch["obs"][:, t]),
                                   rtol=0, atol=0)
    submitted = np.concatenate(pool.submitted_actions)  # in submission order: compare as sets of rows
    assert sorted(map(tuple, submitted.reshape(-1, ACT_DIM).tolist())) == sorted(
        map(tuple, received.reshape(-1, ACT_DIM).tolist()))


# --------------------------------------------------------------------------- a policy without an action distribution
Q01, Q99 = [-0.5, 0.0, -2.0], [0.5, 4.0, 2.0]


def l1_policy():
    """The tiny OpenVLA-OFT with the L1-regression head (OFT's published LIBERO checkpoints), acting
    in the scripted pool's 3 action values, its last one left unnormalised (mask False)."""
    from policies.openvla_oft.configuration_openvla_oft import OpenVLAOFTPolicyConfig
    from policies.openvla_oft.modeling_openvla_oft import OpenVLAOFTPolicy

    statistics = {"q01": Q01, "q99": Q99, "mask": [True, True, False]}
    return OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(architecture="tiny", action_dim=ACT_DIM, chunk_size=2,
                                                   action_head="l1_regression", action_statistics=statistics))


@pytest.mark.parametrize("protocol_wrapper", [False, True])
def test_l1_head_acts_greedily_with_its_regression_and_records_no_log_probs(protocol_wrapper, tmp_path):
    """A greedy rollout of the L1 head (through the evaluation's protocol wrapper too) takes
    predict_action_chunk's regression as its actions, sends their de-normalisation
    (0.5 (a + 1) (q99 - q01) + q01 where masked, OFT's _unnormalize_actions) to the simulator,
    and has no log-probs in its batch or episode store; the store keeps what the simulator got."""
    from vla_rl.evaluation.episode_store import append_episodes, open_rank_store
    from vla_rl.evaluation.protocol import Protocol, ProtocolPolicy

    policy = l1_policy()
    assert not policy.has_action_distribution
    actor = ProtocolPolicy(policy, Protocol("greedy", True, 0.0)) if protocol_wrapper else policy
    pool = CameraPool(success_at=[0, 0], horizon=4)
    result = rollout_episodes(actor, pool, np.array([4, 5]), greedy=True)
    batch = result.batch
    assert keys.OLD_LOG_PROBS not in batch.keys()
    assert batch["finish_step"].tolist() == [2, 2]
    q01, q99 = torch.tensor(Q01), torch.tensor(Q99)
    for t in range(2):
        expected = policy.predict_action_chunk(batch["obs"][:, t])  # (2, chunk, 3), the same two rows
        assert torch.equal(batch["actions"][:, t], expected)
        by_hand = expected.clone()
        by_hand[..., :2] = (0.5 * (expected + 1) * (q99 - q01) + q01)[..., :2]
        torch.testing.assert_close(torch.as_tensor(pool.submitted_actions[t]), by_hand)
        assert np.array_equal(result.env_actions[:, t].numpy(), pool.submitted_actions[t])
    assert len({tuple(batch["actions"][0, t].flatten().tolist()) for t in range(2)}) == 2  # regression differs by step
    spec = EnvSpec(obs_dim=OBS_DIM, action_dim=ACT_DIM, horizon=4)
    store = open_rank_store(tmp_path, "task", 0, spec, 2, {"task": "task", "simulator": "s", "env": {}},
                            policy.has_action_distribution)
    batch.set(keys.INIT_STATE_ID, torch.tensor([4, 5]))
    with pytest.raises(ValueError, match="field 'env_actions'.*RolloutResult.env_actions"):
        append_episodes(store, batch, 0, True, 0.0, {"cpu": "test"})
    batch.set(keys.ENV_ACTIONS, result.env_actions)
    append_episodes(store, batch, 0, True, 0.0, {"cpu": "test"})
    assert "log_probs" not in store.fields
    assert np.array_equal(store.read_episode(1)["actions"], batch["actions"][1].numpy())
    assert np.array_equal(store.read_episode(1)["env_actions"], np.stack([a[1] for a in pool.submitted_actions]))


def test_a_sampled_rollout_of_the_l1_head_is_refused():
    with pytest.raises(ValueError, match="sampled rollout needs a policy with an action distribution"):
        rollout_episodes(l1_policy(), CameraPool(success_at=[0], horizon=4), np.array([4]), greedy=False)


class ModeRecordingPolicy(ConstantPolicy):
    """Records whether it was in training mode at each call (dropout, e.g. LoRA's, is active then)."""

    def sample_actions(self, obs, greedy=False, generator=None):
        self.seen.append(self.training)
        b = obs.shape[0]
        return torch.ones(b, self.chunk_size, ACT_DIM), -torch.ones(b, self.chunk_size)


def test_rollouts_act_in_eval_mode_after_an_update_left_the_policy_training():
    policy = ModeRecordingPolicy(2).train()
    rollout_episodes(policy, ScriptedPool([0, 4], 6), np.array([7, 8]))
    assert policy.seen and not any(policy.seen)


class TimeLimitPool(ScriptedPool):
    """A gym ``TimeLimit`` reports ``truncated`` at the horizon even on a step that succeeds."""

    def collect(self, pending):
        out = super().collect(pending)
        out["truncated"] |= out["success"] & (self.steps_taken[pending[0]] >= self.horizon)
        return out


def test_a_success_on_the_last_step_is_not_a_truncation():
    pool = TimeLimitPool(success_at=[4, 0], horizon=4)
    batch = rollout_episodes(ConstantPolicy(2), pool, np.array([7, 8])).batch
    assert batch["success"].tolist() == [True, False]
    assert batch["truncated"].tolist() == [False, True]
