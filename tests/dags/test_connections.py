"""Airflow connections reaching the real services: the S3 state on versitygw with the credentials
of an ``aws`` connection (the Amazon provider's ``AwsBaseHook``), the Kafka broker from a ``kafka``
connection (the Kafka provider's type), and the schema registry from splitkeeper's own
``splitkeeper_schema_registry`` connection. The connections are defined the way a deployment
defines them (``AIRFLOW_CONN_<ID>`` in the JSON form) and read by Airflow itself; the hook calls
are the ones a task makes (``SplitkeeperHook.open``, the new-data trigger's ``look``)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.records.test_decode import AVRO_SCHEMA, RECORD, wire
from tests.records.test_registry import _Guarded, _serve

pytestmark = [pytest.mark.airflow]

AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL")


def _connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


@pytest.fixture
def store(tmp_path: Path, versitygw: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """versitygw (no faults) with no AWS_* variable in this process: only a connection reaches it."""
    from splitkeeper_tools.chaos.store import ChaosStore

    for name in (*AWS_VARIABLES, "AWS_REGION", "AWS_DEFAULT_REGION", "SPLITKEEPER_S3A_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    s3 = ChaosStore(tmp_path / "store", seed=1, fault_rate=0.0, prefix=f"conn-{uuid.uuid4().hex[:6]}")
    s3.start()
    try:
        yield s3
    finally:
        s3.stop()


def _aws_connection(monkeypatch: pytest.MonkeyPatch, s3: Any, conn_id: str = "aws_store") -> None:
    _connection(
        monkeypatch,
        conn_id,
        conn_type="aws",
        login=s3.access_key,
        password=s3.secret_key,
        extra={"endpoint_url": s3.endpoint, "region_name": "us-east-1"},
    )


def test_the_state_on_s3_is_reached_with_an_aws_connections_credentials(
    tmp_path: Path, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake import DeltaTable, write_deltalake

    from splitkeeper.airflow.hooks import SplitkeeperHook
    from splitkeeper.delta.probe import probe_store
    from splitkeeper.delta.storage import storage_options, table_uri

    _aws_connection(monkeypatch, store)
    state, sink = store.location("state"), store.location("sink")
    path = tmp_path / "orders.yaml"
    path.write_text(
        json.dumps(
            {
                "name": "orders",
                "source": {"kind": "files", "path": str(tmp_path / "in")},
                "state": {"path": state, "connection": "aws_store"},
                "sink": {"path": sink, "connection": "aws_store"},
                "staging": {"path": str(tmp_path / "staging")},
            }
        ),
        encoding="utf-8",
    )
    hook = SplitkeeperHook(str(path))
    config = hook.load_config()
    env = hook.environment(config)  # through AwsBaseHook: its credentials, the extra's endpoint and region
    assert env == {
        "AWS_ACCESS_KEY_ID": store.access_key,
        "AWS_SECRET_ACCESS_KEY": store.secret_key,
        "AWS_ENDPOINT_URL": store.endpoint,
        "AWS_REGION": "us-east-1",
    }
    assert "AWS_ACCESS_KEY_ID" not in os.environ
    config = hook.open()  # what a task does first
    assert probe_store(config.state.path) is True  # signed conditional puts on the real store
    uri = table_uri(config.state.path + "/from-connection")
    write_deltalake(uri, pa.table({"x": [1, 2]}), storage_options=storage_options(uri))
    assert DeltaTable(uri, storage_options=storage_options(uri)).to_pyarrow_table().column(
        "x"
    ).to_pylist() == [1, 2]

    # the new-data trigger's look restores the (empty) state on S3 through the same connection
    from splitkeeper.airflow.triggers import look

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("one\ntwo\n", encoding="utf-8")
    event = look(str(path))
    assert event["pending"] and event["split_count"] == 1 and event["checkpoint_id"] is None

    # a wrong secret: the store refuses, naming no secret
    _connection(
        monkeypatch,
        "aws_store",
        conn_type="aws",
        login=store.access_key,
        password="wrong-secret-0123456789",
        extra={"endpoint_url": store.endpoint, "region_name": "us-east-1"},
    )
    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    SplitkeeperHook(str(path)).open()
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == "wrong-secret-0123456789"
    with pytest.raises(Exception) as refused:  # noqa: B017 - delta-rs's error for the store's 403
        DeltaTable(uri, storage_options=storage_options(uri))
    assert "wrong-secret" not in str(refused.value)


def test_a_files_source_names_the_aws_connection_of_its_object_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from splitkeeper.airflow.hooks import SplitkeeperHook

    _connection(
        monkeypatch,
        "aws_drops",
        conn_type="aws",
        login="drop-key",
        password="drop-secret",
        extra={"service_config": {"s3": {"endpoint_url": "http://drops:7070"}}, "region_name": "eu-west-1"},
    )
    path = tmp_path / "orders.yaml"
    path.write_text(
        json.dumps(
            {
                "name": "orders",
                "source": {"kind": "files", "path": "in", "connection": "aws_drops"},
                "state": {"path": "state"},
                "sink": {"path": "sink"},
            }
        ),
        encoding="utf-8",
    )
    hook = SplitkeeperHook(str(path))
    config = hook.load_config()
    assert config.store_connections == ("aws_drops",)
    assert hook.environment(config) == {
        "AWS_ACCESS_KEY_ID": "drop-key",
        "AWS_SECRET_ACCESS_KEY": "drop-secret",
        "AWS_ENDPOINT_URL": "http://drops:7070",
        "AWS_REGION": "eu-west-1",
    }


def test_without_the_amazon_provider_an_aws_connection_names_the_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from splitkeeper.airflow.hooks import SplitkeeperHook
    from splitkeeper.errors import EnvironmentNotReadyError

    monkeypatch.setitem(sys.modules, "airflow.providers.amazon.aws.hooks.base_aws", None)  # not importable
    _connection(monkeypatch, "aws_store", conn_type="aws", login="a", password="b")
    with pytest.raises(EnvironmentNotReadyError) as err:
        SplitkeeperHook().store_environment("aws_store")
    assert 'pip install "splitkeeper[aws]"' in str(err.value) and "'aws_store'" in str(err.value)


@pytest.mark.kafka
def test_the_broker_from_a_kafka_connection(
    tmp_path: Path, kafka_broker: Any, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Kafka provider's connection (its extra the librdkafka config) gives the brokers: the
    provider's own hook reaches them, and so does the trigger's look (Kafka's end offsets, the
    state on versitygw from the aws connection)."""
    from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook

    from splitkeeper.airflow.triggers import look
    from tests.runtime.test_kafka_broker import _create_topic, _produce

    topic = f"conn-{uuid.uuid4().hex[:8]}"
    _create_topic(kafka_broker.bootstrap_servers, topic, 3)
    _produce(kafka_broker.bootstrap_servers, topic, 60)  # keyed 0..59: every partition gets some
    _connection(
        monkeypatch,
        "kafka_orders",
        conn_type="kafka",
        extra={"bootstrap.servers": kafka_broker.bootstrap_servers, "group.id": "from-connection"},
    )
    _aws_connection(monkeypatch, store)
    assert KafkaBaseHook("kafka_orders").test_connection()[0] is True  # the provider reads the same
    path = tmp_path / "orders.yaml"
    path.write_text(
        json.dumps(
            {
                "name": "orders",
                "source": {"kind": "kafka", "topics": [topic], "connection": "kafka_orders"},
                "state": {"path": store.location("state"), "connection": "aws_store"},
                "sink": {"path": store.location("sink"), "connection": "aws_store"},
                "staging": {"path": str(tmp_path / "staging")},
            }
        ),
        encoding="utf-8",
    )
    event = look(str(path))
    assert event["pending"] and event["split_count"] == 3, event


@pytest.fixture
def registry() -> Iterator[str]:
    _Guarded.schemas = {1: json.dumps(AVRO_SCHEMA)}
    _Guarded.requests, _Guarded.seen = [], []
    _Guarded.expected = "Basic " + base64.b64encode(b"ingest:registry-s3cret").decode()
    server, url = _serve()
    try:
        yield url
    finally:
        _Guarded.expected = None
        server.shutdown()
        server.server_close()


def test_the_schema_registry_from_its_connection(
    tmp_path: Path, registry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from splitkeeper.airflow import get_provider_info
    from splitkeeper.airflow.hooks import SchemaRegistryHook, SplitkeeperHook
    from splitkeeper.config.settings import load_config
    from splitkeeper.errors import ConfigError
    from splitkeeper.records.decode import decode_values

    types = {t["connection-type"]: t["hook-class-name"] for t in get_provider_info()["connection-types"]}
    assert types == {"splitkeeper_schema_registry": "splitkeeper.airflow.hooks.SchemaRegistryHook"}
    assert SchemaRegistryHook.conn_type == "splitkeeper_schema_registry"
    _connection(
        monkeypatch,
        "registry_default",
        conn_type="splitkeeper_schema_registry",
        host=registry,
        login="ingest",
        password="registry-s3cret",
    )
    hook = SchemaRegistryHook("registry_default")
    assert hook.registry_settings() == {"url": registry, "user": "ingest", "password": "registry-s3cret"}
    assert hook.test_connection()[0] is True  # the library's client, with the basic auth

    (tmp_path / "orders.avsc").write_text(json.dumps(AVRO_SCHEMA), encoding="utf-8")
    path = tmp_path / "orders.yaml"
    path.write_text(
        json.dumps(
            {
                "name": "orders",
                "source": {"kind": "files", "path": str(tmp_path / "in")},
                "state": {"path": str(tmp_path / "state")},
                "sink": {"path": str(tmp_path / "sink")},
                "decode": {
                    "kind": "avro",
                    "schema_file": "orders.avsc",
                    "registry": {"connection": "registry_default"},
                },
                "errors": {"tolerance": "all", "dead_letter": {"path": str(tmp_path / "dead")}},
            }
        ),
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match="only inside Airflow"):  # the file alone has no URL
        load_config(path)
    sk = SplitkeeperHook(str(path))
    config = sk.load_config()
    assert config.decode.schema_registry_url == registry
    assert "registry-s3cret" not in json.dumps(config.to_dict())
    out = decode_values(config.decode, pa.array([wire(RECORD), wire(RECORD, schema_id=9)], pa.binary()))
    assert out.table.column("id").to_pylist() == [7] and "schema id 9" in out.bad.messages[0]
    assert set(_Guarded.seen) == {_Guarded.expected}

    # a job spark-submit starts outside Airflow gets the registry's settings through its environment
    job_env = sk.job_environment(config)
    outside = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
    read = (
        "import sys; from splitkeeper.config.settings import load_config\n"
        "c = load_config(sys.argv[1]).decode\n"
        "print(c.schema_registry_url, c.registry.as_dict()['basic.auth.user.info'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", read, str(path)], env={**outside, **job_env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [registry, "ingest:registry-s3cret"]
