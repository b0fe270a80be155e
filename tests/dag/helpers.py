"""Dummy node functions, registered under test-only names on import, and node-list helpers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from vla_rl.dag.registry import NodeOutput, register_node

DUMMY = "test_dummy"
DUMMY_WITH_CONFIG = "test_dummy_cfg"
DUMMY_REFILLING = "test_dummy_refilling"
DUMMY_CRITIC_UPDATE = "test_dummy_critic_update"
DUMMY_WHOLE_SECTION = "test_dummy_whole_section"
DUMMY_WARM_START = "test_dummy_warm_start"
DUMMY_POLICY_USER = "test_dummy_policy_user"


class DummyRewardConfig(BaseModel):
    """Config model of the ``(reward, compute, test_dummy_cfg)`` function."""

    model_config = ConfigDict(extra="forbid")
    reward: Literal["success", "progress"] = "success"
    scale: float = 1.0


def _noop(ctx: Any, batch: Any) -> NodeOutput:
    return NodeOutput(batch=batch)


for _role, _type in [
    ("data", "data_load"),
    ("rollout", "env_interact"),
    ("reward", "compute"),
    ("advantage", "compute"),
]:
    register_node(_role, _type, name=DUMMY)(_noop)
# Like the real model updates, the dummy update takes single samples (see Reshard.whole_groups).
register_node("actor", "model_train", name=DUMMY, whole_groups=False)(_noop)
register_node("reward", "compute", name=DUMMY_WITH_CONFIG, config=DummyRewardConfig)(_noop)


def register_settings_readers() -> None:
    """Register dummy functions that alone read some run settings (as the critic nodes read
    ``critic``, dynamic sampling ``algorithm.filter_groups.max_refill_rounds``); the fixture
    ``settings_readers`` removes them after the test, since the planner checks every template's
    overrides against every registered function."""
    register_node("critic", "model_inference", name=DUMMY, resources=("critic",), settings=("critic",))(_noop)
    register_node("critic", "model_train", name=DUMMY_CRITIC_UPDATE,  # a plug-in's, its resources a function
                  resources=lambda run_config, node_config: ("critic",))(_noop)
    register_node("reward", "compute", name=DUMMY_REFILLING,
                  settings=["algorithm.filter_groups.zero_variance",
                            "algorithm.filter_groups.max_refill_rounds"])(_noop)
    register_node("reward", "compute", name=DUMMY_WHOLE_SECTION, settings=["algorithm.filter_groups"])(_noop)
    # as the text warm start's fine-tuning: the policy resource, a setting of another section, one phase
    register_node("actor", "model_train", name=DUMMY_WARM_START, resources=("policy",),
                  settings=("trainer.max_grad_norm",), phases=("warm_start",))(_noop)
    register_node("actor", "model_train", name=DUMMY_POLICY_USER, whole_groups=False, resources=("policy",))(_noop)


def node(node_id: str, role: str, type: str, deps: Sequence[str] = (), **fields: Any) -> dict[str, Any]:
    """A node mapping served by a dummy function."""
    return {"id": node_id, "role": role, "type": type, "fn": DUMMY, "deps": list(deps), **fields}


def pipeline(reward_dp: int | None = None) -> list[dict[str, Any]]:
    """tasks -> rollout -> reward -> adv -> actor, the reward node at DP size ``reward_dp``."""
    reward = node("reward", "reward", "compute", ["rollout"])
    if reward_dp is not None:
        reward["dp_size"] = reward_dp
    return [
        node("tasks", "data", "data_load"),
        node("rollout", "rollout", "env_interact", ["tasks"]),
        reward,
        node("adv", "advantage", "compute", ["reward"]),
        node("actor", "actor", "model_train", ["adv"]),
    ]
