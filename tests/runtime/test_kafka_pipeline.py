"""The Kafka source end to end: Pipeline on real Spark and Delta, reading a real broker.

Every test checks the data afterwards: the sink table holds each produced message
once, per partition in offset order with contiguous offsets (or exactly the gap the
audit trail reports as lost), and the consumer group's committed offsets equal the
last checkpoint's positions, tagged with its id (protocol sections 1, 3, 5, 6).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from splitkeeper.app import services
from splitkeeper.app.pipeline import EpochReport, Pipeline
from splitkeeper.app.sink import sink_reader
from splitkeeper.config.settings import PipelineConfig, config_from_mapping
from splitkeeper.core.source import ExternalPosition, LostRange
from splitkeeper.core.types import CheckpointKind, RecoveryDecision, RegionOutcome
from splitkeeper.delta import serde
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.errors import SourceError
from splitkeeper.quality.checks import run_restart_checks
from splitkeeper.sinks.delta.sink import DeltaSink
from splitkeeper.sources.kafka.source import COMMIT_METADATA_KEY, KafkaSource, split_id_of
from splitkeeper.spark.faults import FaultPlan
from splitkeeper_tools.kafka_broker import KafkaBroker

from .helpers import sink_rows
from .test_kafka_source import create_topic, produce, recreate_topic, unique

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def kafka_config(
    root: Path,
    bootstrap: str,
    *,
    epoch_records: int,
    retain_checkpoints: int = 3,
    sections: Mapping[str, Any] | None = None,
    **source: Any,
) -> PipelineConfig:
    """A Kafka pipeline (P=4 unless ``parallelism`` is given) with state and sink under ``root``;
    ``sections``: more top-level sections of the file (``decode``, ``errors``)."""
    parallelism = source.pop("parallelism", 4)
    return config_from_mapping(
        {
            "name": unique("kafka"),
            "parallelism": parallelism,
            "strategy": "least-loaded",
            "source": {"kind": "kafka", "bootstrap_servers": bootstrap, **source},
            "checkpoint": {
                "max_consecutive_failures": 3,
                "max_failure_ratio": 0.5,
                "region_timeout_s": 60,
                "retain_checkpoints": retain_checkpoints,
            },
            "backlog": {"backlog_epoch_records": epoch_records, "normal_epoch_records": epoch_records},
            "state": {"path": str(root / "state")},
            "sink": {"path": str(root / "sink")},
            **(sections or {}),
        }
    )


def value_of(topic: str, partition: int, i: int) -> str:
    return f"{topic}|{partition}|{i}"


def produce_numbered(bootstrap: str, topic: str, counts: Mapping[int, int], first: int = 0) -> None:
    produce(
        bootstrap,
        topic,
        {p: [value_of(topic, p, i) for i in range(first, first + n)] for p, n in counts.items()},
    )


def produce_by_partition(
    bootstrap: str, topic: str, values: Sequence[tuple[Any, bytes | None, bytes | None]], partitions: int
) -> tuple[dict[tuple[int, int], Any], dict[int, int]]:
    """Produce ``(tag, value, key)`` round-robin over ``partitions``, idempotently; return each
    ``(partition, offset)``'s tag and the count per partition (the end offsets of a new topic)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    produced: dict[tuple[int, int], Any] = {}
    counts = dict.fromkeys(range(partitions), 0)
    for i, (tag, value, key) in enumerate(values):
        partition = i % partitions
        producer.produce(topic, value=value, key=key, partition=partition)
        produced[(partition, counts[partition])] = tag
        counts[partition] += 1
    assert producer.flush(30) == 0, "messages left unsent"
    return produced, counts


def offsets_accounted(
    sink: Sequence[Mapping[str, Any]], dead: Sequence[Mapping[str, Any]], partition_of: Mapping[str, int]
) -> Counter[tuple[int, int]]:
    """How often each ``(partition, offset)`` is in the sink rows or the dead-letter rows."""
    return Counter(
        [(r["partition"], r["offset"]) for r in sink]
        + [(partition_of[r["split_id"]], r["offset"]) for r in dead]
    )


def run_until_caught_up(
    pipeline: Pipeline, ends: Mapping[str, int], max_epochs: int = 12
) -> list[EpochReport]:
    """Run epochs until the latest checkpoint is global and every split is at its end offset."""
    reports: list[EpochReport] = []
    while len(reports) < max_epochs:
        reports.append(pipeline.run_epoch())
        latest = pipeline.store.latest_checkpoint()
        assert latest is not None
        if reports[-1].kind is CheckpointKind.GLOBAL and positions(latest) == dict(ends):
            return reports
    raise AssertionError(f"not caught up after {max_epochs} epochs: {[r.line() for r in reports]}")


def test_a_topic_created_mid_run_is_read_within_one_epoch_and_a_deleted_one_is_dropped(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """A topic pattern's subscriptions refresh every epoch, not only on restore (protocol rule 1.5)."""
    bootstrap = kafka_broker.bootstrap_servers
    prefix = unique("live")
    first = create_topic(bootstrap, 2, name=f"{prefix}-a")
    produce_numbered(bootstrap, first, {0: 6, 1: 4})
    config = kafka_config(tmp_path, bootstrap, epoch_records=100, parallelism=2, topic_pattern=f"{prefix}-.*")
    pipeline = Pipeline(config, spark)
    try:
        pipeline.open()
        assert pipeline.run_epoch().kind is CheckpointKind.GLOBAL
        created = create_topic(bootstrap, 2, name=f"{prefix}-b")  # while the pipeline runs
        produce_numbered(bootstrap, created, {0: 3, 1: 2})
        report = pipeline.run_epoch()
        assert report.kind is CheckpointKind.GLOBAL
        by_split = sink_offsets(spark, config)
        assert by_split[split_id_of(created, 0)] == [(i, i + 1, value_of(created, 0, i)) for i in range(3)]
        assert by_split[split_id_of(created, 1)] == [(i, i + 1, value_of(created, 1, i)) for i in range(2)]

        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.delete_topics([first]).values():
            future.result(timeout=30)
        deadline = time.monotonic() + 30
        while first in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
            time.sleep(0.2)
        produce_numbered(bootstrap, created, {0: 1}, first=3)
        report = pipeline.run_epoch()
        dropped = {
            a.split_id
            for a in pipeline.enumerator.audit
            if a.decision is RecoveryDecision.DROPPED_REMOVED_SUBSCRIPTION
        }
    finally:
        pipeline.close()
    assert report.kind is CheckpointKind.GLOBAL and report.completed is not None
    assert dropped == {split_id_of(first, 0), split_id_of(first, 1)}
    owned = {s.split_id for r in report.completed.regions.values() for s in r.splits}
    assert owned == {split_id_of(created, 0), split_id_of(created, 1)}
    by_split = sink_offsets(spark, config)
    assert by_split[split_id_of(first, 0)] == [(i, i + 1, value_of(first, 0, i)) for i in range(6)]
    assert by_split[split_id_of(created, 0)][-1] == (3, 4, value_of(created, 0, 3))


def positions(checkpoint: Any) -> dict[str, int]:
    return {s.split_id: s.position for r in checkpoint.regions.values() for s in r.splits}


def sink_offsets(spark: Any, config: PipelineConfig) -> dict[str, list[tuple[int, int, str | None]]]:
    """Per split: (offset, next_offset, value as text) of the sink's records, ordered by offset; no
    duplicates (the values of these tests are UTF-8; the sink keeps their bytes)."""
    rows = sink_rows(config.sink.path)
    twice = [k for k, n in Counter((r.split_id, r.offset) for r in rows).items() if n > 1]
    assert not twice, f"(split, offset) in the sink more than once: {twice[:5]}"
    out: dict[str, list[tuple[int, int, str | None]]] = {}
    for r in sorted(rows, key=lambda r: (r.split_id, r.offset)):
        value = None if r.value is None else r.value.decode("utf-8")
        out.setdefault(r.split_id, []).append((r.offset, r.next_offset, value))
    return out


def delete_records_before(bootstrap: str, topic: str, partition: int, offset: int) -> None:
    """Advance the partition's log start offset (what retention does), like ``kafka-delete-records``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, partition, offset)]).values():
        future.result(timeout=30)


def test_two_topics_at_p4_with_a_failed_region_land_once_each_and_the_group_holds_the_checkpoint(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topics = sorted([create_topic(bootstrap, 4), create_topic(bootstrap, 4)])
    counts = {(t, p): 300 + 37 * p + 11 * i for i, t in enumerate(topics) for p in range(4)}
    for topic in topics:
        produce_numbered(bootstrap, topic, {p: n for (t, p), n in counts.items() if t == topic})
    ends = {split_id_of(t, p): n for (t, p), n in counts.items()}
    group = unique("sk-e2e")
    config = kafka_config(tmp_path, bootstrap, epoch_records=1200, topics=topics, group_id=group)
    lines: list[str] = []

    pipeline = Pipeline(config, spark, faults=FaultPlan.parse(["fail:1@2"]), progress=lines.append)
    try:
        opened = pipeline.open()
        produce_numbered(bootstrap, topics[0], {0: 50}, first=counts[(topics[0], 0)])  # after the start
        summary = pipeline.run(20, until_caught_up=True)
    finally:
        pipeline.close()
    print("\n".join(lines))
    reports = list(summary.epochs)

    # The run ended by itself on the global checkpoint that caught up with what was there at its
    # start (open): no idle epoch after it, and the 50 later messages were not waited for.
    assert summary.caught_up and not summary.finished and len(reports) < 20
    assert reports[-1].kind is CheckpointKind.GLOBAL and reports[-1].committed_records > 0
    counts[(topics[0], 0)] += 50  # read or not, they are in the topic: read them now
    ends[split_id_of(topics[0], 0)] += 50
    if positions(pipeline.store.latest_checkpoint()) != ends:
        again = Pipeline(config, spark)
        try:
            again.open()
            more = again.run(5, until_caught_up=True)
        finally:
            again.close()
        assert more.caught_up
    idle = Pipeline(config, spark)  # nothing new since that global checkpoint: not even one epoch
    try:
        idle.open()
        quiet = idle.run(5, until_caught_up=True)
    finally:
        idle.close()
    assert quiet.caught_up and quiet.epochs == ()
    assert opened.restored_from is None and opened.parallelism == 4
    second = {r.epoch: r for r in reports}[2]
    assert second.kind is CheckpointKind.REGIONAL
    assert second.outcomes[1] is RegionOutcome.DECLINE and "injected fault" in second.region_errors[1]
    assert sum(second.outcomes[r] is RegionOutcome.ACK for r in (0, 2, 3)) == 3

    by_split = sink_offsets(spark, config)
    assert sorted(by_split) == sorted(ends)
    sources = (
        spark.read.format("delta").load(config.sink.path).groupBy("split_id", "topic", "partition").count()
    )
    assert {(r["split_id"], r["topic"], r["partition"]) for r in sources.collect()} == {
        (split_id_of(t, p), t, p) for (t, p) in counts
    }  # every record carries its message's topic and partition
    for (topic, partition), n in counts.items():
        records = by_split[split_id_of(topic, partition)]
        assert records == [(i, i + 1, value_of(topic, partition, i)) for i in range(n)], (topic, partition)

    latest = pipeline.store.latest_checkpoint()
    assert latest is not None and latest.kind is CheckpointKind.GLOBAL
    assert positions(latest) == ends
    committed = KafkaSource(bootstrap, topics=topics, group_id=group).committed_positions()
    assert committed == {sid: ExternalPosition(end, latest.checkpoint_id) for sid, end in ends.items()}
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        raw = probe.committed([TopicPartition(topics[1], 3)], timeout=10)[0]
    finally:
        probe.close()
    assert raw.offset == counts[(topics[1], 3)]
    assert json.loads(raw.metadata or "null") == {COMMIT_METADATA_KEY: latest.checkpoint_id}

    # what the event-driven ingest polls (airflow.schedule: on_new_data): the end offsets against
    # the checkpoint, on the real broker, without Spark; then three new messages in one partition
    assert services.pending_work(config).splits == ()
    produce_numbered(bootstrap, topics[1], {2: 3}, first=counts[(topics[1], 2)])
    work = services.pending_work(config)
    assert work.splits == (split_id_of(topics[1], 2),) and work.checkpoint_id == latest.checkpoint_id


def test_a_restored_pipeline_reads_a_topic_created_while_it_was_down_from_its_earliest_offset(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """``starting: latest`` is for the initial discovery only; no group_id, so nothing is reconciled."""
    bootstrap = kafka_broker.bootstrap_servers
    prefix = unique("late")
    early = create_topic(bootstrap, 2, name=f"{prefix}-a")
    produce_numbered(bootstrap, early, {0: 5, 1: 3})
    config = kafka_config(
        tmp_path, bootstrap, epoch_records=100, parallelism=2, topic_pattern=f"{prefix}-.*", starting="latest"
    )
    first = Pipeline(config, spark)
    try:
        first.open()
        assert first.run_epoch().kind is CheckpointKind.GLOBAL
    finally:
        first.close()
    late = create_topic(bootstrap, 1, name=f"{prefix}-b")
    produce_numbered(bootstrap, late, {0: 7})
    produce_numbered(bootstrap, early, {0: 2}, first=5)

    second = Pipeline(config, spark)  # a new driver: a new connector that knows nothing
    try:
        opened = second.open()
        report = second.run_epoch()
    finally:
        second.close()

    assert opened.restored_from == 1
    assert opened.external_disagreements == ()  # no group_id: no external store to disagree with
    assert report.kind is CheckpointKind.GLOBAL
    by_split = sink_offsets(spark, config)
    assert by_split == {
        split_id_of(late, 0): [(i, i + 1, value_of(late, 0, i)) for i in range(7)],
        split_id_of(early, 0): [(i, i + 1, value_of(early, 0, i)) for i in (5, 6)],
    }
    assert KafkaSource(bootstrap, topic_pattern=f"{prefix}-.*").committed_positions() == {}


def _aged_pipeline(
    spark: Any, bootstrap: str, tmp_path: Path, on_offset_out_of_range: str
) -> tuple[PipelineConfig, Pipeline, str]:
    """A 2-partition topic of 40 records each; epoch 1 reads offsets [0, 10) of both, then
    offsets below 25 of partition 0 are deleted. Returns the config, the open pipeline, the topic.
    One checkpoint is retained: the audit records of earlier ones must survive for the checks."""
    topic = create_topic(bootstrap, 2)
    produce_numbered(bootstrap, topic, {0: 40, 1: 40})
    config = kafka_config(
        tmp_path,
        bootstrap,
        epoch_records=20,
        retain_checkpoints=1,
        parallelism=2,
        topics=[topic],
        on_offset_out_of_range=on_offset_out_of_range,
    )
    pipeline = Pipeline(config, spark)
    pipeline.open()
    assert pipeline.run_epoch().kind is CheckpointKind.GLOBAL
    latest = pipeline.store.latest_checkpoint()
    assert latest is not None and positions(latest) == {split_id_of(topic, 0): 10, split_id_of(topic, 1): 10}
    delete_records_before(bootstrap, topic, 0, 25)
    return config, pipeline, topic


def test_aged_out_offsets_with_skip_are_audited_and_validate_accepts_exactly_that_gap(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    config, pipeline, topic = _aged_pipeline(spark, bootstrap, tmp_path, "skip")
    p0, p1 = split_id_of(topic, 0), split_id_of(topic, 1)
    try:
        reports = run_until_caught_up(pipeline, {p0: 40, p1: 40})
    finally:
        pipeline.close()

    assert reports[0].epoch == 2 and reports[0].lost == (LostRange(p0, 10, 25),)
    assert "LOST 15 offsets of 1 split(s)" in reports[0].line()
    assert all(r.lost == () for r in reports[1:])
    by_split = sink_offsets(spark, config)
    assert [o for o, _n, _v in by_split[p0]] == [*range(10), *range(25, 40)]
    assert [o for o, _n, _v in by_split[p1]] == list(range(40))
    assert by_split[p0][10] == (25, 26, value_of(topic, 0, 25))

    store = DeltaStateStore(config.state.path, config.name, pipeline.connector.fingerprint())
    # checkpoint 2 (the one that skipped the lost range) went with retention; 1 stays only as the
    # full snapshot the latest checkpoint's enumerator rows are a delta against
    assert store.checkpoint_ids() == [1, reports[-1].epoch]
    store.compact()  # ... and compaction: the audit trail (where splits started, what was lost) stays
    audit = [
        serde.audit_from_row(row.asDict())
        for row in spark.read.format("delta").load(store.table_path("audit")).collect()
    ]
    lost = [a for a in audit if a.decision is RecoveryDecision.SKIPPED_LOST_RANGE]
    assert [(a.checkpoint_id, LostRange.from_audit(a)) for a in lost] == [(1, LostRange(p0, 10, 25))]
    assert {a.split_id: a.detail for a in audit if a.decision is RecoveryDecision.DISCOVERED} == {
        p0: "at 0",
        p1: "at 0",
    }
    checks = {
        "strategy": config.strategy,
        "max_consecutive_failures": 3,
        "subscriptions": {topic},
        "source_splits": KafkaSource(bootstrap, topics=[topic]).discover_splits(),  # p0 now starts at 25
    }
    report = run_restart_checks(spark, store, sink_reader(config), data_docs_dir=tmp_path / "docs", **checks)
    assert report.success, report.summary()
    assert any(f"{p0} [10, 25)" in note for note in report.notes), report.notes

    # a gap nobody reported is still a violation, also in the split that has a reported one
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, config.sink.path).delete(f"split_id = '{p0}' AND offset = 30")
    broken = run_restart_checks(spark, store, sink_reader(config), data_docs_dir=tmp_path / "docs2", **checks)
    assert not broken.success
    assert broken.split_ids == (p0,)
    assert [s.key for s in broken.failed_suites] == ["sink_records"]


def test_aged_out_offsets_with_fail_stop_the_epoch_before_anything_is_written(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    config, pipeline, topic = _aged_pipeline(spark, bootstrap, tmp_path, "fail")
    try:
        with pytest.raises(SourceError) as caught:
            pipeline.run_epoch()
    finally:
        pipeline.close()

    message = str(caught.value)
    assert f"topic '{topic}' partition 0: requested offset 10, earliest available 25" in message
    assert "source.on_offset_out_of_range: skip" in message
    store = DeltaStateStore(config.state.path, config.name, pipeline.connector.fingerprint())
    assert store.checkpoint_ids() == [1]
    assert store.latest_plan_epoch() == 1  # the plan of epoch 2 was never persisted
    assert DeltaSink(config.sink.path, config.name, read_only=True).committed_epoch() == 1
    latest = store.latest_checkpoint()
    assert latest is not None and positions(latest) == {split_id_of(topic, 0): 10, split_id_of(topic, 1): 10}
    assert [o for o, _n, _v in sink_offsets(spark, config)[split_id_of(topic, 0)]] == list(range(10))


def test_binary_null_empty_text_and_random_values_reach_a_raw_sink_byte_exact(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """Issue 21: 300 messages of every kind a topic carries (Avro-like binary in the Confluent wire
    format, null tombstones, empty values, UTF-8 text, random bytes; keys random, empty or null),
    ingested with the default ``decode.kind: raw``: every value and key in the sink is the produced
    bytes, nulls null and empties empty."""
    import random

    from splitkeeper.sinks.delta.read import read_sink

    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, 2)
    rng = random.Random(21)
    kinds = [
        lambda i: b"\x00" + (7).to_bytes(4, "big") + rng.randbytes(rng.randint(1, 40)),  # Avro-like
        lambda i: None,  # a tombstone
        lambda i: b"",
        lambda i: f"text {i} é€ 𝄞".encode(),
        lambda i: rng.randbytes(rng.randint(1, 64)),
    ]
    values = []
    for i in range(300):
        value, key = kinds[(i // 2) % len(kinds)](i), rng.choice([None, b"", rng.randbytes(8)])
        values.append(((value, key), value, key))
    produced, counts = produce_by_partition(bootstrap, topic, values, 2)
    assert sum(v is None for v, _ in produced.values()) == 60
    config = kafka_config(tmp_path, bootstrap, epoch_records=120, parallelism=2, topics=[topic])
    assert config.decode.kind == "raw"
    pipeline = Pipeline(config, spark)
    try:
        pipeline.open()
        run_until_caught_up(pipeline, {split_id_of(topic, p): n for p, n in counts.items()})
    finally:
        pipeline.close()

    table = read_sink(config.sink.path, ["partition", "offset", "value", "key"])
    assert table.schema.field("value").type == table.schema.field("key").type
    got = {(r["partition"], r["offset"]): (r["value"], r["key"]) for r in table.to_pylist()}
    assert table.num_rows == len(got) == 300
    wrong = [k for k, v in produced.items() if got.get(k) != v]
    assert not wrong, f"{len(wrong)} records differ from what was produced, e.g. {wrong[:3]}"


def test_a_topic_deleted_and_recreated_is_a_new_split_read_from_its_start(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """Issue 36, item 6: the second run read the new topic's offsets 10-24 only (it went on from the
    old topic's position 10). Now the split of the old topic ends where it stood and the new topic's
    partition is a new split (its topic id in its identity) read from offset 0; audited, validated."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, 1, name=unique("rc"))
    produce(bootstrap, topic, {0: [f"old-{i}" for i in range(10)]})
    config = kafka_config(
        tmp_path, bootstrap, epoch_records=100, parallelism=1, topics=[topic], group_id=unique("g")
    )
    first = Pipeline(config, spark)
    try:
        first.open()
        run_until_caught_up(first, {split_id_of(topic, 0): 10})
    finally:
        first.close()
    recreate_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, {0: [f"new-{i}" for i in range(15)]})

    second = Pipeline(config, spark)  # a restore: the state's split has the old topic's id
    try:
        second.open()
        reports = [second.run_epoch() for _ in range(2)]
        audit = list(second.enumerator.audit)
    finally:
        second.close()
    assert all(r.kind is CheckpointKind.GLOBAL for r in reports)
    by_split = sink_offsets(spark, config)
    old, (new,) = split_id_of(topic, 0), [s for s in by_split if s != split_id_of(topic, 0)]
    assert new.startswith(f"{old}#v")
    assert by_split == {
        old: [(i, i + 1, f"old-{i}") for i in range(10)],
        new: [(i, i + 1, f"new-{i}") for i in range(15)],
    }
    (replaced,) = [a for a in audit if a.decision is RecoveryDecision.REPLACED]
    assert replaced.split_id == old and f"topic {topic!r} was deleted and re-created" in replaced.detail
    assert f"as split {new}" in replaced.detail
    latest = DeltaStateStore(config.state.path, config.name, None, read_only=True).latest_checkpoint()
    assert latest is not None and latest.enumerator is not None
    assert positions(latest) == {new: 15} and old in latest.enumerator.finished
    # the group's offset names the split it belongs to, so a restore compares it with the new split
    group = KafkaSource(bootstrap, topics=[topic], group_id=config.source.group_id).committed_positions()
    assert group == {new: ExternalPosition(15, latest.checkpoint_id)}
    services.validate(config, content=True)


def test_an_offset_reset_past_the_log_end_is_clamped_to_it_and_nothing_produced_later_is_skipped(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """Issue 36, item 7: ``--to offset:999999`` was accepted as it is ("999,499 offsets skipped"), the
    split then waited at an offset no record reached and the next records were never read while
    ``offsets`` showed lag 0. Now, as kafka-consumer-groups --reset-offsets does, the offset is clamped
    to the log end (and refused when the split stands there already)."""
    from splitkeeper.app import incident
    from splitkeeper.errors import InvalidParameterError

    from .helpers import run_pipeline

    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, 1, name=unique("clamp"))
    produce_numbered(bootstrap, topic, {0: 10})
    config = kafka_config(tmp_path, bootstrap, epoch_records=100, parallelism=1, topics=[topic])
    split = split_id_of(topic, 0)
    run_pipeline(config, spark, until_caught_up=True)
    with pytest.raises(InvalidParameterError, match=r"999999 is outside it, and the log end 10 is where"):
        incident.reset_offset(config, split, "offset:999999", dry_run=True)

    produce_numbered(bootstrap, topic, {0: 10}, first=10)  # end 20, the split at 10
    result = incident.reset_offset(config, split, "offset:999999", reason="skip the rest")
    assert result.applied and result.position_after == 20
    assert result.change["skipped"] == 10 and result.change["requested"] == 999999
    assert result.change["clamped_to"] == "the log end 20"
    produce_numbered(bootstrap, topic, {0: 5}, first=20)
    (listed,) = incident.offsets(config).splits
    assert listed.position == 20
    run_pipeline(config, spark, until_caught_up=True)
    want = [(i, i + 1, value_of(topic, 0, i)) for i in (*range(10), *range(20, 25))]
    assert sink_offsets(spark, config) == {split: want}  # nothing after the clamp is skipped
    services.validate(config)


def test_typed_decode_on_the_broker_accounts_every_offset_once_and_keeps_bad_bytes_as_produced(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """The record path under ``decode.kind: json`` and ``errors.tolerance: all`` on a real broker:
    good documents, broken JSON, binary, null and empty values. Every produced offset is in the
    sink or the dead-letter table, exactly once; a good record's typed columns are its document's;
    a dead letter's key and value are the produced bytes (null stays null)."""
    import random

    from splitkeeper.sinks.delta.read import read_dead_letters, read_sink

    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, 2)
    rng = random.Random(37)
    kinds = [
        lambda i: json.dumps({"id": i, "name": f"n{i} é"}).encode(),  # good
        lambda i: b'{"id": ' + str(i).encode(),  # broken JSON
        lambda i: b"\xff\xfe" + rng.randbytes(rng.randint(1, 30)),  # binary, not UTF-8
        lambda i: None,  # null value
        lambda i: b"",  # empty value
    ]
    values = []
    for i in range(200):
        value, key = kinds[(i // 2) % len(kinds)](i), rng.choice([None, b"", rng.randbytes(8)])
        values.append(((value, key), value, key))
    produced, counts = produce_by_partition(bootstrap, topic, values, 2)
    config = kafka_config(
        tmp_path,
        bootstrap,
        epoch_records=80,
        parallelism=2,
        topics=[topic],
        sections={
            "decode": {"kind": "json", "schema": "id BIGINT, name STRING"},
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

    partition_of = {split_id_of(topic, p): p for p in counts}
    sink = read_sink(config.sink.path, ["partition", "offset", "id", "name"]).to_pylist()
    dead = read_dead_letters(str(tmp_path / "dead"), ["split_id", "offset", "key", "value"]).to_pylist()
    seen = offsets_accounted(sink, dead, partition_of)
    assert set(seen) == set(produced) and set(seen.values()) == {1}, "an offset is missing or twice"
    for r in sink:  # only good documents reach the sink, typed as produced
        value, _ = produced[(r["partition"], r["offset"])]
        assert value is not None and json.loads(value) == {"id": r["id"], "name": r["name"]}
    for r in dead:
        assert (r["value"], r["key"]) == produced[(partition_of[r["split_id"]], r["offset"])]
    good = sum(1 for v, _ in produced.values() if v and v.startswith(b'{"id": ') and v.endswith(b"}"))
    assert len(sink) == good == 40 and len(dead) == 160
