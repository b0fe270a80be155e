"""The π0 RL policy on the tiny in-process preset: own actions (the denoising chain) and their
shapes, recomputed log-probs equal to the sampled ones for both samplers, the scored elements,
environment actions from the last block, greedy = the ODE, temperature, behaviour cloning, the
processor, statistics, loading a checkpoint directory, and config errors naming the field."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from policies import make_policy
from policies.action_normalization import ActionStatistics
from policies.pi0 import PI0PolicyConfig
from policies.pi0.checkpoint_pi0 import save_pi0_checkpoint
from policies.pi0.flow_sampling import denoising_times
from policies.pi0.policy_pi0 import PI0Policy, chain_to_own, own_to_chain
from policies.pi0.processor_pi0 import IMAGES, LANG_MASKS, LANG_TOKENS, resize_with_pad
from vla_rl.data import keys
from vla_rl.data.observations import encode_instruction

ACTION_DIM, PROPRIO_DIM = 3, 4  # the tiny model pads to max_action_dim 5, max_state_dim 6
INSTRUCTIONS = ("lift the cube", "open the top drawer of the cabinet")
STATISTICS = {"q01": [-0.5, -1.0, 0.0], "q99": [0.5, 2.0, 1.0], "mask": [True, True, False]}
LOG_2PI_E_HALF = 0.5 * math.log(2 * math.pi * math.e)


def camera_obs(batch: int, seed: int, height: int = 32, width: int = 32) -> TensorDict:
    generator = torch.Generator().manual_seed(seed)
    codes = np.stack([encode_instruction(INSTRUCTIONS[row % 2]) for row in range(batch)])
    return TensorDict({
        keys.OBS_STATE: torch.randn(batch, 5, generator=generator),
        f"agentview{keys.OBS_IMAGE_SUFFIX}": torch.randint(0, 256, (batch, height, width, 3), generator=generator,
                                                          dtype=torch.uint8),
        keys.OBS_INSTRUCTION: torch.from_numpy(codes),
    }, batch_size=[batch])


def tiny_config(**overrides) -> PI0PolicyConfig:
    fields = {"architecture": "tiny", "action_dim": ACTION_DIM, "proprio_dim": PROPRIO_DIM}
    return PI0PolicyConfig(**{**fields, **overrides})


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


# --------------------------------------------------------------------------- LIBERO (embodied_*_pi0_libero)
LIBERO_TEMPLATE = "embodied_srpo_pi0_libero"
#: libero_10's longest instruction (66 tokens of the tiny tokenizer, within the template's 96).
LIBERO_INSTRUCTION = "put the white mug on the left plate and put the yellow and white mug on the right plate"


def libero_observations(env_config, batch: int, seed: int) -> TensorDict:
    """Random observations of ``LiberoEnv``'s declared space (8-value state, one uint8 image per
    camera), carried as the engine carries them (encoded instruction, stacked, TensorDict)."""
    from simulators.robosuite_env import camera_observation_space
    from vla_rl.data.observations import observation, stack_observations, to_torch

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
    policy = robot_policy(config, obs_dim=env.state_dim, act_dim=env.action_dim)
    obs = libero_observations(env, 2, 0)
    assert obs["agentview_image"].shape == obs["robot0_eye_in_hand_image"].shape == (2, 128, 128, 3)
    assert obs[keys.OBS_STATE].shape == (2, 8)
    processed = policy.processor(obs)
    images = processed[IMAGES]
    assert images.shape == (2, 2, 3, 28, 28)
    for slot, camera in enumerate(("agentview", "robot0_eye_in_hand")):  # openpi: base_0_rgb, left_wrist_0_rgb
        torch.testing.assert_close(images[:, slot], resize_with_pad(obs[f"{camera}_image"], 28), rtol=0, atol=0)
    inputs = policy.model_inputs(obs)
    assert torch.equal(inputs.state, obs[keys.OBS_STATE])  # 8 of max_state_dim 8, raw: no statistics yet
    ids = processed[LANG_TOKENS][0][processed[LANG_MASKS][0]].tolist()
    assert policy.tokenizer.decode(ids, skip_special_tokens=True) == LIBERO_INSTRUCTION + "\n"  # not truncated
    own, log_probs = policy.sample_actions(obs, generator=torch.Generator().manual_seed(0))
    assert own.shape == (2, 5, (3 + 1) * 7) and log_probs.shape == (2, 5) and torch.isfinite(log_probs).all()
    assert torch.equal(policy.env_actions(own), own[..., -7:])


def test_the_libero_template_points_at_a_local_checkpoint(tmp_path, capsys):
    """The documented override for a real checkpoint: ``architecture=null`` and ``model_path``; the
    policy takes the checkpoint's chunk and the first 7 action / 8 state q01/q99 of its
    ``norm_stats.json`` (openpi writes them unpadded), and ``vla-rl plan`` accepts it."""
    from simulators.libero_env import LiberoEnvConfig
    from vla_rl.cli import main
    from vla_rl.dag.loader import load_template
    from vla_rl.workflows.embodied import robot_policy

    source = make_policy("pi0", PI0PolicyConfig(architecture={"preset": "tiny", "max_action_dim": 7, "max_state_dim": 8,
                                                              "chunk_size": 6}, proprio_dim=8))
    directory = save_pi0_checkpoint(source.model, tmp_path / "pi0-libero")
    source.tokenizer.save_pretrained(str(directory))
    actions = {"q01": [-1.0] * 6 + [-1.0], "q99": [1.0] * 6 + [1.0], "mean": [0.0] * 7, "std": [0.5] * 7}
    state = {"q01": [0.0] * 8, "q99": [2.0] * 8, "mean": [1.0] * 8, "std": [0.5] * 8}
    (directory / "norm_stats.json").write_text(json.dumps({"norm_stats": {"actions": actions, "state": state}}))
    overrides = ["policy.config.architecture=null", f"policy.config.model_path={directory}",
                 "simulator.env.camera_size=256"]
    assert main(["plan", LIBERO_TEMPLATE, *overrides]) == 0
    assert f"plan {LIBERO_TEMPLATE!r}" in capsys.readouterr().out
    config = load_template(LIBERO_TEMPLATE, overrides).config
    env = LiberoEnvConfig(**config.simulator.env)
    policy = robot_policy(config, obs_dim=env.state_dim, act_dim=env.action_dim)
    assert policy.chunk_size == 6 and policy.action_statistics.q99.tolist() == [1.0] * 7
    assert policy.proprio_statistics.q99.tolist() == [2.0] * 8
    own, _ = policy.sample_actions(libero_observations(env, 1, 1), generator=torch.Generator().manual_seed(1))
    assert policy.env_actions(own).shape == (1, 6, 7)


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
])
def test_bad_config_values_name_the_field(fields, named):
    with pytest.raises(ValueError, match=named):
        tiny_config(**fields)
