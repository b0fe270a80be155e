"""``vla-rl train``: one run of a template, a resumed run, or a seed sweep (``--seeds``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from vla_rl.cli.arguments import one_template, shipped_templates, split_overrides
from vla_rl.errors import CommandLineError


def add_train_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "train",
        help="run a training workflow (Ray on loopback, one DAG worker per device slot)",
        description="Run a template's workflow. Writes a run directory with the resolved template, "
        "metrics (JSONL, tensorboard), checkpoints, a success plot, evaluation videos and a summary.",
        epilog=shipped_templates(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("items", nargs="*", metavar="TEMPLATE|KEY=VALUE",
                        help="the template (a file, or a name in dag_templates/), then dotted overrides (KEY=VALUE, "
                        "or ~KEY to delete a setting so that its default applies); with --resume only the "
                        "overrides (the run's own template is used)")
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
    parser.set_defaults(handler=run_train)


def run_train(args: argparse.Namespace) -> int:
    from vla_rl.driver import train

    names, overrides = split_overrides(args.items)
    from vla_rl.sweep import is_sweep

    if args.seeds is not None or (args.resume and is_sweep(args.resume)):
        return run_seed_sweep(args, names, overrides)
    if args.resume:
        from vla_rl.run_dir import RunDirectory

        RunDirectory.reopen(args.resume)  # a missing directory or template.yaml first, named
        own = run_template_name(args.resume)  # None: an unreadable template.yaml, which train names
        extra = names[1:] if own is None else [name for name in names if name != own]
        if extra:
            raise CommandLineError(f"with --resume the run's own template is used: remove {extra[0]!r} (overrides "
                                   "such as trainer.total_steps=40 apply on top of it)")
        train(None, overrides, resume=args.resume)
        return 0
    train(one_template(names, "name one template (a file, or a name in dag_templates/) before the overrides, or "
                              "continue a run with --resume RUN_DIR"), overrides)
    return 0


def run_seed_sweep(args: argparse.Namespace, names: list[str], overrides: list[str]) -> int:
    from vla_rl.sweep import is_sweep, parse_seeds, resume_sweep, run_sweep
    from vla_rl.utils.console import driver_console

    if args.resume:
        if args.seeds is not None:
            if not is_sweep(args.resume):
                raise CommandLineError(f"--seeds with --resume: {args.resume} is one run, not a sweep (no sweep.json); "
                                       "resume it without --seeds, or start a sweep with --seeds and a template")
            raise CommandLineError(f"{args.resume} is a sweep: --resume continues it with its own seeds; remove "
                                   "--seeds")
        if names or overrides:
            raise CommandLineError(f"--resume of the sweep {args.resume} takes no template or override (got "
                                   f"{(names + overrides)[0]!r}); resume one of its runs for that: --resume "
                                   f"{args.resume}/seed_<S>")
        resume_sweep(args.resume, console=driver_console())
        return 0
    seeds = parse_seeds(args.seeds)
    run_sweep(one_template(names, "name one template before the overrides"), overrides, seeds,
              console=driver_console())
    return 0


def run_template_name(run_dir: str) -> str | None:
    """The template name a run directory was trained with (None if it has no readable template)."""
    import yaml

    from vla_rl_core.run_layout import RUN_TEMPLATE

    try:
        return yaml.safe_load((Path(run_dir) / RUN_TEMPLATE).read_text()).get("name")
    except (OSError, yaml.YAMLError, AttributeError):
        return None
