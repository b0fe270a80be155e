"""``vla-rl plan``: validate a template and print each worker's task chain, the DP-size hops and
the training step's data hops with their estimated bytes (:mod:`vla_rl.dag.traffic`)."""

from __future__ import annotations

import argparse

from rich.console import Console

from vla_rl.cli.arguments import (
    add_template_arguments,
    one_template,
    positive_int,
    shipped_templates,
    split_overrides,
)
from vla_rl.config.sections import MAX_WORKERS
from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import describe_plan, plan
from vla_rl.driver import refuse_evaluation_settings
from vla_rl.errors import CommandLineError
from vla_rl.preflight import preflight


def add_plan_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "plan",
        help="print each worker's task chain and the DP-size hops of a template",
        description="Validate a template and print each worker's task chain and the hops between "
        "DP sizes, without starting anything.",
        epilog=shipped_templates(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_template_arguments(parser)
    parser.add_argument(
        "--world-size", type=positive_int, default=None, metavar="N", help="default: config.workers.num_workers"
    )
    parser.set_defaults(handler=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    names, overrides = split_overrides([args.template, *args.overrides])  # overrides may come first too
    template = load_template(one_template(names, "name one template before or after the overrides"), overrides)
    given = template.config.workers.num_workers
    if args.world_size is not None and args.world_size > MAX_WORKERS:
        raise CommandLineError(f"--world-size {args.world_size}: a run plans for at most {MAX_WORKERS} workers")
    if args.world_size is not None and args.world_size != given and any(
            override.partition("=")[0].strip() == "workers.num_workers" for override in overrides):
        raise CommandLineError(f"--world-size {args.world_size} and workers.num_workers={given} disagree: give one "
                               "(the run trains with workers.num_workers)")
    the_plan = plan(template, world_size=args.world_size)
    if "train" in the_plan.phases:  # a training run's (eval_rollout, vla-rl eval's template, sets them)
        refuse_evaluation_settings(template)
    preflight(template, world_size=args.world_size)
    print(describe_plan(the_plan))
    print_traffic(template, the_plan, Console(width=max(Console().width, 136), highlight=False))
    return 0


def print_traffic(template, the_plan, console: Console) -> None:
    """The ``train`` phase's data hops with their keys and estimated bytes per step, and the
    totals per worker and over all workers."""
    from rich import box
    from rich.table import Table

    from vla_rl.dag.registry import WORKFLOWS
    from vla_rl.dag.traffic import estimate_traffic, format_bytes

    config = template.config
    shape = WORKFLOWS.get(config.run.workflow).step_shape(config)
    world = the_plan.world_size
    if shape is None:
        console.print(f"data hops: workflow {config.run.workflow!r} gives no batch sizes to estimate bytes from")
        return
    hops = estimate_traffic(the_plan, shape)
    if not hops:
        console.print("data hops of a training step: none (every node reads its producer's output on its own worker)")
        return
    sampled = any(node.role == "rollout" and node.phase == "train" for node in template.nodes)
    batch = f"{shape.groups} groups x {shape.group_size} samples" if sampled else f"{shape.groups} rows (no rollout)"
    table = Table(box=box.SIMPLE_HEAD, title=f"data hops of a training step: {batch}, T = {shape.decisions} decisions, "
                  f"{world} workers")
    for column in ("hop", "DP", "keys", "rows", "bytes/row", "moved/step", "in/worker", "max in", "max out",
                   "meta/worker"):
        table.add_column(column, justify="left" if column == "hop" else "right", no_wrap=True)
    for hop in hops:
        rows = f"{'<=' if hop.rows_upper_bound else ''}{hop.rows}"
        if hop.rebalance:
            bound = f"<={format_bytes(hop.rebalance_bound_per_worker)}"
            moved, per_worker, max_in, max_out = "0*", "0*", bound, bound
        else:
            moved, per_worker = format_bytes(hop.total_bytes), format_bytes(hop.bytes_per_worker)
            max_in, max_out = format_bytes(hop.max_received), format_bytes(hop.max_sent)
        table.add_row(f"{hop.src} -> {hop.dst}", f"{hop.src_dp_size}->{hop.dst_dp_size}", str(len(hop.keys)), rows,
                      format_bytes(hop.row_bytes), moved, per_worker, max_in, max_out,
                      format_bytes(hop.meta_bytes_per_worker))
    console.print(table)
    if any(hop.rebalance for hop in hops):
        console.print("* a rebalance (same DP size) moves nothing when the shards it evens out are equal, else "
                      "the surplus rows only (max in / max out: at most)")
    for hop in hops:
        listed = sorted(hop.keys, key=lambda k: (-(hop.key_bytes[k] or 0), k))
        keys = ", ".join(f"{key} {'?' if hop.key_bytes[key] is None else hop.key_bytes[key]}" for key in listed)
        console.print(f"{hop.src} -> {hop.dst} moves (bytes per sample): {keys}")
    rows_per_worker = sum(hop.bytes_per_worker for hop in hops if not hop.rebalance)
    bound = sum(hop.rebalance_bound_per_worker for hop in hops if hop.rebalance)
    meta = sum(hop.meta_bytes_per_worker for hop in hops)
    total = sum(hop.total_bytes for hop in hops if not hop.rebalance)
    console.print(f"per worker per step: {format_bytes(rows_per_worker)} of rows"
                  + (f" (+ up to {format_bytes(bound)} rebalancing unequal shards)" if bound else "")
                  + f" + {format_bytes(meta)} of re-shard metadata; all {world} workers: {format_bytes(total)} of rows"
                  + (f" (+ up to {format_bytes(bound * world)})" if bound else "")
                  + f" + {format_bytes(meta * world)} of metadata")
    unknown = sorted({key for hop in hops for key in hop.unknown_keys})
    if unknown:
        console.print(f"[yellow]sizes unknown before the simulator starts, left out: {', '.join(unknown)}[/yellow]")
