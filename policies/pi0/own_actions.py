"""The own actions of π0 (:class:`policies.pi0.policy_pi0.PI0Policy`: what
:meth:`PI0Policy.sample_actions` returns, the rollout stores and the RL loss scores) are the whole
denoising chain of every model position, not only the executed actions: a chain's log-density is the
sum of its Gaussian transitions' log-densities, and recomputing the transitions of one position
needs every position's state (the velocity at a position attends to all of them). Layout, float32
``(batch, n, own_action_dim)`` with ``own_action_dim = m * (num_steps + 1) * max_action_dim``,
strided packing: model position ``p = j * n + c`` goes to slot ``c``, group ``j`` (values ``j * G ..
(j + 1) * G - 1``, ``G = (num_steps + 1) * max_action_dim``), so slot ``c``'s group 0 is the
executed action ``c`` and its groups ``1 .. m - 1`` the positions ``c + n, c + 2 n, ...`` that are
never executed. Inside a group, block ``k`` (``max_action_dim`` values) is ``x`` at flow time ``t_k
= 1 - k / num_steps`` (block 0 the initial noise, the last block the normalised, padded action), all
``max_action_dim`` values, because the padded values are inputs of the velocity at the next step and
so of the recomputed log-densities. Without ``executed_actions``, ``m = 1``: slot ``c`` is model
position ``c``. :meth:`PI0Policy.env_actions` reads group 0's last block's first ``action_dim``
values, de-normalises them and (``delta_action_mask``) adds the state back.

Scored elements (RLinf keeps only the executed positions and dimensions: ``log_probs[:, :,
:action_chunk, :action_env_dim]`` in ``openpi_action_model.py``'s
``_sample_actions_with_prefix_cache`` and ``default_forward``): the transition into block ``k >= 1``
of group 0 (the executed position), values ``0 .. action_dim - 1``. The initial noise block (a
standard normal, independent of the policy), the padded values and the groups of the positions never
executed contribute 0, so slot ``c``'s log-prob is the sum over denoising steps of the exact
Gaussian log-density of executed action ``c``'s transition given every position's previous state:
a partial likelihood, not the density of ``c``'s chain given the other positions' chains (their
transitions depend on ``c``'s through attention), nor the density of the whole chain, which would
also score the unexecuted positions (RLinf's choice, followed here).
:meth:`PI0Policy.log_prob_and_entropy_per_dim` returns per-element values in the own layout with
those zeros, so that its ``.sum(-1)`` is, operation for operation, the sum
:meth:`PI0Policy.sample_actions` returns.
"""

from __future__ import annotations

from torch import Tensor


def chain_to_own(chain: Tensor, executed: int | None = None) -> Tensor:
    """``(batch, num_steps + 1, P, D)`` chains of ``P`` model positions → own actions ``(batch, n,
    m * (num_steps + 1) * D)`` of ``n = executed`` slots (default ``P``), ``m = P / n``: position
    ``p = j * n + c`` is group ``j`` of slot ``c``, its block ``k`` the chain at ``t_k`` (module
    docstring)."""
    positions = chain.shape[2]
    n = positions if executed is None else executed
    per_position = chain.permute(0, 2, 1, 3)  # (B, P, N + 1, D)
    grouped = per_position.unflatten(1, (positions // n, n))  # (B, m, n, N + 1, D): p = j n + c
    return grouped.transpose(1, 2).flatten(2)  # (B, n, m (N + 1) D)


def own_to_chain(own: Tensor, num_steps: int, groups: int = 1) -> Tensor:
    """Inverse of :func:`chain_to_own`: ``(batch, n, groups * (num_steps + 1) * D)`` → ``(batch,
    num_steps + 1, groups * n, D)``."""
    grouped = own.unflatten(2, (groups, num_steps + 1, -1))  # (B, n, m, N + 1, D)
    per_position = grouped.transpose(1, 2).flatten(1, 2)  # (B, P, N + 1, D), p = j n + c
    return per_position.permute(0, 2, 1, 3)  # (B, N + 1, P, D)
