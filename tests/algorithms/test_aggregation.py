"""Loss aggregation modes on a ragged batch, by hand."""

import pytest
import torch

from vla_rl.algorithms.aggregation import LOSS_AGG_MODES, aggregate_loss, aggregation_weight, masked_mean
from vla_rl_core.registry import RegistryError

NAN = float("nan")
INF = float("inf")

# Row 0: 3 valid tokens (1, 2, 3); row 1: 1 valid token (4); row 2: none.
# Masked positions hold NaN / inf and must never show up.
LOSS = torch.tensor([[1.0, 2.0, 3.0, NAN],
                     [4.0, INF, NAN, -INF],
                     [NAN, 5.0, INF, 6.0]])
MASK = torch.tensor([[1, 1, 1, 0],
                     [1, 0, 0, 0],
                     [0, 0, 0, 0]], dtype=torch.bool)

EXPECTED = {
    "token-mean": (1 + 2 + 3 + 4) / 4,             # 2.5
    "seq-mean-token-mean": ((1 + 2 + 3) / 3 + 4) / 2,  # 3.0, empty row excluded
    "seq-mean-token-sum": ((1 + 2 + 3) + 4) / 2,       # 5.0, empty row excluded
    "seq-mean-token-sum-norm": ((1 + 2 + 3) / 4 + 4 / 4) / 2,  # 1.25: constant 4 = seq_len
}


def test_registry_holds_exactly_the_four_modes():
    assert set(LOSS_AGG_MODES.names()) == set(EXPECTED)


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_modes_on_ragged_batch(mode):
    result = aggregate_loss(LOSS, MASK, mode)
    assert result.shape == ()
    assert result.item() == pytest.approx(EXPECTED[mode])


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_float_mask_same_as_bool(mode):
    assert aggregate_loss(LOSS, MASK.float(), mode).item() == pytest.approx(EXPECTED[mode])


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_gradient_is_finite_and_zero_at_masked_positions(mode):
    loss = LOSS.clone().requires_grad_(True)
    aggregate_loss(loss, MASK, mode).backward()
    assert torch.isfinite(loss.grad).all()
    assert torch.equal(loss.grad[~MASK], torch.zeros(int((~MASK).sum())))


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_nothing_valid_gives_zero_not_nan(mode):
    result = aggregate_loss(LOSS, torch.zeros_like(MASK), mode)
    assert result.item() == 0.0


def test_norm_mode_divides_by_the_constant_not_the_lengths():
    # The constant replaces each row's length: rows of 3 and 1 valid tokens, C = 10.
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", normalizer=10.0).item() == pytest.approx(
        ((1 + 2 + 3) / 10 + 4 / 10) / 2)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_normaliser_only_fits_the_norm_mode(mode):
    with pytest.raises(ValueError, match="normaliser"):
        aggregate_loss(LOSS, MASK, mode, normalizer=10.0)
    with pytest.raises(ValueError, match="normaliser"):
        aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", normalizer=0.0)


def test_masked_mean_by_hand():
    x = torch.tensor([[2.0, NAN], [4.0, 6.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert masked_mean(x, mask).item() == pytest.approx(4.0)


def test_unknown_mode_and_bad_shapes_raise():
    with pytest.raises(RegistryError, match="token-mean"):
        aggregate_loss(LOSS, MASK, "token-sum")
    with pytest.raises(ValueError, match="shape"):
        aggregate_loss(LOSS, MASK[:, :2], "token-mean")
    with pytest.raises(ValueError, match="batch, seq_len"):
        aggregate_loss(LOSS[0], MASK[0], "seq-mean-token-sum")


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_micro_batches_weighted_by_aggregation_weight_give_the_minibatchs_loss(mode):
    """``sum_i (w_i / W) * aggregate(micro_i) == aggregate(minibatch)`` (gradient accumulation),
    with a micro-batch whose one row is fully masked (weight 0, not one row) and one mixing such
    a row with valid ones."""
    loss = torch.cat([LOSS, torch.tensor([[7.0, 8.0, NAN, NAN], [NAN, NAN, NAN, NAN]])])
    mask = torch.cat([MASK, torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)])
    assert aggregation_weight(mask, mode) == (6.0 if mode == "token-mean" else 3.0)
    whole = aggregate_loss(loss, mask, mode)
    for split in ([[0], [1, 2], [3, 4]], [[2], [0, 1, 3, 4]], [[0, 1], [2, 3], [4]]):
        accumulated = sum(aggregation_weight(mask[rows], mode) / aggregation_weight(mask, mode)
                          * aggregate_loss(loss[rows], mask[rows], mode) for rows in split)  # an empty one: 0
        assert float(accumulated) == pytest.approx(float(whole)), split
