"""Tests for policies/__init__.py (registry, factory) and policies/base.py (contract checks)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from child_env import child_env

from policies import available_policies, make_policy
from policies.base import Policy
from policies.mlp import MLPPolicy, MLPPolicyConfig
from vla_rl_core.registry import RegistryError


@dataclasses.dataclass
class _Config:
    size: int = 1


def test_subclass_without_name_fails_at_definition():
    with pytest.raises(TypeError, match="must set the class attribute `name`"):

        class NoName(Policy):
            config_class = _Config


def test_subclass_without_dataclass_config_fails_at_definition():
    with pytest.raises(TypeError, match="`config_class`"):

        class NoConfig(Policy):
            name = "no_config"

    with pytest.raises(TypeError, match="`config_class`"):

        class PlainConfig(Policy):
            name = "plain_config"
            config_class = dict


def test_abstract_intermediate_base_is_allowed():
    class Intermediate(Policy, abstract=True):
        pass

    with pytest.raises(TypeError, match="`name`"):

        class Concrete(Intermediate):
            config_class = _Config


def test_factory_builds_registered_policy():
    assert "mlp" in available_policies()
    policy = make_policy("mlp", MLPPolicyConfig(obs_dim=3, action_dim=2, hidden_sizes=(4,)))
    assert isinstance(policy, MLPPolicy) and policy.action_dim == 2 and policy.chunk_size == 1


def test_factory_unknown_name_lists_known_names():
    with pytest.raises(RegistryError, match=r"unknown policy 'nope'; known: .*mlp"):
        make_policy("nope", MLPPolicyConfig(obs_dim=3, action_dim=2))


def test_factory_rejects_wrong_config_type():
    with pytest.raises(TypeError, match="needs a MLPPolicyConfig"):
        make_policy("mlp", _Config())


def test_importing_configs_does_not_import_torch():
    code = (
        "import sys, policies, policies.mlp, policies.mlp.configuration_mlp; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    repo_root = str(Path(__file__).resolve().parents[2])
    subprocess.run([sys.executable, "-c", code], check=True, cwd=repo_root, env=child_env(repo_root))
