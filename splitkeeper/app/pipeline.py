"""The Spark runtime of the epoch driver: adapters for the ports of :mod:`splitkeeper.core.ports`.

The protocol (restore and redo, plan, checkpoint, commit order, failover,
rescale, finish) is :class:`splitkeeper.core.driver.EpochDriver`'s. This module
supplies what it runs on:

- :class:`~splitkeeper.spark.runner.SparkRegionRunner`: the regions of an epoch as the tasks of
  one Spark job, each running :func:`splitkeeper.spark.task.region_task`, which stages one parquet
  file per region and attempt;
- the pipeline's sink, of its sink kind (:func:`splitkeeper.app.sink.config_sink`, behind the
  port of :mod:`splitkeeper.sinks.port`): the exactly-once commit of those staged files;
- the pipeline's source, of its source kind (:func:`splitkeeper.sources.build_source`);
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
from typing import TYPE_CHECKING, Any

from splitkeeper.app.sink import config_sink, record_policy, sink_reader
from splitkeeper.config.models import Readers, TransformKind
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
)
from splitkeeper.core.rescale import Redistribution
from splitkeeper.core.restarts import RestartCheck
from splitkeeper.core.source import SourceConnector
from splitkeeper.core.types import CompletedCheckpoint, Split
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.delta.lease import HeldLease
from splitkeeper.sources import build_source
from splitkeeper.spark.faults import PAUSE_ENV, FaultPlan, crash_if_requested, crash_request
from splitkeeper.spark.runner import LazySpark, LongLivedRegionRunner, SparkRegionRunner
from splitkeeper.transforms import Transform, identity, resolve_transform

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
        if hooks.metrics is not None:
            hooks.metrics.watch_source(self.connector)  # its discovery counts (notification mode)
        self.store = DeltaStateStore(
            config.state.path,
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
                self.lazy_spark.get(), config.transform_function, self.policy, config.staging.folder
            )
            dependence = _shuffle_dependence(config, spark_transform)
        else:
            self.transform = resolve_transform(config.transform_function)
        long_lived = config.readers is Readers.LONG_LIVED  # never with a spark transform (config)
        self.runner = (LongLivedRegionRunner if long_lived else SparkRegionRunner)(
            self.lazy_spark,
            config.name,
            self.connector,
            self.transform,
            config.staging.folder,
            self.faults,
            interrupt,
            self.policy,
            spark_transform,
            self._added_columns,
        )
        self.driver = EpochDriver(
            core_settings(config, regions_dependence=dependence),
            self.connector,
            self.runner,
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
            self.runner.close()
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
        f"the spark transform {config.transform_function} shuffles the epoch's records across regions "
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
            config.state.path,
            config.metrics.otlp_endpoint,
            sink=sink_reader(config),
            max_consecutive_failures=config.checkpoint.max_consecutive_failures,
        )
    except ImportError as err:  # the metrics extra is not installed: the run goes on without
        log.warning("pipeline %s: no metrics (%s); pip install 'splitkeeper[metrics]'", config.name, err)
        return None
