"""Prompt datasets in the verl/siiRL format, read shard by shard: a worker reads only its own rows.

A row holds at least::

    prompt:        [{"role": "user", "content": "What is 2 + 3?"}, ...]   chat messages
    data_source:   "openai/gsm8k"                                        selects the verifier
    reward_model:  {"ground_truth": "5", ...}                            str (or a number)

Other columns (``ability``, ``extra_info``, ...) are read only when asked for by dotted name, e.g.
``extra_info.answer`` (the supervised target of :mod:`vla_rl.data.arithmetic`).

Files are parquet (``.parquet``) or JSON lines (``.jsonl``). Shard ``k`` of ``d`` reads parquet row
groups ``k, k + d, k + 2d, ...`` with ``ParquetFile.read_row_group`` (never the whole file), or
JSONL lines ``k, k + d, ...`` (it scans the file but parses only its own lines). The shard layout
depends only on the file's metadata, so every worker computes it alone, without communication.

:meth:`PromptFile.validate` and :func:`shard_steps_per_epoch` check a file before any worker reads
it (the run's pre-flight, :mod:`vla_rl.preflight`): parquet from its footer and schema alone,
JSONL line by line; :meth:`PromptFile.iter_rows` then streams every row (the pre-flight's checks
of data sources and prompt lengths). Every error names the file (and the line or column).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

#: Columns every row must have (dotted names address struct fields).
REQUIRED_COLUMNS = ("prompt", "data_source", "reward_model.ground_truth")
_SUFFIXES = (".parquet", ".jsonl")
#: First and last four bytes of every parquet file.
PARQUET_MAGIC = b"PAR1"


@dataclass(frozen=True)
class PromptRow:
    """One prompt of a dataset.

    Attributes:
        index: the row's position in its file (0-based); unique, so it serves as the group id.
        prompt: the chat messages, each ``{"role": str, "content": str}``.
        data_source: the dataset the row comes from; selects the reward verifier.
        ground_truth: the reference answer, as a string.
        extra: the extra columns that were asked for, by dotted name.
    """

    index: int
    prompt: list[dict[str, str]]
    data_source: str
    ground_truth: str
    extra: dict[str, Any] = field(default_factory=dict)


def _lookup(record: Mapping[str, Any], dotted: str) -> Any:
    """``record["a"]["b"]`` for ``"a.b"``; raises ``KeyError(dotted)`` if a level is missing."""
    value: Any = record
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(dotted)
        value = value[part]
    return value


def _schema_has(schema: pa.Schema, dotted: str) -> bool:
    head, *rest = dotted.split(".")
    if head not in schema.names:
        return False
    data_type = schema.field(head).type
    for part in rest:
        if not pa.types.is_struct(data_type) or data_type.get_field_index(part) < 0:
            return False
        data_type = data_type.field(part).type
    return True


def _is_message(message: Any) -> bool:
    """Whether ``message`` is a ``{"role": str, "content": str}`` chat message."""
    return (
        isinstance(message, Mapping)
        and isinstance(message.get("role"), str)
        and isinstance(message.get("content"), str)
    )


def _to_row(record: Mapping[str, Any], index: int, path: Path, extra_columns: Sequence[str]) -> PromptRow:
    """Validate one parsed record and build its :class:`PromptRow`.

    Raises:
        ValueError: a required or requested column is missing or null, or ``prompt`` is not a
            list of ``{role, content}`` messages; the message names the file and the row.
    """
    values = {}
    for column in (*REQUIRED_COLUMNS, *extra_columns):
        try:
            values[column] = _lookup(record, column)
        except KeyError:
            raise ValueError(f"{path}: row {index} has no column {column!r}") from None
        if values[column] is None:  # a requested column too: a null SFT target was trained as the text "None"
            raise ValueError(f"{path}: row {index} has a null {column!r}")
    prompt = values["prompt"]
    if not (isinstance(prompt, list) and prompt and all(map(_is_message, prompt))):
        raise ValueError(
            f"{path}: row {index}: 'prompt' must be a non-empty list of {{'role': str, 'content': str}} "
            f"chat messages, got {prompt!r:.200}"
        )
    return PromptRow(
        index=index,
        prompt=[{"role": m["role"], "content": m["content"]} for m in prompt],
        data_source=str(values["data_source"]),
        ground_truth=str(values["reward_model.ground_truth"]),
        extra={column: values[column] for column in extra_columns},
    )


class PromptFile:
    """One prompt file: its layout from metadata alone, and the rows of one shard on demand.

    Args:
        path: a ``.parquet`` or ``.jsonl`` file.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        IsADirectoryError: ``path`` is a directory.
        ValueError: an unknown suffix, an empty (0-byte) file, (parquet) a file whose magic bytes
            or footer cannot be read, or a required column missing from the schema; the message
            names the file (and the column).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise IsADirectoryError(f"{self.path} is a directory, not a prompt file")
        if not self.path.is_file():
            raise FileNotFoundError(f"prompt file {self.path} does not exist")
        if self.path.suffix not in _SUFFIXES:
            raise ValueError(f"{self.path}: unknown prompt file type; use one of {', '.join(_SUFFIXES)}")
        if self.path.stat().st_size == 0:
            raise ValueError(f"{self.path}: the file is empty (0 bytes)")
        if self.is_parquet:
            schema = self._parquet.schema_arrow
            missing = [column for column in REQUIRED_COLUMNS if not _schema_has(schema, column)]
            if missing:
                raise ValueError(
                    f"{self.path}: missing column {missing[0]!r} (required: {', '.join(REQUIRED_COLUMNS)}; "
                    f"the file has: {', '.join(schema.names)})"
                )

    @property
    def is_parquet(self) -> bool:
        return self.path.suffix == ".parquet"

    @cached_property
    def _parquet(self) -> pq.ParquetFile:
        """The file's parquet reader (footer parsed, no data read).

        Raises:
            ValueError: no ``PAR1`` magic bytes at the start and the end (not parquet, or a
                truncated copy), or an unreadable footer; the message names the file.
        """
        size = self.path.stat().st_size
        with self.path.open("rb") as file:
            head = file.read(len(PARQUET_MAGIC))
            file.seek(max(size - len(PARQUET_MAGIC), 0))
            tail = file.read(len(PARQUET_MAGIC))
        if size < 2 * len(PARQUET_MAGIC) or head != PARQUET_MAGIC or tail != PARQUET_MAGIC:
            where = "start" if head != PARQUET_MAGIC else "end"
            raise ValueError(
                f"{self.path}: not a parquet file: no PAR1 magic bytes at its {where} ({size} bytes; "
                "another format, or a truncated copy)"
            )
        try:
            return pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as error:
            raise ValueError(f"{self.path}: unreadable parquet footer ({error})") from None

    @cached_property
    def _units(self) -> list[int]:
        """Rows of each read unit: parquet row groups, or 1 per non-empty JSONL line."""
        if self.is_parquet:
            metadata = self._parquet.metadata
            return [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        with self.path.open("rb") as lines:
            return [1 for line in lines if line.strip()]

    @property
    def num_rows(self) -> int:
        return sum(self._units)

    def validate(self, extra_columns: Sequence[str] = ()) -> None:
        """Check the whole file without reading any parquet data: a parquet file's schema has the
        required and ``extra_columns`` (``prompt`` a list of structs), a JSONL file's every line
        is UTF-8 JSON with them (and a valid ``prompt``); the file has at least one row.

        Raises:
            ValueError: the first problem; the message names the file and the line or column.
        """
        if self.is_parquet:
            schema = self._parquet.schema_arrow
            for column in extra_columns:
                if not _schema_has(schema, column):
                    raise ValueError(f"{self.path}: missing column {column!r} (the file has: {', '.join(schema.names)})")
            prompt_type = schema.field("prompt").type
            if not (pa.types.is_list(prompt_type) or pa.types.is_large_list(prompt_type)) or not pa.types.is_struct(
                prompt_type.value_type
            ):
                raise ValueError(f"{self.path}: column 'prompt' must hold lists of {{role, content}} chat messages, "
                                 f"its type is {prompt_type}")
        else:
            for index, (line_number, line) in enumerate(self._jsonl_lines()):
                self._jsonl_row(index, line_number, line, extra_columns)
        if self.num_rows == 0:
            raise ValueError(f"{self.path}: the file has no rows")

    def iter_rows(self, batch_size: int = 1024, extra_columns: Sequence[str] = ()) -> Iterator[list[PromptRow]]:
        """Every row of the file, in file order, ``batch_size`` rows at a time (the last batch may
        be shorter); parquet reads only the required columns and ``extra_columns`` (dotted
        names), a record batch at a time.

        Raises:
            ValueError: an invalid row (see :class:`PromptRow`; a missing or null column of
                ``extra_columns`` too); the message names the file.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        extra_columns = tuple(extra_columns)
        if self.is_parquet:
            start = 0
            columns = list(dict.fromkeys([*REQUIRED_COLUMNS, *extra_columns]))
            for batch in self._parquet.iter_batches(batch_size=batch_size, columns=columns):
                records = batch.to_pylist()
                yield [_to_row(record, start + i, self.path, extra_columns) for i, record in enumerate(records)]
                start += len(records)
            return
        rows = []
        for index, (line_number, line) in enumerate(self._jsonl_lines()):
            rows.append(self._jsonl_row(index, line_number, line, extra_columns))
            if len(rows) == batch_size:
                yield rows
                rows = []
        if rows:
            yield rows

    def _jsonl_lines(self) -> Iterable[tuple[int, bytes]]:
        """``(1-based line number, line)`` of the file's non-blank lines."""
        with self.path.open("rb") as lines:
            for line_number, line in enumerate(lines, start=1):
                if line.strip():
                    yield line_number, line

    def _parse_line(self, line: bytes, line_number: int) -> Any:
        """One JSONL line as JSON, decoded as UTF-8.

        Raises:
            ValueError: the line is not UTF-8 or not JSON; the message names the file and line.
        """
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{self.path}: line {line_number} is not valid UTF-8 (byte 0x{line[error.start]:02x} at column "
                f"{error.start + 1}); JSON lines files must be UTF-8: re-encode it, e.g. "
                "iconv -f latin1 -t utf-8"
            ) from None
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{self.path}: line {line_number} is not valid JSON: {error}") from None

    def _jsonl_row(self, index: int, line_number: int, line: bytes, extra_columns: Sequence[str]) -> PromptRow:
        """Row ``index`` of a JSONL file, from its line ``line_number``; errors name both."""
        record = self._parse_line(line, line_number)
        if not isinstance(record, Mapping):
            raise ValueError(f"{self.path}: line {line_number} is a JSON {type(record).__name__}, not an object "
                             "(one row per line)")
        try:
            return _to_row(record, index, self.path, extra_columns)
        except ValueError as error:
            raise ValueError(f"{error} (line {line_number})") from None

    def check_shards(self, num_shards: int, per_shard: int = 1) -> None:
        """Check that the file has a read unit (row group, line) for each of ``num_shards`` shards.

        Raises:
            ValueError: too few; for parquet the message gives a ``row_group_size`` that deals
                every shard at least ``per_shard`` rows (when the file has that many).
        """
        if len(self._units) >= num_shards:
            return
        if not self.is_parquet:
            raise ValueError(f"{self.path} has {len(self._units)} rows, fewer than the {num_shards} shards "
                             "that read it; add rows or read it with a smaller DP size")
        size = _largest_row_group_size(self.num_rows, num_shards, per_shard)
        rewrite = ("" if size is None else "; rewrite it with smaller row groups "
                   f"(pyarrow.parquet.write_table(table, path, row_group_size={size}))")
        raise ValueError(
            f"{self.path} has {len(self._units)} row groups, fewer than the {num_shards} shards that read it "
            f"(each shard reads whole row groups){rewrite}, or read it with a smaller DP size"
            + ("" if size is not None else f", or add rows ({self.num_rows} rows for {num_shards} shards of "
                                             f"{per_shard})")
        )

    def shard_num_rows(self, num_shards: int) -> list[int]:
        """Rows in each of ``num_shards`` shards, from metadata alone.

        Raises:
            ValueError: the file has fewer read units (row groups, lines) than shards.
        """
        self.check_shards(num_shards)
        return [sum(self._units[shard::num_shards]) for shard in range(num_shards)]

    def shard_row_indices(self, shard: int, num_shards: int) -> list[int]:
        """The file positions (:attr:`PromptRow.index`) of the rows of shard ``shard`` of
        ``num_shards``, in the order :meth:`read_shard` returns them, from metadata alone.

        Raises:
            ValueError: bad shard numbers, or too few read units.
        """
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard {shard} outside [0, {num_shards})")
        self.check_shards(num_shards)
        starts = np.concatenate([[0], np.cumsum(self._units)])
        return [index for unit in range(shard, len(self._units), num_shards)
                for index in range(int(starts[unit]), int(starts[unit + 1]))]

    def read_shard(self, shard: int, num_shards: int, extra_columns: Sequence[str] = ()) -> list[PromptRow]:
        """The rows of shard ``shard`` of ``num_shards``, in file order.

        Args:
            shard: which shard, in ``[0, num_shards)``.
            num_shards: number of shards.
            extra_columns: further columns to read into :attr:`PromptRow.extra`, by dotted name.

        Raises:
            ValueError: bad shard numbers, too few read units, a missing extra column, or an
                invalid row (see :class:`PromptRow`); the message names the file.
        """
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard {shard} outside [0, {num_shards})")
        self.check_shards(num_shards)
        starts = np.concatenate([[0], np.cumsum(self._units)])
        if self.is_parquet:
            for column in extra_columns:
                if not _schema_has(self._parquet.schema_arrow, column):
                    raise ValueError(f"{self.path}: missing column {column!r} (asked for as an extra column)")
            columns = list(dict.fromkeys([*REQUIRED_COLUMNS, *extra_columns]))
            rows = []
            for group in range(shard, len(self._units), num_shards):
                records = self._parquet.read_row_group(group, columns=columns).to_pylist()
                rows += [_to_row(r, int(starts[group]) + i, self.path, extra_columns) for i, r in enumerate(records)]
            return rows
        rows = []
        for index, (line_number, line) in enumerate(self._jsonl_lines()):
            if index % num_shards == shard:
                rows.append(self._jsonl_row(index, line_number, line, extra_columns))
        return rows


class ShardedPromptLoader:
    """The prompts of one DP shard, step by step, as ``torch.utils.data.DistributedSampler`` would.

    Shard ``dp_rank`` reads its rows once (lazily, on the first call). Each epoch is a seeded
    permutation of the shard's rows; step ``s`` of an epoch takes the next
    ``prompts_per_step // dp_size`` of them. Every shard runs the same number of steps per epoch
    (set by the smallest shard), so a larger shard leaves a few different rows out each epoch.

    Args:
        path: the prompt file.
        prompts_per_step: prompts per step over all shards.
        dp_rank: this shard, in ``[0, dp_size)``.
        dp_size: number of shards.
        seed: seed of the epoch permutations.
        extra_columns: further columns to read (see :meth:`PromptFile.read_shard`).

    Raises:
        ValueError: ``prompts_per_step`` is not a positive multiple of ``dp_size``, or the
            smallest shard holds fewer rows than one step needs.
    """

    def __init__(
        self,
        path: str | Path,
        prompts_per_step: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
        extra_columns: Sequence[str] = (),
    ) -> None:
        if prompts_per_step < 1 or prompts_per_step % dp_size:
            raise ValueError(
                f"prompts_per_step={prompts_per_step} must be a positive multiple of the DP size {dp_size}"
            )
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank {dp_rank} outside [0, {dp_size})")
        self.file = PromptFile(path)
        self.per_shard = prompts_per_step // dp_size
        self.dp_rank, self.dp_size, self.seed = dp_rank, dp_size, seed
        self.extra_columns = tuple(extra_columns)
        self.steps_per_epoch = shard_steps_per_epoch(self.file, prompts_per_step, dp_size)

    @cached_property
    def rows(self) -> list[PromptRow]:
        """This shard's rows, in file order."""
        return self.file.read_shard(self.dp_rank, self.dp_size, self.extra_columns)

    def rows_for_step(self, step: int) -> list[PromptRow]:
        """This shard's ``prompts_per_step // dp_size`` prompts of training step ``step`` (0-based)."""
        epoch, position = divmod(step, self.steps_per_epoch)
        order = np.random.default_rng([self.seed, epoch, self.dp_rank]).permutation(len(self.rows))
        picked = order[position * self.per_shard : (position + 1) * self.per_shard]
        return [self.rows[i] for i in picked]

    def rows_for_refill(self, step: int, refill_round: int) -> list[PromptRow]:
        """This shard's fresh prompts for dynamic sampling's extra round ``refill_round`` (>= 1)
        of step ``step``: ``prompts_per_step // dp_size`` rows that are neither among the step's
        own rows nor among an earlier round's (so no group id repeats within a step), taken from
        a permutation seeded by ``(seed, step, dp_rank)``.

        Raises:
            ValueError: ``refill_round < 1``, or the shard has too few rows for that many rounds.
        """
        if refill_round < 1:
            raise ValueError(f"refill rounds count from 1 (got {refill_round})")
        taken = {row.index for row in self.rows_for_step(step)}
        fresh = [row for row in self.rows if row.index not in taken]
        order = np.random.default_rng([self.seed, step, self.dp_rank, 1]).permutation(len(fresh))
        picked = order[(refill_round - 1) * self.per_shard : refill_round * self.per_shard]
        if len(picked) < self.per_shard:
            raise ValueError(
                f"{self.file.path}: shard {self.dp_rank} has {len(self.rows)} rows, too few for refill round "
                f"{refill_round} of {self.per_shard} prompts; lower algorithm.filter_groups.max_refill_rounds or add rows"
            )
        return [fresh[i] for i in picked]


def shard_steps_per_epoch(file: PromptFile, prompts_per_step: int, dp_size: int) -> int:
    """Steps per epoch of ``dp_size`` shards each taking ``prompts_per_step // dp_size`` rows a
    step (the smallest shard's rows // that), from the file's metadata alone.

    Raises:
        ValueError: fewer read units than shards, or a shard with fewer rows than one step
            takes; the message names the file and says how to fix it (smaller row groups when
            the rows would suffice dealt more evenly, else fewer prompts per step or more rows).
    """
    per_shard = prompts_per_step // dp_size
    file.check_shards(dp_size, per_shard)
    smallest = min(file.shard_num_rows(dp_size))
    if smallest >= per_shard:
        return smallest // per_shard
    fix = "lower prompts_per_step or add rows"
    if file.is_parquet and file.num_rows // dp_size >= per_shard:
        size = _largest_row_group_size(file.num_rows, dp_size, per_shard)
        fix = (f"row groups are dealt to the shards whole: rewrite it with smaller row groups "
               f"(pyarrow.parquet.write_table(table, path, row_group_size={size})), or {fix}")
    raise ValueError(
        f"{file.path}: its smallest shard has {smallest} rows, fewer than the {per_shard} prompts each of the "
        f"{dp_size} shards needs per step (shards of {', '.join(map(str, file.shard_num_rows(dp_size)))} rows); {fix}"
    )


def _largest_row_group_size(num_rows: int, num_shards: int, per_shard: int) -> int | None:
    """The largest row-group size whose groups, dealt round-robin over ``num_shards`` shards,
    give every shard at least ``per_shard`` of the ``num_rows`` rows (None if none does)."""
    for size in range(max(-(-num_rows // num_shards), 1), 0, -1):  # from ceil(rows / shards): one group each
        groups, rest = -(-num_rows // size), num_rows % size  # the last group holds `rest` rows when > 0
        if groups < num_shards:
            continue
        shard_rows = [-(-(groups - k) // num_shards) * size for k in range(num_shards)]
        if rest:
            shard_rows[(groups - 1) % num_shards] -= size - rest
        if min(shard_rows) >= per_shard:
            return size
    return None


def least_rows(row_group_size: int, num_shards: int, per_shard: int) -> int:
    """The fewest rows whose row groups of ``row_group_size`` (the last one partial), dealt
    round-robin over ``num_shards`` shards as :meth:`PromptFile.shard_num_rows` deals them, give
    every shard at least ``per_shard`` rows (``per_shard`` >= 1): each shard needs
    ``k = ceil(per_shard / row_group_size)`` groups, and the last shard's last group, the file's
    last, may be partial."""
    groups = -(-per_shard // row_group_size)
    return (groups * num_shards - 1) * row_group_size + per_shard - (groups - 1) * row_group_size


def write_prompt_file(rows: Iterable[Mapping[str, Any]], path: str | Path, row_group_size: int = 256) -> Path:
    """Write rows in the verl/siiRL format to a ``.parquet`` or ``.jsonl`` file, atomically.

    Args:
        rows: the rows (see the module docstring), all with the same columns.
        path: the file to write; its suffix picks the format. Parent directories are created.
        row_group_size: rows per parquet row group (the unit a shard reads).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: an unknown suffix, no rows, or a row missing a required column.
    """
    path = Path(path)
    if path.suffix not in _SUFFIXES:
        raise ValueError(f"{path}: unknown prompt file type; use one of {', '.join(_SUFFIXES)}")
    rows = list(rows)
    if not rows:
        raise ValueError(f"{path}: no rows to write")
    for index, row in enumerate(rows):
        _to_row(row, index, path, ())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), tmp, row_group_size=row_group_size)
    else:
        with tmp.open("w") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)
    os.replace(tmp, path)
    return path
