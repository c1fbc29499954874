"""An operator checkpoint's action on one Delta table (rule 8 of :mod:`.sink`): a restore to the
version a rewind names for the table, or a delete of a reset split's rows from its offset on. The sink
applies it in its fenced commit (:mod:`.rewind`), each side table after it (:mod:`.sides`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from splitkeeper.delta.fence import FenceResult, WriteFn, fenced_commit
from splitkeeper.delta.schemas import SINK_TABLE, TableSpec
from splitkeeper.delta.tables import _arrow_schema, guarded, sql_string
from splitkeeper.errors import StateError

if TYPE_CHECKING:  # pragma: no cover
    from deltalake import DeltaTable

__all__ = ["OPERATOR_KEY", "apply_action", "fenced_epoch", "offset_column", "record_only"]

#: The sink commit of an operator checkpoint names its action here (rule 8): ``{"kind": "rewind",
#: "to": N, "versions": {label: Delta version}}`` or ``{"kind": "reset", "split": S, "from": offset}``.
OPERATOR_KEY = "operator"


def fenced_epoch(
    table: DeltaTable,
    *,
    app_id: str,
    path: str,
    epoch: int,
    expected: int | None,
    write: WriteFn,
    regions: list[Any],
    attempt: str,
) -> FenceResult:
    """The sink table's fenced commit of ``epoch`` (:func:`~splitkeeper.delta.fence.fenced_commit`
    keyed by ``epoch``): an epoch's data (:mod:`.sink`) and an operator action (:mod:`.rewind`)."""
    return fenced_commit(
        table,
        pipeline=app_id,
        table_name=f"{SINK_TABLE} ({path})",
        app_id=app_id,
        version=epoch,
        expected=expected,
        write=write,
        metadata={"regions": regions},
        version_key="epoch",
        attempt=attempt,
        what="epoch",
    )


def offset_column(table_spec: TableSpec) -> str:
    """The column a reset compares with its offset: a record's ``offset``, a filtered range's start."""
    return "start_offset" if "start_offset" in table_spec.schema.names else "offset"


def apply_action(
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


def record_only(table: DeltaTable, properties: Any, key: str, action: Mapping[str, Any]) -> None:
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
