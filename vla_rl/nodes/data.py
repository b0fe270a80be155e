"""``(data, data_load)``: this worker's shard of the step's initial states."""

from __future__ import annotations

from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.data import keys
from vla_rl.data.task_loader import ShardedTaskLoader


@register_node("data", "data_load", writes=(keys.INIT_STATE_ID, keys.TASK_ID, keys.UID))
def load_init_states(ctx, batch) -> NodeOutput:
    """Load shard ``ctx.dp_rank`` of the step's ``data.init_states_per_step`` initial states (in a
    dynamic-sampling refill round, fresh ones: :meth:`ShardedTaskLoader.batch_for_refill`); with a
    task set (``simulator.tasks``) as many of every task, ``task_id`` their position in the set.

    Returns:
        ``init_state_id``, ``task_id``, ``uid`` of shape ``(init_states_per_step // dp_size,)``.
    """
    data, sim = ctx.config.data, ctx.config.simulator
    loader = ShardedTaskLoader(
        num_init_states=data.num_train_init_states,
        groups_per_step=data.init_states_per_step,
        dp_rank=ctx.dp_rank,
        dp_size=ctx.dp_size,
        seed=ctx.config.run.seed,
        num_tasks=len(sim.task_names()) if sim.multi_task else 1,
    )
    if ctx.refill_round:
        return NodeOutput(loader.batch_for_refill(ctx.step, ctx.refill_round), {})
    return NodeOutput(loader.batch_for_step(ctx.step), {"data/epoch": float(ctx.step // loader.steps_per_epoch)})
