"""Regions as independent Spark jobs: a failure stays in its region, and every region has a deadline.

Runs :func:`splitkeeper.spark.regions.run_regions` on the shared ``local[2]`` session: two
cores, so at most two region tasks run at once, and at most ``max_concurrent`` region jobs are
submitted at once (a bounded pool of driver threads).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from splitkeeper.spark.regions import RegionStatus, run_regions

pytestmark = [pytest.mark.spark]


def test_a_region_whose_task_never_starts_times_out_at_the_epoch_deadline(spark: Any) -> None:
    """Three regions stall, two cores: the two that start time out after their task's timeout, and
    the one that never gets a core times out at the epoch deadline instead of waiting for one.

    The pool (``max_concurrent=3``) is larger than the cores, so all three jobs are submitted at
    once and the third waits in Spark's scheduler for a core that never frees: its deadline counts
    from its submission. (With a pool no larger than the free cores it would wait in the queue
    instead, uncharged, and start once a stalled region was cancelled.)

    (A region's timeout used to count only from its task's start, so the third waited until the
    others were cancelled and then ran on, however late.)
    """
    spark.sparkContext.parallelize([0, 1], 2).map(lambda x: x).collect()  # Python workers up

    def task(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    # 15 s: on a loaded 2-core machine two tasks took more than 8 s to start (CI, after the
    # paused-holder test); waiting for the third region's late start would take twice as long
    timeout = 15
    started = time.monotonic()
    runs = run_regions(
        spark, "deadline", 1, {0: 60.0, 1: 60.0, 2: 60.0}, task, timeout_s=timeout, max_concurrent=3
    )
    elapsed = time.monotonic() - started

    assert {run.status for run in runs.values()} == {RegionStatus.TIMED_OUT}
    never = [r for r, run in runs.items() if f"did not start within {timeout}s (epoch deadline)" in run.error]
    ran = [r for r, run in runs.items() if run.error == f"no result within {timeout}s"]
    assert len(never) == 1 and len(ran) == 2, {r: run.error for r, run in runs.items()}
    assert runs[never[0]].started_after_s is None
    assert all(runs[r].started_after_s is not None for r in ran)
    assert elapsed < 2 * timeout, f"the epoch waited {elapsed:.0f}s for regions past their deadline"


def test_a_failing_region_fails_alone_and_a_quick_one_acknowledges(spark: Any) -> None:
    def task(payload: int) -> int:
        if payload == 1:
            raise ValueError("region 1 cannot read its split")
        return payload * 10

    runs = run_regions(spark, "alone", 2, {0: 0, 1: 1, 2: 2}, task, timeout_s=30.0)

    assert runs[0].status is RegionStatus.FINISHED and runs[0].result == 0
    assert runs[2].status is RegionStatus.FINISHED and runs[2].result == 20
    assert runs[1].status is RegionStatus.FAILED
    assert "ValueError: region 1 cannot read its split" in runs[1].error


def test_no_payload_runs_no_job_and_returns_at_once(spark: Any) -> None:
    """Every region declined before reading (its splits could not be planned): no job, an empty
    result. The wait loop used to wait for a region that was never submitted, for ever."""
    import threading

    out: list[dict[int, Any]] = []
    t = threading.Thread(
        target=lambda: out.append(run_regions(spark, "p", 1, {}, lambda x: x, 5.0)), daemon=True
    )
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "run_regions({}) did not return"
    assert out == [{}]


def _active_jobs_peak(spark: Any, stop: threading.Event, peak: list[int]) -> None:
    tracker = spark.sparkContext.statusTracker()
    while not stop.is_set():
        peak[0] = max(peak[0], len(tracker.getActiveJobsIds()))
        stop.wait(0.01)


def test_more_regions_than_the_pool_all_finish_with_at_most_the_pool_running(spark: Any) -> None:
    """12 regions, a pool of 3: every region finishes with its own result, and Spark never holds
    more than 3 of their jobs at once (sampled with its status tracker; without the pool all 12
    jobs are submitted together and wait for the two cores inside Spark)."""

    def task(region: int) -> tuple[int, float, float]:
        began = time.time()
        time.sleep(0.05)
        return region * 7, began, time.time()

    peak = [0]
    stop = threading.Event()
    sampler = threading.Thread(target=_active_jobs_peak, args=(spark, stop, peak), daemon=True)
    sampler.start()
    try:
        runs = run_regions(
            spark, "pool", 3, {r: r for r in range(12)}, task, timeout_s=60.0, max_concurrent=3
        )
    finally:
        stop.set()
        sampler.join()

    assert sorted(runs) == list(range(12))
    assert all(run.status is RegionStatus.FINISHED for run in runs.values()), {
        r: run.error for r, run in runs.items()
    }
    assert [runs[r].result[0] for r in range(12)] == [r * 7 for r in range(12)]
    assert 1 <= peak[0] <= 3, f"{peak[0]} region jobs were active at once with a pool of 3"
    # the pool takes the regions in region order: region 11 starts after region 0 ended
    assert runs[11].result[1] >= runs[0].result[2]


def test_a_stalled_region_in_a_pool_of_two_times_out_while_the_others_finish(spark: Any) -> None:
    """A pool of 2 on two cores: region 0 stalls and holds one slot; regions 1-5 pass through the
    other one after another (queued, not charged for the wait) and finish; region 0 is cancelled
    at its timeout, which frees its slot, and the epoch ends then."""

    def task(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    timeout = 10
    payloads = {0: 120.0, **{r: 0.1 for r in range(1, 6)}}
    began = time.monotonic()
    runs = run_regions(spark, "stall", 4, payloads, task, timeout_s=timeout, max_concurrent=2)
    elapsed = time.monotonic() - began

    assert runs[0].status is RegionStatus.TIMED_OUT and runs[0].error == f"no result within {timeout}s"
    assert runs[0].started_after_s is not None
    for r in range(1, 6):
        assert runs[r].status is RegionStatus.FINISHED and runs[r].result == 0.1, runs[r]
    assert timeout <= elapsed < 3 * timeout, f"the epoch took {elapsed:.0f}s"


def test_an_abandoned_epoch_cancels_its_running_regions_and_submits_no_queued_one(spark: Any) -> None:
    """A stop request while a pool of 2 runs two stalled regions of 6: both jobs are cancelled,
    EpochAbandoned is raised, and regions 2-5 never ran a job."""
    from splitkeeper.spark.regions import EpochAbandoned

    def task(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    sc = spark.sparkContext
    interrupt = threading.Event()
    threading.Timer(2.0, interrupt.set).start()
    with pytest.raises(EpochAbandoned):
        run_regions(
            spark,
            "abandon",
            5,
            {r: 120.0 for r in range(6)},
            task,
            60.0,
            interrupt=interrupt,
            max_concurrent=2,
        )
    tracker = sc.statusTracker()
    for r in range(6):
        jobs = tracker.getJobIdsForGroup(f"splitkeeper-abandon-e5-r{r}")
        if r < 2:
            assert jobs and all(tracker.getJobInfo(j).status != "RUNNING" for j in jobs)
        else:
            assert not jobs, f"queued region {r} ran a job after the stop"
