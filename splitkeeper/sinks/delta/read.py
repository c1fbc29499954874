"""Reading the Delta sink's tables back: the one reader of its rows (:func:`read_sink`, delta-rs and
pyarrow, no Spark) for the report, the tools and the tests, Spark frames of them for the restart
checks (a sink can be too large for the driver; :func:`sink_files` says first whether there is
anything to read), and :class:`DeltaSinkReader`, the read side of the sink port
(:class:`~splitkeeper.sinks.port.SinkReader`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from splitkeeper.delta import storage
from splitkeeper.delta.schemas import (
    DEAD_LETTER_SCHEMA,
    DEAD_LETTER_TABLE,
    FILTERED_TABLE,
    STAGED_FILE_SCHEMA,
    sink_spec,
    spec,
)
from splitkeeper.delta.tables import _arrow_schema, open_table, read_rows
from splitkeeper.errors import InvalidParameterError
from splitkeeper.sinks.port import SinkReader, SinkTable

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

    from splitkeeper.records.upsert import UpsertSpec

__all__ = ["DeltaSinkReader", "open_reader", "read_dead_letters", "read_sink", "sink_files", "sink_frame"]


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


class DeltaSinkReader(SinkReader):
    """The read side of a Delta sink: its records table at ``path`` (an upsert sink's keyed table),
    an upsert sink's change table, the dead letters and the filtered offsets (each None: not
    configured). ``app_id``: the pipeline (its recorded epoch)."""

    def __init__(
        self,
        path: str,
        app_id: str,
        *,
        upsert: UpsertSpec | None = None,
        changes_path: str | None = None,
        dead_letter_path: str | None = None,
        filtered_path: str | None = None,
    ) -> None:
        self.path = path
        self.app_id = app_id
        self.upsert = upsert
        self._tables: dict[SinkTable, str | None] = {
            SinkTable.RECORDS: changes_path if upsert is not None else path,
            SinkTable.KEYED: path if upsert is not None else None,
            SinkTable.DEAD_LETTERS: dead_letter_path,
            SinkTable.FILTERED: filtered_path,
        }
        self._open: dict[SinkTable, Any] = {}

    def location(self, table: SinkTable) -> str | None:
        return self._tables[table]

    def files(self, table: SinkTable) -> int | None:
        where = self._tables[table]
        return None if where is None else sink_files(where)

    def rows(
        self, table: SinkTable, columns: Sequence[str] | None = None, *, epoch: int | None = None
    ) -> pa.Table:
        where = self._tables[table]
        if epoch is not None and where is not None:  # pruned on the epoch (the table kept open)
            import pyarrow.compute as pc

            opened = self._opened(table)
            if opened is None:
                return self.rows(table, columns).slice(0, 0)
            return read_rows(
                opened, self._spec(table, opened), filter=pc.field("epoch") == epoch, columns=columns
            )
        if table is SinkTable.DEAD_LETTERS:
            if where is None:
                wanted = list(columns) if columns is not None else DEAD_LETTER_SCHEMA.names
                return DEAD_LETTER_SCHEMA.empty_table().select(wanted)
            return read_dead_letters(where, columns)
        if where is None:
            raise InvalidParameterError("table", table.value, f"a table this sink has: {self._present()}")
        return read_sink(where, columns)

    def version(self, table: SinkTable) -> int | None:
        opened = self._opened(table)
        return None if opened is None else opened.version()

    def _opened(self, table: SinkTable) -> Any:
        """``table`` kept open and brought up to date (a few ms), or None while it does not exist."""
        where = self._tables[table]
        if where is None:
            return None
        found = self._open.get(table)
        if found is None:
            found = open_table(storage.table_uri(where), missing_ok=True)
            if found is not None:
                self._open[table] = found
        else:
            found.update_incremental()
        return found

    @staticmethod
    def _spec(table: SinkTable, opened: Any) -> Any:
        if table is SinkTable.DEAD_LETTERS:
            return spec(DEAD_LETTER_TABLE)
        if table is SinkTable.FILTERED:
            return spec(FILTERED_TABLE)
        return sink_spec(_arrow_schema(opened), opened.metadata().partition_columns)

    def count(self, table: SinkTable, where: str | None = None) -> int:
        """Counted with delta-rs's DataFusion (nothing but the predicate's columns is read)."""
        from deltalake import DeltaTable, QueryBuilder

        location = self._tables[table]
        if location is None or sink_files(location) is None:
            return 0
        sql = "SELECT COUNT(*) AS n FROM t" + (f" WHERE {where}" if where else "")
        rows = QueryBuilder().register("t", DeltaTable(storage.table_uri(location))).execute(sql).read_all()
        return int(rows.column("n")[0].as_py())

    def frame(self, spark: Any, table: SinkTable) -> Any:
        location = self._tables[table]
        if location is None:
            raise InvalidParameterError("table", table.value, f"a table this sink has: {self._present()}")
        return sink_frame(spark, location)

    def schema(self, table: SinkTable = SinkTable.RECORDS) -> pa.Schema | None:
        location = self._tables[table]
        if location is None:
            return None
        found = open_table(storage.table_uri(location), missing_ok=True)
        return None if found is None else _arrow_schema(found)

    def versions(self) -> Mapping[str, int]:
        """Each table's Delta version (-1: none there yet) by its name in the validations' fingerprint
        (``sink``, ``changes``, ``dead_letters``, ``filtered``: the names a validation recorded before)."""
        from splitkeeper.delta.validations import table_versions

        return table_versions(
            {
                "sink": self.path,
                "changes": self._tables[SinkTable.RECORDS] if self.upsert is not None else None,
                "dead_letters": self._tables[SinkTable.DEAD_LETTERS],
                "filtered": self._tables[SinkTable.FILTERED],
            }
        )

    def committed_epoch(self) -> int | None:
        table = open_table(storage.table_uri(self.path), missing_ok=True)
        return None if table is None else table.transaction_version(self.app_id)

    def _present(self) -> list[str]:
        return [t.value for t, where in self._tables.items() if where is not None]


def open_reader(config: Any) -> DeltaSinkReader:
    """The reader of a validated pipeline's Delta sink (the kind's reader builder)."""
    sink = config.sink
    return DeltaSinkReader(
        sink.path,
        config.name,
        upsert=sink.upsert,
        changes_path=sink.changes_path,
        dead_letter_path=config.errors.dead_letter.path,
        filtered_path=sink.filtered_path,
    )
