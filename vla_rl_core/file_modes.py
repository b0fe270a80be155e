"""Where the project may write, and the permissions of what it writes: those ``open()`` and
``mkdir()`` give under the process's umask (``0o666 & ~umask`` for a file, ``0o777 & ~umask`` for a directory: 0644 and
0755 under the usual umask 022).

Two writers do otherwise. safetensors (0.8.0, the version CI installs) writes every file
through a temporary file that it renames into place, and the temporary file is created 0600
whatever the umask (safetensors PR #764; issue #782, still open); transformers'
``save_pretrained`` writes its weights through safetensors. ``tempfile.mkdtemp`` creates its directory 0700. A
checkpoint or an export would then be readable by the user who wrote it alone, beside a
``config.json`` everyone can read: ``vla-rl serve`` or vLLM run as another user, a container's
non-root user, or a teammate on shared storage fail with "Permission denied".
:func:`apply_default_modes` gives a written file or tree the modes the umask allows.

:func:`write_text_atomically` writes a text file that is never seen half-written.

:func:`uncreatable` says, without writing, why a command's output path cannot be created, so that
the command refuses it before its long work (loading a policy, replaying episodes) and not after.

Standard library only (shared by ``policies/``' exports and ``vla_rl``'s checkpoints).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: What ``open()`` and ``mkdir()`` ask of the kernel before the umask is applied.
FILE_MODE = 0o666
DIRECTORY_MODE = 0o777


def umask() -> int:
    """The process's umask, read without changing it (``/proc/self/status`` on Linux 4.7+);
    elsewhere set and restored at once (``os.umask`` has no read-only form before Python 3.14)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_mode(is_directory: bool) -> int:
    """The permission bits ``mkdir()`` (``is_directory``) or ``open()`` gives a new entry here."""
    return (DIRECTORY_MODE if is_directory else FILE_MODE) & ~umask()


def apply_default_modes(path: str | Path) -> None:
    """Give ``path`` and, if it is a directory, every file and directory under it the permission
    bits ``open()`` / ``mkdir()`` would have given them under the process's umask.

    Symbolic links are neither changed nor followed; entries owned by another user (which only
    their owner may change) are left as they are.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(path)
    file_mode, directory_mode = default_mode(False), default_mode(True)
    owner = os.geteuid() if hasattr(os, "geteuid") else None
    entries = [path]
    if path.is_dir() and not path.is_symlink():
        for directory, subdirectories, files in os.walk(path):
            entries.extend(Path(directory) / name for name in (*subdirectories, *files))
    for entry in entries:
        info = entry.lstat()
        if stat.S_ISLNK(info.st_mode) or (owner is not None and info.st_uid != owner):
            continue
        mode = directory_mode if stat.S_ISDIR(info.st_mode) else file_mode
        if stat.S_IMODE(info.st_mode) != mode:
            os.chmod(entry, mode)


def uncreatable(path: str | Path) -> str | None:
    """Why a new file or directory ``path`` could not be created, found without writing: its
    nearest existing ancestor is not a directory (a file on the way) or grants no write and search
    permission; None when nothing is in the way (``path`` itself existing is the caller's
    concern).

    What only the write can tell (a full disk, a read-only mount, a pseudo file system such as
    ``/proc``) is not found here: the write fails then.
    """
    ancestor = Path(os.path.abspath(path)).parent
    while not ancestor.exists() and not ancestor.is_symlink() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is {'a broken symbolic link' if not ancestor.exists() else 'not a directory'}"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"no permission to create entries in {ancestor}"
    return None


def write_text_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through ``<path>.tmp`` renamed into place (``os.replace``): a
    reader (a resume, ``vla-rl compare``, a dashboard) sees the old file or the new one, never a
    half-written one; an interrupted write leaves the old file. The parent directory must exist.

    Raises:
        OSError: the file cannot be written.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
