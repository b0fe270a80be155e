"""The π0 RL policy on the tiny in-process preset: own actions (the denoising chain) and their
shapes, recomputed log-probs equal to the sampled ones for both samplers, the scored elements,
environment actions from the last block, greedy = the ODE, temperature, behaviour cloning, the
processor, statistics (bounds_q99 and openpi's mean/std), state-relative actions, an executed
prefix of the model's chunk, loading a checkpoint directory, and config errors naming the field
(the export: test_pi0_export.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex

import numpy as np
import pytest
import torch
from PIL import Image
from tensordict import TensorDict

from policies import make_policy
from policies.normalization import ActionStatistics, MeanStdStatistics
from policies.pi0 import PI0PolicyConfig
from policies.pi0.checkpoint_pi0 import save_pi0_checkpoint
from policies.pi0.flow_sampling import denoising_times
from policies.pi0.own_actions import chain_to_own, own_to_chain
from policies.pi0.policy_pi0 import PI0Policy
from policies.pi0.processor_pi0 import IMAGES, LANG_MASKS, LANG_TOKENS, resize_with_pad
from tests.policies.pi0_helpers import (
    ACTION_DIM,
    INSTRUCTIONS,
    MEAN_STD,
    PROPRIO_DIM,
    STATISTICS,
    camera_obs,
    tiny_config,
)
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec

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


def test_the_processor_resizes_the_frames_where_they_are():
    """Regression: the processor copied every frame to the CPU to resize it, in every forward pass
    (the rollout's and each epoch's), so a GPU worker resized its frames on its CPU. Frames on the
    ``meta`` device fail any copy to the CPU ("Cannot copy out of meta tensor")."""
    policy = make_policy("pi0", tiny_config())
    obs = camera_obs(2, 8, height=20, width=40)
    obs.set(f"{policy.config.cameras[0]}_image", obs[f"{policy.config.cameras[0]}_image"].to("meta"))
    images = policy.processor(obs)[IMAGES]
    assert images.device.type == "meta" and images.shape == (2, 1, 3, 28, 28)


def openpi_client_resize_with_pad(image: np.ndarray, side: int) -> np.ndarray:
    """openpi's client-side ``resize_with_pad`` (``openpi_client/image_tools.py``): PIL bilinear
    to the aspect-preserving size, pasted on a black ``side`` square at the floor of half the
    margin; uint8 ``(side, side, 3)``."""
    height, width = image.shape[:2]
    ratio = max(width / side, height / side)
    new_h, new_w = int(height / ratio), int(width / ratio)
    resized = Image.fromarray(image).resize((new_w, new_h), resample=Image.BILINEAR)
    canvas = Image.new(resized.mode, (side, side), 0)
    canvas.paste(resized, (int((side - new_w) / 2), int((side - new_h) / 2)))
    return np.asarray(canvas)


@pytest.mark.parametrize("height, width, side", [(128, 128, 56), (20, 40, 28), (96, 128, 56), (40, 20, 56)])
def test_images_are_resized_with_padding_as_openpis_client_sends_them(height, width, side):
    """π0's frames are what openpi's clients send: PIL's 8-bit bilinear resize with black padding
    (here at most 2 of 255 away), scaled to [-1, 1]."""
    images = torch.randint(0, 256, (3, height, width, 3), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    expected = np.stack([openpi_client_resize_with_pad(image, side) for image in images.numpy()])
    pixels = resize_with_pad(images, side)  # (3, 3, side, side) in [-1, 1]
    as_uint8 = (pixels + 1) / 2 * 255  # back to [0, 255]: integers up to float rounding
    torch.testing.assert_close(as_uint8, as_uint8.round(), rtol=0, atol=1e-4)
    difference = (as_uint8.round().permute(0, 2, 3, 1) - torch.from_numpy(expected).float()).abs()
    assert difference.max() <= 2 and difference.mean() < 0.2


def test_processor_images_prompts_and_state():
    policy = make_policy("pi0", tiny_config(proprio_statistics={"q01": [-1.0] * 4, "q99": [1.0] * 4}))
    obs = camera_obs(2, 8, height=20, width=40)
    processed = policy.processor(obs)
    images = processed[IMAGES]
    assert images.shape == (2, 1, 3, 28, 28) and images.min() >= -1 and images.max() <= 1
    assert torch.all(images[:, :, :, :7] == -1) and torch.all(images[:, :, :, -7:] == -1)  # 40x20 -> 28x14, padded
    square = torch.randint(0, 256, (1, 28, 28, 3), dtype=torch.uint8)
    torch.testing.assert_close(resize_with_pad(square, 28), square.permute(0, 3, 1, 2).float() / 255 * 2 - 1)
    tokens, masks = processed[LANG_TOKENS], processed[LANG_MASKS]
    assert tokens.shape == masks.shape == (2, 48)
    tokenizer = policy.tokenizer
    for row, instruction in enumerate(INSTRUCTIONS):
        ids = tokens[row][masks[row]].tolist()
        assert masks[row, : len(ids)].all() and not masks[row, len(ids):].any()  # right-padded
        assert ids[0] == tokenizer.bos_token_id
        assert tokenizer.decode(ids, skip_special_tokens=True) == instruction + "\n"
    inputs = policy.model_inputs(obs)
    expected = ActionStatistics(torch.full((4,), -1.0), torch.ones(4), torch.ones(4, dtype=torch.bool)).normalize(
        obs[keys.OBS_STATE][:, :4])
    torch.testing.assert_close(inputs.state[:, :4], expected)
    assert torch.all(inputs.state[:, 4:] == 0)
    with pytest.raises(ValueError, match="instruction"):
        policy.sample_actions(obs.exclude(keys.OBS_INSTRUCTION))


def test_loads_a_checkpoint_directory_with_tokenizer_and_statistics(tmp_path):
    source = make_policy("pi0", tiny_config(seed=3))
    directory = save_pi0_checkpoint(source.model, tmp_path / "pi0")
    source.tokenizer.save_pretrained(str(directory))
    norm_stats = {"norm_stats": {"actions": {"q01": [-1.0, -2.0, -3.0, 0.0, 0.0], "q99": [1.0, 2.0, 3.0, 1.0, 1.0]},
                                 "state": {"q01": [0.0] * 6, "q99": [2.0] * 6}}}
    (directory / "norm_stats.json").write_text(json.dumps(norm_stats))
    loaded = make_policy("pi0", PI0PolicyConfig(model_path=str(directory), action_dim=ACTION_DIM,
                                                proprio_dim=PROPRIO_DIM))
    assert loaded.action_statistics.q99.tolist() == [1.0, 2.0, 3.0]
    assert loaded.proprio_statistics.q99.tolist() == [2.0] * 4
    obs = camera_obs(2, 9)
    statistics = {name: value for name, value in loaded.state_dict().items() if name.startswith(("action_", "proprio_"))}
    source.load_state_dict({**source.state_dict(), **statistics})
    torch.testing.assert_close(loaded.predict_action_chunk(obs), source.predict_action_chunk(obs), rtol=0, atol=0)
    with pytest.raises(ValueError, match="action_dim"):
        PI0Policy(PI0PolicyConfig(model_path=str(directory), action_dim=6))


# --------------------------------------------------------------------------- openpi's transforms
PROPRIO_MEAN_STD = {"mean": [1.0, 0.0, -1.0, 0.5], "std": [0.5, 2.0, 1.0, 4.0]}


def test_mean_std_normalises_as_openpi_without_clipping():
    """openpi's Normalize / Unnormalize (transforms.py 137-139, 170-173): (x - mean) / (std + 1e-6)
    and x * (std + 1e-6) + mean on every value, no clipping, no mask; the state normalised the same
    way; only the configured normalisation's buffers."""
    policy = make_policy("pi0", tiny_config(normalization="mean_std", action_statistics=MEAN_STD,
                                            proprio_statistics=PROPRIO_MEAN_STD))
    assert isinstance(policy.action_statistics, MeanStdStatistics)
    names = {name for name, _ in policy.named_buffers()}
    assert {"action_mean", "action_std", "proprio_mean", "proprio_std"} <= names
    assert not names & {"action_q01", "action_q99", "action_mask", "proprio_q01"}
    own = torch.zeros(1, 4, 20)
    own[0, :, 15:18] = torch.tensor([[3.0, -2.0, 0.5], [-5.0, 4.0, 10.0], [0.0, 0.0, 0.0], [1.0, 1.0, -1.0]])
    mean, std = torch.tensor(MEAN_STD["mean"], dtype=torch.float64), torch.tensor(MEAN_STD["std"], dtype=torch.float64)
    by_hand = own[0, :, 15:18].double() * (std + 1e-6) + mean  # e.g. 3 * 2.000001 + 0.5 = 6.500003
    torch.testing.assert_close(policy.env_actions(own)[0].double(), by_hand, rtol=1e-6, atol=1e-6)
    assert abs(float(policy.env_actions(own)[0, 0, 0]) - 6.500003) < 1e-5  # far outside [-1, 1]: not clipped
    torch.testing.assert_close(policy.actions_from_env(policy.env_actions(own)), own[..., 15:18], rtol=1e-5, atol=1e-4)
    obs = camera_obs(2, 10)
    state = obs[keys.OBS_STATE][:, :4].double()
    p_mean, p_std = (torch.tensor(PROPRIO_MEAN_STD[k], dtype=torch.float64) for k in ("mean", "std"))
    torch.testing.assert_close(policy.model_inputs(obs).state[:, :4].double(), (state - p_mean) / (p_std + 1e-6))
    # The warm start fits the mean and the population std (openpi's RunningStats).
    fitted = make_policy("pi0", tiny_config(normalization="mean_std"))
    assert fitted.proprio_statistics is None
    obs = camera_obs(6, 11)
    fitted.fit_observation_normalization(obs)
    torch.testing.assert_close(fitted.proprio_mean, obs[keys.OBS_STATE][:, :4].mean(0))
    torch.testing.assert_close(fitted.proprio_std, obs[keys.OBS_STATE][:, :4].std(0, unbiased=False))


DELTA_MASK = (True, False, True)  # action values 0 and 2 relative to state values 0 and 2


def test_delta_actions_add_the_raw_state_back_and_actions_from_env_subtracts_it():
    """openpi's AbsoluteActions after Unnormalize (and DeltaActions before Normalize): the raw
    state's masked values, not the normalised state the model reads, on every position."""
    policy = make_policy("pi0", tiny_config(normalization="mean_std", action_statistics=MEAN_STD,
                                            proprio_statistics=PROPRIO_MEAN_STD, delta_action_mask=DELTA_MASK))
    obs = camera_obs(2, 12)
    obs[keys.OBS_STATE] = torch.tensor([[0.25, 7.0, -3.0, 9.0, 1.0], [1.5, -7.0, 0.5, 9.0, 1.0]])
    own, _ = policy.sample_actions(obs, generator=torch.Generator().manual_seed(12))
    absolute = policy.action_statistics.denormalize(own[..., 15:18])  # (2, 4, 3)
    offset = torch.tensor([[0.25, 0.0, -3.0], [1.5, 0.0, 0.5]])[:, None]  # mask (T, F, T) of the raw state
    torch.testing.assert_close(policy.env_actions(own, obs), absolute + offset, rtol=0, atol=1e-6)
    env = policy.env_actions(own, obs)
    torch.testing.assert_close(policy.actions_from_env(env, obs), own[..., 15:18], rtol=1e-5, atol=1e-4)
    for method, args in (("env_actions", (own,)), ("actions_from_env", (env,))):
        with pytest.raises(ValueError, match=f"{method} needs the observations"):
            getattr(policy, method)(*args)
    with pytest.raises(ValueError, match="state"):
        policy.env_actions(own, obs[:1])


def test_delta_actions_with_bounds_q99_and_the_libero_gripper():
    """The order of the inverse: the gripper post-processing undone, the state subtracted, then
    normalised, so that a round trip through env_actions gives the normalised values back."""
    policy = make_policy("pi0", tiny_config(action_statistics=STATISTICS, delta_action_mask=(True, True),
                                            gripper_postprocess="libero"))
    obs = camera_obs(3, 13)
    normalized = torch.rand(3, 4, ACTION_DIM) * 1.8 - 0.9
    normalized[..., -1] = torch.tensor([0.2, 0.8, 0.2, 0.8])  # the unmasked gripper in [0, 1]
    own = torch.zeros(3, 4, 20)
    own[..., 15:18] = normalized
    env = policy.env_actions(own, obs)
    raw = ActionStatistics.from_dict(STATISTICS, "test").denormalize(normalized)
    torch.testing.assert_close(env[..., :2], raw[..., :2] + obs[keys.OBS_STATE][:, None, :2], rtol=0, atol=1e-6)
    assert env[0, :, -1].tolist() == [1.0, -1.0, 1.0, -1.0]
    binarised = normalized.clone()
    binarised[..., -1] = (normalized[..., -1] > 0.5).float()  # open (> 0.5) -> -1 -> 1: binarised
    torch.testing.assert_close(policy.actions_from_env(env, obs), binarised, rtol=0, atol=1e-5)


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


# --------------------------------------------------------------------------- LIBERO (embodied_*_pi0_libero)
LIBERO_TEMPLATE = "embodied_srpo_pi0_libero"
#: libero_10's longest instruction (66 tokens of the tiny tokenizer, within the template's 96).
LIBERO_INSTRUCTION = "put the white mug on the left plate and put the yellow and white mug on the right plate"


def libero_observations(env_config, batch: int, seed: int) -> TensorDict:
    """Random observations of ``LiberoEnv``'s declared space (8-value state, one uint8 image per
    camera), carried as the engine carries them (encoded instruction, stacked, TensorDict)."""
    from simulators.base import camera_observation_space
    from vla_rl_core.observations import observation, stack_observations, to_torch

    space = camera_observation_space(env_config.state_dim, env_config.cameras, env_config.camera_size)
    space.seed(seed)
    return to_torch(stack_observations([observation(space.sample(), LIBERO_INSTRUCTION) for _ in range(batch)]))


def test_the_libero_templates_policy_reads_a_libero_observation():
    """The template's tiny π0, built as a worker builds it, on LIBERO observations: agentview then
    the wrist camera as images, the 8-value state, the whole instruction as the prompt, and the
    model's 7 values as environment actions (no statistics, no gripper post-processing)."""
    from simulators.libero_env import LiberoEnvConfig
    from vla_rl.dag.loader import load_template
    from vla_rl.workflows.embodied import robot_policy

    config = load_template(LIBERO_TEMPLATE).config
    env = LiberoEnvConfig(**config.simulator.env)
    policy = robot_policy(config, EnvSpec(obs_dim=env.state_dim, action_dim=env.action_dim, horizon=env.horizon))
    obs = libero_observations(env, 2, 0)
    assert obs["agentview_image"].shape == obs["robot0_eye_in_hand_image"].shape == (2, 128, 128, 3)
    assert obs[keys.OBS_STATE].shape == (2, 8)
    processed = policy.processor(obs)
    images = processed[IMAGES]
    assert images.shape == (2, 2, 3, 56, 56)  # the π0 Lift templates' 56 px SigLIP input
    for slot, camera in enumerate(("agentview", "robot0_eye_in_hand")):  # openpi: base_0_rgb, left_wrist_0_rgb
        torch.testing.assert_close(images[:, slot], resize_with_pad(obs[f"{camera}_image"], 56), rtol=0, atol=0)
    inputs = policy.model_inputs(obs)
    assert torch.equal(inputs.state, obs[keys.OBS_STATE])  # 8 of max_state_dim 8, raw: no statistics yet
    ids = processed[LANG_TOKENS][0][processed[LANG_MASKS][0]].tolist()
    assert policy.tokenizer.decode(ids, skip_special_tokens=True) == LIBERO_INSTRUCTION + "\n"  # not truncated
    own, log_probs = policy.sample_actions(obs, generator=torch.Generator().manual_seed(0))
    assert own.shape == (2, 5, (3 + 1) * 7) and log_probs.shape == (2, 5) and torch.isfinite(log_probs).all()
    assert torch.equal(policy.env_actions(own), own[..., -7:])


def checkpoint_overrides(template: str) -> list[str]:
    """The override lines the template's header gives for openpi's pi0_libero checkpoint (the
    comment lines that follow the one ending in "as openpi runs it:", up to the parenthesis)."""
    from vla_rl.dag.loader import resolve_template_path

    lines = resolve_template_path(template).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith("as openpi runs it:")) + 1
    overrides = []
    for line in lines[start:]:
        if not line.startswith("#   "):
            break
        overrides += shlex.split(line[1:])
    return overrides


def test_the_libero_template_header_runs_openpis_checkpoint(tmp_path, capsys):
    """The header's override for openpi's pi0_libero checkpoint, as written there: the policy reads
    the mean/std of the norm_stats.json that openpi's conversion copies under assets/ (the first 7
    action / 8 state values: openpi writes them unpadded), executes 5 of the model's 10 actions
    here (50 for the real one) and adds the raw state's first 6 values to its de-normalised
    actions; ``vla-rl plan`` accepts it and sizes the own actions."""
    from simulators.libero_env import LiberoEnvConfig
    from vla_rl.cli import main
    from vla_rl.dag.loader import load_template
    from vla_rl.workflows.embodied import robot_policy

    source = make_policy("pi0", PI0PolicyConfig(architecture={"preset": "tiny", "max_action_dim": 7, "max_state_dim": 8,
                                                              "chunk_size": 10}, proprio_dim=8))
    directory = save_pi0_checkpoint(source.model, tmp_path / "pi0-libero")
    source.tokenizer.save_pretrained(str(directory))
    actions = {"q01": [-1.0] * 7, "q99": [1.0] * 7, "mean": [0.1] * 7, "std": [0.5] * 7}
    state = {"q01": [0.0] * 8, "q99": [2.0] * 8, "mean": [1.0] * 8, "std": [0.5] * 8}
    assets = directory / "assets" / "physical-intelligence" / "libero"
    assets.mkdir(parents=True)
    (assets / "norm_stats.json").write_text(json.dumps({"norm_stats": {"actions": actions, "state": state}}))
    overrides = checkpoint_overrides(LIBERO_TEMPLATE)
    assert overrides[:2] == ["policy.config.architecture=null", "policy.config.model_path=/data/pi0-libero"]
    overrides[1] = f"policy.config.model_path={directory}"
    assert main(["plan", LIBERO_TEMPLATE, *overrides]) == 0
    assert f"plan {LIBERO_TEMPLATE!r}" in capsys.readouterr().out
    config = load_template(LIBERO_TEMPLATE, overrides).config
    env = LiberoEnvConfig(**config.simulator.env)
    assert env.camera_size == 256
    policy = robot_policy(config, EnvSpec(obs_dim=env.state_dim, action_dim=env.action_dim, horizon=env.horizon))
    assert (policy.chunk_size, policy.model_chunk_size, policy.own_action_dim) == (5, 10, 2 * (3 + 1) * 7)
    assert PI0Policy.planned_action_sizes(policy.config) == (5, 2 * (3 + 1) * 7)
    assert isinstance(policy.action_statistics, MeanStdStatistics)
    assert policy.action_statistics.std.tolist() == [0.5] * 7 and policy.proprio_statistics.mean.tolist() == [1.0] * 8
    obs = libero_observations(env, 1, 1)
    own, _ = policy.sample_actions(obs, generator=torch.Generator().manual_seed(1))
    absolute = own[..., 3 * 7 : 4 * 7] * (0.5 + 1e-6) + 0.1  # group 0's last block, Unnormalize
    absolute[..., :6] += obs[keys.OBS_STATE][:, None, :6]  # AbsoluteActions(make_bool_mask(6, -1))
    torch.testing.assert_close(policy.env_actions(own, obs), absolute, rtol=0, atol=1e-6)
    assert policy.env_actions(own, obs).shape == (1, 5, 7)


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
