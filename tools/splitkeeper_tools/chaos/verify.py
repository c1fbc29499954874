"""The verdict of a chaos run, taken independently of the pipeline wherever it can be.

- the sink (read with delta-rs, another Delta implementation than the Spark writer's)
  and, with ``--bad-records``, the dead-letter table against the producer's delivery
  reports: every delivered message once in one of them, nothing else, per partition
  contiguous and in order, byte for byte; the malformed messages are exactly the dead
  letters and the well-formed ones exactly the sink's rows;
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

from splitkeeper_tools.chaos.processes import say
from splitkeeper_tools.kafka_testbed import QUIET_CLIENT_LOG, end_offsets, value_bytes, value_text

Delivered = Mapping[tuple[str, int, int], str]  # (topic, partition, offset) -> value (value_text)
Row = tuple[str, int, int, bytes | None]  # a sink row or dead letter: split id, offset, next offset, value


def group_offsets(bootstrap: str, group_id: str) -> dict[str, tuple[int, int | None]]:
    """The group's committed offsets through Kafka's admin API: split id -> (offset, checkpoint id tag)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    from splitkeeper.sources.kafka.source import COMMIT_METADATA_KEY, split_id_of

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

    from splitkeeper.sources.kafka.source import split_id_of

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
                out[(split_id_of(topic, partition), offset)] = value_text(msg.value() or b"")
                if offset + 1 >= ends[(topic, partition)]:
                    done.add((topic, partition))
        return out
    finally:
        consumer.close()


def _rows(table: Any) -> list[Row]:
    """(split id, offset, next offset, value bytes) of ``table``'s rows (a text value as UTF-8)."""
    return [
        (sid, off, nxt, value.encode() if isinstance(value, str) else value)
        for sid, off, nxt, value in zip(
            table.column("split_id").to_pylist(),
            table.column("offset").to_pylist(),
            table.column("next_offset").to_pylist(),
            table.column("value").to_pylist(),
            strict=True,
        )
    ]


def read_sink(sink_path: str) -> list[Row]:
    """Every row of the sink table (:func:`splitkeeper.sinks.delta.read.read_sink`): (split id, offset, next
    offset, value bytes)."""
    from splitkeeper.sinks.delta import read as sink

    return _rows(sink.read_sink(sink_path, ["split_id", "offset", "next_offset", "value"]))


def read_dead_letters(path: str) -> tuple[list[Row], Counter[str]]:
    """Every dead letter of the table at ``path`` (read with delta-rs; none when there is no table
    yet): its rows as :data:`Row` and how many failed at each stage."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(path).to_pyarrow_table(
            columns=["split_id", "offset", "next_offset", "value", "stage"]
        )
    except TableNotFoundError:
        return [], Counter()
    return _rows(table), Counter(table.column("stage").to_pylist())


def compare_sink(
    sink: Sequence[Row], delivered: Delivered, dead: Sequence[Row] = (), bad: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The sink's rows and the dead letters against the delivery reports: every delivered message in
    exactly one of them, with its bytes; the ``bad`` ones (their names ``m<seq:08d>``, the first
    field of every chaos value: :func:`is_bad_value`) exactly the dead letters."""
    from splitkeeper.sources.kafka.source import split_id_of

    expected = {(split_id_of(t, p), o): value_bytes(v) for (t, p, o), v in delivered.items()}
    both = [*sink, *dead]
    keys = Counter((sid, off) for sid, off, _n, _v in both)
    values = {(sid, off): v for sid, off, _n, v in both}
    by_split: dict[str, list[tuple[int, int]]] = {}
    for sid, off, nxt, _v in both:
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
    malformed = {k for k, v in expected.items() if is_bad_value(v, bad)}
    dead_keys = {(sid, off) for sid, off, _n, _v in dead}
    return {
        "records_in_sink": len(sink),
        "dead_letters": len(dead),
        "dead_letters_expected": len(malformed),
        # a malformed message in the sink or a well-formed one among the dead letters
        "records_misrouted": len(malformed ^ dead_keys),
        "records_lost": sum(1 for k in expected if k not in keys),
        "records_duplicated": sum(n - 1 for n in keys.values() if n > 1),
        "records_unexpected": sum(1 for k, v in values.items() if expected.get(k) != v),
        "partitions_contiguous": not broken,
        "splits_not_contiguous": broken,
    }


def compare_keyed(
    keyed: Any, delivered: Delivered, key_of: Any, delete_mark: bytes, bad: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The keyed table of ``chaos --sink upsert`` (rows with ``key`` and ``value``) against the fold
    of the delivery reports, computed here independently of the pipeline: per key (``key_of(seq,
    topic, partition)``, each key in one partition) its well-formed message with the highest offset,
    absent when that one ends with ``delete_mark``."""
    latest: dict[bytes, tuple[int, bytes]] = {}
    for (topic, partition, offset), text in delivered.items():
        value = value_bytes(text)
        if is_bad_value(value, bad):
            continue  # a dead letter: not a change of its key
        seq = int(value.split(b"|", 1)[0][1:])
        key = key_of(seq, topic, partition).encode()
        if key not in latest or latest[key][0] < offset:
            latest[key] = (offset, value)
    expected = {k: v for k, (_o, v) in latest.items() if not v.endswith(delete_mark)}
    rows = {
        bytes(k): (v.encode() if isinstance(v, str) else v)
        for k, v in zip(keyed.column("key").to_pylist(), keyed.column("value").to_pylist(), strict=True)
    }
    wrong = sorted(k for k in set(expected) | set(rows) if expected.get(k) != rows.get(k))
    return {
        "keys_in_table": len(rows),
        "keys_expected": len(expected),
        "keys_deleted": len(latest) - len(expected),
        "keyed_rows_total": keyed.num_rows,
        "keyed_matches": not wrong and keyed.num_rows == len(rows),
        "keys_wrong": [k.decode("utf-8", "replace") for k in wrong[:10]],
    }


def is_bad_value(value: bytes, bad: frozenset[str]) -> bool:
    """Whether a produced value is one of the malformed ones (``bad``: their ``m<seq:08d>`` names,
    the first field of every chaos value)."""
    return bool(bad) and value.split(b"|", 1)[0].decode("ascii", "replace") in bad


def verify(
    config_path: Path,
    workdir: Path,
    bootstrap: str,
    topics: Sequence[str],
    group_id: str,
    delivered: Delivered,
    bad: frozenset[str] = frozenset(),
    keyed: tuple[Any, bytes] | None = None,
) -> dict[str, Any]:
    """Every check of the module doc; the result's keys go into the chaos JSON. ``bad``: the names
    (``m<seq:08d>``) of the malformed messages, which must be exactly the dead letters. ``keyed``
    (``--sink upsert``: the producer's ``key_of`` and the delete mark): the change table is what is
    compared with the delivery reports, and the keyed table with their fold (:func:`compare_keyed`)."""
    from splitkeeper.app.sink import sink_reader
    from splitkeeper.config.settings import load_config
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.quality.checks import run_restart_checks
    from splitkeeper.sinks.port import SinkTable
    from splitkeeper.sources.kafka.source import KafkaSource, split_id_of
    from splitkeeper.spark.session import SparkSettings, get_spark

    say("verifying: the sink against every delivery report, the group's offsets, the restart checks")
    started = time.monotonic()
    config = load_config(config_path)
    in_kafka = read_topics(bootstrap, topics)
    dead: list[Row] = []
    stages: Counter[str] = Counter()
    if config.errors.dead_letter.path is not None:
        dead, stages = read_dead_letters(config.errors.dead_letter.path)
    reader = sink_reader(config)
    records_path = reader.location(SinkTable.RECORDS)
    assert records_path is not None
    result = compare_sink(read_sink(records_path), delivered, dead, bad)
    result["dead_letters_by_stage"] = dict(sorted(stages.items()))
    if keyed is not None:
        result.update(compare_keyed(reader.rows(SinkTable.KEYED, ["key", "value"]), delivered, *keyed, bad))
        say(
            f"keyed table: {result['keys_in_table']} keys, {result['keys_expected']} expected from the "
            f"delivery reports ({result['keys_deleted']} deleted); matches: {result['keyed_matches']}"
        )
    say(
        f"sink and dead letters read and compared after {time.monotonic() - started:.0f}s: lost "
        f"{result['records_lost']}, duplicated {result['records_duplicated']}, unexpected "
        f"{result['records_unexpected']}; {result['records_in_sink']} in the sink, {result['dead_letters']} "
        f"dead letters ({result['dead_letters_expected']} malformed produced, "
        f"{result['records_misrouted']} misrouted)"
    )
    committed = group_offsets(bootstrap, group_id)
    ends = end_offsets(delivered)
    source = KafkaSource(bootstrap, topics=list(topics))
    try:
        store = DeltaStateStore(config.state.path, config.name, source.fingerprint(), read_only=True)
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
            reader,  # the dead letters go with the sink: their offsets close the sink's gaps
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
