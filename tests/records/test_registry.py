"""decode.kind avro with a schema registry through ``confluent_kafka.schema_registry``: the
``decode.registry`` keys (basic auth, bearer token, TLS with a client certificate) reach the
library's client, a reader schema resolves each writer schema, and every failure is either a bad
record with its reason or an error naming the registry.

The registry is a stand-in (a stdlib HTTP(S) server answering ``GET /schemas/ids/{id}`` as the
Confluent REST API does, checking the ``Authorization`` header, and the client certificate over
TLS): no Confluent-compatible registry starts here (Apicurio Registry 3 is a Quarkus application
whose Maven Central jar is not runnable on its own).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from splitkeeper.errors import ConfigError, SchemaRegistryError
from splitkeeper.records.decode import decode_values
from splitkeeper.records.spec import DecodeSpec
from tests.records.test_decode import (
    AVRO_SCHEMA,
    FAST_RETRIES,
    RECORD,
    WRITER_V2,
    _Registry,
    bad,
    decode,
    rows,
    wire,
)


class _Guarded(_Registry):
    """The stand-in registry, answering only a request with ``expected`` as its Authorization."""

    expected: str | None = None
    seen: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).seen.append(self.headers.get("Authorization"))
        if self.expected is not None and self.headers.get("Authorization") != self.expected:
            self.send_response(401)
            self.end_headers()
            self.wfile.write(b'{"error_code": 40101, "message": "Unauthorized"}')
            return
        if self.path.split("?")[0].endswith("/subjects"):  # what a connection test lists
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.end_headers()
            self.wfile.write(b'["orders-value"]')
            return
        super().do_GET()


def _serve(context: ssl.SSLContext | None = None) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Guarded)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    scheme = "https" if context is not None else "http"
    # a fresh path per server: the decode caches unknown schema ids per registry URL
    return server, f"{scheme}://127.0.0.1:{server.server_address[1]}/{time.monotonic_ns()}"


@pytest.fixture
def guarded() -> Iterator[str]:
    _Guarded.schemas = {1: json.dumps(AVRO_SCHEMA), 2: json.dumps(WRITER_V2)}
    _Guarded.requests, _Guarded.seen, _Guarded.expected = [], [], None
    server, url = _serve()
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()


def _pipeline(tmp_path: Path, registry: dict[str, Any], **decode_keys: Any) -> Path:
    (tmp_path / "orders.avsc").write_text(json.dumps(AVRO_SCHEMA), encoding="utf-8")
    decode_section = {"kind": "avro", "registry": registry, **decode_keys}
    if "reader_schema_file" not in decode_keys:
        decode_section["schema_file"] = "orders.avsc"
    data = {
        "name": "orders",
        "source": {"kind": "files", "path": str(tmp_path / "in")},
        "state": {"path": str(tmp_path / "state")},
        "sink": {"path": str(tmp_path / "sink")},
        "decode": decode_section,
        "errors": {"tolerance": "all", "dead_letter": {"path": str(tmp_path / "dead")}},
    }
    path = tmp_path / "orders.yaml"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _spec(path: Path) -> DecodeSpec:
    from splitkeeper.config.settings import load_config

    spec = load_config(path).decode
    # the tests' short retries of a 5xx or a refused connection, beside the file's settings
    return DecodeSpec(
        **{**_fields(spec), "registry": type(spec.registry)(spec.registry.items + FAST_RETRIES.items)}
    )


def _fields(spec: DecodeSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in DecodeSpec.__slots__}  # type: ignore[attr-defined]


def test_basic_auth_from_the_decode_section_reaches_the_registry(tmp_path: Path, guarded: str) -> None:
    _Guarded.expected = "Basic " + base64.b64encode(b"ingest:s3cret-registry").decode()
    path = _pipeline(tmp_path, {"url": guarded, "user": "ingest", "password": "${REGISTRY_PASSWORD}"})
    import os

    os.environ["REGISTRY_PASSWORD"] = "s3cret-registry"
    try:
        from splitkeeper.config.settings import load_config

        config = load_config(path)
        spec = _spec(path)
    finally:
        del os.environ["REGISTRY_PASSWORD"]
    assert spec.registry.as_dict()["basic.auth.user.info"] == "ingest:s3cret-registry"
    assert "s3cret-registry" not in repr(spec) and "s3cret-registry" not in json.dumps(config.to_dict())
    out = decode(spec, [wire(RECORD), wire(RECORD, schema_id=5)])
    assert rows(out)[0]["id"] == 7
    assert bad(out)[1][0] == "decode" and "schema id 5 is not in the schema registry" in bad(out)[1][1]
    assert set(_Guarded.seen) == {_Guarded.expected}

    # a wrong password is no bad record: the range fails naming the registry, and is read again
    wrong = DecodeSpec(**{**_fields(spec), "registry": FAST_RETRIES})
    with pytest.raises(SchemaRegistryError) as err:
        decode_values(wrong, pa.array([wire(RECORD, schema_id=2)], pa.binary()))
    assert "HTTP Error 401" in str(err.value) and guarded.split("//")[1] in str(err.value)
    assert err.value.params == {"schema_id": 2, "index": 0}


def test_a_bearer_token_is_sent_as_the_authorization(tmp_path: Path, guarded: str) -> None:
    _Guarded.expected = "Bearer tok-123"
    spec = _spec(_pipeline(tmp_path, {"url": guarded, "bearer_token": "tok-123"}))
    assert rows(decode(spec, [wire(RECORD)]))[0]["id"] == 7


@pytest.mark.parametrize(
    ("registry", "key", "words"),
    [
        ({"url": "http://r:8081", "user": "u"}, "decode.registry.password", "both"),
        (
            {"url": "http://r:8081", "user": "u", "password": "p", "bearer_token": "t"},
            "decode.registry.bearer_token",
            "one of",
        ),
        ({"connection": "registry_default"}, "decode.registry.url", "only inside Airflow"),
        (
            {"url": "http://r:8081", "ssl_key_location": "k.pem"},
            "decode.registry.ssl_certificate_location",
            "client",
        ),
        ({"url": "ftp://r"}, "decode.registry.url", "ftp://r"),
    ],
)
def test_decode_registry_mistakes_are_refused_when_the_file_loads(
    tmp_path: Path, registry: dict[str, Any], key: str, words: str
) -> None:
    from splitkeeper.config.settings import load_config

    with pytest.raises(ConfigError) as err:
        load_config(_pipeline(tmp_path, registry))
    assert key in str(err.value) and words in str(err.value)
    assert "'p'" not in str(err.value) and "'t'" not in str(err.value)


def test_both_url_keys_and_a_reader_schema_without_a_registry_are_refused(tmp_path: Path) -> None:
    from splitkeeper.config.settings import load_config

    with pytest.raises(ConfigError, match="decode.registry.url"):
        load_config(_pipeline(tmp_path, {"url": "http://r:8081"}, schema_registry_url="http://r:8081"))
    path = _pipeline(tmp_path, {"url": "http://r:8081"})
    data = json.loads(path.read_text())
    del data["decode"]["registry"]
    data["decode"]["reader_schema_file"] = "orders.avsc"
    data["decode"].pop("schema_file")
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="decode.reader_schema_file"):
        load_config(path)


READER = {
    **AVRO_SCHEMA,
    "fields": [
        *AVRO_SCHEMA["fields"],  # type: ignore[list-item]
        {"name": "country", "type": "string", "default": "eu"},
    ],
}


def test_a_reader_schema_resolves_every_writer_schema(tmp_path: Path, guarded: str) -> None:
    """Avro schema resolution: a field the writer lacks gets the reader's default, a field the
    reader lacks is dropped (nothing rescued), a writer that cannot be resolved is a bad record."""
    _Guarded.schemas[3] = json.dumps({**AVRO_SCHEMA, "fields": [{"name": "id", "type": "string"}]})
    (tmp_path / "reader.avsc").write_text(json.dumps(READER), encoding="utf-8")
    spec = _spec(_pipeline(tmp_path, {"url": guarded}, reader_schema_file="reader.avsc"))
    assert [c.name for c in spec.columns][-1] == "country" and spec.avro_schema is None
    v2 = {**RECORD, "id": 2, "channel": "web"}
    out = decode(spec, [wire(RECORD), wire(v2, WRITER_V2, 2), wire({"id": "x"}, _Guarded_schema(3), 3)])
    got = rows(out)
    assert got[0]["country"] == "eu" and got[0]["id"] == 7 and got[0]["_rescued"] is None
    assert got[1]["id"] == 2 and got[1]["country"] == "eu" and got[1]["_rescued"] is None
    assert bad(out)[2][0] == "decode" and "schema id 3" in bad(out)[2][1]


def _Guarded_schema(schema_id: int) -> dict[str, Any]:  # noqa: N802
    return dict(json.loads(_Guarded.schemas[schema_id]))


def test_an_unreachable_registry_fails_the_range_naming_its_url() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/nothing-{time.monotonic_ns()}"
    spec = DecodeSpec(
        kind="avro",
        columns=decode_spec_columns(),
        schema_registry_url=url,
        registry=FAST_RETRIES,
    )
    with pytest.raises(SchemaRegistryError) as err:
        decode_values(spec, pa.array([b"not avro", wire(RECORD)], pa.binary()))
    assert f"127.0.0.1:{port}" in str(err.value) and "no answer: ConnectError" in str(err.value)
    assert err.value.params == {"schema_id": 1, "index": 1}


def decode_spec_columns() -> Any:
    from splitkeeper.records.ddl import avro_columns

    return avro_columns(AVRO_SCHEMA)


def test_magic_byte_one_is_a_schema_guid_and_other_bytes_are_not_the_wire_format(guarded: str) -> None:
    spec = DecodeSpec(
        kind="avro", columns=decode_spec_columns(), schema_registry_url=guarded, registry=FAST_RETRIES
    )
    good = wire(RECORD)
    out = decode(spec, [good, b"\x07" + good[1:], good[:5], b"\x01" + bytes(16) + good[5:], good + b"\x01"])
    assert set(rows(out)) == {0}
    assert "magic byte 7" in bad(out)[1][1] and "5 bytes" in bad(out)[2][1]
    assert "GUID 00000000-0000-0000-0000-000000000000" in bad(out)[3][1]  # the registry has no such GUID
    assert "1 bytes after the Avro record" in bad(out)[4][1]


# --------------------------------------------------------------------------- TLS


def _certificates(folder: Path) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)

    def issue(name: str, key: Any, issuer: Any, issuer_key: Any, *, ca: bool, san: bool) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san:
            import ipaddress

            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        return builder.sign(issuer_key, hashes.SHA256())

    def write(name: str, cert: Any, key: Any) -> None:
        (folder / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (folder / f"{name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = issue("test CA", ca_key, ca_name, ca_key, ca=True, san=False)
    write("ca", ca, ca_key)
    for name, san in (("server", True), ("client", False)):
        key = ec.generate_private_key(ec.SECP256R1())
        write(name, issue(name, key, ca_name, ca_key, ca=False, san=san), key)
    return {n: str(folder / n) for n in ("ca", "server", "client")}


def test_tls_with_a_ca_file_and_a_client_certificate(tmp_path: Path) -> None:
    files = _certificates(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=files["ca"] + ".pem")
    context.load_cert_chain(files["server"] + ".pem", files["server"] + ".key")
    context.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: the client's certificate is checked
    _Guarded.schemas = {1: json.dumps(AVRO_SCHEMA)}
    _Guarded.requests, _Guarded.seen, _Guarded.expected = [], [], None
    server, url = _serve(context)
    try:
        tls = {
            "url": url,
            "ssl_ca_location": files["ca"] + ".pem",
            "ssl_certificate_location": files["client"] + ".pem",
            "ssl_key_location": files["client"] + ".key",
        }
        spec = _spec(_pipeline(tmp_path, tls))
        assert spec.registry.as_dict()["ssl.ca.location"] == files["ca"] + ".pem"
        assert rows(decode(spec, [wire(RECORD)]))[0]["id"] == 7

        # without the CA the server's certificate is not trusted: an error naming the registry
        untrusted = {k: v for k, v in tls.items() if k != "ssl_ca_location"}
        spec = _spec(_pipeline(tmp_path, {**untrusted, "url": url + "-untrusted"}))
        with pytest.raises(SchemaRegistryError) as err:
            decode_values(spec, pa.array([wire(RECORD)], pa.binary()))
        assert "CERTIFICATE_VERIFY_FAILED" in str(err.value) and "127.0.0.1" in str(err.value)

        # a client key file that does not exist: the client cannot be set up, named
        missing = {**tls, "url": url + "-nokey", "ssl_key_location": str(tmp_path / "none.key")}
        spec = _spec(_pipeline(tmp_path, missing))
        with pytest.raises(SchemaRegistryError, match="cannot be set up"):
            decode_values(spec, pa.array([wire(RECORD)], pa.binary()))
    finally:
        server.shutdown()
        server.server_close()


# --------------------------------------------------------------------------- JSON Schema


ORDER_JSON_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "order",
    "type": "object",
    "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
    "required": ["id"],
}


def json_wire(record: Any, schema_id: int = 11) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + json.dumps(record).encode()


def test_json_schema_records_are_checked_by_their_registry_schema_then_typed(
    tmp_path: Path, guarded: str
) -> None:
    """decode.kind json_schema: the library's JSONDeserializer reads the wire format and checks
    each record against its writer's JSON Schema; the bodies are then typed as json is."""
    _Guarded.schemas[11] = json.dumps(ORDER_JSON_SCHEMA)
    path = _pipeline(tmp_path, {"url": guarded}, schema="id BIGINT NOT NULL, name STRING")
    data = json.loads(path.read_text())
    data["decode"]["kind"] = "json_schema"
    data["decode"].pop("schema_file")
    path.write_text(json.dumps(data))
    spec = _spec(path)
    assert spec.kind == "json_schema" and spec.schema_registry_url == guarded
    values: list[bytes | None] = [
        json_wire({"id": 1, "name": "a"}),
        json_wire({"id": "one"}),  # its schema says integer: refused by the schema
        json_wire({"id": 3, "extra": True}),  # a field the columns do not name: rescued
        json_wire({"id": 4}, schema_id=12),  # an id the registry does not know
        b'{"id": 5}',  # plain JSON, not the wire format
        b"\x00\x00\x00\x00\x0b{not json",
        None,
    ]
    out = decode(spec, values)
    got = rows(out)
    assert got[0] == {"id": 1, "name": "a", "_rescued": None}
    assert got[2]["id"] == 3 and json.loads(got[2]["_rescued"]) == {"extra": True}
    stages = {i: s for i, (s, _) in bad(out).items()}
    assert stages == {1: "schema", 3: "decode", 4: "decode", 5: "decode", 6: "decode"}
    assert "does not fit its JSON Schema" in bad(out)[1][1] and "schema id 11" in bad(out)[1][1]
    assert "schema id 12 is not in the schema registry" in bad(out)[3][1]
    assert "magic byte 123" in bad(out)[4][1] and "JSON body does not read" in bad(out)[5][1]
    assert "Kafka tombstone" in bad(out)[6][1]

    data["decode"].pop("registry")
    path.write_text(json.dumps(data))
    from splitkeeper.config.settings import load_config

    with pytest.raises(ConfigError, match="decode.registry is required"):
        load_config(path)
