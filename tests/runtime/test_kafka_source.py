"""The Kafka source on a real broker: discovery, starting positions, exact reads, backlog,
external offsets, retention and bad input (protocol sections 1, 3, 4)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import pickle
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from splitkeeper.config.settings import config_from_mapping
from splitkeeper.core.enumerator import RecordingEnumeratorContext, enumerator_for
from splitkeeper.core.external import DisagreementKind, reconcile_positions
from splitkeeper.core.source import (
    ExternalPosition,
    PlannedRange,
    RegionReader,
    SourceRecord,
    SplitChangeKind,
)
from splitkeeper.core.types import Split
from splitkeeper.errors import InvalidParameterError, SourceError
from splitkeeper.records.columnar import SupportsColumnarRead
from splitkeeper.sources import build_source
from splitkeeper.sources.contract import SourceContractTests, read_planned
from splitkeeper.sources.kafka.config import OffsetOutOfRange
from splitkeeper.sources.kafka.source import (
    COMMIT_METADATA_KEY,
    KafkaRegionReader,
    KafkaSource,
    LostRange,
    parse_split_id,
    split_id_of,
)
from splitkeeper.spark.task import SplitReadError, run_region_task
from splitkeeper.transforms import identity
from splitkeeper_tools.kafka_broker import KafkaBroker, free_port

pytestmark = pytest.mark.kafka


# --------------------------------------------------------------------------- helpers


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, partitions: int, name: str | None = None, **config: str) -> str:
    topic = name or unique("t")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1, config=config)]).values():
        future.result(timeout=30)
    wait_for_leaders(admin, topic, partitions)
    return topic


def recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again under the same name (a new topic id, KIP-516)."""
    from confluent_kafka import KafkaException

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic]).values():
        future.result(timeout=30)
    deadline = time.monotonic() + 60
    while True:
        try:
            create_topic(bootstrap, partitions, name=topic)
            return
        except KafkaException:  # still being deleted
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def wait_for_leaders(admin: AdminClient, topic: str, partitions: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        meta = admin.list_topics(timeout=10).topics.get(topic)
        leaders = [] if meta is None else [p.leader for p in meta.partitions.values()]
        if len(leaders) == partitions and min(leaders) >= 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"topic {topic} has no leaders after 30s")


def produce(
    bootstrap: str, topic: str, values: Mapping[int, Sequence[str | None]], timestamp_ms: int | None = None
) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for partition, items in values.items():
        for value in items:
            if timestamp_ms is None:
                producer.produce(topic, value=value, partition=partition)
            else:
                producer.produce(topic, value=value, partition=partition, timestamp=timestamp_ms)
    assert producer.flush(30) == 0


def messages(partition: int, count: int, start: int = 0) -> list[str]:
    return [f"p{partition}-m{i}" for i in range(start, start + count)]


def by_id(splits: Sequence[Split]) -> dict[str, Split]:
    return {s.split_id: s for s in splits}


def assert_chain(records: list[SourceRecord], start: int, end: int) -> None:
    assert records[0].offset == start
    assert records[-1].next_offset == end
    for before, after in zip(records, records[1:], strict=False):
        assert before.next_offset == after.offset


@pytest.fixture
def bootstrap(kafka_broker: KafkaBroker) -> str:
    return kafka_broker.bootstrap_servers


@pytest.fixture
def closed_port_servers() -> str:
    return f"127.0.0.1:{free_port()}"  # nothing listens there: connections are refused


# --------------------------------------------------------------------------- contract


class TestKafkaSourceContract(SourceContractTests):
    """The shared source contract on a topic of three partitions: five records, two, none."""

    @pytest.fixture(autouse=True)
    def _broker(self, kafka_broker: KafkaBroker) -> None:
        self.bootstrap = kafka_broker.bootstrap_servers

    def make_source(self, tmp_path: Path) -> KafkaSource:
        topic = create_topic(self.bootstrap, 3)
        produce(self.bootstrap, topic, {0: messages(0, 5), 1: messages(1, 2)})
        return KafkaSource(self.bootstrap, topics=[topic])


# --------------------------------------------------------------------------- discovery


def test_discovers_two_topics_of_four_partitions_as_sorted_splits(bootstrap: str) -> None:
    first, second = sorted([create_topic(bootstrap, 4), create_topic(bootstrap, 4)])
    source = KafkaSource(bootstrap, topics=[second, first])

    splits = source.discover_splits()

    assert [s.split_id for s in splits] == [split_id_of(t, p) for t in (first, second) for p in range(4)]
    assert all(s.subscription == parse_split_id(s.split_id)[0] for s in splits)
    assert all(s.position == 0 and s.end is None and s.backlog_end is None for s in splits)
    assert source.subscriptions() == frozenset({first, second})
    assert source.discover_splits() == splits


def test_pattern_subscription_picks_up_a_topic_created_later_from_its_earliest_offset(bootstrap: str) -> None:
    prefix = unique("pat")
    early = create_topic(bootstrap, 2, name=f"{prefix}-a")
    produce(bootstrap, early, {0: messages(0, 3)})
    create_topic(
        bootstrap, 1, name=f"other-{prefix}"
    )  # contains the prefix but does not match the whole name
    source = KafkaSource(bootstrap, topic_pattern=f"{prefix}-.*", starting="latest")

    initial = by_id(source.discover_splits())
    assert sorted(initial) == [f"{early}-0", f"{early}-1"]
    assert initial[f"{early}-0"].position == 3  # 'latest' applies to the initial discovery
    assert initial[f"{early}-0"].backlog_end is None  # starting at the end: no backlog

    late = create_topic(bootstrap, 2, name=f"{prefix}-b")
    produce(bootstrap, late, {1: messages(1, 4)})
    later = by_id(source.discover_splits())

    assert sorted(later) == [f"{early}-0", f"{early}-1", f"{late}-0", f"{late}-1"]
    assert (
        later[f"{late}-1"].position == 0
    )  # found while running: earliest, nothing written so far is skipped
    assert later[f"{late}-1"].backlog_end == 4
    assert later[f"{late}-0"].backlog_end is None
    assert later[f"{early}-0"] == initial[f"{early}-0"]
    assert source.subscriptions() == frozenset({early, late})


def test_partitions_added_to_a_topic_are_discovered_at_the_next_epoch(bootstrap: str) -> None:
    topic = create_topic(bootstrap, 2)
    source = KafkaSource(bootstrap, topics=[topic])
    assert len(source.discover_splits()) == 2

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_partitions([NewPartitions(topic, 4)]).values():
        future.result(timeout=30)
    wait_for_leaders(admin, topic, 4)

    rounds = []
    for _ in range(50):  # one discovery per epoch; a partition still loading waits for a later round
        rounds.append([s.split_id for s in source.discover_splits()])
        if len(rounds[-1]) == 4:
            break
        time.sleep(0.1)
    assert rounds[-1] == [f"{topic}-{p}" for p in range(4)]
    assert all({f"{topic}-0", f"{topic}-1"} <= set(ids) for ids in rounds)


def test_restored_pipeline_starts_splits_new_to_its_checkpoint_at_the_earliest_offset(bootstrap: str) -> None:
    topic = create_topic(bootstrap, 1)
    produce(bootstrap, topic, {0: messages(0, 6)})
    source = KafkaSource(bootstrap, topics=[topic], starting="latest")
    source.mark_initial_discovery_finished()

    (split,) = source.discover_splits()

    assert (split.position, split.backlog_end) == (0, 6)


# --------------------------------------------------------------------------- starting positions


def test_starting_timestamp_begins_at_the_first_record_at_or_after_it(bootstrap: str) -> None:
    topic = create_topic(bootstrap, 2)
    base = 1_700_000_000_000
    produce(bootstrap, topic, {0: messages(0, 3)}, timestamp_ms=base)
    produce(bootstrap, topic, {0: messages(0, 2, start=3)}, timestamp_ms=base + 60_000)
    produce(bootstrap, topic, {1: messages(1, 2)}, timestamp_ms=base)

    splits = by_id(KafkaSource(bootstrap, topics=[topic], starting=f"timestamp:{base + 1}").discover_splits())

    assert splits[f"{topic}-0"].position == 3
    assert splits[f"{topic}-1"].position == 2  # every record is older: start at the end
    assert splits[f"{topic}-0"].backlog_end == 5
    assert splits[f"{topic}-1"].backlog_end is None


def test_starting_group_uses_committed_offsets_and_logs_the_earliest_fallback(
    bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic = create_topic(bootstrap, 2)
    produce(bootstrap, topic, {0: messages(0, 5), 1: messages(1, 5)})
    group = unique("group")
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    committer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    committer.close()

    with caplog.at_level(logging.INFO, logger="splitkeeper.sources.kafka"):
        splits = by_id(
            KafkaSource(bootstrap, topics=[topic], starting="group", group_id=group).discover_splits()
        )

    assert splits[f"{topic}-0"].position == 4
    assert splits[f"{topic}-1"].position == 0
    assert any(
        "no committed offset" in r.getMessage() and f"{topic}-1" in r.getMessage() for r in caplog.records
    )


# --------------------------------------------------------------------------- reading


def test_planned_ranges_read_every_message_exactly_once_with_contiguous_offsets(bootstrap: str) -> None:
    topic = create_topic(bootstrap, 4)
    counts = {0: 23, 1: 7, 2: 1, 3: 0}
    produce(bootstrap, topic, {p: messages(p, n) for p, n in counts.items()})
    source = KafkaSource(bootstrap, topics=[topic])

    for split in source.discover_splits():
        partition = parse_split_id(split.split_id)[1]
        assert source.available_end(split) == counts[partition]
        ranges = read_planned(source, split, budget=5)
        chained = [r for rng in ranges for r in rng]
        assert [r.value for r in chained] == [m.encode() for m in messages(partition, counts[partition])]
        assert [r.offset for r in chained] == list(range(counts[partition]))
        assert len(ranges) == -(-counts[partition] // 5)
        if chained:
            assert_chain(chained, 0, counts[partition])


def test_reader_keeps_values_as_bytes_invalid_utf8_too_and_tombstones_as_null(bootstrap: str) -> None:
    topic = create_topic(bootstrap, 1)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, value=b"ok-\xff", partition=0, timestamp=1_700_000_000_123)
    producer.produce(topic, value=None, key=b"k", partition=0, headers=[("trace", b"t1"), ("empty", None)])
    producer.produce(topic, value="é".encode(), partition=0)
    producer.produce(topic, value=b"", partition=0)
    producer.flush(30)
    split = Split(split_id_of(topic, 0), subscription=topic)

    records = list(KafkaRegionReader(bootstrap).read_range(split, 0, 4))

    assert [r[:3] for r in records] == [(0, 1, b"ok-\xff"), (1, 2, None), (2, 3, "é".encode()), (3, 4, b"")]
    columns = KafkaRegionReader(bootstrap).read_range_columns(split, 0, 4)
    assert columns.values.type == pa.binary()
    assert columns.values.to_pylist() == [b"ok-\xff", None, "é".encode(), b""]
    # the message's metadata travels with it (the sink's key/topic/partition/timestamp/headers)
    metas = [r.meta for r in records]
    assert all(m is not None and (m.topic, m.partition) == (topic, 0) for m in metas)
    assert [m.key for m in metas if m] == [None, b"k", None, None]
    assert metas[0] is not None and metas[0].timestamp_ms == 1_700_000_000_123
    assert metas[1] is not None and metas[1].headers == (("trace", b"t1"), ("empty", None))
    assert metas[2] is not None and metas[2].headers == () and metas[2].timestamp_ms is not None


def test_metadata_interval_reuses_the_partitions_but_lists_the_ends_every_round(bootstrap: str) -> None:
    # source.metadata_interval_s: discovery asks for the topics, partitions and topic ids at most
    # that often; every round still lists the end offsets, so new records are planned at once.
    topic = create_topic(bootstrap, 2)
    produce(bootstrap, topic, {0: ["a"], 1: ["b"]})
    source = KafkaSource(bootstrap, topics=[topic], metadata_interval_s=5.0)
    try:
        asked = time.monotonic()
        splits = source.discover_splits()
        assert [source.available_end(s) for s in splits] == [1, 1]
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_partitions([NewPartitions(topic, 3)]).values():
            future.result(timeout=30)
        wait_for_leaders(admin, topic, 3)
        produce(bootstrap, topic, {0: ["c", "d"], 2: ["e"]})
        source.check_splits(splits, {})
        again = source.discover_splits()  # within the interval: the partitions asked before
        if time.monotonic() - asked < 4.5:  # (not when the machine was too slow to tell)
            assert [s.split_id for s in again] == [f"{topic}-0", f"{topic}-1"]
        assert [source.available_end(s) for s in again[:2]] == [3, 1]
        time.sleep(max(0.0, 5.1 - (time.monotonic() - asked)))
        for _ in range(50):  # the interval passed: asked again, the new partition found
            source.check_splits(again, {})
            later = source.discover_splits()
            if len(later) == 3:  # (a partition still loading waits for a later round)
                break
            time.sleep(0.1)
        assert [s.split_id for s in later] == [f"{topic}-{p}" for p in range(3)]
        assert [source.available_end(s) for s in later] == [3, 1, 1]
    finally:
        source.close()


def test_a_topic_deleted_within_the_metadata_interval_fails_its_splits_only_and_is_seen_next_round(
    bootstrap: str,
) -> None:
    kept, gone = create_topic(bootstrap, 2), create_topic(bootstrap, 1)
    produce(bootstrap, kept, {0: ["a"], 1: ["b", "c"]})
    source = KafkaSource(bootstrap, topics=[kept, gone], metadata_interval_s=600)
    try:
        before = source.discover_splits()
        ends = {s.split_id: source.available_end(s) for s in before}
        assert ends == {f"{kept}-0": 1, f"{kept}-1": 2, f"{gone}-0": 0}
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.delete_topics([gone]).values():
            future.result(timeout=30)
        deadline = time.monotonic() + 30
        while gone in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
            time.sleep(0.1)  # until the deletion took effect
        splits = {s.split_id: s for s in source.discover_splits()}
        assert sorted(splits) == sorted(ends)  # the kept answer still names the deleted topic's partition
        started = time.monotonic()
        assert [source.available_end(splits[f"{kept}-{p}"]) for p in (0, 1)] == [1, 2]
        with pytest.raises(SourceError, match=f"end offset of {gone}-0 cannot be listed") as failed:
            source.available_end(splits[f"{gone}-0"])
        assert "source.metadata_interval_s" in str(failed.value)
        assert time.monotonic() - started < 8  # not waited for until connect_timeout_s passes
        with pytest.raises(SourceError, match="explicitly|does not exist|do not exist"):
            source.subscriptions()  # the next round asks the cluster again: the topic is gone
    finally:
        source.close()


def _ends_once_settled(source: KafkaSource, want: list[int], timeout_s: float = 20.0) -> list[int]:
    """The ends ``source`` lists, listed again (a new discovery round each time) until they are
    ``want`` or ``timeout_s`` passed. ``commit_transaction`` returns once the coordinator has the
    commit; it writes the markers to the partitions after that, so a partition's last stable offset
    can lag the commit for a moment (a CI run saw [4, 0] for [4, 2]). Never past ``want``: the
    records of a transaction not yet committed on a partition are never planned."""
    deadline = time.monotonic() + timeout_s
    while True:
        ends = [source.available_end(s) for s in source.discover_splits()]
        assert all(end <= top for end, top in zip(ends, want, strict=True)), (ends, want)
        if ends == want or time.monotonic() > deadline:
            return ends
        time.sleep(0.1)


def test_the_end_stops_at_an_open_transaction_on_both_ways_of_listing_it(bootstrap: str) -> None:
    # The end offsets of an epoch come from the offsets consumer (read_committed); when it does
    # not answer every partition the admin client lists them. Both give the last stable offset:
    # the records of an open transaction are not planned until it commits.
    topic = create_topic(bootstrap, 2)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("txn")})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value="c0", partition=0)
    producer.commit_transaction(30)  # offset 0, commit marker 1
    producer.begin_transaction()
    producer.produce(topic, value="open", partition=0)
    producer.produce(topic, value="open", partition=1)
    producer.flush(30)  # offsets 2 (partition 0) and 0 (partition 1) are in a transaction still open
    fast = KafkaSource(bootstrap, topics=[topic])
    listed = KafkaSource(bootstrap, topics=[topic])
    listed._end_offsets = lambda split_ids: None  # type: ignore[method-assign]  # the admin client's way
    try:
        for source in (fast, listed):
            assert _ends_once_settled(source, [2, 0]) == [2, 0]
        producer.commit_transaction(30)
        for source in (fast, listed):
            assert _ends_once_settled(source, [4, 2]) == [4, 2]
    finally:
        fast.close()
        listed.close()


def test_transaction_markers_and_aborted_records_are_gaps_the_position_moves_over(bootstrap: str) -> None:
    topic = create_topic(bootstrap, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("txn")})
    producer.init_transactions(30)
    producer.begin_transaction()
    for value in ("c0", "c1", "c2"):
        producer.produce(topic, value=value, partition=0)
    producer.commit_transaction(30)  # offsets 0-2, commit marker 3
    producer.begin_transaction()
    for value in ("a0", "a1"):
        producer.produce(topic, value=value, partition=0)
    producer.flush(30)
    producer.abort_transaction(30)  # offsets 4-5 aborted, abort marker 6
    producer.begin_transaction()
    producer.produce(topic, value="c3", partition=0)
    producer.commit_transaction(30)  # offset 7, commit marker 8
    source = KafkaSource(bootstrap, topics=[topic])
    (split,) = source.discover_splits()
    end = source.available_end(split)
    reader = source.reader()

    whole = list(reader.read_range(split, 0, end))
    ending_inside_a_gap = list(reader.read_range(split, 0, 5))
    only_a_gap = list(reader.read_range(split, 4, 7))
    after_the_gap = list(reader.read_range(split, 5, end))

    assert end == 9
    assert [(r.offset, r.value) for r in whole] == [(0, b"c0"), (1, b"c1"), (2, b"c2"), (7, b"c3")]
    assert_chain(whole, 0, end)  # each gap belongs to the record before it
    assert [r.next_offset for r in ending_inside_a_gap] == [1, 2, 5]
    assert only_a_gap == []
    assert [(r.offset, r.next_offset) for r in after_the_gap] == [(7, 9)]


def test_invalid_ranges_and_split_ids_are_refused_on_the_call(bootstrap: str) -> None:
    reader = KafkaRegionReader(bootstrap)
    split = Split("orders-0", subscription="orders")
    with pytest.raises(SourceError, match=r"range \[5, 4\) is not allowed"):
        reader.read_range(split, 5, 4)
    with pytest.raises(SourceError, match="not a Kafka split id"):
        reader.read_range(Split("no_partition"), 0, 1)
    assert list(reader.read_range(split, 3, 3)) == []


def test_reading_a_deleted_topic_names_the_split(bootstrap: str) -> None:
    topic = unique("never-created")
    split = Split(split_id_of(topic, 0), subscription=topic)
    with pytest.raises(SourceError, match=f"topic '{topic}' does not exist"):
        list(KafkaRegionReader(bootstrap, connect_timeout_s=5).read_range(split, 0, 1))


def test_reader_is_picklable_and_carries_no_client(bootstrap: str) -> None:
    topic = create_topic(bootstrap, 1)
    source = KafkaSource(bootstrap, topics=[topic], client_config={"fetch.wait.max.ms": "50"})
    shipped = pickle.loads(pickle.dumps(source.reader()))
    assert shipped == source.reader()
    assert shipped.consumer_config == (("fetch.wait.max.ms", "50"),)


# --------------------------------------------------------------------------- backlog (protocol section 4)


def test_backlog_boundaries_are_the_end_offsets_at_start_and_empty_splits_are_not_in_backlog(
    bootstrap: str,
) -> None:
    topic = create_topic(bootstrap, 3)
    produce(bootstrap, topic, {0: messages(0, 4), 1: messages(1, 9)})
    source = KafkaSource(bootstrap, topics=[topic])
    splits = by_id(source.discover_splits())

    assert {sid: s.backlog_end for sid, s in splits.items()} == {
        f"{topic}-0": 4,
        f"{topic}-1": 9,
        f"{topic}-2": None,
    }
    enumerator = enumerator_for(source, RecordingEnumeratorContext(2), "round-robin")
    enumerator.start()
    assert enumerator.processing_backlog
    assert enumerator.backlog.splits_in_backlog() == [f"{topic}-0", f"{topic}-1"]

    split0 = splits[f"{topic}-0"]
    assert source.available_end(split0) == 4
    produce(bootstrap, topic, {0: messages(0, 3, start=4), 2: messages(2, 2)})
    assert source.available_end(split0) == 4  # cached for this discovery round (epoch)
    again = by_id(source.discover_splits())
    assert again[f"{topic}-0"].backlog_end == 4  # the boundary does not move with new data
    assert again[f"{topic}-2"].backlog_end is None
    assert source.available_end(split0) == 7
    assert source.available_end(again[f"{topic}-2"]) == 2


# ------------------------------------------------------------- external offsets (protocol section 3)


def test_committed_positions_round_trip_with_the_checkpoint_id_and_disagreements_are_reported(
    bootstrap: str,
) -> None:
    topic = create_topic(bootstrap, 3)
    produce(bootstrap, topic, {p: messages(p, 10) for p in range(3)})
    group = unique("sk-group")
    source = KafkaSource(bootstrap, topics=[topic], group_id=group)
    s0, s1, s2 = (split_id_of(topic, p) for p in range(3))

    source.commit_positions(7, {s0: 4, s1: 10})
    source.commit_positions(7, {s0: 4, s1: 10})  # a repeat after a crash is harmless

    assert source.committed_positions() == {s0: ExternalPosition(4, 7), s1: ExternalPosition(10, 7)}
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    raw = probe.committed([TopicPartition(topic, 0)], timeout=10)[0]
    probe.close()
    assert (raw.offset, json.loads(raw.metadata or "null")) == (4, {COMMIT_METADATA_KEY: 7})

    disagreements = reconcile_positions({s0: 6, s1: 10, s2: 3}, source.committed_positions())
    assert [(d.split_id, d.kind) for d in disagreements] == [
        (s0, DisagreementKind.DIFFERENT_POSITION),
        (s2, DisagreementKind.MISSING_EXTERNALLY),
    ]
    assert "checkpoint position 6 is used; external position 4 (tagged checkpoint 7) ignored" in (
        disagreements[0].detail
    )


def test_a_late_commit_of_an_older_checkpoint_never_moves_the_group_backwards(
    bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic = create_topic(bootstrap, 3)
    group = unique("sk-group")
    run_b = KafkaSource(bootstrap, topics=[topic], group_id=group)  # the run that took over
    run_a = KafkaSource(bootstrap, topics=[topic], group_id=group)  # a paused old run, woken up
    s0, s1, s2 = (split_id_of(topic, p) for p in range(3))
    run_b.commit_positions(7, {s0: 40, s1: 100})

    with caplog.at_level(logging.WARNING, logger="splitkeeper.sources.kafka"):
        run_a.commit_positions(5, {s0: 20, s1: 60, s2: 3})  # checkpoint 5's offsets, committed late

    # refused where the group holds checkpoint 7's offsets; s2, which no newer checkpoint committed, lands
    assert run_b.committed_positions() == {
        s0: ExternalPosition(40, 7),
        s1: ExternalPosition(100, 7),
        s2: ExternalPosition(3, 5),
    }
    refusal = [r.getMessage() for r in caplog.records if "refused to commit checkpoint 5" in r.getMessage()]
    assert len(refusal) == 1 and f"{s0}: offset 40 of checkpoint 7" in refusal[0] and s2 not in refusal[0]
    run_b.commit_positions(8, {s0: 10})  # a newer checkpoint (a rewind, a reset) may move it back
    assert run_b.committed_positions()[s0] == ExternalPosition(10, 8)


def test_offsets_committed_by_other_tools_are_reported_untagged_and_logged(
    bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An offset another tool committed (no checkpoint tag: moved by hand) is an external position like
    any other, with no checkpoint id, so a restore names it when it disagrees (protocol rule 3.3)."""
    topic = create_topic(bootstrap, 2)
    group = unique("sk-group")
    other = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    other.commit(offsets=[TopicPartition(topic, 1, 0, metadata="someone else")], asynchronous=False)
    other.close()
    source = KafkaSource(bootstrap, topics=[topic], group_id=group)
    source.commit_positions(3, {split_id_of(topic, 0): 0})

    with caplog.at_level(logging.WARNING, logger="splitkeeper.sources.kafka"):
        assert source.committed_positions() == {
            split_id_of(topic, 0): ExternalPosition(0, 3),
            split_id_of(topic, 1): ExternalPosition(0, None),
        }
    assert any(f"{topic}-1" in r.getMessage() for r in caplog.records)


def test_without_a_group_id_nothing_is_committed_externally(bootstrap: str) -> None:
    topic = create_topic(bootstrap, 1)
    source = KafkaSource(bootstrap, topics=[topic])
    source.commit_positions(1, {split_id_of(topic, 0): 0})
    assert source.group_id is None
    assert source.committed_positions() == {}


# --------------------------------------------------------------------------- retention


@pytest.fixture
def aged_topic(bootstrap: str) -> Iterator[str]:
    """A one-partition topic of 20 records whose first 10 were deleted (log start offset 10)."""
    topic = create_topic(bootstrap, 1)
    produce(bootstrap, topic, {0: messages(0, 20)})
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 10)]).values():
        future.result(timeout=30)
    yield topic


def test_aged_out_offsets_fail_the_plan_naming_the_partition_offsets_and_config_key(
    bootstrap: str, aged_topic: str
) -> None:
    source = KafkaSource(bootstrap, topics=[aged_topic], on_offset_out_of_range="fail")
    split = Split(split_id_of(aged_topic, 0), subscription=aged_topic, position=3)

    with pytest.raises(SourceError) as caught:
        source.check_retention([PlannedRange(split, 3, 8)])

    message = str(caught.value)
    assert f"topic '{aged_topic}' partition 0: requested offset 3, earliest available 10" in message
    assert "source.on_offset_out_of_range: skip" in message
    assert caught.value.params["earliest"] == {split.split_id: 10}


def test_aged_out_offsets_are_skipped_and_reported_as_a_lost_range(bootstrap: str, aged_topic: str) -> None:
    source = KafkaSource(bootstrap, topics=[aged_topic], on_offset_out_of_range=OffsetOutOfRange.SKIP)
    split = Split(split_id_of(aged_topic, 0), subscription=aged_topic, position=3)
    kept = Split(split_id_of(aged_topic, 0), subscription=aged_topic, position=12)

    check = source.check_retention([(split, 3, 8), (kept, 12, 14)])

    assert check.lost == (LostRange(split.split_id, 3, 10),)
    assert check.lost[0].count == 7
    assert check.ranges == (PlannedRange(split, 10, 15), PlannedRange(kept, 12, 14))
    records = list(source.reader().read_range(split, 10, 15))
    assert [r.value for r in records] == [m.encode() for m in messages(0, 5, start=10)]


def test_the_reader_never_skips_aged_out_offsets_even_with_skip_configured(
    bootstrap: str, aged_topic: str
) -> None:
    source = KafkaSource(bootstrap, topics=[aged_topic], on_offset_out_of_range="skip")
    split = Split(split_id_of(aged_topic, 0), subscription=aged_topic)

    with pytest.raises(SourceError, match="planned offset 3 .* earliest available offset is 10"):
        list(source.reader().read_range(split, 3, 12))


def test_discovery_from_earliest_starts_at_the_log_start_offset(bootstrap: str, aged_topic: str) -> None:
    (split,) = KafkaSource(bootstrap, topics=[aged_topic]).discover_splits()
    assert (split.position, split.backlog_end) == (10, 20)


# --------------------------------------------------------------------------- bad input


def test_unreachable_broker_fails_fast_naming_the_servers_and_the_fix(closed_port_servers: str) -> None:
    source = KafkaSource(closed_port_servers, topics=["orders"], timeout_s=2)

    began = time.monotonic()
    with pytest.raises(SourceError) as caught:
        source.discover_splits()
    elapsed = time.monotonic() - began

    assert elapsed < 6
    assert str(caught.value).startswith(
        f"[SOURCE_ERROR] Kafka is not reachable at source.bootstrap_servers='{closed_port_servers}' "
        "(no answer within 2s: "
    )
    assert "bash scripts/kafka.sh status" in str(caught.value)


def test_unreachable_broker_fails_a_region_read_within_the_connect_timeout(closed_port_servers: str) -> None:
    reader = KafkaRegionReader(closed_port_servers, connect_timeout_s=2)
    began = time.monotonic()
    with pytest.raises(SourceError, match="Kafka is not reachable at source.bootstrap_servers"):
        list(reader.read_range(Split("orders-0", subscription="orders"), 0, 10))
    assert time.monotonic() - began < 6


def test_a_coordinator_request_that_times_out_is_sent_again_on_a_new_admin_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """librdkafka can stay wedged after a broker restart: a FindCoordinator lost with the bootstrap
    connection is never sent again and every group request of that client times out (seen in
    ``splitkeeper-tools chaos`` after a broker SIGKILL). The source asks again on a fresh client."""
    from confluent_kafka import KafkaError, KafkaException

    import splitkeeper.sources.kafka.source as kafka_module

    tag = json.dumps({COMMIT_METADATA_KEY: 7})

    class Done:
        def __init__(self, value: object) -> None:
            self.value = value

        def result(self) -> object:
            return self.value

    class Wedged:
        def list_consumer_group_offsets(self, request: object, request_timeout: float) -> object:
            raise KafkaException(
                KafkaError(
                    KafkaError._TIMED_OUT, "Failed while waiting for response from broker: Local: Timed out"
                )
            )

    class Fresh:
        def list_consumer_group_offsets(self, request: object, request_timeout: float) -> object:
            listed = type("Listed", (), {"topic_partitions": [TopicPartition("orders", 0, 42, metadata=tag)]})
            return {"pipeline-group": Done(listed)}

    made: list[object] = []
    monkeypatch.setattr(
        kafka_module, "AdminClient", lambda conf: made.append(Wedged() if not made else Fresh()) or made[-1]
    )
    source = KafkaSource("127.0.0.1:9", topics=["orders"], group_id="pipeline-group", timeout_s=30)

    assert source.committed_positions() == {"orders-0": ExternalPosition(42, 7)}
    assert [type(c).__name__ for c in made] == ["Wedged", "Fresh"]


def test_missing_topic_in_the_list_is_named_with_the_existing_topics(bootstrap: str) -> None:
    present = create_topic(bootstrap, 1)
    missing = unique("missing")
    source = KafkaSource(bootstrap, topics=[present, missing])

    with pytest.raises(SourceError) as caught:
        source.discover_splits()

    message = str(caught.value)
    assert f"source.topics names '{missing}', which does not exist on Kafka at {bootstrap}" in message
    assert "did you mean" not in message  # nothing there is spelt like it
    # the message shows the first 50 topics by name (the suite's broker holds more by now); the
    # error's params hold them all
    assert present in caught.value.params["existing"]
    listed = message.split("existing topics: ")[1].split(". Create the topic")[0]
    assert present in listed or f"({len(caught.value.params['existing'])} topics)" in listed
    assert "__consumer_offsets" not in message
    with pytest.raises(SourceError, match=missing):
        source.subscriptions()


def test_a_misspelt_topic_is_named_with_the_topic_it_resembles(bootstrap: str) -> None:
    present = create_topic(bootstrap, 1)
    misspelt = present[:-1] + ("x" if present[-1] != "x" else "y")
    with pytest.raises(SourceError) as caught:
        KafkaSource(bootstrap, topics=[misspelt]).discover_splits()
    message = str(caught.value)
    assert f"source.topics names '{misspelt}', which does not exist on Kafka at {bootstrap}" in message
    assert f"; did you mean '{present}'?" in message


def test_invalid_constructor_arguments_name_the_parameter() -> None:
    with pytest.raises(InvalidParameterError, match="exactly one of topics"):
        KafkaSource("127.0.0.1:9092", topics=["a"], topic_pattern="a.*")
    with pytest.raises(InvalidParameterError, match="starting='timestamp:soon'"):
        KafkaSource("127.0.0.1:9092", topics=["a"], starting="timestamp:soon")
    with pytest.raises(InvalidParameterError, match="group_id=None"):
        KafkaSource("127.0.0.1:9092", topics=["a"], starting="group")
    with pytest.raises(InvalidParameterError, match="on_offset_out_of_range='drop'"):
        KafkaSource("127.0.0.1:9092", topics=["a"], on_offset_out_of_range="drop")


# --------------------------------------------------------------------------- wiring


def test_build_source_makes_a_reassignable_kafka_source_from_the_config(
    bootstrap: str, tmp_path: Path
) -> None:
    topic = create_topic(bootstrap, 2)
    source = {
        "kind": "kafka",
        "bootstrap_servers": bootstrap,
        "topics": [topic],
        "starting": "latest",
        "group_id": "g",
        "on_offset_out_of_range": "skip",
    }
    places = {"state": {"path": str(tmp_path / "state")}, "sink": {"path": str(tmp_path / "sink")}}
    config = config_from_mapping({"name": "t", "source": source, **places}).source

    source = build_source(config)

    assert isinstance(source, KafkaSource)
    assert (source.group_id, source.on_offset_out_of_range) == ("g", OffsetOutOfRange.SKIP)
    assert enumerator_for(source, RecordingEnumeratorContext(2)).reassign_on_recovery
    cluster_id = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).cluster_id
    assert source.fingerprint() == f"kafka-{cluster_id}"
    # adding a topic to the subscription keeps the pipeline's state usable (protocol rule 1.5)
    assert KafkaSource(bootstrap, topic_pattern=f"{topic}|other").fingerprint() == source.fingerprint()


# --------------------------------------------------------------------------- the columnar read path


class _PerRecord(RegionReader):
    """The Kafka reader's per-record path only (the region task then stages record by record)."""

    def __init__(self, reader: KafkaRegionReader) -> None:
        self.reader = reader

    def read_range(self, split: Split, start: int, end: int) -> Iterator[SourceRecord]:
        return self.reader.read_range(split, start, end)


def _staged(reader: RegionReader, split: Split, start: int, end: int, root: Path) -> list[dict[str, object]]:
    result = run_region_task([(split, start, end)], reader, identity, str(root), 1, 0)
    table = pq.read_table(result.staged_path or "").drop_columns(["ingested_at"])
    return table.to_pylist()


def test_columnar_and_per_record_reads_stage_the_same_rows_keys_headers_and_gaps(
    bootstrap: str, tmp_path: Path
) -> None:
    topic = create_topic(bootstrap, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("txn")})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"ok-\xff", key=b"k0", partition=0, timestamp=1_700_000_000_123)
    producer.produce(topic, value=None, key=b"k1", partition=0, headers=[("trace", b"t1"), ("empty", None)])
    producer.produce(topic, value="é".encode(), partition=0)
    producer.commit_transaction(30)  # offsets 0-2, commit marker 3
    producer.begin_transaction()
    producer.produce(topic, value="aborted", key=b"a", partition=0)
    producer.produce(topic, value="aborted", partition=0)
    producer.flush(30)
    producer.abort_transaction(30)  # offsets 4-5 aborted, abort marker 6
    producer.begin_transaction()
    for i in range(5):
        producer.produce(
            topic, value=f"c{i}", key=f"k{i}".encode(), partition=0, headers=[("i", str(i).encode())]
        )
    producer.commit_transaction(30)  # offsets 7-11, commit marker 12
    source = KafkaSource(bootstrap, topics=[topic])
    (split,) = source.discover_splits()
    end = source.available_end(split)
    reader = dataclasses.replace(source.reader(), batch_size=2)  # several consumed batches per range
    assert isinstance(reader, SupportsColumnarRead)

    for n, (start, stop) in enumerate([(0, end), (0, 5), (4, 7), (5, end), (1, 9), (3, 3)]):
        columnar = _staged(reader, split, start, stop, tmp_path / f"c{n}")
        per_record = _staged(_PerRecord(reader), split, start, stop, tmp_path / f"r{n}")
        assert columnar == per_record, (start, stop)
        columns = reader.read_range_columns(split, start, stop)
        assert list(columns.records()) == list(reader.read_range(split, start, stop)), (start, stop)

    whole = _staged(reader, split, 0, end, tmp_path / "whole")
    assert end == 13
    assert [(r["offset"], r["next_offset"], r["value"]) for r in whole] == [
        (0, 1, b"ok-\xff"),
        (1, 2, None),
        (2, 7, "é".encode()),
        *[(7 + i, 8 + i, f"c{i}".encode()) for i in range(4)],
        (11, 13, b"c4"),
    ]
    assert [r["key"] for r in whole] == [b"k0", b"k1", None, *[f"k{i}".encode() for i in range(5)]]
    assert {(r["topic"], r["partition"]) for r in whole} == {(topic, 0)}
    assert whole[0]["timestamp"] == datetime.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=datetime.UTC)
    assert whole[1]["headers"] == [{"key": "trace", "value": b"t1"}, {"key": "empty", "value": None}]
    assert whole[0]["headers"] == [] and whole[3]["headers"] == [{"key": "i", "value": b"0"}]


def test_columnar_read_raises_what_the_per_record_read_raises(bootstrap: str, tmp_path: Path) -> None:
    topic = unique("never-created")
    split = Split(split_id_of(topic, 0), subscription=topic)
    reader = KafkaRegionReader(bootstrap, connect_timeout_s=5)
    errors = []
    for n, candidate in enumerate([reader, _PerRecord(reader)]):
        with pytest.raises(SplitReadError) as caught:
            run_region_task([(split, 0, 1)], candidate, identity, str(tmp_path / str(n)), 1, 0)
        errors.append(str(caught.value))
    assert errors[0] == errors[1]
    assert f"topic '{topic}' does not exist" in errors[0]
    with pytest.raises(SourceError, match=r"range \[5, 4\) is not allowed"):
        reader.read_range_columns(split, 5, 4)


def test_a_region_of_several_partitions_read_at_once_equals_reading_each_range(
    bootstrap: str, tmp_path: Path
) -> None:
    topic = create_topic(bootstrap, 4)
    other = create_topic(bootstrap, 1)
    counts = {0: 23, 1: 7, 2: 0, 3: 5}
    produce(bootstrap, topic, {p: messages(p, n) for p, n in counts.items()})
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(6):
        producer.produce(other, value=f"o{i}", key=f"k{i}".encode(), partition=0, headers=[("h", b"v")])
    assert producer.flush(30) == 0
    splits = by_id(KafkaSource(bootstrap, topics=[topic, other]).discover_splits())
    plan = [
        (splits[split_id_of(topic, 0)], 3, 20),  # ends before the partition's end
        (splits[split_id_of(topic, 1)], 0, 7),  # ends at the high watermark
        (splits[split_id_of(topic, 2)], 0, 0),  # an empty partition, an empty range
        (splits[split_id_of(topic, 3)], 2, 2),  # an empty range in a partition with records
        (splits[split_id_of(other, 0)], 1, 6),  # another topic, keys and headers
    ]
    reader = KafkaRegionReader(bootstrap, batch_size=4)  # several consumed batches

    together = list(reader.read_ranges_columns(plan))

    assert [list(c.records()) for c in together] == [list(reader.read_range(*r)) for r in plan]
    assert [c.values.to_pylist() for c in together] == [
        [m.encode() for m in messages(0, 17, start=3)],
        [m.encode() for m in messages(1, 7)],
        [],
        [],
        [f"o{i}".encode() for i in range(1, 6)],
    ]
    result = run_region_task(plan, reader, identity, str(tmp_path), 1, 0)
    assert result.positions == {s.split_id: end for s, _start, end in plan}
    staged = pq.read_table(result.staged_path or "").to_pylist()
    assert sorted((r["topic"], r["partition"], r["offset"], r["value"], r["key"]) for r in staged) == sorted(
        (rec.meta.topic, rec.meta.partition, rec.offset, rec.value, rec.meta.key)
        for r in plan
        for rec in reader.read_range(*r)
        if rec.meta is not None
    )


def test_a_failure_in_one_partition_of_a_region_read_names_that_split(
    bootstrap: str, aged_topic: str, tmp_path: Path
) -> None:
    good = create_topic(bootstrap, 1)
    produce(bootstrap, good, {0: messages(0, 5)})
    ok = Split(split_id_of(good, 0), subscription=good)
    aged = Split(split_id_of(aged_topic, 0), subscription=aged_topic)
    reader = KafkaRegionReader(bootstrap)

    with pytest.raises(SourceError, match="planned offset 3 .* earliest available offset is 10") as caught:
        list(reader.read_ranges_columns([(ok, 0, 5), (aged, 3, 12)]))
    assert caught.value.params["split_id"] == aged.split_id
    with pytest.raises(SplitReadError) as failed:
        run_region_task([(ok, 0, 5), (aged, 3, 12)], reader, identity, str(tmp_path), 1, 0)
    assert str(failed.value).startswith(f'[SPLIT_READ_FAILED] split "{aged.split_id}" at offset 3:')
    with pytest.raises(SourceError, match="planned twice in one read"):
        list(reader.read_ranges_columns([(ok, 0, 2), (ok, 2, 5)]))


def test_a_kept_consumer_serves_later_reads_exactly_and_a_failed_read_closes_it(
    bootstrap: str, aged_topic: str
) -> None:
    """A long-lived reader slot keeps its consumer (splitkeeper.clients): each later read of the same
    settings borrows it, assigns its own partitions at their starts and reads them exactly (forward,
    back, another partition, records fetched for an earlier assignment never leak in); a failed
    read closes it, and nothing is kept outside the block."""
    from splitkeeper import clients

    topic = create_topic(bootstrap, 2)
    produce(bootstrap, topic, {0: messages(0, 30), 1: messages(1, 10)})
    p0, p1 = (Split(split_id_of(topic, p), subscription=topic) for p in (0, 1))
    aged = Split(split_id_of(aged_topic, 0), subscription=aged_topic)
    reader = KafkaRegionReader(bootstrap, batch_size=4)
    key = ("kafka-reader", bootstrap, reader.connect_timeout_s, reader.consumer_config)

    def values(*plan: tuple[Split, int, int]) -> list[list[bytes]]:
        return [c.values.to_pylist() for c in reader.read_ranges_columns(list(plan))]

    with clients.kept_clients():
        assert values((p0, 0, 5)) == [[m.encode() for m in messages(0, 5)]]
        first = clients.borrow(key)
        assert first is not None  # handed back, not closed
        clients.give_back(key, first, lambda kept: kept[0].close())
        assert values((p0, 5, 12), (p1, 2, 10)) == [  # the next epoch's ranges, another partition too
            [m.encode() for m in messages(0, 7, start=5)],
            [m.encode() for m in messages(1, 8, start=2)],
        ]
        assert values((p0, 1, 3)) == [[m.encode() for m in messages(0, 2, start=1)]]  # back again
        assert [r.offset for r in reader.read_range(p1, 7, 10)] == [7, 8, 9]
        again = clients.borrow(key)
        assert again is not None and again[0] is first[0]  # the same consumer served every read
        clients.give_back(key, again, lambda kept: kept[0].close())
        with pytest.raises(SourceError, match="earliest available offset is 10"):
            values((p0, 0, 5), (aged, 3, 12))
        assert clients.borrow(key) is None  # the failed read closed it
        assert values((p0, 28, 30)) == [[m.encode() for m in messages(0, 2, start=28)]]  # a new one
        fresh = clients.borrow(key)
        assert fresh is not None and fresh[0] is not first[0]
        clients.give_back(key, fresh, lambda kept: kept[0].close())
    assert clients.borrow(key) is None  # nothing is kept outside the block
    assert values((p0, 0, 2)) == [[m.encode() for m in messages(0, 2)]]
    assert clients.borrow(key) is None


def test_a_kept_consumers_next_read_does_not_wait_for_a_fetch_held_at_the_partitions_end(
    bootstrap: str,
) -> None:
    """Issue 41: a read that reaches a partition's end leaves a fetch held at the broker for
    ``fetch.wait.max.ms`` (librdkafka prefetches to the end); a long-lived slot's kept consumer then
    waited that long before its next read could fetch (librdkafka's default 500 ms: bounded
    ``readers: long_lived`` Kafka runs were slower than a job per epoch). A reader asks for
    FETCH_WAIT_MS unless ``source.client`` sets it; each read is exact either way."""
    from splitkeeper import clients
    from splitkeeper.sources.kafka.source import FETCH_WAIT_MS

    topic = create_topic(bootstrap, 2)
    produce(bootstrap, topic, {0: messages(0, 20), 1: messages(1, 20)})
    p0, p1 = (Split(split_id_of(topic, p), subscription=topic) for p in (0, 1))

    def next_reads(reader: KafkaRegionReader) -> list[float]:
        """Seconds of a kept consumer's read of p1, each shortly after a read of p0 to its end."""
        took = []
        with clients.kept_clients():
            for _ in range(5):
                assert [c.values.to_pylist() for c in reader.read_ranges_columns([(p0, 0, 20)])] == [
                    [m.encode() for m in messages(0, 20)]
                ]
                time.sleep(0.1)  # librdkafka's fetch at p0's end is sent (and held by the broker)
                started = time.monotonic()
                assert [c.values.to_pylist() for c in reader.read_ranges_columns([(p1, 0, 20)])] == [
                    [m.encode() for m in messages(1, 20)]
                ]
                took.append(time.monotonic() - started)
        return took

    ours = KafkaRegionReader(bootstrap)
    assert ours._consumer_conf()["fetch.wait.max.ms"] == FETCH_WAIT_MS <= 50
    librdkafkas = KafkaRegionReader(bootstrap, consumer_config=(("fetch.wait.max.ms", "500"),))
    assert librdkafkas._consumer_conf()["fetch.wait.max.ms"] == "500"  # source.client's setting wins
    waited, fast = next_reads(librdkafkas), next_reads(ours)
    assert sorted(waited)[2] > 0.3, waited  # the wait this default removes, seen with 500 ms (median of 5)
    assert max(fast) < 0.3, fast  # 0.02-0.06 s measured


def test_topic_ids_identify_splits_and_a_recreated_topic_is_a_new_split_at_its_start(bootstrap: str) -> None:
    """Issue 36, item 6, in the connector: each split carries its topic's id (KIP-516). A split without
    one (state of an older splitkeeper) takes it (IDENTIFIED); after the topic is deleted and re-created
    the old split is RECREATED, its replacement the new partition at its earliest offset, and discovery
    names the partition by the replacement's id from then on."""
    topic = create_topic(bootstrap, 1)
    produce(bootstrap, topic, {0: messages(0, 4)})
    source = KafkaSource(bootstrap, topics=[topic])
    (split,) = source.discover_splits()
    assert split.split_id == f"{topic}-0" and split.identity.startswith("kafka:") and len(split.identity) > 6
    moved = dataclasses.replace(split, position=4)
    assert source.check_splits([moved], {}) == []  # the same topic: nothing
    (legacy,) = source.check_splits([dataclasses.replace(moved, identity="")], {})
    assert (legacy.kind, legacy.identity) == (SplitChangeKind.IDENTIFIED, split.identity)

    recreate_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, {0: messages(0, 6)})
    (change,) = source.check_splits([moved], {})
    (new,) = change.replacement
    assert change.kind is SplitChangeKind.RECREATED and change.split_id == f"{topic}-0"
    assert new.split_id == split_id_of(topic, 0, change.identity) and new.split_id.startswith(f"{topic}-0#v")
    assert (new.position, new.backlog_end, new.identity) == (0, 6, change.identity) != split.identity
    assert (
        f"topic {topic!r} was deleted and re-created" in change.detail and "ends at offset 4" in change.detail
    )
    assert parse_split_id(new.split_id) == (topic, 0)
    # once the enumerator ended the old split (finished, with its identity), discovery names the new one
    source.check_splits([new], {split.split_id: split.identity})
    assert source.discover_splits() == [new]
    records = list(source.reader().read_range(new, 0, 6))
    assert [r.value for r in records] == [m.encode() for m in messages(0, 6)]


def test_a_topic_pattern_that_matches_nothing_is_a_warning_naming_it_and_the_topics_seen(
    bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 36: a ``topic_pattern`` matching nothing read nothing and said nothing (exit 0). Now one
    warning per spell of no match names the pattern and the topics there; discovery stays empty."""
    seen = create_topic(bootstrap, 1, name=unique("seen"))
    prefix = unique("nomatch")
    source = KafkaSource(bootstrap, topic_pattern=f"{prefix}-.*")
    with caplog.at_level(logging.WARNING, logger="splitkeeper.sources.kafka"):
        assert source.discover_splits() == [] and source.discover_splits() == []
    (warning,) = [r.getMessage() for r in caplog.records if "matches no topic" in r.getMessage()]
    assert f"source.topic_pattern '{prefix}-.*' matches no topic on Kafka at {bootstrap}" in warning
    assert seen in warning  # the topics seen, so a typo shows
    create_topic(bootstrap, 1, name=f"{prefix}-a")
    assert [s.split_id for s in source.discover_splits()] == [f"{prefix}-a-0"]


def test_end_offsets_listed_in_chunks_and_a_discovery_round_asks_for_metadata_once(
    bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41: at 10,000 partitions one ListOffsets request cost 0.9-1.9 s and each epoch asked for
    the metadata three times and the topic ids twice. The offsets are listed in requests of
    ``_LIST_OFFSETS_CHUNK`` partitions (2 here: 5 partitions are 3 requests) with the same answer, an
    epoch's ends through the offsets consumer (no future per partition); a round (subscriptions,
    check_splits, discover_splits) asks for the metadata and the ids once; the next round, and a
    check_splits called again, ask anew (a topic re-created between them is seen)."""
    import splitkeeper.sources.kafka.source as kafka_source

    monkeypatch.setattr(kafka_source, "_LIST_OFFSETS_CHUNK", 2)
    topic = create_topic(bootstrap, 5)
    produce(bootstrap, topic, {p: messages(p, p + 1) for p in range(5)})
    source = KafkaSource(bootstrap, topics=[topic])
    admin = source._admin_client()
    calls: dict[str, int] = {"list_topics": 0, "describe_topics": 0, "list_offsets": 0}

    def counted(name: str) -> Any:
        real = getattr(admin, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        return call

    class Counting:  # the real client, its requests counted
        def __getattr__(self, name: str) -> Any:
            return counted(name) if name in calls else getattr(admin, name)

    monkeypatch.setattr(source, "_admin", Counting())
    consumer = source._offsets_client()
    asked: list[list[int]] = []

    class CountingConsumer:  # the real offsets consumer, its requests counted
        def offsets_for_times(self, partitions: list[TopicPartition], timeout: float) -> Any:
            asked.append([tp.partition for tp in partitions])
            return consumer.offsets_for_times(partitions, timeout=timeout)

        def close(self) -> None:
            consumer.close()

    monkeypatch.setattr(source, "_offsets_consumer", CountingConsumer())
    splits = source.discover_splits()
    assert [source.available_end(s) for s in splits] == [1, 2, 3, 4, 5]
    assert calls["list_offsets"] == 3 + 3  # discovery's ends and starts
    assert asked == [[0, 1], [2, 3], [4]]  # then the round's ends, through the consumer
    for key in calls:
        calls[key] = 0

    assert source.subscriptions() == frozenset({topic})
    assert source.check_splits(splits, {}) == []
    assert source.discover_splits() == splits
    assert (calls["list_topics"], calls["describe_topics"]) == (1, 1)  # one round, one of each

    source.check_splits(splits, {})
    source.check_splits(splits, {})  # called again: asks anew
    assert (calls["list_topics"], calls["describe_topics"]) == (3, 3)
