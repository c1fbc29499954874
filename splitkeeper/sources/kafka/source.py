"""The Kafka source: topic-partitions as unbounded splits, offsets as positions.

Splits. Every partition of a subscribed topic is one unbounded split with id
``<topic>-<partition>`` (Kafka's ``TopicPartition.toString()`` form, the one
the core ``legacy-hash`` strategy parses) and ``subscription = <topic>``. The
subscription is an explicit topic list (every topic must exist) or a regular
expression matched against whole topic names (internal ``__*`` topics never
match). Discovery runs every epoch, so partitions and topics created while the
pipeline runs are picked up.

Topic ids (KIP-516). A split's ``identity`` is its topic's id (``kafka:<topic id>``), so a
topic deleted and re-created under the same name is new data, not the old log going on
(protocol rule 1.9). Before each discovery :meth:`KafkaSource.check_splits` compares every
known split's identity with its topic's id now: a split without one (state written before
topic ids were recorded) takes the id it has now and goes on as before (IDENTIFIED); a
different id is RECREATED: the split ends where it stands and the new topic's partition is
a new split, ``<topic>-<partition>#v<12 hex of its identity>``, read from its earliest
offset. Discovery names a partition by its plain id unless a known split of another topic
id holds that id. A broker without topic ids (all zero) gives no identity: splits behave as
before topic ids.

Start positions. The splits of the *initial* discovery (the first one of a
pipeline that has no checkpoint yet) start where ``source.starting`` says:
``earliest`` (log start offset), ``latest`` (end offset), ``timestamp:<ms>``
(first offset with a timestamp >= ms, else the end offset) or ``group`` (the
consumer group's committed offset, else earliest, logged). Splits discovered
*later* (a new partition, a new topic matching the pattern, or any split not in
the restored checkpoint) start at the earliest offset, as Flink's Kafka source
does (FLIP-288): records written between the partition's creation and its
discovery are not skipped. The runtime calls
:meth:`KafkaSource.mark_initial_discovery_finished` after restoring a
checkpoint.

Backlog (protocol section 4). A new split carries ``backlog_end`` = the partition's end
offset when it was discovered, unless it starts there already (an empty
partition, or ``latest``): such a split is not in backlog.

End offsets. "The end" is the last stable offset under ``read_committed``
(equal to the high watermark when no transaction is open): what a reader can
actually reach. :meth:`KafkaSource.available_end` asks the broker once per
discovery round for every known partition (one ListOffsets request) and
answers from that cache until the next :meth:`~KafkaSource.discover_splits`.

Records. :class:`KafkaRegionReader` yields ``SourceRecord(offset, next_offset,
value, meta)`` with the message's true Kafka offset and its value as the broker holds it:
the bytes, unchanged (a null value, a tombstone, stays ``None``; an empty one ``b""``;
decoding them is ``decode``'s job in the region task); ``meta`` carries
the key (bytes), topic, partition, timestamp and headers, which the sink keeps in
its ``key``, ``topic``, ``partition``, ``timestamp`` and ``headers`` columns.
``next_offset`` is the consumer position after the record: ``offset + 1`` in a
dense log; where the log has gaps (compacted records, transaction markers,
aborted transactional records) the gap after a record belongs to it, up to the
range end. A range therefore chains contiguously from its first record to its
planned end; only a gap at the very start of a range (a plan that ended inside
a gap) shows as ``first.offset > start``.

Retention (``source.on_offset_out_of_range``). Records below the partition's
log start offset are gone. The *driver* decides, before an epoch plan is
persisted, with :meth:`KafkaSource.check_retention`: ``fail`` raises
SourceError; ``skip`` moves the range start to the log start offset and
returns a :class:`LostRange` per affected split for the runtime to record. The
*reader* never skips: a planned range that aged out after planning raises
SourceError (the region declines; the next epoch's plan is checked again).
Nothing is ever lost silently.

External positions (protocol section 3). With ``source.group_id`` set, the positions of
acknowledged regions are committed as the group's offsets with the checkpoint
id in the offset metadata, so ``kafka-consumer-groups --describe`` shows the
true lag; they are read back only to report disagreements on restore.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import logging
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import pyarrow as pa

from splitkeeper import clients
from splitkeeper.core.source import (
    ExternallyCheckpointedSource,
    ExternalPosition,
    LostRange,
    PlannedRange,
    RecordMeta,
    RegionReader,
    RetentionCheck,
    SourceConnector,
    SourceRecord,
    SplitChange,
    SplitChangeKind,
    SupportsInitialDiscovery,
    SupportsRetentionCheck,
    SupportsSplitIdentityCheck,
    SupportsSplitReassignmentOnRecovery,
    SupportsWarmUp,
)
from splitkeeper.core.types import Split
from splitkeeper.delta.schemas import META_COLUMNS, STAGED_FILE_SCHEMA
from splitkeeper.errors import EnvironmentNotReadyError, InvalidParameterError, SourceError
from splitkeeper.records.columnar import RangeColumns, SupportsColumnarRead
from splitkeeper.sources.kafka.config import KafkaSource as KafkaSection
from splitkeeper.sources.kafka.config import OffsetOutOfRange, StartingMode

# LostRange, RetentionCheck and SupportsRetentionCheck live in splitkeeper.core.source; exported here too.
__all__ = [
    "COMMIT_METADATA_KEY",
    "KafkaRegionReader",
    "KafkaSource",
    "LostRange",
    "RetentionCheck",
    "SupportsRetentionCheck",
    "parse_split_id",
    "split_id_of",
    "topic_identity",
]

try:
    from confluent_kafka import (
        OFFSET_END,
        OFFSET_INVALID,
        TIMESTAMP_NOT_AVAILABLE,
        Consumer,
        ConsumerGroupTopicPartitions,
        IsolationLevel,
        KafkaError,
        KafkaException,
        TopicCollection,
        TopicPartition,
    )
    from confluent_kafka.admin import AdminClient, OffsetSpec
except ImportError as err:  # pragma: no cover - the lock file installs it
    raise EnvironmentNotReadyError(
        f"the Kafka source needs confluent-kafka ({err}); run `bash scripts/setup.sh python`",
        module="confluent_kafka",
    ) from err

log = logging.getLogger("splitkeeper.sources.kafka")
_client_log = logging.getLogger("splitkeeper.sources.kafka.librdkafka")

#: Key of the offset-commit metadata that carries the checkpoint id (protocol section 3).
COMMIT_METADATA_KEY = "splitkeeper_checkpoint_id"
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_READ_TIMEOUT_S = 30.0
_READER_GROUP = "splitkeeper-region-reader"  # librdkafka wants a group.id; readers never join or commit
_PARTITION_GONE_CODES = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
    }
)
_TRANSIENT_CODES = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError._UNKNOWN_PARTITION,
    }
)
_SPLIT_ID = re.compile(r"^(.+)-(\d+)(#v[0-9a-f]{12})?$")
#: The identity of a split of a topic with this id (KIP-516): ``kafka:<topic id>``.
_IDENTITY_PREFIX = "kafka:"
_NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # the all-zero Uuid: a broker without topic ids
_META_TYPES = tuple(STAGED_FILE_SCHEMA.field(name).type for name in META_COLUMNS)
_TIMESTAMP_MS = pa.timestamp("ms", tz="UTC")
_EMPTY_COLUMNS = RangeColumns(pa.array([], pa.int64()), pa.array([], pa.int64()), pa.array([], pa.binary()))
_POLL_S = 0.2
#: A reader's ``fetch.wait.max.ms`` (librdkafka's default 500; ``source.client`` may set another): how
#: long the broker holds a fetch that finds nothing new. A reader assigns only ranges that are there,
#: but librdkafka prefetches past a range to the partition's end, and a fetch held there stays in
#: flight after the read: a kept consumer's next read (a long-lived reader slot serving its next
#: region) waited for it, 0.3-0.5 s (median 0.55-0.62 s against 0.21 s for a new consumer, 48,000
#: messages over 2 partitions, 2 cores at load 9-13; 0.15-0.21 s with 10-50 ms).
FETCH_WAIT_MS = 10
# One admin request waits at most this long before it is sent again on a fresh client (within
# timeout_s in all): a client can stay wedged after a broker restart (see _retry_unreachable).
_ATTEMPT_S = 10.0
#: Partitions per ListOffsets request. librdkafka's cost of one request grows faster than its
#: partitions (measured on 2 cores, load 11: 1,000 partitions 0.03-0.06 s, 10,000 in one request
#: 0.9-1.9 s), so a listing is sent as requests of this many partitions, all in flight at once
#: (10,000 partitions: 0.2 s).
_LIST_OFFSETS_CHUNK = 250
#: A discovery round (the driver's subscriptions(), check_splits() and discover_splits() of an epoch,
#: in that order) asks the cluster for its metadata and topic ids once: each step reuses what the
#: step before it had, unless that answer is older than this. A step called again, or out of
#: order, asks anew (10,000 partitions: 0.2-0.4 s a metadata or describe request under load).
_ROUND_REUSE_S = 2.0
_UNREACHABLE_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError.REQUEST_TIMED_OUT,
    }
)


def split_id_of(topic: str, partition: int, identity: str = "") -> str:
    """The split id of a topic-partition: ``<topic>-<partition>``; with ``identity`` (a re-created
    topic's partition, whose plain id a split of the old topic holds) ``<topic>-<partition>#v<12 hex>``."""
    if not identity:
        return f"{topic}-{partition}"
    return f"{topic}-{partition}#v{hashlib.sha256(identity.encode()).hexdigest()[:12]}"


@functools.lru_cache(maxsize=1 << 16)
def parse_split_id(split_id: str) -> tuple[str, int]:
    """``(topic, partition)`` of a Kafka split id; SourceError for an id of another form."""
    match = _SPLIT_ID.match(split_id)
    if match is None:
        raise SourceError(
            f"split {split_id!r} is not a Kafka split id: expected '<topic>-<partition>', e.g. 'orders-3'",
            split_id=split_id,
        )
    return match.group(1), int(match.group(2))


def topic_identity(topic_id: object) -> str:
    """A split's identity from its topic's id (``TopicDescription.topic_id``): ``kafka:<id>``;
    "" for none (a broker without topic ids answers the all-zero id)."""
    text = "" if topic_id is None else str(topic_id)
    return "" if not text or text == _NO_TOPIC_ID else _IDENTITY_PREFIX + text


def _is_internal(topic: str) -> bool:
    return topic.startswith("__")


# --------------------------------------------------------------------------- executor side


class _Range(NamedTuple):
    """One planned range of a read: its split id, topic-partition and ``[start, end)``."""

    split_id: str
    topic: str
    partition: int
    start: int
    end: int


def _region_columns(planned: Sequence[_Range], delivered: Sequence[list[Any]]) -> list[RangeColumns]:
    """The columns of every range's delivered messages (records in offset order; the last one's
    next offset is the range's end): each column built once for the whole region with one list
    comprehension, and sliced per range (a region of thousands of small ranges pays Arrow's fixed
    cost per array once, not per range)."""
    msgs = [msg for part in delivered for msg in part]
    if not msgs:
        return [_EMPTY_COLUMNS] * len(planned)
    offsets = [msg.offset() for msg in msgs]
    next_offsets: list[int] = []
    topics: list[str] = []
    partitions: list[int] = []
    lo = 0
    for r, part in zip(planned, delivered, strict=True):
        n = len(part)
        if n:
            next_offsets.extend(offsets[lo + 1 : lo + n])
            next_offsets.append(r.end)
            topics.extend([r.topic] * n)
            partitions.extend([r.partition] * n)
        lo += n
    stamps = [msg.timestamp() for msg in msgs]
    headers = [msg.headers() for msg in msgs]
    columns = (
        pa.array(offsets, pa.int64()),
        pa.array(next_offsets, pa.int64()),
        pa.array([msg.value() for msg in msgs], pa.binary()),
        pa.array([msg.key() for msg in msgs], pa.binary()),
        pa.array(topics, pa.string()),
        pa.array(partitions, pa.int32()),
        pa.array(
            [None if kind == TIMESTAMP_NOT_AVAILABLE else ms for kind, ms in stamps], _TIMESTAMP_MS
        ).cast(_META_TYPES[3]),
        _headers_array(headers) if any(headers) else _no_headers(len(msgs)),
    )
    out: list[RangeColumns] = []
    lo = 0
    for part in delivered:
        n = len(part)
        if not n:
            out.append(_EMPTY_COLUMNS)
            continue
        sliced = [column.slice(lo, n) for column in columns]
        out.append(RangeColumns(sliced[0], sliced[1], sliced[2], tuple(sliced[3:])))
        lo += n
    return out


def _checked_range(split: Split, start: int, end: int) -> tuple[str, int]:
    """The topic and partition of ``split``, after refusing a range outside ``0 <= start <= end``."""
    if start < 0 or end < start:
        raise SourceError(
            f"split {split.split_id!r}: range [{start}, {end}) is not allowed: 0 <= start <= end",
            split_id=split.split_id,
            start=start,
            end=end,
        )
    return parse_split_id(split.split_id)


def _close_kept(kept: tuple[Any, list[Any]]) -> None:
    kept[0].close()


@dataclass(frozen=True, slots=True)
class KafkaRegionReader(RegionReader, SupportsColumnarRead, SupportsWarmUp):
    """Reads planned offset ranges of Kafka splits on an executor. Picklable, stateless.

    Each :meth:`read_range` creates its own consumer (``isolation.level=read_committed``,
    no group membership, no commits, ``auto.offset.reset=error``), assigns the
    partition at ``start`` and closes it when the iteration ends (in a long-lived reader slot a
    read that completed hands it back instead and the slot's next read of the same settings
    assigns it anew: :mod:`splitkeeper.clients`);
    :meth:`read_ranges_columns` reads all of a region's ranges with one consumer
    assigned every partition. Fields are plain
    values: ``consumer_config`` holds extra librdkafka settings as ``(key, value)`` pairs.
    ``connect_timeout_s`` bounds the first metadata request (an unreachable
    broker); ``read_timeout_s`` bounds how long a read may make no progress.
    """

    bootstrap_servers: str
    connect_timeout_s: float = DEFAULT_TIMEOUT_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    batch_size: int = 10_000
    consumer_config: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # may hold secrets

    def _consumer_conf(self) -> dict[str, Any]:
        """The reader's consumer settings: ``consumer_config``, then splitkeeper's own, which win (a
        reader never reads uncommitted records, joins no group and commits nothing, whatever the
        settings say; the config refuses those keys in ``source.client`` too)."""
        conf: dict[str, Any] = {
            "socket.connection.setup.timeout.ms": max(1000, int(self.connect_timeout_s * 1000)),
            "fetch.wait.max.ms": FETCH_WAIT_MS,  # a kept consumer's next read waits for no held fetch
            **dict(self.consumer_config),
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": _READER_GROUP,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            "logger": _client_log,
        }
        return conf

    def read_range(self, split: Split, start: int, end: int) -> Iterator[SourceRecord]:
        """Yield the records of ``split`` whose Kafka offset lies in ``[start, end)``, in offset order.

        ``start > end`` or a negative ``start`` raise SourceError on the call.
        While iterating, SourceError is raised when the broker cannot be
        reached (within ``connect_timeout_s``), the topic or partition is gone,
        ``start`` is below the log start offset (aged out: never skipped here),
        ``end`` lies beyond the partition's end, or no progress is made for
        ``read_timeout_s``. The consumer is closed when the iteration ends or
        the generator is closed.
        """
        topic, partition = _checked_range(split, start, end)
        if start == end:
            return iter(())
        return self._read(split.split_id, topic, partition, start, end)

    def read_range_columns(self, split: Split, start: int, end: int) -> RangeColumns:
        """The records :meth:`read_range` yields, as Arrow columns with their metadata columns.

        Consumes the whole range on the call (raising what :meth:`read_range`
        raises, with the same messages) and builds each column with one list
        comprehension over the delivered messages: no :class:`SourceRecord` per
        message. Gaps are handled as in :meth:`read_range`: a record's
        ``next_offset`` is the offset of the next delivered record, the last
        one's is ``end``. Topic and partition are the split's (every message of
        the range has them). The one-range case of :meth:`read_ranges_columns`.
        """
        return next(iter(self.read_ranges_columns([(split, start, end)])))

    def read_ranges_columns(self, ranges: Sequence[tuple[Split, int, int]]) -> Iterator[RangeColumns]:
        """The columns of every range, read together: one consumer assigned every partition.

        The first step checks every range (what :meth:`read_range` refuses on the call,
        and a partition planned twice), asks for each topic's metadata once, assigns every
        non-empty range's partition at its start and consumes them all in batches; a
        partition is paused once its range is complete, and the read ends when every range
        is. Each range's records are then those :meth:`read_range_columns` returns for it,
        with the same guarantees (exact ``[start, end)``, bytes unchanged, metadata, gaps)
        and the same errors, each naming its split (``params["split_id"]``). No progress on
        any open range for ``read_timeout_s`` raises for the first open one.
        """
        planned: list[_Range] = []
        seen: dict[tuple[str, int], str] = {}
        for split, start, end in ranges:
            topic, partition = _checked_range(split, start, end)
            if (topic, partition) in seen:
                raise SourceError(
                    f"split {split.split_id!r}: topic {topic!r} partition {partition} is planned twice in "
                    f"one read (also as {seen[topic, partition]!r})",
                    split_id=split.split_id,
                )
            seen[topic, partition] = split.split_id
            planned.append(_Range(split.split_id, topic, partition, start, end))
        delivered: list[list[Any]] = [[] for _ in planned]
        reading = [n for n, r in enumerate(planned) if r.start < r.end]
        if reading:
            for n, records in self._consume([planned[n] for n in reading]):
                delivered[reading[n]].extend(records)
        yield from _region_columns(planned, delivered)

    def _read(
        self, split_id: str, topic: str, partition: int, start: int, end: int
    ) -> Iterator[SourceRecord]:
        held: tuple[int, bytes | None, RecordMeta] | None = (
            None  # the last record, yielded once its next offset is known
        )
        for batch in self._batches(split_id, topic, partition, start, end):
            for msg in batch:
                offset = cast(int, msg.offset())  # always set on a record
                if held is not None:
                    yield SourceRecord(held[0], offset, held[1], held[2])
                held = (offset, msg.value(), _meta(msg))
        if held is not None:
            yield SourceRecord(held[0], end, held[1], held[2])

    def _batches(
        self, split_id: str, topic: str, partition: int, start: int, end: int
    ) -> Iterator[list[Any]]:
        """The delivered messages of ``[start, end)`` (records only, in offset order), batch by batch
        (:meth:`_consume` of one range)."""
        for _n, records in self._consume([_Range(split_id, topic, partition, start, end)]):
            yield records

    def _consume(self, ranges: Sequence[_Range]) -> Iterator[tuple[int, list[Any]]]:
        """The delivered messages of every range (non-empty, one per partition): ``(index, records)``
        chunks, each range's records in offset order.

        The one consume loop of every read path: one consumer assigned every range's partition
        at its start; each message goes to its partition's range; a range is complete when its
        position reaches its end (a record at or past the end, or the consumer position moving
        over a gap: control records, aborted or compacted offsets), and its partition is paused
        then. Client events are handled (raised, naming their range's split; an event of no
        partition counts for the first open range) in their place among the messages, so the
        messages before an event are yielded before it raises. No progress on any open range for
        ``read_timeout_s`` raises. The consumer is closed when the iteration ends or the
        generator is closed.
        """
        key, consumer, errors = self._borrow_consumer()
        done = False
        try:
            self._check_partitions(consumer, ranges)
            tps = [TopicPartition(r.topic, r.partition) for r in ranges]
            index: dict[tuple[str | None, int | None], int] = {
                (r.topic, r.partition): n for n, r in enumerate(ranges)
            }
            positions = [r.start for r in ranges]
            open_ranges = dict.fromkeys(range(len(ranges)))  # insertion-ordered set of incomplete ranges
            consumer.assign([TopicPartition(r.topic, r.partition, r.start) for r in ranges])
            progress_at = time.monotonic()
            while open_ranges:
                # consume() waits until it has num_messages or the timeout passed: ask for no more
                # than the offsets left, so dense ranges return as soon as their records arrived.
                left = sum(ranges[n].end - positions[n] for n in open_ranges)
                batch = consumer.consume(num_messages=min(self.batch_size, left), timeout=_POLL_S)
                records: dict[int, list[Any]] = {}
                complete: list[int] = []
                for msg in batch:
                    n = index.get((msg.topic(), msg.partition()), -1)
                    err = msg.error()
                    if err is not None:
                        if n < 0 and open_ranges:
                            n = next(iter(open_ranges))
                        if n not in open_ranges:
                            continue
                        yield from records.items()
                        records = {}
                        event_offset = msg.offset()
                        at = -1 if event_offset is None else event_offset
                        r = ranges[n]
                        self._on_event(consumer, err, at, r.split_id, tps[n], r.start, r.end)
                        continue
                    if n not in open_ranges:
                        continue  # a message of a complete range (fetched before its pause)
                    offset = cast(int, msg.offset())  # always set on a record
                    if offset < positions[n]:
                        continue  # fetched for an earlier assignment of a kept consumer
                    end = ranges[n].end
                    if offset < end:
                        records.setdefault(n, []).append(msg)
                    positions[n] = min(offset + 1, end)
                    if positions[n] >= end:
                        del open_ranges[n]
                        complete.append(n)
                yield from records.items()
                if batch:
                    progress_at = time.monotonic()
                if open_ranges:
                    # the position moves past gaps (control records, aborted or compacted offsets)
                    waiting = list(open_ranges)
                    moved = False
                    for n, now in zip(waiting, consumer.position([tps[n] for n in waiting]), strict=True):
                        if now.offset >= 0 and now.offset > positions[n]:
                            positions[n] = min(now.offset, ranges[n].end)
                            moved = True
                            if positions[n] >= ranges[n].end:
                                del open_ranges[n]
                                complete.append(n)
                    if moved:
                        progress_at = time.monotonic()
                    elif open_ranges and not batch and time.monotonic() - progress_at > self.read_timeout_s:
                        n = next(iter(open_ranges))
                        r = ranges[n]
                        raise self._stalled(
                            r.split_id, r.start, r.end, positions[n], errors, len(open_ranges)
                        )
                if complete and open_ranges:
                    consumer.pause([tps[n] for n in complete])
            # the next read assigns its own partitions at their starts; a pause outlives an assignment
            consumer.resume(tps)
            consumer.unassign()
            done = True
        finally:
            if done:  # kept for the slot's next read, or closed (splitkeeper.clients)
                clients.give_back(key, (consumer, errors), _close_kept)
            else:  # failed, or closed early: never reused
                consumer.close()

    def _borrow_consumer(self) -> tuple[tuple[Any, ...], Any, list[KafkaError]]:
        """``(key, consumer, its error list)``: a long-lived reader slot's consumer of an earlier
        read or warm-up (:mod:`splitkeeper.clients`), else a new one."""
        key = ("kafka-reader", self.bootstrap_servers, self.connect_timeout_s, self.consumer_config)
        kept = clients.borrow(key)
        if kept is None:
            errors: list[KafkaError] = []
            conf = self._consumer_conf()
            conf["error_cb"] = errors.append
            return key, Consumer(conf), errors
        consumer, errors = kept
        errors.clear()
        return key, consumer, errors

    def warm_up(self, splits: Sequence[Split]) -> None:
        """Connect a consumer for ``splits`` and hand it back (:class:`SupportsWarmUp`): one metadata
        request per topic (a missing topic or partition raises as a read would) and each partition's
        offsets from its leader (the connection a fetch uses), within ``connect_timeout_s`` each.
        Nothing is assigned or read. Outside a long-lived reader slot the consumer is closed at once."""
        key, consumer, errors = self._borrow_consumer()
        done = False
        try:
            ranges = [_Range(s.split_id, *parse_split_id(s.split_id), 0, 0) for s in splits]
            self._check_partitions(consumer, ranges)
            for r in ranges:
                try:
                    consumer.get_watermark_offsets(
                        TopicPartition(r.topic, r.partition), timeout=self.connect_timeout_s, cached=False
                    )
                except KafkaException as err:
                    raise _unreachable(self.bootstrap_servers, self.connect_timeout_s, err) from err
            done = True
        finally:
            if done:
                clients.give_back(key, (consumer, errors), _close_kept)
            else:
                consumer.close()

    def _check_partitions(self, consumer: Any, ranges: Sequence[_Range]) -> None:
        """Every range's topic exists and has its partition (one metadata request per topic)."""
        topics: dict[str, Any] = {}
        for r in ranges:
            if r.topic not in topics:
                try:
                    topics[r.topic] = consumer.list_topics(r.topic, timeout=self.connect_timeout_s)
                except KafkaException as err:
                    raise _unreachable(self.bootstrap_servers, self.connect_timeout_s, err) from err
            self._check_partition(topics[r.topic], r.split_id, r.topic, r.partition)

    def _check_partition(self, metadata: Any, split_id: str, topic: str, partition: int) -> None:
        meta = metadata.topics.get(topic)
        if meta is None or (meta.error is not None and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            raise SourceError(
                f"split {split_id!r}: topic {topic!r} does not exist on Kafka at {self.bootstrap_servers} "
                "(deleted after the epoch was planned?)",
                split_id=split_id,
                topic=topic,
            )
        if partition not in meta.partitions:
            raise SourceError(
                f"split {split_id!r}: topic {topic!r} has no partition {partition} "
                f"(partitions 0..{len(meta.partitions) - 1})",
                split_id=split_id,
                topic=topic,
                partition=partition,
            )

    def _on_event(
        self, consumer: Any, err: KafkaError, offset: int, split_id: str, tp: Any, start: int, end: int
    ) -> None:
        code = err.code()
        if code == KafkaError._PARTITION_EOF:
            if offset >= end:
                return
            low, high = _watermarks(consumer, tp, self.bootstrap_servers, self.connect_timeout_s)
            if high < end:
                raise SourceError(
                    f"split {split_id!r}: planned range [{start}, {end}) ends beyond the partition's end "
                    f"offset {high}: the topic was deleted and re-created, or truncated, after planning",
                    split_id=split_id,
                    start=start,
                    end=end,
                    end_offset=high,
                )
            return
        if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            low, high = _watermarks(consumer, tp, self.bootstrap_servers, self.connect_timeout_s)
            raise SourceError(
                f"split {split_id!r}: planned offset {start} of topic {tp.topic!r} partition {tp.partition} "
                f"is no longer available; the earliest available offset is {low} (latest {high}). The "
                "records aged out of retention after the epoch was planned; the next plan applies "
                "source.on_offset_out_of_range",
                split_id=split_id,
                topic=tp.topic,
                partition=tp.partition,
                requested=start,
                earliest=low,
            )
        if err.fatal() or code in _PARTITION_GONE_CODES:
            raise SourceError(
                f"split {split_id!r}: reading [{start}, {end}) failed: {err.str()}",
                split_id=split_id,
                code=err.name(),
            )
        log.debug("split %s: transient consumer event %s", split_id, err)  # bounded by read_timeout_s

    def _stalled(
        self, split_id: str, start: int, end: int, position: int, errors: list[KafkaError], waiting: int = 1
    ) -> SourceError:
        last = f"; last client error: {errors[-1].str()}" if errors else ""
        others = f", nor did {waiting - 1} other range(s) read with it" if waiting > 1 else ""
        return SourceError(
            f"split {split_id!r}: reading [{start}, {end}) made no progress for {self.read_timeout_s:.0f}s "
            f"at offset {position}{others} (Kafka at {self.bootstrap_servers}){last}",
            split_id=split_id,
            position=position,
        )


_AUTH_CODES = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED})


def _unreachable(
    bootstrap_servers: str, timeout_s: float, err: BaseException, client_error: Any = None
) -> SourceError:
    kerr = err.args[0] if isinstance(err, KafkaException) and err.args else None
    detail = kerr.str() if isinstance(kerr, KafkaError) else str(err)
    for candidate in (kerr, client_error):
        if isinstance(candidate, KafkaError) and candidate.code() in _AUTH_CODES:
            return SourceError(
                f"Kafka at source.bootstrap_servers={bootstrap_servers!r} refused the credentials of "
                f"source.client (authentication failed: {candidate.str()}); check security.protocol, "
                "sasl.mechanism, sasl.username and sasl.password (or the SSL settings)",
                bootstrap_servers=bootstrap_servers,
            )
    return SourceError(
        f"Kafka is not reachable at source.bootstrap_servers={bootstrap_servers!r} (no answer within "
        f"{timeout_s:g}s: {detail}); check that the brokers run and that host:port is right "
        "(local broker: bash scripts/kafka.sh status)",
        bootstrap_servers=bootstrap_servers,
    )


def _transient(err: KafkaError) -> bool:
    """A partition-level error that goes away by itself (leader election, partition still loading)."""
    return err.code() not in _UNREACHABLE_CODES and (err.retriable() or err.code() in _TRANSIENT_CODES)


def _kafka_error(err: KafkaException) -> KafkaError | None:
    return err.args[0] if err.args and isinstance(err.args[0], KafkaError) else None


def _watermarks(consumer: Any, tp: Any, bootstrap_servers: str, timeout_s: float) -> tuple[int, int]:
    try:
        low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
    except KafkaException as err:
        raise _unreachable(bootstrap_servers, timeout_s, err) from err
    return int(low), int(high)


# --------------------------------------------------------------------------- driver side


class KafkaSource(
    SourceConnector,
    SupportsSplitReassignmentOnRecovery,
    SupportsInitialDiscovery,
    ExternallyCheckpointedSource,
    SupportsRetentionCheck,
    SupportsSplitIdentityCheck,
):
    """Driver side of the Kafka source (see the module doc for splits, topic ids, positions and
    retention).

    Created once per driver run (:meth:`from_config`) and used from the driver
    thread only; holds an admin client and, with a ``group_id``, a consumer for
    offset commits, both created lazily and released by :meth:`close`. Regions
    keep no split state of their own, so the source opts into deferred
    assignment (FLIP-537). ``timeout_s`` bounds every broker request.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        topics: Sequence[str] = (),
        topic_pattern: str | None = None,
        starting: str = "earliest",
        group_id: str | None = None,
        on_offset_out_of_range: OffsetOutOfRange | str = OffsetOutOfRange.FAIL,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        client_config: Mapping[str, str] | None = None,
        deferred_assignment: bool = True,
        metadata_interval_s: float = 0.0,
    ) -> None:
        self._deferred = bool(deferred_assignment)
        if not metadata_interval_s >= 0:
            raise InvalidParameterError("metadata_interval_s", metadata_interval_s, "seconds >= 0")
        self._metadata_interval_s = float(metadata_interval_s)
        # the last metadata and topic ids asked (monotonic time, answer): reused by the discovery
        # rounds of the next metadata_interval_s seconds (0: never)
        self._kept_metadata: tuple[float, dict[str, tuple[int, ...]]] | None = None
        self._kept_ids: tuple[float, dict[str, str]] | None = None
        self._reused = False  # this round's metadata is a kept answer (not asked this round)
        self._unlisted: set[str] = set()  # this round's splits whose end offset could not be listed
        if not bootstrap_servers:
            raise InvalidParameterError("bootstrap_servers", bootstrap_servers, "'host:port[,host:port...]'")
        if bool(topics) == bool(topic_pattern):
            raise InvalidParameterError(
                "topics",
                {"topics": list(topics), "topic_pattern": topic_pattern},
                "exactly one of topics (a list of names) or topic_pattern (a regex)",
            )
        self._pattern: re.Pattern[str] | None = None
        if topic_pattern:
            try:
                self._pattern = re.compile(topic_pattern)
            except re.error as err:
                raise InvalidParameterError(
                    "topic_pattern", topic_pattern, "a valid regular expression"
                ) from err
        mode, _, stamp = starting.partition(":")
        try:
            self._starting = StartingMode(mode)
        except ValueError as err:
            raise InvalidParameterError(
                "starting", starting, "'earliest', 'latest', 'timestamp:<epoch ms>' or 'group'"
            ) from err
        if (self._starting is StartingMode.TIMESTAMP) != stamp.isdigit():
            raise InvalidParameterError("starting", starting, "'timestamp:<epoch ms>' with digits only")
        if self._starting is StartingMode.GROUP and not group_id:
            raise InvalidParameterError("group_id", group_id, "a consumer group id when starting is 'group'")
        if not timeout_s > 0 or not read_timeout_s > 0:
            raise InvalidParameterError("timeout_s", (timeout_s, read_timeout_s), "seconds > 0")
        self._bootstrap = bootstrap_servers
        self._topics = tuple(dict.fromkeys(topics))
        self._topic_pattern = topic_pattern
        self._starting_ms = int(stamp) if self._starting is StartingMode.TIMESTAMP else None
        self._group_id = group_id
        try:
            self._on_out_of_range = OffsetOutOfRange(on_offset_out_of_range)
        except ValueError as err:
            raise InvalidParameterError(
                "on_offset_out_of_range", on_offset_out_of_range, "'fail' or 'skip'"
            ) from err
        self._timeout_s = float(timeout_s)
        self._read_timeout_s = float(read_timeout_s)
        self._client_config = dict(client_config or {})
        self._client_error: Any = None  # the last error librdkafka reported (an authentication failure...)
        self._admin: Any = None
        self._group_consumer: Any = None
        self._offsets_consumer: Any = None  # lists the end offsets of an epoch (_end_offsets)
        # the requests of the last end-offset listing: its split ids and their TopicPartition chunks
        self._end_requests: tuple[tuple[str, ...], list[list[Any]]] | None = None
        self._cluster_id: str | None = None
        self._known: dict[str, Split] = {}  # split id -> the split as first discovered
        # split id -> identity of every split the enumerator knows, live and finished (check_splits)
        self._taken: dict[str, str] = {}
        self._no_topic_ids = False  # the broker answered without topic ids: logged once
        self._warned_no_match = False  # topic_pattern matched nothing, and that was logged
        self._ends: dict[str, int] | None = None  # end offsets of this discovery round
        # this round's metadata (monotonic time, the step that had it, answer) and topic ids (time,
        # answer; check_splits' only): see _ROUND_REUSE_S
        self._round_metadata: tuple[float, str, dict[str, tuple[int, ...]]] | None = None
        self._round_ids: tuple[float, dict[str, str]] | None = None
        self._initial_done = False
        self._unready: set[str] = set()  # topics with partitions that had no leader at the last metadata call
        self._warned_untagged: set[str] = set()

    @classmethod
    def from_config(cls, source: KafkaSection) -> KafkaSource:
        """The connector for a validated ``source`` section of kind ``kafka``."""
        if not isinstance(source, KafkaSection):
            raise InvalidParameterError(
                "source.kind", getattr(source, "kind", None), "'kafka' for a KafkaSource"
            )
        return cls(
            source.servers,
            topics=source.topics,
            topic_pattern=source.topic_pattern,
            starting=source.starting,
            group_id=source.group_id,
            on_offset_out_of_range=source.on_offset_out_of_range,
            timeout_s=source.connect_timeout_s or DEFAULT_TIMEOUT_S,
            read_timeout_s=source.read_timeout_s or DEFAULT_READ_TIMEOUT_S,
            client_config=source.client_config.as_dict(),
            deferred_assignment=source.deferred_assignment,
            metadata_interval_s=source.metadata_interval_s,
        )

    # -- identity ---------------------------------------------------------------------------

    @property
    def name(self) -> str:
        what = ",".join(self._topics) if self._topics else f"/{self._topic_pattern}/"
        return f"kafka:{what}"

    @property
    def bounded(self) -> bool:
        return False

    @property
    def reassigns_on_recovery(self) -> bool:
        """``source.reader_mode``: deferred (True, the default) or legacy (protocol rule 1.2)."""
        return self._deferred

    @property
    def bootstrap_servers(self) -> str:
        return self._bootstrap

    @property
    def group_id(self) -> str | None:
        """The consumer group external positions go to; None: no external commits (protocol section 3)."""
        return self._group_id

    @property
    def keeps_external_positions(self) -> bool:
        """Only with a ``group_id``: without one there is no external store to commit to or compare."""
        return self._group_id is not None

    @property
    def on_offset_out_of_range(self) -> OffsetOutOfRange:
        return self._on_out_of_range

    def fingerprint(self) -> str:
        """``kafka-<cluster id>``: which Kafka cluster the pipeline's state positions belong to.

        The subscription is deliberately not part of it: topics may be added to
        or removed from a pipeline between runs (splits of removed topics are
        dropped on restart, protocol rule 1.5), while offsets of another cluster mean
        nothing. Costs one metadata request the first time.
        """
        if self._cluster_id is None:
            self._metadata()
        return f"kafka-{self._cluster_id}"

    def reader(self) -> KafkaRegionReader:
        return KafkaRegionReader(
            self._bootstrap,
            connect_timeout_s=self._timeout_s,
            read_timeout_s=self._read_timeout_s,
            consumer_config=tuple(sorted(self._client_config.items())),
        )

    def close(self) -> None:
        for consumer in (self._group_consumer, self._offsets_consumer):
            if consumer is not None:
                consumer.close()
        self._group_consumer = self._offsets_consumer = None
        self._end_requests = None
        self._admin = None

    # -- clients ----------------------------------------------------------------------------

    def _admin_client(self) -> Any:
        if self._admin is None:
            conf: dict[str, Any] = {
                "bootstrap.servers": self._bootstrap,
                "socket.connection.setup.timeout.ms": max(1000, int(self._timeout_s * 1000)),
                "logger": _client_log,
                "error_cb": self._on_client_error,
            }
            conf.update(self._client_config)
            self._admin = AdminClient(conf)
        return self._admin

    def _committer(self) -> Any:
        if self._group_consumer is None:
            conf: dict[str, Any] = {
                **self._client_config,
                "bootstrap.servers": self._bootstrap,
                "group.id": self._group_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",
                "logger": _client_log,
            }
            self._group_consumer = Consumer(conf)
        return self._group_consumer

    def _offsets_client(self) -> Any:
        """A consumer without a group that lists offsets (read_committed: the last stable offset)."""
        if self._offsets_consumer is None:
            conf: dict[str, Any] = {
                **self._client_config,
                "bootstrap.servers": self._bootstrap,
                "group.id": _READER_GROUP,  # never joins the group nor commits: it only lists offsets
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "socket.connection.setup.timeout.ms": max(1000, int(self._timeout_s * 1000)),
                "logger": _client_log,
            }
            self._offsets_consumer = Consumer(conf)
        return self._offsets_consumer

    def _end_offsets(self, split_ids: Sequence[str]) -> dict[str, int] | None:
        """The end offsets of ``split_ids`` (one id per partition, as :attr:`_known` holds them)
        through the offsets consumer's ``offsets_for_times`` in requests of ``_LIST_OFFSETS_CHUNK``
        partitions; None when any partition did not answer with an offset (the caller then lists
        through :meth:`_list_offsets`, which retries, waits for leaders and says what failed).

        ``AdminClient.list_offsets`` answers each partition with a Python future (a lock and a
        condition each): at 10,000 partitions that alone took 0.4-0.7 s an epoch, this 0.04-0.06 s
        (load 28, 2 cores). The requests (TopicPartition objects) are kept while the ids are the
        same, which they are from one epoch to the next unless discovery found or lost a partition.
        """
        ids = tuple(split_ids)
        if self._end_requests is None or self._end_requests[0] != ids:
            partitions = [TopicPartition(*parse_split_id(sid), OFFSET_END) for sid in ids]
            chunks = [
                partitions[at : at + _LIST_OFFSETS_CHUNK] for at in range(0, len(ids), _LIST_OFFSETS_CHUNK)
            ]
            self._end_requests = (ids, chunks)
        consumer = self._offsets_client()
        found: list[int] = []
        try:
            for chunk in self._end_requests[1]:
                answered = consumer.offsets_for_times(chunk, timeout=self._timeout_s)
                if len(answered) != len(chunk):
                    return None
                for asked, tp in zip(chunk, answered, strict=True):
                    if tp.error is not None or tp.offset < 0 or tp.partition != asked.partition:
                        return None
                    found.append(tp.offset)
        except KafkaException as err:
            log.info("end offsets through the offsets consumer failed (%s); listing them again", err)
            return None
        return dict(zip(ids, found, strict=True))

    def _retry_unreachable(self, err: KafkaException, deadline: float) -> bool:
        """Whether a request that found no broker (a restart, a leader failing over) may be sent again.

        Yes until ``deadline`` (``timeout_s`` after the first attempt), after a short pause, on a
        fresh admin client; never for another error or a refused authentication. The fresh client
        matters: with librdkafka 2.16 a client asked for group offsets while the broker restarts
        can lose its coordinator lookup (the FindCoordinator sent on the bootstrap connection
        fails with "Broker handle destroyed" and is not sent again), after which every group
        request of that client times out until the connection drops (compare librdkafka issue
        5511); a new client looks the coordinator up again.
        """
        kerr = _kafka_error(err)
        if kerr is None or kerr.code() not in _UNREACHABLE_CODES or time.monotonic() >= deadline:
            return False
        client = self._client_error
        if isinstance(client, KafkaError) and client.code() in _AUTH_CODES:
            return False
        log.info("Kafka at %s did not answer (%s); asking again on a new client", self._bootstrap, kerr.str())
        self._admin = None
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        return True

    def _attempt_s(self, deadline: float) -> float:
        """How long one admin request may wait: up to ``_ATTEMPT_S``, never past ``deadline``."""
        return max(0.5, min(_ATTEMPT_S, deadline - time.monotonic()))

    def _on_client_error(self, err: Any) -> None:
        self._client_error = err
        _client_log.warning("Kafka client error: %s", err.str() if isinstance(err, KafkaError) else err)

    def _metadata(self, step: str = "", reuse_after: Sequence[str] = ()) -> dict[str, tuple[int, ...]]:
        """Every non-internal topic that exists now -> its partitions that have a leader (sorted).

        A topic or partition being created may have no leader for a moment; it
        is left out of this round and discovered by a later one. ``step`` names the discovery
        step asking; the answer a step in ``reuse_after`` had last (at most ``_ROUND_REUSE_S`` old)
        is returned again.
        """
        if self._round_metadata is not None:
            at, last, answer = self._round_metadata
            if last in reuse_after and time.monotonic() - at <= _ROUND_REUSE_S:
                self._round_metadata = (at, step, answer)
                return dict(answer)
        if self._kept_metadata is not None and self._kept(self._kept_metadata[0]):
            self._round_metadata = (time.monotonic(), step, dict(self._kept_metadata[1]))
            self._reused = True
            return dict(self._kept_metadata[1])
        self._reused = False
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                cluster = self._admin_client().list_topics(timeout=self._attempt_s(deadline))
                break
            except KafkaException as err:
                self._admin_client().poll(
                    0
                )  # serve queued error callbacks: an authentication failure says why
                if not self._retry_unreachable(err, deadline):
                    raise _unreachable(self._bootstrap, self._timeout_s, err, self._client_error) from err
        self._cluster_id = cluster.cluster_id
        self._unready = set()
        out: dict[str, tuple[int, ...]] = {}
        for name, meta in cluster.topics.items():
            if _is_internal(name):
                continue
            if meta.error is not None and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue
            ready = tuple(
                sorted(p for p, pm in meta.partitions.items() if pm.leader >= 0 and pm.error is None)
            )
            if meta.error is not None or len(ready) < len(meta.partitions):
                self._unready.add(name)
                log.info(
                    "topic %s is not fully ready (%s); discovery picks the rest up later", name, meta.error
                )
            out[name] = ready
        self._round_metadata = (time.monotonic(), step, dict(out))
        # a topic not fully ready is asked about again next round, not kept
        self._kept_metadata = None if self._unready else (time.monotonic(), dict(out))
        return out

    def _kept(self, at: float) -> bool:
        """Whether an answer of the cluster asked at ``at`` is reused (``metadata_interval_s``)."""
        return self._metadata_interval_s > 0 and time.monotonic() - at < self._metadata_interval_s

    def _forget_kept(self) -> None:
        """The next discovery round asks the cluster for its metadata and topic ids again."""
        self._kept_metadata = self._kept_ids = None

    def _resolve_topics(self, existing: Mapping[str, tuple[int, ...]]) -> list[str]:
        if self._pattern is not None:
            matched = sorted(t for t in existing if self._pattern.fullmatch(t))
            if not matched and not self._warned_no_match:
                shown = sorted(existing)
                listing = ", ".join(shown[:50]) + (f" ... ({len(shown)} topics)" if len(shown) > 50 else "")
                log.warning(
                    "source.topic_pattern %r matches no topic on Kafka at %s (a whole topic name must "
                    "match; internal __ topics never do): nothing is read until a topic matches. Topics "
                    "there: %s",
                    self._topic_pattern,
                    self._bootstrap,
                    listing or "(none)",
                )
            self._warned_no_match = not matched  # said once until a topic matched again
            return matched
        missing = [t for t in self._topics if t not in existing]
        if missing:
            shown = sorted(existing)
            listing = ", ".join(shown[:50]) + (f" ... ({len(shown)} topics)" if len(shown) > 50 else "")
            close = [c for t in missing for c in difflib.get_close_matches(t, shown, n=3, cutoff=0.8)]
            guess = f"; did you mean {', '.join(repr(c) for c in dict.fromkeys(close))}?" if close else ""
            raise SourceError(
                f"source.topics names {', '.join(repr(t) for t in missing)}, which "
                f"{'does' if len(missing) == 1 else 'do'} not exist on Kafka at {self._bootstrap}{guess}; "
                f"existing topics: {listing or '(none)'}. Create the topic or fix source.topics",
                missing=missing,
                existing=shown,
            )
        return sorted(self._topics)

    def _list_offsets(self, specs: Mapping[str, Any], what: str, *, partial: bool = False) -> dict[str, int]:
        """ListOffsets (read_committed) for every split id in ``specs``: split id -> offset.

        One request per ``_LIST_OFFSETS_CHUNK`` partitions per round, all sent before any answer
        is awaited. Partitions that answer with a retriable error (a
        leader moving, a partition still being created) are asked again until
        ``timeout_s`` passed; with ``partial`` they are left out of the answer
        instead (discovery defers them to its next round). Raises SourceError
        for an unreachable cluster or a partition that cannot be listed.
        """
        out: dict[str, int] = {}
        pending = dict(specs)
        deadline = time.monotonic() + self._timeout_s
        while pending:
            asked: dict[tuple[str, int], list[str]] = {}  # one request per partition, for every id of it
            for sid in pending:
                asked.setdefault(parse_split_id(sid), []).append(sid)
            request = [(TopicPartition(*tp), pending[sids[0]]) for tp, sids in asked.items()]
            failed: dict[str, KafkaError] = {}
            try:
                futures: dict[Any, Any] = {}
                for at in range(0, len(request), _LIST_OFFSETS_CHUNK):  # all in flight, then awaited
                    futures.update(
                        self._admin_client().list_offsets(
                            dict(request[at : at + _LIST_OFFSETS_CHUNK]),
                            isolation_level=IsolationLevel.READ_COMMITTED,
                            request_timeout=self._attempt_s(deadline),
                        )
                    )
                for tp, future in futures.items():
                    sids = asked[(tp.topic, tp.partition)]
                    try:
                        offset = int(future.result().offset)
                        out.update(dict.fromkeys(sids, offset))
                    except KafkaException as err:
                        kerr = _kafka_error(err)
                        if kerr is None or not _transient(kerr):
                            raise
                        failed.update(dict.fromkeys(sids, kerr))
            except KafkaException as err:
                kerr = _kafka_error(err)
                if self._retry_unreachable(err, deadline):
                    continue
                if kerr is not None and kerr.code() in _UNREACHABLE_CODES:
                    raise _unreachable(self._bootstrap, self._timeout_s, err) from err
                raise SourceError(
                    f"listing the {what} offsets of {sorted(pending)} on Kafka at {self._bootstrap} failed: "
                    f"{kerr.str() if kerr is not None else err}",
                    splits=sorted(pending),
                ) from err
            if failed and partial:
                log.info(
                    "%s offsets of %s not available yet (%s); retried next round",
                    what,
                    sorted(failed),
                    next(iter(failed.values())).str(),
                )
                break
            if failed and time.monotonic() > deadline:
                raise SourceError(
                    f"listing the {what} offsets of {sorted(failed)} on Kafka at {self._bootstrap} kept "
                    f"failing for {self._timeout_s:g}s: {next(iter(failed.values())).str()}",
                    splits=sorted(failed),
                )
            pending = {sid: specs[sid] for sid in failed}
            if pending:
                time.sleep(0.1)
        return out

    # -- discovery --------------------------------------------------------------------------

    def subscriptions(self) -> frozenset[str]:
        """The topics subscribed now: the configured list (all must exist) or the pattern's matches."""
        return frozenset(self._resolve_topics(self._metadata("subscriptions")))

    def mark_initial_discovery_finished(self) -> None:
        """From now on every newly discovered split starts at the earliest offset (FLIP-288).

        Called by the runtime when it restores a checkpoint, before the restored
        enumerator's first discovery (splits new to that checkpoint are not
        "initial"; see :class:`~splitkeeper.core.source.SupportsInitialDiscovery`).
        The first :meth:`discover_splits` of a fresh pipeline sets it by itself. Idempotent.
        """
        self._initial_done = True

    def discover_splits(self) -> list[Split]:
        """Every partition of the subscribed topics, sorted by (topic, partition), at its start position.

        Called by the driver every epoch; starts a new round of end offsets
        (the :meth:`available_end` cache is refreshed on its next call). Splits
        already discovered by this object are returned as first discovered
        (position and backlog boundary unchanged); new ones are positioned as
        the module doc says. The initial discovery waits up to ``timeout_s`` for
        every partition; later ones leave a partition that is still being
        created (no leader, offsets not listable) to the next round. Raises
        SourceError for an unreachable cluster or a missing explicitly listed topic.
        """
        deadline = time.monotonic() + self._timeout_s
        reuse: tuple[str, ...] = ("subscriptions", "check_splits")  # this round's, the first time
        while True:
            existing = self._metadata("discover", reuse_after=reuse)
            topics = self._resolve_topics(existing)
            if self._initial_done or not self._unready.intersection(topics) or time.monotonic() > deadline:
                break
            reuse = ()
            time.sleep(0.1)  # the initial discovery waits for partitions that are still being created
        self._ends = None
        self._unlisted = set()
        identities = self._identities(topics)
        for sid in [
            s
            for s, split in self._known.items()
            if split.subscription not in existing
            or (split.identity and identities.get(split.subscription, split.identity) != split.identity)
        ]:
            del self._known[sid]  # topic deleted (and maybe re-created): its splits are not the old ones
        current = [self._split_id(t, p, identities.get(t, "")) for t in topics for p in existing[t]]
        new = [sid for sid in current if sid not in self._known]
        if new:
            self._add_new_splits(new, identities)
        self._initial_done = True
        self._round_metadata = self._round_ids = None  # the round ends: the next one asks anew
        return [self._known[sid] for sid in current if sid in self._known]

    def _split_id(self, topic: str, partition: int, identity: str) -> str:
        """The id of ``topic``'s ``partition`` whose topic has ``identity`` now: the plain id, unless a
        split the enumerator knows (:meth:`check_splits`) holds it with another identity (a split of
        the topic before it was deleted and re-created): then the id with ``identity``'s suffix."""
        plain = split_id_of(topic, partition)
        held = self._taken.get(plain)
        if held is None or not held or not identity or held == identity:
            return plain
        return split_id_of(topic, partition, identity)

    def _identities(self, topics: Sequence[str]) -> dict[str, str]:
        """Topic -> the identity of its splits now (its topic id, KIP-516), one DescribeTopics request
        for all. "" for a topic whose id cannot be had (a broker without topic ids, a describe that
        fails): its splits then behave as before topic ids. A topic gone meanwhile is left out."""
        if not topics:
            return {}
        if self._round_ids is not None and time.monotonic() - self._round_ids[0] <= _ROUND_REUSE_S:
            known = self._round_ids[1]
            if all(t in known for t in topics):  # this round's check_splits described them
                return {t: known[t] for t in topics}
        if self._kept_ids is not None and self._kept(self._kept_ids[0]):
            known = self._kept_ids[1]
            if all(known.get(t) for t in topics):  # described within metadata_interval_s, with ids
                self._round_ids = (time.monotonic(), {t: known[t] for t in topics})
                return {t: known[t] for t in topics}
        deadline = time.monotonic() + self._timeout_s
        out: dict[str, str] = {}
        results: dict[str, Any] = {}
        while True:
            try:
                futures = self._admin_client().describe_topics(
                    TopicCollection(list(topics)), request_timeout=self._attempt_s(deadline)
                )
                results = {}
                for topic, future in futures.items():
                    try:
                        results[topic] = future.result()
                    except KafkaException as err:
                        kerr = _kafka_error(err)
                        if kerr is not None and kerr.code() in _UNREACHABLE_CODES:
                            raise
                        if kerr is None or kerr.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                            log.info("topic %s: no topic id now (%s)", topic, err)
                            out[topic] = ""
                break
            except KafkaException as err:
                if self._retry_unreachable(err, deadline):
                    continue
                kerr = _kafka_error(err)
                if kerr is not None and kerr.code() in _UNREACHABLE_CODES:
                    raise _unreachable(self._bootstrap, self._timeout_s, err, self._client_error) from err
                log.info("Kafka at %s did not describe %s (%s): no topic ids", self._bootstrap, topics, err)
                return dict.fromkeys(topics, "")
        out.update({topic: topic_identity(found.topic_id) for topic, found in results.items()})
        self._round_ids = (time.monotonic(), dict(out))
        self._kept_ids = (time.monotonic(), dict(out))
        if out and not any(out.values()) and not self._no_topic_ids:
            self._no_topic_ids = True
            log.warning(
                "Kafka at %s gives no topic ids (KIP-516, Kafka 2.8+): a topic deleted and re-created "
                "under the same name cannot be told from the old one",
                self._bootstrap,
            )
        return out

    def check_splits(
        self, live: Sequence[Split], finished: Mapping[str, str], *, recheck_finished: bool = True
    ) -> list[SplitChange]:
        """The known splits whose topic has another id now (deleted and re-created: RECREATED, with
        the new topic's partition as the replacement, at its earliest offset), or had none recorded
        (IDENTIFIED), in id order; see the module doc. Learns every known id with its identity, so
        that :meth:`discover_splits` names a re-created topic's partitions apart from the old ones.
        Finished splits (a Kafka split finishes only when its topic was re-created) change nothing
        (so ``recheck_finished`` changes nothing either)."""
        self._taken = {**dict(finished), **{s.split_id: s.identity for s in live}}
        by_topic: dict[str, list[Split]] = {}
        for split in live:
            topic, _partition = parse_split_id(split.split_id)
            by_topic.setdefault(topic, []).append(split)
        if not by_topic:
            return []
        existing = self._metadata("check_splits", reuse_after=("subscriptions",))
        self._round_ids = None  # check_splits describes anew: the topic may have been re-created
        identities = self._identities(sorted(t for t in by_topic if t in existing))
        changes: list[SplitChange] = []
        recreated: list[tuple[Split, str, str]] = []  # (old split, identity now, the new split's id)
        for topic, splits in by_topic.items():
            now = identities.get(topic)
            if not now:
                continue  # gone, not described this round, or no topic ids: nothing to compare
            for split in splits:
                if not split.identity:
                    changes.append(SplitChange(split.split_id, SplitChangeKind.IDENTIFIED, now, ""))
                    self._taken[split.split_id] = now
                elif split.identity != now:
                    _topic, partition = parse_split_id(split.split_id)
                    new_id = split_id_of(topic, partition, now)
                    recreated.append((split, now, new_id if partition in existing[topic] else ""))
        # the new partitions that answer now are the replacements; one still being created is found by
        # a later discovery under the same id, at its earliest offset (the old split ends now all the same)
        wanted = [new_id for _s, _now, new_id in recreated if new_id]
        starts = self._list_offsets(dict.fromkeys(wanted, OffsetSpec.earliest()), "earliest", partial=True)
        ends = self._list_offsets(dict.fromkeys(wanted, OffsetSpec.latest()), "end", partial=True)
        for split, now, new_id in recreated:
            topic, partition = parse_split_id(split.split_id)
            replacement: tuple[Split, ...] = ()
            then = f"its partition {partition} is read from its start as split {new_id}"
            if new_id in starts and new_id in ends:
                start, end = starts[new_id], ends[new_id]
                fresh = Split(
                    new_id, topic, position=start, backlog_end=end if end > start else None, identity=now
                )
                self._known[new_id] = fresh
                replacement = (fresh,)
            elif not new_id:
                then = f"it has no partition {partition} now"
            changes.append(
                SplitChange(
                    split.split_id,
                    SplitChangeKind.RECREATED,
                    now,
                    f"topic {topic!r} was deleted and re-created (topic id {_topic_id(split.identity)} -> "
                    f"{_topic_id(now)}): split {split.split_id} ends at offset {split.position} (the old "
                    f"topic's records from there on, if any, were deleted with it); {then}",
                    start=replacement[0].position if replacement else 0,
                    replacement=replacement,
                )
            )
        return sorted(changes, key=lambda c: c.split_id)

    def _add_new_splits(self, new: list[str], identities: Mapping[str, str]) -> None:
        # The initial discovery waits (up to timeout_s) for every partition; later rounds take the
        # partitions that answer and leave the others (still being created) to the next round.
        partial = self._initial_done
        ends = self._list_offsets(dict.fromkeys(new, OffsetSpec.latest()), "end", partial=partial)
        new = [sid for sid in new if sid in ends]
        mode = self._starting if not self._initial_done else StartingMode.EARLIEST
        if mode is StartingMode.LATEST:
            starts = dict(ends)
        elif mode is StartingMode.TIMESTAMP:
            assert self._starting_ms is not None
            found = self._list_offsets(
                dict.fromkeys(new, OffsetSpec.for_timestamp(self._starting_ms)), "timestamp", partial=partial
            )
            starts = {sid: (off if off >= 0 else ends[sid]) for sid, off in found.items()}
        else:
            starts = self._list_offsets(
                dict.fromkeys(new, OffsetSpec.earliest()), "earliest", partial=partial
            )
            if mode is StartingMode.GROUP:
                committed = self._group_offsets(new)
                fallback = sorted(sid for sid in new if sid not in committed)
                if fallback:
                    log.info(
                        "consumer group %s has no committed offset for %s; starting at the earliest offset",
                        self._group_id,
                        fallback,
                    )
                starts.update(committed)
        new = [sid for sid in new if sid in starts]
        if self._initial_done and new:
            log.info("new Kafka splits discovered while running start at the earliest offset: %s", new)
        for sid in new:
            topic, _partition = parse_split_id(sid)
            start, end = starts[sid], ends[sid]
            self._known[sid] = Split(
                sid,
                subscription=topic,
                position=start,
                backlog_end=end if end > start else None,
                identity=identities.get(topic, ""),
            )

    def _group_offsets(self, split_ids: Sequence[str]) -> dict[str, int]:
        """The group's committed offsets of ``split_ids`` (those that have one)."""
        tps = [TopicPartition(*parse_split_id(sid)) for sid in split_ids]
        try:
            committed = self._committer().committed(tps, timeout=self._timeout_s)
        except KafkaException as err:
            raise _unreachable(self._bootstrap, self._timeout_s, err) from err
        return {
            split_id_of(tp.topic, tp.partition): int(tp.offset)
            for tp in committed
            if tp.error is None and tp.offset >= 0
        }

    def available_end(self, split: Split) -> int:
        """The partition's end offset (last stable offset) as of this discovery round.

        The first call after :meth:`discover_splits` fetches the ends of every
        known partition (and ``split``) in one request; later calls in the
        same round answer from that cache.

        When this round's partitions are a kept answer (``metadata_interval_s``), a partition
        that does not answer (its topic deleted since) is not waited for: SourceError for its
        split in this round (the planner's failed read of the split: its region declines), and
        the next round asks the cluster for its topics again.
        """
        if split.split_id in self._unlisted:
            raise SourceError(
                f"the end offset of {split.split_id} cannot be listed on Kafka at {self._bootstrap} "
                "now (its topic deleted or being re-created since the partitions were last asked "
                "for, source.metadata_interval_s); the next epoch asks for the topics again",
                split=split.split_id,
            )
        if self._ends is None or split.split_id not in self._ends:
            ids = list(dict.fromkeys([*self._known, split.split_id]))
            plain = len({parse_split_id(sid) for sid in ids}) == len(ids)  # one id per partition
            ends = self._end_offsets(ids) if plain else None
            if ends is None:
                reused = self._reused
                try:
                    ends = self._list_offsets(dict.fromkeys(ids, OffsetSpec.latest()), "end", partial=reused)
                except SourceError:
                    self._forget_kept()  # a partition gone (a topic deleted): the next round asks
                    raise
                if reused and len(ends) < len(ids):
                    self._forget_kept()
                    self._unlisted = {sid for sid in ids if sid not in ends}
            self._ends = {**(self._ends or {}), **ends}
        return self.available_end(split) if split.split_id in self._unlisted else self._ends[split.split_id]

    def offset_for(self, split: Split, kind: str, timestamp_ms: int | None = None) -> int:
        """The partition's offset for ``offsets reset --to``: ``earliest`` (log start), ``latest``
        (last stable offset) or ``timestamp`` (the first offset at or after ``timestamp_ms``; the
        end when no record is that new), as Kafka's ``--reset-offsets`` resolves them."""
        specs = {"earliest": OffsetSpec.earliest(), "latest": OffsetSpec.latest()}
        if kind == "timestamp":
            if timestamp_ms is None:
                raise InvalidParameterError("timestamp", timestamp_ms, "epoch milliseconds")
            specs["timestamp"] = OffsetSpec.for_timestamp(timestamp_ms)
        if kind not in specs:
            raise InvalidParameterError("kind", kind, "earliest, latest or timestamp")
        found = self._list_offsets({split.split_id: specs[kind]}, kind)[split.split_id]
        if kind == "timestamp" and found < 0:
            return self._list_offsets({split.split_id: OffsetSpec.latest()}, "end")[split.split_id]
        return found

    def offset_bounds(self, split: Split) -> tuple[int, int]:
        """The partition's log start offset and end (last stable offset) now: where ``offsets reset``
        clamps an offset outside them, as ``kafka-consumer-groups --reset-offsets`` does."""
        start = self._list_offsets({split.split_id: OffsetSpec.earliest()}, "earliest")[split.split_id]
        end = self._list_offsets({split.split_id: OffsetSpec.latest()}, "end")[split.split_id]
        return start, end

    # -- retention --------------------------------------------------------------------------

    def check_retention(self, ranges: Iterable[PlannedRange | tuple[Split, int, int]]) -> RetentionCheck:
        """Compare each range's start with its partition's log start offset (one request for all).

        ``fail``: SourceError naming every affected topic, partition, requested
        offset and earliest available offset, and the config key to change.
        ``skip``: the range moves to ``[earliest, earliest + budget)`` (the end
        re-planned with :meth:`plan_end`) and a :class:`LostRange` reports
        ``[start, earliest)``; each is logged as a warning. See
        :meth:`SupportsRetentionCheck.check_retention` for who calls it.
        """
        planned = [PlannedRange(*r) for r in ranges]
        earliest = self._list_offsets({r.split.split_id: OffsetSpec.earliest() for r in planned}, "earliest")
        aged = [r for r in planned if r.start < earliest[r.split.split_id]]
        if not aged:
            return RetentionCheck(tuple(planned))
        if self._on_out_of_range is OffsetOutOfRange.FAIL:
            parts = []
            for r in aged:
                topic, partition = parse_split_id(r.split.split_id)
                parts.append(
                    f"topic {topic!r} partition {partition}: requested offset {r.start}, "
                    f"earliest available {earliest[r.split.split_id]}"
                )
            raise SourceError(
                "Kafka records to read next aged out of retention (or were deleted): "
                + "; ".join(parts)
                + ". Set source.on_offset_out_of_range: skip to continue from the earliest available offset "
                "and record the lost offsets, or restore the data",
                splits=[r.split.split_id for r in aged],
                requested={r.split.split_id: r.start for r in aged},
                earliest={r.split.split_id: earliest[r.split.split_id] for r in aged},
                config_key="source.on_offset_out_of_range",
            )
        moved: list[PlannedRange] = []
        lost: list[LostRange] = []
        for r in planned:
            first = earliest[r.split.split_id]
            if r.start >= first:
                moved.append(r)
                continue
            gone = LostRange(r.split.split_id, r.start, first)
            log.warning("%s", gone.detail)
            lost.append(gone)
            moved.append(PlannedRange(r.split, first, self.plan_end(r.split, first, r.end - r.start)))
        return RetentionCheck(tuple(moved), tuple(lost))

    # -- external positions (protocol section 3) ------------------------------------------------------

    def commit_positions(self, checkpoint_id: int, positions: Mapping[str, int]) -> None:
        """Commit ``positions`` as offsets of ``group_id``, each tagged with ``checkpoint_id``.

        Called by the runtime after checkpoint ``checkpoint_id`` is durable,
        with acknowledged regions' positions only; idempotent (a repeat commits
        the same values). Without a ``group_id`` nothing is committed. Never moves
        the group backwards: a partition whose committed offset is tagged with a
        newer checkpoint (a late commit of an older run) is refused and logged. Raises
        SourceError when the broker refuses a commit (e.g. the group has live
        members: splitkeeper commits as a standalone member, so use a group id
        no consumer subscribes with).
        """
        if not positions or self._group_id is None:
            return
        offsets = [
            TopicPartition(*parse_split_id(sid), int(pos), metadata=_commit_metadata(checkpoint_id, sid))
            for sid, pos in sorted(positions.items())
        ]
        newer = self._newer_commits(checkpoint_id, offsets)
        if newer:
            log.warning(
                "consumer group %s: refused to commit checkpoint %s's offsets of %s: the group holds "
                "offsets of a newer checkpoint there (%s). Checkpoint ids only grow, so this is a late "
                "commit of an older run and would move the group backwards; nothing of it is committed "
                "there. If the pipeline's state was started anew with this group, give it a new "
                "source.group_id",
                self._group_id,
                checkpoint_id,
                sorted(newer),
                ", ".join(
                    f"{sid}: offset {o.position} of checkpoint {o.checkpoint_id}" for sid, o in newer.items()
                ),
            )
            offsets = [tp for tp in offsets if split_id_of(tp.topic, tp.partition) not in newer]
            if not offsets:
                return
        try:
            result = self._committer().commit(offsets=offsets, asynchronous=False)
        except KafkaException as err:
            raise SourceError(
                f"committing checkpoint {checkpoint_id} positions to consumer group {self._group_id!r} on "
                f"Kafka at {self._bootstrap} failed: {err.args[0] if err.args else err}. If consumers "
                "subscribe with that group id, give the pipeline a group id of its own (source.group_id)",
                group_id=self._group_id,
                checkpoint_id=checkpoint_id,
            ) from err
        failed = [f"{tp.topic}-{tp.partition}: {tp.error}" for tp in result or () if tp.error is not None]
        if failed:
            raise SourceError(
                f"committing checkpoint {checkpoint_id} positions to consumer group {self._group_id!r} "
                f"failed for {failed}",
                group_id=self._group_id,
                checkpoint_id=checkpoint_id,
            )

    def _newer_commits(
        self, checkpoint_id: int, offsets: Sequence[TopicPartition]
    ) -> dict[str, ExternalPosition]:
        """The group's commits of ``offsets``' partitions tagged with a checkpoint after ``checkpoint_id``.

        Kafka has no conditional offset commit: this read just before the commit is what keeps a
        paused old run's late commit from moving the group backwards (a commit racing it within
        that moment is not caught; the group's offsets are a report, never a restore position).
        """
        request = [TopicPartition(tp.topic, tp.partition) for tp in offsets]
        try:
            committed = self._committer().committed(request, timeout=self._timeout_s)
        except KafkaException as err:
            raise _unreachable(self._bootstrap, self._timeout_s, err) from err
        newer: dict[str, ExternalPosition] = {}
        for tp in committed:
            tag = _checkpoint_tag(tp.metadata) if tp.error is None and tp.offset >= 0 else None
            if tag is not None and tag > checkpoint_id:
                newer[split_id_of(tp.topic, tp.partition)] = ExternalPosition(int(tp.offset), tag)
        return newer

    def committed_positions(self) -> dict[str, ExternalPosition]:
        """The group's committed offsets by split id, with the splitkeeper checkpoint id they carry.

        Reads every partition the group has committed (one request), so
        offsets of topics no longer subscribed are reported too. An offset
        committed by another tool (an operator's ``kafka-consumer-groups
        --reset-offsets``) carries no checkpoint tag: it is reported with
        ``checkpoint_id`` None, so a restore names it when it disagrees (protocol
        rule 3.3), and logged once as a warning. Empty without a ``group_id``.
        """
        if self._group_id is None:
            return {}
        request = [ConsumerGroupTopicPartitions(self._group_id)]
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                futures = self._admin_client().list_consumer_group_offsets(
                    request, request_timeout=self._attempt_s(deadline)
                )
                listed = futures[self._group_id].result().topic_partitions or []
                break
            except KafkaException as err:
                if not self._retry_unreachable(err, deadline):
                    raise _unreachable(self._bootstrap, self._timeout_s, err) from err
        out: dict[str, ExternalPosition] = {}
        untagged: list[str] = []
        for tp in listed:
            if tp.error is not None or tp.offset == OFFSET_INVALID or tp.offset < 0:
                continue
            sid = _split_of_commit(tp.metadata) or split_id_of(tp.topic, tp.partition)
            checkpoint_id = _checkpoint_tag(tp.metadata)
            if checkpoint_id is None:
                untagged.append(sid)
            out[sid] = ExternalPosition(int(tp.offset), checkpoint_id)
        fresh = sorted(set(untagged) - self._warned_untagged)
        if fresh:
            self._warned_untagged.update(fresh)
            log.warning(
                "consumer group %s has offsets without a splitkeeper checkpoint id for %s "
                "(committed by another tool); the checkpoint's positions are used, and a restore names "
                "every one of them that disagrees",
                self._group_id,
                fresh,
            )
        return dict(sorted(out.items()))


#: Key of the offset-commit metadata that names the split when it is not the plain id (a partition of
#: a re-created topic): the group's offset is then compared with that split on restore.
_COMMIT_SPLIT_KEY = "splitkeeper_split"


def _commit_metadata(checkpoint_id: int, split_id: str) -> str:
    tag: dict[str, object] = {COMMIT_METADATA_KEY: checkpoint_id}
    if split_id != split_id_of(*parse_split_id(split_id)):
        tag[_COMMIT_SPLIT_KEY] = split_id
    return json.dumps(tag, separators=(",", ":"))


def _split_of_commit(metadata: str | None) -> str | None:
    try:
        value = json.loads(metadata or "{}").get(_COMMIT_SPLIT_KEY)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def _topic_id(identity: str) -> str:
    return identity.removeprefix(_IDENTITY_PREFIX) or "none"


def _checkpoint_tag(metadata: str | None) -> int | None:
    if not metadata:
        return None
    try:
        value = json.loads(metadata).get(COMMIT_METADATA_KEY)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _meta(msg: Any) -> RecordMeta:
    """A message's key, topic, partition, timestamp and headers (the sink's metadata columns)."""
    ts_type, ts = msg.timestamp()
    headers = msg.headers() or ()
    return RecordMeta(
        key=msg.key(),
        topic=msg.topic(),
        partition=msg.partition(),
        timestamp_ms=None if ts_type == TIMESTAMP_NOT_AVAILABLE else ts,
        headers=tuple((str(k), v) for k, v in headers),
    )


def _headers_array(headers: list[list[tuple[str, bytes | None]] | None]) -> pa.Array:
    """The headers column of messages some of which carry headers (``[]`` for those without)."""
    return pa.array(
        [[{"key": str(k), "value": v} for k, v in h] if h else [] for h in headers], _META_TYPES[4]
    )


def _no_headers(n: int) -> pa.Array:
    """The headers column of ``n`` messages without headers: ``n`` empty lists."""
    return pa.ListArray.from_arrays(
        pa.repeat(pa.scalar(0, pa.int32()), n + 1),
        pa.array([], _META_TYPES[4].value_type),
        type=_META_TYPES[4],
    )


def connector(section: Any) -> KafkaSource:
    """The kafka source of a validated ``source`` section (the kind's builder, :mod:`splitkeeper.kinds`)."""
    return KafkaSource.from_config(section)
