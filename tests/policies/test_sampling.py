"""Inverse-transform sampling of categorical distributions (policies/sampling.py)."""

from __future__ import annotations

import pytest
import torch

from policies import sampling
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


def test_a_point_rounded_up_to_the_stage_total_stays_on_the_last_positive_entry():
    """The second stage's fraction (what is left of u in the block over the block's sum) reaches
    1, or a hair above, where the float64 cumulative sum of the block sums rounded up; the point
    is kept below the total, in the last entry of positive weight, not past it."""
    weights = torch.tensor([[0.25, 0.75, 0.0, 0.0], [2.0, 0.0, 3.0, 0.0]], dtype=torch.float64)
    for fraction in (1.0, 1.0 + 2.3e-16):  # 1 and the next double above
        index, offset = sampling._locate(weights, torch.full((2, 1), fraction, dtype=torch.float64))
        assert index.tolist() == [[1], [2]]
        assert ((offset > 0) & (offset < torch.tensor([[0.75], [3.0]], dtype=torch.float64))).all()


def test_the_generator_makes_draws_reproducible():
    probs = torch.rand(3, 5, 64).softmax(-1)
    first = sample_categorical(probs, torch.Generator().manual_seed(7))
    second = sample_categorical(probs, torch.Generator().manual_seed(7))
    assert first.shape == (3, 5) and torch.equal(first, second)
    assert not torch.equal(first, sample_categorical(probs, torch.Generator().manual_seed(8)))


def test_a_long_tail_after_a_dominant_class_keeps_its_probability(monkeypatch):
    """40,000 classes of 2.5e-8 after one of 0.999: each is below half a float32 step near 1
    (6e-8), so a float32 cumulative sum never moved past the dominant class and the tail's 1e-3
    was never drawn. Uniforms placed in the tail must land on the tail's classes, in order, one
    interval of 2.5e-8 each."""
    tail = 40_000
    probs = torch.full((tail + 1,), 2.5e-8)
    probs[0] = 1.0 - tail * 2.5e-8
    points = 200
    uniform = 0.999 + (torch.arange(points, dtype=torch.float64) + 0.5) * (1e-3 / points)  # (200,)
    monkeypatch.setattr(sampling, "draw", lambda kind, shape, generator, dtype, device: uniform[:, None].to(dtype))
    samples = sampling.sample_categorical(probs.expand(points, -1))
    expected = 1 + ((uniform - 0.999) / 2.5e-8).floor().long()  # (200,)
    assert (samples - expected).abs().max() <= 1, (samples[:5], expected[:5])


def test_classes_in_every_block_are_drawn_at_their_probabilities():
    """1,300 classes: two blocks of 512 and a last one of 276; weight on each block's first and
    last class, zeros elsewhere (whole zero stretches, and a block boundary between two weighted
    classes). 40,000 draws: every class within 5 standard errors, no zero-weight class drawn."""
    weights = torch.zeros(1300)
    weighted = torch.tensor([0, 511, 512, 1023, 1024, 1299])
    weights[weighted] = torch.tensor([1.0, 2.0, 3.0, 0.5, 0.25, 4.0])
    probs = weights.double() / weights.sum()
    draws = 40_000
    samples = sampling.sample_categorical(weights.expand(draws, -1), torch.Generator().manual_seed(0))
    assert samples.shape == (draws,) and samples.dtype == torch.int64
    frequencies = torch.bincount(samples, minlength=1300).double() / draws
    standard_error = (probs * (1 - probs) / draws).sqrt()
    assert ((frequencies - probs).abs() <= 5 * standard_error + 1e-12).all()
    assert frequencies[weights == 0].sum() == 0


def test_the_result_has_the_leading_shape_and_stays_on_the_device():
    probs = torch.rand(2, 3, 700)
    assert sampling.sample_categorical(probs, torch.Generator().manual_seed(0)).shape == (2, 3)
    one = sampling.sample_categorical(torch.rand(700), torch.Generator().manual_seed(0))
    assert one.shape == () and 0 <= int(one) < 700
    meta = sampling.sample_categorical(torch.rand(4, 700, device="meta"), torch.Generator().manual_seed(0))
    assert meta.device.type == "meta" and meta.shape == (4,)


@pytest.mark.parametrize("classes", [3, 1000])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "zeros"])
def test_a_row_without_a_positive_finite_sum_is_refused_naming_it(classes, bad):
    # torch.multinomial refuses these rows; the inverse transform drew class `classes` (past the
    # last) from a NaN row of one block, and failed with an index error over several blocks.
    probs = torch.rand(2, 3, classes)
    if bad == "zeros":
        probs[1, 2] = 0.0
    else:
        probs[1, 2, 1] = bad
    with pytest.raises(ValueError, match=r"probs\[1, 2\]: the row's sum is (nan|inf|0\.0), not a positive finite"):
        sampling.sample_categorical(probs, torch.Generator().manual_seed(0))
