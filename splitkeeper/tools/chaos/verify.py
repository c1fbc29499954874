"""The verdict of a chaos run, taken independently of the pipeline wherever it can be.

- the sink (read with delta-rs, another Delta implementation than the Spark writer's)
  against the producer's delivery reports: every delivered message once, nothing else,
  per partition contiguous and in order;
- Kafka's own copy of the topics (a plain consumer) against the delivery reports;
- the consumer group's committed offsets, read with Kafka's admin API, against the
  offsets after the last delivered message and against the last checkpoint's positions
  and id (the only part that reads the pipeline's state: the checkpoint it compares to);
- the restart checks (protocol section 6, Great Expectations) on the final state.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from splitkeeper.tools.chaos.processes import say
from splitkeeper.tools.kafka_testbed import QUIET_CLIENT_LOG, end_offsets

Delivered = Mapping[tuple[str, int, int], str]  # (topic, partition, offset) -> value


def group_offsets(bootstrap: str, group_id: str) -> dict[str, tuple[int, int | None]]:
    """The group's committed offsets through Kafka's admin API: split id -> (offset, checkpoint id tag)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    from splitkeeper.spark.sources.kafka import COMMIT_METADATA_KEY, split_id_of

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": QUIET_CLIENT_LOG}
    admin = AdminClient(conf)
    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group_id)], request_timeout=30)
    out: dict[str, tuple[int, int | None]] = {}
    for tp in futures[group_id].result().topic_partitions or []:
        if tp.error is not None or tp.offset < 0:
            continue
        try:
            tag = json.loads(tp.metadata or "{}").get(COMMIT_METADATA_KEY)
        except ValueError:
            tag = None
        out[split_id_of(tp.topic, tp.partition)] = (int(tp.offset), None if tag is None else int(tag))
    return out


def read_topics(bootstrap: str, topics: Sequence[str]) -> dict[tuple[str, int], str]:
    """Every message of ``topics`` as Kafka holds it now, read with a plain consumer.

    Returns (split id, offset) -> value.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from splitkeeper.spark.sources.kafka import split_id_of

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"chaos-oracle-{os.getpid()}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "logger": QUIET_CLIENT_LOG,  # the clients' own logs: the broker dies on purpose
    }
    consumer = Consumer(conf)
    try:
        metadata = consumer.list_topics(timeout=30).topics
        ends: dict[tuple[str, int], int] = {}
        for topic in topics:
            for partition in metadata[topic].partitions:
                _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
                if high > 0:
                    ends[(topic, partition)] = high
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in ends])
        out: dict[tuple[str, int], str] = {}
        done: set[tuple[str, int]] = set()
        deadline = time.monotonic() + 300
        while len(done) < len(ends) and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10_000, timeout=1.0):
                if msg.error() is not None:
                    continue
                topic, partition, offset = str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0)
                out[(split_id_of(topic, partition), offset)] = (msg.value() or b"").decode()
                if offset + 1 >= ends[(topic, partition)]:
                    done.add((topic, partition))
        return out
    finally:
        consumer.close()


def read_sink(sink_path: str) -> list[tuple[str, int, int, str | bytes | None]]:
    """Every row of the sink table (:func:`splitkeeper.delta.sink.read_sink`): (split id, offset, next
    offset, value)."""
    from splitkeeper.delta import sink

    table = sink.read_sink(sink_path, ["split_id", "offset", "next_offset", "value"])
    return list(
        zip(
            table.column("split_id").to_pylist(),
            table.column("offset").to_pylist(),
            table.column("next_offset").to_pylist(),
            table.column("value").to_pylist(),
            strict=True,
        )
    )


def _bytes(value: str | bytes | None) -> bytes | None:
    return value.encode("utf-8") if isinstance(value, str) else value


def compare_sink(
    sink: Sequence[tuple[str, int, int, str | bytes | None]], delivered: Delivered
) -> dict[str, Any]:
    """The sink's (split id, offset, next offset, value) rows against the delivery reports."""
    from splitkeeper.spark.sources.kafka import split_id_of

    expected = {(split_id_of(t, p), o): _bytes(v) for (t, p, o), v in delivered.items()}
    keys = Counter((sid, off) for sid, off, _n, _v in sink)
    values = {(sid, off): _bytes(v) for sid, off, _n, v in sink}  # the sink keeps bytes (raw) or text
    by_split: dict[str, list[tuple[int, int]]] = {}
    for sid, off, nxt, _v in sink:
        by_split.setdefault(sid, []).append((off, nxt))
    produced: dict[str, list[int]] = {}
    for sid, off in expected:
        produced.setdefault(sid, []).append(off)
    broken = []
    for sid, offsets in sorted(produced.items()):
        got = sorted(by_split.get(sid, []))
        if [o for o, _n in got] != sorted(offsets) or any(n != o + 1 for o, n in got):
            broken.append(sid)
    broken += sorted(set(by_split) - set(produced))
    return {
        "records_in_sink": len(sink),
        "records_lost": sum(1 for k in expected if k not in keys),
        "records_duplicated": sum(n - 1 for n in keys.values() if n > 1),
        "records_unexpected": sum(1 for k, v in values.items() if expected.get(k) != v),
        "partitions_contiguous": not broken,
        "splits_not_contiguous": broken,
    }


def verify(
    config_path: Path,
    workdir: Path,
    bootstrap: str,
    topics: Sequence[str],
    group_id: str,
    delivered: Delivered,
) -> dict[str, Any]:
    """Every check of the module doc; the result's keys go into the chaos JSON."""
    from splitkeeper.config.settings import load_config
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.quality.checks import run_restart_checks
    from splitkeeper.spark.session import SparkSettings, get_spark
    from splitkeeper.spark.sources.kafka import KafkaSource, split_id_of

    say("verifying: the sink against every delivery report, the group's offsets, the restart checks")
    started = time.monotonic()
    config = load_config(config_path)
    in_kafka = read_topics(bootstrap, topics)
    result = compare_sink(read_sink(config.sink_path), delivered)
    say(
        f"sink read and compared after {time.monotonic() - started:.0f}s: lost {result['records_lost']}, "
        f"duplicated {result['records_duplicated']}, unexpected {result['records_unexpected']}"
    )
    committed = group_offsets(bootstrap, group_id)
    ends = end_offsets(delivered)
    source = KafkaSource(bootstrap, topics=list(topics))
    try:
        store = DeltaStateStore(config.state_path, config.name, source.fingerprint(), read_only=True)
        latest = store.latest_checkpoint()
        positions = (
            {}
            if latest is None
            else {s.split_id: s.position for r in latest.regions.values() for s in r.splits}
        )
        aligned = latest is not None and committed == {
            sid: (pos, latest.checkpoint_id) for sid, pos in positions.items()
        }
        report = run_restart_checks(
            lambda: get_spark(SparkSettings.from_env(ui_enabled=False)),
            store,
            config.sink_path,
            strategy=config.strategy,
            max_consecutive_failures=config.checkpoint.max_consecutive_failures,
            subscriptions=source.subscriptions(),
            data_docs_dir=workdir / "data_docs",
            source_splits=source.discover_splits(),
        )
    finally:
        source.close()
    say(f"restart checks {'passed' if report.success else 'FAILED'} after {time.monotonic() - started:.0f}s")
    if not report.success:
        say(report.summary())
    return {
        "messages_in_kafka": len(in_kafka),
        "kafka_matches_delivery_reports": in_kafka
        == {(split_id_of(t, p), o): v for (t, p, o), v in delivered.items()},
        **result,
        "offsets_aligned": bool(aligned),
        "offsets_at_end": {sid: off for sid, (off, _tag) in committed.items()} == ends,
        "last_checkpoint": None if latest is None else latest.checkpoint_id,
        "restart_checks": "passed" if report.success else "failed",
    }
