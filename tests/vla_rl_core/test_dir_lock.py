"""The directory lock: one holder, named by its pid to the others; a test of the lock changes nothing."""

from __future__ import annotations

import os

import pytest

from vla_rl_core.dir_lock import DirectoryInUse, directory_in_use, lock_directory, unlock_directory


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
