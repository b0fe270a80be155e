"""State-resampling trajectory encoder: interpolation values worked out by hand."""

import pytest
import torch

from vla_rl.rewards.trajectory_encoders import TRAJECTORY_ENCODERS, encode_state_trajectories

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
