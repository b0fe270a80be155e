"""Small statistics helpers."""

from __future__ import annotations


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a success rate (Wilson 1927), via ``scipy.stats.binomtest``.

    Args:
        successes: number of successes k (0 ≤ k ≤ n).
        trials: number of trials n (> 0).
        confidence: confidence level of the two-sided interval.

    Returns:
        (low, high) bounds in [0, 1].

    Raises:
        ValueError: if ``trials`` is 0 or ``successes`` is outside [0, trials].
    """
    from scipy.stats import binomtest

    if trials <= 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials > 0 (got {successes}/{trials})")
    ci = binomtest(successes, trials).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def mean_interval(values: list[float], confidence: float = 0.95,
                  bounds: tuple[float, float] | None = None) -> tuple[float, float | None, float | None]:
    """Mean of independent draws (e.g. one figure per training seed) with the two-sided Student t
    interval of the mean: ``mean ± t_{(1+confidence)/2, n-1} · s / √n`` (``s`` the sample
    standard deviation, ``n - 1`` degrees of freedom; Student 1908).

    Args:
        values: the n draws (n ≥ 1).
        confidence: confidence level of the interval.
        bounds: ``(least, most)`` the quantity can take (a success rate: ``(0, 1)``; the difference
            of two: ``(-1, 1)``): the interval is clipped to them; None: not clipped.

    Returns:
        ``(mean, low, high)``; ``low`` and ``high`` are None for a single draw (no spread to
        estimate).

    Raises:
        ValueError: ``values`` is empty.
    """
    import numpy as np
    from scipy.stats import t

    if not values:
        raise ValueError("need at least one value")
    draws = np.asarray(values, dtype=np.float64)
    mean = float(draws.mean())
    if draws.size == 1:
        return mean, None, None
    half = float(t.ppf((1 + confidence) / 2, draws.size - 1) * draws.std(ddof=1) / np.sqrt(draws.size))
    low, high = mean - half, mean + half
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return mean, low, high
