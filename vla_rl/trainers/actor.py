"""Data-parallel actor update: clipped policy-gradient epochs over a step's episodes.

The policy trains over the DAG workers' process group (gloo on CPU, nccl/hccl on accelerators)
with the strategy of ``trainer.strategy`` (:mod:`vla_rl.trainers.strategy`): DDP, the policy on
every worker with its gradients averaged, or FSDP2, a sharded training copy whose weights go back
into the policy after each update. Each worker updates on its own shard. Every worker runs the
same number of minibatches (the smallest shard decides) and of micro-batches per minibatch
(``trainer.micro_batch_size``), so the collectives of the forward and backward passes always match.

The loss of a minibatch, at the configured ratio granularity (token, action or chunk; see
:mod:`vla_rl.algorithms.granularity`)::

    loss = policy_objective - entropy_coeff * aggregate(entropy) + kl_loss_coef * aggregate(KL(pi || ref))

with the objective from ``POLICY_LOSSES`` and every term aggregated with the same mode over the
loss's units: the executed actions (an episode that ends inside a chunk never runs the rest of it,
:mod:`vla_rl.algorithms.granularity`). The denominator is the global minibatch's, the union of
the workers' minibatches of the same position (verl's global-batch ``agg_loss``): each pass's
loss is scaled by its share of it (:func:`~vla_rl.trainers.minibatches.micro_batch_passes`) times
the world size, so that the gradient DDP or FSDP averages over the workers is that of the global
minibatch aggregated as one, whatever the number of workers, their split of the rows, or the
micro-batches; the reported loss terms are the global minibatch's too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from vla_rl.algorithms.aggregation import aggregate_loss
from vla_rl.algorithms.granularity import (
    executed_actions,
    expand_per_step,
    reduce_per_action,
    reduce_per_dim,
    unit_mask,
)
from vla_rl.algorithms.kl import kl_penalty
from vla_rl.algorithms.policy_loss import POLICY_LOSSES
from vla_rl.errors import RunStopped
from vla_rl.trainers.guard import GuardedStep
from vla_rl.trainers.minibatches import global_weights, micro_batch_passes, minibatch_schedule, sum_over_workers
from vla_rl.trainers.strategy import make_strategy
from vla_rl.utils.collectives import all_gather_small_objects
from vla_rl_core import keys


def embodied_forward(model, batch: TensorDict, with_entropy: bool = True) -> tuple[Tensor, Tensor | None]:
    """Per-dimension log-probs and entropies of the executed actions of whole episodes.

    Only the valid steps go through ``model`` (the policy, or its DDP wrapper): steps after an
    episode's end cost nothing and whatever they hold never reaches the outputs nor the
    gradients. Batch invariance makes each step's values independent of which others share the
    forward. The actions of an episode's last chunk that never ran (it ended inside the chunk)
    get 0, as the rollout's ``old_log_probs`` (:func:`~vla_rl.algorithms.granularity.executed_actions`).

    Args:
        model: called as ``model(obs, actions)`` -> per-dimension ``(log_probs, entropy)``.
        batch: ``obs`` ``(n, T + 1, obs_dim)`` (the last one is not used; camera observations: a
            TensorDict of batch size ``(n, T + 1)``, which the policy's processor reads),
            ``actions`` ``(n, T, chunk, own_action_dim)`` (the policy's own actions,
            ``policy.own_action_dim`` values each), ``response_mask`` ``(n, T)`` bool,
            ``control_steps`` ``(n,)`` int64.
        with_entropy: False: the entropy is None (the robot policies' per-dimension entropies cost
            next to nothing, so they are computed and dropped).

    Returns:
        ``log_probs`` and ``entropy``, each ``(n, T, chunk, own_action_dim)``, 0 at invalid steps
        and at the actions that never ran.
    """
    obs, actions, valid = batch[keys.OBS], batch[keys.ACTIONS], batch[keys.RESPONSE_MASK]
    step_obs = obs[:, :-1][valid]  # (v, obs_dim), or a TensorDict of batch size (v,)
    log_probs, entropy = model(step_obs, actions[valid])  # (v, C, A_own) each
    executed = executed_actions(valid, batch[keys.CONTROL_STEPS], actions.shape[2])[..., None]  # (n, T, C, 1)

    def spread(values: Tensor) -> Tensor:  # (v, C, A_own) -> (n, T, C, A_own)
        full = values.new_zeros(actions.shape)
        full[valid] = values
        return torch.where(executed, full, 0.0)

    return spread(log_probs), spread(entropy) if with_entropy else None


def loss_actions(batch: TensorDict, chunk_size: int) -> Tensor:
    """``(n, T, chunk)`` bool: the actions that are units of the loss. Embodied episodes: the
    executed ones (:func:`~vla_rl.algorithms.granularity.executed_actions` of ``control_steps``);
    text responses (no ``control_steps``; a decision is one token): every response token."""
    mask = batch[keys.RESPONSE_MASK]  # (n, T)
    if keys.CONTROL_STEPS in batch.keys():
        return executed_actions(mask, batch[keys.CONTROL_STEPS], chunk_size)
    return mask.bool()[..., None].expand(*mask.shape, chunk_size)


def without_truncated_responses(batch: TensorDict) -> TensorDict:
    """``batch`` with an empty ``response_mask`` on its ``truncated`` responses
    (``algorithm.mask_truncated_responses``): they are no unit of any loss term nor of its
    aggregation's denominator, as TRL's ``mask_truncated_completions`` zeroes their
    ``completion_mask``; ``batch`` itself is left as it is.

    Args:
        batch: text samples with ``response_mask`` ``(n, R)`` bool and ``truncated`` ``(n,)`` bool.
    """
    out = batch.clone(recurse=False)
    out.set(keys.RESPONSE_MASK, batch[keys.RESPONSE_MASK] & ~batch[keys.TRUNCATED][:, None])
    return out


def weight_units(batch: TensorDict, granularity: str) -> Tensor:
    """``(n, L)`` bool whose rows count the loss's units at ``granularity`` up to a factor shared
    by every row (what :func:`~vla_rl.algorithms.aggregation.aggregation_weight` counts): the
    decisions for ``chunk``, the executed actions for ``action`` and ``token`` (a text response's
    tokens)."""
    if granularity == "chunk" or keys.CONTROL_STEPS not in batch.keys():
        return batch[keys.RESPONSE_MASK]
    return executed_actions(batch[keys.RESPONSE_MASK], batch[keys.CONTROL_STEPS],
                            batch[keys.ACTIONS].shape[2]).flatten(start_dim=1)  # (n, T * C)


def text_forward(model, batch: TensorDict, temperature: float | None = None, with_entropy: bool = True
                 ) -> tuple[Tensor, Tensor | None]:
    """Log-probs and entropies of sampled responses, laid out as one-token, one-dimension actions.

    A response token is a decision step whose chunk and action dimension are both 1, so the
    ratio granularities ``token``, ``action`` and ``chunk`` coincide and every loss, aggregation
    and KL term of the embodied path applies unchanged.

    Args:
        model: a :class:`~policies.causal_lm.modeling_causal_lm.CausalLMPolicy` or its DDP
            wrapper, called as ``model(input_ids, attention_mask, responses, response_mask,
            temperature, with_entropy=...)`` at the policy's sampling temperature.
        batch: ``input_ids``, ``attention_mask`` ``(n, P)`` left-padded prompts; ``responses``
            ``(n, R)`` int64 and ``response_mask`` ``(n, R)`` bool, right-padded.
        temperature: another temperature (supervised fine-tuning's 1); None: the policy's.
        with_entropy: False: no entropy is computed (it would take one more ``(n, R, vocab)``
            float32 tensor than the log-probs); the entropy returned is None.

    Returns:
        ``log_probs`` and ``entropy``, each ``(n, R, 1, 1)`` float32, 0 after each response's end
        (zeros without a forward pass for an empty batch, e.g. a filtered-out shard).
    """
    responses = batch[keys.RESPONSES]
    if responses.shape[0] == 0:
        empty = responses.new_zeros((*responses.shape, 1, 1), dtype=torch.float32)
        return empty, empty.clone() if with_entropy else None
    policy = model.module if isinstance(model, DistributedDataParallel) else model
    temperature = policy.config.temperature if temperature is None else temperature
    log_probs, entropy = model(batch[keys.INPUT_IDS], batch[keys.ATTENTION_MASK], batch[keys.RESPONSES],
                               batch[keys.RESPONSE_MASK], temperature, with_entropy=with_entropy)  # (n, R) each
    return log_probs[..., None, None], entropy[..., None, None] if with_entropy else None


def with_model_ready_observations(policy, batch: TensorDict) -> TensorDict:
    """The batch with its camera observations prepared once for the update's passes (the
    old-log-prob rescoring, every epoch's minibatches): ``policy.model_ready_observations`` of the
    decision steps, those :func:`embodied_forward` reads (not the final observation, not the
    steps after an episode's end).

    Args:
        policy: the worker's policy.
        batch: an embodied batch (``obs`` a TensorDict of batch size ``(n, T + 1)`` and
            ``response_mask`` ``(n, T)``), or any other (flat states, text: returned as it is).

    Returns:
        A new TensorDict with the prepared ``obs`` (``batch`` is not modified: other nodes on the
        worker may read it), or ``batch`` itself when the policy prepares nothing.
    """
    obs = batch.get(keys.OBS, None)
    if not isinstance(obs, TensorDict):
        return batch
    response_mask = batch[keys.RESPONSE_MASK]  # (n, T)
    steps = torch.zeros(obs.batch_size, dtype=torch.bool, device=response_mask.device)  # (n, T + 1)
    steps[:, :-1] = response_mask
    ready = policy.model_ready_observations(obs, steps)
    if ready is obs:
        return batch
    batch = batch.copy()
    batch[keys.OBS] = ready
    return batch


@torch.no_grad()
def per_dim_log_probs(policy, batch: TensorDict, forward=embodied_forward, micro_batch_size: int | None = None
                      ) -> Tensor:
    """Log-probs of every action dimension of whole episodes (or responses), without gradients,
    scored ``micro_batch_size`` rows at a time (``trainer.micro_batch_size``): only those rows are
    on the policy's device at once, and only their activations (an LLM's ``(rows, R, V)`` logits)
    exist at once. No entropy is computed (``forward(..., with_entropy=False)``).

    Args:
        policy: a :class:`policies.base.Policy` or a causal LM policy.
        batch: what ``forward`` reads, ``n`` rows.
        forward: :func:`embodied_forward` or :func:`text_forward` (or what takes their arguments).
        micro_batch_size: rows per forward pass; None: all ``n`` in one.

    Returns:
        ``(n, T, chunk, own_action_dim)`` float32 on the policy's device, 0 at invalid steps;
        bit-identical to the rollout's values whatever the micro-batch size (the policy
        contract's batch invariance).
    """
    rows = batch.batch_size[0]
    if micro_batch_size is None or rows <= micro_batch_size:
        return forward(policy, batch.to(policy.device), with_entropy=False)[0]
    return torch.cat([forward(policy, batch[start:start + micro_batch_size].to(policy.device), with_entropy=False)[0]
                      for start in range(0, rows, micro_batch_size)])


class ActorTrainer:
    """Owns the data-parallel policy (DDP or FSDP2) and its Adam optimizer on one worker.

    The update loop is the same for every modality and strategy; ``forward`` turns a minibatch
    into per-dimension log-probs and entropies (the workflow's ``batch_forward``).

    Args:
        policy: the worker's policy (already on its device; weights equal on every worker or
            broadcast from rank 0 at construction). Under FSDP it stays the plain module the
            rollout uses, refreshed from the sharded training copy after each update.
        lr: Adam learning rate.
        group: the DAG workers' process group (None: the default group).
        forward: :func:`embodied_forward` (episodes of a robot policy) or :func:`text_forward`
            (responses of a causal LM).
        trainer: the run's ``trainer`` section, for ``strategy``, ``mixed_precision``,
            ``gradient_checkpointing`` and ``fsdp`` (None: DDP without activation checkpointing).

    Attributes:
        parallel: the :mod:`~vla_rl.trainers.strategy` object; ``parallel.trained`` is the module
            the optimizer updates (the policy under DDP).
    """

    def __init__(self, policy: torch.nn.Module, lr: float, group: dist.ProcessGroup | None = None,
                 forward: Callable[[Any, TensorDict], tuple[Tensor, Tensor]] = embodied_forward,
                 trainer=None) -> None:
        self.policy = policy
        self.group = group
        self.forward = forward
        self.parallel = make_strategy(policy, group, trainer)
        self.optimizer = torch.optim.Adam(self.parallel.trained.parameters(), lr=lr)
        self.guarded_step = GuardedStep("actor")
        self.guarded_sft_step = GuardedStep("sft")

    @property
    def ddp(self):
        """What the training forward calls (the DDP wrapper, or the FSDP training copy)."""
        return self.parallel.module

    @property
    def sharded(self) -> bool:
        """Whether the trained state is sharded over the workers (FSDP: checkpoints with
        torch.distributed.checkpoint, :mod:`vla_rl.checkpoints.sharded`)."""
        return self.parallel.sharded

    def update(self, batch: TensorDict, algorithm, trainer, generator: torch.Generator) -> dict[str, float]:
        """One update on this worker's shard ``batch`` (episodes with ``advantages``).

        Args:
            batch: what ``forward`` reads (embodied: ``obs`` ``(n, T + 1, obs_dim)``, ``actions``
                ``(n, T, chunk, own_action_dim)``; text: prompts and responses, chunk = action_dim = 1),
                ``old_log_probs`` ``(n, T, chunk)`` (the rollout's), ``response_mask`` ``(n, T)``,
                ``advantages`` ``(n, T)``, and ``ref_log_probs`` ``(n, T, chunk, own_action_dim)`` with
                ``algorithm.use_kl_loss``.
            algorithm: the run's ``algorithm`` section: the objective (``policy_loss`` and its
                settings), ``ratio_granularity``, ``loss_agg_mode``, ``entropy_coeff``, the
                KL loss term and ``mask_truncated_responses`` (text: ``batch`` then holds
                ``truncated`` ``(n,)`` bool, :func:`without_truncated_responses`).
            trainer: the run's ``trainer`` section: ``ppo_epochs``, ``ppo_mini_batch_size``
                (episodes per minibatch summed over the workers; each pass makes
                ``ceil(total episodes / ppo_mini_batch_size)`` minibatches, or
                ``ppo_num_mini_batches`` when set, fewer if a worker's shard has fewer episodes than
                that), ``micro_batch_size`` (gradient accumulation)
                and ``max_grad_norm``.
            generator: shuffles the minibatches (seeded per worker, saved in checkpoints).

        Returns:
            Means over the applied minibatch updates of the loss terms and the objective's
            metrics (``actor/pg_loss``, ``actor/entropy``, ``actor/kl_loss``, ``actor/pg_clipfrac``,
            ``actor/approx_kl``, ``actor/grad_norm``, ...; each minibatch's value is the global
            minibatch's, its passes on every worker weighted like their losses: identical on
            every worker), ``actor/num_updates`` (0 when
            some worker's shard is empty: nobody updates), ``actor/action_std`` (a policy with a
            state-independent ``action_std()``, e.g. the MLP: its mean over the action dimensions
            after the update, in action units) and ``actor/skipped_updates`` (updates
            whose gradient norm was not finite, not applied: :mod:`vla_rl.trainers.guard`);
            with ``trainer.gradient_checkpointing``, ``actor/checkpointed_blocks`` (the blocks
            that recompute their activations: 0 would mean checkpointing did nothing). At
            token granularity, ``actor/old_log_prob_max_diff``: the largest gap between the
            recomputed per-dimension log-probs (summed per action) and the rollout's, exactly 0
            for a conforming policy; also at every granularity when the training module
            rescores the rollout's actions (FSDP's mixed precision, bfloat16 master weights), then
            the rollout/trainer mismatch.

        Raises:
            RunStopped: ``trainer.max_skipped_updates`` skipped updates in a row.
            ValueError: ``trainer.micro_batch_size`` with a loss aggregation mode that is not
                built in (see :func:`~vla_rl.algorithms.aggregation.aggregation_weight`).
        """
        batch = with_model_ready_observations(self.policy, batch.to(self.policy.device))  # once, at the node boundary
        if algorithm.mask_truncated_responses:
            batch = without_truncated_responses(batch)
        old_log_probs, metrics = self._old_log_probs(batch, algorithm.ratio_granularity,
                                                     trainer.micro_batch_size)  # (n, L)
        loss_fn = POLICY_LOSSES.get(algorithm.policy_loss)
        loss_options = algorithm.options("policy_loss")
        totals: dict[str, float] = {}
        updates = skipped = 0
        self.policy.train()
        self.parallel.trained.train()
        schedule = list(minibatch_schedule(batch.batch_size[0], trainer.ppo_mini_batch_size, trainer.ppo_epochs,
                                           generator, self.group, trainer.micro_batch_size,
                                           trainer.ppo_num_mini_batches))
        units = weight_units(batch, algorithm.ratio_granularity)  # (n, L)
        weights = global_weights(units, schedule, algorithm.loss_agg_mode, self.group)
        for i, micro_batches in enumerate(schedule):
            step = self._minibatch_step(batch, micro_batches, units, None if weights is None else weights[i],
                                        old_log_probs, algorithm, trainer, loss_fn, loss_options)
            if step is None:
                skipped += 1
                continue
            for name, value in step.items():
                totals[name] = totals.get(name, 0.0) + value
            updates += 1
        if updates:
            self.parallel.after_update()
        grad_norm = totals.pop("actor/grad_norm", None)
        means = {name: total / updates for name, total in totals.items()}
        metrics.update(sum_over_workers(means, self.group) if weights is not None else means)
        if grad_norm is not None:  # the same on every worker (the norm of the averaged gradient)
            metrics["actor/grad_norm"] = grad_norm / updates
        metrics["actor/num_updates"] = float(updates)
        metrics["actor/skipped_updates"] = float(skipped)
        if callable(getattr(self.policy, "action_std", None)):  # a Gaussian policy's state-independent std
            metrics["actor/action_std"] = float(self.policy.action_std().detach().mean())
        if self.parallel.checkpointed_blocks:
            metrics["actor/checkpointed_blocks"] = float(self.parallel.checkpointed_blocks)
        return metrics

    def supervised_update(self, batch: TensorDict, epochs: int, mini_batch_size: int, max_grad_norm: float,
                          generator: torch.Generator, micro_batch_size: int | None = None,
                          max_skipped_updates: int = 3, num_mini_batches: int | None = None) -> dict[str, float]:
        """Supervised fine-tuning on this worker's shard of prompt/target pairs (``llm_sft``; a
        causal LM, scored by :func:`text_forward`): the negative log-likelihood of the target
        tokens at temperature 1 whatever ``text.temperature`` (the warm start's
        :meth:`~policies.causal_lm.modeling_causal_lm.CausalLMPolicy.sft_loss` too), token mean.

        Args:
            batch: what ``forward`` reads, the targets as ``responses`` / ``response_mask``.
            epochs: passes over the shard.
            mini_batch_size: samples per minibatch, summed over the workers (unused with
                ``num_mini_batches``).
            max_grad_norm: gradient-norm clip.
            generator: shuffles the minibatches.
            micro_batch_size: samples per forward/backward pass (None: the whole minibatch).
            max_skipped_updates: updates in a row whose gradient norm is not finite (skipped, as
                the actor's: :class:`~vla_rl.trainers.guard.GuardedStep`) after which the run stops.
            num_mini_batches: minibatches per pass (``trainer.ppo_num_mini_batches``; None: from
                ``mini_batch_size``), as the RL update's.

        Returns:
            ``sft/loss`` (the global minibatches' token mean, as the actor's loss terms) and
            ``sft/grad_norm`` (means over the applied updates), ``sft/num_updates``,
            ``sft/skipped_updates``.

        Raises:
            RunStopped: ``max_skipped_updates`` skipped updates in a row.
        """
        batch = batch.to(self.policy.device)
        totals = {"sft/loss": 0.0, "sft/grad_norm": 0.0}
        updates = skipped = 0
        self.policy.train()
        self.parallel.trained.train()
        mask = batch[keys.RESPONSE_MASK]
        schedule = list(minibatch_schedule(batch.batch_size[0], mini_batch_size, epochs, generator, self.group,
                                           micro_batch_size, num_mini_batches))
        weights = global_weights(mask, schedule, "token-mean", self.group)
        world = dist.get_world_size(self.group)
        for i, micro_batches in enumerate(schedule):
            self.optimizer.zero_grad(set_to_none=True)
            loss_value = 0.0
            for index, scale, share, sync in micro_batch_passes(mask, micro_batches, "token-mean",
                                                                None if weights is None else weights[i], world):
                mb = batch[index]
                with self.parallel.gradient_sync(sync):  # the forward too: DDP arms its all-reduce there
                    with self.parallel.autocast():
                        log_probs = text_forward(self.ddp, mb, temperature=1.0, with_entropy=False)[0]
                        log_probs = log_probs.flatten(start_dim=2).sum(-1)
                    loss = -aggregate_loss(log_probs, mb[keys.RESPONSE_MASK], "token-mean")  # log_probs (b, T)
                    (loss if scale is None else loss * scale).backward()
                loss_value += float(loss.detach()) * share
            grad_norm, applied = self.guarded_sft_step(self.parallel.trained.parameters(), self.optimizer,
                                                       max_grad_norm, max_skipped_updates, loss)
            if not applied:
                skipped += 1
                continue
            totals["sft/loss"] += loss_value
            totals["sft/grad_norm"] += grad_norm
            updates += 1
        if updates:
            self.parallel.after_update()
        metrics = {name: total / max(updates, 1) for name, total in totals.items()}
        if weights is not None:  # each worker's share of the global minibatches' loss
            metrics.update(sum_over_workers({"sft/loss": metrics["sft/loss"]}, self.group))
        metrics["sft/num_updates"] = float(updates)
        metrics["sft/skipped_updates"] = float(skipped)
        return metrics

    def _old_log_probs(self, batch: TensorDict, granularity: str, micro_batch_size: int | None
                       ) -> tuple[Tensor, dict[str, float]]:
        """The old policy's log-probs at ``granularity``: (n, L).

        Action and chunk level come from the rollout's per-action log-probs; token level needs
        one per action dimension, recomputed here before any update (the weights are still the
        rollout's) and checked against the rollout's sums. When the strategy's training copy may
        compute otherwise than the policy the rollout sampled with (bfloat16 mixed precision, or
        FSDP's bfloat16 master weights over float32 trainable parameters:
        :attr:`~vla_rl.trainers.strategy.FSDPStrategy.recomputes_old_log_probs`),
        the training module scores the rollout's actions instead, at every granularity (verl's
        ``actor.compute_log_prob``): the first minibatch's ratio is then 1 in the trainer's own
        arithmetic (bit for bit where the minibatch's passes have the rescoring's batch shape; on
        an accelerator's bfloat16 kernels other shapes may round otherwise), and
        ``actor/old_log_prob_max_diff`` is the largest gap between the rollout's log-probs and the
        trainer's.
        """
        rollout_log_probs = batch[keys.OLD_LOG_PROBS]  # (n, T, chunk)
        per_dim = self._trainer_log_probs(batch, micro_batch_size) if self.parallel.recomputes_old_log_probs else None
        if per_dim is None:
            if granularity != "token":
                return reduce_per_action(rollout_log_probs, granularity), {}
            per_dim = per_dim_log_probs(self.policy, batch, self.forward, micro_batch_size)  # (n, T, C, A_own)
        valid = batch[keys.RESPONSE_MASK]  # (n, T)
        gap = (per_dim.sum(dim=-1) - rollout_log_probs)[valid].abs()
        max_gap = float(gap.max()) if gap.numel() else 0.0
        return reduce_per_dim(per_dim, granularity), {"actor/old_log_prob_max_diff": max_gap}

    @torch.no_grad()
    def _trainer_log_probs(self, batch: TensorDict, micro_batch_size: int | None) -> Tensor | None:
        """Per-dimension log-probs ``(n, T, chunk, own_action_dim)`` float32 of the batch's actions
        under the training module in eval mode, as the rollout scored them, before any update.

        Collective (FSDP gathers parameters in every pass): every worker runs the same number of
        passes of at most ``micro_batch_size`` rows, a worker with fewer rows repeating its first
        row in a pass whose result it drops. None when some worker's shard is empty (no worker
        updates then, :func:`~vla_rl.trainers.minibatches.minibatch_schedule`).
        """
        counts = all_gather_small_objects(batch.batch_size[0], self.group)
        if min(counts) == 0:
            return None
        size = micro_batch_size or max(counts)
        module = self.parallel.module.eval()
        scored = []
        for start in range(0, max(counts), size):
            part = batch[start:start + size]
            with self.parallel.autocast():
                log_probs = self.forward(module, part if len(part) else batch[:1], with_entropy=False)[0]
            if len(part):
                scored.append(log_probs.float())
        return torch.cat(scored)

    def _minibatch_step(self, batch: TensorDict, micro_batches: list[Tensor], units: Tensor,
                        global_weight: float | None, old_log_probs: Tensor, algorithm, trainer, loss_fn,
                        loss_options) -> dict[str, float] | None:
        """One minibatch update, its gradient accumulated over ``micro_batches`` (index tensors
        into ``batch``) and normalised by ``global_weight`` (:func:`~vla_rl.trainers.minibatches.global_weights`;
        None: by this worker's minibatch); its metrics (the loss terms' shares of the minibatch,
        :class:`~vla_rl.trainers.minibatches.Pass`), or None when its gradient was not finite (skipped)."""
        self.optimizer.zero_grad(set_to_none=True)
        out: dict[str, float] = {}
        loss = None
        world = dist.get_world_size(self.group)
        for index, scale, share, sync in micro_batch_passes(units, micro_batches, algorithm.loss_agg_mode,
                                                            global_weight, world):
            with self.parallel.gradient_sync(sync):  # the forward too: DDP arms its all-reduce there
                loss, terms = self._loss(batch[index], old_log_probs[index], algorithm, loss_fn, loss_options)
                (loss if scale is None else loss * scale).backward()
            if scale is None:  # the whole minibatch in one pass
                out.update(terms)
                continue
            for name, value in terms.items():
                out[name] = out.get(name, 0.0) + value * share
        grad_norm, applied = self.guarded_step(self.parallel.trained.parameters(), self.optimizer,
                                               trainer.max_grad_norm, trainer.max_skipped_updates, loss)
        if not applied:
            return None
        out["actor/grad_norm"] = grad_norm
        return out

    def _loss(self, mb: TensorDict, old_log_probs: Tensor, algorithm, loss_fn, loss_options
              ) -> tuple[Tensor, dict[str, float]]:
        """The loss of minibatch (or micro-batch) ``mb`` and its terms and metrics."""
        granularity = algorithm.ratio_granularity
        agg_mode, agg_normalizer = algorithm.loss_agg_mode, algorithm.loss_agg_normalizer
        with self.parallel.autocast():
            dim_log_probs, entropy = self.forward(self.ddp, mb)  # (b, T, C, A_own) each
        chunk, own_action_dim = dim_log_probs.shape[2:]
        log_probs = reduce_per_dim(dim_log_probs, granularity)  # (b, L)
        entropy = reduce_per_dim(entropy, granularity)  # (b, L)
        executed = loss_actions(mb, chunk)  # (b, T, C)
        mask = unit_mask(executed, own_action_dim, granularity)  # (b, L)
        advantages = expand_per_step(mb[keys.ADVANTAGES], chunk, own_action_dim, granularity)  # (b, L)

        returned = loss_fn(log_probs, old_log_probs, advantages, mask, loss_options, agg_mode, agg_normalizer)
        if not (isinstance(returned, tuple) and len(returned) == 2 and isinstance(returned[0], torch.Tensor)
                and returned[0].dim() == 0 and isinstance(returned[1], dict)):
            raise RunStopped(f"policy loss {algorithm.policy_loss!r} ({getattr(loss_fn, '__module__', '?')}) returned "
                             f"{_described(returned)}; a policy loss returns (loss, metrics): a scalar tensor and a "
                             "dict of floats (docs/extending.md)")
        pg_loss, pg_metrics = returned
        entropy_term = aggregate_loss(entropy, mask, agg_mode, agg_normalizer)
        # without a bonus the entropy is a metric only: kept out of the loss, its backward never runs
        loss = pg_loss - algorithm.entropy_coeff * entropy_term if algorithm.entropy_coeff else pg_loss
        out = {f"actor/{name}": value for name, value in pg_metrics.items()}
        if algorithm.use_kl_loss:
            # estimated per action dimension (a token, as verl's per-token KL) and summed over each
            # unit: the chain rule's KL of the unit, never one estimate of a whole chunk's log-ratio,
            # which k3's clamp (verl's, sized for one token) saturates and stops the gradient of
            executed_dims = executed[..., None].expand_as(dim_log_probs)  # (b, T, C, A_own)
            kl = reduce_per_dim(kl_penalty(dim_log_probs, mb[keys.REF_LOG_PROBS], algorithm.kl_loss_type,
                                           executed_dims), granularity)  # (b, L)
            kl_term = aggregate_loss(kl, mask, agg_mode, agg_normalizer)
            loss = loss + algorithm.kl_loss_coef * kl_term
            out["actor/kl_loss"] = float(kl_term.detach())
        out.update({"actor/pg_loss": float(pg_loss.detach()), "actor/entropy": float(entropy_term.detach())})
        return loss, out

    # ------------------------------------------------------------------ checkpoints
    def save_sharded(self, directory) -> None:
        """Collective (FSDP): write the training copy's weights and the optimizer's state, sharded,
        into ``directory`` (:func:`~vla_rl.checkpoints.sharded.save_sharded`)."""
        from vla_rl.checkpoints.sharded import save_sharded

        save_sharded(directory, self.parallel.trained, self.optimizer, self.group)

    def load_sharded(self, directory) -> None:
        """Collective (FSDP): restore what :meth:`save_sharded` wrote, then refresh the policy."""
        from vla_rl.checkpoints.sharded import load_sharded

        load_sharded(directory, self.parallel.trained, self.optimizer, self.group)
        self.parallel.after_update()


def _described(value) -> str:
    """A short description of what a plug-in returned (its type, a tensor's shape)."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} ({', '.join(_described(item) for item in value)})"
    return f"a {type(value).__name__}"
