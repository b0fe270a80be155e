"""``(data, data_load)``: this worker's shard of the step's initial states."""

from __future__ import annotations

from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.data.task_loader import ShardedTaskLoader
from vla_rl_core import keys


def task_loader(config, dp_rank: int, dp_size: int) -> ShardedTaskLoader:
    """The loader of the step's initial states of DP shard ``dp_rank`` of ``dp_size``.

    Raises:
        ValueError: see :class:`ShardedTaskLoader` (``data.init_states_per_step`` not a multiple of
            the DP size or of the task count, or larger than ``data.num_train_init_states``).
    """
    data, sim = config.data, config.simulator
    return ShardedTaskLoader(
        num_init_states=data.num_train_init_states,
        groups_per_step=data.init_states_per_step,
        dp_rank=dp_rank,
        dp_size=dp_size,
        seed=config.run.seed,
        num_tasks=len(sim.task_names()) if sim.multi_task else 1,
    )


def _shards_divide_the_step(config, node_config, dp_size: int, world_size: int):
    """Plan-time: every DP shard loads as many initial states (checked before any worker starts)."""
    try:
        task_loader(config, 0, dp_size)
    except ValueError as error:
        return "data.init_states_per_step", f"{error} (with {world_size} workers)"
    return None


@register_node("data", "data_load", writes=(keys.INIT_STATE_ID, keys.TASK_ID, keys.UID), check=_shards_divide_the_step)
def load_init_states(ctx, batch) -> NodeOutput:
    """Load shard ``ctx.dp_rank`` of the step's ``data.init_states_per_step`` initial states (in a
    dynamic-sampling refill round, fresh ones: :meth:`ShardedTaskLoader.batch_for_refill`); with a
    task set (``simulator.tasks``) as many of every task, ``task_id`` their position in the set.

    Returns:
        ``init_state_id``, ``task_id``, ``uid`` of shape ``(init_states_per_step // dp_size,)``.
    """
    loader = task_loader(ctx.config, ctx.dp_rank, ctx.dp_size)
    if ctx.refill_round:
        return NodeOutput(loader.batch_for_refill(ctx.step, ctx.refill_round), {})
    return NodeOutput(loader.batch_for_step(ctx.step), {"data/epoch": float(ctx.step // loader.steps_per_epoch)})
