"""``splitkeeper-tools bench ingest --source kafka``: Kafka into Delta, splitkeeper vs Structured Streaming.

One run, one Spark session, one Kafka:

1. **Kafka and input.** The project's own KRaft broker in a temporary folder (or the one
   ``--bootstrap-servers`` names) and two fresh topics of ``--partitions`` partitions
   (default 8): the main topic gets ``--messages`` (default 400,000) numbered messages of
   about ``--value-bytes`` (100) bytes, the stall topic ``--stall-messages`` (40,000);
   partitions are drawn evenly, by an idempotent producer (``acks=all``), before anything
   is timed (:class:`splitkeeper_tools.kafka_testbed.NumberedProducer`). Nothing is produced
   afterwards, so the end offsets at start are the delivery reports' ends, and each side
   must ingest exactly the offsets ``[0, end)`` of every partition.
2. **Throughput**, per repetition (``--repeat``, default 3; the order alternates), each
   side into a fresh Delta table:

   - **splitkeeper**: a Kafka pipeline (``--parallelism`` regions, default 4; regional
     checkpoints on; least-loaded assignment; ``starting: earliest``; no consumer group, so
     no external offset commits, as Structured Streaming makes none; identity transform;
     ``--epoch-records`` records per epoch, default half the messages; region timeout one
     hour, so none fires). A Kafka pipeline is unbounded: it runs epoch by epoch
     (:meth:`Pipeline.run_epoch`) until every partition's committed position (the
     enumerator's, after the epoch's checkpoint) reached the end offset at start. Timed
     from taking the lease and constructing the pipeline (state and sink tables are created;
     :func:`splitkeeper.app.services.leased_pipeline`) to ``close()`` and the lease's release;
   - **baseline**: Structured Streaming's Kafka source (``subscribe`` the topic,
     ``startingOffsets earliest``, ``kafka.isolation.level read_committed`` as our readers
     use, ``maxOffsetsPerTrigger`` = our epoch size plus one per partition, see
     :func:`batch_limit`) with ``Trigger.AvailableNow`` (it takes
     the end offsets when the query starts and stops there; ``endingOffsets`` is a batch-only
     option), selecting ``split_id`` (``<topic>-<partition>``, our split id), ``offset`` and
     ``value`` (as a string) into a Delta sink with a fresh checkpoint. Timed from
     ``start()`` to ``awaitTermination()``.

   Both sinks are checked after the timing: per partition exactly end-offset records, no
   ``(split_id, offset)`` twice (both sinks keep the Kafka offset), and, in the first
   repetition, the same multiset of values.
3. **Stalled partition** (once per side, on the stall topic, in two epochs / two
   micro-batches of half of it each): one reader is stuck for ``--stall-s`` seconds
   (default 60) in the second one. Not in the first: a region can only fall back to a
   completed checkpoint, so a region failing in a pipeline's first epoch aborts it.

   - ours: fault ``stall:<stall-s>:0@2``: region 0's task sleeps before reading in epoch 2;
     the region timeout is ``--region-timeout-s`` (10): region 0 is cancelled, the epoch
     completes as a regional checkpoint with the other regions' records, and region 0's
     partitions go back to the pool and are read in the next epoch;
   - baseline: the last record of one partition X, the first of the partitions region 0
     planned in our epoch 2, takes ``stall-s`` to process (it lies in the second
     micro-batch): a filter calls ``java.lang.Thread.sleep`` through Spark's ``reflect()``
     for that one row (in the JVM, so no Python UDF slows the other rows down). X's task
     holds a core that long, and the micro-batch, with its Delta commit, waits for it.

   A partition is committed when all its records up to the end offset are: ours at the
   end of the epoch whose checkpoint moved its committed position there; the baseline at
   the end of the micro-batch whose end offset reached it (progress ``timestamp`` +
   ``triggerExecution``). ``stalled_ours_s`` / ``stalled_baseline_s``: seconds from the
   start of the stalled epoch / micro-batch until the last of the partitions the stalled
   reader does not own is committed: the same partitions on both sides (all but the ones
   region 0 planned in our stalled epoch, X among them), so the row compares like with
   like. Also reported: every partition but X (ours then also waits for the partition
   region 0 owned beside X) and all partitions, each from the stalled epoch's start and
   from the run's start (as timed for throughput).

``--limit``: a third side in every repetition, the Arrow limit (``tools/splitkeeper_tools/bench/limit.py``,
:func:`~splitkeeper_tools.bench.limit.kafka_limit`): plain confluent-kafka batch consumes of the
same topic's messages, the partitions split round robin over ``--parallelism`` spawned processes
(one per region; process start included), written with pyarrow as parquet with the columns our
raw Kafka sink writes from a message (``split_id``, ``offset``, ``value`` (bytes unchanged),
``key``, ``topic``, ``partition``, ``timestamp``, ``headers``); no protocol, no Spark, no Delta.
Its files are read back after the timing: every produced message exactly once, with its bytes.
It adds ``limit_s``, ``limit_records_per_s`` and ``ours_over_limit`` (ours / limit seconds)
beside the ratio, a third bar in the chart and a row in the table. Raw values only.

``--decode json``: every message's value is a JSON object of the shape of the files
benchmark's lines (``examples/make_files.py``: ``id``, ``user``, ``amount``, ``ts``, ``note``,
about ``--value-bytes`` long); ours decodes it with ``decode: {kind: json, schema:
JSON_SCHEMA}`` into typed columns, the baseline selects ``from_json(CAST(value AS STRING),
JSON_SCHEMA)``'s columns beside ``split_id`` and ``offset``; the content check compares the
typed rows; the chart goes to ``ingest_kafka_json.html``.

Where our time goes: every epoch's :attr:`EpochReport.phases`, the setup, the Spark job
counts; the baseline's per-batch ``durationMs``. Every figure comes with the 1-minute load
average sampled while it was measured (2 shared cores make wall times noisy). Figures:
medians over the repetitions; records/s = messages / median seconds; ``ratio`` = ours /
baseline records/s (above 1: ours is faster). The HTML chart goes to ``--out``
(default ``var/bench``). Exit 0 when every sink check passed and the stall was injected on
both sides, 1 otherwise, 2 on bad input.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitkeeper.errors import InvalidParameterError, SplitkeeperError
from splitkeeper_tools.bench.ingest import (
    LoadFigure,
    LoadSampler,
    _make_files_module,
    add_output_arguments,
    bench_spark,
    breakdown_chart,
    breakdown_lines,
    chart_file,
    check_counts,
    check_decode,
    check_readers,
    check_sink,
    decode_figures,
    decode_text,
    job_submissions,
    jobs_between,
    jobs_in,
    latest_job_id,
    limit_figures,
    mean_durations_ms,
    ordered_phases,
    rate_lines,
    repetitions_table,
    run_benchmark,
    run_repetitions,
    throughput_chart,
    throughput_figures,
    warm_up,
    warm_workers,
    write_page,
)
from splitkeeper_tools.bench.ingest_common import (
    pipeline_config,
    reading_batches,
    run_available_now,
    typed_frame,
)
from splitkeeper_tools.kafka_testbed import (
    BrokerHandle,
    NumberedProducer,
    ValueOf,
    check_bootstrap_servers,
    create_topics,
    end_offsets,
    numbered_value,
    value_bytes,
)

if TYPE_CHECKING:
    from splitkeeper.config.settings import PipelineConfig

CHART_FILE = "ingest_kafka.html"
PIPELINE_NAME = "bench-ingest-kafka"
STALLED_REGION = 0
STALL_EPOCH = 2  # the first epoch that can be regional: epoch 1 gives the checkpoint to fall back to
NO_TIMEOUT_S = 3600.0  # the throughput runs' region timeout: none fires


def _say(line: str) -> None:
    print(f"[bench ingest kafka] {line}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KafkaIngestSettings:
    """What to measure. ``epoch_records=None``: half the messages (two reading epochs).

    ``stall_messages=0`` skips the stalled-partition measurement.
    """

    messages: int = 400_000
    partitions: int = 8
    parallelism: int = 4
    value_bytes: int = 100
    epoch_records: int | None = None
    repeat: int = 3
    region_timeout_s: float = 10.0
    stall_s: float = 60.0
    stall_messages: int = 40_000
    seed: int = 1
    warmup: bool = True
    content_check: bool = True
    decode: str = "raw"
    limit: bool = False  # add plain confluent-kafka + Arrow's consume-and-write (tools/bench/limit.py)
    readers: str = "per_epoch"  # our pipeline's readers setting (the default: a Spark job per epoch)

    def __post_init__(self) -> None:
        check_decode(self.decode)
        check_readers(self.readers)
        if self.limit and self.decode != "raw":
            raise InvalidParameterError(
                "limit",
                True,
                "with --decode raw",
                hint="the Kafka limit writes the raw values; run --limit without --decode json",
            )
        check_counts(
            self,
            (
                ("messages", 1),
                ("partitions", 1),
                ("parallelism", 1),
                ("value_bytes", 1),
                ("repeat", 1),
                ("stall_messages", 0),
            ),
            optional=("epoch_records",),
        )
        if not self.region_timeout_s > 0:
            raise InvalidParameterError("region_timeout_s", self.region_timeout_s, "seconds > 0")
        if self.stall_messages and not self.stall_s > self.region_timeout_s:
            raise InvalidParameterError(
                "stall_s",
                self.stall_s,
                f"seconds > region_timeout_s ({self.region_timeout_s:g})",
                hint="a stall shorter than the region timeout does not fail the region",
            )

    @property
    def records_per_epoch(self) -> int:
        return self.epoch_records if self.epoch_records is not None else math.ceil(self.messages / 2)

    @property
    def max_offsets_per_trigger(self) -> int:
        """The baseline's micro-batch size: our epoch size (see :func:`batch_limit`)."""
        return batch_limit(self.records_per_epoch, self.partitions)


def batch_limit(epoch_records: int, partitions: int) -> int:
    """``maxOffsetsPerTrigger`` for micro-batches as large as our epochs: Spark gives each partition
    its share of the limit rounded down, so the limit gets one record per partition on top; without
    it, the records lost to rounding make one more (tiny) micro-batch, an extra Delta commit."""
    return epoch_records + partitions


# ---------------------------------------------------------------------------------------
# input
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicData:
    """A produced topic: per split id, the end offset at start (= its record count: a fresh topic);
    ``values``: (topic, partition, offset) -> the produced value's bytes (kept for ``--limit``'s
    content check, else empty)."""

    topic: str
    ends: dict[str, int]
    values: Mapping[tuple[str, int, int], bytes] = field(default_factory=dict, repr=False)

    @property
    def records(self) -> int:
        return sum(self.ends.values())


def produce_topic(bootstrap: str, topic: str, settings: KafkaIngestSettings, count: int) -> TopicData:
    """Produce ``count`` numbered messages evenly over the partitions of ``topic``; check the reports."""
    partitions = [(topic, p) for p in range(settings.partitions)]
    prefix = len(f"m{0:08d}|{topic}|{settings.partitions - 1}|")
    payload = max(1, (settings.value_bytes - prefix) // 2)  # hex: two characters per byte
    value_of = (
        json_values(settings.value_bytes, settings.seed) if settings.decode == "json" else numbered_value
    )
    producer = NumberedProducer(
        bootstrap, partitions, settings.seed, payload_bytes=(payload, payload), value_of=value_of
    )
    producer.produce(count)
    ends = end_offsets(producer.delivered)
    if producer.failed or len(producer.delivered) != count or sum(ends.values()) != count:
        raise SplitkeeperError(
            f"producing to {topic}: {len(producer.delivered)} of {count} messages delivered with offsets "
            f"up to {sum(ends.values())} ({len(producer.failed)} failed: {producer.failed[:3]})",
            topic=topic,
        )
    values = {at: value_bytes(text) for at, text in producer.delivered.items()} if settings.limit else {}
    return TopicData(topic, dict(sorted(ends.items())), values)


def json_values(value_bytes: int, seed: int) -> ValueOf:
    """Values for ``--decode json``: message ``seq`` is the JSON object ``examples/make_files.py``
    writes as record ``seq`` (``id`` = ``seq``), about ``value_bytes`` long, drawn from ``seed``."""
    import random

    make_line = _make_files_module().make_line
    rng = random.Random(seed)

    def value_of(seq: int, _topic: str, _partition: int, _payload: str) -> bytes:
        return str(make_line(rng, seq, "jsonl", value_bytes)).encode()

    return value_of


def _warm_kafka_task(_: int) -> int:
    """A Python worker's first import of the Kafka reader (module-level: pickled by reference)."""
    import splitkeeper.sources.kafka.source  # noqa: F401

    return os.getpid()


def warm_up_kafka(spark: Any, work_dir: str, bootstrap: str, topic: str) -> None:
    """:func:`warm_up`, then both Kafka clients once: our readers' import, Spark's Kafka classes."""
    warm_up(spark, work_dir)
    warm_workers(spark, _warm_kafka_task)
    spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option(
        "subscribe", topic
    ).load().limit(1).collect()


# ---------------------------------------------------------------------------------------
# the two sides
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OursRun:
    seconds: float
    setup_s: float  # the lease + Pipeline(...) (creates state and sink tables) + open()
    # per epoch: epoch, kind, records, elapsed_s, phases, outcomes, started_at_s, ended_at_s
    epochs: tuple[dict[str, Any], ...]
    done_at_s: dict[str, float]  # split id -> seconds from start until committed up to its end offset
    stalled_splits: tuple[str, ...]  # what the stalled region planned in the stall epoch (stall run)
    setup_jobs: int | None
    jobs: int | None
    load: LoadFigure
    sink_path: str


@dataclass(frozen=True, slots=True)
class BaselineRun:
    seconds: float
    batches: int
    batch_ms: dict[str, float]  # mean per micro-batch of Structured Streaming's durationMs entries
    batch_spans_s: tuple[tuple[float, float], ...]  # per micro-batch: (start, end), seconds from start
    done_at_s: dict[str, float]  # split id -> seconds from start until committed up to its end offset
    jobs: int | None
    load: LoadFigure
    sink_path: str


def _ours_config(
    bootstrap: str,
    topic: str,
    root: str,
    parallelism: int,
    epoch_records: int,
    region_timeout_s: float,
    decode: str = "raw",
    readers: str = "per_epoch",
) -> PipelineConfig:
    return pipeline_config(
        PIPELINE_NAME,
        root,
        {"kind": "kafka", "bootstrap_servers": bootstrap, "topics": [topic], "starting": "earliest"},
        parallelism=parallelism,
        epoch_records=epoch_records,
        region_timeout_s=region_timeout_s,
        decode=decode,
        readers=readers,
    )


def run_ours(
    spark: Any,
    settings: KafkaIngestSettings,
    bootstrap: str,
    data: TopicData,
    root: str,
    label: str,
    *,
    epoch_records: int,
    region_timeout_s: float = NO_TIMEOUT_S,
    faults: Sequence[str] = (),
) -> OursRun:
    """Ingest ``data`` with a fresh pipeline under ``root``, epoch by epoch until every partition's
    committed position is at its end offset; time it end to end. With ``faults`` (the stall run),
    ``stalled_splits`` are the splits region :data:`STALLED_REGION` planned in :data:`STALL_EPOCH`."""
    from splitkeeper.app.services import leased_pipeline
    from splitkeeper.app.sink import sink_reader
    from splitkeeper.sinks.port import SinkTable

    config = _ours_config(
        bootstrap,
        data.topic,
        root,
        settings.parallelism,
        epoch_records,
        region_timeout_s,
        settings.decode,
        settings.readers,
    )
    max_epochs = 3 * math.ceil(data.records / epoch_records) + 5
    epochs: list[dict[str, Any]] = []
    done: dict[str, float] = {}
    warm_workers(spark, _warm_kafka_task)  # the Python workers Spark ended since the last run, untimed
    first_job = latest_job_id(spark)
    with LoadSampler() as sampler:
        started = time.perf_counter()
        with leased_pipeline(
            config, spark, faults=faults, progress=lambda line: _say(f"{label}: {line}"), metrics=False
        ) as pipeline:
            pipeline.open()
            setup_s = time.perf_counter() - started
            opened_at = time.time()  # the setup's jobs are counted after the run (no py4j in the clock)
            while len(done) < len(data.ends):
                if len(epochs) >= max_epochs:
                    raise SplitkeeperError(
                        f"{label}: not at the end offsets after {max_epochs} epochs; still behind: "
                        f"{sorted(set(data.ends) - set(done))}"
                    )
                began = round(time.perf_counter() - started, 3)
                report = pipeline.run_epoch()
                now = round(time.perf_counter() - started, 3)
                assert pipeline.enumerator is not None
                for sid, end in data.ends.items():
                    split = pipeline.enumerator.split(sid)
                    if sid not in done and split is not None and split.position >= end:
                        done[sid] = now
                epochs.append(
                    {
                        "epoch": report.epoch,
                        "kind": report.kind.value,
                        "records": report.committed_records,
                        "elapsed_s": report.elapsed_s,
                        "phases": dict(report.phases),
                        "outcomes": {str(r): o.value for r, o in sorted(report.outcomes.items())},
                        "started_at_s": began,
                        "ended_at_s": now,
                    }
                )
        seconds = time.perf_counter() - started
    last_job = latest_job_id(spark)
    jobs = jobs_between(first_job, last_job)
    stalled: tuple[str, ...] = ()
    if faults:
        plan = pipeline.store.read_plan(STALL_EPOCH)
        stalled = tuple(sorted(r.split_id for r in plan.regions.get(STALLED_REGION, ())))
    return OursRun(
        seconds=round(seconds, 3),
        setup_s=round(setup_s, 3),
        epochs=tuple(epochs),
        done_at_s=dict(sorted(done.items())),
        stalled_splits=stalled,
        setup_jobs=jobs_in(job_submissions(spark, first_job, last_job), None, opened_at),
        jobs=jobs,
        load=sampler.figure,
        sink_path=str(sink_reader(config).location(SinkTable.RECORDS)),
    )


def stall_filter(split_id: str, offset: int, seconds: float) -> str:
    """A SQL predicate, true for every row, that sleeps ``seconds`` in the JVM on the one row
    ``(split_id, offset)`` (``reflect`` is non-deterministic, so the optimizer keeps it)."""
    if "'" in split_id:
        raise InvalidParameterError("split_id", split_id, "a topic-partition id without quotes")
    millis = int(seconds * 1000)
    return (
        f"CASE WHEN split_id = '{split_id}' AND offset = {int(offset)} "
        f"THEN length(reflect('java.lang.Thread', 'sleep', CAST({millis} AS BIGINT))) >= 0 ELSE true END"
    )


def _end_offsets_of(progress: Mapping[str, Any]) -> dict[str, int]:
    """Split id -> the batch's end offset, from a Kafka source's ``endOffset`` (JSON text or object)."""
    from splitkeeper.sources.kafka.source import split_id_of

    out: dict[str, int] = {}
    for source in progress.get("sources") or ():
        offsets = source.get("endOffset")
        if isinstance(offsets, str):
            offsets = json.loads(offsets)
        for topic, parts in (offsets or {}).items():
            for partition, offset in parts.items():
                out[split_id_of(topic, int(partition))] = int(offset)
    return out


def run_baseline(
    spark: Any,
    bootstrap: str,
    data: TopicData,
    root: str,
    label: str,
    *,
    max_offsets_per_trigger: int,
    stall: tuple[str, int, float] | None = None,
    decode: str = "raw",
) -> BaselineRun:
    """Ingest ``data`` with Structured Streaming (Kafka source, Delta sink, availableNow); with
    ``decode="json"`` the values are parsed with ``from_json`` into the typed columns.

    ``stall`` = (split id, offset, seconds): that record takes that long (:func:`stall_filter`).
    """
    sink_path = os.path.join(root, "sink")
    first_job = latest_job_id(spark)
    with LoadSampler() as sampler:
        started_wall = time.time()
        started = time.perf_counter()
        frame = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", data.topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", max_offsets_per_trigger)
            .option("kafka.isolation.level", "read_committed")
            .load()
        )
        split_id = "concat(topic, '-', CAST(partition AS STRING))"
        if decode == "json":
            frame = typed_frame(
                frame, "CAST(value AS STRING)", (("split_id", split_id), ("offset", "offset"))
            )
        else:
            frame = frame.selectExpr(f"{split_id} AS split_id", "offset", "CAST(value AS STRING) AS value")
        if stall is not None:
            frame = frame.where(stall_filter(*stall))
        query = run_available_now(
            frame,
            sink_path,
            os.path.join(root, "checkpoint"),
            f"bench_ingest_kafka_{os.getpid()}_{int(started * 1000)}",
        )
        seconds = time.perf_counter() - started
    progress = reading_batches(query, label)
    spans: list[tuple[float, float]] = []
    done: dict[str, float] = {}
    for p in progress:
        began = datetime.fromisoformat(str(p["timestamp"]).replace("Z", "+00:00")).timestamp()
        start_s = round(began - started_wall, 3)
        end_s = round(start_s + p["durationMs"]["triggerExecution"] / 1000, 3)
        spans.append((start_s, end_s))
        for sid, offset in _end_offsets_of(p).items():
            if sid not in done and offset >= data.ends.get(sid, math.inf):
                done[sid] = end_s
    _say(f"{label}: {len(progress)} micro-batches in {seconds:.2f}s")
    return BaselineRun(
        seconds=round(seconds, 3),
        batches=len(progress),
        batch_ms=mean_durations_ms(progress),
        batch_spans_s=tuple(spans),
        done_at_s=dict(sorted(done.items())),
        jobs=jobs_between(first_job, latest_job_id(spark)),
        load=sampler.figure,
        sink_path=sink_path,
    )


# ---------------------------------------------------------------------------------------
# the stalled partition
# ---------------------------------------------------------------------------------------


def latest_of(done_at_s: Mapping[str, float], splits: Sequence[str]) -> float | None:
    """When the last of ``splits`` was committed up to its end (None if one never was)."""
    times = [done_at_s.get(s) for s in splits]
    return None if not times or any(t is None for t in times) else max(t for t in times if t is not None)


def _since(start: float | None, at: float | None) -> float | None:
    return None if start is None or at is None else round(at - start, 3)


def measure_stall(
    spark: Any, settings: KafkaIngestSettings, bootstrap: str, data: TopicData, work_dir: str
) -> dict[str, Any]:
    """Both sides on ``data`` with one stalled reader (see the module doc); latencies and evidence."""
    epoch = math.ceil(data.records / 2)  # two epochs / micro-batches; the stall hits the second
    label = "stall ours"
    spec = f"stall:{settings.stall_s:g}:{STALLED_REGION}@{STALL_EPOCH}"
    _say(f"{label}: fault {spec}, region timeout {settings.region_timeout_s:g}s")
    ours = run_ours(
        spark,
        settings,
        bootstrap,
        data,
        os.path.join(work_dir, "stall-ours"),
        label,
        epoch_records=epoch,
        region_timeout_s=settings.region_timeout_s,
        faults=(spec,),
    )
    stalled_epoch = next((e for e in ours.epochs if e["epoch"] == STALL_EPOCH), None)
    ours_injected = (
        stalled_epoch is not None
        and stalled_epoch["kind"] == "regional"
        and stalled_epoch["outcomes"].get(str(STALLED_REGION)) == "timeout"
    )
    if not ours.stalled_splits:
        raise SplitkeeperError(f"{label}: region {STALLED_REGION} planned nothing in epoch {STALL_EPOCH}")
    stalled = ours.stalled_splits[0]
    offset = data.ends[stalled] - 1  # the partition's last record: in the second micro-batch
    _say(f"stall baseline: record {offset} of {stalled} sleeps {settings.stall_s:g}s")
    base = run_baseline(
        spark,
        bootstrap,
        data,
        os.path.join(work_dir, "stall-baseline"),
        "stall baseline",
        max_offsets_per_trigger=batch_limit(epoch, settings.partitions),
        stall=(stalled, offset, settings.stall_s),
        decode=settings.decode,
    )
    # the stalled micro-batch: the one that read the sleeping record, i.e. completed its partition
    span = next((sp for sp in base.batch_spans_s if sp[1] == base.done_at_s.get(stalled)), None)
    base_injected = span is not None and span[1] - span[0] >= settings.stall_s
    ours_start = None if stalled_epoch is None else stalled_epoch["started_at_s"]
    base_start = None if span is None else span[0]
    ours_check = check_sink(ours.sink_path, data.ends, with_offsets=True)
    base_check = check_sink(base.sink_path, data.ends, with_offsets=True)
    splits = sorted(data.ends)
    healthy_ours = [s for s in splits if s not in ours.stalled_splits]
    all_but_stalled = [s for s in splits if s != stalled]
    from_start = {
        "ours_healthy": latest_of(ours.done_at_s, healthy_ours),
        # like for like: the same partitions left out on both sides (those region 0 planned)
        "baseline_healthy": latest_of(base.done_at_s, healthy_ours),
        "ours_all_but_stalled_partition": latest_of(ours.done_at_s, all_but_stalled),
        "baseline_all_but_stalled_partition": latest_of(base.done_at_s, all_but_stalled),
        "ours_all": latest_of(ours.done_at_s, splits),
        "baseline_all": latest_of(base.done_at_s, splits),
    }
    return {
        "stalled_ours_s": _since(ours_start, from_start["ours_healthy"]),
        "stalled_baseline_s": _since(base_start, from_start["baseline_healthy"]),
        "stall": {
            "messages": data.records,
            "epoch_records": epoch,
            "stall_s": settings.stall_s,
            "region_timeout_s": settings.region_timeout_s,
            "fault": spec,
            "stalled_partition": stalled,
            "stalled_offset": offset,
            "stalled_region_partitions": list(ours.stalled_splits),
            "ours_stall_started_at_s": ours_start,
            "baseline_stall_started_at_s": base_start,
            "ours_all_but_stalled_partition_s": _since(
                ours_start, from_start["ours_all_but_stalled_partition"]
            ),
            "baseline_all_but_stalled_partition_s": _since(
                base_start, from_start["baseline_all_but_stalled_partition"]
            ),
            "ours_all_s": _since(ours_start, from_start["ours_all"]),
            "baseline_all_s": _since(base_start, from_start["baseline_all"]),
            "from_run_start_s": from_start,
            "ours_done_at_s": ours.done_at_s,
            "baseline_done_at_s": base.done_at_s,
            "ours_setup_s": ours.setup_s,
            "ours_epochs": list(ours.epochs),
            "baseline_batch_spans_s": [list(sp) for sp in base.batch_spans_s],
            "ours_s": ours.seconds,
            "baseline_s": base.seconds,
            "ours_injected": ours_injected,
            "baseline_injected": base_injected,
            "ours_exact": ours_check.exact and ours_check.records == data.records,
            "baseline_exact": base_check.exact and base_check.records == data.records,
            "ours_load": ours.load.mean,
            "baseline_load": base.load.mean,
        },
    }


# ---------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------


def bench_ingest_kafka(
    settings: KafkaIngestSettings,
    work_dir: str,
    bootstrap_servers: str | None = None,
    spark: Any | None = None,
) -> dict[str, Any]:
    """Run the benchmark under ``work_dir`` (broker, sinks, state) and return its figures."""
    load_start = [round(x, 2) for x in os.getloadavg()]
    broker = BrokerHandle(Path(work_dir), bootstrap_servers)
    try:
        if bootstrap_servers is None:
            _say("starting a Kafka broker (KRaft) ...")
        bootstrap = broker.start()
        run_id = uuid.uuid4().hex[:8]
        topic, stall_topic = f"bench-ingest-{run_id}", f"bench-ingest-{run_id}-stall"
        create_topics(bootstrap, {topic: settings.partitions, stall_topic: settings.partitions})
        t0 = time.perf_counter()
        data = produce_topic(bootstrap, topic, settings, settings.messages)
        stall_data = (
            produce_topic(bootstrap, stall_topic, settings, settings.stall_messages)
            if settings.stall_messages
            else None
        )
        _say(
            f"Kafka at {bootstrap}: {topic} ({settings.partitions} partitions) holds {data.records:,} "
            f"messages, produced in {time.perf_counter() - t0:.1f}s; epoch {settings.records_per_epoch:,} "
            f"records, maxOffsetsPerTrigger {settings.max_offsets_per_trigger:,}; "
            f"parallelism {settings.parallelism}"
        )
        spark = spark or bench_spark()
        if settings.warmup:
            warm_up_kafka(spark, work_dir, bootstrap, stall_topic if stall_data else topic)
            _say("warm-up done (Python workers, Delta, both Kafka clients)")
        result = _throughput(spark, settings, bootstrap, data, work_dir)
        if stall_data is not None:
            stall = measure_stall(spark, settings, bootstrap, stall_data, work_dir)
            result.update(stall)
            _say(
                f"stalled partition: healthy partitions committed after {stall['stalled_ours_s']}s (ours) "
                f"vs {stall['stalled_baseline_s']}s (baseline)"
            )
        else:
            result.update({"stalled_ours_s": None, "stalled_baseline_s": None, "stall": None})
    finally:
        broker.stop()
    result["topic"] = topic
    result["bootstrap_servers"] = bootstrap_servers or "own broker"
    result["load_avg"].update(
        {
            "start": load_start,
            "stall_ours": None if result["stall"] is None else result["stall"]["ours_load"],
            "stall_baseline": None if result["stall"] is None else result["stall"]["baseline_load"],
            "end": [round(x, 2) for x in os.getloadavg()],
        }
    )
    stall_ok = result["stall"] is None or all(
        result["stall"][k] for k in ("ours_injected", "baseline_injected", "ours_exact", "baseline_exact")
    )
    result["passed"] = bool(result["exact"] and stall_ok)
    return result


def _throughput(
    spark: Any, settings: KafkaIngestSettings, bootstrap: str, data: TopicData, work_dir: str
) -> dict[str, Any]:
    reps = run_repetitions(
        spark,
        settings.repeat,
        work_dir,
        lambda rep_dir: {  # each called with its label
            "ours": functools.partial(
                run_ours,
                spark,
                settings,
                bootstrap,
                data,
                os.path.join(rep_dir, "ours"),
                epoch_records=settings.records_per_epoch,
            ),
            "baseline": functools.partial(
                run_baseline,
                spark,
                bootstrap,
                data,
                os.path.join(rep_dir, "baseline"),
                max_offsets_per_trigger=settings.max_offsets_per_trigger,
                decode=settings.decode,
            ),
            **(
                {
                    "limit": functools.partial(
                        run_limit, settings, bootstrap, data, os.path.join(rep_dir, "limit")
                    )
                }
                if settings.limit
                else {}
            ),
        },
        data.ends,
        baseline_offsets=True,
        content_check=settings.content_check,
        typed=settings.decode == "json",
        say=_say,
    )
    figures = throughput_figures(data.records, reps.ours, reps.baseline, reps.runs)
    if reps.limit:
        figures |= limit_figures(data.records, figures["ours_s"], reps.limit)
    return {
        **figures,
        "benchmark": "ingest",
        "source": "kafka",
        **decode_figures(settings.decode, settings.readers),
        "messages": data.records,
        "records": data.records,
        "partitions": settings.partitions,
        "value_bytes": settings.value_bytes,
        "parallelism": settings.parallelism,
        "epoch_records": settings.records_per_epoch,
        "max_offsets_per_trigger": settings.max_offsets_per_trigger,
        "repeat": settings.repeat,
        "ours_checkpoint_kinds": sorted({e["kind"] for r in reps.ours for e in r.epochs}),
        "baseline_duplicates": max((r["baseline_duplicates"] or 0) for r in reps.runs),
        "content_equal": reps.content_equal,
        "exact": reps.exact,
    }


def run_limit(
    settings: KafkaIngestSettings, bootstrap: str, data: TopicData, out_dir: str, label: str
) -> Any:
    """The Arrow limit of one repetition (:func:`splitkeeper_tools.bench.limit.kafka_limit`), its
    files then checked against the produced messages (not timed)."""
    from splitkeeper_tools.bench.limit import check_kafka_limit, kafka_limit

    ends = {int(sid.rsplit("-", 1)[1]): end for sid, end in data.ends.items()}
    run = kafka_limit(bootstrap, data.topic, ends, out_dir, LoadSampler())
    equal = check_kafka_limit(out_dir, data.values)
    if not equal:
        _say(f"{label}: the limit's files do NOT hold exactly the produced messages")
    return replace(run, content_equal=equal)


# ---------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def render_table(result: Mapping[str, Any]) -> str:
    """The human-readable report (what ``run`` prints without ``--json``)."""
    load = result["load_avg"]
    lines = [
        f"Kafka ({result['bootstrap_servers']}): topic {result['topic']}, {result['partitions']} partitions, "
        f"{result['messages']:,} messages of ~{result['value_bytes']} bytes; "
        f"epoch {result['epoch_records']:,} records, "
        f"maxOffsetsPerTrigger {result['max_offsets_per_trigger']:,}, parallelism {result['parallelism']}, "
        f"{result['repeat']} repetition(s), {load['cpus']} cpus; {decode_text(result)}",
        *rate_lines(result),
        f"checks: exactly the end offsets per partition in both sinks, no duplicate (split_id, offset): "
        f"{result['exact']}; same {'typed rows' if result.get('decode') == 'json' else 'values'} in both: "
        f"{result['content_equal']}",
        "",
        f"our epochs: {result['ours_epochs_per_run']} per run, {result['ours_epoch_s_avg']:.2f}s each on "
        f"average, checkpoints {', '.join(result['ours_checkpoint_kinds'])}; Spark jobs per run "
        f"{result['ours_jobs_per_run']} vs baseline {result['baseline_jobs_per_run']} "
        f"({result['baseline_batches_per_run']} micro-batches)",
        "phase averages per epoch (s): "
        + "  ".join(f"{k}={v:.2f}" for k, v in ordered_phases(result["ours_phases_avg_s"])),
        *breakdown_lines(result),
    ]
    lines.append(
        "baseline per micro-batch (ms): "
        + "  ".join(f"{k}={v:.0f}" for k, v in result["baseline_batch_ms_avg"].items())
    )
    stall = result["stall"]
    if stall is not None:
        lines += [
            "",
            f"stalled reader ({stall['messages']:,} messages in two epochs / micro-batches, one reader stuck "
            f"{stall['stall_s']:g}s in the second; our region timeout {stall['region_timeout_s']:g}s): "
            "seconds from the stalled epoch's / micro-batch's start until committed",
            f"  {'':<44}{'splitkeeper':>12}{'baseline':>10}",
            f"  {'partitions the stalled reader does not own':<44}{_s(result['stalled_ours_s']):>12}"
            f"{_s(result['stalled_baseline_s']):>10}",
            f"  {'every partition but the stalled one':<44}"
            f"{_s(stall['ours_all_but_stalled_partition_s']):>12}"
            f"{_s(stall['baseline_all_but_stalled_partition_s']):>10}",
            f"  {'every partition':<44}{_s(stall['ours_all_s']):>12}{_s(stall['baseline_all_s']):>10}",
            f"  from the run's start: healthy {_s(stall['from_run_start_s']['ours_healthy'])} vs "
            f"{_s(stall['from_run_start_s']['baseline_healthy'])}, every partition "
            f"{_s(stall['from_run_start_s']['ours_all'])} vs {_s(stall['from_run_start_s']['baseline_all'])}",
            f"  stalled partition {stall['stalled_partition']} (record {stall['stalled_offset']} in the "
            f"baseline); our stalled region owned {', '.join(stall['stalled_region_partitions'])}; "
            f"fault {stall['fault']}; injected: ours {stall['ours_injected']}, "
            f"baseline {stall['baseline_injected']}; exact: ours "
            f"{stall['ours_exact']}, baseline {stall['baseline_exact']}; load {stall['ours_load']:.1f} / "
            f"{stall['baseline_load']:.1f}",
        ]
    if result.get("chart"):
        lines.append(f"chart: {result['chart']}")
    return "\n".join(lines)


def write_chart(result: Mapping[str, Any], out_dir: str) -> str:
    """Write ``<out_dir>/ingest_kafka.html`` (inline SVG, no network); return its path."""
    from html import escape

    from splitkeeper.report import charts

    throughput = throughput_chart(
        result, "ingest-kafka-throughput", "Records per second, Kafka to Delta, end to end"
    )
    run_chart = breakdown_chart(result, "ingest-kafka-run-breakdown")
    stall = result["stall"]
    stall_html = "<p>Stalled-partition latency not measured.</p>"
    if stall is not None:
        values = [
            (result["stalled_ours_s"], result["stalled_baseline_s"]),
            (stall["ours_all_but_stalled_partition_s"], stall["baseline_all_but_stalled_partition_s"]),
            (stall["ours_all_s"], stall["baseline_all_s"]),
        ]
        stall_chart = charts.bar_chart(
            "ingest-kafka-stall",
            "Seconds until committed, with one reader stuck (lower is better)",
            f"One reader stuck {stall['stall_s']:g}s in the second of two epochs / micro-batches; "
            f"splitkeeper's region timeout {stall['region_timeout_s']:g}s",
            ["healthy readers' partitions", f"all but {stall['stalled_partition']}", "all partitions"],
            [
                charts.Series("splitkeeper", tuple(o or 0.0 for o, _b in values), charts.BLUE),
                charts.Series("Structured Streaming", tuple(b or 0.0 for _o, b in values), charts.ORANGE),
            ],
            x_label="partitions committed",
            y_label="seconds from the stalled epoch's start",
            reference=("stall", stall["stall_s"]),
        )
        stall_html = (
            f"<div>{stall_chart}</div><p>{stall['messages']:,} messages in two epochs / micro-batches; "
            f"our region {STALLED_REGION} (owning {escape(', '.join(stall['stalled_region_partitions']))}) "
            f"stalled in the second by fault {escape(stall['fault'])}; in the baseline record "
            f"{stall['stalled_offset']} of {escape(stall['stalled_partition'])} sleeps. "
            f"Injected: ours {stall['ours_injected']}, baseline "
            f"{stall['baseline_injected']}.</p>"
        )
    body = f"""<h1>bench ingest --source kafka --decode {escape(result.get("decode", "raw"))}</h1>
<p>{result["messages"]:,} messages in {result["partitions"]} partitions, {escape(decode_text(result))},
epoch {result["epoch_records"]:,} records, maxOffsetsPerTrigger {result["max_offsets_per_trigger"]:,},
parallelism {result["parallelism"]}.
Ratio ours / baseline: <b>{result["ratio"]:.3f}</b>. Exactly-once checks passed: {result["exact"]}.</p>
<div>{throughput}{run_chart}</div>
<h2>Stalled partition</h2>
{stall_html}
{repetitions_table(result)}"""
    return write_page(
        out_dir, chart_file(CHART_FILE, result), "splitkeeper-tools bench ingest --source kafka", body
    )


# ---------------------------------------------------------------------------------------
# command
# ---------------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    d = KafkaIngestSettings()
    parser.add_argument("--source", default="kafka", choices=("kafka",), help="kafka (this benchmark)")
    parser.add_argument("--messages", type=int, default=d.messages, help=f"messages (default {d.messages:,})")
    parser.add_argument("--partitions", type=int, default=d.partitions, help="topic partitions (default 8)")
    parser.add_argument("--value-bytes", type=int, default=d.value_bytes, help="message value length (100)")
    parser.add_argument("--parallelism", type=int, default=d.parallelism, help="our regions (default 4)")
    parser.add_argument(
        "--epoch-records",
        type=int,
        default=None,
        help="records per epoch (default: half the messages); maxOffsetsPerTrigger: this + partitions",
    )
    parser.add_argument("--repeat", type=int, default=d.repeat, help="repetitions (default 3)")
    parser.add_argument(
        "--stall-messages",
        type=int,
        default=d.stall_messages,
        help="messages of the stalled-partition measurement (default 40,000; 0 skips it)",
    )
    parser.add_argument("--stall-s", type=float, default=d.stall_s, help="how long the reader is stuck (60)")
    parser.add_argument(
        "--region-timeout-s", type=float, default=d.region_timeout_s, help="our region timeout there (10)"
    )
    parser.add_argument("--seed", type=int, default=d.seed, help="draws partitions and payloads (1)")
    parser.add_argument(
        "--bootstrap-servers", default=None, help="use this Kafka instead of starting one (host:port,...)"
    )
    parser.add_argument(
        "--limit",
        action="store_true",
        help="also time plain confluent-kafka batch consumes of the same messages written as parquet by "
        "Arrow, warm workers, one per core (no protocol, no Spark): prints ours / limit (ours_over_limit)",
    )
    add_output_arguments(parser, "broker, sinks and state")


def run(args: argparse.Namespace) -> int:
    settings = KafkaIngestSettings(
        messages=args.messages,
        partitions=args.partitions,
        parallelism=args.parallelism,
        value_bytes=args.value_bytes,
        epoch_records=args.epoch_records,
        repeat=args.repeat,
        region_timeout_s=args.region_timeout_s,
        stall_s=args.stall_s,
        stall_messages=args.stall_messages,
        seed=args.seed,
        warmup=not args.no_warmup,
        content_check=not args.no_content_check,
        decode=args.decode,
        limit=args.limit,
        readers=args.readers,
    )
    check_bootstrap_servers(args.bootstrap_servers)
    return run_benchmark(
        args,
        lambda work: bench_ingest_kafka(settings, work, args.bootstrap_servers),
        prefix="bench-ingest-kafka-",
        write_chart=write_chart,
        render_table=render_table,
        passed="passed",
        failure="splitkeeper-tools bench ingest --source kafka: a sink does not hold exactly the produced "
        "records, "
        "or the stall was not injected (see the checks and stalled reader lines)",
        say=_say,
    )
