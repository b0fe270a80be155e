"""Flow-Noise (πRL, Chen et al., arXiv 2510.25889; ReinFlow, Zhang et al., arXiv 2505.22094): the
Euler step of the flow ODE plus Gaussian noise whose per-element std a small learned network
predicts, so that each denoising step is a Gaussian transition with an exact log-density. The
sampler contract, the chain and its recomputation are :mod:`policies.pi0.flow_sampling`'s.

Reference implementation read: RLinf (github.com/RLinf/RLinf, commit
a3816b596478dcd8a5c69a6ec1468c9519f77b5b), ``rlinf/models/embodiment/modules/explore_noise_net.py``
(``ExploreNoiseNet``) and the ``flow_noise`` branch of ``sample_mean_var_val`` in
``rlinf/models/embodiment/openpi/openpi_action_model.py``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from policies.pi0.flow_sampling import FlowSampler


class NoiseHead(nn.Module):
    """Flow-Noise's noise network: per-element log-std of a denoising step, bounded.

    An MLP ``in_dim -> hidden_dims -> action_dim`` with tanh between layers (RLinf's
    ``ExploreNoiseNet``: hidden ``[128, 64]``, tanh), whose output ``h`` is squashed into
    ``[log(min_std), log(max_std)]``::

        log_std = log(min_std) + (log(max_std) - log(min_std)) * (tanh(h) + 1) / 2

    (RLinf bounds the log-variance the same way, ``[log min_std^2, log max_std^2]``, then halves
    it: the same map). RLinf's range is ``noise_logvar_range = [0.08, 0.16]`` (despite the name,
    the bounds are stds).

    Args:
        in_dim: feature size: the velocity function's ``features`` size, or ``action_dim + 1``
            when it gives none (the head then reads ``(x_t, t)``).
        action_dim: number of values per action.
        hidden_dims: hidden layer sizes, each >= 1 (may be empty: one linear layer).
        min_std, max_std: the bounds, ``0 < min_std < max_std``.

    Raises:
        ValueError: non-positive sizes or bounds out of order.
    """

    def __init__(self, in_dim: int, action_dim: int, hidden_dims: Sequence[int] = (128, 64),
                 min_std: float = 0.08, max_std: float = 0.16) -> None:
        super().__init__()
        sizes = [in_dim, *hidden_dims, action_dim]
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
            raise ValueError(
                f"in_dim, hidden_dims and action_dim must be ints >= 1, got in_dim={in_dim!r}, "
                f"hidden_dims={tuple(hidden_dims)!r}, action_dim={action_dim!r}"
            )
        if not (0 < min_std < max_std and math.isfinite(max_std)):
            raise ValueError(
                f"need 0 < min_std < max_std < inf, got min_std={min_std!r}, max_std={max_std!r}"
            )
        layers: list[nn.Module] = []
        for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
            if i:
                layers.append(nn.Tanh())
            layers.append(nn.Linear(fan_in, fan_out))
        self.mlp = nn.Sequential(*layers)
        self.in_dim, self.action_dim = in_dim, action_dim
        self.log_min_std, self.log_max_std = math.log(min_std), math.log(max_std)

    def forward(self, features: Tensor) -> Tensor:
        """Log-std of each action element.

        Args:
            features: ``(batch, chunk, in_dim)`` floating.

        Returns:
            ``(batch, chunk, action_dim)`` float32 in ``[log(min_std), log(max_std)]``.

        Raises:
            ValueError: ``features`` is not ``(batch, chunk, in_dim)``.
        """
        if features.dim() != 3 or features.shape[-1] != self.in_dim:
            raise ValueError(
                f"NoiseHead features must be (batch, chunk, in_dim={self.in_dim}), got "
                f"{tuple(features.shape)} (without velocity features the head reads (x_t, t): "
                f"in_dim must be action_dim + 1)"
            )
        weight = next(self.mlp.parameters())
        h = self.mlp(features.to(weight.dtype)).to(torch.float32)
        unit = 0.5 * (torch.tanh(h) + 1.0)  # (B, chunk, D) in [0, 1]
        return self.log_min_std + (self.log_max_std - self.log_min_std) * unit


class FlowNoiseSampler(FlowSampler):
    """πRL's Flow-Noise: the ODE's Euler step plus learned Gaussian noise, every step stochastic::

        mean = x_t - delta * v(x_t, t),    std = exp(noise_head(features)),

    RLinf's ``sample_mean_var_val`` branch ``flow_noise`` (with ``joint_logprob``, every step of
    the chain is scored). The features are the velocity function's (RLinf: the action expert's
    output tokens at that step) or, when it gives none, ``cat(x_t, t)`` per action.

    Args:
        noise_head: the :class:`NoiseHead` (its parameters train with the policy).
    """

    def __init__(self, noise_head: NoiseHead) -> None:
        super().__init__()
        if not isinstance(noise_head, NoiseHead):
            raise TypeError(f"noise_head must be a NoiseHead, got {type(noise_head).__name__}")
        self.noise_head = noise_head

    def _stochastic_transition(self, x_t, velocity, features, t, delta):
        if features is None:
            features = torch.cat([x_t, t.expand(*x_t.shape[:2], 1)], dim=-1)  # (B, chunk, D + 1)
        std = torch.exp(self.noise_head(features))
        if std.shape != x_t.shape:
            raise ValueError(
                f"the noise head gives std of shape {tuple(std.shape)} for actions of shape "
                f"{tuple(x_t.shape)}: its action_dim must be {x_t.shape[-1]}"
            )
        return x_t - delta * velocity, std
