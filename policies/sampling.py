"""Drawing from categorical distributions, shared by every policy that samples tokens or bins.

:func:`sample_categorical` is inverse-transform sampling in two stages (a block of classes, then
a class in it), one uniform draw per row located with binary searches. It draws from
``probs / sum(probs)``, as ``torch.multinomial(probs, 1)`` does, to the float32 rounding of
``probs`` itself, with the same ``torch.Generator`` control, at a fraction of its cost on CPU
(``benchmarks/categorical_sampling.py``), which matters in a decoding loop that samples once per
token.

Random numbers are drawn on the generator's device and moved to the data's (:func:`draw`): a
worker's one CPU generator serves a policy on the CPU or on an accelerator, and a rollout draws
the same numbers on either (the generator's state is part of every checkpoint).
"""

from __future__ import annotations

import torch
from torch import Tensor


def draw(kind: str, shape: tuple[int, ...], generator: torch.Generator | None, dtype: torch.dtype,
         device: torch.device) -> Tensor:
    """``torch.rand`` (``kind="uniform"``, U[0, 1)) or ``torch.randn`` (``kind="normal"``) of
    ``shape`` from ``generator`` on the generator's own device, returned on ``device``.

    Args:
        kind: ``"uniform"`` or ``"normal"``.
        shape: the sample's shape.
        generator: the random generator (any device); None: the global generator of ``device``.
        dtype: floating dtype of the numbers.
        device: where the caller needs them.

    Raises:
        ValueError: an unknown ``kind``.
    """
    if kind not in ("uniform", "normal"):
        raise ValueError(f"kind must be 'uniform' or 'normal', got {kind!r}")
    source = device if generator is None else generator.device
    sample = (torch.rand if kind == "uniform" else torch.randn)(shape, generator=generator, dtype=dtype, device=source)
    return sample.to(device)


BLOCK_SIZE = 512
"""Classes per block of :func:`sample_categorical`'s first stage."""


def sample_categorical(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One class per row of ``probs``, drawn with probability proportional to its entry.

    Inverse-transform sampling (Devroye, *Non-Uniform Random Variate Generation*, 1986, ch. III.2):
    with ``cdf = cumsum(w)`` and ``u ~ U[0, cdf[-1])``, the first ``k`` with ``cdf[k] > u`` is drawn
    with probability ``w[k] / sum(w)``, and an entry of 0 (an empty interval) never is. Done in two
    stages: over the sums of blocks of :data:`BLOCK_SIZE` classes (float32 sums, then float64),
    then, with what is left of ``u`` rescaled to the block, over the chosen block's entries (a
    float64 sum). One float32 cumulative sum over a whole vocabulary has steps of 6e-8 near 1, so
    after a dominant class every class under 3e-8 got an empty interval: a 151,936-token row with
    a 99% token was drawn from a distribution 4.8e-4 in total variation from its softmax (before
    2026-12-03; ``benchmarks/categorical_sampling.py`` measures both). Now each class's
    probability is right to the float32 rounding of its block's sum (relative 1e-7 typically, 3e-5
    at worst), and the two stages read ``probs`` once, as the one sum did. ``u`` is kept strictly
    below each stage's total so that rounding never steps past the last entry of positive weight.

    Args:
        probs: ``(..., num_classes)`` non-negative float weights (need not sum to 1), each row
            with a positive sum.
        generator: random generator (on any device: see :func:`draw`); the global one if ``None``.

    Returns:
        ``(...)`` int64 class indices, on ``probs``' device.

    Raises:
        ValueError: a row whose sum is not a positive finite number (a NaN or infinite entry, or
            all zeros), as ``torch.multinomial`` refuses one; it would have drawn a class past the
            last. The check reads the row sums the draw computes anyway (one host synchronisation).
    """
    dtype = torch.float32 if probs.device.type == "mps" else torch.float64  # MPS has no float64
    *leading, classes = probs.shape
    rows = probs.reshape(-1, classes)  # (R, K)
    uniform = draw("uniform", (rows.shape[0], 1), generator, dtype, rows.device)
    if classes <= BLOCK_SIZE:  # one block
        weights = rows.to(dtype)
        _check_totals(weights.sum(-1), leading)
        return _locate(weights, uniform)[0].reshape(leading)
    full = classes // BLOCK_SIZE
    block_sums = [rows.unfold(-1, BLOCK_SIZE, BLOCK_SIZE).sum(-1)] if full else []  # (R, full)
    if full * BLOCK_SIZE < classes:
        block_sums.append(rows[:, full * BLOCK_SIZE:].sum(-1, keepdim=True))  # the last, shorter block
    block_sums = torch.cat(block_sums, dim=-1).to(dtype)  # (R, num_blocks)
    _check_totals(block_sums.sum(-1), leading)
    block, left = _locate(block_sums, uniform)  # (R, 1) each: the block, the point's offset in it
    columns = block * BLOCK_SIZE + torch.arange(BLOCK_SIZE, device=rows.device)  # (R, BLOCK_SIZE)
    inside = columns < classes
    weights = rows.gather(-1, columns.clamp(max=classes - 1)).to(dtype) * inside  # (R, BLOCK_SIZE)
    fraction = left / block_sums.gather(-1, block)  # (R, 1), in [0, 1) up to rounding
    index, _ = _locate(weights, fraction)
    return (block * BLOCK_SIZE + index).reshape(leading)


def _check_totals(totals: Tensor, leading: list[int]) -> None:
    """Raise the ValueError of :func:`sample_categorical` if a row's sum ``totals`` ``(R,)`` is
    not positive and finite, naming the first such row (its index in ``probs``' leading shape).
    Tensors on the ``meta`` device hold no values to check."""
    if totals.device.type == "meta":
        return
    bad = ~(torch.isfinite(totals) & (totals > 0))
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        where = tuple(torch.unravel_index(torch.tensor(row), tuple(leading))) if leading else ()
        raise ValueError(f"probs{list(int(i) for i in where)}: the row's sum is {float(totals[row])}, not a positive "
                         "finite number (a NaN or infinite probability, or all zeros: the policy's logits are not "
                         "finite?)")


def _locate(weights: Tensor, fraction: Tensor) -> tuple[Tensor, Tensor]:
    """The entry of ``weights`` ``(R, n)`` whose cumulative interval holds ``fraction`` of the
    row's sum (kept strictly below the sum); the entry ``(R, 1)`` int64 and the point's offset
    from the entry's start ``(R, 1)``."""
    cdf = weights.cumsum(-1)  # (R, n)
    total = cdf[:, -1:]
    point = torch.minimum(fraction * total, torch.nextafter(total, torch.zeros_like(total)))  # (R, 1), in [0, total)
    index = torch.searchsorted(cdf, point, right=True)  # (R, 1)
    start = torch.where(index > 0, cdf.gather(-1, (index - 1).clamp(min=0)), 0.0)
    return index, point - start
