"""Regions as the tasks of one Spark job per epoch: a failure stays in its region, and every region
has a deadline.

Runs :func:`splitkeeper.spark.regions.run_regions` on the shared ``local[2]`` session: two
cores, so at most two region tasks run at once.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.spark.regions import (
    TASKS_PER_CORE_CONF,
    RegionStatus,
    _job_group,
    _server_addresses,
    max_task_failures,
    pack_regions,
    run_regions,
    tasks_per_core,
)

pytestmark = [pytest.mark.spark]


def _epoch_jobs(spark: Any, pipeline: str, epoch: int) -> list[tuple[str, int]]:
    """(status, number of tasks) of every Spark job of the epoch's job group."""
    tracker = spark.sparkContext.statusTracker()
    out = []
    for job_id in tracker.getJobIdsForGroup(_job_group(pipeline, epoch)):
        job = tracker.getJobInfo(job_id)
        tasks = sum(tracker.getStageInfo(s).numTasks for s in job.stageIds if tracker.getStageInfo(s))
        out.append((str(job.status), tasks))
    return out


def _sleeper() -> Any:
    """A task that sleeps its payload's seconds (defined in a function: cloudpickle ships it by
    value, as the test module is not importable on the Python workers)."""

    def sleep(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    return sleep


def test_a_region_whose_task_never_starts_times_out_at_the_epoch_deadline(spark: Any) -> None:
    """Three regions stall, two cores: the two that start time out after their task's timeout, and
    the one that never gets a core times out at the epoch deadline (no task started or ended for the
    timeout) instead of waiting for one.

    (A region's timeout used to count only from its task's start, so the third waited until the
    others were cancelled and then ran on, however late.)
    """
    spark.sparkContext.parallelize([0, 1], 2).map(lambda x: x).collect()  # Python workers up

    # 15 s: on a loaded 2-core machine two tasks took more than 8 s to start (CI, after the
    # paused-holder test); waiting for the third region's late start would take twice as long
    timeout = 15
    started = time.monotonic()
    runs = run_regions(spark, "deadline", 1, {0: 60.0, 1: 60.0, 2: 60.0}, _sleeper(), timeout_s=timeout)
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
    assert _epoch_jobs(spark, "alone", 2) == [("SUCCEEDED", 3)]  # the failure did not fail the job


def test_no_payload_runs_no_job_and_returns_at_once(spark: Any) -> None:
    """Every region declined before reading (its splits could not be planned): no job, an empty
    result. The wait loop used to wait for a region that was never submitted, for ever."""
    out: list[dict[int, Any]] = []
    t = threading.Thread(
        target=lambda: out.append(run_regions(spark, "p", 1, {}, lambda x: x, 5.0)), daemon=True
    )
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "run_regions({}) did not return"
    assert out == [{}]
    assert _epoch_jobs(spark, "p", 1) == []


def test_many_regions_are_one_job_whose_tasks_run_on_the_cores_and_each_returns_its_result(
    spark: Any,
) -> None:
    """12 regions on two cores: one Spark job of 4 tasks (two per core), each running its 3 regions
    one after another; every region finishes with its own result, at most the two cores' regions run
    at once (by the regions' own clocks), in region order."""

    def task(region: int) -> tuple[int, float, float]:
        began = time.time()
        time.sleep(0.05)
        return region * 7, began, time.time()

    runs = run_regions(spark, "pool", 3, {r: r for r in range(12)}, task, timeout_s=60.0)

    assert sorted(runs) == list(range(12))
    assert all(run.status is RegionStatus.FINISHED for run in runs.values()), {
        r: run.error for r, run in runs.items()
    }
    assert [runs[r].result[0] for r in range(12)] == [r * 7 for r in range(12)]
    assert _epoch_jobs(spark, "pool", 3) == [("SUCCEEDED", 4)]
    spans = [runs[r].result[1:] for r in range(12)]  # each task's own (start, end)
    peak = max(sum(1 for b, e in spans if b <= t < e) for t, _ in spans)
    assert 1 <= peak <= 2, f"{peak} region tasks ran at once on two cores"
    assert runs[11].result[1] >= runs[0].result[2]  # partitions run in region order
    assert all(runs[r].started_after_s is not None for r in range(12))


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 made zip finders' invalidation lazy")
def test_a_region_task_runs_without_zip_and_jar_finders_in_its_worker(spark: Any) -> None:
    """PySpark invalidates the worker's import caches before every task; on 3.11 each zip finder then
    re-reads its archive (pyspark.zip, spark-core.jar). The region task drops them first, so the task
    body sees none, and the jar is off the path; imports still work (a module new to the worker)."""

    def task(_payload: int) -> tuple[list[str], list[str], str]:
        import sys as worker_sys

        finders = [k for k in worker_sys.path_importer_cache if ".jar" in k or ".zip" in k]
        jars = [p for p in worker_sys.path if p.endswith(".jar")]
        import pyspark.sql.avro.functions as late  # a module new to the worker: new finders, as needed

        return finders, jars, late.__name__

    runs = run_regions(spark, "imports", 9, {0: 0, 1: 1}, task, timeout_s=60.0)
    for run in runs.values():
        assert run.status is RegionStatus.FINISHED, run.error
        assert run.result == ([], [], "pyspark.sql.avro.functions")


def test_one_job_a_raising_and_a_stalled_region_fail_alone_and_the_others_finish(
    spark: Any, tmp_path: Path
) -> None:
    """One epoch, one Spark job of 4 tasks (6 regions, two cores): region 0 stalls and region 1
    raises; regions 2-5 pass through the other core and finish with their results. Region 0 times
    out on its own timeout and its task alone is killed: the job still succeeds (it was not
    cancelled), the killed task's retry was refused region 0 before running its body (each body marks
    its start in a file) and ran region 4, packed behind region 0 in that task, after the kill; the
    epoch ends without waiting for the 120 s."""

    def task(payload: tuple[str, int, float]) -> float:
        folder, region, seconds = payload
        with open(Path(folder, f"r{region}"), "a") as marks:
            marks.write("started\n")
        if seconds < 0:
            raise RuntimeError("region 1 is broken")
        time.sleep(seconds)
        return seconds

    timeout = 10
    seconds = {0: 120.0, 1: -1.0, **{r: 0.1 * r for r in range(2, 6)}}
    payloads = {r: (str(tmp_path), r, s) for r, s in seconds.items()}
    began = time.monotonic()
    runs = run_regions(spark, "stall", 4, payloads, task, timeout_s=timeout)
    elapsed = time.monotonic() - began

    assert runs[0].status is RegionStatus.TIMED_OUT and runs[0].error == f"no result within {timeout}s"
    assert runs[0].started_after_s is not None
    assert runs[1].status is RegionStatus.FAILED and "RuntimeError: region 1 is broken" in runs[1].error
    for r in range(2, 6):
        assert runs[r].status is RegionStatus.FINISHED and runs[r].result == pytest.approx(0.1 * r), runs[r]
    assert pack_regions(list(range(6)), 2) == [[0, 4], [1, 5], [2], [3]]
    assert _epoch_jobs(spark, "stall", 4) == [("SUCCEEDED", 4)]  # one job of four tasks, not cancelled
    assert Path(tmp_path, "r0").read_text() == "started\n"  # the killed task's retry did not run it
    assert runs[4].started_after_s is not None and runs[4].started_after_s >= timeout  # after the kill
    assert timeout <= elapsed < 2 * timeout, f"the epoch took {elapsed:.0f}s"


def test_a_killed_python_worker_fails_its_region_only_and_the_others_run_again(spark: Any) -> None:
    """Region 1's Python worker dies (``os._exit``), which on ``local[2]`` (one attempt per task)
    aborts the epoch's job of 4 tasks (8 regions, two per task): region 1, the region running in the
    task Spark names, fails with Spark's reason, and the regions the abort took down (region 5, packed
    behind region 1, among them) run again in a second job and finish with their results."""

    def task(payload: tuple[int, float]) -> int:
        region, seconds = payload
        if region == 1:
            time.sleep(0.5)
            import os

            os._exit(3)
        time.sleep(seconds)
        return region * 10

    runs = run_regions(spark, "worker", 7, {r: (r, 1.0) for r in range(8)}, task, timeout_s=60.0)

    assert runs[1].status is RegionStatus.FAILED and "Python worker exited unexpectedly" in runs[1].error, (
        runs[1]
    )
    for r in (0, 2, 3, 4, 5, 6, 7):
        assert runs[r].status is RegionStatus.FINISHED and runs[r].result == r * 10, runs[r]
    jobs = _epoch_jobs(spark, "worker", 7)
    # the first job (four tasks) failed; the second ran the regions it took down, and succeeded
    assert sorted(jobs)[0] == ("FAILED", 4) and sorted(jobs)[1][0] == "SUCCEEDED" and len(jobs) == 2, jobs


def test_an_abandoned_epoch_cancels_its_job_and_starts_no_queued_region(spark: Any, tmp_path: Path) -> None:
    """A stop request while two stalled regions of 6 hold both cores: the epoch's job is cancelled,
    EpochAbandoned is raised, and regions 2-5 never started (each task marks its start in a file)."""
    from splitkeeper.spark.regions import EpochAbandoned

    def task(payload: tuple[str, int]) -> int:
        Path(payload[0], f"started-{payload[1]}").touch()
        time.sleep(120)
        return payload[1]

    interrupt = threading.Event()
    threading.Timer(3.0, interrupt.set).start()
    with pytest.raises(EpochAbandoned):
        run_regions(
            spark, "abandon", 5, {r: (str(tmp_path), r) for r in range(6)}, task, 60.0, interrupt=interrupt
        )
    jobs = _epoch_jobs(spark, "abandon", 5)
    assert len(jobs) == 1 and jobs[0][0] != "RUNNING", jobs
    time.sleep(1)  # a queued task that had been launched regardless would have marked its start now
    assert sorted(p.name for p in tmp_path.iterdir()) <= ["started-0", "started-1"]


def test_the_attempts_a_task_gets_follow_the_master_as_spark_decides() -> None:
    """A region task re-raises (for Spark to retry it) only while Spark will: 1 attempt on
    ``local``/``local[N]``, F on ``local[N,F]``, else ``spark.task.maxFailures`` (default 4)."""
    from types import SimpleNamespace

    def sc(master: str, **conf: str) -> Any:
        return SimpleNamespace(
            master=master, getConf=lambda: SimpleNamespace(get=lambda k, d: conf.get(k, d))
        )

    assert [
        max_task_failures(sc(m)) for m in ("local", "local[2]", "local[*]", "local[2,3]", "local[*, 2]")
    ] == [
        1,
        1,
        1,
        3,
        2,
    ]
    assert max_task_failures(sc("spark://h:7077")) == 4
    assert max_task_failures(sc("yarn", **{"spark.task.maxFailures": "8"})) == 8
    assert max_task_failures(sc("local-cluster[2,1,1024]", **{"spark.task.maxFailures": "2"})) == 2


def test_regions_are_dealt_into_at_most_tasks_per_core_times_the_cores_tasks() -> None:
    """Neighbouring regions go to different tasks, the tasks differ by at most one region, and a
    conf of 0 gives every region its own task (as before packing)."""
    assert pack_regions([], 2) == []
    assert pack_regions([3, 5], 2) == [[3], [5]]
    assert pack_regions(list(range(10)), 2) == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    assert pack_regions(list(range(10)), 2, per_core=1) == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    assert pack_regions(list(range(3)), 2, per_core=0) == [[0], [1], [2]]
    assert sorted(len(p) for p in pack_regions(list(range(200)), 2)) == [50, 50, 50, 50]


def test_the_tasks_per_core_conf_is_read_from_the_session_and_a_bad_value_names_the_fix(spark: Any) -> None:
    from splitkeeper.errors import InvalidParameterError

    assert tasks_per_core(spark) == 2
    try:
        spark.conf.set(TASKS_PER_CORE_CONF, "0")
        assert tasks_per_core(spark) == 0
        runs = run_regions(spark, "apart", 11, {r: r for r in range(5)}, lambda x: x + 1, timeout_s=60.0)
        assert {r: run.result for r, run in runs.items()} == {r: r + 1 for r in range(5)}
        assert _epoch_jobs(spark, "apart", 11) == [("SUCCEEDED", 5)]  # a task per region
        spark.conf.set(TASKS_PER_CORE_CONF, "two")
        with pytest.raises(InvalidParameterError, match=r"spark.splitkeeper.regions.tasksPerCore='two'"):
            run_regions(spark, "bad", 12, {0: 0}, lambda x: x, timeout_s=60.0)
    finally:
        spark.conf.unset(TASKS_PER_CORE_CONF)


def test_the_driver_addresses_are_read_once_per_spark_context() -> None:
    """The region server binds and advertises Spark's driver addresses; ``SparkContext.getConf()``
    (a py4j copy of the whole conf) is asked once per context, not every epoch, and a new context
    (a restarted session) is asked again."""

    class Context:
        def __init__(self, **conf: str) -> None:
            self.conf = conf
            self.asked = 0

        def getConf(self) -> Any:  # noqa: N802 (SparkContext's name)
            self.asked += 1
            conf = dict(self.conf)
            return type("Conf", (), {"get": staticmethod(lambda k, d=None: conf.get(k, d))})()

    first = Context(**{"spark.driver.host": "10.0.0.5", "spark.driver.bindAddress": "0.0.0.0"})
    assert [_server_addresses(first) for _ in range(3)] == [("0.0.0.0", "10.0.0.5")] * 3
    assert first.asked == 1
    second = Context()  # no driver host set: the loopback, bound where it is reached
    assert _server_addresses(second) == ("127.0.0.1", "127.0.0.1") and second.asked == 1
