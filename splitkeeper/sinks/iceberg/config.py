"""``sink.kind: iceberg``: the section of the Iceberg sink.

Keys: ``table`` (the table's identifier, ``namespace.name``), ``warehouse`` (the embedded
catalog's folder: a path relative to the pipeline file's folder, default ``iceberg``; its SQLite
catalog file ``catalog.db`` and the tables' files are kept there) and ``catalog`` (a catalog of
the cluster instead: the properties :func:`pyiceberg.catalog.load_catalog` takes, e.g.
``{type: rest, uri: http://catalog:8181}``; ``name`` names it, and what the file does not say
comes from pyiceberg's own configuration, ``~/.pyiceberg.yaml`` or ``PYICEBERG_CATALOG__<NAME>__*``
variables, where credentials belong). ``mode`` is ``append`` (every record a new row) or
``upsert`` (the latest row per ``key``; ``delete_when`` a predicate that deletes its key, as for the
Delta sink; ``changes_table`` the change table, every record of every epoch, default
``<table>_changes`` in the same namespace). An upsert sink's ``delete_when`` is evaluated by
pyiceberg's row filter (comparisons, ``IN``, ``IS NULL``, ``LIKE 'prefix%'``, ``AND``/``OR``/``NOT``),
checked when the file is loaded.

Validated (:meth:`IcebergSink.checked`), the section holds its warehouse resolved. Dead letters and
a Spark transform's filtered offsets are side tables only the Delta sink commits: a pipeline that
makes them is refused here, before it runs.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field

from splitkeeper.config.base import Location, Text, Where, is_uri
from splitkeeper.sinks.keyed import KeyedSinkSection, check_upsert_keys

__all__ = ["CATALOG_TYPES", "EMBEDDED_CATALOG", "IcebergSink"]

#: The catalog types pyiceberg loads (``pyiceberg.catalog.CatalogType``); ``py-catalog-impl`` names any other.
CATALOG_TYPES = ("rest", "hive", "glue", "dynamodb", "sql", "in-memory", "bigquery")
#: The name of the embedded catalog (its SQLite file is ``<warehouse>/catalog.db``).
EMBEDDED_CATALOG = "splitkeeper"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


class IcebergSink(KeyedSinkSection):
    """``sink`` with ``kind: iceberg``: an Iceberg table of the records, one snapshot per epoch."""

    kind: Literal["iceberg"] = Field(description="iceberg")
    table: Text = Field(description="the table's identifier, namespace.name (e.g. ingest.events)")
    warehouse: Text = Field(
        "iceberg",
        description="the embedded SQL catalog's folder (a path relative to the file's directory): its "
        "SQLite file catalog.db and the tables' files; ignored when sink.catalog names a catalog",
    )
    catalog: dict[str, Text] | None = Field(
        None,
        description="a catalog of the cluster instead of the embedded one: pyiceberg's load_catalog "
        "properties, e.g. {type: rest, uri: http://catalog:8181} ('name' names it; credentials come "
        "from ~/.pyiceberg.yaml or PYICEBERG_CATALOG__<NAME>__* variables, not this file)",
    )
    mode: Literal["append", "upsert"] = Field(
        "append",
        description="append: every record is a new row; upsert: the latest row per sink.key, one "
        "snapshot per epoch (deletes by sink.delete_when or a null Kafka value)",
    )
    changes_table: Text | None = Field(
        None,
        description="the change table of an upsert sink, namespace.name: every record of every epoch "
        "(default: <sink.table>_changes)",
    )

    @property
    def upserting(self) -> bool:
        return self.mode == "upsert"

    @property
    def changes(self) -> str:
        """The change table's identifier (an upsert sink's)."""
        return self.changes_table or f"{self.table}_changes"

    @property
    def changes_path(self) -> str:
        """Where the change table is, for messages (as :attr:`path` for the keyed table)."""
        if self.embedded:
            namespace, name = self.changes.rsplit(".", 1)
            return f"{self.warehouse.rstrip('/')}/{namespace}.db/{name}"
        return f"iceberg://{self.catalog_name}/{self.changes}"

    @property
    def namespace(self) -> str:
        return self.table.rsplit(".", 1)[0]

    @property
    def embedded(self) -> bool:
        """True: the embedded SQL catalog on SQLite in ``warehouse`` (no ``catalog`` given)."""
        return self.catalog is None

    @property
    def catalog_name(self) -> str:
        return (self.catalog or {}).get("name", EMBEDDED_CATALOG)

    def catalog_properties(self) -> dict[str, str]:
        """What :func:`pyiceberg.catalog.load_catalog` gets (``name`` apart)."""
        if self.catalog is not None:
            return {k: v for k, v in self.catalog.items() if k != "name"}
        return {
            "type": "sql",
            "uri": f"sqlite:///{self.warehouse.rstrip('/')}/catalog.db",
            "warehouse": f"file://{self.warehouse}",
        }

    @property
    def path(self) -> str:
        """Where the sink is, for messages and lineage: the embedded table's folder, else the catalog
        and the table (``iceberg://<catalog>/<namespace.name>``)."""
        if self.embedded:
            return f"{self.warehouse.rstrip('/')}/{self.namespace}.db/{self.table.rsplit('.', 1)[1]}"
        return f"iceberg://{self.catalog_name}/{self.table}"

    def locations(self) -> list[Location]:
        if not self.embedded:
            return []
        return [Location("sink.warehouse", self.warehouse, "it holds the Iceberg catalog and tables")]

    def checked(self, file: Any, at: Where) -> IcebergSink:
        """The identifier has a namespace; a given catalog names a type pyiceberg loads (or leaves it to
        pyiceberg's own configuration of its ``name``); the embedded warehouse is a local folder; no
        side table (dead letters, a Spark transform) is asked for. Returns the section with its
        warehouse resolved."""
        from splitkeeper.config.models import NewFields, TransformKind

        if not _IDENTIFIER.match(self.table):
            raise at.invalid(
                "sink.table",
                self.table,
                "namespace.name: letters, digits and _ (e.g. ingest.events)",
                "an Iceberg table lives in a namespace",
            )
        self._check_upsert(file, at)
        if self.catalog is not None:
            kind = self.catalog.get("type")
            if kind is None and "name" not in self.catalog and "py-catalog-impl" not in self.catalog:
                raise at.missing(
                    "sink.catalog.type",
                    f"one of {', '.join(CATALOG_TYPES)} (with its uri), or sink.catalog.name naming a "
                    "catalog configured in ~/.pyiceberg.yaml; or drop sink.catalog for the embedded one",
                )
            if kind is not None and kind not in CATALOG_TYPES:
                raise at.invalid(
                    "sink.catalog.type", kind, f"one of {', '.join(CATALOG_TYPES)}", "pyiceberg loads these"
                )
            if kind in ("rest", "hive", "sql") and "uri" not in self.catalog:
                raise at.missing("sink.catalog.uri", f"the {kind} catalog's address, e.g. {_EXAMPLES[kind]}")
        elif is_uri(self.warehouse) and not self.warehouse.startswith("file://"):
            raise at.invalid(
                "sink.warehouse",
                self.warehouse,
                "a local folder (the embedded catalog is an SQLite file)",
                "for an object store name a catalog: sink.catalog: {type: sql, uri: "
                "'sqlite:////local/catalog.db', warehouse: 's3://bucket/path'} or a REST catalog",
            )
        if file.errors.dead_letter.path is not None:
            raise at.invalid(
                "errors.dead_letter.path",
                file.errors.dead_letter.path,
                "nothing with sink.kind 'iceberg' (dead letters are a side table only the delta sink "
                "commits)",
                "use errors.tolerance: none, or sink.kind: delta",
            )
        if file.decode.on_new_fields == NewFields.ADD_COLUMNS.value:
            raise at.invalid(
                "decode.on_new_fields",
                NewFields.ADD_COLUMNS.value,
                "rescue or fail with sink.kind 'iceberg' (its table's columns are fixed when it is created)",
                "keep new fields in the _rescued column (rescue), or declare them in decode.schema",
            )
        if file.transform_kind is TransformKind.SPARK:
            raise at.invalid(
                "transform.kind",
                TransformKind.SPARK.value,
                "python with sink.kind 'iceberg' (a Spark transform's filtered offsets are a side table "
                "only the delta sink commits)",
                "use a python transform, or sink.kind: delta",
            )
        return self.model_copy(update={"warehouse": at.path(self.warehouse)})

    def _check_upsert(self, file: Any, at: Where) -> None:
        """The upsert keys (:func:`~splitkeeper.sinks.keyed.check_upsert_keys`), the change table's
        identifier, and a ``delete_when`` that pyiceberg's row filter reads."""
        check_upsert_keys(
            self,
            file,
            at,
            keys=("key", "delete_when", "changes_table"),
            why="the keyed Iceberg table's columns are fixed when it is created",
        )
        if not self.upserting:
            return
        if not _IDENTIFIER.match(self.changes) or self.changes == self.table:
            raise at.invalid(
                "sink.changes_table",
                self.changes_table,
                "namespace.name of a table other than sink.table (letters, digits and _)",
            )
        if self.delete_when is not None:
            try:
                from pyiceberg.expressions.parser import parse
            except ModuleNotFoundError:  # pragma: no cover - the sink refuses to open without pyiceberg
                return
            try:
                parse(self.delete_when)
            except Exception as err:  # noqa: BLE001 - pyparsing's ParseException and pyiceberg's own
                raise at.invalid(
                    "sink.delete_when",
                    self.delete_when,
                    "a predicate pyiceberg's row filter reads: comparisons (=, !=, <, <=, >, >=), IN, "
                    "IS NULL, IS NOT NULL, LIKE 'prefix%', AND, OR, NOT over the record's columns, e.g. "
                    "\"op = 'd'\"",
                    f"it does not parse: {str(err).splitlines()[0]}; use sink.kind: delta for any SQL",
                ) from None


_EXAMPLES = {
    "rest": "http://catalog:8181",
    "hive": "thrift://metastore:9083",
    "sql": "postgresql+psycopg2://user@host/db",
}
