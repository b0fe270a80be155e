"""``(actor, model_train)`` and ``(critic, model_train)``: the data-parallel updates on this
worker's shard, and the ``actor`` resource (the policy in DDP or FSDP2, and its optimizer)."""

from __future__ import annotations

from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.nodes.inference import critic_needs_one_task, scored_keys
from vla_rl.trainers.actor import ActorTrainer
from vla_rl.workers.checkpointing import ACTOR_CHECKPOINT
from vla_rl.workers.metrics import same
from vla_rl.workers.resources import register_resource
from vla_rl_core import keys


@register_resource("actor", needs=("policy",), checkpoint=ACTOR_CHECKPOINT)
def build_actor(res):
    """The policy set up for data-parallel training (``trainer.strategy``: DDP, or a sharded FSDP2
    copy), with its Adam optimizer (``trainer.lr``)."""
    trainer = res.config.trainer
    return ActorTrainer(res.policy, trainer.lr, group=res.group, forward=res.workflow.batch_forward, trainer=trainer)


def _actor_reads(config, node_config) -> tuple[str, ...]:
    reads = (*scored_keys(config, node_config), keys.OLD_LOG_PROBS, keys.ADVANTAGES)
    if config.algorithm.mask_truncated_responses:
        reads = (*reads, keys.TRUNCATED)
    return (*reads, keys.REF_LOG_PROBS) if config.algorithm.use_kl_loss else reads


def _token_ratios_need_scored_elements(config, node_config, dp_size: int, world_size: int):
    """Token-level ratios make every element of the own actions a unit of the loss's mean: a
    policy whose own actions hold elements it never scores (π0: the initial noise and the padded
    values of its denoising chains, log-probs exactly 0) would dilute that mean with them. The
    ``action`` and ``chunk`` granularities sum over the elements, where the zeros are exact."""
    if config.run.workflow != "embodied" or config.algorithm.ratio_granularity != "token":
        return None
    from policies import POLICIES

    policy = config.policy
    reason = POLICIES.get(policy.name).unscored_own_elements(policy.policy_config())
    if reason is None:
        return None
    return "algorithm.ratio_granularity", (f"'token' makes every element of the policy's own actions a unit of the "
                                           f"loss, and the {policy.name!r} policy (policy.name) {reason}; use "
                                           "algorithm.ratio_granularity=action (the default) or chunk, which sum "
                                           "the elements exactly")


def _ddp_needs_float32_weights(config) -> tuple[str, str] | None:
    """The planner's form of :class:`~vla_rl.trainers.strategy.DDPStrategy`'s refusal: DDP steps
    Adam on the policy's own parameters, which must then be float32 (or LoRA's float32 adapters),
    refused before any worker loads a model and warm-starts it."""
    if config.trainer.strategy != "ddp" or (trained := config.low_precision_trained()) is None:
        return None
    field, dtype = trained
    lora = f" {way}," if (way := config.lora_way_out()) else ""
    return "trainer.strategy", (f"ddp would run Adam on the policy's {dtype} parameters ({field}={dtype}; no float32 "
                                "master weights): use trainer.strategy=fsdp (float32 master weights, bfloat16 "
                                f"compute),{lora} or {field}=float32 (trainer.mixed_precision auto computes in "
                                "bfloat16 on accelerators)")


def _actor_checks(config, node_config, dp_size: int, world_size: int) -> tuple[str, str] | None:
    return (_ddp_needs_float32_weights(config)
            or _token_ratios_need_scored_elements(config, node_config, dp_size, world_size))


AGREED_METRICS = ("actor/num_updates", "actor/skipped_updates", "actor/action_std", "actor/checkpointed_blocks",
                  "critic/num_updates", "critic/skipped_updates")
"""Update metrics every worker agrees on (the updates are collective, the models replicated):
reported as they are, not as means over the input batch, which drop out of a step whose shards
are all empty (a group filter keeping no group: ``actor/num_updates`` 0 went missing)."""


def _agreed(metrics: dict[str, float]) -> dict:
    return {name: same(value) if name in AGREED_METRICS else value for name, value in metrics.items()}


@register_node("actor", "model_train", whole_groups=False, reads=_actor_reads, resources=("actor",),
               check=_actor_checks)
def update_actor(ctx, batch) -> NodeOutput:
    """Policy-gradient epochs over the shard's episodes (``algorithm`` and ``trainer`` settings);
    returns the batch unchanged."""
    metrics = ctx.resources.actor.update(batch, ctx.config.algorithm, ctx.config.trainer, ctx.resources.generator)
    return NodeOutput(batch, _agreed(metrics))


def _ddp_needs_a_float32_value_body(config) -> tuple[str, str] | None:
    """The text critic's body is a whole trainable copy of the policy's, in ``text.dtype`` whatever
    the actor's LoRA: under DDP (Adam on it, no float32 masters) it must be float32."""
    dtype = config.text.dtype
    if config.run.workflow != "text" or config.trainer.strategy != "ddp" or dtype == "float32":
        return None
    return "trainer.strategy", (f"ddp would run the critic's Adam on its {dtype} value model (a whole trainable copy "
                                f"of the policy's body in text.dtype={dtype}, LoRA or not; no float32 master "
                                "weights): use trainer.strategy=fsdp (float32 master weights, bfloat16 compute) or "
                                "text.dtype=float32 (trainer.mixed_precision auto computes in bfloat16 on "
                                "accelerators)")


def _critic_checks(config, node_config, dp_size: int, world_size: int) -> tuple[str, str] | None:
    return (_ddp_needs_a_float32_value_body(config)
            or critic_needs_one_task(config, node_config, dp_size, world_size))


@register_node("critic", "model_train", whole_groups=False,
               reads=lambda config, node_config: (*scored_keys(config, node_config), keys.VALUES, keys.RETURNS),
               resources=("critic",), check=_critic_checks, settings=("critic",))
def update_critic(ctx, batch) -> NodeOutput:
    """Value-regression epochs on ``returns`` over the shard's episodes (``critic`` and ``trainer``
    settings); returns the batch unchanged."""
    metrics = ctx.resources.critic.update(batch, ctx.config.critic, ctx.config.trainer, ctx.resources.generator)
    return NodeOutput(batch, _agreed(metrics))
