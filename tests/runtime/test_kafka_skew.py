"""FLINK-31762 on real topics: the Kafka connector's hash owner skews, the balanced strategies do not.

Two topics of four partitions each (eight splits) discovered through
:class:`KafkaSource` from a real broker, assigned to eight readers. The legacy
owner of partition ``p`` of topic ``t`` is ``(start(t) + p) % 8``; when two
topics' start indexes are close their partitions land on the same readers, so
some readers get two splits and others none. The topic names are chosen (by
trying random suffixes) so that the two start indexes coincide, the worst case
the issue reports.
"""

from __future__ import annotations

import itertools
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from splitkeeper.core.assignment import legacy_hash_owner
from splitkeeper.core.enumerator import RecordingEnumeratorContext, SplitEnumerator, enumerator_for
from splitkeeper.core.types import Split
from splitkeeper.sources.kafka.source import KafkaSource, parse_split_id
from splitkeeper_tools.kafka_broker import KafkaBroker

pytestmark = pytest.mark.kafka

PARALLELISM = 8
PARTITIONS = 4


def colliding_topic_names() -> tuple[str, str]:
    """Two fresh topic names whose legacy-hash start index at parallelism 8 is the same."""
    prefix = f"skew-{uuid.uuid4().hex[:8]}"
    first = f"{prefix}-orders"
    start = legacy_hash_owner(first, 0, PARALLELISM)
    for i in itertools.count():
        second = f"{prefix}-payments{i}"
        if legacy_hash_owner(second, 0, PARALLELISM) == start:
            return first, second
    raise AssertionError("unreachable")  # pragma: no cover


@pytest.fixture(scope="module")
def discovered(kafka_broker: KafkaBroker) -> tuple[KafkaSource, list[Split]]:
    bootstrap = kafka_broker.bootstrap_servers
    topics = colliding_topic_names()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics]).values():
        future.result(timeout=30)
    source = KafkaSource(bootstrap, topics=list(topics))
    splits = source.discover_splits()
    return source, splits


def assign(source: KafkaSource, strategy: str) -> SplitEnumerator:
    context = RecordingEnumeratorContext(PARALLELISM)
    enumerator = enumerator_for(source, context, strategy)
    enumerator.start()
    for reader_id in range(PARALLELISM):
        context.register_reader(reader_id)
        enumerator.add_reader(reader_id)
    return enumerator


def test_two_real_topics_of_four_partitions_are_discovered_as_eight_splits(
    discovered: tuple[KafkaSource, list[Split]],
) -> None:
    source, splits = discovered
    assert len(splits) == 2 * PARTITIONS
    assert len({s.subscription for s in splits}) == 2
    assert source.subscriptions() == frozenset(s.subscription for s in splits)


def test_legacy_hash_piles_the_discovered_splits_onto_half_the_readers(
    discovered: tuple[KafkaSource, list[Split]],
) -> None:
    source, splits = discovered
    enumerator = assign(source, "legacy-hash")

    owners = enumerator.owners()
    loads = enumerator.loads()
    assert set(owners) == {s.split_id for s in splits}
    for split in splits:
        topic, partition = parse_split_id(split.split_id)
        assert owners[split.split_id] == legacy_hash_owner(topic, partition, PARALLELISM)
    assert sorted(loads.values()) == [0, 0, 0, 0, 2, 2, 2, 2]
    assert max(loads.values()) > 1 and min(loads.values()) == 0


@pytest.mark.parametrize("strategy", ["round-robin", "least-loaded", "weighted"])
def test_balanced_strategies_give_every_reader_exactly_one_discovered_split(
    discovered: tuple[KafkaSource, list[Split]], strategy: str
) -> None:
    source, splits = discovered
    enumerator = assign(source, strategy)

    assert enumerator.loads() == dict.fromkeys(range(PARALLELISM), 1)
    assert sorted(s.split_id for r in enumerator.assignment().readers.values() for s in r) == sorted(
        s.split_id for s in splits
    )
    assert enumerator.pool_size == 0
