"""docs/extending.md's policy family (a linear Gaussian policy in one module), written out as the
doc gives it: its log-probs are its samples', it is built through the registry from a config the
engine fills, and it trains one SRPO step on the doc's batched point mass through the unchanged
engine (in a subprocess, so that it never enters this process's registries for good)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from child_env import child_env
from devices import device_overrides, device_under_test
from test_extending import write_doc_files

from policies import POLICIES, make_policy
from vla_rl.dag.loader import REPO_ROOT


@pytest.fixture(scope="module")
def doc_files(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("doc")
    assert {"point_mass.py", "linear_gaussian.py"} <= set(write_doc_files(directory))
    return directory


def test_the_documented_policy_scores_its_own_samples(doc_files, monkeypatch):
    POLICIES.load_builtins()
    for store in ("_entries", "_configs", "_traits"):  # this test's copy of the registry
        monkeypatch.setattr(POLICIES, store, dict(getattr(POLICIES, store)))
    spec = importlib.util.spec_from_file_location("linear_gaussian_doc", doc_files / "linear_gaussian.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    policy = make_policy("linear_gaussian", module.LinearGaussianConfig(obs_dim=4, action_dim=2))
    obs = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    actions, log_probs = policy.sample_actions(obs, generator=torch.Generator().manual_seed(1))
    assert actions.shape == (5, 1, 2) and log_probs.shape == (5, 1)
    scored, entropy = policy.log_prob_and_entropy(obs, actions)
    torch.testing.assert_close(scored, log_probs)
    import math

    per_dim = 0.5 + 0.5 * math.log(2 * math.pi) + math.log(0.3)  # a Gaussian's entropy, std 0.3 (init_std)
    torch.testing.assert_close(entropy, torch.full((5, 1), 2 * per_dim))
    greedy, _ = policy.sample_actions(obs, greedy=True)
    torch.testing.assert_close(greedy[:, 0], policy.mean(obs))
    assert policy.bc_loss(obs, greedy).item() == 0.0
    # as a CUDA worker's rollout samples: in bfloat16 autocast, with the worker's CPU generator
    policy.to(device_under_test())
    for greedy in (False, True):
        with torch.no_grad(), torch.autocast(policy.mean.weight.device.type, dtype=torch.bfloat16):
            actions, log_probs = policy.sample_actions(obs, greedy=greedy, generator=torch.Generator().manual_seed(1))
        assert actions.dtype == log_probs.dtype == torch.float32 and actions.device == policy.mean.weight.device


@pytest.mark.e2e
def test_the_documented_policy_trains_a_step_on_the_documented_simulator(doc_files, tmp_path):
    out = tmp_path / "runs"
    env = child_env(doc_files, REPO_ROOT)
    args = ["train", "embodied_srpo", "run.imports=[point_mass,linear_gaussian]", "simulator.name=point_mass",
            "policy.name=linear_gaussian", "simulator.env.horizon=20", "warm_start.num_demos=0",
            "eval.num_episodes=0", "trainer.total_steps=1", "trainer.ppo_epochs=1", "trainer.ppo_mini_batch_size=4",
            "data.init_states_per_step=2", "data.group_size=4", "algorithm.filter_groups.success_rate_band=null",
            "algorithm.filter_groups.zero_variance=false", *device_overrides(), f"run.output_dir={out}",
            "run.name=linear"]
    trained = subprocess.run([sys.executable, "-m", "vla_rl.cli", *args], cwd=doc_files, env=env,
                             capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    records = [json.loads(line) for line in (out / "linear" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in records if "rollout/success_rate" in r)
    assert step["actor/num_updates"] >= 1.0 and 8 <= step["rollout/total_env_steps"] <= 8 * 20
    assert step["actor/approx_kl"] < 1e-3  # one epoch, a few minibatches from the rollout's own policy
