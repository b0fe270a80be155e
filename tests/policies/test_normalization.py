"""policies.normalization, the one home of the normalisation formulas, against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from policies.normalization import (
    MEAN_STD_EPS,
    MeanStdStatistics,
    fit_bounds_q99,
    fit_mean_std,
    mean_std_denormalize,
    mean_std_normalize,
)

VALUES = torch.tensor([[1.0, 5.0], [3.0, 5.0], [5.0, 5.0]])  # feature 1 constant


def test_fit_mean_std_is_the_population_std_floored():
    mean, std = fit_mean_std(VALUES)
    assert mean.tolist() == [3.0, 5.0]
    assert std.tolist() == pytest.approx([(8 / 3) ** 0.5, 0.0])  # sqrt(((-2)^2 + 0 + 2^2) / 3)
    assert fit_mean_std(VALUES, std_floor=0.1)[1].tolist() == pytest.approx([(8 / 3) ** 0.5, 0.1])


def test_mean_std_normalize_and_its_inverse():
    mean, std = torch.tensor([3.0, 5.0]), torch.tensor([2.0, 0.5])
    x = torch.tensor([[7.0, 4.0]])
    assert mean_std_normalize(x, mean, std).tolist() == [[2.0, -2.0]]
    assert mean_std_normalize(x, mean, std, eps=0.5)[0].tolist() == pytest.approx([1.6, -1.0])  # 4 / 2.5, -1 / 1
    assert torch.equal(mean_std_denormalize(mean_std_normalize(x, mean, std), mean, std), x)


def test_openpis_mean_std_statistics_guard_the_denominator():
    stats = MeanStdStatistics(torch.tensor([1.0]), torch.tensor([0.0]))
    out = stats.normalize(torch.tensor([[1.5]], dtype=torch.float64))
    assert out.dtype == torch.float32 and out.item() == pytest.approx(0.5 / MEAN_STD_EPS)


def test_fit_bounds_q99_are_the_1st_and_99th_percentiles():
    values = torch.arange(101, dtype=torch.float32)[:, None]  # 0..100: the q-th percentile is q
    q01, q99 = fit_bounds_q99(values)
    assert q01.tolist() == pytest.approx([1.0]) and q99.tolist() == pytest.approx([99.0])


def test_mean_std_denormalize_adds_eps_to_the_scale():
    mean, std = torch.tensor([3.0, 5.0]), torch.tensor([2.0, 0.5])
    out = mean_std_denormalize(torch.tensor([[1.0, -2.0]]), mean, std, eps=0.5)
    assert out[0].tolist() == pytest.approx([3.0 + 2.5, 5.0 - 2.0])  # x * (std + eps) + mean
    stats = MeanStdStatistics(torch.tensor([1.0]), torch.tensor([0.0]))
    assert stats.denormalize(torch.tensor([[2.0]])).item() == pytest.approx(1.0 + 2 * MEAN_STD_EPS)
