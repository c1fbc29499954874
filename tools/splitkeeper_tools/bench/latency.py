"""``splitkeeper-tools bench latency --source kafka``: produce-to-visible latency, ours vs the baseline.

One run, one Spark session (:func:`latency_spark`: ``local[2 x cores]`` unless one runs, the
long-lived readers holding at most half its task slots), one Kafka (the project's own KRaft
broker in a temporary folder, :class:`splitkeeper_tools.kafka_testbed.BrokerHandle`), one fresh
topic of ``--partitions``
partitions (default 8), both sides reading it side by side in the same process:

- **ours**: :func:`splitkeeper.app.services.run` with ``continuous=True`` in a thread (the
  stop event ends it on a final global checkpoint), ``backlog.backlog_interval_s`` and
  ``normal_interval_s`` = ``--interval-s`` (0.5), ``--parallelism`` regions (4), regional
  checkpoints on, raw values into its Delta sink (the pipeline of ``bench ingest --source
  kafka``: :func:`~splitkeeper_tools.bench.ingest_common.pipeline_config`), its ``readers`` as
  ``--readers`` says (``long_lived``: one reader job for the run; ``per_epoch``: a job per epoch);
- **Structured Streaming**: Kafka source (``startingOffsets earliest``, ``read_committed``) ->
  ``split_id``, ``offset``, ``value`` (as a string) -> Delta sink, the default trigger (a
  micro-batch as soon as the previous one ended), its own checkpoint.

Once both are started (our sink table exists, the query made its first progress), the
producer is connected (:meth:`~splitkeeper_tools.kafka_testbed.NumberedProducer.connect`: a fresh
idempotent producer holds its first messages back 0.5-1.0 s while it connects and gets its
producer id, a cost of the harness that both sides would count) and ``--settle-s`` (3) later, a
producer thread sends ``--rate`` (500) messages per second for
``--seconds`` (30), dealt at random over the partitions by the project's idempotent
producer (:class:`~splitkeeper_tools.kafka_testbed.NumberedProducer`); each value is the
JSON object ``{"seq": N, "produced_at": <time.time_ns() when handed to the client>, "pad":
"<hex>"}``. A poller thread per sink refreshes its Delta table every ``--poll-s`` (0.05)
(``DeltaTable.update_incremental()``); when a new version appears it notes the time, reads
the data files the version added (``file_uris()`` not seen before) and records, for every
sequence number seen for the first time, ``visible_at - produced_at``. A file rewritten by
maintenance only repeats sequence numbers already seen.

After the producer stopped, both sinks must hold every message within ``--drain-timeout-s``
(120); then both are stopped and checked by content: every delivered (partition, offset)
exactly once with its value byte for byte (so every sequence number exactly once).

Figures: ``ours_p50_s`` / ``p90`` / ``p99`` and ``ss_*`` (nearest-rank percentiles over all
messages), ``p99_ratio`` = ours / SS (below 1: ours is faster), the same for the messages
produced after the first ``--ramp-s`` (2) seconds (``ours_steady_p50_s`` ... ``ss_steady_p99_s``,
``steady_p99_ratio``: both sides meet data first after idling there, and pay one-off costs a
running pipeline has paid), ``rate_reached`` (messages /
the produce span), ``messages``, ``ours_exact`` / ``ss_exact`` and the 1-minute load average
sampled during the run (2 shared cores make latencies noisy; the load says how noisy). The
poll interval bounds the resolution (a record is seen up to ``--poll-s`` plus one read after
it became visible, on both sides alike). ``p99_by_second``: the p99 of the messages produced in
each second of production, both sides. An HTML chart goes to ``--out`` (``var/bench``): the
percentiles, and the p99 of each second.

``--fault worker-kill`` (with ``--readers long_lived``) SIGKILLs, at ``--fault-at`` (0.5) of the
production span, the Python worker of the reader slot of ours whose hello came last (the pool's own
``reader slot S ready (task T, pid P)`` records, :class:`ReaderSlots`); Structured Streaming is not
faulted (its query runs in the JVM, with no Python worker). ``fault`` in the JSON: both sides'
percentiles over the messages produced from 1 s before to 3 s after it (:data:`FAULT_WINDOW_S`),
the reader jobs started and the epochs with a failed region after it, and the evidence.

Exit 0 when both sinks are exact (and an asked fault was met), 1 otherwise, 2 on bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitkeeper.errors import InvalidParameterError, SplitkeeperError
from splitkeeper_tools.bench.ingest import (
    LoadSampler,
    add_run_arguments,
    check_counts,
    run_benchmark,
    write_page,
)
from splitkeeper_tools.bench.ingest_common import READERS, pipeline_config
from splitkeeper_tools.bench.ingest_kafka import warm_up_kafka
from splitkeeper_tools.kafka_testbed import (
    BrokerHandle,
    NumberedProducer,
    check_bootstrap_servers,
    create_topics,
    value_bytes,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from splitkeeper.config.settings import PipelineConfig

CHART_FILE = "latency_kafka.html"
PIPELINE_NAME = "bench-latency-kafka"
EPOCH_RECORDS = 1_000_000  # per epoch at most: an interval's epoch reads whatever arrived
READY_TIMEOUT_S = 180.0
REGION_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 120.0
PROGRESS_EVERY_S = 5.0
PERCENTILES = (50, 90, 99)
FAULTS = ("worker-kill",)
#: the messages whose latency the fault window figures cover: produced from this long before the
#: fault until this long after it (seconds)
FAULT_WINDOW_S = (1.0, 3.0)


def _say(line: str) -> None:
    print(f"[bench latency] {line}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LatencySettings:
    """What to measure: ``rate`` messages/s for ``seconds`` over ``partitions`` partitions."""

    rate: int = 500
    seconds: float = 30.0
    partitions: int = 8
    parallelism: int = 4
    interval_s: float = 0.5
    poll_s: float = 0.05
    value_bytes: int = 100
    settle_s: float = 3.0
    drain_timeout_s: float = 120.0
    seed: int = 1
    warmup: bool = True
    readers: str = "long_lived"
    ramp_s: float = 2.0  # the first seconds of production, left out of the steady figures
    fault: str | None = None  # FAULTS: injected into our side once, at fault_at of the production span
    fault_at: float = 0.5

    def __post_init__(self) -> None:
        check_counts(
            self, (("rate", 1), ("partitions", 1), ("parallelism", 1), ("value_bytes", 1), ("seed", 0))
        )
        for name in ("seconds", "interval_s", "poll_s", "drain_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidParameterError(name, value, "a number of seconds > 0")
        if self.readers not in READERS:
            raise InvalidParameterError("readers", self.readers, " or ".join(READERS))
        if isinstance(self.ramp_s, bool) or not 0 <= self.ramp_s < self.seconds:
            raise InvalidParameterError(
                "ramp_s", self.ramp_s, f"seconds >= 0 and < seconds ({self.seconds:g})"
            )
        if self.fault is not None and self.fault not in FAULTS:
            raise InvalidParameterError("fault", self.fault, " or ".join(FAULTS))
        if self.fault == "worker-kill" and self.readers != "long_lived":
            raise InvalidParameterError(
                "fault",
                self.fault,
                "with --readers long_lived: a job per epoch keeps no reader process between epochs to "
                "kill (chaos kills a per-epoch task's worker mid-read)",
            )
        if isinstance(self.fault_at, bool) or not 0 < self.fault_at < 1:
            raise InvalidParameterError(
                "fault_at", self.fault_at, "a fraction of the production span, > 0 and < 1"
            )
        if isinstance(self.settle_s, bool) or not self.settle_s >= 0:
            raise InvalidParameterError("settle_s", self.settle_s, "a number of seconds >= 0")
        if self.messages < 1:
            raise InvalidParameterError(
                "seconds", self.seconds, f"long enough for one message at rate {self.rate}"
            )

    @property
    def messages(self) -> int:
        return int(round(self.rate * self.seconds))


# ---------------------------------------------------------------------------------------
# the producer
# ---------------------------------------------------------------------------------------


def stamped_value(payload_hex_bytes: int) -> Callable[[int, str, int, str], bytes]:
    """``NumberedProducer``'s ``value_of``: ``{"seq", "produced_at" (ns, now), "pad"}`` as JSON."""

    def value_of(seq: int, _topic: str, _partition: int, payload: str) -> bytes:
        stamped = {"seq": seq, "produced_at": time.time_ns(), "pad": payload[: 2 * payload_hex_bytes]}
        return json.dumps(stamped, separators=(",", ":")).encode()

    return value_of


@dataclass
class PacedRun:
    """What the paced producer did: messages handed over and the span it took."""

    sent: int = 0
    span_s: float = 0.0
    started_ns: int = 0
    error: BaseException | None = None
    done: threading.Event | None = None


def produce_paced(producer: NumberedProducer, rate: int, count: int, run: PacedRun) -> None:
    """Hand message ``k`` to the client at ``k / rate`` seconds after the start (in small batches
    every ~5 ms), then wait for every delivery report. ``run.span_s``: from the start until the
    last message's slot ended (``count / rate`` when on time)."""
    started = time.monotonic()
    run.started_ns = time.time_ns()
    try:
        while run.sent < count:
            due = min(count, int((time.monotonic() - started) * rate) + 1)
            if due > run.sent:
                producer.enqueue(due - run.sent)
                run.sent = due
            else:
                time.sleep(min(0.005, max(0.0, (due / rate) - (time.monotonic() - started))))
        run.span_s = time.monotonic() - started + 1 / rate
        producer.flush()
    except BaseException as err:  # reported by the caller
        run.error = err
    finally:
        if run.done is not None:
            run.done.set()


# ---------------------------------------------------------------------------------------
# the pollers
# ---------------------------------------------------------------------------------------


def parse_stamps(values: Sequence[Any]) -> list[tuple[int, int]]:
    """(seq, produced_at ns) of each stamped value (bytes or text; others are skipped)."""
    out = []
    for value in values:
        if value is None:
            continue
        try:
            item = json.loads(value)
            out.append((int(item["seq"]), int(item["produced_at"])))
        except (ValueError, KeyError, TypeError):
            continue
    return out


class SinkWatcher:
    """Polls one Delta table every ``poll_s`` and records, per sequence number seen for the first
    time, the seconds from its ``produced_at`` to the poll that saw its version."""

    def __init__(self, label: str, path: str, poll_s: float) -> None:
        self.label = label
        self.path = path
        self.poll_s = poll_s
        self.latency_s: dict[int, float] = {}
        self.versions = 0
        self.errors: list[str] = []
        self._table: Any = None
        self._version: int | None = None
        self._files: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"bench-latency-{label}", daemon=True)

    @property
    def seen(self) -> int:
        with self._lock:
            return len(self.latency_s)

    def exists(self) -> bool:
        from deltalake import DeltaTable

        return bool(DeltaTable.is_deltatable(self.path))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop polling (a no-op when never started or already stopped)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll_once()
            except Exception as err:  # a table being written: tried again at the next poll
                if len(self.errors) < 20:
                    self.errors.append(f"{type(err).__name__}: {err}")

    def poll_once(self) -> int:
        """One poll; returns how many sequence numbers became visible."""
        import pyarrow.parquet as pq
        from deltalake import DeltaTable

        if self._table is None:
            if not DeltaTable.is_deltatable(self.path):
                return 0
            self._table = DeltaTable(self.path)
        else:
            self._table.update_incremental()
        version = self._table.version()
        if version == self._version:
            return 0
        visible_ns = time.time_ns()
        files = set(self._table.file_uris())
        fresh = files - self._files
        stamps: list[tuple[int, int]] = []
        for uri in sorted(fresh):
            column = pq.read_table(uri, columns=["value"]).column("value")
            stamps += parse_stamps(column.to_pylist())
        added = 0
        with self._lock:
            for seq, produced_ns in stamps:
                if seq not in self.latency_s:
                    self.latency_s[seq] = (visible_ns - produced_ns) / 1e9
                    added += 1
        self._files |= fresh
        self._version = version
        self.versions += 1
        return added


# ---------------------------------------------------------------------------------------
# figures and checks
# ---------------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile of ascending ``sorted_values`` (not empty)."""
    if not sorted_values:
        raise ValueError("no values")
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


def percentiles(latency_s: Mapping[int, float], prefix: str) -> dict[str, float | None]:
    values = sorted(latency_s.values())
    return {f"{prefix}_p{q}_s": (round(percentile(values, q), 3) if values else None) for q in PERCENTILES}


def steady(latency_s: Mapping[int, float], rate: int, ramp_s: float) -> dict[int, float]:
    """The latencies of the messages produced after the first ``ramp_s`` seconds: message ``k`` is
    produced at ``k / rate`` seconds (:func:`produce_paced`), so those are ``k >= ramp_s * rate``.
    The ramp is when both sides first meet data after idling (our reader slots open their Kafka
    consumers, Structured Streaming's first batch plans); what a pipeline that has been running
    sees is the rest."""
    first = math.ceil(ramp_s * rate)
    return {seq: value for seq, value in latency_s.items() if seq >= first}


def by_second(latency_s: Mapping[int, float], rate: int, seconds: float, q: float = 99) -> list[float | None]:
    """The ``q``-th percentile of the latencies of the messages produced in each second of production
    (second ``k``: messages ``k * rate`` up to ``(k + 1) * rate``); None for a second with none seen."""
    buckets: list[list[float]] = [[] for _ in range(max(1, math.ceil(seconds)))]
    for seq, value in latency_s.items():
        k = seq // rate
        if 0 <= k < len(buckets):
            buckets[k].append(value)
    return [round(percentile(sorted(b), q), 3) if b else None for b in buckets]


def produced_between(
    latency_s: Mapping[int, float], rate: int, start_s: float, end_s: float
) -> dict[int, float]:
    """The latencies of the messages produced from ``start_s`` until ``end_s`` seconds into production
    (message ``k`` at ``k / rate``, as :func:`steady` reads it)."""
    first, last = math.ceil(start_s * rate), math.ceil(end_s * rate)
    return {seq: value for seq, value in latency_s.items() if first <= seq < last}


# ---------------------------------------------------------------------------------------
# the fault (ours only)
# ---------------------------------------------------------------------------------------


class ReaderSlots(logging.Handler):
    """Our long-lived reader slots as the pool announces them: its ``reader slot S ready (task T, pid
    P)`` and ``starting reader job N`` log records (:mod:`splitkeeper.spark.readers`), with the
    monotonic time each came. :meth:`attached` listens while the run runs."""

    LOGGER = "splitkeeper.spark.readers"

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.ready: list[tuple[float, Any, int]] = []  # (when, slot, Python worker pid)
        self.jobs: list[float] = []  # when each reader job started

    def emit(self, record: logging.LogRecord) -> None:
        text = str(record.msg)
        if text.startswith("reader slot") and "pid" in text and len(record.args or ()) == 3:
            slot, _task, pid = record.args  # type: ignore[misc]
            self.ready.append((time.monotonic(), slot, int(str(pid))))
        elif text.startswith("starting reader job"):
            self.jobs.append(time.monotonic())

    @contextlib.contextmanager
    def attached(self) -> Iterator[ReaderSlots]:
        logger = logging.getLogger(self.LOGGER)
        level = logger.level
        if not logger.isEnabledFor(logging.INFO):
            logger.setLevel(logging.INFO)
        logger.addHandler(self)
        try:
            yield self
        finally:
            logger.removeHandler(self)
            logger.setLevel(level)

    def live_worker(self) -> tuple[Any, int] | None:
        """The slot and pid of the reader slot that said hello last and whose worker still runs."""
        latest: dict[Any, tuple[float, int]] = {}
        for when, slot, pid in self.ready:
            latest[slot] = (when, pid)
        for slot, (_when, pid) in sorted(latest.items(), key=lambda item: item[1][0], reverse=True):
            try:
                os.kill(pid, 0)
            except OSError:
                continue
            return slot, pid
        return None


@dataclass
class FaultRun:
    """One injected fault: what was asked, when it was done and to what."""

    kind: str
    at_s: float  # planned: seconds into production
    killed_at: float | None = None  # monotonic
    slot: Any = None
    pid: int | None = None
    error: str = ""


def kill_reader_worker(slots: ReaderSlots, fault: FaultRun, started: float, stop: threading.Event) -> None:
    """At ``fault.at_s`` into production, SIGKILL the Python worker of one of our reader slots."""
    if stop.wait(max(0.0, started + fault.at_s - time.monotonic())):
        fault.error = "the run stopped before the fault was due"
        return
    target = slots.live_worker()
    if target is None:
        fault.error = "no reader slot's Python worker was running at the fault's time"
        return
    fault.slot, fault.pid = target
    try:
        os.kill(fault.pid, signal.SIGKILL)
    except OSError as err:  # it ended between the look and the kill
        fault.error = f"reader slot {fault.slot}'s Python worker (pid {fault.pid}) could not be killed: {err}"
        return
    fault.killed_at = time.monotonic()
    _say(
        f"SIGKILL of our reader slot {fault.slot}'s Python worker (pid {fault.pid}), "
        f"{fault.at_s:.1f}s into production"
    )


def fault_figures(
    fault: FaultRun,
    slots: ReaderSlots,
    started: float,
    epoch_ends: Sequence[tuple[float, str]],
    latency: Mapping[str, Mapping[int, float]],
    rate: int,
) -> dict[str, Any]:
    """What the fault did: the killed worker, the reader jobs and the epochs with a failed region after
    it, and both sides' latency over the messages produced around it (:data:`FAULT_WINDOW_S`)."""
    before, after = FAULT_WINDOW_S
    window = (max(0.0, fault.at_s - before), fault.at_s + after)
    figures: dict[str, Any] = {"kind": fault.kind, "at_s": fault.at_s, "window_s": list(window)}
    for side, values in latency.items():
        chosen = produced_between(values, rate, *window)
        figures.update(percentiles(chosen, f"{side}_window"))
        figures[f"{side}_window_max_s"] = round(max(chosen.values()), 3) if chosen else None
    if fault.killed_at is None:
        return {**figures, "injected": False, "evidence": fault.error}
    jobs_after = [t for t in slots.jobs if t >= fault.killed_at]
    failed = [line.split()[1] for t, line in epoch_ends if t >= fault.killed_at and "regions ack (" in line]
    recovered = jobs_after or failed
    return {
        **figures,
        "injected": bool(recovered),
        "killed_at_s": round(fault.killed_at - started, 3),
        "slot": list(fault.slot) if isinstance(fault.slot, tuple) else fault.slot,
        "pid": fault.pid,
        "reader_jobs_started_after": len(jobs_after),
        "epochs_with_a_failed_region_after": [int(e) for e in failed],
        "evidence": (
            f"pid {fault.pid} (reader slot {fault.slot}) SIGKILLed {fault.killed_at - started:.1f}s into "
            f"production; {len(jobs_after)} reader job(s) started after it; epochs with a failed region "
            f"after it: {failed or 'none'}" + ("" if recovered else "; nothing shows the run met the fault")
        ),
    }


def check_exact(rows: pa.Table, expected: Mapping[tuple[str, int], bytes]) -> dict[str, Any]:
    """Compare a sink's ``split_id``, ``offset``, ``value`` rows with the delivered messages: every
    one exactly once with the same bytes, and every sequence number exactly once."""
    seen: dict[tuple[str, int], int] = {}
    wrong_values = 0
    unexpected = 0
    seqs: set[int] = set()
    for sid, offset, value in zip(
        rows.column("split_id").to_pylist(),
        rows.column("offset").to_pylist(),
        rows.column("value").to_pylist(),
        strict=True,
    ):
        key = (sid, int(offset))
        seen[key] = seen.get(key, 0) + 1
        raw = value.encode() if isinstance(value, str) else value
        want = expected.get(key)
        if want is None:
            unexpected += 1
        elif raw != want:
            wrong_values += 1
        seqs |= {seq for seq, _at in parse_stamps([raw])}
    duplicates = sum(1 for n in seen.values() if n > 1)
    missing = sum(1 for key in expected if key not in seen)
    every_seq = seqs == set(range(len(expected)))
    return {
        "rows": rows.num_rows,
        "missing": missing,
        "duplicates": duplicates,
        "unexpected": unexpected,
        "wrong_values": wrong_values,
        "every_seq_once": every_seq and rows.num_rows == len(expected),
        "exact": not (missing or duplicates or unexpected or wrong_values)
        and every_seq
        and rows.num_rows == len(expected),
    }


# ---------------------------------------------------------------------------------------
# the two sides
# ---------------------------------------------------------------------------------------


def ours_config(settings: LatencySettings, bootstrap: str, topic: str, root: str) -> PipelineConfig:
    """The ``bench ingest --source kafka`` pipeline with both checkpoint intervals at ``interval_s``
    and ``readers`` as ``settings.readers`` says."""
    return pipeline_config(
        PIPELINE_NAME,
        root,
        {"kind": "kafka", "bootstrap_servers": bootstrap, "topics": [topic], "starting": "earliest"},
        parallelism=settings.parallelism,
        epoch_records=EPOCH_RECORDS,
        region_timeout_s=REGION_TIMEOUT_S,
        interval_s=settings.interval_s,
        readers=settings.readers,
    )


def latency_spark() -> Any:
    """The running session if there is one, else one of ``local[2 x cores]``; either way the
    long-lived readers may hold half its task slots (:data:`~splitkeeper.spark.readers.SLOTS_CONF`):
    they hold theirs for the run, and the Structured Streaming query in the same session needs the
    others. Both reader modes run on such a session, so a before/after differs in the readers alone."""
    from pyspark.sql import SparkSession

    from splitkeeper.spark.readers import SLOTS_CONF

    spark = SparkSession.getActiveSession()
    if spark is None:
        from splitkeeper.spark.session import SparkSettings, get_spark

        cores = os.cpu_count() or 2
        spark = get_spark(
            SparkSettings.from_env(ui_enabled=False, shuffle_partitions=cores, master=f"local[{2 * cores}]")
        )
        spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set(SLOTS_CONF, str(max(1, spark.sparkContext.defaultParallelism // 2)))
    return spark


def start_ss(spark: Any, bootstrap: str, topic: str, root: str) -> tuple[Any, str]:
    """Structured Streaming: Kafka -> Delta, the default trigger; returns (query, sink path)."""
    sink = os.path.join(root, "sink")
    frame = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .load()
        .selectExpr(
            "concat(topic, '-', CAST(partition AS STRING)) AS split_id",
            "offset",
            "CAST(value AS STRING) AS value",
        )
    )
    query = (
        frame.writeStream.format("delta")
        .option("checkpointLocation", os.path.join(root, "checkpoint"))
        .queryName(f"bench_latency_{os.getpid()}_{uuid.uuid4().hex[:6]}")
        .start(sink)
    )
    return query, sink


def _wait(condition: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SplitkeeperError(f"bench latency: {what} not within {timeout_s:g}s")
        time.sleep(poll_s)


# ---------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------


def bench_latency(
    settings: LatencySettings, work_dir: str, bootstrap_servers: str | None = None, spark: Any = None
) -> dict[str, Any]:
    """Run the benchmark under ``work_dir`` (broker, sinks, state) and return its figures."""
    from splitkeeper.app import services
    from splitkeeper.app.sink import sink_reader
    from splitkeeper.sinks.delta.read import read_sink
    from splitkeeper.sinks.port import SinkTable
    from splitkeeper.sources.kafka.source import split_id_of

    load_start = [round(x, 2) for x in os.getloadavg()]
    broker = BrokerHandle(Path(work_dir), bootstrap_servers)
    stop = threading.Event()
    ours_errors: list[BaseException] = []
    query = None
    ours_thread = None
    watchers: list[SinkWatcher] = []
    listening = contextlib.ExitStack()
    slots = listening.enter_context(ReaderSlots().attached())
    fault = FaultRun(settings.fault, settings.fault_at * settings.seconds) if settings.fault else None
    fault_thread = None
    try:
        if bootstrap_servers is None:
            _say("starting a Kafka broker (KRaft) ...")
        bootstrap = broker.start()
        topic = f"bench-latency-{uuid.uuid4().hex[:8]}"
        create_topics(bootstrap, {topic: settings.partitions})
        spark = spark or latency_spark()
        if settings.warmup:
            warm_up_kafka(spark, work_dir, bootstrap, topic)
            _say("warm-up done (Python workers, Delta, both Kafka clients)")
        config = ours_config(settings, bootstrap, topic, os.path.join(work_dir, "ours"))
        ours_sink = str(sink_reader(config).location(SinkTable.RECORDS))

        epoch_lines: list[str] = []
        epoch_ends: list[tuple[float, str]] = []  # (when the line came, the line): the phase figures

        def count_epochs(line: str) -> None:  # every epoch's line, kept off stderr (two a second)
            if line.startswith("epoch"):
                epoch_lines.append(line)
                epoch_ends.append((time.monotonic(), line))

        def run_ours() -> None:
            try:
                services.run(config, continuous=True, stop=stop, progress=count_epochs)
            except BaseException as err:  # reported after the run
                ours_errors.append(err)
                stop.set()

        ours_thread = threading.Thread(target=run_ours, name="bench-latency-ours", daemon=True)
        ours_thread.start()
        query, ss_sink = start_ss(spark, bootstrap, topic, os.path.join(work_dir, "ss"))
        ours_watch = SinkWatcher("ours", ours_sink, settings.poll_s)
        ss_watch = SinkWatcher("ss", ss_sink, settings.poll_s)
        watchers = [ours_watch, ss_watch]
        _wait(
            lambda: bool(ours_errors) or (ours_watch.exists() and query.lastProgress is not None),
            READY_TIMEOUT_S,
            "our sink table and the query's first progress",
        )
        if ours_errors:
            raise SplitkeeperError(f"bench latency: our continuous run failed: {ours_errors[0]}")
        payload = max(1, (settings.value_bytes - 50) // 2)
        producer = NumberedProducer(
            bootstrap,
            [(topic, p) for p in range(settings.partitions)],
            settings.seed,
            payload_bytes=(payload, payload),
            value_of=stamped_value(payload),
        )
        producer.connect()  # connected (and its producer id got) during the settle, not while timed
        time.sleep(settings.settle_s)
        for watcher in watchers:
            watcher.start()
        count = settings.messages
        _say(
            f"Kafka at {bootstrap}: {topic} ({settings.partitions} partitions); both sides running "
            f"(ours: continuous, interval {settings.interval_s:g}s, parallelism {settings.parallelism}; "
            f"SS: default trigger); producing {count:,} messages at {settings.rate}/s"
        )
        paced = PacedRun(done=threading.Event())
        producing = threading.Thread(
            target=produce_paced, args=(producer, settings.rate, count, paced), name="bench-latency-producer"
        )
        started = time.monotonic()

        def heartbeat(elapsed: float) -> None:
            _say(
                f"{elapsed:.0f}s: produced {paced.sent:,}/{count:,}, visible: ours {ours_watch.seen:,} "
                f"({ours_watch.versions} versions, {len(epoch_lines)} epochs), "
                f"SS {ss_watch.seen:,} ({ss_watch.versions} versions)"
            )

        with LoadSampler(heartbeat_s=PROGRESS_EVERY_S, heartbeat=heartbeat) as sampler:
            producing.start()
            if fault is not None:
                fault_thread = threading.Thread(
                    target=kill_reader_worker,
                    args=(slots, fault, started, stop),
                    name="bench-latency-fault",
                    daemon=True,
                )
                fault_thread.start()
            producing.join()
            if paced.error is not None:
                raise SplitkeeperError(f"bench latency: producing to {topic} failed: {paced.error}")
            if producer.failed or len(producer.delivered) != count:
                raise SplitkeeperError(
                    f"bench latency: {len(producer.delivered)} of {count} messages delivered "
                    f"({len(producer.failed)} failed: {producer.failed[:3]})"
                )
            _say(f"produced {count:,} in {paced.span_s:.1f}s; waiting for both sinks to hold them all")
            deadline = time.monotonic() + settings.drain_timeout_s
            while (ours_watch.seen < count or ss_watch.seen < count) and time.monotonic() < deadline:
                if ours_errors or query.exception() is not None:
                    break
                time.sleep(0.1)
            drained_s = time.monotonic() - started
            measured = [(t, line) for t, line in epoch_ends if started <= t <= started + drained_s]
        for watcher in watchers:
            watcher.stop()
        _say(f"visible after {drained_s:.1f}s: ours {ours_watch.seen:,}, SS {ss_watch.seen:,}; stopping both")
        stop.set()
        ours_thread.join(STOP_TIMEOUT_S)
        ss_error = query.exception()
        query.stop()
        if ours_thread.is_alive():
            raise SplitkeeperError(
                f"bench latency: our continuous run did not stop within {STOP_TIMEOUT_S:g}s"
            )
        expected = {
            (split_id_of(t, p), offset): value_bytes(text)
            for (t, p, offset), text in producer.delivered.items()
        }
        ours_check = check_exact(read_sink(ours_sink, ["split_id", "offset", "value"]), expected)
        ss_check = check_exact(read_sink(ss_sink, ["split_id", "offset", "value"]), expected)
    finally:
        stop.set()
        for watcher in watchers:
            watcher.stop()
        if query is not None and query.isActive:
            query.stop()
        if ours_thread is not None:
            ours_thread.join(STOP_TIMEOUT_S)
        if fault_thread is not None:
            fault_thread.join()
        listening.close()
        broker.stop()
    ours_exact = bool(ours_check["exact"]) and not ours_errors
    ss_exact = bool(ss_check["exact"]) and ss_error is None
    figures: dict[str, Any] = {
        **percentiles(ours_watch.latency_s, "ours"),
        **percentiles(ss_watch.latency_s, "ss"),
        **percentiles(steady(ours_watch.latency_s, settings.rate, settings.ramp_s), "ours_steady"),
        **percentiles(steady(ss_watch.latency_s, settings.rate, settings.ramp_s), "ss_steady"),
    }
    p99_ours, p99_ss = figures["ours_p99_s"], figures["ss_p99_s"]
    faulted = (
        None
        if fault is None
        else fault_figures(
            fault,
            slots,
            started,
            epoch_ends,
            {"ours": ours_watch.latency_s, "ss": ss_watch.latency_s},
            settings.rate,
        )
    )
    steady_ours, steady_ss = figures["ours_steady_p99_s"], figures["ss_steady_p99_s"]
    return {
        "benchmark": "latency",
        "source": "kafka",
        **figures,
        "p99_ratio": round(p99_ours / p99_ss, 3) if p99_ours is not None and p99_ss else None,
        "steady_p99_ratio": (
            round(steady_ours / steady_ss, 3) if steady_ours is not None and steady_ss else None
        ),
        "ramp_s": settings.ramp_s,
        "ours_mean_s": _mean(ours_watch.latency_s),
        "ss_mean_s": _mean(ss_watch.latency_s),
        "ours_max_s": round(max(ours_watch.latency_s.values(), default=0.0), 3),
        "ss_max_s": round(max(ss_watch.latency_s.values(), default=0.0), 3),
        "rate": settings.rate,
        "seconds": settings.seconds,
        "rate_reached": round(count / paced.span_s, 1) if paced.span_s else None,
        "messages": count,
        "partitions": settings.partitions,
        "parallelism": settings.parallelism,
        "interval_s": settings.interval_s,
        "readers": settings.readers,
        "poll_s": settings.poll_s,
        "fault": faulted,
        "p99_by_second": {
            "ours": by_second(ours_watch.latency_s, settings.rate, settings.seconds),
            "ss": by_second(ss_watch.latency_s, settings.rate, settings.seconds),
        },
        "reader_jobs_started": len(slots.jobs),
        "ours_visible": len(ours_watch.latency_s),
        "ss_visible": len(ss_watch.latency_s),
        "ours_versions": ours_watch.versions,
        "ours_epochs": len(epoch_lines),
        "ss_versions": ss_watch.versions,
        "ours_exact": ours_exact,
        "ss_exact": ss_exact,
        "ours_check": ours_check,
        "ss_check": ss_check,
        "errors": [str(e) for e in ours_errors] + ([str(ss_error)] if ss_error is not None else []),
        "poll_errors": {w.label: w.errors for w in watchers if w.errors},
        "drained_s": round(drained_s, 3),
        "ours_epoch_phases": epoch_phases(measured),
        "load_avg": {
            "start": load_start,
            "run": sampler.figure.mean,
            "run_max": sampler.figure.max,
            "end": [round(x, 2) for x in os.getloadavg()],
            "cpus": os.cpu_count(),
        },
        "topic": topic,
        "bootstrap_servers": bootstrap_servers or "own broker",
        "passed": ours_exact and ss_exact and (faulted is None or faulted["injected"]),
    }


def epoch_phases(ends: Sequence[tuple[float, str]]) -> dict[str, dict[str, float]]:
    """Where our epochs' wall time went while the messages were produced and drained: p50/p90/max of
    each phase of the epoch lines (``plan=0.05 read=0.31 ...``, seconds), of the epoch itself
    (``epoch``), and of the ``gap`` between one epoch's end and the next one's start (the next
    epoch's line came ``gap + its elapsed`` after the previous one's)."""
    series: dict[str, list[float]] = {}
    previous: float | None = None
    for at, line in ends:
        fields = line.split()
        elapsed = next((float(f[:-1]) for f in fields if f.endswith("s") and _number(f[:-1])), None)
        if elapsed is None:
            continue
        series.setdefault("epoch", []).append(elapsed)
        for name, _eq, value in (f.partition("=") for f in fields if "=" in f):
            if _number(value):
                series.setdefault(name, []).append(float(value))
        if previous is not None:
            series.setdefault("gap", []).append(max(0.0, at - previous - elapsed))
        previous = at
    return {
        name: {
            "p50": round(percentile(sorted(values), 50), 3),
            "p90": round(percentile(sorted(values), 90), 3),
            "max": round(max(values), 3),
            "n": len(values),
        }
        for name, values in series.items()
    }


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _mean(latency_s: Mapping[int, float]) -> float | None:
    return round(sum(latency_s.values()) / len(latency_s), 3) if latency_s else None


# ---------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


def render_table(result: Mapping[str, Any]) -> str:
    """The human-readable report (what ``run`` prints without ``--json``)."""
    load = result["load_avg"]
    rows = [
        f"Kafka ({result['bootstrap_servers']}): {result['messages']:,} messages at {result['rate']}/s "
        f"(reached {result['rate_reached']}/s) over {result['partitions']} partitions; ours continuous, "
        f"interval {result['interval_s']:g}s, parallelism {result['parallelism']}; SS default trigger; "
        f"poll {result['poll_s']:g}s",
        f"  {'':<14}{'p50':>9}{'p90':>9}{'p99':>9}{'mean':>9}{'max':>9}{'versions':>10}  exact",
    ]
    for label, key in (("splitkeeper", "ours"), ("Structured S.", "ss")):
        rows.append(
            f"  {label:<14}{_s(result[f'{key}_p50_s']):>9}{_s(result[f'{key}_p90_s']):>9}"
            f"{_s(result[f'{key}_p99_s']):>9}{_s(result[f'{key}_mean_s']):>9}{_s(result[f'{key}_max_s']):>9}"
            f"{result[f'{key}_versions']:>10}  {result[f'{key}_exact']}"
        )
    rows += [
        f"p99 ours / SS: {result['p99_ratio']} (below 1: ours is faster)",
        f"after the first {result['ramp_s']:g}s of production (steady): p50/p90/p99 ours "
        + "/".join(_s(result[f"ours_steady_p{q}_s"]) for q in PERCENTILES)
        + ", SS "
        + "/".join(_s(result[f"ss_steady_p{q}_s"]) for q in PERCENTILES)
        + f", p99 ours / SS {result['steady_p99_ratio']}",
        f"load average: {load['run']:.1f} during the run (max {load['run_max']:.1f}), {load['cpus']} cpus",
    ]
    fault = result.get("fault")
    if fault:
        low, high = fault["window_s"]
        rows.append(
            f"fault {fault['kind']} at {fault['at_s']:.1f}s (ours only): {fault['evidence']}; messages "
            f"produced {low:g}-{high:g}s: p99 ours {_s(fault['ours_window_p99_s'])} "
            f"(max {_s(fault['ours_window_max_s'])}), SS {_s(fault['ss_window_p99_s'])} "
            f"(max {_s(fault['ss_window_max_s'])})"
        )
    phases = result.get("ours_epoch_phases") or {}
    if phases:
        rows.append(
            "our epochs, p50/p90 s: "
            + " ".join(f"{name}={f['p50']:.2f}/{f['p90']:.2f}" for name, f in phases.items())
        )
    if result.get("chart"):
        rows.append(f"chart: {result['chart']}")
    return "\n".join(rows)


def write_chart(result: Mapping[str, Any], out_dir: str) -> str:
    """Write ``<out_dir>/latency_kafka.html`` (inline SVG, no network); return its path."""
    from splitkeeper.report import charts

    chart = charts.bar_chart(
        "latency-kafka",
        "Produce-to-visible latency, Kafka to Delta (lower is better)",
        f"{result['messages']:,} messages at {result['rate']}/s over {result['partitions']} partitions",
        [f"p{q}" for q in PERCENTILES],
        [
            charts.Series(
                "splitkeeper", tuple(result[f"ours_p{q}_s"] or 0.0 for q in PERCENTILES), charts.BLUE
            ),
            charts.Series(
                "Structured Streaming", tuple(result[f"ss_p{q}_s"] or 0.0 for q in PERCENTILES), charts.ORANGE
            ),
        ],
        x_label="percentile",
        y_label="seconds from produce to visible",
    )
    timeline = ""
    seconds = result.get("p99_by_second")
    if seconds and seconds["ours"]:
        fault = result.get("fault")
        fault_second = int(fault["at_s"]) if fault else None
        labels = [f"{k}s" + (" (fault)" if k == fault_second else "") for k in range(len(seconds["ours"]))]
        timeline = charts.line_chart(
            "latency-kafka-by-second",
            "p99 of the messages produced in each second (lower is better)",
            "the same run, second by second of production"
            + (f"; our reader slot's Python worker SIGKILLed at {fault['at_s']:g}s" if fault else ""),
            labels,
            [
                charts.Series(
                    "splitkeeper",
                    tuple(math.nan if v is None else v for v in seconds["ours"]),
                    charts.BLUE,
                ),
                charts.Series(
                    "Structured Streaming",
                    tuple(math.nan if v is None else v for v in seconds["ss"]),
                    charts.ORANGE,
                ),
            ],
            x_label="second of production the messages were produced in",
            y_label="p99 seconds from produce to visible",
        )
    load = result["load_avg"]
    body = f"""<h1>bench latency --source kafka</h1>
<p>{result["messages"]:,} messages at {result["rate"]}/s (reached {result["rate_reached"]}/s),
{result["partitions"]} partitions; ours continuous with a {result["interval_s"]:g}s interval,
parallelism {result["parallelism"]}; Structured Streaming with its default trigger.
p99 ours / SS: <b>{result["p99_ratio"]}</b>. Exact: ours {result["ours_exact"]}, SS {result["ss_exact"]}.
Load average during the run {load["run"]:.1f} (max {load["run_max"]:.1f}) on {load["cpus"]} cpus.</p>
<div>{chart}</div>
<div>{timeline}</div>"""
    return write_page(out_dir, CHART_FILE, "splitkeeper-tools bench latency --source kafka", body)


# ---------------------------------------------------------------------------------------
# command
# ---------------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    d = LatencySettings()
    parser.add_argument("--source", default="kafka", choices=("kafka",), help="kafka (the only source)")
    parser.add_argument("--rate", type=int, default=d.rate, help=f"messages per second ({d.rate})")
    parser.add_argument(
        "--seconds", type=float, default=d.seconds, help=f"produce for this long ({d.seconds:g})"
    )
    parser.add_argument(
        "--partitions", type=int, default=d.partitions, help=f"topic partitions ({d.partitions})"
    )
    parser.add_argument(
        "--parallelism", type=int, default=d.parallelism, help=f"our regions ({d.parallelism})"
    )
    parser.add_argument(
        "--interval-s",
        type=float,
        default=d.interval_s,
        help=f"our backlog and normal checkpoint interval ({d.interval_s:g})",
    )
    parser.add_argument(
        "--readers",
        default=d.readers,
        choices=READERS,
        help=f"our region readers: a Spark job per epoch, or one job for the run ({d.readers})",
    )
    parser.add_argument(
        "--ramp-s",
        type=float,
        default=d.ramp_s,
        help="the first seconds of production, left out of the steady_* figures (both sides; the "
        f"all-message figures keep them) ({d.ramp_s:g})",
    )
    parser.add_argument(
        "--fault",
        default=None,
        choices=FAULTS,
        help="inject a fault into our side once while producing: worker-kill SIGKILLs the Python worker "
        "of one of our long-lived reader slots (needs --readers long_lived); the JSON's fault gives both "
        "sides' latency over the messages produced around it (Structured Streaming is not faulted)",
    )
    parser.add_argument(
        "--fault-at",
        type=float,
        default=d.fault_at,
        help=f"when the fault comes, as a fraction of the production span ({d.fault_at:g}: its middle)",
    )
    parser.add_argument("--poll-s", type=float, default=d.poll_s, help=f"sink poll interval ({d.poll_s:g})")
    parser.add_argument("--value-bytes", type=int, default=d.value_bytes, help="message value length (100)")
    parser.add_argument(
        "--settle-s", type=float, default=d.settle_s, help="idle seconds after both started (3)"
    )
    parser.add_argument(
        "--drain-timeout-s",
        type=float,
        default=d.drain_timeout_s,
        help="after producing, how long both sinks may take to hold every message (120)",
    )
    parser.add_argument("--seed", type=int, default=d.seed, help="draws partitions and payloads (1)")
    parser.add_argument(
        "--bootstrap-servers", default=None, help="use this Kafka instead of starting one (host:port,...)"
    )
    add_run_arguments(parser, "broker, sinks and state")


def run(args: argparse.Namespace) -> int:
    settings = LatencySettings(
        rate=args.rate,
        seconds=args.seconds,
        partitions=args.partitions,
        parallelism=args.parallelism,
        interval_s=args.interval_s,
        poll_s=args.poll_s,
        value_bytes=args.value_bytes,
        settle_s=args.settle_s,
        drain_timeout_s=args.drain_timeout_s,
        seed=args.seed,
        warmup=not args.no_warmup,
        readers=args.readers,
        ramp_s=args.ramp_s,
        fault=args.fault,
        fault_at=args.fault_at,
    )
    check_bootstrap_servers(args.bootstrap_servers)
    return run_benchmark(
        args,
        lambda work: bench_latency(settings, work, args.bootstrap_servers),
        prefix="bench-latency-",
        write_chart=write_chart,
        render_table=render_table,
        passed="passed",
        failure="splitkeeper-tools bench latency: a sink does not hold exactly the produced messages "
        "(see ours_check / ss_check), or the --fault asked for did not happen (see fault.evidence)",
        say=_say,
    )
