"""Every evaluation episode in zarr: one :class:`~vla_rl.data.trajectory_store.TrajectoryStore` per
task and worker rank, ``<eval_dir>/episodes/<task>/rank<r>.zarr`` (one writer per store; episodes
are committed one by one, so an interrupted evaluation loses no finished episode).

Per decision step ``t < finish_step`` an episode stores ``obs`` (the observation before action
``t``), ``next_obs`` (after it; the last one is the terminal observation), ``actions``
``(chunk, own_action_dim)`` float32 (the policy's own, as sampled: what the RL loss scores, e.g.
OpenVLA-OFT's normalised values, π0's whole denoising chain; ``own_action_dim`` is
``policy.own_action_dim``, the simulator's ``action_dim`` for most policies), ``env_actions``
``(chunk, action_dim)`` float32 (what the
simulator received, ``policy.env_actions(actions)``: de-normalised, gripper post-processed; a
replay executes these) and ``log_probs`` ``(chunk,)`` (not for a policy without an action
distribution, whose log-probs are undefined); its scalars are the :class:`EpisodeKey` fields plus
``success``, ``truncated`` and ``finish_step``. Stores written before ``env_actions`` existed lack
it (:func:`vla_rl.evaluation.replay.episode_env_actions` says when their ``actions`` can stand in).

Each episode names the machine it ran on: its ``host`` scalar indexes the store's ``hosts``
attribute, the host records (:func:`vla_rl.utils.host.host_record`) of the workers that appended
to the store, a continued evaluation's machine added to an earlier one's (a machine's CPU may
change the episodes). Stores written by an earlier vla-rl have neither; their episodes, and those
later appended to them, name none (:func:`episode_hosts`).

A store that cannot be read (a truncated ``zarr.json`` or chunk, a missing array: a disk that
filled up, a copy cut short) is a :class:`DamagedStoreError` naming the store and the array, with
the way out: move it aside (``mv STORE STORE.damaged``) and run the same command again, which
re-runs the episodes it held (a set-aside store no longer matches ``rank*.zarr``).
:func:`check_stores` reads every store of an evaluation directory before ``vla-rl eval`` writes
anything; the reads of the driver and the workers go through :func:`reading_store`.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tensordict import TensorDict

from simulators.registry import SETTINGS_FORMAT, canonical_env, same_env
from vla_rl.data.trajectory_store import LENGTH_KEY, TrajectoryStore
from vla_rl.errors import RunStopped
from vla_rl.evaluation.targets import EvalInputError
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec
from vla_rl_core.run_layout import EPISODES_DIR

STORE_PATTERN = "rank*.zarr"
"""The stores of a task directory (``rank<r>.zarr``); a store set aside as ``rank<r>.zarr.damaged``
does not match."""
HOSTS_ATTR = "hosts"
"""A store's attribute: the host records of the workers that appended to it."""
HOST_SCALAR = "host"
"""An episode's scalar: the index in its store's :data:`HOSTS_ATTR` of the machine it ran on."""
SET_ASIDE_SUFFIX = ".damaged"
"""What the message of a :class:`DamagedStoreError` says to append to the store's name."""
_CHECK_BLOCK_BYTES = 64 << 20
"""Most bytes of one array :func:`check_store` decompresses at once."""
_BLOSC_HEADER_BYTES = 16
"""A Blosc frame's header: version, flags, type size, then uncompressed, block and compressed
sizes (4 bytes little-endian each; the compressed size, the frame's own, at bytes 12-15)."""


class DamagedStoreError(EvalInputError, RunStopped):
    """An evaluation store that cannot be read; the message names the store, the array and the
    command that sets the store aside. An input error of ``vla-rl eval`` (one line, exit status 2),
    found before anything is written, or, for a store damaged during the evaluation, by a worker
    (a :class:`~vla_rl.errors.RunStopped`, which the driver re-raises without the Ray traceback)."""


def damaged_store(path: Path, what: str, error: BaseException | str) -> DamagedStoreError:
    """The error for store ``path`` whose ``what`` (``"array 'obs', episode 3 (chunk obs/c/3/0/0)"``)
    cannot be read because of ``error``."""
    cause = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    cause = " ".join(cause.split())
    cause = cause if len(cause) <= 200 else cause[:197] + "..."
    error = DamagedStoreError(
        f"evaluation store {path} is damaged: {what} cannot be read ({cause}); set it aside and run the same "
        f"command again, which re-runs its episodes: mv {path} {path}{SET_ASIDE_SUFFIX}")
    error.store, error.what, error.cause = path, what, cause  # for commands that word it otherwise
    return error


def check_store(path: Path) -> None:
    """Read all of the store at ``path``: its attributes, and every committed episode of every
    array (fields, scalars, lengths; in blocks of at most 64 MiB), and compare each chunk file's
    size with its Blosc header's, so that a damaged one is named before an evaluation starts. A
    chunk that is missing reads as zeros, which only the lengths (at least 1 for an episode) reveal.
    Each episode's machine must be one the store records (:func:`episode_hosts`).

    Raises:
        DamagedStoreError: the first array (or the attributes) that cannot be read, or an episode
            naming a machine the store does not record.
    """
    import zarr

    path = Path(path)
    try:
        store = TrajectoryStore.open(path, read_only=True)
        group = zarr.open_group(path, mode="r", zarr_format=3)
    except Exception as err:  # JSON, zarr and OS errors alike: the store cannot be opened
        raise damaged_store(path, "its attributes (zarr.json)", err) from None
    n = len(store)
    for name in (LENGTH_KEY, *store.scalars, *store.fields):
        try:
            array = group[name]
        except Exception as err:
            raise damaged_store(path, f"array {name!r} ({name}/zarr.json)", err) from None
        if array.shape[0] < n:
            raise damaged_store(path, f"array {name!r}", f"it holds {array.shape[0]} episodes, the store "
                                f"committed {n}")
        per_episode = max(1, int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize)
        block = max(1, _CHECK_BLOCK_BYTES // per_episode)
        for start in range(0, n, block):
            stop = min(n, start + block)
            try:
                values = np.asarray(array[start:stop])
            except Exception as err:
                episode = _first_unreadable(array, start, stop)
                chunk = "/".join([name, "c", str(episode), *["0"] * (array.ndim - 1)])
                raise damaged_store(path, f"array {name!r}, episode {episode} (chunk {chunk})", err) from None
            if name == LENGTH_KEY:
                bad = np.flatnonzero((values < 1) | (values > store.max_steps))
                if len(bad):
                    episode = start + int(bad[0])
                    raise damaged_store(path, f"array {name!r}, episode {episode} (chunk {name}/c/{episode})",
                                        f"length {int(values[bad[0]])} outside [1, {store.max_steps}]: its chunk "
                                        "is missing or wrong")
        _check_chunk_sizes(path, name, array, n)
    if HOST_SCALAR in store.scalars:
        episode_hosts(store, {HOST_SCALAR: np.asarray(group[HOST_SCALAR][:n])})  # each names a recorded machine


def _check_chunk_sizes(path: Path, name: str, array, n: int) -> None:
    """Compare each committed episode's chunk file of a Blosc-compressed array with the size its
    Blosc header states: Blosc decodes a truncated chunk of incompressible data (stored as is)
    without an error, into garbage."""
    from zarr.codecs import BloscCodec

    if len(array.compressors) != 1 or not isinstance(array.compressors[0], BloscCodec) or array.filters:
        return
    for episode in range(n):
        chunk = "/".join([name, "c", str(episode), *["0"] * (array.ndim - 1)])
        file = path / chunk
        try:
            size = file.stat().st_size
            with file.open("rb") as handle:
                header = handle.read(_BLOSC_HEADER_BYTES)
        except FileNotFoundError:
            continue  # a chunk of fill values (zeros) is not written
        except OSError as err:
            raise damaged_store(path, f"array {name!r}, episode {episode} (chunk {chunk})", err) from None
        stated = int.from_bytes(header[12:16], "little") if len(header) == _BLOSC_HEADER_BYTES else -1
        if stated != size:
            raise damaged_store(path, f"array {name!r}, episode {episode} (chunk {chunk})",
                                f"the chunk file holds {size} bytes, its Blosc header {max(stated, 0)}: truncated")


def _first_unreadable(array, start: int, stop: int) -> int:
    """The first episode in ``[start, stop)`` of a zarr array whose chunk does not decode."""
    for episode in range(start, stop):
        try:
            np.asarray(array[episode])
        except Exception:
            return episode
    return start


def check_stores(eval_dir: Path) -> None:
    """:func:`check_store` on every store of the evaluation directory (``episodes/*/rank*.zarr``).

    Raises:
        DamagedStoreError: the first store that cannot be read.
    """
    for path in sorted(Path(eval_dir).glob(f"{EPISODES_DIR}/*/{STORE_PATTERN}")):
        check_store(path)


@contextmanager
def reading_store(path: Path) -> Iterator[None]:
    """Reads of the store at ``path``: an error raised by them becomes a :class:`DamagedStoreError`
    naming the store and the damaged array when :func:`check_store` finds the store damaged (else
    it propagates as it is)."""
    try:
        yield
    except DamagedStoreError:
        raise
    except Exception:
        check_store(path)  # raises the DamagedStoreError that names the array
        raise


@dataclass(frozen=True, order=True)
class EpisodeKey:
    """What identifies an evaluation episode within one task: the checkpoint (its training step),
    the protocol (greedy, or the sampling temperature) and the initial state."""

    checkpoint_step: int
    greedy: bool
    temperature: float
    init_state_id: int


def task_dir(eval_dir: Path, task: str) -> Path:
    """Directory of a task's stores."""
    return Path(eval_dir) / EPISODES_DIR / task


def episode_keys(store: TrajectoryStore) -> list[EpisodeKey]:
    """The keys of a store's committed episodes, in order."""
    if len(store) == 0:
        return []
    data = store.read_scalars()
    return [EpisodeKey(int(s), bool(g), float(t), int(i)) for s, g, t, i in
            zip(data["checkpoint_step"], data["greedy"], data["temperature"], data["init_state_id"])]


def check_task_settings(eval_dir: Path, task: str, simulator: str, env: dict) -> None:
    """Check that the task's existing stores were written with this simulator and settings, as
    :func:`simulators.registry.same_env` compares them (every field of the validated config,
    defaults included: a store recorded them all, ``settings_format`` 1; an earlier store's own
    settings are completed with today's defaults).

    Raises:
        ValueError: a store holds episodes of other settings (naming the store and both settings),
            or records them in a form newer than this version knows.
    """
    for path in sorted(task_dir(eval_dir, task).glob(STORE_PATTERN)):
        with reading_store(path):
            attrs = TrajectoryStore.open(path, read_only=True).attrs
        if int(attrs.get("settings_format", 0)) > SETTINGS_FORMAT:
            raise ValueError(f"{path} records its settings in form {attrs['settings_format']}, newer than this "
                             f"vla-rl's {SETTINGS_FORMAT}: evaluate with the version that wrote it, or into another "
                             "directory (--output)")
        if not same_env(attrs["simulator"], attrs["env"], simulator, env):
            differences = settings_differences(attrs["simulator"], attrs["env"], simulator, env)
            raise ValueError(f"{path} holds episodes of task {task!r} with other settings ({differences}); evaluate "
                             "into another directory (--output) to change the task's settings")


def settings_differences(stored_simulator: str, stored_env: dict, simulator: str, env: dict) -> str:
    """What differs between a store's simulator settings and these, one ``name: stored in the
    store, this here`` per setting (``simulator`` when the simulators differ; else each field of
    ``simulator.env``, completed with the defaults as :func:`simulators.registry.canonical_env`
    completes them; of stored settings this version no longer builds, the fields they record)."""
    if stored_simulator != simulator:
        return f"simulator: {stored_simulator} in the store, {simulator} here"
    current = canonical_env(simulator, env)
    try:
        stored = canonical_env(stored_simulator, stored_env)
        names = set(stored) | set(current)
    except (ValueError, TypeError, KeyError):  # a field this version no longer has: the fields it recorded
        stored, names = dict(stored_env), set(stored_env)

    def shown(settings: dict, name: str) -> str:
        return repr(settings[name]) if name in settings else "unset"

    return "; ".join(f"simulator.env.{name}: {shown(stored, name)} in the store, {shown(current, name)} here"
                     for name in sorted(names) if stored.get(name) != current.get(name))


def stored_keys(eval_dir: Path, task: str) -> set[EpisodeKey]:
    """Keys of every committed episode of ``task`` in all ranks' stores (read-only).

    Raises:
        DamagedStoreError: a store cannot be read.
    """
    keys_found: set[EpisodeKey] = set()
    for path in sorted(task_dir(eval_dir, task).glob(STORE_PATTERN)):
        with reading_store(path):
            keys_found.update(episode_keys(TrajectoryStore.open(path, read_only=True)))
    return keys_found


def open_rank_store(eval_dir: Path, task: str, rank: int, spec: EnvSpec, chunk: int, attrs: dict,
                    log_probs: bool, own_action_dim: int | None = None) -> TrajectoryStore:
    """This rank's store of ``task``, created on first use, whole (made beside it and renamed into
    place, so that a reader never finds it half made), recording machines (:data:`HOSTS_ATTR`
    starts empty, :func:`append_episodes` adds them).

    Args:
        spec: the simulator's spec (its ``obs_dim``, ``action_dim`` and ``horizon`` size the fields).
        chunk: the policy's action-chunk length.
        own_action_dim: values per own action of the policy (``policy.own_action_dim``), the
            width of the ``actions`` field; None: the simulator's ``action_dim`` (a policy whose own
            actions are the environment's width).
        attrs: metadata kept with a new store (task, simulator, settings).
        log_probs: a new store has the ``log_probs`` field (the policy has an action distribution).
    """
    path = task_dir(eval_dir, task) / f"rank{rank}.zarr"
    if path.exists():
        with reading_store(path):
            return TrajectoryStore.open(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    obs_dim, action_dim = spec.obs_dim, spec.action_dim
    own_action_dim = action_dim if own_action_dim is None else int(own_action_dim)
    fields = {
        "obs": ((obs_dim,), np.float32),
        "next_obs": ((obs_dim,), np.float32),
        "actions": ((chunk, own_action_dim), np.float32),
        "env_actions": ((chunk, action_dim), np.float32),
    }
    if log_probs:
        fields["log_probs"] = ((chunk,), np.float32)
    # made beside it and renamed into place: the driver reads the stores while the workers write them
    # (vla-rl eval's report), and a store it found half made read as damaged, stopping the evaluation
    creating = path.with_name(f".{path.name}.creating")
    shutil.rmtree(creating, ignore_errors=True)  # one a crash left
    TrajectoryStore.create(creating, fields, max_steps=-(-spec.horizon // chunk), attrs={**attrs, HOSTS_ATTR: []})
    creating.rename(path)
    return TrajectoryStore.open(path)


def host_index(store: TrajectoryStore, host: dict) -> int | None:
    """The index of machine ``host`` in the store's :data:`HOSTS_ATTR`, added there if new; None
    for a store that records no machines (written by an earlier vla-rl: no such attribute, or
    episodes committed without the :data:`HOST_SCALAR`)."""
    hosts = store.attrs.get(HOSTS_ATTR)
    if not isinstance(hosts, list) or (len(store) and HOST_SCALAR not in store.scalars):
        return None
    if host not in hosts:
        store.update_attrs({HOSTS_ATTR: [*hosts, host]})
        return len(hosts)
    return hosts.index(host)


def episode_hosts(store: TrajectoryStore, scalars: dict[str, np.ndarray]) -> list[dict | None]:
    """The machine of each committed episode of ``store`` (its host record; None: not recorded),
    from the store's scalars (``store.read_scalars()``).

    Raises:
        DamagedStoreError: an episode's :data:`HOST_SCALAR` is not an index of the store's
            :data:`HOSTS_ATTR`.
    """
    hosts = store.attrs.get(HOSTS_ATTR)
    if not isinstance(hosts, list) or HOST_SCALAR not in scalars:
        return [None] * len(store)
    out = []
    for episode, index in enumerate(scalars[HOST_SCALAR][: len(store)].tolist()):
        if not 0 <= index < len(hosts) or not isinstance(hosts[index], dict):
            found = f"{len(hosts)} entries" if not 0 <= index < len(hosts) else f"{hosts[index]!r} there"
            raise damaged_store(store.path, f"array {HOST_SCALAR!r}, episode {episode}",
                                f"it names machine {index} of the store's attribute {HOSTS_ATTR!r}, which has {found}")
        out.append(hosts[index])
    return out


def append_episodes(store: TrajectoryStore, episodes: TensorDict, checkpoint_step: int, greedy: bool,
                    temperature: float, host: dict) -> list[EpisodeKey]:
    """Append rollout episodes (the keys of :func:`vla_rl.rollout.embodied.rollout_episodes` plus
    ``truncated``; ``old_log_probs`` when the policy has them; ``env_actions``
    (:attr:`~vla_rl.rollout.embodied.RolloutResult.env_actions`) when the store has that field, as
    every store created by :func:`open_rank_store` does) one by one, each committed before the
    next; returns their keys. ``host``: the machine they ran on (a host record, kept as
    :func:`host_index` says).

    Raises:
        ValueError: the store has an ``env_actions`` field and the episodes lack it, or the
            episodes' fields are not the store's (see ``TrajectoryStore.append_episode``).
    """
    env_actions = "env_actions" in store.fields
    if env_actions and keys.ENV_ACTIONS not in episodes.keys():
        raise ValueError(f"{store.path} stores the simulator's actions of each episode (field 'env_actions'), and "
                         f"the episodes have no {keys.ENV_ACTIONS!r}: set it from the rollout's "
                         "RolloutResult.env_actions")
    index = host_index(store, host)
    machine = {} if index is None else {HOST_SCALAR: np.int64(index)}
    added = []
    for row in range(len(episodes)):
        length = int(episodes[keys.FINISH_STEP][row])
        obs = episodes[keys.OBS][row]  # camera observations: their state only (images are not stored)
        obs = (obs[keys.OBS_STATE] if isinstance(obs, TensorDict) else obs).numpy()  # (T + 1, obs_dim)
        steps = {"obs": obs[:length], "next_obs": obs[1 : length + 1],
                 "actions": episodes[keys.ACTIONS][row, :length].numpy()}
        if env_actions:
            steps["env_actions"] = episodes[keys.ENV_ACTIONS][row, :length].numpy()
        if keys.OLD_LOG_PROBS in episodes.keys():
            steps["log_probs"] = episodes[keys.OLD_LOG_PROBS][row, :length].numpy()
        store.append_episode(
            steps,
            checkpoint_step=np.int64(checkpoint_step), greedy=np.bool_(greedy), temperature=np.float64(temperature),
            init_state_id=np.int64(episodes[keys.INIT_STATE_ID][row]), success=np.bool_(episodes[keys.SUCCESS][row]),
            truncated=np.bool_(episodes[keys.TRUNCATED][row]), finish_step=np.int64(length), **machine,
        )
        added.append(EpisodeKey(checkpoint_step, greedy, temperature, int(episodes[keys.INIT_STATE_ID][row])))
    return added
