"""Advantage estimators, registered by name in ``ADVANTAGE_ESTIMATORS`` (as verl does).

Every estimator has one calling convention, verl's::

    advantages, returns = estimator(token_level_rewards, response_mask, group_ids, config, values=None)

- ``config``: the estimator's own settings, the config class it is registered with
  (:class:`GAEConfig`, :class:`GRPOConfig`, ...; None for ``"rloo"``, which takes none); a
  template sets them as ``algorithm.<name>`` (``algorithm.gae.lam=0.95``).

- ``token_level_rewards``: (batch, seq_len) float, the reward of each step/token. An outcome
  (trajectory-level) reward sits on the last valid step of its row
  (:func:`vla_rl.algorithms.rewards.outcome_to_token_rewards`).
- ``response_mask``: (batch, seq_len) bool, True on the steps the policy acted in. Positions
  after an episode's end are False; whatever they hold (NaN included) never reaches the outputs.
- ``group_ids``: (batch,) int64, the group (``uid``) of each row: the rollouts that share a
  prompt or initial state. Groups need not be contiguous.
- ``values``: (batch, seq_len) float critic values, read by ``"gae"`` only; the outcome
  estimators take no critic and ignore it.
- Returns ``advantages`` and ``returns``, both (batch, seq_len) float in ``token_level_rewards``'
  dtype, exactly 0 at masked positions.

Registered: ``"gae"``, ``"grpo"`` (Dr. GRPO with ``norm_by_std=False``), ``"rloo"``,
``"reinforce_plus_plus"``, ``"reinforce_plus_plus_baseline"``. An estimator that reads batch keys
beyond rewards, mask and groups declares them when it registers (``"gae"``:
``reads=("values",)``), so that the planner checks a template writes them (a critic node); one
that compares a group's samples declares ``groups=True``, so that a group size below 2 (every
advantage 0: nothing trains) is refused at plan time; one that takes statistics over the whole
batch (whitening) declares ``batch_statistics=True`` and accepts ``reduce`` (a
:data:`ShardReduce`), so that it can run on the batch's DP shards and give the single batch's
result.

Conventions of the group estimators (GRPO, RLOO, REINFORCE++-baseline), kept from the first
GRPO implementation:

- a group whose scores are all equal carries no signal: its centred score is exactly 0 (never a
  rounding residue, never NaN);
- a group of size 1 is such a group: one sample's own score would be its baseline. verl returns
  the raw score for it instead;
- GRPO divides by the unbiased (Bessel-corrected, divisor ``n - 1``) group standard deviation,
  ``torch.std``'s default and what verl and TRL use, so that learning rates carry over from those
  implementations; ``epsilon`` defaults to verl's ``1e-6`` (TRL adds ``1e-4``: the advantages
  differ by a factor of about ``1 + 1e-4 / std``, 1% for a group standard deviation of 0.01,
  which SRPO's failure rewards in (0, 0.6) can have).

Statistics are computed in float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict
from torch import Tensor

from vla_rl_core.registry import Registry

AdvantageEstimator = Callable[..., tuple[Tensor, Tensor]]



class EstimatorTraits(BaseModel):
    """What an advantage estimator declares when it registers (checked then, by pydantic).

    Attributes:
        reads: batch keys it reads beyond rewards, mask and groups (``("values",)`` for GAE): the
            planner checks that a node before it writes them.
        groups: it compares the samples of a group, so a group size below 2 is refused at plan time.
        batch_statistics: it takes statistics over the whole batch and accepts ``reduce`` (a
            :data:`ShardReduce`), so that it can run on the batch's DP shards.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    reads: tuple[str, ...] = ()
    groups: bool = False
    batch_statistics: bool = False


def _estimator_call(traits: EstimatorTraits | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """How the advantage node calls an estimator (verl's convention, plus ``reduce`` for those that
    take batch statistics)."""
    keywords = ("values", "reduce") if traits is not None and traits.batch_statistics else ("values",)
    return ("token_level_rewards", "response_mask", "group_ids", "config"), keywords


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator", traits=EstimatorTraits,
                                                              calls=_estimator_call)


def _check_unit_interval(**values: float) -> None:
    for name, value in values.items():
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1] (got {value})")


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0.0:
            raise ValueError(f"{name} must be > 0 (got {value})")


@dataclass(frozen=True)
class GAEConfig:
    """Settings of ``"gae"``.

    Attributes:
        gamma: discount factor in [0, 1].
        lam: lambda in [0, 1].
        whiten_epsilon: added to the variance when whitening the advantages; > 0.

    Raises:
        ValueError: from ``__post_init__`` when a field is out of range.
    """

    gamma: float = 1.0
    lam: float = 1.0
    whiten_epsilon: float = 1e-8

    def __post_init__(self) -> None:
        _check_unit_interval(gamma=self.gamma, lam=self.lam)
        _check_positive(whiten_epsilon=self.whiten_epsilon)


@dataclass(frozen=True)
class GRPOConfig:
    """Settings of ``"grpo"``.

    Attributes:
        norm_by_std: divide the centred score by the group std (False: Dr. GRPO, Liu et al. 2025).
        epsilon: added to the group std before dividing; > 0.

    Raises:
        ValueError: from ``__post_init__`` when ``epsilon`` is not positive.
    """

    norm_by_std: bool = True
    epsilon: float = 1e-6

    def __post_init__(self) -> None:
        _check_positive(epsilon=self.epsilon)


@dataclass(frozen=True)
class ReinforcePlusPlusConfig:
    """Settings of ``"reinforce_plus_plus"``.

    Attributes:
        gamma: discount factor in [0, 1].
        whiten_epsilon: added to the variance when whitening the returns; > 0.

    Raises:
        ValueError: from ``__post_init__`` when a field is out of range.
    """

    gamma: float = 1.0
    whiten_epsilon: float = 1e-8

    def __post_init__(self) -> None:
        _check_unit_interval(gamma=self.gamma)
        _check_positive(whiten_epsilon=self.whiten_epsilon)


@dataclass(frozen=True)
class WhitenConfig:
    """Settings of ``"reinforce_plus_plus_baseline"``.

    Attributes:
        whiten_epsilon: added to the variance when whitening the centred scores; > 0.

    Raises:
        ValueError: from ``__post_init__`` when ``whiten_epsilon`` is not positive.
    """

    whiten_epsilon: float = 1e-8

    def __post_init__(self) -> None:
        _check_positive(whiten_epsilon=self.whiten_epsilon)


def _check_inputs(token_level_rewards: Tensor, response_mask: Tensor, group_ids: Tensor) -> Tensor:
    """Validate the common inputs; return the mask as bool.

    Raises:
        ValueError: on shape or dtype mismatches, or non-finite rewards at valid positions.
    """
    if token_level_rewards.dim() != 2 or not token_level_rewards.is_floating_point():
        raise ValueError(f"token_level_rewards must be a (batch, seq_len) float tensor; got "
                         f"{token_level_rewards.dtype} of shape {tuple(token_level_rewards.shape)}")
    if response_mask.shape != token_level_rewards.shape:
        raise ValueError(f"response_mask shape {tuple(response_mask.shape)} must equal "
                         f"token_level_rewards shape {tuple(token_level_rewards.shape)}")
    if group_ids.shape != token_level_rewards.shape[:1] or group_ids.dtype != torch.int64:
        raise ValueError(f"group_ids must be a (batch,) int64 tensor; got {group_ids.dtype} of "
                         f"shape {tuple(group_ids.shape)}")
    mask = response_mask if response_mask.dtype == torch.bool else response_mask != 0
    if not torch.isfinite(token_level_rewards[mask]).all():
        raise ValueError("token_level_rewards contain NaN or inf at valid positions; check the reward")
    return mask


ShardReduce = Callable[[Tensor, str], Tensor]
"""``reduce(values, op)`` with ``op`` in ``sum``, ``max``, ``min``: ``values`` combined over the
shards of a batch split across workers (the DP shards of an advantage node)."""


def masked_whiten(x: Tensor, mask: Tensor, epsilon: float = 1e-8, reduce: ShardReduce | None = None) -> Tensor:
    """Whiten ``x`` over its valid positions: ``(x - mean) / sqrt(var + epsilon)``.

    ``mean`` and the unbiased ``var`` (divisor ``n - 1``) are taken over the valid positions of
    the whole tensor, as verl's ``masked_whiten`` — or, with ``reduce``, over those of every shard
    of the batch (two rounds of sums, as a single batch would give up to float64 rounding). If
    fewer than two positions are valid, or all valid values are equal, there is nothing to
    normalise and the result is exactly 0.

    Args:
        x: any shape, float.
        mask: bool, same shape; True marks valid positions.
        epsilon: added to the variance; > 0.
        reduce: combines statistics over the batch's shards (None: this tensor is the batch).

    Returns:
        Same shape and dtype as ``x``; exactly 0 at masked positions, whatever ``x`` holds there.
    """
    values = torch.where(mask, x.to(torch.float64), 0.0)
    valid = values[mask]
    if reduce is None:
        count, total = int(mask.sum()), valid.sum()
        if count < 2 or bool(valid.max() == valid.min()):
            return torch.zeros_like(x)
        mean = total / count
        var = ((valid - mean) ** 2).sum() / (count - 1)
    else:
        count_and_total = reduce(torch.stack([torch.tensor(float(valid.numel()), dtype=torch.float64),
                                              valid.sum()]), "sum")
        count, total = int(count_and_total[0]), count_and_total[1]
        empty = valid.numel() == 0
        highest = reduce(torch.tensor(-math.inf if empty else float(valid.max()), dtype=torch.float64), "max")
        lowest = reduce(torch.tensor(math.inf if empty else float(valid.min()), dtype=torch.float64), "min")
        if count < 2 or bool(highest == lowest):
            return torch.zeros_like(x)
        mean = total / count
        var = reduce(((valid - mean) ** 2).sum(), "sum") / (count - 1)
    whitened = (values - mean) / torch.sqrt(var + epsilon)
    return torch.where(mask, whitened, 0.0).to(x.dtype)


def _row_scores(token_level_rewards: Tensor, mask: Tensor) -> Tensor:
    """(B, T) -> (B,) float64: each row's summed reward over its valid steps."""
    return torch.where(mask, token_level_rewards.to(torch.float64), 0.0).sum(dim=-1)


def _centre_in_groups(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Group statistics of ``scores`` (B,) float64.

    Returns:
        ``centred`` (B,) ``score - group mean``, exactly 0 for rows of all-equal (and size-1)
        groups; ``group_size`` (B,) float64, the size of each row's group; ``sum_sq`` (B,), the
        group's sum of squared deviations; ``informative`` (B,) bool, whether the group varies.
    """
    _, index = torch.unique(group_ids, return_inverse=True)  # (B,) in [0, G)
    num_groups = int(index.max()) + 1 if scores.numel() else 0

    def group_sum(x: Tensor) -> Tensor:  # (B,) -> (G,)
        return torch.zeros(num_groups, dtype=x.dtype).index_add_(0, index, x)

    size = group_sum(torch.ones_like(scores))  # (G,)
    mean = group_sum(scores) / size  # (G,)
    high = torch.full((num_groups,), -torch.inf, dtype=scores.dtype).scatter_reduce(0, index, scores, "amax")
    low = torch.full((num_groups,), torch.inf, dtype=scores.dtype).scatter_reduce(0, index, scores, "amin")
    informative = (high > low)[index]  # (B,)
    centred = torch.where(informative, scores - mean[index], 0.0)  # (B,)
    return centred, size[index], group_sum(centred**2)[index], informative


def _broadcast(per_row: Tensor, mask: Tensor, dtype: torch.dtype) -> Tensor:
    """(B,) -> (B, T): the row's value on its valid steps, 0 elsewhere."""
    return torch.where(mask, per_row[:, None], 0.0).to(dtype)


@ADVANTAGE_ESTIMATORS.register("gae", config=GAEConfig, reads=("values",), batch_statistics=True)
def compute_gae_advantage_return(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    config: GAEConfig,
    values: Tensor | None = None,
    reduce: ShardReduce | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, "High-Dimensional Continuous
    Control Using Generalized Advantage Estimation", eq. 16), as verl's
    ``compute_gae_advantage_return``::

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}            (the reversed loop, CleanRL style)
        R_t     = A_t + V_t                                  (the critic's regression target)

    over the valid steps of each row; ``V`` after the last valid step is 0 (the episode's end is
    terminal: success, failure or time-out, as verl treats EOS). Masked steps are skipped, never
    read: neither their values nor their rewards reach a valid step. The advantages are then
    whitened over all valid steps of the batch (:func:`masked_whiten`), as verl does.

    Args:
        token_level_rewards: (batch, seq_len) float.
        response_mask: (batch, seq_len) bool, True on valid steps.
        group_ids: (batch,) int64; ignored (GAE has no groups).
        config: ``gamma``, ``lam``, ``whiten_epsilon``.
        values: (batch, seq_len) float critic values V(s_t); required.
        reduce: combines the whitening statistics over the batch's DP shards (None: one batch).

    Returns:
        (advantages, returns), each (batch, seq_len), 0 at masked steps.

    Raises:
        ValueError: if ``values`` is missing or mis-shaped, or from the common input checks.
    """
    mask = _check_inputs(token_level_rewards, response_mask, group_ids)
    if values is None or values.shape != token_level_rewards.shape:
        raise ValueError("gae needs values of shape (batch, seq_len) from a critic; add a "
                         "(critic, model_inference) node before the advantage node")
    rewards = torch.where(mask, token_level_rewards.to(torch.float64), 0.0)
    v = torch.where(mask, values.to(torch.float64), 0.0)
    next_value = torch.zeros(rewards.shape[0], dtype=torch.float64)  # (B,)
    last_gae = torch.zeros_like(next_value)  # (B,)
    advantages = torch.zeros_like(rewards)  # (B, T)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + config.gamma * next_value - v[:, t]
        gae = delta + config.gamma * config.lam * last_gae
        valid = mask[:, t]
        next_value = torch.where(valid, v[:, t], next_value)
        last_gae = torch.where(valid, gae, last_gae)
        advantages[:, t] = torch.where(valid, gae, 0.0)
    returns = torch.where(mask, advantages + v, 0.0)
    whitened = masked_whiten(advantages, mask, config.whiten_epsilon, reduce)
    return whitened.to(token_level_rewards.dtype), returns.to(token_level_rewards.dtype)


@ADVANTAGE_ESTIMATORS.register("grpo", config=GRPOConfig, groups=True)
def compute_grpo_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    config: GRPOConfig,
    values: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Group-relative outcome advantage (GRPO, Shao et al. 2024, "DeepSeekMath", §4.1.2; Dr.
    GRPO, Liu et al. 2025, "Understanding R1-Zero-Like Training").

    With ``r_i`` the summed reward of row ``i`` (its outcome) and ``g`` its group::

        A_i = (r_i - mean_g(r)) / (std_g(r) + epsilon)       if config.norm_by_std (GRPO)
        A_i =  r_i - mean_g(r)                               otherwise (Dr. GRPO)

    ``std_g`` is unbiased; all-equal and size-1 groups give exactly 0 (module docstring). ``A_i``
    is broadcast over the row's valid steps; returns equal the advantages (verl).

    Args:
        token_level_rewards: (batch, seq_len) float.
        response_mask: (batch, seq_len) bool, True on valid steps.
        group_ids: (batch,) int64.
        config: ``norm_by_std``, ``epsilon``.
        values: ignored.

    Returns:
        (advantages, returns), each (batch, seq_len), 0 at masked steps.

    Raises:
        ValueError: from the common input checks.
    """
    mask = _check_inputs(token_level_rewards, response_mask, group_ids)
    centred, size, sum_sq, informative = _centre_in_groups(_row_scores(token_level_rewards, mask), group_ids)
    if config.norm_by_std:
        std = (sum_sq / (size - 1).clamp(min=1)).sqrt()  # (B,), unbiased
        centred = torch.where(informative, centred / (std + config.epsilon), 0.0)
    advantages = _broadcast(centred, mask, token_level_rewards.dtype)
    return advantages, advantages


@ADVANTAGE_ESTIMATORS.register("rloo", groups=True)
def compute_rloo_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    config: None = None,
    values: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics", the RLOO
    estimator): each sample's baseline is the mean score of the other ``n - 1`` samples of its
    group::

        A_i = r_i - (1 / (n - 1)) * sum_{j != i} r_j  =  n / (n - 1) * (r_i - mean_g(r))

    All-equal and size-1 groups give exactly 0 (verl returns the raw score for size 1).
    Broadcast over valid steps; returns equal the advantages.

    Args:
        token_level_rewards: (batch, seq_len) float.
        response_mask: (batch, seq_len) bool.
        group_ids: (batch,) int64.
        config: none (``"rloo"`` takes no settings; the argument keeps one signature for all).
        values: ignored.

    Returns:
        (advantages, returns), each (batch, seq_len), 0 at masked steps.

    Raises:
        ValueError: from the common input checks.
    """
    mask = _check_inputs(token_level_rewards, response_mask, group_ids)
    centred, size, _, _ = _centre_in_groups(_row_scores(token_level_rewards, mask), group_ids)
    leave_one_out = centred * size / (size - 1).clamp(min=1)  # (B,); size-1 rows are 0 already
    advantages = _broadcast(leave_one_out, mask, token_level_rewards.dtype)
    return advantages, advantages


def _discounted_returns(token_level_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """(B, T) float64 ``G_t = sum_{k >= 0} gamma^k r_{t+k}`` over the valid steps up to the next
    masked one; 0 at masked ones."""
    rewards = torch.where(mask, token_level_rewards.to(torch.float64), 0.0)
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=torch.float64)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(mask[:, t], rewards[:, t] + gamma * running, 0.0)
        returns[:, t] = running
    return returns


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus", config=ReinforcePlusPlusConfig, batch_statistics=True)
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    config: ReinforcePlusPlusConfig,
    values: Tensor | None = None,
    reduce: ShardReduce | None = None,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large
    Language Models", arXiv 2501.03262: token-level discounted return and global advantage
    normalisation), as verl's ``compute_reinforce_plus_plus_outcome_advantage``::

        G_t = sum_{k >= 0} gamma^k r_{t+k}             (within the row's valid steps)
        A_t = (G_t - mean(G)) / sqrt(var(G) + whiten_epsilon)

    where mean and unbiased var run over every valid step of the batch (:func:`masked_whiten`).
    A masked step inside a row (a tool's output between two turns) ends the sum, as in verl: the
    return before it leaves out the rewards after it (GAE, :func:`compute_gae_advantage_return`,
    runs across it instead).

    Args:
        token_level_rewards: (batch, seq_len) float.
        response_mask: (batch, seq_len) bool.
        group_ids: (batch,) int64; ignored (no groups).
        config: ``gamma``, ``whiten_epsilon``.
        values: ignored.
        reduce: combines the whitening statistics over the batch's DP shards (None: one batch).

    Returns:
        (advantages, returns): whitened advantages and the raw returns ``G``, 0 at masked steps.

    Raises:
        ValueError: from the common input checks.
    """
    mask = _check_inputs(token_level_rewards, response_mask, group_ids)
    returns = _discounted_returns(token_level_rewards, mask, config.gamma)
    advantages = masked_whiten(returns, mask, config.whiten_epsilon, reduce)
    return advantages.to(token_level_rewards.dtype), returns.to(token_level_rewards.dtype)


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus_baseline", config=WhitenConfig, groups=True,
                                batch_statistics=True)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    config: WhitenConfig,
    values: Tensor | None = None,
    reduce: ShardReduce | None = None,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline (Hu 2025, arXiv 2501.03262, the group-mean baseline variant), as
    verl's ``compute_reinforce_plus_plus_baseline_outcome_advantage``::

        a_i = r_i - mean_g(r)                          (exactly 0 for all-equal / size-1 groups)
        A_t = whiten(a_i broadcast over the row's valid steps)

    The whitening runs over every valid step of the batch (:func:`masked_whiten`), so an
    all-equal group's steps end at ``-mean / std`` of the batch unless every group is all-equal
    (then everything is exactly 0). Returns equal the advantages.

    Args:
        token_level_rewards: (batch, seq_len) float.
        response_mask: (batch, seq_len) bool.
        group_ids: (batch,) int64.
        config: ``whiten_epsilon``.
        values: ignored.
        reduce: combines the whitening statistics over the batch's DP shards (None: one batch).

    Returns:
        (advantages, returns), each (batch, seq_len), 0 at masked steps.

    Raises:
        ValueError: from the common input checks.
    """
    mask = _check_inputs(token_level_rewards, response_mask, group_ids)
    centred, _, _, _ = _centre_in_groups(_row_scores(token_level_rewards, mask), group_ids)
    advantages = masked_whiten(_broadcast(centred, mask, torch.float64), mask, config.whiten_epsilon, reduce)
    advantages = advantages.to(token_level_rewards.dtype)
    return advantages, advantages
