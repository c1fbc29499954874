"""The read-only use cases of a pipeline's state: ``status``, the pending work, the metrics text."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from splitkeeper.app.assembly import _local_state_missing, _named, _no_state_error, _pipeline, _state_store
from splitkeeper.app.results import (
    LatestCheckpoint,
    SplitLine,
    StatusResult,
    TimelineLine,
)
from splitkeeper.config.settings import PipelineConfig
from splitkeeper.core.lag import split_lags
from splitkeeper.core.types import CompletedCheckpoint
from splitkeeper.errors import (
    StateError,
)

if TYPE_CHECKING:
    from splitkeeper.core.driver import PendingWork
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.delta.history import TimelineEntry

log = logging.getLogger("splitkeeper.app")


@_named
def metrics_text(config: PipelineConfig) -> str:
    """The Prometheus text the pipeline's last run wrote (``<state>/metrics.prom``). Read-only.

    A StateError says what to do when no run wrote it yet.
    """
    from splitkeeper.app.metrics import metrics_path, read_metrics_text

    text = read_metrics_text(config.state.path)
    if text is None:
        raise StateError(
            f"pipeline {config.name!r} has no metrics yet: {metrics_path(config.state.path)} is written "
            "after each epoch of a run; run the pipeline (splitkeeper run --config ...) first",
            path=metrics_path(config.state.path),
        )
    return text


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
        _discovery_counts(config),
    )


def _discovery_counts(config: PipelineConfig) -> dict[str, int]:
    """The last run's discovery counts, from its metrics text (empty: none, or no metrics extra)."""
    try:
        from splitkeeper.app.metrics import discovery_counts, read_metrics_text

        text = read_metrics_text(config.state.path)
        return discovery_counts(text) if text else {}
    except ImportError:  # the metrics extra is not installed: no run wrote metrics either
        return {}
    except ValueError as err:  # a metrics file that is not Prometheus text: status goes on without
        log.warning("pipeline %s: discovery counts not shown: metrics text unreadable: %s", config.name, err)
        return {}


#: In-run restart checks status shows (the report shows more; the validations table keeps all).
STATUS_RESTART_CHECKS = 5


def _restart_check_lines(store: DeltaStateStore) -> tuple[str, ...]:
    """The latest run of the restart checks (validate) and the latest in-run checks, newest first."""
    from splitkeeper.delta.validations import ValidationRecords

    records = ValidationRecords(store.tables, store.pipeline_name)
    validated = records.recorded(in_run=False, limit=1)
    in_run = records.recorded(in_run=True, limit=STATUS_RESTART_CHECKS)
    return tuple(r.line() for r in (*validated, *in_run))


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
