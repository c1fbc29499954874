"""The Iceberg sink's read side (:class:`~splitkeeper.sinks.port.SinkReader`): for the restart
checks, the report, ``status`` and the metrics. An append sink's one table is
:attr:`SinkTable.RECORDS`; an upsert sink's records are its change table and its table is
:attr:`SinkTable.KEYED`. It has no dead letters (empty rows) and no filtered offsets (None
locations). Reading
opens the catalog and writes nothing; a table not created yet reads as absent. The version of the
table is its current snapshot's sequence number (0: created, no snapshot yet).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from splitkeeper.delta.schemas import DEAD_LETTER_SCHEMA
from splitkeeper.errors import InvalidParameterError
from splitkeeper.sinks.iceberg.catalog import equal, load_catalog, load_table, recorded, refresh, version_of
from splitkeeper.sinks.port import SinkReader, SinkTable

if TYPE_CHECKING:  # pragma: no cover
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from splitkeeper.sinks.iceberg.config import IcebergSink

__all__ = ["IcebergSinkReader", "open_reader"]


class IcebergSinkReader(SinkReader):
    """The records of the Iceberg table ``section.table``, committed by pipeline ``app_id``."""

    def __init__(self, section: IcebergSink, app_id: str, *, catalog: Catalog | None = None) -> None:
        self.section = section
        self.app_id = app_id
        self.upsert = section.upsert
        self._catalog = catalog
        self._tables: dict[str, Table] = {}

    def _identifier(self, table: SinkTable) -> str | None:
        """The Iceberg table behind ``table``, or None when this sink has none."""
        if self.upsert is None:
            return self.section.table if table is SinkTable.RECORDS else None
        if table is SinkTable.RECORDS:
            return self.section.changes
        return self.section.table if table is SinkTable.KEYED else None

    def _load(self, identifier: str) -> Table | None:
        """The table ``identifier``, brought up to date, or None while it does not exist."""
        found = self._tables.get(identifier)
        if found is not None:
            refresh(found)
            return found
        if self._catalog is None:
            self._catalog = load_catalog(self.section)
        loaded = load_table(self._catalog, identifier)
        if loaded is not None:
            self._tables[identifier] = loaded
        return loaded

    def _get(self) -> Table | None:
        """The table the pipeline's epochs are recorded in (the keyed table of an upsert sink)."""
        return self._load(self.section.table)

    def _records(self, table: SinkTable) -> Table | None:
        identifier = self._identifier(table)
        return None if identifier is None else self._load(identifier)

    def location(self, table: SinkTable) -> str | None:
        identifier = self._identifier(table)
        if identifier is None:
            return None
        return self.section.path if identifier == self.section.table else self.section.changes_path

    def files(self, table: SinkTable) -> int | None:
        found = self._records(table)
        if found is None:
            return None
        return len(self._data_files(found))

    @staticmethod
    def _data_files(table: Table) -> list[str]:
        if table.current_snapshot() is None:
            return []
        return [task.file.file_path for task in table.scan().plan_files()]

    def rows(
        self, table: SinkTable, columns: Sequence[str] | None = None, *, epoch: int | None = None
    ) -> pa.Table:
        if table is SinkTable.DEAD_LETTERS:
            wanted = list(columns) if columns is not None else DEAD_LETTER_SCHEMA.names
            return DEAD_LETTER_SCHEMA.empty_table().select(wanted)
        if self._identifier(table) is None:
            raise InvalidParameterError("table", table.value, self._tables_named())
        found = self._records(table)
        if found is None:
            from splitkeeper.delta.schemas import STAGED_FILE_SCHEMA

            return STAGED_FILE_SCHEMA.empty_table().select(list(columns or STAGED_FILE_SCHEMA.names))
        schema = found.schema().as_arrow()
        if found.current_snapshot() is None:
            return schema.empty_table().select(list(columns or schema.names))
        from pyiceberg.expressions import AlwaysTrue

        scan = found.scan(
            row_filter=AlwaysTrue() if epoch is None else equal("epoch", int(epoch)),
            selected_fields=tuple(columns) if columns is not None else ("*",),
        )
        return scan.to_arrow()

    def version(self, table: SinkTable) -> int | None:
        return version_of(self._records(table))

    def count(self, table: SinkTable, where: str | None = None) -> int:
        found = self._records(table)
        if found is None or found.current_snapshot() is None:
            return 0
        if where is None:
            return int(found.scan().count())
        from pyiceberg.expressions.parser import parse

        try:
            predicate = parse(where)
        except Exception:  # noqa: BLE001 - pyparsing's ParseException: SQL beyond pyiceberg's row filter
            return _count_sql(found, where)
        return int(found.scan(row_filter=predicate).count())

    def frame(self, spark: Any, table: SinkTable) -> Any:
        """The table's data files read by Spark (the sink's commits write data files only: no delete
        files, so the current snapshot's data files are its rows)."""
        found = self._records(table)
        if found is None:
            raise InvalidParameterError("table", table.value, self._tables_named())
        paths = self._data_files(found)
        if not paths:
            return spark.createDataFrame([], schema=_spark_schema(spark, found.schema().as_arrow()))
        return spark.read.parquet(*paths)

    def schema(self, table: SinkTable = SinkTable.RECORDS) -> pa.Schema | None:
        found = self._records(table)
        return None if found is None else found.schema().as_arrow()

    def versions(self) -> Mapping[str, int]:
        found = version_of(self._get())
        out = {} if found is None else {"sink": found}
        if self.upsert is not None:
            changes = version_of(self._load(self.section.changes))
            if changes is not None:
                out["changes"] = changes
        return out

    def _tables_named(self) -> str:
        if self.upsert is None:
            return "records (the one table of an iceberg append sink)"
        return "records (the change table) or keyed (the keyed table) of an iceberg upsert sink"

    def committed_epoch(self) -> int | None:
        found = recorded(self._get(), self.app_id)
        return None if found is None else found.epoch


def _count_sql(table: Table, where: str) -> int:
    """Rows of ``table`` where the generic-SQL ``where`` holds, for what pyiceberg's row filter does not
    read (``COALESCE``, functions: an upsert sink's delete condition): the columns it names scanned,
    the predicate evaluated by sqlglot's Python executor (what the report asks; no engine needed)."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.executor import execute

    columns = tuple(dict.fromkeys(c.name for c in sqlglot.parse_one(where).find_all(exp.Column)))
    if columns:
        rows = table.scan(selected_fields=columns).to_arrow().to_pylist()
    else:  # a constant predicate: every row or none
        rows = [{"_": 0}] * int(table.scan().count())
    if not rows:
        return 0
    return int(execute(f"SELECT COUNT(*) AS n FROM t WHERE {where}", tables={"t": rows}).rows[0][0])


def _spark_schema(spark: Any, schema: pa.Schema) -> Any:
    empty = spark.createDataFrame(schema.empty_table().to_pandas())
    return empty.schema


def open_reader(config: Any) -> IcebergSinkReader:
    """The reader of a validated pipeline's Iceberg sink (the kind's reader builder)."""
    return IcebergSinkReader(config.sink, config.name)
