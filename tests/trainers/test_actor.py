"""The actor update: at the first minibatch of an on-policy update the ratio is exactly 1, for
every registered policy (policies that are not batch-invariant, the VLAs on camera
observations: 1 up to float rounding), policy objective and ratio granularity; minibatches sized
by ``ppo_mini_batch_size``; the KL and entropy terms; steps after an episode's end."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch

from policies import available_policies, make_policy
from policies.mlp import MLPPolicyConfig
from policies.openvla import OpenVLAPolicyConfig
from policies.openvla_oft import OpenVLAOFTPolicyConfig
from policies.pi0 import PI0PolicyConfig
from vla_rl.algorithms.granularity import executed_actions
from vla_rl.algorithms.policy_loss import POLICY_LOSSES
from vla_rl.config import AlgorithmSection, TrainerSection
from vla_rl.rollout.embodied import rollout_episodes
from vla_rl.trainers import actor as actor_module
from vla_rl.trainers.actor import ActorTrainer, per_dim_log_probs
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec
from vla_rl_core.observations import encode_instruction
from vla_rl_core.registry import Registry

OBS_DIM, ACT_DIM, HORIZON = 5, 7, 12
TINY_CONFIGS = {
    "mlp": lambda: MLPPolicyConfig(obs_dim=OBS_DIM, action_dim=ACT_DIM, hidden_sizes=(16, 16)),
    "openvla": lambda: OpenVLAPolicyConfig(architecture={"preset": "tiny", "fused": False}, action_dim=ACT_DIM),
    "openvla_oft": lambda: OpenVLAOFTPolicyConfig(architecture={"preset": "tiny", "fused": False},
                                                  action_dim=ACT_DIM, chunk_size=3, proprio_dim=3),
    # own actions: the denoising chains, (3 steps + 1) * 8 = 32 values per chunk position
    "pi0": lambda: PI0PolicyConfig(architecture={"preset": "tiny", "max_action_dim": 8}, action_dim=ACT_DIM,
                                   proprio_dim=3),
}


class RandomWalkPool:
    """In-process stand-in for a simulator pool: random observations, environment ``i`` ends
    (as a success) after ``ends[i]`` control steps, so the rollout samples ever fewer running
    environments per call, down to one."""

    def __init__(self, ends: list[int]) -> None:
        self.ends = np.asarray(ends)
        self.rng = np.random.default_rng(0)

    def spec(self):
        return EnvSpec(obs_dim=OBS_DIM, action_dim=ACT_DIM, horizon=HORIZON)

    def reset(self, ids):
        self.steps = np.zeros(len(ids), dtype=np.int64)
        return self.rng.normal(size=(len(ids), OBS_DIM)).astype(np.float32)

    def submit(self, env_indices, actions, render_indices=()):
        return np.asarray(env_indices), actions.shape[1]

    def collect(self, pending):
        rows, chunk = pending
        steps = np.minimum(chunk, self.ends[rows] - self.steps[rows])  # the chunk, up to the episode's end
        self.steps[rows] += steps
        done = self.steps[rows] >= self.ends[rows]
        k = len(rows)
        return {"obs": self.rng.normal(size=(k, OBS_DIM)).astype(np.float32), "reward": done.astype(np.float32),
                "terminated": done, "truncated": np.zeros_like(done), "success": done, "steps": steps,
                "lost": np.zeros(k, dtype=bool), "frames": {}, "sim_seconds": 0.0, "sim_cpu_seconds": 0.0}


class CameraRandomWalkPool(RandomWalkPool):
    """The same episodes with camera observations: the state, a random 16x16 agentview image and
    the instruction."""

    def spec(self):
        return dataclasses.replace(super().spec(), images={"agentview_image": (16, 16, 3)})

    def _camera(self, state):
        n = len(state)
        return {"state": state, "agentview_image": self.rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8),
                "instruction": np.stack([encode_instruction("lift the cube")] * n)}

    def reset(self, ids):
        return self._camera(super().reset(ids))

    def collect(self, pending):
        out = super().collect(pending)
        return {**out, "obs": self._camera(out["obs"])}


def test_every_registered_policy_has_a_tiny_config():
    assert sorted(TINY_CONFIGS) == sorted(available_policies())


def rollout_batch(policy) -> tuple:
    """Eight episodes of 1..12 decisions in two groups, with per-episode advantages."""
    torch.manual_seed(0)
    ends = [12, 1, 7, 3, 12, 2, 9, 5]
    pool = RandomWalkPool(ends) if policy.name == "mlp" else CameraRandomWalkPool(ends)
    batch = rollout_episodes(policy, pool, np.arange(8), generator=torch.Generator().manual_seed(1)).batch
    per_episode = torch.tensor([1.0, -0.5, 0.25, -1.0, 0.5, 2.0, -0.75, 0.1])
    batch.set(keys.ADVANTAGES, torch.where(batch[keys.RESPONSE_MASK], per_episode[:, None], 0.0))
    batch.set(keys.UID, torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]))
    return batch


TRAINER_FIELDS = ("ppo_epochs", "ppo_mini_batch_size", "ppo_num_mini_batches", "max_grad_norm", "max_skipped_updates",
                  "mixed_precision")


def update_config(loss_name: str, granularity: str, **overrides) -> tuple[AlgorithmSection, TrainerSection]:
    """The ``algorithm`` and ``trainer`` sections of an update: one epoch of minibatches of 4,
    token-mean, the clip range 0.2 / 0.28 for every objective, no entropy or KL term; then
    ``overrides`` (fields of either section)."""
    trainer = {"ppo_epochs": 1, "ppo_mini_batch_size": 4, "max_grad_norm": 1.0}
    algorithm = {"policy_loss": loss_name, loss_name: {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28},
                 "ratio_granularity": granularity, "loss_agg_mode": "token-mean", "entropy_coeff": 0.0,
                 "use_kl_loss": False, "kl_loss_coef": 0.0, "kl_loss_type": "k3"}
    for key, value in overrides.items():
        (trainer if key in TRAINER_FIELDS else algorithm)[key] = value
    return AlgorithmSection(**algorithm), TrainerSection(**trainer)


def spy_on_losses(monkeypatch) -> list:
    """Wrap every registered objective so that each call's inputs and metrics are recorded."""
    calls: list = []
    spies = Registry("policy loss")
    for name in POLICY_LOSSES.names():
        def spy(log_probs, old_log_probs, advantages, mask, *settings, _real=POLICY_LOSSES.get(name)):
            loss, metrics = _real(log_probs, old_log_probs, advantages, mask, *settings)
            calls.append((log_probs.detach().clone(), old_log_probs.clone(), mask.clone(), metrics))
            return loss, metrics
        spies.register(name, config=POLICY_LOSSES.config_class(name))(spy)
    monkeypatch.setattr(actor_module, "POLICY_LOSSES", spies)
    return calls


# Every objective with the MLP; the (slower) VLAs with PPO-clip, the objective is not what differs.
RATIO_CASES = [(name, granularity, loss) for name in sorted(TINY_CONFIGS) for granularity in ("token", "action", "chunk")
               for loss in (POLICY_LOSSES.names() if name == "mlp" else ["ppo_clip"])]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_one_thread):
    """Small models on the shared machines run fastest on one thread."""


@pytest.mark.parametrize(("policy_name", "granularity", "loss_name"), RATIO_CASES)
def test_first_minibatch_ratio_is_exactly_one(process_group, device, monkeypatch, policy_name, granularity, loss_name):
    torch.manual_seed(0)
    policy = make_policy(policy_name, TINY_CONFIGS[policy_name]()).to(device)
    batch = rollout_batch(policy)
    calls = spy_on_losses(monkeypatch)
    metrics = ActorTrainer(policy, lr=1e-2).update(batch, *update_config(loss_name, granularity),
                                                   torch.Generator().manual_seed(2))
    assert metrics["actor/num_updates"] == 2.0
    log_probs, old_log_probs, mask, first_metrics = calls[0]
    # The second minibatch comes after an update: the policy has moved.
    second_log_probs, second_old, second_mask, _ = calls[1]
    assert not torch.equal(second_log_probs[second_mask], second_old[second_mask])
    if not policy.batch_invariant or device.type != "cpu":
        # The rollout's batches differ from the minibatches (and accelerator kernels differ with
        # the batch size): rounding only.
        torch.testing.assert_close(log_probs[mask], old_log_probs[mask], rtol=0, atol=1e-4)
        assert abs(first_metrics["ratio_mean"] - 1.0) < 1e-4 and first_metrics["pg_clipfrac"] == 0.0
        if granularity == "token":
            assert metrics["actor/old_log_prob_max_diff"] < 1e-4
        return
    # Rollout and trainer computed bit-identical log-probs: every log-ratio is exactly 0.
    assert torch.equal(log_probs[mask], old_log_probs[mask])
    assert first_metrics["ratio_mean"] == 1.0 and first_metrics["approx_kl"] == 0.0
    assert first_metrics["pg_clipfrac"] == 0.0
    if granularity == "token":
        assert metrics["actor/old_log_prob_max_diff"] == 0.0


@pytest.mark.parametrize("granularity", ["action", "chunk"])
def test_first_minibatch_ratio_is_one_for_pi0_executing_a_prefix_of_state_relative_actions(process_group, device,
                                                                                         monkeypatch, granularity):
    """π0 executing 2 of its 4 actions, the first 3 values relative to the state: the rollout
    stores every position's chains packed into 2 slots, and the trainer's recomputation of the
    executed positions' log-probs gives ratio 1 (up to rounding: not batch-invariant)."""
    torch.manual_seed(0)
    config = dataclasses.replace(TINY_CONFIGS["pi0"](), executed_actions=2, delta_action_mask=(True, True, True))
    policy = make_policy("pi0", config).to(device)
    batch = rollout_batch(policy)
    assert batch[keys.ACTIONS].shape[2:] == (2, 2 * 32) and batch[keys.OLD_LOG_PROBS].shape[2] == 2
    calls = spy_on_losses(monkeypatch)
    metrics = ActorTrainer(policy, lr=1e-2).update(batch, *update_config("ppo_clip", granularity),
                                                   torch.Generator().manual_seed(2))
    assert metrics["actor/num_updates"] == 2.0
    log_probs, old_log_probs, mask, first_metrics = calls[0]
    torch.testing.assert_close(log_probs[mask], old_log_probs[mask], rtol=0, atol=1e-4)
    assert abs(first_metrics["ratio_mean"] - 1.0) < 1e-4 and first_metrics["pg_clipfrac"] == 0.0


@pytest.mark.parametrize("policy_name", ["openvla", "openvla_oft", "pi0"])
def test_fsdp_updates_a_bfloat16_policy_without_mixed_precision(process_group, device, policy_name):
    """A policy with ``dtype: bfloat16`` under FSDP and ``trainer.mixed_precision: none`` (the
    default ``auto`` on a CPU or a GPU without native bfloat16): the training copy computes in its
    float32 master dtype, the frozen parameters (the towers' and the VLM's unused last blocks)
    included (before: "mixed dtype" or "expected m1 and m2 to have the same dtype" at the first
    rescoring, the frozen ones were bfloat16)."""
    from vla_rl.config import TrainerSection
    from vla_rl.trainers.strategy import meta_copy

    policy = make_policy(policy_name, dataclasses.replace(TINY_CONFIGS[policy_name](), dtype="bfloat16")).to(device)
    assert torch.bfloat16 in {p.dtype for p in policy.parameters()} and not all(p.requires_grad
                                                                                 for p in policy.parameters())
    assert {p.dtype for p in meta_copy(policy, torch.float32).parameters()} == {torch.float32}
    batch = rollout_batch(policy)
    algorithm, _ = update_config("ppo_clip", "action")
    trainer = TrainerSection(ppo_epochs=1, ppo_mini_batch_size=4, max_grad_norm=1.0, strategy="fsdp",
                             mixed_precision="none")
    before = [p.detach().clone() for p in policy.parameters()]
    metrics = ActorTrainer(policy, lr=1e-3, trainer=trainer).update(batch, algorithm, trainer,
                                                                    torch.Generator().manual_seed(2))
    assert metrics["actor/num_updates"] == 2.0 and math.isfinite(metrics["actor/pg_loss"])
    assert any(not torch.equal(p, q) for p, q in zip(policy.parameters(), before))


@pytest.mark.parametrize("policy_name", ["openvla", "pi0"])
def test_the_update_resizes_each_decision_steps_frames_once(process_group, monkeypatch, policy_name):
    """Camera frames are prepared once per update (``Policy.model_ready_observations``), not in
    each of its passes: with token ratios (the old log-probs are rescored first) and three
    epochs, each decision step's frame is resized once; the batch handed in is not modified
    (other nodes of the worker may read it)."""
    from tests.policies.test_model_ready_observations import resized_frames

    torch.manual_seed(0)
    policy = make_policy(policy_name, TINY_CONFIGS[policy_name]())
    batch = rollout_batch(policy)
    obs_keys = sorted(batch[keys.OBS].keys())
    counts = resized_frames(monkeypatch)
    metrics = ActorTrainer(policy, lr=1e-2).update(batch, *update_config("ppo_clip", "token", ppo_epochs=3),
                                                   torch.Generator().manual_seed(2))
    assert metrics["actor/num_updates"] == 6.0
    assert sum(counts) == int(batch[keys.RESPONSE_MASK].sum()) > 0  # the passes read each of them 4 times
    assert sorted(batch[keys.OBS].keys()) == obs_keys


def test_the_update_on_prepared_frames_is_the_update_on_the_simulators_frames(process_group, monkeypatch):
    """π0 over two epochs with micro-batches of 2 episodes: the same metrics and the same weights,
    value for value, whether the update prepares the frames once or resizes them in every pass."""
    from policies.base import Policy
    from policies.pi0.policy_pi0 import PI0Policy

    torch.manual_seed(0)
    policy = make_policy("pi0", TINY_CONFIGS["pi0"]())
    batch = rollout_batch(policy)
    config = update_config("ppo_clip", "action", ppo_epochs=2)
    trainer_section = config[1].model_copy(update={"micro_batch_size": 2})
    results = []
    for prepare in (True, False):
        if not prepare:
            monkeypatch.setattr(PI0Policy, "model_ready_observations", Policy.model_ready_observations)
        copy_of_policy = copy.deepcopy(policy)
        metrics = ActorTrainer(copy_of_policy, lr=1e-2).update(batch, config[0], trainer_section,
                                                               torch.Generator().manual_seed(2))
        results.append((metrics, copy_of_policy.state_dict()))
    (prepared, prepared_weights), (every_pass, every_pass_weights) = results
    assert prepared == every_pass and prepared["actor/num_updates"] == 4.0
    assert all(torch.equal(prepared_weights[name], every_pass_weights[name]) for name in every_pass_weights)


def test_ddp_all_reduces_once_per_minibatch_whatever_its_micro_batches(process_group, device):
    """Micro-batches accumulate locally under DDP's no_sync, forward included (DDP arms the
    backward's all-reduce in its forward): 2 minibatches of 2 micro-batches all-reduce twice, not
    4 times (the forward ran outside no_sync)."""
    torch.manual_seed(0)
    policy = make_policy("mlp", TINY_CONFIGS["mlp"]()).to(device)
    batch = rollout_batch(policy)
    algorithm, trainer_section = update_config("ppo_clip", "action")
    trainer_section = trainer_section.model_copy(update={"micro_batch_size": 2})
    trainer = ActorTrainer(policy, lr=1e-3)
    all_reduces = []

    def counting_hook(state, bucket):
        all_reduces.append(bucket.index())
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    trainer.parallel.module.register_comm_hook(None, counting_hook)
    metrics = trainer.update(batch, algorithm, trainer_section, torch.Generator().manual_seed(1))
    assert metrics["actor/num_updates"] == 2.0 and all_reduces == [0, 0]


@pytest.mark.parametrize(("episodes", "mini_batch", "expected_updates"), [(12, 4, 3 * 2), (3, 4, 1 * 2), (5, 1, 5 * 2)])
def test_updates_per_epoch_follow_the_mini_batch_size(process_group, device, episodes, mini_batch, expected_updates):
    torch.manual_seed(0)
    policy = make_policy("mlp", TINY_CONFIGS["mlp"]()).to(device)
    batch = rollout_batch(policy)
    batch = torch.cat([batch, batch])[:episodes]  # (episodes,)
    config = update_config("ppo_clip", "action", ppo_epochs=2, ppo_mini_batch_size=mini_batch)
    metrics = ActorTrainer(policy, lr=1e-3).update(batch, *config, torch.Generator().manual_seed(1))
    assert metrics["actor/num_updates"] == expected_updates


@pytest.mark.parametrize(("episodes", "num_mini_batches", "expected_updates"), [(12, 4, 4 * 2), (3, 4, 3 * 2), (12, 1, 2)])
def test_a_fixed_number_of_minibatches_whatever_the_batch_size(process_group, device, episodes, num_mini_batches,
                                                               expected_updates, monkeypatch):
    """``trainer.ppo_num_mini_batches`` replaces ``ppo_mini_batch_size``: as many updates per pass
    whatever the batch's size (fewer only when the shard is smaller), equal shares of it."""
    torch.manual_seed(0)
    policy = make_policy("mlp", TINY_CONFIGS["mlp"]()).to(device)
    batch = rollout_batch(policy)
    batch = torch.cat([batch, batch])[:episodes]  # (episodes,)
    config = update_config("ppo_clip", "action", ppo_epochs=2, ppo_mini_batch_size=1,
                           ppo_num_mini_batches=num_mini_batches)
    trainer = ActorTrainer(policy, lr=1e-3)
    sizes = []
    real_step = trainer._minibatch_step
    monkeypatch.setattr(trainer, "_minibatch_step",
                        lambda batch, micro_batches, *rest: sizes.append(sum(map(len, micro_batches)))
                        or real_step(batch, micro_batches, *rest))
    metrics = trainer.update(batch, *config, torch.Generator().manual_seed(1))
    assert metrics["actor/num_updates"] == expected_updates
    assert sum(sizes) == 2 * episodes and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("name", ["mlp", "openvla_oft", "pi0"])
def test_no_grad_scoring_runs_micro_batches_of_rows_and_gives_the_whole_batchs_values(name):
    """``per_dim_log_probs(..., micro_batch_size=3)`` (the reference's and the token-level old
    log-probs) forwards at most 3 of the 8 episodes at once and returns what one forward of all 8
    returns (batch invariance: equal, not close, for the MLP)."""
    policy = make_policy(name, TINY_CONFIGS[name]()).eval()
    batch = rollout_batch(policy)
    whole = per_dim_log_probs(policy, batch)
    rows = []

    def counted(model, mb, with_entropy=True):
        rows.append(mb.batch_size[0])
        return actor_module.embodied_forward(model, mb, with_entropy)

    chunked = per_dim_log_probs(policy, batch, counted, micro_batch_size=3)
    assert rows == [3, 3, 2] and chunked.shape == whole.shape == (8, *whole.shape[1:])
    if name == "mlp":
        assert torch.equal(chunked, whole)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-5)


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


def _text_update(policy, batch, device, **overrides) -> tuple[dict[str, float], list[torch.Tensor], list[torch.Tensor]]:
    """One update of a copy of the causal LM ``policy`` on ``batch`` (one minibatch), in float32
    on any device (``trainer.mixed_precision: none``: the default ``auto`` computes in bfloat16
    autocast on an accelerator); its metrics, parameters and the minibatch's (clipped) gradients,
    which the trainer leaves in place after its one optimizer step."""
    from vla_rl.trainers.actor import text_forward

    policy = copy.deepcopy(policy).to(device)
    algorithm, trainer = update_config("ppo_clip", "action", **{"mixed_precision": "none", **overrides})
    metrics = ActorTrainer(policy, lr=1e-2, forward=text_forward, trainer=trainer).update(
        batch, algorithm, trainer, torch.Generator().manual_seed(2))
    return (metrics, [p.detach().clone() for p in policy.parameters()],
            [p.grad.detach().clone() for p in policy.parameters()])


@pytest.fixture(scope="module")
def text_batch(tiny_lm_dir):
    """A tiny causal LM and four sampled responses with fixed advantages; responses 1 and 3 are
    marked as cut at the length limit."""
    from fsdp_harness import _text_batch

    from policies.causal_lm import CausalLMConfig, CausalLMPolicy

    torch.manual_seed(0)
    policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(tiny_lm_dir), max_prompt_length=32,
                                                           max_response_length=8))
    batch = _text_batch(policy, 0)
    batch.set(keys.TRUNCATED, torch.tensor([False, True, False, True]))
    return policy, batch


def test_no_grad_scoring_and_the_sft_update_compute_no_entropy(text_batch, monkeypatch):
    """The reference's and the old policy's log-probs, and the SFT loss, read no entropy: none is
    computed (an LLM's would take one more ``(rows, R, vocab)`` float32 tensor than the
    log-probs), and the log-probs are those of the pass with the entropy."""
    from policies.causal_lm import modeling_causal_lm
    from vla_rl.trainers.actor import text_forward

    policy, batch = text_batch
    with torch.no_grad():
        expected = text_forward(policy, batch)[0]

    def refused(log_softmax):
        raise AssertionError("an entropy was computed")

    monkeypatch.setattr(modeling_causal_lm, "_entropy", refused)
    torch.testing.assert_close(per_dim_log_probs(policy, batch, text_forward, micro_batch_size=3), expected,
                               rtol=0, atol=0)
    assert text_forward(policy, batch, with_entropy=False)[1] is None
    trainer = ActorTrainer(copy.deepcopy(policy), lr=1e-3, forward=text_forward)
    metrics = trainer.supervised_update(batch, 1, 4, 1.0, torch.Generator().manual_seed(0))
    assert metrics["sft/num_updates"] == 1.0


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_masked_truncated_responses_update_as_if_they_were_not_in_the_batch(process_group, bf16_device, text_batch,
                                                                             agg_mode):
    """``algorithm.mask_truncated_responses`` (TRL's ``mask_truncated_completions``): the update is
    the one on the batch without the truncated responses, whatever the loss aggregation (they
    leave its denominator too); without it they count."""
    policy, batch = text_batch
    before = [p.detach().clone() for p in policy.parameters()]
    kept_batch = batch[torch.tensor([0, 2])]
    kept_batch.set(keys.REF_LOG_PROBS, torch.zeros(2, 8, 1, 1))
    batch = batch.clone()
    batch.set(keys.REF_LOG_PROBS, torch.zeros(4, 8, 1, 1))
    masked, masked_params, masked_grads = _text_update(policy, batch, bf16_device, loss_agg_mode=agg_mode,
                                                       mask_truncated_responses=True, entropy_coeff=0.01,
                                                       use_kl_loss=True, kl_loss_coef=0.1)
    kept, _, kept_grads = _text_update(policy, kept_batch, bf16_device, loss_agg_mode=agg_mode, entropy_coeff=0.01,
                                       use_kl_loss=True, kl_loss_coef=0.1)
    counted, counted_params, counted_grads = _text_update(policy, batch, bf16_device, loss_agg_mode=agg_mode,
                                                          entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1)
    for name in ("actor/pg_loss", "actor/entropy", "actor/kl_loss"):
        assert masked[name] == pytest.approx(kept[name], rel=1e-5, abs=1e-7), name
    assert masked["actor/pg_loss"] != pytest.approx(counted["actor/pg_loss"], rel=1e-3)
    step = max(float((m.cpu() - b).abs().max()) for m, b in zip(masked_params, before))
    assert step == pytest.approx(1e-2, rel=1e-3)  # Adam's first step: lr x sign(gradient)
    # The gradients are compared, not the weights after Adam's step (lr x g / (|g| + eps)): a
    # gradient element that cancels to float rounding takes a full +-lr step whose sign is that
    # rounding's. On an H200 the batch of 4 and the batch of 2 sum in different orders, and 8 of
    # the embedding's 18,176 weights stepped the opposite way (2 x lr apart). They are compared in
    # float32: under bfloat16 autocast (``bf16_device``: what ``auto`` means on an accelerator, or
    # the CPU emulation) the two batches' products round differently, 4e-3 of the largest gradient
    # apart on the H200 (2026-12-04) and on this CPU.
    scale = max(float(g.abs().max()) for g in kept_grads)
    for m, k in zip(masked_grads, kept_grads):
        torch.testing.assert_close(m.cpu(), k.cpu(), rtol=0, atol=1e-5 * scale)
    assert max(float((m - c).abs().max()) for m, c in zip(masked_grads, counted_grads)) > 1e-2 * scale
    assert max(float((m - c).abs().max()) for m, c in zip(masked_params, counted_params)) > 5e-3


def test_a_batch_of_truncated_responses_only_changes_nothing(process_group, device, text_batch):
    policy, batch = text_batch
    batch = batch.clone()
    batch.set(keys.TRUNCATED, torch.ones(4, dtype=torch.bool))
    metrics, params, _ = _text_update(policy, batch, device, mask_truncated_responses=True)
    assert metrics["actor/num_updates"] == 1.0 and metrics["actor/pg_loss"] == 0.0
    for p, q in zip(params, policy.parameters()):
        assert torch.equal(p.cpu(), q.detach().cpu())
