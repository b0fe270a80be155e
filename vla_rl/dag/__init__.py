"""vla_rl.dag: the DAG layer.

- :mod:`~vla_rl.dag.schema`: pydantic models of a template file (``TemplateSpec``, ``NodeSpec``).
- :mod:`~vla_rl.dag.loader`: ``load_template`` (YAML, ``extends``, dotted overrides, validation).
- :mod:`~vla_rl.dag.registry`: node functions and their contracts, registered by ``(role, type, name)``.
- :mod:`~vla_rl.dag.planner`: ``plan`` (validation, key flow, topological order, one task chain per worker and phase).
- :mod:`~vla_rl.dag.errors`: ``TemplateError``, naming the file, node and field at fault.

Importing this package imports no Ray, simulator, model or torch code.
"""

from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import Template, load_template
from vla_rl.dag.planner import (
    Hop,
    PhasePlan,
    Plan,
    Reshard,
    RunNode,
    Task,
    describe_plan,
    plan,
)
from vla_rl.dag.registry import (
    NodeFunction,
    NodeOutput,
    get_node_function,
    register_node,
)
from vla_rl.dag.schema import NodeSpec, TemplateSpec

__all__ = [
    "Hop",
    "NodeFunction",
    "NodeOutput",
    "NodeSpec",
    "PhasePlan",
    "Plan",
    "Reshard",
    "RunNode",
    "Task",
    "Template",
    "TemplateError",
    "TemplateSpec",
    "describe_plan",
    "get_node_function",
    "load_template",
    "plan",
    "register_node",
]
