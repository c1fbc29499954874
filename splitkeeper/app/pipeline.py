"""The Spark runtime of the epoch driver: adapters for the ports of :mod:`splitkeeper.core.ports`.

The protocol (restore and redo, plan, checkpoint, commit order, failover,
rescale, finish) is :class:`splitkeeper.core.driver.EpochDriver`'s. This module
supplies what it runs on:

- :class:`SparkRegionRunner`: every region as its own Spark job
  (:mod:`splitkeeper.spark.regions`), the region task body
  (:func:`splitkeeper.spark.task.run_region_task`) writing one staged parquet
  file per region and attempt;
- :class:`~splitkeeper.delta.sink.DeltaSink`: the exactly-once Delta sink over those
  staged files (delta-rs);
- :class:`~splitkeeper.delta.checkpoints.DeltaStateStore`: the Delta state tables (delta-rs);
- :class:`RuntimeHooks`: crash injection (``SPLITKEEPER_CRASH_AT``) and progress lines.

:class:`Pipeline` puts them together for one pipeline config and Spark session.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from splitkeeper.config.settings import PipelineConfig, core_settings
from splitkeeper.core import driver as core_driver
from splitkeeper.core.driver import (
    EpochDriver,
    EpochReport,
    OpenReport,
    ReaderStateContext,
    RunSummary,
)
from splitkeeper.core.ports import (
    Clock,
    CrashPoint,
    DriverHooks,
    EpochPlan,
    RegionRun,
    RegionRunner,
)
from splitkeeper.core.rescale import Redistribution
from splitkeeper.core.source import SourceConnector
from splitkeeper.core.types import RegionOutcome
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.delta.lease import HeldLease, PipelineLease, held
from splitkeeper.delta.sink import DeltaSink
from splitkeeper.spark.faults import FaultPlan, crash_if_requested, crash_request
from splitkeeper.spark.regions import RegionStatus, run_regions
from splitkeeper.spark.sources import build_source
from splitkeeper.spark.task import FaultKind, RegionResult, failed_splits, run_region_task
from splitkeeper.transforms import Transform, resolve_transform

if TYPE_CHECKING:
    from splitkeeper.app.metrics import PipelineMetrics

__all__ = [
    "EpochReport",
    "OpenReport",
    "Pipeline",
    "ReaderStateContext",
    "RunSummary",
    "RuntimeHooks",
    "SparkRegionRunner",
    "SystemClock",
]

log = logging.getLogger("splitkeeper.app.pipeline")
#: One record per epoch and per interval switch: the run's story (the CLI shows them as bare lines).
PROGRESS_LOG = logging.getLogger("splitkeeper.progress")

OPERATOR_STATE_KEEP = core_driver.OPERATOR_STATE_KEEP


# --------------------------------------------------------------------------- adapters


class SystemClock(Clock):
    """The process's monotonic clock."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class RuntimeHooks(DriverHooks):
    """Crash injection at the driver's crash points (``SPLITKEEPER_CRASH_AT``) and progress lines."""

    def __init__(self, progress: Callable[[str], None] | None = None) -> None:
        crash_request()  # a misspelt SPLITKEEPER_CRASH_AT fails here, before anything is written
        self._progress = progress or (lambda line: None)
        self.lease: HeldLease | None = None  # set while the pipeline holds its lease
        self.metrics: PipelineMetrics | None = None  # set when the run records metrics

    def before_epoch(self, epoch: int) -> None:
        """A run whose lease was taken over (it had expired) stops before it writes anything more."""
        if self.lease is not None:
            self.lease.check()

    def crash_point(self, point: CrashPoint, epoch: int) -> None:
        crash_if_requested(point, epoch)

    def progress(self, line: str, **context: Any) -> None:
        PROGRESS_LOG.info(line, extra=context)
        self._progress(line)

    def after_epoch(self, report: Any) -> None:
        if self.metrics is not None:
            self.metrics.observe(report)


def _region_task(payload: tuple[Any, ...]) -> RegionResult:
    """The body of a region's Spark task (module-level so it pickles by reference).

    A ``flaky`` fault applies to the task's first attempt only: a retry that Spark makes
    (``spark.task.maxFailures`` > 1, as on clusters) runs clean and writes a new attempt.
    """
    fault = payload[-1]
    if fault is not None and fault.kind is FaultKind.FLAKY:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and context.attemptNumber() > 0:
            payload = (*payload[:-1], None)
    return run_region_task(*payload)


class SparkRegionRunner(RegionRunner):
    """Each region of an epoch as its own one-task Spark job; faults from a :class:`FaultPlan`."""

    def __init__(
        self,
        spark: Any,
        pipeline: str,
        connector: SourceConnector,
        transform: Transform,
        staging_path: str,
        faults: FaultPlan,
        interrupt: threading.Event | None = None,
    ) -> None:
        self.spark = spark
        self.interrupt = interrupt  # set: the epoch in its read phase is abandoned (EpochAbandoned)
        self.pipeline = pipeline
        self.connector = connector
        self.transform = transform
        self.staging_path = staging_path
        self.faults = faults

    def run(self, epoch: int, plan: EpochPlan, timeout_s: float) -> dict[int, RegionRun]:
        reader = self.connector.reader()
        payloads = {
            r: (
                list(ranges),
                reader,
                self.transform,
                self.staging_path,
                epoch,
                r,
                None,
                self.faults.for_region(epoch, r),
            )
            for r, ranges in plan.items()
        }
        runs = run_regions(
            self.spark, self.pipeline, epoch, payloads, _region_task, timeout_s, interrupt=self.interrupt
        )
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
                    output=result.staged_path,
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
        return out


# --------------------------------------------------------------------------- the pipeline


class Pipeline:
    """One pipeline on Spark: the core driver with the Spark runtime's adapters.

    Created on the driver; not thread-safe; one per process. ``open()`` restores
    (or starts fresh), ``run_epoch()`` runs one checkpoint attempt, ``run()`` loops
    with progress. Two runs against the same state never both commit: the sink's
    fence stops the later one with ConcurrentRunError. ``read_only`` builds a store
    and sink that create and write nothing, for dry runs (open it read-only too).
    """

    def __init__(
        self,
        config: PipelineConfig,
        spark: Any,
        *,
        faults: FaultPlan | None = None,
        progress: Callable[[str], None] | None = None,
        connector: SourceConnector | None = None,
        read_only: bool = False,
        lease: bool | HeldLease = True,
        metrics: bool = False,
        interrupt: threading.Event | None = None,
    ) -> None:
        hooks = RuntimeHooks(progress)
        self.hooks = hooks
        if isinstance(lease, HeldLease):  # the caller took it (the application services do, before Spark)
            hooks.lease = lease
        self._use_lease = lease is True and not read_only
        if metrics and not read_only:
            hooks.metrics = _metrics_of(config)
        self._held = contextlib.ExitStack()
        self.config = config
        self.spark = spark
        self.faults = faults or FaultPlan()
        self.connector = connector or build_source(config.source)
        self.store = DeltaStateStore(
            config.state_path,
            config.name,
            self.connector.fingerprint(),
            full_snapshot_every=config.checkpoint.full_snapshot_every,
            read_only=read_only,
        )
        self.sink = DeltaSink(
            config.sink_path, config.name, staging_path=config.staging_path, read_only=read_only
        )
        self.transform = resolve_transform(config.transform)
        self.driver = EpochDriver(
            core_settings(config),
            self.connector,
            SparkRegionRunner(
                spark,
                config.name,
                self.connector,
                self.transform,
                config.staging_path,
                self.faults,
                interrupt,
            ),
            self.sink,
            self.store,
            SystemClock(),
            hooks,
        )

    # -- the driver's view, for callers and tests --

    @property
    def redistribution(self) -> Redistribution:
        return self.driver.redistribution

    @redistribution.setter
    def redistribution(self, value: Redistribution) -> None:
        self.driver.redistribution = value

    @property
    def enumerator(self) -> Any:
        return self.driver.enumerator

    @property
    def context(self) -> ReaderStateContext | None:
        return self.driver.context

    @property
    def coordinator(self) -> Any:
        return self.driver.coordinator

    @property
    def operator_state(self) -> dict[int, tuple[str, ...]]:
        return self.driver.operator_state

    @property
    def parallelism(self) -> int:
        return self.driver.parallelism

    def open(
        self, checkpoint_id: int | None = None, parallelism: int | None = None, *, read_only: bool = False
    ) -> OpenReport:
        """Take the pipeline's lease, recover and restore (fresh when there is no checkpoint). Call once.

        One writer per pipeline (protocol rule 5.6): a run that finds the lease held by a live
        run stops here with :class:`~splitkeeper.delta.lease.LeaseHeldError` naming the holder,
        before it writes anything; a lease whose holder stopped heartbeating for
        ``lease.ttl_s`` is taken over. A read-only open takes no lease.
        """
        if self._use_lease and not read_only and self.hooks.lease is None:
            lease = PipelineLease(self.store.tables, self.config.name)
            self.hooks.lease = self._held.enter_context(held(lease, ttl_s=self.config.lease_ttl_s))
        return self.driver.open(checkpoint_id, parallelism, read_only=read_only)

    def run_epoch(self, *, final: bool = False) -> EpochReport:
        return self.driver.run_epoch(final=final)

    def run(
        self,
        epochs: int | None = None,
        *,
        until_caught_up: bool = False,
        stop_requested: Callable[[], bool] | None = None,
    ) -> RunSummary:
        return self.driver.run(epochs, until_caught_up=until_caught_up, stop_requested=stop_requested)

    def close(self) -> None:
        """Release the lease (heartbeats stop) and the source's clients. Idempotent."""
        try:
            self._held.close()
        finally:
            self.hooks.lease = None
            if self.hooks.metrics is not None:
                self.hooks.metrics.close()
                self.hooks.metrics = None
            self.connector.close()


def _metrics_of(config: PipelineConfig) -> PipelineMetrics | None:
    """The run's metrics (``<state>/metrics.prom``, OTLP when configured); None without the packages."""
    from splitkeeper.app.metrics import PipelineMetrics

    try:
        return PipelineMetrics(config.name, config.state_path, config.otlp_endpoint)
    except ImportError as err:  # the metrics extra is not installed: the run goes on without
        log.warning("pipeline %s: no metrics (%s); pip install 'splitkeeper[metrics]'", config.name, err)
        return None
