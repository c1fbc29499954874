"""The exactly-once Delta sink: :class:`DeltaSink`, the ``EpochSink`` port on delta-rs.

The region tasks stage one parquet file per region and attempt
(``<staging>/epoch=N/region=R/attempt=<id>/part.parquet``, every column of
the ``sink_records`` schema, see :mod:`splitkeeper.spark.task`). The sink commits an
epoch by making the acknowledged regions' staged files data files of the table, in one
commit; the records are written once, by the tasks.

Contract of :meth:`DeltaSink.commit` ``(epoch, outputs, expected=, attempt_id=)``:

1. Only acknowledged regions' outputs, each a staged file of this epoch and of its own
   region (the path says so), may be committed: anything else is
   InvalidParameterError and nothing happens.
2. The commit is fenced (:mod:`splitkeeper.delta.fence`, app id = the pipeline, version
   = the epoch): it lands only if the pipeline's recorded epoch is exactly ``expected``
   (the one this run restored or last committed); another run's commit in between
   makes it a ConcurrentRunError. The epoch already recorded by a commit that names
   ``attempt_id`` is a replay: nothing is written, the receipt says ``replayed``.
3. The staged files are checked before anything moves: a missing or unreadable one is
   a StateError naming the path and what to do, and nothing is moved or committed.
   Then each file is moved (renamed, on local disk; copied with ``pyarrow.fs`` to an
   object store) into the table folder under :func:`adopted_name`, and all are added
   in ONE commit (``create_write_transaction``) with ``Transaction(pipeline, epoch)``,
   per-file statistics from the parquet footer (numRecords, minValues, maxValues,
   nullCount) and the custom metadata ``{app_id, epoch, regions, attempt_id, records}``.
   A file moved by a commit that then died is found under its table name by the next
   attempt of the same commit; a file moved by a commit that lost the fence is in no
   commit, so no reader sees it (``maintain`` deletes it after ``maintenance.untracked_hours``:
   :meth:`DeltaSink.remove_untracked`). A staged file of an older writer (without
   ``ingested_at``) is rewritten into the table folder with ``ingested_at`` = now.
4. An epoch with no output still commits (no files) so the epoch is recorded.
5. The table's columns are the pipeline's (``schema``, :func:`~splitkeeper.delta.schemas.sink_schema`
   of its decode spec), checked when a writable sink opens an existing table (other data columns
   or partition columns: StateError saying what to do; nothing is migrated). A partitioned
   sink's region output is a manifest (``parts.json``) naming one file per partition value under
   ``col=value/`` folders; each is added with its ``partitionValues`` in the same one commit.
   With ``widen`` (``decode.on_new_fields: add_columns``) the new columns of the staged files
   are added to the table (nullable) in a schema commit just before the fenced commit (delta-rs's
   ``create_write_transaction`` keeps the table's schema); a changed type is refused.

6. Side tables (:class:`SideTable`: the dead letters, the filtered offsets, an upsert sink's change
   table) are staged before the fenced commit, listed in its metadata, committed after it and
   repaired on open (:meth:`DeltaSink.repair_sides`).
7. Upsert (``upsert=``, ``sink.mode: upsert``): the fenced write is ONE delta-rs MERGE of the epoch's
   winners (:func:`winners`) into the keyed table, whose columns are the schema's without
   ``tombstone``; the staged files become the change table (``changes_path``), so the keyed table is
   the fold of the change table (:mod:`splitkeeper.records.upsert`). The table's properties
   ``splitkeeper.sink.mode``/``splitkeeper.sink.key`` are checked on open (StateError when the mode or
   key differ). A partitioned upsert sink's keyed and change tables have its partitions; ``widen``
   is refused.
8. Operator checkpoints (:mod:`splitkeeper.core.operator`): :meth:`DeltaSink.operator_commit` is the
   fenced commit of an operator's epoch. A rewind restores the sink and every side table to its
   Delta version as of the target checkpoint (:meth:`DeltaSink.rewind_plan`: the last version before
   the first commit of a later epoch); a backward reset deletes one split's records from an offset
   on. The sink's commit names the action under :data:`OPERATOR_KEY`; each side table then applies
   it with ``Transaction(pipeline, epoch)``, and a repair on open applies it to a side table that
   missed it (side rule (d)).

:meth:`committed_epoch` is ``transaction_version(pipeline)``; :meth:`committed_attempt`
reads the commit's metadata back from the table history. One sink per pipeline and
driver process; ``read_only`` sinks create and write nothing (dry runs, status).

Reading the records back: :func:`read_sink` (delta-rs and pyarrow, no Spark) is the one
reader of a sink's rows, for the report, the tools and the tests. :func:`sink_frame` gives
the restart checks the same table as a Spark frame (a sink can be too large for the driver),
and :func:`sink_files` tells them first whether there is anything to read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.parquet as pq

from splitkeeper.core.ports import EpochSink, RegionRun, SinkCrashPoint, SinkReceipt
from splitkeeper.delta import storage
from splitkeeper.delta.fence import _metadata_of, fenced_commit, recorded_commit
from splitkeeper.delta.retention import retention_hours
from splitkeeper.delta.schemas import (
    DEAD_FILE,
    DEAD_LETTER_SCHEMA,
    DEAD_LETTER_TABLE,
    FILTERED_FILE,
    FILTERED_TABLE,
    SINK_TABLE,
    STAGED_COLUMNS,
    STAGED_FILE_SCHEMA,
    TableSpec,
    sink_spec,
    spec,
)
from splitkeeper.delta.tables import (
    _arrow_schema,
    _shape,
    ensure_table,
    guarded,
    open_table,
    read_rows,
    refresh,
    sql_string,
)
from splitkeeper.errors import InvalidParameterError, StagedOutputError, StateError
from splitkeeper.records.spec import NOT_DATA_COLUMNS, TOMBSTONE
from splitkeeper.records.upsert import UpsertSpec

if TYPE_CHECKING:  # pragma: no cover
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

__all__ = [
    "DeltaSink",
    "SideTable",
    "OPERATOR_KEY",
    "SinkCommit",
    "TableRewind",
    "adopted_name",
    "file_statistics",
    "read_dead_letters",
    "read_sink",
    "sink_files",
    "sink_frame",
    "winners",
]

log = logging.getLogger(__name__)

_SEGMENT = re.compile(r"(?:^|/)(epoch|region)=(\d+)(?=/|$)")
_ATTEMPT = re.compile(r"(?:^|/)attempt=([A-Za-z0-9_-]+)(?=/|$)")
_EPOCH_DIR = re.compile(r"^epoch=(\d+)$")
#: Delta statistics keep string bounds short; longer minimums are cut, longer maximums left out.
STRING_STATS_PREFIX = 32


def adopted_name(staged_path: str) -> str:
    """The table-relative name a staged file gets in the sink: one per epoch, region and attempt
    (and, for a partitioned sink's file, under its ``col=value/`` folders, one per partition)."""
    text = staged_path.replace(os.sep, "/")
    attempt = _ATTEMPT.search(text)
    segments = dict(_SEGMENT.findall(text[: attempt.end()] if attempt else text))
    name = (
        f"sk-e{int(segments['epoch']):010d}-r{int(segments['region']):05d}-"
        f"{attempt.group(1) if attempt else 'once'}"
    )
    after = text[attempt.end() :].strip("/").split("/") if attempt else []
    if len(after) > 1:  # <col>=<value>/.../part-<n>.parquet below the attempt directory
        part = after[-1].removesuffix(".parquet")
        return "/".join([*after[:-1], f"{name}-{part}.parquet"])
    return f"{name}.parquet"


def epoch_of(path: str) -> int | None:
    found = dict(_SEGMENT.findall(path.replace(os.sep, "/")))
    return int(found["epoch"]) if "epoch" in found else None


def _partition_values(staged_path: str, partition_by: Sequence[str]) -> dict[str, str | None]:
    """A partitioned staged file's partition values, from its ``col=value`` folders."""
    if not partition_by:
        return {}
    found: dict[str, str | None] = {}
    text = staged_path.replace(os.sep, "/")
    attempt = _ATTEMPT.search(text)
    for segment in (text[attempt.end() :] if attempt else text).split("/"):
        name, sep, value = segment.partition("=")
        if sep and name in partition_by:
            found[name] = None if value == "__HIVE_DEFAULT_PARTITION__" else unquote(value)
    missing = [c for c in partition_by if c not in found]
    if missing:
        raise StagedOutputError(
            f"staged file {staged_path} has no folder for the partition columns {missing} of the "
            "sink: it was not written for this sink.partition_by. Recover the pipeline so the epoch is "
            "read again",
            path=staged_path,
        )
    return found


def _uri_path(name: str) -> str:
    """A table-relative file name as a Delta log path (URI-encoded)."""
    return quote(name, safe="/=")


@dataclass(frozen=True, slots=True)
class SinkCommit:
    """One epoch's commit as the table history records it (None fields: not recorded)."""

    app_id: str
    epoch_id: int
    regions: tuple[int, ...] | None
    table_version: int | None
    records: int | None
    attempt_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- statistics


def _stat_value(value: Any, *, upper: bool) -> Any:
    """A footer min/max as Delta statistics JSON holds it; None when it cannot be a safe bound."""
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        moment = moment.astimezone(UTC)
        millis = moment.replace(microsecond=(moment.microsecond // 1000) * 1000)
        if upper and millis != moment:  # milliseconds in the JSON: round the upper bound up
            millis += timedelta(milliseconds=1)
        return millis.strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis.microsecond // 1000:03d}Z"
    if isinstance(value, str):
        if len(value) <= STRING_STATS_PREFIX:
            return value
        return None if upper else value[:STRING_STATS_PREFIX]
    if isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return None


def file_statistics(metadata: pq.FileMetaData, columns: Sequence[str]) -> dict[str, Any]:
    """Delta file statistics of ``columns`` from a parquet footer: numRecords, minValues,
    maxValues, nullCount (a column whose row groups lack statistics gets none)."""
    names = metadata.schema.to_arrow_schema().names
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in columns:
        if name not in names:
            continue
        index = names.index(name)
        low = high = None
        count = 0
        complete = True
        for group in range(metadata.num_row_groups):
            chunk = metadata.row_group(group).column(index)
            stats = chunk.statistics
            if stats is None or not stats.has_null_count:
                complete = False
                break
            count += int(stats.null_count)
            if chunk.num_values == stats.null_count:
                continue  # all NULL: no bounds from this group
            if not stats.has_min_max:
                complete = False
                break
            low = stats.min if low is None or stats.min < low else low
            high = stats.max if high is None or stats.max > high else high
        if not complete:
            continue
        nulls[name] = count
        if low is not None and high is not None:
            low_value, high_value = _stat_value(low, upper=False), _stat_value(high, upper=True)
            if low_value is not None:
                mins[name] = low_value
            if high_value is not None:
                maxs[name] = high_value
    return {"numRecords": metadata.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


# --------------------------------------------------------------------------- the sink


@dataclass(frozen=True, slots=True)
class _Staged:
    """A staged file checked for commit: where it is now, where it goes, what it holds."""

    staged: str  # the path the region task returned
    source: str  # where it is now: the staged path, or the table folder (moved by an earlier attempt)
    name: str  # its name in the table
    rows: int
    stats: dict[str, Any]
    complete: bool  # False: an older writer's file without ingested_at (rewritten, not moved)
    partition_values: dict[str, str | None] = field(default_factory=dict)
    extra: tuple[pa.Field, ...] = ()  # columns the sink's schema lacks (decode.on_new_fields: add_columns)


# --------------------------------------------------------------------------- side tables

#: The sink commit's metadata keys that name the epoch's files of each side table and count their rows.
DEAD_LETTERS_KEY = "dead_letters"
DEAD_LETTER_RECORDS_KEY = "dead_letter_records"
FILTERED_KEY = "filtered"
FILTERED_RECORDS_KEY = "filtered_records"
CHANGES_KEY = "changes"
CHANGE_RECORDS_KEY = "change_records"
#: The sink commit of an operator checkpoint names its action here (rule 8): ``{"kind": "rewind",
#: "to": N, "versions": {label: Delta version}}`` or ``{"kind": "reset", "split": S, "from": offset}``.
OPERATOR_KEY = "operator"
#: Delta table properties of an upsert sink's keyed table (and what an append sink lacks).
MODE_PROPERTY = "splitkeeper.sink.mode"
KEY_PROPERTY = "splitkeeper.sink.key"
#: Side files a region may stage although the sink has no table for them: (what, file, how to fix).
_UNCONFIGURED_SIDES = (
    ("dead letters", DEAD_FILE, "set errors.dead_letter.path (with errors.tolerance: all)"),
    ("filtered offsets", FILTERED_FILE, "open the sink with filtered_path (the pipeline does)"),
)


class SideTable:
    """A table committed after the sink's fenced commit of each epoch, exactly once, redo-safe.

    The dead-letter table, the filtered-offsets table and an upsert sink's change table are each
    one of these. Per epoch:

    a. ``stage``: before the fenced commit, each file (``staged_file`` beside a region's output,
       or, for the change table, the region outputs themselves) is checked (its columns are the
       table's) and moved into the table folder under :func:`adopted_name`, untracked (an earlier
       attempt's moved file is found there);
    b. the sink's fenced commit lists them (path, size, rows, modified, stats) in its custom
       metadata under ``key`` (and their rows under ``records_key``): the redo record;
    c. ``commit``: after it, the files are added in ONE commit with ``Transaction(pipeline,
       epoch)``, unless the table records ``epoch`` already (a replay, a repair done);
    d. a driver that died between (b) and (c) leaves the latest epoch pending: the sink repairs
       it on open (:meth:`DeltaSink.repair_sides`).

    The table's recorded epoch is cached after the first read and after each commit: one sink per
    pipeline and driver process, and a concurrent commit of the same epoch fails delta-rs's app
    transaction check (then it is read again). ``eager``: created on open, else at its first files.
    """

    def __init__(
        self,
        label: str,
        path: str,
        table_spec: TableSpec,
        staged_file: str | None,
        key: str,
        records_key: str,
        *,
        eager: bool = True,
    ) -> None:
        self.label = label
        self.path = path
        self.spec = table_spec
        self.staged_file = staged_file
        self.key = key
        self.records_key = records_key
        self.eager = eager
        self.table: DeltaTable | None = None
        self._recorded: int | None = None
        self._known = False

    def open(self) -> None:
        """Create the table (an ``eager`` one) or open it when it exists."""
        if self.eager:
            self.table = ensure_table(self.path, self.spec)[0]
        else:
            self.table = open_table(self.path, missing_ok=True)
        self._known = False

    def epoch(self, app_id: str, *, fresh: bool = False) -> int | None:
        """The last epoch this table records for ``app_id`` (cached unless ``fresh``)."""
        if self._known and not fresh:
            return self._recorded
        if self.table is None:
            self.table = open_table(self.path, missing_ok=True)
        else:
            refresh(self.table)
        self._recorded = None if self.table is None else self.table.transaction_version(app_id)
        self._known = True
        return self._recorded

    def _footer(self, epoch: int, location: str, sink: str) -> pq.FileMetaData | None:
        """The footer of the file at ``location``, or None when there is none; a damaged file or one of
        other columns is a StagedOutputError (nothing is committed)."""
        fs, inner = storage.filesystem(location)
        try:
            if fs.get_file_info(inner).type.name != "File":
                return None
            with fs.open_input_file(inner) as handle:
                metadata = pq.ParquetFile(handle).metadata
        except OSError:
            return None
        except Exception as err:  # noqa: BLE001 - any unreadable footer is the same problem
            raise StagedOutputError(
                f"sink {sink}: {self.label} file {location} of epoch {epoch} is not a complete parquet "
                f"file ({err}). Nothing was committed: recover the pipeline (splitkeeper recover "
                "--checkpoint latest) so the epoch is read again",
                path=location,
                epoch_id=epoch,
            ) from err
        found = [(f.name, f.type) for f in metadata.schema.to_arrow_schema()]
        wanted = [(f.name, f.type) for f in self.spec.schema if f.name not in self.spec.partition_by]
        if [(n, _shape(t)) for n, t in found] != [(n, _shape(t)) for n, t in wanted]:
            raise StagedOutputError(
                f"sink {sink}: {self.label} file {location} of epoch {epoch} has columns {found}, not "
                f"the {self.label} table's {wanted}. Nothing was committed: recover the pipeline so the "
                "epoch is read again by this splitkeeper",
                path=location,
                epoch_id=epoch,
            )
        return metadata

    def stage(
        self, epoch: int, sources: Sequence[str], *, sink: str, required: bool = False
    ) -> list[dict[str, Any]]:
        """Rule (a): the files at ``sources`` (or moved by an earlier attempt; a missing one is no file,
        or, ``required``, a StagedOutputError) checked, then moved into the table folder. The entries
        the sink commit records (rule (b))."""
        found: list[tuple[str, str, pq.FileMetaData]] = []  # (where it is now, its table name, footer)
        for source in sources:
            name = adopted_name(source)
            checked = self._footer(epoch, source, sink)
            if checked is None:
                moved = storage.join(self.path, name)
                checked = self._footer(epoch, moved, sink)
                source = moved if checked is not None else source
            if checked is not None:
                found.append((source, name, checked))
            elif required:
                raise StagedOutputError(
                    f"sink {sink}: staged file {source} of epoch {epoch} is gone, and was not moved into "
                    f"the {self.label} table {self.path} as {name} either. Nothing was committed: recover "
                    "the pipeline (splitkeeper recover --checkpoint latest) so the epoch is read again, "
                    "and check what removes files under the staging path",
                    path=source,
                    epoch_id=epoch,
                )
        entries: list[dict[str, Any]] = []
        for source, name, metadata in found:
            target = storage.join(self.path, name)
            if source != target:
                _move(source, target)
            fs, inner = storage.filesystem(target)
            info = fs.get_file_info(inner)
            entry = {
                "path": name,
                "size": int(info.size),
                "rows": int(metadata.num_rows),
                "modified": int(info.mtime.timestamp() * 1000) if info.mtime is not None else 0,
                "stats": json.dumps(file_statistics(metadata, self.spec.stats_columns)),
            }
            if self.spec.partition_by:  # a partitioned change table: the file's col=value folders
                entry["partition_values"] = _partition_values(name, self.spec.partition_by)
            entries.append(entry)
        return entries

    def read(self, entries: Sequence[Mapping[str, Any]]) -> pa.Table:
        """The rows of the moved (maybe not yet committed) files ``entries``, in the table's schema."""
        tables = []
        schema = self.spec.schema
        for entry in entries:
            fs, inner = storage.filesystem(storage.join(self.path, str(entry["path"])))
            with fs.open_input_file(inner) as handle:
                data = pq.read_table(handle)
            for column, value in dict(entry.get("partition_values") or {}).items():
                typed = pa.array([value], pa.string()).cast(schema.field(column).type)
                data = data.append_column(column, pa.repeat(typed[0], data.num_rows))
            tables.append(data.select(schema.names).cast(schema))
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def commit(
        self,
        app_id: str,
        epoch: int,
        entries: Sequence[Mapping[str, Any]],
        extra: Mapping[str, Any] | None = None,
    ) -> bool:
        """Rule (c): add ``entries`` (already in the table folder) in ONE commit with
        ``Transaction(app_id, epoch)``; nothing when there are none, or when the table records ``epoch``
        (or a later one). ``extra``: more custom metadata. True when this call committed them."""
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

        if not entries:
            return False
        done = self.epoch(app_id)
        if done is not None and done >= epoch:
            return False
        if self.table is None:
            self.table = ensure_table(self.path, self.spec)[0]
        table = self.table
        missing = [str(e["path"]) for e in entries if not _exists(storage.join(self.path, str(e["path"])))]
        if missing:
            raise StateError(
                f"pipeline {app_id!r}: the sink commit of epoch {epoch} names {self.label} files that are "
                f"not in the {self.label} table folder {self.path}: {missing}. They were removed after the "
                "sink commit; their records are the only copy of them. Restore them from a backup of that "
                f"folder; until then this epoch's {self.label} records are missing",
                pipeline=app_id,
                epoch_id=epoch,
                path=self.path,
            )
        actions: list[AddAction | RemoveAction] = [
            AddAction(
                _uri_path(str(e["path"])),
                int(e["size"]),
                dict(e.get("partition_values") or {}),
                int(e["modified"]),
                True,
                str(e["stats"]),
            )
            for e in entries
        ]
        properties = CommitProperties(
            app_transactions=[Transaction(app_id, epoch)],
            custom_metadata={
                **(extra or {}),
                "app_id": app_id,
                "epoch": epoch,
                "records": sum(int(e["rows"]) for e in entries),
            },
        )
        try:
            guarded(
                self.path,
                lambda: table.create_write_transaction(
                    actions, mode="append", schema=self.spec.schema, commit_properties=properties
                ),
            )
        except CommitFailedError:
            done = self.epoch(app_id, fresh=True)
            if done is not None and done >= epoch:
                return False  # another process of this pipeline committed them meanwhile
            raise
        refresh(table)  # the next commit's snapshot: delta-rs checks app transactions against it
        self._recorded, self._known = epoch, True
        return True

    def apply_operator(self, app_id: str, epoch: int, action: Mapping[str, Any]) -> bool:
        """Rule 8: apply an operator checkpoint's ``action`` to this table with ``Transaction(app_id,
        epoch)``, unless it records ``epoch`` (or a later one) already, or does not exist (a table
        created after the sink commit named it has nothing to undo). True when this call committed."""
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import CommitProperties, Transaction

        done = self.epoch(app_id, fresh=True)
        if done is not None and done >= epoch:
            return False
        if self.table is None:
            return False
        table = self.table
        properties = CommitProperties(
            app_transactions=[Transaction(app_id, epoch)],
            custom_metadata={"app_id": app_id, "epoch": epoch, OPERATOR_KEY: json.dumps(dict(action))},
        )
        try:
            _apply(table, action, self.label, properties, offset_column=_offset_column(self.spec))
        except CommitFailedError:
            done = self.epoch(app_id, fresh=True)
            if done is not None and done >= epoch:
                return False
            raise
        refresh(table)
        self._recorded, self._known = epoch, True
        return True


def _offset_column(table_spec: TableSpec) -> str:
    """The column a reset compares with its offset: a record's ``offset``, a filtered range's start."""
    return "start_offset" if "start_offset" in table_spec.schema.names else "offset"


def _apply(
    table: DeltaTable,
    action: Mapping[str, Any],
    label: str,
    properties: Any,
    *,
    offset_column: str = "offset",
) -> None:
    """One commit of an operator action on ``table`` (rule 8): a restore to the version the action
    names for ``label``, or a delete of the reset split's rows from its offset on (an empty
    commit when there is nothing to delete: the epoch is recorded all the same)."""
    if action.get("kind") == "rewind":
        version = dict(action.get("versions") or {}).get(label)
        if version is not None and int(version) != table.version():
            guarded(table.table_uri, lambda: table.restore(int(version), commit_properties=properties))
            return
    elif action.get("kind") == "reset":
        split, start = sql_string(str(action["split"])), int(action["from"])
        predicate = f"split_id = {split} AND {_quoted(offset_column)} >= {start}"
        before = table.version()
        guarded(table.table_uri, lambda: table.delete(predicate, commit_properties=properties))
        if table.version() != before:
            return
        # delta-rs commits nothing for a delete that matches no row (a reset back to where a forward
        # reset left the split): without the empty commit below the sink would not record the epoch,
        # and every later open would find the checkpoint ahead of the sink (issue 36, item 14)
    else:
        raise StateError(f"unknown operator action {dict(action)!r} in the commit of table {table.table_uri}")
    guarded(  # nothing to restore or delete: record the epoch with an empty commit
        table.table_uri,
        lambda: table.create_write_transaction(
            [], mode="append", schema=_arrow_schema(table), commit_properties=properties
        ),
    )


def _record_only(table: DeltaTable, properties: Any, key: str, action: Mapping[str, Any]) -> None:
    """An empty commit that records the epoch and names ``action`` (a forward reset changes no rows)."""
    properties.custom_metadata[key] = json.dumps(dict(action))
    properties.custom_metadata["records"] = 0
    guarded(
        table.table_uri,
        lambda: table.create_write_transaction(
            [], mode="append", schema=_arrow_schema(table), commit_properties=properties
        ),
    )


def _quoted(column: str) -> str:
    return f'"{column}"' if column in ("offset", "end", "partition", "timestamp") else column


@dataclass(frozen=True, slots=True)
class TableRewind:
    """What a rewind does to one table (rule 8): its Delta version now and after, and its rows now
    and after (from the log's file statistics: no data read)."""

    label: str
    path: str
    version_now: int
    version_after: int
    rows_now: int
    rows_after: int

    @property
    def changes(self) -> bool:
        return self.version_now != self.version_after

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.label,
            "path": self.path,
            "version_now": self.version_now,
            "version_after": self.version_after,
            "rows_now": self.rows_now,
            "rows_after": self.rows_after,
        }


def version_as_of(table: DeltaTable, epoch: int) -> int:
    """The table's Delta version as of ``epoch``: the last version before the first commit that
    records a later epoch (commits without one, such as a compaction, belong to the epoch before
    them). Reads the table's history (its commit infos)."""
    return _entry_as_of(guarded(table.table_uri, lambda: table.history()), epoch)["version"]


def _entry_as_of(history: Sequence[Mapping[str, Any]], epoch: int) -> dict[str, Any]:
    """The history entry of :func:`version_as_of` (its ``version`` and ``timestamp``): version 0 (the
    table's creation) when the first commit already records a later epoch."""
    entries = sorted(history, key=lambda e: int(e["version"]))
    first = next((e for e in entries if int(e["version"]) == 0), None)
    found: dict[str, Any] = {"version": 0, "timestamp": None if first is None else first.get("timestamp")}
    for entry in entries:
        recorded = _metadata_of(entry).get("epoch")
        try:
            later = recorded is not None and int(recorded) > epoch
        except (TypeError, ValueError):
            later = False
        if later:
            break
        found = {"version": int(entry["version"]), "timestamp": entry.get("timestamp")}
    return found


def _rows_at(path: str, version: int) -> int:
    from deltalake import DeltaTable

    options = storage.storage_options(path)
    table = guarded(path, lambda: DeltaTable(path, version=version, storage_options=options))
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return 0
    return int(sum(v for v in actions.column("num_records").to_pylist() if v is not None))


#: The manifest a partitioned region task writes beside its files: their paths, relative to it.
PARTS_FILE = "parts.json"


def _data_fields(schema: pa.Schema) -> list[tuple[str, Any]]:
    return [(f.name, _shape(f.type)) for f in schema if f.name not in NOT_DATA_COLUMNS]


def _ddl_list(fields: Sequence[pa.Field]) -> str:
    return ", ".join(f"{f.name} {str(f.type).upper()}" for f in fields if f.name not in NOT_DATA_COLUMNS)


class DeltaSink(EpochSink):
    """The records table at ``path``, committed by pipeline ``app_id`` (see the module doc).

    ``staging_path``: where the region tasks stage (for :meth:`discard`). ``schema``: the
    sink's columns (:func:`~splitkeeper.delta.schemas.sink_schema` of the pipeline's decode
    spec; default the raw sink's, :data:`STAGED_FILE_SCHEMA`); ``partition_by``: its Delta
    partition columns; ``widen``: staged files may bring new columns, added to the table
    (``decode.on_new_fields: add_columns``). A writable sink creates its table with them, or
    checks an existing one: data columns other than the schema's (say an older sink's
    ``value STRING`` opened with the raw decode, ``value BINARY``) are a StateError that says
    what the table has, what the config wants and what to do; nothing is migrated.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        app_id: str,
        *,
        staging_path: str | os.PathLike[str] | None = None,
        read_only: bool = False,
        dead_letter_path: str | os.PathLike[str] | None = None,
        crash_point: Callable[[SinkCrashPoint, int], None] | None = None,
        schema: pa.Schema | None = None,
        partition_by: Sequence[str] = (),
        widen: bool = False,
        upsert: UpsertSpec | None = None,
        changes_path: str | os.PathLike[str] | None = None,
        filtered_path: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(app_id, str) or not app_id.strip():
            raise InvalidParameterError("app_id", app_id, "a non-empty name (the pipeline name)")
        self.path = storage.table_uri(path)
        self.app_id = app_id
        self.staging_path = None if staging_path is None else storage.table_uri(staging_path)
        self.read_only = read_only
        self.schema: pa.Schema = STAGED_FILE_SCHEMA if schema is None else schema
        self._configured = self.schema  # without the columns add_columns added (self.schema has them)
        self.partition_by = tuple(partition_by)
        self.widen = widen
        self.upsert = upsert
        self._table: DeltaTable | None = None
        self.dead_letter_path = None if dead_letter_path is None else storage.table_uri(dead_letter_path)
        self.filtered_path = None if filtered_path is None else storage.table_uri(filtered_path)
        self.changes_path: str | None = None
        self._crash_point = crash_point
        self._side_pending = False
        self._merged: dict[str, int] = {}  # the last MERGE's counts, for the change table's commit
        self._sides: list[SideTable] = []
        if self.dead_letter_path is not None:
            self._sides.append(
                SideTable(
                    "dead-letter",
                    self.dead_letter_path,
                    spec(DEAD_LETTER_TABLE),
                    DEAD_FILE,
                    DEAD_LETTERS_KEY,
                    DEAD_LETTER_RECORDS_KEY,
                )
            )
        if self.filtered_path is not None:
            self._sides.append(
                SideTable(
                    "filtered-offset",
                    self.filtered_path,
                    spec(FILTERED_TABLE),
                    FILTERED_FILE,
                    FILTERED_KEY,
                    FILTERED_RECORDS_KEY,
                    eager=False,
                )
            )
        if upsert is not None:
            if not read_only:
                self._check_upsert(upsert)
            self.changes_path = storage.table_uri(
                changes_path if changes_path is not None else f"{str(path).rstrip('/')}_changes"
            )
            # the change table: every staged record of every committed epoch (tombstone column included)
            self._sides.append(
                SideTable(
                    "change",
                    self.changes_path,
                    sink_spec(self.schema, self.partition_by),
                    None,
                    CHANGES_KEY,
                    CHANGE_RECORDS_KEY,
                )
            )
        if not read_only:
            existing = open_table(self.path, missing_ok=True)
            if existing is not None:
                self._check_mode(existing)
                self.schema = self._check_existing(existing)
            self._table = ensure_table(self.path, self._spec())[0]
            for side in self._sides:
                side.open()
            self.repair_sides()

    def _check_upsert(self, upsert: UpsertSpec) -> None:
        """An upsert sink's schema has the tombstone column and the key's columns; new columns
        (``widen``) are not supported by its MERGE (refused, with what to do)."""
        if TOMBSTONE not in self.schema.names:
            raise InvalidParameterError(
                "schema", self.schema.names, f"an upsert sink's staged schema, with the {TOMBSTONE} column"
            )
        upsert.check_columns(self.schema.names)
        if self.widen:
            raise InvalidParameterError(
                "decode.on_new_fields",
                "add_columns",
                "fail or rescue with sink.mode: upsert (the keyed table's columns are fixed; declare "
                "new fields in decode.schema)",
            )

    @property
    def keyed_schema(self) -> pa.Schema:
        """The keyed table's columns (upsert sink): the staged schema without ``tombstone``."""
        return pa.schema([f for f in self.schema if f.name != TOMBSTONE])

    def _check_mode(self, table: DeltaTable) -> None:
        """An existing table's recorded mode and key (table properties) against this sink's."""
        config = dict(table.metadata().configuration or {})
        mode = config.get(MODE_PROPERTY, "append")
        key = config.get(KEY_PROPERTY)
        want_mode = "append" if self.upsert is None else "upsert"
        want_key = None if self.upsert is None else ",".join(self.upsert.key)
        if mode == want_mode and key == want_key:
            return
        what = f"an upsert sink keyed by [{key}]" if mode == "upsert" else "an append sink"
        wants = f"sink.mode: upsert with sink.key [{want_key}]" if want_key else "sink.mode: append"
        fix = (
            f"set sink.mode: upsert and sink.key: [{key}] to keep writing it"
            if mode == "upsert"
            else "set sink.mode: append to keep writing it"
        )
        raise StateError(
            f"sink {self.path} is {what} (its Delta properties {MODE_PROPERTY}, {KEY_PROPERTY}), but the "
            f"pipeline has {wants}: {fix}, or point sink.path at a new table (a table's mode and key "
            "do not change in place)",
            path=self.path,
            has=what,
            wants=wants,
        )

    def _spec(self) -> TableSpec:
        if self.upsert is None:
            return sink_spec(self.schema, self.partition_by)
        from dataclasses import replace

        keyed = sink_spec(self.keyed_schema, self.partition_by)
        mode = {MODE_PROPERTY: "upsert", KEY_PROPERTY: ",".join(self.upsert.key)}
        return replace(keyed, extra_properties={**keyed.extra_properties, **mode})

    def _check_existing(self, table: DeltaTable) -> pa.Schema:
        """An existing table's data columns and partitions against the configured ones: the schema
        to write (wider than the configured one when ``widen`` added columns before); else StateError."""
        actual = _arrow_schema(table)
        have, want = _data_fields(actual), _data_fields(self.schema)
        partitions = list(table.metadata().partition_columns)
        if partitions != list(self.partition_by):
            raise StateError(
                f"sink {self.path} is partitioned by {partitions}, but the pipeline's sink.partition_by is "
                f"{list(self.partition_by)}: a Delta table's partition columns cannot change in place. Set "
                f"sink.partition_by: {partitions} to keep writing this table, "
                "or point sink.path at a new table",
                path=self.path,
            )
        if have == want:
            return self.schema
        if self.widen and have[: len(want)] == want:  # columns added by add_columns earlier
            extra = [actual.field(name).with_nullable(True) for name, _ in have[len(want) :]]
            return pa.schema([*self.schema, *extra])
        has_text = _ddl_list(list(actual))
        wants_text = _ddl_list(list(self.schema))
        hint = (
            "set decode.kind: text to keep writing its STRING value column (each value checked as UTF-8; "
            "invalid bytes are bad records), or point sink.path at a new table for the raw bytes"
            if have == [("value", "string")] and want == [("value", "binary")]
            else "set decode to what the table holds, or point sink.path at a new table"
        )
        raise StateError(
            f"sink {self.path} has the data columns [{has_text}], but the pipeline's decode section makes "
            f"[{wants_text}]: {hint}. The table is not migrated: that would rewrite every data file of it "
            "(and a changed column type is not a Delta schema evolution)",
            path=self.path,
            has=has_text,
            wants=wants_text,
        )

    def _get(self) -> DeltaTable | None:
        if self._table is None:
            self._table = open_table(self.path, missing_ok=True)
            return self._table
        return refresh(self._table)

    # -- the recorded epoch --------------------------------------------------------------

    def committed_epoch(self) -> int | None:
        """The pipeline's recorded epoch (the last ``txn`` version of app id ``app_id``), or None."""
        table = self._get()
        return None if table is None else table.transaction_version(self.app_id)

    def committed_metadata(self, epoch: int) -> SinkCommit | None:
        """The commit of ``epoch`` by this pipeline, read from the table history; None if not found."""
        table = self._get()
        if table is None:
            return None
        found = recorded_commit(table, self.app_id, epoch, "epoch")
        if found is None:
            return None
        regions = found.get("regions")
        records = found.get("records")
        if found.get("operation") == "MERGE" and isinstance(found.get("operationMetrics"), Mapping):
            found = {**_merge_counts(found["operationMetrics"]), **found}
        return SinkCommit(
            app_id=self.app_id,
            epoch_id=int(epoch),
            regions=None if regions is None else tuple(int(r) for r in regions),
            table_version=found.get("version"),
            records=None if records is None else int(records),
            attempt_id=None if found.get("attempt_id") is None else str(found["attempt_id"]),
            metadata=found,
        )

    def committed_attempt(self, epoch: int) -> str | None:
        found = self.committed_metadata(epoch)
        return None if found is None else found.attempt_id

    # -- operator checkpoints (rule 8) ----------------------------------------------------------

    def _sink_label(self) -> str:
        return "keyed" if self.upsert is not None else "sink"

    def rewind_plan(self, epoch: int) -> tuple[TableRewind, ...]:
        """What a rewind to checkpoint ``epoch`` does to each table of this sink (rule 8): the sink
        (an upsert sink's keyed table) first, then each side table that exists. Read-only; no data is
        read (the history and the log's file statistics)."""
        plans: list[TableRewind] = []
        tables: list[tuple[str, DeltaTable | None]] = [(self._sink_label(), self._get())]
        for side in self._sides:
            tables.append((side.label, open_table(side.path, missing_ok=True)))
        for label, table in tables:
            if table is None:
                continue
            now = table.version()
            after = version_as_of(table, epoch)
            rows_now = _rows_at(table.table_uri, now)
            rows_after = rows_now if after == now else _rows_at(table.table_uri, after)
            plans.append(TableRewind(label, table.table_uri, now, after, rows_now, rows_after))
        return tuple(plans)

    def operator_commit(
        self, epoch: int, action: Mapping[str, Any], *, expected: int | None, attempt_id: str
    ) -> SinkReceipt:
        """The fenced commit of operator checkpoint ``epoch`` (rule 8): ``action`` on the sink table
        (fenced like an epoch's commit: a replay of the same attempt writes nothing), then on each
        side table. A rewind's ``versions`` name every table's target version by label."""
        if self.read_only:
            raise StateError(f"sink {self.path} is opened read-only: refusing operator epoch {epoch}")
        if action.get("kind") == "reset" and not action.get("forward") and self.upsert is not None:
            raise InvalidParameterError(
                "reset",
                action.get("split"),
                "a forward reset on an upsert sink (its keyed table cannot take back one split's changes)",
                "rewind the pipeline instead (splitkeeper recover --checkpoint N --rewind)",
            )
        table = self._get()
        assert table is not None
        label = self._sink_label()

        def write(target: DeltaTable, properties: Any) -> None:
            properties.custom_metadata[OPERATOR_KEY] = json.dumps(dict(action))
            properties.custom_metadata["records"] = 0
            _apply(target, action, label, properties)

        forward = action.get("kind") == "reset" and action.get("forward")
        result = fenced_commit(
            table,
            pipeline=self.app_id,
            table_name=f"{SINK_TABLE} ({self.path})",
            app_id=self.app_id,
            version=epoch,
            expected=expected,
            write=(lambda t, p: _record_only(t, p, OPERATOR_KEY, action)) if forward else write,
            metadata={"regions": []},
            version_key="epoch",
            attempt=attempt_id,
            what="epoch",
        )
        if self._crash_point is not None:
            self._crash_point(SinkCrashPoint.BEFORE_SIDE_COMMIT, epoch)
        self._side_pending = True
        for side in self._sides:
            if not forward:
                side.apply_operator(self.app_id, epoch, action)
        self._side_pending = False
        return SinkReceipt(epoch, 0, replayed=result.replayed, version=result.table_version)

    # -- commit -----------------------------------------------------------------------------

    def commit(
        self, epoch: int, outputs: Sequence[RegionRun], *, expected: int | None, attempt_id: str
    ) -> SinkReceipt:
        """Commit the acknowledged regions' staged files of ``epoch`` (rules 1-4 of the module doc)."""
        if self.read_only:
            raise StateError(f"sink {self.path} is opened read-only: refusing to commit epoch {epoch}")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidParameterError("epoch", epoch, "an integer >= 0")
        if not isinstance(attempt_id, str) or not attempt_id:
            raise InvalidParameterError("attempt_id", attempt_id, "the decision's attempt id")
        staged = self._check_outputs(epoch, outputs)
        regions = sorted(o.region_id for o in outputs)
        table = self._get()
        assert table is not None
        committed: dict[str, int] = {}
        if self._side_pending:  # a side commit of the last epoch failed in this process
            self.repair_sides()
        if self.widen and table.transaction_version(self.app_id) == expected:
            table = self._widen(table, [self._inspect(epoch, p) for p in self._staged_files(staged)])

        def write(target: DeltaTable, properties: Any) -> None:
            data_files = self._staged_files(staged) if self.upsert is not None else []
            # (a): the side tables' files moved first, untracked until (c); (b): the sink commit lists them
            properties.custom_metadata.update(self._side_entries(epoch, staged, data_files))
            if self.upsert is not None:
                committed["records"] = int(properties.custom_metadata[CHANGE_RECORDS_KEY])
                properties.custom_metadata["records"] = committed["records"]
                self._merge(epoch, target, properties)
                return
            actions, records = self._adopt(epoch, staged)
            if self._crash_point is not None:  # moved into the table's folder, named by no commit yet
                self._crash_point(SinkCrashPoint.AFTER_FILES_MOVED, epoch)
            committed["records"] = records
            properties.custom_metadata["records"] = records
            guarded(
                target.table_uri,
                lambda: target.create_write_transaction(
                    actions,
                    mode="append",
                    schema=self.schema,
                    partition_by=list(self.partition_by) or None,
                    commit_properties=properties,
                ),
            )

        result = fenced_commit(
            table,
            pipeline=self.app_id,
            table_name=f"{SINK_TABLE} ({self.path})",
            app_id=self.app_id,
            version=epoch,
            expected=expected,
            write=write,
            metadata={"regions": regions},
            version_key="epoch",
            attempt=attempt_id,
            what="epoch",
        )
        # (c), also on a replay: the sink commit of this epoch may have landed without them
        self._commit_sides(epoch, result.metadata, {CHANGES_KEY: self._merged} if self._merged else {})
        self._merged = {}
        if result.replayed:
            records = result.metadata.get("records")
            return SinkReceipt(epoch, int(records or 0), replayed=True, version=result.table_version)
        return SinkReceipt(epoch, committed["records"], replayed=False, version=result.table_version)

    # -- upsert (sink.mode: upsert) ------------------------------------------------------------

    def _merge(self, epoch: int, target: DeltaTable, properties: Any) -> None:
        """The fenced write of an upsert sink: ONE delta-rs MERGE of the epoch's winners into the keyed
        table (:mod:`splitkeeper.records.upsert`); an epoch without one only records the epoch."""
        upsert = self.upsert
        assert upsert is not None
        changes = self._side(CHANGES_KEY)
        assert changes is not None
        source = winners(changes.read(properties.custom_metadata[CHANGES_KEY]), upsert)
        properties.custom_metadata["keys"] = source.num_rows
        if source.num_rows == 0:
            guarded(
                target.table_uri,
                lambda: target.create_write_transaction(
                    [], mode="append", schema=self.keyed_schema, commit_properties=properties
                ),
            )
            self._merged = {"upserts": 0, "deletes": 0}
            return
        deleted = upsert.delete_condition("s")
        metrics: dict[str, Any] = guarded(
            target.table_uri,
            lambda: (
                target.merge(
                    source=source,
                    predicate=upsert.key_match("t", "s"),
                    source_alias="s",
                    target_alias="t",
                    commit_properties=properties,
                )
                .when_matched_delete(deleted)
                .when_matched_update_all(f"NOT {deleted}")
                .when_not_matched_insert_all(f"NOT {deleted}")
                .execute()
            ),
        )
        self._merged = _merge_counts(metrics)
        log.debug("sink %s: epoch %s merged: %s", self.path, epoch, metrics)

    @staticmethod
    def _check_outputs(epoch: int, outputs: Sequence[RegionRun]) -> list[str]:
        """Rule 1: the staged paths of acknowledged regions of this epoch."""
        paths: list[str] = []
        for run in outputs:
            if not run.acknowledged:
                raise InvalidParameterError(
                    "outputs",
                    f"region {run.region_id} ({run.outcome.value})",
                    "acknowledged regions' outputs only",
                    hint="only acknowledged regions' output may be committed (protocol rule 2.5)",
                )
            if not run.output:
                continue
            path = os.fspath(run.output)
            segments = dict(_SEGMENT.findall(path.replace(os.sep, "/")))
            if "epoch" not in segments or "region" not in segments:
                raise InvalidParameterError(
                    "outputs",
                    path,
                    "a staged file under .../epoch=<N>/region=<R>/ (the layout region tasks write)",
                )
            if int(segments["epoch"]) != epoch:
                raise InvalidParameterError(
                    "outputs", path, f"a staged file of epoch {epoch}", hint="it belongs to another epoch"
                )
            if int(segments["region"]) != run.region_id:
                raise InvalidParameterError(
                    "outputs",
                    path,
                    f"a staged file of region {run.region_id}",
                    hint="a region's output must be its own staged file",
                )
            paths.append(path)
        return paths

    def _inspect(self, epoch: int, staged_path: str) -> _Staged:
        """Rule 3, before anything moves: find the file (staged, or moved by an earlier attempt) and
        read its footer."""
        name = adopted_name(staged_path)
        moved = storage.join(self.path, name)
        candidates = [(staged_path, storage.filesystem(staged_path)), (moved, storage.filesystem(moved))]
        for location, (fs, inner) in candidates:
            try:
                info = fs.get_file_info(inner)
            except OSError:
                continue
            if info.type.name != "File":
                continue
            try:
                with fs.open_input_file(inner) as handle:
                    metadata = pq.ParquetFile(handle).metadata
            except Exception as err:  # noqa: BLE001 - any unreadable footer is the same problem
                raise StagedOutputError(
                    f"sink {self.path}: staged file {location} of epoch {epoch} is not a complete parquet "
                    f"file ({err}); its region task's output is damaged. Nothing was committed: recover the "
                    "pipeline (splitkeeper recover --checkpoint latest) so the epoch is read again, and "
                    "check the staging storage",
                    path=location,
                    epoch_id=epoch,
                ) from err
            file_schema = metadata.schema.to_arrow_schema()
            found = [(f.name, f.type) for f in file_schema]
            # add_columns: a region writes the configured columns, then the new fields of its records
            # (columns the sink added before or not, any of them, in its order): its extra columns
            in_file = [
                f
                for f in (self._configured if self.widen else self.schema)
                if f.name not in self.partition_by
            ]
            wanted = [(f.name, f.type) for f in in_file]
            extra: tuple[pa.Field, ...] = ()
            if self.widen and len(found) > len(wanted) and found[: len(wanted)] == wanted:
                extra = tuple(file_schema.field(name) for name, _ in found[len(wanted) :])
                found = found[: len(wanted)]
            records_only = [(f.name, f.type) for f in in_file if f.name in STAGED_COLUMNS]
            # an older writer's file lacks the metadata columns at the end: Delta reads them as NULL
            stamped = wanted[: len(STAGED_COLUMNS) + 1]
            whole = found == wanted[: len(found)] and len(found) >= len(stamped)
            types = dict(found)
            for column, wanted_type in wanted:
                if column in types and _shape(types[column]) != _shape(wanted_type):
                    raise StagedOutputError(
                        f"sink {self.path}: staged file {location} of epoch {epoch} has column "
                        f"{column} of type {types[column]}, but the sink's {column} is {wanted_type}: a "
                        "column's type does not change (decode.on_new_fields: add_columns only adds new "
                        "nullable columns). Nothing was committed: declare the column's type in "
                        "decode.schema, or point sink.path at a new table",
                        path=location,
                        epoch_id=epoch,
                    )
            if not whole and found != records_only:
                raise StagedOutputError(
                    f"sink {self.path}: staged file {location} of epoch {epoch} has columns {found}, not the "
                    f"sink's {wanted} (the {SINK_TABLE} schema of the pipeline's decode section). Nothing "
                    "was committed: recover the pipeline so the epoch is read again by this splitkeeper",
                    path=location,
                    epoch_id=epoch,
                )
            stats = file_statistics(metadata, spec(SINK_TABLE).stats_columns)
            values = _partition_values(staged_path, self.partition_by)
            return _Staged(staged_path, location, name, metadata.num_rows, stats, whole, values, extra)
        folder = os.path.dirname(staged_path)
        raise StagedOutputError(
            f"sink {self.path}: staged file {staged_path} of epoch {epoch} is gone, and was not moved into "
            f"the table as {name} either (its staging folder {folder} was removed or never written "
            "completely). Nothing was committed: recover the pipeline (splitkeeper recover --checkpoint "
            "latest) so the epoch is read again, and check what removes files under the staging path",
            path=staged_path,
            epoch_id=epoch,
        )

    def _adopt(self, epoch: int, paths: Sequence[str]) -> tuple[list[Any], int]:
        """Rule 3: check every staged file, then move (or copy) each into the table; the add actions."""
        from deltalake.transaction import AddAction

        checked = [self._inspect(epoch, p) for p in self._staged_files(paths)]  # all before anything moves
        actions = []
        for item in checked:
            target = storage.join(self.path, item.name)
            if item.complete:
                if item.source != target:
                    _move(item.source, target)
            else:
                _rewrite_with_ingested_at(item.source, target)
            fs, inner = storage.filesystem(target)
            info = fs.get_file_info(inner)
            mtime = info.mtime
            millis = (
                int(mtime.timestamp() * 1000)
                if mtime is not None
                else int(datetime.now(UTC).timestamp() * 1000)
            )
            actions.append(
                AddAction(
                    _uri_path(item.name),
                    int(info.size),
                    item.partition_values,
                    millis,
                    True,
                    json.dumps(item.stats),
                )
            )
        return actions, sum(item.rows for item in checked)

    # -- side tables (dead letters, filtered offsets, an upsert sink's changes) -------------------

    def _side_entries(self, epoch: int, staged: Sequence[str], data_files: Sequence[str]) -> dict[str, Any]:
        """Side rule (a) for every side table: its staged files moved into its folder (untracked until
        (c)); returns the custom metadata the sink commit records of them (rule (b))."""
        for label, file_name, hint in _UNCONFIGURED_SIDES:
            if any(side.staged_file == file_name for side in self._sides):
                continue
            for part in staged:
                location = _sibling(part, file_name)
                if _exists(location):
                    raise StagedOutputError(
                        f"sink {self.path}: region output {location} of epoch {epoch} holds {label}, but "
                        f"this sink has no {label} table. Nothing was committed: {hint} and run the "
                        "pipeline again",
                        path=location,
                        epoch_id=epoch,
                    )
        found: dict[str, Any] = {}
        for side in self._sides:
            sources = (
                data_files if side.staged_file is None else [_sibling(p, side.staged_file) for p in staged]
            )
            entries = side.stage(epoch, sources, sink=self.path, required=side.staged_file is None)
            found[side.key] = entries
            found[side.records_key] = sum(int(e["rows"]) for e in entries)
        return found

    def _commit_sides(self, epoch: int, metadata: Mapping[str, Any], extra: Mapping[str, Any]) -> None:
        """Side rule (c), also on a replay: add each side table's files that the sink commit of ``epoch``
        records (``metadata``) to that table, unless it records ``epoch`` already."""
        if not self._sides:
            return
        if self._crash_point is not None:
            self._crash_point(SinkCrashPoint.BEFORE_SIDE_COMMIT, epoch)
        from deltalake.exceptions import DeltaError

        self._side_pending = True
        for side in self._sides:
            if side.key == DEAD_LETTERS_KEY and self._crash_point is not None:
                self._crash_point(SinkCrashPoint.BEFORE_DEAD_LETTER_COMMIT, epoch)
            try:
                side.commit(self.app_id, epoch, metadata.get(side.key) or [], extra.get(side.key))
            except StateError:
                raise
            except (OSError, DeltaError) as err:  # the store failed (a reset, a 5xx past the retries)
                raise StateError(
                    f"sink {self.path}: epoch {epoch}'s sink commit landed, but committing its files to the "
                    f"{side.label} table failed in the store ({type(err).__name__}: {err}). Nothing is lost: "
                    f"the sink commit names those files, and the next run commits them to the {side.label} "
                    "table when it opens (side rule (d)); run again",
                    path=self.path,
                    epoch=epoch,
                    table=side.label,
                ) from err
        self._side_pending = False

    def repair_sides(self) -> int | None:
        """Side rule (d), on open (and on the next commit after a side commit failed): when the recorded
        epoch's sink commit names side-table files that their table does not record yet (the driver died
        between the commits), commit them now. Only the latest epoch can be pending; one history read
        serves every side table. The epoch repaired, or None."""
        if self.read_only or not self._sides:
            return None
        epoch = self.committed_epoch()
        if epoch is None:
            return None
        behind = [s for s in self._sides if (s.epoch(self.app_id) or -1) < epoch]
        if not behind:
            return None
        found = self.committed_metadata(epoch)
        repaired = None
        operator = None if found is None else found.metadata.get(OPERATOR_KEY)
        if operator is not None:  # an operator checkpoint's sink commit (rule 8)
            action = json.loads(operator) if isinstance(operator, str) else dict(operator)
            for side in behind:
                if not action.get("forward") and side.apply_operator(self.app_id, epoch, action):
                    log.warning(
                        "sink %s: the %s table got the %s of operator epoch %s on open (the last command "
                        "died between the sink commit and the %s table's commit)",
                        self.path,
                        side.label,
                        action.get("kind"),
                        epoch,
                        side.label,
                    )
                    repaired = epoch
            self._side_pending = False
            return repaired
        for side in behind:
            entries = [] if found is None else found.metadata.get(side.key) or []
            if side.commit(self.app_id, epoch, entries):
                log.warning(
                    "sink %s: the %s files of epoch %s were committed on open (%s file(s); the last run "
                    "died between the sink commit and the %s table's commit)",
                    self.path,
                    side.label,
                    epoch,
                    len(entries),
                    side.label,
                )
                repaired = epoch
        self._side_pending = False
        return repaired

    def dead_letter_epoch(self) -> int | None:
        """The last epoch whose dead letters were committed (the dead-letter table's ``txn`` version of
        this pipeline), or None (none yet, or no dead-letter table)."""
        side = self._side(DEAD_LETTERS_KEY)
        return None if side is None else side.epoch(self.app_id, fresh=True)

    def change_epoch(self) -> int | None:
        """The last epoch whose records the change table (upsert sink) records, or None."""
        side = self._side(CHANGES_KEY)
        return None if side is None else side.epoch(self.app_id, fresh=True)

    def _side(self, key: str) -> SideTable | None:
        return next((s for s in self._sides if s.key == key), None)

    def _staged_files(self, paths: Sequence[str]) -> list[str]:
        """The staged data files of the outputs: a region's ``part.parquet``, or (partitioned) the
        files its manifest (:data:`PARTS_FILE`) names, one per partition value."""
        files: list[str] = []
        for path in paths:
            if not path.endswith(PARTS_FILE):
                files.append(path)
                continue
            fs, inner = storage.filesystem(path)
            try:
                with fs.open_input_stream(inner) as handle:
                    names = json.loads(handle.read().decode("utf-8"))
            except (OSError, ValueError) as err:
                raise StagedOutputError(
                    f"sink {self.path}: the manifest {path} of epoch {epoch_of(path)} cannot be "
                    f"read ({err}). Nothing was committed: recover the pipeline (splitkeeper recover "
                    "--checkpoint latest) so the epoch is read again",
                    path=path,
                ) from err
            folder = path[: -len(PARTS_FILE)].rstrip("/")
            files.extend(f"{folder}/{name}" for name in names)
        return files

    def _widen(self, table: DeltaTable, checked: Sequence[_Staged]) -> DeltaTable:
        """``add_columns``: add the staged files' new columns to the table (nullable; older rows read
        NULL) before the fenced commit. A column of another type is refused."""
        from deltalake.schema import Field

        known = {f.name: f for f in self.schema}
        new: dict[str, pa.Field] = {}
        origin: dict[str, str] = {}  # a new column -> the staged file that brought it first
        spelled = {name.lower(): name for name in known}
        for item in checked:
            for f in item.extra:
                old = known.get(f.name) or new.get(f.name)
                if old is not None and _shape(old.type) != _shape(f.type):
                    where = (
                        f"the sink's {f.name} is {old.type}"
                        if f.name in known
                        else f"staged file {origin.get(f.name)} of the same epoch (another region's records) "
                        f"has it as {old.type}"
                    )
                    raise StagedOutputError(
                        f"sink {self.path}: staged file {item.source} has column {f.name} of type "
                        f"{f.type}, but {where}: a column's type does not change (only new nullable "
                        "columns are added). Nothing was committed: declare the column's type in "
                        "decode.schema, or point sink.path at a new table",
                        path=item.source,
                    )
                other = spelled.get(f.name.lower())
                if old is None and other is not None:
                    raise StagedOutputError(
                        f"sink {self.path}: staged file {item.source} has the new column {f.name}, which "
                        f"differs only in case from the column {other} "
                        f"{'of the sink' if other in known else f'of staged file {origin.get(other)}'} "
                        "(Delta compares column names case-insensitively; two regions of one epoch met "
                        "both spellings first). Nothing was committed: declare the column in "
                        "decode.schema (the other spelling is then rescued), or use on_new_fields: rescue",
                        path=item.source,
                    )
                if old is None:
                    new[f.name] = f.with_nullable(True)
                    origin[f.name] = item.source
                    spelled[f.name.lower()] = f.name
        if not new:
            return table
        guarded(self.path, lambda: table.alter.add_columns([Field.from_arrow(f) for f in new.values()]))
        log.info("sink %s: added columns %s (decode.on_new_fields: add_columns)", self.path, list(new))
        self.schema = pa.schema([*self.schema, *new.values()])
        return refresh(table)

    # -- staging ------------------------------------------------------------------------------

    # -- maintenance --------------------------------------------------------------------

    def compact(self) -> int:
        """Bin-pack the sink's small files (one per region and epoch) into larger ones; files rewritten.

        The records stay as they are (same rows, new files); the old files stay on disk until
        :meth:`vacuum` removes them, so readers of older versions keep working until then.
        """
        table = self._writable_table("compact the sink")
        metrics: dict[str, Any] = guarded(self.path, table.optimize.compact)
        return int(metrics.get("numFilesRemoved") or 0)

    def vacuum(self, history_hours: float, *, dry_run: bool = False) -> list[str]:
        """Delete the files commits removed more than ``history_hours`` ago (delta-rs's lite vacuum).

        Only files the log tombstoned: never a file of the current version, and never an
        untracked one (a staged file moved in by a commit that did not land yet). ``dry_run``
        lists them and deletes nothing.
        """
        hours = retention_hours(history_hours)
        table = self._get() if dry_run else self._writable_table("vacuum the sink")
        if table is None:
            return []
        files = guarded(
            self.path,
            lambda: table.vacuum(retention_hours=hours, dry_run=dry_run, enforce_retention_duration=False),
        )
        if not dry_run:
            guarded(self.path, table.cleanup_metadata)
        return sorted(files)

    def remove_untracked(
        self, untracked_hours: float, history_hours: float, *, dry_run: bool = False
    ) -> list[tuple[str, int]]:
        """Delete the files in the sink's folder that no Delta version names and that are older than
        ``untracked_hours`` (at least the VACUUM window ``history_hours``); ``(path, bytes)`` of each.

        Listed by delta-rs's full VACUUM (a dry run) less what its lite VACUUM lists: files of a
        commit that died after moving them in, or of a fence loser (rule 3), older than the window
        by their modification time (a move sets it), so a commit moving its files in right now keeps
        them. Only those are deleted (no VACUUM commit); tombstoned files are :meth:`vacuum`'s.
        ``dry_run`` lists them and deletes nothing.
        """
        hours = retention_hours(max(untracked_hours, history_hours))
        table = self._get() if dry_run else self._writable_table("remove untracked files from the sink")
        if table is None:
            return []

        def listing(full: bool) -> set[str]:
            return set(
                guarded(
                    self.path,
                    lambda: table.vacuum(
                        retention_hours=hours, dry_run=True, enforce_retention_duration=False, full=full
                    ),
                )
            )

        untracked = sorted(listing(True) - listing(False))
        fs, inner = storage.filesystem(self.path)
        found = [(path, fs.get_file_info(storage.join(inner, path)).size or 0) for path in untracked]
        if dry_run or not found:
            return found
        for path, _size in found:  # only these: a file that became tracked since is not touched
            fs.delete_file(storage.join(inner, path))
        return found

    def remove_staged_leftovers(
        self, untracked_hours: float, *, dry_run: bool = False
    ) -> list[tuple[str, int]]:
        """Delete the staged files of epochs the sink already recorded (``epoch=N``, N at most
        :meth:`committed_epoch`) that are older than ``untracked_hours``; ``(path, bytes)`` of each.

        No run commits such an epoch again (the fence), so nothing reads them; a later epoch's
        files, which a running or pending epoch may still commit, are never touched.
        """
        if self.staging_path is None:
            return []
        import time

        import pyarrow.fs as pafs

        recorded = self.committed_epoch()
        if recorded is None:
            return []
        cutoff = time.time() - retention_hours(untracked_hours) * 3600
        fs, inner = storage.filesystem(self.staging_path)
        found: list[tuple[str, int]] = []
        try:
            infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True))
        except OSError:
            return []
        for info in infos:
            m = _EPOCH_DIR.match(info.base_name)
            if m is None or int(m[1]) > recorded:
                continue
            for item in fs.get_file_info(pafs.FileSelector(info.path, recursive=True)):
                if (
                    item.type == pafs.FileType.File
                    and item.mtime is not None
                    and item.mtime.timestamp() < cutoff
                ):
                    found.append((item.path, item.size or 0))
        if not dry_run and not self.read_only:
            for path, _size in found:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(path)
        return sorted(found)

    def hours_since(self, epoch: int) -> float:
        """Hours since the sink's version as of ``epoch`` was committed: a VACUUM that keeps files removed
        this recently keeps everything a rewind to ``epoch`` restores (rule 8). 0 without a table."""
        table = self._get()
        if table is None:
            return 0.0
        stamp = _entry_as_of(guarded(self.path, lambda: table.history()), epoch)["timestamp"]
        if stamp is None:
            return 0.0
        return max(0.0, (datetime.now(UTC).timestamp() * 1000 - int(stamp)) / 3_600_000) + 1.0

    def _writable_table(self, what: str) -> DeltaTable:
        if self.read_only:
            raise StateError(f"the sink at {self.path} is open read-only; cannot {what}", path=self.path)
        table = self._get()
        assert table is not None  # a writable sink created its table
        return table

    def discard(self, epoch: int) -> None:
        """Drop what regions staged for ``epoch`` (idempotent, best effort)."""
        if self.staging_path is None or self.read_only:
            return
        fs, inner = storage.filesystem(self.staging_path)
        with contextlib.suppress(OSError):
            fs.delete_dir(storage.join(inner, f"epoch={int(epoch)}"))

    def discard_through(self, epoch: int) -> None:
        """On open: remove the staged output of epochs up to ``epoch`` (committed or abandoned).

        A driver killed after its checkpoint row, or a cancelled task finishing late,
        leaves ``epoch=N`` folders nobody reads. Newer folders stay: another run may be
        writing them.
        """
        if self.staging_path is None or self.read_only:
            return
        import pyarrow.fs as pafs

        fs, inner = storage.filesystem(self.staging_path)
        try:
            infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True))
        except OSError:
            return
        for info in infos:
            m = _EPOCH_DIR.match(info.base_name)
            if m is not None and int(m[1]) <= epoch:
                with contextlib.suppress(OSError):
                    fs.delete_dir(info.path)


# --------------------------------------------------------------------------- upsert helpers


def winners(rows: pa.Table, upsert: UpsertSpec) -> pa.Table:
    """An epoch's staged rows reduced to what its MERGE applies (:mod:`splitkeeper.records.upsert`):
    keyless tombstones dropped (rule 4), then per key (null-safe) the row of the highest
    ``(offset, split_id)`` (rule 2; one epoch, so ``epoch`` ties). Vectorised with pyarrow."""
    import pyarrow.compute as pc

    if not upsert.keyed_tombstones and rows.num_rows:
        rows = rows.filter(pc.invert(pc.fill_null(rows.column(TOMBSTONE), False)))
    if rows.num_rows == 0:
        return rows
    row = "__splitkeeper_row"
    indexed = rows.append_column(row, pa.array(range(rows.num_rows), pa.int64()))
    ordered = indexed.sort_by([("offset", "descending"), ("split_id", "descending")])
    first = ordered.group_by(list(upsert.key), use_threads=False).aggregate([(row, "first")])
    picked = first.column(f"{row}_first").combine_chunks()
    return rows.take(picked.take(pc.sort_indices(picked)))  # in staged order


def _merge_counts(metrics: Mapping[str, Any]) -> dict[str, int]:
    """A delta-rs MERGE's metrics as the keyed table's counts: rows upserted (inserted + updated) and
    rows deleted."""
    inserted = int(metrics.get("num_target_rows_inserted") or 0)
    updated = int(metrics.get("num_target_rows_updated") or 0)
    return {
        "upserts": inserted + updated,
        "inserted": inserted,
        "updated": updated,
        "deletes": int(metrics.get("num_target_rows_deleted") or 0),
    }


# --------------------------------------------------------------------------- reading back


def read_sink(path: str | os.PathLike[str], columns: Sequence[str] | None = None) -> pa.Table:
    """The rows of the sink table at ``path`` (its latest version), read with delta-rs and pyarrow:
    ``columns`` only (all of the sink's when None); an empty table of those columns when no table
    exists there yet. The one reader of a sink's records (report, tools, tests), and of an upsert sink's
    keyed and change tables and the filtered-offsets table given their paths; a damaged log or data
    file is the StateError of :func:`~splitkeeper.delta.tables.open_table` and
    :func:`~splitkeeper.delta.tables.read_rows`."""
    uri = storage.table_uri(path)
    table = open_table(uri, missing_ok=True)
    schema = STAGED_FILE_SCHEMA if table is None else _arrow_schema(table)
    wanted = list(columns) if columns is not None else schema.names
    unknown = [c for c in wanted if c not in schema.names]
    if unknown:
        raise InvalidParameterError("columns", unknown, f"columns of the sink table: {schema.names}")
    if table is None:
        return STAGED_FILE_SCHEMA.empty_table().select(wanted)
    return read_rows(table, sink_spec(schema, table.metadata().partition_columns), columns=wanted)


def read_dead_letters(path: str | os.PathLike[str], columns: Sequence[str] | None = None) -> pa.Table:
    """The rows of the dead-letter table at ``path`` (its latest version), read with delta-rs and
    pyarrow like :func:`read_sink`: ``columns`` only (all when None); an empty table of those columns
    when no table exists there yet."""
    uri = storage.table_uri(path)
    wanted = list(columns) if columns is not None else DEAD_LETTER_SCHEMA.names
    unknown = [c for c in wanted if c not in DEAD_LETTER_SCHEMA.names]
    if unknown:
        raise InvalidParameterError(
            "columns", unknown, f"columns of the dead-letter table: {DEAD_LETTER_SCHEMA.names}"
        )
    table = open_table(uri, missing_ok=True)
    if table is None:
        return DEAD_LETTER_SCHEMA.empty_table().select(wanted)
    return read_rows(table, spec(DEAD_LETTER_TABLE), columns=wanted)


def _exists(uri: str) -> bool:
    fs, inner = storage.filesystem(uri)
    return bool(fs.get_file_info(inner).type.name == "File")


def _sibling(path: str, name: str) -> str:
    """The file ``name`` in the folder of ``path`` (a local path or a URI)."""
    text = os.fspath(path)
    cut = max(text.rfind("/"), text.rfind(os.sep))
    return name if cut < 0 else text[: cut + 1] + name


def sink_files(path: str | os.PathLike[str]) -> int | None:
    """How many data files the sink table at ``path`` has (its latest version, from its log with
    delta-rs; no data file is read), or None when no table exists there yet. Tells a reader whether
    there is anything to scan before it starts Spark (the restart checks)."""
    table = open_table(storage.table_uri(path), missing_ok=True)
    return None if table is None else len(table.file_uris())


def sink_frame(spark: Any, path: str | os.PathLike[str]) -> DataFrame:
    """The sink table at ``path`` read with Spark: what the restart checks scan, once
    :func:`sink_files` said it has data files."""
    return spark.read.format("delta").load(storage.spark_uri(storage.table_uri(path)))


def _move(source: str, target: str) -> None:
    """Rename ``source`` to ``target`` on one local file system; otherwise copy (the source stays)."""
    src_local, dst_local = storage.local_path(source), storage.local_path(target)
    if src_local is not None and dst_local is not None:
        os.makedirs(os.path.dirname(dst_local), exist_ok=True)  # a partition's folder
        try:
            os.replace(src_local, dst_local)
            # a rename keeps the staged file's time: maintain's untracked window counts from the move
            os.utime(dst_local)
            return
        except OSError as err:
            if err.errno != 18:  # EXDEV: another device; copy instead
                raise
        partial = f"{dst_local}.copying"
        shutil.copyfile(src_local, partial)
        os.replace(partial, dst_local)
        return
    import pyarrow.fs as pafs

    src_fs, src_inner = storage.filesystem(source)
    dst_fs, dst_inner = storage.filesystem(target)
    pafs.copy_files(src_inner, dst_inner, source_filesystem=src_fs, destination_filesystem=dst_fs)


def _rewrite_with_ingested_at(source: str, target: str) -> None:
    """An older writer's staged file (record columns only), written into the table with
    ``ingested_at`` = now."""
    src_fs, src_inner = storage.filesystem(source)
    with src_fs.open_input_file(src_inner) as handle:
        data = pq.read_table(handle)
    now = pa.scalar(datetime.now(UTC), STAGED_FILE_SCHEMA.field("ingested_at").type)
    stamped = pa.schema(list(STAGED_FILE_SCHEMA)[: len(STAGED_COLUMNS) + 1])  # the metadata columns read NULL
    data = data.append_column(STAGED_FILE_SCHEMA.field("ingested_at"), pa.repeat(now, data.num_rows)).cast(
        stamped
    )
    dst_fs, dst_inner = storage.filesystem(target)
    with dst_fs.open_output_stream(dst_inner) as out:
        pq.write_table(data, out)
