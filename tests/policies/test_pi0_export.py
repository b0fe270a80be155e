"""π0's export (``PI0Policy.save_pretrained``): the directory ``policy.config.model_path`` loads
back alone (model, statistics, tokenizer, Flow-Noise head), written atomically."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from policies import make_policy
from policies.pi0.policy_pi0 import PI0Policy
from tests.policies.pi0_helpers import (
    INSTRUCTIONS,
    MEAN_STD,
    STATISTICS,
    camera_obs,
    tiny_config,
)


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_one_thread):
    """Small models on the shared machines run fastest on one thread."""


def trained(policy: PI0Policy, seed: int) -> PI0Policy:
    """Move every parameter (model and noise head) off its seeded initialisation, as training would."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return policy


def reloaded(policy: PI0Policy, out, **overrides) -> PI0Policy:
    """``out`` loaded as ``model_path`` with the source's settings, the statistics left to its
    norm_stats.json and another seed (a noise head not read from ``out`` would differ)."""
    fields = {"model_path": str(out), "architecture": None, "action_statistics": None, "proprio_statistics": None,
              "seed": policy.config.seed + 7}
    return PI0Policy(dataclasses.replace(policy.config, **{**fields, **overrides}))


@pytest.mark.parametrize(("normalization", "sampler", "layout"), [
    ("bounds_q99", "flow_sde", "lerobot"),
    ("mean_std", "flow_noise", "lerobot"),
    ("bounds_q99", "flow_noise", "openpi"),
])
def test_save_pretrained_round_trips_through_model_path(tmp_path, normalization, sampler, layout):
    """The exported directory, as model_path alone (architecture null, no tokenizer_path, no
    statistics in the config), gives the same parameters, statistics (with the action mask),
    tokenizer ids, noise head and sampled / greedy actions."""
    statistics = STATISTICS if normalization == "bounds_q99" else MEAN_STD
    policy = trained(make_policy("pi0", tiny_config(normalization=normalization, sampler=sampler, seed=5,
                                                    action_statistics=statistics)), seed=6)
    policy.fit_observation_normalization(camera_obs(8, 20))
    out = policy.save_pretrained(tmp_path / "pi0", layout=layout)
    stored = json.loads((out / "norm_stats.json").read_text())["norm_stats"]
    assert set(stored) == {"actions", "state"}
    assert (out / "pi0_noise_head.safetensors").is_file() == (sampler == "flow_noise")
    assert (out / "tokenizer_config.json").is_file()
    loaded = reloaded(policy, out)
    assert loaded.config.tokenizer_path is None and loaded.config.architecture is None
    want, got = policy.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    for prefix in ("action", "proprio"):
        source, copy = getattr(policy, f"{prefix}_statistics"), getattr(loaded, f"{prefix}_statistics")
        assert type(copy) is type(source)
        for field in dataclasses.fields(source):
            assert torch.equal(getattr(copy, field.name), getattr(source, field.name))
    if normalization == "bounds_q99":
        assert loaded.action_mask.tolist() == STATISTICS["mask"]
    for text in INSTRUCTIONS:
        assert loaded.tokenizer(text)["input_ids"] == policy.tokenizer(text)["input_ids"]
    obs = camera_obs(3, 21)
    for greedy in (False, True):
        own, log_probs = policy.sample_actions(obs, greedy=greedy, generator=torch.Generator().manual_seed(2))
        own_2, log_probs_2 = loaded.sample_actions(obs, greedy=greedy, generator=torch.Generator().manual_seed(2))
        assert torch.equal(own_2, own) and torch.equal(log_probs_2, log_probs)
        assert torch.equal(loaded.env_actions(own), policy.env_actions(own))


def test_save_pretrained_without_statistics_writes_no_norm_stats(tmp_path):
    policy = make_policy("pi0", tiny_config())
    out = policy.save_pretrained(tmp_path / "pi0")
    assert not (out / "norm_stats.json").exists()
    loaded = reloaded(policy, out)
    assert loaded.action_statistics is None and loaded.proprio_statistics is None


def test_a_directory_without_a_tokenizer_loads_with_tokenizer_path_as_openpi_s_conversions_need(tmp_path):
    """openpi's converted checkpoints hold no tokenizer: the policy (as ``vla-rl serve`` builds it)
    says to set tokenizer_path, and loads with it."""
    policy = make_policy("pi0", tiny_config())
    out = policy.save_pretrained(tmp_path / "pi0", layout="openpi")
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (out / name).exists():
            (out / name).rename(tokenizer / name)
    with pytest.raises(ValueError, match=r"no usable tokenizer.*; or set tokenizer_path to a directory holding the "
                                         r"model's tokenizer \(PaliGemma's for openpi's checkpoints\)"):
        reloaded(policy, out)
    assert reloaded(policy, out, tokenizer_path=str(tokenizer)).tokenizer("lift")["input_ids"] == (
        policy.tokenizer("lift")["input_ids"])


def test_save_pretrained_refuses_an_existing_directory_and_leaves_nothing_behind(tmp_path):
    policy = make_policy("pi0", tiny_config())
    existing = tmp_path / "out"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="exists"):
        policy.save_pretrained(existing)
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]
    with pytest.raises(ValueError, match="layout"):
        policy.save_pretrained(tmp_path / "new", layout="jax")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging directory left


def test_an_exported_noise_head_loads_only_into_matching_flow_noise_settings(tmp_path):
    policy = trained(make_policy("pi0", tiny_config(sampler="flow_noise", noise_hidden_dims=(8,))), seed=1)
    out = policy.save_pretrained(tmp_path / "pi0")
    with pytest.raises(ValueError, match="noise_hidden_dims"):
        reloaded(policy, out, noise_hidden_dims=(16,))
    with pytest.raises(ValueError, match="noise_min_std"):
        reloaded(policy, out, noise_min_std=0.05)
    sde = reloaded(policy, out, sampler="flow_sde")  # the noise head is Flow-Noise's: Flow-SDE ignores it
    assert all(torch.equal(sde.model.state_dict()[name], tensor) for name, tensor in policy.model.state_dict().items())
    # A checkpoint without the file (openpi's, LeRobot's) starts a new noise head.
    (out / "pi0_noise_head.safetensors").unlink()
    fresh = reloaded(policy, out)
    assert not torch.equal(fresh.sampler.noise_head.mlp[0].weight, policy.sampler.noise_head.mlp[0].weight)
