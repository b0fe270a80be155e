"""What the actor update counts: the KL loss to a copy of the policy (0 at the first minibatch, each
dimension's estimate summed over its unit), the entropy bonus and the entropy as a metric only,
an empty shard, the steps after an episode's end and the actions that never ran (no units of the
update), and diverged updates skipped, then stopping the run (the first ratio and the
minibatches: test_actor.py)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from test_actor import ACT_DIM, TINY_CONFIGS, rollout_batch, spy_on_losses, update_config

from policies import make_policy
from vla_rl.algorithms.granularity import executed_actions
from vla_rl.algorithms.policy_loss import POLICY_LOSSES
from vla_rl.trainers.actor import ActorTrainer, per_dim_log_probs
from vla_rl_core import keys


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_one_thread):
    """Small models on the shared machines run fastest on one thread."""


def test_kl_loss_to_a_copy_of_the_policy_is_zero_at_the_first_minibatch(process_group, device, monkeypatch):
    torch.manual_seed(0)
    policy = make_policy("mlp", TINY_CONFIGS["mlp"]()).to(device)
    batch = rollout_batch(policy)
    reference = copy.deepcopy(policy).requires_grad_(False)
    batch.set(keys.REF_LOG_PROBS, per_dim_log_probs(reference, batch))
    config = update_config("ppo_clip", "token", use_kl_loss=True, kl_loss_coef=0.5, ppo_epochs=2)
    trainer = ActorTrainer(policy, lr=1e-2)
    kl_terms = []
    real_step = trainer._minibatch_step

    def record(*args):
        out = real_step(*args)
        kl_terms.append(out["actor/kl_loss"])
        return out

    monkeypatch.setattr(trainer, "_minibatch_step", record)
    trainer.update(batch, *config, torch.Generator().manual_seed(2))
    assert kl_terms[0] == 0.0
    assert all(kl > 0 for kl in kl_terms[1:])


@pytest.mark.parametrize("granularity", ["token", "action", "chunk"])
def test_the_kl_loss_sums_each_dimensions_estimate_over_its_unit(process_group, device, monkeypatch, granularity):
    """A reference 0.5 above the policy in every dimension of every executed action (7 per action):
    at the first minibatch the KL loss is k3(0.5) per dimension summed over the unit, at every
    granularity, and it pulls the policy back. k3 of a whole action's log-ratio (3.5: 28.6) was
    clamped to verl's per-token bound of 10, which also stops its gradient."""
    torch.manual_seed(0)
    policy = make_policy("mlp", TINY_CONFIGS["mlp"]()).to(device)
    batch = rollout_batch(policy)
    batch.set(keys.REF_LOG_PROBS, per_dim_log_probs(policy, batch).cpu() + 0.5)
    batch.set(keys.ADVANTAGES, torch.zeros_like(batch[keys.ADVANTAGES]))  # only the KL term acts
    config = update_config("ppo_clip", granularity, use_kl_loss=True, kl_loss_coef=1.0, ppo_mini_batch_size=8)
    trainer = ActorTrainer(policy, lr=1e-2)
    seen = []
    real_step = trainer._minibatch_step
    monkeypatch.setattr(trainer, "_minibatch_step", lambda *args: seen.append(real_step(*args)) or seen[-1])
    trainer.update(batch, *config, torch.Generator().manual_seed(2))
    per_dim = float(np.expm1(0.5) - 0.5)  # k3 = r - 1 - log r, log r = log pi_ref - log pi = 0.5
    per_unit = {"token": per_dim, "action": ACT_DIM * per_dim, "chunk": ACT_DIM * per_dim}[granularity]  # chunk 1
    assert seen[0]["actor/kl_loss"] == pytest.approx(per_unit, rel=1e-5)
    after = per_dim_log_probs(policy, batch).cpu()
    executed = batch[keys.RESPONSE_MASK][..., None, None].expand_as(after)
    gap_after = (batch[keys.REF_LOG_PROBS] - after)[executed].mean()
    assert float(gap_after) < 0.5  # the update moved the policy towards the reference


def test_entropy_bonus_raises_the_policy_std(process_group, device):
    torch.manual_seed(0)
    policy = make_policy("mlp", TINY_CONFIGS["mlp"]()).to(device)
    batch = rollout_batch(policy)
    batch.set(keys.ADVANTAGES, torch.zeros_like(batch[keys.ADVANTAGES]))  # only the entropy term acts
    before = policy.action_std().detach().clone()
    metrics = ActorTrainer(policy, lr=1e-2).update(batch, *update_config("ppo_clip", "action", entropy_coeff=1.0),
                                                   torch.Generator().manual_seed(2))
    assert (policy.action_std() > before).all()
    # The reported std is the updated policy's, not the rollout's.
    assert metrics["actor/action_std"] == pytest.approx(float(policy.action_std().detach().mean()), rel=1e-6)
    assert metrics["actor/action_std"] > float(before.mean())


class _NoBackward(torch.autograd.Function):
    """Identity whose backward pass fails: marks a tensor the loss must not differentiate."""

    @staticmethod
    def forward(ctx, tensor):
        return tensor.clone()

    @staticmethod
    def backward(ctx, grad):
        raise AssertionError("the entropy's backward pass ran")


def test_without_an_entropy_bonus_the_entropy_is_a_metric_only(process_group, device):
    """entropy_coeff 0 (the default): the entropy is reported but stays out of the loss, so its
    backward pass (a vocabulary-wide recompute for a language model) never runs."""
    torch.manual_seed(0)
    policy = make_policy("mlp", TINY_CONFIGS["mlp"]()).to(device)
    batch = rollout_batch(policy)
    trainer = ActorTrainer(policy, lr=1e-2)
    forward = trainer.forward

    def entropy_without_backward(model, mb):
        log_probs, entropy = forward(model, mb)
        return log_probs, _NoBackward.apply(entropy)

    trainer.forward = entropy_without_backward
    metrics = trainer.update(batch, *update_config("ppo_clip", "action"), torch.Generator().manual_seed(2))
    assert metrics["actor/entropy"] != 0.0
    with pytest.raises(AssertionError, match="backward pass ran"):
        trainer.update(batch, *update_config("ppo_clip", "action", entropy_coeff=0.01), torch.Generator().manual_seed(2))


@pytest.mark.parametrize("granularity", ["token", "action", "chunk"])
def test_an_empty_shard_makes_no_update(process_group, device, granularity):
    policy = make_policy("mlp", TINY_CONFIGS["mlp"]()).to(device)
    batch = rollout_batch(policy)[:0]
    metrics = ActorTrainer(policy, lr=1e-2).update(batch, *update_config("ppo_clip", granularity),
                                                   torch.Generator().manual_seed(2))
    assert metrics["actor/num_updates"] == 0.0


@pytest.mark.parametrize("loss_name", POLICY_LOSSES.names())
def test_steps_after_the_episode_end_never_reach_the_update(process_group, device, loss_name):
    """NaN in every per-step field after each episode's end: the update (loss, entropy and KL
    terms, gradients, metrics) is bit-identical to the one on the clean batch."""
    results = []
    for dirty in (False, True):
        torch.manual_seed(0)
        policy = make_policy("mlp", TINY_CONFIGS["mlp"]()).to(device)
        batch = rollout_batch(policy)
        batch.set(keys.REF_LOG_PROBS, torch.zeros(batch[keys.ACTIONS].shape) - 9.0)
        if dirty:
            after_end = ~batch[keys.RESPONSE_MASK]  # (n, T)
            for key in (keys.ACTIONS, keys.OLD_LOG_PROBS, keys.ADVANTAGES, keys.REF_LOG_PROBS):
                batch[key][after_end] = float("nan")
            batch[keys.OBS][:, :-1][after_end] = float("nan")
        config = update_config(loss_name, "token", use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01)
        metrics = ActorTrainer(policy, lr=1e-2).update(batch, *config, torch.Generator().manual_seed(2))
        results.append((metrics, [p.detach().clone() for p in policy.parameters()]))
    (clean_metrics, clean_params), (dirty_metrics, dirty_params) = results
    assert dirty_metrics == clean_metrics
    assert all(torch.equal(c, d) for c, d in zip(clean_params, dirty_params))


@pytest.mark.parametrize("granularity", ["token", "action", "chunk"])
def test_actions_that_never_ran_are_no_units_of_the_update(process_group, device, monkeypatch, granularity):
    """OpenVLA-OFT, chunks of 3: 4 of the 8 episodes end inside their last chunk, leaving 6 actions
    sampled and never executed. The loss counts exactly the executed actions (SimpleVLA-RL's and
    RLinf's per-action masks), and the update is bit-identical whatever those 6 actions hold."""
    calls = spy_on_losses(monkeypatch)
    results = []
    for shuffled in (False, True):
        calls.clear()
        torch.manual_seed(0)
        policy = make_policy("openvla_oft", TINY_CONFIGS["openvla_oft"]()).to(device)
        batch = rollout_batch(policy)  # episodes of 12, 1, 7, 3, 12, 2, 9, 5 control steps
        assert batch[keys.CONTROL_STEPS].tolist() == [12, 1, 7, 3, 12, 2, 9, 5]
        never_ran = batch[keys.RESPONSE_MASK][..., None] & ~executed_actions(
            batch[keys.RESPONSE_MASK], batch[keys.CONTROL_STEPS], 3)  # (n, T, C)
        assert int(never_ran.sum()) == 6 and torch.all(batch[keys.OLD_LOG_PROBS][never_ran] == 0)
        if shuffled:  # other valid actions where none was executed
            batch[keys.ACTIONS][never_ran] = batch[keys.ACTIONS][never_ran].flip(-1)
        config = update_config("ppo_clip", granularity, ppo_mini_batch_size=8, entropy_coeff=0.01)
        metrics = ActorTrainer(policy, lr=1e-2).update(batch, *config, torch.Generator().manual_seed(2))
        results.append((metrics, [p.detach().clone() for p in policy.parameters()]))
    units = {"token": ACT_DIM * 51, "action": 51, "chunk": 19}[granularity]  # 51 actions ran, in 19 decisions
    assert int(calls[0][2].sum()) == units
    (metrics, params), (shuffled_metrics, shuffled_params) = results
    assert shuffled_metrics == metrics
    assert all(torch.equal(a, b) for a, b in zip(params, shuffled_params))


def test_a_diverged_update_is_skipped_and_stops_the_run_after_k_in_a_row(process_group, device):
    """lr 1e30: the first update lands (its gradient is finite) and blows the weights up; the
    next ones have a non-finite gradient norm, are skipped (weights untouched), counted, and the
    third in a row stops the run with a message."""
    from vla_rl.errors import RunStopped

    torch.manual_seed(0)
    policy = make_policy("mlp", TINY_CONFIGS["mlp"]()).to(device)
    batch = rollout_batch(policy)
    trainer = ActorTrainer(policy, lr=1e30)
    algorithm, settings = update_config("ppo_clip", "action", ppo_epochs=1, ppo_mini_batch_size=8,
                                        max_skipped_updates=3)
    first = trainer.update(batch, algorithm, settings, torch.Generator().manual_seed(2))
    assert first["actor/num_updates"] == 1.0 and first["actor/skipped_updates"] == 0.0
    blown = [p.detach().clone() for p in policy.parameters()]
    assert max(float(p.abs().max()) for p in blown) > 1e20 and all(torch.isfinite(p).all() for p in blown)
    for _ in range(2):
        metrics = trainer.update(batch, algorithm, settings, torch.Generator().manual_seed(2))
        assert metrics["actor/num_updates"] == 0.0 and metrics["actor/skipped_updates"] == 1.0
        assert all(torch.equal(p, q) for p, q in zip(policy.parameters(), blown))  # untouched
    with pytest.raises(RunStopped, match=r"3 updates in a row had a non-finite gradient norm.*trainer.lr"):
        trainer.update(batch, algorithm, settings, torch.Generator().manual_seed(2))

