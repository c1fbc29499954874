"""The Spark runner of an epoch's regions: the ``RegionRunner`` port of :mod:`splitkeeper.core.ports`.

:class:`SparkRegionRunner` runs the regions of an epoch that have ranges to read as the tasks of
one Spark job (:func:`~splitkeeper.spark.regions.run_regions`); each task runs
:func:`~splitkeeper.spark.task.region_task` on its :class:`~splitkeeper.spark.task.RegionTask`
(the named, picklable payload: plan, reader, transform, staging root, epoch, region, fault,
record policy) and publishes a :class:`~splitkeeper.staging.StagedRegion`, the output the sink
commits. :class:`LazySpark` starts the session with the first epoch that has ranges to read.

A Spark conf :data:`SHARED_DISK_CONF` ``false`` says the executors share no disk with the driver (the
local cluster's profile sets it: each worker in a mount namespace of its own): a local staging folder
is then a ConfigError at the first epoch with ranges to read, before any task runs
(:mod:`splitkeeper.staging` rule 5: staging on such a cluster is an object-store prefix).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from splitkeeper.core.ports import EpochPlan, RegionRun, RegionRunner
from splitkeeper.core.source import SourceConnector
from splitkeeper.core.types import RegionOutcome, Split
from splitkeeper.delta import storage
from splitkeeper.errors import ConfigError
from splitkeeper.spark.faults import FaultPlan
from splitkeeper.spark.readers import ReaderPool
from splitkeeper.spark.regions import RegionStatus, run_regions
from splitkeeper.spark.task import (
    RecordPolicy,
    RegionResult,
    RegionTask,
    WarmTask,
    failed_splits,
    region_task,
    warm_task,
)
from splitkeeper.transforms import Transform

if TYPE_CHECKING:
    from splitkeeper.spark.transform import SparkTransform

__all__ = ["SHARED_DISK_CONF", "LazySpark", "LongLivedRegionRunner", "SparkRegionRunner", "check_staging"]

#: ``false``: the executors share no disk with the driver; a local staging folder is refused.
SHARED_DISK_CONF = "spark.splitkeeper.executors.sharedDisk"

log = logging.getLogger("splitkeeper.spark.runner")


class LazySpark:
    """The pipeline's Spark session, started on first use: a run with nothing to read starts no JVM.

    ``spark`` is a running session, None (a read-only pipeline that runs no region), or a
    zero-argument callable that starts one (:func:`splitkeeper.app.services.spark_session`),
    called once, when an epoch first has ranges to read (or a spark transform needs it).
    """

    def __init__(self, spark: Any) -> None:
        self._start: Callable[[], Any] | None = spark if callable(spark) else None
        self._session: Any = None if callable(spark) else spark

    @property
    def started(self) -> bool:
        """Whether the session exists (given, or started by :meth:`get`)."""
        return self._session is not None

    def get(self) -> Any:
        """The session, started now when it was not yet."""
        if self._session is None and self._start is not None:
            log.info("starting the Spark session: the first epoch with ranges to read")
            self._session = self._start()
        return self._session


class SparkRegionRunner(RegionRunner):
    """The regions of an epoch that have ranges to read as the tasks of one Spark job
    (:func:`~splitkeeper.spark.regions.run_regions`); faults from a :class:`FaultPlan`.

    The driver calls it with the regions that need a task only
    (:func:`~splitkeeper.core.driver.regions_to_run`): a region with nothing to read this epoch is
    acknowledged by the driver and costs no thread, job or staged file here, and an epoch with
    nothing to read anywhere (a final checkpoint, an idle unbounded source) does not call it. A
    fault planned for such a region does not fire (it has no task). ``spark`` is a session or a
    :class:`LazySpark`: the session starts with the first epoch that has ranges to read.
    """

    def __init__(
        self,
        spark: Any,
        pipeline: str,
        connector: SourceConnector,
        transform: Transform,
        staging_path: str,
        faults: FaultPlan,
        interrupt: threading.Event | None = None,
        policy: RecordPolicy | None = None,
        spark_transform: SparkTransform | None = None,
        sink_columns: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        self.spark = spark if isinstance(spark, LazySpark) else LazySpark(spark)
        self.sink_columns = sink_columns  # add_columns: the columns the sink added so far
        self.policy = policy or RecordPolicy()
        self.spark_transform = spark_transform  # transform.kind spark: run per epoch after the regions
        self.interrupt = interrupt  # set: the epoch in its read phase is abandoned (EpochAbandoned)
        self.pipeline = pipeline
        self.connector = connector
        self.transform = transform
        self.staging_path = staging_path
        self.faults = faults
        self._staging_checked = False

    def run(self, epoch: int, plan: EpochPlan, timeout_s: float) -> dict[int, RegionRun]:
        reader = self.connector.reader()
        staged = (
            self.policy if self.spark_transform is None else self.spark_transform.input_policy(self.policy)
        )
        if staged.widen and self.sink_columns is not None:
            staged = replace(staged, columns=tuple(self.sink_columns()))
        payloads = {
            r: RegionTask(
                list(ranges),
                reader,
                self.transform,
                self.staging_path,
                epoch,
                r,
                self.faults.for_region(epoch, r),
                staged,
            )
            for r, ranges in plan.items()
        }
        if payloads and not self._staging_checked:
            check_staging(self.spark.get(), self.staging_path)
            self._staging_checked = True
        runs = self._run_regions(epoch, payloads, timeout_s) if payloads else {}
        out: dict[int, RegionRun] = {}
        for r, run in runs.items():
            if run.status is RegionStatus.FINISHED:
                result: RegionResult = run.result
                out[r] = RegionRun(
                    region_id=r,
                    outcome=RegionOutcome.ACK,
                    positions=dict(result.positions),
                    records=result.records,
                    backlog_finished=tuple(result.backlog_finished),
                    output=result.staged,
                    started_after_s=run.started_after_s,
                    elapsed_s=result.elapsed_s,  # the task's own time
                )
            else:
                outcome = (
                    RegionOutcome.DECLINE if run.status is RegionStatus.FAILED else RegionOutcome.TIMEOUT
                )
                out[r] = RegionRun(
                    region_id=r,
                    outcome=outcome,
                    error=run.error,
                    failed_splits=failed_splits(run.error),  # what checkpoint.on_split_failure counts
                    started_after_s=run.started_after_s,
                    elapsed_s=run.elapsed_s,
                )
        if self.spark_transform is not None:  # within the region timeout too (protocol rule 2.3)
            return self.spark_transform.apply(epoch, out, timeout_s)
        return out

    def _run_regions(self, epoch: int, payloads: dict[int, RegionTask], timeout_s: float) -> dict[int, Any]:
        """Each region's :class:`~splitkeeper.spark.regions.RegionRun`: one Spark job for the epoch."""
        return run_regions(
            self.spark.get(), self.pipeline, epoch, payloads, region_task, timeout_s, interrupt=self.interrupt
        )

    def close(self) -> None:
        """Nothing to release: each epoch's job ended with its epoch."""


class LongLivedRegionRunner(SparkRegionRunner):
    """``readers: long_lived``: the regions of every epoch go to the slots of one Spark job kept for
    the run (:class:`~splitkeeper.spark.readers.ReaderPool`), started with the first epoch that has
    ranges to read, or, in a continuous run, when it opens (:meth:`prepare`: each slot then opens
    its source client for its regions' splits while nothing is to read yet); :meth:`close` ends
    it. Payloads, outcomes and faults are :class:`SparkRegionRunner`'s: only the launch differs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pool: ReaderPool | None = None

    @property
    def pool(self) -> ReaderPool | None:
        """The run's reader slots, once started (None before, and after :meth:`close`)."""
        return self._pool

    def _started_pool(self) -> ReaderPool:
        if self._pool is None:
            self._pool = ReaderPool(self.spark.get(), self.pipeline, region_task, warm=warm_task)
        return self._pool

    def prepare(self, regions: Mapping[int, Sequence[Split]]) -> None:
        """Start the reader job now, a slot per region up to the slot cap, and warm each slot up
        (:func:`~splitkeeper.spark.task.warm_task`: the reader's client for its regions' splits, the
        staging writer) while the run waits for its first records; returns at once."""
        if not regions:
            return
        reader = self.connector.reader()
        self._started_pool().prepare(
            sorted(regions), lambda group: WarmTask(reader, tuple(s for r in group for s in regions[r]))
        )

    def _run_regions(self, epoch: int, payloads: dict[int, RegionTask], timeout_s: float) -> dict[int, Any]:
        return self._started_pool().run_epoch(epoch, payloads, timeout_s, interrupt=self.interrupt)

    def close(self) -> None:
        """End the readers' job (each slot is sent stop; the job group is cancelled if it lingers)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


def check_staging(spark: Any, staging_path: str) -> None:
    """ConfigError when the session's executors share no disk with the driver
    (:data:`SHARED_DISK_CONF` ``false``) and ``staging_path`` is a local folder."""
    shared = str(spark.conf.get(SHARED_DISK_CONF, "true")).strip().lower()
    if shared == "false" and storage.is_local(staging_path):
        raise ConfigError(
            f"staging.path={staging_path!r} is not allowed: a local folder, but the Spark executors share "
            f"no disk with the driver ({SHARED_DISK_CONF}=false, a cluster's setting); remove staging.path "
            "(the default <state>/_staging is on the object store when state is) or set it to an s3:// "
            "prefix",
            key="staging.path",
            value=staging_path,
            allowed="an object-store prefix (s3://, s3a://)",
        )
