"""records.decode: json, csv and avro values into typed Arrow columns, bad records kept apart.

Pure pyarrow (and fastavro): no Spark. Every test checks the bookkeeping of the contract:
``kept`` and ``bad.indices`` together are every input index, once.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitkeeper.records.ddl import avro_columns, parse_ddl
from splitkeeper.records.decode import Decoded, SchemaDriftError, decode_values
from splitkeeper.records.spec import DecodeSpec, RegistryConf
from splitkeeper.transforms import identity

ORDERS = parse_ddl("id BIGINT NOT NULL, name STRING, amount DECIMAL(10,2), day DATE, at TIMESTAMP")


def json_spec(policy: str = "rescue", columns: Any = ORDERS) -> DecodeSpec:
    return DecodeSpec(kind="json", columns=columns, on_new_fields=policy)


def decode(spec: DecodeSpec, values: list[bytes | None]) -> Decoded:
    out = decode_values(spec, pa.array(values, pa.binary()))
    kept = out.kept.to_pylist()
    assert kept == sorted(kept), "rows are in input order"
    assert sorted(kept + out.bad.indices) == list(range(len(values))), "every index once: kept or bad"
    assert set(out.bad.stages) <= {"decode", "schema"}
    assert out.table.num_rows == len(kept)
    return out


def rows(out: Decoded) -> dict[int, dict[str, Any]]:
    return dict(zip(out.kept.to_pylist(), out.table.to_pylist(), strict=True))


def bad(out: Decoded) -> dict[int, tuple[str, str]]:
    return {i: (s, m) for i, s, m in zip(out.bad.indices, out.bad.stages, out.bad.messages, strict=True)}


# --------------------------------------------------------------------------- json


def test_json_good_records_are_typed_columns() -> None:
    out = decode(
        json_spec(),
        [
            b'{"id": 1, "name": "caf\xc3\xa9", "amount": 12.5, "day": "2024-02-29", '
            b'"at": "2024-01-01T10:00:00+02:00"}',
            b'{"id": 2, "amount": "0.10"}',
        ],
    )
    assert out.table.schema.names == ["id", "name", "amount", "day", "at", "_rescued"]
    assert out.table.schema.field("id").type == pa.int64() and not out.table.schema.field("id").nullable
    assert out.table.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert out.table.to_pylist() == [
        {
            "id": 1,
            "name": "café",
            "amount": Decimal("12.50"),
            "day": dt.date(2024, 2, 29),
            "at": dt.datetime(2024, 1, 1, 8, 0, tzinfo=dt.UTC),
            "_rescued": None,
        },
        {"id": 2, "name": None, "amount": Decimal("0.10"), "day": None, "at": None, "_rescued": None},
    ]
    assert not out.bad


def test_json_bad_records_are_found_and_the_good_ones_kept() -> None:
    values: list[bytes | None] = [
        b'{"id": 0}',
        None,  # a Kafka tombstone
        b"",
        b"not json",
        b'{"id": "abc"}',  # a type mismatch of a NOT NULL column: schema
        b'{"id": 5, "name": "x\xff"}',  # invalid UTF-8: decode, never a replacement character
        b'{"name": "no id"}',  # NOT NULL column missing
        b"[1, 2]",
        b'{"id": 8}{"id": 9}',  # two objects in one value
        b'{\n  "id": 9,\n  "name": "pretty"\n}',  # pretty-printed: a good record
        b'{"id": 10, "id": 11}',
        b'{"id": 11, "day": "2024-13-01"}',  # a mismatch of a nullable column: rescued (below)
        b"   ",
        b'{"id": 13}',
    ]
    out = decode(json_spec(), values)
    found = bad(out)
    assert {i: s for i, (s, _) in found.items()} == {
        1: "decode",
        2: "decode",
        3: "decode",
        4: "schema",
        5: "decode",
        6: "schema",
        7: "decode",
        8: "decode",
        10: "decode",
        12: "decode",
    }
    assert "tombstone" in found[1][1] and "empty" in found[2][1]
    assert "field 'id': expected BIGINT, got \"abc\"" in found[4][1]
    assert "not valid UTF-8" in found[5][1]
    assert "column 'id' is NOT NULL" in found[6][1]
    assert "'id' is given twice" in found[10][1]
    got = rows(out)
    assert [got[i]["id"] for i in sorted(got)] == [0, 9, 11, 13]
    assert got[9]["name"] == "pretty"
    assert got[11]["day"] is None and got[11]["_rescued"] == '{"day":"2024-13-01"}'


def test_rescue_keeps_unknown_fields_as_their_original_json_text() -> None:
    out = decode(
        json_spec(),
        [
            b'{"id": 1, "extra": {"deep": [1, 2.50, "x"]}, "name": "a", "n": 1.0E3}',
            b'{"id": 2}',
            b'{"id": 3, "extra": null}',  # an unknown field with null is still kept
            b'{"id": 4, "amount": "lots"}',  # a type mismatch is rescued, the column is null
        ],
    )
    got = rows(out)
    assert got[0]["_rescued"] == '{"extra":{"deep": [1, 2.50, "x"]},"n":1.0E3}'
    assert got[0]["name"] == "a"
    assert got[1]["_rescued"] is None
    assert got[2]["_rescued"] == '{"extra":null}'
    assert got[3]["amount"] is None and got[3]["_rescued"] == '{"amount":"lots"}'
    assert out.new_columns == ()


def test_rescue_keeps_undeclared_fields_inside_a_struct() -> None:
    columns = parse_ddl("id BIGINT, s STRUCT<a: INT>")
    out = decode(
        json_spec("rescue", columns), [b'{"id": 1, "s": {"a": 1, "b": "new"}}', b'{"id": 2, "s": {"a": 2}}']
    )
    got = rows(out)
    assert got[0]["s"] == {"a": 1} and got[0]["_rescued"] == '{"s":{"a": 1, "b": "new"}}'
    assert got[1]["s"] == {"a": 2} and got[1]["_rescued"] is None


def test_add_columns_makes_new_top_level_fields_columns_after_the_declared_ones() -> None:
    out = decode(
        json_spec("add_columns"),
        [b'{"id": 1, "color": "red"}', b'{"id": 2, "size": 3}', b'{"id": 3}', b'{"id": "x", "size": 4}'],
    )
    assert out.new_columns == ("color", "size")
    assert out.table.column_names == ["id", "name", "amount", "day", "at", "color", "size"]
    got = rows(out)
    assert [(got[i]["color"], got[i]["size"]) for i in (0, 1, 2)] == [("red", None), (None, 3), (None, None)]
    assert bad(out)[3][0] == "schema", "add_columns does not rescue a type mismatch"


def test_rescue_keeps_every_unknown_top_level_field_whatever_its_name() -> None:
    """Issue 36 item 5: dotted names were split at the dot (``user.id`` looked for ``user``), so
    they were dropped, and ``id.x`` rescued the declared ``id`` instead of itself."""
    out = decode(
        json_spec("rescue", parse_ddl("id BIGINT, s STRUCT<a: INT>")),
        [
            b'{"id": 1, "user.id": 42, "event.type": "click", "x": 1}',
            b'{"id": 2, "id.x": 5}',
            b'{"id": 3, "s.a": 7, "s": {"a": 1, "b": 2}}',  # a dotted name beside a struct it spells
            b'{"id": 4, "\\u00e9": null, ".": [], "": 0}',  # escaped, odd and empty names, null values
        ],
    )
    got = rows(out)
    assert got[0] == {"id": 1, "s": None, "_rescued": '{"user.id":42,"event.type":"click","x":1}'}
    assert got[1] == {"id": 2, "s": None, "_rescued": '{"id.x":5}'}  # id is 2, from "id" only
    assert got[2] == {"id": 3, "s": {"a": 1}, "_rescued": '{"s.a":7,"s":{"a": 1, "b": 2}}'}
    assert json.loads(got[3]["_rescued"]) == {"\u00e9": None, ".": [], "": 0}
    out = decode(json_spec("add_columns"), [b'{"id": 1, "user.id": 42}'])  # a top-level column, not nested
    assert out.new_columns == ("user.id",) and rows(out)[0]["user.id"] == 42


def test_add_columns_rescues_fields_that_cannot_be_columns_and_keeps_their_values() -> None:
    """Issue 36 items 4 and 16: fields named like bookkeeping columns were dropped silently, and
    ``id`` beside ``ID`` (Delta compares names case-insensitively) crashed every commit. Such a
    field goes to a ``_rescued`` column (added like a new column), with its original JSON text."""
    values: list[bytes | None] = [
        b'{"id": 1, "timestamp": "2024-05-05T10:00:00Z", "key": "user-key", "headers": "h", '
        b'"next_offset": 5, "ingested_at": "x", "offset": 9, "split_id": "s", "epoch": 1, "region": 2, '
        b'"topic": "t", "partition": 3, "color": "red"}',
        b'{"id": 2, "ID": 3, "Color": "blue", "Ingested_Date": "d", "tombstone": true, "_rescued": {"a": 1}}',
        b'{"id": 3, "o": {"a": 1, "A": 2}, "color": "green"}',  # a struct Delta cannot hold
        b'{"id": 4}',
    ]
    out = decode(json_spec("add_columns"), values)
    assert out.new_columns == ("color", "_rescued")
    got = rows(out)
    assert [got[i]["color"] for i in range(4)] == ["red", None, "green", None]
    assert json.loads(got[0]["_rescued"]) == {
        "timestamp": "2024-05-05T10:00:00Z",
        "key": "user-key",
        "headers": "h",
        "next_offset": 5,
        "ingested_at": "x",
        "offset": 9,
        "split_id": "s",
        "epoch": 1,
        "region": 2,
        "topic": "t",
        "partition": 3,
    }
    assert json.loads(got[1]["_rescued"]) == {
        "ID": 3,
        "Color": "blue",
        "Ingested_Date": "d",
        "tombstone": True,
        "_rescued": {"a": 1},
    }
    assert got[1]["id"] == 2 and json.loads(got[2]["_rescued"]) == {"o": {"a": 1, "A": 2}}
    assert got[3]["_rescued"] is None
    known = decode_values(
        json_spec("add_columns"), pa.array([b'{"id": 5, "COLOR": "x", "size": 1}']), known=["color"]
    )
    assert known.new_columns == ("size", "_rescued")  # another spelling of a column the sink has
    assert known.table.to_pylist()[0]["_rescued"] == '{"COLOR":"x"}'


def test_a_json_value_nested_too_deep_is_one_bad_record() -> None:
    """Issue 36 item 13: one value nested ~1,000 levels raised RecursionError for the whole range
    (and ~30,000 levels crashed Arrow's reader). It is one bad record of stage decode now."""
    deep = b'{"id": 1, "n": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    deeper = b'{"id": 2, "n": ' + b'{"a": ' * 40_000 + b"1" + b"}" * 40_000 + b"}"
    fine = b'{"id": 3, "n": ' + b"[" * 500 + b"]" * 500 + b', "s": "' + b"[" * 2000 + b'"}'
    for policy in ("rescue", "add_columns", "fail"):
        out = decode(
            json_spec(policy, parse_ddl("id BIGINT")),
            [b'{"id": 0}', deep, deeper, fine] if policy != "fail" else [deep, b'{"id": 0}'],
        )
        found = bad(out)
        first = 1 if policy != "fail" else 0
        assert (
            found[first] == ("decode", found[first][1])
            and "nests 1001 levels deep, more than the 512" in found[first][1]
        )
        assert set(out.bad.error_classes) == {"NestedTooDeep"}
    out = decode(json_spec("rescue", parse_ddl("id BIGINT")), [b'{"id": 0}', deep, deeper, fine])
    assert sorted(bad(out)) == [1, 2] and [r["id"] for r in out.table.to_pylist()] == [0, 3]


def test_csv_numbers_and_booleans_are_read_as_spark_reads_them() -> None:
    """Issue 36 item 11: Arrow's cast read ``0x1A`` into a BIGINT as 26 (Spark: not a number) and
    ``1``/``0`` as booleans. Only Spark's forms are read; another is a type mismatch, rescued."""
    spec = DecodeSpec(kind="csv", columns=parse_ddl("n BIGINT, x DOUBLE, b BOOLEAN, d DECIMAL(6,2)"))
    lines = {
        b"0x1A,0x1A,1,0x1A": (None, None, None, None),
        b"1_000,1_000,0,1_0": (None, None, None, None),
        b" 7 , 7 ,t, 7 ": (None, None, None, None),
        b"1e3,1e3,yes,1e3": (None, 1000.0, None, Decimal("1000.00")),
        b"1.0,inf,TRUE,1.5": (None, None, True, Decimal("1.50")),
        b"+5,+5,false,+5": (5, 5.0, False, Decimal("5.00")),
        b"-007,-Inf,False,-.5": (-7, float("-inf"), False, Decimal("-0.50")),
        b"42,NaN,true,Inf": (42, None, True, None),
    }
    out = decode(spec, list(lines))
    got = rows(out)
    for i, (line, want) in enumerate(lines.items()):
        row = got[i]
        have = (row["n"], row["x"], row["b"], row["d"])
        if want[1] is None and row["x"] is not None and row["x"] != row["x"]:  # NaN
            have = (row["n"], None, row["b"], row["d"])
        assert have == want, line
        fields = line.decode().split(",")
        rescued = json.loads(row["_rescued"] or "{}")
        for name, field, value in zip(("n", "x", "b", "d"), fields, want, strict=True):
            assert (name in rescued) == (value is None and not (name == "x" and field == "NaN")), (line, name)
            if name in rescued:
                assert rescued[name] == field  # the text as it was, nothing reinterpreted
    strict = decode(
        DecodeSpec(kind="csv", columns=parse_ddl("n BIGINT"), on_new_fields="fail"), [b"0x1A", b"26"]
    )
    assert rows(strict) == {1: {"n": 26}}
    assert (
        "expected BIGINT, got '0x1A'" in bad(strict)[0][1]
        and "optional + or - and decimal digits" in bad(strict)[0][1]
    )


def test_fail_names_the_field_and_the_first_record_having_it() -> None:
    with pytest.raises(SchemaDriftError) as caught:
        decode_values(
            json_spec("fail"), pa.array([b'{"id": 1}', b'{"id": 2, "new": 1}', b'{"new": 2}'], pa.binary())
        )
    assert caught.value.params == {"field": "new", "index": 1}
    assert "'new'" in str(caught.value) and "on_new_fields" in str(caught.value)
    out = decode(json_spec("fail"), [b'{"id": 1}', b'{"id": "a"}'])  # a mismatch is no drift: schema
    assert bad(out)[1][0] == "schema"


def test_a_few_bad_records_in_a_large_range_are_isolated() -> None:
    values: list[bytes | None] = [
        json.dumps({"id": i, "name": f"n{i}", "amount": i / 100}).encode() for i in range(20_000)
    ]
    for i in (0, 7_777, 19_999):
        values[i] = b'{"id": 1, "name": '
    out = decode(json_spec(), values)
    assert out.bad.indices == [0, 7_777, 19_999]
    assert out.table.column("id").to_pylist() == [i for i in range(20_000) if i not in (0, 7_777, 19_999)]


_good = st.builds(
    lambda i, name, amount: json.dumps({"id": i, "name": name, "amount": amount}).encode(),
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=5) | st.none(),
    st.decimals(min_value=-(10**7), max_value=10**7, places=2, allow_nan=False).map(str) | st.none(),
)
_bad = st.sampled_from([b"", b"{", b'{"id": "x"}', b"\xff", b'{"id": 1.5}', b"null", b'{"name": "x"}', b"{}"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), _good, _bad), max_size=40))
def test_every_record_is_kept_exactly_or_bad(mix: list[tuple[bool, bytes, bytes]]) -> None:
    values: list[bytes | None] = [g if ok else b for ok, g, b in mix]
    out = decode(json_spec("add_columns"), values)
    want = [i for i, (ok, _, _) in enumerate(mix) if ok]
    assert out.kept.to_pylist() == want
    for i, row in rows(out).items():
        source = json.loads(values[i])  # type: ignore[arg-type]
        assert row["id"] == source["id"] and row["name"] == source["name"]
        assert row["amount"] == (None if source["amount"] is None else Decimal(source["amount"]))


@pytest.mark.slow
def test_json_decode_of_200k_records_is_columnar(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.decode_json import measure

    seconds, n = measure(200_000)
    with capsys.disabled():
        print(f"\ndecode json: {n} records of 5 fields in {seconds:.3f} s ({n / seconds:,.0f} records/s)")
    assert seconds < 10


# --------------------------------------------------------------------------- csv

CSV = parse_ddl("id BIGINT NOT NULL, name STRING, amount DECIMAL(10,2), ok BOOLEAN")


def csv_spec(policy: str = "rescue", delimiter: str = ",") -> DecodeSpec:
    return DecodeSpec(kind="csv", columns=CSV, on_new_fields=policy, csv_delimiter=delimiter)


def test_csv_fields_by_position_with_bad_records() -> None:
    values: list[bytes | None] = [
        b"1,alice,1.50,true",
        b'2,"b,""quoted""",2,false',
        b"3,,,",  # an empty string stays empty; other empty fields are null
        b"x,bad,1,true",  # a type mismatch of a NOT NULL column
        b"5,too few",
        b"6,extra,1,true,more,fields",
        b'7,"two\nlines",1,true',
        None,
        b"9,caf\xe9,1,true",  # Latin-1, not UTF-8
        b"10,a,notanumber,true",
    ]
    out = decode(csv_spec(), values)
    got = rows(out)
    assert got[0] == {"id": 1, "name": "alice", "amount": Decimal("1.50"), "ok": True, "_rescued": None}
    assert got[1]["name"] == 'b,"quoted"'
    assert got[2] == {"id": 3, "name": "", "amount": None, "ok": None, "_rescued": None}
    assert got[5]["_rescued"] == '{"_c4":"more","_c5":"fields"}' and got[5]["ok"] is True
    assert got[6]["name"] == "two\nlines"
    assert got[9]["amount"] is None and got[9]["_rescued"] == '{"amount":"notanumber"}'
    assert {i: s for i, (s, _) in bad(out).items()} == {3: "schema", 4: "schema", 7: "decode", 8: "decode"}
    assert "2 fields, 4 declared" in bad(out)[4][1]


def test_csv_extra_fields_under_fail_and_another_delimiter() -> None:
    with pytest.raises(SchemaDriftError) as caught:
        decode_values(csv_spec("fail", ";"), pa.array([b"1;a;1;true", b"2;b;1;true;x"], pa.binary()))
    assert caught.value.params == {"field": "_c4", "index": 1}
    out = decode(csv_spec("fail", ";"), [b"1;a,b;1;true"])
    assert rows(out)[0]["name"] == "a,b"


# --------------------------------------------------------------------------- avro

AVRO_SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": ["null", "string"]},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "tags", "type": {"type": "map", "values": "long"}},
    ],
}
WRITER_V2 = {**AVRO_SCHEMA, "fields": [*AVRO_SCHEMA["fields"], {"name": "channel", "type": "string"}]}  # type: ignore[list-item]


def wire(record: dict[str, Any], schema: dict[str, Any] = AVRO_SCHEMA, schema_id: int = 1) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + body.getvalue()


#: The registry client's retries of an HTTP 5xx or a refused connection, short for the tests
#: (its defaults wait about a second between tries).
FAST_RETRIES = RegistryConf((("max.retries", 2), ("retries.wait.ms", 5), ("retries.max.wait.ms", 20)))


def avro_spec(policy: str = "rescue", registry: str | None = None) -> DecodeSpec:
    return DecodeSpec(
        kind="avro",
        columns=avro_columns(AVRO_SCHEMA),
        on_new_fields=policy,
        avro_schema=json.dumps(AVRO_SCHEMA),
        schema_registry_url=registry,
        registry=FAST_RETRIES,
    )


RECORD = {
    "id": 7,
    "name": "x",
    "amount": Decimal("3.25"),
    "at": dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC),
    "tags": {"a": 1},
}


def test_avro_confluent_wire_format_without_a_registry() -> None:
    good = wire(RECORD)
    values: list[bytes | None] = [
        good,
        b"\x01" + good[1:],  # wrong magic byte
        good[:3],  # shorter than the header
        good[:-4],  # a truncated body
        good + b"\x00",  # trailing bytes
        None,
        wire({**RECORD, "name": None, "id": 8}, schema_id=99),  # any id is read with the file's schema
    ]
    out = decode(avro_spec(), values)
    assert {i: s for i, (s, _) in bad(out).items()} == {
        1: "decode",
        2: "decode",
        3: "decode",
        4: "decode",
        5: "decode",
    }
    assert "magic byte 1" in bad(out)[1][1]
    got = rows(out)
    assert got[0] == {**RECORD, "tags": [("a", 1)], "_rescued": None}
    assert got[6]["id"] == 8 and got[6]["name"] is None


class _Registry(BaseHTTPRequestHandler):
    """A stand-in for the Confluent schema registry's REST endpoint GET /schemas/ids/{id}."""

    schemas: dict[int, str] = {}
    requests: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).requests.append(self.path)
        schema_id = int(self.path.rsplit("/", 1)[-1]) if "/schemas/ids/" in self.path else -1
        if schema_id == 500:  # a registry failing: not a "not found"
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b'{"error_code": 50001, "message": "Error in the backend data store"}')
            return
        if schema_id not in self.schemas:
            self.send_response(404)
            self.end_headers()
            self.wfile.write(b'{"error_code": 40403, "message": "Schema not found"}')
            return
        body = json.dumps({"schema": self.schemas[schema_id]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def registry() -> Iterator[str]:
    """A stand-in for a Confluent-compatible registry: a stdlib http.server serving
    GET /schemas/ids/{id} as the Confluent REST API does (no real registry is installable here)."""
    _Registry.schemas = {1: json.dumps(AVRO_SCHEMA), 2: json.dumps(WRITER_V2)}
    _Registry.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{time.monotonic_ns()}"  # a fresh cache key
    finally:
        server.shutdown()
        server.server_close()


def test_avro_with_a_registry_reads_each_record_with_its_writer_schema(registry: str) -> None:
    """Against the http.server stand-in for the registry's REST endpoint (fixture ``registry``)."""
    _Registry.requests.clear()
    v2 = {**RECORD, "id": 2, "channel": "web"}
    values: list[bytes | None] = [
        wire(RECORD),
        wire(v2, WRITER_V2, 2),
        wire(RECORD, schema_id=5),
        wire(RECORD),
    ]
    out = decode(avro_spec("rescue", registry), values)
    got = rows(out)
    assert got[0]["_rescued"] is None and got[3]["id"] == 7
    assert got[1]["id"] == 2 and got[1]["_rescued"] == '{"channel":"web"}'
    assert bad(out)[2][0] == "decode" and "schema id 5 is not in the schema registry" in bad(out)[2][1]
    out = decode(avro_spec("add_columns", registry), values)
    assert (
        out.new_columns == ("channel",)
        and rows(out)[1]["channel"] == "web"
        and rows(out)[0]["channel"] is None
    )
    with pytest.raises(SchemaDriftError) as caught:
        decode_values(avro_spec("fail", registry), pa.array(values, pa.binary()))
    assert caught.value.params == {"field": "channel", "index": 1}
    assert sorted(p.rsplit("/", 1)[-1] for p in _Registry.requests) == ["1", "2", "5"], (
        "once per id and process"
    )


WRITER_CLASH = {
    **AVRO_SCHEMA,
    "fields": [*AVRO_SCHEMA["fields"], {"name": "topic", "type": "string"}, {"name": "ID", "type": "long"}],  # type: ignore[list-item]
}


def test_add_columns_rescues_avro_fields_that_cannot_be_columns(registry: str) -> None:
    _Registry.schemas[3] = json.dumps(WRITER_CLASH)
    out = decode(
        avro_spec("add_columns", registry),
        [wire({**RECORD, "topic": "mine", "ID": 8}, WRITER_CLASH, 3), wire(RECORD)],
    )
    assert out.new_columns == ("_rescued",)
    got = rows(out)
    assert got[0]["id"] == 7 and json.loads(got[0]["_rescued"]) == {"topic": "mine", "ID": 8}
    assert got[1]["_rescued"] is None


def test_a_registry_failure_names_the_schema_id_and_the_records_offset(registry: str) -> None:
    """Issue 36: a registry's HTTP 500 failed the range naming neither the schema id nor the record.
    It is retried (not a bad record), and the error names both; the URL's credentials are hidden."""
    from splitkeeper.core.source import RegionReader, SourceRecord
    from splitkeeper.core.types import Split
    from splitkeeper.errors import SchemaRegistryError
    from splitkeeper.spark.task import RecordPolicy, SplitReadError, run_region_task

    values = [wire(RECORD), wire(RECORD, schema_id=500)]
    with pytest.raises(SchemaRegistryError) as caught:
        decode_values(avro_spec("rescue", registry), pa.array(values, pa.binary()))
    assert caught.value.params == {"schema_id": 500, "index": 1}
    assert "schema id 500" in str(caught.value) and "HTTP Error 500" in str(caught.value)
    secret_url = registry.replace("http://", "http://user:hunter2@") + "-creds"
    with pytest.raises(SchemaRegistryError) as hidden:  # whatever fails, a URL's password is not shown
        decode_values(avro_spec("rescue", secret_url), pa.array(values[1:], pa.binary()))
    assert "hunter2" not in str(hidden.value) and "http://***@127.0.0.1" in str(hidden.value)

    class Records(RegionReader):
        def read_range(self, split: Split, start: int, end: int) -> Iterator[SourceRecord]:
            return iter([SourceRecord(40, 41, values[0]), SourceRecord(41, 42, values[1])])

    with pytest.raises(SplitReadError) as failed:
        run_region_task(
            [(Split("orders-0"), 40, 42)],
            Records(),
            identity,
            "/nonexistent/never-written",
            1,
            0,
            policy=RecordPolicy(decode=avro_spec("rescue", registry), tolerance="all", max_bad_ratio=1.0),
        )
    assert 'split "orders-0" at offset 41: SchemaRegistryError: [SCHEMA_REGISTRY]' in str(failed.value)
    assert "schema id 500" in str(failed.value)


# --------------------------------------------------------------------------- text


def test_text_with_invalid_utf8_is_a_bad_record_not_a_replacement() -> None:
    out = decode_values(DecodeSpec(kind="text"), pa.array([b"ok", b"\xff\xfe", None, b""], pa.binary()))
    assert out.table.column("value").to_pylist() == ["ok", None, ""]
    assert out.kept.to_pylist() == [0, 2, 3] and out.bad.indices == [1] and out.bad.stages == ["decode"]


def test_nested_dates_and_structs_in_json() -> None:
    columns = parse_ddl("id BIGINT, s STRUCT<d: DATE, xs: ARRAY<DATE>>")
    out = decode(
        json_spec("fail", columns),
        [b'{"id": 1, "s": {"d": "2024-01-02", "xs": ["2024-01-03"]}}', b'{"id": 2, "s": {"d": "nope"}}'],
    )
    assert rows(out)[0]["s"] == {"d": dt.date(2024, 1, 2), "xs": [dt.date(2024, 1, 3)]}
    assert bad(out)[1][0] == "schema" and "expected STRUCT<d: DATE" in bad(out)[1][1]


def test_not_null_fields_inside_structs_and_arrays() -> None:
    columns = parse_ddl(
        "id INT NOT NULL, s STRUCT<a: INT NOT NULL, t: STRUCT<b: INT NOT NULL>>, "
        "xs ARRAY<STRUCT<c: INT NOT NULL, d: DATE NOT NULL>>"
    )
    values: list[bytes | None] = [
        b'{"id": 1, "s": {}}',
        b'{"id": 2, "s": {"a": 3}}',  # t is nullable: absent is fine
        b'{"id": 3}',  # s absent: its NOT NULL fields do not apply
        b'{"id": 4, "s": {"a": 1, "t": {}}}',
        b'{"id": 5, "xs": [{"c": 1, "d": "2024-01-01"}, {"c": 2}]}',
        b'{"id": 6, "xs": [{"c": 1, "d": "2024-01-01"}]}',
    ]
    out = decode(json_spec("rescue", columns), values)
    assert {i: m for i, (_, m) in bad(out).items()} == {
        0: "field 's.a' is NOT NULL but the record has no value",
        3: "field 's.t.b' is NOT NULL but the record has no value",
        4: "field 'xs[].d' is NOT NULL but the record has no value",
    }
    from splitkeeper.records.ddl import arrow_schema

    assert out.table.drop_columns(["_rescued"]).schema == arrow_schema(columns)
    out.table.validate(full=True)
    got = rows(out)
    assert got[1]["s"] == {"a": 3, "t": None} and got[2]["s"] is None
    assert got[5]["xs"] == [{"c": 1, "d": dt.date(2024, 1, 1)}]
