"""The Arrow limit of ``bench ingest --limit``: what reading the same files and writing the same
parquet costs with nothing but Arrow, as a floor for any ingest tool on this machine.

Warm workers, one per core (``os.cpu_count()``): the processes are started, have imported
pyarrow (and confluent-kafka) and have done the same work once (untimed, its output removed)
before the clock starts, so the figure is the machine's floor for the work itself, not
process start-up or the first touch of its memory. Each takes its share of the files (round robin, as
the even-split assignment gives them), reads each file in one call and splits its lines with
numpy into one binary column (``raw``: a line is a record, its bytes unchanged) or with Arrow's JSON
reader and the benchmark's declared schema (``json``), adds the ``split_id`` and ``offset``
columns our sink has (offset: the line's first byte), and writes one parquet file per input
file, with the writer settings of our region tasks. No protocol, no Spark, no Delta log, no
exactly-once: that difference is what ``ours_over_limit`` shows.

The Kafka limit (``bench ingest --source kafka --limit``, :func:`kafka_limit`): the same, with
the topic's partitions in place of the files (round robin over the warm processes, as the
least-loaded assignment gives a region its partitions). Each process is one confluent-kafka
consumer (``isolation.level read_committed``, as our readers; no group membership, no offset
commits) ``assign``-ed its partitions at offset 0 that batch-consumes (``consume(num_messages=
...)``, batches of our reader's size) until every partition reached its end offset, builds the
columns our raw Kafka sink writes from a message (``split_id`` = ``<topic>-<partition>``,
``offset``, ``value`` (the bytes unchanged), ``key``, ``topic``, ``partition``, ``timestamp``,
``headers``; not our bookkeeping columns ``next_offset``, ``epoch``, ``region``,
``ingested_at``) and writes them as one parquet file per process. The benchmark then reads the
files back and checks every produced message is there once with its bytes
(:func:`check_kafka_limit`, not timed).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

from splitkeeper.staging import ROW_GROUP_ROWS, parquet_options

__all__ = [
    "LimitRun",
    "arrow_limit",
    "check_kafka_limit",
    "cores",
    "consume_and_write",
    "kafka_limit",
    "read_and_write",
]


@dataclass(frozen=True, slots=True)
class LimitRun:
    """One measurement: wall seconds (the first call to every file written, workers warm), the rows written
    per file (Kafka: per split id) and the load average while it ran (``load`` is the benchmark's
    ``LoadFigure``). ``content_equal``: whether the written rows were checked equal to the input
    (:func:`check_kafka_limit`); None: not checked."""

    seconds: float
    rows: dict[str, int]
    processes: int
    load: Any
    content_equal: bool | None = None


def _read_raw(path: str) -> Any:
    """The file's lines as one binary ``value`` column and each line's first byte as ``offset``:
    the whole file in one read, the newlines found by numpy, the values a view of the bytes
    without them (what any careful plain-Arrow reader does; no per-line Python)."""
    import numpy as np
    import pyarrow as pa

    with open(path, "rb") as f:
        data = f.read()
    buf = np.frombuffer(data, np.uint8)
    newlines = np.flatnonzero(buf == 0x0A)
    starts = (
        np.concatenate(([0], newlines[:-1] + 1))
        if data.endswith(b"\n")
        else np.concatenate(([0], newlines + 1))
    )
    ends = newlines if data.endswith(b"\n") else np.append(newlines, len(data))
    offsets = np.zeros(len(starts) + 1, np.int32)
    np.cumsum(ends - starts, out=offsets[1:])
    keep = np.ones(len(data), np.bool_)
    keep[newlines] = False
    values = pa.Array.from_buffers(
        pa.binary(), len(starts), [None, pa.py_buffer(offsets), pa.py_buffer(buf[keep])]
    )
    return pa.table({"value": values, "offset": pa.array(starts, pa.int64())})


#: Parquet as our region tasks write it (spark/task.py): their writer settings
#: (:func:`splitkeeper.staging.parquet_options`), their row groups (``ROW_GROUP_ROWS``), Arrow's
#: default codec.
_ROW_GROUP = ROW_GROUP_ROWS


def _read_json(path: str, schema_ddl: str) -> Any:
    from pyarrow import json

    from splitkeeper.records.ddl import arrow_schema, parse_ddl

    schema = arrow_schema(parse_ddl(schema_ddl))
    return json.read_json(path, parse_options=json.ParseOptions(explicit_schema=schema))


def read_and_write(paths: Sequence[str], out_dir: str, schema_ddl: str | None = None) -> dict[str, int]:
    """Read ``paths`` and write each as ``<out_dir>/<file name>.parquet``; file name -> rows.

    ``schema_ddl`` None reads raw lines (one binary ``value`` column and its byte ``offset``);
    a DDL reads JSON lines into its typed columns (and the row number as ``offset``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(out_dir, exist_ok=True)
    rows: dict[str, int] = {}
    for path in paths:
        name = os.path.basename(path)
        if schema_ddl is None:
            table = _read_raw(path)
        else:
            table = _read_json(path, schema_ddl)
            table = table.append_column("offset", pa.array(range(table.num_rows), pa.int64()))
        table = table.append_column("split_id", pa.array([name] * table.num_rows, pa.string()))
        pq.write_table(
            table,
            os.path.join(out_dir, f"{name}.parquet"),
            row_group_size=_ROW_GROUP,
            **parquet_options(table.schema),
        )
        rows[name] = table.num_rows
    return rows


def cores() -> int:
    """The limit's process count: one per core of this machine."""
    return max(1, os.cpu_count() or 1)


def arrow_limit(input_dir: str, out_dir: str, schema_ddl: str | None, load_sampler: Any) -> LimitRun:
    """Time :func:`read_and_write` over every file of ``input_dir`` in one warm process per core."""
    files = sorted(os.path.join(input_dir, f) for f in os.listdir(input_dir))
    processes = cores()
    shares = [files[i::processes] for i in range(processes)]
    warm_dir = os.path.join(out_dir, "_warm-up")
    return _timed(
        read_and_write,
        [(s, out_dir, schema_ddl) for s in shares if s],
        out_dir,
        load_sampler,
        warm_up=[(s, warm_dir, schema_ddl) for s in shares if s],
    )


def _warm() -> None:
    """A worker's start: import what the work imports (outside the clock)."""
    import numpy  # noqa: F401
    import pyarrow.compute
    import pyarrow.json
    import pyarrow.parquet  # noqa: F401

    with contextlib.suppress(ImportError):  # the files limit needs no Kafka client
        import confluent_kafka  # noqa: F401


def _ready(delay_s: float) -> int:
    time.sleep(delay_s)  # held so that every worker, not one fast one, takes a warm-up call
    return os.getpid()


def _timed(
    work: Callable[..., dict[str, int]],
    calls: Sequence[tuple[Any, ...]],
    out_dir: str,
    load_sampler: Any,
    warm_up: Sequence[tuple[Any, ...]] = (),
) -> LimitRun:
    """Run ``work(*args)`` for every ``args`` of ``calls`` in a pool of that many warm processes,
    timed from the first call to the last result; the rows are the union of the results.

    Warm, as our run's Python workers are after its warm-up: spawned (nothing inherited from a
    process running a JVM), each has run :func:`_warm` and answered a warm-up call, and the pool
    has done the same work once (``warm_up``: the calls with their output elsewhere, removed
    after) before the clock starts, so the timed run pays no first-touch of its buffers."""
    os.makedirs(out_dir, exist_ok=True)
    rows: dict[str, int] = {}
    workers = len(calls)
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"), initializer=_warm) as pool:
        started: set[int] = set()
        deadline = time.monotonic() + 120
        while len(started) < workers:  # every worker up and warm, before the clock
            if time.monotonic() > deadline:
                raise RuntimeError(f"the limit's {workers} worker processes did not all start in 120 s")
            started.update(pool.map(_ready, [0.2] * workers))
        if warm_up:
            list(pool.map(work, *zip(*warm_up, strict=True)))
            shutil.rmtree(os.path.join(out_dir, "_warm-up"), ignore_errors=True)
        with load_sampler as sampler:
            t0 = time.perf_counter()
            for done in pool.map(work, *zip(*calls, strict=True)):
                rows.update(done)
            seconds = time.perf_counter() - t0
    return LimitRun(round(seconds, 3), rows, workers, sampler.figure)


# --------------------------------------------------------------------------- Kafka

#: Messages per ``consume()`` call: our reader's default batch (``KafkaRegionReader.batch_size``).
KAFKA_BATCH = 10_000
_STUCK_S = 60.0  # no message for this long: the limit fails instead of waiting forever


def consume_and_write(
    bootstrap: str, topic: str, ends: dict[int, int], out_path: str, batch: int = KAFKA_BATCH
) -> dict[str, int]:
    """Consume offsets ``[0, end)`` of every partition -> end of ``topic`` with one consumer
    assigned them all, write their columns as the parquet file ``out_path``; split id -> rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "splitkeeper-bench-limit",  # required by the client; never joined (assign)
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",
        }
    )
    left = {p: end for p, end in ends.items() if end > 0}
    remaining = sum(left.values())
    msgs: list[Any] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in left])
        progress_at = time.monotonic()
        while left:
            got = consumer.consume(num_messages=max(1, min(batch, remaining)), timeout=0.2)
            if not got:
                if time.monotonic() - progress_at > _STUCK_S:
                    raise RuntimeError(
                        f"the Kafka limit's consumer got nothing for {_STUCK_S:g}s; waiting for {left}"
                    )
                continue
            progress_at = time.monotonic()
            failed = [m.error() for m in got if m.error() is not None]
            if failed:
                raise RuntimeError(f"the Kafka limit's consumer: {failed[0]}")
            last: dict[Any, Any] = {m.partition(): m.offset() for m in got}  # per partition, in order
            if any(offset >= ends.get(p, 0) for p, offset in last.items()):  # records at or past an end
                got = [m for m in got if m.offset() < ends.get(m.partition(), 0)]  # type: ignore[operator,arg-type]
            msgs.extend(got)
            remaining -= len(got)
            for p, offset in last.items():
                if p in left and offset + 1 >= left[p]:
                    del left[p]
    finally:
        consumer.close()
    partitions = [m.partition() for m in msgs]
    stamps = [m.timestamp() for m in msgs]  # (kind, ms); kind 0: not available
    headers = [m.headers() for m in msgs]
    header_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    table = pa.table(
        {
            "split_id": pa.array([f"{topic}-{p}" for p in partitions], pa.string()),
            "offset": pa.array([m.offset() for m in msgs], pa.int64()),
            "value": pa.array([m.value() for m in msgs], pa.binary()),
            "key": pa.array([m.key() for m in msgs], pa.binary()),
            "topic": pa.array([topic] * len(msgs), pa.string()),
            "partition": pa.array(partitions, pa.int32()),
            "timestamp": pa.array(
                [ms if kind else None for kind, ms in stamps], pa.timestamp("ms", tz="UTC")
            ).cast(pa.timestamp("us", tz="UTC")),
            "headers": pa.array(
                [[{"key": k, "value": v} for k, v in h] if h else [] for h in headers], header_type
            ),
        }
    )
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    pq.write_table(table, out_path, row_group_size=_ROW_GROUP, **parquet_options(table.schema))
    counted = table.group_by("split_id").aggregate([([], "count_all")])
    return dict(zip(counted["split_id"].to_pylist(), counted["count_all"].to_pylist(), strict=True))


def kafka_limit(
    bootstrap: str, topic: str, ends: Mapping[int, int], out_dir: str, load_sampler: Any
) -> LimitRun:
    """Time :func:`consume_and_write` of ``topic``'s partitions (partition -> end offset) split
    round robin over one warm process per core, each writing ``<out_dir>/part-<n>.parquet``."""
    processes = cores()
    partitions = sorted(ends)
    shares = [partitions[i::processes] for i in range(processes)]
    calls = [
        (bootstrap, topic, {p: ends[p] for p in share}, os.path.join(out_dir, f"part-{n}.parquet"))
        for n, share in enumerate(s for s in shares if s)
    ]
    warm = [(*call[:3], os.path.join(out_dir, "_warm-up", os.path.basename(call[3]))) for call in calls]
    return _timed(consume_and_write, calls, out_dir, load_sampler, warm_up=warm)


def check_kafka_limit(out_dir: str, delivered: Mapping[tuple[str, int, int], bytes]) -> bool:
    """Whether the parquet files in ``out_dir`` hold every delivered ``(topic, partition, offset)``
    exactly once, with its value's bytes, its split id and nothing else."""
    import pyarrow.parquet as pq

    table = pq.read_table(out_dir, columns=["split_id", "topic", "partition", "offset", "value"])
    if table.num_rows != len(delivered):
        return False
    seen: set[tuple[str, int, int]] = set()
    columns = [table.column(c).to_pylist() for c in ("split_id", "topic", "partition", "offset", "value")]
    for split_id, topic, partition, offset, value in zip(*columns, strict=True):
        at = (topic, partition, offset)
        if at in seen or split_id != f"{topic}-{partition}" or delivered.get(at) != value:
            return False
        seen.add(at)
    return len(seen) == len(delivered)
