"""records.ddl: Spark DDL strings, their Arrow types and Avro record schemas, without Spark."""

from __future__ import annotations

import json
import string

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitkeeper.records.ddl import PRIMITIVES, arrow_schema, arrow_type, avro_columns, parse_ddl, render_ddl
from splitkeeper.records.spec import Column


def test_every_documented_type_reads_to_its_canonical_text() -> None:
    columns = parse_ddl(
        "a STRING, b binary, c Boolean, d TINYINT, e SMALLINT, f INT, g INTEGER, h BIGINT, i FLOAT, "
        "j DOUBLE, k DECIMAL(10, 2), l DATE, m TIMESTAMP, n TIMESTAMP_NTZ, o ARRAY<int>, "
        "p MAP<string, array<bigint>>, "
        "q STRUCT<x: INT, y STRING NOT NULL COMMENT 'why', `z z`: DECIMAL(5,1)>, r LONG, s DECIMAL"
    )
    assert [c.type for c in columns] == [
        "STRING", "BINARY", "BOOLEAN", "TINYINT", "SMALLINT", "INT", "INT", "BIGINT", "FLOAT", "DOUBLE",
        "DECIMAL(10,2)", "DATE", "TIMESTAMP", "TIMESTAMP_NTZ", "ARRAY<INT>", "MAP<STRING, ARRAY<BIGINT>>",
        "STRUCT<x: INT, y: STRING NOT NULL, `z z`: DECIMAL(5,1)>", "BIGINT", "DECIMAL(10,0)",
    ]  # fmt: skip
    assert all(c.nullable for c in columns)


def test_backquoted_names_not_null_and_comments() -> None:
    columns = parse_ddl("`order id` BIGINT NOT NULL COMMENT 'the key', `a``b` string comment \"x, y\"")
    assert columns == (Column("order id", "BIGINT", False), Column("a`b", "STRING", True))


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("", "no columns", "name TYPE"),
        ("id", "column 1 ('id')", "expected a type"),
        ("id BIGINT, name VARCHAR2", "column 2 ('name')", "got 'VARCHAR2' at position 16"),
        ("id INT,", "column 1 ('id')", "another column after ','"),
        ("id INT, id STRING", "column 2 ('id')", "given twice"),
        ("a DECIMAL(40,2)", "column 1 ('a')", "DECIMAL(40,2) is out of range"),
        ("s STRUCT<a INT", "column 1 ('s')", "',' or '>' in STRUCT"),
        ("s STRUCT<a INT, a STRING>", "field 'a' of STRUCT", "given twice"),
        ("a INT b INT", "column 1 ('a')", "',' or the end of the schema, got 'b'"),
        ("a INT NOT", "column 1 ('a')", "NULL after NOT"),
        ("a INT; DROP", "unexpected character ';' at position 5", ""),
        ("m MAP<STRING>", "column 1 ('m')", "expected ','"),
    ],
)
def test_mistakes_say_what_and_where(text: str, where: str, what: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_ddl(text)
    assert where in str(caught.value) and what in str(caught.value)


def test_arrow_types() -> None:
    assert arrow_type("TIMESTAMP") == pa.timestamp("us", tz="UTC")
    assert arrow_type("TIMESTAMP_NTZ") == pa.timestamp("us")
    assert arrow_type("DECIMAL(10,2)") == pa.decimal128(10, 2)
    assert arrow_type("MAP<STRING, ARRAY<INT>>") == pa.map_(pa.string(), pa.list_(pa.int32()))
    assert arrow_type("STRUCT<a: INT NOT NULL, b: DATE>") == pa.struct(
        [pa.field("a", pa.int32(), nullable=False), pa.field("b", pa.date32())]
    )
    schema = arrow_schema(parse_ddl("id BIGINT NOT NULL, v BINARY"))
    assert schema == pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.binary())])


def test_the_module_imports_without_pyarrow() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['pyarrow'] = None\n"
        "from splitkeeper.records.ddl import parse_ddl, avro_columns\n"
        "print(parse_ddl('a STRUCT<b: INT>')[0].type)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "STRUCT<b: INT>"


# --------------------------------------------------------------------------- the round trip

_names = st.text(alphabet=string.ascii_letters + string.digits + "_ `-.", min_size=1, max_size=8)
_primitive = st.sampled_from(PRIMITIVES) | st.builds(
    lambda p, s: f"DECIMAL({p},{min(s, p)})", st.integers(1, 38), st.integers(0, 38)
)


def _struct(fields: list[tuple[str, str, bool]]) -> str:
    unique = list({n: (n, t, nl) for n, t, nl in fields}.values())
    quoted = [
        "`" + n.replace("`", "``") + "`" if not n.isidentifier() or "`" in n else n for n, _, _ in unique
    ]
    inner = ", ".join(
        f"{q}: {t}" + ("" if nl else " NOT NULL") for q, (_, t, nl) in zip(quoted, unique, strict=True)
    )
    return f"STRUCT<{inner}>"


_types = st.recursive(
    _primitive,
    lambda inner: (
        st.builds(lambda t: f"ARRAY<{t}>", inner)
        | st.builds(lambda k, v: f"MAP<{k}, {v}>", _primitive, inner)
        | st.builds(_struct, st.lists(st.tuples(_names, inner, st.booleans()), min_size=1, max_size=3))
    ),
    max_leaves=6,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_names, _types, st.booleans()), min_size=1, max_size=6, unique_by=lambda c: c[0]))
def test_parse_of_render_is_the_columns(columns: list[tuple[str, str, bool]]) -> None:
    canonical = tuple(Column(n, parse_ddl(f"x {t}")[0].type, nl) for n, t, nl in columns)
    assert parse_ddl(render_ddl(canonical)) == canonical
    for c in canonical:  # canonical text is a fixed point, and every type has an Arrow type
        assert parse_ddl(f"x {c.type}")[0].type == c.type
        arrow_type(c.type)


# --------------------------------------------------------------------------- Avro

AVRO = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "double"]}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
        {
            "name": "ship",
            "type": [
                "null",
                {"type": "record", "name": "Ship", "fields": [{"name": "city", "type": "string"}]},
            ],
        },
        {"name": "bill", "type": "Ship"},
        {"name": "ok", "type": "boolean"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "n", "type": "int"},
        {"name": "raw", "type": "bytes"},
    ],
}


def test_avro_record_schemas_map_to_columns() -> None:
    columns = avro_columns(json.dumps(AVRO))
    assert [(c.name, c.type, c.nullable) for c in columns] == [
        ("id", "BIGINT", False),
        ("note", "STRING", True),
        ("amount", "DECIMAL(10,2)", False),
        ("day", "DATE", False),
        ("at", "TIMESTAMP", False),
        ("local", "TIMESTAMP_NTZ", False),
        ("tags", "ARRAY<STRING>", False),
        ("attrs", "MAP<STRING, DOUBLE>", False),
        ("kind", "STRING", False),
        ("hash", "BINARY", False),
        ("ship", "STRUCT<city: STRING NOT NULL>", True),
        ("bill", "STRUCT<city: STRING NOT NULL>", False),
        ("ok", "BOOLEAN", False),
        ("f", "FLOAT", False),
        ("d", "DOUBLE", False),
        ("n", "INT", False),
        ("raw", "BINARY", False),
    ]
    assert parse_ddl(render_ddl(columns)) == columns


@pytest.mark.parametrize(
    ("field_type", "what"),
    [
        (["int", "string"], "field 'x': the union"),
        ({"type": "int", "logicalType": "time-millis"}, "field 'x': the logical type 'time-millis'"),
        ("Nope", "field 'x': unknown Avro type 'Nope'"),
        ("null", "field 'x': the type 'null' alone"),
        (
            {"type": "record", "name": "In", "fields": [{"name": "deep", "type": ["int", "boolean"]}]},
            "field 'In.deep'",
        ),
    ],
)
def test_avro_types_without_a_spark_type_name_the_field(field_type: object, what: str) -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "x", "type": field_type}]}
    with pytest.raises(ValueError, match=None) as caught:
        avro_columns(schema)
    assert what in str(caught.value)


def test_a_recursive_avro_record_is_refused() -> None:
    schema = {
        "type": "record",
        "name": "Node",
        "fields": [{"name": "next", "type": ["null", "Node"]}],
    }
    with pytest.raises(ValueError, match="recursive"):
        avro_columns(schema)


def test_only_an_avro_record_has_columns() -> None:
    with pytest.raises(ValueError, match="must be a record"):
        avro_columns('"string"')


def test_what_a_kind_cannot_decode_is_named() -> None:
    from splitkeeper.records.ddl import decodable_problem

    assert decodable_problem("json", parse_ddl("a STRUCT<b: ARRAY<DATE>>, c DECIMAL(5,2)")) is None
    assert "MAP is not supported for decode.kind json" in (
        decodable_problem("json", parse_ddl("m MAP<STRING, INT>")) or ""
    )
    assert "'s' STRUCT<a: INT>: a csv column must be of a primitive type" in (
        decodable_problem("csv", parse_ddl("s STRUCT<a: INT>")) or ""
    )
    assert decodable_problem("avro", parse_ddl("m MAP<STRING, INT>")) is None
