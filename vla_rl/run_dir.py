"""Run directories owned by one run at a time.

A new run gets a directory of its own under ``run.output_dir``: an explicit ``run.name`` that
already exists is refused (continue it with ``--resume``), and default names
(``<template>_<YYYYmmdd_HHMMSS>``) get a numeric suffix when two runs start in the same second.
While a run (or a resume) uses a directory, it holds an exclusive ``flock`` on ``<run>/.lock``,
whose text is the owner's pid: a second process is refused with that pid, and the lock goes away
with its process, however it ends.

The run's ``template.yaml`` is written once, when the run starts. A resume never rewrites it: its
overrides are validated first (:func:`check_resume` holds them against the run's newest checkpoint
before Ray starts), then appended to ``resumes.jsonl`` (one JSON record per resume) once the workers
have loaded the checkpoint with them, and the effective template of a resumed run is
``template.yaml`` with every recorded resume's overrides applied in order. A start that fails
before the run wrote a metric or a checkpoint leaves no directory (:meth:`RunDirectory.remove`), so
the same command can be run again.

Paths are absolute before they reach the workers: a run directory's path is made absolute when
it is opened, and the input paths a run reads (:data:`INPUT_PATH_FIELDS`) reach the workers as
absolute overrides (:func:`absolute_path_overrides`). On a cluster started with ``ray start`` the
workers' working directory is where ``ray start`` ran, not the driver's.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
from datetime import datetime
from pathlib import Path

import yaml

from vla_rl.dag.errors import TemplateError
from vla_rl_core.dir_lock import DirectoryInUse, directory_in_use, lock_directory, unlock_directory
from vla_rl_core.file_modes import write_text_atomically
from vla_rl_core.run_layout import (
    CHECKPOINTS_DIR,
    HOSTS_FILE,
    LOCK_FILE,
    METRICS_FILE,
    RESUMES_FILE,
    RUN_TEMPLATE,
    SUMMARY_FILE,
)

POLICY_SETTINGS = ("policy", "text", "simulator", "run.workflow")
"""The settings whose override may change the policy a resume builds (its tensor names and shapes):
a resume that overrides one is checked against the checkpoint's tensors (:func:`check_resume`)."""

INPUT_PATH_FIELDS = ("warm_start.demo_store", "warm_start.dataset", "text.model_path", "text.train_file",
                     "text.test_file", "policy.config.model_path", "policy.config.tokenizer_path")
"""The settings that name a file or directory the workers read (or create, for demonstrations)."""


class RunDirError(TemplateError):
    """A run directory that cannot be used (exists, is not a run, or is in use); names it."""


#: Errors of making a run directory that are the parent's (``run.output_dir``), not the name's.
_PARENT_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})


def _unwritable(parent: Path, path: Path, err: OSError) -> RunDirError:
    """The error of a run directory ``path`` that ``parent`` (``run.output_dir``) refused."""
    return RunDirError(f"run.output_dir {parent}: the run directory {path.name} cannot be made there: "
                       f"{err.strerror or err}", field="run.output_dir")


def _refuse_if_in_use(path: Path, field: str | None = None) -> None:
    """Refuse a run directory whose lock another process holds (a run going on there), naming its
    pid; changes nothing (:func:`~vla_rl_core.dir_lock.directory_in_use`).

    Raises:
        RunDirError: the directory is in use.
    """
    if (owner := directory_in_use(path)) is not None:
        raise RunDirError(f"run directory {path} is in use by another process (pid {owner}): a run is going on "
                          "there; wait for it to end or stop it", field=field)


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
            RunDirError: ``name`` names an existing directory, or ``output_dir`` or ``name`` a path
                that cannot be made (a file on the way, no permission), naming the field.
        """
        parent = Path(output_dir)
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # a file where a directory goes, no permission, ...
            raise RunDirError(f"run.output_dir {parent} cannot be made a directory: {err.strerror or err}",
                              field="run.output_dir") from None
        if name is not None:
            path = parent / name
            try:
                path.mkdir()
            except FileExistsError:
                from vla_rl.checkpoints.files import complete_checkpoints

                _refuse_if_in_use(path, field="run.name")
                if (path / RUN_TEMPLATE).is_file() and not complete_checkpoints(path / CHECKPOINTS_DIR):
                    raise RunDirError(f"run directory {path} already exists and holds no checkpoint to resume from: "
                                      "remove it to start the run again under this name, or choose another "
                                      "run.name", field="run.name") from None
                raise RunDirError(f"run directory {path} already exists: continue it with `vla-rl train --resume "
                                  f"{path}`, or choose another run.name", field="run.name") from None
            except OSError as err:
                if err.errno in _PARENT_ERRNOS:  # the directory refuses any new entry: not the name's fault
                    raise _unwritable(parent, path, err) from None
                raise RunDirError(f"run.name {name!r}: {path} cannot be made: {err.strerror or err} (a run name is "
                                  "one directory under run.output_dir)", field="run.name") from None
        else:
            stem = f"{template_name}_{datetime.now():%Y%m%d_%H%M%S}"
            for suffix in ("", *(f"_{i}" for i in range(2, 1000))):
                path = parent / f"{stem}{suffix}"
                try:
                    path.mkdir()
                    break
                except FileExistsError:
                    continue
                except OSError as err:
                    raise _unwritable(parent, path, err) from None
        run = cls(path)
        run.lock()
        return run

    @classmethod
    def reopen(cls, path: str | Path) -> RunDirectory:
        """An existing run directory (``--resume``), not yet locked.

        Raises:
            RunDirError: ``path`` is not a run directory (no such directory, or no ``template.yaml``).
        """
        path = Path(path)
        if not path.is_dir():
            what = "it is a file" if path.exists() else "there is no such directory"
            raise RunDirError(f"{path} is not a run directory: {what} (--resume takes the directory of an earlier "
                              "run, e.g. outputs/<run.name>)")
        if not (path / RUN_TEMPLATE).is_file():
            raise RunDirError(f"{path} is not a run directory: it has no {RUN_TEMPLATE}")
        _refuse_if_in_use(path)  # before its files are read: a run going on writes them
        return cls(path)

    def lock(self) -> None:
        """Take the directory's exclusive lock (its text becomes this process's pid).

        Raises:
            RunDirError: another process holds it (naming its pid).
        """
        try:
            self._lock = lock_directory(self.path)
        except DirectoryInUse as err:
            raise RunDirError(f"run directory {self.path} is in use by another process (pid {err.pid}); wait for it "
                              "to end or stop it") from None
        except OSError as err:  # a read-only file system, no permission
            raise RunDirError(f"run directory {self.path} cannot be locked for this run ({LOCK_FILE}: "
                              f"{err.strerror or err}): a run writes into its directory") from None

    def close(self) -> None:
        """Release the lock, emptied first: a finished run's ``.lock`` names no process."""
        if self._lock is not None:
            unlock_directory(self._lock)
            self._lock = None

    def remove(self) -> None:
        """Delete the run directory and release its lock: a new run that failed before it wrote
        anything a resume or a reader could use (:meth:`has_progress`)."""
        shutil.rmtree(self.path, ignore_errors=True)  # the lock is held until it is gone
        self.close()

    # ------------------------------------------------------------------ contents
    @property
    def template_path(self) -> Path:
        return self.path / RUN_TEMPLATE

    def write_template(self, resolved: dict) -> None:
        """Write the run's resolved template (once, when the run starts), atomically."""
        write_text_atomically(self.template_path, yaml.safe_dump(resolved, sort_keys=False))

    def has_progress(self) -> bool:
        """Whether the run wrote a metrics record or a checkpoint (published, or being staged)."""
        metrics = self.path / METRICS_FILE
        checkpoints = self.path / CHECKPOINTS_DIR
        return ((metrics.is_file() and metrics.stat().st_size > 0)
                or (checkpoints.is_dir() and any(checkpoints.iterdir())))

    def has_checkpoint(self) -> bool:
        """Whether the run holds a complete checkpoint, which a resume could continue from."""
        from vla_rl.checkpoints.files import complete_checkpoints

        return bool(complete_checkpoints(self.path / CHECKPOINTS_DIR))

    def recorded_overrides(self) -> list[str]:
        """The overrides of every earlier resume, in order.

        Raises:
            RunDirError: ``resumes.jsonl`` holds a line that is no resume record (naming it).
        """
        path = self.path / RESUMES_FILE
        if not path.exists():
            return []
        overrides = []
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            items = record.get("overrides") if isinstance(record, dict) else None
            if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
                raise RunDirError(f"{path}: line {number} is not a resume record ({{\"time\": ..., \"overrides\": "
                                  "[KEY=VALUE, ...]}): the run's settings cannot be known; restore the file (vla-rl "
                                  "writes it at each resume)")
            overrides += items
        return overrides

    def record_resume(self, overrides: list[str]) -> None:
        """Append a resume's overrides to ``resumes.jsonl`` (rewritten atomically); the driver calls it
        once the workers have loaded the checkpoint with them."""
        path = self.path / RESUMES_FILE
        previous = path.read_text() if path.exists() else ""
        record = {"time": datetime.now().isoformat(timespec="seconds"), "overrides": list(overrides)}
        write_text_atomically(path, previous + json.dumps(record) + "\n")

    def record_hosts(self, hosts: list[dict]) -> None:
        """Append the machine of each rank of a group of workers that set up (a new run, a resume,
        a restart after a worker died) to ``hosts.jsonl`` (rewritten atomically). A run with
        progress and no such file yet (its earlier starts were by an earlier vla-rl) first gets a
        record without hosts: they are unknown (:meth:`recorded_hosts`)."""
        path = self.path / HOSTS_FILE
        previous = path.read_text() if path.exists() else ""
        now = datetime.now().isoformat(timespec="seconds")
        if not previous and self.has_progress():
            previous = json.dumps({"time": now, "hosts": None}) + "\n"
        write_text_atomically(path, previous + json.dumps({"time": now, "hosts": list(hosts)}) + "\n")

    def recorded_hosts(self) -> tuple[list[dict], bool]:
        """The machines every start of the run's workers ran on, without repeats
        (:func:`vla_rl.utils.host.distinct`), and whether one start's were not recorded."""
        from vla_rl.utils.host import distinct

        path = self.path / HOSTS_FILE
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        unrecorded = any(not isinstance(record.get("hosts"), list) for record in records)
        return distinct([h for record in records for h in record.get("hosts") or []]), unrecorded


def check_resume(run: RunDirectory, template, overrides: list[str], world_size: int) -> None:
    """Check, before Ray starts, that the workers can resume ``run`` exactly as ``template`` (the
    run's template with the recorded and the new overrides) asks, against its newest complete
    checkpoint; nothing is read but file names and headers.

    - The run has a checkpoint none of whose files is missing or truncated (against its
      manifest, by size): the newest such one, which the workers will resume from (they set newer
      damaged ones aside); a finished run (its ``summary.json`` of that checkpoint's step) one
      before ``trainer.total_steps``, and fewer environment steps than ``trainer.total_env_steps``
      at it (an unfinished one may end its interrupted final evaluation, without training, a
      resume's too, whose summary is the leg's before).
    - The same number of workers wrote it: each worker continues its own random streams
      (``rng_rank<r>.safetensors``), so another number cannot resume exactly (the optimizer state
      would load: DDP's is replicated, DCP reshards FSDP's; the random streams would not).
    - The same ``trainer.strategy`` wrote it (DDP's ``optimizer.json`` or FSDP's ``actor_sharded/``).
    - When ``overrides`` (this resume's own) set a :data:`POLICY_SETTINGS` key, the policy they
      build (on the ``meta`` device: no weights, no memory) has the checkpoint's tensor names and
      shapes. A policy that loads a pretrained checkpoint of its own (``policy.config.model_path``,
      a GGUF ``text.gguf_file``) is not checked here: building it reads its weights.
    - ``policy.*`` overrides keep the run's policy (:func:`_refuse_policy_changes`): only where its
      pretrained checkpoint lives and how it is loaded may change.
    - Nor do they change what the run made as it started (:data:`START_ONLY_SETTINGS`: its tiny
      model, its generated prompts, its warm start).
    - No override of ``run.name`` or ``run.output_dir``: they place a new run, and a resume
      recorded them and trained on where the run is.
    - ``metrics.jsonl`` reads: a damaged line before its last stopped the resume after Ray and
      the workers had started, with a traceback (and the resume's overrides recorded).

    Args:
        run: the reopened run directory.
        template: the effective template of the resume.
        overrides: this resume's overrides.
        world_size: the number of workers the resume would start.

    Raises:
        RunDirError: the first problem, naming the setting (or the overrides) and the checkpoint.
    """
    from vla_rl.checkpoints import integrity
    from vla_rl.checkpoints.files import checkpoint_step
    from vla_rl.utils.tracking import read_metrics

    config = template.config
    placed = [item for item in overrides if _sets(_override_key(item), ("run.name", "run.output_dir"))]
    if placed:
        raise RunDirError(f"{placed[0]}: a resume continues {run.path} where it is, and run.name and run.output_dir "
                          "place a new run; resume without it (or copy the run directory first)",
                          field=_override_key(placed[0]))
    if (run.path / METRICS_FILE).is_file():
        try:
            read_metrics(run.path / METRICS_FILE)
        except ValueError as error:
            raise RunDirError(f"{error}: repair or delete that line, then resume") from None
    # the checkpoint the workers will choose, by sizes only (they hash the files as they load them)
    checkpoint, skipped = integrity.latest_verified_checkpoint(run.path / CHECKPOINTS_DIR, digests=False, log=False)
    if checkpoint is None and skipped:
        raise RunDirError(f"cannot resume: no checkpoint of {run.path} verifies ({'; '.join(r for _, r in skipped)})")
    if checkpoint is None:
        raise RunDirError(f"{run.path} has no checkpoint to resume from: the run stopped before it wrote one "
                          f"(trainer.save_every={config.trainer.save_every}); start a new run instead, e.g. "
                          f"vla-rl train {shlex.quote(str(run.template_path))} run.name=NEW_NAME")
    step, total = checkpoint_step(checkpoint), config.trainer.total_steps
    summarised = _summarised_step(run.path)
    finished = summarised is not None and summarised >= step  # else its summary, if any, is an earlier leg's
    if step >= total and finished:  # finished: it would only log a second final evaluation
        raise RunDirError(f"the run finished: its checkpoint {checkpoint} is at step {step}, and trainer.total_steps is "
                          f"{total}; raise it to train on, e.g. trainer.total_steps={step + max(step, 1)}",
                          field="trainer.total_steps")
    budget = config.trainer.total_env_steps
    spent = checkpoint_env_steps(checkpoint, run.path / METRICS_FILE) if budget is not None else 0.0
    if budget is not None and spent >= budget and finished:
        raise RunDirError(f"the run finished: its checkpoint {checkpoint} is at step {step}, after {spent:.0f} "
                          f"environment steps, and trainer.total_env_steps is {budget}; raise it to train on, e.g. "
                          f"trainer.total_env_steps={2 * int(spent)}", field="trainer.total_env_steps")
    ranks = integrity.checkpoint_ranks(checkpoint)
    if ranks and ranks != world_size:
        raise RunDirError(f"the run's checkpoint {checkpoint} was written by {ranks} workers, this resume would start "
                          f"{world_size}: each worker continues its own random streams (rng_rank<r>.safetensors), so "
                          f"a resume needs the same number; resume with workers.num_workers={ranks}",
                          field="workers.num_workers")
    strategy = integrity.checkpoint_strategy(checkpoint)
    if strategy is not None and strategy != config.trainer.strategy:
        raise RunDirError(f"the run's checkpoint {checkpoint} holds the actor state of trainer.strategy {strategy}, "
                          f"which trainer.strategy {config.trainer.strategy} cannot read; resume with "
                          f"trainer.strategy={strategy}",
                          field="trainer.strategy")
    changed = [item for item in overrides if _sets(_override_key(item), POLICY_SETTINGS)]
    misfit = policy_misfit(config, run.path, [checkpoint]) if changed else None
    if misfit:
        these = "this override builds" if len(changed) == 1 else "these overrides build"
        raise RunDirError(f"{' '.join(changed)}: the run's checkpoint {misfit[0]} does not fit the policy {these}: "
                          f"{misfit[1]}; resume without {'it' if len(changed) == 1 else 'them'}, or start a new run")
    if any(_sets(_override_key(item), ("policy", *START_ONLY_SETTINGS)) for item in overrides):
        from vla_rl.dag.loader import load_template

        before = load_template(run.template_path, recorded=run.recorded_overrides()).config
        _refuse_start_only_changes(before, config, checkpoint)
        _refuse_policy_changes(before.policy, config.policy, checkpoint)


def _refuse_start_only_changes(before, after, checkpoint: Path) -> None:
    """Refuse a resume that changes a :data:`START_ONLY_SETTINGS` setting: the run's recorded
    configuration would hold a value it never trained with (a tiny model of 128 units where the
    run's has 64, more generated rows than its splits hold).

    Raises:
        RunDirError: naming the first changed setting, its value in the run and in the resume.
    """
    for setting, why in START_ONLY_SETTINGS.items():
        was, now = (_flat({setting: _field_value(config, setting)}) for config in (before, after))
        for key in sorted(was.keys() | now.keys()):
            if was.get(key) != now.get(key):
                raise RunDirError(f"{key}: the run has {was.get(key)!r}, this resume {now.get(key)!r}; {why} (from "
                                  f"{checkpoint}): resume without the override, or start a new run", field=key)


def policy_misfit(config, run_dir: Path, checkpoints: list[Path]) -> tuple[Path, str] | None:
    """The first of ``checkpoints`` whose policy tensors (names and shapes, from the file headers)
    do not fit the policy ``config`` builds (on the ``meta`` device, :func:`_meta_policy`), and how;
    None when all fit, when none holds readable policy tensors, or when the policy loads a
    pretrained checkpoint of its own (building it would read its weights).

    Returns:
        (the file read, the mismatch in one line) or None.
    """
    from vla_rl.checkpoints import integrity

    policy = None
    for checkpoint in checkpoints:
        stored = integrity.stored_policy_shapes(checkpoint)
        if stored is None:
            continue
        policy = policy or _meta_policy(config, run_dir)
        if policy is None:
            return None
        mismatch = _policy_mismatch(policy, stored[1])
        if mismatch:
            return stored[0], mismatch.describe()
    return None


def _summarised_step(run_dir: Path) -> int | None:
    """The ``last_step`` of the run's ``summary.json``: the step whose final evaluation it holds;
    None without a readable one. A resume interrupted in its final evaluation leaves the summary of
    the leg before it, of an earlier step."""
    try:
        step = json.loads((run_dir / SUMMARY_FILE).read_text()).get("last_step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def _override_key(item: str) -> str:
    """The dotted key an override sets (``KEY=VALUE``) or deletes (``~KEY``)."""
    return item.partition("=")[0].removeprefix("~")


def checkpoint_env_steps(checkpoint: Path, metrics: Path) -> float:
    """The environment steps a run had simulated by its checkpoint ``checkpoint``: the count the
    checkpoint records (its ``trainer_state.json`` run state), else, for a checkpoint written
    before checkpoints recorded it, ``metrics.jsonl``'s (:func:`env_steps_at`)."""
    from vla_rl.checkpoints.files import checkpoint_step, load_run_state

    recorded = load_run_state(checkpoint).get("env_steps")
    return float(recorded) if recorded is not None else env_steps_at(metrics, checkpoint_step(checkpoint))


def env_steps_at(metrics: Path, step: int) -> float:
    """The environment steps (``rollout/total_env_steps``) a run had simulated after ``step``
    training steps, from its ``metrics.jsonl`` (0 without a record of them)."""
    from vla_rl.utils.tracking import read_metrics

    records = [r for r in read_metrics(metrics) if r.get("step", 0) <= step and "rollout/total_env_steps" in r] \
        if metrics.is_file() else []
    return float(records[-1]["rollout/total_env_steps"]) if records else 0.0


#: Policy settings a resume may change: where a pretrained checkpoint lives (a moved directory),
#: and how it is loaded; the trained weights come from the run's checkpoint either way.
RESUMABLE_POLICY_SETTINGS = ("config.model_path", "config.tokenizer_path", "allow_partial_load")

_WARM_STARTED = "the warm start ran when the run started, and a resume restores the checkpoint's weights instead"
START_ONLY_SETTINGS = {
    "text.tiny_hidden_size": "the run built its tiny model (tiny_model/) when it started, and a resume reuses it",
    "text.tiny_num_layers": "the run built its tiny model (tiny_model/) when it started, and a resume reuses it",
    **dict.fromkeys(("text.num_generated_train", "text.num_generated_test", "text.arithmetic_levels"),
                    "the run wrote its arithmetic splits (arithmetic/) when it started, and a resume reuses them"),
    **dict.fromkeys(("text.sft_steps", "text.sft_lr", "text.sft_batch_size", "warm_start"), _WARM_STARTED),
}
"""Settings read only as a run starts, ``{setting: why}``: a resume that changes one would record a
value that never took effect (:func:`_refuse_start_only_changes`)."""


def _refuse_policy_changes(run_policy, policy, checkpoint: Path) -> None:
    """Refuse a resume that changes the run's policy (``policy.*`` but
    :data:`RESUMABLE_POLICY_SETTINGS`) although the tensors still fit: an activation, a learned
    std that becomes fixed, a dtype, a sampling setting. The checkpoint's weights and optimizer
    state were trained with the run's policy; another one would continue from them silently (or,
    with another set of trainable tensors, fail in the workers).

    Raises:
        RunDirError: naming the first changed setting, its value in the run and in the resume.
    """
    before, after = _policy_settings(run_policy), _policy_settings(policy)
    for key in sorted(before.keys() | after.keys()):
        if key not in RESUMABLE_POLICY_SETTINGS and before.get(key) != after.get(key):
            raise RunDirError(f"policy.{key}: the run's policy has {before.get(key)!r}, this resume {after.get(key)!r}; "
                              f"the checkpoint {checkpoint} was trained with the run's, so a resume keeps it: resume "
                              "without the override, or start a new run", field=f"policy.{key}")


def _policy_settings(policy) -> dict:
    """The ``policy`` section as ``{"config.activation": "tanh", ...}``, its config with the
    defaults the policy's config class fills in (a default given explicitly is no change)."""
    import dataclasses

    settings = policy.model_dump()
    config = policy.policy_config()
    if dataclasses.is_dataclass(config):
        settings["config"] = dataclasses.asdict(config)
    return _flat(settings)


def _flat(values: dict, prefix: str = "") -> dict:
    """A nested dict (or config section) as ``{"a.b.c": value}`` (lists and other values as leaves)."""
    out = {}
    for key, value in values.items():
        value = value.model_dump() if hasattr(value, "model_dump") else value
        if isinstance(value, dict) and value:
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _sets(key: str, settings: tuple[str, ...]) -> bool:
    """Whether the override key ``key`` sets one of ``settings`` or a key below one."""
    return any(key == setting or key.startswith(setting + ".") for setting in settings)


def _meta_policy(config, run_dir: Path):
    """The policy the run's workers would build under ``config``, on the ``meta`` device, with its
    LoRA adapters (``policy.lora``); None for a policy that loads a pretrained checkpoint of its own
    (see :func:`check_resume`) or a text model that is not there yet."""
    import torch

    lora = config.policy.lora
    if config.run.workflow == "text":
        from vla_rl.workflows.text import meta_causal_lm_policy
        from vla_rl.workflows.text_assets import TextAssets

        policy = meta_causal_lm_policy(config, TextAssets.resolve(config, run_dir).model_path)
        if policy is None:
            return None
    else:
        from vla_rl.workflows.embodied import robot_policy, simulator_spec
        from vla_rl_core.env_spec import EnvSpec

        if getattr(config.policy.policy_config(), "model_path", None) is not None:
            return None
        env = config.simulator.env_config()
        state_dim, action_dim = getattr(env, "state_dim", None), getattr(env, "action_dim", None)
        if state_dim and action_dim and not config.simulator.multi_task:  # the policy reads no more of it
            spec = EnvSpec(obs_dim=state_dim, action_dim=action_dim, horizon=env.horizon)
        else:  # only the environment knows: make one, as vla-rl export does
            spec = simulator_spec(config)
        with torch.device("meta"):
            policy = robot_policy(config, spec)
    if lora is not None:
        with torch.device("meta"):
            policy.apply_lora(**lora.apply_arguments())
    return policy


def _policy_mismatch(policy, stored: dict[str, tuple[int, ...]]):
    """How a checkpoint's policy tensors (``stored``: name -> shape) differ from ``policy``'s state,
    as a strict load sees it: a tensor tied to another (stored once) is not missing when one of
    its names is there."""
    from policies.checkpoint_files import WeightMismatch, compare_shapes

    state = policy.state_dict(keep_vars=True)
    mismatch = compare_shapes({name: tuple(tensor.shape) for name, tensor in state.items()}, stored)
    names_of: dict[int, set[str]] = {}
    for name, tensor in state.items():
        names_of.setdefault(id(tensor), set()).add(name)
    missing = tuple(name for name in mismatch.missing if not names_of[id(state[name])] & stored.keys())
    return WeightMismatch(missing, mismatch.unexpected, mismatch.mismatched)


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


