"""``(actor, model_train)`` and ``(critic, model_train)``: the data-parallel updates on this
worker's shard."""

from __future__ import annotations

from vla_rl.algorithms.policy_loss import PolicyLossConfig
from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.trainers.actor import ActorUpdateConfig
from vla_rl.trainers.critic import CriticUpdateConfig


@register_node("actor", "model_train", whole_groups=False)
def update_actor(ctx, batch) -> NodeOutput:
    """Policy-gradient epochs over the shard's episodes; returns the batch unchanged."""
    algo, trainer = ctx.config.algorithm, ctx.config.trainer
    loss = PolicyLossConfig(
        clip_ratio_low=algo.clip_ratio_low,
        clip_ratio_high=algo.clip_ratio_high,
        dual_clip_c=algo.dual_clip_c,
        loss_agg_mode=algo.loss_agg_mode,
        loss_agg_normalizer=algo.loss_agg_normalizer,
        policy_drift_coef=algo.policy_drift_coef,
    )
    config = ActorUpdateConfig(
        ppo_epochs=trainer.ppo_epochs,
        ppo_mini_batch_size=trainer.ppo_mini_batch_size,
        max_grad_norm=trainer.max_grad_norm,
        policy_loss=algo.policy_loss,
        loss=loss,
        ratio_granularity=algo.ratio_granularity,
        entropy_coeff=algo.entropy_coeff,
        use_kl_loss=algo.use_kl_loss,
        kl_loss_coef=algo.kl_loss_coef,
        kl_loss_type=algo.kl_loss_type,
    )
    metrics = ctx.resources.actor.update(batch, config, ctx.resources.generator)
    return NodeOutput(batch, metrics)


@register_node("critic", "model_train", whole_groups=False)
def update_critic(ctx, batch) -> NodeOutput:
    """Value-regression epochs on ``returns`` over the shard's episodes; returns the batch unchanged."""
    critic, trainer = ctx.config.critic, ctx.config.trainer
    config = CriticUpdateConfig(
        ppo_epochs=trainer.ppo_epochs,
        ppo_mini_batch_size=trainer.ppo_mini_batch_size,
        max_grad_norm=trainer.max_grad_norm,
        cliprange_value=critic.cliprange_value,
        loss_agg_mode=critic.loss_agg_mode,
    )
    metrics = ctx.resources.critic.update(batch, config, ctx.resources.generator)
    return NodeOutput(batch, metrics)
