"""Run one epoch's regions as independent Spark jobs, with per-region timeouts.

Each region is one Spark job of one task, submitted from its own driver thread
in its own job group. A region whose task raises fails alone (its job fails;
the others go on). A region that is still running ``timeout_s`` after its task
*started*, or whose task has not started ``timeout_s`` after the epoch's regions
were submitted (no free core, a lost executor: the epoch deadline), is cancelled
with ``SparkContext.cancelJobGroup`` and counted as timed out (protocol rule
2.3). This is what lets a checkpoint complete regionally instead of the whole
micro-batch failing, which is Structured Streaming's behaviour.

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
from typing import Any

from splitkeeper.errors import SplitkeeperError

log = logging.getLogger("splitkeeper.spark.regions")
#: How long an abandoned epoch waits for its cancelled region jobs to wind down.
ABANDON_WAIT_S = 10.0


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
) -> dict[int, RegionRun]:
    """Run ``task(payload)`` for every region as its own Spark job; return each region's outcome.

    Called by the epoch runner on the driver, once per epoch. ``task`` and the
    payloads cross to executors: they must be picklable. The timeout of a region
    counts from the moment its task starts running, measured with Spark's status
    tracker; a region whose task has not started ``timeout_s`` after submission
    times out too (it may never be scheduled), and its job is cancelled before it runs.
    Once ``interrupt`` is set, every region job still running is cancelled and
    EpochAbandoned is raised (after the jobs wound down, at most ``ABANDON_WAIT_S``).
    No payload (every region declined before reading): no job, an empty result.
    """
    if not payloads:
        return {}
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    runs: dict[int, RegionRun] = {}
    done = threading.Event()
    lock = threading.Lock()
    submitted = time.monotonic()

    def worker(region: int, payload: Any) -> None:
        group = _job_group(pipeline, epoch, region)
        sc.setJobGroup(group, f"splitkeeper {pipeline} epoch {epoch} region {region}", True)
        try:
            result = sc.parallelize([payload], 1).map(task).collect()[0]
            run = RegionRun(region, RegionStatus.FINISHED, result=result)
        except Exception as err:  # a failed or cancelled Spark job: the region failed
            run = RegionRun(region, RegionStatus.FAILED, error=_short_error(err))
            log.debug(
                "region %s job failed: %s",
                region,
                traceback.format_exc(),
                extra={"epoch": epoch, "checkpoint_id": epoch, "region": region},
            )
        with lock:
            runs.setdefault(region, run)
            if len(runs) == len(payloads):
                done.set()

    threads = {r: threading.Thread(target=worker, args=(r, p), daemon=True) for r, p in payloads.items()}
    for t in threads.values():
        t.start()
    started: dict[int, float] = {}
    cancelled: set[int] = set()
    while not done.is_set():
        if interrupt is not None and interrupt.is_set():
            _abandon(sc, pipeline, epoch, [r for r in payloads if r not in runs], threads)
        now = time.monotonic()
        for region in payloads:
            if region in started or region in runs:
                continue
            if _has_active_task(tracker, _job_group(pipeline, epoch, region)):
                started[region] = now
        expired: list[tuple[int, str]] = []
        for region in payloads:
            if region in runs or region in cancelled:
                continue
            if region in started:
                if now - started[region] > timeout_s:
                    expired.append((region, f"no result within {timeout_s:g}s"))
            elif now - submitted > timeout_s:
                expired.append((region, f"its task did not start within {timeout_s:g}s (epoch deadline)"))
        for region, why in expired:
            log.warning(
                "region %s of epoch %s timed out: %s; cancelling",
                region,
                epoch,
                why,
                extra={"epoch": epoch, "checkpoint_id": epoch, "region": region},
            )
            with lock:
                runs.setdefault(region, RegionRun(region, RegionStatus.TIMED_OUT, error=why))
                if len(runs) == len(payloads):
                    done.set()
            cancelled.add(region)
        for region, _why in expired:
            sc.cancelJobGroup(_job_group(pipeline, epoch, region))
        done.wait(poll_s)
    for region in cancelled:  # let cancelled jobs wind down so their cores are free
        threads[region].join(timeout=30)
    end = time.monotonic()
    out: dict[int, RegionRun] = {}
    for region, run in runs.items():
        began = started.get(region)
        out[region] = RegionRun(
            run.region_id,
            run.status,
            run.result,
            run.error,
            None if began is None else round(began - submitted, 3),
            round(end - submitted, 3),
        )
    return dict(sorted(out.items()))


def _abandon(
    sc: Any, pipeline: str, epoch: int, running: list[int], threads: Mapping[int, threading.Thread]
) -> None:
    """Cancel the regions still running and raise EpochAbandoned once they wound down."""
    log.warning("epoch %s abandoned: cancelling regions %s", epoch, running, extra={"epoch": epoch})
    for region in running:
        sc.cancelJobGroup(_job_group(pipeline, epoch, region))
    deadline = time.monotonic() + ABANDON_WAIT_S
    for region in running:
        threads[region].join(timeout=max(0.0, deadline - time.monotonic()))
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
