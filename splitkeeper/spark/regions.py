"""Run one epoch's regions as independent Spark jobs, at most ``max_concurrent`` at once,
with per-region timeouts.

Each region is one Spark job of one task in its own job group. A bounded pool of driver
threads takes the regions from a queue in region order, each thread submitting one region's
job at a time and waiting for it (``max_concurrent`` threads: by default twice the cluster's
task slots, ``SparkContext.defaultParallelism``, from 2 to :data:`DEFAULT_MAX_CONCURRENT`;
config ``max_concurrent_regions``). So an epoch of thousands of regions with ranges holds a
few driver threads and py4j sockets, not one per region (py4j fails past descriptor 1023).

A region whose task raises fails alone (its job fails; the others go on). A region that is
still running ``timeout_s`` after its task *started*, or whose task has not started
``timeout_s`` after its job was *submitted* (taken from the queue: no free core, a lost
executor: the epoch deadline), is cancelled with ``SparkContext.cancelJobGroup`` and counted as
timed out (protocol rule 2.3). Waiting in the queue for a pool thread is not counted: a region
is timed out for its own job only. The epoch still ends: every submitted job ends, is cancelled
at its deadline or its timeout, and so frees its pool thread for the next region (at worst
``2 * timeout_s`` per round of ``max_concurrent`` regions when every one of them stalls).
This is what lets a checkpoint complete regionally instead of the whole micro-batch failing,
which is Structured Streaming's behaviour. A stop request (``interrupt``) cancels the jobs
running and submits none of the queued regions (EpochAbandoned).

Spark's own task retry cannot turn a failed region into a duplicate. Where
``spark.task.maxFailures`` allows it (clusters; ``local[N,F]``), Spark reruns a region
task whose attempt raised; every attempt stages its output under its own
``attempt=<id>`` folder and publishes it only when it finishes, and the driver commits
only the path the finished attempt returned. A region whose every attempt fails
declines once (tests/runtime/test_task_retry.py, with the ``flaky`` fault).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from queue import Empty, SimpleQueue
from typing import Any

from splitkeeper.errors import SplitkeeperError

log = logging.getLogger("splitkeeper.spark.regions")
#: How long an abandoned epoch waits for its cancelled region jobs to wind down.
ABANDON_WAIT_S = 10.0
#: The most region jobs at once by default (the config's ``max_concurrent_regions`` may say more,
#: up to :data:`~splitkeeper.config.limits.MAX_CONCURRENT_REGIONS`).
DEFAULT_MAX_CONCURRENT = 64


class EpochAbandoned(SplitkeeperError):
    """The epoch's read phase was abandoned because a stop was requested (``params['epoch']``).

    Every region job still running was cancelled; nothing of the epoch is committed.
    """

    code = "INTERRUPTED"


class RegionStatus(enum.Enum):
    FINISHED = "finished"
    FAILED = "failed"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True, slots=True)
class RegionRun:
    """What the driver learned about one region's job."""

    region_id: int
    status: RegionStatus
    result: Any = None  # the task's return value when FINISHED
    error: str = ""
    started_after_s: float | None = None  # queueing delay before the task began
    elapsed_s: float = 0.0


def _job_group(pipeline: str, epoch: int, region: int) -> str:
    return f"splitkeeper-{pipeline}-e{epoch}-r{region}"


_TRACEBACK = "Traceback (most recent call last):"


def _short_error(err: BaseException) -> str:
    """One line saying why a region's job failed: the task's Python exception when there is one.

    A failed Python task reaches the driver as a JVM error (py4j) that embeds the
    worker's traceback, whose first unindented line after ``Traceback ...`` is
    ``module.ExceptionClass: message``. Other failures (a cancelled job) keep the
    last line that names an error or exception.
    """
    text = str(err)
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].rstrip().endswith(_TRACEBACK):
            for line in lines[i + 1 :]:
                if line.strip() and not line[:1].isspace():
                    return line.strip()[:500]
            break
    for line in reversed(lines):
        line = line.strip()
        if line and ("Error" in line or "Exception" in line) and not line.startswith("at "):
            return line[:500]
    return (text.splitlines() or [type(err).__name__])[0][:500]


def default_max_concurrent(sc: Any) -> int:
    """Region jobs at once when the config does not say: twice the cluster's task slots
    (``defaultParallelism``: N for ``local[N]``, the executors' cores on a cluster), so the next
    region's job is already queued in Spark when a task ends, from 2 to :data:`DEFAULT_MAX_CONCURRENT`."""
    try:
        slots = int(sc.defaultParallelism)
    except Exception:  # a context without the property (a stub): the smallest pool
        slots = 1
    return max(2, min(DEFAULT_MAX_CONCURRENT, 2 * slots))


def run_regions(
    spark: Any,
    pipeline: str,
    epoch: int,
    payloads: Mapping[int, Any],
    task: Callable[[Any], Any],
    timeout_s: float,
    poll_s: float = 0.05,
    *,
    interrupt: threading.Event | None = None,
    max_concurrent: int | None = None,
) -> dict[int, RegionRun]:
    """Run ``task(payload)`` for every region as its own Spark job, at most ``max_concurrent`` jobs
    at once (None: :func:`default_max_concurrent`); return each region's outcome.

    Called by the epoch runner on the driver, once per epoch. ``task`` and the
    payloads cross to executors: they must be picklable. Regions are submitted in region order
    as pool threads free up. The timeout of a region counts from the moment its task starts
    running, measured with Spark's status tracker; a region whose task has not started
    ``timeout_s`` after its job's submission times out too (it may never be scheduled), and its
    job is cancelled before it runs. Once ``interrupt`` is set, every region job still running is
    cancelled, no queued region is submitted, and EpochAbandoned is raised (after the jobs wound
    down, at most ``ABANDON_WAIT_S``). No payload (every region declined before reading): no
    job, an empty result.
    """
    if not payloads:
        return {}
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    pool_size = max(1, min(len(payloads), max_concurrent or default_max_concurrent(sc)))
    runs: dict[int, RegionRun] = {}
    submitted: dict[int, float] = {}  # region -> when a pool thread submitted its job
    done = threading.Event()
    stopping = threading.Event()  # abandoned: pool threads take no more regions
    lock = threading.Lock()
    epoch_start = time.monotonic()
    queue: SimpleQueue[int] = SimpleQueue()
    for region in sorted(payloads):
        queue.put(region)

    def record(region: int, run: RegionRun) -> None:
        with lock:
            runs.setdefault(region, run)
            if len(runs) == len(payloads):
                done.set()

    def worker() -> None:
        while not stopping.is_set():
            try:
                region = queue.get_nowait()
            except Empty:
                return
            with lock:
                if stopping.is_set() or region in runs:
                    return
                submitted[region] = time.monotonic()
            group = _job_group(pipeline, epoch, region)
            sc.setJobGroup(group, f"splitkeeper {pipeline} epoch {epoch} region {region}", True)
            try:
                result = sc.parallelize([payloads[region]], 1).map(task).collect()[0]
                run = RegionRun(region, RegionStatus.FINISHED, result=result)
            except Exception as err:  # a failed or cancelled Spark job: the region failed
                run = RegionRun(region, RegionStatus.FAILED, error=_short_error(err))
                log.debug(
                    "region %s job failed: %s",
                    region,
                    traceback.format_exc(),
                    extra={"epoch": epoch, "checkpoint_id": epoch, "region": region},
                )
            record(region, run)

    threads = [
        threading.Thread(target=worker, name=f"splitkeeper-region-{i}", daemon=True) for i in range(pool_size)
    ]
    for t in threads:
        t.start()
    started: dict[int, float] = {}
    cancelled: set[int] = set()
    while not done.is_set():
        with lock:
            in_flight = [r for r in submitted if r not in runs]
        if interrupt is not None and interrupt.is_set():
            _abandon(sc, pipeline, epoch, in_flight, threads, stopping)
        now = time.monotonic()
        for region in in_flight:
            if region not in started and _has_active_task(tracker, _job_group(pipeline, epoch, region)):
                started[region] = now
        expired: list[tuple[int, str]] = []
        for region in in_flight:
            if region in cancelled:
                continue
            if region in started:
                if now - started[region] > timeout_s:
                    expired.append((region, f"no result within {timeout_s:g}s"))
            elif now - submitted[region] > timeout_s:
                expired.append((region, f"its task did not start within {timeout_s:g}s (epoch deadline)"))
        for region, why in expired:
            log.warning(
                "region %s of epoch %s timed out: %s; cancelling",
                region,
                epoch,
                why,
                extra={"epoch": epoch, "checkpoint_id": epoch, "region": region},
            )
            record(region, RegionRun(region, RegionStatus.TIMED_OUT, error=why))
            cancelled.add(region)
        for region, _why in expired:
            sc.cancelJobGroup(_job_group(pipeline, epoch, region))
        done.wait(poll_s)
    wind_down = time.monotonic() + 30  # let cancelled jobs wind down so their cores are free
    for t in threads:
        t.join(timeout=max(0.0, wind_down - time.monotonic()))
    end = time.monotonic()
    out: dict[int, RegionRun] = {}
    for region, run in runs.items():
        began = started.get(region)
        out[region] = RegionRun(
            run.region_id,
            run.status,
            run.result,
            run.error,
            None if began is None else round(began - epoch_start, 3),
            round(end - epoch_start, 3),
        )
    return dict(sorted(out.items()))


def _abandon(
    sc: Any,
    pipeline: str,
    epoch: int,
    running: list[int],
    threads: list[threading.Thread],
    stopping: threading.Event,
) -> None:
    """Submit no queued region, cancel the regions still running and raise EpochAbandoned once
    they wound down."""
    stopping.set()
    log.warning("epoch %s abandoned: cancelling regions %s", epoch, running, extra={"epoch": epoch})
    for region in running:
        sc.cancelJobGroup(_job_group(pipeline, epoch, region))
    deadline = time.monotonic() + ABANDON_WAIT_S
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    raise EpochAbandoned(
        f"epoch {epoch} of pipeline {pipeline!r} was abandoned in its read phase: a stop was requested",
        epoch=epoch,
    )


def _has_active_task(tracker: Any, group: str) -> bool:
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        if job is None:
            continue
        for stage_id in job.stageIds:
            stage = tracker.getStageInfo(stage_id)
            if stage is not None and (stage.numActiveTasks > 0 or stage.numCompletedTasks > 0):
                return True
    return False
