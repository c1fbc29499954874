"""What a region task writes, and the region task body itself.

:func:`run_region_task` is the pure-Python body of one region's work in an
epoch: read the planned ranges through the source's :class:`RegionReader`,
apply the transform, write one parquet file under the staging directory, and
return a small :class:`RegionResult`. The Spark epoch runner wraps it in a
one-task job per region; this module never imports pyspark, so the body runs
(and is tested) without Spark.

Staging layout: ``<staging>/epoch=<N>/region=<r>/attempt=<id>/part.parquet``.
A file is written under a temporary name in its attempt directory and renamed
when complete, so a visible ``part.parquet`` is always whole. The driver only
reads the path a finished task returned; other attempts' files are garbage for
the staging cleanup. A staged file has every column of the sink table (the
task stamps ``ingested_at``; the schema is :data:`~splitkeeper.delta.schemas.STAGED_FILE_SCHEMA`,
from :mod:`splitkeeper.delta.schemas`), so the sink can adopt it as a Delta data file
as it is, without rewriting it (:meth:`~splitkeeper.delta.sink.DeltaSink.commit`).
"""

from __future__ import annotations

import enum
import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from splitkeeper.core.source import RecordMeta, RegionReader, SourceRecord
from splitkeeper.core.types import Split
from splitkeeper.delta.schemas import META_COLUMNS, STAGED_FILE_SCHEMA, STAGED_SCHEMA
from splitkeeper.errors import InvalidParameterError, ProtocolError, SourceError, SplitkeeperError
from splitkeeper.spark.columnar import RangeColumns, SupportsColumnarRead
from splitkeeper.transforms import Transform, apply_transform, identity, transform_values

PART_FILE = "part.parquet"
_ROW_GROUP = 128 * 1024


class InjectedFault(SplitkeeperError):
    """A region task failed on purpose, because the fault plan said so."""

    code = "INJECTED_FAULT"


class SplitReadError(SplitkeeperError):
    """Reading (or transforming) one split of a region failed; the message names the split first.

    The region declines. Its message starts ``split "<id>" at offset <n>:`` (the id as JSON) so the driver can
    tell which split failed across the executor boundary (:data:`SPLIT_READ_FAILED`), and
    count it towards ``checkpoint.on_split_failure: quarantine`` (protocol rule 1.8).
    """

    code = "SPLIT_READ_FAILED"

    def __init__(self, split_id: str, offset: int, cause: BaseException) -> None:
        super().__init__(
            f"split {json.dumps(split_id)} at offset {offset}: {type(cause).__name__}: {cause}",
            split_id=split_id,
            offset=offset,
        )


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
    ``staged_path`` is the only output of this attempt the sink may read; it is
    written even when no record was read, so every acknowledged epoch commits.
    A declined or timed-out region is built by the driver with :meth:`declined`.
    """

    region_id: int
    ack: bool
    positions: dict[str, int] = field(default_factory=dict)
    records: int = 0
    staged_path: str | None = None
    backlog_finished: tuple[str, ...] = ()
    error: str | None = None
    epoch: int = 0
    attempt: str = ""
    staged_bytes: int = 0
    records_by_split: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @classmethod
    def declined(cls, region_id: int, epoch: int, error: str) -> RegionResult:
        """A region that did not acknowledge (task failed or timed out); ``error`` says why."""
        return cls(region_id=region_id, ack=False, epoch=epoch, error=error)


def attempt_dir(staging_root: str, epoch: int, region: int, attempt: str) -> str:
    return os.path.join(staging_root, f"epoch={epoch}", f"region={region}", f"attempt={attempt}")


class StagedWriter:
    """Streams records into one parquet file, published atomically by :meth:`commit`.

    Rows go to ``<path>.tmp-<random>`` in row groups; :meth:`commit` closes it
    and renames it to ``path``; :meth:`abort` (or leaving a ``with`` block by an
    exception) deletes the temporary file. Single use, single thread.
    """

    def __init__(self, path: str, epoch: int, region: int) -> None:
        self.path = path
        self.epoch = epoch
        self.region = region
        self._tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(
            self._tmp, STAGED_FILE_SCHEMA, use_dictionary=["split_id", "epoch", "region"]
        )
        self._ingested_at = pa.scalar(time.time_ns() // 1000, pa.timestamp("us", tz="UTC"))
        self._split_ids: list[str] = []
        self._offsets: list[int] = []
        self._next_offsets: list[int] = []
        self._values: list[str] = []
        self._metas: list[RecordMeta | None] = []  # filled once a record carries metadata
        self._has_meta = False
        self._batches: list[pa.RecordBatch] = []  # built, not yet written: less than a row group
        self._batched = 0
        self.records = 0
        self.last_next_offset: int | None = None

    def add(self, split_id: str, records: Iterable[SourceRecord]) -> int:
        """Append the records of one split; returns how many were added.

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
            values.append(record[2])
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
        """Append the records of one split given as columns (``values`` replaces ``columns.values``).

        No Python step per record: the columns (the metadata columns too, when
        ``columns.meta`` has them) become record batches as they are. Sets
        :attr:`last_next_offset` as :meth:`add` does; returns the count.
        """
        values = columns.values if values is None else values
        n = len(values)
        self.last_next_offset = columns.last_next_offset
        if n == 0:
            return 0
        self._batch_rows()  # rows added by add() go first
        if values.type != pa.string():
            values = values.cast(pa.string())
        self._batch(
            pa.repeat(pa.scalar(split_id, pa.string()), n),
            columns.offsets,
            columns.next_offsets,
            values,
            list(columns.meta)
            if columns.meta is not None
            else [pa.nulls(n, STAGED_FILE_SCHEMA.field(name).type) for name in META_COLUMNS],
        )
        self.records += n
        return n

    def _meta_arrays(self, n: int) -> list[pa.Array]:
        """The key, topic, partition, timestamp and headers columns of the buffered rows."""
        types = [STAGED_FILE_SCHEMA.field(name).type for name in META_COLUMNS]
        if not self._has_meta:
            return [pa.nulls(n, t) for t in types]
        metas = self._metas
        return [
            pa.array([m.key if m else None for m in metas], types[0]),
            pa.array([m.topic if m else None for m in metas], types[1]),
            pa.array([m.partition if m else None for m in metas], types[2]),
            pa.array(
                [m.timestamp_ms * 1000 if m and m.timestamp_ms is not None else None for m in metas], types[3]
            ),
            pa.array(
                [[{"key": k, "value": v} for k, v in m.headers] if m else None for m in metas], types[4]
            ),
        ]

    def _batch_rows(self) -> None:
        """Turn the rows :meth:`add` buffered into a record batch."""
        n = len(self._values)
        if n == 0:
            return
        self._batch(
            pa.array(self._split_ids, pa.string()),
            pa.array(self._offsets, pa.int64()),
            pa.array(self._next_offsets, pa.int64()),
            pa.array(self._values, pa.string()),
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
        values: pa.Array,
        metas: list[pa.Array],
    ) -> None:
        """Queue one batch of rows; write whole row groups of ``_ROW_GROUP`` rows once there are any."""
        n = len(values)
        self._batches.append(
            pa.record_batch(
                [
                    split_ids,
                    offsets,
                    next_offsets,
                    values,
                    pa.repeat(pa.scalar(self.epoch, pa.int64()), n),
                    pa.repeat(pa.scalar(self.region, pa.int32()), n),
                    pa.repeat(self._ingested_at, n),
                    *metas,
                ],
                schema=STAGED_FILE_SCHEMA,
            )
        )
        self._batched += n
        if self._batched >= _ROW_GROUP:
            self._write(whole_groups_only=True)

    def _write(self, whole_groups_only: bool) -> None:
        if not self._batched or self._writer is None:
            return
        table = pa.Table.from_batches(self._batches, STAGED_FILE_SCHEMA)
        rows = (self._batched // _ROW_GROUP) * _ROW_GROUP if whole_groups_only else self._batched
        self._writer.write_table(table.slice(0, rows), row_group_size=_ROW_GROUP)
        rest = table.slice(rows)
        self._batches = rest.to_batches()
        self._batched = rest.num_rows

    def _flush(self) -> None:
        self._batch_rows()
        self._write(whole_groups_only=False)

    def commit(self) -> StagedOutput:
        """Flush, close and rename into place. Returns the published file."""
        if self._writer is None:
            raise ProtocolError(f"staged file {self.path} was already committed or aborted")
        try:
            self._flush()
            self._writer.close()
            self._writer = None
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()
            raise
        return StagedOutput(self.path, self.records, os.path.getsize(self.path))

    def abort(self) -> None:
        """Drop everything written so far. Idempotent."""
        if self._writer is not None:
            try:
                self._writer.close()
            finally:
                self._writer = None
        if os.path.exists(self._tmp):
            os.remove(self._tmp)

    def __enter__(self) -> StagedWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None or self._writer is not None:
            self.abort()


def write_staged(
    records: Iterable[SourceRecord], split_ids: Iterable[str] | str, path: str, *, epoch: int, region: int
) -> StagedOutput:
    """Write records to a parquet file at ``path`` atomically (tmp name, then rename).

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
    return pq.read_table(path, columns=STAGED_SCHEMA.names).cast(STAGED_SCHEMA)


def run_region_task(
    plan_for_region: Sequence[tuple[Split, int, int]],
    reader: RegionReader,
    transform: Transform,
    staging_root: str,
    epoch: int,
    region: int,
    attempt: str | None = None,
    fault: RegionFault | None = None,
) -> RegionResult:
    """Run one region's share of epoch ``epoch``; called inside the region's Spark task.

    Reads each planned ``(split, start, end)`` through ``reader`` (as Arrow
    columns when the reader :class:`~splitkeeper.spark.columnar.SupportsColumnarRead`,
    record by record otherwise), applies ``transform`` to every value (a whole
    column at once when it is vectorised), writes all records to one staged file and
    returns an acknowledging :class:`RegionResult`. ``attempt`` names the
    attempt directory; ``None`` draws a fresh id, which is what a Spark task
    should pass so that a retried task never shares a file with an earlier
    attempt. The new position of a split is its planned ``end`` (or, for a
    range planned mid-record, the end of the last record read). Any failure
    raises (SourceError, TransformError, InjectedFault, OSError): the job
    fails and the driver declines the region; nothing is published then.
    Calling it twice with the same plan writes the same rows to two attempts.
    """
    started = time.monotonic()
    attempt = attempt or uuid.uuid4().hex
    if fault is not None and fault.kind is FaultKind.STALL:
        time.sleep(fault.seconds)
    seen: set[str] = set()
    positions: dict[str, int] = {}
    counts: dict[str, int] = {}
    backlog_finished: list[str] = []
    path = os.path.join(attempt_dir(staging_root, epoch, region, attempt), PART_FILE)
    with StagedWriter(path, epoch, region) as writer:
        for split, start, end in plan_for_region:
            if split.split_id in seen:
                raise ProtocolError(
                    f"epoch {epoch} region {region}: split {split.split_id!r} is planned twice", epoch=epoch
                )
            seen.add(split.split_id)
            try:
                if isinstance(reader, SupportsColumnarRead):
                    columns = reader.read_range_columns(split, start, end)
                    values = None
                    if transform is not identity and len(columns.values):
                        values = transform_values(transform, columns.values, columns.offsets, split.split_id)
                    counts[split.split_id] = writer.add_columns(split.split_id, columns, values)
                else:
                    records = reader.read_range(split, start, end)
                    if transform is not identity:
                        records = _transformed(records, transform, split.split_id)
                    counts[split.split_id] = writer.add(split.split_id, records)
            except Exception as err:  # the split's records cannot be read or transformed: name the split
                raise SplitReadError(split.split_id, start, err) from err
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
        if fault is not None and fault.kind in (FaultKind.FAIL, FaultKind.FLAKY):
            raise InjectedFault(
                f"injected fault: region {region} fails at epoch {epoch} (attempt {attempt}) as the fault "
                f"plan asked{' (first task attempt only)' if fault.kind is FaultKind.FLAKY else ''}; "
                f"{writer.records} records read were not published",
                region=region,
                epoch=epoch,
            )
        staged = writer.commit()
    return RegionResult(
        region_id=region,
        ack=True,
        positions=positions,
        records=staged.records,
        staged_path=staged.path,
        backlog_finished=tuple(backlog_finished),
        epoch=epoch,
        attempt=attempt,
        staged_bytes=staged.bytes,
        records_by_split=counts,
        elapsed_s=time.monotonic() - started,
    )


def _transformed(
    records: Iterable[SourceRecord], transform: Transform, split_id: str
) -> Iterator[SourceRecord]:
    for record in records:
        offset, next_offset, value = record[0], record[1], record[2]
        meta = record[3] if len(record) > 3 else None
        yield SourceRecord(offset, next_offset, apply_transform(transform, value, split_id, offset), meta)
