"""Kafka for the tools that ingest known data: ``splitkeeper-tools chaos``, ``bench ingest --source kafka``.

- :class:`BrokerHandle`: the Kafka a tool runs against, either the project's own KRaft
  broker (:class:`~splitkeeper_tools.kafka_broker.KafkaBroker`) in a folder the tool
  owns (restartable, cleanly or after a SIGKILL), or an external one named by
  ``--bootstrap-servers``;
- :func:`create_topics`: create topics and wait until every partition has a leader;
- :class:`NumberedProducer`: produces numbered messages whose key and value name them
  (``m<seq>|<topic>|<partition>|<hex payload>``) and keeps every delivery report, the
  oracle a sink is checked against;
- :func:`end_offsets`: per split, the offset after the last delivered message.

The clients' own logs go to :data:`QUIET_CLIENT_LOG`, which drops them (a tool that
bounces the broker on purpose expects connection errors). Driver-side only; nothing
here crosses to Spark executors.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from splitkeeper.errors import InvalidParameterError, SourceError

#: A logger for the librdkafka clients of these tools: swallows their output.
QUIET_CLIENT_LOG = logging.getLogger("splitkeeper_tools.kafka_testbed.librdkafka")
QUIET_CLIENT_LOG.addHandler(logging.NullHandler())
QUIET_CLIENT_LOG.propagate = False

_BOOTSTRAP = re.compile(r"[^\s,]+:\d+(,[^\s,]+:\d+)*")
DELIVERY_TIMEOUT_S = 660.0


def check_bootstrap_servers(value: str | None, name: str = "--bootstrap-servers") -> str | None:
    """``value`` unchanged when it is None or ``host:port[,host:port...]``; else InvalidParameterError."""
    if value is not None and not _BOOTSTRAP.fullmatch(value):
        raise InvalidParameterError(name, value, "'host:port[,host:port...]'")
    return value


@dataclass(frozen=True, slots=True)
class BrokerCrash:
    """What :meth:`BrokerHandle.crash_and_restart` did: the killed pid, its exit status, the new pid."""

    killed_pid: int | None
    exit_status: int | None  # -9: it died of the SIGKILL
    new_pid: int | None
    down_s: float  # from the kill until the restarted broker answered

    def describe(self) -> str:
        return (
            f"broker pid {self.killed_pid} SIGKILLed (exit {self.exit_status}), back as pid {self.new_pid} "
            f"after {self.down_s:g}s"
        )


class BrokerHandle:
    """Our own broker in ``<workdir>/kafka`` (restartable), or the external one at ``bootstrap_servers``.

    ``start`` returns the bootstrap servers; ``stop`` stops only a broker this handle
    started (an external one is left alone). One owner drives it; not thread-safe.
    """

    def __init__(self, workdir: Path, bootstrap_servers: str | None) -> None:
        self.external = bootstrap_servers
        self._broker: Any = None
        if bootstrap_servers is None:
            from splitkeeper_tools.kafka_broker import KafkaBroker, free_port

            self._broker = KafkaBroker(workdir / "kafka", port=free_port())  # a fixed port survives restarts

    @property
    def restartable(self) -> bool:
        return self._broker is not None

    def start(self, timeout_s: float = 180) -> str:
        if self._broker is None:
            assert self.external is not None
            return self.external
        self._broker.start(timeout_s=timeout_s)
        return str(self._broker.bootstrap_servers)

    def restart(self, down_s: float) -> str:
        """Stop the broker process (controlled shutdown), wait, start it again; the new pid."""
        assert self._broker is not None
        old = self._broker.pid
        self._broker.stop()
        time.sleep(down_s)
        self._broker.start(timeout_s=180)
        return f"pid {old} -> {self._broker.pid}"

    def crash_and_restart(self, down_s: float, on_killed: Callable[[], None] | None = None) -> BrokerCrash:
        """SIGKILL the broker process (no controlled shutdown), call ``on_killed``, wait ``down_s``,
        start it again."""
        assert self._broker is not None
        old = self._broker.pid
        status = self._broker.kill()
        killed_at = time.monotonic()
        if on_killed is not None:
            on_killed()
        time.sleep(down_s)
        self._broker.start(timeout_s=180)
        return BrokerCrash(old, status, self._broker.pid, round(time.monotonic() - killed_at, 1))

    def stop(self) -> None:
        if self._broker is not None:
            self._broker.stop()


#: Partitions created (or added) per admin request: a KRaft controller refuses one operation of more
#: than 10,000 metadata records (POLICY_VIOLATION "Unable to perform excessively large batch
#: operation"), and a topic of 10,000 partitions is 10,001 (the topic and one per partition).
PARTITIONS_PER_REQUEST = 5000


def create_topics(bootstrap: str, partitions: Mapping[str, int], timeout_s: float = 60) -> None:
    """Create each topic (name -> partition count, replication 1) and wait until all partitions have
    a leader. SourceError when they do not within ``timeout_s``; Kafka's error when a topic exists.
    A topic of more than :data:`PARTITIONS_PER_REQUEST` partitions is created with that many and
    grown to its count in steps of as many."""
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    admin_conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": QUIET_CLIENT_LOG}
    admin = AdminClient(admin_conf)
    first = {t: min(n, PARTITIONS_PER_REQUEST) for t, n in partitions.items()}
    for future in admin.create_topics([NewTopic(t, n, 1) for t, n in first.items()]).values():
        future.result(timeout=timeout_s)
    for topic, total in partitions.items():
        for count in range(
            first[topic] + PARTITIONS_PER_REQUEST, total + PARTITIONS_PER_REQUEST, PARTITIONS_PER_REQUEST
        ):
            grow = admin.create_partitions([NewPartitions(topic, min(count, total))])
            for future in grow.values():
                future.result(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        topics = admin.list_topics(timeout=10).topics
        leaders = [p.leader for t in partitions if t in topics for p in topics[t].partitions.values()]
        if len(leaders) == sum(partitions.values()) and min(leaders) >= 0:
            return
        time.sleep(0.1)
    raise SourceError(f"topics {sorted(partitions)} have no leaders after {timeout_s:g}s")


#: A message's value from (sequence number, topic, partition, payload hex): see :class:`NumberedProducer`.
ValueOf = Callable[[int, str, int, str], bytes]
KeyOf = Callable[[int, str, int], str]


def numbered_key(seq: int, topic: str, partition: int) -> str:
    """The default key of message ``seq``: ``m<seq:08d>`` (every message its own key)."""
    return f"m{seq:08d}"


def numbered_value(seq: int, topic: str, partition: int, payload: str) -> bytes:
    """The default value of message ``seq``: ``m<seq:08d>|<topic>|<partition>|<payload>``."""
    return f"m{seq:08d}|{topic}|{partition}|{payload}".encode()


def in_share(seq: int, share: float) -> bool:
    """Whether message ``seq`` is in the evenly spread ``share`` of the messages: of the first ``n``
    messages, ``int(n * share)`` are (malformed messages of the chaos run and the demo)."""
    return share > 0 and int((seq + 1) * share) > int(seq * share)


def value_text(value: bytes) -> str:
    """A value as the ``delivered`` oracle keeps it: UTF-8 text, and bytes that are not valid UTF-8
    as lone surrogates (``surrogateescape``), so :func:`value_bytes` gives back the exact bytes."""
    return value.decode("utf-8", "surrogateescape")


def value_bytes(text: str) -> bytes:
    """The exact bytes of a value :func:`value_text` kept."""
    return text.encode("utf-8", "surrogateescape")


class NumberedProducer:
    """Produces numbered messages and keeps every delivery report: the oracle.

    Message ``seq`` goes to a partition drawn from ``partitions`` with ``weights`` (None:
    equal weights), key ``m<seq:08d>``, value ``m<seq:08d>|<topic>|<partition>|<payload>``
    where the payload is the hex of ``payload_bytes`` random bytes (a ``(low, high)``
    range, drawn per message); ``value_of(seq, topic, partition, payload)`` makes another
    value (JSON objects, malformed records) from the same draws, ``key_of(seq, topic, partition)``
    another key (the keyed messages of ``chaos --sink upsert``). Draws come from ``seed``. The
    producer is idempotent with ``acks=all`` and never gives up on a message (it is delivered
    after a broker restart). ``delivered`` maps (topic, partition, offset) to the value;
    ``failed`` lists messages whose delivery failed. A value that is not valid UTF-8 is kept
    with :func:`value_text`.
    """

    def __init__(
        self,
        bootstrap: str,
        partitions: Sequence[tuple[str, int]],
        seed: int,
        *,
        weights: Sequence[int] | None = None,
        payload_bytes: tuple[int, int] = (4, 32),
        value_of: ValueOf = numbered_value,
        key_of: KeyOf = numbered_key,
    ) -> None:
        from confluent_kafka import Producer

        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 600_000,  # delivered after a broker restart, never given up
            "logger": QUIET_CLIENT_LOG,
        }
        self._producer = Producer(conf)
        self._partitions = list(partitions)
        self._weights = list(weights) if weights is not None else None
        self._payload_bytes = payload_bytes
        self._value_of = value_of
        self._key_of = key_of
        self._rng = random.Random(seed)
        self._next = 0
        self._lock = threading.Lock()  # delivery reports (called from poll/flush)
        self._numbering = threading.Lock()  # one batch at a time draws sequence numbers and partitions
        self.delivered: dict[tuple[str, int, int], str] = {}
        self.failed: list[str] = []

    def _on_delivery(self, err: Any, msg: Any) -> None:
        value = value_text(msg.value())
        with self._lock:
            if err is not None:
                self.failed.append(f"{(msg.key() or b'').decode()}: {err}")
            else:
                self.delivered[(msg.topic(), msg.partition(), msg.offset())] = value

    def produce(self, count: int, chunks: int = 1, pause_s: float = 0.0, each: int = 0) -> None:
        """Produce ``count`` messages in ``chunks`` flushed batches, ``pause_s`` apart; with ``each``,
        the first ``each`` messages of every partition are dealt round-robin before the weighted draw
        (every partition gets at least that many, however uneven the weights)."""
        if each * len(self._partitions) > count:
            raise ValueError(f"each={each} needs {each * len(self._partitions)} messages, not {count}")
        sizes = [count // chunks + (1 if i < count % chunks else 0) for i in range(chunks)]
        to_deal, dealt = each * len(self._partitions), 0
        with self._numbering:
            for i, size in enumerate(sizes):
                if i and pause_s:
                    time.sleep(pause_s)
                self._enqueue(size, range(dealt, to_deal))
                dealt = min(to_deal, dealt + size)
                self.flush()

    def enqueue(self, count: int) -> int:
        """Hand ``count`` messages to the client without waiting for their delivery reports.

        Returns how many messages the client holds undelivered right after (in flight: queued
        or sent, not yet acknowledged). :meth:`flush` (or a later :meth:`produce`) waits for them.
        """
        with self._numbering:
            self._enqueue(count)
            return len(self._producer)

    def connect(self, timeout_s: float = 30.0) -> None:
        """Connect now: ask for the metadata of every topic produced to. A fresh client otherwise
        holds its first messages back while it connects and gets its idempotent producer id
        (0.5-1.0 s on a local broker, 2 busy cores), which a latency measurement would count; the
        id request follows the connection, so give it a moment before timing (the latency
        benchmark's settle)."""
        for topic in dict.fromkeys(topic for topic, _partition in self._partitions):
            self._producer.list_topics(topic, timeout=timeout_s)

    def in_flight(self) -> int:
        """Messages handed to the client whose delivery report has not arrived yet."""
        return len(self._producer)

    def flush(self) -> None:
        """Wait for every delivery report; SourceError when some are missing after the delivery timeout."""
        left = self._producer.flush(DELIVERY_TIMEOUT_S)
        if left:
            raise SourceError(f"producer: {left} messages still undelivered after {DELIVERY_TIMEOUT_S:g}s")

    def _enqueue(self, count: int, deal: range = range(0)) -> None:
        low, high = self._payload_bytes
        for i in range(count):
            if i < len(deal):  # dealt round-robin first (produce's ``each``)
                topic, partition = self._partitions[deal[i] % len(self._partitions)]
            else:
                topic, partition = self._rng.choices(self._partitions, self._weights)[0]
            seq = self._next
            self._next += 1
            payload = self._rng.randbytes(self._rng.randint(low, high)).hex()
            value = self._value_of(seq, topic, partition, payload)
            while True:
                try:
                    self._producer.produce(
                        topic,
                        key=self._key_of(seq, topic, partition),
                        value=value,
                        partition=partition,
                        on_delivery=self._on_delivery,
                    )
                    break
                except BufferError:
                    self._producer.poll(0.1)
            self._producer.poll(0)

    def in_background(self, count: int, chunks: int, pause_s: float) -> threading.Thread:
        """:meth:`produce` in a daemon thread; its exception, if any, is in the thread's ``errors``."""
        errors: list[BaseException] = []

        def body() -> None:
            try:
                self.produce(count, chunks, pause_s)
            except BaseException as err:  # reported when joined
                errors.append(err)

        thread = threading.Thread(target=body, name="numbered-producer", daemon=True)
        thread.errors = errors  # type: ignore[attr-defined]
        thread.start()
        return thread


def end_offsets(delivered: Mapping[tuple[str, int, int], str]) -> dict[str, int]:
    """Per split id, the offset after the last delivered message."""
    from splitkeeper.sources.kafka.source import split_id_of

    ends: dict[str, int] = {}
    for topic, partition, offset in delivered:
        sid = split_id_of(topic, partition)
        ends[sid] = max(ends.get(sid, 0), offset + 1)
    return ends
