"""Regions as independent Spark jobs: a failure stays in its region, and every region has a deadline.

Runs :func:`splitkeeper.spark.regions.run_regions` on the shared ``local[2]`` session: two
cores, so at most two region tasks run at once.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from splitkeeper.spark.regions import RegionStatus, run_regions

pytestmark = [pytest.mark.spark]


def test_a_region_whose_task_never_starts_times_out_at_the_epoch_deadline(spark: Any) -> None:
    """Three regions stall, two cores: the two that start time out after their task's timeout, and
    the one that never gets a core times out at the epoch deadline instead of waiting for one.

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
    runs = run_regions(spark, "deadline", 1, {0: 60.0, 1: 60.0, 2: 60.0}, task, timeout_s=timeout)
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
