"""Policies built on a device read a checkpoint's weights straight onto it, one tensor at a
time: a GPU worker's host never holds a copy of a 7.5 B model before it reaches the GPU.

The ``meta`` device stands for the accelerator: a tensor read to the CPU and moved afterwards
would reach ``load_state_dict`` on the CPU, which the spy below sees."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from policies import make_policy
from policies.causal_lm.loading import load_pretrained
from policies.openvla.checkpoint_prismatic import read_checkpoint
from policies.openvla_oft import OpenVLAOFTPolicyConfig
from policies.pi0 import PI0PolicyConfig

TINY = {
    "openvla_oft": lambda **fields: OpenVLAOFTPolicyConfig(**{"architecture": {"preset": "tiny", "fused": False},
                                                             "action_dim": 7, "chunk_size": 3, "proprio_dim": 3,
                                                             **fields}),
    # the tiny π0 pads actions to 5 values and the state to 6
    "pi0": lambda **fields: PI0PolicyConfig(**{"architecture": "tiny", "action_dim": 3, "proprio_dim": 4, **fields}),
}


@pytest.fixture
def loaded_devices(monkeypatch) -> list[set]:
    """The devices of the tensors every ``load_state_dict`` call received, one set per call."""
    calls: list[set] = []
    real = nn.Module.load_state_dict

    def spy(module, state_dict, *args, **kwargs):
        calls.append({tensor.device.type for tensor in state_dict.values()})
        return real(module, state_dict, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "load_state_dict", spy)
    return calls


def _checkpoint(name: str, tmp_path):
    torch.manual_seed(0)
    policy = make_policy(name, TINY[name]())
    directory = policy.save_pretrained(tmp_path / name)
    model_path = {"model_path": str(directory)}
    if name == "pi0":  # a checkpoint directory holds its architecture; the tokenizer is the tiny one's
        model_path |= {"architecture": None, "tokenizer_path": str(directory)}
    else:
        model_path |= {"architecture": None}
    return policy, TINY[name](**model_path)


@pytest.mark.parametrize("name", ["openvla_oft", "pi0"])
def test_a_checkpoint_is_read_onto_the_policys_device(name, tmp_path, loaded_devices):
    _, config = _checkpoint(name, tmp_path)
    loaded_devices.clear()
    on_meta = make_policy(name, config, device="meta")
    assert loaded_devices and {"meta"} in loaded_devices  # the model's weights arrived on the device
    assert all(devices <= {"meta"} or devices <= {"cpu"} for devices in loaded_devices)
    assert {t.device.type for t in [*on_meta.parameters(), *on_meta.buffers()]} == {"meta"}
    # on the CPU, the same weights as without a device
    on_cpu = make_policy(name, config, device="cpu")
    default = make_policy(name, dataclasses.replace(config))
    assert list(on_cpu.state_dict()) == list(default.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(on_cpu.state_dict().values(), default.state_dict().values()))


def test_prismatic_weights_are_read_onto_the_requested_device(tmp_path):
    _, config = _checkpoint("openvla_oft", tmp_path)
    _, weights, _ = read_checkpoint(config.model_path, device="meta")
    assert weights and {tensor.device.type for tensor in weights.values()} == {"meta"}


def test_a_causal_lm_is_loaded_onto_the_requested_device(tiny_lm_dir):
    model, _ = load_pretrained(tiny_lm_dir, device="meta")
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"meta"}
    model, _ = load_pretrained(tiny_lm_dir)
    assert {t.device.type for t in model.parameters()} == {"cpu"}


def test_a_policy_without_builds_on_device_is_built_and_moved():
    from policies.mlp import MLPPolicyConfig

    policy = make_policy("mlp", MLPPolicyConfig(obs_dim=5, action_dim=7, hidden_sizes=(16,)), device="meta")
    assert {t.device.type for t in [*policy.parameters(), *policy.buffers()]} == {"meta"}
