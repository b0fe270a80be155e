"""The advantage node's KL penalty in the reward (``algorithm.use_kl_in_reward``): a decision's
KL is the sum of its executed actions' estimates, checked against a hand computation."""

from __future__ import annotations

import math
import types

import pytest
import torch
from tensordict import TensorDict

from vla_rl.algorithms.kl import FixedKLController
from vla_rl.config import AlgorithmSection, RunConfig
from vla_rl.nodes.advantage import kl_reward_penalty
from vla_rl_core import keys

N, T, C, A = 2, 3, 4, 7


def k3(log_ratio: float) -> float:
    """Schulman's k3 of one log-ratio log(pi_ref / pi_theta), by hand."""
    return math.exp(log_ratio) - 1.0 - log_ratio


def kl_batch(gap_per_dim: float) -> TensorDict:
    """Two episodes of 3 decisions of 4 actions of 7 dimensions; the reference's log-prob of every
    dimension ``gap_per_dim`` above the rollout's. Episode 0 executes 10 actions (its last chunk
    half), episode 1 takes 2 decisions and executes all 8 of their actions."""
    generator = torch.Generator().manual_seed(0)
    dims = -torch.rand(N, T, C, A, generator=generator)  # the rollout's per-dimension log-probs
    mask = torch.tensor([[True, True, True], [True, True, False]])
    control_steps = torch.tensor([10, 8])
    executed = (torch.arange(T * C).view(T, C) < control_steps[:, None, None]) & mask[..., None]  # (N, T, C)
    dims = torch.where(executed[..., None], dims, 0.0)  # actions that never ran: log-prob 0
    reference = torch.where(executed[..., None], dims + gap_per_dim, 0.0)
    return TensorDict({keys.RESPONSE_MASK: mask, keys.CONTROL_STEPS: control_steps,
                       keys.OLD_LOG_PROBS: dims.sum(dim=-1), keys.REF_LOG_PROBS: reference}, batch_size=[N])


def context(estimator: str, beta: float) -> types.SimpleNamespace:
    algorithm = AlgorithmSection(use_kl_in_reward=True, kl_penalty=estimator)
    return types.SimpleNamespace(config=types.SimpleNamespace(algorithm=algorithm), group=None, replicas=1,
                                 resources=types.SimpleNamespace(kl_ctrl=FixedKLController(beta)))


@pytest.mark.parametrize("estimator", ["k1", "k2", "abs", "k3"])
def test_a_decisions_kl_is_the_sum_of_its_executed_actions_estimates(process_group, estimator):
    """0.1 per dimension: 0.7 per action, 2.8 per chunk. k3 of a whole chunk's log-ratio, 12.6,
    was clamped to verl's per-token bound of 10 (its gradient and its signal lost); the sum of the
    four actions' k3 is 4 x 0.314. Actions that never ran add nothing (episode 0's last decision
    executed 2 of 4)."""
    per_action = {"k1": -0.7, "k2": 0.5 * 0.7 ** 2, "abs": 0.7, "k3": k3(0.7)}[estimator]
    penalty, metrics = kl_reward_penalty(context(estimator, beta=0.5), kl_batch(0.1))
    executed_per_decision = torch.tensor([[4, 4, 2], [4, 4, 0]], dtype=torch.float64)
    expected = 0.5 * per_action * executed_per_decision
    torch.testing.assert_close(penalty.to(torch.float64), expected, rtol=1e-5, atol=1e-6)
    # the controller's KL: the mean over episodes of each episode's mean over its decisions
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(per_action * (10 / 3 + 8 / 2) / 2, rel=1e-5)
    if estimator == "k3":
        assert float(penalty.max()) == pytest.approx(0.5 * 4 * k3(0.7), rel=1e-5) and k3(2.8) > 10


@pytest.mark.parametrize(("overrides", "refused"), [
    (["algorithm.adv_estimator=grpo"], False),
    (["algorithm.adv_estimator=rloo"], False),
    (["algorithm.adv_estimator=reinforce_plus_plus_baseline"], False),
    (["algorithm.adv_estimator=reinforce_plus_plus"], False),  # gamma 1: the outcome at every step
    (["algorithm.adv_estimator=reinforce_plus_plus", "algorithm.reinforce_plus_plus.gamma=0.9"], True),
])
def test_gspo_with_advantages_that_vary_along_a_row_is_refused_by_the_plan(overrides, refused):
    """GSPO's sequence loss raised on them in the actor's first update, a Ray traceback after the
    warm start and a rollout (an audit: embodied_ppo algorithm.policy_loss=gspo); the estimator is
    judged by what it computes, so REINFORCE++ at gamma 1 (constant returns) stays allowed."""
    from vla_rl.dag.errors import TemplateError
    from vla_rl.dag.loader import load_template
    from vla_rl.dag.planner import plan

    loaded = load_template("embodied_grpo", ["algorithm.policy_loss=gspo", *overrides])
    if not refused:
        plan(loaded)
        return
    with pytest.raises(TemplateError, match=r"'gspo' takes one advantage per sequence, and advantage estimator "
                                            r"'reinforce_plus_plus' \(algorithm.adv_estimator\) gives each step its "
                                            r"own; use policy_loss 'gspo_token'") as error:
        plan(loaded)
    assert error.value.field == "algorithm.policy_loss"
    with pytest.raises(TemplateError, match=r"'gae' \(algorithm.adv_estimator\) gives each step its own"):
        plan(load_template("embodied_ppo", ["algorithm.policy_loss=gspo"]))


@pytest.mark.parametrize(("estimator", "varies"), [("reinforce_plus_plus", True), ("grpo", False)])
def test_gspo_check_counts_the_kl_penalty_in_the_rewards(estimator, varies):
    """With ``algorithm.use_kl_in_reward`` every step carries its own penalty: REINFORCE++'s returns
    (constant along a row at gamma 1 without it) then vary along the row and GSPO is refused; GRPO
    sums a row's rewards into one score, so it stays allowed."""
    from vla_rl.dag.errors import TemplateError
    from vla_rl.dag.loader import load_template
    from vla_rl.dag.planner import plan
    from vla_rl.nodes.advantage import advantages_vary_within_rows

    def config(kl: bool) -> RunConfig:
        return RunConfig.model_validate({"algorithm": {"adv_estimator": estimator, "use_kl_in_reward": kl}})

    assert advantages_vary_within_rows(config(True)) is varies
    assert advantages_vary_within_rows(config(False)) is False
    if varies:  # the plan names the penalty (the shipped templates have no reference node for it to read)
        with pytest.raises(TemplateError, match=r"'reinforce_plus_plus' \(algorithm.adv_estimator\) with "
                                                r"algorithm.use_kl_in_reward \(a penalty at every step\) gives each"):
            plan(load_template("llm_gspo", [f"algorithm.adv_estimator={estimator}", "algorithm.use_kl_in_reward=true"]))


@pytest.mark.parametrize(("template", "overrides", "refused"), [
    ("embodied_grpo", [], True),
    ("llm_grpo", ["algorithm.adv_estimator=rloo"], True),
    ("embodied_ppo", [], False),  # GAE compares each step with the critic's value, not with a group
])
def test_a_group_relative_estimator_with_groups_of_one_is_refused_by_the_plan(template, overrides, refused):
    """Groups of one sample give every advantage 0 under a group-relative estimator: nothing would
    train, so the plan names ``data.group_size``; groups of 2 are enough."""
    from vla_rl.dag.errors import TemplateError
    from vla_rl.dag.loader import load_template
    from vla_rl.dag.planner import plan

    plan(load_template(template, [*overrides, "data.group_size=2"]))
    if not refused:
        plan(load_template(template, [*overrides, "data.group_size=1"]))
        return
    with pytest.raises(TemplateError, match=r"compares the samples of a group, so data.group_size must be at least "
                                            r"2 \(got 1: every advantage would be 0") as error:
        plan(load_template(template, [*overrides, "data.group_size=1"]))
    assert error.value.field == "data.group_size" and error.value.node == "advantage"


def test_gspo_check_leaves_an_estimator_that_raises_on_the_made_up_batch_to_the_actor(monkeypatch, caplog):
    """A plug-in estimator that raises on the check's made-up batch (it may need more than 4 rows
    of 5 steps) was a traceback from ``plan``; the plan now warns and leaves the check to the actor."""
    import vla_rl.nodes.advantage as advantage_module
    from vla_rl.dag.loader import load_template
    from vla_rl.dag.planner import plan

    def needs_more_rows(*args, **kwargs):
        raise ValueError("needs 8 rows")

    monkeypatch.setattr(advantage_module.ADVANTAGE_ESTIMATORS, "get", lambda name: needs_more_rows)
    with caplog.at_level("WARNING", logger="vla_rl.nodes.advantage"):
        plan(load_template("embodied_grpo", ["algorithm.policy_loss=gspo"]))
    assert "cannot tell whether advantage estimator 'grpo' gives each step its own advantage (it raised ValueError" \
        in caplog.text


def test_the_penalty_uses_the_coefficient_before_the_update_and_ignores_actions_that_never_ran(process_group):
    """k2 with 0.1 per dimension: 0.245 per executed action. The reference scores every action,
    those that never ran too (the rollout's are 0 there): they add nothing. The adaptive
    controller moves after the penalty is taken, by the episodes of one replica: x (1 + 0.2 * 1 / 10)."""
    from vla_rl.algorithms.kl import AdaptiveKLController

    batch = kl_batch(0.1)
    dims = -torch.rand(N, T, C, A, generator=torch.Generator().manual_seed(1))
    batch.set(keys.REF_LOG_PROBS, torch.where(batch[keys.REF_LOG_PROBS] != 0, batch[keys.REF_LOG_PROBS], dims))
    ctx = context("k2", beta=0.5)
    ctx.replicas = 2  # each episode counted twice in the all-reduce: n_steps = 2 episodes / 2
    ctx.resources.kl_ctrl = AdaptiveKLController(kl_coef=0.5, target_kl=0.01, horizon=10)
    penalty, metrics = kl_reward_penalty(ctx, batch)
    expected = 0.5 * (0.5 * 0.7 ** 2) * torch.tensor([[4, 4, 2], [4, 4, 0]], dtype=torch.float64)
    torch.testing.assert_close(penalty.to(torch.float64), expected, rtol=1e-5, atol=1e-6)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5
    assert ctx.resources.kl_ctrl.value == pytest.approx(0.5 * (1 + 0.2 * 1 / 10))


def test_the_node_subtracts_the_kl_penalty_from_the_rewards(process_group):
    """token_level_rewards = the outcome on each episode's last decision - beta * KL per decision."""
    from vla_rl.nodes.advantage import compute_advantages

    batch = kl_batch(0.1)
    batch.set(keys.REWARDS, torch.tensor([1.0, 0.0]))
    batch.set(keys.UID, torch.tensor([0, 0]))
    ctx = context("k2", beta=0.5)
    ctx.config.algorithm = AlgorithmSection(use_kl_in_reward=True, kl_penalty="k2", adv_estimator="grpo")
    ctx.dp_size = 1
    out = compute_advantages(ctx, batch)
    penalty = 0.5 * (0.5 * 0.7 ** 2) * torch.tensor([[4, 4, 2], [4, 4, 0]], dtype=torch.float64)
    outcome = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(out.batch[keys.TOKEN_LEVEL_REWARDS].to(torch.float64), outcome - penalty,
                               rtol=1e-5, atol=1e-6)
