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

:class:`Pipeline` puts them together for one pipeline config and Spark session, over the
lease its caller holds: :mod:`splitkeeper.app.services` takes it (``writer_lease``), assembles
and opens the pipeline; a pipeline never takes the lease itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from splitkeeper.app.sink import config_sink
from splitkeeper.config.models import TransformKind
from splitkeeper.config.settings import PipelineConfig, core_settings
from splitkeeper.core import driver as core_driver
from splitkeeper.core.checkpoint import RegionalCheckpointCoordinator
from splitkeeper.core.driver import (
    EpochDriver,
    EpochReport,
    OpenReport,
    PendingWork,
    ReaderStateContext,
    RunSummary,
)
from splitkeeper.core.enumerator import SplitEnumerator
from splitkeeper.core.ports import (
    AnyCrashPoint,
    Clock,
    DriverHooks,
    EpochPlan,
    RegionRun,
    RegionRunner,
)
from splitkeeper.core.rescale import Redistribution
from splitkeeper.core.restarts import RestartCheck
from splitkeeper.core.source import SourceConnector
from splitkeeper.core.types import CompletedCheckpoint, RegionOutcome, Split
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.delta.lease import HeldLease
from splitkeeper.delta.schemas import data_schema
from splitkeeper.errors import ConfigError
from splitkeeper.spark.faults import PAUSE_ENV, FaultPlan, crash_if_requested, crash_request
from splitkeeper.spark.regions import RegionStatus, run_regions
from splitkeeper.spark.sources import build_source
from splitkeeper.spark.task import FaultKind, RecordPolicy, RegionResult, failed_splits, run_region_task
from splitkeeper.transforms import Transform, identity, is_batch, output_schema, resolve_transform

if TYPE_CHECKING:
    from splitkeeper.app.metrics import PipelineMetrics
    from splitkeeper.spark.transform import SparkTransform

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
        crash_request(variable=PAUSE_ENV)  # and a misspelt SPLITKEEPER_PAUSE_AT
        self._progress = progress or (lambda line: None)
        self.lease: HeldLease | None = None  # the lease the pipeline's caller holds for it (None: none)
        self.metrics: PipelineMetrics | None = None  # set when the run records metrics
        self.faults: FaultPlan = FaultPlan()  # the pipeline's injected region faults

    def before_epoch(self, epoch: int) -> None:
        """A run whose lease was taken over (it had expired) stops before it writes anything more."""
        if self.lease is not None:
            self.lease.check()

    def before_sink_commit(self, epoch: int) -> None:
        """A run whose lease is no longer its own (taken over while it was paused) commits nothing."""
        if self.lease is not None:
            self.lease.verify()

    def crash_point(self, point: AnyCrashPoint, epoch: int) -> None:
        crash_if_requested(point, epoch)

    def progress(self, line: str, **context: Any) -> None:
        PROGRESS_LOG.info(line, extra=context)
        self._progress(line)

    def restart_checked(self, check: RestartCheck) -> None:
        """Every in-run restart check: a log line (an error when it failed) and the metrics' counter."""
        if check.passed:
            log.info("restart check: %s", check.line(), extra={"epoch": check.epoch})
        else:
            log.error("restart check: %s", check.line(), extra={"epoch": check.epoch})
        for note in check.notes:
            log.warning("restart check of checkpoint %s: %s", check.checkpoint_id, note)
        if self.metrics is not None:
            self.metrics.restart_checked(check)

    def after_epoch(self, report: Any) -> None:
        for region in report.idle_regions:  # a fault for an idle region has no task to fire in: say so
            if self.faults.for_region(report.epoch, region) is not None:
                log.warning(
                    "fault %s@%s not injected: region %s had nothing to read in epoch %s (no task ran)",
                    region,
                    report.epoch,
                    region,
                    report.epoch,
                    extra={"epoch": report.epoch, "region": region},
                )
        if self.metrics is not None:
            self.metrics.observe(report)


def record_policy(config: PipelineConfig, spark: Any = None) -> RecordPolicy:
    """What the region tasks do with the records' bytes: the pipeline's decode, errors and
    sink.partition_by settings in one small picklable value; its ``schema`` is the sink's.

    A spark transform (``transform.kind: spark``) makes the sink's data columns: what it returns
    for an empty DataFrame of the staged columns, run on ``spark``
    (:meth:`~splitkeeper.spark.transform.SparkTransform.output_data`); the upsert key and
    ``delete_when`` are checked against them (ConfigError). Without a session (maintenance),
    the existing sink table's data columns stand in for them."""
    policy = RecordPolicy(
        decode=config.decode,
        tolerance=config.tolerance.value,
        max_bad_ratio=config.max_bad_ratio,
        partition_by=tuple(config.partition_by),
        upsert=config.upsert,
    )
    if config.transform_kind is TransformKind.SPARK:
        return _spark_transform_policy(config, policy, spark)
    transform = resolve_transform(config.transform)
    if not is_batch(transform):
        return policy
    return replace(policy, data=output_schema(transform, data_schema(config.decode)))


def _spark_transform_policy(config: PipelineConfig, policy: RecordPolicy, spark: Any) -> RecordPolicy:
    from splitkeeper.records.spec import NOT_DATA_COLUMNS
    from splitkeeper.records.upsert import UpsertError
    from splitkeeper.spark.transform import SparkTransform

    if spark is not None:
        data = SparkTransform(spark, config.transform, policy, config.staging_path).output_data()
    else:
        try:
            from deltalake import DeltaTable

            schema = pa.schema(DeltaTable(config.sink_path).schema().to_arrow())
        except Exception:  # noqa: BLE001 - no sink table yet: the decoded columns
            return policy
        data = pa.schema(
            [pa.field(f.name, f.type, nullable=True) for f in schema if f.name not in NOT_DATA_COLUMNS]
        )
    policy = replace(policy, data=data)
    if config.upsert is not None:
        try:
            config.upsert.check_columns(policy.schema.names)
        except UpsertError as err:
            value = list(config.upsert.key) if err.key == "key" else config.upsert.delete_when
            raise ConfigError(
                f"sink.{err.key}={value!r} is not allowed: {err} (the sink's columns are what the spark "
                f"transform {config.transform} returns)",
                key=f"sink.{err.key}",
                value=value,
            ) from None
    return policy


def _region_task(payload: tuple[Any, ...]) -> RegionResult:
    """The body of a region's Spark task (module-level so it pickles by reference).

    A ``flaky`` fault applies to the task's first attempt only: a retry that Spark makes
    (``spark.task.maxFailures`` > 1, as on clusters) runs clean and writes a new attempt.
    """
    fault = payload[7]
    if fault is not None and fault.kind is FaultKind.FLAKY:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and context.attemptNumber() > 0:
            payload = (*payload[:7], None, *payload[8:])
    return run_region_task(*payload)


class SparkRegionRunner(RegionRunner):
    """The regions of an epoch that have ranges to read as the tasks of one Spark job
    (:func:`~splitkeeper.spark.regions.run_regions`); faults from a :class:`FaultPlan`.
    ``max_concurrent`` (config ``max_concurrent_regions``) is accepted and ignored, with a warning.

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
        max_concurrent: int | None = None,
        sink_columns: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        self.spark = spark if isinstance(spark, LazySpark) else LazySpark(spark)
        self.sink_columns = sink_columns  # add_columns: the columns the sink added so far
        if max_concurrent is not None:
            log.warning(
                "max_concurrent_regions=%s is ignored: an epoch's regions are the tasks of one Spark "
                "job, and Spark's cores bound how many run at once; remove the key",
                max_concurrent,
            )
        self.max_concurrent = max_concurrent  # ignored by run_regions (kept for its signature)
        self.policy = policy or RecordPolicy()
        self.spark_transform = spark_transform  # transform.kind spark: run per epoch after the regions
        self.interrupt = interrupt  # set: the epoch in its read phase is abandoned (EpochAbandoned)
        self.pipeline = pipeline
        self.connector = connector
        self.transform = transform
        self.staging_path = staging_path
        self.faults = faults

    def run(self, epoch: int, plan: EpochPlan, timeout_s: float) -> dict[int, RegionRun]:
        reader = self.connector.reader()
        staged = (
            self.policy if self.spark_transform is None else self.spark_transform.input_policy(self.policy)
        )
        if staged.widen and self.sink_columns is not None:
            staged = replace(staged, columns=tuple(self.sink_columns()))
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
                staged,
            )
            for r, ranges in plan.items()
        }
        runs = (
            run_regions(
                self.spark.get(),
                self.pipeline,
                epoch,
                payloads,
                _region_task,
                timeout_s,
                interrupt=self.interrupt,
                max_concurrent=self.max_concurrent,
            )
            if payloads
            else {}
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
        if self.spark_transform is not None:  # within the region timeout too (protocol rule 2.3)
            return self.spark_transform.apply(epoch, out, timeout_s)
        return out


# --------------------------------------------------------------------------- the pipeline


class Pipeline:
    """One pipeline on Spark: the core driver with the Spark runtime's adapters.

    ``spark``: a session, or a zero-argument callable that starts one when an epoch first has
    ranges to read (:class:`LazySpark`): opening, restoring, discovering and a run that finds
    nothing new start no JVM. A spark transform (``transform.kind: spark``) starts it at once.

    Created on the driver; not thread-safe; one per process. ``open()`` restores
    (or starts fresh), ``run_epoch()`` runs one checkpoint attempt, ``run()`` loops
    with progress. Two runs against the same state never both commit: the sink's
    fence stops the later one with ConcurrentRunError. ``read_only`` builds a store
    and sink that create and write nothing, for dry runs (open it read-only too).

    ``lease``: the pipeline's lease, taken and held by the caller (protocol rule 5.6; the
    application services take it with ``writer_lease`` before they assemble the pipeline, and
    release it after :meth:`close`); the run checks it before every epoch and stops with
    LeaseLostError once it was taken over. None: the pipeline runs without one (read-only
    uses; tests of the driver alone).
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
        lease: HeldLease | None = None,
        metrics: bool = False,
        interrupt: threading.Event | None = None,
    ) -> None:
        hooks = RuntimeHooks(progress)
        self.hooks = hooks
        hooks.lease = lease
        if metrics and not read_only:
            hooks.metrics = _metrics_of(config)
        self.config = config
        self.lazy_spark = spark if isinstance(spark, LazySpark) else LazySpark(spark)
        if config.transform_kind is TransformKind.SPARK:
            self.lazy_spark.get()  # the transform's output columns are the sink's: Spark plans them
        self.faults = faults or FaultPlan()
        hooks.faults = self.faults
        self.connector = connector or build_source(config.source)
        self.store = DeltaStateStore(
            config.state_path,
            config.name,
            self.connector.fingerprint(),
            full_snapshot_every=config.checkpoint.full_snapshot_every,
            read_only=read_only,
        )
        self.policy = record_policy(config, self.lazy_spark.get() if self.lazy_spark.started else None)
        self.sink = config_sink(
            config, read_only=read_only, policy=self.policy, crash_point=hooks.crash_point
        )
        spark_transform = None
        self.transform: Transform = identity
        dependence = ""
        if config.transform_kind is TransformKind.SPARK:  # the region tasks stage the records as read
            from splitkeeper.spark.transform import SparkTransform

            spark_transform = SparkTransform(
                self.lazy_spark.get(), config.transform, self.policy, config.staging_path
            )
            dependence = _shuffle_dependence(config, spark_transform)
        else:
            self.transform = resolve_transform(config.transform)
        self.driver = EpochDriver(
            core_settings(config, regions_dependence=dependence),
            self.connector,
            SparkRegionRunner(
                self.lazy_spark,
                config.name,
                self.connector,
                self.transform,
                config.staging_path,
                self.faults,
                interrupt,
                self.policy,
                spark_transform,
                config.max_concurrent_regions,
                self._added_columns,
            ),
            self.sink,
            self.store,
            SystemClock(),
            hooks,
        )

    def _added_columns(self) -> list[str]:
        """The sink's columns beyond the pipeline's schema (``decode.on_new_fields: add_columns``)."""
        configured = set(self.policy.schema.names)
        return [name for name in self.sink.schema.names if name not in configured]

    # -- the driver's view, for callers and tests --

    @property
    def spark(self) -> Any:
        """The Spark session, started now when it was not yet (see :class:`LazySpark`)."""
        return self.lazy_spark.get()

    @property
    def redistribution(self) -> Redistribution:
        return self.driver.redistribution

    @redistribution.setter
    def redistribution(self, value: Redistribution) -> None:
        self.driver.redistribution = value

    @property
    def enumerator(self) -> SplitEnumerator | None:
        """The split enumerator (None until :meth:`open`)."""
        return self.driver.enumerator

    @property
    def context(self) -> ReaderStateContext | None:
        return self.driver.context

    @property
    def coordinator(self) -> RegionalCheckpointCoordinator | None:
        return self.driver.coordinator

    @property
    def operator_state(self) -> dict[int, tuple[str, ...]]:
        return self.driver.operator_state

    @property
    def parallelism(self) -> int:
        return self.driver.parallelism

    @property
    def loads(self) -> dict[int, int]:
        """How many splits each region owns (empty until :meth:`open`)."""
        enumerator = self.driver.enumerator
        return {} if enumerator is None else enumerator.loads()

    @property
    def pool_size(self) -> int:
        """How many splits wait in the enumerator's pool (0 until :meth:`open`)."""
        enumerator = self.driver.enumerator
        return 0 if enumerator is None else enumerator.pool_size

    def checkpoint_ids(self) -> list[int]:
        """The ids of the pipeline's completed checkpoints, oldest first (from its state tables)."""
        return self.store.checkpoint_ids()

    def latest_checkpoint(self) -> CompletedCheckpoint | None:
        """The pipeline's latest completed checkpoint (from its state tables), or None."""
        return self.store.latest_checkpoint()

    def open(
        self, checkpoint_id: int | None = None, parallelism: int | None = None, *, read_only: bool = False
    ) -> OpenReport:
        """Recover and restore (fresh when there is no checkpoint). Call once.

        One writer per pipeline (protocol rule 5.6) is the caller's lease (see the class doc):
        the application services take it before they assemble the pipeline, so a second run is
        refused with :class:`~splitkeeper.delta.lease.LeaseHeldError` naming the holder before
        it writes anything.
        """
        return self.driver.open(checkpoint_id, parallelism, read_only=read_only)

    def discover(self) -> int:
        """Ask the source for its splits now; how many entered the pool (:meth:`EpochDriver.discover`)."""
        return self.driver.discover()

    def pending_work(self) -> PendingWork:
        """What a run would read now, reading nothing (:meth:`EpochDriver.pending_work`)."""
        return self.driver.pending_work()

    def reset_backlog(self) -> dict[str, int]:
        """Every live unbounded split's end now becomes its backlog boundary (protocol rule 4.1)."""
        return self.driver.reset_backlog()

    def release(self, split_ids: Sequence[str]) -> list[Split]:
        """Put quarantined splits back: read again from their position (protocol rule 1.8)."""
        return self.driver.release(split_ids)

    def drop(self, split_ids: Sequence[str]) -> list[Split]:
        """Forget splits the source no longer has, audited (``recover --drop``)."""
        return self.driver.drop(split_ids)

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

    def run_continuously(self, stop_requested: Callable[[], bool]) -> RunSummary:
        """Checkpoint on the backlog/normal intervals until ``stop_requested``, then end on a global
        checkpoint (:meth:`EpochDriver.run_continuously`)."""
        return self.driver.run_continuously(stop_requested)

    def close(self) -> None:
        """Stop the metrics and the source's clients. Idempotent. The lease stays the caller's to
        release (after this)."""
        self.hooks.lease = None
        try:
            if self.hooks.metrics is not None:
                self.hooks.metrics.close()
                self.hooks.metrics = None
        finally:
            self.connector.close()


def _shuffle_dependence(config: PipelineConfig, spark_transform: SparkTransform) -> str:
    """Why the regions of a pipeline with a Spark transform are not independent ('' when they are):
    the transform's plan shuffles the epoch's records (protocol rule 2.9), so one region's output
    may depend on another's records and a region must not fall back alone. Logged; the checkpoint
    mode names it (run output, each checkpoint's reason in status and the report)."""
    if not config.regional_checkpoints:
        return ""  # regions: global says so already
    found = spark_transform.shuffles()
    if not found:
        return ""
    shown = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
    why = (
        f"the spark transform {config.transform} shuffles the epoch's records across regions "
        f"(its physical plan has {len(found)} exchange(s): {shown})"
    )
    log.warning(
        "pipeline %s: %s; every checkpoint is global (set regions: global to say so in the file)",
        config.name,
        why,
    )
    return why


def _metrics_of(config: PipelineConfig) -> PipelineMetrics | None:
    """The run's metrics (``<state>/metrics.prom``, OTLP when configured); None without the packages."""
    from splitkeeper.app.metrics import PipelineMetrics

    try:
        return PipelineMetrics(
            config.name,
            config.state_path,
            config.otlp_endpoint,
            dead_letter_path=config.dead_letter_path,
            max_consecutive_failures=config.checkpoint.max_consecutive_failures,
        )
    except ImportError as err:  # the metrics extra is not installed: the run goes on without
        log.warning("pipeline %s: no metrics (%s); pip install 'splitkeeper[metrics]'", config.name, err)
        return None
