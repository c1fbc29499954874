"""Spark DDL strings without Spark: ``"id BIGINT, name STRING, amount DECIMAL(10,2)"``.

STUB (issue 21, being filled in): top-level ``name TYPE`` pairs of primitive types only.
"""

from __future__ import annotations

import re
from typing import Any

from splitkeeper.records.spec import Column

_PRIMITIVE = re.compile(
    r"^(STRING|BINARY|BOOLEAN|TINYINT|SMALLINT|INT|INTEGER|BIGINT|FLOAT|DOUBLE|DATE|TIMESTAMP|"
    r"TIMESTAMP_NTZ|DECIMAL\(\s*\d+\s*,\s*\d+\s*\))$",
    re.IGNORECASE,
)


def parse_ddl(text: str) -> tuple[Column, ...]:
    """The columns of a DDL string; ValueError says what is wrong and where."""
    columns: list[Column] = []
    for part in [p.strip() for p in re.split(r",(?![^(]*\))", text) if p.strip()]:
        name, _, type_text = part.partition(" ")
        type_text = type_text.strip()
        if not name or not _PRIMITIVE.match(type_text):
            raise ValueError(f"cannot read column {part!r}: expected 'name TYPE'")
        columns.append(Column(name.strip("`"), re.sub(r"\s+", "", type_text.upper())))
    if not columns:
        raise ValueError("no columns")
    names = [c.name for c in columns]
    if len(set(names)) != len(names):
        raise ValueError("a column name is given twice")
    return tuple(columns)


def avro_columns(schema: Any) -> tuple[Column, ...]:
    """The columns of an Avro record schema (STUB)."""
    raise ValueError("avro schemas are not supported yet")


def arrow_type(type_text: str) -> Any:
    """The pyarrow type of a DDL type (STUB: primitives)."""
    import pyarrow as pa

    t = type_text.upper()
    simple = {
        "STRING": pa.string(),
        "BINARY": pa.binary(),
        "BOOLEAN": pa.bool_(),
        "TINYINT": pa.int8(),
        "SMALLINT": pa.int16(),
        "INT": pa.int32(),
        "INTEGER": pa.int32(),
        "BIGINT": pa.int64(),
        "FLOAT": pa.float32(),
        "DOUBLE": pa.float64(),
        "DATE": pa.date32(),
        "TIMESTAMP": pa.timestamp("us", tz="UTC"),
        "TIMESTAMP_NTZ": pa.timestamp("us"),
    }
    if t in simple:
        return simple[t]
    m = re.match(r"DECIMAL\((\d+),(\d+)\)", t)
    if m:
        return pa.decimal128(int(m[1]), int(m[2]))
    raise ValueError(f"unknown type {type_text!r}")
