"""The directory lock: one holder, named by its pid to the others; a test of the lock changes nothing. A
reader's hold on a directory: it is not taken for removal while held."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vla_rl_core import dir_lock
from vla_rl_core.dir_lock import (
    DirectoryInUse,
    directory_in_use,
    hold_directory,
    lock_directory,
    release_directory,
    take_for_removal,
    unlock_directory,
)


def test_one_holder_named_to_the_others(tmp_path):
    assert directory_in_use(tmp_path) is None and not (tmp_path / ".lock").exists()  # never locked: nothing written
    handle = lock_directory(tmp_path)
    assert (tmp_path / ".lock").read_text() == str(os.getpid())
    assert directory_in_use(tmp_path) == str(os.getpid())  # another open file: flock refuses it, in-process too
    with pytest.raises(DirectoryInUse, match=rf"in use by another process \(pid {os.getpid()}\)") as err:
        lock_directory(tmp_path)
    assert err.value.pid == str(os.getpid())
    assert directory_in_use(tmp_path) == str(os.getpid())  # the refused attempt took nothing
    unlock_directory(handle)
    assert (tmp_path / ".lock").read_text() == "" and directory_in_use(tmp_path) is None
    unlock_directory(lock_directory(tmp_path))


def test_a_held_directory_is_not_taken_for_removal_until_released(tmp_path):
    held = tmp_path / "step_1"
    held.mkdir()
    reader = subprocess.Popen([sys.executable, "-c", "import sys; from vla_rl_core.dir_lock import hold_directory; "
                               f"hold_directory({str(held)!r}); print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "held"
        assert take_for_removal(held) is None  # another process reads it
        own = hold_directory(held)  # readers share it
        assert take_for_removal(held) is None
        release_directory(own)
        assert take_for_removal(held) is None  # the other reader still holds it
    finally:
        reader.communicate("", timeout=30)  # exits: its hold goes with it
    fd = take_for_removal(held)
    assert fd is not None
    release_directory(fd)


def test_a_hold_of_a_directory_gone_or_renamed_away_as_it_is_taken_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "step_1"
    with pytest.raises(FileNotFoundError):
        hold_directory(path)
    path.mkdir()
    flock = dir_lock.fcntl.flock

    def removed_meanwhile(fd, operation):  # a prune renames it between the hold's open and its lock
        os.replace(path, tmp_path / f".step_1.{fd}.deleting")
        if replaced:  # and a resumed run writes that step again
            path.mkdir()
        flock(fd, operation)

    monkeypatch.setattr(dir_lock.fcntl, "flock", removed_meanwhile)
    for replaced in (False, True):
        with pytest.raises(FileNotFoundError, match="step_1 is gone"):
            hold_directory(path)
        path.mkdir(exist_ok=True)
    monkeypatch.undo()
    fd = hold_directory(path)  # the directory of that name now: held
    assert take_for_removal(path) is None
    release_directory(fd)


def test_a_stale_pid_left_in_the_lock_file_is_replaced_not_appended_to(tmp_path):
    (tmp_path / ".lock").write_text("999999999")  # a holder killed before it could empty the file
    handle = lock_directory(tmp_path)
    assert (tmp_path / ".lock").read_text() == str(os.getpid())
    unlock_directory(handle)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts this process's open files in /proc")
def test_a_refused_take_for_removal_leaves_no_file_open(tmp_path):
    held = hold_directory(tmp_path)
    open_before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        assert take_for_removal(tmp_path) is None
    assert len(os.listdir("/proc/self/fd")) == open_before
    release_directory(held)
