"""The decode spec: what a record's bytes are, and the sink columns they become.

Contract:

1. :class:`DecodeSpec` is built once from the ``decode`` section (:func:`decode_spec_of`, at
   config validation) and shipped to the region tasks; it is frozen, picklable, and imports
   neither pyarrow nor Spark (the base install validates configs).
2. :meth:`DecodeSpec.data_columns` is the one definition of the sink's data columns:
   ``raw`` -> ``value BINARY``; ``text`` -> ``value STRING``; ``json``/``csv``/``avro`` ->
   the declared columns, plus ``_rescued STRING`` when ``on_new_fields`` is ``rescue``.
   :func:`splitkeeper.delta.schemas.sink_schema` puts the bookkeeping columns around them.
3. Every rule of the ``decode`` section that spans its keys is here, raised as a ConfigError
   naming the key, the value and what is allowed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from splitkeeper.errors import ConfigError
from splitkeeper.records.ddl import Column, avro_columns, decodable_problem, parse_ddl

__all__ = [
    "BOOKKEEPING_COLUMNS",
    "NOT_DATA_COLUMNS",
    "TOMBSTONE",
    "RESCUED",
    "RESERVED_NAMES",
    "Column",
    "DecodeSpec",
    "decode_spec_of",
    "name_clash",
]

#: The column that keeps, as JSON, the fields the declared schema does not name (``rescue``).
RESCUED = "_rescued"
#: The columns every sink has besides the data columns (the record's place and its Kafka metadata).
BOOKKEEPING_COLUMNS: tuple[str, ...] = (
    "split_id",
    "offset",
    "next_offset",
    "epoch",
    "region",
    "ingested_at",
    "key",
    "topic",
    "partition",
    "timestamp",
    "headers",
)
#: The bookkeeping column of an upsert sink's rows (sink.mode upsert only): the value was null, a
#: Kafka tombstone (see :mod:`splitkeeper.records.upsert`).
TOMBSTONE = "tombstone"
#: A derived column a sink may be partitioned by: the UTC date of ``ingested_at``.
INGESTED_DATE = "ingested_date"
#: Every sink column that is not a data column (what a schema's data columns are told apart by).
NOT_DATA_COLUMNS: frozenset[str] = frozenset((*BOOKKEEPING_COLUMNS, INGESTED_DATE, TOMBSTONE))
#: The names no data column may have: the bookkeeping columns and ``_rescued``. Like every column
#: name they compare case-insensitively (as Delta and Spark compare column names): see :func:`name_clash`.
RESERVED_NAMES: frozenset[str] = NOT_DATA_COLUMNS | {RESCUED}
KINDS = ("raw", "text", "json", "csv", "avro")
TYPED_KINDS = ("json", "csv", "avro")


@dataclass(frozen=True, slots=True)
class DecodeSpec:
    """How a record's bytes become columns (module doc). ``columns``: the declared columns
    (typed kinds only); ``avro_schema``: the writer schema's JSON text (kind ``avro`` with a
    schema file)."""

    kind: str = "raw"
    columns: tuple[Column, ...] = ()
    on_new_fields: str = "rescue"
    csv_delimiter: str = ","
    avro_schema: str | None = None
    schema_registry_url: str | None = None
    extra: tuple[tuple[str, Any], ...] = field(default=())

    @property
    def typed(self) -> bool:
        return self.kind in TYPED_KINDS

    def data_columns(self) -> tuple[Column, ...]:
        """The sink's data columns (contract 2)."""
        if self.kind == "raw":
            return (Column("value", "BINARY"),)
        if self.kind == "text":
            return (Column("value", "STRING"),)
        rescued = (Column(RESCUED, "STRING"),) if self.on_new_fields == "rescue" else ()
        return self.columns + rescued

    def sink_column_names(self) -> tuple[str, ...]:
        """Every column a sink of this spec may have (what ``sink.partition_by`` may name)."""
        return (
            BOOKKEEPING_COLUMNS[:3]
            + tuple(c.name for c in self.data_columns())
            + BOOKKEEPING_COLUMNS[3:]
            + (INGESTED_DATE,)
        )


def name_clash(name: str, taken: Mapping[str, str]) -> str | None:
    """Why ``name`` cannot be a data column beside ``taken`` (lower-case name -> the column that
    has it), or None when it can. Delta and Spark compare column names case-insensitively, so any
    spelling of a taken name is taken; a name equal to a taken data column is that column. Every
    :data:`RESERVED_NAMES` is always taken."""
    folded = name.lower()
    have = taken.get(folded)
    if folded in RESERVED_NAMES:
        which = "the _rescued column" if folded == RESCUED else "a bookkeeping column of the sink"
        spelled = "" if name == folded else f" (as {folded!r}: column names compare case-insensitively)"
        return f"{name!r} is {which}{spelled}"
    if have is None or have == name:
        return None
    return f"{name!r} differs from the column {have!r} only in case (column names compare case-insensitively)"


class DecodeSection(Protocol):
    """What :func:`decode_spec_of` reads of the ``decode`` section (the config's model of it,
    :class:`splitkeeper.config.models.DecodeSection`; the records package does not import it)."""

    kind: Any  # an enum whose value is the kind's name
    schema_: str | None
    schema_file: str | None
    schema_registry_url: str | None
    on_new_fields: Any  # an enum whose value is the setting's name
    csv_delimiter: str

    def given(self) -> list[str]: ...


def decode_spec_of(section: DecodeSection, *, base: str | os.PathLike[str], where: str) -> DecodeSpec:
    """The spec of a validated ``decode`` section (contract 3); ``base`` resolves ``schema_file``."""
    kind = section.kind.value
    given = set(section.given())

    def invalid(key: str, value: Any, allowed: str, hint: str = "") -> ConfigError:
        message = f"decode.{key}={value!r} is not allowed: {allowed}" + (f"; {hint}" if hint else "")
        return ConfigError(f"{message} ({where})", key=f"decode.{key}", value=value, allowed=allowed)

    def missing(key: str, allowed: str) -> ConfigError:
        return ConfigError(
            f"decode.{key} is required but missing ({where}): {allowed}",
            key=f"decode.{key}",
            value=None,
            allowed=allowed,
        )

    typed_only = ("schema_", "schema_file", "schema_registry_url", "on_new_fields")
    if kind in ("raw", "text"):
        for key in typed_only:
            if key in given:
                name = key.rstrip("_")
                raise invalid(
                    name,
                    getattr(section, key),
                    f"nothing for decode.kind {kind!r} (it has one value column)",
                    "set decode.kind to json, csv or avro to declare columns",
                )
    if kind != "csv" and "csv_delimiter" in given:
        raise invalid("csv_delimiter", section.csv_delimiter, "nothing unless decode.kind is 'csv'")
    columns: tuple[Column, ...] = ()
    avro_schema = None
    if kind in ("json", "csv"):
        for key in ("schema_file", "schema_registry_url"):
            if key in given:
                raise invalid(key, getattr(section, key), f"nothing for decode.kind {kind!r} (Avro only)")
        if section.schema_ is None:
            raise missing(
                "schema", f"a Spark DDL string of the {kind} record's columns, e.g. 'id BIGINT, name STRING'"
            )
        try:
            columns = parse_ddl(section.schema_)
        except ValueError as err:
            raise invalid("schema", section.schema_, "a Spark DDL string 'name TYPE, ...'", str(err)) from err
        if kind == "csv" and section.on_new_fields.value == "add_columns":
            raise invalid(
                "on_new_fields", "add_columns", "rescue or fail for csv (its extra fields have no names)"
            )
    if kind == "avro":
        if "schema_" in given:
            raise invalid(
                "schema", section.schema_, "nothing for kind 'avro': use decode.schema_file (.avsc)"
            )
        if section.schema_file is None and section.schema_registry_url is None:
            raise missing("schema_file", "an Avro schema file (.avsc), or decode.schema_registry_url")
        if section.schema_file is not None:
            path = Path(section.schema_file).expanduser()
            path = path if path.is_absolute() else Path(base) / path
            try:
                avro_schema = path.read_text(encoding="utf-8")
                parsed = json.loads(avro_schema)
            except (OSError, ValueError) as err:
                raise invalid(
                    "schema_file", section.schema_file, "a readable Avro schema file (JSON)", str(err)
                ) from err
            try:
                columns = avro_columns(parsed)
            except ValueError as err:
                raise invalid("schema_file", section.schema_file, "an Avro record schema", str(err)) from err
    if columns:
        problem = decodable_problem(kind, columns)
        if problem is not None:
            key = "schema_file" if kind == "avro" else "schema"
            raise invalid(
                key, getattr(section, "schema_" if key == "schema" else key), "decodable columns", problem
            )
    taken: dict[str, str] = {}
    for c in columns:
        clash = name_clash(c.name, taken)
        if clash is not None:
            raise invalid(
                "schema",
                section.schema_ or section.schema_file,
                f"column names other than {sorted(RESERVED_NAMES)}, each once in any spelling",
                clash,
            )
        taken[c.name.lower()] = c.name
    return DecodeSpec(
        kind=kind,
        columns=columns,
        on_new_fields=section.on_new_fields.value,
        csv_delimiter=section.csv_delimiter,
        avro_schema=avro_schema,
        schema_registry_url=section.schema_registry_url,
    )
