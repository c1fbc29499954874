"""The local KRaft broker: lifecycle, real produce/consume, scripts/kafka.sh, Spark's connector."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from splitkeeper.errors import EnvironmentNotReadyError, InvalidParameterError, SourceError
from splitkeeper_tools.kafka_broker import (
    BrokerStatus,
    KafkaBroker,
    free_port,
    is_broker_process,
    new_cluster_id,
    read_state,
)

ROOT = Path(__file__).resolve().parents[2]


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive its futures
    futures = admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=30)
    for future in futures.values():
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    while len(admin.list_topics(topic, timeout=10).topics[topic].partitions) < partitions:
        assert time.monotonic() < deadline, f"topic {topic} has no {partitions} partitions after 30s"
        time.sleep(0.1)


def _produce(bootstrap: str, topic: str, count: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, key=str(i).encode(), value=f"message-{i}".encode())
    assert producer.flush(30) == 0


def _consume_all(
    bootstrap: str, topic: str, expected: int, timeout_s: float = 60
) -> list[tuple[int | None, int | None, bytes | None]]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen: list[tuple[int | None, int | None, bytes | None]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(seen) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=1.0):
                assert msg.error() is None, msg.error()
                seen.append((msg.partition(), msg.offset(), msg.value()))
        # Nothing beyond what was produced arrives.
        seen.extend(
            (m.partition(), m.offset(), m.value()) for m in consumer.consume(num_messages=10, timeout=1.0)
        )
    finally:
        consumer.close()
    return seen


@pytest.mark.kafka
def test_broker_starts_serves_1000_messages_on_4_partitions_and_stops(tmp_path):
    broker = KafkaBroker(tmp_path / "kafka")
    with broker:
        pid = broker.pid
        assert pid is not None and is_broker_process(pid)
        assert broker.status() is BrokerStatus.RUNNING
        state = read_state(tmp_path / "kafka")
        assert state is not None and state.pid == pid
        assert broker.bootstrap_servers == f"127.0.0.1:{state.port}"

        _create_topic(broker.bootstrap_servers, "orders", partitions=4)
        _produce(broker.bootstrap_servers, "orders", 1000)
        seen = _consume_all(broker.bootstrap_servers, "orders", expected=1000)

        assert len(seen) == 1000
        assert sorted(int((v or b"").decode().split("-")[1]) for _, _, v in seen) == list(range(1000))
        assert {p for p, _, _ in seen} == {0, 1, 2, 3}
        assert len({(p, o) for p, o, _ in seen}) == 1000  # no (partition, offset) twice

    assert not is_broker_process(pid)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert broker.status() is BrokerStatus.STOPPED
    stopped = read_state(tmp_path / "kafka")
    assert stopped is not None and stopped.pid is None
    broker.stop()  # a second stop is a no-op


@pytest.mark.kafka
def test_restart_on_same_data_dir_keeps_topics_port_and_cluster_id(tmp_path):
    data = tmp_path / "kafka"
    with KafkaBroker(data) as first:
        _create_topic(first.bootstrap_servers, "kept", partitions=2)
        _produce(first.bootstrap_servers, "kept", 10)
        before = read_state(data)
    with KafkaBroker(data) as second:
        after = read_state(data)
        assert before is not None and after is not None
        assert (after.port, after.cluster_id) == (before.port, before.cluster_id)
        assert len(_consume_all(second.bootstrap_servers, "kept", expected=10)) == 10


def test_a_cluster_id_starting_with_a_dash_formats_and_serves(tmp_path, monkeypatch):
    # Data dirs formatted before ids avoided "-" keep theirs; formatting must pass it as one token.
    import splitkeeper_tools.kafka_broker as kafka_broker_module

    monkeypatch.setattr(kafka_broker_module, "new_cluster_id", lambda: "-AbCdEfGhIjKlMnOpQrStU")
    with KafkaBroker(tmp_path / "kafka") as broker:
        state = read_state(broker.data_dir)
        assert state is not None and state.cluster_id == "-AbCdEfGhIjKlMnOpQrStU"
        _create_topic(broker.bootstrap_servers, "dash", partitions=1)
        _produce(broker.bootstrap_servers, "dash", 3)
        assert len(_consume_all(broker.bootstrap_servers, "dash", expected=3)) == 3


def test_second_broker_on_a_running_data_dir_is_refused(kafka_broker):
    other = KafkaBroker(kafka_broker.data_dir)
    with pytest.raises(SourceError, match=r"already runs from .*scripts/kafka\.sh stop"):
        other.start(timeout_s=5)
    assert is_broker_process(kafka_broker.pid)  # the running broker was not touched


@pytest.mark.kafka
def test_kafka_sh_start_status_stop_from_separate_processes(tmp_path):
    script = ROOT / "scripts" / "kafka.sh"
    port = free_port()
    env = {**os.environ, "SPLITKEEPER_KAFKA_DIR": str(tmp_path / "kdir"), "SPLITKEEPER_KAFKA_PORT": str(port)}

    def kafka_sh(action: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(script), action], env=env, capture_output=True, text=True, timeout=180
        )

    started = kafka_sh("start")
    try:
        assert started.returncode == 0, started.stderr
        assert f"bootstrap.servers=127.0.0.1:{port}" in started.stdout
        state = json.loads((tmp_path / "kdir" / "broker.json").read_text())
        assert is_broker_process(state["pid"])
        again = kafka_sh("start")
        assert again.returncode == 0 and "already running" in again.stdout
        status = kafka_sh("status")
        assert status.returncode == 0 and f"pid {state['pid']}" in status.stdout
    finally:
        stopped = kafka_sh("stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not is_broker_process(state["pid"])
    after = kafka_sh("status")
    assert after.returncode == 3 and "stopped" in after.stdout


@pytest.mark.spark
def test_a_topic_larger_than_one_admin_request_is_created_in_steps(kafka_broker, monkeypatch):
    """The KRaft controller refuses a topic of 10,000 partitions in one request (10,001 records):
    create_topics creates PARTITIONS_PER_REQUEST and grows the topic in steps of as many."""
    from confluent_kafka.admin import AdminClient

    import splitkeeper_tools.kafka_testbed as testbed

    monkeypatch.setattr(testbed, "PARTITIONS_PER_REQUEST", 2)
    topic = f"steps-{uuid.uuid4().hex[:8]}"
    testbed.create_topics(kafka_broker.bootstrap_servers, {topic: 5}, timeout_s=30)
    meta = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers}).list_topics(topic, timeout=10)
    partitions = meta.topics[topic].partitions
    assert sorted(partitions) == [0, 1, 2, 3, 4]
    assert min(p.leader for p in partitions.values()) >= 0


def test_spark_kafka_connector_reads_what_confluent_kafka_produced(spark, kafka_broker):
    # spark-sql-kafka 4.1.1 runs with kafka-clients 3.9.1 and token-provider 4.0.0 from .jars/spark.
    topic = f"spark-{uuid.uuid4().hex[:8]}"
    _create_topic(kafka_broker.bootstrap_servers, topic, partitions=4)
    _produce(kafka_broker.bootstrap_servers, topic, 200)
    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
        .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
        .collect()
    )
    assert len(rows) == 200
    assert sorted(int(r.value.split("-")[1]) for r in rows) == list(range(200))
    assert {r.partition for r in rows} == {0, 1, 2, 3}


def test_missing_kafka_jars_raise_environment_not_ready(tmp_path):
    broker = KafkaBroker(tmp_path / "data", jars_dir=tmp_path / "no-jars")
    with pytest.raises(
        EnvironmentNotReadyError, match=r"kafka jars folder .* does not exist.*bash scripts/setup\.sh"
    ):
        broker.start(timeout_s=5)
    assert read_state(tmp_path / "data") is None  # nothing launched, nothing recorded


def test_bootstrap_servers_before_start_is_a_clear_error(tmp_path):
    with pytest.raises(SourceError, match="not started"):
        _ = KafkaBroker(tmp_path).bootstrap_servers


def test_port_out_of_range_is_rejected(tmp_path):
    with pytest.raises(InvalidParameterError) as info:
        KafkaBroker(tmp_path, port=70000)
    assert info.value.name == "port"


def test_cluster_ids_are_fresh_22_char_base64_never_starting_with_a_dash():
    # A leading "-" made kafka-storage read the id as an option (a CI failure, 1 run in 64).
    ids = {new_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(len(i) == 22 and "=" not in i for i in ids)
    assert not any(i.startswith("-") for i in ids)


def test_a_non_broker_pid_is_never_taken_for_the_broker(tmp_path):
    # pid reuse: broker.json names a live process that is not Kafka -> stopped, not signalled.
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        data = tmp_path / "stale"
        data.mkdir()
        (data / "broker.json").write_text(
            json.dumps(
                {
                    "data_dir": str(data),
                    "port": 1,
                    "controller_port": 2,
                    "cluster_id": "x",
                    "log_file": str(data / "broker.log"),
                    "pid": sleeper.pid,
                    "started_at": 0.0,
                }
            )
        )
        broker = KafkaBroker(data)
        assert broker.status() is BrokerStatus.STOPPED
        broker.stop()
        assert sleeper.poll() is None  # still alive: stop() did not signal it
    finally:
        sleeper.kill()
        sleeper.wait()


def test_default_data_dir_of_kafka_sh_is_ignored_by_git():
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "var/kafka/broker.json"], cwd=ROOT, check=False
    ).returncode
    assert ignored == 0
    assert (ROOT / ".gitignore").read_text().count("/var/") == 1
