"""Decoding a range's values into the sink's data columns, columnar, with bad records kept apart.

Contract of :func:`decode_values` ``(spec, values)``:

1. ``values`` is the range's record values as one binary array (a null is a Kafka null
   value); the result's ``table`` holds the good records only, in input order, with the
   columns of ``spec.data_columns()`` (plus, for ``on_new_fields: add_columns``, the new
   columns named in ``new_columns``, after them) and their Arrow types;
   ``kept`` is the input index of each row of ``table``.
2. Every input index is either in ``kept`` or in ``bad`` (with its stage, ``decode`` for
   bytes that do not parse or ``schema`` for a parsed record that does not fit the declared
   columns, the error class and a message); never both. Nothing is replaced silently.
3. ``on_new_fields: fail`` raises :class:`SchemaDriftError` naming the field and the input
   index of the first record that has it (the region task adds the split and offset).
4. The normal path has no Python step per record; a batch with bad records may be
   re-checked record by record to find them.

The kinds:

- ``raw``: the bytes. ``text``: UTF-8; a value that is not valid UTF-8 is a ``decode`` bad record.
- ``json``: one JSON object per value, read by ``pyarrow.json`` over the whole range (the
  values joined with newlines into one buffer) with the declared columns as its explicit
  schema. A batch that fails is bisected; the halves that read are kept, down to single
  records, which are then classified: a null or empty value, invalid UTF-8, or text that is
  not one JSON object is stage ``decode``; an object whose field does not convert to its
  declared type (``"abc"`` for a BIGINT), or with a null/missing ``NOT NULL`` column, is stage
  ``schema``. A value with a raw newline (pretty-printed JSON) is read on its own with
  ``newlines_in_values``. ``DATE`` is read from ``"YYYY-MM-DD"`` strings; ``TIMESTAMP`` from
  ISO-8601 strings (with an offset, or UTC when it has none); ``BINARY`` holds the string's
  UTF-8 bytes (no base64); a ``MAP`` column is not supported for json (Arrow's JSON reader
  has no map conversion: declare a STRUCT).
- ``csv``: one delimited line per value, no header, the fields by position as the declared
  columns, read by ``pyarrow.csv`` as text and cast column by column. A string field keeps
  its text exactly (an empty field is ``""``); an empty field of another type is null. Fewer
  fields than declared is stage ``schema``; more is schema drift (below) whose fields are
  named ``_c<i>`` (``i`` the 0-based position, as Spark names CSV columns). Only primitive
  types.
- ``avro``: the Confluent wire format (magic byte 0 and a 4-byte schema id, or magic byte 1 and a
  16-byte schema GUID, then the Avro binary body), one record per call (fastavro has no columnar
  reader), then built into Arrow columns of the declared types in one step. Without a registry
  the framing is the library's (``confluent_kafka.schema_registry.prefix_schema_id_deserializer``)
  and every schema id is read with the schema file's schema. With one (``decode.registry``: its
  URL, basic auth, bearer token and TLS files as ``SchemaRegistryClient`` conf), a record is read
  by the library's ``AvroDeserializer`` with its own writer schema, fetched once per process and
  settings by the client (resolved to ``spec.reader_schema`` when the pipeline names one). A value
  that is not the wire format, a short or truncated body, trailing bytes, and a schema id the
  registry does not know (HTTP 404; remembered, never asked again) are stage ``decode`` bad
  records; any other registry failure (HTTP 401 or 500, refused, a TLS failure) fails the range
  (it is retried) with :class:`~splitkeeper.errors.SchemaRegistryError` naming the registry's URL
  (credentials hidden), the schema id and the record (the region task names its offset).
- ``json_schema``: JSON in the same wire format, read by the library's ``JSONDeserializer`` (the
  writer's JSON Schema from the registry, the record validated against it; refused: stage
  ``schema``), then the JSON bodies decoded as ``json`` (the declared columns).

Schema drift (``on_new_fields``, Auto Loader's meanings), for top-level fields:

- ``rescue``: the fields the schema does not name go into ``_rescued`` as a JSON object
  (each field's original JSON text, in record order; null when there are none). A declared
  field whose value does not convert to its type is rescued too, as Auto Loader does: its
  column is null and its original value is in ``_rescued`` (a ``NOT NULL`` column cannot be
  null: that record is stage ``schema``). A declared STRUCT holding fields its type does not
  name keeps the declared ones and the whole original value is also in ``_rescued``.
- ``add_columns``: new top-level fields become new columns after the declared ones (their
  types inferred by Arrow; a field that is null in every record of the range is STRING),
  listed in ``new_columns``; a type mismatch is stage ``schema``; undeclared fields inside a
  declared STRUCT are stage ``schema`` (only top-level columns are added).
- ``fail``: :class:`SchemaDriftError` naming the field (``a.b`` when nested) and the input
  index of the first record having it; a type mismatch is stage ``schema``.
"""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from splitkeeper.errors import SchemaDriftError, SchemaRegistryError
from splitkeeper.records.ddl import DdlType, arrow_type, parse_type
from splitkeeper.records.spec import RESCUED, Column, DecodeSpec, name_clash

__all__ = [
    "CSV_FORMS",
    "MAX_JSON_DEPTH",
    "STAGES",
    "BadRecords",
    "Decoded",
    "SchemaDriftError",
    "decode_values",
    "registry_client",
    "too_deep",
]

#: Where a bad record failed: its bytes, the declared columns, or the user's transform.
STAGES = ("decode", "schema", "transform")
#: Below this many records a failing batch is read record by record instead of bisected.
_BISECT_FLOOR = 8


@dataclass(frozen=True, slots=True)
class BadRecords:
    """Bad records of a range: parallel lists, ``indices`` ascending (input positions)."""

    indices: list[int] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)
    error_classes: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.indices)

    def add(self, index: int, stage: str, error: BaseException | str, error_class: str | None = None) -> None:
        self.indices.append(index)
        self.stages.append(stage)
        self.error_classes.append(error_class or type(error).__name__)
        self.messages.append(str(error))


@dataclass(frozen=True, slots=True)
class Decoded:
    table: pa.Table
    kept: pa.Array  # int64: the input index of each row of ``table``
    bad: BadRecords
    new_columns: tuple[str, ...] = ()


def _all_kept(table: pa.Table) -> Decoded:
    return Decoded(table, pa.array(range(table.num_rows), pa.int64()), BadRecords())


def decode_values(spec: DecodeSpec, values: pa.Array, *, known: Sequence[str] = ()) -> Decoded:
    """The range's values decoded per ``spec`` (module doc); ``known``: for ``add_columns``, the
    columns the sink has beyond the declared ones (added before: a new field of that name is that
    column, another spelling of it is rescued)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if spec.kind == "raw":
        if values.type != pa.binary():
            values = values.cast(pa.binary())
        return _all_kept(pa.table({"value": values}))
    if spec.kind == "text":
        return _text(values)
    if spec.kind in ("json", "csv", "avro", "json_schema"):
        if values.type != pa.binary():
            values = values.cast(pa.binary())
        if spec.kind == "json_schema":
            return _json_schema(spec, values, known)
        return _Typed(spec, values, known).run()
    raise ValueError(f"unknown decode.kind {spec.kind!r}: allowed raw, text, json, csv, avro, json_schema")


def _json_schema(spec: DecodeSpec, values: pa.Array, known: Sequence[str]) -> Decoded:
    """``json_schema``: each value's wire format and JSON Schema through the library's
    ``JSONDeserializer`` (the writer schema from the registry, the record validated against it),
    then the JSON bodies decoded as ``json`` is (columnar, the declared columns). A value that is
    not the wire format, of an unknown schema id or not JSON is stage ``decode``; a record its own
    schema refuses is stage ``schema``."""
    import dataclasses

    read = _registry_reader(spec.schema_registry_url or "", spec.registry.items, None, "JSON")
    bodies: list[bytes | None] = []
    early: dict[int, tuple[str, str, str]] = {}
    for i, raw in enumerate(values.to_pylist()):
        if not raw:  # null and empty: the json decode names them
            bodies.append(raw)
            continue
        try:
            _, _, start = read(raw)
        except (_NotWireFormat, _UnknownSchema, _BadBody) as err:
            kind = "UnknownSchemaId" if isinstance(err, _UnknownSchema) else "JsonSchemaDecodeError"
            early[i] = ("decode", kind, str(err))
            bodies.append(None)
            continue
        except _Violation as err:
            early[i] = ("schema", "JsonSchemaViolation", str(err))
            bodies.append(None)
            continue
        except _RegistryFailed as err:
            raise _registry_error(spec, err, i) from None
        bodies.append(raw[start:])
    out = _Typed(dataclasses.replace(spec, kind="json"), pa.array(bodies, pa.binary()), known).run()
    if not early:
        return out
    bad = BadRecords()
    for i, stage, error_class, message in zip(
        out.bad.indices, out.bad.stages, out.bad.error_classes, out.bad.messages, strict=True
    ):
        stage, error_class, message = early.get(i, (stage, error_class, message))
        bad.add(i, stage, message, error_class)
    return Decoded(out.table, out.kept, bad, out.new_columns)


def _text(values: pa.Array) -> Decoded:
    try:
        return _all_kept(pa.table({"value": values.cast(pa.string())}))
    except pa.ArrowInvalid:
        pass
    bad = BadRecords()
    kept: list[int] = []
    out: list[Any] = []
    for i, raw in enumerate(values.to_pylist()):  # only a batch with invalid UTF-8 comes here
        if raw is None:
            kept.append(i)
            out.append(None)
            continue
        try:
            out.append(raw.decode("utf-8"))
            kept.append(i)
        except UnicodeDecodeError as err:
            bad.add(i, "decode", f"not valid UTF-8: {err}", "UnicodeDecodeError")
    return Decoded(pa.table({"value": pa.array(out, pa.string())}), pa.array(kept, pa.int64()), bad)


# --------------------------------------------------------------------------- the plan of a spec


@dataclass(frozen=True)
class _Plan:
    columns: tuple[Column, ...]
    names: frozenset[str]
    types: dict[str, DdlType]
    arrow: dict[str, pa.DataType]
    read: dict[str, pa.DataType]  # what the reader produces before the cast (DATE is read as text)


def _json_readable(t: DdlType) -> pa.DataType:
    if t.name == "DATE":
        return pa.string()
    if t.name == "ARRAY":
        return pa.list_(_json_readable(t.children[0]))
    if t.name == "STRUCT":
        # read as nullable (Arrow's reader refuses a NOT NULL field even under a missing struct);
        # _retag puts the declared flags back and _nested_nulls finds the real violations
        return pa.struct([pa.field(n, _json_readable(ft)) for n, ft, _ in t.fields])
    if t.name == "MAP":
        raise ValueError(
            "a MAP column is not supported for decode.kind json (Arrow's JSON reader has no maps)"
        )
    out: pa.DataType = arrow_type(_render(t))
    return out


def _render(t: DdlType) -> str:
    from splitkeeper.records.ddl import render_type

    return render_type(t)


def _plan(spec: DecodeSpec) -> _Plan:
    try:
        return _cached_plan(spec)
    except TypeError:  # an unhashable spec (a list in ``extra``): not cached
        return _make_plan(spec)


@lru_cache(maxsize=64)
def _cached_plan(spec: DecodeSpec) -> _Plan:
    return _make_plan(spec)


def _make_plan(spec: DecodeSpec) -> _Plan:
    from splitkeeper.records.ddl import decodable_problem

    problem = decodable_problem(spec.kind, spec.columns)
    if problem:
        raise ValueError(f"decode.schema: {problem}")
    types = {c.name: parse_type(c.type) for c in spec.columns}
    arrow = {c.name: arrow_type(c.type) for c in spec.columns}
    read: dict[str, pa.DataType] = {}
    for c in spec.columns:
        t = types[c.name]
        if spec.kind == "json":
            try:
                read[c.name] = _json_readable(t)
            except ValueError as err:
                raise ValueError(f"decode column {c.name!r} {c.type}: {err}") from None
        elif spec.kind == "csv":
            if t.name in ("ARRAY", "MAP", "STRUCT"):
                raise ValueError(
                    f"decode column {c.name!r} {c.type}: csv columns must be of a primitive type"
                )
            read[c.name] = pa.string()
        else:
            read[c.name] = _loose(arrow[c.name])
    return _Plan(spec.columns, frozenset(types), types, arrow, read)


# --------------------------------------------------------------------------- the typed kinds


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def json_members(text: str) -> list[tuple[str, str]]:
    """The top-level ``(key, original value text)`` pairs of a JSON object text, in order;
    ValueError when ``text`` is not exactly one JSON object."""
    i = _WS.match(text, 0).end()  # type: ignore[union-attr]
    if text[i : i + 1] != "{":
        raise ValueError("not a JSON object")
    i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
    out: list[tuple[str, str]] = []
    if text[i : i + 1] == "}":
        i += 1
    else:
        while True:
            if text[i : i + 1] != '"':
                raise ValueError(f"expected a quoted key at character {i}")
            key, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if text[i : i + 1] != ":":
                raise ValueError(f"expected ':' after the key {key!r} at character {i}")
            i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
            _, end = _DECODER.raw_decode(text, i)
            out.append((key, text[i:end]))
            i = _WS.match(text, end).end()  # type: ignore[union-attr]
            if text[i : i + 1] == ",":
                i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
                continue
            if text[i : i + 1] == "}":
                i += 1
                break
            raise ValueError(f"expected ',' or '}}' at character {i}")
    if _WS.match(text, i).end() != len(text):  # type: ignore[union-attr]
        raise ValueError(f"data after the object at character {i}")
    return out


def _unknown_path(value: Any, t: DdlType, prefix: str) -> str | None:
    """The first field of ``value`` (parsed JSON) that ``t`` does not name, as a dotted path."""
    if t.name == "STRUCT" and isinstance(value, dict):
        names = {n: ft for n, ft, _ in t.fields}
        for k, v in value.items():
            if k not in names:
                return f"{prefix}.{k}"
            found = _unknown_path(v, names[k], f"{prefix}.{k}")
            if found:
                return found
    elif t.name == "ARRAY" and isinstance(value, list):
        for v in value:
            found = _unknown_path(v, t.children[0], prefix)
            if found:
                return found
    return None


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class _Typed:
    """One decode of a range for the typed kinds (json, csv, avro)."""

    def __init__(self, spec: DecodeSpec, values: pa.Array, known: Sequence[str] = ()) -> None:
        self.spec = spec
        self.plan = _plan(spec)
        self.values = values
        self.n = len(values)
        self.parts: list[tuple[np.ndarray, pa.Table]] = []
        self.bad: dict[int, tuple[str, str, str]] = {}
        self.rescue_keys: dict[int, set[str]] = {}  # declared keys rescued per record (type mismatch)
        self.drift_candidates: set[int] = set()
        self.drift: list[tuple[int, str]] = []
        self.texts: pa.Array | None = None
        self.rescued_text: dict[int, str] = {}  # _rescued built directly (csv, avro)
        self.known = tuple(known)  # add_columns: the sink's columns beyond the declared ones
        self.taken: dict[str, str] | None = None  # add_columns: lower-case name -> its column
        self.not_columns: set[str] = set()  # add_columns: new fields kept in _rescued instead

    # ---------------------------------------------------------------- driver

    def run(self) -> Decoded:
        usable = self._screen()
        if self.spec.kind == "avro":
            self._avro(usable)
        else:
            texts = self.texts
            assert texts is not None
            if len(usable):
                multi = _bytes_in(texts, b"\n\r")[usable]
                plain, lines = usable[~multi], usable[multi]
            else:
                plain = lines = usable
            self._read(plain, newlines=False)
            for i in lines:
                self._read(np.array([i], np.int64), newlines=True)
        return self._finish()

    def _screen(self) -> np.ndarray:
        """Null, empty and (json/csv) non-UTF-8 values are bad (stage decode); the rest's indices."""
        values = self.values
        valid = np.asarray(pc.fill_null(pc.greater(pc.binary_length(values), 0), False))
        if not valid.all():
            nulls = np.asarray(values.is_null())
            for j in np.flatnonzero(~valid):
                what = "a null value (a Kafka tombstone)" if nulls[j] else "an empty value"
                self._bad(int(j), "decode", f"{what} has no {self.spec.kind} record", "EmptyValue")
        if self.spec.kind == "avro":
            return np.flatnonzero(valid).astype(np.int64)
        try:
            self.texts = values.cast(pa.string())
        except pa.ArrowInvalid:
            good: list[bytes | None] = []
            for i, raw in enumerate(values.to_pylist()):  # only a batch with invalid UTF-8 comes here
                try:
                    if raw is not None:
                        raw.decode("utf-8")
                    good.append(raw)
                except UnicodeDecodeError as err:
                    self._bad(i, "decode", f"not valid UTF-8: {err}", "UnicodeDecodeError")
                    valid[i] = False
                    good.append(None)
            self.texts = pa.array(good, pa.binary()).cast(pa.string())
        if self.spec.kind == "json":  # also: a buffer that begins with `null` crashes Arrow's JSON reader
            objects = _begins_with_brace(self.texts)
            for j in np.flatnonzero(valid & ~objects):
                text = self.texts[int(j)].as_py()
                self._bad(
                    int(j),
                    "decode",
                    f"not a JSON object: the value begins {_short(text)!r}",
                    "JSONDecodeError",
                )
            valid &= objects
            for index, depth in too_deep(self.texts).items():  # before a parser recurses that deep
                if valid[index]:
                    valid[index] = False
                    self._bad(
                        index,
                        "decode",
                        f"the JSON value nests {depth} levels deep, more than the {MAX_JSON_DEPTH} allowed "
                        "(objects and arrays in one another)",
                        "NestedTooDeep",
                    )
        return np.flatnonzero(valid).astype(np.int64)

    def _bad(self, index: int, stage: str, message: str, error_class: str) -> None:
        self.bad.setdefault(index, (stage, error_class, message))

    # ---------------------------------------------------------------- json and csv: bisection

    def _read(self, indices: np.ndarray, *, newlines: bool) -> None:
        if not len(indices):
            return
        try:
            table = self._read_batch(indices, newlines=newlines)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            table = None
        if table is not None and table.num_rows == len(indices):
            self._accept(indices, table)
            return
        if len(indices) <= _BISECT_FLOOR:
            for i in indices:
                if len(indices) > 1:
                    try:
                        one = self._read_batch(np.array([i], np.int64), newlines=newlines)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                        one = None
                    if one is not None and one.num_rows == 1:
                        self._accept(np.array([i], np.int64), one)
                        continue
                self._single(int(i), newlines=newlines)
            return
        half = len(indices) // 2
        self._read(indices[:half], newlines=newlines)
        self._read(indices[half:], newlines=newlines)

    def _buffer(self, indices: np.ndarray) -> pa.Buffer:
        texts = self.texts
        assert texts is not None
        chosen = texts if len(indices) == self.n else texts.take(pa.array(indices))
        lists = pa.ListArray.from_arrays(pa.array([0, len(chosen)], pa.int32()), chosen)
        joined = pc.binary_join(lists, "\n")[0]
        buffer: pa.Buffer = joined.as_buffer()
        return buffer

    def _read_batch(
        self, indices: np.ndarray, *, newlines: bool, columns: tuple[str, ...] | None = None
    ) -> pa.Table:
        buffer = self._buffer(indices)
        if self.spec.kind == "json":
            return self._read_json(buffer, newlines=newlines, columns=columns)
        return self._read_csv(buffer, newlines=newlines)

    def _read_json(
        self, buffer: pa.Buffer, *, newlines: bool, columns: tuple[str, ...] | None = None, infer: bool = True
    ) -> pa.Table:
        import pyarrow.json as pj

        names = columns if columns is not None else tuple(c.name for c in self.plan.columns)
        schema = pa.schema([pa.field(n, self.plan.read[n]) for n in names])
        options = pj.ParseOptions(
            explicit_schema=schema,
            unexpected_field_behavior="infer" if infer else "ignore",
            newlines_in_values=newlines,
        )
        block = max(1 << 20, min(len(buffer) + 1, 1 << 26))
        return pj.read_json(
            pa.BufferReader(buffer), read_options=pj.ReadOptions(block_size=block), parse_options=options
        )

    def _read_csv(self, buffer: pa.Buffer, *, newlines: bool, names: list[str] | None = None) -> pa.Table:
        import pyarrow.csv as pcsv

        names = names if names is not None else [c.name for c in self.plan.columns]
        return pcsv.read_csv(
            pa.BufferReader(buffer),
            read_options=pcsv.ReadOptions(
                column_names=names, block_size=max(1 << 20, min(len(buffer) + 1, 1 << 26))
            ),
            parse_options=pcsv.ParseOptions(delimiter=self.spec.csv_delimiter, newlines_in_values=newlines),
            convert_options=pcsv.ConvertOptions(
                column_types={n: pa.string() for n in names},
                null_values=[],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )

    def _single(self, i: int, *, newlines: bool) -> None:
        """One record the reader refused: find why (decode or schema), rescue what can be."""
        texts = self.texts
        assert texts is not None
        text: str = texts[i].as_py()
        if self.spec.kind == "csv":
            self._single_csv(i, text, newlines=newlines)
            return
        try:
            members = json_members(text)
        except ValueError as err:
            self._bad(
                i,
                "decode",
                f"not one JSON object: {err}; the value begins {_short(text)!r}",
                "JSONDecodeError",
            )
            return
        keys = [k for k, _ in members]
        if len(set(keys)) != len(keys):
            twice = next(k for k in keys if keys.count(k) > 1)
            self._bad(i, "decode", f"the key {twice!r} is given twice", "JSONDecodeError")
            return
        mismatched: list[tuple[str, str, str]] = []
        for key, raw in members:
            if key not in self.plan.names:
                continue
            line = "{" + json.dumps(key) + ":" + raw + "}"
            try:
                self._read_json(pa.py_buffer(line.encode()), newlines=True, columns=(key,))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
                mismatched.append((key, raw, str(err)))
        unknown = [k for k in keys if k not in self.plan.names]
        if not mismatched and unknown:  # Arrow cannot infer one type for an undeclared field's value
            self._single_unreadable_drift(i, text, unknown)
            return
        if not mismatched:
            self._bad(
                i,
                "schema",
                f"the record does not fit the declared columns: {_short(text, 200)!r}",
                "ArrowInvalid",
            )
            return
        detail = "; ".join(
            f"field {k!r}: expected {self._declared(k).type}, got {_short(raw)}" for k, raw, _ in mismatched
        )
        not_null = [k for k, _, _ in mismatched if not self._declared(k).nullable]
        if self.spec.on_new_fields != "rescue" or not_null:
            self._bad(i, "schema", detail, "SchemaMismatch")
            return
        keep = tuple(c.name for c in self.plan.columns if c.name not in {k for k, _, _ in mismatched})
        try:
            table = self._read_json(pa.py_buffer(text.encode()), newlines=True, columns=keep, infer=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
            self._bad(i, "schema", f"{detail}; and {err}", "SchemaMismatch")
            return
        for key, _, _ in mismatched:  # read as an undeclared field: the null column replaces it
            if key in table.column_names:
                table = table.drop_columns([key])
            table = table.append_column(key, pa.nulls(1, self.plan.read[key]))
        self.rescue_keys[i] = {k for k, _, _ in mismatched}
        if unknown:
            self.drift_candidates.add(i)
        self._accept(np.array([i], np.int64), table)

    def _single_unreadable_drift(self, i: int, text: str, unknown: list[str]) -> None:
        """A record whose declared fields fit but whose undeclared ones Arrow cannot type."""
        if self.spec.on_new_fields == "fail":
            self.drift.append((i, unknown[0]))
            return
        if self.spec.on_new_fields == "add_columns":
            self._bad(
                i,
                "schema",
                f"the new field(s) {unknown} have no one Arrow type (e.g. an array of mixed types), so they "
                "cannot be added as columns; declare them in decode.schema",
                "SchemaDrift",
            )
            return
        try:
            table = self._read_json(pa.py_buffer(text.encode()), newlines=True, infer=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
            self._bad(i, "schema", f"the record does not fit the declared columns: {err}", "SchemaMismatch")
            return
        self.drift_candidates.add(i)
        self._accept(np.array([i], np.int64), table)

    def _declared(self, name: str) -> Column:
        return next(c for c in self.plan.columns if c.name == name)

    def _single_csv(self, i: int, text: str, *, newlines: bool) -> None:
        import pyarrow.csv as pcsv

        try:
            table = pcsv.read_csv(
                pa.py_buffer(text.encode() + b"\n"),  # a last line without its end reads as no columns
                read_options=pcsv.ReadOptions(autogenerate_column_names=True),
                parse_options=pcsv.ParseOptions(delimiter=self.spec.csv_delimiter, newlines_in_values=True),
                convert_options=pcsv.ConvertOptions(
                    column_types={},
                    null_values=[],
                    strings_can_be_null=False,
                    quoted_strings_can_be_null=False,
                ),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            self._bad(i, "decode", f"not one CSV record: {err}", "CSVDecodeError")
            return
        declared = len(self.plan.columns)
        if table.num_rows != 1:
            self._bad(i, "decode", f"not one CSV record: it reads as {table.num_rows} rows", "CSVDecodeError")
            return
        fields = [table.column(j).cast(pa.string()) for j in range(table.num_columns)]
        if len(fields) < declared:
            self._bad(
                i, "schema", f"{len(fields)} fields, {declared} declared: {_short(text)!r}", "SchemaMismatch"
            )
            return
        if len(fields) > declared:
            extra = {f"_c{j}": fields[j][0].as_py() for j in range(declared, len(fields))}
            if self.spec.on_new_fields == "fail":
                self.drift.append((i, f"_c{declared}"))
                return
            self.rescued_text[i] = json.dumps(extra, ensure_ascii=False, separators=(",", ":"))
        row = pa.table({c.name: fields[j] for j, c in enumerate(self.plan.columns)})
        self._accept(np.array([i], np.int64), row)

    # ---------------------------------------------------------------- after a read

    def _accept(self, indices: np.ndarray, table: pa.Table) -> None:
        """A read's rows: cast to the declared types, check NOT NULL, handle drift, keep."""
        plan = self.plan
        keep = np.ones(len(indices), bool)
        columns: dict[str, pa.Array] = {}
        for c in plan.columns:
            column = table.column(c.name).combine_chunks()
            if self.spec.kind == "csv" and column.type != plan.arrow[c.name]:
                column = pc.if_else(pc.equal(column, ""), pa.scalar(None, pa.string()), column)
            if column.type != plan.arrow[c.name]:
                column = self._cast(column, c, indices, keep)
            columns[c.name] = column
            self._required(c, column, indices, keep)
        extras = {n: table.column(n).combine_chunks() for n in table.column_names if n not in plan.names}
        if extras or self.spec.kind == "json":
            nested = [c.name for c in plan.columns if table.column(c.name).type != plan.read[c.name]]
            if extras or nested:
                self._drift(indices, keep, extras, {n: table.column(n).combine_chunks() for n in nested})
            if self.spec.on_new_fields == "add_columns":
                for name, column in extras.items():
                    columns[name] = column if column.type != pa.null() else column.cast(pa.string())
        out = pa.table(columns)
        if not keep.all():
            out = out.filter(pa.array(keep))
            indices = indices[keep]
        self.parts.append((indices, out))

    def _required(self, c: Column, column: pa.Array, indices: np.ndarray, keep: np.ndarray) -> None:
        """Rows with a null in a NOT NULL field nested in ``c`` (a STRUCT), or in ``c`` itself when it
        is NOT NULL: stage schema (a row is named once, for the first it breaks)."""
        if "NOT NULL" in c.type:
            found: dict[int, str] = {}
            for j in np.flatnonzero(_nested_nulls(column, column.type, c.name, found)):
                if keep[j]:
                    keep[j] = False
                    where = found.get(int(j), c.name)
                    self._bad(
                        int(indices[j]),
                        "schema",
                        f"field {where!r} is NOT NULL but the record has no value",
                        "NullValue",
                    )
        if not c.nullable and column.null_count:
            for j in np.flatnonzero(np.asarray(column.is_null())):
                if keep[j]:
                    keep[j] = False
                    self._bad(
                        int(indices[j]),
                        "schema",
                        f"column {c.name!r} is NOT NULL but the record has no value",
                        "NullValue",
                    )

    def _cast(self, column: pa.Array, c: Column, indices: np.ndarray, keep: np.ndarray) -> pa.Array:
        declared = self.plan.arrow[c.name]
        target = _loose(declared)  # cast without the NOT NULL flags inside, then put them back
        if column.type == target:
            return _retag(column, declared)
        original, refused = column, None
        if self.spec.kind == "csv":
            column, refused = _csv_forms(column, self.plan.types[c.name].name)
        if refused is None:
            try:
                return _retag(column.cast(target), declared)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                pass
        out: list[Any] = []
        for j in range(len(column)):  # only a column with a value that does not convert comes here
            one = column.slice(j, 1)
            error: Exception | str
            if refused is not None and refused[j]:
                error = f"Spark's CSV reader reads {c.type} from {CSV_FORMS[self.plan.types[c.name].name][0]}"
            else:
                try:
                    out.append(one.cast(target))
                    continue
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
                    error = err
            out.append(pa.nulls(1, target))  # the declared flags go back on below
            shown = original[j].as_py()
            i = int(indices[j])
            if self.spec.on_new_fields == "rescue" and c.nullable:
                self.rescue_keys.setdefault(i, set()).add(c.name)
                if self.spec.kind == "csv":
                    self._csv_rescue_field(i, c.name, shown)
            elif keep[j]:
                keep[j] = False
                self._bad(
                    i,
                    "schema",
                    f"field {c.name!r}: expected {c.type}, got {_short(repr(shown))} ({error})",
                    "SchemaMismatch",
                )
        return _retag(pa.concat_arrays(out), declared)

    def _csv_rescue_field(self, i: int, name: str, text: Any) -> None:
        current = json.loads(self.rescued_text.get(i, "{}"))
        current[name] = text
        self.rescued_text[i] = json.dumps(current, ensure_ascii=False, separators=(",", ":"))

    def _drift(
        self, indices: np.ndarray, keep: np.ndarray, extras: dict[str, pa.Array], nested: dict[str, pa.Array]
    ) -> None:
        """Rows that may have fields the schema does not name: note them per policy."""
        texts = self.texts
        assert texts is not None
        candidate = np.zeros(len(indices), bool)
        chosen = texts.take(pa.array(indices))
        for name, column in {**extras, **nested}.items():
            candidate |= np.asarray(pc.fill_null(column.is_valid(), False))
            if name in extras:  # a field that is null in this record: its key is in the text
                candidate |= _present(chosen, name)
        for j in np.flatnonzero(candidate):  # drift rows only: the normal path has none
            i = int(indices[j])
            if self.spec.kind != "json":
                continue
            unknown = self._unknown_fields(texts[i].as_py())
            if not unknown:
                continue
            if self.spec.on_new_fields == "fail":
                self.drift.append((i, unknown[0][1]))
            elif self.spec.on_new_fields == "rescue":
                self.drift_candidates.add(i)
            else:  # add_columns: top-level fields are columns now; nested ones cannot be added
                deep = [path for top, path in unknown if path != top]
                if deep and keep[j]:
                    keep[j] = False
                    self._bad(
                        i,
                        "schema",
                        f"field {deep[0]!r} is not declared; on_new_fields add_columns adds top-level "
                        "columns only",
                        "SchemaDrift",
                    )

    def _unknown_fields(self, text: str) -> list[tuple[str, str]]:
        """The fields of a JSON object text that the schema does not name, as ``(top-level key,
        path)``: an undeclared top-level key is its own path (whatever it holds, dots included); a
        field inside a declared STRUCT has the dotted path ``key.field``."""
        out: list[tuple[str, str]] = []
        for key, raw in json_members(text):
            if key not in self.plan.names:
                out.append((key, key))
                continue
            t = self.plan.types[key]
            if t.name in ("STRUCT", "ARRAY"):
                found = _unknown_path(json.loads(raw), t, key)
                if found:
                    out.append((key, found))
        return out

    # ---------------------------------------------------------------- avro

    def _avro(self, usable: np.ndarray) -> None:
        spec = self.spec
        raws = self.values.to_pylist()
        records: list[dict[str, Any]] = []
        where: list[int] = []
        try:
            read = _avro_reader(spec) if len(usable) else None
        except _RegistryFailed as err:
            raise SchemaRegistryError(
                f"the schema registry at {_shown_url(spec.schema_registry_url or '')}: "
                f"{_shown_url(err.reason)} (check decode.registry's TLS settings and files)",
                schema_id=None,
                index=int(usable[0]),
            ) from None
        for i in usable:  # one record per call: fastavro has no columnar reader (module doc)
            assert read is not None
            i = int(i)
            raw: bytes = raws[i]
            try:
                record, schema_name, rest = read(raw)
            except _NotWireFormat as err:
                self._bad(i, "decode", str(err), "AvroDecodeError")
                continue
            except _UnknownSchema as err:
                self._bad(i, "decode", str(err), "UnknownSchemaId")
                continue
            except _RegistryFailed as err:
                raise _registry_error(spec, err, i) from None
            except _BadBody as err:
                self._bad(i, "decode", str(err), "AvroDecodeError")
                continue
            if rest:
                self._bad(
                    i, "decode", f"{schema_name}: {rest} bytes after the Avro record", "AvroDecodeError"
                )
                continue
            if not isinstance(record, dict):
                self._bad(i, "decode", f"{schema_name}: the Avro value is not a record", "AvroDecodeError")
                continue
            records.append(record)
            where.append(i)
        self._avro_build(records, np.array(where, np.int64))

    def _avro_build(self, records: list[dict[str, Any]], indices: np.ndarray) -> None:
        if not len(indices):
            return
        plan = self.plan
        declared = [c.name for c in plan.columns]
        extra_names: list[str] = []
        for r in records:
            for k in r:
                if k not in plan.names and k not in extra_names:
                    extra_names.append(k)
        schema = pa.schema([pa.field(c.name, _loose(plan.arrow[c.name])) for c in plan.columns])
        rows = [{k: _plain(r.get(k)) for k in declared} for r in records]
        try:
            table = pa.Table.from_pylist(rows, schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError):
            table = None
        if table is None:
            keep_rows, keep_idx = [], []
            for row, i in zip(rows, indices, strict=True):  # only a batch with a record that does not fit
                try:
                    pa.Table.from_pylist([row], schema=schema)
                except (
                    pa.ArrowInvalid,
                    pa.ArrowTypeError,
                    pa.ArrowNotImplementedError,
                    OverflowError,
                    TypeError,
                ) as err:
                    self._bad(
                        int(i),
                        "schema",
                        f"the Avro record does not fit the declared columns: {err}",
                        "SchemaMismatch",
                    )
                    continue
                keep_rows.append(row)
                keep_idx.append(int(i))
            kept_set = set(keep_idx)
            records = [records[j] for j, i in enumerate(indices) if int(i) in kept_set]
            indices = np.array(keep_idx, np.int64)
            table = pa.Table.from_pylist(keep_rows, schema=schema)
        table = pa.Table.from_arrays(
            [_retag(table.column(c.name).combine_chunks(), plan.arrow[c.name]) for c in plan.columns],
            names=declared,
        )
        if extra_names:
            policy = self.spec.on_new_fields
            if policy == "fail":
                for r, i in zip(records, indices, strict=True):
                    names = [k for k in r if k not in plan.names]
                    if names:
                        self.drift.append((int(i), names[0]))
                        break
            elif policy == "rescue":
                for r, i in zip(records, indices, strict=True):
                    rest = {k: v for k, v in r.items() if k not in plan.names}
                    if rest:
                        self.rescued_text[int(i)] = json.dumps(
                            rest, default=str, ensure_ascii=False, separators=(",", ":")
                        )
            else:
                new = pa.Table.from_pylist([{k: _plain(r.get(k)) for k in extra_names} for r in records])
                out = self._not_columns([(n, [new.schema.field(n).type]) for n in extra_names])
                for r, i in zip(records, indices, strict=True):
                    rest = {k: v for k, v in r.items() if k in out}
                    if rest:
                        self.rescued_text[int(i)] = json.dumps(
                            rest, default=str, ensure_ascii=False, separators=(",", ":")
                        )
                for name in [n for n in extra_names if n not in out]:
                    column = new.column(name)
                    table = table.append_column(
                        name, column if column.type != pa.null() else column.cast(pa.string())
                    )
        keep = np.ones(len(indices), bool)
        for c in plan.columns:
            self._required(c, table.column(c.name).combine_chunks(), indices, keep)
        if not keep.all():
            table = table.filter(pa.array(keep))
            indices = indices[keep]
        self.parts.append((indices, table))

    # ---------------------------------------------------------------- the result

    def _finish(self) -> Decoded:
        if self.drift:
            index, name = min(self.drift)
            raise SchemaDriftError(
                f"record {index} of the range has the field {name!r} that decode.schema does not name, and "
                "decode.on_new_fields is 'fail'; declare the field in decode.schema, or set on_new_fields to "
                "'rescue' (kept as JSON in _rescued) or 'add_columns'",
                field=name,
                index=index,
            )
        plan = self.plan
        parts = [(idx, t) for idx, t in self.parts if len(idx)]
        add = self.spec.on_new_fields == "add_columns"
        declared = [c.name for c in plan.columns]
        new_columns: list[str] = []
        if add:
            for _, t in parts:
                new_columns += [n for n in t.column_names if n not in plan.names and n not in new_columns]
            kept_out = self._not_columns(
                [(n, [t.schema.field(n).type for _, t in parts if n in t.column_names]) for n in new_columns]
            )
            if kept_out:
                for idx, t in parts:
                    self._rescue_fields(idx, t, kept_out)
                new_columns = [n for n in new_columns if n not in kept_out]
        if parts:
            indices = np.concatenate([idx for idx, _ in parts])
            if len(parts) == 1:
                table = parts[0][1]
            else:
                tables = [
                    t.select(declared + [n for n in new_columns if n in t.column_names]) for _, t in parts
                ]
                table = _concat(tables)
                order = np.argsort(indices, kind="stable")
                indices = indices[order]
                table = table.take(pa.array(order))
        else:
            indices = np.zeros(0, np.int64)
            table = pa.table({c.name: pa.array([], plan.arrow[c.name]) for c in plan.columns})
        table = table.select(declared + new_columns)
        schema = pa.schema(
            [pa.field(c.name, plan.arrow[c.name], c.nullable) for c in plan.columns]
            + [table.schema.field(n) for n in new_columns]
        )
        # the declared types are already there; only the flags of the fields are set (Arrow's cast
        # refuses a NOT NULL struct field that is null under a null struct, which is valid data)
        table = pa.Table.from_arrays(
            [
                col if col.type == f.type else col.cast(f.type)
                for col, f in zip(table.columns, schema, strict=True)
            ],
            schema=schema,
        )
        if self.spec.on_new_fields == "rescue" or (add and (self.rescue_keys or self.rescued_text)):
            table = table.append_column(RESCUED, self._rescued(indices))
            if add:
                new_columns.append(RESCUED)
        bad = BadRecords()
        for i in sorted(self.bad):
            stage, error_class, message = self.bad[i]
            bad.add(i, stage, message, error_class)
        kept = pa.array(indices, pa.int64())
        overlap = bool(len(bad)) and bool(np.isin(np.array(bad.indices, np.int64), indices).any())
        if len(kept) + len(bad) != self.n or overlap:
            raise AssertionError(
                f"decode lost track of records: {len(kept)} kept + {len(bad)} bad != {self.n}"
            )
        return Decoded(table, kept, bad, tuple(new_columns))

    def _not_columns(self, fields: list[tuple[str, list[pa.DataType]]]) -> set[str]:
        """``add_columns``: the new fields (name, the types read for it) that cannot be columns, whose
        values go to ``_rescued`` instead (contract of the module doc): a name :func:`name_clash`
        refuses beside the declared, reserved and known columns and the new fields before it (the
        first spelling of a name is the column), or a type with two STRUCT field names that differ
        only in case. Remembered for the range."""
        if self.taken is None:
            self.taken = {c.name.lower(): c.name for c in self.plan.columns}
            for name in self.known:
                self.taken.setdefault(name.lower(), name)
        out: set[str] = set()
        for name, types in fields:
            if name in self.not_columns:
                out.add(name)
                continue
            if name_clash(name, self.taken) is not None or any(_case_twice(t) for t in types):
                self.not_columns.add(name)
                out.add(name)
                continue
            self.taken.setdefault(name.lower(), name)
        return out

    def _rescue_fields(self, indices: np.ndarray, table: pa.Table, names: set[str]) -> None:
        """The records of a part (``indices``, its ``table``) that have any of ``names``: those
        fields are rescued (their original JSON text goes to ``_rescued``)."""
        names = names & set(table.column_names)
        if not names:
            return
        texts = self.texts
        assert texts is not None
        chosen = texts.take(pa.array(indices))
        maybe = np.zeros(len(indices), bool)
        for name in names:
            maybe |= np.asarray(pc.fill_null(table.column(name).is_valid(), False)) | _present(chosen, name)
        for j in np.flatnonzero(maybe):
            i = int(indices[j])
            here = {k for k, _ in json_members(chosen[int(j)].as_py())} & names
            if here:
                self.rescue_keys.setdefault(i, set()).update(here)

    def _rescued(self, indices: np.ndarray) -> pa.Array:
        rescued: dict[int, str] = dict(self.rescued_text)
        texts = self.texts
        for i in sorted(self.drift_candidates | set(self.rescue_keys)):
            if i in rescued or texts is None:
                continue
            names = self.rescue_keys.get(i, set())
            members = json_members(texts[i].as_py())
            if self.spec.on_new_fields == "rescue":  # add_columns: its new fields are columns
                names = names | {top for top, _ in self._unknown_fields(texts[i].as_py())}
            chosen = [(k, raw) for k, raw in members if k in names]
            if chosen:
                rescued[i] = (
                    "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + raw for k, raw in chosen) + "}"
                )
        if not rescued:
            return pa.nulls(len(indices), pa.string())
        positions = np.searchsorted(indices, np.array(sorted(rescued), np.int64))
        mask = np.zeros(len(indices), bool)
        mask[positions] = True
        return pc.replace_with_mask(
            pa.nulls(len(indices), pa.string()),
            pa.array(mask),
            pa.array([rescued[i] for i in sorted(rescued)], pa.string()),
        )


def _plain(value: Any) -> Any:
    """A fastavro value as pyarrow takes it (a UUID as its text)."""
    import uuid

    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


# --------------------------------------------------------------------------- Avro schemas


_AVRO_LOCK = threading.Lock()
#: The schema ids a registry does not know, per registry URL: a schema id never changes, so a record
#: with one is a bad record without asking the registry again.
_UNKNOWN: set[tuple[str, int | str]] = set()
_WIRE_FORMAT = (
    "not the Confluent wire format (magic byte 0 and a 4-byte schema id, or magic byte 1 and a 16-byte "
    "schema GUID, then the body)"
)


class _NotWireFormat(ValueError):
    pass


class _UnknownSchema(LookupError):
    pass


class _BadBody(ValueError):
    pass


class _Violation(ValueError):
    """A record its own JSON Schema refuses."""


class _RegistryFailed(Exception):
    def __init__(self, schema_id: int | str | None, reason: str) -> None:
        super().__init__(reason)
        self.schema_id, self.reason = schema_id, reason


def _registry_error(spec: Any, err: _RegistryFailed, index: int) -> SchemaRegistryError:
    """Record ``index``'s writer schema could not be fetched: the range fails (read again next epoch)."""
    return SchemaRegistryError(
        f"record {index} of the range has schema id {err.schema_id}, and the schema registry at "
        f"{_shown_url(spec.schema_registry_url or '')} did not give its schema: "
        f"{_shown_url(err.reason)}; the range is read again with the next epoch (check the "
        "registry and decode.registry if this repeats)",
        schema_id=err.schema_id,
        index=index,
    )


@lru_cache(maxsize=256)
def _parsed_avro(schema_text: str) -> Any:
    import fastavro

    return fastavro.parse_schema(json.loads(schema_text))


def _shown_url(text: str) -> str:
    """``text`` with the credentials of any URL in it hidden (``https://***@host``)."""
    return re.sub(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]+@", r"\1***@", text)


def _schema_name(schema_id: Any) -> str:
    """How messages name a parsed ``SchemaId``: ``schema id 7``, or its GUID (magic byte 1)."""
    if schema_id.id is not None:
        return f"schema id {schema_id.id}"
    return f"schema GUID {schema_id.guid} (magic byte 1)"


def _schema_key(schema_id: Any) -> int | str:
    return int(schema_id.id) if schema_id.id is not None else str(schema_id.guid)


def _framing(raw: bytes) -> tuple[Any, io.BytesIO]:
    """The schema id of a value in the Confluent wire format and its body (the library's framing:
    ``confluent_kafka.schema_registry.prefix_schema_id_deserializer``)."""
    from confluent_kafka.schema_registry import prefix_schema_id_deserializer
    from confluent_kafka.schema_registry.serde import SchemaId

    schema_id = SchemaId("AVRO")
    try:
        body = prefix_schema_id_deserializer(raw, None, schema_id)
    except Exception as err:  # noqa: BLE001 - a wrong magic byte, a short header
        what = f"magic byte {raw[0]}" if raw[0] not in (0, 1) else f"{len(raw)} bytes ({err})"
        raise _NotWireFormat(f"{_WIRE_FORMAT}: {what}") from None
    if len(raw) - body.tell() <= 0:
        raise _NotWireFormat(f"{_WIRE_FORMAT}: {len(raw)} bytes, no body")
    return schema_id, body


#: What reads one value of a range: ``raw -> (record, schema id, bytes left after the record)``.
AvroRead = Callable[[bytes], tuple[Any, str, int]]  # (record, how messages name its schema, bytes left)


def _avro_reader(spec: DecodeSpec) -> AvroRead:
    """How the values of ``spec`` are read: with a registry, by the library's ``AvroDeserializer``
    (the writer schema of each id fetched and cached by ``SchemaRegistryClient``, resolved to the
    reader schema when the spec has one); without, with the schema file's schema for every id."""
    if spec.schema_registry_url:
        return _registry_reader(spec.schema_registry_url, spec.registry.items, spec.reader_schema)
    writer = _parsed_avro(spec.avro_schema) if spec.avro_schema else None

    def read(raw: bytes) -> tuple[Any, str, int]:
        import fastavro

        schema_id, body = _framing(raw)
        name = _schema_name(schema_id)
        if writer is None:
            raise _BadBody("no writer schema: set decode.schema_file or decode.registry")
        try:
            record = fastavro.schemaless_reader(body, writer, None)
        except Exception as err:  # noqa: BLE001 - any failure of the body's bytes is a decode error
            raise _BadBody(f"{name}: the Avro body does not read: {type(err).__name__}: {err}") from None
        return record, name, len(raw) - body.tell()

    return read


def registry_client(url: str, conf: Sequence[tuple[str, Any]] = ()) -> Any:
    """The ``SchemaRegistryClient`` of ``url`` with ``conf`` (auth, TLS), one per process and settings
    (its cache of schemas by id is shared by every range the process decodes)."""
    return _registry_client(url, tuple(conf))


@lru_cache(maxsize=16)
def _registry_client(url: str, conf: tuple[tuple[str, Any], ...]) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": url, **dict(conf)})


@lru_cache(maxsize=16)
def _registry_reader(
    url: str, conf: tuple[tuple[str, Any], ...], reader_schema: str | None, fmt: str = "AVRO"
) -> AvroRead:
    """One value read through the library's deserializer of ``fmt`` (``AVRO``: the record, how
    messages name its schema, the bytes left after it; ``JSON``: the validated object, its schema's
    name, where its JSON body starts)."""
    from confluent_kafka.schema_registry import SchemaRegistryError as RegistryAnswer
    from confluent_kafka.schema_registry import dual_schema_id_deserializer
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import SerializationError

    local = threading.local()  # what the deserializer's framing step saw, per thread
    cache_key = url.rstrip("/")

    def framing(data: bytes, ctx: Any, schema_id: Any) -> io.BytesIO:
        try:
            body = dual_schema_id_deserializer(data, ctx, schema_id)
        except Exception as err:  # noqa: BLE001 - a wrong magic byte, a short header
            what = f"magic byte {data[0]}" if data[0] not in (0, 1) else f"{len(data)} bytes ({err})"
            raise _NotWireFormat(f"{_WIRE_FORMAT}: {what}") from None
        local.schema_id, local.body, local.start = schema_id, body, body.tell()
        key = _schema_key(schema_id)
        if (cache_key, key) in _UNKNOWN:
            raise _UnknownSchema(_unknown(schema_id, url))
        try:  # the writer schema, into the client's cache, where the deserializer finds it next
            client.get_schema(key) if isinstance(key, int) else client.get_schema_by_guid(key)
        except RegistryAnswer as err:
            if err.http_status_code == 404:
                with _AVRO_LOCK:
                    _UNKNOWN.add((cache_key, key))
                raise _UnknownSchema(_unknown(schema_id, url)) from None
            raise _RegistryFailed(
                key, f"HTTP Error {err.http_status_code}: {err.error_message} (error code {err.error_code})"
            ) from None
        except Exception as err:  # noqa: BLE001 - refused, timed out, TLS: no answer
            raise _RegistryFailed(key, f"no answer: {type(err).__name__}: {err}") from None
        return body

    try:
        client = _registry_client(url, conf)
    except (ValueError, TypeError, OSError) as err:  # the library refuses a setting, a CA file is missing
        raise _RegistryFailed(None, f"its client cannot be set up: {type(err).__name__}: {err}") from None
    deserializer: Any
    if fmt == "JSON":
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer

        # the writer schema by the record's id, no subject (the JSON deserializer asks for one
        # even without a serialization context; the Avro one asks only with a context)
        deserializer = JSONDeserializer(
            None,
            schema_registry_client=client,
            conf={"schema.id.deserializer": framing, "subject.name.strategy": _no_subject},
        )
    else:
        deserializer = AvroDeserializer(client, reader_schema, conf={"schema.id.deserializer": framing})

    def read(raw: bytes) -> tuple[Any, str, int]:
        local.schema_id = local.body = None
        if len(raw) <= 5:  # the deserializer's own message for it does not say what it is
            what = f"magic byte {raw[0]}" if raw[0] not in (0, 1) else f"{len(raw)} bytes"
            raise _NotWireFormat(f"{_WIRE_FORMAT}: {what}")
        try:
            record = deserializer(raw, None)
        except (_NotWireFormat, _UnknownSchema, _RegistryFailed):
            raise
        except RegistryAnswer as err:  # a schema the writer schema references
            raise _RegistryFailed(
                _key_of(local.schema_id),
                f"HTTP Error {err.http_status_code}: {err.error_message} (error code {err.error_code})",
            ) from None
        except SerializationError as err:  # JSON: the record does not fit its own schema
            name = _schema_name(local.schema_id) if local.schema_id is not None else "the value"
            if fmt != "JSON":
                raise _BadBody(f"{name}: the Avro body does not read: {err}") from None
            raise _Violation(f"{name}: the record does not fit its JSON Schema: {err}") from None
        except Exception as err:  # noqa: BLE001 - the body's bytes, or a writer schema of another kind
            name = _schema_name(local.schema_id) if local.schema_id is not None else "the value"
            what = "JSON" if fmt == "JSON" else "Avro"
            raise _BadBody(f"{name}: the {what} body does not read: {type(err).__name__}: {err}") from None
        if fmt == "JSON":
            return record, _schema_name(local.schema_id), local.start
        body: io.BytesIO | None = local.body
        rest = 0 if body is None else len(body.getbuffer()) - body.tell()
        return record, _schema_name(local.schema_id), rest

    return read


def _no_subject(ctx: Any, record_name: Any) -> None:
    """A subject name strategy naming none: a record is read with its own writer schema."""
    return None


def _key_of(schema_id: Any) -> int | str | None:
    return None if schema_id is None else _schema_key(schema_id)


def _unknown(schema_id: Any, url: str) -> str:
    return (
        f"{_schema_name(schema_id)} is not in the schema registry at {_shown_url(url.rstrip('/'))} (HTTP 404)"
    )


def _concat(tables: list[pa.Table]) -> pa.Table:
    """Parts of one range as one table; new columns inferred differently per part (``1`` here,
    ``"a"`` there) become STRING when that converts, so no record is lost for its type."""
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    kinds: dict[str, set[pa.DataType]] = {}
    for t in tables:
        for f in t.schema:
            kinds.setdefault(f.name, set()).add(f.type)
    mixed = {n for n, ts in kinds.items() if len(ts - {pa.null()}) > 1}
    out = []
    for t in tables:
        for n in mixed & set(t.column_names):
            t = t.set_column(t.schema.get_field_index(n), n, t.column(n).cast(pa.string()))
        out.append(t)
    return pa.concat_tables(out, promote_options="permissive")


_SIGNED_INTEGER = ("an optional + or - and decimal digits only", r"^[+-]?[0-9]+$")
_DECIMAL_NUMBER = r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?"
#: What a csv field of a numeric or BOOLEAN column may be (Spark's CSV reader: Java's
#: ``Long.parseLong``, ``Double.parseDouble`` with its ``NaN``/``Inf``/``-Inf`` options,
#: ``BigDecimal``, Scala's ``toBoolean``), as (the words of an error, an RE2 pattern). A field of
#: another form is a type mismatch (rescued, or stage ``schema``), never read another way: Arrow's
#: own cast reads ``0x1A`` as 26 and ``1``/``0`` as true/false. Stricter than Spark where Spark
#: trims blanks around a DOUBLE or rounds a DECIMAL's extra digits: those are mismatches here.
CSV_FORMS: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("TINYINT", "SMALLINT", "INT", "BIGINT"), _SIGNED_INTEGER),
    **dict.fromkeys(
        ("FLOAT", "DOUBLE"),
        (
            "a decimal number (digits, an optional point and exponent, an optional sign), NaN, "
            "Infinity, Inf or -Inf",
            rf"^({_DECIMAL_NUMBER}|[+-]?NaN|[+-]?Infinity|-?Inf)$",
        ),
    ),
    "DECIMAL": (
        "a decimal number (digits, an optional point and exponent, an optional sign)",
        rf"^{_DECIMAL_NUMBER}$",
    ),
    "BOOLEAN": ("true or false, in any case", r"^(?i:true|false)$"),
}


#: A character every form in which Arrow's cast would read a field that :data:`CSV_FORMS` refuses,
#: or refuse one it accepts, has (Arrow reads integers as ``-``/digits or ``0x`` hex, and floats
#: with ``inf``/``nan`` in any case): a column without one needs no check of its forms.
_CSV_SUSPECT = {
    **dict.fromkeys(("TINYINT", "SMALLINT", "INT", "BIGINT"), "xX+"),
    **dict.fromkeys(("FLOAT", "DOUBLE"), "iInN"),
}


def _csv_forms(column: pa.Array, type_name: str) -> tuple[pa.Array, np.ndarray | None]:
    """A csv column (text) of a column of type ``type_name``, and per field whether its form is
    refused (:data:`CSV_FORMS`; None when none is); an integer's leading ``+`` is dropped (Arrow
    refuses it, Spark reads it)."""
    form = CSV_FORMS.get(type_name)
    if form is None:
        return column, None
    suspect = _CSV_SUSPECT.get(type_name)
    if suspect is not None and not any(pc.any(pc.match_substring(column, c)).as_py() for c in suspect):
        return column, None  # the forms Arrow's cast and Spark read differently all have one of these
    accepted = pc.match_substring_regex(column, form[1])
    refused = np.asarray(pc.fill_null(pc.invert(accepted), False))
    if form is _SIGNED_INTEGER:
        column = pc.replace_substring_regex(column, r"^\+", "")
    return column, refused if refused.any() else None


#: How deep a JSON value may nest (objects and arrays in one another). A deeper one is a bad record
#: (stage ``decode``): Python's JSON parser and Arrow's inference recurse once per level (a few
#: thousand levels crash the process), and Spark's JSON reader (Jackson) refuses more than 1,000.
MAX_JSON_DEPTH = 512
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def too_deep(texts: pa.Array, limit: int = MAX_JSON_DEPTH) -> dict[int, int]:
    """The values of ``texts`` (JSON, as a string or binary array) that nest deeper than ``limit``
    levels, with their depth. Only a value longer than ``limit`` bytes can (a level is at least
    one byte); among those one numpy pass counts each one's ``[`` and ``{``, and only a value with
    more than ``limit`` of them is measured (its strings removed first)."""
    lengths = np.asarray(pc.fill_null(pc.binary_length(texts), 0))
    longer = np.flatnonzero(lengths > limit)
    if not len(longer):
        return {}
    if len(longer) < len(texts):
        found = too_deep(texts.take(pa.array(longer)), limit)
        return {int(longer[j]): depth for j, depth in found.items()}
    offsets, data = _layout(texts)
    n = len(texts)
    body = data[offsets[0] : offsets[-1]]
    opens = np.flatnonzero((body == ord("[")) | (body == ord("{")))
    if len(opens) <= limit:
        return {}
    counts = np.bincount(np.searchsorted(offsets, opens + offsets[0], side="right") - 1, minlength=n)
    out: dict[int, int] = {}
    for j in np.flatnonzero(counts > limit).tolist():
        bare = np.frombuffer(_JSON_STRING.sub(b"", data[offsets[j] : offsets[j + 1]].tobytes()), np.uint8)
        step = ((bare == ord("[")) | (bare == ord("{"))).astype(np.int64)
        step -= ((bare == ord("]")) | (bare == ord("}"))).astype(np.int64)
        depth = int(np.cumsum(step).max()) if len(step) else 0
        if depth > limit:
            out[int(j)] = depth
    return out


def _case_twice(t: pa.DataType) -> bool:
    """Whether a STRUCT inside ``t`` has two field names that differ only in case (Delta refuses it)."""
    if pa.types.is_struct(t):
        names = [t.field(k).name.lower() for k in range(t.num_fields)]
        return len(set(names)) != len(names) or any(_case_twice(t.field(k).type) for k in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _case_twice(t.value_type)
    if pa.types.is_map(t):
        return _case_twice(t.key_type) or _case_twice(t.item_type)
    return False


def _present(texts: pa.Array, key: str) -> np.ndarray:
    """Per JSON text: whether it may have the top-level ``key`` (its JSON spelling occurs, or a
    backslash, with which a writer may spell a key otherwise): the rows worth parsing for it."""
    spelled = pc.match_substring(texts, json.dumps(key, ensure_ascii=False))
    escaped = pc.match_substring(texts, "\\")
    return np.asarray(pc.fill_null(pc.or_(spelled, escaped), False))


def _layout(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The value offsets (n + 1) and the data bytes of a string or binary array (large ones too),
    as numpy views."""
    n = len(texts)
    buffers = texts.buffers()
    large = pa.types.is_large_string(texts.type) or pa.types.is_large_binary(texts.type)
    offsets = np.frombuffer(buffers[1], np.int64 if large else np.int32)[texts.offset : texts.offset + n + 1]
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return offsets, data


def _bytes_in(texts: pa.Array, chars: bytes) -> np.ndarray:
    """Per value: whether it holds any of ``chars`` (one numpy pass over the data bytes)."""
    offsets, data = _layout(texts)
    out = np.zeros(len(texts), bool)
    if not len(texts):
        return out
    body = data[offsets[0] : offsets[-1]]
    hit = np.zeros(len(body), bool)
    for c in chars:
        hit |= body == c
    positions = np.flatnonzero(hit) + offsets[0]
    if len(positions):
        out[np.searchsorted(offsets, positions, side="right") - 1] = True
    return out


def _begins_with_brace(texts: pa.Array) -> np.ndarray:
    """Per value: whether its first non-blank character is ``{`` (null and empty: False)."""
    offsets, data = _layout(texts)
    n = len(texts)
    out = np.zeros(n, bool)
    lengths = np.diff(offsets)
    present = (lengths > 0) & np.asarray(texts.is_valid())
    first = np.zeros(n, np.uint8)
    first[present] = data[offsets[:-1][present]]
    out[present] = first[present] == ord("{")
    for j in np.flatnonzero(present & np.isin(first, np.frombuffer(b" \t\r\n", np.uint8))):
        out[j] = texts[int(j)].as_py().lstrip(" \t\r\n").startswith("{")  # rare: leading blanks
    return out


def _nested_nulls(array: pa.Array, t: pa.DataType, path: str, found: dict[int, str]) -> np.ndarray:
    """Per element of ``array``: whether a NOT NULL field inside it (``t``) is null; ``found``
    gets the dotted path of the first such field per element."""
    out = np.zeros(len(array), bool)
    if pa.types.is_struct(t):
        valid = np.asarray(array.is_valid())
        for k in range(t.num_fields):
            f = t.field(k)
            child = array.field(k)
            where = f"{path}.{f.name}"
            hit = np.zeros(len(array), bool)
            if not f.nullable:
                hit |= valid & np.asarray(child.is_null())
            deeper: dict[int, str] = {}
            hit |= valid & _nested_nulls(child, f.type, where, deeper)
            for j in np.flatnonzero(hit & ~out):
                found.setdefault(int(j), deeper.get(int(j), where))
            out |= hit
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        flat = array.flatten()
        below: dict[int, str] = {}
        inner = _nested_nulls(flat, t.value_type, path + "[]", below)
        if not t.value_field.nullable:
            inner |= np.asarray(flat.is_null())
        if inner.any():
            parents = np.asarray(pc.list_parent_indices(array))
            for element in np.flatnonzero(inner).tolist():
                found.setdefault(int(parents[element]), below.get(element, path + "[]"))
            out[parents[inner]] = True
    return out


def _loose(t: pa.DataType) -> pa.DataType:
    """``t`` with every field nested in it nullable (what the readers and casts can produce)."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _loose(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _loose(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(t.key_type, pa.field(t.item_field.name, _loose(t.item_type)))
    return t


def _retag(array: pa.Array, t: pa.DataType) -> pa.Array:
    """``array`` (of ``_loose(t)``) as type ``t``: the same data with the declared NOT NULL flags,
    rebuilt without the check a cast makes (a NOT NULL field may hold null under a null struct)."""
    if array.type == t:
        return array
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(t):
        children = [_retag(array.field(k), t.field(k).type) for k in range(t.num_fields)]
        return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)
    if pa.types.is_list(t):
        values = _retag(array.values, t.value_type)
        return pa.ListArray.from_arrays(array.offsets, values, type=t, mask=mask)
    if pa.types.is_map(t):
        items = _retag(array.items, t.item_type)
        return pa.MapArray.from_arrays(array.offsets, array.keys, items, type=t, mask=mask)
    return array.cast(t)
