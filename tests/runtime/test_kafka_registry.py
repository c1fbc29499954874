"""decode.kind avro with a schema registry on the real broker and Spark: the region tasks read each
record through ``confluent_kafka.schema_registry`` (basic auth to the registry stand-in of
tests/records/test_registry.py) and every produced offset lands once, in the sink or as a dead
letter with the reason of its stage."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.app.pipeline import Pipeline
from splitkeeper.sources.kafka.source import split_id_of
from splitkeeper_tools.kafka_broker import KafkaBroker
from tests.records.test_decode import wire
from tests.records.test_registry import _Guarded, _serve

from .test_kafka_pipeline import kafka_config, offsets_accounted, produce_by_partition, run_until_caught_up
from .test_kafka_source import create_topic

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

# no MAP column: a staged file's MAP type reads back with its entries named after the column and
# the sink refuses it as a changed type (a sink matter of every typed kind, reported apart)
AVRO_SCHEMA = {
    "type": "record",
    "name": "order",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"]}],
}
WRITER_V2 = {**AVRO_SCHEMA, "fields": [*AVRO_SCHEMA["fields"], {"name": "channel", "type": "string"}]}
RECORD = {"id": 7, "name": "x"}


def test_avro_through_the_registry_accounts_every_offset_once(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    from splitkeeper.sinks.delta.read import read_dead_letters, read_sink

    _Guarded.schemas = {1: json.dumps(AVRO_SCHEMA), 2: json.dumps(WRITER_V2)}
    _Guarded.requests, _Guarded.seen = [], []
    auth = _Guarded.expected = "Basic " + base64.b64encode(b"ingest:pw-registry").decode()
    server, url = _serve()
    try:
        bootstrap = kafka_broker.bootstrap_servers
        topic = create_topic(bootstrap, 2)
        good, v2 = wire(RECORD, AVRO_SCHEMA), wire({**RECORD, "id": 8, "channel": "web"}, WRITER_V2, 2)
        kinds: list[tuple[str, bytes | None]] = [
            ("good", good),
            ("good", v2),
            ("UnknownSchemaId", wire(RECORD, AVRO_SCHEMA, 77)),
            ("AvroDecodeError", b'{"id": 7}'),  # not the wire format
            ("AvroDecodeError", good[:-1]),  # a truncated body
            ("EmptyValue", None),
        ]
        values = [(what, value, None) for what, value in (kinds[(i // 2) % len(kinds)] for i in range(60))]
        produced, counts = produce_by_partition(bootstrap, topic, values, 2)
        (tmp_path / "orders.avsc").write_text(json.dumps(AVRO_SCHEMA), encoding="utf-8")
        config = kafka_config(
            tmp_path,
            bootstrap,
            epoch_records=40,
            parallelism=2,
            topics=[topic],
            sections={
                "decode": {
                    "kind": "avro",
                    "schema_file": str(tmp_path / "orders.avsc"),
                    "registry": {"url": url, "user": "ingest", "password": "pw-registry"},
                },
                "errors": {
                    "tolerance": "all",
                    "dead_letter": {"path": str(tmp_path / "dead")},
                    "max_bad_ratio": 1.0,
                },
            },
        )
        pipeline = Pipeline(config, spark)
        try:
            pipeline.open()
            run_until_caught_up(pipeline, {split_id_of(topic, p): n for p, n in counts.items()})
        finally:
            pipeline.close()
    finally:
        _Guarded.expected = None
        server.shutdown()
        server.server_close()

    partition_of = {split_id_of(topic, p): p for p in counts}
    sink = read_sink(config.sink.path, ["partition", "offset", "id", "_rescued"]).to_pylist()
    dead = read_dead_letters(
        str(tmp_path / "dead"), ["split_id", "offset", "error_class", "error_message"]
    ).to_pylist()
    seen = offsets_accounted(sink, dead, partition_of)
    assert set(seen) == set(produced) and set(seen.values()) == {1}, "an offset is missing or twice"
    assert {produced[(r["partition"], r["offset"])] for r in sink} == {"good"} and len(sink) == 20
    assert {r["id"] for r in sink} == {7, 8}
    assert {r["_rescued"] for r in sink if r["id"] == 8} == {'{"channel":"web"}'}
    for r in dead:
        assert r["error_class"] == produced[(partition_of[r["split_id"]], r["offset"])], r
    assert any("schema id 77 is not in the schema registry" in r["error_message"] for r in dead)
    assert _Guarded.seen and set(_Guarded.seen) == {auth}  # the region tasks' requests, authenticated
