"""Externally checkpointed sources end to end (protocol section 3, DESIGN §3; issue 39 item 3):
Spark, Delta and a real Kafka broker with a consumer group.

- only acknowledged regions' partitions get their group offsets moved (tagged with the
  checkpoint); a region that declines leaves its partitions' offsets where they were;
- group offsets moved by hand between runs: the checkpoint's positions win (the sink holds each
  message once), and the run's result, ``status`` and the report say so in a sentence naming the
  split, both positions and which one was used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from splitkeeper.app import services
from splitkeeper.core.source import ExternalPosition
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.sources.kafka.source import KafkaSource, split_id_of
from splitkeeper_tools.kafka_broker import KafkaBroker

from .test_kafka_pipeline import kafka_config, produce_numbered, sink_offsets, value_of
from .test_kafka_source import create_topic, unique

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _commit_by_hand(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """What an operator's kafka-consumer-groups --reset-offsets does: plain offsets, no checkpoint tag."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def test_declined_regions_keep_their_group_offsets_and_offsets_moved_by_hand_lose_to_the_checkpoint(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, 2)
    produce_numbered(bootstrap, topic, {0: 20, 1: 20})
    group = unique("sk-external")
    config = kafka_config(
        tmp_path, bootstrap, epoch_records=200, topics=[topic], group_id=group, parallelism=2
    )
    group_of = KafkaSource(bootstrap, topics=[topic], group_id=group)
    first = services.run(config, until_caught_up=True, epochs=5)
    a = first.epochs[-1].epoch
    both = {split_id_of(topic, p): ExternalPosition(20, a) for p in range(2)}
    assert group_of.committed_positions() == both

    # region 1 declines the next epoch: only region 0's partition moves on in the group
    store = DeltaStateStore(config.state.path, config.name, None, read_only=True)
    latest = store.latest_checkpoint()
    assert latest is not None
    owner = {s.split_id: r for r, state in latest.regions.items() for s in state.splits}
    mine, theirs = sorted(owner, key=lambda sid: owner[sid])  # region 0's split, region 1's split
    produce_numbered(bootstrap, topic, {0: 10, 1: 10}, first=20)
    second = services.run(config, epochs=1, faults=[f"fail:1@{a + 1}"])
    assert [e.kind for e in second.epochs] == ["regional"]
    b = second.epochs[0].epoch
    assert group_of.committed_positions() == {mine: ExternalPosition(30, b), theirs: ExternalPosition(20, a)}

    # an operator moves region 0's partition back to 5 by hand: the checkpoint's 30 wins
    partition = int(mine.rsplit("-", 1)[1])
    _commit_by_hand(bootstrap, group, topic, {partition: 5})
    third = services.run(config, until_caught_up=True, epochs=5)
    said = (
        f"split {mine}: checkpoint position 30 is used; external position 5 (set outside splitkeeper: "
        "no checkpoint tag) ignored"
    )
    assert third.opened.external_disagreements == (said,)
    assert third.restart_checks[0].endswith(f"passed (noted: {said})")  # reported, not a violation
    lines = services.status(config).restart_checks
    assert any("in-run check of the global restore of checkpoint" in line and said in line for line in lines)
    assert said in services.report(config).read_text(encoding="utf-8")

    by_split = sink_offsets(spark, config)  # each message once: nothing of 5..30 was read again
    for p in range(2):
        assert by_split[split_id_of(topic, p)] == [(i, i + 1, value_of(topic, p, i)) for i in range(30)]
    end = third.epochs[-1].epoch
    assert group_of.committed_positions() == {sid: ExternalPosition(30, end) for sid in (mine, theirs)}
    group_of.close()
