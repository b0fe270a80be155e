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
