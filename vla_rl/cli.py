"""The ``vla-rl`` command line.

    vla-rl plan TEMPLATE [KEY=VALUE ...] [--world-size N]
    vla-rl train TEMPLATE [KEY=VALUE ...]
    vla-rl train --resume RUN_DIR [KEY=VALUE ...]
    vla-rl train TEMPLATE --seeds 0,1,2 [KEY=VALUE ...]   (and --resume SWEEP_DIR)
    vla-rl compare SWEEP_A SWEEP_B [--output DIR]
    vla-rl eval RUN_DIR|CHECKPOINT_DIR ... [KEY=VALUE ...] [--steps 5,10] [--output DIR]
    vla-rl export CHECKPOINT_DIR OUT_DIR

``plan`` loads a template (a path, or a name in ``dag_templates/``), applies the dotted overrides
and prints each worker's task chain and the hops between DP sizes, then a table of the training
step's data hops (re-shards): the keys that move and their estimated bytes per step
(:mod:`vla_rl.dag.traffic`), without starting anything.

Each subcommand is a ``_add_<name>_command(commands)`` function that adds its subparser and sets
``handler`` (a function ``args -> exit status``). A problem with the user's input (a template,
an override, a registry name) is printed as one red line on stderr and exits with status 2;
importing this module imports no Ray, simulator or model code.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import describe_plan, plan
from vla_rl.errors import CommandLineError, RunStopped
from vla_rl.evaluation.targets import EvalInputError
from vla_rl.export import ExportError
from vla_rl.export_episodes import EpisodesExportError
from vla_rl.preflight import preflight
from vla_rl.serving import ServeError
from vla_rl_core.registry import RegistryError

USER_ERRORS: tuple[type[Exception], ...] = (TemplateError, ValidationError, RegistryError, EvalInputError,
                                            ExportError, EpisodesExportError, ServeError,
                                            CommandLineError)
"""Errors caused by the user's input: reported in one line, exit status 2, no traceback."""

USER_ERROR_STATUS = 2
RUN_STOPPED_STATUS = 1
#: Exit status after Ctrl-C (the shell's 128 + SIGINT).
INTERRUPTED_STATUS = 130


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="vla-rl", description="RL post-training of VLA policies on a multi-controller DAG engine."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_plan_command(commands)
    _add_train_command(commands)
    _add_compare_command(commands)
    _add_eval_command(commands)
    _add_export_command(commands)
    _add_export_episodes_command(commands)
    _add_serve_command(commands)
    _add_remote_env_command(commands)
    return parser


def add_template_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``TEMPLATE`` and ``KEY=VALUE`` overrides positionals shared by the commands that
    run a template."""
    parser.add_argument("template", metavar="TEMPLATE", help="template file, or a name in dag_templates/")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="dotted overrides: trainer.total_steps=5 (config), nodes.reward.dp_size=1 (a node's field)",
    )


def shipped_templates() -> str:
    """The runnable templates of ``dag_templates/`` (not the phases and bases they include), one
    per line with its ``description`` (read as YAML text: no validation, nothing imported)."""
    import yaml

    from vla_rl.dag.loader import TEMPLATE_DIR

    lines = []
    for path in sorted(TEMPLATE_DIR.glob("*.yaml")):
        try:
            description = (yaml.safe_load(path.read_text()) or {}).get("description", "")
        except (OSError, yaml.YAMLError):
            description = "(unreadable)"
        lines.append(f"  {path.stem:<28} {description}")
    return "shipped templates (dag_templates/):\n" + "\n".join(lines)


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _add_plan_command(commands: argparse._SubParsersAction) -> None:
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
    parser.set_defaults(handler=_run_plan)


def _run_plan(args: argparse.Namespace) -> int:
    template = load_template(args.template, args.overrides)
    preflight(template, world_size=args.world_size)
    the_plan = plan(template, world_size=args.world_size)
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
    table = Table(box=box.SIMPLE_HEAD, title=f"data hops of a training step: {shape.groups} groups x {shape.group_size} samples, "
                        f"T = {shape.decisions} decisions, {world} workers")
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
        console.print("* a rebalance (same DP size) moves nothing when the shards it evens out are equal, else their "
                      "surplus rows (max in / max out: at most)")
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


def _add_train_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "train",
        help="run a training workflow (Ray on loopback, one DAG worker per device slot)",
        description="Run a template's workflow. Writes a run directory with the resolved template, "
        "metrics (JSONL, tensorboard), checkpoints, a success plot, evaluation videos and a summary.",
        epilog=shipped_templates(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("items", nargs="*", metavar="TEMPLATE|KEY=VALUE",
                        help="the template (a file, or a name in dag_templates/), then dotted overrides; with "
                        "--resume only the overrides (the run's own template is used)")
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        default=None,
        help="continue RUN_DIR from its last complete checkpoint; overrides apply on top of the run's "
        "template (and of earlier resumes'), e.g. trainer.total_steps=40; a sweep directory (--seeds) "
        "continues the sweep",
    )
    parser.add_argument(
        "--seeds",
        metavar="SEEDS",
        default=None,
        help="run the template once per seed (0,1,2 or 0-4), one after the other, each in its own run "
        "directory under one sweep directory (run.output_dir/run.name), which gets report.md, report.json "
        "and success_vs_env_steps.png: per-seed held-out figures and their mean with a 95%% t interval",
    )
    parser.set_defaults(handler=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    from vla_rl.driver import train

    names = [item for item in args.items if "=" not in item]
    overrides = [item for item in args.items if "=" in item]
    from vla_rl.sweep import is_sweep

    if args.seeds is not None or (args.resume and is_sweep(args.resume)):
        return _run_sweep(args, names, overrides)
    if args.resume:
        from vla_rl.run_dir import RunDirectory

        RunDirectory.reopen(args.resume)  # a missing directory or template.yaml first, named
        own = _run_template_name(args.resume)  # None: an unreadable template.yaml, which train names
        extra = names[1:] if own is None else [name for name in names if name != own]
        if extra:
            raise CommandLineError(f"with --resume the run's own template is used: remove {extra[0]!r} (overrides "
                                   "such as trainer.total_steps=40 apply on top of it)")
        train(None, overrides, resume=args.resume)
        return 0
    if len(names) != 1:
        raise CommandLineError("name one template (a file, or a name in dag_templates/) before the overrides, or "
                               f"continue a run with --resume RUN_DIR (got {names or 'none'})")
    train(names[0], overrides)
    return 0


def _run_sweep(args: argparse.Namespace, names: list[str], overrides: list[str]) -> int:
    from vla_rl.sweep import parse_seeds, resume_sweep, run_sweep
    from vla_rl.utils.console import driver_console

    if args.resume:
        if args.seeds is not None:
            raise CommandLineError(f"{args.resume} is a sweep: --resume continues it with its own seeds; remove "
                                   "--seeds")
        if names or overrides:
            raise CommandLineError(f"--resume of the sweep {args.resume} takes no template or override (got "
                                   f"{(names + overrides)[0]!r}); resume one of its runs for that: --resume "
                                   f"{args.resume}/seed_<S>")
        resume_sweep(args.resume, console=driver_console())
        return 0
    seeds = parse_seeds(args.seeds)
    if len(names) != 1:
        raise CommandLineError(f"name one template before the overrides (got {names or 'none'})")
    run_sweep(names[0], overrides, seeds, console=driver_console())
    return 0


def _run_template_name(run_dir: str) -> str | None:
    """The template name a run directory was trained with (None if it has no readable template)."""
    import yaml

    from vla_rl_core.run_layout import RUN_TEMPLATE

    try:
        return yaml.safe_load((Path(run_dir) / RUN_TEMPLATE).read_text()).get("name")
    except (OSError, yaml.YAMLError, AttributeError):
        return None


def _add_eval_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "eval",
        help="evaluate checkpoints with rollouts (the eval_rollout template on the DAG workers)",
        description="Roll out checkpoints on a benchmark's tasks under the greedy and/or sampled protocol. "
        "Writes <run>/eval/ (or --output): every episode in zarr, videos, report.md, report.json and a "
        "success-vs-checkpoint plot. Running it again continues an interrupted evaluation.",
    )
    parser.add_argument(
        "items",
        nargs="+",
        metavar="TARGET|KEY=VALUE",
        help="run directories (all their checkpoints) or checkpoint directories, then dotted overrides of "
        "the evaluation template: eval.num_episodes=20, eval.protocols=[greedy], eval.temperature=0.5, "
        "eval.benchmark=robosuite",
    )
    parser.add_argument("--steps", type=_steps, default=None, metavar="S1,S2",
                        help="evaluate only the checkpoints of these training steps")
    parser.add_argument("--output", default=None, metavar="DIR", help="evaluation directory (default: <run>/eval)")
    parser.add_argument("--template", default="eval_rollout", metavar="TEMPLATE",
                        help="evaluation template (default: eval_rollout)")
    parser.set_defaults(handler=_run_eval)


def _steps(text: str) -> list[int]:
    """argparse type: comma-separated non-negative training steps."""
    try:
        steps = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated steps such as 5,10, got {text!r}") from None
    if any(step < 0 for step in steps):
        raise argparse.ArgumentTypeError(f"steps must be non-negative, got {text!r}")
    return steps


def _run_eval(args: argparse.Namespace) -> int:
    from vla_rl.eval_driver import evaluate

    targets = [item for item in args.items if "=" not in item]
    overrides = [item for item in args.items if "=" in item]
    if not targets:
        raise EvalInputError("name a run directory or checkpoint directory to evaluate")
    evaluate(targets, overrides, steps=args.steps, output=args.output, template=args.template)
    return 0


def _add_compare_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "compare",
        help="compare two seed sweeps seed by seed (e.g. SRPO vs GRPO at equal environment steps)",
        description="Pair the runs of two seed sweeps (vla-rl train TEMPLATE --seeds ...) by seed and report, per "
        "held-out protocol, each seed's final success in both and the difference B - A, with the mean difference "
        "over the seeds and its 95%% Student t interval; and whether the runs cost the same (each seed's "
        "environment steps, and whether both sweeps set the same trainer.total_env_steps). Writes compare.md, "
        "compare.json and compare.png.",
    )
    parser.add_argument("sweep_a", metavar="SWEEP_A", help="a sweep directory (or its report.json): the baseline")
    parser.add_argument("sweep_b", metavar="SWEEP_B", help="the sweep compared with it")
    parser.add_argument("--output", default=None, metavar="DIR",
                        help="where to write the comparison (default: compare_<A>_vs_<B> beside SWEEP_A)")
    parser.set_defaults(handler=_run_compare)


def _run_compare(args: argparse.Namespace) -> int:
    from vla_rl.sweep_compare import COMPARE_MD, compare_sweeps

    a, b = Path(args.sweep_a), Path(args.sweep_b)
    names = [(path.parent if path.is_file() else path).resolve().name for path in (a, b)]
    out = Path(args.output) if args.output else (a.parent if a.is_file() else a).resolve().parent / (
        f"compare_{names[0]}_vs_{names[1]}")
    compare_sweeps(a, b, out)
    print((out / COMPARE_MD).read_text(), end="")
    print(f"written to {out}")
    return 0


def _add_export_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "export",
        help="write a checkpoint's policy in its own model layout (LoRA merged), loadable as a pretrained model",
        description="Verify a training checkpoint (DDP or FSDP-sharded), rebuild the run's policy in this process, "
        "load the checkpoint's weights, merge LoRA adapters and write the policy in its model layout: a Hugging "
        "Face directory for causal LMs (text.model_path), the published OpenVLA(-OFT) layout "
        "(policy.config.model_path), config.json + model.safetensors for the MLP policy.",
    )
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint directory: <run>/checkpoints/step_*")
    parser.add_argument("out", metavar="OUT", help="the directory to write (must not exist)")
    parser.set_defaults(handler=_run_export)


def _run_export(args: argparse.Namespace) -> int:
    from vla_rl.export import export_checkpoint

    print(export_checkpoint(args.checkpoint, args.out))
    return 0


def _add_export_episodes_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "export-episodes",
        help="write stored episodes (evaluations, demonstrations) as a LeRobot dataset (format v3.0)",
        description="Replay the episodes of an evaluation directory (vla-rl eval), a run directory (its eval/) or "
        "a demonstration store (demos.zarr) in the simulator, one control step at a time, and write them as a "
        "LeRobot v3.0 dataset: observation.state, action, next.reward/done/success, and with --cameras "
        "observation.images.<camera> videos (AV1, as LeRobot encodes). LeRobot's LeRobotDataset loads it.",
    )
    parser.add_argument("source", metavar="SOURCE", help="an evaluation directory, a run directory or a demos.zarr")
    parser.add_argument("out", metavar="OUT", help="the dataset root to write (must not exist)")
    parser.add_argument("--cameras", type=_names, default=(), metavar="C1,C2",
                        help="cameras to render as videos (e.g. agentview,robot0_eye_in_hand); default: state only")
    parser.add_argument("--camera-size", type=positive_int, default=None, help="square camera size in pixels")
    parser.add_argument("--fps", type=float, default=None, help="frames per second (default: the control frequency)")
    parser.add_argument("--greedy-only", action="store_true", help="only the greedy protocol's evaluation episodes")
    parser.add_argument("--robot-type", default=None, help="LeRobot's robot_type (default: the simulator's robot)")
    parser.set_defaults(handler=_run_export_episodes)


def _names(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated non-empty names."""
    names = tuple(part.strip() for part in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated names such as agentview,robot0_eye_in_hand, "
                                         f"got {text!r}")
    return names


def _run_export_episodes(args: argparse.Namespace) -> int:
    import logging

    from vla_rl.export_episodes import export_episodes

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(export_episodes(args.source, args.out, cameras=args.cameras, camera_size=args.camera_size, fps=args.fps,
                          greedy_only=args.greedy_only, robot_type=args.robot_type))
    return 0


def _add_serve_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "serve",
        help="serve a trained policy to robots over openpi's websocket protocol (openpi-client drives it)",
        description="Load a policy (a run directory's newest checkpoint, a checkpoint directory, or an export of "
        "vla-rl export) and serve it over openpi's websocket protocol: metadata on connect, an observation dict "
        "in, an action chunk out (greedy unless --sample or a request's 'sample': true). Concurrent clients share "
        "forwards. Binds 127.0.0.1 unless --host says otherwise. README, 'Real robots'.",
    )
    parser.add_argument("target", metavar="CHECKPOINT_OR_EXPORT",
                        help="a run directory, a checkpoint directory (<run>/checkpoints/step_*) or an export")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="dotted overrides of --template (the training settings of a π0/OpenVLA export)")
    parser.add_argument("--template", default=None, metavar="TEMPLATE",
                        help="the template a π0/OpenVLA(-OFT) export was trained with (checkpoints record their own)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0: any free port)")
    parser.add_argument("--token", default=None,
                        help="shared secret clients must send (Authorization: Api-Key TOKEN; openpi-client's "
                        "api_key); also read from VLA_RL_SERVE_TOKEN")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: cuda if present, else cpu)")
    parser.add_argument("--sample", action="store_true", help="sample actions by default instead of the mode")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled actions (default 0)")
    parser.add_argument("--batch-window-ms", type=float, default=0.0,
                        help="how long a batch waits for more requests after its first (default 0)")
    parser.add_argument("--max-batch", type=positive_int, default=64, help="most requests per forward (default 64)")
    parser.set_defaults(handler=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    import logging
    import os

    from vla_rl.serving.policy import load_served_policy
    from vla_rl.serving.server import PolicyServer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    token = args.token if args.token is not None else os.environ.get("VLA_RL_SERVE_TOKEN")
    served = load_served_policy(args.target, args.template, args.overrides, device=args.device,
                                temperature=args.temperature, seed=args.seed)
    server = PolicyServer(served, host=args.host, port=args.port, token=token, sample=args.sample,
                          batch_window_ms=args.batch_window_ms, max_batch=args.max_batch)
    server.serve_forever()
    return 0


def _add_remote_env_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "remote-env",
        help="run environments of a simulator for a run on another machine (simulator.name: remote)",
        description="Create --num-envs environments of SIMULATOR (its config from KEY=VALUE, e.g. horizon=100) "
        "and connect each to a run's remote environment hub (vla_rl.remote.RobotClient, one thread each) until "
        "Ctrl-C; a dropped connection is made again. docs/remote.md.",
    )
    parser.add_argument("simulator", help="a registered simulator, e.g. robosuite_lift")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="the simulator's config fields (YAML values)")
    parser.add_argument("--connect", default="ws://127.0.0.1:8765", metavar="URI",
                        help="the hub: ws://HOST:PORT of the run's simulator.env (default ws://127.0.0.1:8765)")
    parser.add_argument("--num-envs", type=positive_int, default=1, help="environments (connections), default 1")
    parser.add_argument("--token", default=None, help="the run's token; also read from VLA_RL_REMOTE_TOKEN")
    parser.set_defaults(handler=_run_remote_env)


def _run_remote_env(args: argparse.Namespace) -> int:
    import logging
    import os
    import threading

    import yaml

    from simulators import make_env
    from vla_rl.remote import serve_envs

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    fields = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandLineError(f"{item!r}: simulator config fields are KEY=VALUE")
        fields[key] = yaml.safe_load(value)
    try:
        envs = [make_env(args.simulator, fields) for _ in range(args.num_envs)]
    except (ValueError, TypeError) as err:
        raise CommandLineError(f"{args.simulator}: {err}") from None
    stop = threading.Event()
    token = args.token if args.token is not None else os.environ.get("VLA_RL_REMOTE_TOKEN")
    clients = serve_envs(envs, args.connect, token, stop)
    try:
        while all(client.thread.is_alive() for client in clients):
            clients[0].thread.join(0.5)
    finally:
        stop.set()
        for client in clients:
            client.thread.join(5.0)
        for env in envs:
            env.close()
    errors = [client.error for client in clients if client.error is not None]
    if errors:
        raise RunStopped(str(errors[0]))
    return 0


def print_error(error: BaseException) -> None:
    """Print ``error`` as one red line on stderr."""
    console = Console(stderr=True, soft_wrap=True, highlight=False)
    message = " ".join(str(error).split()) or type(error).__name__
    console.print(Text(f"error: {message}", style="bold red"))


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    Overrides may come before or after the options (``vla-rl train --resume RUN trainer.total_steps=6``
    and ``vla-rl train TEMPLATE --resume ...`` parse alike).
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        target = "items" if hasattr(args, "items") else "overrides" if hasattr(args, "overrides") else None
        if target is None or any(item.startswith("-") for item in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        setattr(args, target, [*getattr(args, target), *extra])
    ray_before = _ray_running()
    try:
        return args.handler(args)
    except USER_ERRORS as error:
        _stop_ray_started_since(ray_before)
        print_error(error)
        return USER_ERROR_STATUS
    except RunStopped as error:  # a run that cannot go on, with a message that says why
        _stop_ray_started_since(ray_before)
        print_error(error)
        return RUN_STOPPED_STATUS
    except KeyboardInterrupt:  # Ctrl-C: the driver has already stopped the workers; no traceback
        stopped = _stop_ray_started_since(ray_before, timeout_s=CTRL_C_SHUTDOWN_S)
        print_error(RunStopped("interrupted (Ctrl-C)" if stopped else
                               f"interrupted (Ctrl-C); Ray did not shut down within {CTRL_C_SHUTDOWN_S:g} s, "
                               "leaving without it"))
        if not stopped:  # Ray's own exit hook would wait on it again: Ctrl-C must end the process
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(INTERRUPTED_STATUS)
        return INTERRUPTED_STATUS


CTRL_C_SHUTDOWN_S = 10.0
"""How long a Ctrl-C'd command waits for Ray to shut down before it leaves without it."""

def _ray_running() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _stop_ray_started_since(running_before: bool, timeout_s: float | None = None) -> bool:
    """Shut down the Ray instance this command started (never one it found running: a notebook's,
    a test session's) before the error line is printed: Ray prints its workers' output on the
    driver's console from a background thread until it shuts down, which otherwise comes after
    the error (at interpreter exit) and leaves it buried.

    Args:
        running_before: whether Ray was initialised before the command (then it is left alone).
        timeout_s: give up waiting after this long (the shutdown goes on in a daemon thread);
            None: wait for it.

    Returns:
        False if the shutdown did not finish within ``timeout_s``, else True.
    """
    if running_before or not _ray_running():
        return True
    if timeout_s is None:
        sys.modules["ray"].shutdown()
        return True
    import threading

    stopper = threading.Thread(target=sys.modules["ray"].shutdown, name="ray-shutdown", daemon=True)
    stopper.start()
    stopper.join(timeout_s)
    return not stopper.is_alive()


if __name__ == "__main__":
    sys.exit(main())
