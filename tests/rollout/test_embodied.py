"""Episode bookkeeping of the rollout loop, against scripted in-process pools (flat state and
camera observations)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensordict import TensorDict

from vla_rl.data import keys
from vla_rl.data.observations import INSTRUCTION_BYTES, encode_instruction
from vla_rl.rollout.embodied import rollout_episodes


class ScriptedPool:
    """Env ``i`` succeeds at control step ``success_at[i]`` (never if 0); obs = [step count, id]."""

    def __init__(self, success_at: list[int], horizon: int) -> None:
        self.success_at = np.asarray(success_at)
        self.horizon = horizon
        self.steps_taken: np.ndarray | None = None

    def spec(self):
        return {"obs_dim": 2, "act_dim": 3, "horizon": self.horizon}

    def reset(self, ids):
        self.ids = np.asarray(ids, dtype=np.float32)
        self.steps_taken = np.zeros(len(ids), dtype=np.int64)
        self.ended = np.zeros(len(ids), dtype=bool)
        return np.stack([np.zeros(len(ids), dtype=np.float32), self.ids], axis=1)

    def step(self, actions, active, render_indices=()):
        assert not (active & self.ended).any(), "stepped an environment whose episode ended"
        self.last_actions = actions
        self.steps_taken[active] += 1
        success = active & (self.steps_taken == self.success_at)
        truncated = active & ~success & (self.steps_taken >= self.horizon)
        self.ended |= success | truncated
        obs = np.stack([self.steps_taken.astype(np.float32), self.ids], axis=1) * active[:, None]
        return {"obs": obs, "reward": success.astype(np.float32), "terminated": success,
                "truncated": truncated, "success": success}


class ConstantPolicy(torch.nn.Module):
    """Acts 1.0 everywhere with log-prob -1 per step; chunk of ``chunk_size`` actions; the
    simulator gets half of them."""

    def __init__(self, chunk_size: int) -> None:
        super().__init__()
        self.chunk_size = chunk_size
        self.seen = []

    def sample_actions(self, obs, greedy=False, generator=None):
        self.seen.append(obs)
        b = obs.shape[0]
        return torch.ones(b, self.chunk_size, 3), -torch.ones(b, self.chunk_size)

    def env_actions(self, actions):
        return 0.5 * actions


@pytest.mark.parametrize("chunk", [1, 4])
def test_success_mid_chunk_ends_the_episode_as_success(chunk):
    pool = ScriptedPool(success_at=[6, 0, 1], horizon=10)
    result = rollout_episodes(ConstantPolicy(chunk), pool, np.array([7, 8, 9]))
    batch = result.batch
    assert np.all(pool.last_actions[1] == 0.5)  # the simulator gets env_actions, the batch the policy's
    assert torch.all(batch["actions"][batch["response_mask"]] == 1.0)
    assert batch["success"].tolist() == [True, False, True]
    # Decision steps: ceil(control steps / chunk); the time-out runs the whole horizon.
    expected_finish = [int(np.ceil(6 / chunk)), int(np.ceil(10 / chunk)), 1]
    assert batch["finish_step"].tolist() == expected_finish
    assert pool.steps_taken.tolist() == [6, 10, 1]  # nothing stepped after the episode ended
    assert result.env_steps == 17
    for i, finish in enumerate(expected_finish):
        assert batch["response_mask"][i].tolist() == [t < finish for t in range(batch["response_mask"].shape[1])]
        # The terminal observation is kept at index finish_step and holds the last step count.
        assert batch["obs"][i, finish, 0].item() == pool.steps_taken[i]
        assert batch["obs"][i, 0].tolist() == [0.0, 7.0 + i]
    assert batch["actions"].shape == (3, int(np.ceil(10 / chunk)), chunk, 3)
    assert torch.all(batch["old_log_probs"][batch["response_mask"]] == -1)
    assert torch.all(batch["old_log_probs"][~batch["response_mask"]] == 0)


class CameraPool(ScriptedPool):
    """The scripted pool with camera observations: ``state`` as above, a 4x4 image filled with
    the step count, and the instruction."""

    def spec(self):
        return {**super().spec(), "images": {"agentview_image": [4, 4, 3]}}

    def _camera(self, state):
        n = len(state)
        image = np.broadcast_to(state[:, :1, None, None].astype(np.uint8), (n, 4, 4, 3)).copy()
        return {"state": state, "agentview_image": image,
                "instruction": np.stack([encode_instruction("lift the cube")] * n)}

    def reset(self, ids):
        return self._camera(super().reset(ids))

    def step(self, actions, active, render_indices=()):
        out = super().step(actions, active, render_indices)
        return {**out, "obs": self._camera(out["obs"])}


def test_camera_observations_are_stored_as_a_uint8_tensordict():
    pool = CameraPool(success_at=[3, 0], horizon=6)
    policy = ConstantPolicy(2)
    batch = rollout_episodes(policy, pool, np.array([4, 5])).batch
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
    # The policy got TensorDicts of the running environments only.
    assert [seen.batch_size[0] for seen in policy.seen] == [2, 2, 1]
    assert all(isinstance(seen, TensorDict) for seen in policy.seen)
