"""Inverse-transform sampling of categorical distributions (policies/sampling.py)."""

from __future__ import annotations

import torch

from policies.sampling import sample_categorical


def test_frequencies_match_the_probabilities():
    """200,000 draws per row: every class within 5 standard errors of its probability, and the
    classes of probability 0 (first, middle and last) never drawn."""
    weights = torch.tensor([[0.0, 1.0, 2.0, 0.0, 3.0, 4.0, 0.0],
                            [5.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0]])  # unnormalised
    probs = weights / weights.sum(-1, keepdim=True)
    draws = 200_000
    samples = sample_categorical(weights[:, None, :].expand(2, draws, 7), torch.Generator().manual_seed(0))
    assert samples.shape == (2, draws) and samples.dtype == torch.int64
    counts = torch.stack([torch.bincount(row, minlength=7) for row in samples]).double()
    frequencies = counts / draws
    standard_error = (probs * (1 - probs) / draws).sqrt()
    assert ((frequencies - probs).abs() <= 5 * standard_error + 1e-12).all()
    assert (counts[probs == 0] == 0).all()


def test_one_class_of_positive_probability_is_always_drawn():
    probs = torch.zeros(4, 50)
    probs[torch.arange(4), torch.tensor([0, 17, 48, 49])] = 1.0
    for seed in range(20):
        assert sample_categorical(probs, torch.Generator().manual_seed(seed)).tolist() == [0, 17, 48, 49]


def test_the_generator_makes_draws_reproducible():
    probs = torch.rand(3, 5, 64).softmax(-1)
    first = sample_categorical(probs, torch.Generator().manual_seed(7))
    second = sample_categorical(probs, torch.Generator().manual_seed(7))
    assert first.shape == (3, 5) and torch.equal(first, second)
    assert not torch.equal(first, sample_categorical(probs, torch.Generator().manual_seed(8)))
