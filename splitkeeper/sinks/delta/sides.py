"""The Delta sink's side tables: the dead letters, a Spark transform's filtered offsets and an upsert
sink's change table, each committed after the sink's fenced commit of an epoch, exactly once, and
repaired on open (:class:`SideTable`, rules (a) to (d)).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from splitkeeper.core.ports import SinkCrashPoint
from splitkeeper.delta import storage
from splitkeeper.delta.schemas import TableSpec
from splitkeeper.delta.tables import _shape, ensure_table, guarded, open_table, refresh
from splitkeeper.errors import StagedOutputError, StateError
from splitkeeper.sinks.delta.actions import OPERATOR_KEY, apply_action, offset_column
from splitkeeper.sinks.delta.files import exists, move, uri_path
from splitkeeper.sinks.delta.stats import file_statistics
from splitkeeper.sinks.port import SinkCommit, SupportsSideTables
from splitkeeper.staging import DEAD_FILE, FILTERED_FILE, StagedFile, StagedRegion

if TYPE_CHECKING:  # pragma: no cover
    from deltalake import DeltaTable

__all__ = ["SideTable", "SideTables"]

log = logging.getLogger("splitkeeper.sinks.delta")

#: The sink commit's metadata keys that name the epoch's files of each side table and count their rows.
DEAD_LETTERS_KEY = "dead_letters"
DEAD_LETTER_RECORDS_KEY = "dead_letter_records"
FILTERED_KEY = "filtered"
FILTERED_RECORDS_KEY = "filtered_records"
CHANGES_KEY = "changes"
CHANGE_RECORDS_KEY = "change_records"
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
        self, epoch: int, sources: Sequence[StagedFile], *, sink: str, required: bool = False
    ) -> list[dict[str, Any]]:
        """Rule (a): the staged files ``sources`` (or moved by an earlier attempt; a missing one is no
        file, or, ``required``, a StagedOutputError) checked, then moved into the table folder. The
        entries the sink commit records (rule (b))."""
        found: list[tuple[str, StagedFile, pq.FileMetaData]] = []  # (where it is now, the file, its footer)
        for staged in sources:
            source, name = staged.path, staged.name
            checked = self._footer(epoch, source, sink)
            if checked is None:
                moved = storage.join(self.path, name)
                checked = self._footer(epoch, moved, sink)
                source = moved if checked is not None else source
            if checked is not None:
                found.append((source, staged, checked))
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
        for source, staged, metadata in found:
            name = staged.name
            target = storage.join(self.path, name)
            if source != target:
                move(source, target)
            fs, inner = storage.filesystem(target)
            info = fs.get_file_info(inner)
            entry = {
                "path": name,
                "size": int(info.size),
                "rows": int(metadata.num_rows),
                "modified": int(info.mtime.timestamp() * 1000) if info.mtime is not None else 0,
                "stats": json.dumps(file_statistics(metadata, self.spec.stats_columns)),
            }
            if self.spec.partition_by:  # a partitioned change table: the file's partition values
                entry["partition_values"] = partition_values(staged, self.spec.partition_by, sink)
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
        missing = [str(e["path"]) for e in entries if not exists(storage.join(self.path, str(e["path"])))]
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
                uri_path(str(e["path"])),
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
            apply_action(table, action, self.label, properties, offset_column=offset_column(self.spec))
        except CommitFailedError:
            done = self.epoch(app_id, fresh=True)
            if done is not None and done >= epoch:
                return False
            raise
        refresh(table)
        self._recorded, self._known = epoch, True
        return True


def partition_values(staged: StagedFile, partition_by: Sequence[str], sink: str) -> dict[str, str | None]:
    """A partitioned staged file's partition values (its manifest entry's), every column of
    ``partition_by``; StagedOutputError when the file was not written for them."""
    missing = [c for c in partition_by if c not in staged.values]
    if missing:
        raise StagedOutputError(
            f"sink {sink}: staged file {staged.path} has no folder for the partition columns {missing} of "
            "the sink: it was not written for this sink.partition_by. Recover the pipeline so the epoch is "
            "read again",
            path=staged.path,
        )
    return {c: staged.values[c] for c in partition_by}


class SideTables(SupportsSideTables):
    """The Delta sink's side tables, rules (a) to (d) of :class:`SideTable` (part of
    :class:`~splitkeeper.sinks.delta.sink.DeltaSink`)."""

    path: str
    app_id: str
    read_only: bool
    _sides: list[SideTable]
    _crash_point: Callable[[SinkCrashPoint, int], None] | None
    _side_pending: bool

    if TYPE_CHECKING:

        def committed_epoch(self) -> int | None: ...

        def committed_metadata(self, epoch: int) -> SinkCommit | None: ...

    def _side_entries(
        self, epoch: int, staged: Sequence[StagedRegion], data_files: Sequence[StagedFile]
    ) -> dict[str, Any]:
        """Side rule (a) for every side table: its staged files moved into its folder (untracked until
        (c)); returns the custom metadata the sink commit records of them (rule (b))."""
        for label, file_name, hint in _UNCONFIGURED_SIDES:
            if any(side.staged_file == file_name for side in self._sides):
                continue
            for region in staged:
                location = region.side(file_name).path
                if exists(location):
                    raise StagedOutputError(
                        f"sink {self.path}: region output {location} of epoch {epoch} holds {label}, but "
                        f"this sink has no {label} table. Nothing was committed: {hint} and run the "
                        "pipeline again",
                        path=location,
                        epoch_id=epoch,
                    )
        found: dict[str, Any] = {}
        for side in self._sides:
            sources = data_files if side.staged_file is None else [r.side(side.staged_file) for r in staged]
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
