"""The checks the policies' config classes share (policies/config_checks.py)."""

from __future__ import annotations

import pytest

from policies.config_checks import check_seed, is_int


@pytest.mark.parametrize(("value", "expected"), [(3, True), (0, True), (-2, True), (True, False), (False, False),
                                                 (3.0, False), ("3", False), (None, False)])
def test_is_int_takes_ints_and_no_booleans(value, expected):
    assert is_int(value) is expected


@pytest.mark.parametrize("seed", [0, 7, 2**63 - 1])
def test_seeds_torch_takes_pass(seed):
    check_seed("P", seed)


@pytest.mark.parametrize("seed", [-1, 2**63, 10**20, True, 1.0, "0"])
def test_other_seeds_are_refused_naming_the_field(seed):
    with pytest.raises(ValueError, match=rf"^P\.seed must be an int from 0 to 2\*\*63 - 1, got {seed!r}$"):
        check_seed("P", seed)
