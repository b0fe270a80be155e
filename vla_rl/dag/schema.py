"""Pydantic models of a DAG template file (after ``extends`` and overrides are merged in).

A template names a workflow, carries a global ``config:`` mapping (validated separately by the
run-config model given to the loader, :class:`vla_rl.config.RunConfig` in production) and lists
its nodes::

    name: embodied_srpo
    description: free text
    config: {...}
    nodes:
      - id: tasks
        role: data
        type: data_load
        fn: default        # which registered function serves this (role, type)
        deps: []
        dp_size: 2         # default: the world size
        phase: train       # train (every step), warm_start (once, before training) or evaluate
        config: {}         # validated by the config model the node's function declares

Each phase is a DAG of its own (a node's deps lie in its phase): ``warm_start`` runs once before
the first training step, ``train`` every step, ``evaluate`` whenever the run evaluates (before
and after training, every ``eval.every_steps``, and ``vla-rl eval``) until nothing remains.
Phases are usually included from ``dag_templates/phases/`` through ``extends``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

Role = Literal[
    "data", "rollout", "actor", "critic", "reference", "reward", "advantage", "filter", "simulator", "evaluator"
]
"""What a node stands for in the workflow."""

NodeType = Literal["data_load", "env_interact", "model_inference", "model_train", "compute"]
"""What kind of work a node does."""

Phase = Literal["warm_start", "train", "evaluate"]
"""When a node runs (see the module docstring)."""

PHASES: tuple[str, ...] = get_args(Phase)

ROLES: tuple[str, ...] = get_args(Role)
NODE_TYPES: tuple[str, ...] = get_args(NodeType)

NODE_ID_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

NodeId = Annotated[str, Field(min_length=1, pattern=NODE_ID_PATTERN)]


class NodeSpec(BaseModel):
    """One node of a template, as written (defaults not yet resolved against the world size)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: NodeId = Field(description="Unique identifier-like name of the node (letters, digits, _).")
    role: Role = Field(description="What the node stands for (actor, rollout, reward, ...).")
    type: NodeType = Field(description="What kind of work the node does (data_load, compute, ...).")
    fn: str = Field("default", min_length=1, description="Registered function name for (role, type).")
    deps: tuple[NodeId, ...] = Field((), description="Ids of the nodes whose outputs this node reads.")
    dp_size: StrictInt | None = Field(
        None, ge=1, description="Workers that split this node's batch; default: the world size."
    )
    phase: Phase = Field("train", description="When the node runs: warm_start, train or evaluate.")
    config: dict[str, Any] = Field(
        default_factory=dict, description="Per-node settings, validated by the function's config model; "
        "null: none (an extending template's config: null drops the settings its base gave the node)."
    )

    @field_validator("config", mode="before")
    @classmethod
    def _null_config_is_none(cls, value: Any) -> Any:
        return {} if value is None else value


class TemplateSpec(BaseModel):
    """A whole template file; ``config`` stays a mapping until the loader validates it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Name of the workflow.")
    description: str = Field("", description="Free text.")
    config: dict[str, Any] = Field(default_factory=dict, description="The global run configuration.")
    nodes: tuple[NodeSpec, ...] = Field(min_length=1, description="The nodes of the DAG.")
