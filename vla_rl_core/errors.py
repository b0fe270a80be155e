"""The error that ends a run with a message instead of a traceback, raised on any floor.

A worker, a policy or a simulator raises :class:`RunStopped` when the run cannot go on and it can
say why and what to do (a diverged update, a worker that cannot be restarted, no remote
environment connected); the driver re-raises it as is from the Ray errors that carry it (a
simulator actor's through its DAG worker's), and the command line prints its message in one line
(exit 1). The engine imports it from :mod:`vla_rl.errors`.
"""

from __future__ import annotations


class RunStopped(RuntimeError):
    """The run stopped; the message says why and what to do."""
