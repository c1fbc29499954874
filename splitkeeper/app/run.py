"""The ``run`` use case (and ``stop``, which asks a running one to end on a global checkpoint)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import TYPE_CHECKING

from splitkeeper.app.assembly import Progress, _named, _open_summary, _pipeline, spark_session, writer_lease
from splitkeeper.app.results import (
    RunResult,
    StopResult,
)
from splitkeeper.config.settings import PipelineConfig, ReaderMode, with_reader_mode
from splitkeeper.errors import (
    InvalidParameterError,
    RunInterrupted,
    SplitsQuarantinedError,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from splitkeeper.app.pipeline import RunSummary
    from splitkeeper.delta.tables import StateTables

log = logging.getLogger("splitkeeper.app")


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

    tables = StateTables(config.state.path)
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
