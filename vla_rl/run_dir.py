"""Run directories owned by one run at a time.

A new run gets a directory of its own under ``run.output_dir``: an explicit ``run.name`` that
already exists is refused (continue it with ``--resume``), and default names
(``<template>_<YYYYmmdd_HHMMSS>``) get a numeric suffix when two runs start in the same second.
While a run (or a resume) uses a directory, it holds an exclusive ``flock`` on ``<run>/.lock``,
whose text is the owner's pid: a second process is refused with that pid, and the lock goes away
with its process, however it ends.

The run's ``template.yaml`` is written once, when the run starts. A resume never rewrites it: its
overrides are validated first, then appended to ``resumes.jsonl`` (one JSON record per resume), and
the effective template of a resumed run is ``template.yaml`` with every recorded resume's overrides
applied in order.

Paths are absolute before they reach the workers: a run directory's path is made absolute when
it is opened, and the input paths a run reads (:data:`INPUT_PATH_FIELDS`) reach the workers as
absolute overrides (:func:`absolute_path_overrides`). On a cluster started with ``ray start`` the
workers' working directory is where ``ray start`` ran, not the driver's.
"""

from __future__ import annotations

import fcntl
import json
import os
from datetime import datetime
from pathlib import Path

import yaml

from vla_rl.dag.errors import TemplateError
from vla_rl.evaluation.targets import RUN_TEMPLATE as RESOLVED_TEMPLATE

RESUMES_FILE = "resumes.jsonl"
LOCK_FILE = ".lock"

INPUT_PATH_FIELDS = ("warm_start.demo_store", "text.model_path", "text.train_file", "text.test_file",
                     "policy.config.model_path")
"""The settings that name a file or directory the workers read (or create, for demonstrations)."""


class RunDirError(TemplateError):
    """A run directory that cannot be used (exists, is not a run, or is in use); names it."""


class RunDirectory:
    """An open run directory and the lock its owner holds (release it with :meth:`close`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = absolute(path)
        self._lock = None

    # ------------------------------------------------------------------ opening
    @classmethod
    def create(cls, output_dir: str | Path, name: str | None, template_name: str) -> RunDirectory:
        """Create a new run directory and lock it.

        Args:
            output_dir: the parent directory (``run.output_dir``).
            name: ``run.name``; None: ``<template_name>_<timestamp>``, made unique with ``_2``, ``_3``...

        Raises:
            RunDirError: ``name`` names an existing directory.
        """
        parent = Path(output_dir)
        parent.mkdir(parents=True, exist_ok=True)
        if name is not None:
            path = parent / name
            try:
                path.mkdir()
            except FileExistsError:
                raise RunDirError(f"run directory {path} already exists: continue it with `vla-rl train --resume "
                                  f"{path}`, or choose another run.name", field="run.name") from None
        else:
            stem = f"{template_name}_{datetime.now():%Y%m%d_%H%M%S}"
            for suffix in ("", *(f"_{i}" for i in range(2, 1000))):
                path = parent / f"{stem}{suffix}"
                try:
                    path.mkdir()
                    break
                except FileExistsError:
                    continue
        run = cls(path)
        run.lock()
        return run

    @classmethod
    def reopen(cls, path: str | Path) -> RunDirectory:
        """An existing run directory (``--resume``), not yet locked.

        Raises:
            RunDirError: ``path`` is not a run directory (no ``template.yaml``).
        """
        path = Path(path)
        if not (path / RESOLVED_TEMPLATE).is_file():
            raise RunDirError(f"{path} is not a run directory: it has no {RESOLVED_TEMPLATE}")
        return cls(path)

    def lock(self) -> None:
        """Take the directory's exclusive lock (its text becomes this process's pid).

        Raises:
            RunDirError: another process holds it (naming its pid).
        """
        handle = open(self.path / LOCK_FILE, "a+")  # noqa: SIM115  (held until close)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "unknown"
            handle.close()
            raise RunDirError(f"run directory {self.path} is in use by another process (pid {owner}); wait for it "
                              "to end or stop it") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._lock = handle

    def close(self) -> None:
        """Release the lock."""
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    # ------------------------------------------------------------------ contents
    @property
    def template_path(self) -> Path:
        return self.path / RESOLVED_TEMPLATE

    def write_template(self, resolved: dict) -> None:
        """Write the run's resolved template (once, when the run starts), atomically."""
        _write_atomic(self.template_path, yaml.safe_dump(resolved, sort_keys=False))

    def recorded_overrides(self) -> list[str]:
        """The overrides of every earlier resume, in order."""
        path = self.path / RESUMES_FILE
        if not path.exists():
            return []
        return [item for line in path.read_text().splitlines() if line.strip()
                for item in json.loads(line)["overrides"]]

    def record_resume(self, overrides: list[str]) -> None:
        """Append a resume's overrides to ``resumes.jsonl`` (rewritten atomically)."""
        path = self.path / RESUMES_FILE
        previous = path.read_text() if path.exists() else ""
        record = {"time": datetime.now().isoformat(timespec="seconds"), "overrides": list(overrides)}
        _write_atomic(path, previous + json.dumps(record) + "\n")


def absolute(path: str | Path) -> Path:
    """``path`` made absolute against the working directory, ``..`` folded, symbolic links kept
    (a shared filesystem may be reached through a link of the same name on every node)."""
    return Path(os.path.abspath(os.path.expanduser(path)))


def absolute_path_overrides(config) -> list[str]:
    """Overrides that give the workers the run's relative (or ``~``) input paths
    (:data:`INPUT_PATH_FIELDS`) as absolute ones, resolved against the driver's working directory
    and home; empty if all are absolute.

    Args:
        config: the run's effective config (``RunConfig``).
    """
    overrides = []
    for field in INPUT_PATH_FIELDS:
        value = _field_value(config, field)
        if isinstance(value, str) and value and str(absolute(value)) != value:
            quoted = json.dumps(str(absolute(value)), ensure_ascii=False)  # any character survives the override
            overrides.append(f"{field}={quoted}")
    return overrides


def _field_value(config, field: str):
    """The value of a dotted setting of ``config`` (None when unset); ``policy.config`` is a mapping."""
    value = config
    for part in field.split("."):
        value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
        if value is None:
            return None
    return value


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
