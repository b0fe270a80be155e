"""Contract tests run against every registered policy, with a tiny config per policy and the
observations it reads: a flat state tensor (MLP), or simulator camera observations as a
TensorDict of state, uint8 images and the encoded instruction (OpenVLA, OpenVLA-OFT, π0). Own
actions are ``own_action_dim`` wide (π0: its denoising chain), environment actions ``action_dim``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from policies import available_policies, make_policy
from policies.mlp import MLPPolicyConfig
from policies.openvla import OpenVLAPolicyConfig
from policies.openvla_oft import OpenVLAOFTPolicyConfig
from policies.pi0 import PI0PolicyConfig
from vla_rl_core import keys
from vla_rl_core.observations import encode_instruction

OBS_DIM = 5
IMAGE_SIZE = 32
INSTRUCTIONS = ("lift the cube", "open the top drawer of the cabinet")


def state_obs(batch: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, OBS_DIM, generator=torch.Generator().manual_seed(seed))


def camera_obs(batch: int, seed: int) -> TensorDict:
    """Simulator camera observations: state, an agentview image and one of two instructions."""
    generator = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (batch, IMAGE_SIZE, IMAGE_SIZE, 3), generator=generator, dtype=torch.uint8)
    codes = np.stack([encode_instruction(INSTRUCTIONS[row % 2]) for row in range(batch)])
    return TensorDict({keys.OBS_STATE: torch.randn(batch, OBS_DIM, generator=generator),
                       f"agentview{keys.OBS_IMAGE_SUFFIX}": image,
                       keys.OBS_INSTRUCTION: torch.from_numpy(codes)}, batch_size=[batch])


@dataclass
class Case:
    """A tiny config, its observations ``obs(batch, seed)``, a malformed batch of 4 and the
    error message that batch must raise."""

    config: Callable[[], Any]
    obs: Callable[[int, int], Any]
    bad_obs: Callable[[], Any]
    bad_obs_message: str


CASES = {
    "mlp": Case(lambda: MLPPolicyConfig(obs_dim=OBS_DIM, action_dim=3, hidden_sizes=(8, 8)), state_obs,
                lambda: torch.randn(4, OBS_DIM + 1), "obs"),
    "openvla": Case(lambda: OpenVLAPolicyConfig(architecture="tiny", action_dim=3), camera_obs,
                    lambda: camera_obs(4, 0).exclude(f"agentview{keys.OBS_IMAGE_SUFFIX}"), "agentview_image"),
    "openvla_oft": Case(lambda: OpenVLAOFTPolicyConfig(architecture={"preset": "tiny", "fused": False},
                                                       action_dim=3, chunk_size=2, proprio_dim=4),
                        camera_obs, lambda: camera_obs(4, 0).exclude(keys.OBS_INSTRUCTION), "instruction"),
    "pi0": Case(lambda: PI0PolicyConfig(architecture="tiny", action_dim=3, proprio_dim=4), camera_obs,
                lambda: camera_obs(4, 0).exclude(keys.OBS_INSTRUCTION), "instruction"),
}


def test_every_registered_policy_has_a_tiny_config():
    assert sorted(CASES) == available_policies()


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_one_thread):
    """Small models on the shared machines run fastest on one thread."""


@pytest.fixture(params=sorted(CASES))
def case(request, device):
    """The policy on the test device, and its case with observations made on that device (as
    the rollout hands them over)."""
    torch.manual_seed(0)
    spec = CASES[request.param]
    on_device = Case(spec.config, lambda batch, seed: spec.obs(batch, seed).to(device),
                     lambda: spec.bad_obs().to(device), spec.bad_obs_message)
    return make_policy(request.param, spec.config()).to(device), on_device


def test_sample_shapes_and_dtypes(case):
    policy, spec = case
    obs = spec.obs(4, 0)
    actions, log_probs = policy.sample_actions(obs)
    assert actions.shape == (4, policy.chunk_size, policy.own_action_dim)
    assert log_probs.shape == (4, policy.chunk_size)
    assert actions.dtype == log_probs.dtype == torch.float32
    assert not actions.requires_grad and not log_probs.requires_grad
    env_actions = policy.env_actions(actions)
    assert env_actions.shape == (4, policy.chunk_size, policy.action_dim) and env_actions.dtype == torch.float32
    # The rollout passes the observations the actions came from; these policies act absolutely.
    assert torch.equal(policy.env_actions(actions, obs), env_actions)
    assert policy.bc_chunk_size == policy.chunk_size
    if policy.actions_are_env_actions:  # then an older evaluation store's actions replay as they are
        assert torch.equal(env_actions, actions)


@pytest.mark.parametrize("greedy", [False, True])
def test_actions_stay_float32_under_bfloat16_autocast(case, greedy):
    """A CUDA worker's rollout samples in ``torch.autocast(bfloat16)`` (``trainer.mixed_precision:
    auto``): actions, log-probs and environment actions must still be float32 (the rollout hands
    the environment actions to numpy, which has no bfloat16, and stores the actions for the
    update to rescore)."""
    policy, spec = case
    obs = spec.obs(4, 0)
    with torch.no_grad(), torch.autocast(policy.device.type, dtype=torch.bfloat16):
        actions, log_probs = policy.sample_actions(obs, greedy=greedy, generator=torch.Generator().manual_seed(0))
        env_actions = policy.env_actions(actions, obs)
    assert actions.dtype == log_probs.dtype == env_actions.dtype == torch.float32
    assert torch.isfinite(actions).all() and torch.isfinite(log_probs).all()


def assert_sampled_log_probs(policy, recomputed: torch.Tensor, sampled: torch.Tensor) -> None:
    """Bit for bit, or up to float rounding for a policy that declares its sampling pass is
    computed otherwise (``sampled_log_probs_recomputed = False``: OpenVLA's cached decoding)."""
    if policy.sampled_log_probs_recomputed:
        assert torch.equal(recomputed, sampled)
    else:
        torch.testing.assert_close(recomputed, sampled, rtol=0, atol=1e-4)


def test_recomputed_log_prob_equals_sampled_exactly(case):
    policy, spec = case
    obs = spec.obs(16, 1)
    for greedy in (False, True):
        actions, log_probs = policy.sample_actions(obs, greedy=greedy)
        recomputed, entropy = policy.log_prob_and_entropy(obs, actions)
        assert_sampled_log_probs(policy, recomputed, log_probs)
        assert entropy.shape == log_probs.shape and recomputed.requires_grad


def test_per_dimension_log_probs_sum_to_the_sampled_ones_exactly(case):
    policy, spec = case
    obs = spec.obs(9, 2)
    actions, log_probs = policy.sample_actions(obs)
    per_dim, entropy = policy.log_prob_and_entropy_per_dim(obs, actions)
    assert per_dim.shape == entropy.shape == (9, policy.chunk_size, policy.own_action_dim)
    assert_sampled_log_probs(policy, per_dim.sum(dim=-1), log_probs)
    assert torch.equal(policy(obs, actions)[0], per_dim)  # the training forward


def test_log_probs_are_batch_invariant(case):
    # The rollout samples a few running environments at a time, the trainer recomputes whole
    # minibatches: every row must come out bit-identical whatever shares its batch (policies
    # declaring batch_invariant = False: equal up to float rounding).
    policy, spec = case
    total, sizes = (300, (1, 2, 3, 5, 7, 8, 63, 64, 65, 130, 299)) if policy.batch_invariant else (24, (1, 2, 5, 23))
    obs = spec.obs(total, 3)
    actions, _ = policy.sample_actions(obs)
    full, _ = policy.log_prob_and_entropy_per_dim(obs, actions)
    generator = torch.Generator().manual_seed(0)
    for size in sizes:
        rows = torch.randperm(total, generator=generator)[:size].to(policy.device)
        part, _ = policy.log_prob_and_entropy_per_dim(obs[rows], actions[rows])
        if policy.batch_invariant:
            assert torch.equal(part, full[rows]), size
        else:
            torch.testing.assert_close(part, full[rows], rtol=0, atol=1e-4, msg=str(size))
    _, sampled_alone = policy.sample_actions(obs[:1], greedy=True)
    _, sampled_together = policy.sample_actions(obs, greedy=True)
    if policy.batch_invariant:
        assert torch.equal(sampled_alone, sampled_together[:1])
    else:
        torch.testing.assert_close(sampled_alone, sampled_together[:1], rtol=0, atol=1e-4)


def test_batch_invariant_log_probs_stay_so_under_bfloat16_autocast(case):
    """A CUDA worker's rollout and reference score in ``torch.autocast(bfloat16)`` (DDP's
    ``mixed_precision: auto``), in batches of other sizes: a batch-invariant policy's rows must
    stay bit-identical there too. On one H200 (2026-12-04) tests/test_templates.py's reward KL
    penalty at the first step, 0 when the reference and the rollout score alike, came out 1.8e-8
    under autocast; this checks the policy alone on the test device."""
    policy, spec = case
    if not policy.batch_invariant:
        pytest.skip("declares batch_invariant = False")
    obs = spec.obs(130, 4)
    with torch.no_grad(), torch.autocast(policy.device.type, dtype=torch.bfloat16):
        actions, _ = policy.sample_actions(obs, generator=torch.Generator().manual_seed(0))
        full, _ = policy.log_prob_and_entropy_per_dim(obs, actions)
        for size in (1, 3, 8, 64, 129):
            part, _ = policy.log_prob_and_entropy_per_dim(obs[-size:], actions[-size:])
            assert torch.equal(part, full[-size:]), size


def test_generator_makes_sampling_reproducible(case):
    policy, spec = case
    obs = spec.obs(4, 4)
    first, _ = policy.sample_actions(obs, generator=torch.Generator().manual_seed(7))
    second, _ = policy.sample_actions(obs, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_bc_loss_is_a_differentiable_scalar(case):
    policy, spec = case
    loss = policy.bc_loss(spec.obs(4, 5), torch.zeros(4, policy.chunk_size, policy.action_dim, device=policy.device))
    assert loss.ndim == 0
    loss.backward()


def test_wrong_shapes_raise(case):
    policy, spec = case
    with pytest.raises(ValueError, match=spec.bad_obs_message):
        policy.sample_actions(spec.bad_obs())
    with pytest.raises(ValueError, match="actions"):
        policy.log_prob_and_entropy(spec.obs(4, 6), torch.zeros(4, policy.action_dim, device=policy.device))
    short_batch = torch.zeros(3, policy.chunk_size, policy.action_dim, device=policy.device)
    with pytest.raises(ValueError, match="expert_actions"):
        policy.bc_loss(spec.obs(4, 6), short_batch)


def test_mlp_takes_inputs_from_any_device():
    # Behaviour cloning and the trainer hand CPU batches to the policy wherever it lives (its
    # inputs go to policy.device). On the meta device any CPU tensor that reaches an op fails, as
    # it would on a GPU.
    policy = make_policy("mlp", CASES["mlp"].config()).to("meta")
    obs, actions = state_obs(4, 0), torch.zeros(4, 1, 3)
    sampled, log_probs = policy.sample_actions(obs, generator=torch.Generator().manual_seed(0))
    assert sampled.device.type == log_probs.device.type == "meta"
    assert policy.predict_action_chunk(obs).device.type == "meta"
    per_dim, _ = policy.log_prob_and_entropy_per_dim(obs, actions)
    assert per_dim.device.type == "meta"
    policy.bc_loss(obs, actions).backward()
    assert policy.mean_net[0].weight.grad.device.type == "meta"
