"""``sink.kind: delta`` (the default): the section of the Delta sink.

Keys: ``path`` (the records table: a path relative to the pipeline file's folder, or a URI),
``connection`` (an Airflow AWS connection for its store), ``partition_by`` (Delta partition
columns, names of the sink's columns), ``mode`` (:class:`SinkMode`: ``append`` every record, or
``upsert`` the latest per ``key``), ``key`` and ``delete_when`` (``upsert`` only), ``changes_path``
(``upsert`` only: the change table, default ``<path>_changes`` beside the sink).

Validated (:meth:`DeltaSink.checked`), the section holds its locations resolved; its upsert rule
is :attr:`DeltaSink.upsert` and the table of the offsets a Spark transform dropped is
:attr:`DeltaSink.filtered_path` (``<path>_filtered``).
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import Field

from splitkeeper.config.base import (
    CONN_ID_PATTERN,
    STORE_CONNECTION,
    Location,
    Text,
    Where,
    choice,
    sibling,
)
from splitkeeper.sinks.keyed import KeyedSinkSection, check_upsert_keys

__all__ = ["DeltaSink", "SinkMode"]


class SinkMode(enum.Enum):
    """``sink.mode``: what an epoch's records do to the sink table."""

    APPEND = "append"  # every record is a new row (the table is the change log)
    UPSERT = "upsert"  # the latest row per sink.key, one Delta MERGE per epoch; deletes by sink.delete_when


class DeltaSink(KeyedSinkSection):
    """``sink`` with ``kind: delta`` (or no kind): the exactly-once Delta table of the records."""

    kind: Literal["delta"] = Field("delta", description="delta (the default)")
    path: Text = Field(description="a path (relative to the file's directory) or a URI")
    connection: Text | None = Field(None, pattern=CONN_ID_PATTERN, description=STORE_CONNECTION)
    partition_by: tuple[Text, ...] = Field(
        (), strict=False, description="a list of sink column names (Delta partition columns)"
    )
    mode: SinkMode = choice(SinkMode, SinkMode.APPEND)
    changes_path: Text | None = Field(
        None,
        description="the change table of an upsert sink: every record of every epoch (default: "
        "<sink.path>_changes beside the sink)",
    )

    @property
    def upserting(self) -> bool:
        return self.mode is SinkMode.UPSERT

    @property
    def staged_partition_by(self) -> tuple[str, ...]:
        return tuple(self.partition_by)

    @property
    def filtered_path(self) -> str:
        """The table of the offsets a Spark transform dropped, beside the sink."""
        return sibling(self.path, "_filtered")

    def connections(self) -> tuple[str, ...]:
        return () if self.connection is None else (self.connection,)

    def locations(self) -> list[Location]:
        found = [Location("sink.path", self.path, "VACUUM on the sink would delete it")]
        if self.changes_path is not None:
            found.append(
                Location(
                    "sink.changes_path",
                    self.changes_path,
                    "it is the change Delta table, whose upkeep removes what it does not own",
                )
            )
        return found

    def checked(self, file: Any, at: Where) -> DeltaSink:
        """The sink's rules with the rest of the file (contract of :class:`SinkSection`): the dead-letter
        table is not the sink; the partition columns are distinct sink columns; ``mode``, ``key``,
        ``delete_when`` and ``changes_path`` together (an upsert sink has a key of distinct sink
        columns, a delete predicate that parses and names sink columns only, and a change table that
        is no other table of the pipeline; an append sink has none of them; a Spark transform may
        change the columns, so its key and predicate are checked again against its output when the
        pipeline opens). Returns the section with its path and change table resolved."""
        path = at.path(self.path)
        dead = file.errors.dead_letter.path
        if dead is not None and dead.rstrip("/") == path.rstrip("/"):
            raise at.invalid("errors.dead_letter.path", dead, "a table other than sink.path")
        columns = file.decode.sink_column_names()
        for name in self.partition_by:
            if name not in columns:
                raise at.invalid(
                    "sink.partition_by",
                    list(self.partition_by),
                    f"names of the sink's columns: {', '.join(columns)}",
                    f"{name!r} is not one",
                )
        if len(set(self.partition_by)) != len(self.partition_by):
            raise at.invalid("sink.partition_by", list(self.partition_by), "distinct column names")
        check_upsert_keys(
            self,
            file,
            at,
            keys=("key", "delete_when", "changes_path"),
            why="a MERGE does not widen the keyed table's columns",
        )
        if not self.upserting:
            return self.model_copy(update={"path": path})
        changes = at.path(self.changes_path) if self.changes_path is not None else sibling(path, "_changes")
        for name, other in (("sink.path", path), ("errors.dead_letter.path", dead)):
            if other is not None and changes.rstrip("/") == other.rstrip("/"):
                raise at.invalid("sink.changes_path", self.changes_path, f"a table other than {name}")
        return self.model_copy(update={"path": path, "changes_path": changes})
