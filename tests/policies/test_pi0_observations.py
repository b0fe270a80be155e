"""π0's observations in and actions out on the tiny in-process preset: the processor (frames
resized with padding where they are, as openpi's client sends them; prompts; state), loading a
checkpoint directory with its tokenizer and statistics, openpi's transforms (mean/std without
clipping, state-relative actions, the LIBERO gripper), and the LIBERO templates' policy on a LIBERO
observation and openpi's checkpoint layout (the sampling and scoring: test_pi0_policy.py)."""

from __future__ import annotations

import json
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


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_one_thread):
    """Small models on the shared machines run fastest on one thread."""


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


def test_an_openpi_or_lerobot_checkpoint_without_its_statistics_is_refused(tmp_path):
    """A checkpoint of openpi's or LeRobot's (a config.json, no pi0_architecture.json) without
    norm_stats.json acted on normalised actions, de-normalised by nothing, silently: openpi's
    create_trained_policy refuses it too. Its statistics under assets/, or the config's, are
    enough; the policy's own export without statistics (pi0_architecture.json) acts in the
    simulator's units, as the policy it was exported from."""
    from policies.pi0.transforms_pi0 import load_statistics, register_statistics

    external = tmp_path / "openpi"
    external.mkdir()
    (external / "config.json").write_text(json.dumps({"action_dim": 32, "action_horizon": 10}))

    def statistics(**fields):
        module = torch.nn.Module()
        config = PI0PolicyConfig(model_path=str(external), action_dim=3, proprio_dim=4, **fields)
        register_statistics(module, config.normalization, config.action_dim, config.proprio_dim)
        load_statistics(module, config)
        return module

    with pytest.raises(ValueError, match=rf"^{external}: no norm_stats.json there nor under its assets/ .*copy the "
                                         r"checkpoint's norm_stats.json there, or give policy.config.action_statistics"):
        statistics()
    assert statistics(action_statistics=STATISTICS).action_statistics_set
    (external / "assets" / "libero").mkdir(parents=True)
    (external / "assets" / "libero" / "norm_stats.json").write_text(json.dumps(
        {"norm_stats": {"actions": {"q01": [-1.0, -2.0, -3.0], "q99": [1.0, 2.0, 3.0]}}}))
    assert statistics().action_q99.tolist() == [1.0, 2.0, 3.0]
    own = make_policy("pi0", tiny_config()).save_pretrained(tmp_path / "own")  # no statistics set
    assert not (own / "norm_stats.json").exists()
    assert make_policy("pi0", PI0PolicyConfig(model_path=str(own), action_dim=ACTION_DIM,
                                              proprio_dim=PROPRIO_DIM)).action_statistics is None


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


