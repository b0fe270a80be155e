"""Errors that end a run with a message instead of a traceback.

A worker raises :class:`RunStopped` when the run cannot go on and it can say why and what to do
(a diverged update, a worker that cannot be restarted); the driver re-raises it as is from the
Ray error that carries it, and the command line prints its message in one line (exit 1).
"""

from __future__ import annotations


class RunStopped(RuntimeError):
    """The run stopped; the message says why and what to do."""


class CommandLineError(ValueError):
    """Arguments that do not make a command (reported in one line, exit 2)."""


class Terminated(KeyboardInterrupt):
    """The command received SIGTERM (a scheduler's preemption, ``kill``): handled as Ctrl-C is
    (:mod:`vla_rl.utils.signals`), reported in one line, exit status 143 (128 + 15)."""
