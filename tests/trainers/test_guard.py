"""GuardedStep and clip_grad_norm: non-finite gradients are skipped, counted in a row, and stop the run."""

from __future__ import annotations

import math

import pytest
import torch

from vla_rl.errors import RunStopped
from vla_rl.trainers.guard import GuardedStep


def _step(guard: GuardedStep, weight: torch.nn.Parameter, optimizer, grad: float, max_skipped: int = 2):
    weight.grad = torch.tensor([grad])
    return guard([weight], optimizer, 10.0, max_skipped, torch.tensor(1.0))


def test_an_infinite_gradient_is_skipped_and_the_weights_stay():
    weight = torch.nn.Parameter(torch.tensor([1.0]))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    norm, applied = _step(GuardedStep("actor"), weight, optimizer, math.inf)
    assert not applied and math.isinf(norm) and weight.tolist() == [1.0] and weight.grad is None


def test_a_finite_update_resets_the_count_of_skipped_updates_in_a_row():
    weight = torch.nn.Parameter(torch.tensor([1.0]))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    guard = GuardedStep("actor")
    assert _step(guard, weight, optimizer, math.nan) == (pytest.approx(math.nan, nan_ok=True), False)
    norm, applied = _step(guard, weight, optimizer, 0.5)
    assert applied and norm == pytest.approx(0.5) and weight.tolist() == pytest.approx([0.5])
    assert not _step(guard, weight, optimizer, math.nan)[1]  # one skip in a row again: no stop at 2
    with pytest.raises(RunStopped, match="2 updates in a row"):
        _step(guard, weight, optimizer, math.nan)
