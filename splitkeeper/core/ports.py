"""The ports of the epoch driver: what :class:`~splitkeeper.core.driver.EpochDriver` needs from an engine.

The driver (``core/driver.py``) makes every protocol decision: restore and redo,
discovery and plan, checkpoint trigger and acknowledgement, completion, partial
failover, rescale, until-caught-up and finish. It reaches the world only through
the small interfaces below. Two sets of adapters implement them:

- the Spark runtime: region tasks as the tasks of one Spark job per epoch (``splitkeeper/spark``),
  the sink of the pipeline's sink kind (``splitkeeper/sinks``) and the Delta state tables
  (``splitkeeper/delta``), put together by ``splitkeeper/app/pipeline.py``;
- the simulator (``splitkeeper/sim``): in-memory readers, sink and store with
  fault injection, driven through millions of events.

So the simulator checks the very driver that users run. Nothing in this module
imports an engine (protocol rule 0.1 in ``docs/protocol.md``).

Value types that cross a port are immutable and picklable; what a region task
returns crosses from an executor, so :class:`RegionRun` holds plain data and an
opaque ``output`` handle that only the sink adapter interprets.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from splitkeeper.core.failures import RegionFailure
from splitkeeper.core.restarts import RestartCheck
from splitkeeper.core.source import PlannedRange
from splitkeeper.core.types import AuditRecord, CompletedCheckpoint, RegionOutcome, Split

# --------------------------------------------------------------------------- value types


EpochPlan = Mapping[int, Sequence[PlannedRange]]
"""The write-ahead plan of one epoch: every region of the epoch mapped to the ranges it reads."""


@dataclass(frozen=True, slots=True)
class RegionRun:
    """What the driver learns about one region's work in an epoch (returned by a :class:`RegionRunner`).

    ``outcome`` is ACK (the region's task finished and published its output),
    DECLINE (it raised) or TIMEOUT (no answer within ``region_timeout_s``, whether
    it started or not); a DECLINE names in ``failed_splits`` the splits whose read
    failed, when it knows. For an ACK: ``positions`` maps every planned split to its
    new position (the planned end, or the end of the last record read when a range
    was planned mid-record), ``backlog_finished`` lists planned splits that reached
    their backlog boundary, ``records`` counts what was staged and ``output`` is
    the opaque handle of the staged output that the :class:`EpochSink` commits
    (a path for the Spark runtime, a list of ranges in the simulator). ``error``
    says why a region did not acknowledge.
    """

    region_id: int
    outcome: RegionOutcome
    positions: Mapping[str, int] = field(default_factory=dict)
    records: int = 0
    backlog_finished: tuple[str, ...] = ()
    output: Any = None
    error: str = ""
    started_after_s: float | None = None
    elapsed_s: float = 0.0
    failed_splits: tuple[str, ...] = ()  # a DECLINE caused by reading these splits (rule 1.8)

    @property
    def acknowledged(self) -> bool:
        return self.outcome is RegionOutcome.ACK


@dataclass(frozen=True, slots=True)
class EpochDecision:
    """Everything needed to (re)write checkpoint ``checkpoint.checkpoint_id`` after its sink commit.

    Written by the driver to the state store *before* the sink commit
    (:meth:`StateStore.write_decision`); the sink commit names ``attempt_id``. If
    the driver dies between the sink commit and the checkpoint row, the next
    driver reads the decision the sink commit names and commits it as the
    checkpoint (a redo, protocol rule 5.4). ``audit`` holds the recovery and
    assignment decisions persisted with the checkpoint; ``acknowledged`` the
    regions whose output the sink commits; ``configured_parallelism`` the
    pipeline config's parallelism when the checkpoint was taken; ``split_weights``
    the weight of every owned split under the ``weighted`` strategy (its measured
    throughput; empty for other strategies), so a restart check weighs the loads as the
    driver did.
    """

    checkpoint: CompletedCheckpoint
    attempt_id: str
    audit: tuple[AuditRecord, ...] = ()
    acknowledged: tuple[int, ...] = ()
    configured_parallelism: int | None = None
    reason: str = ""
    split_weights: tuple[tuple[str, float], ...] = ()

    @property
    def epoch(self) -> int:
        return self.checkpoint.checkpoint_id


@dataclass(frozen=True, slots=True)
class SinkReceipt:
    """What one sink commit did: ``records`` written, ``replayed`` when the epoch was already committed."""

    epoch: int
    records: int
    replayed: bool = False
    version: int | None = None


class CrashPoint(enum.Enum):
    """Named points of an epoch where a driver may die (protocol rule 5.5); fault tests kill it there.

    In commit order: after the plan is persisted, after the decision record, after
    the sink commit, before the checkpoint row, after the checkpoint row, and in
    the middle of retention (the deleted checkpoints archived to the log, their rows
    not deleted yet; when retention deletes nothing, just before it would).
    """

    AFTER_PLAN = "after_plan"
    AFTER_DECISION = "after_decision"
    AFTER_SINK_COMMIT = "after_sink_commit"
    BEFORE_CHECKPOINT_ROW = "before_checkpoint_row"
    AFTER_CHECKPOINT_ROW = "after_checkpoint_row"
    DURING_RETENTION = "during_retention"


class SinkCrashPoint(enum.Enum):
    """Crash points inside the sink's epoch commit (``SPLITKEEPER_CRASH_AT`` names them like a
    :class:`CrashPoint`); not part of the chaos run's one-driver-per-:class:`CrashPoint` table.

    ``before_side_commit``: the sink commit (the redo record naming the epoch's side-table files:
    dead letters, filtered offsets, an upsert sink's changes) landed, no side table's commit of
    them did. ``before_dead_letter_commit``: the same, just before the dead-letter table's commit
    (the other side tables' commits may have landed).
    """

    BEFORE_SIDE_COMMIT = "before_side_commit"
    BEFORE_DEAD_LETTER_COMMIT = "before_dead_letter_commit"
    #: the staged files moved into the sink's folder, the fenced Delta commit naming them not made (an
    #: append sink; an upsert sink's MERGE moves no data file in)
    AFTER_FILES_MOVED = "after_files_moved"


class UpkeepCrashPoint(enum.Enum):
    """Crash points of ``maintain`` (``SPLITKEEPER_CRASH_AT`` names them like a :class:`CrashPoint`;
    the epoch is the latest checkpoint's). ``mid_compaction``: the state tables' unread rows deleted,
    their files and the sink's not bin-packed yet."""

    MID_COMPACTION = "mid_compaction"


#: Every named crash point ``SPLITKEEPER_CRASH_AT`` may ask for.
AnyCrashPoint = CrashPoint | SinkCrashPoint | UpkeepCrashPoint


# --------------------------------------------------------------------------- ports


class RegionRunner(abc.ABC):
    """Runs one epoch's regions and reports each region's outcome. Called by the driver, once per epoch."""

    @abc.abstractmethod
    def run(self, epoch: int, plan: EpochPlan, timeout_s: float) -> Mapping[int, RegionRun]:
        """Run every region of ``plan`` and return one RegionRun per region.

        The driver passes only the regions that have ranges to read this epoch
        (:func:`splitkeeper.core.driver.regions_to_run`; it acknowledges the idle ones
        itself) and does not call it for an epoch with nothing to read.

        A region that raises is DECLINE; one that has not answered ``timeout_s``
        after the epoch's regions were submitted (started or not: a region that is
        never scheduled times out too) is TIMEOUT and its late output is never
        committed. Must not raise for a region's failure.
        """

    def prepare(self, regions: Mapping[int, Sequence[Split]]) -> None:
        """Get ready to run epochs of ``regions`` (each region id with the unfinished splits it owns).

        Called by the driver on the driver, once, when a continuous run opens, before its first
        epoch is planned (:meth:`~splitkeeper.core.driver.EpochDriver.run_continuously`): a runner
        that keeps its readers for the run may start them now and open what their reads of these
        splits need (a connection and its metadata), so the first epoch that has records to read
        does not pay for it. Bounded runs do not call it. It decides nothing: the epochs' plans,
        outcomes and timeouts are :meth:`run`'s as without it, and a region whose ownership changes
        later is still read where the plan says. May return before the readers are ready; must not
        raise for a reader that cannot get ready (its first epoch then pays, or fails, as without
        it). The default does nothing.
        """
        del regions


class EpochSink(abc.ABC):
    """The exactly-once sink of one pipeline: one fenced, idempotent commit per epoch (protocol rule 5.2).

    The pipeline's *recorded epoch* is the last epoch whose output the sink
    committed. :meth:`commit` lands only when the recorded epoch is exactly
    ``expected`` (the one the driver restored or last committed), checked by the
    commit itself: a writer that committed in between makes it fail with
    :class:`~splitkeeper.errors.ConcurrentRunError`. That one check is the fence
    that keeps two drivers of one pipeline from both committing.
    """

    @abc.abstractmethod
    def committed_epoch(self) -> int | None:
        """The pipeline's recorded epoch, or None when nothing was committed yet."""

    @abc.abstractmethod
    def committed_attempt(self, epoch: int) -> str | None:
        """The decision attempt id that the commit of ``epoch`` names (for a redo); None if unknown."""

    @abc.abstractmethod
    def commit(
        self, epoch: int, outputs: Sequence[RegionRun], *, expected: int | None, attempt_id: str
    ) -> SinkReceipt:
        """Commit the acknowledged regions' ``outputs`` of ``epoch`` as one atomic, fenced commit.

        If ``epoch`` is already the recorded epoch and its commit names
        ``attempt_id``, nothing is written and the receipt says ``replayed``. Raises
        ConcurrentRunError (nothing committed) when the recorded epoch is not
        ``expected``, or another writer committed meanwhile.
        """

    @abc.abstractmethod
    def discard(self, epoch: int) -> None:
        """Drop what regions staged for ``epoch`` that was not committed (idempotent, best effort)."""

    @abc.abstractmethod
    def discard_through(self, epoch: int) -> None:
        """On open: drop every staged output of epochs up to ``epoch`` (they are committed or abandoned)."""


class StateStore(abc.ABC):
    """The persistent state of one pipeline: plans, decisions, checkpoints with enumerator state, history.

    The checkpoint chain and retention rules are the core's
    (:class:`~splitkeeper.core.checkpoint.CheckpointStore`); a store persists
    what the driver hands it, in the order of protocol rule 5.3: plan, decision,
    (sink commit), checkpoint row last. Only the checkpoint row makes a
    checkpoint exist.
    """

    # -- reads --

    @abc.abstractmethod
    def latest_checkpoint(self) -> CompletedCheckpoint | None:
        """The newest completed checkpoint (what a restart restores), or None."""

    @abc.abstractmethod
    def load_checkpoint(self, checkpoint_id: int) -> CompletedCheckpoint:
        """A completed checkpoint; CheckpointError naming the available ids when there is none."""

    @abc.abstractmethod
    def checkpoint_ids(self) -> list[int]:
        """Completed checkpoint ids, ascending."""

    @abc.abstractmethod
    def ref_chain(self, checkpoint_id: int) -> list[int]:
        """``checkpoint_id`` and every checkpoint it references, transitively, newest first."""

    @abc.abstractmethod
    def configured_parallelism(self, checkpoint_id: int) -> int | None:
        """The config's parallelism checkpoint ``checkpoint_id`` was taken under (None: not recorded)."""

    @abc.abstractmethod
    def split_weights(self, checkpoint_id: int) -> Mapping[str, float]:
        """The owned splits' weights checkpoint ``checkpoint_id`` recorded (weighted strategy; else empty)."""

    @abc.abstractmethod
    def latest_plan_epoch(self) -> int | None:
        """The highest epoch ever planned, or None."""

    @abc.abstractmethod
    def decision(self, epoch: int, attempt_id: str) -> EpochDecision | None:
        """The decision record of ``epoch`` with ``attempt_id``, or None when it was never written."""

    # -- writes (never called by a read-only driver) --

    @abc.abstractmethod
    def write_plan(self, epoch: int, plan: EpochPlan) -> None:
        """Persist the write-ahead plan of ``epoch`` before any region reads it.

        Fenced like the sink: planned epochs strictly increase, and a plan of an
        epoch another run planned meanwhile raises ConcurrentRunError.
        """

    @abc.abstractmethod
    def write_decision(self, decision: EpochDecision) -> None:
        """Persist the epoch's decision before its sink commit (the redo record)."""

    @abc.abstractmethod
    def discard_decision(self, epoch: int, attempt_id: str) -> None:
        """Remove the decision record ``(epoch, attempt_id)``: its sink commit certainly did not land.

        Only the run that wrote it calls this, and only after the sink refused its
        commit (the fence, or its staged output missing or damaged), so no sink commit
        names it and no redo can need it (protocol rule 5.2).
        """

    @abc.abstractmethod
    def commit_checkpoint(
        self,
        decision: EpochDecision,
        before_row: Callable[[], None] | None = None,
        *,
        phases_ms: Mapping[str, int] | None = None,
        failures: Sequence[RegionFailure] = (),
    ) -> None:
        """Persist the decided checkpoint: enumerator state and audit rows, the checkpoint row last.

        ``before_row`` is called between the state rows and the checkpoint row (a
        crash point). Idempotent for the same decision (a redo after the row landed
        writes nothing); ConcurrentRunError when another run committed a checkpoint
        with this or a later id. ``phases_ms`` (``plan``, ``read``, ``sink``: milliseconds)
        and ``failures`` (why each failed region failed) go into the row, for status and
        the report (a redo knows neither: NULL).
        """

    @abc.abstractmethod
    def log_attempt(
        self,
        epoch: int,
        outcomes: Mapping[int, RegionOutcome],
        reason: str,
        *,
        failures: Sequence[RegionFailure] = (),
    ) -> None:
        """Record an aborted checkpoint attempt (and why its regions failed) for the timeline
        (never read by restore)."""

    @abc.abstractmethod
    def retain(
        self,
        keep_latest: int,
        pinned: Sequence[int] = (),
        mid_retention: Callable[[], None] | None = None,
    ) -> list[int]:
        """Delete old checkpoints by the core's chain-safe rule; return the deleted ids.

        ``mid_retention`` is called once, after the deleted checkpoints were archived and
        before their rows are deleted (when none is deleted: before returning); a crash point.
        """

    @abc.abstractmethod
    def record_restart_checks(self, checks: Sequence[RestartCheck]) -> None:
        """Keep in-run restart checks (:mod:`splitkeeper.core.restarts`) as history, each when it was
        made, a failed one before the run stops: the run's report and status show them. Never read
        by a restore; a store that cannot write them must not stop the run (it logs)."""


class Clock(abc.ABC):
    """Time as the driver sees it: seconds on a monotonic clock (simulated in the simulator)."""

    @abc.abstractmethod
    def now(self) -> float:
        """Seconds since an arbitrary origin; never goes back."""

    @abc.abstractmethod
    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass (a continuous run waits for its next checkpoint interval)."""


class DriverHooks:
    """Optional callbacks of the driver; the default does nothing.

    ``crash_point`` is called at every :class:`CrashPoint` of an epoch (fault
    tests kill the process there; the simulator may raise to model a crash).
    ``before_epoch`` is called before anything of an epoch is written (the
    runtime checks its pipeline lease there); ``before_sink_commit`` right before
    an epoch's decision record and sink commit (the runtime re-reads its lease
    there and raises when it is no longer this run's: nothing is written). ``progress`` gets one line per
    epoch, ``after_epoch`` the epoch's report (metrics), ``restart_checked`` every in-run restart
    check. Hooks must not change protocol state.
    """

    def crash_point(self, point: CrashPoint, epoch: int) -> None:
        """Called at ``point`` of ``epoch``."""

    def before_epoch(self, epoch: int) -> None:
        """Called before epoch ``epoch`` plans (nothing of it is written yet)."""

    def before_sink_commit(self, epoch: int) -> None:
        """Called right before epoch ``epoch``'s decision record and sink commit; raising stops the
        epoch with nothing of its commit written."""

    def progress(self, line: str, **context: Any) -> None:
        """One human-readable line per epoch; ``context`` names it (epoch, checkpoint_id, kind)."""

    def after_epoch(self, report: Any) -> None:
        """Called with each epoch's EpochReport once the epoch is done (committed or aborted)."""

    def restart_checked(self, check: RestartCheck) -> None:
        """Called with every in-run restart check (passed or failed), before a failed one stops the
        run (metrics, log lines)."""
