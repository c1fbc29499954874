"""The upsert commit of the Delta sink (``sink.mode: upsert``, rule 7 of :mod:`.sink`): ONE delta-rs
MERGE of an epoch's winners into the keyed table; the staged files become the change table.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from splitkeeper.delta.tables import guarded
from splitkeeper.errors import InvalidParameterError
from splitkeeper.records.spec import TOMBSTONE
from splitkeeper.records.upsert import UpsertSpec, winners
from splitkeeper.sinks.delta.sides import CHANGES_KEY

if TYPE_CHECKING:  # pragma: no cover
    from deltalake import DeltaTable

    from splitkeeper.sinks.delta.sides import SideTable

__all__ = ["KEY_PROPERTY", "MODE_PROPERTY", "Upserts", "merge_counts", "winners"]

log = logging.getLogger("splitkeeper.sinks.delta")

#: Delta table properties of an upsert sink's keyed table (and what an append sink lacks).
MODE_PROPERTY = "splitkeeper.sink.mode"
KEY_PROPERTY = "splitkeeper.sink.key"


def merge_counts(metrics: Mapping[str, Any]) -> dict[str, int]:
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


class Upserts:
    """The Delta sink's upsert commit (part of :class:`~splitkeeper.sinks.delta.sink.DeltaSink`)."""

    path: str
    schema: pa.Schema
    widen: bool
    upsert: UpsertSpec | None
    _merged: dict[str, int]

    if TYPE_CHECKING:

        def _side(self, key: str) -> SideTable | None: ...

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
        self._merged = merge_counts(metrics)
        log.debug("sink %s: epoch %s merged: %s", self.path, epoch, metrics)
