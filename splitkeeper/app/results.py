"""Typed results of the application services (:mod:`splitkeeper.app.services`).

Every service returns one of these frozen dataclasses. ``to_dict()`` gives the
JSON-able form the CLI prints with ``--json`` and the Airflow tasks return as
their XCom; field names are stable (tests and DAGs read them).
"""

from __future__ import annotations

import dataclasses
import enum
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from splitkeeper.core.driver import EpochReport, OpenReport, RunSummary
from splitkeeper.core.restarts import RestartCheck

#: Audit records an OpenSummary keeps (a rescale of a large pipeline decides for every split).
AUDIT_SHOWN = 500


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class _Result:
    def to_dict(self) -> dict[str, Any]:
        out = _plain(self)
        assert isinstance(out, dict)
        return out


@dataclass(frozen=True, slots=True)
class AuditLine:
    split_id: str
    reader: int | None
    decision: str
    detail: str


@dataclass(frozen=True, slots=True)
class OpenSummary(_Result):
    """How a pipeline was opened: restored from which checkpoint, what recovery decided."""

    restored_from: int | None
    redone_checkpoint: int | None
    parallelism: int
    previous_parallelism: int | None
    decisions: dict[str, int]
    loads: dict[str, int]
    pool: int
    external_disagreements: tuple[str, ...]
    mode: str
    audit: tuple[AuditLine, ...] = ()
    read_only: bool = False

    @classmethod
    def of(cls, opened: OpenReport, loads: Mapping[int, int], pool: int) -> OpenSummary:
        counts = Counter(d.decision.value for d in opened.decisions)
        return cls(
            restored_from=opened.restored_from,
            redone_checkpoint=opened.redone_checkpoint,
            parallelism=opened.parallelism,
            previous_parallelism=opened.previous_parallelism,
            decisions=dict(sorted(counts.items())),
            loads={str(r): n for r, n in sorted(loads.items())},
            pool=pool,
            external_disagreements=tuple(opened.external_disagreements),
            mode=opened.mode_reason,
            audit=tuple(
                AuditLine(d.split_id, d.reader_id, d.decision.value, d.detail)
                for d in opened.decisions[:AUDIT_SHOWN]
            ),
            read_only=opened.read_only,
        )


@dataclass(frozen=True, slots=True)
class EpochLine:
    epoch: int
    kind: str
    failed_regions: tuple[int, ...]
    committed_records: int
    processing_backlog: bool
    reason: str
    started_at: float  # seconds on the driver's clock (monotonic): for intervals between epochs
    final: bool

    @classmethod
    def of(cls, report: EpochReport) -> EpochLine:
        return cls(
            epoch=report.epoch,
            kind=report.kind.value,
            failed_regions=tuple(sorted(r for r, o in report.outcomes.items() if o.value != "ack")),
            committed_records=report.committed_records,
            processing_backlog=report.processing_backlog,
            reason=report.reason,
            started_at=round(report.started_at, 3),
            final=report.final,
        )


@dataclass(frozen=True, slots=True)
class RunResult(_Result):
    """What ``run`` did: the open (recovery), the discovery, every epoch."""

    pipeline: str
    opened: OpenSummary
    new_splits: int
    epochs: tuple[EpochLine, ...]
    checkpoints: dict[str, int]
    committed_records: int
    finished: bool
    caught_up: bool
    stopped: bool = False  # a continuous run stopped on request, on a global checkpoint
    interval_switches: tuple[str, ...] = ()
    quarantined: tuple[str, ...] = ()  # splits parked (protocol rule 1.8): not read until released
    #: every in-run restart check of the run (a restore proven before it read on), one line each
    restart_checks: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        pipeline: str,
        opened: OpenSummary,
        new_splits: int,
        summary: RunSummary,
        restart_checks: Sequence[RestartCheck] = (),
    ) -> RunResult:
        return cls(
            pipeline=pipeline,
            opened=opened,
            new_splits=new_splits,
            epochs=tuple(EpochLine.of(e) for e in summary.epochs),
            checkpoints=summary.counts(),
            committed_records=summary.committed_records,
            finished=summary.finished,
            caught_up=summary.caught_up,
            stopped=summary.stopped,
            interval_switches=tuple(s.line() for s in summary.interval_switches),
            quarantined=summary.quarantined,
            restart_checks=tuple(c.line() for c in restart_checks),
        )


@dataclass(frozen=True, slots=True)
class RecoverResult(_Result):
    """What ``recover`` (and ``rescale``) did; ``dry_run``: nothing was written anywhere."""

    pipeline: str
    opened: OpenSummary
    dry_run: bool
    epochs: tuple[EpochLine, ...] = ()
    checkpoints: dict[str, int] = field(default_factory=dict)
    committed_records: int = 0
    released: tuple[str, ...] = ()  # quarantined splits put back (recover --release)
    dropped: tuple[tuple[str, int], ...] = ()  # (split, position) forgotten for good (recover --drop)
    restart_checks: tuple[str, ...] = ()  # every in-run restart check of the recovery, one line each
    failovers: tuple[str, ...] = ()  # mode partial: each named reader's restart (protocol rule 1.3)
    failover_audit: tuple[AuditLine, ...] = ()  # mode partial: the decisions of those restarts


@dataclass(frozen=True, slots=True)
class RecoveryPreview(_Result):
    """The checkpoint a recovery would restore, and what each reader would report (read-only)."""

    pipeline: str
    checkpoint_id: int
    kind: str
    parallelism_before: int
    pool: int
    owned: dict[str, int]
    finished: int
    ref_chain: tuple[int, ...]
    reports: dict[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class LatestCheckpoint:
    id: int
    kind: str
    parallelism: int
    consecutive_regional: int
    processing_backlog: bool
    failed_regions: tuple[int, ...]
    ref_chain: tuple[int, ...]
    loads: dict[str, int]
    pool: int
    finished_splits: int
    quarantined: dict[str, int] = field(default_factory=dict)  # parked split -> its position


@dataclass(frozen=True, slots=True)
class TimelineLine:
    id: int
    kind: str
    failed_regions: tuple[int, ...]
    reason: str
    phases_ms: dict[str, int] = field(default_factory=dict)  # plan, read, sink, commit (those recorded)
    failures: tuple[str, ...] = ()  # why each failed region failed (RegionFailure.line())


@dataclass(frozen=True, slots=True)
class SplitLine:
    """One live split at the latest checkpoint (lag: core.backlog.split_lag; None when unknown)."""

    split: str
    status: str  # assigned | pool | quarantined
    owner: int | None
    position: int
    end: int | None
    lag: int | None
    backlog: bool


@dataclass(frozen=True, slots=True)
class StatusResult(_Result):
    """The state of a pipeline as its tables say, read without writing anything."""

    pipeline: str
    latest_checkpoint: LatestCheckpoint | None
    timeline: tuple[TimelineLine, ...]
    next_epoch: int
    lease: dict[str, Any] | None = None
    # checkpoint-interval switches over the whole history: (checkpoint id, "backlog" | "normal"):
    # the checkpoint after which the interval changed to that mode (protocol rule 4.4)
    interval_switches: tuple[tuple[int, str], ...] = ()
    splits: tuple[SplitLine, ...] = ()  # the latest checkpoint's live splits, most lag first
    # what stops the next run or leaves it nothing to read (the sink behind the state, every split
    # quarantined), each in the words of the error; empty when the pipeline can go on
    problems: tuple[str, ...] = ()
    #: the latest run of the restart checks (validate) and the latest in-run checks (each restore
    #: proven before it read on), newest first, one sentence each; see status' restart-check lines
    restart_checks: tuple[str, ...] = ()
    #: what the last run's discovery did, from its metrics (``metrics.prom``): a files source in
    #: notification mode counts ``listings`` (full listings) and ``skipped_events`` (messages of the
    #: event topic that were not S3 events); empty when the last run counted none
    discovery: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ValidationResult(_Result):
    """The restart checks' verdict on one checkpoint (raises before returning when one failed)."""

    pipeline: str
    checkpoint_id: int
    success: bool
    suites: dict[str, str]
    data_docs: str | None
    notes: tuple[str, ...]
    #: set when these checks passed earlier on the same input and were not run again (its time)
    already_validated_at: str | None = None


@dataclass(frozen=True, slots=True)
class MaintenanceResult(_Result):
    """What ``maintain`` removed: state rows nothing reads, compacted files, vacuumed files (paths)."""

    pipeline: str
    dry_run: bool
    history_hours: float
    deleted_rows: dict[str, int]
    compacted_files: dict[str, int]
    vacuumed: dict[str, tuple[str, ...]]
    #: leftovers no Delta version names, older than ``untracked_hours``: ``sink`` (files in the sink's
    #: folder, e.g. a fenced-out loser's), ``staging`` (staged files of epochs the sink recorded)
    untracked: dict[str, tuple[str, ...]] = field(default_factory=dict)
    untracked_bytes: int = 0
    untracked_hours: float = 0.0

    @property
    def vacuumed_count(self) -> int:
        return sum(len(v) for v in self.vacuumed.values())

    @property
    def untracked_count(self) -> int:
        return sum(len(v) for v in self.untracked.values())

    def to_dict(self) -> dict[str, Any]:
        return {**_Result.to_dict(self), "untracked_count": self.untracked_count}


@dataclass(frozen=True, slots=True)
class StopResult(_Result):
    """A stop request: when it was recorded, who runs the pipeline now, and the pid signalled here."""

    pipeline: str
    requested_at: str
    running: str | None
    signalled_pid: int | None
