"""Spark DDL strings without Spark: ``"id BIGINT, name STRING, amount DECIMAL(10,2)"``.

Contract:

1. :func:`parse_ddl` reads a Spark DDL column list: the types ``STRING``, ``BINARY``,
   ``BOOLEAN``, ``TINYINT``, ``SMALLINT``, ``INT``/``INTEGER``, ``BIGINT``, ``FLOAT``,
   ``DOUBLE``, ``DECIMAL(p,s)`` (``DECIMAL`` alone is ``DECIMAL(10,0)``), ``DATE``,
   ``TIMESTAMP``, ``TIMESTAMP_NTZ``, ``ARRAY<t>``, ``MAP<k, v>``, ``STRUCT<a: t, b t>``;
   Spark's aliases ``LONG``, ``SHORT``, ``BYTE``, ``REAL``, ``DEC``, ``NUMERIC`` too;
   backquoted names (a doubled backquote inside is one), ``NOT NULL`` and ``COMMENT '...'``
   (the comment is read and dropped). Each column's ``type`` is the canonical upper-case type
   text (:func:`render_type`: ``INT`` for ``INTEGER``, ``STRUCT<a: INT NOT NULL>``), so two
   spellings of one schema give equal columns. A mistake raises ValueError naming the column
   (or position) and what was expected.
2. :func:`render_ddl` writes columns back: ``parse_ddl(render_ddl(cs)) == cs``.
3. :func:`arrow_type` maps a type text to pyarrow (imported lazily: this module stays
   importable without pyarrow, the config validates with it): ``TIMESTAMP`` ->
   ``timestamp("us", tz="UTC")``, ``TIMESTAMP_NTZ`` -> ``timestamp("us")``.
4. :func:`avro_columns` maps an Avro record schema to columns: primitives, the logical types
   decimal, date, timestamp-millis/micros (``TIMESTAMP``), local-timestamp-millis/micros
   (``TIMESTAMP_NTZ``) and uuid (``STRING``), enums (``STRING``), fixed (``BINARY``), a union
   with null (nullable), records (``STRUCT``), arrays and maps. Anything else (a union of two
   non-null types, time-of-day types, a recursive record) is a ValueError naming the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Column",
    "DdlType",
    "arrow_schema",
    "arrow_type",
    "avro_columns",
    "decodable_problem",
    "parse_ddl",
    "parse_type",
    "render_ddl",
]


@dataclass(frozen=True, slots=True)
class Column:
    """One data column: its name and its Spark SQL type as DDL text (``BIGINT``, ``DECIMAL(10,2)``,
    ``STRUCT<a: INT>``), canonical upper case."""

    name: str
    type: str
    nullable: bool = True


PRIMITIVES = (
    "STRING",
    "BINARY",
    "BOOLEAN",
    "TINYINT",
    "SMALLINT",
    "INT",
    "BIGINT",
    "FLOAT",
    "DOUBLE",
    "DATE",
    "TIMESTAMP",
    "TIMESTAMP_NTZ",
)
_ALIASES = {
    "INTEGER": "INT",
    "LONG": "BIGINT",
    "SHORT": "SMALLINT",
    "BYTE": "TINYINT",
    "REAL": "FLOAT",
    "DEC": "DECIMAL",
    "NUMERIC": "DECIMAL",
}
_EXPECTED_TYPE = (
    "a type (" + ", ".join(PRIMITIVES) + ", DECIMAL(p,s), ARRAY<t>, MAP<k, v>, STRUCT<name: t, ...>)"
)
_TOKEN = re.compile(
    r"\s*(?:(?P<bq>`(?:[^`]|``)*`)|(?P<str>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")|(?P<num>\d+)"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<punct>[<>(),:])|(?P<bad>\S))"
)
_PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class DdlType:
    """A parsed type: ``name`` is a primitive, ``DECIMAL``, ``ARRAY``, ``MAP`` or ``STRUCT``;
    ``params`` (precision, scale) for DECIMAL; ``children`` the element (ARRAY), key and value
    (MAP) or the fields (STRUCT, as ``(name, type, nullable)``)."""

    name: str
    params: tuple[int, ...] = ()
    children: tuple[DdlType, ...] = ()
    fields: tuple[tuple[str, DdlType, bool], ...] = ()


def _quote(name: str) -> str:
    return name if _PLAIN_NAME.match(name) else "`" + name.replace("`", "``") + "`"


def render_type(t: DdlType) -> str:
    """The canonical text of a type (contract 1)."""
    if t.name == "DECIMAL":
        return f"DECIMAL({t.params[0]},{t.params[1]})"
    if t.name == "ARRAY":
        return f"ARRAY<{render_type(t.children[0])}>"
    if t.name == "MAP":
        return f"MAP<{render_type(t.children[0])}, {render_type(t.children[1])}>"
    if t.name == "STRUCT":
        inner = ", ".join(
            f"{_quote(n)}: {render_type(ft)}" + ("" if nullable else " NOT NULL")
            for n, ft, nullable in t.fields
        )
        return f"STRUCT<{inner}>"
    return t.name


def render_ddl(columns: tuple[Column, ...] | list[Column]) -> str:
    """Columns as a DDL string that :func:`parse_ddl` reads back to the same columns."""
    return ", ".join(f"{_quote(c.name)} {c.type}" + ("" if c.nullable else " NOT NULL") for c in columns)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []  # (kind, text, position)
        for m in _TOKEN.finditer(text):
            kind = m.lastgroup or "bad"
            value = m.group(kind)
            if kind == "bad":
                raise ValueError(f"unexpected character {value!r} at position {m.start(kind)} of {text!r}")
            self.tokens.append((kind, value, m.start(kind)))
        self.i = 0
        self.where = "the schema"

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def fail(self, expected: str) -> ValueError:
        token = self.peek()
        got = f"{token[1]!r} at position {token[2]}" if token else "the end of the text"
        return ValueError(f"{self.where}: expected {expected}, got {got} in {self.text!r}")

    def take(self) -> tuple[str, str, int]:
        token = self.peek()
        if token is None:
            raise self.fail("more")
        self.i += 1
        return token

    def accept(self, punct: str) -> bool:
        token = self.peek()
        if token is not None and token[0] == "punct" and token[1] == punct:
            self.i += 1
            return True
        return False

    def accept_word(self, word: str) -> bool:
        token = self.peek()
        if token is not None and token[0] == "word" and token[1].upper() == word:
            self.i += 1
            return True
        return False

    def expect(self, punct: str) -> None:
        if not self.accept(punct):
            raise self.fail(repr(punct))

    def name(self) -> str:
        token = self.peek()
        if token is None or token[0] not in ("word", "bq"):
            raise self.fail("a column name")
        self.i += 1
        if token[0] == "bq":
            inner = token[1][1:-1].replace("``", "`")
            if not inner:
                raise ValueError(f"{self.where}: an empty name `` at position {token[2]} of {self.text!r}")
            return inner
        return token[1]

    def number(self) -> int:
        token = self.peek()
        if token is None or token[0] != "num":
            raise self.fail("a number")
        self.i += 1
        return int(token[1])

    def type(self) -> DdlType:
        token = self.peek()
        if token is None or token[0] != "word":
            raise self.fail(_EXPECTED_TYPE)
        word = _ALIASES.get(token[1].upper(), token[1].upper())
        self.i += 1
        if word in PRIMITIVES:
            return DdlType(word)
        if word == "DECIMAL":
            precision, scale = 10, 0
            if self.accept("("):
                precision = self.number()
                scale = self.number() if self.accept(",") else 0
                self.expect(")")
            if not 1 <= precision <= 38 or not 0 <= scale <= precision:
                raise ValueError(
                    f"{self.where}: DECIMAL({precision},{scale}) is out of range: precision 1..38, "
                    f"scale 0..precision (in {self.text!r})"
                )
            return DdlType("DECIMAL", (precision, scale))
        if word == "ARRAY":
            self.expect("<")
            element = self.type()
            self.expect(">")
            return DdlType("ARRAY", children=(element,))
        if word == "MAP":
            self.expect("<")
            key = self.type()
            self.expect(",")
            value = self.type()
            self.expect(">")
            return DdlType("MAP", children=(key, value))
        if word == "STRUCT":
            self.expect("<")
            fields: list[tuple[str, DdlType, bool]] = []
            outer = self.where
            if not self.accept(">"):
                while True:
                    name = self.name()
                    self.where = f"{outer}, field {name!r} of STRUCT"
                    self.accept(":")
                    ftype = self.type()
                    nullable = self.nullability()
                    self.comment()
                    if any(name == f[0] for f in fields):
                        raise ValueError(f"{self.where}: the field name is given twice in {self.text!r}")
                    fields.append((name, ftype, nullable))
                    self.where = outer
                    if self.accept(">"):
                        break
                    if not self.accept(","):
                        raise self.fail("',' or '>' in STRUCT<...>")
            return DdlType("STRUCT", fields=tuple(fields))
        self.i -= 1
        raise self.fail(_EXPECTED_TYPE)

    def nullability(self) -> bool:
        if self.accept_word("NOT"):
            if not self.accept_word("NULL"):
                raise self.fail("NULL after NOT")
            return False
        return True

    def comment(self) -> None:
        if self.accept_word("COMMENT"):
            token = self.peek()
            if token is None or token[0] != "str":
                raise self.fail("a quoted comment after COMMENT")
            self.i += 1


def parse_type(text: str) -> DdlType:
    """One type text (``"ARRAY<STRUCT<a: INT>>"``) parsed; ValueError when it is not one."""
    parser = _Parser(text)
    parser.where = "the type"
    t = parser.type()
    if parser.peek() is not None:
        raise parser.fail("the end of the type")
    return t


def parse_ddl(text: str) -> tuple[Column, ...]:
    """The columns of a DDL string (contract 1); ValueError says what is wrong and where."""
    parser = _Parser(text)
    columns: list[Column] = []
    if parser.peek() is None:
        raise ValueError(f"no columns in {text!r}: expected 'name TYPE, ...'")
    while True:
        position = len(columns) + 1
        parser.where = f"column {position}"
        name = parser.name()
        parser.where = f"column {position} ({name!r})"
        if any(c.name == name for c in columns):
            raise ValueError(f"{parser.where}: the column name is given twice in {text!r}")
        ctype = parser.type()
        nullable = parser.nullability()
        parser.comment()
        columns.append(Column(name, render_type(ctype), nullable))
        if parser.peek() is None:
            break
        if not parser.accept(","):
            raise parser.fail("',' or the end of the schema")
        if parser.peek() is None:
            raise parser.fail("another column after ','")
    return tuple(columns)


def decodable_problem(kind: str, columns: tuple[Column, ...] | list[Column]) -> str | None:
    """Why ``columns`` cannot be decoded from ``kind`` records (None when they can): csv
    fields are primitive types only; Arrow's JSON reader has no MAP conversion; a STRUCT's field
    names are distinct in any spelling (Delta compares names case-insensitively)."""
    for c in columns:
        t = parse_type(c.type)
        twice = _case_twice(t)
        if twice is not None:
            return (
                f"column {c.name!r} {c.type}: the STRUCT field names {twice[0]!r} and {twice[1]!r} differ "
                "only in case, and Delta compares field names case-insensitively; rename one"
            )
        if kind == "csv" and t.name in ("ARRAY", "MAP", "STRUCT"):
            return f"column {c.name!r} {c.type}: a csv column must be of a primitive type"
        if kind in ("json", "json_schema") and "MAP<" in c.type:
            return (
                f"column {c.name!r} {c.type}: MAP is not supported for decode.kind json (Arrow's JSON reader "
                "has no map conversion); declare a STRUCT of the known keys"
            )
    return None


def _case_twice(t: DdlType) -> tuple[str, str] | None:
    """Two field names of a STRUCT inside ``t`` that differ only in case, if any."""
    if t.name == "STRUCT":
        seen: dict[str, str] = {}
        for name, _ft, _ in t.fields:
            if name.lower() in seen:
                return seen[name.lower()], name
            seen[name.lower()] = name
    for child in (*t.children, *(ft for _, ft, _ in t.fields)):
        found = _case_twice(child)
        if found is not None:
            return found
    return None


# --------------------------------------------------------------------------- Arrow


def _arrow(t: DdlType) -> Any:
    import pyarrow as pa

    simple = {
        "STRING": pa.string(),
        "BINARY": pa.binary(),
        "BOOLEAN": pa.bool_(),
        "TINYINT": pa.int8(),
        "SMALLINT": pa.int16(),
        "INT": pa.int32(),
        "BIGINT": pa.int64(),
        "FLOAT": pa.float32(),
        "DOUBLE": pa.float64(),
        "DATE": pa.date32(),
        "TIMESTAMP": pa.timestamp("us", tz="UTC"),
        "TIMESTAMP_NTZ": pa.timestamp("us"),
    }
    if t.name in simple:
        return simple[t.name]
    if t.name == "DECIMAL":
        return pa.decimal128(*t.params)
    if t.name == "ARRAY":
        return pa.list_(_arrow(t.children[0]))
    if t.name == "MAP":
        return pa.map_(_arrow(t.children[0]), _arrow(t.children[1]))
    return pa.struct([pa.field(n, _arrow(ft), nullable) for n, ft, nullable in t.fields])


def arrow_type(type_text: str) -> Any:
    """The pyarrow type of a DDL type text (contract 3)."""
    return _arrow(parse_type(type_text))


def arrow_schema(columns: tuple[Column, ...] | list[Column]) -> Any:
    """The pyarrow schema of columns (their types and nullability)."""
    import pyarrow as pa

    return pa.schema([pa.field(c.name, arrow_type(c.type), c.nullable) for c in columns])


# --------------------------------------------------------------------------- Avro

_AVRO_PRIMITIVES = {
    "boolean": "BOOLEAN",
    "int": "INT",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "bytes": "BINARY",
    "string": "STRING",
}


def avro_columns(avro_schema_json: Any) -> tuple[Column, ...]:
    """The columns of an Avro record schema (a JSON text or its parsed form; contract 4)."""
    schema = json.loads(avro_schema_json) if isinstance(avro_schema_json, str) else avro_schema_json
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ValueError(
            f"the Avro schema must be a record ({{'type': 'record', 'fields': [...]}}), got {schema!r:.200}"
        )
    named: dict[str, Any] = {}
    stack: list[str] = []
    t = _avro_record(schema, named, stack, "")
    return tuple(Column(name, render_type(ft), nullable) for name, ft, nullable in t.fields)


def _full_name(schema: dict[str, Any], namespace: str) -> str:
    name = str(schema.get("name", ""))
    if "." in name:
        return name
    ns = schema.get("namespace", namespace)
    return f"{ns}.{name}" if ns else name


def _avro_record(schema: dict[str, Any], named: dict[str, Any], stack: list[str], namespace: str) -> DdlType:
    full = _full_name(schema, namespace)
    ns = full.rpartition(".")[0]
    if full in stack:
        raise ValueError(f"record {full!r} is recursive; a recursive record has no Spark type")
    named[full] = schema
    stack.append(full)
    fields: list[tuple[str, DdlType, bool]] = []
    for f in schema.get("fields", []):
        name = f.get("name")
        path = ".".join([*stack[1:], str(name)]) if len(stack) > 1 else str(name)
        if not isinstance(name, str) or not name:
            raise ValueError(f"field {path!r}: an Avro field needs a name")
        try:
            ftype, nullable = _avro_type(f.get("type"), named, stack, ns)
        except ValueError as err:
            if str(err).startswith("field "):
                raise
            raise ValueError(f"field {path!r}: {err}") from err
        fields.append((name, ftype, nullable))
    stack.pop()
    if not fields:
        raise ValueError(f"record {full!r} has no fields")
    return DdlType("STRUCT", fields=tuple(fields))


def _avro_type(t: Any, named: dict[str, Any], stack: list[str], ns: str) -> tuple[DdlType, bool]:
    if isinstance(t, list):
        others = [b for b in t if b != "null"]
        if len(others) != 1:
            raise ValueError(
                f"the union {t!r} has no Spark type: only a union of one type with 'null' (nullable) "
                "is supported"
            )
        inner, _ = _avro_type(others[0], named, stack, ns)
        return inner, len(others) != len(t)
    if isinstance(t, str):
        if t in _AVRO_PRIMITIVES:
            return DdlType(_AVRO_PRIMITIVES[t]), False
        if t == "null":
            raise ValueError("the type 'null' alone has no Spark type")
        full = t if "." in t or not ns else f"{ns}.{t}"
        target = named.get(full, named.get(t))
        if target is None:
            raise ValueError(f"unknown Avro type {t!r}")
        if (target.get("type") == "record") and (full in stack or t in stack):
            raise ValueError(f"record {t!r} is recursive; a recursive record has no Spark type")
        return _avro_type(target, named, stack, ns)
    if not isinstance(t, dict):
        raise ValueError(f"unreadable Avro type {t!r}")
    kind = t.get("type")
    logical = t.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(t.get("precision", 0)), int(t.get("scale", 0))
        if not 1 <= precision <= 38 or not 0 <= scale <= precision:
            raise ValueError(
                f"decimal({precision},{scale}) is out of range: precision 1..38, scale 0..precision"
            )
        if kind == "fixed":
            named[_full_name(t, ns)] = t
        return DdlType("DECIMAL", (precision, scale)), False
    if logical == "date" and kind == "int":
        return DdlType("DATE"), False
    if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        return DdlType("TIMESTAMP"), False
    if logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
        return DdlType("TIMESTAMP_NTZ"), False
    if logical in ("time-millis", "time-micros"):
        raise ValueError(f"the logical type {logical!r} (a time of day) has no Spark type")
    if logical == "uuid" and kind == "string":
        return DdlType("STRING"), False
    if kind == "record":
        return _avro_record(t, named, stack, ns), False
    if kind == "enum":
        named[_full_name(t, ns)] = t
        return DdlType("STRING"), False
    if kind == "fixed":
        named[_full_name(t, ns)] = t
        return DdlType("BINARY"), False
    if kind == "array":
        element, _ = _avro_type(t.get("items"), named, stack, ns)
        return DdlType("ARRAY", children=(element,)), False
    if kind == "map":
        value, _ = _avro_type(t.get("values"), named, stack, ns)
        return DdlType("MAP", children=(DdlType("STRING"), value)), False
    if isinstance(kind, str | list):
        return _avro_type(kind, named, stack, ns)
    raise ValueError(f"unreadable Avro type {t!r}")
