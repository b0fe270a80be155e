"""SIGTERM handled as Ctrl-C is, in the ``vla-rl`` command.

A scheduler that preempts a job (Slurm, Kubernetes, ``kill``) sends SIGTERM. Python's default
ends the process at once: a run stopped while it starts up left its run directory behind
(which then neither resumes, having no checkpoint, nor lets the same ``run.name`` start again),
and its workers and Ray were not stopped. :func:`sigterm_as_interrupt` makes SIGTERM raise
:class:`~vla_rl.errors.Terminated`, a ``KeyboardInterrupt``, so that every path that handles
Ctrl-C handles it too. ``ray.init`` sets its own handler (``sys.exit(15)``), and an exception
raised at an arbitrary point of it can be swallowed (Python prints "Exception ignored" for one
raised in an at-fork hook, and the run went on as if no SIGTERM had come) or leave Ray half
started: :func:`interrupts_deferred` records a SIGTERM (or a Ctrl-C, whose exception does the
same) there and raises once ``ray.init`` is done (:func:`vla_rl.utils.ray_utils.init_ray` keeps
Ray from setting its handler; while ``ray.init`` connects the driver, about half a second, Ray's
C++ failure signal handler is SIGTERM's: it prints ``*** SIGTERM received`` and passes the signal on
to ours). A SIGTERM that
arrives while the driver waits in Ray (``ray.get``, ``ray.wait``: most of a run) reaches it as a
plain ``KeyboardInterrupt`` (Ray's ``check_signals`` turns the handler's exception into an
"interrupted" status and raises a new one): :func:`was_terminated` tells the two apart.

Python runs a signal handler at whatever line the main thread is on; its exception is swallowed
where none can propagate (a finalizer the garbage collector runs, an at-fork hook: Python prints
"Exception ignored"), and the command went on as if no SIGTERM had come.
:func:`raise_if_terminated` raises it again where the driver waits (the replies of its workers)
and when the command starts Ray.
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


def raise_if_terminated() -> None:
    """Raise :class:`~vla_rl.errors.Terminated` if a SIGTERM came within the current
    :func:`sigterm_as_interrupt` block, in its main thread: its own exception did not end the
    command (module docstring). Outside a block (or once it ended: the command handles the
    interrupt), nothing.

    Raises:
        Terminated: a SIGTERM came within the block.
    """
    if _received.is_set() and signal.getsignal(signal.SIGTERM) is _raise_terminated and \
            threading.current_thread() is threading.main_thread():
        raise Terminated()


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[bool]:
    """Within a :func:`sigterm_as_interrupt` block (its handler current, in the main thread), a
    SIGTERM or Ctrl-C (SIGINT, while Python's own handler is current) inside this block is only
    recorded, and raises when the block ends (from the block's own exception, if it raised one):
    :class:`~vla_rl.errors.Terminated` for a SIGTERM, else ``KeyboardInterrupt``. A second one
    raises at once (``ray.init`` waits up to 30 s for a node that does not start). The handlers
    come back after, whatever the block set. Yields whether it defers: elsewhere nothing changes.

    Raises:
        Terminated: a SIGTERM came within the block, or before it (:func:`raise_if_terminated`).
        KeyboardInterrupt: a Ctrl-C came within the block (and no SIGTERM).
    """
    if signal.getsignal(signal.SIGTERM) is not _raise_terminated or threading.current_thread() is not \
            threading.main_thread():
        yield False
        return
    raise_if_terminated()
    deferred = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        deferred.append(signal.SIGINT)
    received: list[int] = []

    def record(signum: int, frame: Any) -> None:
        received.append(signum)
        if signum == signal.SIGTERM:
            _received.set()
        if len(received) > 1:  # a second one: whoever sent it will not wait for the block to end
            raise _interrupt(received)

    previous = {signum: signal.signal(signum, record) for signum in deferred}
    try:
        yield True
    except BaseException as error:
        if received and not isinstance(error, KeyboardInterrupt):
            raise _interrupt(received) from error
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        raise _interrupt(received)


def _interrupt(received: list[int]) -> KeyboardInterrupt:
    return Terminated() if signal.SIGTERM in received else KeyboardInterrupt()
