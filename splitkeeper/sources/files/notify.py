"""``source.discovery: notifications``: the files of an object store found through its bucket events.

The store publishes an event per object written or removed to a Kafka topic
(``source.notifications``): the S3 event notification format, one JSON document per message,
``{"Records": [{"eventName": "s3:ObjectCreated:Put", "s3": {"bucket": {"name": ...},
"object": {"key": ..., "size": ..., "eTag": ..., "sequencer": ...}}}]}`` (versitygw
``--event-kafka-url --event-kafka-topic``; AWS S3 through EventBridge or SQS bridged to Kafka).

Contract:

1. **Positions.** The offsets of the event topic up to which discovery handed the splits of the
   events over are the source's discovery positions
   (:class:`~splitkeeper.core.source.SupportsDiscoveryPositions`), in the same checkpoint as the
   splits (``checkpoints.discovery``, key ``<topic>:<partition>``). A restore reads the events
   again from the checkpoint's offsets; no consumer group is used or committed.
2. **What an event says.** Only which object to look at: its key is stat-ed (one HEAD; for an
   object new to the process, one ranged GET of up to 64 KiB whose answer gives the stat and the
   content sample at once, :meth:`~.fs.ObjectFiles.open_sampled`) and the object as it is then is
   what discovery takes, as a listing would have found it (the event's size and ETag are not used:
   the identity needs Last-Modified, which the event does not carry); so events out of order, twice, or for an
   object overwritten since are harmless, and a file seen both by a listing and by an event is one
   split (its identity, :mod:`.source`). A key is looked at as the event
   spells it and URL-decoded (AWS encodes keys, versitygw does not). A key gone is a removed file
   (``on_file_change`` applies as for a file a listing no longer has). Events of other buckets,
   of keys outside ``source.path``, of names the listing skips (``.``/``_``), of other kinds
   (tagging, ACL) and the store's test event (``s3:TestEvent``) are ignored.
3. **Full listings.** Discovery lists the prefix whole, with the topic's end offsets taken
   *before* the listing as its new positions (an event published before those ends was for a
   change the listing sees): at the first discovery without positions (a first run, or state
   written before they existed), when a checkpointed offset is below the topic's first offset
   now (events aged out by retention), after an event that cannot be parsed, and at the epochs
   that recheck finished files (``source.recheck_finished_every``) but for the discoveries right
   after a restore with positions (the events since the checkpoint say what changed): the
   safety net for an event the store failed to publish.
4. **An event that cannot be parsed** (not JSON, no ``Records``, a record without bucket or key)
   is skipped, counted (:attr:`~.source.FileSource.skipped_events`) and logged with its partition,
   offset and first bytes, and that discovery lists the prefix whole: whatever it announced is
   found now, nothing is lost.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from splitkeeper.errors import SourceError

log = logging.getLogger("splitkeeper.sources.files")

#: The consumer group id librdkafka asks for; never joined nor committed (contract 1).
_GROUP = "splitkeeper-notifications"
DEFAULT_TIMEOUT_S = 10.0


class EventError(ValueError):
    """A message of the event topic that is not an S3 event notification (contract 4)."""


@dataclass(frozen=True, slots=True)
class ObjectEvent:
    """One record of an S3 event notification: an object created (written, copied) or removed."""

    name: str  # eventName, e.g. s3:ObjectCreated:Put
    bucket: str
    key: str  # as the event spells it
    size: int | None = None
    etag: str | None = None
    sequencer: str = ""

    @property
    def created(self) -> bool:
        return "ObjectCreated:" in self.name

    @property
    def removed(self) -> bool:
        return "ObjectRemoved:" in self.name

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys it may name: AWS URL-encodes the key (a space is ``+``), versitygw does not; both
        are looked at (contract 2: a key that is not there is only a file gone if it was one)."""
        decoded = unquote_plus(self.key)
        return (self.key,) if decoded == self.key else (self.key, decoded)


def parse_events(value: bytes | str | None) -> list[ObjectEvent]:
    """The object events of one message: the created and removed records, in order; [] for the
    store's test event and records of other kinds. EventError when it is not the format."""
    if value is None:
        raise EventError("an empty message (no value)")
    try:
        doc = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise EventError(f"not JSON: {err}") from err
    if not isinstance(doc, dict):
        raise EventError(f"a JSON {type(doc).__name__}, not an object with Records")
    if doc.get("Event") == "s3:TestEvent":
        return []
    records = doc.get("Records")
    if not isinstance(records, list):
        raise EventError("no Records list")
    events: list[ObjectEvent] = []
    for i, record in enumerate(records):
        name = record.get("eventName") if isinstance(record, dict) else None
        if not isinstance(name, str):
            raise EventError(f"Records[{i}] has no eventName")
        if "ObjectCreated:" not in name and "ObjectRemoved:" not in name:
            continue
        s3 = record.get("s3")
        bucket = s3.get("bucket") if isinstance(s3, dict) else None
        obj = s3.get("object") if isinstance(s3, dict) else None
        bucket_name = bucket.get("name") if isinstance(bucket, dict) else None
        key = obj.get("key") if isinstance(obj, dict) else None
        if not isinstance(bucket_name, str) or not bucket_name or not isinstance(key, str) or not key:
            raise EventError(f"Records[{i}] ({name}) has no s3.bucket.name or s3.object.key")
        assert isinstance(obj, dict)
        size = obj.get("size")
        etag = obj.get("eTag")
        events.append(
            ObjectEvent(
                name,
                bucket_name,
                key,
                size if isinstance(size, int) and not isinstance(size, bool) else None,
                etag if isinstance(etag, str) else None,
                str(obj.get("sequencer") or ""),
            )
        )
    return events


class EventFeed:
    """The driver's reader of the event topic: its partitions' first and end offsets, and the
    messages between given offsets and those ends. No group membership, no commits (contract 1)."""

    DEFAULT_TIMEOUT_S = DEFAULT_TIMEOUT_S

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        client_config: Mapping[str, str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self._client = dict(client_config or {})
        self._timeout_s = float(timeout_s)
        self._consumer: Any = None

    def _conf(self) -> dict[str, Any]:
        from splitkeeper.sources.kafka.source import _client_log

        return {
            "socket.connection.setup.timeout.ms": max(1000, int(self._timeout_s * 1000)),
            **self._client,
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": _GROUP,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            "logger": _client_log,
        }

    def _client_for(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer(self._conf())
        return self._consumer

    def _unreachable(self, err: BaseException) -> SourceError:
        return SourceError(
            f"Kafka is not reachable at source.notifications.bootstrap_servers={self.bootstrap_servers!r} "
            f"(no answer within {self._timeout_s:g}s: {err}); check that the brokers run and that "
            "host:port is right",
            bootstrap_servers=self.bootstrap_servers,
        )

    def partitions(self) -> dict[int, tuple[int, int]]:
        """partition -> (first offset, end offset) of the topic now; SourceError naming
        ``source.notifications.topic`` when it does not exist."""
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        consumer = self._client_for()
        try:
            meta = consumer.list_topics(self.topic, timeout=self._timeout_s)
        except KafkaException as err:
            raise self._unreachable(err) from err
        found = meta.topics.get(self.topic)
        error = None if found is None else found.error
        if found is None or (error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            raise SourceError(
                f"source.notifications.topic {self.topic!r} does not exist at "
                f"{self.bootstrap_servers}: create it (the store publishes its bucket events there, "
                "e.g. versitygw --event-kafka-topic) or fix source.notifications.topic",
                topic=self.topic,
            )
        if error is not None or not found.partitions:
            raise SourceError(
                f"source.notifications.topic {self.topic!r}: the broker answered {error}; retry, or check "
                "the topic and the client settings (source.notifications.client)",
                topic=self.topic,
            )
        marks: dict[int, tuple[int, int]] = {}
        for p in sorted(found.partitions):
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=self._timeout_s, cached=False
                )
            except KafkaException as err:
                raise self._unreachable(err) from err
            marks[p] = (int(low), int(high))
        return marks

    def read(
        self, start: Mapping[int, int], end: Mapping[int, int]
    ) -> Iterator[tuple[int, int, bytes | None]]:
        """``(partition, offset, value)`` of every message from ``start`` up to ``end`` (exclusive) per
        partition, each partition in offset order."""
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        todo = {p: (int(start[p]), int(e)) for p, e in end.items() if int(start.get(p, e)) < int(e)}
        if not todo:
            return
        consumer = self._client_for()
        consumer.assign([TopicPartition(self.topic, p, s) for p, (s, _e) in todo.items()])
        left = {p: e for p, (_s, e) in todo.items()}
        at = {p: s for p, (s, _e) in todo.items()}  # the next offset expected per partition
        stall_s = max(30.0, 3 * self._timeout_s)
        deadline = time.monotonic() + stall_s
        try:
            while left:
                if time.monotonic() > deadline:
                    raise SourceError(
                        f"source.notifications.topic {self.topic!r}: no event came for {stall_s:g}s while "
                        f"the offsets up to {left} (partition: end) are still to read; check the brokers",
                        topic=self.topic,
                    )
                # as many as are still to come: the call returns as soon as they are there
                wanted = max(1, min(1000, sum(left[p] - at[p] for p in left)))
                batch = consumer.consume(wanted, timeout=1.0)
                if batch:
                    deadline = time.monotonic() + stall_s
                for msg in batch:
                    err = msg.error()
                    p = msg.partition()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            if p in left and msg.offset() >= left[p]:
                                left.pop(p)
                            continue
                        raise SourceError(
                            f"source.notifications.topic {self.topic!r} partition {p}: {err.str()}",
                            topic=self.topic,
                            partition=p,
                        )
                    if p not in left:
                        continue
                    offset = msg.offset()
                    if offset >= left[p]:
                        left.pop(p)
                        continue
                    at[p] = offset + 1
                    yield p, offset, msg.value()
                    if offset + 1 >= left[p]:
                        left.pop(p)
        except KafkaException as err:
            raise self._unreachable(err) from err
        finally:
            consumer.unassign()

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
