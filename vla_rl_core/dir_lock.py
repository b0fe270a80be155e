"""The exclusive lock a command holds on the directory it writes (a training run's, an
evaluation's): ``<dir>/.lock`` (:data:`~vla_rl_core.run_layout.LOCK_FILE`), ``flock``-ed, its
text the holder's pid while held and empty once let go. A second writer is refused naming the
first's pid; a reader tests the lock without taking it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import TextIO

from vla_rl_core.run_layout import LOCK_FILE


class DirectoryInUse(Exception):
    """Another process holds the directory's lock.

    Attributes:
        pid: what its lock file says (``unknown`` when empty).
    """

    def __init__(self, path: Path, pid: str) -> None:
        super().__init__(f"{path} is in use by another process (pid {pid})")
        self.path, self.pid = path, pid


def lock_directory(path: str | Path) -> TextIO:
    """Take ``path``'s exclusive lock, writing this process's pid into it; hold the returned
    handle until :func:`unlock_directory`.

    Raises:
        DirectoryInUse: another process holds it.
        OSError: the lock file cannot be opened for writing (a read-only file system).
    """
    handle = open(Path(path) / LOCK_FILE, "a+")  # noqa: SIM115  (held until unlock_directory)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "unknown"
        handle.close()
        raise DirectoryInUse(Path(path), owner) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def unlock_directory(handle: TextIO) -> None:
    """Let go of a :func:`lock_directory` lock, emptied first (a finished command's lock file names
    no process)."""
    handle.seek(0)
    handle.truncate()
    handle.flush()
    fcntl.flock(handle, fcntl.LOCK_UN)
    handle.close()


def directory_in_use(path: str | Path) -> str | None:
    """The pid holding ``path``'s lock, or None when none does; changes nothing (the lock is tested
    shared and let go at once; a directory without a lock file was never locked)."""
    try:
        handle = open(Path(path) / LOCK_FILE)  # noqa: SIM115
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "unknown"
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None
