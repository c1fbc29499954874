"""The application services: each use case of splitkeeper, once, for the CLI and the Airflow tasks.

``run``, ``recover`` (and ``rescale``), ``preview_recovery``, ``status``,
``validate`` and ``report`` take a validated :class:`PipelineConfig`, do one use
case and return a typed result (:mod:`splitkeeper.app.results`). The CLI
commands (``splitkeeper/commands``) format those results; the Airflow tasks
(``splitkeeper/orchestration/tasks.py``) return their ``to_dict()``. Neither
holds logic of its own.

Read-only services (``status``, ``preview_recovery``, a dry-run ``recover``)
write nothing anywhere: no table is created, no redo is committed, no staging
is cleaned.

The services own the pipeline's lease (protocol rule 5.6): a writing use case takes it
(:func:`writer_lease`, before Spark starts), then assembles the pipeline over it and opens
it; read-only ones take none. :func:`leased_pipeline` is the same for callers that drive
the pipeline themselves (the benchmarks, the tests' helpers).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

from splitkeeper import logs
from splitkeeper.app.results import (
    AUDIT_SHOWN,
    AuditLine,
    EpochLine,
    LatestCheckpoint,
    MaintenanceResult,
    OpenSummary,
    RecoverResult,
    RecoveryPreview,
    RunResult,
    SplitLine,
    StatusResult,
    StopResult,
    TimelineLine,
    ValidationResult,
)
from splitkeeper.config.limits import check_parallelism
from splitkeeper.config.models import TransformKind
from splitkeeper.config.settings import PipelineConfig, ReaderMode, with_reader_mode
from splitkeeper.core.assignment import AssignmentStrategy, WeightedStrategy
from splitkeeper.core.lag import split_lags
from splitkeeper.core.rescale import Redistribution
from splitkeeper.core.types import CompletedCheckpoint, Split
from splitkeeper.errors import (
    CheckpointError,
    InvalidParameterError,
    RunInterrupted,
    SplitsQuarantinedError,
    StateError,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from splitkeeper.app.pipeline import Pipeline, RunSummary
    from splitkeeper.core.driver import OpenReport, PendingWork
    from splitkeeper.core.source import SourceConnector
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.delta.history import TimelineEntry
    from splitkeeper.delta.lease import HeldLease
    from splitkeeper.delta.repair import RepairReport
    from splitkeeper.delta.sink import DeltaSink
    from splitkeeper.delta.tables import StateTables
    from splitkeeper.quality.checks import CheckReport

log = logging.getLogger("splitkeeper.app")

REPORTS_ENV = "SPLITKEEPER_REPORTS_DIR"
RECOVERY_MODES = ("auto", "global", "partial")

Progress = Callable[[str], None]
_R = TypeVar("_R")
_P = ParamSpec("_P")


# --------------------------------------------------------------------------- shared pieces


def checkpoint_id_of(value: object, name: str = "checkpoint_id") -> int | None:
    """The checkpoint a person or a DAG Param names for a recovery: ``'latest'`` (or None, or
    ``''``) is None, else a positive integer, given as one or as its digits; InvalidParameterError
    naming ``name`` otherwise. The one parse of a checkpoint id (CLI and Airflow)."""
    if value in (None, "", "latest"):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and value.isdigit() and int(value) > 0:
        return int(value)
    raise InvalidParameterError(name, value, "'latest' or a checkpoint id (a positive integer)")


def spark_session() -> SparkSession:
    """The driver's Spark session (``SPLITKEEPER_SPARK_*``), UI off."""
    from splitkeeper.spark.session import SparkSettings, get_spark

    return get_spark(SparkSettings.from_env(ui_enabled=False))


def reports_dir(config: PipelineConfig) -> Path:
    """Where the reports go: ``$SPLITKEEPER_REPORTS_DIR/<name>``, else ``<state>/../reports/<name>``."""
    base = os.environ.get(REPORTS_ENV) or os.path.join(
        os.path.dirname(config.state_path.rstrip("/")), "reports"
    )
    return Path(base) / config.name


def _pipeline(
    config: PipelineConfig,
    lease: HeldLease | None,
    *,
    spark: SparkSession | Callable[[], SparkSession] | None = None,
    faults: Iterable[str] = (),
    progress: Progress | None = None,
    read_only: bool = False,
    metrics: bool = True,
    interrupt: threading.Event | None = None,
) -> Pipeline:
    """The pipeline of ``config`` over ``lease`` (the caller took it with :func:`writer_lease`;
    None for a read-only use), on ``spark`` (default :func:`spark_session`, started only when an
    epoch first has ranges to read: a run with nothing new starts no JVM). Not opened. A read-only
    pipeline (a dry run) runs no region, so it starts no Spark unless given a session."""
    from splitkeeper.app.pipeline import Pipeline
    from splitkeeper.spark.faults import FaultPlan

    return Pipeline(
        config,
        spark if spark is not None or read_only else spark_session,  # started by the first read
        faults=FaultPlan.parse(faults),
        progress=progress,
        read_only=read_only,
        lease=lease,
        # <state>/metrics.prom after each epoch (and OTLP when configured)
        metrics=metrics and not read_only,
        interrupt=interrupt,
    )


@contextlib.contextmanager
def leased_pipeline(
    config: PipelineConfig,
    spark: SparkSession | None = None,
    *,
    faults: Iterable[str] = (),
    progress: Progress | None = None,
    metrics: bool = True,
) -> Iterator[Pipeline]:
    """Take the pipeline's lease (:func:`writer_lease`), then assemble the pipeline over it, for a
    caller that opens and drives it itself; on exit the pipeline is closed, then the lease released.

    LeaseHeldError naming the holder, before anything is assembled or written, while another
    run holds it (protocol rule 5.6).
    """
    with writer_lease(config) as lease:
        pipeline = _pipeline(config, lease, spark=spark, faults=faults, progress=progress, metrics=metrics)
        try:
            yield pipeline
        finally:
            pipeline.close()


@contextlib.contextmanager
def writer_lease(config: PipelineConfig) -> Iterator[HeldLease]:
    """Hold the pipeline's lease for a writing use case (protocol rule 5.6); taken before Spark starts.

    The one place that takes it. First the state's object store is probed (a store that does not
    refuse a second put-if-absent is refused with StoreUnsafeError, nothing written). A second
    writer is refused within a second, with LeaseHeldError naming the holder; a holder whose lease
    generation did not move for its ttl while this writer watched (``lease.wait_s``) is taken over
    (logged), and a run whose lease was taken over stops before its next epoch and before any sink
    commit. Released on exit.
    """
    from splitkeeper.delta.lease import PipelineLease, held
    from splitkeeper.delta.probe import probe_store
    from splitkeeper.delta.tables import StateTables
    from splitkeeper.spark.faults import crash_request

    crash_request()  # a misspelt SPLITKEEPER_CRASH_AT fails before the lease table is written
    probe_store(config.state_path)  # the fences need put-if-absent: checked before the first write
    tables = StateTables(config.state_path)  # only the lease table: the pipeline's claim comes with the run
    lease_of = PipelineLease(tables, config.name)
    with held(lease_of, ttl_s=config.lease_ttl_s, wait_s=config.lease_wait_s) as lease:
        yield lease


def _state_store(config: PipelineConfig) -> DeltaStateStore:
    """The pipeline's state store, read-only (no table is created; the source is not asked)."""
    from splitkeeper.delta.checkpoints import DeltaStateStore

    return DeltaStateStore(config.state_path, config.name, None, read_only=True)


def _open_summary(pipeline: Pipeline, opened: OpenReport) -> OpenSummary:
    return OpenSummary.of(opened, pipeline.loads, pipeline.pool_size)


def recovery_mode(mode: str, readers: Sequence[int]) -> str:
    """The mode a recovery runs in: ``auto`` with readers named is ``partial``; the others as given.
    InvalidParameterError for an unknown mode, readers with ``global``, or ``partial`` without readers."""
    if mode not in RECOVERY_MODES:
        raise InvalidParameterError("mode", mode, f"one of {', '.join(RECOVERY_MODES)}")
    if readers and mode == "global":
        raise InvalidParameterError(
            "readers",
            list(readers),
            "none with mode 'global' (a global restore restarts every reader)",
            "name readers with mode 'partial' (or 'auto') to restart only them",
        )
    if mode == "partial" and not readers:
        raise InvalidParameterError(
            "readers",
            list(readers),
            "one or more reader ids with mode 'partial' (the readers to restart, e.g. --readers 2,5)",
            "status shows the per-reader loads; mode 'global' restarts every reader",
        )
    return "partial" if readers else mode


def check_recovery_mode(
    mode: str, parallelism: int | None, parallelism_before: int | None, readers: Sequence[int] = ()
) -> None:
    """``partial`` restarts named readers of the latest checkpoint's parallelism and cannot rescale
    (a partial failover keeps the parallelism, protocol rule 1.3)."""
    mode = recovery_mode(mode, readers)
    if mode == "partial" and parallelism is not None and parallelism != parallelism_before:
        raise InvalidParameterError(
            "mode", mode, "'auto' or 'global' when the parallelism changes (a rescale is a global restore)"
        )
    if len(set(readers)) != len(readers):
        raise InvalidParameterError("readers", list(readers), "distinct reader ids")
    wrong = [r for r in readers if isinstance(r, bool) or not isinstance(r, int) or r < 0]
    if parallelism_before is not None:
        wrong += [r for r in readers if isinstance(r, int) and r >= parallelism_before and r not in wrong]
    if wrong:
        top = (
            ""
            if parallelism_before is None
            else f" < {parallelism_before}, the parallelism of the latest checkpoint"
        )
        raise InvalidParameterError("readers", list(readers), f"reader ids >= 0{top}")


def _named(
    service: Callable[Concatenate[PipelineConfig, _P], _R],
) -> Callable[Concatenate[PipelineConfig, _P], _R]:
    """Every log record of the service carries the pipeline's name (``logs.bind``)."""

    @functools.wraps(service)
    def wrapper(config: PipelineConfig, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with logs.bind(pipeline=config.name):
            return service(config, *args, **kwargs)

    return wrapper


# --------------------------------------------------------------------------- use cases


@_named
def run(
    config: PipelineConfig,
    *,
    epochs: int | None = None,
    until_caught_up: bool = False,
    faults: Iterable[str] = (),
    progress: Progress | None = None,
    reset_backlog: bool = False,
    continuous: bool = False,
    stop: threading.Event | None = None,
    reader_mode: ReaderMode | None = None,
) -> RunResult:
    """Open the pipeline once (recover a half-done epoch, restore), discover, run epochs.

    ``epochs=None`` runs a bounded source to its end; ``until_caught_up`` ends an unbounded
    one on the global checkpoint where every split reached the end it had at the start
    (``epochs`` caps it). ``reset_backlog`` makes every unbounded split's end now its new
    backlog boundary (throughput mode until caught up, protocol rule 4.1). ``reader_mode``: this
    run's ``source.reader_mode`` (None: the file's; ``legacy``: readers keep what they restored).

    ``continuous`` checkpoints every ``backlog.backlog_interval_s`` while any split processes
    backlog and every ``backlog.normal_interval_s`` afterwards, until ``stop`` is set or the
    process gets SIGTERM or SIGINT (an Airflow task's cancel sends SIGTERM): then it ends on
    a final checkpoint that is global, retried until it is, and returns normally.

    A bounded run (not ``continuous``) that gets SIGTERM or SIGINT, or whose ``stop`` is set,
    stops between epochs; an epoch in its read phase is abandoned (its region jobs are
    cancelled, nothing of it is committed, the next run reads it again). The lease is released
    and RunInterrupted is raised (``exit_code`` 143 for SIGTERM, 130 for SIGINT). A run whose
    epochs keep aborting raises RunStalledError (the core driver decides, see
    :meth:`~splitkeeper.core.driver.EpochDriver.run`).
    """
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
        raise InvalidParameterError("epochs", epochs, "an integer >= 1, or None to run until done")
    if continuous and (epochs is not None or until_caught_up):
        raise InvalidParameterError(
            "continuous",
            continuous,
            "alone: a continuous run ends when stopped, not after epochs or caught up",
        )
    from splitkeeper.spark.regions import EpochAbandoned

    config = with_reader_mode(config, reader_mode)
    signals = _SignalStop(stop or threading.Event())
    summary: RunSummary | None = None
    abandoned: int | None = None
    latest: int | None = None

    def started_spark() -> SparkSession:
        session = spark_session()
        signals.install()  # again: starting Spark installs pyspark's own SIGINT handler
        return session

    with signals.installed(), writer_lease(config) as lease:
        pipeline = _pipeline(
            config,
            lease,
            # started by the first epoch with ranges to read: a run with nothing new starts no JVM. A
            # continuous run starts it at once, so that its first epoch keeps the interval schedule
            spark=started_spark() if continuous else started_spark,
            faults=faults,
            progress=progress,
            interrupt=None if continuous else signals.event,
        )
        try:
            opened = _open_summary(pipeline, pipeline.open())
            new_splits = pipeline.discover()
            if reset_backlog:
                pipeline.reset_backlog()
            if continuous:
                summary = pipeline.run_continuously(
                    _stop_check(signals.event, lease.lease.tables, config.name)
                )
            else:
                try:
                    summary = pipeline.run(
                        epochs, until_caught_up=until_caught_up, stop_requested=signals.event.is_set
                    )
                except EpochAbandoned as err:
                    abandoned = err.params["epoch"]
                if signals.event.is_set():
                    latest = max(pipeline.checkpoint_ids(), default=None)
        finally:
            pipeline.close()
    if not continuous and signals.event.is_set():
        raise signals.interrupted(config.name, abandoned, latest, summary)
    assert summary is not None  # only an abandoned epoch leaves none, and it was stopped (above)
    if summary.all_quarantined:
        raise _all_quarantined(config.name, summary)
    return RunResult.of(config.name, opened, new_splits, summary, pipeline.driver.restart_checks)


def _all_quarantined(pipeline: str, summary: RunSummary) -> SplitsQuarantinedError:
    """A run that ends with every split quarantined reads nothing: not "caught up", an error (exit 2,
    a failed Airflow task). Its checkpoints stay committed."""
    parked = ", ".join(summary.quarantined)
    return SplitsQuarantinedError(
        f"pipeline {pipeline!r}: every split is quarantined ({parked}), so nothing is read until one "
        f"is released. This run's {len(summary.epochs)} epoch(s) and {summary.committed_records:,} "
        "record(s) are committed; nothing was lost. 'splitkeeper status' and the report name each "
        "split's error: fix it "
        "(a transform that copes, the data), then 'splitkeeper recover --release SPLIT'; or 'splitkeeper "
        "recover --drop SPLIT' for a split whose data is gone",
        pipeline=pipeline,
        quarantined=list(summary.quarantined),
    )


class _SignalStop:
    """SIGTERM and SIGINT set ``event`` (a stop request) while installed; the first signal is kept.

    Only the main thread can install handlers; elsewhere the event is the only way to stop.
    :meth:`installed` restores the previous handlers when its block ends; :meth:`install` may
    be called again inside it (after something replaced them).
    """

    def __init__(self, event: threading.Event) -> None:
        self.event = event
        self.received: int | None = None
        self._previous: dict[int, signal._HANDLER] = {}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        log.warning("%s: stopping (no new epoch starts; one in its read phase is abandoned)", _name(signum))
        self.event.set()

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.signal(sig, self._handle)
            self._previous.setdefault(sig, previous)

    @contextlib.contextmanager
    def installed(self) -> Iterator[_SignalStop]:
        self.install()
        try:
            yield self
        finally:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            self._previous.clear()

    def interrupted(
        self, pipeline: str, abandoned: int | None, latest: int | None, summary: RunSummary | None
    ) -> RunInterrupted:
        """The one-line error a bounded run that was stopped ends with (exit 128 + the signal)."""
        signum = self.received or signal.SIGTERM  # a caller's stop event counts as a termination request
        if abandoned is not None:
            how = f"epoch {abandoned} was abandoned in its read phase (nothing of it is committed)"
        else:
            done = len(summary.epochs) if summary is not None else 0
            how = f"it stopped between epochs after {done} epoch(s) of this run"
        where = f"latest checkpoint {latest}" if latest is not None else "no checkpoint yet"
        return RunInterrupted(
            f"{_name(signum)}: pipeline {pipeline!r} stopped: {how}; the lease is released ({where}); "
            "run it again to go on from there",
            signal_number=int(signum),
            pipeline=pipeline,
            abandoned_epoch=abandoned,
        )


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _stop_check(
    event: threading.Event, tables: StateTables, pipeline: str, every_s: float = 2.0
) -> Callable[[], bool]:
    """A continuous run's stop: the signal event, or a ``splitkeeper stop`` request since it started
    (the control table is read at most every ``every_s``)."""
    from datetime import UTC, datetime

    from splitkeeper.delta.control import ControlRequests

    requests = ControlRequests(tables, pipeline)
    started = datetime.now(UTC)
    last = [0.0]

    def stop_requested() -> bool:
        if event.is_set():
            return True
        now = time.monotonic()
        if now - last[0] >= every_s:
            last[0] = now
            if requests.stop_requested_since(started):
                log.warning("a stop was requested (splitkeeper stop): ending on a final global checkpoint")
                event.set()
        return event.is_set()

    return stop_requested


@_named
def stop(config: PipelineConfig) -> StopResult:
    """Ask the pipeline's continuous run to end on a final global checkpoint (``splitkeeper stop``).

    Records a stop request in the control table (any host's run sees it within seconds), and
    sends SIGTERM to the lease holder when it runs on this host (it stops at once).
    """
    from splitkeeper.delta.control import ControlRequests
    from splitkeeper.delta.lease import PipelineLease
    from splitkeeper.delta.tables import StateTables

    tables = StateTables(config.state_path)
    holder = PipelineLease(tables, config.name).holder()
    requested_at = ControlRequests(tables, config.name).request_stop()
    signalled = None
    if holder is not None and holder.live() and holder.owner.host == socket.gethostname():
        try:
            os.kill(holder.owner.pid, signal.SIGTERM)
            signalled = holder.owner.pid
        except ProcessLookupError:
            signalled = None
    running = None if holder is None or not holder.live() else holder.owner.describe()
    return StopResult(config.name, requested_at.isoformat(), running, signalled)


@_named
def recover(
    config: PipelineConfig,
    *,
    checkpoint_id: int | None = None,
    parallelism: int | None = None,
    redistribution: Redistribution | None = None,
    mode: str = "auto",
    dry_run: bool = False,
    epochs: int = 1,
    faults: Iterable[str] = (),
    progress: Progress | None = None,
    release: Iterable[str] = (),
    drop: Iterable[str] = (),
    readers: Sequence[int] = (),
    reader_mode: ReaderMode | None = None,
) -> RecoverResult:
    """A global restore from ``checkpoint_id`` (latest by default), optionally a rescale.

    ``mode`` ``partial`` with ``readers`` (``auto`` with readers is partial): after the restore
    (a restarted driver restores every region: no enumerator survives between processes) the
    named readers restart the way a running job restarts a failed reader (protocol rule 1.3,
    FLIP-537's partial failover: each unregisters, the splits assigned to it since the checkpoint
    are added back, it registers again reporting its region's last good state, and the enumerator
    decides each split), the in-run check proves the result, and the epochs' checkpoints may be
    regional as usual. The other readers keep what the restore gave them.

    Every split's recovery decision is in the result. Unless ``dry_run``, ``epochs``
    epochs run so that the new assignment is committed by a checkpoint at the new
    parallelism. A dry run opens read-only: nothing is written anywhere. ``release``:
    quarantined splits to put back (protocol rule 1.8); they are read again from their
    position, and the release is committed with the next checkpoint (so ``epochs`` >= 1).
    ``drop``: live or quarantined splits whose file is gone, forgotten for good (audited
    DROPPED_BY_OPERATOR; refused while the source still lists one), committed the same way.
    """
    config = with_reader_mode(config, reader_mode)  # this recovery's (None: the file's)
    release = tuple(dict.fromkeys(release))
    drop = tuple(dict.fromkeys(drop))
    both = sorted(set(release) & set(drop))
    if both:
        raise InvalidParameterError(
            "drop", both[0], "a split not also given to --release", "release reads it on, drop forgets it"
        )
    if parallelism is not None:
        check_parallelism(parallelism, or_else=", or None to keep it")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise InvalidParameterError("epochs", epochs, "an integer >= 0")
    if epochs == 0 and not dry_run:
        raise InvalidParameterError(
            "epochs",
            epochs,
            "an integer >= 1, or 0 with --dry-run",
            "a recovery (and a release or a drop) is applied by the checkpoint of the epoch after it, so "
            "with 0 epochs nothing would be applied; --dry-run shows the plan without writing",
        )
    if _local_state_missing(config):
        raise _no_state_error(config, "there is nothing to recover")
    if checkpoint_id is not None:  # checked before the lease: a refused recover writes nothing
        _check_restorable(config, checkpoint_id)
    with contextlib.ExitStack() as stack:
        lease = None if dry_run else stack.enter_context(writer_lease(config))  # a dry run writes nothing
        _require_checkpoint_to_recover(config)  # after the lease: a run starting now is refused by it first
        pipeline = _pipeline(config, lease, faults=faults, progress=progress, read_only=dry_run)
        if redistribution is not None:
            pipeline.redistribution = redistribution
        try:
            latest = pipeline.latest_checkpoint()
            check_recovery_mode(mode, parallelism, None if latest is None else latest.parallelism, readers)
            opened = _open_summary(
                pipeline,
                pipeline.open(checkpoint_id=checkpoint_id, parallelism=parallelism, read_only=dry_run),
            )
            failovers: tuple[str, ...] = ()
            failover_audit: tuple[AuditLine, ...] = ()
            if readers:
                failovers, failover_audit = _partial_failover(pipeline, readers)
            released = tuple(s.split_id for s in pipeline.release(release)) if release else ()
            for split_id in released:
                log.warning("split %s released from quarantine: it is read again from its position", split_id)
            dropped = tuple((s.split_id, s.position) for s in pipeline.drop(drop)) if drop else ()
            for split_id, position in dropped:
                log.warning(
                    "split %s dropped by the operator at position %s: its records before it stay in the "
                    "sink, the rest is never read",
                    split_id,
                    position,
                )
            if dry_run or epochs == 0:
                return RecoverResult(
                    config.name,
                    opened,
                    dry_run,
                    released=released,
                    dropped=dropped,
                    restart_checks=tuple(c.line() for c in pipeline.driver.restart_checks),
                    failovers=failovers,
                    failover_audit=failover_audit,
                )
            summary = pipeline.run(epochs)
        finally:
            pipeline.close()
    return RecoverResult(
        config.name,
        opened,
        dry_run,
        epochs=tuple(EpochLine.of(e) for e in summary.epochs),
        checkpoints=summary.counts(),
        committed_records=summary.committed_records,
        released=released,
        dropped=dropped,
        restart_checks=tuple(c.line() for c in pipeline.driver.restart_checks),
        failovers=failovers,
        failover_audit=failover_audit,
    )


def _partial_failover(
    pipeline: Pipeline, readers: Sequence[int]
) -> tuple[tuple[str, ...], tuple[AuditLine, ...]]:
    """``recover --mode partial --readers``: the named readers through the core's partial failover
    (:meth:`~splitkeeper.core.driver.EpochDriver.fail_readers`); a line per reader and the decisions."""
    enumerator = pipeline.enumerator
    assert enumerator is not None
    mark = enumerator.audit_count
    reports = pipeline.driver.fail_readers(list(readers))
    lines = tuple(
        f"reader {f.reader} restarted from its state in checkpoint {f.ref_checkpoint_id} "
        f"(protocol rule 1.3): {len(f.moved)} split(s) changed owner"
        + (f", {f.foreign} from other readers" if f.foreign else "")
        for f in reports
    )
    for line in lines:
        log.warning("partial recovery: %s", line)
    audit = tuple(
        AuditLine(d.split_id, d.reader_id, d.decision.value, d.detail)
        for d in enumerator.audit_since(mark)[:AUDIT_SHOWN]
    )
    return lines, audit


def repair(config: PipelineConfig, *, dry_run: bool = False) -> RepairReport:
    """Rebuild the rows of kept checkpoints lost or damaged after their commit (``recover --repair``,
    :mod:`splitkeeper.delta.repair`); returns its RepairReport. Holds the lease unless ``dry_run``
    (then nothing is written). No Spark: run the pipeline afterwards as usual."""
    from splitkeeper.app.sink import config_sink
    from splitkeeper.delta import storage
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.delta.repair import repair_files, repair_rows, repair_sink_resets
    from splitkeeper.delta.tables import StateTables

    if storage.is_local(config.state_path) and not os.path.isdir(config.state_path):
        raise StateError(
            f"pipeline {config.name!r} has no state at {config.state_path}: nothing to repair",
            path=config.state_path,
        )
    with contextlib.ExitStack() as stack:
        if not dry_run:
            stack.enter_context(writer_lease(config))
        report = repair_files(StateTables(config.state_path, read_only=dry_run), dry_run=dry_run)
        store = DeltaStateStore(config.state_path, config.name, None, read_only=dry_run)
        repair_rows(store, report)
        repair_sink_resets(store, config_sink(config, read_only=True), report, lambda: config_sink(config))
    for path in report.moved:
        log.warning("state repair: %s %s", "would move" if dry_run else "moved aside", path)
    return report


def rescale(
    config: PipelineConfig,
    parallelism: int,
    redistribution: Redistribution = Redistribution.EVEN_SPLIT,
    *,
    checkpoint_id: int | None = None,
    progress: Progress | None = None,
) -> RecoverResult:
    """Change the parallelism from the latest checkpoint (protocol rule 2.8); one epoch commits it.

    ``checkpoint_id``: the checkpoint the caller previewed (None: the latest); a
    CheckpointError when it is no longer the latest.
    """
    return recover(
        config,
        checkpoint_id=checkpoint_id,
        parallelism=parallelism,
        redistribution=redistribution,
        mode="global",
        progress=progress,
    )


@_named
def preview_recovery(config: PipelineConfig, checkpoint_id: int | None = None) -> RecoveryPreview:
    """The checkpoint a recovery would restore and what every reader would report on registration.

    Read-only. CheckpointError when there is no completed checkpoint, or ``checkpoint_id``
    is not the latest (the sink holds what later checkpoints committed).
    """
    store = _state_store(config)
    ids = store.checkpoint_ids()
    if not ids:
        raise CheckpointError(f"pipeline {config.name!r} has no completed checkpoint to recover from")
    cid = checkpoint_id or ids[-1]
    _check_restorable(config, cid, ids)
    checkpoint = store.load_checkpoint(cid)
    enum = checkpoint.enumerator
    return RecoveryPreview(
        pipeline=config.name,
        checkpoint_id=cid,
        kind=checkpoint.kind.value,
        parallelism_before=checkpoint.parallelism,
        pool=0 if enum is None else len(enum.pool),
        owned={} if enum is None else {str(r): len(s) for r, s in sorted(enum.assignments.items())},
        finished=0 if enum is None else len(enum.finished),
        ref_chain=tuple(store.ref_chain(cid)),
        reports={
            str(r): tuple(s.split_id for s in state.splits) for r, state in sorted(checkpoint.regions.items())
        },
    )


@_named
def metrics_text(config: PipelineConfig) -> str:
    """The Prometheus text the pipeline's last run wrote (``<state>/metrics.prom``). Read-only.

    A StateError says what to do when no run wrote it yet.
    """
    from splitkeeper.app.metrics import metrics_path, read_metrics_text

    text = read_metrics_text(config.state_path)
    if text is None:
        raise StateError(
            f"pipeline {config.name!r} has no metrics yet: {metrics_path(config.state_path)} is written "
            "after each epoch of a run; run the pipeline (splitkeeper run --config ...) first",
            path=metrics_path(config.state_path),
        )
    return text


def _check_restorable(config: PipelineConfig, checkpoint_id: int, ids: Sequence[int] | None = None) -> None:
    """``recover --checkpoint N`` restores the latest checkpoint only (the sink holds what later ones
    committed); an older one is a rewind. A CheckpointError saying which, with the ids, otherwise."""
    store = _state_store(config)
    ids = list(store.checkpoint_ids() if ids is None else ids)
    if not ids or checkpoint_id == ids[-1]:
        return
    if checkpoint_id in ids:
        raise CheckpointError(
            f"pipeline {config.name!r}: checkpoint {checkpoint_id} is not the latest ({ids[-1]}): the sink "
            "holds the records of the checkpoints after it, so restoring only the state would read them "
            "twice. To go back to it, rewind state and sink together: "
            f"splitkeeper recover --checkpoint {checkpoint_id} --rewind (prints the plan; --yes applies it). "
            f"Nothing was done; checkpoints that can be restored: {ids[:-1]}",
            checkpoint_id=checkpoint_id,
        )
    why = store.history.why_not_kept(checkpoint_id)
    raise CheckpointError(
        f"pipeline {config.name!r}: checkpoint {checkpoint_id} {why}; nothing was done. available: {ids} "
        f"(recover restores the latest, {ids[-1]}; an older one with --rewind)",
        checkpoint_id=checkpoint_id,
    )


def _local_state_missing(config: PipelineConfig) -> bool:
    """The state folder is a local path that does not exist (never created, or a typo in state.path)."""
    path = config.state_path
    return "://" not in path and not os.path.isdir(path)


def _no_state_error(config: PipelineConfig, what: str) -> StateError:
    origin = f" in {config.origin}" if config.origin else ""
    return StateError(
        f"pipeline {config.name!r} has no state folder at {config.state_path} (state.path{origin}): {what}. "
        "Check the path for a typo; a pipeline that never ran gets its state from its first "
        "'splitkeeper run'",
        pipeline=config.name,
        path=config.state_path,
    )


def _require_checkpoint_to_recover(config: PipelineConfig) -> None:
    """``recover`` restores a checkpoint: refused (nothing written but the lease) when the pipeline has none.

    A first epoch whose sink commit landed without its checkpoint row still counts: the
    restore finishes it from its decision record (a redo).
    """
    from splitkeeper.delta.sink import DeltaSink

    if _state_store(config).checkpoint_ids():
        return
    if DeltaSink(config.sink_path, config.name, read_only=True).committed_epoch() is not None:
        return  # a redo: the sink holds an epoch whose checkpoint row is missing
    raise CheckpointError(
        f"pipeline {config.name!r} has no completed checkpoint to recover from (state at "
        f"{config.state_path}); nothing was done. 'splitkeeper run' starts the pipeline",
        pipeline=config.name,
    )


def next_epoch(config: PipelineConfig) -> int:
    """The id the next epoch of this pipeline will get: 1 for a pipeline that never ran (no state
    folder yet, which :func:`status` refuses as a likely typo). Read-only."""
    if _local_state_missing(config):
        return 1
    return status(config, last=1).next_epoch


@_named
def status(config: PipelineConfig, *, last: int = 10) -> StatusResult:
    """The latest checkpoint, its ref chain and loads, and the last ``last`` timeline entries. Read-only.

    StateError when the state folder is a local path that does not exist (a typo in
    ``state.path``, or a pipeline that never ran); an existing folder without a completed
    checkpoint is a pipeline that has not checkpointed yet.
    """
    if _local_state_missing(config):
        raise _no_state_error(config, "nothing to show")
    store = _state_store(config)
    latest = store.latest_checkpoint()
    info = None
    if latest is not None:
        enum = latest.enumerator
        loads = {r: len(s) for r, s in (enum.assignments.items() if enum else [])}
        info = LatestCheckpoint(
            id=latest.checkpoint_id,
            kind=latest.kind.value,
            parallelism=latest.parallelism,
            consecutive_regional=latest.consecutive_regional,
            processing_backlog=latest.processing_backlog,
            failed_regions=tuple(latest.failed_regions),
            ref_chain=tuple(store.ref_chain(latest.checkpoint_id)),
            loads={str(k): v for k, v in sorted(loads.items())},
            pool=0 if enum is None else len(enum.pool),
            finished_splits=0 if enum is None else len(enum.finished),
            quarantined={} if enum is None else {s.split_id: s.position for s in enum.quarantined},
        )
    history = store.history.timeline()
    timeline = tuple(
        TimelineLine(
            t.checkpoint_id,
            t.kind.value,
            tuple(t.failed_regions),
            t.reason,
            dict(t.phases_ms),
            tuple(f.line() for f in t.failures),
        )
        for t in history[-last:]
    )
    ids = store.checkpoint_ids()
    next_epoch = max(store.latest_plan_epoch() or 0, ids[-1] if ids else 0) + 1
    splits: tuple[SplitLine, ...] = ()
    if latest is not None and latest.enumerator is not None:
        splits = tuple(
            SplitLine(s.split_id, s.status, s.owner, s.position, s.end, s.lag, s.in_backlog)
            for s in split_lags(latest)
        )
    return StatusResult(
        config.name,
        info,
        timeline,
        next_epoch,
        _lease_of(store),
        _interval_switches(history),
        splits,
        _blocking_problems(config, store, latest),
        _restart_check_lines(store),
    )


def _blocking_problems(
    config: PipelineConfig, store: DeltaStateStore, latest: CompletedCheckpoint | None
) -> tuple[str, ...]:
    """What stops the next ``run`` (or leaves it nothing to read), in the words of the error that run
    would raise: the sink behind the latest checkpoint (the rule of the driver's open,
    :func:`~splitkeeper.core.driver.sink_behind`), and every split quarantined
    (:func:`~splitkeeper.core.lag.all_quarantined`). ``status`` shows them and exits 1."""
    from splitkeeper.app.sink import config_sink
    from splitkeeper.core.driver import pending_decision, sink_behind
    from splitkeeper.core.lag import FINISHED, QUARANTINED, all_quarantined, split_places
    from splitkeeper.errors import SplitkeeperError

    if latest is None:
        return ()
    problems: list[str] = []
    try:
        sink = config_sink(config, read_only=True)
        recorded = sink.committed_epoch()
        if pending_decision(store, sink, config.name, recorded) is None:
            behind = sink_behind(config.name, recorded, latest.checkpoint_id)
            if behind is not None:
                problems.append(str(behind))
    except SplitkeeperError as err:
        problems.append(str(err))
    statuses = [p.status for p in split_places(latest).values()]
    parked = statuses.count(QUARANTINED)
    finished = statuses.count(FINISHED)
    if all_quarantined(parked, len(statuses) - parked - finished, finished):
        problems.append(
            f"every split is quarantined ({parked}): nothing is read until one is released "
            "('splitkeeper recover --release SPLIT' once what fails its reads is fixed)"
        )
    return tuple(problems)


#: In-run restart checks status shows (the report shows more; the validations table keeps all).
STATUS_RESTART_CHECKS = 5


def _restart_check_lines(store: DeltaStateStore) -> tuple[str, ...]:
    """The latest run of the restart checks (validate) and the latest in-run checks, newest first."""
    from splitkeeper.delta.validations import ValidationRecords

    records = ValidationRecords(store.tables, store.pipeline_name)
    validated = records.recorded(in_run=False, limit=1)
    in_run = records.recorded(in_run=True, limit=STATUS_RESTART_CHECKS)
    return tuple(r.line() for r in (*validated, *in_run))


@_named
def pending_work(config: PipelineConfig) -> PendingWork:
    """What ``splitkeeper run`` would read if started now, without Spark and without reading a
    record (:meth:`~splitkeeper.core.driver.EpochDriver.pending_work`: the driver's own discovery
    and end offsets over the restored state). Read-only: no lease, nothing written. A pipeline
    that never ran (no state folder) is unsettled: its first run checkpoints."""
    from splitkeeper.core.driver import PendingWork

    if _local_state_missing(config):
        return PendingWork((), True, None)
    pipeline = _pipeline(config, None, read_only=True, metrics=False)
    try:
        pipeline.open(read_only=True)
        return pipeline.pending_work()
    finally:
        pipeline.close()


def _interval_switches(timeline: Sequence[TimelineEntry]) -> tuple[tuple[int, str], ...]:
    """Where the checkpoint interval changed mode, from the timeline's completed checkpoints
    (archived ones too; each records whether the pipeline processes backlog once it completed):
    (the checkpoint after which the mode changed, the new mode), as the run logs it."""
    switches: list[tuple[int, str]] = []
    previous: bool | None = None
    for entry in timeline:
        if entry.processing_backlog is None:  # an aborted attempt
            continue
        if previous is not None and entry.processing_backlog != previous:
            switches.append((entry.checkpoint_id, "backlog" if entry.processing_backlog else "normal"))
        previous = entry.processing_backlog
    return tuple(switches)


def _lease_of(store: DeltaStateStore) -> dict[str, str | bool] | None:
    """Who holds the pipeline's lease (read-only), or None when it never had one."""
    from splitkeeper.delta.lease import PipelineLease

    holder = PipelineLease(store.tables, store.pipeline_name).holder()
    if holder is None:
        return None
    return {
        "holder": holder.owner.describe(),
        "since": holder.acquired_at.isoformat(),
        "until": holder.expires_at.isoformat(),
        "released": holder.released,
    }


def _strategy(config: PipelineConfig) -> str | AssignmentStrategy:
    """The config's strategy as the checks weigh it: ``weighted`` with the configured capacities."""
    if config.strategy == "weighted":
        return WeightedStrategy(capacities=dict(config.capacities))
    return config.strategy


def _source_splits(
    connector: SourceConnector, store: DeltaStateStore, checkpoint_id: int | None
) -> list[Split]:
    """The source's splits as the checked checkpoint knows them: a source that checks split
    identities first learns the layout of the checkpoint's splits (a file read as a new
    version, grown or moved keeps the ids the pipeline gave it), then discovers."""
    from splitkeeper.core.source import SupportsSplitIdentityCheck

    if isinstance(connector, SupportsSplitIdentityCheck):
        checkpoint = (
            store.latest_checkpoint() if checkpoint_id is None else store.load_checkpoint(checkpoint_id)
        )
        snapshot = None if checkpoint is None else checkpoint.enumerator
        if snapshot is not None:
            live = [
                *snapshot.pool,
                *snapshot.quarantined,
                *(s for ss in snapshot.assignments.values() for s in ss),
            ]
            connector.check_splits(live, snapshot.finished_identities)
    splits: list[Split] = connector.discover_splits()
    return splits


def _check_fingerprint(
    config: PipelineConfig, store: DeltaStateStore, connector: SourceConnector, source_splits: Sequence[Split]
) -> dict[str, object]:
    """What the restart checks of the latest checkpoint read: the Delta version of every state and
    sink-side table, the source's fingerprint, subscriptions and splits, and the checks' settings
    (the validations table's ``tables``, :mod:`splitkeeper.delta.validations`). No Spark."""
    import hashlib

    from splitkeeper.delta.schemas import STATE_TABLES
    from splitkeeper.delta.validations import table_versions

    splits = hashlib.sha256(
        "\n".join(sorted(f"{s.split_id}\t{s.position}\t{s.end}" for s in source_splits)).encode()
    ).hexdigest()
    sides = {
        "sink": config.sink_path,
        "changes": config.changes_path if config.upsert is not None else None,
        "dead_letters": config.dead_letter_path,
        "filtered": config.filtered_path,
    }
    return {
        "state": {name: store.table_version(name) for name in STATE_TABLES},
        "sink": table_versions({k: None if v is None else str(v) for k, v in sides.items()}),
        "source": {
            "fingerprint": connector.fingerprint(),
            "subscriptions": sorted(connector.subscriptions()),
            "splits_sha256": splits,
        },
        "settings": {
            "strategy": config.strategy,
            "capacities": {str(k): v for k, v in sorted(dict(config.capacities).items())},
            "max_consecutive_failures": config.checkpoint.max_consecutive_failures,
            "reader_mode": config.source.reader_mode.value,
        },
    }


@_named
def validate(
    config: PipelineConfig,
    checkpoint_id: int | None = None,
    *,
    content: bool = False,
    skip_validated: bool = False,
    reader_mode: ReaderMode | None = None,
) -> ValidationResult:
    """The restart checks (protocol section 6, Great Expectations) on a checkpoint and the sink.

    ``content``: also compare each finished split's committed values with the source's data
    (bounded sources). The sink holds transformed values, so this holds only for a pipeline
    whose transform was always the identity; it is refused with another transform.

    A run of the checks on the latest checkpoint that passes is recorded in the validations table
    (:mod:`splitkeeper.delta.validations`) with the fingerprint of what they read.
    ``skip_validated`` (the DAGs' validate task): when the latest checkpoint passed already with
    the same fingerprint (nothing committed, compacted or discovered since), the checks are not run
    again: the result names that run and its Data Docs (``already_validated_at``), and no Spark
    session starts. An explicit ``checkpoint_id`` or ``content`` always runs the checks.

    ``reader_mode``: the readers' mode the checked run had (None: the file's): legacy readers
    keep what they restored, so the balance suite is skipped for them.

    Raises InvariantViolation naming the split ids when a check fails.
    """
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.delta.tables import StateTables
    from splitkeeper.delta.validations import ValidationRecords
    from splitkeeper.quality.checks import raise_on_failure, run_restart_checks
    from splitkeeper.spark.sources import build_source
    from splitkeeper.transforms import identity, resolve_transform

    config = with_reader_mode(config, reader_mode)
    spark_transform = config.transform_kind is TransformKind.SPARK
    if content and (spark_transform or resolve_transform(config.transform) is not identity):
        raise InvalidParameterError(
            "content",
            content,
            "False for a pipeline with a transform",
            hint=f"the sink holds the values transform {config.transform} made, not the file's lines",
        )
    connector = build_source(config.source)
    try:
        store = DeltaStateStore(config.state_path, config.name, connector.fingerprint(), read_only=True)
        ids = store.ids() if checkpoint_id is None and not content else []
        latest = ids[-1] if ids else None
        source_splits = _source_splits(connector, store, checkpoint_id)
        fingerprint = None if latest is None else _check_fingerprint(config, store, connector, source_splits)
        if latest is not None and fingerprint is not None and skip_validated:
            passed = ValidationRecords(StateTables(config.state_path, read_only=True), config.name).passed(
                latest, fingerprint
            )
            if passed is not None:
                note = (
                    f"checkpoint {latest} was validated at {passed.validated_at.isoformat()} by "
                    f"{passed.validated_by} and nothing it read changed since (no new checkpoint, sink or "
                    f"state commit, source change): the checks were not run again; their report: "
                    f"{passed.data_docs or 'no Data Docs'}"
                )
                log.info("%s", note)
                return ValidationResult(
                    pipeline=config.name,
                    checkpoint_id=latest,
                    success=True,
                    suites=passed.suites,
                    data_docs=passed.data_docs,
                    notes=(note,),
                    already_validated_at=passed.validated_at.isoformat(),
                )
        report = run_restart_checks(
            spark_session,  # started only when the sink has data to scan
            store,
            config.sink_path,
            checkpoint_id=checkpoint_id,
            strategy=_strategy(config),
            max_consecutive_failures=config.checkpoint.max_consecutive_failures,
            subscriptions=connector.subscriptions(),
            data_docs_dir=reports_dir(config) / "data_docs",
            source_splits=source_splits,
            content_reader=connector.reader() if content and connector.bounded else None,
            dead_letter_path=config.dead_letter_path,
            filtered_path=config.filtered_path,
            upsert=config.upsert,
            changes_path=config.changes_path,
            deferred_assignment=config.source.deferred_assignment,
        )
        log.info("%s", report.summary())
        if not report.success:  # recorded before it is raised: the run report says the checks failed
            _record_failed_validation(config, report, fingerprint)
        raise_on_failure(report)
        result = ValidationResult(
            pipeline=config.name,
            checkpoint_id=report.checkpoint_id,
            success=report.success,
            suites={s.key: s.status.value for s in report.suites},
            data_docs=None if report.data_docs_index is None else str(report.data_docs_index),
            notes=tuple(report.notes),
        )
        # recorded only when what the checks read did not move while they ran (a run committing beside)
        if (
            fingerprint is not None
            and report.checkpoint_id == latest
            and _check_fingerprint(config, store, connector, _source_splits(connector, store, None))
            == fingerprint
        ):
            try:
                ValidationRecords(StateTables(config.state_path), config.name).record(
                    latest, fingerprint, result.suites, result.data_docs
                )
            except (StateError, OSError) as err:  # the checks passed; only the shortcut is lost
                log.warning("the passed checks of checkpoint %s were not recorded: %s", latest, err)
    finally:
        connector.close()
    return result


def _record_failed_validation(
    config: PipelineConfig, report: CheckReport, fingerprint: Mapping | None
) -> None:
    """A failed run of the restart checks in the validations table (rule 1 of
    :mod:`splitkeeper.delta.validations`): the report task reads it. A store error only logs."""
    from splitkeeper.delta.tables import StateTables
    from splitkeeper.delta.validations import ValidationRecords

    violations = report.violations()
    detail = "; ".join(f"{v.kind.value}: {v.detail}" for v in violations[:10])
    if len(violations) > 10:
        detail += f" (and {len(violations) - 10} more)"
    try:
        ValidationRecords(StateTables(config.state_path), config.name).record(
            report.checkpoint_id,
            fingerprint or {},
            {s.key: s.status.value for s in report.suites},
            None if report.data_docs_index is None else str(report.data_docs_index),
            verdict="failed",
            detail=detail[:4000],
        )
    except (StateError, OSError) as err:
        log.warning("the failed checks of checkpoint %s were not recorded: %s", report.checkpoint_id, err)


@_named
def maintain(
    config: PipelineConfig, *, history_hours: float | None = None, dry_run: bool = False
) -> MaintenanceResult:
    """Compaction and VACUUM of the state tables and the sink, holding the pipeline's lease.

    Deletes state rows nothing reads any more (deleted checkpoints' enumerator rows, losing
    attempts, plans and decisions older than every kept checkpoint), bin-packs small files,
    and VACUUMs the files commits removed more than ``history_hours`` ago (default:
    ``maintenance.history_hours``). Never a file of a kept checkpoint (and so of a retained
    ref chain) or of an epoch not committed yet. Then removes the leftovers no Delta version names
    once older than ``maintenance.untracked_hours``: files in the sink's folder (a fence loser's, a
    crashed commit's) and staged files of epochs the sink recorded; the staged files of later epochs
    never. ``dry_run`` lists what VACUUM and the leftover removal would remove and changes nothing.
    """
    from splitkeeper.app.sink import config_sink
    from splitkeeper.core.ports import UpkeepCrashPoint
    from splitkeeper.delta import retention
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.spark.faults import crash_if_requested

    hours = config.history_hours if history_hours is None else history_hours
    if isinstance(hours, bool) or not isinstance(hours, int | float) or hours < 0:
        raise InvalidParameterError("history_hours", hours, "hours >= 0")
    untracked_window = config.untracked_hours
    if dry_run:
        store = _state_store(config)
        sink = config_sink(config, read_only=True)
        vacuumed = {name: tuple(files) for name, files in retention.vacuum_plan(store, hours).items()}
        sink_hours = _sink_hours(store, sink, hours)
        vacuumed["sink"] = tuple(sink.vacuum(sink_hours, dry_run=True))
        leftovers = {
            "sink": sink.remove_untracked(untracked_window, sink_hours, dry_run=True),
            "staging": sink.remove_staged_leftovers(untracked_window, dry_run=True),
        }
        return MaintenanceResult(
            config.name, True, hours, {}, {}, vacuumed, *_untracked(leftovers), untracked_window
        )
    with writer_lease(config):  # no run of the pipeline commits while this holds the lease
        store = DeltaStateStore(config.state_path, config.name, None)
        sink = config_sink(config)
        latest = (store.checkpoint_ids() or [0])[-1]
        compaction = retention.compact(
            store, mid_compaction=lambda: crash_if_requested(UpkeepCrashPoint.MID_COMPACTION, latest)
        )
        compacted = {**compaction.compacted_files, "sink": sink.compact()}
        vacuumed = {name: tuple(files) for name, files in retention.vacuum(store, hours).items()}
        sink_hours = _sink_hours(store, sink, hours)
        vacuumed["sink"] = tuple(sink.vacuum(sink_hours))
        leftovers = {
            "sink": sink.remove_untracked(untracked_window, sink_hours),
            "staging": sink.remove_staged_leftovers(untracked_window),
        }
    for table, files in vacuumed.items():
        for path in files:
            log.info("vacuumed %s: %s", table, path)
    for where, found in leftovers.items():
        for path, size in found:
            log.info(
                "removed untracked %s file (%d bytes, older than %g h): %s",
                where,
                size,
                untracked_window,
                path,
            )
    return MaintenanceResult(
        config.name,
        False,
        hours,
        dict(compaction.deleted_rows),
        compacted,
        vacuumed,
        *_untracked(leftovers),
        untracked_window,
    )


def _untracked(found: Mapping[str, Sequence[tuple[str, int]]]) -> tuple[dict[str, tuple[str, ...]], int]:
    """The paths per place, and their bytes in all, of what :func:`maintain` found untracked."""
    paths = {where: tuple(path for path, _size in items) for where, items in found.items()}
    return paths, sum(size for items in found.values() for _path, size in items)


def _sink_hours(store: DeltaStateStore, sink: DeltaSink, hours: float) -> float:
    """The sink's VACUUM keeps at least what a rewind to the oldest retained checkpoint restores."""
    ids = store.checkpoint_ids()
    if not ids:
        return hours
    needed = sink.hours_since(ids[0])
    if needed > hours:
        log.info(
            "sink VACUUM keeps %.1f h (not %.1f h): a rewind to checkpoint %s restores files removed since",
            needed,
            hours,
            ids[0],
        )
    return max(hours, needed)


@_named
def report(config: PipelineConfig, title: str | None = None) -> Path:
    """Render the pipeline's run report (HTML with charts); returns its path."""
    from splitkeeper.report.html import render_report

    out = reports_dir(config)
    docs = out / "data_docs" / "index.html"
    return render_report(
        _state_store(config),
        out,
        sink_path=config.sink_path,
        title=title or f"splitkeeper run report: {config.name}",
        data_docs_index=docs if docs.exists() else None,
        dead_letter_path=config.dead_letter_path,
        upsert=config.upsert,
        changes_path=config.changes_path,
        filtered_path=config.filtered_path,
    )
