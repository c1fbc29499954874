"""Operator checkpoints on the Delta sink (module doc rule 8 of :mod:`.sink`): a rewind restores the
sink and every side table to its Delta version as of the target checkpoint; a backward reset deletes
one split's records from an offset on. The sink's fenced commit names the action under
:data:`OPERATOR_KEY`; each side table then applies it with ``Transaction(pipeline, epoch)``, and a
repair on open applies it to a side table that missed it (:mod:`.sides`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from splitkeeper.core.ports import SinkCrashPoint, SinkReceipt
from splitkeeper.delta import storage
from splitkeeper.delta.fence import _metadata_of
from splitkeeper.delta.tables import guarded, open_table
from splitkeeper.errors import InvalidParameterError, StateError
from splitkeeper.sinks.delta.actions import (
    OPERATOR_KEY,
    apply_action,
    fenced_epoch,
    offset_column,
    record_only,
)
from splitkeeper.sinks.delta.sides import SideTable
from splitkeeper.sinks.port import SupportsRewind, TableRewind

if TYPE_CHECKING:  # pragma: no cover
    from deltalake import DeltaTable

    from splitkeeper.records.upsert import UpsertSpec

__all__ = ["Rewinds", "version_as_of"]


def version_as_of(table: DeltaTable, epoch: int) -> int:
    """The table's Delta version as of ``epoch``: the last version before the first commit that
    records a later epoch (commits without one, such as a compaction, belong to the epoch before
    them). Reads the table's history (its commit infos)."""
    return entry_as_of(guarded(table.table_uri, lambda: table.history()), epoch)["version"]


def entry_as_of(history: Sequence[Mapping[str, Any]], epoch: int) -> dict[str, Any]:
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


class Rewinds(SupportsRewind):
    """The Delta sink's operator checkpoints (part of :class:`~splitkeeper.sinks.delta.sink.DeltaSink`)."""

    path: str
    app_id: str
    read_only: bool
    upsert: UpsertSpec | None
    _sides: list[SideTable]
    _crash_point: Callable[[SinkCrashPoint, int], None] | None
    _side_pending: bool

    if TYPE_CHECKING:

        def _get(self) -> DeltaTable | None: ...

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
            apply_action(target, action, label, properties)

        forward = action.get("kind") == "reset" and action.get("forward")
        result = fenced_epoch(
            table,
            app_id=self.app_id,
            path=self.path,
            epoch=epoch,
            expected=expected,
            write=(lambda t, p: record_only(t, p, OPERATOR_KEY, action)) if forward else write,
            regions=[],
            attempt=attempt_id,
        )
        if self._crash_point is not None:
            self._crash_point(SinkCrashPoint.BEFORE_SIDE_COMMIT, epoch)
        self._side_pending = True
        for side in self._sides:
            if not forward:
                side.apply_operator(self.app_id, epoch, action)
        self._side_pending = False
        return SinkReceipt(epoch, 0, replayed=result.replayed, version=result.table_version)

    def rows_from(self, split_id: str, offset: int) -> dict[str, int]:
        """Rows of ``split_id`` at offsets >= ``offset`` in the sink, its dead letters and its filtered
        offsets (what a backward reset deletes): two columns read, filtered by the files' statistics."""
        import pyarrow.compute as pc

        found: dict[str, int] = {}
        places = [("sink", self.path, "offset")] + [
            (side.label, side.path, offset_column(side.spec))
            for side in self._sides
            if side.label in ("dead-letter", "filtered-offset")
        ]
        for label, path, column in places:
            table = open_table(storage.table_uri(path), missing_ok=True)
            if table is None:
                continue
            data = table.to_pyarrow_dataset().to_table(
                columns=[column], filter=(pc.field("split_id") == split_id) & (pc.field(column) >= offset)
            )
            found[label] = data.num_rows
        return found

    def hours_since(self, epoch: int) -> float:
        """Hours since the sink's version as of ``epoch`` was committed: a VACUUM that keeps files removed
        this recently keeps everything a rewind to ``epoch`` restores (rule 8). 0 without a table."""
        table = self._get()
        if table is None:
            return 0.0
        stamp = entry_as_of(guarded(self.path, lambda: table.history()), epoch)["timestamp"]
        if stamp is None:
            return 0.0
        return max(0.0, (datetime.now(UTC).timestamp() * 1000 - int(stamp)) / 3_600_000) + 1.0
