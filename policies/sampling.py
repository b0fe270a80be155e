"""Drawing from categorical distributions, shared by every policy that samples tokens or bins.

:func:`sample_categorical` is inverse-transform sampling: one uniform draw per row, located in
the row's cumulative distribution with a binary search. It draws from exactly the distribution
``torch.multinomial(probs, 1)`` draws from, with the same ``torch.Generator`` control, at a
fraction of its cost on CPU (measured on the project machine, one thread, 32 rows: 22 us against
253 us over 512 classes, 1.4 ms against 23 ms over SmolLM2's 49,152), which matters in a decoding
loop that samples once per token.

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


def sample_categorical(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One class per row of ``probs``, drawn with probability proportional to its entry.

    Inverse-transform sampling (Devroye, *Non-Uniform Random Variate Generation*, 1986, ch. III.2):
    with ``cdf = cumsum(probs)`` and ``u ~ U[0, cdf[-1])``, the class is the first ``k`` with
    ``cdf[k] > u``; class ``k`` is therefore drawn with probability
    ``(cdf[k] - cdf[k - 1]) / cdf[-1] = probs[k] / sum(probs)``, and a class of probability 0
    (an empty interval) never is. ``u`` is kept strictly below ``cdf[-1]`` so that rounding can
    never step past the last class of positive probability.

    Args:
        probs: ``(..., num_classes)`` non-negative float weights (need not sum to 1), each row
            with a positive sum.
        generator: random generator (on any device: see :func:`draw`); the global one if ``None``.

    Returns:
        ``(...)`` int64 class indices.
    """
    cdf = probs.cumsum(-1)  # (..., K)
    total = cdf[..., -1:]  # (..., 1)
    uniform = draw("uniform", tuple(total.shape), generator, cdf.dtype, cdf.device)
    below_total = torch.nextafter(total, torch.zeros_like(total))
    point = torch.minimum(uniform * total, below_total)  # (..., 1), in [0, total)
    return torch.searchsorted(cdf, point, right=True).squeeze(-1)
