"""The actor update: at the first minibatch of an on-policy update the ratio is exactly 1, for
every registered policy (policies that are not batch-invariant, the VLAs on camera
observations: 1 up to float rounding), policy objective and ratio granularity; minibatches sized
by ``ppo_mini_batch_size`` or counted; frames prepared once per update; DDP's one all-reduce per
minibatch; bfloat16 policies under FSDP; micro-batched no-gradient scoring. Its helpers (the tiny
configs, a rollout batch, the update sections) serve the other actor tests: the loss terms in
test_actor_loss_terms.py, the causal LM's update in test_actor_text.py."""

from __future__ import annotations

import copy
import dataclasses
import math
import re

import numpy as np
import pytest
import torch

from policies import available_policies, make_policy
from policies.mlp import MLPPolicyConfig
from policies.openvla import OpenVLAPolicyConfig
from policies.openvla_oft import OpenVLAOFTPolicyConfig
from policies.pi0 import PI0PolicyConfig
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


def test_a_policy_loss_returning_something_else_stops_the_run_naming_it(process_group, monkeypatch):
    """A plug-in loss returning a bare tensor failed as "iteration over a 0-d tensor" in a worker's
    traceback, naming neither the loss nor what a loss returns."""
    from vla_rl.errors import RunStopped

    bare = Registry("policy loss")
    bare.register("ppo_clip", config=POLICY_LOSSES.config_class("ppo_clip"))(
        lambda log_probs, *rest: (log_probs * 0).sum())
    monkeypatch.setattr(actor_module, "POLICY_LOSSES", bare)
    policy = make_policy("mlp", TINY_CONFIGS["mlp"]())
    with pytest.raises(RunStopped, match=re.escape(f"policy loss 'ppo_clip' ({__name__}) returned a tensor of shape "
                                                   "(); a policy loss returns (loss, metrics)")):
        ActorTrainer(policy, lr=1e-2).update(rollout_batch(policy), *update_config("ppo_clip", "token"),
                                             torch.Generator().manual_seed(2))


def test_weight_units_count_decisions_for_chunk_and_executed_actions_for_action():
    """Micro-batch weights count the loss's own units: an episode whose last chunk ran 1 of its 4
    actions weighs 2 decisions at ``chunk`` granularity, 5 actions at ``action`` and ``token``."""
    from tensordict import TensorDict

    from vla_rl.algorithms.aggregation import aggregation_weight
    from vla_rl.trainers.actor import weight_units

    batch = TensorDict({keys.RESPONSE_MASK: torch.tensor([[True, True, False], [True, False, False]]),
                        keys.CONTROL_STEPS: torch.tensor([5, 2]), keys.ACTIONS: torch.zeros(2, 3, 4, 7)},
                       batch_size=[2])
    assert torch.equal(weight_units(batch, "chunk"), batch[keys.RESPONSE_MASK])
    for granularity in ("action", "token"):
        units = weight_units(batch, granularity)
        assert units.shape == (2, 12) and units.sum(dim=1).tolist() == [5, 2]
        assert aggregation_weight(units, "token-mean") == 7.0 and aggregation_weight(units, "seq-mean-token-mean") == 2
    assert aggregation_weight(weight_units(batch, "chunk"), "token-mean") == 3.0


def test_grad_norm_is_the_mean_over_the_updates(process_group, device, monkeypatch):
    """``actor/grad_norm``: the mean of the updates' pre-clip gradient norms (2 minibatches), not their sum."""
    from vla_rl.trainers.guard import GuardedStep

    norms: list[float] = []
    real = GuardedStep.__call__

    def recorded(self, *args, **kwargs):
        norm, applied = real(self, *args, **kwargs)
        norms.append(float(norm))
        return norm, applied

    monkeypatch.setattr(GuardedStep, "__call__", recorded)
    torch.manual_seed(0)
    policy = make_policy("mlp", TINY_CONFIGS["mlp"]()).to(device)
    metrics = ActorTrainer(policy, lr=1e-2).update(rollout_batch(policy), *update_config("ppo_clip", "action"),
                                                   torch.Generator().manual_seed(2))
    assert metrics["actor/num_updates"] == 2.0 and len(norms) == 2 and min(norms) > 0
    assert metrics["actor/grad_norm"] == pytest.approx(sum(norms) / 2, rel=1e-6)
