"""Checks the policies' config classes share (no torch import: configs stay light)."""

from __future__ import annotations


def is_int(value: object) -> bool:
    """Whether ``value`` is an int and not a bool (``True`` is an int to Python: ``hidden_sizes:
    [true]`` would build a width-1 layer)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_seed(owner: str, seed: object) -> None:
    """``seed`` is an int torch's generators take as given, from 0 to ``2**63 - 1`` (a larger one
    failed in every worker, "Overflow when unpacking long long").

    Raises:
        ValueError: naming ``owner.seed``.
    """
    if not is_int(seed) or not 0 <= seed < 2**63:
        raise ValueError(f"{owner}.seed must be an int from 0 to 2**63 - 1, got {seed!r}")
