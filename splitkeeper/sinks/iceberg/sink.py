"""The exactly-once Iceberg sink: :class:`IcebergEpochSink`, the sink port
(:mod:`splitkeeper.sinks.port`) on pyiceberg.

The region tasks stage one parquet file per region and attempt (:mod:`splitkeeper.staging`), as
for the Delta sink. Contract of :meth:`IcebergEpochSink.commit` ``(epoch, outputs, expected=,
attempt_id=)``:

1. Only acknowledged regions' outputs of this epoch (:func:`~splitkeeper.sinks.staged.acknowledged_outputs`).
2. The fence, the protocol of :mod:`splitkeeper.delta.fence` on Iceberg's own mechanism: the
   pipeline's recorded epoch is that of the newest snapshot of the table's lineage naming it
   (:func:`~splitkeeper.sinks.iceberg.catalog.recorded`). When it already is ``epoch`` and its
   snapshot names ``attempt_id``, the commit is a replay: nothing is written (a commit redone after a
   crash finds its own snapshot). When it is not ``expected``: ConcurrentRunError, nothing written.
   Otherwise ONE snapshot is committed on the table as read, its summary carrying the pipeline,
   the epoch, the attempt, the regions and the records; the catalog's compare-and-swap on the main
   branch (pyiceberg's ``AssertRefSnapshotId`` requirement) refuses it when any snapshot landed
   since, and the table's ``commit.retry.num-retries`` is 0 so pyiceberg does not retry it on the
   newer table: the loser reads the table again, finds the winner's commit of the same attempt (a
   replay) or a ConcurrentRunError. A lost answer (``CommitStateUnknownException``, a store error)
   is read again the same way; not found, it is a StateError and the next run's open settles it.
3. The staged files are read with pyarrow (all checked before anything is written: a missing or
   damaged one is a StagedOutputError, nothing committed) and appended: pyiceberg writes the
   table's own data files. ``add_files`` would register the staged files in place instead (no
   second write), but they live in the staging folder that is removed after every epoch, carry no
   Iceberg field ids and may hold types the table stores otherwise; the copy costs one write of
   the epoch's records and keeps the table's files the table's.
4. An epoch with no output still commits (an empty append snapshot) so the epoch is recorded.
5. Operator checkpoints (:class:`~splitkeeper.sinks.port.SupportsRewind`): a rewind commits the
   content of the snapshot as of the target checkpoint (:func:`~.catalog.as_of`) as an overwrite
   snapshot naming the operator's epoch (the lineage only grows: the recorded epoch is the
   operator's); a backward reset deletes one split's rows from an offset on; both fenced as above.
6. ``maintain`` (:class:`~splitkeeper.sinks.port.SupportsUpkeep`) removes the staged leftovers of
   recorded epochs; the table's own upkeep (snapshot expiry, compaction, orphan files) is left to
   the Iceberg tools, so its compact, VACUUM and untracked-file steps do nothing here.
7. Upsert (``sink.mode: upsert``, :mod:`.upsert`): the table is the keyed table (the staged columns
   without ``tombstone``; its properties :data:`~.catalog.MODE_PROPERTY` and
   :data:`~.catalog.KEY_PROPERTY` checked on open), the fenced commit overwrites the epoch's winners'
   keys with its live winners, and a change table (``sink.changes_table``) keeps every record,
   committed after it and repaired on open (:class:`~splitkeeper.sinks.port.SupportsSideTables`).
   A rewind is refused (ConfigError); a backward offsets reset is refused before it reaches the sink.

The table is created by the first writable open (namespace included) with the pipeline's columns
and the properties :data:`~.catalog.RETRIES_PROPERTY` = 0 and :data:`~.catalog.MODE_PROPERTY`; an
existing table is checked (its data columns, its mode) and its retry property set.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from splitkeeper.core.ports import RegionRun, SinkCrashPoint, SinkReceipt
from splitkeeper.delta import storage
from splitkeeper.delta.schemas import STAGED_FILE_SCHEMA
from splitkeeper.errors import ConcurrentRunError, InvalidParameterError, StagedOutputError, StateError
from splitkeeper.records.spec import NOT_DATA_COLUMNS
from splitkeeper.sinks.iceberg.catalog import (
    APP_KEY,
    ATTEMPT_KEY,
    CHANGES_KEY,
    EPOCH_KEY,
    KEY_PROPERTY,
    MODE_PROPERTY,
    OPERATOR_KEY,
    RECORDS_KEY,
    REGIONS_KEY,
    RETRIES_PROPERTY,
    Recorded,
    as_of,
    by_version,
    load_catalog,
    load_table,
    recorded,
    refresh,
    split_from,
    version_of,
)
from splitkeeper.sinks.iceberg.read import IcebergSinkReader
from splitkeeper.sinks.iceberg.upsert import IcebergUpserts
from splitkeeper.sinks.port import (
    Sink,
    SinkCommit,
    SupportsRewind,
    SupportsSideTables,
    SupportsUpkeep,
    TableRewind,
)
from splitkeeper.sinks.staged import (
    acknowledged_outputs,
    discard_epoch,
    discard_epochs_through,
    staged_leftovers,
)
from splitkeeper.staging import StagedRegion

if TYPE_CHECKING:  # pragma: no cover
    from pyiceberg.table import Table

    from splitkeeper.sinks.iceberg.config import IcebergSink

__all__ = ["IcebergEpochSink", "open_sink"]

log = logging.getLogger(__name__)

#: The label of the sink's one table in a rewind's plan and action (the Delta sink's too).
LABEL = "sink"


class IcebergEpochSink(IcebergUpserts, SupportsRewind, SupportsUpkeep, SupportsSideTables, Sink):
    """The Iceberg table ``section.table`` committed by pipeline ``app_id`` (see the module doc).

    ``staging_path``: where the region tasks stage (for :meth:`discard`). ``schema``: the sink's
    columns (the pipeline's :class:`~splitkeeper.spark.task.RecordPolicy` schema; default the raw
    sink's). ``read_only`` sinks create and write nothing."""

    def __init__(
        self,
        section: IcebergSink,
        app_id: str,
        *,
        staging_path: str | None = None,
        read_only: bool = False,
        crash_point: Callable[[SinkCrashPoint, int], None] | None = None,
        schema: pa.Schema | None = None,
    ) -> None:
        if not isinstance(app_id, str) or not app_id.strip():
            raise InvalidParameterError("app_id", app_id, "a non-empty name (the pipeline name)")
        self.section = section
        self.identifier = section.table
        self.path = section.path
        self.app_id = app_id
        self.staging_path = None if staging_path is None else storage.table_uri(staging_path)
        self.read_only = read_only
        self._crash_point = crash_point
        self.upsert = section.upsert
        self.catalog = load_catalog(section, create=not read_only)
        self._table: Table | None = load_table(self.catalog, self.identifier)
        self._changes: Table | None = None
        self.schema: pa.Schema = schema if schema is not None else self._existing_schema()
        if not read_only:
            if self.upsert is not None:
                self._check_upsert(self.upsert)
            self._table = self._ensure()
            if self.upsert is not None:
                self._changes = self._ensure_changes()
                self.repair_sides()

    # -- the table -----------------------------------------------------------------------------

    def _existing_schema(self) -> pa.Schema:
        if self.upsert is not None:  # the staged columns are the change table's
            changes = load_table(self.catalog, self.section.changes)
            if changes is not None:
                return changes.schema().as_arrow()
        return STAGED_FILE_SCHEMA if self._table is None else self._table.schema().as_arrow()

    def _ensure(self) -> Table:
        """Create the table (and its namespace) with the sink's columns, or check the existing one."""
        upsert = self.upsert
        properties = {RETRIES_PROPERTY: "0", MODE_PROPERTY: "append" if upsert is None else "upsert"}
        if upsert is not None:
            properties[KEY_PROPERTY] = ",".join(upsert.key)
        table = self._table
        if table is None:
            self.catalog.create_namespace_if_not_exists(self.section.namespace)
            table = self.catalog.create_table_if_not_exists(
                self.identifier,
                schema=self.schema if upsert is None else self.keyed_schema,
                properties=properties,
            )
            log.info("sink %s: created Iceberg table %s", self.path, self.identifier)
        have = _data_columns(table.schema().as_arrow())
        want = _data_columns(self.schema)
        if have != want:
            raise StateError(
                f"sink {self.identifier} ({self.path}) has the data columns {have}, but the pipeline's "
                f"decode section makes {want}: set decode to what the table holds, or name a new table in "
                "sink.table (the table is not migrated)",
                table=self.identifier,
            )
        mode = table.properties.get(MODE_PROPERTY, "append")
        key = table.properties.get(KEY_PROPERTY)
        if (mode, key) != (properties[MODE_PROPERTY], properties.get(KEY_PROPERTY)):
            what = f"an upsert sink keyed by [{key}]" if mode == "upsert" else f"an {mode} sink"
            wants = (
                f"sink.mode: upsert with sink.key [{properties[KEY_PROPERTY]}]"
                if upsert is not None
                else "sink.mode: append"
            )
            fix = "set sink.mode: append"
            if mode == "upsert":
                fix = f"set sink.mode: upsert and sink.key: [{key}]"
            raise StateError(
                f"sink {self.identifier} is {what} (its properties {MODE_PROPERTY}, {KEY_PROPERTY}), but "
                f"the pipeline has {wants}: {fix} to keep writing it, or name a new table in sink.table "
                "(a table's mode and key do not change in place)",
                table=self.identifier,
            )
        if any(table.properties.get(k) != v for k, v in properties.items()):
            with table.transaction() as txn:  # a table made elsewhere: no retry on a stale view
                txn.set_properties(properties)
        return table

    def _get(self) -> Table | None:
        if self._table is None:
            self._table = load_table(self.catalog, self.identifier)
        else:
            refresh(self._table)
        return self._table

    # -- the recorded epoch --------------------------------------------------------------------

    def committed_epoch(self) -> int | None:
        found = recorded(self._get(), self.app_id)
        return None if found is None else found.epoch

    def committed_metadata(self, epoch: int) -> SinkCommit | None:
        found = recorded(self._get(), self.app_id, epoch)
        if found is None:
            return None
        return SinkCommit(
            app_id=self.app_id,
            epoch_id=int(epoch),
            regions=found.regions,
            table_version=found.sequence_number,
            records=found.records,
            attempt_id=found.attempt_id,
            metadata={**found.properties, "snapshot_id": found.snapshot_id, "version": found.sequence_number},
        )

    def committed_attempt(self, epoch: int) -> str | None:
        found = self.committed_metadata(epoch)
        return None if found is None else found.attempt_id

    def reader(self) -> IcebergSinkReader:
        return IcebergSinkReader(self.section, self.app_id, catalog=self.catalog)

    # -- commit ----------------------------------------------------------------------------------

    def commit(
        self, epoch: int, outputs: Sequence[RegionRun], *, expected: int | None, attempt_id: str
    ) -> SinkReceipt:
        """Commit the acknowledged regions' staged files of ``epoch`` (rules 1-4 of the module doc)."""
        self._check_call(epoch, attempt_id, "commit epoch")
        staged = acknowledged_outputs(epoch, outputs)
        regions = sorted(o.region_id for o in outputs)
        table = self._writable()
        replay = self._fence(table, epoch, expected, attempt_id)
        if replay is not None:
            if self.upsert is not None:  # a replay after a crash before the change table's commit
                self._commit_changes(epoch, replay)
            return SinkReceipt(epoch, replay.records, replayed=True, version=replay.sequence_number)
        data = self._read_staged(epoch, staged)
        properties = self._properties(epoch, attempt_id, regions=regions, records=data.num_rows)
        write: Callable[[Any], None]
        if self.upsert is None:

            def write(txn: Any) -> None:
                txn.append(data, snapshot_properties=properties)

        else:  # rule 7: the change file first (pending), then the keyed table's one commit naming it
            properties[CHANGES_KEY] = self._stage_changes(epoch, attempt_id, data)
            write = self._upsert_write(table, data, properties)
        landed = self._commit(table, epoch, expected, attempt_id, write)
        if self.upsert is not None:
            found = recorded(table, self.app_id, epoch)
            assert found is not None  # the commit just landed (or was found landed)
            self._commit_changes(epoch, found)
        return SinkReceipt(epoch, data.num_rows, replayed=landed.replayed, version=landed.version)

    def _check_call(self, epoch: int, attempt_id: str, what: str) -> None:
        if self.read_only:
            raise StateError(f"sink {self.identifier} is opened read-only: refusing to {what} {epoch}")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidParameterError("epoch", epoch, "an integer >= 0")
        if not isinstance(attempt_id, str) or not attempt_id:
            raise InvalidParameterError("attempt_id", attempt_id, "the decision's attempt id")

    def _writable(self) -> Table:
        table = self._get()
        assert table is not None  # a writable sink created its table
        return table

    def _properties(self, epoch: int, attempt_id: str, **extra: Any) -> dict[str, str]:
        found = {APP_KEY: self.app_id, EPOCH_KEY: str(epoch), ATTEMPT_KEY: attempt_id}
        if "regions" in extra:
            found[REGIONS_KEY] = json.dumps(list(extra["regions"]))
        if "records" in extra:
            found[RECORDS_KEY] = str(int(extra["records"]))
        if "operator" in extra:
            found[OPERATOR_KEY] = json.dumps(dict(extra["operator"]))
        return found

    def _conflict(self, epoch: int, found: int | None, expected: int | None) -> ConcurrentRunError:
        return ConcurrentRunError(
            f"pipeline {self.app_id!r}: cannot commit epoch {epoch} to Iceberg table {self.identifier}: it "
            f"records epoch {found} but this run expected {expected}; another run committed meanwhile; "
            "only one run may drive a pipeline: this run stops, and the state is intact",
            pipeline=self.app_id,
            table=self.identifier,
            epoch_id=epoch,
            found=found,
            expected=expected,
        )

    def _fence(self, table: Table, epoch: int, expected: int | None, attempt_id: str) -> Recorded | None:
        """Rule 2 before writing: this attempt's commit of ``epoch`` (a replay), or None to commit."""
        found = recorded(table, self.app_id)
        current = None if found is None else found.epoch
        if found is not None and current == epoch:
            if found.attempt_id == attempt_id:
                return found
            raise self._conflict(epoch, current, expected)
        if current != expected:
            raise self._conflict(epoch, current, expected)
        return None

    def _commit(
        self, table: Table, epoch: int, expected: int | None, attempt_id: str, write: Callable[[Any], None]
    ) -> _Landed:
        """Rule 2: ``write`` in one transaction on ``table`` as read, committed through the catalog's
        compare-and-swap; a refusal or a lost answer is read again."""
        from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

        txn = table.transaction()
        write(txn)
        try:
            txn.commit_transaction()
        except (CommitFailedException, CommitStateUnknownException, OSError) as err:
            lost = not isinstance(err, CommitFailedException)
            for wait in (0.5, 1.0, 2.0) if lost else (0.0,):
                time.sleep(wait)
                try:
                    table.refresh()
                    break
                except OSError:
                    continue
            replay = self._fence(table, epoch, expected, attempt_id)  # a rival's commit: ConcurrentRunError
            if replay is not None:
                log.warning(
                    "the commit of epoch %s to %s raised (%s), but the table, read again, records it",
                    epoch,
                    self.identifier,
                    err,
                )
                return _Landed(replay.sequence_number, True)
            reason = (
                f"failed in the catalog or store ({type(err).__name__}: {err}), and the table, read again, "
                "does not record it: run again; the next run's open finds out whether it landed"
                if lost
                else f"was refused ({err}) although no other run recorded a newer epoch (another writer "
                "changed the table): retry; if it fails again, check who else writes to the table"
            )
            raise StateError(
                f"pipeline {self.app_id!r}: the commit of epoch {epoch} to Iceberg table {self.identifier} "
                f"{reason}",
                pipeline=self.app_id,
                table=self.identifier,
                epoch_id=epoch,
            ) from err
        return _Landed(version_of(table) or 0, False)

    def _read_staged(self, epoch: int, staged: Sequence[StagedRegion]) -> pa.Table:
        """Rule 3: every staged file read (each checked) before anything is written; as the sink's columns."""
        parts: list[pa.Table] = []
        for region in staged:
            try:
                files = region.files()
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise StagedOutputError(
                    f"sink {self.identifier}: the manifest {region.path} of epoch {epoch} cannot be read "
                    f"({err}). Nothing was committed: recover the pipeline (splitkeeper recover "
                    "--checkpoint latest) so the epoch is read again",
                    path=region.path,
                ) from err
            for item in files:
                fs, inner = storage.filesystem(item.path)
                try:
                    with fs.open_input_file(inner) as handle:
                        part = pq.read_table(handle)
                except Exception as err:  # noqa: BLE001 - gone or damaged: the same problem
                    raise StagedOutputError(
                        f"sink {self.identifier}: staged file {item.path} of epoch {epoch} is missing or not "
                        f"a complete parquet file ({err}). Nothing was committed: recover the pipeline "
                        "(splitkeeper recover --checkpoint latest) so the epoch is read again, and check "
                        "what removes files under the staging path",
                        path=item.path,
                        epoch_id=epoch,
                    ) from err
                if part.schema.names != self.schema.names:
                    raise StagedOutputError(
                        f"sink {self.identifier}: staged file {item.path} of epoch {epoch} has columns "
                        f"{part.schema.names}, not the sink's {self.schema.names}. Nothing was committed: "
                        "recover the pipeline so the epoch is read again by this splitkeeper",
                        path=item.path,
                        epoch_id=epoch,
                    )
                parts.append(part.cast(self.schema))
        return pa.concat_tables(parts) if parts else self.schema.empty_table()

    def discard(self, epoch: int) -> None:
        if self.staging_path is not None and not self.read_only:
            discard_epoch(self.staging_path, epoch)

    def discard_through(self, epoch: int) -> None:
        if self.staging_path is not None and not self.read_only:
            discard_epochs_through(self.staging_path, epoch)

    # -- operator checkpoints (rule 5) -------------------------------------------------------------

    def rewind_plan(self, epoch: int) -> tuple[TableRewind, ...]:
        self._refuse_rewind()
        table = self._get()
        if table is None or table.current_snapshot() is None:
            return ()
        now = version_of(table) or 0
        target = as_of(table, self.app_id, epoch)
        after = 0 if target is None else target.sequence_number
        rows_now = _rows(table, None)
        rows_after = rows_now if after == now else _rows(table, target)
        return (TableRewind(LABEL, self.path, now, after, rows_now, rows_after),)

    def operator_commit(
        self, epoch: int, action: Mapping[str, Any], *, expected: int | None, attempt_id: str
    ) -> SinkReceipt:
        """Operator checkpoint ``epoch``'s fenced commit: a rewind's overwrite with the content of the
        version its ``versions`` name for :data:`LABEL`, a backward reset's delete, or (a forward reset,
        nothing to restore or delete) an empty snapshot that records the epoch."""
        self._check_call(epoch, attempt_id, "commit operator epoch")
        table = self._writable()
        replay = self._fence(table, epoch, expected, attempt_id)
        if replay is not None:
            if self.upsert is not None:
                self._commit_changes(epoch, replay)
            return SinkReceipt(epoch, 0, replayed=True, version=replay.sequence_number)
        properties = self._properties(epoch, attempt_id, records=0, operator=action)
        kind = action.get("kind")
        write: Callable[[Any], None]
        if self.upsert is not None:
            if kind == "rewind":
                self._refuse_rewind()
            if kind == "reset" and not action.get("forward"):
                raise StateError(
                    f"a backward offsets reset of pipeline {self.app_id!r} cannot be applied to the upsert "
                    f"sink {self.identifier} (its keyed table keeps no per-record history)"
                )
            write = self._record_only(properties)  # a forward reset: the epoch recorded, nothing changed
        elif kind == "rewind":
            version = dict(action.get("versions") or {}).get(LABEL)
            now = version_of(table) or 0
            if version is None or int(version) == now:
                write = self._record_only(properties)
            else:
                target = by_version(table, int(version))
                content = self.schema.empty_table() if target is None else _content(table, target)

                def write(txn: Any) -> None:
                    txn.overwrite(content.cast(table.schema().as_arrow()), snapshot_properties=properties)

        elif kind == "reset":
            predicate = split_from(str(action["split"]), int(action["from"]))
            if action.get("forward") or table.scan(row_filter=predicate).count() == 0:
                write = self._record_only(properties)
            else:

                def write(txn: Any) -> None:
                    txn.delete(predicate, snapshot_properties=properties)

        else:
            raise StateError(f"unknown operator action {dict(action)!r} for Iceberg table {self.identifier}")
        landed = self._commit(table, epoch, expected, attempt_id, write)
        if self.upsert is not None:
            found = recorded(table, self.app_id, epoch)
            assert found is not None
            self._commit_changes(epoch, found)
        return SinkReceipt(epoch, 0, replayed=landed.replayed, version=landed.version)

    def _record_only(self, properties: dict[str, str]) -> Callable[[Any], None]:
        empty = self._writable().schema().as_arrow().empty_table()
        return lambda txn: txn.append(empty, snapshot_properties=properties)

    def rows_from(self, split_id: str, offset: int) -> dict[str, int]:
        table = self._get()
        if table is None or table.current_snapshot() is None:
            return {}
        return {LABEL: int(table.scan(row_filter=split_from(split_id, offset)).count())}

    def hours_since(self, epoch: int) -> float:
        table = self._get()
        target = None if table is None else as_of(table, self.app_id, epoch)
        if target is None:
            return 0.0
        return max(0.0, (time.time() * 1000 - target.timestamp_ms) / 3_600_000) + 1.0

    # -- upkeep (maintain) ------------------------------------------------------------------------
    # The table's own upkeep (expiring snapshots, compaction, orphan files) is the Iceberg tools'
    # (Spark's system procedures, the catalog's): pyiceberg 0.12 expires snapshots' metadata only.
    # maintain keeps the state tables and removes the staged leftovers of recorded epochs.

    def compact(self) -> int:
        return 0

    def vacuum(self, history_hours: float, *, dry_run: bool = False) -> list[str]:
        return []

    def remove_untracked(
        self, untracked_hours: float, history_hours: float, *, dry_run: bool = False
    ) -> list[tuple[str, int]]:
        return []

    def remove_staged_leftovers(
        self, untracked_hours: float, *, dry_run: bool = False
    ) -> list[tuple[str, int]]:
        if self.staging_path is None:
            return []
        return staged_leftovers(
            self.staging_path,
            self.committed_epoch(),
            untracked_hours,
            delete=not dry_run and not self.read_only,
        )


def _data_columns(schema: pa.Schema) -> list[tuple[str, str]]:
    """The data columns and their types, as Iceberg keeps them (pyarrow reads its binary and string
    columns back as the ``large_`` types)."""
    return [(f.name, str(f.type).replace("large_", "")) for f in schema if f.name not in NOT_DATA_COLUMNS]


class _Landed:
    __slots__ = ("replayed", "version")

    def __init__(self, version: int, replayed: bool) -> None:
        self.version = version
        self.replayed = replayed


def _rows(table: Table, at: Recorded | None) -> int:
    if at is None:
        snapshot = table.current_snapshot()
        return 0 if snapshot is None else int(table.scan().count())
    return int(table.scan(snapshot_id=at.snapshot_id).count())


def _content(table: Table, at: Recorded) -> pa.Table:
    return table.scan(snapshot_id=at.snapshot_id).to_arrow()


def open_sink(
    config: Any,
    *,
    read_only: bool = False,
    policy: Any = None,
    crash_point: Callable[[Any, int], None] | None = None,
) -> IcebergEpochSink:
    """The Iceberg sink of a validated pipeline (the kind's builder), with the columns of ``policy``
    (the :class:`~splitkeeper.spark.task.RecordPolicy`; None: a read-only sink needs none)."""
    return IcebergEpochSink(
        config.sink,
        config.name,
        staging_path=None if config.staging.path is None else str(config.staging.path),
        read_only=read_only,
        crash_point=crash_point,
        schema=None if policy is None else policy.schema,
    )
