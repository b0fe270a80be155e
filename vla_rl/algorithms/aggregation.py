"""Loss aggregation: how a ``(batch, seq_len)`` matrix of per-token losses becomes one scalar.

The aggregation mode is a setting of its own, independent of the policy objective, as in
verl's ``agg_loss(loss_mat, loss_mask, loss_agg_mode)``:

- ``"token-mean"``: every valid token of the batch weighs the same (DAPO, Yu et al. 2025, §3.3
  "Token-Level Policy Gradient Loss").
- ``"seq-mean-token-mean"``: mean over tokens within each sequence, then mean over sequences
  (the original GRPO objective, Shao et al. 2024, eq. 3).
- ``"seq-mean-token-sum"``: sum over tokens within each sequence, then mean over sequences
  (Dr. GRPO, Liu et al. 2025, "Understanding R1-Zero-Like Training", up to its constant
  normaliser).
- ``"seq-mean-token-sum-norm"``: the same divided by a constant normaliser, e.g. the maximum
  response length (Dr. GRPO's implementation, which divides token sums by the generation budget
  instead of each sequence's length).

Masked positions never reach the result, even when they hold NaN or inf: they are replaced with
``torch.where`` (``NaN * 0`` is NaN, so multiplying by the mask would not do). Rows without any
valid token are left out of the sequence means; where nothing at all is valid the result is 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from vla_rl_core.registry import Registry

LossAggregator = Callable[[Tensor, Tensor, float | None], Tensor]

LOSS_AGG_MODES: Registry[LossAggregator] = Registry("loss aggregation mode",
                                                   calls=(("loss_mat", "mask", "normalizer"), ()))


def _check_mask(x: Tensor, mask: Tensor) -> Tensor:
    """Validate ``mask`` against ``x`` and return it as a bool tensor (nonzero = valid).

    Raises:
        ValueError: if the shapes differ.
    """
    if mask.shape != x.shape:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} must equal the tensor's shape {tuple(x.shape)}"
        )
    return mask if mask.dtype == torch.bool else mask != 0


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` is set.

    Args:
        x: any shape, floating dtype.
        mask: same shape as ``x``; bool, or float/int where nonzero means valid.

    Returns:
        A 0-dim tensor of ``x``'s dtype; 0 when no position is valid. Values of ``x`` at masked
        positions (including NaN and inf) never influence the result nor its gradient.

    Raises:
        ValueError: if ``mask`` and ``x`` differ in shape.
    """
    valid = _check_mask(x, mask)
    total = torch.where(valid, x, torch.zeros_like(x)).sum()
    count = valid.sum().clamp(min=1).to(x.dtype)
    return total / count


def _masked_row_sums(loss_mat: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row token sums ``(B,)`` over valid positions and per-row valid counts ``(B,)``."""
    valid = _check_mask(loss_mat, mask)
    if loss_mat.dim() != 2:
        raise ValueError(f"loss_mat must be (batch, seq_len); got shape {tuple(loss_mat.shape)}")
    row_sums = torch.where(valid, loss_mat, torch.zeros_like(loss_mat)).sum(dim=-1)  # (B,)
    return row_sums, valid.sum(dim=-1)


def _mean_over_rows_with_tokens(row_values: Tensor, row_counts: Tensor) -> Tensor:
    """Mean of ``row_values`` (B,) over the rows holding >= 1 valid token; 0 if there are none."""
    row_has_tokens = row_counts > 0  # (B,)
    num_rows = row_has_tokens.sum().clamp(min=1).to(row_values.dtype)
    return torch.where(row_has_tokens, row_values, torch.zeros_like(row_values)).sum() / num_rows


def _no_normalizer(mode: str, normalizer: float | None) -> None:
    if normalizer is not None:
        raise ValueError(f"loss aggregation {mode!r} takes no normaliser (got {normalizer}); only "
                         "'seq-mean-token-sum-norm' does")


@LOSS_AGG_MODES.register("token-mean")
def token_mean(loss_mat: Tensor, mask: Tensor, normalizer: float | None = None) -> Tensor:
    """Mean over all valid tokens of the batch: ``sum(L * m) / sum(m)``.

    Args:
        loss_mat: (batch, seq_len) float.
        mask: (batch, seq_len) bool or 0/1 float.
        normalizer: must be None.

    Returns:
        0-dim tensor; 0 when no token is valid.

    Raises:
        ValueError: if the shapes are not both (batch, seq_len) and equal, or a normaliser is given.
    """
    _no_normalizer("token-mean", normalizer)
    if loss_mat.dim() != 2:
        raise ValueError(f"loss_mat must be (batch, seq_len); got shape {tuple(loss_mat.shape)}")
    return masked_mean(loss_mat, mask)


@LOSS_AGG_MODES.register("seq-mean-token-mean")
def seq_mean_token_mean(loss_mat: Tensor, mask: Tensor, normalizer: float | None = None) -> Tensor:
    """Token mean within each sequence, then mean over the sequences with >= 1 valid token.

    Args:
        loss_mat: (batch, seq_len) float.
        mask: (batch, seq_len) bool or 0/1 float.
        normalizer: must be None.

    Returns:
        0-dim tensor; 0 when no token is valid.

    Raises:
        ValueError: if the shapes are not both (batch, seq_len) and equal, or a normaliser is given.
    """
    _no_normalizer("seq-mean-token-mean", normalizer)
    row_sums, row_counts = _masked_row_sums(loss_mat, mask)
    row_means = row_sums / row_counts.clamp(min=1).to(loss_mat.dtype)  # (B,)
    return _mean_over_rows_with_tokens(row_means, row_counts)


@LOSS_AGG_MODES.register("seq-mean-token-sum")
def seq_mean_token_sum(loss_mat: Tensor, mask: Tensor, normalizer: float | None = None) -> Tensor:
    """Token sum within each sequence, then mean over the sequences with >= 1 valid token.

    Rows without a valid token are left out of the mean, as in ``"seq-mean-token-mean"`` and in
    verl's ``agg_loss`` (its ``seq_mask`` excludes fully masked sequences).

    Args:
        loss_mat: (batch, seq_len) float.
        mask: (batch, seq_len) bool or 0/1 float.
        normalizer: must be None.

    Returns:
        0-dim tensor; 0 when no token is valid.

    Raises:
        ValueError: if the shapes are not both (batch, seq_len) and equal, or a normaliser is given.
    """
    _no_normalizer("seq-mean-token-sum", normalizer)
    row_sums, row_counts = _masked_row_sums(loss_mat, mask)
    return _mean_over_rows_with_tokens(row_sums, row_counts)


@LOSS_AGG_MODES.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss_mat: Tensor, mask: Tensor, normalizer: float | None = None) -> Tensor:
    """Token sum within each sequence divided by a constant, then mean over the sequences with
    >= 1 valid token: ``mean_i (sum_t L_it m_it) / C``.

    Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", the Dr. GRPO
    objective ``(1/G) sum_i sum_t``) removes the ``1/|o_i|`` length normalisation; its code
    divides each token sum by a constant generation budget ``C`` to keep the loss scale. ``C``
    defaults to ``seq_len`` (the padded length: the maximum response length, or the episode's
    decision budget), constant over training as long as the padding is. verl's mode of the same
    name sums over sequences instead of averaging (its value is this one times the number of
    sequences).

    Args:
        loss_mat: (batch, seq_len) float.
        mask: (batch, seq_len) bool or 0/1 float.
        normalizer: the constant ``C`` > 0; None uses ``seq_len``.

    Returns:
        0-dim tensor; 0 when no token is valid.

    Raises:
        ValueError: if the shapes are not both (batch, seq_len) and equal, or ``normalizer <= 0``.
    """
    row_sums, row_counts = _masked_row_sums(loss_mat, mask)
    constant = float(loss_mat.shape[-1]) if normalizer is None else normalizer
    if not constant > 0:
        raise ValueError(f"the seq-mean-token-sum-norm normaliser must be > 0 (got {constant})")
    return _mean_over_rows_with_tokens(row_sums / constant, row_counts)


def aggregate_loss(loss_mat: Tensor, mask: Tensor, mode: str, normalizer: float | None = None) -> Tensor:
    """Aggregate per-token losses into a scalar with the named mode (verl's ``agg_loss``).

    Args:
        loss_mat: (batch, seq_len) float, per-token losses.
        mask: (batch, seq_len) bool, or float/int where nonzero marks a valid token.
        mode: a name in ``LOSS_AGG_MODES``: ``"token-mean"``, ``"seq-mean-token-mean"``,
            ``"seq-mean-token-sum"``, ``"seq-mean-token-sum-norm"``.
        normalizer: the constant of ``"seq-mean-token-sum-norm"`` (None: ``seq_len``); must be
            None for the other modes.

    Returns:
        0-dim tensor of ``loss_mat``'s dtype, differentiable w.r.t. ``loss_mat``.

    Raises:
        RegistryError: if ``mode`` is unknown (the message lists the known modes).
        ValueError: if the shapes are not both (batch, seq_len) and equal, or the normaliser
            does not fit the mode.
    """
    return LOSS_AGG_MODES.get(mode)(loss_mat, mask, normalizer)


#: What each built-in mode divides by: valid tokens, or rows holding at least one valid token.
AGGREGATION_DENOMINATORS = {"token-mean": "tokens", "seq-mean-token-mean": "rows", "seq-mean-token-sum": "rows",
                            "seq-mean-token-sum-norm": "rows"}


def aggregation_weight(mask: Tensor, mode: str) -> float:
    """The count aggregation ``mode`` divides by over ``mask``: the valid tokens (``token-mean``)
    or the rows with at least one valid token (the ``seq-mean-*`` modes).

    Gradient accumulation splits a minibatch into micro-batches of whole rows; with ``w_i`` the
    weight of micro-batch ``i`` and ``W`` the minibatch's, ``sum_i (w_i / W) * aggregate(micro_i)
    == aggregate(minibatch)`` for every built-in mode (the token sums and row means of one row
    never straddle micro-batches), so the accumulated gradient is the minibatch's. Pass the loss's
    unit mask, or any mask whose rows count the same units up to a factor shared by every row
    (which cancels in ``w_i / W``): the executed actions for the ``action`` and ``token``
    granularities (an action's dimensions are a constant factor), the decision steps for ``chunk``.

    Args:
        mask: ``(batch, L)`` bool, or 0/1.
        mode: a built-in mode.

    Returns:
        the count, a float >= 0.

    Raises:
        ValueError: ``mode`` is not a built-in mode (a mode registered elsewhere does not say what
            it divides by: train it without ``trainer.micro_batch_size``).
    """
    if mode not in AGGREGATION_DENOMINATORS:
        raise ValueError(f"loss aggregation {mode!r} has no known denominator, so trainer.micro_batch_size cannot "
                         f"split its minibatches exactly; use one of {sorted(AGGREGATION_DENOMINATORS)} or no "
                         "micro_batch_size")
    valid = mask.bool()
    if AGGREGATION_DENOMINATORS[mode] == "tokens":
        return float(valid.sum())
    return float(valid.reshape(valid.shape[0], -1).any(dim=1).sum())
