"""The π0 RL policy on the tiny in-process preset: own actions (the denoising chain) and their
shapes, openpi's bfloat16 dtypes, recomputed log-probs equal to the sampled ones for both
samplers, the scored elements, environment actions from the last block, greedy = the ODE,
temperature, behaviour cloning, an executed prefix of the model's chunk, and config errors naming
the field (the processor, statistics, openpi's transforms, checkpoint loading and the LIBERO
templates: test_pi0_observations.py; the export: test_pi0_export.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from policies import make_policy
from policies.normalization import ActionStatistics
from policies.pi0 import PI0PolicyConfig
from policies.pi0.flow_sampling import denoising_times
from policies.pi0.own_actions import chain_to_own, own_to_chain
from policies.pi0.policy_pi0 import PI0Policy
from tests.policies.pi0_helpers import (
    ACTION_DIM,
    STATISTICS,
    camera_obs,
    tiny_config,
)

LOG_2PI_E_HALF = 0.5 * math.log(2 * math.pi * math.e)


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_one_thread):
    """Small models on the shared machines run fastest on one thread."""


@pytest.fixture(scope="module", params=["flow_sde", "flow_noise"])
def policy(request) -> PI0Policy:
    return make_policy("pi0", tiny_config(sampler=request.param, action_statistics=STATISTICS))


def test_registered_and_sizes(policy):
    assert isinstance(policy, PI0Policy) and policy.name == "pi0"
    assert not PI0Policy.batch_invariant and not policy.actions_are_env_actions
    model = policy.model.config
    assert policy.num_steps == model.num_steps == 3
    assert policy.chunk_size == model.chunk_size == 4 and policy.action_dim == ACTION_DIM
    assert policy.own_action_dim == (3 + 1) * model.max_action_dim == 20
    other = make_policy("pi0", tiny_config(num_steps=5))
    assert other.num_steps == 5 and other.own_action_dim == 6 * 5


def test_shapes_of_sampled_greedy_and_environment_actions(policy):
    obs = camera_obs(3, 0)
    for greedy in (False, True):
        own, log_probs = policy.sample_actions(obs, greedy=greedy, generator=torch.Generator().manual_seed(0))
        assert own.shape == (3, 4, 20) and own.dtype == torch.float32
        assert log_probs.shape == (3, 4) and log_probs.dtype == torch.float32
        assert torch.isfinite(log_probs).all()
        env = policy.env_actions(own)
        assert env.shape == (3, 4, ACTION_DIM) and env.dtype == torch.float32
    chunk = policy.predict_action_chunk(obs)
    assert chunk.shape == (3, 4, 20)
    assert policy.env_actions(chunk).shape == (3, 4, ACTION_DIM)


def test_a_bfloat16_policy_takes_openpis_dtypes_and_keeps_float32_rotary_frequencies():
    """``dtype: bfloat16`` casts the parameters only, to openpi's dtypes (``PI0Model.parameter_dtypes``):
    the buffers (the rotary frequencies, which openpi's JAX π0 computes in float32) are the
    float32 policy's; it samples, and scores what it sampled, in float32 log-probs."""
    full = make_policy("pi0", tiny_config())
    half = make_policy("pi0", tiny_config(dtype="bfloat16"))
    dtypes = half.model.parameter_dtypes(torch.bfloat16)
    assert {name: p.dtype for name, p in half.model.named_parameters()} == dtypes
    assert set(dtypes.values()) == {torch.float32, torch.bfloat16}
    obs = camera_obs(4, seed=5)
    actions, log_probs = half.sample_actions(obs, generator=torch.Generator().manual_seed(3))
    assert log_probs.dtype == torch.float32 and torch.isfinite(log_probs).all()
    torch.testing.assert_close(half.log_prob_and_entropy(obs, actions)[0], log_probs, rtol=0, atol=1e-4)
    buffers = dict(full.named_buffers())
    assert any(name.endswith("rotary_emb.inv_freq") for name in buffers)
    for name, buffer in half.named_buffers():
        assert buffer.dtype == buffers[name].dtype and torch.equal(buffer, buffers[name]), name


def test_own_layout_round_trips():
    chain = torch.randn(2, 4, 3, 5)  # (B, N + 1, chunk, D)
    own = chain_to_own(chain)
    assert own.shape == (2, 3, 20)
    assert torch.equal(own[1, 2, 5:10], chain[1, 1, 2])  # block 1 of position 2
    assert torch.equal(own_to_chain(own, 3), chain)


def test_recomputed_log_probs_equal_the_sampled_ones_exactly(policy):
    obs = camera_obs(6, 1)
    own, log_probs = policy.sample_actions(obs, generator=torch.Generator().manual_seed(1))
    per_dim, entropy = policy.log_prob_and_entropy_per_dim(obs, own)
    assert per_dim.shape == entropy.shape == (6, 4, 20) and per_dim.requires_grad
    assert torch.equal(per_dim.sum(-1), log_probs)
    assert torch.equal(torch.exp(per_dim.sum(-1) - log_probs), torch.ones_like(log_probs))  # ratio 1
    # The chain the rollout stored is what the model went through: block 0 is N(0, I) noise.
    blocks = own.unflatten(2, (4, 5))  # (B, chunk, N + 1, D)
    assert 0.5 < float(blocks[:, :, 0].std()) < 2.0


def test_recomputed_log_probs_match_across_batch_shapes(policy):
    obs = camera_obs(6, 2)
    own, log_probs = policy.sample_actions(obs, generator=torch.Generator().manual_seed(2))
    rows = torch.tensor([4, 1])
    part, _ = policy.log_prob_and_entropy_per_dim(obs[rows], own[rows])
    torch.testing.assert_close(part.sum(-1), log_probs[rows], rtol=0, atol=1e-4)  # batch_invariant = False


def test_only_the_executed_values_of_the_denoised_blocks_are_scored(policy):
    obs = camera_obs(3, 3)
    own, _ = policy.sample_actions(obs, generator=torch.Generator().manual_seed(3))
    per_dim, entropy = policy.log_prob_and_entropy_per_dim(obs, own)
    scored = torch.zeros(4, 5, dtype=torch.bool)  # (N + 1 blocks, max_action_dim)
    scored[1:, :ACTION_DIM] = True
    scored = scored.flatten()  # own layout of one position
    for values in (per_dim, entropy):
        assert torch.all(values[..., ~scored] == 0)
        assert torch.all(values[..., scored] != 0)
    # Changing a padded value of the last block changes nothing scored by that step... but the
    # padded values of earlier blocks are velocity inputs, so they do change the log-probs.
    changed = own.clone()
    changed[..., 5 + ACTION_DIM] += 1.0  # block 1, first padded value
    assert not torch.equal(policy.log_prob_and_entropy_per_dim(obs, changed)[0], per_dim)


def test_entropy_is_the_gaussian_entropy_of_each_transition():
    policy = make_policy("pi0", tiny_config(sampler="flow_sde", noise_level=0.3))
    obs = camera_obs(2, 4)
    own, _ = policy.sample_actions(obs)
    _, entropy = policy.log_prob_and_entropy_per_dim(obs, own)
    first_step = entropy[..., 5:5 + ACTION_DIM]  # the first step's std is exactly a (RLinf's t_1 rule)
    torch.testing.assert_close(first_step, torch.full_like(first_step, math.log(0.3) + LOG_2PI_E_HALF))
    noise = make_policy("pi0", tiny_config(sampler="flow_noise", noise_min_std=0.05, noise_max_std=0.2))
    own, _ = noise.sample_actions(obs)
    _, entropy = noise.log_prob_and_entropy_per_dim(obs, own)
    scored = entropy.unflatten(2, (4, 5))[:, :, 1:, :ACTION_DIM]
    assert (scored >= math.log(0.05) + LOG_2PI_E_HALF - 1e-6).all()
    assert (scored <= math.log(0.2) + LOG_2PI_E_HALF + 1e-6).all()


def test_env_actions_denormalise_the_first_values_of_the_last_block(policy):
    own = torch.randn(2, 4, 20)
    last = own[..., 15:15 + ACTION_DIM]
    expected = ActionStatistics.from_dict(STATISTICS, "test").denormalize(last)
    torch.testing.assert_close(policy.env_actions(own), expected, rtol=0, atol=0)
    changed = own.clone()
    changed[..., :15] = 7.0  # earlier blocks
    changed[..., 15 + ACTION_DIM:] = 7.0  # padded values of the last block
    assert torch.equal(policy.env_actions(changed), policy.env_actions(own))
    # actions_from_env is the inverse on the normalised range (the unmasked gripper passes through).
    normalized = torch.rand(2, 4, ACTION_DIM) * 1.8 - 0.9
    raw = ActionStatistics.from_dict(STATISTICS, "test").denormalize(normalized)
    torch.testing.assert_close(policy.actions_from_env(raw), normalized, rtol=0, atol=1e-6)


def test_env_actions_libero_gripper_and_no_statistics():
    libero = make_policy("pi0", tiny_config(gripper_postprocess="libero"))
    own = torch.zeros(1, 4, 20)
    own[..., 15 + ACTION_DIM - 1] = torch.tensor([0.2, 0.8, 0.2, 0.8])  # gripper in [0, 1]: open above 0.5
    assert libero.env_actions(own)[0, :, -1].tolist() == [1.0, -1.0, 1.0, -1.0]
    plain = make_policy("pi0", tiny_config())
    assert plain.action_statistics is None
    assert torch.equal(plain.env_actions(own), own[..., 15:15 + ACTION_DIM])


def test_greedy_is_the_deterministic_ode_from_zero_noise(policy):
    obs = camera_obs(3, 5)
    own, log_probs = policy.sample_actions(obs, greedy=True)
    again, again_log_probs = policy.sample_actions(obs, greedy=True, generator=torch.Generator().manual_seed(9))
    assert torch.equal(own, again) and torch.equal(log_probs, again_log_probs)
    assert torch.equal(policy.predict_action_chunk(obs), own)
    chain = own_to_chain(own, policy.num_steps)
    assert torch.all(chain[:, 0] == 0)
    inputs = policy.model_inputs(obs)
    with torch.no_grad():
        cache = policy.model.prefix_cache(inputs)
        x = torch.zeros(3, 4, 5)
        for k, (t, t_next) in enumerate(zip(denoising_times(3)[:-1], denoising_times(3)[1:])):
            x = x - (t - t_next) * policy.model.velocity(cache, x, t, inputs.state)  # Euler, by hand
            torch.testing.assert_close(chain[:, k + 1], x, rtol=0, atol=0)
        ode = policy.model.sample_actions_ode(inputs, noise=torch.zeros(3, 4, 5))
    # openpi's time grid accumulates dt in float32, the samplers' is rounded once: rounding apart
    # (amplified by the time embedding's shortest period, 4e-3).
    torch.testing.assert_close(chain[:, -1], ode, rtol=0, atol=1e-4)
    per_dim, _ = policy.log_prob_and_entropy_per_dim(obs, own)
    assert torch.equal(per_dim.sum(-1), log_probs)  # the sampler's density of the ODE chain


def test_temperature_scales_the_transition_std(policy):
    obs = camera_obs(3, 6)
    own, log_probs = policy.sample_actions(obs, generator=torch.Generator().manual_seed(6), temperature=2.0)
    per_dim, entropy = policy.log_prob_and_entropy_per_dim(obs, own, temperature=2.0)
    assert torch.equal(per_dim.sum(-1), log_probs)
    _, entropy_one = policy.log_prob_and_entropy_per_dim(obs, own, temperature=1.0)
    scored = entropy != 0
    torch.testing.assert_close(entropy[scored], entropy_one[scored] + math.log(2.0))
    # Same draws, doubled std: the first step's deviation from its mean doubles.
    cold, _ = policy.sample_actions(obs, generator=torch.Generator().manual_seed(6), temperature=1.0)
    hot_chain, cold_chain = own_to_chain(own, 3), own_to_chain(cold, 3)
    assert torch.equal(hot_chain[:, 0], cold_chain[:, 0])
    mean = 2 * cold_chain[:, 1] - hot_chain[:, 1]  # hot = mean + 2 s eps, cold = mean + s eps
    torch.testing.assert_close(hot_chain[:, 1] - mean, 2 * (cold_chain[:, 1] - mean))
    # The config's temperature is the default of both.
    tempered = make_policy("pi0", dataclasses.replace(policy.config, temperature=2.0))
    tempered.load_state_dict(policy.state_dict())
    assert torch.equal(tempered.log_prob_and_entropy_per_dim(obs, own)[0], per_dim)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            policy.sample_actions(obs, temperature=bad)


def test_behaviour_cloning_lowers_the_flow_matching_loss():
    torch.manual_seed(0)
    policy = make_policy("pi0", tiny_config(action_statistics=STATISTICS))
    obs = camera_obs(4, 7)
    policy.fit_observation_normalization(obs)
    assert policy.proprio_statistics is not None
    expert = policy.actions_from_env(torch.rand(4, 4, ACTION_DIM))

    def fixed_loss() -> float:
        with torch.no_grad():
            return float(policy.bc_loss(obs, expert, generator=torch.Generator().manual_seed(0)))

    before = fixed_loss()
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    policy.train()
    for _ in range(40):  # fresh noise and times each step, as the warm start draws them
        loss = policy.bc_loss(obs, expert)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    policy.eval()
    assert fixed_loss() < 0.8 * before  # the flow-matching loss has an irreducible part


# --------------------------------------------------------------------------- executed prefix
EXECUTED, MODEL_CHUNK = 2, 6  # m = 3 model positions per executed slot


def prefix_config(executed: int | None = EXECUTED, **overrides) -> PI0PolicyConfig:
    return tiny_config(architecture={"preset": "tiny", "chunk_size": MODEL_CHUNK}, executed_actions=executed,
                       action_statistics=STATISTICS, **overrides)


@pytest.fixture(scope="module", params=["flow_sde", "flow_noise"])
def prefix_policy(request) -> PI0Policy:
    return make_policy("pi0", prefix_config(sampler=request.param))


def test_executed_prefix_sizes_and_strided_packing(prefix_policy):
    policy = prefix_policy
    assert (policy.chunk_size, policy.model_chunk_size, policy.chunk_groups, policy.bc_chunk_size) == (2, 6, 3, 6)
    assert policy.own_action_dim == 3 * (3 + 1) * 5 == 60
    assert PI0Policy.planned_action_sizes(policy.config) == (2, 60)
    assert PI0Policy.planned_action_sizes(prefix_config(executed=None)) == (6, 20)
    chain = torch.randn(2, 4, 6, 5)  # (B, N + 1, P, D)
    own = chain_to_own(chain, EXECUTED)
    assert own.shape == (2, 2, 60)
    for position in range(6):  # model position p = j n + c: slot c, group j
        c, j = position % 2, position // 2
        for k in range(4):
            assert torch.equal(own[:, c, j * 20 + k * 5 : j * 20 + (k + 1) * 5], chain[:, k, position])
    assert torch.equal(own_to_chain(own, 3, 3), chain)


def test_executed_prefix_scores_only_the_executed_positions(prefix_policy):
    """Slot c's log-prob is the executed action c's chain log-density, as the whole-chunk policy
    (same weights, same draws) scores model position c; recomputed exactly (ratio 1)."""
    policy = prefix_policy
    obs = camera_obs(3, 14)
    own, log_probs = policy.sample_actions(obs, generator=torch.Generator().manual_seed(14))
    assert own.shape == (3, 2, 60) and log_probs.shape == (3, 2)
    per_dim, entropy = policy.log_prob_and_entropy_per_dim(obs, own)
    assert torch.equal(per_dim.sum(-1), log_probs)
    assert torch.equal(torch.exp(per_dim.sum(-1) - log_probs), torch.ones_like(log_probs))  # ratio 1
    scored = torch.zeros(3, 4, 5, dtype=torch.bool)  # (m groups, N + 1 blocks, D) of one slot
    scored[0, 1:, :ACTION_DIM] = True
    scored = scored.flatten()
    for values in (per_dim, entropy):
        assert torch.all(values[..., ~scored] == 0) and torch.all(values[..., scored] != 0)
    whole = make_policy("pi0", dataclasses.replace(policy.config, executed_actions=None))
    whole.load_state_dict(policy.state_dict())
    whole_own, whole_log_probs = whole.sample_actions(obs, generator=torch.Generator().manual_seed(14))
    assert torch.equal(own_to_chain(own, 3, 3), own_to_chain(whole_own, 3))  # the same chains, packed
    torch.testing.assert_close(log_probs, whole_log_probs[:, :EXECUTED], rtol=0, atol=1e-5)
    torch.testing.assert_close(policy.env_actions(own), whole.env_actions(whole_own)[:, :EXECUTED], rtol=0, atol=0)
    # An unexecuted position's chain is an input of the executed ones' velocities: it must be kept.
    changed = own.clone()
    changed[:, 0, 20 + 5] += 1.0  # group 1 (model position 2), block 1, value 0
    assert not torch.equal(policy.log_prob_and_entropy_per_dim(obs, changed)[0], per_dim)
    assert "unexecuted positions" in PI0Policy.unscored_own_elements(policy.config)


def test_executed_prefix_greedy_and_behaviour_cloning_take_the_whole_model_chunk(prefix_policy):
    policy = prefix_policy
    obs = camera_obs(2, 15)
    chunk = policy.predict_action_chunk(obs)
    assert chunk.shape == (2, 2, 60) and torch.all(own_to_chain(chunk, 3, 3)[:, 0] == 0)  # the ODE from x_1 = 0
    assert policy.env_actions(chunk).shape == (2, 2, ACTION_DIM)
    expert = policy.actions_from_env(torch.rand(2, MODEL_CHUNK, ACTION_DIM))
    assert torch.isfinite(policy.bc_loss(obs, expert))
    with pytest.raises(ValueError, match="expert_actions"):
        policy.bc_loss(obs, expert[:, :EXECUTED])


@pytest.mark.parametrize(("fields", "named"), [
    ({"sampler": "ode"}, "sampler"),
    ({"stochastic_steps": "one"}, "stochastic_steps"),
    ({"noise_level": 0.0}, "noise_level"),
    ({"temperature": -1.0}, "temperature"),
    ({"noise_min_std": 0.2, "noise_max_std": 0.1}, "noise_min_std"),
    ({"noise_hidden_dims": (8, 0)}, "noise_hidden_dims"),
    ({"num_steps": 0}, "num_steps"),
    ({"action_dim": 6}, "action_dim"),
    ({"proprio_dim": 7}, "proprio_dim"),
    ({"cameras": ()}, "cameras"),
    ({"action_statistics": {"q01": [0.0], "q99": [1.0]}}, "action_statistics"),
    ({"gripper_postprocess": "robosuite"}, "gripper_postprocess"),
    ({"dtype": "float64"}, "dtype"),
    ({"architecture": "huge"}, "architecture"),
    ({"architecture": {"preset": "tiny", "chunk_sise": 3}}, "architecture"),
    ({"model_path": "/nonexistent"}, "model_path"),
    ({"model_path": "/data/pi0"}, "both are set: set architecture to null to load model_path"),  # the tiny kept
    ({"architecture": {"chunk_size": 4}}, "tokenizer_path"),
    ({"executed_actions": 3}, "executed_actions"),  # does not divide the tiny chunk of 4
    ({"executed_actions": 0}, "executed_actions"),
    ({"normalization": "quantile"}, "normalization"),
    ({"normalization": "mean_std", "action_statistics": STATISTICS}, "action_statistics"),
    ({"delta_action_mask": (True,) * 4}, "delta_action_mask"),  # longer than action_dim 3
    ({"delta_action_mask": (True,), "proprio_dim": None}, "delta_action_mask"),
    ({"delta_action_mask": [1, 0]}, "delta_action_mask"),
])
def test_bad_config_values_name_the_field(fields, named):
    with pytest.raises(ValueError, match=named):
        tiny_config(**fields)
