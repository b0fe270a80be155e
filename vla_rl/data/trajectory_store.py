"""Episodes of variable length in one zarr (v3) group, appended crash-safely.

Layout of a store at ``path`` (one zarr group)::

    <field>   (capacity, max_steps, *step_shape)  one array per declared field, zero-padded
    length    (capacity,) int64                   steps of each episode
    <scalar>  (capacity,)                         one array per per-episode scalar (success, ...)
    attrs     {"trajectory_store": {format_version, max_steps, fields, scalars, num_episodes},
               "user_attrs": {...}}

Every array is chunked one episode per chunk along the episode axis and compressed with Blosc
zstd. ``capacity`` may exceed the committed episode count after an interrupted append.

Crash safety: :meth:`TrajectoryStore.append_episode` writes the episode into slot
``num_episodes`` first (each chunk file is written atomically by zarr's ``LocalStore``) and only
then commits ``num_episodes + 1`` in the group attributes (one atomic rewrite of the group's
``zarr.json``). Readers see only committed episodes, so an interruption loses no finished episode
and never exposes a half-written one; the next append overwrites the uncommitted slot in full.
A store has a single writer at a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec, BloscShuffle
from zarr.errors import BaseZarrError

FORMAT_VERSION = 1
LENGTH_KEY = "length"
_SCHEMA_ATTR = "trajectory_store"
_USER_ATTR = "user_attrs"
_COMPRESSION_LEVEL = 3

FieldSpec = tuple[tuple[int, ...], np.dtype]


def _compressors() -> list[BloscCodec]:
    return [BloscCodec(cname="zstd", clevel=_COMPRESSION_LEVEL, shuffle=BloscShuffle.shuffle)]


def _check_name(name: Any, what: str, path: Path) -> None:
    if not isinstance(name, str) or not name or "/" in name or name.startswith("__"):
        raise ValueError(
            f"{path}: invalid {what} name {name!r}: use a non-empty string without '/' "
            "that does not start with '__'"
        )
    if name == LENGTH_KEY:
        raise ValueError(f"{path}: {what} name {LENGTH_KEY!r} is reserved for episode lengths")


def _normalize_fields(fields: Mapping[str, FieldSpec], path: Path) -> dict[str, FieldSpec]:
    if not fields:
        raise ValueError(f"{path}: declare at least one field, e.g. {{'obs': ((19,), np.float32)}}")
    normalized: dict[str, FieldSpec] = {}
    for name, spec in fields.items():
        _check_name(name, "field", path)
        try:
            shape, dtype = spec
            shape = tuple(int(d) for d in shape)
            dtype = np.dtype(dtype)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"{path}: field {name!r} must be declared as (step_shape, dtype), got {spec!r}"
            ) from err
        if any(d < 1 for d in shape):
            raise ValueError(f"{path}: field {name!r} has a non-positive dimension in {shape}")
        if dtype.kind not in "biuf":
            raise ValueError(
                f"{path}: field {name!r} has dtype {dtype}; use a bool or numeric dtype"
            )
        normalized[name] = (shape, dtype)
    return normalized


class TrajectoryStore:
    """Append-only store of variable-length episodes (see the module docstring for the layout).

    Create one with :meth:`create` or open an existing one with :meth:`open`; do not call the
    constructor directly.
    """

    def __init__(self, group: zarr.Group, path: Path) -> None:
        self._group = group
        self.path = path
        schema = dict(group.attrs[_SCHEMA_ATTR])
        self.max_steps: int = int(schema["max_steps"])
        self.fields: dict[str, FieldSpec] = {
            name: (tuple(spec["shape"]), np.dtype(spec["dtype"]))
            for name, spec in schema["fields"].items()
        }
        self.scalars: dict[str, np.dtype] = {n: np.dtype(d) for n, d in schema["scalars"].items()}
        self._num_episodes = int(schema["num_episodes"])
        self._user_attrs: dict[str, Any] = dict(group.attrs.get(_USER_ATTR, {}))

    @classmethod
    def create(
        cls,
        path: str | Path,
        fields: Mapping[str, FieldSpec],
        max_steps: int,
        attrs: dict[str, Any] | None = None,
        *,
        overwrite: bool = False,
    ) -> TrajectoryStore:
        """Create an empty store.

        Args:
            path: directory of the new zarr group.
            fields: per-step shape and dtype of each field, e.g.
                ``{"obs": ((19,), np.float32), "actions": ((7,), np.float32)}``.
            max_steps: longest episode the store accepts (steps); shorter ones are zero-padded.
            attrs: JSON-serialisable metadata kept with the store (env name, seed, ...).
            overwrite: replace an existing store at ``path``.

        Raises:
            FileExistsError: ``path`` exists and ``overwrite`` is false.
            ValueError: a field name, shape or dtype is invalid, or ``max_steps < 1``.
        """
        path = Path(path)
        normalized = _normalize_fields(fields, path)
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"{path}: max_steps must be a positive int, got {max_steps!r}")
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it")
        group = zarr.open_group(path, mode="w", zarr_format=3)
        for name, (shape, dtype) in normalized.items():
            group.create_array(
                name,
                shape=(0, max_steps, *shape),
                chunks=(1, max_steps, *shape),
                dtype=dtype,
                fill_value=0,
                compressors=_compressors(),
            )
        group.create_array(
            LENGTH_KEY, shape=(0,), chunks=(1,), dtype=np.int64, fill_value=0,
            compressors=_compressors(),
        )
        schema = {
            "format_version": FORMAT_VERSION,
            "max_steps": max_steps,
            "fields": {n: {"shape": list(s), "dtype": d.str} for n, (s, d) in normalized.items()},
            "scalars": {},
            "num_episodes": 0,
        }
        group.update_attributes({_SCHEMA_ATTR: schema, _USER_ATTR: dict(attrs or {})})
        return cls(group, path)

    @classmethod
    def open(cls, path: str | Path, *, read_only: bool = False) -> TrajectoryStore:
        """Open an existing store; ``read_only=True`` forbids appends.

        Raises:
            FileNotFoundError: nothing exists at ``path``.
            ValueError: ``path`` is not a zarr group, not a trajectory store, or of an
                unsupported format version.
        """
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no trajectory store at {path}")
        try:
            group = zarr.open_group(path, mode="r" if read_only else "r+", zarr_format=3)
        except BaseZarrError as err:
            raise ValueError(f"{path} is not a zarr (v3) group: {err}") from err
        schema = group.attrs.get(_SCHEMA_ATTR)
        if not isinstance(schema, Mapping):
            raise ValueError(f"{path} is a zarr group but not a trajectory store")
        if schema.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{path}: trajectory store format {schema.get('format_version')!r} is not "
                f"supported (expected {FORMAT_VERSION})"
            )
        return cls(group, path)

    @property
    def attrs(self) -> dict[str, Any]:
        """A copy of the user metadata given to :meth:`create` (and :meth:`update_attrs`)."""
        return dict(self._user_attrs)

    def update_attrs(self, values: Mapping[str, Any]) -> None:
        """Set user metadata entries (JSON-serialisable; others are kept), in one atomic rewrite
        of the group's ``zarr.json`` as a commit is.

        Raises:
            PermissionError: the store was opened read-only.
        """
        if self._group.read_only:
            raise PermissionError(f"{self.path} was opened read-only")
        self._user_attrs.update(values)
        self._group.update_attributes({_USER_ATTR: dict(self._user_attrs)})

    def __len__(self) -> int:
        """Number of committed episodes."""
        return self._num_episodes

    def append_episode(self, episode: Mapping[str, Any], **scalars: Any) -> int:
        """Append one episode and commit it; returns its index.

        Args:
            episode: one array ``(T, *step_shape)`` per declared field, same ``T`` for all,
                ``1 <= T <= max_steps``. Values are cast to the field dtype if numpy's
                ``same_kind`` casting allows it (float64 -> float32 yes, float -> int no).
            **scalars: per-episode scalars (``success=True``, ``init_state_id=3``). The first
                committed episode fixes their names and dtypes (inferred by ``np.asarray``);
                later episodes must give the same names with castable values.

        Raises:
            ValueError: missing or unknown field or scalar, wrong shape, length or dtype.
            PermissionError: the store was opened read-only.
        """
        if self._group.read_only:
            raise PermissionError(f"{self.path} was opened read-only")
        arrays, length = self._validate_episode(episode)
        scalar_values, scalar_dtypes = self._validate_scalars(scalars)
        index = self._num_episodes
        if index == 0:
            self._prepare_scalar_arrays(scalar_dtypes)
        for name, (step_shape, dtype) in self.fields.items():
            padded = np.zeros((self.max_steps, *step_shape), dtype=dtype)
            padded[:length] = arrays[name]
            self._write_slot(name, index, padded)
        for name, value in scalar_values.items():
            self._write_slot(name, index, np.asarray(value, dtype=scalar_dtypes[name]))
        self._write_slot(LENGTH_KEY, index, np.int64(length))
        self._commit(index + 1, scalar_dtypes)
        return index

    def read_episode(self, index: int, fields: Sequence[str] | None = None) -> dict[str, Any]:
        """Read committed episode ``index`` (negative counts from the end).

        Args:
            index: the episode.
            fields: the step fields to read (e.g. the state without the images); None: all.

        Returns:
            one array ``(T, *step_shape)`` per (read) field trimmed to the episode's length ``T``,
            one numpy scalar per per-episode scalar, and ``"length"``: ``T`` as an int.

        Raises:
            IndexError: ``index`` is not a committed episode.
            KeyError: a name in ``fields`` is not a field of the store.
        """
        n = self._num_episodes
        if not -n <= index < n:
            raise IndexError(f"{self.path}: episode {index} out of range ({n} committed)")
        index %= n
        length = int(self._group[LENGTH_KEY][index])
        names = list(self.fields) if fields is None else list(fields)
        unknown = [name for name in names if name not in self.fields]
        if unknown:
            raise KeyError(f"{self.path}: no field {unknown[0]!r}; fields: {', '.join(self.fields)}")
        out: dict[str, Any] = {name: np.asarray(self._group[name][index, :length]) for name in names}
        for name in self.scalars:
            out[name] = np.asarray(self._group[name][index])[()]
        out[LENGTH_KEY] = length
        return out

    def read_scalars(self) -> dict[str, np.ndarray]:
        """The per-episode scalars of every committed episode, without their steps.

        Returns:
            one ``(N,)`` array per per-episode scalar and ``"length"``: ``(N,)`` int64.
        """
        n = self._num_episodes
        out = {name: np.asarray(self._group[name][:n]) for name in self.scalars}
        out[LENGTH_KEY] = np.asarray(self._group[LENGTH_KEY][:n])
        return out

    def read_all(self) -> dict[str, np.ndarray]:
        """Read every committed episode, ``N = len(self)``.

        Returns:
            one zero-padded array ``(N, max_steps, *step_shape)`` per field, one ``(N,)`` array
            per per-episode scalar, and ``"length"``: ``(N,)`` int64 steps of each episode.
        """
        n = self._num_episodes
        out = {name: np.asarray(self._group[name][:n]) for name in self.fields}
        for name in self.scalars:
            out[name] = np.asarray(self._group[name][:n])
        out[LENGTH_KEY] = np.asarray(self._group[LENGTH_KEY][:n])
        return out

    def _validate_episode(self, episode: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
        missing = sorted(set(self.fields) - set(episode))
        unknown = sorted(set(episode) - set(self.fields))
        if missing or unknown:
            raise ValueError(
                f"{self.path}: episode fields do not match the store: missing {missing}, "
                f"unknown {unknown} (declared: {sorted(self.fields)})"
            )
        arrays: dict[str, np.ndarray] = {}
        lengths: dict[str, int] = {}
        for name, (step_shape, dtype) in self.fields.items():
            array = np.asarray(episode[name])
            if array.ndim != 1 + len(step_shape) or array.shape[1:] != step_shape:
                raise ValueError(
                    f"{self.path}: field {name!r} has shape {array.shape}; "
                    f"expected (T, {', '.join(map(str, step_shape))})"
                )
            if not np.can_cast(array.dtype, dtype, casting="same_kind"):
                raise ValueError(
                    f"{self.path}: field {name!r} has dtype {array.dtype}, which does not cast "
                    f"safely to the declared {dtype}"
                )
            arrays[name] = array
            lengths[name] = array.shape[0]
        if len(set(lengths.values())) != 1:
            raise ValueError(f"{self.path}: fields disagree on the episode length T: {lengths}")
        length = next(iter(lengths.values()))
        if not 1 <= length <= self.max_steps:
            raise ValueError(
                f"{self.path}: episode length {length} outside [1, max_steps={self.max_steps}]"
            )
        return arrays, length

    def _validate_scalars(
        self, scalars: Mapping[str, Any]
    ) -> tuple[dict[str, np.ndarray], dict[str, np.dtype]]:
        values = {name: np.asarray(value) for name, value in scalars.items()}
        for name, value in values.items():
            _check_name(name, "scalar", self.path)
            if name in self.fields:
                raise ValueError(f"{self.path}: scalar {name!r} has the name of a field")
            if value.ndim != 0 or value.dtype.kind not in "biuf":
                raise ValueError(
                    f"{self.path}: scalar {name!r} must be one bool or number, got "
                    f"shape {value.shape} dtype {value.dtype}"
                )
        if self._num_episodes == 0:
            return values, {name: value.dtype for name, value in values.items()}
        if set(values) != set(self.scalars):
            raise ValueError(
                f"{self.path}: scalars {sorted(values)} differ from the store's "
                f"{sorted(self.scalars)}"
            )
        for name, value in values.items():
            if not np.can_cast(value.dtype, self.scalars[name], casting="same_kind"):
                raise ValueError(
                    f"{self.path}: scalar {name!r} has dtype {value.dtype}, which does not cast "
                    f"safely to the store's {self.scalars[name]}"
                )
        return values, dict(self.scalars)

    def _prepare_scalar_arrays(self, dtypes: Mapping[str, np.dtype]) -> None:
        """Before the first commit: (re)create the scalar arrays, dropping leftovers of an
        interrupted first append."""
        for name in list(self._group.array_keys()):
            if name not in self.fields and name != LENGTH_KEY:
                del self._group[name]
        for name, dtype in dtypes.items():
            self._group.create_array(
                name, shape=(0,), chunks=(1,), dtype=dtype, fill_value=0,
                compressors=_compressors(),
            )

    def _write_slot(self, name: str, index: int, value: np.ndarray) -> None:
        array = self._group[name]
        if array.shape[0] <= index:
            array.resize((index + 1, *array.shape[1:]))
        array[index] = value

    def _commit(self, num_episodes: int, scalar_dtypes: Mapping[str, np.dtype]) -> None:
        schema = dict(self._group.attrs[_SCHEMA_ATTR])
        schema["scalars"] = {name: dtype.str for name, dtype in scalar_dtypes.items()}
        schema["num_episodes"] = num_episodes
        self._group.update_attributes({_SCHEMA_ATTR: schema})
        self.scalars = dict(scalar_dtypes)
        self._num_episodes = num_episodes
