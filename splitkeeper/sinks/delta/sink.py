"""The exactly-once Delta sink: :class:`DeltaSink`, the sink port (:mod:`splitkeeper.sinks.port`) on
delta-rs. This module holds its commit; the package's other modules its side tables
(:mod:`.sides`), upsert MERGE (:mod:`.upsert`), operator checkpoints (:mod:`.rewind`), upkeep
(:mod:`.upkeep`), statistics (:mod:`.stats`) and reads (:mod:`.read`).

The region tasks stage one parquet file per region and attempt (the layout of
:mod:`splitkeeper.staging`: every column of the ``sink_records`` schema, see
:mod:`splitkeeper.spark.task`); what a task published is a
:class:`~splitkeeper.staging.StagedRegion`, the ``output`` of its region's run. The sink commits an
epoch by making the acknowledged regions' staged files data files of the table, in one
commit; the records are written once, by the tasks.

Contract of :meth:`DeltaSink.commit` ``(epoch, outputs, expected=, attempt_id=)``:

1. Only acknowledged regions' outputs, each a staged file of this epoch and of its own
   region (its :class:`~splitkeeper.staging.StagedRegion` says so; a path given by hand is read
   back by the staging layout), may be committed: anything else is
   InvalidParameterError and nothing happens.
2. The commit is fenced (:mod:`splitkeeper.delta.fence`, app id = the pipeline, version
   = the epoch): it lands only if the pipeline's recorded epoch is exactly ``expected``
   (the one this run restored or last committed); another run's commit in between
   makes it a ConcurrentRunError. The epoch already recorded by a commit that names
   ``attempt_id`` is a replay: nothing is written, the receipt says ``replayed``.
3. The staged files are checked before anything moves: a missing or unreadable one is
   a StateError naming the path and what to do, and nothing is moved or committed.
   Then each file is moved (renamed, on local disk; copied with ``pyarrow.fs`` to an
   object store) into the table folder under its adopted name
   (:meth:`~splitkeeper.staging.StagedRegion.adopted_name`), and all are added
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

Reading the records back: :mod:`.read` (:func:`~splitkeeper.sinks.delta.read.read_sink`, the one
reader of a sink's rows; :class:`~splitkeeper.sinks.delta.read.DeltaSinkReader`, the port's read
side).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from splitkeeper.core.ports import RegionRun, SinkCrashPoint, SinkReceipt
from splitkeeper.delta import storage
from splitkeeper.delta.fence import recorded_commit
from splitkeeper.delta.schemas import (
    DEAD_LETTER_TABLE,
    FILTERED_TABLE,
    SINK_TABLE,
    STAGED_COLUMNS,
    STAGED_FILE_SCHEMA,
    TableSpec,
    sink_spec,
    spec,
)
from splitkeeper.delta.tables import _arrow_schema, _shape, ensure_table, guarded, open_table, refresh
from splitkeeper.errors import InvalidParameterError, StagedOutputError, StateError
from splitkeeper.records.spec import NOT_DATA_COLUMNS
from splitkeeper.records.upsert import UpsertSpec
from splitkeeper.sinks.delta.actions import fenced_epoch
from splitkeeper.sinks.delta.files import move, rewrite_with_ingested_at, uri_path
from splitkeeper.sinks.delta.read import DeltaSinkReader
from splitkeeper.sinks.delta.rewind import Rewinds
from splitkeeper.sinks.delta.sides import (
    CHANGE_RECORDS_KEY,
    CHANGES_KEY,
    DEAD_LETTER_RECORDS_KEY,
    DEAD_LETTERS_KEY,
    FILTERED_KEY,
    FILTERED_RECORDS_KEY,
    SideTable,
    SideTables,
    partition_values,
)
from splitkeeper.sinks.delta.stats import file_statistics
from splitkeeper.sinks.delta.upkeep import Upkeep
from splitkeeper.sinks.delta.upsert import KEY_PROPERTY, MODE_PROPERTY, Upserts, merge_counts
from splitkeeper.sinks.port import Sink, SinkCommit
from splitkeeper.sinks.staged import acknowledged_outputs
from splitkeeper.staging import DEAD_FILE, FILTERED_FILE, StagedFile, StagedRegion

if TYPE_CHECKING:  # pragma: no cover
    from deltalake import DeltaTable


__all__ = ["DeltaSink", "open_sink"]

log = logging.getLogger(__name__)


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


def _data_fields(schema: pa.Schema) -> list[tuple[str, Any]]:
    return [(f.name, _shape(f.type)) for f in schema if f.name not in NOT_DATA_COLUMNS]


def _ddl_list(fields: Sequence[pa.Field]) -> str:
    return ", ".join(f"{f.name} {str(f.type).upper()}" for f in fields if f.name not in NOT_DATA_COLUMNS)


class DeltaSink(SideTables, Upserts, Rewinds, Upkeep, Sink):
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
            found = {**merge_counts(found["operationMetrics"]), **found}
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

    def reader(self) -> DeltaSinkReader:
        """The read side of this sink's tables."""
        return DeltaSinkReader(
            self.path,
            self.app_id,
            upsert=self.upsert,
            changes_path=self.changes_path,
            dead_letter_path=self.dead_letter_path,
            filtered_path=self.filtered_path,
        )

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

        result = fenced_epoch(
            table,
            app_id=self.app_id,
            path=self.path,
            epoch=epoch,
            expected=expected,
            write=write,
            regions=regions,
            attempt=attempt_id,
        )
        # (c), also on a replay: the sink commit of this epoch may have landed without them
        self._commit_sides(epoch, result.metadata, {CHANGES_KEY: self._merged} if self._merged else {})
        self._merged = {}
        if result.replayed:
            records = result.metadata.get("records")
            return SinkReceipt(epoch, int(records or 0), replayed=True, version=result.table_version)
        return SinkReceipt(epoch, committed["records"], replayed=False, version=result.table_version)

    @staticmethod
    def _check_outputs(epoch: int, outputs: Sequence[RegionRun]) -> list[StagedRegion]:
        """Rule 1: the staged outputs of acknowledged regions of this epoch."""
        return acknowledged_outputs(epoch, outputs)

    def _inspect(self, epoch: int, staged: StagedFile) -> _Staged:
        """Rule 3, before anything moves: find the file (staged, or moved by an earlier attempt) and
        read its footer."""
        staged_path, name = staged.path, staged.name
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
            values = partition_values(staged, self.partition_by, self.path) if self.partition_by else {}
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

    def _adopt(self, epoch: int, staged: Sequence[StagedRegion]) -> tuple[list[Any], int]:
        """Rule 3: check every staged file, then move (or copy) each into the table; the add actions."""
        from deltalake.transaction import AddAction

        checked = [self._inspect(epoch, p) for p in self._staged_files(staged)]  # all before anything moves
        actions = []
        for item in checked:
            target = storage.join(self.path, item.name)
            if item.complete:
                if item.source != target:
                    move(item.source, target)
            else:
                rewrite_with_ingested_at(item.source, target)
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
                    uri_path(item.name),
                    int(info.size),
                    item.partition_values,
                    millis,
                    True,
                    json.dumps(item.stats),
                )
            )
        return actions, sum(item.rows for item in checked)

    def _staged_files(self, staged: Sequence[StagedRegion]) -> list[StagedFile]:
        """The staged data files of the outputs: a region's ``part.parquet``, or (partitioned) the
        files its manifest names, one per partition value."""
        files: list[StagedFile] = []
        for region in staged:
            try:
                files.extend(region.files())
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise StagedOutputError(
                    f"sink {self.path}: the manifest {region.path} of epoch {region.epoch} cannot be "
                    f"read ({err}). Nothing was committed: recover the pipeline (splitkeeper recover "
                    "--checkpoint latest) so the epoch is read again",
                    path=region.path,
                ) from err
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


def open_sink(
    config: Any,
    *,
    read_only: bool = False,
    policy: Any = None,
    crash_point: Callable[[Any, int], None] | None = None,
) -> DeltaSink:
    """The Delta sink of a validated pipeline (the kind's builder): its records table (an upsert
    sink's keyed table), dead letters, filtered offsets and change table, with the columns and
    partitions of ``policy`` (the :class:`~splitkeeper.spark.task.RecordPolicy` of what the region
    tasks stage: its ``schema``, ``partition_by`` and ``widen``; None: a read-only sink needs none). A
    writable one checks an existing table against them and repairs its side tables on open."""
    sink = config.sink
    shape: dict[str, Any] = (
        {}
        if policy is None
        else {"schema": policy.schema, "partition_by": policy.partition_by, "widen": policy.widen}
    )
    return DeltaSink(
        sink.path,
        config.name,
        staging_path=config.staging.path,
        read_only=read_only,
        dead_letter_path=config.errors.dead_letter.path,
        crash_point=crash_point,
        upsert=sink.upsert,  # an upsert sink's keyed table is opened as one (mode and key checked)
        changes_path=sink.changes_path,
        filtered_path=sink.filtered_path,
        **shape,
    )
