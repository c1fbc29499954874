"""A Kafka cluster behind SASL: ``source.client`` reaches the connector, every reader and the committer.

The project's broker gets a second listener, SASL_PLAINTEXT with the PLAIN mechanism, on
loopback. A pipeline that authenticates reads a topic exactly once and commits the consumer
group's offsets through it; one with a wrong password fails with an error that says so, and the
password appears in no error, log record or output.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from splitkeeper.app import services
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.errors import SplitkeeperError
from splitkeeper.sources.kafka.source import split_id_of
from splitkeeper_tools.kafka_broker import KafkaBroker

from .helpers import sink_rows
from .test_kafka_source import create_topic, produce, unique

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

PASSWORD = "alice-pw-7f3k2q"


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka-sasl"), sasl_users={"alice": PASSWORD})
    broker.start(timeout_s=120)
    try:
        yield broker
    finally:
        broker.stop()


def _config(root: Path, broker: KafkaBroker, topic: str, password: str, group: str) -> Any:
    return config_from_mapping(
        {
            "name": unique("sasl"),
            "parallelism": 2,
            "source": {
                "kind": "kafka",
                "bootstrap_servers": broker.sasl_bootstrap_servers,
                "topics": [topic],
                "group_id": group,
                "connect_timeout_s": 10,
                "client": {
                    "security.protocol": "SASL_PLAINTEXT",
                    "sasl.mechanism": "PLAIN",
                    "sasl.username": "alice",
                    "sasl.password": password,
                },
            },
            "state": {"path": str(root / "state")},
            "sink": {"path": str(root / "sink")},
        }
    )


def test_a_pipeline_reads_through_a_sasl_listener_and_never_prints_the_password(
    spark: Any, sasl_broker: KafkaBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: Any
) -> None:
    plain = sasl_broker.bootstrap_servers
    topic = create_topic(plain, 2, name=unique("secured"))
    produce(plain, topic, {0: [f"a{i}" for i in range(7)], 1: [f"b{i}" for i in range(4)]})
    group = unique("group")
    caplog.set_level(logging.DEBUG)

    result = services.run(_config(tmp_path / "ok", sasl_broker, topic, PASSWORD, group), until_caught_up=True)

    assert result.caught_up
    rows = sink_rows(tmp_path / "ok" / "sink")
    assert sorted((r.split_id, r.offset, r.value) for r in rows) == sorted(
        [(split_id_of(topic, 0), i, f"a{i}".encode()) for i in range(7)]
        + [(split_id_of(topic, 1), i, f"b{i}".encode()) for i in range(4)]
    )
    consumer = Consumer({"bootstrap.servers": plain, "group.id": group})  # offsets through SASL, read back
    try:
        committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    finally:
        consumer.close()
    assert [tp.offset for tp in committed] == [7, 4]

    with pytest.raises(SplitkeeperError) as err:
        services.run(_config(tmp_path / "bad", sasl_broker, topic, "not-" + PASSWORD, unique("g")))
    assert "auth" in str(err.value).lower()
    seen = str(err.value) + caplog.text + "".join(capsys.readouterr())
    assert PASSWORD not in seen
