"""The exclusive lock a command holds on the directory it writes (a training run's, an
evaluation's): ``<dir>/.lock`` (:data:`~vla_rl_core.run_layout.LOCK_FILE`), ``flock``-ed, its
text the holder's pid while held and empty once let go. A second writer is refused naming the
first's pid; a reader tests the lock without taking it.

And a reader's hold on a directory another process may remove (an evaluation's on the training
checkpoints it reads, which ``trainer.keep_last`` prunes): a shared ``flock`` of the directory
itself (:func:`hold_directory`), nothing written into it (a read-only run is held too); the remover
takes it exclusively, without waiting, before it renames the directory away
(:func:`take_for_removal`), and leaves a held one in place. Where the file system has no
``flock`` (some network file systems) a hold keeps nothing.
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


def hold_directory(path: str | Path) -> int:
    """Hold ``path`` against removal by :func:`take_for_removal` until :func:`release_directory`
    (a shared ``flock`` of the directory; waits while a remover holds it).

    Returns:
        The held directory's file descriptor.

    Raises:
        FileNotFoundError: ``path`` is gone, or was renamed away while the hold was taken.
        OSError: it cannot be opened (not a directory, no permission).
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:  # no flock on this file system (ENOLCK): held as far as it can be, not at all
        pass
    held = os.fstat(fd)
    try:
        now = os.stat(path)
    except FileNotFoundError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
        os.close(fd)
        raise FileNotFoundError(f"{path} is gone")
    return fd


def release_directory(fd: int) -> None:
    """Let go of a :func:`hold_directory` hold."""
    os.close(fd)


def take_for_removal(path: str | Path) -> int | None:
    """Take ``path`` exclusively, without waiting, to rename it away: the directory's file
    descriptor (close it once the directory is renamed), or None when a reader holds it
    (:func:`hold_directory`): leave it in place.

    Raises:
        OSError: it cannot be opened (gone, not a directory).
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:  # no flock on this file system: no reader can hold it
        pass
    return fd
