"""Episode bookkeeping of the rollout loop, against a scripted in-process pool."""

from __future__ import annotations

import numpy as np
import pytest
import torch

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
        self.steps_taken[active] += 1
        success = active & (self.steps_taken == self.success_at)
        truncated = active & ~success & (self.steps_taken >= self.horizon)
        self.ended |= success | truncated
        obs = np.stack([self.steps_taken.astype(np.float32), self.ids], axis=1) * active[:, None]
        return {"obs": obs, "reward": success.astype(np.float32), "terminated": success,
                "truncated": truncated, "success": success}


class ConstantPolicy(torch.nn.Module):
    """Acts 1.0 everywhere with log-prob -1 per step; chunk of ``chunk_size`` actions."""

    def __init__(self, chunk_size: int) -> None:
        super().__init__()
        self.chunk_size = chunk_size

    def sample_actions(self, obs, greedy=False, generator=None):
        b = obs.shape[0]
        return torch.ones(b, self.chunk_size, 3), -torch.ones(b, self.chunk_size)


@pytest.mark.parametrize("chunk", [1, 4])
def test_success_mid_chunk_ends_the_episode_as_success(chunk):
    pool = ScriptedPool(success_at=[6, 0, 1], horizon=10)
    result = rollout_episodes(ConstantPolicy(chunk), pool, np.array([7, 8, 9]))
    batch = result.batch
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
