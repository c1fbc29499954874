"""The upsert commit of the Iceberg sink (``sink.mode: upsert``, rule 7 of :mod:`.sink`).

Iceberg commits one table at a time (pyiceberg has no multi-table transaction), so the keyed table
and the change table are committed in the Delta upsert sink's two steps, with its recovery rules
(:class:`~splitkeeper.sinks.delta.sides.SideTable`, rules (a) to (d)):

a. before the fenced commit, the epoch's staged records (read and checked, :mod:`.sink` rule 3) are
   written as ONE parquet file into the change table's data folder, named by the epoch and the
   attempt (:func:`pending_name`), untracked: no snapshot names it yet;
b. the fenced commit of the keyed table (one catalog commit, compare-and-swap on the table as read)
   applies the epoch's winners (:func:`~splitkeeper.records.upsert.winners`: per key the latest by
   ``(offset, split_id)``, keyless tombstones dropped): ``overwrite`` with the filter of the
   winners' keys (:func:`keys_filter`) deletes every row of those keys and appends the winners that
   are not deletes (:func:`live`). pyiceberg writes it as up to three snapshots (a DELETE of whole
   files, an OVERWRITE of the files it rewrites without the keys' rows, the APPEND of the live
   winners), all in the same one commit and each carrying the fence's summary properties and
   :data:`CHANGES_KEY`, the pending file (the redo record); an epoch without records is one empty
   APPEND that records it;
c. after it, the change table adds the pending file (``add_files``: no second write) in one snapshot
   naming the pipeline, epoch and attempt, unless it records the epoch already;
d. a driver that died between (b) and (c) leaves the change table one epoch behind: the sink
   commits it on open (:meth:`IcebergUpserts.repair_sides`), and a replayed commit of the epoch
   does the same. A pending file of an attempt whose keyed commit never landed is named by no
   snapshot: no reader sees it.

So the keyed table is the fold of the change table (rule 5 of :mod:`splitkeeper.records.upsert`),
which the restart checks prove. Deletes: the tombstone, or ``delete_when`` evaluated by pyiceberg's
row filter over the winners (:func:`live`). Operator checkpoints: a forward offsets reset records
the epoch in both tables; a rewind is refused (ConfigError): Iceberg restores one table at a time,
and a keyed table rewound without its change table (or the other way round) would break the fold.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from splitkeeper.core.ports import SinkCrashPoint
from splitkeeper.errors import ConfigError, InvalidParameterError, StateError
from splitkeeper.records.spec import TOMBSTONE
from splitkeeper.records.upsert import UpsertSpec, winners
from splitkeeper.sinks.iceberg.catalog import (
    APP_KEY,
    ATTEMPT_KEY,
    CHANGES_KEY,
    EPOCH_KEY,
    RECORDS_KEY,
    RETRIES_PROPERTY,
    Recorded,
    load_table,
    recorded,
    refresh,
)

if TYPE_CHECKING:  # pragma: no cover
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

    from splitkeeper.sinks.iceberg.config import IcebergSink

__all__ = ["IcebergUpserts", "as_written", "keys_filter", "live", "pending_name"]

log = logging.getLogger("splitkeeper.sinks.iceberg")


def pending_name(app_id: str, epoch: int, attempt_id: str) -> str:
    """The name of an epoch's change file in the change table's data folder (rule (a))."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{app_id}-{attempt_id}")
    return f"splitkeeper-epoch-{epoch:012d}-{safe}.parquet"


def keys_filter(rows: pa.Table, key: Sequence[str]) -> BooleanExpression:
    """The row filter of the keys of ``rows`` (null-safe: a null key column is ``IS NULL``): ``IN``
    for one column, else a balanced ``OR`` of the keys' ``AND`` (no deep recursion)."""
    from pyiceberg.expressions import AlwaysFalse, And, EqualTo, In, IsNull, Or, Reference
    from pyiceberg.expressions.literals import literal

    def column(name: str, value: Any) -> BooleanExpression:
        if value is None:
            return IsNull(term=Reference(name))
        return EqualTo(term=Reference(name), value=literal(value))

    if len(key) == 1:
        values = rows.column(key[0]).to_pylist()
        present = sorted({v for v in values if v is not None})
        found: BooleanExpression = (
            In(term=Reference(key[0]), values={literal(v) for v in present}) if present else AlwaysFalse()
        )
        return Or(found, IsNull(term=Reference(key[0]))) if None in values else found
    keys = sorted(set(zip(*(rows.column(k).to_pylist() for k in key), strict=True)), key=repr)
    parts: list[BooleanExpression] = []
    for values in keys:
        expr = column(key[0], values[0])
        for name, value in zip(key[1:], values[1:], strict=True):
            expr = And(expr, column(name, value))
        parts.append(expr)
    if not parts:
        return AlwaysFalse()
    while len(parts) > 1:
        pairs = range(0, len(parts), 2)
        parts = [Or(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i] for i in pairs]
    return parts[0]


def live(chosen: pa.Table, upsert: UpsertSpec, schema: Schema) -> pa.Table:
    """The winners that are not deletes (rule 3): not a tombstone, and ``delete_when`` (pyiceberg's
    row filter, bound to the keyed table's Iceberg ``schema`` and evaluated with pyarrow) not true;
    a null predicate is false."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    if chosen.num_rows == 0:
        return chosen
    deleted = pc.fill_null(chosen.column(TOMBSTONE), False)
    if upsert.delete_when is not None:
        from pyiceberg.expressions.parser import parse
        from pyiceberg.expressions.visitors import bind
        from pyiceberg.io.pyarrow import expression_to_pyarrow

        bound = bind(schema, parse(upsert.delete_when), case_sensitive=True)
        mask = ds.dataset(chosen).to_table(columns={"d": expression_to_pyarrow(bound, schema)}).column("d")
        deleted = pc.or_(deleted, pc.fill_null(mask, False))
    return chosen.filter(pc.invert(deleted))


def as_written(data: pa.Table) -> pa.Table:
    """``data`` as pyiceberg's writer stores it: a null list of structs (the ``headers`` column of a
    record without headers) becomes an empty list (pyiceberg rebuilds such lists from their offsets,
    the workaround of apache/arrow#38809, and drops their nulls). The change file is written so too,
    so the keyed table and the change table hold the same values and the fold check compares like
    with like."""
    import pyarrow.compute as pc

    columns = []
    for field, column in zip(data.schema, data.columns, strict=True):
        kind = field.type
        listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
        if listed and pa.types.is_struct(kind.value_type) and column.null_count:
            column = pc.if_else(pc.is_null(column), pa.scalar([], type=kind), column)
        columns.append(column)
    return pa.table(columns, schema=data.schema)


class IcebergUpserts:
    """The Iceberg sink's upsert commit and its change table (part of
    :class:`~splitkeeper.sinks.iceberg.sink.IcebergEpochSink`; the module doc)."""

    section: IcebergSink
    app_id: str
    identifier: str
    schema: pa.Schema
    catalog: Catalog
    read_only: bool
    upsert: UpsertSpec | None
    _changes: Table | None
    _crash_point: Callable[[SinkCrashPoint, int], None] | None

    if TYPE_CHECKING:

        def _get(self) -> Table | None: ...

    @property
    def keyed_schema(self) -> pa.Schema:
        """The keyed table's columns (upsert sink): the staged schema without ``tombstone``."""
        return pa.schema([f for f in self.schema if f.name != TOMBSTONE])

    def _check_upsert(self, upsert: UpsertSpec) -> None:
        if TOMBSTONE not in self.schema.names:
            raise InvalidParameterError(
                "schema", self.schema.names, f"an upsert sink's staged schema, with the {TOMBSTONE} column"
            )
        upsert.check_columns(self.schema.names)

    def _ensure_changes(self) -> Table:
        """The change table (created with the staged columns, tombstone included), checked."""
        found = load_table(self.catalog, self.section.changes)
        if found is None:
            self.catalog.create_namespace_if_not_exists(self.section.changes.rsplit(".", 1)[0])
            found = self.catalog.create_table_if_not_exists(
                self.section.changes, schema=self.schema, properties={RETRIES_PROPERTY: "0"}
            )
            log.info("sink %s: created the Iceberg change table %s", self.identifier, self.section.changes)
        have = [f.name for f in found.schema().as_arrow()]
        if have != self.schema.names:
            raise StateError(
                f"change table {self.section.changes} has the columns {have}, but the pipeline stages "
                f"{self.schema.names}: set decode to what the table holds, or name new tables in "
                "sink.table and sink.changes_table (tables are not migrated)",
                table=self.section.changes,
            )
        return found

    def _changes_table(self) -> Table | None:
        if self._changes is None:
            self._changes = load_table(self.catalog, self.section.changes)
        else:
            refresh(self._changes)
        return self._changes

    # -- rule (a) and (b): the pending change file and the keyed table's write ---------------------

    def _stage_changes(self, epoch: int, attempt_id: str, data: pa.Table) -> str:
        """Rule (a): the epoch's records as one parquet file in the change table's data folder (no
        field ids: ``add_files`` maps them by name); its location. None written for no records."""
        changes = self._changes_table()
        assert changes is not None  # a writable upsert sink created it
        if data.num_rows == 0:
            return ""
        location = f"{changes.location().rstrip('/')}/data/{pending_name(self.app_id, epoch, attempt_id)}"
        with changes.io.new_output(location).create(overwrite=True) as handle:
            pq.write_table(as_written(data.cast(self.schema)), handle)
        return location

    def _upsert_write(
        self, table: Table, data: pa.Table, properties: dict[str, str]
    ) -> Callable[[Any], None]:
        """Rule (b): the transaction's writes: an overwrite of the winners' keys by the live winners
        (one empty append when the epoch has no winner)."""
        upsert = self.upsert
        assert upsert is not None
        chosen = winners(data, upsert)
        properties["splitkeeper.keys"] = str(chosen.num_rows)
        kept = live(chosen, upsert, table.schema()).select(self.keyed_schema.names).cast(self.keyed_schema)
        if chosen.num_rows == 0:
            return lambda txn: txn.append(kept, snapshot_properties=properties)
        predicate = keys_filter(chosen, upsert.key)

        def write(txn: Any) -> None:
            import warnings

            with warnings.catch_warnings():  # "Delete operation did not match any records": new keys
                warnings.filterwarnings("ignore", message="Delete operation did not match")
                txn.overwrite(kept, overwrite_filter=predicate, snapshot_properties=properties)

        return write

    # -- rule (c) and (d): the change table's commit, and its repair -----------------------------

    def _commit_changes(self, epoch: int, found: Recorded) -> bool:
        """Rule (c): the change table commits the pending file that the keyed table's snapshot ``found``
        of ``epoch`` names, unless it records the epoch already. Whether it committed."""
        changes = self._changes_table()
        assert changes is not None
        done = recorded(changes, self.app_id)
        if done is not None and done.epoch is not None and done.epoch >= epoch:
            return False
        if self._crash_point is not None:
            self._crash_point(SinkCrashPoint.BEFORE_SIDE_COMMIT, epoch)
        from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

        pending = found.properties.get(CHANGES_KEY) or ""
        properties = {
            APP_KEY: self.app_id,
            EPOCH_KEY: str(epoch),
            ATTEMPT_KEY: found.attempt_id or "",
            RECORDS_KEY: found.properties.get(RECORDS_KEY, "0"),
        }
        txn = changes.transaction()
        if pending:
            txn.add_files([pending], snapshot_properties=properties)
        else:
            txn.append(changes.schema().as_arrow().empty_table(), snapshot_properties=properties)
        try:
            txn.commit_transaction()
        except (CommitFailedException, CommitStateUnknownException, OSError) as err:
            refresh(changes)
            done = recorded(changes, self.app_id)
            if done is not None and done.epoch == epoch:  # a rival's repair of the same epoch landed
                return False
            raise StateError(
                f"pipeline {self.app_id!r}: the change table {self.section.changes} could not record epoch "
                f"{epoch} ({type(err).__name__}: {err}); the keyed table records it: run again, the "
                "sink commits the change table's part on open",
                pipeline=self.app_id,
                table=self.section.changes,
                epoch_id=epoch,
            ) from err
        return True

    def repair_sides(self) -> int | None:
        """Rule (d): the change table's part of the recorded epoch, committed when it is missing (the
        driver died between the two commits). The epoch repaired, or None."""
        if self.read_only or self.upsert is None:
            return None
        found = recorded(self._get(), self.app_id)
        if found is None or found.epoch is None:
            return None
        if self._commit_changes(found.epoch, found):
            log.warning(
                "sink %s: the change table %s got epoch %s on open (the last run died between the keyed "
                "table's commit and the change table's)",
                self.identifier,
                self.section.changes,
                found.epoch,
            )
            return found.epoch
        return None

    def dead_letter_epoch(self) -> int | None:
        return None  # an Iceberg sink has no dead-letter table (the config refuses one)

    def change_epoch(self) -> int | None:
        """The last epoch the change table records (upsert sink), or None."""
        if self.upsert is None:
            return None
        found = recorded(self._changes_table(), self.app_id)
        return None if found is None else found.epoch

    def _refuse_rewind(self) -> None:
        if self.upsert is not None:
            raise ConfigError(
                f"recover --rewind of pipeline {self.app_id!r} is not supported with sink.kind: iceberg "
                "and sink.mode: upsert (Iceberg restores one table at a time, and the keyed table and "
                "its change table must move together to stay its fold); reprocess into new tables "
                "(sink.table, sink.changes_table) instead, or use sink.kind: delta, whose rewind "
                "restores both",
                key="sink.mode",
                value="upsert",
            )
