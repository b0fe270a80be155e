"""Trajectory encoders: state resampling (interpolation values worked out by hand), siiRL's frame
sampling (uniform, cyclic for short episodes), the V-JEPA 2 encoder on a tiny saved model, and the
policy-backbone encoder."""

import numpy as np
import pytest
import torch

from vla_rl.rewards.trajectory_encoders import (
    TRAJECTORY_ENCODERS,
    BackboneTrajectoryEncoder,
    FrameEncoderConfig,
    StateEncoderConfig,
    VJEPA2EncoderConfig,
    VJEPA2TrajectoryEncoder,
    build_trajectory_encoder,
    encode_state_trajectories,
    sample_frames,
    srpo_frame_indices,
)
from vla_rl_core.registry import RegistryError

NAN = float("nan")


def test_registered_under_state_resample():
    assert TRAJECTORY_ENCODERS.get("state_resample") is encode_state_trajectories


def test_linear_interpolation_by_hand():
    # 1-D states 0, 10, 20 (3 valid steps), resampled at 5 points: times 0, .5, 1, 1.5, 2.
    states = torch.tensor([[[0.0], [10.0], [20.0], [NAN]]])
    encoded = encode_state_trajectories(states, torch.tensor([3]), num_points=5)
    torch.testing.assert_close(encoded, torch.tensor([[0.0, 5.0, 10.0, 15.0, 20.0]]))


def test_multi_dimensional_layout_is_sample_major():
    # 2 valid steps of 2-D states (0, 100) -> (4, 200); 3 points at times 0, 0.5, 1.
    states = torch.tensor([[[0.0, 100.0], [4.0, 200.0], [NAN, NAN]]])
    encoded = encode_state_trajectories(states, torch.tensor([2]), num_points=3)
    torch.testing.assert_close(encoded, torch.tensor([[0.0, 100.0, 2.0, 150.0, 4.0, 200.0]]))


def test_non_integer_sample_times():
    # 4 valid steps (0, 3, 6, 12), 3 points at times 0, 1.5, 3 -> 0, (3 + 6) / 2, 12.
    states = torch.tensor([[[0.0], [3.0], [6.0], [12.0], [1e30]]])
    encoded = encode_state_trajectories(states, torch.tensor([4]), num_points=3)
    torch.testing.assert_close(encoded, torch.tensor([[0.0, 4.5, 12.0]]))


def test_steps_past_length_never_influence_result():
    clean = torch.arange(2 * 6 * 3, dtype=torch.float32).reshape(2, 6, 3)
    lengths = torch.tensor([4, 6])
    dirty = clean.clone()
    dirty[0, 4:] = torch.tensor([NAN, float("inf"), -1e30])
    expected = encode_state_trajectories(clean, lengths, num_points=7)
    torch.testing.assert_close(encode_state_trajectories(dirty, lengths, num_points=7), expected)
    assert torch.isfinite(expected).all()


def test_length_one_repeats_the_state():
    states = torch.tensor([[[1.0, -2.0], [NAN, NAN], [NAN, NAN]]])
    encoded = encode_state_trajectories(states, torch.tensor([1]), num_points=4)
    torch.testing.assert_close(encoded, torch.tensor([[1.0, -2.0] * 4]))


def test_invalid_arguments_raise():
    states = torch.zeros(2, 5, 3)
    with pytest.raises(ValueError, match="length"):
        encode_state_trajectories(states, torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="length"):
        encode_state_trajectories(states, torch.tensor([1, 6]))
    with pytest.raises(ValueError, match="num_points"):
        encode_state_trajectories(states, torch.tensor([1, 5]), num_points=1)
    with pytest.raises(ValueError, match="int64"):
        encode_state_trajectories(states, torch.tensor([1, 5], dtype=torch.int32))


def test_srpo_frame_indices_of_long_episodes_by_hand():
    # L = 5, 3 frames: 0, 2, 4. L = 4, 3 frames: 0, 1.5 -> 1, 3. L = 10, 4 frames: 0, 3, 6, 9.
    torch.testing.assert_close(srpo_frame_indices(torch.tensor([5, 4]), 3), torch.tensor([[0, 2, 4], [0, 1, 3]]))
    torch.testing.assert_close(srpo_frame_indices(torch.tensor([10]), 4), torch.tensor([[0, 3, 6, 9]]))
    # L = num_frames: every step once.
    torch.testing.assert_close(srpo_frame_indices(torch.tensor([64]), 64), torch.arange(64)[None])
    with pytest.raises(ValueError, match="num_frames"):
        srpo_frame_indices(torch.tensor([3]), 1)
    with pytest.raises(ValueError, match="lengths"):
        srpo_frame_indices(torch.tensor([0, 3]), 2)


def test_srpo_frame_indices_pad_a_10_frame_episode_cyclically():
    # siiRL (VideoEmbeddingModel.get_embeddings, 64 frames): np.resize(np.arange(10), 64) = 0..9 six
    # times, then 0..3; not each frame repeated (0, 0, ..., 1, 1, ...).
    expected = torch.tensor([list(range(10)) * 6 + [0, 1, 2, 3]])
    torch.testing.assert_close(srpo_frame_indices(torch.tensor([10]), 64), expected)
    # L = 3, 5 frames: 0, 1, 2, 0, 1. L = 1: always step 0. Batched with a long episode (L = 7: 0, 1, 3, 4, 6).
    torch.testing.assert_close(srpo_frame_indices(torch.tensor([3, 1, 7]), 5),
                               torch.tensor([[0, 1, 2, 0, 1], [0, 0, 0, 0, 0], [0, 1, 3, 4, 6]]))


def test_srpo_frame_indices_round_as_numpy_linspace_does():
    # L = 154, 64 frames: step (153 / 63) in float64 times k lands just below the integers 51, 102
    # and 119 at k = 21, 42, 49, so numpy.linspace(..., dtype=int) (siiRL) gives 50, 101, 118 there;
    # elsewhere floor(k * 153 / 63) exactly; the last frame is 153.
    expected = [k * 153 // 63 for k in range(64)]
    expected[21], expected[42], expected[49] = 50, 101, 118
    torch.testing.assert_close(srpo_frame_indices(torch.tensor([154]), 64), torch.tensor([expected]))


def test_srpo_frame_indices_match_siirl_numpy_expression():
    lengths = torch.arange(1, 400)
    for num_frames in (2, 16, 64):
        indices = srpo_frame_indices(lengths, num_frames)
        for length, row in zip(lengths.tolist(), indices.tolist()):
            # siiRL's siirl/utils/embodied/video_emb.py, VideoEmbeddingModel.get_embeddings.
            if length >= num_frames:
                reference = np.linspace(0, length - 1, num=num_frames, dtype=int)
            else:
                reference = np.resize(np.arange(length), num_frames)
            assert row == reference.tolist(), (length, num_frames)


def _numbered_frames(batch: int, time: int, size: int) -> torch.Tensor:
    """(batch, time, size, size, 3) uint8 whose every pixel of frame (b, t) holds 10 * b + t."""
    values = (10 * torch.arange(batch)[:, None] + torch.arange(time)[None, :]).to(torch.uint8)  # (B, T)
    return values[:, :, None, None, None].expand(batch, time, size, size, 3).contiguous()


def test_sample_frames_reads_only_the_valid_steps():
    frames = _numbered_frames(2, 6, 4)
    sampled = sample_frames(frames, torch.tensor([5, 6]), 3)
    assert sampled.shape == (2, 3, 4, 4, 3) and sampled.dtype == torch.uint8
    # episode 0: steps 0, 2, 4; episode 1: steps 0, 2 (2.5 floored), 5.
    torch.testing.assert_close(sampled[:, :, 0, 0, 0], torch.tensor([[0, 2, 4], [10, 12, 15]], dtype=torch.uint8))
    # A 2-step episode of 5 frames cycles through its steps 0, 1 and never reads the padding.
    short = sample_frames(frames, torch.tensor([2, 6]), 5)
    torch.testing.assert_close(short[0, :, 0, 0, 0], torch.tensor([0, 1, 0, 1, 0], dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        sample_frames(frames.float(), torch.tensor([5, 6]), 3)
    with pytest.raises(ValueError, match="length"):
        sample_frames(frames, torch.tensor([5, 7]), 3)


def test_vjepa2_encoder_embeds_uniform_frames_with_mean_pooled_tokens(tiny_vjepa2_dir, torch_one_thread):
    from transformers import VJEPA2Model

    encoder = build_trajectory_encoder("vjepa2", VJEPA2EncoderConfig(model_dir=str(tiny_vjepa2_dir)))
    assert isinstance(encoder, VJEPA2TrajectoryEncoder) and encoder.embedding_dim == 32
    # Frames of 36 px = int(32 * 256 / 224): the resize keeps them, the centre crop removes 2 px a side.
    generator = torch.Generator().manual_seed(1)
    frames = torch.randint(0, 256, (2, 9, 36, 36, 3), dtype=torch.uint8, generator=generator)
    lengths = torch.tensor([7, 9])
    embeddings = encoder(frames, lengths, num_points=4)
    assert embeddings.shape == (2, 32) and embeddings.dtype == torch.float32

    # By hand: steps floor(linspace(0, 6, 4)) = 0, 2, 4, 6 and floor(linspace(0, 8, 4)) = 0, 2, 5, 8.
    clips = torch.stack([frames[0, [0, 2, 4, 6]], frames[1, [0, 2, 5, 8]]])  # (2, 4, 36, 36, 3)
    mean = torch.tensor([0.485, 0.456, 0.406])[None, None, :, None, None]
    std = torch.tensor([0.229, 0.224, 0.225])[None, None, :, None, None]
    pixels = (clips[:, :, 2:34, 2:34].permute(0, 1, 4, 2, 3).float() / 255.0 - mean) / std  # (2, 4, 3, 32, 32)
    torch.testing.assert_close(encoder.preprocess(clips), pixels, atol=1e-5, rtol=1e-5)
    reloaded = VJEPA2Model.from_pretrained(tiny_vjepa2_dir).eval()
    with torch.no_grad():
        tokens = reloaded(pixels, skip_predictor=True).last_hidden_state  # (2, 2 * 2 * 2, 32)
    assert tokens.shape == (2, 8, 32)
    torch.testing.assert_close(embeddings, tokens.sum(dim=1) / 8, atol=1e-5, rtol=1e-5)
    # Steps past an episode's length never matter.
    frames[0, 7:] = 0
    torch.testing.assert_close(encoder(frames, lengths, num_points=4), embeddings)


def test_vjepa2_encoder_rejects_bad_inputs(tiny_vjepa2_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        VJEPA2TrajectoryEncoder(VJEPA2EncoderConfig(model_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="model_dir is required"):
        VJEPA2EncoderConfig()
    encoder = VJEPA2TrajectoryEncoder(VJEPA2EncoderConfig(model_dir=str(tiny_vjepa2_dir)))
    with pytest.raises(ValueError, match="tubelet_size"):
        encoder(torch.zeros(1, 4, 36, 36, 3, dtype=torch.uint8), torch.tensor([4]), num_points=3)


def test_backbone_encoder_concatenates_frame_features_in_time_order():
    calls = []

    def frame_features(frames):  # (n, H, W, 3) uint8 -> (n, 2): the pixel value and its double
        calls.append(frames.shape)
        value = frames[:, 0, 0, 0].float()
        return torch.stack([value, 2 * value], dim=1)

    encoder = build_trajectory_encoder("policy_backbone", frame_features=frame_features)
    assert encoder.frame_features is frame_features
    assert isinstance(encoder, BackboneTrajectoryEncoder)
    embeddings = encoder(_numbered_frames(2, 6, 4), torch.tensor([5, 6]), num_points=3)
    assert calls == [(6, 4, 4, 3)]
    # Steps 0, 2, 4 (episode 0) and 0, 2, 5 (episode 1; values 10 + step).
    torch.testing.assert_close(embeddings, torch.tensor([[0.0, 0.0, 2.0, 4.0, 4.0, 8.0],
                                                         [10.0, 20.0, 12.0, 24.0, 15.0, 30.0]]))
    with pytest.raises(ValueError, match="feature_dim"):
        BackboneTrajectoryEncoder(FrameEncoderConfig(), lambda frames: torch.zeros(1, 2))(
            _numbered_frames(1, 3, 4), torch.tensor([3]), 2)
    with pytest.raises(TypeError, match="callable"):
        BackboneTrajectoryEncoder(FrameEncoderConfig(), "not a function")


def test_build_trajectory_encoder_function_entry_and_errors():
    assert build_trajectory_encoder("state_resample") is encode_state_trajectories
    assert TRAJECTORY_ENCODERS.config_class("state_resample") is StateEncoderConfig
    with pytest.raises(ValueError, match="points must be >= 2"):
        StateEncoderConfig(points=1)
    with pytest.raises(RegistryError, match="vjepa2"):
        build_trajectory_encoder("vjepa3")
