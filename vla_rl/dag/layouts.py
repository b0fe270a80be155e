"""The planner's rules on how rows reach a node over the workers (:mod:`vla_rl.dag.planner`).

A node's input reaches it from each dep as the dep left it (equal DP sizes), rebalanced in place
(a node taking single samples at DP size > 1), or cut anew into the node's shards (a re-shard
between different DP sizes). These rules refuse, before anything starts, the templates whose rows
would reach a worker in a way its node cannot use: deps joined from two ways, or a node reading
worker-local state of an upstream node (:attr:`~vla_rl.dag.registry.NodeFunction.local_to`) at
another DP size than that node's.
"""

from __future__ import annotations

from pathlib import Path

from vla_rl.dag.errors import TemplateError
from vla_rl.dag.registry import NodeFunction, get_node_function
from vla_rl.dag.schema import NodeSpec


def rebalances(function: NodeFunction, dp_size: int) -> bool:
    """Whether a node's input is re-sharded even from a node of its own DP size: a node that takes
    single samples (``whole_groups=False``, a model update) gets shards of equal size, since the
    filters upstream leave them unequal and a data-parallel update runs as many minibatches as
    the smallest shard allows."""
    return not function.whole_groups and dp_size > 1


def ancestors(node_id: str, nodes: dict[str, NodeSpec]) -> list[str]:
    """The ids of every node upstream of ``node_id``, nearest first along each path."""
    seen: list[str] = []
    stack = list(nodes[node_id].deps)
    while stack:
        dep = stack.pop()
        if dep not in seen:
            seen.append(dep)
            stack.extend(nodes[dep].deps)
    return seen


def check_joined_layouts(nodes: tuple[NodeSpec, ...], dp_sizes: dict[str, int], file: Path) -> None:
    """A node's deps reach it one way: all as their nodes left them, all rebalanced in place (a
    sample-taking node's deps at its own DP size: rows stay where they are, the surplus moves),
    or all cut from the global order into the node's shards (deps at other DP sizes). Two ways
    put different rows on a worker (one re-sharded into near-equal cuts, another as a filter left
    it: the run stopped at its first step, or with no key in common would join wrong rows).
    Deps reaching it the same way hold the same rows when they come from the same rows, which the
    worker checks.

    Raises:
        TemplateError: naming the node, ``deps`` and how each dep reaches it.
    """
    for node in nodes:
        dp_size, function = dp_sizes[node.id], get_node_function(node.role, node.type, node.fn)
        ways = {dep: ("cut" if dp_sizes[dep] != dp_size else
                      "rebalanced" if rebalances(function, dp_size) else "as it is") for dep in node.deps}
        if len(set(ways.values())) > 1:
            listed = ", ".join(f"{dep} at DP {dp_sizes[dep]} {way}" for dep, way in ways.items())
            raise TemplateError(f"its deps reach it in two ways ({listed}, for DP {dp_size}): their rows are cut "
                                "over the workers differently and cannot be joined row by row; give them one "
                                "dp_size", file=file, node=node.id, field="deps")


def check_local_rows(nodes: tuple[NodeSpec, ...], dp_sizes: dict[str, int], file: Path) -> None:
    """A node whose function is ``local_to`` a role reads, for each of its rows, state that the
    upstream node of that role kept on the worker that produced the row (the text reward looks
    each row's answer up among the prompts its worker read, by its own ``dp_rank``). It must run
    at that node's DP size: at another, its shard holds rows other workers read. (Between the two,
    nodes at other DP sizes are allowed: equal shards re-sharded there and back return to the
    workers they left; a shard that did not finds its rows missing at the first step.)

    Raises:
        TemplateError: naming the node, ``dp_size``, the upstream node and both DP sizes.
    """
    by_id = {node.id: node for node in nodes}
    for node in nodes:
        role = get_node_function(node.role, node.type, node.fn).local_to
        if role is None:
            continue
        for source in (by_id[dep] for dep in ancestors(node.id, by_id) if by_id[dep].role == role):
            if dp_sizes[source.id] != dp_sizes[node.id]:
                raise TemplateError(
                    f"{node.role}/{node.type}/{node.fn} reads, for each row, what the {role} node {source.id!r} "
                    f"kept on the worker that read the row, so it must run at that node's DP size ({source.id!r} "
                    f"at DP {dp_sizes[source.id]}, {node.id!r} at DP {dp_sizes[node.id]}): give them one dp_size",
                    file=file, node=node.id, field="dp_size")
