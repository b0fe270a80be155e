"""Errors that end a command with a message instead of a traceback: :class:`RunStopped` (defined
on the ground floor, :mod:`vla_rl_core.errors`, so that simulators and policies raise it too),
:class:`ResumeRefused`, :class:`CommandLineError` and :class:`Terminated`; and
:func:`out_of_memory_message` and :func:`file_system_error`, which tell an out-of-memory error and
a file system's refusal (a full disk) from the others.
"""

from __future__ import annotations

import errno
import re

from vla_rl_core.errors import RunStopped

__all__ = ["CommandLineError", "ResumeRefused", "RunStopped", "Terminated", "file_system_error",
           "out_of_memory_message"]


class ResumeRefused(RunStopped):
    """A resume whose run has no checkpoint that verifies, found by the workers as they hash its
    files (the driver's check before Ray compares sizes only): reported as that check reports its
    refusals, in one line with exit status 2, not as a worker's traceback."""


class CommandLineError(ValueError):
    """Arguments that do not make a command (reported in one line, exit 2)."""


class Terminated(KeyboardInterrupt):
    """The command received SIGTERM (a scheduler's preemption, ``kill``): handled as Ctrl-C is
    (:mod:`vla_rl.utils.signals`), reported in one line, exit status 143 (128 + 15)."""


_ALLOCATOR_PREFIX = re.compile(r"^\[enforce fail at [^\]]*\]\s*(err == 0\.\s*)?")
"""What torch's CPU allocator puts before its message (``[enforce fail at alloc_cpu.cpp:127] err == 0.``)."""


def out_of_memory_message(error: BaseException) -> str | None:
    """The first line of ``error``'s message when it says that a device ran out of memory, else None.

    Out of memory is Python's ``MemoryError``, ``torch.OutOfMemoryError`` (CUDA's "CUDA out of
    memory. Tried to allocate ..."; a ``RuntimeError``, as Ascend's "NPU out of memory" and MPS's
    "MPS backend out of memory") and torch's CPU allocator failing ("DefaultCPUAllocator: can't
    allocate memory: you tried to allocate N bytes"), whose source-location prefix is left out.
    The test is on the message, so that it also holds for an error that crossed a process
    boundary (Ray re-raises a worker's exception in the driver).
    """
    if not isinstance(error, (MemoryError, RuntimeError)):
        return None
    lines = str(error).strip().splitlines()
    first = _ALLOCATOR_PREFIX.sub("", lines[0]) if lines else ""
    if isinstance(error, MemoryError):
        return first or "MemoryError"  # MemoryError() has no message
    if "out of memory" in first or "can't allocate memory" in first:
        return first
    return None


#: safetensors' (Rust) ``I/O error: No space left on device (os error 28)``, and an ``OSError``
#: quoted in another error's text (torch.distributed.checkpoint's ``CheckpointException`` lists
#: each rank's failure): ``[Errno 28] No space left on device``; group 1 the errno, 2 the reason.
_QUOTED_OS_ERRORS = (re.compile(r"I/O error: (?P<reason>.+?) \(os error (?P<errno>\d+)\)"),
                     re.compile(r"\[Errno (?P<errno>\d+)\] (?P<reason>[^:'\"\n]+)"))
#: What a file system refuses a write with: full, over quota, read-only, no permission, an I/O
#: error, a file too large (not a timeout or a connection's error, also OSErrors).
_FILE_SYSTEM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO,
                                 errno.EFBIG})


def file_system_error(error: BaseException | None) -> str | None:
    """Why the file system refused a write, when that is what ``error`` (or an error it was raised
    from, ``__cause__``) is: an ``OSError`` of :data:`_FILE_SYSTEM_ERRNOS` (``No space left on
    device``, ``Read-only file system``, ...; a timeout's or a connection's errno is not), or one
    quoted in its text (:data:`_QUOTED_OS_ERRORS`); else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _FILE_SYSTEM_ERRNOS:
            return error.strerror or str(error)
        for pattern in _QUOTED_OS_ERRORS:
            match = pattern.search(str(error))
            if match is not None and int(match.group("errno")) in _FILE_SYSTEM_ERRNOS:
                return match.group("reason").strip()
        error = error.__cause__
    return None
