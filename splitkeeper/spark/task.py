"""What a region task writes, and the region task itself.

:func:`run_region_task` is the pure-Python body of one region's work in an
epoch: read the planned ranges through the source's :class:`RegionReader`,
apply the transform, write one parquet file under the staging directory, and
return a small :class:`RegionResult`. :func:`region_task` is what a Spark task runs: the body
for one :class:`RegionTask` (the named, picklable payload the runner ships,
:mod:`splitkeeper.spark.runner`). This module never imports pyspark at import time, so the body
runs (and is tested) without Spark.

The staging layout is :mod:`splitkeeper.staging`'s: ``<staging>/epoch=<N>/region=<r>/attempt=<id>/
part.parquet``. A file is written under a temporary name in its attempt directory and renamed
when complete, so a visible ``part.parquet`` is always whole. The driver only reads what a
finished task returned (its :class:`~splitkeeper.staging.StagedRegion`); other attempts' files are
garbage for the staging cleanup. A staged file has every column of the sink table (the
task stamps ``ingested_at``; the schema is :data:`~splitkeeper.delta.schemas.STAGED_FILE_SCHEMA`,
from :mod:`splitkeeper.delta.schemas`), so a sink can adopt it as a data file as it is, without
rewriting it (:meth:`splitkeeper.sinks.delta.sink.DeltaSink.commit`).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import re
import time
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from splitkeeper.core.defaults import MAX_BAD_RATIO
from splitkeeper.core.source import RecordMeta, RegionReader, SourceRecord, SupportsWarmUp
from splitkeeper.core.types import Split
from splitkeeper.delta.schemas import META_COLUMNS, STAGED_FILE_SCHEMA, STAGED_SCHEMA, sink_schema
from splitkeeper.errors import (
    BadRecordError,
    InjectedFault,
    InvalidParameterError,
    ProtocolError,
    SchemaDriftError,
    SchemaRegistryError,
    SourceError,
    SplitkeeperError,
    SplitReadError,
    TransformError,
)
from splitkeeper.records.columnar import RangeColumns, SupportsColumnarRead
from splitkeeper.records.decode import BadRecords, Decoded, decode_values
from splitkeeper.records.spec import INGESTED_DATE, RESCUED, TOMBSTONE, DecodeSpec
from splitkeeper.records.upsert import UpsertSpec
from splitkeeper.staging import (
    DEAD_FILE,
    PART_FILE,
    ROW_GROUP_ROWS,
    StagedRegion,
    StagedTarget,
    attempt_dir,
    new_attempt,
    parquet_options,
    partition_folder,
    read_table,
    write_manifest,
)
from splitkeeper.transforms import Transform, apply_to_table, identity

_ROW_GROUP = ROW_GROUP_ROWS


#: What finds the failed split's id in a region's error text (``[SPLIT_READ_FAILED] split "x" ...``).
SPLIT_READ_FAILED = re.compile(r'\[SPLIT_READ_FAILED\] split ("(?:[^"\\]|\\.)*") at offset (\d+)')


def failed_splits(error: str) -> tuple[str, ...]:
    """The split ids a region's error text names as failed (none for other failures)."""
    return tuple(dict.fromkeys(json.loads(m.group(1)) for m in SPLIT_READ_FAILED.finditer(error)))


class FaultKind(enum.Enum):
    FAIL = "fail"  # the task raises InjectedFault after reading, before publishing its output
    FLAKY = "flaky"  # like FAIL in a task's first attempt only: a Spark retry of the task succeeds
    STALL = "stall"  # the task sleeps ``seconds`` before reading (past the region timeout)


@dataclass(frozen=True, slots=True)
class RegionFault:
    """A fault to inject into one region task (chosen by the driver's fault plan)."""

    kind: FaultKind
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.kind, FaultKind):
            raise InvalidParameterError("kind", self.kind, "a FaultKind ('fail', 'flaky' or 'stall')")
        if self.seconds < 0 or (self.kind is FaultKind.STALL and self.seconds == 0):
            raise InvalidParameterError(
                "seconds", self.seconds, "> 0 for a stall, >= 0 otherwise", hint=f"fault {self.kind.value}"
            )

    @classmethod
    def parse(cls, text: str) -> RegionFault:
        """``'fail'``, ``'flaky'`` or ``'stall:<seconds>'``."""
        kind, _, seconds = text.partition(":")
        try:
            fault_kind = FaultKind(kind)
            return cls(fault_kind, float(seconds) if seconds else 0.0)
        except ValueError as err:
            raise InvalidParameterError("fault", text, "'fail', 'flaky' or 'stall:<seconds>'") from err


@dataclass(frozen=True, slots=True)
class StagedOutput:
    """A complete staged parquet file: where, how many rows, how many bytes."""

    path: str
    records: int
    bytes: int


@dataclass(frozen=True, slots=True)
class RegionResult:
    """What a region task returns to the driver (small; pickled back from the executor).

    ``positions`` maps every planned split to its new position (the planned
    end). ``backlog_finished`` lists planned splits whose new position reached
    their ``backlog_end`` (reported every time; the enumerator deduplicates).
    ``staged`` (its file: ``staged_path``) is the only output of this attempt the sink may read; it
    is written even when no record was read, so every acknowledged epoch commits.
    A declined or timed-out region is built by the driver with :meth:`declined`.
    """

    region_id: int
    ack: bool
    positions: dict[str, int] = field(default_factory=dict)
    records: int = 0
    staged_path: str | None = None
    staged: StagedRegion | None = None
    backlog_finished: tuple[str, ...] = ()
    error: str | None = None
    epoch: int = 0
    attempt: str = ""
    staged_bytes: int = 0
    records_by_split: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    dead_letters: int = 0  # bad records staged to dead_letter_path (errors.tolerance: all)
    dead_letter_path: str | None = None  # <attempt dir>/dead.parquet, None when there were none
    dead_letters_by_split: dict[str, int] = field(default_factory=dict)

    @classmethod
    def declined(cls, region_id: int, epoch: int, error: str) -> RegionResult:
        """A region that did not acknowledge (task failed or timed out); ``error`` says why."""
        return cls(region_id=region_id, ack=False, epoch=epoch, error=error)


class StagedWriter:
    """Streams records into one parquet file, published atomically by :meth:`commit`.

    ``schema``: the sink's schema (:func:`~splitkeeper.delta.schemas.sink_schema`; default the
    raw sink's, :data:`STAGED_FILE_SCHEMA`); the writer stamps the bookkeeping columns and
    takes the data columns by name. Rows go in row groups to a
    :class:`~splitkeeper.staging.StagedTarget` (``<path>.tmp-<random>`` on local disk, the object
    itself on an object store); :meth:`commit` closes it and publishes it at ``path``;
    :meth:`abort` (or leaving a ``with`` block by an exception) deletes what was written. Single
    use, single thread.

    ``partition_by``: the sink's partition columns. The writer then keeps the rows until
    :meth:`commit` and writes one file per partition value, Delta's layout
    ``<dir of path>/<col>=<value>/part-<n>.parquet`` without the partition columns, and the
    manifest :data:`PARTS_FILE` naming them (the published path; the sink reads it, so a commit
    redone after some files were moved still finds them all). ``widen``: a data table may
    bring columns the schema lacks (``decode.on_new_fields: add_columns``); they are appended,
    nullable, to the file's schema at :meth:`commit` (rows are kept until then too).
    """

    def __init__(
        self,
        path: str,
        epoch: int,
        region: int,
        schema: pa.Schema = STAGED_FILE_SCHEMA,
        *,
        partition_by: Sequence[str] = (),
        widen: bool = False,
    ) -> None:
        self.path = path
        self.epoch = epoch
        self.region = region
        self.schema = schema
        self.partition_by = tuple(partition_by)
        self._widen = widen
        self._buffered = bool(self.partition_by) or widen
        self._target = StagedTarget(path)
        self._writer: pq.ParquetWriter | None = None
        self._open = True
        if not self._buffered:
            self._writer = pq.ParquetWriter(
                self._target.where,
                schema,
                filesystem=self._target.filesystem,
                **parquet_options(schema),
            )
        self._ingested_at = pa.scalar(time.time_ns() // 1000, pa.timestamp("us", tz="UTC"))
        self._split_ids: list[str] = []
        self._offsets: list[int] = []
        self._next_offsets: list[int] = []
        self._values: list[bytes | None] = []
        self._metas: list[RecordMeta | None] = []  # filled once a record carries metadata
        self._has_meta = False
        self._batches: list[pa.RecordBatch] = []  # built, not yet written: less than a row group
        self._batched = 0
        self._published: list[StagedTarget] = []
        self.records = 0
        self.last_next_offset: int | None = None

    @property
    def added_columns(self) -> list[str]:
        """``widen``: the columns the rows added so far bring beyond the schema, in order."""
        names = set(self.schema.names)
        out: list[str] = []
        for batch in self._batches:
            out += [n for n in batch.schema.names if n not in names and n not in out]
        return out

    def add(self, split_id: str, records: Iterable[SourceRecord]) -> int:
        """Append the records of one split (their values as the ``value`` column); returns how
        many were added. A ``str`` value (a reader of an older contract) is its UTF-8 bytes.

        Afterwards :attr:`last_next_offset` is the ``next_offset`` of the last
        record added by this call (``None`` if it added none).
        """
        offsets, next_offsets, values, metas = self._offsets, self._next_offsets, self._values, self._metas
        count = 0
        next_offset = None
        for record in records:
            offsets.append(record[0])
            next_offset = record[1]
            next_offsets.append(next_offset)
            value = record[2]
            values.append(value.encode("utf-8") if isinstance(value, str) else value)
            meta = record[3] if len(record) > 3 else None
            if meta is not None and not self._has_meta:
                self._has_meta = True
                metas.extend([None] * (len(values) - 1 - len(metas)))
            if self._has_meta:
                metas.append(meta)
            count += 1
            if len(values) >= _ROW_GROUP:
                self._split_ids.extend([split_id] * (len(values) - len(self._split_ids)))
                self._batch_rows()
        self._split_ids.extend([split_id] * (len(values) - len(self._split_ids)))
        self.records += count
        self.last_next_offset = next_offset if count else None
        return count

    def add_columns(self, split_id: str, columns: RangeColumns, values: pa.Array | None = None) -> int:
        """Append the records of one split given as columns (``values`` replaces ``columns.values``
        as the ``value`` column).

        No Python step per record: the columns (the metadata columns too, when
        ``columns.meta`` has them) become record batches as they are. Sets
        :attr:`last_next_offset` as :meth:`add` does; returns the count.
        """
        values = columns.values if values is None else values
        self.last_next_offset = columns.last_next_offset
        return self._add(
            split_id, columns.offsets, columns.next_offsets, pa.table({"value": values}), columns.meta
        )

    def add_table(
        self,
        split_id: str,
        offsets: pa.Array,
        next_offsets: pa.Array,
        data: pa.Table,
        meta: Sequence[pa.Array] | None,
        last_next_offset: int | None,
    ) -> int:
        """Append rows of one split: their bookkeeping columns and their data columns (``data``,
        by name; a data column of the schema that ``data`` lacks is null). Sets
        :attr:`last_next_offset` to ``last_next_offset`` (the range's, kept rows or not)."""
        self.last_next_offset = last_next_offset
        return self._add(split_id, offsets, next_offsets, data, meta)

    def _add(
        self,
        split_id: str,
        offsets: pa.Array,
        next_offsets: pa.Array,
        data: pa.Table,
        meta: Sequence[pa.Array] | None,
    ) -> int:
        n = data.num_rows
        if n == 0:
            return 0
        self._batch_rows()  # rows added by add() go first
        self._batch(
            pa.repeat(pa.scalar(split_id, pa.string()), n),
            offsets,
            next_offsets,
            data,
            list(meta) if meta is not None else [pa.nulls(n, _meta_type(name)) for name in META_COLUMNS],
        )
        self.records += n
        return n

    def _meta_arrays(self, n: int) -> list[pa.Array]:
        """The key, topic, partition, timestamp and headers columns of the buffered rows."""
        if not self._has_meta:
            return [pa.nulls(n, _meta_type(name)) for name in META_COLUMNS]
        return _meta_columns(self._metas)

    def _batch_rows(self) -> None:
        """Turn the rows :meth:`add` buffered into a record batch."""
        n = len(self._values)
        if n == 0:
            return
        self._batch(
            pa.array(self._split_ids, pa.string()),
            pa.array(self._offsets, pa.int64()),
            pa.array(self._next_offsets, pa.int64()),
            pa.table({"value": pa.array(self._values, pa.binary())}),
            self._meta_arrays(n),
        )
        self._split_ids.clear()
        self._offsets.clear()
        self._next_offsets.clear()
        self._values.clear()
        self._metas.clear()

    def _batch(
        self,
        split_ids: pa.Array,
        offsets: pa.Array,
        next_offsets: pa.Array,
        data: pa.Table,
        metas: list[pa.Array],
    ) -> None:
        """Queue one batch of rows; write whole row groups of ``_ROW_GROUP`` rows once there are any."""
        n = data.num_rows
        own = {
            "split_id": split_ids,
            "offset": offsets,
            "next_offset": next_offsets,
            "epoch": pa.repeat(pa.scalar(self.epoch, pa.int64()), n),
            "region": pa.repeat(pa.scalar(self.region, pa.int32()), n),
            "ingested_at": pa.repeat(self._ingested_at, n),
            **dict(zip(META_COLUMNS, metas, strict=True)),
        }
        arrays: list[pa.Array] = []
        for f in self.schema:
            if f.name in own:
                arrays.append(own[f.name])
            elif f.name == INGESTED_DATE:
                arrays.append(pa.repeat(self._ingested_at, n).cast(f.type))
            elif f.name in data.column_names:
                column = data.column(f.name).combine_chunks()
                arrays.append(column if column.type == f.type else column.cast(f.type))
            elif f.name == TOMBSTONE:  # an upsert sink's: a record without a value (a Kafka tombstone)
                value = data.column("value") if "value" in data.column_names else None
                arrays.append(
                    pa.repeat(pa.scalar(False), n) if value is None else value.combine_chunks().is_null()
                )
            else:
                arrays.append(pa.nulls(n, f.type))
        fields = list(self.schema)
        unknown = [name for name in data.column_names if name not in self.schema.names]
        if unknown and not self._widen:
            raise ProtocolError(
                f"staged file {self.path}: the records have the columns {unknown}, which the sink's schema "
                f"({self.schema.names}) lacks; a batch transform must return the same columns for every "
                "batch as for an empty one"
            )
        if self._widen:  # the data's columns the schema lacks come last, nullable
            for name in data.column_names:
                if name not in self.schema.names:
                    column = data.column(name).combine_chunks()
                    fields.append(pa.field(name, column.type, nullable=True))
                    arrays.append(column)
        self._batches.append(pa.record_batch(arrays, schema=pa.schema(fields)))
        self._batched += n
        if self._batched >= _ROW_GROUP and not self._buffered:
            self._write(whole_groups_only=True)

    def _write(self, whole_groups_only: bool) -> None:
        if not self._batched or self._writer is None:
            return
        table = pa.Table.from_batches(self._batches, self.schema)
        rows = (self._batched // _ROW_GROUP) * _ROW_GROUP if whole_groups_only else self._batched
        self._writer.write_table(table.slice(0, rows), row_group_size=_ROW_GROUP)
        rest = table.slice(rows)
        self._batches = rest.to_batches()
        self._batched = rest.num_rows

    def _flush(self) -> None:
        self._batch_rows()
        self._write(whole_groups_only=False)

    def _buffered_table(self) -> pa.Table:
        """Every kept row, in the schema widened by the new columns in their order of appearance."""
        fields = list(self.schema)
        for batch in self._batches:
            for f in batch.schema:
                if f.name not in [g.name for g in fields]:
                    fields.append(f)
        schema = pa.schema(fields)
        tables = []
        for batch in self._batches:
            table = pa.Table.from_batches([batch])
            for f in schema:
                if f.name not in table.column_names:
                    table = table.append_column(f, pa.nulls(table.num_rows, f.type))
            tables.append(table.select(schema.names).cast(schema))
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def _commit_buffered(self) -> StagedOutput:
        """Write the kept rows: one file (``widen``), or one file per partition value under the
        attempt directory (``partition_by``), each written under a temporary name, then renamed."""
        self._batch_rows()
        table = self._buffered_table()
        if not self.partition_by:
            pq.write_table(
                table,
                self._target.where,
                filesystem=self._target.filesystem,
                row_group_size=_ROW_GROUP,
                **parquet_options(table.schema, data_dictionary=True),
            )
            return StagedOutput(self.path, self.records, self._target.publish())
        folder = os.path.dirname(self.path)
        keys = table.select(list(self.partition_by))
        groups = (
            keys.group_by(list(self.partition_by), use_threads=False).aggregate([]) if len(table) else keys
        )
        data = table.drop_columns(list(self.partition_by))
        size = 0
        for i, row in enumerate(groups.to_pylist()):
            mask = None
            for name, value in row.items():
                column = table.column(name)
                this = (
                    pc.is_null(column) if value is None else pc.equal(column, pa.scalar(value, column.type))
                )
                mask = this if mask is None else pc.and_(mask, this)
            part = data.filter(mask)
            target = StagedTarget(os.path.join(folder, partition_folder(row), f"part-{i:05d}.parquet"))
            self._published.append(target)
            pq.write_table(
                part,
                target.where,
                filesystem=target.filesystem,
                row_group_size=_ROW_GROUP,
                **parquet_options(part.schema, data_dictionary=True),
            )
            size += target.publish()
        manifest = write_manifest(folder, [target.path for target in self._published])
        return StagedOutput(manifest, self.records, size)

    def commit(self) -> StagedOutput:
        """Flush, close and rename into place. Returns the published file (partitioned: the
        manifest naming the published files)."""
        if not self._open:
            raise ProtocolError(f"staged file {self.path} was already committed or aborted")
        try:
            if self._buffered:
                self._open = False
                return self._commit_buffered()
            self._flush()
            assert self._writer is not None
            self._writer.close()
            self._writer = None
            self._open = False
            size = self._target.publish()
        except BaseException:
            self.abort()
            raise
        return StagedOutput(self.path, self.records, size)

    def abort(self) -> None:
        """Drop everything written so far. Idempotent."""
        self._open = False
        if self._writer is not None:
            try:
                self._writer.close()
            finally:
                self._writer = None
        self._target.discard()
        for published in self._published:
            published.discard()
        self._published.clear()

    def __enter__(self) -> StagedWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None or self._open:
            self.abort()


def _meta_type(name: str) -> pa.DataType:
    return STAGED_FILE_SCHEMA.field(name).type


def write_staged(
    records: Iterable[SourceRecord], split_ids: Iterable[str] | str, path: str, *, epoch: int, region: int
) -> StagedOutput:
    """Write records to a parquet file at ``path`` atomically (only a whole file is visible).

    ``split_ids`` is one split id for all records, or one id per record.
    """
    with StagedWriter(path, epoch, region) as writer:
        if isinstance(split_ids, str):
            writer.add(split_ids, records)
        else:
            for split_id, record in zip(split_ids, records, strict=True):
                writer.add(split_id, (record,))
        return writer.commit()


def read_staged(path: str) -> pa.Table:
    """The records of a staged file (its :data:`STAGED_SCHEMA` columns; for tests and validation)."""
    return read_table(path, columns=STAGED_SCHEMA.names).cast(STAGED_SCHEMA)


@dataclass(frozen=True, slots=True)
class RecordPolicy:
    """What a region task does with a range's bytes (built once from the pipeline's config and
    shipped with every task): ``decode`` (the spec), ``tolerance`` (``none``: a bad record fails
    the region; ``all``: it is a dead letter), ``max_bad_ratio`` (per region and epoch, above it
    the region fails), ``partition_by`` (the sink's partition columns). The default is the raw
    sink: the bytes as read, no partitions."""

    decode: DecodeSpec = field(default_factory=DecodeSpec)
    tolerance: str = "none"
    max_bad_ratio: float = MAX_BAD_RATIO
    partition_by: tuple[str, ...] = ()
    data: pa.Schema | None = None  # a batch transform's output columns (transforms.output_schema)
    upsert: UpsertSpec | None = None  # sink.mode upsert: staged rows carry the tombstone column
    columns: tuple[str, ...] = ()  # add_columns: the sink's columns beyond the schema's, at the epoch's start

    @property
    def schema(self) -> pa.Schema:
        """The staged files' schema: the sink's (the change table's, for an upsert sink)."""
        return sink_schema(self.decode, self.partition_by, self.data, tombstone=self.upsert is not None)

    @property
    def widen(self) -> bool:
        return self.decode.on_new_fields == "add_columns" and self.decode.typed


def run_region_task(
    plan_for_region: Sequence[tuple[Split, int, int]],
    reader: RegionReader,
    transform: Transform,
    staging_root: str,
    epoch: int,
    region: int,
    attempt: str | None = None,
    fault: RegionFault | None = None,
    policy: RecordPolicy | None = None,
) -> RegionResult:
    """Run one region's share of epoch ``epoch``; called inside the region's Spark task.

    Per planned ``(split, start, end)``: read the range (as Arrow columns when the reader
    :class:`~splitkeeper.records.columnar.SupportsColumnarRead`, else its records made into
    columns) -> decode the values (:func:`~splitkeeper.records.decode.decode_values` with
    ``policy.decode``) -> apply ``transform`` to the kept rows
    (:func:`~splitkeeper.transforms.apply_to_table`) -> stage the kept rows with their
    bookkeeping columns, all splits into one staged file (one per partition value for a
    partitioned sink). A raw sink with the identity transform stages the columns as read
    (no decode step, no Python step per record). Bad records: with ``policy.tolerance``
    ``none`` the first fails the region (SplitReadError naming split, offset, stage and
    reason); with ``all`` they go to ``dead.parquet`` beside the staged file
    (:class:`~splitkeeper.spark.dead_letters.DeadLetterWriter`), counted in the result, and
    the region fails when more than ``policy.max_bad_ratio`` of its records are bad.
    ``attempt`` names the attempt directory; ``None`` draws a fresh id, which is what a
    Spark task should pass so that a retried task never shares a file with an earlier
    attempt. The new position of a split is its planned ``end`` (or, for a range planned
    mid-record, the end of the last record read). Any failure raises (SourceError,
    TransformError, InjectedFault, OSError): the job fails and the driver declines the
    region; nothing is published then. Calling it twice with the same plan writes the same
    rows to two attempts.
    """
    from splitkeeper.spark.dead_letters import DeadLetterWriter

    started = time.monotonic()
    policy = policy or RecordPolicy()
    attempt = attempt or new_attempt()
    if fault is not None and fault.kind is FaultKind.STALL:
        time.sleep(fault.seconds)
    seen: set[str] = set()
    positions: dict[str, int] = {}
    counts: dict[str, int] = {}
    dead_counts: dict[str, int] = {}
    first_bad: dict[str, list[int]] = {}
    backlog_finished: list[str] = []
    folder = attempt_dir(staging_root, epoch, region, attempt)
    path = os.path.join(folder, PART_FILE)
    tolerant = policy.tolerance == "all"
    dead = DeadLetterWriter(os.path.join(folder, DEAD_FILE), epoch, region, attempt) if tolerant else None
    fast = policy.decode.kind == "raw" and transform is identity
    read = 0
    for split, _start, _end in plan_for_region:
        if split.split_id in seen:
            raise ProtocolError(
                f"epoch {epoch} region {region}: split {split.split_id!r} is planned twice", epoch=epoch
            )
        seen.add(split.split_id)
    read_all = _read_ranges(reader, plan_for_region)
    with (
        contextlib.closing(read_all),
        StagedWriter(
            path, epoch, region, policy.schema, partition_by=policy.partition_by, widen=policy.widen
        ) as writer,
    ):
        for split, start, end in plan_for_region:
            try:
                columns = next(read_all)
                read += len(columns.offsets)
                if fast and not columns.bad:
                    counts[split.split_id] = writer.add_columns(split.split_id, columns)
                else:
                    bad = _stage_range(writer, split.split_id, columns, transform, policy)
                    if len(bad):
                        bad_offsets = columns.offsets.take(pa.array(bad.indices, pa.int64())).to_pylist()
                        if dead is None:
                            raise BadRecordError(
                                f"{bad.stages[0]} failed: {bad.error_classes[0]}: {bad.messages[0]} "
                                "(errors.tolerance is 'none': a bad record fails its region; set "
                                "errors.tolerance: all and errors.dead_letter.path to keep going)",
                                offset=bad_offsets[0],
                                stage=bad.stages[0],
                            )
                        meta = columns.meta
                        dead.add(
                            split.split_id,
                            columns.offsets,
                            columns.next_offsets,
                            None if meta is None else meta[0],
                            columns.values,
                            bad,
                            None if meta is None else tuple(meta),
                        )
                        dead_counts[split.split_id] = len(bad)
                        first_bad[split.split_id] = bad_offsets[:5]
                    counts[split.split_id] = len(columns.offsets) - len(bad)
            except (BadRecordError, TransformError, SchemaRegistryError) as err:
                raise SplitReadError(split.split_id, int(err.params.get("offset", start)), err) from err
            except Exception as err:  # the split's records cannot be read or transformed: name the split
                failed, failed_start = _failed_range(err, plan_for_region, split, start)
                raise SplitReadError(failed.split_id, failed_start, err) from err
            last = writer.last_next_offset
            position = end if last is None else max(end, last)
            if split.end is not None and position > split.end:
                raise SourceError(
                    f"split {split.split_id!r}: reading [{start}, {end}) ended at {position}, past the split "
                    f"end {split.end}; the reader does not honour the split bounds",
                    split_id=split.split_id,
                )
            positions[split.split_id] = position
            if split.backlog_end is not None and position >= split.backlog_end:
                backlog_finished.append(split.split_id)
        bad_total = sum(dead_counts.values())
        if bad_total and bad_total > policy.max_bad_ratio * read:
            worst = max(dead_counts, key=lambda k: dead_counts[k])
            raise SplitReadError(
                worst,
                first_bad[worst][0],
                BadRecordError(
                    f"{bad_total} of the {read} records of region {region} in epoch {epoch} are bad, more "
                    f"than errors.max_bad_ratio {policy.max_bad_ratio:g}; split {worst!r} has "
                    f"{dead_counts[worst]}, the first at offsets {first_bad[worst]}. Nothing was published: "
                    "fix the producer or the decode settings, or raise errors.max_bad_ratio"
                ),
            )
        if fault is not None and fault.kind in (FaultKind.FAIL, FaultKind.FLAKY):
            raise InjectedFault(
                f"injected fault: region {region} fails at epoch {epoch} (attempt {attempt}) as the fault "
                f"plan asked{' (first task attempt only)' if fault.kind is FaultKind.FLAKY else ''}; "
                f"{writer.records} records read were not published",
                region=region,
                epoch=epoch,
            )
        dead_path = dead.commit() if dead is not None else None
        staged = writer.commit()
    return RegionResult(
        region_id=region,
        ack=True,
        positions=positions,
        records=staged.records,
        staged_path=staged.path,
        staged=StagedRegion(staging_root, epoch, region, attempt, os.path.basename(staged.path)),
        backlog_finished=tuple(backlog_finished),
        epoch=epoch,
        attempt=attempt,
        staged_bytes=staged.bytes,
        records_by_split=counts,
        elapsed_s=time.monotonic() - started,
        dead_letters=bad_total,
        dead_letter_path=dead_path,
        dead_letters_by_split=dead_counts,
    )


_TEXT = DecodeSpec(kind="text")


def _stage_range(
    writer: StagedWriter, split_id: str, columns: RangeColumns, transform: Transform, policy: RecordPolicy
) -> BadRecords:
    """Decode, transform and stage one range's kept rows; its bad records (input indices)."""
    n = len(columns.offsets)
    if n == 0:
        writer.last_next_offset = None
        return BadRecords()
    if columns.bad:
        return _stage_refused(writer, split_id, columns, transform, policy)
    # A raw sink with a transform: the transform (value: str) -> str sees the values as text (bytes that
    # are not UTF-8 are bad records of stage decode), and the sink keeps the UTF-8 bytes it returns.
    spec = _TEXT if policy.decode.kind == "raw" else policy.decode
    tombstones = pa.array([], pa.int64())
    try:
        if policy.upsert is not None and spec.typed:
            decoded, tombstones = _decode_with_tombstones(spec, columns.values)
        elif policy.widen:  # the columns added before (epochs, ranges): another spelling is rescued
            decoded = decode_values(spec, columns.values, known=(*policy.columns, *writer.added_columns))
        else:
            decoded = decode_values(spec, columns.values)
    except SchemaDriftError as err:
        index = err.params.get("index")
        offset = columns.offsets[int(index)].as_py() if isinstance(index, int) and 0 <= index < n else None
        raise BadRecordError(
            f"schema failed: {err.message}", **({"offset": offset} if offset is not None else {})
        ) from err
    except SchemaRegistryError as err:  # the range is read again; the error names the record's offset
        index = err.params.get("index")
        if isinstance(index, int) and 0 <= index < n:
            err.params["offset"] = columns.offsets[index].as_py()
        raise
    kept = decoded.kept
    offsets = columns.offsets.take(kept)
    bad = decoded.bad
    if (
        policy.tolerance == "all" and transform is not identity
    ):  # a record its transform fails on is a dead letter
        table, rows, failed = apply_to_table(transform, decoded.table, offsets, split_id, tolerate=True)
        if len(failed):
            bad = _merged(bad, failed, kept)
            kept, offsets = kept.take(rows), offsets.take(rows)
    else:
        table = apply_to_table(transform, decoded.table, offsets, split_id)
    if spec is _TEXT:
        table = table.set_column(0, "value", table.column("value").cast(pa.binary()))
    if policy.upsert is not None and table.num_rows:  # a record without its key is bad, not a NULL key
        keyless = _keyless(policy.upsert, table, columns.meta, kept)
        if len(keyless):
            bad = _merged(bad, keyless, kept)
            rows = pa.array(np.setdiff1d(np.arange(table.num_rows), keyless.indices))
            table, kept, offsets = table.take(rows), kept.take(rows), offsets.take(rows)
    if len(tombstones):  # an upsert sink's null values: rows of null data columns, tombstone true
        table = table.append_column(TOMBSTONE, pa.repeat(pa.scalar(False), table.num_rows))
        marked = pa.table({TOMBSTONE: pa.repeat(pa.scalar(True), len(tombstones))})
        rows = pa.concat_tables([table, marked], promote_options="default")
        every = pa.concat_arrays([kept.cast(pa.int64()), tombstones])
        order = pc.sort_indices(every)
        table, kept = rows.take(order), every.take(order)
        offsets = columns.offsets.take(kept)
    writer.add_table(
        split_id,
        offsets,
        columns.next_offsets.take(kept),
        table,
        None if columns.meta is None else [m.take(kept) for m in columns.meta],
        columns.last_next_offset,
    )
    return bad


def _keyless(
    upsert: UpsertSpec, table: pa.Table, meta: Sequence[pa.Array] | None, kept: pa.Array
) -> BadRecords:
    """An upsert sink's rows (``table``, input indices ``kept``; no tombstone among them) whose key
    has a null column (records.upsert rule 1): bad records of stage schema, by row of ``table``.
    A key column the rows do not have yet (a Spark transform makes it) is not checked here."""
    null = np.zeros(table.num_rows, np.bool_)
    which: dict[int, str] = {}
    for name in upsert.key:
        if name == "key":
            column = meta[0].take(kept) if meta is not None else pa.nulls(table.num_rows, pa.binary())
        elif name in table.column_names:
            column = table.column(name)
        else:
            continue
        hit = np.asarray(column.is_null()) & ~null
        for j in np.flatnonzero(hit).tolist():
            which[j] = name
        null |= hit
    out = BadRecords()
    rescued = table.column(RESCUED) if RESCUED in table.column_names else None
    for j in np.flatnonzero(null).tolist():
        name = which[j]
        if name == "key":
            why = "the record has no Kafka key"
        else:
            why = f"its key column {name!r} is null (missing, null, or a value of another type"
            text = rescued[j].as_py() if rescued is not None else None
            why += f"; the record's {RESCUED}: {text})" if text else ")"
        out.add(
            j,
            "schema",
            f"{why}, and sink.key is {list(upsert.key)}: a record of an upsert sink needs its key (a "
            "null key is no key: such records would overwrite one another); fix the producer, or "
            "declare the key column's type to match",
            "NullKey",
        )
    return out


def _stage_refused(
    writer: StagedWriter, split_id: str, columns: RangeColumns, transform: Transform, policy: RecordPolicy
) -> BadRecords:
    """A range with records its source's format refused (``columns.bad``, a jsonl line that is not
    JSON): the others staged as any range's, those bad records of stage decode with the reader's
    error; every bad record by its index in ``columns``."""
    refused = np.zeros(len(columns.offsets), np.bool_)
    refused[[b.row for b in columns.bad]] = True
    good = pa.array(~refused)
    rest = RangeColumns(
        columns.offsets.filter(good),
        columns.next_offsets.filter(good),
        columns.values.filter(good),
        None if columns.meta is None else tuple(m.filter(good) for m in columns.meta),
    )
    inner = _stage_range(writer, split_id, rest, transform, policy)
    writer.last_next_offset = columns.last_next_offset  # the range's, whichever record is last
    where = np.flatnonzero(~refused)
    entries = [
        *(
            (int(where[i]), stage, cls, msg)
            for i, stage, cls, msg in zip(
                inner.indices, inner.stages, inner.error_classes, inner.messages, strict=True
            )
        ),
        *((b.row, "decode", b.error_class, b.message) for b in columns.bad),
    ]
    merged = BadRecords()
    for index, stage, cls, msg in sorted(entries, key=lambda e: e[0]):
        merged.add(index, stage, msg, cls)
    return merged


def _decode_with_tombstones(spec: DecodeSpec, values: pa.Array) -> tuple[Decoded, pa.Array]:
    """An upsert sink's typed decode: the non-null values decoded (indices are the input's), and the
    input indices of the null values (tombstones: rows of null data columns, not bad records)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    nulls = values.is_null()
    if not pc.any(nulls).as_py():
        return decode_values(spec, values), pa.array([], pa.int64())
    everything = pa.array(range(len(values)), pa.int64())
    present = everything.filter(pc.invert(nulls))
    try:
        decoded = decode_values(spec, values.filter(pc.invert(nulls)))
    except (SchemaDriftError, SchemaRegistryError) as err:
        index = err.params.get("index")
        if isinstance(index, int) and 0 <= index < len(present):
            err.params["index"] = present[index].as_py()
        raise
    where = present.to_pylist()
    bad = BadRecords()
    for index, stage, cls, msg in zip(
        decoded.bad.indices, decoded.bad.stages, decoded.bad.error_classes, decoded.bad.messages, strict=True
    ):
        bad.add(where[index], stage, msg, cls)
    moved = Decoded(decoded.table, present.take(decoded.kept), bad, decoded.new_columns)
    return moved, everything.filter(nulls)


def _merged(decoded: BadRecords, failed: BadRecords, kept: pa.Array) -> BadRecords:
    """The decode stage's bad records and the transform's (whose indices are rows of the decoded
    table, ``kept`` maps them to input indices), as one list in input order."""
    rows = kept.to_pylist()
    entries = [
        *zip(decoded.indices, decoded.stages, decoded.error_classes, decoded.messages, strict=True),
        *(
            (rows[i], stage, cls, msg)
            for i, stage, cls, msg in zip(
                failed.indices, failed.stages, failed.error_classes, failed.messages, strict=True
            )
        ),
    ]
    merged = BadRecords()
    for index, stage, cls, msg in sorted(entries, key=lambda e: e[0]):
        merged.add(index, stage, msg, cls)
    return merged


def _meta_columns(metas: Sequence[RecordMeta | None]) -> list[pa.Array]:
    """The key, topic, partition, timestamp and headers columns of records' metadata (None: NULLs)."""
    types = [_meta_type(name) for name in META_COLUMNS]
    return [
        pa.array([m.key if m else None for m in metas], types[0]),
        pa.array([m.topic if m else None for m in metas], types[1]),
        pa.array([m.partition if m else None for m in metas], types[2]),
        pa.array(
            [m.timestamp_ms * 1000 if m and m.timestamp_ms is not None else None for m in metas], types[3]
        ),
        pa.array([[{"key": k, "value": v} for k, v in m.headers] if m else None for m in metas], types[4]),
    ]


def _read_ranges(reader: RegionReader, plan: Sequence[tuple[Split, int, int]]) -> Generator[RangeColumns]:
    """Every planned range's columns, in plan order: the reader's
    :meth:`~splitkeeper.records.columnar.SupportsColumnarRead.read_ranges_columns` (Kafka reads all
    the region's partitions at once), else each range's records made into columns."""
    if isinstance(reader, SupportsColumnarRead):
        yield from reader.read_ranges_columns(plan)
        return
    for split, start, end in plan:
        yield _columns_of(reader.read_range(split, start, end))


def _failed_range(
    err: BaseException, plan: Sequence[tuple[Split, int, int]], split: Split, start: int
) -> tuple[Split, int]:
    """The planned range a read error belongs to: the split its ``split_id`` names (a reader of
    several ranges at once fails on another range than the one being staged), else ``split``."""
    named = err.params.get("split_id") if isinstance(err, SplitkeeperError) else None
    for candidate, candidate_start, _end in plan:
        if candidate.split_id == named:
            return candidate, candidate_start
    return split, start


def _columns_of(records: Iterable[SourceRecord]) -> RangeColumns:
    """A reader's records (the per-record form) as range columns (a ``str`` value: its UTF-8 bytes)."""
    offsets: list[int] = []
    nexts: list[int] = []
    values: list[bytes | None] = []
    metas: list[RecordMeta | None] = []
    for record in records:
        offsets.append(record[0])
        nexts.append(record[1])
        value = record[2]
        values.append(value.encode("utf-8") if isinstance(value, str) else value)
        metas.append(record[3] if len(record) > 3 else None)
    meta = tuple(_meta_columns(metas)) if any(m is not None for m in metas) else None
    return RangeColumns(
        pa.array(offsets, pa.int64()), pa.array(nexts, pa.int64()), pa.array(values, pa.binary()), meta
    )


# --------------------------------------------------------------------------- the Spark task


@dataclass(frozen=True, slots=True)
class RegionTask:
    """What one region's Spark task gets (pickled to its executor; every field picklable): the
    ``plan`` of its ranges, the source's ``reader``, the record ``transform`` (a module-level
    function: it pickles by reference), the ``staging`` root, the ``epoch`` and ``region``, the
    injected ``fault`` (None: none) and the record ``policy``."""

    plan: Sequence[tuple[Split, int, int]]
    reader: RegionReader
    transform: Transform
    staging: str
    epoch: int
    region: int
    fault: RegionFault | None = None
    policy: RecordPolicy | None = None


def region_task(task: RegionTask) -> RegionResult:
    """The body of a region's Spark task (module-level so it pickles by reference): a fresh attempt
    of :func:`run_region_task` for ``task``.

    A ``flaky`` fault applies to the task's first attempt only: a retry that Spark makes
    (``spark.task.maxFailures`` > 1, as on clusters) runs clean and writes a new attempt.
    """
    fault = task.fault
    if fault is not None and fault.kind is FaultKind.FLAKY:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and context.attemptNumber() > 0:
            fault = None
    return run_region_task(
        task.plan,
        task.reader,
        task.transform,
        task.staging,
        task.epoch,
        task.region,
        None,
        fault,
        task.policy,
    )


@dataclass(frozen=True, slots=True)
class WarmTask:
    """What a long-lived reader slot gets to warm up before the run's first epoch (pickled like a
    :class:`RegionTask`): the source's ``reader`` and the ``splits`` of the regions the slot is
    likely to serve (:meth:`splitkeeper.core.ports.RegionRunner.prepare`)."""

    reader: RegionReader
    splits: Sequence[Split]


def warm_task(task: WarmTask) -> float:
    """Warm a reader slot's process for its first region (module-level so it pickles by reference):
    the reader opens its client for ``task.splits`` (:class:`~splitkeeper.core.source.SupportsWarmUp`;
    kept by the slot, :mod:`splitkeeper.clients`) and a :class:`StagedWriter` stages one row in a
    temporary folder of its own, deleted after (the Arrow kernels and the parquet writer a first
    region would start). Returns its seconds; raises what the reader's warm-up raised (the slot
    reports it and serves regions as without it)."""
    import tempfile

    started = time.monotonic()
    if isinstance(task.reader, SupportsWarmUp):
        task.reader.warm_up(task.splits)
    with tempfile.TemporaryDirectory(prefix="splitkeeper-warm-") as folder:
        writer = StagedWriter(os.path.join(folder, PART_FILE), 0, 0)
        one = pa.table({"value": pa.array([b"warm"], pa.binary())})
        writer.add_table("warm", pa.array([0], pa.int64()), pa.array([1], pa.int64()), one, None, 1)
        writer.commit()
    return round(time.monotonic() - started, 3)
