"""SIGTERM handled as Ctrl-C is, in the ``vla-rl`` command.

A scheduler that preempts a job (Slurm, Kubernetes, ``kill``) sends SIGTERM. Python's default
ends the process at once: a run stopped while it starts up left its run directory behind
(which then neither resumes, having no checkpoint, nor lets the same ``run.name`` start again),
and its workers and Ray were not stopped. :func:`sigterm_as_interrupt` makes SIGTERM raise
:class:`~vla_rl.errors.Terminated`, a ``KeyboardInterrupt``, so that every path that handles
Ctrl-C handles it too. ``ray.init`` replaces the handler with its own (``sys.exit(15)``):
:func:`restore_after_ray_init` puts this one back. A SIGTERM that arrives while the driver waits in
Ray (``ray.get``, ``ray.wait``: most of a run) reaches it as a plain ``KeyboardInterrupt`` (Ray's
``check_signals`` turns the handler's exception into an "interrupted" status and raises a new one):
:func:`was_terminated` tells the two apart.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from vla_rl.errors import Terminated

#: Whether SIGTERM arrived within the current :func:`sigterm_as_interrupt` block.
_received = threading.Event()


def _raise_terminated(signum: int, frame: Any) -> None:
    _received.set()
    raise Terminated()


def was_terminated(interrupt: KeyboardInterrupt) -> bool:
    """Whether ``interrupt`` comes from SIGTERM: a :class:`~vla_rl.errors.Terminated`, or the plain
    ``KeyboardInterrupt`` Ray raised in its place (module docstring) after a SIGTERM within the
    current :func:`sigterm_as_interrupt` block."""
    return isinstance(interrupt, Terminated) or _received.is_set()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`~vla_rl.errors.Terminated` (in the main thread;
    elsewhere nothing changes: only it may set handlers); the previous handler comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def sigterm_handler() -> Any:
    """SIGTERM's current handler (to give :func:`restore_after_ray_init`)."""
    return signal.getsignal(signal.SIGTERM)


def restore_after_ray_init(before: Any) -> None:
    """Put :func:`sigterm_as_interrupt`'s handler back if it was ``before`` ``ray.init`` (which
    sets its own); any other handler is left as Ray set it."""
    if before is _raise_terminated and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)
