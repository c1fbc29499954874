"""``splitkeeper-tools bench ingest --source files``: exactly-once files ingest vs Structured Streaming.

One run, one Spark session:

1. the input is generated once (``examples/make_files.py``: ``--files`` files of
   ``--lines`` JSON lines of about ``--line-bytes`` bytes, deterministic);
2. per repetition, both ingest it into a fresh Delta table, one after the other
   (the order alternates between repetitions so neither side always runs warm):

   - **splitkeeper**: a bounded files pipeline (``--parallelism`` regions,
     regional checkpoints on, identity transform, ``--epoch-records`` records per
     epoch) opened and run to completion through :class:`splitkeeper.app.pipeline.Pipeline`,
     holding its lease as a run does (:func:`splitkeeper.app.services.leased_pipeline`);
     timed from taking the lease and constructing the pipeline (state and sink tables are
     created) to ``close()`` and the lease's release. Its epochs and the baseline's
     micro-batches are the same size, so both sides make the same number of
     exactly-once Delta commits of records (two by default); the global checkpoint
     of the epoch that reads the last records ends our run;
   - **baseline**: Structured Streaming's ``text`` file source over the same
     directory, ``value`` plus ``_metadata.file_name`` as ``split_id``, into a
     Delta sink with ``trigger(availableNow=True)``, ``maxFilesPerTrigger`` =
     epoch records / lines per file, checkpoint in a fresh directory; timed from
     ``start()`` to ``awaitTermination()``;

3. both sinks are checked (outside the timings): exactly the input record count,
   every file's line count per ``split_id``, no duplicate ``(split_id, offset)``
   in ours, and (first repetition) the same multiset of values in both;

   with ``--decode json`` both sides parse every line into typed columns with one declared
   schema (:data:`~splitkeeper_tools.bench.ingest_common.JSON_SCHEMA`): ours with
   ``decode: {kind: json, schema: ...}``, the baseline with ``from_json(value, schema)``; the
   content check then compares the typed rows (every row's typed columns, sorted); the chart
   goes to ``ingest_json.html``;
4. the state store's restore time is measured after 10 and after
   ``--restore-checkpoints`` (default 200) checkpoints with
   :func:`splitkeeper_tools.bench.state.measure_state_store`.

Where our time goes: every epoch's :attr:`EpochReport.phases`, the pipeline's
setup (construct + open), the number of Spark jobs, and, per run, the wall time
of the state store's and sink's Delta operations (their methods are wrapped by
:class:`CallTimer` for the duration of our run; the wrappers only time, the
behaviour is unchanged). Every figure is reported with the 1-minute load average
sampled while it was measured: the reference machine has 2 cores shared with
other work, so wall times are noisy.

Figures: medians over ``--repeat`` repetitions; records/s = records / median
wall seconds; ``ratio`` = ours / baseline records/s as printed (above 1: ours
is faster). The HTML chart goes to ``--out`` (default ``var/bench``).

``--source kafka`` runs :mod:`splitkeeper_tools.bench.ingest_kafka`, built on the helpers here that
both benchmarks share (settings checks, repetitions, load sampling, throughput figures, report
lines, chart page, command).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING, Any

from splitkeeper.errors import EnvironmentNotReadyError, InvalidParameterError, SplitkeeperError
from splitkeeper_tools.bench.ingest_common import (
    CDC_COLUMNS,
    CDC_SCHEMA,
    DECODES,
    JSON_SCHEMA,
    READERS,
    SINKS,
    cdc_rows,
    expected_cdc_rows,
    merge_available_now,
    pipeline_config,
    reading_batches,
    run_available_now,
    same_typed_rows,
    typed_frame,
    write_cdc_files,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from splitkeeper.config.settings import PipelineConfig

KAFKA_MODULE = "splitkeeper_tools.bench.ingest_kafka"
CHART_FILE = "ingest.html"
PIPELINE_NAME = "bench-ingest"
#: Epoch phases of :attr:`EpochReport.phases`, in the order the runner measures them.
PHASES: tuple[str, ...] = ("plan", "read", "decide", "sink", "state", "retain", "finish")
#: restore after 10 and after 200 checkpoints should be "about equal": within this factor.
RESTORE_EQUAL_FACTOR = 1.5
SMALL_RESTORE_MARK = 10


def _progress(line: str) -> None:
    print(f"[bench ingest] {line}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------------------


def check_counts(owner: object, minimums: Sequence[tuple[str, int]], optional: Sequence[str] = ()) -> None:
    """Raise InvalidParameterError naming the first field of ``owner`` (a settings object, from its
    ``__post_init__``) that is not an integer >= its minimum; ``optional`` fields are None or >= 1."""
    for name, minimum in (*minimums, *((n, 1) for n in optional)):
        value = getattr(owner, name)
        if name in optional and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            unset = " (or unset)" if name in optional else ""
            raise InvalidParameterError(name, value, f"an integer >= {minimum}{unset}")


def check_decode(decode: str) -> None:
    """InvalidParameterError unless ``decode`` is one of :data:`DECODES`."""
    if decode not in DECODES:
        raise InvalidParameterError("decode", decode, " or ".join(DECODES))


def check_readers(readers: str) -> None:
    """InvalidParameterError unless ``readers`` is one of :data:`READERS` (the pipeline setting's values)."""
    if readers not in READERS:
        raise InvalidParameterError("readers", readers, " or ".join(READERS))


@dataclass(frozen=True, slots=True)
class IngestSettings:
    """What to measure. ``epoch_records=None``: half the input (two reading epochs).

    ``restore_checkpoints=0`` skips the restore measurement.
    """

    files: int = 8
    lines: int = 100_000
    line_bytes: int = 100
    parallelism: int = field(default_factory=lambda: os.cpu_count() or 2)
    epoch_records: int | None = None
    repeat: int = 3
    restore_checkpoints: int = 200
    restore_repeat: int = 3
    warmup: bool = True
    content_check: bool = True
    decode: str = "raw"
    sink: str = "append"
    limit: bool = False  # add plain Arrow's read-and-write of the same input (tools/bench/limit.py)
    readers: str = "per_epoch"  # our pipeline's readers setting (the default: a Spark job per epoch)

    def __post_init__(self) -> None:
        check_decode(self.decode)
        check_readers(self.readers)
        if self.sink not in SINKS:
            raise InvalidParameterError("sink", self.sink, " or ".join(SINKS))
        if self.limit and self.sink != "append":
            raise InvalidParameterError(
                "limit", True, "with --sink append", hint="the Arrow limit writes parquet, it has no MERGE"
            )
        check_counts(
            self,
            (
                ("files", 1),
                ("lines", 1),
                ("line_bytes", 8),
                ("parallelism", 1),
                ("repeat", 1),
                ("restore_checkpoints", 0),
                ("restore_repeat", 0),
            ),
            optional=("epoch_records",),
        )

    @property
    def records(self) -> int:
        return self.files * self.lines

    @property
    def records_per_epoch(self) -> int:
        return self.epoch_records if self.epoch_records is not None else math.ceil(self.records / 2)

    @property
    def max_files_per_trigger(self) -> int:
        """The baseline's micro-batch size closest to our epoch size, in whole files."""
        return max(1, round(self.records_per_epoch / self.lines))

    @property
    def restore_marks(self) -> tuple[int, ...]:
        n = self.restore_checkpoints
        return tuple(sorted({m for m in (SMALL_RESTORE_MARK, n) if 1 <= m <= n}))


# ---------------------------------------------------------------------------------------
# measurement helpers
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadFigure:
    """The 1-minute load average while something was measured: mean and max of 1 s samples."""

    mean: float
    max: float
    samples: int

    def text(self) -> str:
        return f"load {self.mean:.1f} (max {self.max:.1f})"


class LoadSampler:
    """Samples ``os.getloadavg()[0]`` every ``interval_s`` in a daemon thread while in a ``with``.

    With ``heartbeat_s`` it also calls ``heartbeat(elapsed_s)`` that often (progress for
    long silent steps). One use per instance.
    """

    def __init__(
        self,
        interval_s: float = 1.0,
        heartbeat_s: float | None = None,
        heartbeat: Callable[[float], None] | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.heartbeat_s = heartbeat_s
        self.heartbeat = heartbeat
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-load", daemon=True)

    def _loop(self) -> None:
        started = time.monotonic()
        beat = started
        while True:
            self._samples.append(os.getloadavg()[0])
            if self._stop.wait(self.interval_s):
                return
            now = time.monotonic()
            if self.heartbeat and self.heartbeat_s and now - beat >= self.heartbeat_s:
                beat = now
                self.heartbeat(now - started)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._samples.append(os.getloadavg()[0])

    @property
    def figure(self) -> LoadFigure:
        samples = self._samples or [os.getloadavg()[0]]
        return LoadFigure(round(statistics.fmean(samples), 2), round(max(samples), 2), len(samples))


class CallTimer:
    """Wall time and call count per wrapped method (inclusive: nested wrapped calls count in both).

    ``patch(cls, names, prefix)`` replaces methods on the class for the ``with`` block and
    restores them afterwards; the wrappers only time. Used by this benchmark around our
    run to attribute the epoch phases to Delta operations. Not thread-safe for nested
    patches of the same method; counts from several threads are fine (a lock guards them).
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def _record(self, label: str, elapsed: float) -> None:
        with self._lock:
            self.seconds[label] = self.seconds.get(label, 0.0) + elapsed
            self.calls[label] = self.calls.get(label, 0) + 1

    @contextlib.contextmanager
    def patch(self, owner: type, names: Sequence[str], prefix: str) -> Iterator[None]:
        originals = {name: owner.__dict__.get(name) for name in names}  # None: inherited

        def wrap(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(fn)
            def timed(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    self._record(label, time.perf_counter() - started)

            return timed

        try:
            for name in originals:
                setattr(owner, name, wrap(f"{prefix}.{name}", getattr(owner, name)))
            yield
        finally:
            for name, fn in originals.items():
                if fn is None:
                    delattr(owner, name)
                else:
                    setattr(owner, name, fn)


def latest_job_id(spark: Any) -> int | None:
    """The id of the newest Spark job of this context (ids are sequential), None if unknown.

    Reads the driver's status store through py4j (an internal API): None when it is
    not reachable, and the job counts are then left out.
    """
    try:
        jobs = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
        size = int(jobs.size())
        if size == 0:
            return -1
        return max(int(jobs.apply(0).jobId()), int(jobs.apply(size - 1).jobId()))
    except Exception:  # noqa: BLE001 - a figure we can do without
        return None


def jobs_between(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before


def job_submissions(spark: Any, after: int | None, through: int | None) -> dict[int, float] | None:
    """Job id -> submission time (seconds since 1970, the driver JVM's clock, which is this host's)
    of the jobs after ``after`` through ``through`` (the driver's status store, py4j; None when
    unknown). Read once a timed run is over: counting jobs per epoch with :func:`latest_job_id`
    marks inside the clock charged our side a status-store listing per epoch (2-3 ms each at load
    5-8, three per files run), which the baseline's side did not pay."""
    if after is None or through is None:
        return None
    try:
        store = spark.sparkContext._jsc.sc().statusStore()
        found: dict[int, float] = {}
        for job_id in range(after + 1, through + 1):
            submitted = store.job(job_id).submissionTime()
            if submitted.isDefined():
                found[job_id] = int(submitted.get().getTime()) / 1000
        return found
    except Exception:  # noqa: BLE001 - a figure we can do without
        return None


def jobs_in(submitted: Mapping[int, float] | None, start: float | None, end: float | None) -> int | None:
    """How many of ``submitted`` (:func:`job_submissions`) were submitted in ``[start, end)`` (None: open)."""
    if submitted is None:
        return None
    return sum(1 for t in submitted.values() if (start is None or t >= start) and (end is None or t < end))


def average_phases(phases: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per phase, the mean seconds over ``phases`` (one mapping per epoch; a missing phase is 0)."""
    names = [p for p in PHASES if any(p in e for e in phases)]
    names += sorted({k for e in phases for k in e} - set(names))
    if not phases:
        return {}
    return {n: round(statistics.fmean(e.get(n, 0.0) for e in phases), 3) for n in names}


def restore_verdict(restore_s: Mapping[int, float]) -> str:
    """One sentence comparing the restore time after the fewest and the most checkpoints.

    "about equal" when the larger is within :data:`RESTORE_EQUAL_FACTOR` of the smaller.
    """
    if len(restore_s) < 2:
        return "restore measured at one checkpoint count only: " + ", ".join(
            f"{s:.2f} s after {n}" for n, s in sorted(restore_s.items())
        )
    (n_small, small), (n_large, large) = min(restore_s.items()), max(restore_s.items())
    factor = large / small if small > 0 else math.inf
    figures = f"{small:.2f} s after {n_small} vs {large:.2f} s after {n_large} checkpoints (x{factor:.2f})"
    if factor <= RESTORE_EQUAL_FACTOR and (small == 0 or small / large <= RESTORE_EQUAL_FACTOR):
        return f"about equal: {figures}; restore does not grow with history"
    if factor > RESTORE_EQUAL_FACTOR:
        return f"NOT equal: {figures}; restore grows with history"
    return f"NOT equal: {figures}; restore after more checkpoints was faster (noise?)"


# ---------------------------------------------------------------------------------------
# input
# ---------------------------------------------------------------------------------------


def _make_files_module() -> Any:
    """``examples/make_files.py`` of this checkout (the project's one input generator)."""
    from splitkeeper import resources

    checkout = resources.require_checkout("bench ingest's input generator examples/make_files.py")
    path = checkout / "examples" / "make_files.py"
    if not path.is_file():
        raise EnvironmentNotReadyError(
            f"splitkeeper-tools bench ingest needs {path}, missing from the checkout",
            path=str(path),
        )
    spec = importlib.util.spec_from_file_location("splitkeeper_examples_make_files", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_input(directory: str, settings: IngestSettings) -> dict[str, int]:
    """Write the input files into ``directory``; return file name -> line count."""
    paths = _make_files_module().write_files(
        directory, settings.files, settings.lines, fmt="jsonl", line_bytes=settings.line_bytes
    )
    return {os.path.basename(p): settings.lines for p in paths}


def _warm_task(_: int) -> int:
    """A Python worker's first import of the staging stack (module-level: pickled by reference)."""
    import splitkeeper.spark.task  # noqa: F401

    return os.getpid()


def warm_workers(spark: Any, task: Callable[[int], int] = _warm_task) -> None:
    """Start Spark's Python workers (one per core) and their imports of ``task``'s module, untimed.

    Called before every run of ours, not only once: Spark ends a Python worker idle for about a
    minute (PySpark's ``PythonWorkerFactory``, ``IDLE_WORKER_TIMEOUT_NS``), which a repetition's
    baseline and checks outlast on a busy machine; our first epoch then timed worker start and
    imports (epoch 1's read phase 10-19 s against 0.9-1.5 s warm, 2 cores at load 26-34) instead of
    ingest, while the baseline's JVM and the limit's processes stay warm."""
    cores = max(1, spark.sparkContext.defaultParallelism)
    spark.sparkContext.parallelize(range(2 * cores), cores).map(task).collect()


def warm_up(spark: Any, directory: str) -> None:
    """Start the Python workers and load Delta's classes once, before either side is timed."""
    warm_workers(spark)
    path = os.path.join(directory, "warmup-delta")
    spark.range(100).selectExpr("id", "cast(id as string) as value").write.format("delta").save(path)
    spark.read.format("delta").load(path).count()
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# the two sides
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OursRun:
    seconds: float
    setup_s: float  # the lease + Pipeline(...) (creates state and sink tables) + open()
    epochs: tuple[dict[str, Any], ...]  # per epoch: epoch, kind, records, elapsed_s, phases, jobs
    committed_records: int
    finished: bool
    checkpoint_commit_ms: tuple[int, ...]  # the checkpoints rows' commit_ms (retained rows)
    calls: dict[str, dict[str, float]]  # label -> {"calls", "seconds"}
    region_task_s: tuple[float, ...]  # every acknowledged region task's own elapsed_s
    setup_jobs: int | None
    jobs: int | None
    load: LoadFigure
    sink_path: str
    changes_path: str | None = None  # --sink upsert: the change table (every record once)


@dataclass(frozen=True, slots=True)
class BaselineRun:
    seconds: float
    batches: int
    batch_ms: dict[str, float]  # mean per micro-batch of Structured Streaming's durationMs entries
    jobs: int | None
    load: LoadFigure
    sink_path: str


def _ours_config(settings: IngestSettings, input_dir: str, root: str) -> PipelineConfig:
    return pipeline_config(
        PIPELINE_NAME,
        root,
        {"kind": "files", "path": input_dir, "format": "lines"},
        parallelism=settings.parallelism,
        epoch_records=settings.records_per_epoch,
        region_timeout_s=3600,
        decode=settings.decode,
        sink=settings.sink,
        readers=settings.readers,
    )


def run_ours(spark: Any, settings: IngestSettings, input_dir: str, root: str, label: str) -> OursRun:
    """Ingest ``input_dir`` with a fresh splitkeeper pipeline under ``root``; time it end to end."""
    from splitkeeper.app.services import leased_pipeline
    from splitkeeper.app.sink import sink_reader
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.sinks.delta.sink import DeltaSink
    from splitkeeper.sinks.port import SinkTable

    config = _ours_config(settings, input_dir, root)
    timer = CallTimer()
    epochs: list[dict[str, Any]] = []
    marks: list[float] = []  # wall clock when open ended, then when each epoch ended (no py4j in the clock)

    def on_epoch(line: str) -> None:
        marks.append(time.time())
        _progress(f"{label}: {line}")

    store_ops = (
        "_claim_pipeline",
        "write_plan",
        "latest_plan_epoch",
        "write_decision",
        "commit_checkpoint",
        "kept",
        "retain",
        "compact",
        "latest_checkpoint",
        "ref_chain",
    )
    sink_ops = ("commit", "committed_epoch", "committed_metadata", "discard", "discard_through")
    with contextlib.ExitStack() as stack:
        stack.enter_context(timer.patch(DeltaStateStore, store_ops, "state_store"))
        stack.enter_context(timer.patch(DeltaSink, sink_ops, "sink"))
        warm_workers(spark)  # the Python workers Spark ended since the last run, outside the clock
        first_job = latest_job_id(spark)
        sampler = stack.enter_context(LoadSampler())
        started = time.perf_counter()
        with leased_pipeline(config, spark, progress=on_epoch, metrics=False) as pipeline:
            pipeline.open()
            setup_s = time.perf_counter() - started
            marks.insert(0, time.time())
            summary = pipeline.run()
        seconds = time.perf_counter() - started
    load = sampler.figure
    submitted = job_submissions(spark, first_job, latest_job_id(spark))
    # every acknowledged region task's own time, as the region runner measured it (EpochReport)
    task_seconds = [float(s) for report in summary.epochs for s in report.region_task_s.values()]
    for i, report in enumerate(summary.epochs):
        epochs.append(
            {
                "epoch": report.epoch,
                "kind": report.kind.value,
                "records": report.committed_records,
                "elapsed_s": report.elapsed_s,
                "phases": dict(report.phases),
                "final": report.final,
                "jobs": jobs_in(submitted, marks[i], marks[i + 1]) if i + 1 < len(marks) else None,
            }
        )
    commit_ms = tuple(e.commit_ms for e in pipeline.store.history.timeline() if e.commit_ms is not None)
    reader = sink_reader(config)
    return OursRun(
        seconds=round(seconds, 3),
        setup_s=round(setup_s, 3),
        epochs=tuple(epochs),
        committed_records=summary.committed_records,
        finished=summary.finished,
        checkpoint_commit_ms=commit_ms,
        calls={
            k: {"calls": timer.calls[k], "seconds": round(v, 3)} for k, v in sorted(timer.seconds.items())
        },
        region_task_s=tuple(round(s, 3) for s in task_seconds),
        setup_jobs=jobs_in(submitted, None, marks[0]),
        jobs=jobs_in(submitted, None, marks[-1]),
        load=load,
        sink_path=str(reader.location(SinkTable.KEYED if reader.upsert else SinkTable.RECORDS)),
        changes_path=reader.location(SinkTable.RECORDS) if reader.upsert else None,
    )


def run_baseline(spark: Any, settings: IngestSettings, input_dir: str, root: str, label: str) -> BaselineRun:
    """Ingest ``input_dir`` with Structured Streaming (text source, Delta sink, availableNow); with
    ``--decode json`` the lines are parsed with ``from_json`` into the typed columns; with ``--sink
    upsert`` into the CDC columns, merged per micro-batch (``foreachBatch`` + Delta ``MERGE``)."""
    sink_path = os.path.join(root, "sink")
    checkpoint = os.path.join(root, "checkpoint")
    first_job = latest_job_id(spark)
    with LoadSampler() as sampler:
        started = time.perf_counter()
        lines = (
            spark.readStream.format("text")
            .option("maxFilesPerTrigger", settings.max_files_per_trigger)
            .load(input_dir)
        )
        name = f"bench_ingest_baseline_{os.getpid()}_{int(started * 1000)}"
        if settings.sink == "upsert":
            frame = typed_frame(lines, "value", (), CDC_SCHEMA, CDC_COLUMNS)
            query = merge_available_now(frame, sink_path, checkpoint, name)
        else:
            if settings.decode == "json":
                frame = typed_frame(lines, "value", (("split_id", "_metadata.file_name"),))
            else:
                frame = lines.selectExpr("value", "_metadata.file_name AS split_id")
            query = run_available_now(frame, sink_path, checkpoint, name)
        seconds = time.perf_counter() - started
    progress = reading_batches(query, label)
    _progress(f"{label}: {len(progress)} micro-batches in {seconds:.2f}s")
    return BaselineRun(
        seconds=round(seconds, 3),
        batches=len(progress),
        batch_ms=mean_durations_ms(progress),
        jobs=jobs_between(first_job, latest_job_id(spark)),
        load=sampler.figure,
        sink_path=sink_path,
    )


def mean_durations_ms(progress: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per ``durationMs`` entry (addBatch, triggerExecution, ...), its mean over the micro-batches."""
    durations: dict[str, list[float]] = {}
    for p in progress:
        for key, value in (p.get("durationMs") or {}).items():
            durations.setdefault(key, []).append(float(value))
    return {k: round(statistics.fmean(v), 1) for k, v in sorted(durations.items())}


# ---------------------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SinkCheck:
    records: int
    wrong_splits: dict[str, int]  # split id -> records found, where it differs from the file's lines
    duplicates: int | None  # (split_id, offset) keys held more than once; None without offsets

    @property
    def exact(self) -> bool:
        return not self.wrong_splits and not self.duplicates


def check_sink(path: str, expected: Mapping[str, int], with_offsets: bool) -> SinkCheck:
    """Count the sink's records, per split against ``expected``, and duplicate offsets if it has them
    (either side's table read with :func:`splitkeeper.sinks.delta.read.read_sink`, no Spark)."""
    import pyarrow.compute as pc

    from splitkeeper.sinks.delta.read import read_sink

    rows = read_sink(path, ["split_id", "offset"] if with_offsets else ["split_id"])
    counted = rows.group_by("split_id").aggregate([([], "count_all")])
    per_split = dict(zip(counted["split_id"].to_pylist(), counted["count_all"].to_pylist(), strict=True))
    wrong = {
        sid: per_split.get(sid, 0)
        for sid in sorted(set(expected) | set(per_split))
        if per_split.get(sid, 0) != expected.get(sid, 0)
    }
    duplicates = None
    if with_offsets:
        keys = rows.group_by(["split_id", "offset"]).aggregate([([], "count_all")])
        duplicates = int(pc.sum(pc.greater(keys["count_all"], 1)).as_py() or 0)
    return SinkCheck(sum(per_split.values()), wrong, duplicates)


def check_keyed(
    expected: Mapping[str, int], rows: pa.Table, ours: OursRun, base: BaselineRun
) -> tuple[SinkCheck, SinkCheck, bool]:
    """``--sink upsert``'s checks: our change table holds every record once (per split, no duplicate
    offsets) and both keyed tables hold exactly ``rows``, the generator's latest record of every
    live key (:func:`~splitkeeper_tools.bench.ingest_common.cdc_rows`); the third value says whether
    both keyed tables are equal."""
    from deltalake import DeltaTable

    from splitkeeper.sinks.delta.read import read_sink

    assert ours.changes_path is not None
    ours_check = check_sink(ours.changes_path, expected, with_offsets=True)
    mine = cdc_rows(read_sink(ours.sink_path, list(CDC_COLUMNS)))
    theirs = cdc_rows(DeltaTable(base.sink_path).to_pyarrow_table(columns=list(CDC_COLUMNS)))
    if not mine.equals(rows):
        ours_check = SinkCheck(
            ours_check.records,
            {**ours_check.wrong_splits, "keyed table": mine.num_rows},
            ours_check.duplicates,
        )
    base_check = SinkCheck(
        theirs.num_rows, {} if theirs.equals(rows) else {"keyed table": theirs.num_rows}, None
    )
    return ours_check, base_check, bool(mine.equals(theirs))


def same_values(ours: str, baseline: str) -> bool:
    """True when both sinks hold the same multiset of ``value`` (call only with equal counts)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from splitkeeper.sinks.delta.read import read_sink

    def values(path: str) -> pa.Array:
        column = read_sink(path, ["value"]).column("value").cast(pa.large_string()).combine_chunks()
        return column.take(pc.sort_indices(column))

    return bool(values(ours).equals(values(baseline)))


# ---------------------------------------------------------------------------------------
# restore
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RestoreSample:
    """One restore as a restarted driver does it: a fresh store, then ``latest_checkpoint()``."""

    checkpoints: int  # how many checkpoints the store had committed
    open_s: float  # a fresh DeltaStateStore(...) (no table loaded yet)
    restore_s: float  # latest_checkpoint()
    load: float  # 1-minute load average right after


@dataclass(frozen=True, slots=True)
class RestoreFigures:
    """Restore time per checkpoint count: medians of the interleaved samples (or, with no
    samples, :func:`measure_state_store`'s single measurement)."""

    restore_s: dict[int, float]
    open_s: dict[int, float]
    samples: tuple[RestoreSample, ...]
    measure_restore_s: dict[int, float]  # measure_state_store's own single sample per mark
    commit_ms_median: float
    retain_ms_median: float
    seconds: float
    load: LoadFigure


def _time_restore(root: str, checkpoints: int) -> RestoreSample:
    """Restore the store :func:`measure_state_store` wrote at ``root`` (its pipeline is
    ``measure``, its fingerprint ``synthetic``) the way that function times it."""
    from splitkeeper.delta.checkpoints import DeltaStateStore

    t0 = time.perf_counter()
    store = DeltaStateStore(root, "measure", "synthetic")
    t1 = time.perf_counter()
    restored = store.latest_checkpoint()
    t2 = time.perf_counter()
    if restored is None or restored.checkpoint_id != checkpoints:
        found = None if restored is None else restored.checkpoint_id
        raise SplitkeeperError(
            f"restore measurement: expected checkpoint {checkpoints} at {root}, got {found}"
        )
    return RestoreSample(checkpoints, round(t1 - t0, 3), round(t2 - t1, 3), round(os.getloadavg()[0], 2))


def measure_restore(spark: Any, root: str, settings: IngestSettings) -> RestoreFigures:
    """Restore time after 10 and after ``restore_checkpoints`` checkpoints, under ``root``.

    :func:`measure_state_store` commits the checkpoints (and times commits and a restore
    at each mark, once). A second store with 10 checkpoints is written beside it; then
    both are restored ``restore_repeat`` times, alternating which goes first, so both
    counts are sampled under the same (drifting) machine load.
    """
    from splitkeeper_tools.bench.state import measure_state_store

    n = settings.restore_checkpoints
    _progress(
        f"state store: committing {n} synthetic checkpoints, restore timed after "
        + ", ".join(str(m) for m in settings.restore_marks)
    )
    started = time.perf_counter()
    roots = {n: os.path.join(root, f"after-{n}")}
    with LoadSampler(
        heartbeat_s=30, heartbeat=lambda s: _progress(f"state store: still measuring ({s:.0f}s)")
    ) as sampler:
        measured = measure_state_store(roots[n], checkpoints=n, marks=settings.restore_marks)
        if n > SMALL_RESTORE_MARK and settings.restore_repeat > 0:
            roots[SMALL_RESTORE_MARK] = os.path.join(root, f"after-{SMALL_RESTORE_MARK}")
            measure_state_store(
                roots[SMALL_RESTORE_MARK], checkpoints=SMALL_RESTORE_MARK, marks=(SMALL_RESTORE_MARK,)
            )
        samples: list[RestoreSample] = []
        for k in range(settings.restore_repeat):
            for count in sorted(roots, reverse=k % 2 == 1):
                samples.append(_time_restore(roots[count], count))
    measure_restore_s = {k: v / 1000 for k, v in measured.restore_ms.items()}
    if samples:
        restore_s = {c: rounded_median([x.restore_s for x in samples if x.checkpoints == c]) for c in roots}
        open_s = {c: rounded_median([x.open_s for x in samples if x.checkpoints == c]) for c in roots}
    else:
        restore_s = measure_restore_s
        open_s = {k: v / 1000 for k, v in measured.open_ms.items()}
    return RestoreFigures(
        restore_s=dict(sorted(restore_s.items())),
        open_s=dict(sorted(open_s.items())),
        samples=tuple(samples),
        measure_restore_s=measure_restore_s,
        commit_ms_median=float(statistics.median(measured.total_commit_ms)),
        retain_ms_median=float(statistics.median(measured.retain_ms)) if measured.retain_ms else 0.0,
        seconds=round(time.perf_counter() - started, 1),
        load=sampler.figure,
    )


# ---------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------


def bench_spark() -> Any:
    """The running session if there is one (tests, notebooks), else a new one from the environment."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    from splitkeeper.spark.session import SparkSettings, get_spark

    spark = get_spark(SparkSettings.from_env(ui_enabled=False, shuffle_partitions=os.cpu_count() or 2))
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def rounded_median(values: Sequence[float]) -> float:
    return round(float(statistics.median(values)), 3)


def bench_ingest(settings: IngestSettings, work_dir: str, spark: Any | None = None) -> dict[str, Any]:
    """Run the benchmark under ``work_dir`` (input, sinks, state) and return its figures."""
    spark = spark or bench_spark()
    load_start = [round(x, 2) for x in os.getloadavg()]
    input_dir = os.path.join(work_dir, "input")
    shutil.rmtree(input_dir, ignore_errors=True)
    t0 = time.perf_counter()
    verify = None
    if settings.sink == "upsert":
        expected, keyed = write_cdc_files(input_dir, settings.files, settings.lines, settings.line_bytes)
        verify = functools.partial(check_keyed, expected, expected_cdc_rows(keyed))
        _progress(f"keyed change records: {len(keyed):,} live keys at the end (upserts and deletes by id)")
    else:
        expected = make_input(input_dir, settings)
    input_bytes = sum(os.path.getsize(os.path.join(input_dir, f)) for f in expected)
    _progress(
        f"input: {settings.files} files x {settings.lines:,} lines = {settings.records:,} records, "
        f"{input_bytes / 1e6:.1f} MB, written in {time.perf_counter() - t0:.1f}s; "
        f"epoch {settings.records_per_epoch:,} records, maxFilesPerTrigger {settings.max_files_per_trigger}, "
        f"parallelism {settings.parallelism}"
    )
    if settings.warmup:
        warm_up(spark, work_dir)
        _progress("warm-up done (Python workers started, Delta loaded)")

    reps = run_repetitions(
        spark,
        settings.repeat,
        work_dir,
        lambda rep_dir: {  # each called with its label
            "ours": functools.partial(run_ours, spark, settings, input_dir, os.path.join(rep_dir, "ours")),
            "baseline": functools.partial(
                run_baseline, spark, settings, input_dir, os.path.join(rep_dir, "baseline")
            ),
            **(
                {"limit": functools.partial(run_limit, settings, input_dir, os.path.join(rep_dir, "limit"))}
                if settings.limit
                else {}
            ),
        },
        expected,
        baseline_offsets=False,  # the text source has no offsets
        content_check=settings.content_check,
        typed=settings.decode == "json",
        ours_row=lambda ours: {
            "ours_finished": ours.finished,
            "ours_calls": ours.calls,
            "ours_region_task_s": list(ours.region_task_s),
            "ours_checkpoint_commit_ms": list(ours.checkpoint_commit_ms),
        },
        ours_complete=lambda ours: bool(ours.finished),
        verify=verify,
    )

    restore: RestoreFigures | None = None
    if settings.restore_checkpoints > 0:
        restore_root = os.path.join(work_dir, "restore")
        shutil.rmtree(restore_root, ignore_errors=True)
        restore = measure_restore(spark, restore_root, settings)
        shutil.rmtree(restore_root, ignore_errors=True)
        _progress(f"state store: {restore_verdict(restore.restore_s)}; {restore.load.text()}")

    result = _result(
        settings,
        input_bytes,
        reps.ours,
        reps.baseline,
        reps.runs,
        restore,
        reps.exact,
        reps.content_equal,
        load_start,
    )
    if reps.limit:
        result.update(limit_figures(settings.records, result["ours_s"], reps.limit))
    return result


def run_limit(settings: IngestSettings, input_dir: str, out_dir: str, label: str) -> Any:
    """The Arrow limit of one repetition (:func:`splitkeeper_tools.bench.limit.arrow_limit`)."""
    from splitkeeper_tools.bench.limit import arrow_limit

    schema = JSON_SCHEMA if settings.decode == "json" else None
    return arrow_limit(input_dir, out_dir, schema, LoadSampler())


def limit_figures(records: int, ours_s: float, limit_runs: Sequence[Any]) -> dict[str, Any]:
    """The result keys of ``--limit``: the limit's median seconds and rate, and ours / limit
    (the limit runs warm workers, one per core: ``limit_processes``)."""
    limit_s = rounded_median([r.seconds for r in limit_runs])
    return {
        "limit_s": limit_s,
        "limit_records_per_s": round(records / limit_s, 1),
        "limit_processes": max(r.processes for r in limit_runs),
        "limit_warm": True,
        "limit_load": round(statistics.fmean(r.load.mean for r in limit_runs), 2),
        # how many times the floor our run takes (1.0: as fast as plain Arrow; lower is better)
        "ours_over_limit": round(ours_s / limit_s, 3),
    }


@dataclass(frozen=True, slots=True)
class Repetitions:
    """Both sides' runs of every repetition, their JSON ``runs`` entries and the checks' outcome."""

    ours: tuple[Any, ...]
    baseline: tuple[Any, ...]
    runs: tuple[dict[str, Any], ...]
    exact: bool  # every repetition: both sinks exact, ours complete, equal values where compared
    content_equal: bool | None  # the first repetition's comparison of values; None: not compared
    limit: tuple[Any, ...] = ()  # the Arrow limit's runs, when a "limit" side was given


def run_repetitions(
    spark: Any,
    repeat: int,
    work_dir: str,
    sides: Callable[[str], Mapping[str, Callable[[str], Any]]],
    expected: Mapping[str, int],
    *,
    baseline_offsets: bool,
    content_check: bool,
    ours_row: Callable[[Any], dict[str, Any]] | None = None,
    ours_complete: Callable[[Any], bool] | None = None,
    typed: bool = False,
    say: Callable[[str], None] = _progress,
    verify: Callable[[Any, Any], tuple[SinkCheck, SinkCheck, bool]] | None = None,
) -> Repetitions:
    """Run ``repeat`` repetitions of both sides, each in a fresh ``<work_dir>/rep<N>`` (removed after).

    ``sides(rep_dir)`` maps "ours" and "baseline" (and optionally "limit", the Arrow limit) to
    callables taking the run's label and returning a run (with ``seconds``, ``setup_s``, ``load``,
    ``sink_path``, ...); the order rotates every repetition (ours first in the first), so no side
    always runs warm. A limit run's rows per file (split) must equal ``expected``, and its
    ``content_equal`` must not be False. After each repetition
    both sinks are checked against ``expected`` (split id -> records; duplicate ``(split_id, offset)`` in the
    baseline only with ``baseline_offsets``) and, in the first with ``content_check``, compared
    by value (``typed``: by their typed rows, :func:`same_typed_rows`). ``ours_row`` adds figures
    of our run to its repetition's entry; ``ours_complete`` says whether our run finished its
    input (default: yes). ``verify(ours, base)`` replaces both sink checks and the comparison
    (``--sink upsert``: :func:`check_keyed`).
    """
    records = sum(expected.values())
    ours_runs: list[Any] = []
    base_runs: list[Any] = []
    runs: list[dict[str, Any]] = []
    limit_runs: list[Any] = []
    exact = True
    content_equal: bool | None = None
    for rep in range(1, repeat + 1):
        rep_dir = os.path.join(work_dir, f"rep{rep}")
        shutil.rmtree(rep_dir, ignore_errors=True)
        run_side = sides(rep_dir)
        names = ("ours", "baseline", *(s for s in run_side if s not in ("ours", "baseline")))
        shift = (rep - 1) % len(names)
        order = names[shift:] + names[:shift]
        done: dict[str, Any] = {}
        for side in order:
            label = f"rep {rep}/{repeat} {side}"
            say(f"{label}: start ({os.getloadavg()[0]:.1f} load)")
            done[side] = run_side[side](label)
            say(f"{label}: {done[side].seconds:.2f}s, {done[side].load.text()}")
        ours, base = done["ours"], done["baseline"]
        if verify is not None:
            ours_check, base_check, equal = verify(ours, base)
            if rep == 1 and content_check:
                content_equal = equal
        else:
            ours_check = check_sink(ours.sink_path, expected, with_offsets=True)
            base_check = check_sink(base.sink_path, expected, with_offsets=baseline_offsets)
        if verify is None and rep == 1 and content_check and ours_check.records == base_check.records:
            compare = same_typed_rows if typed else same_values
            content_equal = compare(ours.sink_path, base.sink_path)
        complete = ours_complete is None or ours_complete(ours)
        limit = done.get("limit")
        limit_ok = limit is None or (limit.rows == dict(expected) and limit.content_equal is not False)
        sinks_ok = ours_check.exact and base_check.exact and limit_ok
        rep_ok = sinks_ok and complete and content_equal is not False
        exact = exact and rep_ok
        ours_runs.append(ours)
        base_runs.append(base)
        row = _repetition_row(rep, order, records, ours, base, ours_check, base_check, rep_ok, say)
        if limit is not None:
            limit_runs.append(limit)
            row |= {
                "limit_s": limit.seconds,
                "limit_records_per_s": round(records / limit.seconds, 1),
                "limit_load": limit.load.mean,
                "limit_rows": sum(limit.rows.values()),
                "limit_content_equal": limit.content_equal,
            }
        runs.append({**row, **(ours_row(ours) if ours_row else {})})
        shutil.rmtree(rep_dir, ignore_errors=True)
    return Repetitions(
        tuple(ours_runs), tuple(base_runs), tuple(runs), exact, content_equal, tuple(limit_runs)
    )


def _repetition_row(
    rep: int,
    order: Sequence[str],
    records: int,
    ours: Any,
    base: Any,
    ours_check: SinkCheck,
    base_check: SinkCheck,
    exact: bool,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """One repetition's entry of the JSON ``runs`` list; says what the sinks hold."""
    base_dups = "" if base_check.duplicates is None else f", {base_check.duplicates} duplicate offsets"
    say(
        f"rep {rep}: sinks hold {ours_check.records:,} (ours, {ours_check.duplicates} duplicate offsets) "
        f"and {base_check.records:,} (baseline{base_dups}) of {records:,} records"
        + ("" if exact else f"; NOT EXACT: ours {ours_check.wrong_splits} baseline {base_check.wrong_splits}")
    )
    return {
        "rep": rep,
        "order": list(order),
        "ours_s": ours.seconds,
        "ours_setup_s": ours.setup_s,
        "ours_records_per_s": round(records / ours.seconds, 1),
        "ours_load": ours.load.mean,
        "ours_sink_records": ours_check.records,
        "ours_duplicates": ours_check.duplicates,
        "ours_epochs": list(ours.epochs),
        "ours_jobs": ours.jobs,
        "ours_setup_jobs": ours.setup_jobs,
        "baseline_s": base.seconds,
        "baseline_records_per_s": round(records / base.seconds, 1),
        "baseline_load": base.load.mean,
        "baseline_sink_records": base_check.records,
        "baseline_duplicates": base_check.duplicates,
        "baseline_batches": base.batches,
        "baseline_batch_ms": base.batch_ms,
        "baseline_jobs": base.jobs,
        "exact": exact,
    }


def decode_figures(decode: str, readers: str = "per_epoch") -> dict[str, Any]:
    """The result keys saying how records were decoded (both sides alike) and how our region tasks
    started (``readers``, the pipeline setting)."""
    return {"decode": decode, "schema": JSON_SCHEMA if decode == "json" else None, "readers": readers}


def sink_figures(sink: str) -> dict[str, Any]:
    """The result keys saying what both sides wrote: ``sink`` and, for upsert, the CDC schema."""
    if sink == "upsert":
        return {"sink": "upsert", "decode": "json", "schema": CDC_SCHEMA}
    return {"sink": "append"}


def decode_text(result: Mapping[str, Any]) -> str:
    """How both sides decoded the records (and, when not the default, how our region tasks started),
    for the report's first line."""
    readers = result.get("readers", "per_epoch")
    ours = "" if readers == "per_epoch" else f"; ours with readers {readers}"
    if result.get("sink") == "upsert":
        return (
            f"sink upsert: keyed change records ({result['schema']}; 20% updates, 2% deletes), ours "
            f"sink.mode upsert (one MERGE per epoch), baseline foreachBatch + Delta MERGE{ours}"
        )
    if result.get("decode", "raw") == "json":
        return f"decode json ({result['schema']}; baseline: from_json, same schema){ours}"
    return f"decode raw (one value column){ours}"


def _median_or_none(values: Sequence[int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return rounded_median(known) if known else None


def throughput_figures(
    records: int, ours_runs: Sequence[Any], base_runs: Sequence[Any], runs: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The result keys both ingest benchmarks compute alike: medians, rates and their ratio, our
    setup, where one of our runs' time goes, the baseline's micro-batches, job counts, sink counts
    and load. Our runs have ``seconds``, ``setup_s``, ``epochs`` (dicts with ``elapsed_s`` and
    ``phases``), ``jobs``, ``setup_jobs``, ``load``; the baseline's ``seconds``, ``batches``,
    ``batch_ms``, ``jobs``, ``load``; ``runs`` are :func:`run_repetitions` entries."""
    ours_s = rounded_median([r.seconds for r in ours_runs])
    base_s = rounded_median([r.seconds for r in base_runs])
    ours_rps = round(records / ours_s, 1)
    base_rps = round(records / base_s, 1)
    all_epochs = [e for r in ours_runs for e in r.epochs]
    n = len(ours_runs)
    # Where one run's wall time goes (means over the repetitions).
    breakdown = {"setup (tables, open)": round(statistics.fmean(r.setup_s for r in ours_runs), 3)}
    for phase in PHASES:
        total = sum(e["phases"].get(phase, 0.0) for e in all_epochs) / n
        if total > 0:
            breakdown[f"epochs: {phase}"] = round(total, 3)
    accounted = sum(breakdown.values())
    breakdown["other (run loop, close)"] = round(
        max(0.0, statistics.fmean(r.seconds for r in ours_runs) - accounted), 3
    )
    base_batch: dict[str, list[float]] = {}
    for b in base_runs:
        for k, v in b.batch_ms.items():
            base_batch.setdefault(k, []).append(v)
    after_setup_s = rounded_median([r.seconds - r.setup_s for r in ours_runs])
    return {
        "ours_s": ours_s,
        "baseline_s": base_s,
        "ours_records_per_s": ours_rps,
        "baseline_records_per_s": base_rps,
        "ratio": round(ours_rps / base_rps, 4),
        "ours_setup_s": rounded_median([r.setup_s for r in ours_runs]),
        # the same runs without the one-time setup (creating the state and sink tables, open)
        "ours_after_setup_s": after_setup_s,
        "ours_records_per_s_after_setup": round(records / max(1e-9, after_setup_s), 1),
        "ours_epochs_per_run": round(len(all_epochs) / n, 1),
        "ours_epoch_s_avg": round(statistics.fmean(e["elapsed_s"] for e in all_epochs), 3),
        "ours_phases_avg_s": average_phases([e["phases"] for e in all_epochs]),
        "ours_run_breakdown_s": breakdown,
        "ours_jobs_per_run": _median_or_none([r.jobs for r in ours_runs]),
        "ours_setup_jobs": _median_or_none([r.setup_jobs for r in ours_runs]),
        "baseline_batches_per_run": round(statistics.fmean(r.batches for r in base_runs), 1),
        "baseline_batch_ms_avg": {k: round(statistics.fmean(v), 1) for k, v in sorted(base_batch.items())},
        "baseline_jobs_per_run": _median_or_none([r.jobs for r in base_runs]),
        "ours_sink_records": runs[-1]["ours_sink_records"],
        "baseline_sink_records": runs[-1]["baseline_sink_records"],
        "ours_duplicates": max((r["ours_duplicates"] or 0) for r in runs),
        "load_avg": {
            "ours": round(statistics.fmean(r.load.mean for r in ours_runs), 2),
            "ours_max": max(r.load.max for r in ours_runs),
            "baseline": round(statistics.fmean(r.load.mean for r in base_runs), 2),
            "baseline_max": max(r.load.max for r in base_runs),
            "cpus": os.cpu_count(),
        },
        "runs": list(runs),
    }


def _result(
    settings: IngestSettings,
    input_bytes: int,
    ours_runs: Sequence[OursRun],
    base_runs: Sequence[BaselineRun],
    runs: Sequence[dict[str, Any]],
    restore: RestoreFigures | None,
    checks_ok: bool,
    content_equal: bool | None,
    load_start: list[float],
) -> dict[str, Any]:
    figures = throughput_figures(settings.records, ours_runs, base_runs, runs)
    all_epochs = [e for r in ours_runs for e in r.epochs]
    reading = [e for e in all_epochs if not e["final"]]
    n = len(ours_runs)
    calls: dict[str, dict[str, float]] = {}
    for r in ours_runs:
        for label, fig in r.calls.items():
            slot = calls.setdefault(label, {"calls": 0.0, "seconds": 0.0})
            slot["calls"] += fig["calls"] / n
            slot["seconds"] += fig["seconds"] / n
    calls = {
        k: {"calls": round(v["calls"], 1), "seconds": round(v["seconds"], 3)}
        for k, v in sorted(calls.items(), key=lambda kv: -kv[1]["seconds"])
    }
    tasks = [s for r in ours_runs for s in r.region_task_s]
    read_total = sum(e["phases"].get("read", 0.0) for e in all_epochs)
    row_commit_ms = [ms for r in ours_runs for ms in r.checkpoint_commit_ms]
    state_phase = [e["phases"].get("state", 0.0) for e in all_epochs]
    epoch_jobs = [e["jobs"] for e in all_epochs if e["jobs"] is not None]
    result: dict[str, Any] = {
        **figures,
        "benchmark": "ingest",
        "source": "files",
        **decode_figures(settings.decode, settings.readers),
        **sink_figures(settings.sink),
        "records": settings.records,
        "files": settings.files,
        "lines_per_file": settings.lines,
        "input_bytes": input_bytes,
        "parallelism": settings.parallelism,
        "epoch_records": settings.records_per_epoch,
        "max_files_per_trigger": settings.max_files_per_trigger,
        "repeat": settings.repeat,
        "ours_reading_epochs_per_run": round(len(reading) / n, 1),
        "ours_reading_phases_avg_s": average_phases([e["phases"] for e in reading]),
        "ours_final_epoch_s_avg": round(statistics.fmean(e["elapsed_s"] for e in all_epochs if e["final"]), 3)
        if any(e["final"] for e in all_epochs)
        else None,
        "ours_calls": calls,
        "ours_region_task_s_avg": round(statistics.fmean(tasks), 3) if tasks else None,
        "ours_region_task_share_of_read": round(sum(tasks) / settings.parallelism / read_total, 3)
        if read_total > 0
        else None,
        "ours_jobs_per_epoch_avg": round(statistics.fmean(epoch_jobs), 1) if epoch_jobs else None,
        "state_commit_ms_avg": round(1000 * statistics.fmean(state_phase), 1),
        "state_commit_row_ms_avg": round(statistics.fmean(row_commit_ms), 1) if row_commit_ms else None,
        "content_equal": content_equal,
        "exact": checks_ok,
        "restore_checkpoints": settings.restore_checkpoints if restore else 0,
        "restore_s_after_10": None,
        "restore_s_after_200": None,
        "restore_s_by_checkpoints": {},
        "restore_open_s_by_checkpoints": {},
        "restore_samples": [],
        "restore_verdict": None,
        "restore_measure_commit_ms_median": None,
        "load_avg": {
            **figures["load_avg"],
            "start": load_start,
            "restore": None if restore is None else restore.load.mean,
            "end": [round(x, 2) for x in os.getloadavg()],
        },
    }
    if restore is not None:
        result.update(
            {
                "restore_s_after_10": restore.restore_s.get(10),
                "restore_s_after_200": restore.restore_s.get(200),
                "restore_s_by_checkpoints": {str(k): v for k, v in sorted(restore.restore_s.items())},
                "restore_open_s_by_checkpoints": {str(k): v for k, v in sorted(restore.open_s.items())},
                "restore_samples": [
                    {
                        "checkpoints": x.checkpoints,
                        "open_s": x.open_s,
                        "restore_s": x.restore_s,
                        "load": x.load,
                    }
                    for x in restore.samples
                ],
                "restore_measure_single_s": {str(k): v for k, v in sorted(restore.measure_restore_s.items())},
                "restore_verdict": restore_verdict(restore.restore_s),
                "restore_measure_commit_ms_median": restore.commit_ms_median,
                "restore_measure_retain_ms_median": restore.retain_ms_median,
                "restore_measure_s": restore.seconds,
            }
        )
    return result


# ---------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------


def _seconds_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _load_text(value: float | None) -> str:
    return "load -" if value is None else f"load {value:.1f}"


def ordered_phases(phases: Mapping[str, float]) -> list[tuple[str, float]]:
    """``phases`` in the runner's order (JSON may have sorted the keys)."""
    known = [(p, phases[p]) for p in PHASES if p in phases]
    return known + sorted((k, v) for k, v in phases.items() if k not in PHASES)


def _breakdown_items(breakdown: Mapping[str, float]) -> list[tuple[str, float]]:
    """Setup first, then the phases in the runner's order, then the rest."""
    rank = {"setup (tables, open)": -1, **{f"epochs: {p}": i for i, p in enumerate(PHASES)}}
    return sorted(breakdown.items(), key=lambda kv: (rank.get(kv[0], len(PHASES)), kv[0]))


def _call_items(calls: Mapping[str, Mapping[str, float]]) -> list[tuple[str, Mapping[str, float]]]:
    """Most expensive first."""
    return sorted(calls.items(), key=lambda kv: (-kv[1]["seconds"], kv[0]))


def rate_lines(result: Mapping[str, Any]) -> list[str]:
    """The throughput table of both ingest benchmarks' reports: seconds, records/s, load, ratio,
    ours without setup, then one line with every repetition."""
    load = result["load_avg"]
    return [
        "",
        f"{'':<30}{'records':>10}{'seconds':>10}{'records/s':>12}  load avg (1 min, mean/max while timed)",
        f"{'splitkeeper (median)':<30}{result['ours_sink_records']:>10,}{result['ours_s']:>10.2f}"
        f"{result['ours_records_per_s']:>12,.0f}  {load['ours']:.1f} / {load['ours_max']:.1f}",
        f"{'Structured Streaming (median)':<30}{result['baseline_sink_records']:>10,}"
        f"{result['baseline_s']:>10.2f}"
        f"{result['baseline_records_per_s']:>12,.0f}  {load['baseline']:.1f} / {load['baseline_max']:.1f}",
        f"{'ratio ours / baseline':<30}{'':>20}{result['ratio']:>12.3f}",
        *(
            [
                f"{'Arrow limit (median)':<30}{result['runs'][-1]['limit_rows']:>10,}"
                f"{result['limit_s']:>10.2f}"
                f"{result['limit_records_per_s']:>12,.0f}  {result['limit_load']:.1f}  "
                f"({result['limit_processes']} processes, no protocol, no Spark)",
                f"{'ours / limit (seconds)':<30}{'':>20}{result['ours_over_limit']:>12.3f}",
            ]
            if "ours_over_limit" in result
            else []
        ),
        f"{'splitkeeper without setup':<30}{'':>10}{result['ours_after_setup_s']:>10.2f}"
        f"{result['ours_records_per_s_after_setup']:>12,.0f}  (setup: state + sink tables, open: "
        f"{result['ours_setup_s']:.2f}s median)",
        "",
        "per repetition: "
        + "; ".join(
            f"#{r['rep']} ours {r['ours_s']:.1f}s ({_load_text(r['ours_load'])}) "
            f"baseline {r['baseline_s']:.1f}s ({_load_text(r['baseline_load'])})"
            for r in result["runs"]
        ),
    ]


def breakdown_lines(result: Mapping[str, Any]) -> list[str]:
    """Where one of our runs' wall time goes (``ours_run_breakdown_s``), a line per part."""
    return ["one run's wall time (mean s):"] + [
        f"  {label:<34}{value:>8.2f} s" for label, value in _breakdown_items(result["ours_run_breakdown_s"])
    ]


def render_table(result: Mapping[str, Any]) -> str:
    """The human-readable report (what ``run`` prints without ``--json``)."""
    load = result["load_avg"]
    lines = [
        f"input: {result['files']} files x {result['lines_per_file']:,} lines = "
        f"{result['records']:,} records ({result['input_bytes'] / 1e6:.1f} MB); "
        f"epoch {result['epoch_records']:,} records, "
        f"maxFilesPerTrigger {result['max_files_per_trigger']}, parallelism {result['parallelism']}, "
        f"{result['repeat']} repetition(s), {load['cpus']} cpus; {decode_text(result)}",
        *rate_lines(result),
        f"checks: exactly the input count in both sinks, per file: {result['exact']}; "
        f"duplicate (split_id, offset) in ours: {result['ours_duplicates']}; "
        f"same {'typed rows' if result.get('decode') == 'json' else 'values'} in both: "
        f"{result['content_equal']}",
        "",
        f"our epochs: {result['ours_epochs_per_run']} per run "
        f"({result['ours_reading_epochs_per_run']} reading, the last one's global checkpoint ends the run "
        f"unless an empty final epoch follows), {result['ours_epoch_s_avg']:.2f}s each on average, "
        f"final (empty) epoch {_seconds_text(result['ours_final_epoch_s_avg'])}; Spark jobs per run "
        f"{result['ours_jobs_per_run']} (setup {result['ours_setup_jobs']}, "
        f"{result['ours_jobs_per_epoch_avg']} per epoch) vs baseline {result['baseline_jobs_per_run']}",
        "phase averages per epoch (s): "
        + "  ".join(f"{k}={v:.2f}" for k, v in ordered_phases(result["ours_phases_avg_s"])),
        "  reading epochs only (s):   "
        + "  ".join(f"{k}={v:.2f}" for k, v in ordered_phases(result["ours_reading_phases_avg_s"])),
        f"region tasks: {result['ours_region_task_s_avg']}s each on average (reading + staging parquet); "
        f"their share of the read phase {result['ours_region_task_share_of_read']}",
        *breakdown_lines(result),
    ]
    lines.append("Delta operations per run (inclusive wall s / calls; nested calls count in both):")
    for label, fig in _call_items(result["ours_calls"])[:14]:
        lines.append(f"  {label:<34}{fig['seconds']:>8.2f} s {fig['calls']:>7.1f} calls")
    lines.append(
        "baseline per micro-batch (ms): "
        + "  ".join(f"{k}={v:.0f}" for k, v in result["baseline_batch_ms_avg"].items())
        + f"; {result['baseline_batches_per_run']} batches per run"
    )
    lines.append(
        f"state commit per checkpoint: {result['state_commit_ms_avg']:.0f} ms (epoch 'state' phase), "
        f"{result['state_commit_row_ms_avg']} ms recorded as commit_ms (before the checkpoints row)"
    )
    if result["restore_verdict"] is not None:
        by = sorted(result["restore_s_by_checkpoints"].items(), key=lambda kv: int(kv[0]))
        opened = result["restore_open_s_by_checkpoints"]
        samples = result["restore_samples"]
        lines.append(
            "restore (fresh store, Delta log cache cleared; "
            + (f"median of {len(samples)} interleaved samples" if samples else "one sample each")
            + f", {_load_text(load['restore'])}):"
        )
        for n, seconds in by:
            mine = [x for x in samples if x["checkpoints"] == int(n)]
            detail = ", ".join(f"{x['restore_s']:.2f}s at load {x['load']:.1f}" for x in mine)
            lines.append(
                f"  after {n:>4} checkpoints: open {opened[n]:.2f}s + restore {seconds:.2f}s"
                + (f"  ({detail})" if detail else "")
            )
        lines.append(f"  {result['restore_verdict']}")
    else:
        lines.append("restore: skipped")
    if result.get("chart"):
        lines.append(f"chart: {result['chart']}")
    return "\n".join(lines)


def write_chart(result: Mapping[str, Any], out_dir: str) -> str:
    """Write ``<out_dir>/ingest.html`` (inline SVG, no network); return its path."""
    from splitkeeper.report import charts

    throughput = throughput_chart(result, "ingest-throughput", "Records per second, end to end")
    run_chart = breakdown_chart(result, "ingest-run-breakdown")
    phase_items = ordered_phases(result["ours_phases_avg_s"])
    phase_chart = charts.hbar_chart(
        "ingest-phases",
        "Mean seconds per epoch, by phase",
        "EpochReport.phases averaged over every epoch of every repetition",
        phase_items,
        x_label="seconds per epoch",
        y_label="phase",
        color=charts.GREEN,
    )
    calls = _call_items(result["ours_calls"])[:12]
    call_chart = charts.hbar_chart(
        "ingest-calls",
        "Delta operations of one run (inclusive s)",
        "Wall seconds per run spent in state store and sink methods (nested calls count in both)",
        [(k, v["seconds"]) for k, v in calls],
        x_label="seconds per run",
        y_label="operation",
        color=charts.VERMILLION,
    )
    restore = escape(result["restore_verdict"] or "restore not measured")
    body = f"""<h1>bench ingest --source files --decode {escape(result.get("decode", "raw"))}</h1>
<p>{result["records"]:,} records ({result["files"]} files x {result["lines_per_file"]:,} lines,
{result["input_bytes"] / 1e6:.1f} MB), {escape(decode_text(result))},
epoch {result["epoch_records"]:,} records,
maxFilesPerTrigger {result["max_files_per_trigger"]}, parallelism {result["parallelism"]}.
Ratio ours / baseline: <b>{result["ratio"]:.3f}</b>. Exactly-once checks passed: {result["exact"]}.</p>
<div>{throughput}{run_chart}</div>
<div>{phase_chart}{call_chart}</div>
{repetitions_table(result)}
<h2>State store</h2>
<p>State commit per checkpoint (epoch 'state' phase): {result["state_commit_ms_avg"]:.0f} ms.
Restore: {restore} ({_load_text(result["load_avg"]["restore"])}).</p>
"""
    return write_page(out_dir, chart_file(CHART_FILE, result), "splitkeeper-tools bench ingest", body)


def chart_file(name: str, result: Mapping[str, Any]) -> str:
    """The chart page's file name: ``name``, or ``<stem>_json.html`` for ``--decode json`` (so the
    raw and the typed figures each keep their page)."""
    if result.get("sink") == "upsert":
        return name.replace(".html", "_upsert.html")
    decode = result.get("decode", "raw")
    return name if decode == "raw" else name.replace(".html", f"_{decode}.html")


def throughput_chart(result: Mapping[str, Any], chart_id: str, title: str) -> str:
    """Both sides' records/s per repetition and their medians, as an SVG bar chart."""
    from splitkeeper.report import charts

    categories = [f"rep {r['rep']}" for r in result["runs"]] + ["median"]
    ours = [r["ours_records_per_s"] for r in result["runs"]] + [result["ours_records_per_s"]]
    base = [r["baseline_records_per_s"] for r in result["runs"]] + [result["baseline_records_per_s"]]
    load = result["load_avg"]
    series = [
        charts.Series("splitkeeper", tuple(ours), charts.BLUE),
        charts.Series("Structured Streaming", tuple(base), charts.ORANGE),
    ]
    limit_text = ""
    if "ours_over_limit" in result:
        limit = [r["limit_records_per_s"] for r in result["runs"]] + [result["limit_records_per_s"]]
        series.append(charts.Series("Arrow limit", tuple(limit), charts.GREEN))
        limit_text = f"; ours / Arrow limit {result['ours_over_limit']:.2f}x the time"
    return charts.bar_chart(
        chart_id,
        f"{title} (higher is better)",
        f"splitkeeper {result['ours_records_per_s']:,.0f} records/s vs Structured Streaming "
        f"{result['baseline_records_per_s']:,.0f} records/s over {result['records']:,} records; "
        f"ratio {result['ratio']:.3f}{limit_text}; load average {load['ours']:.1f} and "
        f"{load['baseline']:.1f} on {load['cpus']} cpus",
        categories,
        series,
        x_label="repetition",
        y_label="records/s",
    )


def breakdown_chart(result: Mapping[str, Any], chart_id: str) -> str:
    """Where one of our runs' time goes (``ours_run_breakdown_s``), as horizontal SVG bars."""
    from splitkeeper.report import charts

    return charts.hbar_chart(
        chart_id,
        "Where one splitkeeper run's time goes (s)",
        "Mean seconds per run: pipeline setup, each epoch phase summed over the run, and the rest",
        _breakdown_items(result["ours_run_breakdown_s"]),
        x_label="seconds per run",
        y_label="part",
        color=charts.BLUE,
    )


def repetitions_table(result: Mapping[str, Any]) -> str:
    """An HTML heading and table: per repetition, the order, both sides' seconds and load, exactness."""
    rows = "".join(
        f"<tr><td>{r['rep']}</td><td>{' then '.join(r['order'])}</td><td>{r['ours_s']:.2f}</td>"
        f"<td>{r['ours_load']:.1f}</td><td>{r['baseline_s']:.2f}</td><td>{r['baseline_load']:.1f}</td>"
        f"<td>{r['exact']}</td></tr>"
        for r in result["runs"]
    )
    return f"""<h2>Repetitions</h2>
<table><tr><th>rep</th><th>order</th><th>ours s</th><th>load</th><th>baseline s</th><th>load</th>
<th>exact</th></tr>{rows}</table>
"""


def write_page(out_dir: str, file_name: str, title: str, body: str) -> str:
    """Write ``<out_dir>/<file_name>``: a standalone HTML page (inline styles, no network) with
    ``body``, replaced atomically; return its path."""
    html = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:24px;color:#1f2328}} table{{border-collapse:collapse}}
td,th{{border:1px solid #d0d7de;padding:4px 8px;text-align:right}} svg{{margin:8px 16px 8px 0}}</style>
</head><body>
{body}</body></html>
"""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, file_name)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(html)
    os.replace(path + ".tmp", path)
    return path


# ---------------------------------------------------------------------------------------
# command
# ---------------------------------------------------------------------------------------


def module_for_source(options: Sequence[str]) -> str:
    """The benchmark module for ``splitkeeper-tools bench ingest OPTIONS``: the Kafka one for
    ``--source kafka`` once :data:`KAFKA_MODULE` exists, else this one (which then refuses)."""
    source = None
    for i, option in enumerate(options):
        if option == "--source" and i + 1 < len(options):
            source = options[i + 1]
        elif option.startswith("--source="):
            source = option.split("=", 1)[1]
    if source == "kafka" and importlib.util.find_spec(KAFKA_MODULE) is not None:
        return KAFKA_MODULE
    return __name__


def configure(parser: argparse.ArgumentParser) -> None:
    defaults = IngestSettings()
    parser.add_argument(
        "--source", default="files", help="files (default), or kafka: see --source kafka --help"
    )
    parser.add_argument("--files", type=int, default=defaults.files, help="input files (default 8)")
    parser.add_argument("--lines", type=int, default=defaults.lines, help="lines per file (default 100,000)")
    parser.add_argument("--line-bytes", type=int, default=defaults.line_bytes, help="mean line length (100)")
    parser.add_argument(
        "--parallelism", type=int, default=defaults.parallelism, help="our regions (default: the core count)"
    )
    parser.add_argument(
        "--epoch-records", type=int, default=None, help="records per epoch (default: half the input)"
    )
    parser.add_argument("--repeat", type=int, default=defaults.repeat, help="repetitions (default 3)")
    parser.add_argument(
        "--restore-checkpoints",
        type=int,
        default=defaults.restore_checkpoints,
        help="restore is timed after 10 and after this many checkpoints (default 200)",
    )
    parser.add_argument(
        "--restore-repeat",
        type=int,
        default=defaults.restore_repeat,
        help="restore samples per checkpoint count, interleaved (default 3)",
    )
    parser.add_argument("--skip-restore", action="store_true", help="do not measure restore time")
    parser.add_argument(
        "--sink",
        default="append",
        choices=SINKS,
        help="append (default) or upsert: keyed change records (20%% updates, 2%% deletes) into a keyed "
        "table, ours with sink.mode upsert, the baseline with foreachBatch + Delta MERGE",
    )
    parser.add_argument(
        "--limit",
        action="store_true",
        help="also time plain Arrow reading the same files and writing the same parquet, one process "
        "per region (no protocol, no Spark): prints ours / limit (ours_over_limit)",
    )
    add_output_arguments(parser, "input, sinks and state")


def add_output_arguments(parser: argparse.ArgumentParser, work: str) -> None:
    """The options both ingest benchmarks share: decode, content check, and those of every
    benchmark run by :func:`run_benchmark` (:func:`add_run_arguments`)."""
    parser.add_argument(
        "--decode",
        default="raw",
        choices=DECODES,
        help=f"raw (default: the bytes into one value column) or json: both sides parse JSON into "
        f"typed columns ({JSON_SCHEMA}); ours with decode.kind json, the baseline with from_json",
    )
    parser.add_argument(
        "--readers",
        default="per_epoch",
        choices=READERS,
        help="our pipeline's readers setting: per_epoch (default, as a pipeline's: a Spark job per "
        "epoch) or long_lived (one Spark job for the run, whose tasks take every epoch's regions)",
    )
    parser.add_argument("--no-content-check", action="store_true", help="skip comparing the sinks' values")
    add_run_arguments(parser, work)


def add_run_arguments(parser: argparse.ArgumentParser, work: str) -> None:
    """The options of every benchmark :func:`run_benchmark` runs: warm-up, chart folder, work folder
    (``work`` says what goes there), JSON output."""
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up")
    parser.add_argument("--out", default=os.path.join("var", "bench"), help="chart directory (var/bench)")
    parser.add_argument("--work-dir", default=None, help=f"{work} go here (default: a temporary directory)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def run_benchmark(
    args: argparse.Namespace,
    bench: Callable[[str], dict[str, Any]],
    *,
    prefix: str,
    write_chart: Callable[[Mapping[str, Any], str], str],
    render_table: Callable[[Mapping[str, Any]], str],
    passed: str,
    failure: str,
    say: Callable[[str], None] = _progress,
) -> int:
    """Run ``bench(work_dir)`` in a fresh folder (under ``--work-dir``, else temporary; removed after),
    write its chart to ``--out``, print the result (JSON with ``--json``, else the table) and return
    the exit code: 0 when ``result[passed]`` is true, else 1 with ``failure`` on stderr."""
    if args.work_dir:
        os.makedirs(args.work_dir, exist_ok=True)
        work = tempfile.mkdtemp(prefix=prefix, dir=args.work_dir)
    else:
        work = tempfile.mkdtemp(prefix=f"splitkeeper-{prefix}")
    try:
        result = bench(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["chart"] = write_chart(result, args.out)
    say(f"chart written to {result['chart']}")
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(render_table(result))
    if not result[passed]:
        print(failure, file=sys.stderr)
        return 1
    return 0


def run(args: argparse.Namespace) -> int:
    if args.source != "files":
        if args.source == "kafka":
            raise InvalidParameterError(
                "source",
                "kafka",
                "files",
                hint=f"the Kafka ingest benchmark is not available yet ({KAFKA_MODULE} does not exist)",
            )
        raise InvalidParameterError("source", args.source, "files (kafka is not available yet)")
    settings = IngestSettings(
        files=args.files,
        lines=args.lines,
        line_bytes=args.line_bytes,
        parallelism=args.parallelism,
        epoch_records=args.epoch_records,
        repeat=args.repeat,
        restore_checkpoints=0 if args.skip_restore else args.restore_checkpoints,
        restore_repeat=args.restore_repeat,
        warmup=not args.no_warmup,
        content_check=not args.no_content_check,
        decode=args.decode,
        sink=args.sink,
        limit=args.limit,
        readers=args.readers,
    )
    return run_benchmark(
        args,
        functools.partial(bench_ingest, settings),
        prefix="bench-ingest-",
        write_chart=write_chart,
        render_table=render_table,
        passed="exact",
        failure="splitkeeper-tools bench ingest: a sink does not hold exactly the input records "
        "(see the checks line)",
    )
