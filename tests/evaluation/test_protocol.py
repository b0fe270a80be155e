"""Action protocols: the protocol, not the caller, decides greedy or sampled and the temperature."""

from __future__ import annotations

import pytest
import torch

from policies import make_policy
from policies.mlp import MLPPolicyConfig
from vla_rl.config import EvalSection
from vla_rl.evaluation.protocol import Protocol, ProtocolPolicy, eval_protocols


def test_protocols_of_the_eval_section():
    protocols = eval_protocols(EvalSection(protocols=["sampled", "greedy"], temperature=0.7))
    assert protocols == [Protocol("sampled", False, 0.7), Protocol("greedy", True, 0.0)]
    assert [p.label for p in protocols] == ["sampled@0.7", "greedy"]


def test_protocol_policy_forwards_the_temperature():
    policy = make_policy("mlp", MLPPolicyConfig(obs_dim=3, action_dim=2, hidden_sizes=(4,)))
    obs = torch.randn(5, 3)
    sampled = ProtocolPolicy(policy, Protocol("sampled", False, 0.5))
    assert sampled.chunk_size == 1
    got = sampled.sample_actions(obs, greedy=True, generator=torch.Generator().manual_seed(1))
    want = policy.sample_actions(obs, generator=torch.Generator().manual_seed(1), temperature=0.5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    greedy, _ = ProtocolPolicy(policy, Protocol("greedy", True, 0.0)).sample_actions(obs, greedy=False)
    torch.testing.assert_close(greedy[:, 0], policy.action_mean(obs), rtol=0, atol=0)


# --------------------------------------------------------------------------- a policy without an action distribution
L1_HEAD = "policy.config.action_head=l1_regression"


def test_the_sampled_protocol_of_an_l1_head_policy_is_refused_at_plan_time():
    from vla_rl.dag.errors import TemplateError
    from vla_rl.dag.loader import load_template
    from vla_rl.dag.planner import plan

    oft = ["policy.name=openvla_oft", "policy.config={architecture: tiny, action_head: l1_regression}",
           "simulator.env.cameras=[agentview]"]  # the camera the policy reads
    with pytest.raises(TemplateError, match=r"eval\.protocols.*policy\.config\.action_head 'l1_regression'.*"
                                            r"eval\.protocols=\[greedy\]"):
        plan(load_template("eval_rollout", [*oft, "eval.protocols=[greedy,sampled]"]))
    plan(load_template("eval_rollout", [*oft, "eval.protocols=[greedy]"]))  # greedy: its regression
    plan(load_template("eval_rollout", ["policy.name=openvla_oft", "policy.config={architecture: tiny}",
                                        "simulator.env.cameras=[agentview]",
                                        "eval.protocols=[greedy,sampled]"]))  # the discrete head samples


@pytest.mark.parametrize("template", ["embodied_grpo_oft_lift", "embodied_srpo_oft_lift", "embodied_grpo_oft_libero",
                                      "embodied_srpo_oft_libero"])
def test_rl_templates_refuse_the_l1_head_naming_the_field(template):
    from vla_rl.dag.errors import TemplateError
    from vla_rl.dag.loader import load_template
    from vla_rl.dag.planner import plan

    plan(load_template(template))  # the templates' discrete head
    with pytest.raises(TemplateError, match=r"node 'rollout': field 'policy\.config\.action_head'.*log-probs") as error:
        plan(load_template(template, [L1_HEAD, "eval.protocols=[greedy]"]))
    assert "'l1_regression'" in str(error.value)

