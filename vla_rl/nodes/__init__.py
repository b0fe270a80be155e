"""The built-in DAG node functions. Importing this package registers them in
:data:`vla_rl.dag.registry.NODE_FUNCTIONS`, keyed by (role, type, name).

Each node is a small callable ``fn(ctx, batch) -> NodeOutput`` with its contract (the batch keys
it reads and writes, the resources it uses); algorithms live in :mod:`vla_rl.algorithms`,
rollouts in :mod:`vla_rl.rollout`, updates in :mod:`vla_rl.trainers`, what differs between the
embodied and the text workflows in :mod:`vla_rl.workflows`. The modules also register the worker
resources they own (``actor``, ``reference``, ``kl_ctrl``, ``trajectory_encoder``).
"""

from vla_rl.nodes import (  # noqa: F401  (registration)
    advantage,
    data,
    evaluation,
    group_filter,
    inference,
    reward,
    rollout,
    text,
    train,
    warm_start,
)
