"""The built-in DAG node functions. Importing this package registers them in
:data:`vla_rl.dag.registry.NODE_FUNCTIONS`, keyed by (role, type, name).

Each node is a small callable ``fn(ctx, batch) -> NodeOutput``; algorithms live in
:mod:`vla_rl.algorithms`, rollouts in :mod:`vla_rl.rollout`, updates in :mod:`vla_rl.trainers`.
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
)
