"""The embodied workflow's policy: built for the worker's simulator sizes, and a model directory
that does not fit them reported as its setting (one line from the driver), not a traceback."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from policies.mlp.configuration_mlp import MLPPolicyConfig
from policies.mlp.modeling_mlp import MLPPolicy
from vla_rl.dag.loader import load_template
from vla_rl.workflows.embodied import EmbodiedWorkflow
from vla_rl_core.components import ComponentConfigError
from vla_rl_core.env_spec import EnvSpec


def test_a_model_directory_saved_for_other_simulator_sizes_names_its_setting(tmp_path):
    """A ValueError here became a 70-line Ray traceback from every worker."""
    saved = MLPPolicy(MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,))).save_pretrained(tmp_path / "mlp")
    config = load_template("embodied_srpo", [f"policy.config.model_path={saved}", "policy.config.hidden_sizes=[8]"]).config
    res = SimpleNamespace(config=config, device=torch.device("cpu"),
                          env_spec=EnvSpec(obs_dim=11, action_dim=7, horizon=10))
    with pytest.raises(ComponentConfigError, match="holds an MLP policy for obs_dim 15, the simulator gives 11") as error:
        EmbodiedWorkflow().build_policy(res)
    assert error.value.field == "policy.config.model_path"
    res.env_spec = EnvSpec(obs_dim=15, action_dim=7, horizon=10)
    assert EmbodiedWorkflow().build_policy(res).config.obs_dim == 15


@pytest.mark.parametrize(("setting", "value", "match"), [
    ("target_modules", "[q_proj,v_prj]", r"\['v_prj'\] name no trainable linear layer"),
    ("trainable_modules", "[proprio_projectr]", "the policy has no submodule 'proprio_projectr'"),
])
def test_a_lora_setting_the_worker_cannot_apply_names_its_field(setting, value, match):
    """What the pre-flight cannot check (a policy it cannot build on the meta device) stops the
    worker with the field named, which the driver prints in one line (before: ``policy.lora:`` in
    a ValueError, a Ray traceback)."""
    config = load_template("embodied_grpo_oft_lift", ["policy.lora.rank=4", f"policy.lora.{setting}={value}"]).config
    res = SimpleNamespace(config=config, device=torch.device("cpu"),
                          env_spec=EnvSpec(obs_dim=9, action_dim=7, horizon=10))
    policy = EmbodiedWorkflow().build_policy(res)
    from vla_rl.workflows.base import apply_lora

    with pytest.raises(ComponentConfigError, match=match) as error:
        apply_lora(policy, config.policy.lora, seed=0)
    assert error.value.field == f"policy.lora.{setting}"
