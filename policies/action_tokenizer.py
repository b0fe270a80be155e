"""OpenVLA's action tokenizer: normalised actions in [-1, 1] ↔ 256 bins ↔ the last 256 token ids
below the tokenizer's vocabulary size.

Sources: ``prismatic/vla/action_tokenizer.py`` (``ActionTokenizer``: ``bins = linspace(-1, 1,
n_bins)``, ``digitize(clip(a, -1, 1), bins)`` and ``token = vocab_size - digitize``) and
``OpenVLAForActionPrediction.predict_action`` in ``prismatic/extern/hf/modeling_prismatic.py``
(decoding: ``bin_centers[clip(vocab_size - token - 1, 0, n_bins - 2)]``) of openvla/openvla.

``n_bins`` edges ``e_0 = -1 < ... < e_{n-1} = +1`` give ``n_bins`` digitize results ``d`` in
``[1, n_bins]``; we index bins by ``b = d - 1`` in ``[0, n_bins - 1]``, so bin ``b`` holds
``[e_b, e_{b+1})`` and the last bin holds only ``+1`` exactly. Token ``vocab_end - 1 - b``
stands for bin ``b`` (bin 0, the most negative actions, is the highest id).

Each bin has one *bin value*, the normalised action the policy emits for it: the centre
``(e_b + e_{b+1}) / 2`` of bins ``0 .. n_bins - 2``, and ``+1`` for the last bin (the only
value that tokenizes there). Bin values tokenize back to their own bin exactly, so an RL
trainer recovers the sampled tokens from the emitted actions. OpenVLA decodes the last bin to
the centre of the one before (its index clip); :meth:`ActionTokenizer.decode_for_env` does the
same for the values sent to the environment.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

#: OpenVLA's number of action bins (``OpenVLAConfig.n_action_bins``).
N_ACTION_BINS = 256


class ActionTokenizer:
    """Map normalised actions to bins and token ids and back (see the module docstring).

    Args:
        vocab_end: the tokenizer's vocabulary size (32000 for OpenVLA's Llama-2 tokenizer; the
            model's padded vocabulary is larger); the action tokens are ids
            ``[vocab_end - n_bins, vocab_end)``.
        n_bins: number of bins (256 in OpenVLA).

    Raises:
        ValueError: ``n_bins < 2`` or ``vocab_end < n_bins``.
    """

    def __init__(self, vocab_end: int, n_bins: int = N_ACTION_BINS) -> None:
        if n_bins < 2 or vocab_end < n_bins:
            raise ValueError(f"need n_bins >= 2 and vocab_end >= n_bins, got n_bins={n_bins}, vocab_end={vocab_end}")
        self.vocab_end = vocab_end
        self.n_bins = n_bins
        edges = np.linspace(-1.0, 1.0, n_bins)  # float64, as OpenVLA computes them
        centers = (edges[:-1] + edges[1:]) / 2.0
        #: ``(n_bins,)`` float64 bin edges ``e_b`` (OpenVLA digitizes against float64 edges).
        self.edges = torch.from_numpy(edges)
        #: ``(n_bins,)`` float32 bin values: centres of bins ``0 .. n_bins - 2``, then ``+1``.
        self.bin_values = torch.from_numpy(np.append(centers, 1.0)).float()
        #: ``(n_bins,)`` float32 values OpenVLA decodes each bin to (last bin → previous centre).
        self.env_values = torch.from_numpy(np.append(centers, centers[-1])).float()

    @property
    def token_begin(self) -> int:
        """The smallest action token id, ``vocab_end - n_bins``."""
        return self.vocab_end - self.n_bins

    def bins_from_actions(self, actions: Tensor) -> Tensor:
        """Bin index of each normalised action value: ``digitize(clip(a, -1, 1), edges) - 1``,
        compared in float64 as numpy does.

        Args:
            actions: any shape, floating, normalised units (clipped to [-1, 1]; NaN is an error).

        Returns:
            int64 bin indices in ``[0, n_bins - 1]``, same shape.

        Raises:
            ValueError: ``actions`` is not floating or holds NaN.
        """
        if not actions.is_floating_point() or torch.isnan(actions).any():
            raise ValueError("actions must be floating and free of NaN to be tokenized")
        edges = self.edges.to(actions.device)
        clipped = actions.double().clamp(-1.0, 1.0)
        # bucketize(right=True) = numpy.digitize(right=False): the i with e_{i-1} <= x < e_i.
        return torch.bucketize(clipped, edges, right=True) - 1

    def actions_from_bins(self, bins: Tensor) -> Tensor:
        """Bin values of bin indices (float32, same shape); exact inverse of
        :meth:`bins_from_actions` on bin values.

        Raises:
            ValueError: an index is outside ``[0, n_bins - 1]``.
        """
        self._check_bins(bins)
        return self.bin_values.to(bins.device)[bins]

    def decode_for_env(self, bins: Tensor) -> Tensor:
        """Normalised actions as OpenVLA's ``predict_action`` decodes bins: bin centres, the last
        bin mapped to the centre before it. Float32, same shape.

        Raises:
            ValueError: an index is outside ``[0, n_bins - 1]``.
        """
        self._check_bins(bins)
        return self.env_values.to(bins.device)[bins]

    def tokens_from_bins(self, bins: Tensor) -> Tensor:
        """Token ids ``vocab_end - 1 - b`` (int64, same shape).

        Raises:
            ValueError: an index is outside ``[0, n_bins - 1]``.
        """
        self._check_bins(bins)
        return self.vocab_end - 1 - bins.long()

    def bins_from_tokens(self, tokens: Tensor) -> Tensor:
        """Bin indices ``vocab_end - 1 - token`` of action token ids (int64, same shape).

        Raises:
            ValueError: a token is not one of the ``n_bins`` action tokens.
        """
        if ((tokens < self.token_begin) | (tokens >= self.vocab_end)).any():
            raise ValueError(
                f"action token ids must lie in [{self.token_begin}, {self.vocab_end}), got "
                f"[{int(tokens.min())}, {int(tokens.max())}]"
            )
        return self.vocab_end - 1 - tokens.long()

    def bin_logits(self, logits: Tensor) -> Tensor:
        """The logits of the action tokens, reordered by bin index.

        Args:
            logits: ``(..., vocab)`` logits over the model's (padded) vocabulary,
                ``vocab >= vocab_end``.

        Returns:
            ``(..., n_bins)`` view-derived tensor; column ``b`` is the logit of token
            ``vocab_end - 1 - b``.

        Raises:
            ValueError: ``vocab < vocab_end``.
        """
        if logits.shape[-1] < self.vocab_end:
            raise ValueError(
                f"logits cover {logits.shape[-1]} ids, fewer than the action vocabulary end {self.vocab_end}"
            )
        return logits[..., self.token_begin : self.vocab_end].flip(-1)

    def _check_bins(self, bins: Tensor) -> None:
        if bins.is_floating_point() or ((bins < 0) | (bins >= self.n_bins)).any():
            raise ValueError(f"bin indices must be integers in [0, {self.n_bins - 1}]")


def bin_log_softmax(bin_logits: Tensor, temperature: float) -> Tensor:
    """``log_softmax(bin_logits.float() / temperature)`` over the bins only (the restricted
    softmax of SimpleVLA-RL / RLinf: the rest of the vocabulary gets no probability).

    Args:
        bin_logits: ``(..., n_bins)`` from :meth:`ActionTokenizer.bin_logits`.
        temperature: > 0.

    Returns:
        ``(..., n_bins)`` float32 log-probabilities.

    Raises:
        ValueError: ``temperature`` is not > 0.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return (bin_logits.float() / temperature).log_softmax(-1)
