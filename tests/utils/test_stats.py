"""Wilson's interval of a success rate and Student's interval of a mean over seeds, by hand."""

from __future__ import annotations

import math

import pytest

from vla_rl.utils.stats import mean_interval, wilson_interval

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
T95_DF2 = 4.302652729911275  # Student's t, 97.5% quantile, 2 degrees of freedom


@pytest.mark.parametrize(("k", "n"), [(3, 10), (0, 20), (20, 20), (41, 50)])
def test_wilson_interval_by_hand(k, n):
    """Wilson (1927): (p + z²/2n ± z √(p(1-p)/n + z²/4n²)) / (1 + z²/n); not the exact
    Clopper-Pearson interval (wider) nor the normal one (outside [0, 1] at 0 and n successes)."""
    p = k / n
    centre = (p + Z95 ** 2 / (2 * n)) / (1 + Z95 ** 2 / n)
    half = Z95 / (1 + Z95 ** 2 / n) * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n ** 2))
    low, high = wilson_interval(k, n)
    assert low == pytest.approx(max(0.0, centre - half), abs=1e-9)
    assert high == pytest.approx(min(1.0, centre + half), abs=1e-9)


@pytest.mark.parametrize(("k", "n"), [(-1, 10), (11, 10), (0, 0)])
def test_wilson_interval_refuses_impossible_counts(k, n):
    with pytest.raises(ValueError, match=rf"need 0 <= successes <= trials and trials > 0 \(got {k}/{n}\)"):
        wilson_interval(k, n)


def test_mean_interval_over_three_seeds_by_hand():
    """The main job's 40%, 82% and 30% on seeds 0-2: mean 0.5067, s = 0.2759, half-width
    t(0.975, 2) s / √3 = 0.685, clipped to a success rate's [0, 1]."""
    values = [0.40, 0.82, 0.30]
    mean = sum(values) / 3
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
    half = T95_DF2 * s / math.sqrt(3)
    got = mean_interval(values)
    assert got == pytest.approx((mean, mean - half, mean + half), rel=1e-9)
    assert mean_interval(values, bounds=(0.0, 1.0)) == pytest.approx((mean, 0.0, 1.0), rel=1e-9)
    assert mean_interval([0.25]) == (0.25, None, None)
    with pytest.raises(ValueError, match="need at least one value"):
        mean_interval([])
