"""OpenVLA's action tokenizer and restricted softmax, against numpy re-computations of
OpenVLA's formulas (``np.digitize`` tokenization, ``bin_centers[clip(d - 1, 0, 254)]``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from policies.action_tokenizer import ActionTokenizer, bin_log_softmax

VOCAB_END = 32000  # Llama-2's tokenizer, as in OpenVLA
BINS = np.linspace(-1.0, 1.0, 256)
CENTERS = (BINS[:-1] + BINS[1:]) / 2.0


@pytest.fixture(scope="module")
def tokenizer():
    return ActionTokenizer(VOCAB_END)


def openvla_tokens(actions: np.ndarray) -> np.ndarray:
    """prismatic/vla/action_tokenizer.py: vocab_size - digitize(clip(a, -1, 1), bins)."""
    return VOCAB_END - np.digitize(np.clip(actions, -1.0, 1.0), BINS)


def openvla_decode(tokens: np.ndarray) -> np.ndarray:
    """OpenVLAForActionPrediction.predict_action: bin_centers[clip(vocab - t - 1, 0, 254)]."""
    return CENTERS[np.clip(VOCAB_END - tokens - 1, 0, CENTERS.shape[0] - 1)]


def test_bin_edges_and_extremes(tokenizer):
    values = torch.tensor([-1.0, 1.0, -1.5, 2.0, 0.0])
    assert tokenizer.bins_from_actions(values).tolist() == [0, 255, 0, 255, 127]
    # Each interior edge e_b opens bin b; the float just below it is still in bin b - 1.
    edges = torch.from_numpy(BINS)  # float64, as numpy compares
    below = torch.nextafter(edges, torch.tensor(-2.0, dtype=torch.float64))
    assert tokenizer.bins_from_actions(edges).tolist() == list(range(256))
    assert tokenizer.bins_from_actions(below[1:]).tolist() == list(range(255))
    assert tokenizer.tokens_from_bins(torch.tensor([0, 255])).tolist() == [VOCAB_END - 1, VOCAB_END - 256]


def test_tokens_match_openvla_on_random_values(tokenizer):
    actions = np.random.default_rng(0).uniform(-1.2, 1.2, size=2000).astype(np.float32)
    actions[:4] = [-1.0, 1.0, BINS[100], BINS[200]]
    ours = tokenizer.tokens_from_bins(tokenizer.bins_from_actions(torch.from_numpy(actions)))
    np.testing.assert_array_equal(ours.numpy(), openvla_tokens(actions.astype(np.float64)))


def test_round_trips_bins_values_tokens(tokenizer):
    bins = torch.arange(256)
    values = tokenizer.actions_from_bins(bins)
    assert torch.equal(tokenizer.bins_from_actions(values), bins)
    assert values[255] == 1.0 and values[0] == pytest.approx(CENTERS[0])
    tokens = tokenizer.tokens_from_bins(bins)
    assert torch.equal(tokenizer.bins_from_tokens(tokens), bins)
    # Environment decoding is OpenVLA's: the last bin shares the previous centre.
    expected = openvla_decode(tokens.numpy())
    np.testing.assert_allclose(tokenizer.decode_for_env(bins).numpy(), expected, rtol=0, atol=1e-7)


def test_invalid_inputs_raise(tokenizer):
    with pytest.raises(ValueError, match="NaN"):
        tokenizer.bins_from_actions(torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="bin indices"):
        tokenizer.actions_from_bins(torch.tensor([256]))
    with pytest.raises(ValueError, match="action token ids"):
        tokenizer.bins_from_tokens(torch.tensor([VOCAB_END]))
    with pytest.raises(ValueError, match="vocab_end"):
        ActionTokenizer(100)


def test_restricted_softmax_against_a_hand_computation():
    tokenizer = ActionTokenizer(300)
    logits = torch.randn(2, 320, generator=torch.Generator().manual_seed(0)) * 3
    temperature = 0.7
    log_probs = bin_log_softmax(tokenizer.bin_logits(logits), temperature)
    for row in range(2):
        action_logits = [float(logits[row, 299 - b]) / temperature for b in range(256)]  # bin b ↔ id 299 - b
        log_normaliser = math.log(sum(math.exp(value) for value in action_logits))
        expected = torch.tensor([value - log_normaliser for value in action_logits])
        torch.testing.assert_close(log_probs[row], expected.float(), rtol=0, atol=1e-5)
    # The rest of the vocabulary gets no mass, whatever its logits.
    boosted = logits.clone()
    boosted[:, :44] += 100.0
    boosted[:, 300:] += 100.0
    assert torch.equal(bin_log_softmax(tokenizer.bin_logits(boosted), temperature), log_probs)
    with pytest.raises(ValueError, match="temperature"):
        bin_log_softmax(tokenizer.bin_logits(logits), 0.0)
