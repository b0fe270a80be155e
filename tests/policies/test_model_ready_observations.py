"""``Policy.model_ready_observations``: camera frames prepared once for several passes (π0's
resize with padding, OpenVLA-OFT's preparation and the towers' resize) give bit-identical
log-probs, entropies and behaviour-cloning losses, and the passes that read them resize nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import policies.openvla.modeling_prismatic as prismatic
import policies.openvla.processor_openvla as processor_openvla
import policies.pi0.processor_pi0 as processor_pi0
from policies import make_policy
from policies.image_resize import resize_uint8
from policies.mlp import MLPPolicyConfig
from policies.openvla import OpenVLAPolicyConfig
from policies.openvla_oft import OpenVLAOFTPolicyConfig
from policies.pi0 import PI0PolicyConfig
from vla_rl_core import keys
from vla_rl_core.observations import encode_instruction

CAMERAS = ("agentview", "robot0_eye_in_hand")
#: (policy name, config) of each case.
CASES = {
    "pi0": ("pi0", lambda: PI0PolicyConfig(architecture="tiny", action_dim=3, proprio_dim=4, cameras=CAMERAS)),
    # fused towers of one size (the published layout): the towers' resize is done once
    "openvla": ("openvla", lambda: OpenVLAPolicyConfig(architecture="tiny", action_dim=3)),
    # OpenVLA-OFT's Lanczos resize and centre crop first, two cameras
    "openvla_oft": ("openvla_oft", lambda: OpenVLAOFTPolicyConfig(
        architecture="tiny", action_dim=3, chunk_size=2, proprio_dim=4, num_images=2, cameras=CAMERAS,
        image_resize="jpeg_lanczos3", center_crop=True)),
    # fused towers of different sizes (as if: no preset has them): each resizes in the forward pass
    "openvla_towers_of_two_sizes": ("openvla", lambda: OpenVLAPolicyConfig(architecture="tiny", action_dim=3)),
}


def build(case: str):
    name, config = CASES[case]
    return make_policy(name, config())


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_one_thread):
    """Small models on the shared machines run fastest on one thread."""


def episodes_obs(policy, episodes: int, steps: int, height: int = 40, width: int = 30, seed: int = 0) -> TensorDict:
    """Camera observations of batch size ``(episodes, steps)``, as an embodied batch holds them."""
    generator = torch.Generator().manual_seed(seed)
    shape = (episodes, steps)
    codes = torch.from_numpy(np.stack([encode_instruction("lift the cube")] * episodes * steps)).unflatten(0, shape)
    data = {keys.OBS_STATE: torch.randn(*shape, 6, generator=generator), keys.OBS_INSTRUCTION: codes}
    for camera in policy.config.cameras:
        data[f"{camera}{keys.OBS_IMAGE_SUFFIX}"] = torch.randint(0, 256, (*shape, height, width, 3),
                                                                 generator=generator, dtype=torch.uint8)
    return TensorDict(data, batch_size=list(shape))


def resized_frames(monkeypatch) -> list[int]:
    """Count the frames the policies' processors and towers resize (calls that change the size),
    and those OpenVLA-OFT's preparation looks up (:class:`PreparedFrames`: a digest each)."""
    counts: list[int] = []
    lookup = processor_openvla.PREPARED_FRAMES.get

    def counting_lookup(image, *args):
        counts.append(1)
        return lookup(image, *args)

    def counting(images, height, width, mode):
        if tuple(images.shape[-2:]) != (height, width):
            counts.append(images.shape[0])
        return resize_uint8(images, height, width, mode)

    monkeypatch.setattr(processor_pi0, "resize_uint8", counting)
    monkeypatch.setattr(prismatic, "resize_uint8", counting)
    monkeypatch.setattr(processor_openvla.PREPARED_FRAMES, "get", counting_lookup)
    return counts


@pytest.mark.parametrize("case", sorted(CASES))
def test_prepared_observations_score_bit_identically_and_resize_nothing(case, monkeypatch):
    torch.manual_seed(0)
    policy = build(case)
    if case == "openvla_towers_of_two_sizes":
        monkeypatch.setattr(prismatic.PrismaticVisionBackbone, "image_size", property(lambda self: None))
    obs = episodes_obs(policy, 3, 4)
    mask = torch.tensor([[True, True, False, False], [True, False, False, False], [True, True, True, True]])
    before = {key: value.clone() for key, value in obs.items()}
    ready = policy.model_ready_observations(obs, mask)

    assert sorted(obs.keys()) == sorted(before) and all(torch.equal(obs[key], before[key]) for key in before)
    image_keys = [f"{camera}{keys.OBS_IMAGE_SUFFIX}" for camera in policy.config.cameras]
    model_keys = [f"{camera}{keys.OBS_MODEL_IMAGE_SUFFIX}" for camera in policy.config.cameras]
    assert not set(image_keys) & set(ready.keys()) and set(model_keys) <= set(ready.keys())
    for key in model_keys:
        frames = ready[key]
        assert frames.dtype == torch.uint8 and frames.shape[:2] == (3, 4) and frames.shape[-1] == 3
        assert not frames[~mask].any() and frames[mask].any()  # only the masked-in steps are prepared

    steps, prepared = obs[mask], ready[mask]  # (7,) each
    with torch.no_grad():
        actions, _ = policy.sample_actions(steps, generator=torch.Generator().manual_seed(1))
    counts = resized_frames(monkeypatch)
    expected = policy.log_prob_and_entropy_per_dim(steps, actions)
    raw_resizes = sum(counts)
    counts.clear()
    got = policy.log_prob_and_entropy_per_dim(prepared, actions)
    for value, reference in zip(got, expected, strict=True):
        assert torch.equal(value, reference)
    assert raw_resizes > 0
    assert sum(counts) == (2 * 7 if case == "openvla_towers_of_two_sizes" else 0)  # each tower's resize is left


def test_behaviour_cloning_losses_are_the_same_on_prepared_observations():
    policy = build("pi0")
    obs = episodes_obs(policy, 5, 1)[:, 0]
    expert = torch.rand(5, policy.bc_chunk_size, 3)
    ready = policy.model_ready_observations(obs)
    losses = [policy.bc_loss(observations, expert, generator=torch.Generator().manual_seed(3))
              for observations in (obs, ready)]
    assert torch.equal(losses[0], losses[1])


def test_state_policies_prepare_nothing():
    policy = make_policy("mlp", MLPPolicyConfig(obs_dim=4, action_dim=2, hidden_sizes=(8,)))
    obs = torch.randn(3, 4)
    assert policy.model_ready_observations(obs) is obs


def test_model_frames_of_some_cameras_only_are_refused():
    policy = build("openvla_oft")
    obs = episodes_obs(policy, 2, 1)[:, 0]
    ready = policy.model_ready_observations(obs)
    ready[f"{CAMERAS[1]}{keys.OBS_IMAGE_SUFFIX}"] = obs[f"{CAMERAS[1]}{keys.OBS_IMAGE_SUFFIX}"]
    del ready[f"{CAMERAS[1]}{keys.OBS_MODEL_IMAGE_SUFFIX}"]
    with pytest.raises(ValueError, match="model frames of some cameras only"):
        policy.model_inputs(ready)


def test_pi0_prepares_the_frames_where_they_are():
    """Frames on ``meta`` fail any copy to the CPU ("Cannot copy out of meta tensor"): π0's frames
    are resized on their own device (a GPU worker's GPU), with or without a mask."""
    policy = build("pi0")
    obs = episodes_obs(policy, 2, 3).apply(lambda value: value.to("meta") if value.dtype == torch.uint8 else value)
    side = policy.processor.image_size
    for mask in (None, torch.tensor([[True, False, True], [False, False, True]])):
        ready = policy.model_ready_observations(obs, mask)
        for camera in CAMERAS:
            frames = ready[f"{camera}{keys.OBS_MODEL_IMAGE_SUFFIX}"]
            assert frames.device.type == "meta" and frames.shape == (2, 3, side, side, 3)


@pytest.mark.parametrize("case", ["pi0", "openvla_oft"])
def test_prepared_observations_on_the_test_device(case, device):
    """On the test device (a GPU on the GPU check): the frames are prepared there (OpenVLA's
    towers resize on the policy's device, as its forward pass does) and score as the raw ones."""
    torch.manual_seed(0)
    policy = build(case).to(device)
    obs = episodes_obs(policy, 2, 3).to(device)
    mask = torch.tensor([[True, True, False], [True, False, True]], device=device)
    ready = policy.model_ready_observations(obs, mask)
    for camera in policy.config.cameras:
        assert ready[f"{camera}{keys.OBS_MODEL_IMAGE_SUFFIX}"].device == obs[f"{camera}{keys.OBS_IMAGE_SUFFIX}"].device
    steps, prepared = obs[mask], ready[mask]
    with torch.no_grad():
        actions, _ = policy.sample_actions(steps, generator=torch.Generator(device=device).manual_seed(1))
        expected = policy.log_prob_and_entropy_per_dim(steps, actions)
        got = policy.log_prob_and_entropy_per_dim(prepared, actions)
    for value, reference in zip(got, expected, strict=True):
        assert torch.equal(value, reference)
