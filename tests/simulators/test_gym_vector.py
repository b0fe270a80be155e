"""simulators/gym_vector.py with a plug-in gymnasium environment: success read from ``info``
under either key, actions clipped to the environment's bounds."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest

from simulators.gym_vector import GymVector
from simulators.registry import SIMULATORS
from simulators.stepping import ChunkedSteps
from vla_rl_core.components import ComponentConfigError


@dataclasses.dataclass
class ReachConfig:
    horizon: int = 5
    action_low: float = -1.0
    action_high: float = 1.0
    success_key: str | None = "is_success"  # gymnasium-robotics' key

    @property
    def task_name(self) -> str:
        return "Reach"


class Reach(gym.Env):
    """A point on a line that reaches 0.5 and says so under ``config.success_key``."""

    config_class = ReachConfig
    render_mode = None
    instruction = "reach"

    def __init__(self, config: ReachConfig) -> None:
        self.config, self.horizon, self.obs_layout = config, config.horizon, {}
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Box(config.action_low, config.action_high, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        self.position, self.steps = 0.0, 0
        return np.array([self.position], np.float32), {}

    def step(self, action):
        self.position += float(action[0])
        self.steps += 1
        done = self.position >= 0.5
        info = {} if self.config.success_key is None else {self.config.success_key: done}
        return np.array([self.position], np.float32), float(done), done, self.steps >= self.horizon, info


@pytest.fixture
def reach(monkeypatch):
    """``reach`` registered in this test's copy of the simulator registry (restored after)."""
    monkeypatch.setattr(SIMULATORS, "_entries", dict(SIMULATORS._entries))
    monkeypatch.setattr(SIMULATORS, "_configs", dict(SIMULATORS._configs))
    monkeypatch.setattr(SIMULATORS, "_traits", dict(SIMULATORS._traits))
    SIMULATORS.register("test_reach")(Reach)
    return lambda **settings: GymVector("test_reach", ReachConfig(**settings), 2)


def test_success_under_gymnasium_robotics_is_success_key_is_scored(reach):
    """It was a KeyError: 'success' in a 90-line Ray traceback at the first rollout."""
    vector = reach()
    vector.reset([0, 1], [0, 1])
    result = vector.step_chunk([0, 1], np.array([[[0.3], [0.3]], [[0.1], [0.1]]], np.float32))
    assert result.success.tolist() == [True, False] and result.steps.tolist() == [2, 2]


def test_an_environment_reporting_no_success_stops_the_run_naming_it(reach):
    vector = reach(success_key="goal_reached")
    vector.reset([0], [0])
    with pytest.raises(ComponentConfigError, match=r"environment Reach: step\(\) returned an info without 'success' "
                                                   r"or 'is_success' \(it has \['goal_reached'\]\)") as raised:
        vector.step_chunk([0], np.array([[[0.1]]], np.float32))
    assert raised.value.field == "simulator.name"


def test_actions_are_clipped_to_the_environments_bounds(reach):
    """A Box(0, 1) environment received the policy's negative samples as they were."""
    vector = reach(action_low=0.0, action_high=0.25, success_key="success")
    vector.reset([0, 1], [0, 1])
    vector.step_chunk([0, 1], np.array([[[-0.5]], [[0.75]]], np.float32))
    assert [vector._env(i).position for i in range(2)] == [0.0, 0.25]


def test_non_finite_actions_are_refused_not_clipped_to_a_bound(reach):
    """Clipping turned inf into the bound, silently (the built-in simulators refused it)."""
    vector = reach()
    vector.reset([0], [0])
    with pytest.raises(ValueError, match=r"actions must be finite, got \[\[inf\]\]"):
        vector.step_chunk([0], np.array([[[np.inf]]], np.float32))


def test_export_episodes_replays_a_plug_in_environment_as_the_workers_step_it(reach):
    """vla-rl export-episodes' replay read info["success"] (a KeyError for is_success) and stepped
    the stored actions unclipped, another path than the run's."""
    import types
    from pathlib import Path

    from vla_rl.export_episodes import _replay

    env = Reach(ReachConfig(action_low=0.0, action_high=0.25))
    demonstration = {"actions": np.full((3, 1), 0.75, np.float32), "init_state_id": 0}
    replayed = _replay(env, demonstration, types.SimpleNamespace(evaluation=False, path=Path("demos.zarr")), 0, [])
    assert replayed.actions.tolist() == [[0.25], [0.25]]  # clipped; the goal (0.5) reached at the second step


class ChunkedReach(ChunkedSteps, Reach):
    """Reach executing a whole chunk itself (as a remote environment does elsewhere)."""

    def send_actions(self, actions):
        self.sent = np.asarray(actions)

    def receive_outcome(self):
        reward, steps, info = 0.0, 0, {}
        for action in self.sent:
            obs, step_reward, terminated, truncated, info = Reach.step(self, action)
            reward, steps = reward + step_reward, steps + 1
            if terminated or truncated:
                break
        return obs, reward, terminated, truncated, info, steps


def test_a_chunked_environment_reports_is_success_and_gets_no_non_finite_action(reach):
    """A remote client refused a non-finite action on its side: the episode was lost and the run
    went on, where an in-process environment stops it."""
    SIMULATORS.register("test_chunked_reach")(ChunkedReach)
    vector = GymVector("test_chunked_reach", ReachConfig(), 1)
    vector.reset([0], [0])
    result = vector.step_chunk([0], np.array([[[0.3], [0.3], [0.3]]], np.float32))
    assert result.success.tolist() == [True] and result.steps.tolist() == [2]
    vector.reset([0], [1])
    with pytest.raises(ValueError, match="actions must be finite"):
        vector.step_chunk([0], np.array([[[np.nan], [0.1], [0.1]]], np.float32))
