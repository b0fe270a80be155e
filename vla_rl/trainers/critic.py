"""The critic of PPO with GAE: a value network over the state, and its data-parallel update.

``V(s_t)`` is predicted for the observation before each decision step (the state the policy
acted in): the flat state vector, or the ``state`` of camera observations (the images and the
instruction are not read). The value network normalises it with fixed statistics chosen when the
critic is built (:meth:`~vla_rl.workflows.embodied.EmbodiedWorkflow.build_critic`). The update
regresses it on the advantage node's ``returns`` with the clipped value loss of
:func:`vla_rl.algorithms.value_loss.compute_value_loss`, with the actor's strategy
(``trainer.strategy``: DDP, or an FSDP2 training copy whose weights go back into the value
network after each update; :mod:`vla_rl.trainers.strategy`), its micro-batches
(``trainer.micro_batch_size``) and its activation checkpointing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict, TensorDictBase
from torch import Tensor, nn

from policies.normalization import mean_std_normalize
from vla_rl.algorithms.value_loss import compute_value_loss
from vla_rl.trainers.guard import GuardedStep
from vla_rl.trainers.minibatches import global_weights, micro_batch_passes, minibatch_schedule, sum_over_workers
from vla_rl.trainers.strategy import make_strategy
from vla_rl_core import keys


class ValueNetwork(nn.Module):
    """``V(s) = MLP((s - obs_mean) / obs_std)``, tanh hidden layers, one output.

    Args:
        obs_dim: features of the state vector.
        hidden_sizes: hidden layer widths.
        obs_mean: ``(obs_dim,)`` observation mean (buffer, saved with the weights).
        obs_std: ``(obs_dim,)`` observation scale, > 0.
    """

    def __init__(self, obs_dim: int, hidden_sizes: list[int], obs_mean: Tensor, obs_std: Tensor) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = obs_dim
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.Tanh()]
            width = hidden
        head = nn.Linear(width, 1)
        nn.init.zeros_(head.weight)  # V = 0 everywhere at the start: no spurious advantages
        nn.init.zeros_(head.bias)
        self.net = nn.Sequential(*layers, head)
        self.register_buffer("obs_mean", obs_mean.detach().clone())
        self.register_buffer("obs_std", obs_std.detach().clone())

    def forward(self, obs: Tensor) -> Tensor:
        """``(batch, obs_dim)`` observations -> ``(batch,)`` float32 values (the layers compute in
        their weights' dtype: bfloat16 under FSDP's mixed precision)."""
        normalized = mean_std_normalize(obs, self.obs_mean, self.obs_std)
        # a float32 copy even in float32 (no view: FSDP2 warns of a sharded module returning one)
        return self.net(normalized.to(self.net[0].weight.dtype)).squeeze(-1).to(torch.float32, copy=True)

    def fsdp_units(self) -> list[nn.Module]:
        """The linear layers (FSDP2 shards each; see :meth:`policies.base.Policy.fsdp_units`)."""
        return [layer for layer in self.net if isinstance(layer, nn.Linear)]


def embodied_values(model, batch: TensorDict) -> Tensor:
    """Values of the state before each decision: ``obs`` ``(n, T + 1, obs_dim)``, or camera
    observations (a TensorDict of batch size ``(n, T + 1)``) whose ``state`` ``(n, T + 1, obs_dim)``
    is read -> ``(n, T)``."""
    obs = batch[keys.OBS]
    states = (obs[keys.OBS_STATE] if isinstance(obs, TensorDictBase) else obs)[:, :-1]  # (n, T, obs_dim)
    return model(states.reshape(-1, states.shape[-1])).reshape(states.shape[:2])


def text_values(model, batch: TensorDict) -> Tensor:
    """Values before each response token (a
    :class:`~policies.causal_lm.value_causal_lm.CausalLMValueModel`): ``(n, R)``."""
    return model(batch[keys.INPUT_IDS], batch[keys.ATTENTION_MASK], batch[keys.RESPONSES], batch[keys.RESPONSE_MASK])


class CriticTrainer:
    """Owns the data-parallel value network (DDP or FSDP2) and its Adam optimizer on one worker.

    Args:
        network: the value network (same initial weights on every worker, or broadcast from rank
            0 at construction), with ``fsdp_units()`` for FSDP. Under FSDP it stays the plain
            module :meth:`values` uses, refreshed from the sharded training copy after each update.
        lr: Adam learning rate.
        group: the DAG workers' process group (None: the default group).
        forward: how a batch becomes ``(n, T)`` values (:func:`embodied_values`, the default, or
            :func:`text_values`).
        trainer: the run's ``trainer`` section, for ``strategy``, ``mixed_precision``,
            ``gradient_checkpointing`` and ``fsdp`` (None: DDP without activation checkpointing).

    Raises:
        ValueError: see :func:`~vla_rl.trainers.strategy.make_strategy`.
    """

    def __init__(self, network: nn.Module, lr: float, group: dist.ProcessGroup | None = None,
                 forward: Callable[[Any, TensorDict], Tensor] | None = None, trainer=None) -> None:
        self.network = network
        self.group = group
        self.forward = embodied_values if forward is None else forward
        self.parallel = make_strategy(network, group, trainer)
        self.optimizer = torch.optim.Adam(self.parallel.trained.parameters(), lr=lr)
        self.guarded_step = GuardedStep("critic")

    @property
    def device(self) -> torch.device:
        """The device of the value network."""
        return next(self.network.parameters()).device

    @property
    def sharded(self) -> bool:
        """Whether the trained state is sharded over the workers (FSDP: ``critic_sharded/`` in
        checkpoints)."""
        return self.parallel.sharded

    @torch.no_grad()
    def values(self, batch: TensorDict, micro_batch_size: int | None = None) -> Tensor:
        """``(n, T)`` float32 values of the state before each decision of ``batch`` (what
        ``forward`` reads; steps after an episode's end hold the value of padding or 0), on the CPU,
        computed ``micro_batch_size`` rows at a time (None: all at once)."""
        rows = batch.batch_size[0]
        step = rows if micro_batch_size is None else micro_batch_size
        if rows <= step:
            return self.forward(self.network, batch.to(self.device)).cpu()
        return torch.cat([self.forward(self.network, batch[start:start + step].to(self.device)).cpu()
                          for start in range(0, rows, step)])

    def update(self, batch: TensorDict, critic, trainer, generator: torch.Generator) -> dict[str, float]:
        """Regress the values on ``returns`` over this worker's shard.

        Args:
            batch: what ``forward`` reads, ``values`` and ``returns`` ``(n, T)``,
                ``response_mask`` ``(n, T)``.
            critic: the run's ``critic`` section (``cliprange_value``: value clipping, None for the
                plain squared error; ``loss_agg_mode``).
            trainer: the run's ``trainer`` section (``ppo_epochs``, ``ppo_mini_batch_size``:
                episodes per minibatch summed over the workers, ``ppo_num_mini_batches``,
                ``micro_batch_size``: gradient accumulation as the actor's, ``max_grad_norm``).
            generator: shuffles the minibatches.

        Returns:
            Means over the applied minibatch updates of ``critic/vf_loss``, ``critic/vf_clipfrac``,
            ``critic/vpred_mean``, ``critic/grad_norm``, ``critic/num_updates``, and
            ``critic/skipped_updates`` (non-finite gradient norms, not applied); each
            minibatch's value is the global minibatch's (the workers' passes weighted like their
            losses), whose denominator also normalises the loss, as the actor's
            (:func:`~vla_rl.trainers.minibatches.global_weights`).

        Raises:
            RunStopped: ``trainer.max_skipped_updates`` skipped updates in a row.
        """
        batch = batch.to(self.device)  # once, at the node boundary
        totals: dict[str, float] = {}
        updates = skipped = 0
        self.network.train()
        self.parallel.trained.train()
        mask = batch[keys.RESPONSE_MASK]
        schedule = list(minibatch_schedule(batch.batch_size[0], trainer.ppo_mini_batch_size, trainer.ppo_epochs,
                                           generator, self.group, trainer.micro_batch_size,
                                           trainer.ppo_num_mini_batches))
        weights = global_weights(mask, schedule, critic.loss_agg_mode, self.group)
        world = dist.get_world_size(self.group)
        for i, micro_batches in enumerate(schedule):
            self.optimizer.zero_grad(set_to_none=True)
            metrics: dict[str, float] = {}
            vf_loss = None
            for index, scale, share, sync in micro_batch_passes(mask, micro_batches, critic.loss_agg_mode,
                                                                None if weights is None else weights[i], world):
                mb = batch[index]
                with self.parallel.gradient_sync(sync):  # the forward too: DDP arms its all-reduce there
                    with self.parallel.autocast():
                        vpreds = self.forward(self.parallel.module, mb)  # (b, T)
                    vf_loss, terms = compute_value_loss(vpreds, mb[keys.RETURNS], mb[keys.VALUES],
                                                        mb[keys.RESPONSE_MASK], critic.cliprange_value,
                                                        critic.loss_agg_mode)
                    (vf_loss if scale is None else vf_loss * scale).backward()
                terms["vf_loss"] = float(vf_loss.detach())
                for name, value in terms.items():
                    metrics[name] = metrics.get(name, 0.0) + value * share
            grad_norm, applied = self.guarded_step(self.parallel.trained.parameters(), self.optimizer,
                                                   trainer.max_grad_norm, trainer.max_skipped_updates, vf_loss)
            if not applied:
                skipped += 1
                continue
            metrics["grad_norm"] = grad_norm
            for name, value in metrics.items():
                totals[f"critic/{name}"] = totals.get(f"critic/{name}", 0.0) + value
            updates += 1
        if updates:
            self.parallel.after_update()
        grad_norm = totals.pop("critic/grad_norm", None)
        out = {name: total / updates for name, total in totals.items()}
        if weights is not None:  # each worker's share of the global minibatches' values
            out = sum_over_workers(out, self.group)
        if grad_norm is not None:  # the same on every worker
            out["critic/grad_norm"] = grad_norm / updates
        out["critic/num_updates"] = float(updates)
        out["critic/skipped_updates"] = float(skipped)
        return out

    # ------------------------------------------------------------------ checkpoints
    def save_sharded(self, directory) -> None:
        """Collective (FSDP): write the training copy's weights and the optimizer's state, sharded,
        into ``<directory>/critic_sharded`` (:func:`~vla_rl.checkpoints.sharded.save_sharded`)."""
        from vla_rl.checkpoints.layout import CRITIC_SHARDED_DIR
        from vla_rl.checkpoints.sharded import save_sharded

        save_sharded(directory, self.parallel.trained, self.optimizer, self.group, name=CRITIC_SHARDED_DIR)

    def load_sharded(self, directory) -> None:
        """Collective (FSDP): restore what :meth:`save_sharded` wrote, then refresh the value
        network (its weights, and its buffers: the state normalisation)."""
        from vla_rl.checkpoints.layout import CRITIC_SHARDED_DIR
        from vla_rl.checkpoints.sharded import load_sharded

        load_sharded(directory, self.parallel.trained, self.optimizer, self.group, name=CRITIC_SHARDED_DIR)
        self.parallel.after_update()
        buffers = dict(self.parallel.trained.named_buffers())
        with torch.no_grad():
            for name, buffer in self.network.named_buffers():
                buffer.copy_(buffers[name])
