"""Forward passes of the models other than the rollout policy, on this worker's shard:

- ``(reference, model_inference)``: ``ref_log_probs`` under the frozen reference policy (a copy
  of the warm-start policy sharing its frozen parameters, the ``reference`` resource), for the
  KL loss term or the KL penalty in the reward;
- ``(critic, model_inference)``: ``values``, the critic's V(s_t) before each decision, for GAE.
"""

from __future__ import annotations

import copy

from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.trainers.actor import per_dim_log_probs
from vla_rl.trainers.strategy import autocast, cast_for_rollouts
from vla_rl.workers.checkpointing import SharedModuleCheckpoint
from vla_rl.workers.metrics import mean
from vla_rl.workers.resources import register_resource
from vla_rl_core import keys


def scored_keys(config, node_config) -> tuple[str, ...]:
    """What scoring a batch with the policy (or a model of its family) reads: the workflow's
    policy inputs and ``response_mask``."""
    from vla_rl.dag.registry import WORKFLOWS

    return (*WORKFLOWS.get(config.run.workflow).policy_keys, keys.RESPONSE_MASK)


def critic_needs_one_task(config, node_config, dp_size: int, world_size: int) -> tuple[str, str] | None:
    """The planner's check of both critic nodes: the embodied value network reads the state
    vector alone (the flat observation, or the ``state`` of camera observations), not a task
    set's task id, so a task set is refused."""
    if config.run.workflow != "embodied" or not config.simulator.multi_task:
        return None
    return "simulator.tasks", ("critic nodes do not support a task set: the value network reads the state vector "
                               "alone, not the task; remove simulator.tasks, or the critic nodes (an advantage "
                               "estimator without a critic, e.g. algorithm.adv_estimator=grpo)")


@register_resource("reference", needs=("policy",),
                   checkpoint=SharedModuleCheckpoint("reference", "reference", owner="policy"))
def build_reference(res):
    """A frozen copy of the policy as it is when the training phase starts (the warm start);
    restored from checkpoints on resume. Only the policy's trainable parameters are copied: its
    frozen ones (a LoRA run's whole base model, the layers a policy freezes itself) never change
    in training, so the reference shares them, and under LoRA costs the adapters, not a second
    model, in memory and in checkpoints (:class:`~vla_rl.workers.checkpointing.SharedModuleCheckpoint`).
    verl reaches the same by scoring with the adapters disabled, which is the reference only
    while no warm start trained them. Its floating parameters take the dtype the policy's take
    under the run's strategy (:func:`~vla_rl.trainers.strategy.policy_dtype`: bfloat16 under
    FSDP's mixed precision, which the actor then gives the policy's too), whether it is built
    before the actor casts the policy or after: the KL term of the first minibatch is then 0,
    not the float32/bfloat16 gap."""
    frozen = {id(parameter): parameter for parameter in res.policy.parameters() if not parameter.requires_grad}
    reference = copy.deepcopy(res.policy, frozen).requires_grad_(False).eval()
    cast_for_rollouts(reference, res.config.trainer, res.device)
    return reference


@register_node("reference", "model_inference", reads=scored_keys, writes=(keys.REF_LOG_PROBS,),
               resources=("reference",))
def compute_ref_log_probs(ctx, batch) -> NodeOutput:
    """Set ``ref_log_probs`` ``(n, T, chunk, own_action_dim)``: per-element log-probs of the taken
    own actions (``policy.own_action_dim`` values each; response tokens: chunk = own_action_dim =
    1) under the reference policy (0 after each episode's or response's end, and on the elements
    the policy never scores), scored ``trainer.micro_batch_size`` rows at a time, in the trainer's
    autocast context (:func:`~vla_rl.trainers.strategy.autocast`)."""
    with autocast(ctx.config.trainer, ctx.resources.device):
        ref_log_probs = per_dim_log_probs(ctx.resources.reference, batch, ctx.resources.workflow.batch_forward,
                                          ctx.config.trainer.micro_batch_size)
    batch.set(keys.REF_LOG_PROBS, ref_log_probs.cpu())
    return NodeOutput(batch, {})


@register_node("critic", "model_inference", reads=scored_keys, writes=(keys.VALUES,), resources=("critic",),
               check=critic_needs_one_task, settings=("critic",))
def compute_values(ctx, batch) -> NodeOutput:
    """Set ``values`` ``(n, T)``: the critic's value of the state before each decision (text: before
    each response token), in the trainer's autocast context (:func:`~vla_rl.trainers.strategy.autocast`).
    Metric ``critic/values_mean``: over the valid decision steps."""
    with autocast(ctx.config.trainer, ctx.resources.device):
        values = ctx.resources.critic.values(batch, ctx.config.trainer.micro_batch_size)
    batch.set(keys.VALUES, values)
    valid = batch[keys.RESPONSE_MASK]
    count = int(valid.sum())
    return NodeOutput(batch, {"critic/values_mean": mean(values[valid].mean() if count else 0.0, count)})
