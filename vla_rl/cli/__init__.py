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

Each subcommand is an ``add_<name>_command(commands)`` function of its module in this package
(``plan``, ``train``, ``evaluate``, ``export``, ``serve``) that adds its subparser and sets
``handler`` (a function ``args -> exit status``). A problem with the user's input (a template,
an override, a registry name) is printed as one red line on stderr and exits with status 2;
importing this module imports no Ray, simulator or model code.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
from typing import NoReturn

from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from vla_rl.cli.evaluate import add_compare_command, add_eval_command
from vla_rl.cli.export import add_export_command, add_export_episodes_command
from vla_rl.cli.plan import add_plan_command
from vla_rl.cli.serve import add_remote_env_command, add_serve_command
from vla_rl.cli.train import add_train_command
from vla_rl.dag.errors import TemplateError
from vla_rl.errors import CommandLineError, ResumeRefused, RunStopped, file_system_error
from vla_rl.evaluation.targets import EvalInputError
from vla_rl.export import ExportError
from vla_rl.export_episodes import EpisodesExportError
from vla_rl.serving import ServeError
from vla_rl.utils.signals import sigterm_as_interrupt, was_terminated
from vla_rl_core.registry import RegistryError

USER_ERRORS: tuple[type[Exception], ...] = (TemplateError, ValidationError, RegistryError, EvalInputError,
                                            ExportError, EpisodesExportError, ServeError,
                                            CommandLineError, ResumeRefused)
"""Errors caused by the user's input: reported in one line, exit status 2, no traceback."""

USER_ERROR_STATUS = 2
RUN_STOPPED_STATUS = 1
#: Exit status after Ctrl-C (the shell's 128 + SIGINT).
INTERRUPTED_STATUS = 130
#: Exit status after SIGTERM (128 + SIGTERM).
TERMINATED_STATUS = 143


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="vla-rl", description="RL post-training of VLA policies on a multi-controller DAG engine."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_plan_command(commands)
    add_train_command(commands)
    add_compare_command(commands)
    add_eval_command(commands)
    add_export_command(commands)
    add_export_episodes_command(commands)
    add_serve_command(commands)
    add_remote_env_command(commands)
    for command in commands.choices.values():  # a command's own usage line for its own errors
        command.set_defaults(command_parser=command)
    return parser


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
            args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
        setattr(args, target, [*getattr(args, target), *extra])
    ray_before = _ray_running()
    try:
        with sigterm_as_interrupt():
            return args.handler(args)
    except USER_ERRORS as error:
        _stop_ray_started_since(ray_before)
        print_error(error)
        return USER_ERROR_STATUS
    except RunStopped as error:  # a run that cannot go on, with a message that says why
        _stop_ray_started_since(ray_before)
        print_error(error)
        return RUN_STOPPED_STATUS
    except OSError as error:  # the file system refused the driver a write (a full disk): not a bug to trace
        reason = file_system_error(error)
        if reason is None:
            raise
        _stop_ray_started_since(ray_before)
        file = f" ({error.filename})" if getattr(error, "filename", None) else ""
        print_error(RunStopped(f"the file system refused a write: {reason}{file}; free space or fix the file system, "
                               "then run the command again (a training run: vla-rl train --resume RUN_DIR "
                               "continues from its last checkpoint)"))
        return RUN_STOPPED_STATUS
    except KeyboardInterrupt as interrupt:  # Ctrl-C or SIGTERM: the driver has already stopped the workers
        what, status = (("terminated (SIGTERM)", TERMINATED_STATUS) if was_terminated(interrupt)
                        else ("interrupted (Ctrl-C)", INTERRUPTED_STATUS))
        stopped = _stop_ray_started_since(ray_before, timeout_s=CTRL_C_SHUTDOWN_S)
        print_error(RunStopped(what if stopped else
                               f"{what}; Ray did not shut down within {CTRL_C_SHUTDOWN_S:g} s, leaving without it"))
        if not stopped:  # Ray's own exit hook would wait on it again: the process must end
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        return status


def run(argv: list[str] | None = None) -> NoReturn:
    """The ``vla-rl`` console script (and ``python -m vla_rl.cli``): :func:`main`, then exit with
    its status. After Ctrl-C or SIGTERM the process leaves once its exit hooks have run (``atexit``:
    Ray's, logging's, temporary directories'), without the interpreter's last garbage collection:
    after a Ray start that was interrupted, that collection can crash in Ray's objects (a
    segmentation fault, or an abort under Ray's failure signal handler: exit status 139 or 134
    after the error line, where a scheduler expects 130 or 143)."""
    status = main(argv)
    if status in (INTERRUPTED_STATUS, TERMINATED_STATUS):
        atexit._run_exitfuncs()  # what a normal exit runs first (CPython's own, undocumented)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


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

