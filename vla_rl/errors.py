"""Errors that end a command with a message instead of a traceback: :class:`RunStopped` (defined
on the ground floor, :mod:`vla_rl_core.errors`, so that simulators and policies raise it too),
:class:`ResumeRefused`, :class:`CommandLineError` and :class:`Terminated`.
"""

from __future__ import annotations

from vla_rl_core.errors import RunStopped

__all__ = ["CommandLineError", "ResumeRefused", "RunStopped", "Terminated"]


class ResumeRefused(RunStopped):
    """A resume whose run has no checkpoint that verifies, found by the workers as they hash its
    files (the driver's check before Ray compares sizes only): reported as that check reports its
    refusals, in one line with exit status 2, not as a worker's traceback."""


class CommandLineError(ValueError):
    """Arguments that do not make a command (reported in one line, exit 2)."""


class Terminated(KeyboardInterrupt):
    """The command received SIGTERM (a scheduler's preemption, ``kill``): handled as Ctrl-C is
    (:mod:`vla_rl.utils.signals`), reported in one line, exit status 143 (128 + 15)."""
