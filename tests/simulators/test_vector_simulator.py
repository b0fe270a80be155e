"""The vectorised simulator contract (simulators/vector.py): docs/extending.md's batched point-mass
reach, written out as the doc gives it, is driven by the simulator worker as the gym adapters are,
and trains one SRPO step end to end through the unchanged engine (``vla-rl train``, Ray workers,
simulator actors), in a subprocess so that it never enters this process's registries for good."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from child_env import child_env
from devices import device_overrides
from test_extending import write_doc_files

from simulators.experts import NoExpertError
from simulators.registry import SIMULATORS
from simulators.vector import ChunkResult, VectorSimulator
from simulators.worker import SimulatorWorker
from vla_rl.dag.loader import REPO_ROOT
from vla_rl_core.env_spec import EnvSpec


@pytest.fixture(scope="module")
def doc_files(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("doc")
    assert "point_mass.py" in write_doc_files(directory)
    return directory


@pytest.fixture
def point_mass(doc_files, monkeypatch):
    """The doc's module, imported with this test's copy of the simulator registry (restored after)."""
    monkeypatch.setattr(SIMULATORS, "_entries", dict(SIMULATORS._entries))
    monkeypatch.setattr(SIMULATORS, "_configs", dict(SIMULATORS._configs))
    monkeypatch.setattr(SIMULATORS, "_traits", dict(SIMULATORS._traits))
    spec = importlib.util.spec_from_file_location("point_mass_doc", doc_files / "point_mass.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def toward_target(obs: np.ndarray, chunk: int) -> np.ndarray:
    """``(n, chunk, 2)`` actions that move each point straight at its target at full speed."""
    direction = obs[:, 2:] - obs[:, :2]
    step = direction / np.maximum(np.abs(direction).max(axis=1, keepdims=True), 1e-6)
    return np.repeat(step[:, None, :], chunk, axis=1).astype(np.float32)


def test_the_worker_drives_a_batch_of_environments_through_the_contract(point_mass):
    worker = SimulatorWorker("point_mass", point_mass.PointMassConfig(horizon=12), 4)
    assert isinstance(worker._sim, VectorSimulator)
    assert worker.spec() == EnvSpec(obs_dim=4, action_dim=2, horizon=12,
                                    obs_layout={"position": (0, 2), "target": (2, 4)})
    obs = worker.reset([3, 1], [7, 8])
    assert obs.shape == (2, 4) and obs.dtype == np.float32
    np.testing.assert_array_equal(obs, worker.reset([0, 2], [7, 8]))  # an id is a state, in any slot
    start = np.random.default_rng(7).uniform(-1, 1, (2, 2))
    np.testing.assert_allclose(obs[0], start.reshape(-1), rtol=1e-6)

    # Row 0 heads for its target, row 1 stands still: only row 0 moves, by speed per step.
    actions = np.zeros((2, 3, 2), np.float32)
    actions[0] = toward_target(obs, 3)[0]
    result = worker.step_chunk([3, 1], actions)
    assert set(result) >= {"obs", "reward", "terminated", "truncated", "success", "steps", "lost", "frames",
                           "sim_seconds", "sim_cpu_seconds"}
    moved = np.linalg.norm(result["obs"][:, :2] - obs[:, :2], axis=1)
    np.testing.assert_allclose(moved[1], 0.0, atol=1e-7)
    assert 0.0 < moved[0] <= 3 * 0.1 * np.sqrt(2) + 1e-6
    np.testing.assert_array_equal(result["steps"], [3, 3])

    # Full speed at the target: success mid-chunk ends the episode (fewer steps than the chunk).
    far = worker.reset([0], [7])
    done = worker.step_chunk([0], toward_target(far, 40))
    distance = np.linalg.norm(far[0, 2:] - far[0, :2])
    assert done["success"][0] and done["terminated"][0] and not done["truncated"][0]
    assert done["reward"][0] == 1.0 and 1 <= done["steps"][0] < 40
    assert done["steps"][0] <= int(np.ceil((distance - 0.15) / 0.1)) + 1
    with pytest.raises(RuntimeError, match="reset it first"):
        worker.step_chunk([0], np.zeros((1, 1, 2), np.float32))

    # Standing still until the horizon: truncated, never successful.
    worker.reset([2], [8])
    idle = worker.step_chunk([2], np.zeros((1, 20, 2), np.float32))
    assert idle["truncated"][0] and not idle["success"][0] and idle["steps"][0] == 12

    with pytest.raises(ValueError, match=r"out of range \[0, 4\)"):
        worker.step_chunk([4], np.zeros((1, 1, 2), np.float32))
    with pytest.raises(ValueError, match=r"actions must have shape \(2, chunk, action_dim\)"):
        worker.step_chunk([1, 3], np.zeros((1, 1, 2), np.float32))
    with pytest.raises(RuntimeError, match="renders no frames"):
        worker.step_chunk([1], np.zeros((1, 1, 2), np.float32), render_indices=[1])
    with pytest.raises(NoExpertError, match="warm_start.num_demos=0"):
        worker.run_expert([0])
    with pytest.raises(ValueError, match="cannot host a task set"):
        SimulatorWorker("point_mass", [point_mass.PointMassConfig()] * 2, 1)


def test_a_spec_that_is_not_an_env_spec_is_refused_naming_the_simulator(point_mass, monkeypatch):
    worker = SimulatorWorker("point_mass", point_mass.PointMassConfig(), 1)
    monkeypatch.setattr(worker._sim, "spec", lambda: {"obs_dim": 4, "action_dim": 2, "horizon": 40})
    with pytest.raises(TypeError, match="simulator 'point_mass': spec\\(\\) must return a vla_rl_core.env_spec.EnvSpec, "
                                        "got dict"):
        worker.spec()


def test_states_of_another_size_than_the_spec_are_refused_naming_the_simulator(point_mass, monkeypatch):
    """A plug-in whose spec() says obs_dim 3 and whose states hold 4 values failed in the rollout's
    set_rows ("shape mismatch"), a traceback naming neither the simulator nor the call."""
    from vla_rl_core.components import ComponentConfigError

    worker = SimulatorWorker("point_mass", point_mass.PointMassConfig(horizon=12), 2)
    monkeypatch.setattr(worker._sim, "spec", lambda: EnvSpec(obs_dim=3, action_dim=2, horizon=12))
    with pytest.raises(ComponentConfigError, match=re.escape("simulator 'point_mass': reset() returned states of "
                                                             "shape (2, 4), its spec() says (2, 3)")) as raised:
        worker.reset([0, 1], [7, 8])
    assert raised.value.field == "simulator.name"
    worker._obs_dim = 4
    worker.reset([0, 1], [7, 8])
    worker._obs_dim = 3
    with pytest.raises(ComponentConfigError, match=re.escape("step_chunk() returned states of shape (2, 4)")):
        worker.step_chunk([0, 1], np.zeros((2, 1, 2), np.float32))


def test_a_chunk_result_refuses_rows_of_another_length_or_dtype():
    good = {"reward": np.zeros(2, np.float32), "terminated": np.zeros(2, bool), "truncated": np.zeros(2, bool),
            "success": np.zeros(2, bool), "steps": np.ones(2, np.int64), "lost": np.zeros(2, bool)}
    ChunkResult(obs=np.zeros((2, 4), np.float32), **good)
    with pytest.raises(ValueError, match=r"ChunkResult.steps must be a int64 array of shape \(2,\)"):
        ChunkResult(obs=np.zeros((2, 4), np.float32), **{**good, "steps": np.ones(3, np.int64)})
    with pytest.raises(ValueError, match="ChunkResult.success must be a bool array"):
        ChunkResult(obs=np.zeros((2, 4), np.float32), **{**good, "success": np.zeros(2, np.float32)})


@pytest.mark.e2e
def test_srpo_trains_a_step_on_the_batched_simulator_through_the_engine(doc_files, tmp_path):
    out = tmp_path / "runs"
    env = child_env(doc_files, REPO_ROOT)
    args = ["train", "embodied_srpo", "run.imports=[point_mass]", "simulator.name=point_mass",
            "simulator.env.horizon=20", "warm_start.num_demos=0", "eval.num_episodes=0",
            "trainer.total_steps=1", "trainer.ppo_epochs=1", "trainer.ppo_mini_batch_size=4",
            "data.init_states_per_step=2", "data.group_size=4", "algorithm.filter_groups.success_rate_band=null",
            "algorithm.filter_groups.zero_variance=false", "policy.config.hidden_sizes=[16]",
            *device_overrides(), f"run.output_dir={out}", "run.name=point_mass"]
    trained = subprocess.run([sys.executable, "-m", "vla_rl.cli", *args], cwd=doc_files, env=env,
                             capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    records = [json.loads(line) for line in (out / "point_mass" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in records if "rollout/success_rate" in r)
    assert step["step"] == 1 and step["actor/num_updates"] >= 1.0
    # 2 initial states (one per worker) x 4 rollouts, each episode 1 to 20 control steps
    assert 8 <= step["rollout/total_env_steps"] <= 8 * 20
    assert (out / "point_mass" / "checkpoints" / "latest").is_file()
    # its evaluation's workers import the plug-in too (they failed: unknown simulator 'point_mass')
    evaluated = subprocess.run([sys.executable, "-m", "vla_rl.cli", "eval", str(out / "point_mass"),
                                "eval.num_episodes=2", "eval.protocols=[greedy]", *device_overrides()],
                               cwd=doc_files, env=env, capture_output=True, text=True, timeout=600)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads((out / "point_mass" / "eval" / "report.json").read_text())
    assert [(r["protocol"], r["episodes"]) for r in report["results"]] == [("greedy", 2)]


_BROKEN_SIMULATORS = '''
import gymnasium as gym
from point_mass import PointMassConfig, PointMassReach
from simulators.registry import SIMULATORS


@SIMULATORS.register("broken_mass")
class BrokenMass(PointMassReach):
    def __init__(self, config, num_envs):
        import gpu_only_library_of_this_test  # noqa: F401  (not installed here)


@SIMULATORS.register("broken_gym_mass")
class BrokenGymMass(gym.Env):
    config_class = PointMassConfig

    def __init__(self, config):
        raise RuntimeError("no display for the renderer")
'''


@pytest.mark.e2e
@pytest.mark.parametrize(("name", "reason"), [
    ("broken_mass", "ModuleNotFoundError: No module named 'gpu_only_library_of_this_test'"),  # in the actor's __init__
    ("broken_gym_mass", "RuntimeError: no display for the renderer"),  # making its environments
])
def test_a_simulator_whose_environments_cannot_be_created_stops_in_one_line(doc_files, tmp_path, name, reason):
    """A plug-in whose constructor raised ended the run in ~100 lines of driver and actor tracebacks
    (and a plug-in whose config class is another module's, ``broken_mass``'s, was unknown to the
    simulator actors: they import the module that registers it now)."""
    (doc_files / "broken_simulators.py").write_text(_BROKEN_SIMULATORS)
    args = ["train", "embodied_srpo", "run.imports=[broken_simulators]", f"simulator.name={name}",
            "warm_start.num_demos=0", "eval.num_episodes=0", "trainer.total_steps=1", *device_overrides(),
            f"run.output_dir={tmp_path}", "run.name=broken"]
    done = subprocess.run([sys.executable, "-m", "vla_rl.cli", *args], cwd=doc_files,
                          env=child_env(doc_files, REPO_ROOT), capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    expected = rf"error: worker \d: simulator.name: simulator '{name}': its environments cannot be created " \
               rf"\({re.escape(reason)}\)"
    assert len(errors) == 1 and re.fullmatch(expected, errors[0]), done.stderr[-3000:]
    assert "Traceback" not in done.stderr.split("error:")[-1]
