"""The epoch driver: one pipeline's protocol, from restore to checkpoint, behind ports.

:class:`EpochDriver` makes every protocol decision of a running pipeline and
nothing else: it never reads a record, writes a file or starts a job. It talks
to the world through the ports of :mod:`splitkeeper.core.ports` (a region
runner, an exactly-once sink, a state store and a clock) and to the source
through :class:`~splitkeeper.core.source.SourceConnector`. The Spark runtime
and the simulator both run this class; so the simulator checks the driver
users run (protocol rule 0.2 in ``docs/protocol.md``).

One epoch is one checkpoint attempt with a strictly increasing id ``N``
(protocol section 5):

1. discovery: the source's splits enter the enumerator, which decides ownership;
2. the plan: per region, the ranges it reads; persisted before any region reads
   (:meth:`StateStore.write_plan`, fenced);
3. the regions run (:class:`RegionRunner`): each acknowledges, declines or
   times out;
4. acknowledged progress reaches the enumerator (positions first, then finished
   splits, then backlog reports) and the coordinator decides GLOBAL, REGIONAL or
   ABORTED;
5. completed: the decision record is persisted, the acknowledged regions'
   output is committed to the sink in one fenced, idempotent commit that names
   the decision, then the checkpoint row is written (last: it alone makes the
   checkpoint exist);
6. acknowledged regions get their side effects (external offsets), failed
   regions' readers go through partial failover, staged leftovers are dropped
   and retention runs. Aborted: nothing is committed and every reader restarts
   from the latest completed checkpoint (a global restore).

On open, a sink commit newer than the latest checkpoint row (the previous
driver died between the sink commit and the row) is finished from its decision
record (a redo), then the latest checkpoint is restored. Epoch ids continue
after every id ever planned or committed, so an abandoned plan is never reused.

Not thread-safe; one instance per driver process and pipeline.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from splitkeeper.core import defaults
from splitkeeper.core.assignment import (
    AssignmentStrategy,
    ThroughputMeter,
    WeightedStrategy,
    strategy_by_name,
    validate_parallelism,
)
from splitkeeper.core.backlog import BacklogConfig
from splitkeeper.core.checkpoint import (
    CheckpointConfig,
    CheckpointResult,
    CheckpointStore,
    RegionalCheckpointCoordinator,
    RestoredCheckpoint,
)
from splitkeeper.core.enumerator import (
    RecordingEnumeratorContext,
    SplitEnumerator,
    enumerator_for,
    fail_reader,
    restart_reader,
)
from splitkeeper.core.external import positions_to_commit, reconcile_positions
from splitkeeper.core.failures import RegionFailure, clip, region_failure
from splitkeeper.core.lag import all_quarantined
from splitkeeper.core.ports import (
    Clock,
    CrashPoint,
    DriverHooks,
    EpochDecision,
    EpochSink,
    RegionRun,
    RegionRunner,
    StateStore,
)
from splitkeeper.core.rescale import Redistribution
from splitkeeper.core.restarts import (
    RestartCheck,
    RestoreKind,
    check_restart,
    checkpoint_split_ids,
    placed_split_ids,
    restart_check_error,
)
from splitkeeper.core.source import (
    ExternallyCheckpointedSource,
    LostRange,
    PlannedRange,
    SourceConnector,
    SplitChangeKind,
    SupportsInitialDiscovery,
    SupportsRetentionCheck,
    SupportsSplitIdentityCheck,
)
from splitkeeper.core.types import (
    AuditRecord,
    CheckpointKind,
    CompletedCheckpoint,
    ReaderInfo,
    RegionOutcome,
    RegionState,
    Split,
    SplitChangePolicy,
    SplitFailurePolicy,
)
from splitkeeper.errors import (
    CheckpointError,
    ConcurrentRunError,
    InvalidParameterError,
    ProtocolError,
    RunStalledError,
    SourceError,
    StagedOutputError,
    StateError,
)

log = logging.getLogger("splitkeeper.driver")

#: Epoch summaries each region keeps in its list-style operator state (``e<epoch>:n<records>``).
OPERATOR_STATE_KEEP = 8
#: A split with less than ``budget / TAIL_DIVISOR`` left after its budget is planned to its end
#: (no tiny remainder that costs a whole epoch of its own).
TAIL_DIVISOR = 4
#: Aborted epochs in a row after which a bounded run stops (``checkpoint.max_consecutive_aborts``).
MAX_CONSECUTIVE_ABORTS = defaults.MAX_CONSECUTIVE_ABORTS


def idle_acknowledgement(region: int) -> RegionRun:
    """The answer of a region with nothing to read this epoch, given by the driver: no task runs.

    It is what a region task with no ranges would return: an ACK that moves no position,
    finishes no split, stages nothing (``output`` None: the sink commits nothing of it) and
    took no task time. Its regional state is acknowledged unchanged (same splits at the
    same positions; its operator state gets the epoch's ``n0`` summary, as a task's ACK would).
    """
    return RegionRun(region_id=region, outcome=RegionOutcome.ACK)


def regions_to_run(
    plan: Mapping[int, Sequence[PlannedRange]], declined: Mapping[int, RegionRun]
) -> tuple[dict[int, Sequence[PlannedRange]], dict[int, RegionRun]]:
    """Which regions of an epoch's plan need a task (protocol rule 2.1): ``(to_run, idle)``.

    A region with at least one planned range runs (a range the retention check emptied too: its
    position still moves). A region with none is ``idle``: the driver acknowledges it at once
    with :func:`idle_acknowledgement`, so a parallelism far above the split count costs no task,
    thread or job per idle region. Regions in ``declined`` (their plan failed) are in neither.
    """
    to_run: dict[int, Sequence[PlannedRange]] = {}
    idle: dict[int, RegionRun] = {}
    for region, ranges in plan.items():
        if region in declined:
            continue
        if ranges:
            to_run[region] = ranges
        else:
            idle[region] = idle_acknowledgement(region)
    return to_run, idle


def check_retain_checkpoints(value: object) -> None:
    """``retain_checkpoints`` (``checkpoint.retain_checkpoints``): an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidParameterError("retain_checkpoints", value, "an integer >= 1")


def check_quarantine_after(value: object) -> None:
    """``quarantine_after`` (``checkpoint.quarantine_after``): an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidParameterError("quarantine_after", value, "an integer >= 1 (failed epochs in a row)")


def check_recheck_finished_every(value: object) -> None:
    """``recheck_finished_every`` (``source.recheck_finished_every``): an integer >= 1 (epochs)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidParameterError(
            "source.recheck_finished_every",
            value,
            "an integer >= 1 (epochs between checks of finished files; 1: every epoch)",
        )


def check_abort_limit(
    max_consecutive_aborts: object, on_split_failure: SplitFailurePolicy, quarantine_after: int
) -> None:
    """``max_consecutive_aborts`` must be an integer >= 1, and above ``quarantine_after`` under quarantine.

    On a first run, a region whose split cannot be read has no state to fall back to, so every
    epoch aborts until the split is quarantined (after ``quarantine_after`` of them): a run that
    gave up first would never let quarantine free the other splits.
    """
    n = max_consecutive_aborts
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidParameterError("max_consecutive_aborts", n, "an integer >= 1 (aborted epochs in a row)")
    if on_split_failure is SplitFailurePolicy.QUARANTINE and n <= quarantine_after:
        raise InvalidParameterError(
            "max_consecutive_aborts",
            n,
            f"an integer > quarantine_after ({quarantine_after}) when on_split_failure is quarantine",
            "a run must outlast the epochs it takes to quarantine a split that cannot be read",
        )


EnumeratorFactory = Callable[..., SplitEnumerator]
"""``(source, context, strategy, restored=snapshot | None) -> SplitEnumerator`` (:func:`enumerator_for`)."""


# --------------------------------------------------------------------------- settings and reports


@dataclass(frozen=True, slots=True)
class PendingWork:
    """What a run started now would read (:meth:`EpochDriver.pending_work`), found without reading.

    ``splits``: the ids of the splits with something to read (a bounded source's unfinished
    and new splits; an unbounded source's live splits behind their available end, and new
    ones), sorted. ``unsettled``: the latest checkpoint is not a global one at this parallelism
    (or there is none, or a split changed): a run checkpoints even with nothing to read.
    ``checkpoint_id``: the latest checkpoint the answer is relative to (None: none yet).
    """

    splits: tuple[str, ...]
    unsettled: bool
    checkpoint_id: int | None

    @property
    def any(self) -> bool:
        """A run started now would run an epoch."""
        return self.unsettled or bool(self.splits)


@dataclass(frozen=True, slots=True)
class DriverSettings:
    """What the driver needs of a pipeline's configuration (engine-free; validated by the core types).

    ``parallelism`` is the configured one (a restore keeps a checkpoint's
    parallelism unless the configuration changed since, see :meth:`EpochDriver.open`).
    ``strategy`` names an assignment strategy, ``strategy_options`` are its
    constructor options (weights and capacities of ``weighted``).
    """

    pipeline: str
    parallelism: int
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    backlog: BacklogConfig = field(default_factory=BacklogConfig)
    retain_checkpoints: int = defaults.RETAIN_CHECKPOINTS
    strategy: str = defaults.STRATEGY
    strategy_options: Mapping[str, Any] = field(default_factory=dict)
    redistribution: Redistribution = Redistribution.EVEN_SPLIT
    rebalance_threshold: float = defaults.REBALANCE_THRESHOLD  # weighted: imbalance (max/min) that re-weights
    on_split_failure: SplitFailurePolicy = defaults.ON_SPLIT_FAILURE
    quarantine_after: int = defaults.QUARANTINE_AFTER  # quarantine: failed epochs in a row before parking
    max_consecutive_aborts: int = MAX_CONSECUTIVE_ABORTS  # a bounded run stops after this many in a row
    on_file_change: SplitChangePolicy = defaults.ON_FILE_CHANGE  # a known split's data changed (rule 1.9)
    recheck_finished_every: int = defaults.RECHECK_FINISHED_EVERY  # epochs between checks of finished splits

    def __post_init__(self) -> None:
        if not isinstance(self.pipeline, str) or not self.pipeline:
            raise InvalidParameterError("pipeline", self.pipeline, "a non-empty pipeline name")
        validate_parallelism(self.parallelism)
        check_retain_checkpoints(self.retain_checkpoints)
        if not isinstance(self.redistribution, Redistribution):
            raise InvalidParameterError("redistribution", self.redistribution, "a Redistribution")
        if not isinstance(self.on_split_failure, SplitFailurePolicy):
            raise InvalidParameterError("on_split_failure", self.on_split_failure, "a SplitFailurePolicy")
        if not isinstance(self.on_file_change, SplitChangePolicy):
            raise InvalidParameterError("on_file_change", self.on_file_change, "a SplitChangePolicy")
        check_quarantine_after(self.quarantine_after)
        check_recheck_finished_every(self.recheck_finished_every)
        check_abort_limit(self.max_consecutive_aborts, self.on_split_failure, self.quarantine_after)
        threshold = self.rebalance_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not threshold >= 1.0:
            raise InvalidParameterError("rebalance_threshold", threshold, "a ratio >= 1.0 (max / min load)")

    def new_strategy(self) -> AssignmentStrategy:
        return strategy_by_name(self.strategy, **dict(self.strategy_options))


@dataclass(frozen=True, slots=True)
class FailoverReport:
    """One partial failover (protocol rule 1.3): which reader, from which state, which splits moved."""

    reader: int
    ref_checkpoint_id: int | None
    moved: tuple[str, ...]  # split ids whose owner changed
    foreign: int  # of those, how many another reader owned before (sticky strategies: 0)


@dataclass(frozen=True, slots=True)
class EpochReport:
    """What one epoch did, for progress output, status, the simulator's checks and tests."""

    epoch: int
    kind: CheckpointKind
    outcomes: dict[int, RegionOutcome]
    records: int
    committed_records: int
    processing_backlog: bool
    reason: str
    elapsed_s: float
    region_errors: dict[int, str] = field(default_factory=dict)
    final: bool = False
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase: plan, read, decide, ...
    lost: tuple[LostRange, ...] = ()  # ranges the plan skipped because the source no longer had them
    completed: CompletedCheckpoint | None = None
    failovers: tuple[FailoverReport, ...] = ()
    refused: bool = False  # the enumerator refused the checkpoint: a restore still waits for reports
    started_at: float = 0.0  # the driver clock when the epoch started
    region_task_s: dict[int, float] = field(default_factory=dict)  # acked region -> RegionRun.elapsed_s
    #: regions with nothing to read this epoch: acknowledged by the driver, no task (no entry in
    #: ``region_task_s``); see :func:`idle_acknowledgement`
    idle_regions: tuple[int, ...] = ()

    def line(self) -> str:
        failed = {r: o.value for r, o in self.outcomes.items() if o is not RegionOutcome.ACK}
        regions = f"{len(self.outcomes) - len(failed)}/{len(self.outcomes)} regions ack"
        if failed:
            regions += " (" + ", ".join(f"r{r} {o}" for r, o in sorted(failed.items())) + ")"
        mode = "backlog" if self.processing_backlog else "normal"
        lost = ""
        if self.lost:
            lost = f" LOST {sum(r.count for r in self.lost):,} offsets of {len(self.lost)} split(s) (skip)"
        return (
            f"epoch {self.epoch:>4} {self.kind.value:<8} {regions:<34} "
            f"committed {self.committed_records:>9,} records  [{mode}] {self.elapsed_s:6.2f}s "
            + " ".join(f"{k}={v:.2f}" for k, v in self.phases.items())
            + lost
        )


@dataclass(frozen=True, slots=True)
class IntervalSwitch:
    """A continuous run changed its checkpoint interval (protocol rule 4.4): after checkpoint ``after``."""

    after: int
    processing_backlog: bool  # the mode from now on
    interval_s: float

    def line(self) -> str:
        mode = "backlog" if self.processing_backlog else "normal"
        return (
            f"checkpoint interval switched to the {mode} interval ({self.interval_s:g}s) "
            f"after checkpoint {self.after}"
        )


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What :meth:`EpochDriver.run` did."""

    epochs: tuple[EpochReport, ...]
    finished: bool  # a bounded source was read completely and ended on a global checkpoint
    committed_records: int
    caught_up: bool = False  # until_caught_up: every split reached its end at the start, globally
    stopped: bool = False  # a continuous run that stopped on request, on a global checkpoint
    interval_switches: tuple[IntervalSwitch, ...] = ()
    quarantined: tuple[str, ...] = ()  # splits parked at the end (read by nobody until released)
    interrupted: bool = False  # a bounded run that stopped between epochs because a stop was requested
    all_quarantined: bool = False  # every split is quarantined: nothing is read (core.lag.all_quarantined)

    def counts(self) -> dict[str, int]:
        out = {k.value: 0 for k in CheckpointKind}
        for e in self.epochs:
            out[e.kind.value] += 1
        return out


@dataclass(frozen=True, slots=True)
class OpenReport:
    """How the pipeline started: fresh, or restored from which checkpoint, and what recovery did.

    ``redone_checkpoint`` is the checkpoint a redo committed from its sink commit;
    in a read-only open it is the one a redo *would* commit (nothing is written).
    """

    restored_from: int | None
    redone_checkpoint: int | None
    parallelism: int
    previous_parallelism: int | None
    decisions: tuple[AuditRecord, ...]
    external_disagreements: tuple[str, ...] = ()
    mode_reason: str = ""
    read_only: bool = False


class ReaderStateContext(RecordingEnumeratorContext):
    """The enumerator context of the driver: assignments land in the readers' driver-side views.

    Readers are logical in the driver (reader ``r`` runs as region ``r``'s task
    each epoch); what a reader owns and where it stands is kept here and becomes
    the next plan. Only the enumerator changes it, through :meth:`assign_splits`
    and :meth:`revoke_splits` (and the restored splits a legacy reader keeps).
    """

    def __init__(self, parallelism: int) -> None:
        super().__init__(parallelism)
        self.reader_splits: dict[int, dict[str, Split]] = {}

    def assign_splits(self, assignment: Mapping[int, Sequence[Split]]) -> None:
        super().assign_splits(assignment)
        for reader, splits in assignment.items():
            mine = self.reader_splits.setdefault(reader, {})
            for split in splits:
                mine[split.split_id] = split

    def revoke_splits(self, revocation: Mapping[int, Sequence[str]]) -> None:
        super().revoke_splits(revocation)
        for reader, ids in revocation.items():
            mine = self.reader_splits.get(reader, {})
            for sid in ids:
                mine.pop(sid, None)

    def update_splits(self, updates: Mapping[int, Sequence[Split]]) -> None:
        super().update_splits(updates)
        for reader, splits in updates.items():
            mine = self.reader_splits.get(reader, {})
            for split in splits:
                if split.split_id in mine:  # the reader's position stays; the new metadata is taken
                    mine[split.split_id] = split.at(mine[split.split_id].position)


class _ReadOnly(ProtocolError):
    """A read-only driver reached a write (a bug: read-only opens never run epochs)."""


#: In-run restart checks a driver keeps in memory (the state store keeps every one).
RESTART_CHECKS_KEPT = 1000


@dataclass(frozen=True, slots=True)
class _Unproven:
    """A restore whose in-run check waits for the last reader to register (protocol rule 1.4)."""

    kind: RestoreKind
    checkpoint_id: int | None
    must_be_live: frozenset[str]
    audit_mark: int
    readers: tuple[int, ...]
    notes: tuple[str, ...] = ()


# --------------------------------------------------------------------------- the driver


def sink_behind(pipeline: str, recorded: int | None, latest: int) -> StateError | None:
    """The error that stops every open when the sink records fewer epochs than the state's latest
    checkpoint counts as read (rule 5.3: every checkpoint follows its epoch's sink commit): the sink
    lost commits, or an operator checkpoint's sink commit was never recorded (an offset reset of a
    splitkeeper before issue 36 that deleted nothing, item 14). None when the sink is not behind.
    The one rule :meth:`EpochDriver.open` and ``status`` apply."""
    if recorded is not None and recorded >= latest:
        return None
    first = 1 if recorded is None else recorded + 1
    records = (
        "the sink has no commit of this pipeline"
        if recorded is None
        else f"the sink records epoch {recorded} as its last commit"
    )
    lost = f"epoch {latest}" if first == latest else f"epochs {first} to {latest}"
    return StateError(
        f"pipeline {pipeline!r}: {records}, but "
        f"the state's latest checkpoint is {latest}, which counts the records of {lost} as "
        "written: the sink lost those commits (an entry of its _delta_log removed or rolled back, or "
        "an older copy of the sink table). Nothing was restored and nothing was changed: the "
        "checkpoint's positions would skip those records. Restore the sink table from a backup that "
        f"holds epoch {latest}, then run again; when those checkpoints are offset resets (splitkeeper "
        "offsets reset), 'splitkeeper recover --repair' records them in the sink instead",
        pipeline=pipeline,
        sink_epoch=recorded,
        checkpoint_id=latest,
    )


def pending_decision(
    state: StateStore, sink: EpochSink, pipeline: str, committed: int | None
) -> EpochDecision | None:
    """The decision of the epoch whose sink commit landed after the latest checkpoint row (a redo
    is pending, protocol rule 5.4), or None. ``committed`` is the sink's recorded epoch. A sink
    commit without its decision record is a CheckpointError: state and sink do not belong together."""
    latest_id = max(state.checkpoint_ids(), default=0)
    if committed is None or committed <= latest_id:
        return None
    attempt = sink.committed_attempt(committed)
    decision = None if attempt is None else state.decision(committed, attempt)
    if decision is None:
        raise CheckpointError(
            f"pipeline {pipeline!r}: the sink holds epoch {committed}, newer than the "
            f"latest checkpoint {latest_id or 'none'}, but its decision record (attempt {attempt}) is "
            "not in the state store, so the checkpoint cannot be redone. The state store and the sink "
            "do not belong together (restore the state directory that wrote this sink, or point the "
            "pipeline at a fresh sink)",
            checkpoint_id=committed,
            attempt_id=attempt,
        )
    return decision


class EpochDriver:
    """Drives one pipeline through epochs; every protocol decision is made here (see the module doc).

    Created on the driver process with its adapters. ``open()`` recovers and
    restores (or starts fresh), ``run_epoch()`` runs one checkpoint attempt,
    ``run()`` loops until a bounded source is done, until caught up, or for a
    number of epochs. ``read_only`` opens write nothing at all (dry runs, status):
    no redo is committed, no staging is cleaned, and epochs cannot run.
    """

    def __init__(
        self,
        settings: DriverSettings,
        source: SourceConnector,
        runner: RegionRunner,
        sink: EpochSink,
        state: StateStore,
        clock: Clock,
        hooks: DriverHooks | None = None,
        *,
        enumerator_factory: EnumeratorFactory | None = None,
    ) -> None:
        self.settings = settings
        self.source = source
        self.runner = runner
        self.sink = sink
        self.state = state
        self.clock = clock
        self.hooks = hooks or DriverHooks()
        self._enumerator_factory = enumerator_factory or enumerator_for
        self.redistribution = settings.redistribution
        self.context: ReaderStateContext | None = None
        self.enumerator: SplitEnumerator | None = None
        self.coordinator: RegionalCheckpointCoordinator | None = None
        self.operator_state: dict[int, tuple[str, ...]] = {}
        self.last_restore: RestoredCheckpoint | None = None  # what the latest restore redistributed
        self.meter = ThroughputMeter()  # per-split arrival rates: the weighted strategy's weights
        self._failing: dict[str, tuple[int, str]] = {}  # split -> (failed epochs in a row, last error)
        self._unplannable: dict[int, dict[str, str]] = {}  # this epoch: region -> split -> why not planned
        self.restores = 0  # global restores so far (open, abort, explicit)
        self.split_changes = 0  # changes of known splits (rule 1.9) the latest discovery applied
        self._audit_persisted = 0
        self._settled = False  # restored from a global checkpoint at the same parallelism, nothing run yet
        self._next_epoch = 1
        self._recheck_at = 0  # the epoch from which the next discovery checks finished splits too
        self._recorded: int | None = None  # the sink's recorded epoch this driver expects (the fence)
        self._read_only = False
        self.opened: OpenReport | None = None
        #: the in-run restart checks of this driver, oldest first (the last RESTART_CHECKS_KEPT)
        self.restart_checks: list[RestartCheck] = []
        self._unproven: _Unproven | None = None

    # -- start / restore -------------------------------------------------------------------

    @property
    def parallelism(self) -> int:
        if self.context is None:
            raise ProtocolError("the driver is not open: call open() first")
        return self.context.parallelism

    @property
    def next_epoch(self) -> int:
        """The id the next epoch gets."""
        return self._next_epoch

    def open(
        self,
        checkpoint_id: int | None = None,
        parallelism: int | None = None,
        *,
        read_only: bool = False,
    ) -> OpenReport:
        """Recover (redo an epoch whose sink commit has no checkpoint row yet) and restore. Call once.

        ``checkpoint_id`` must be the latest checkpoint (an older one would read
        again what the sink already holds); None restores the latest, or starts
        fresh when there is none. ``parallelism`` rescales (None: the checkpoint's,
        unless the configuration's changed since). ``read_only``: nothing is
        written; a pending redo is applied in memory only and reported.
        """
        self._read_only = read_only
        # The sink's recorded epoch is read once, before anything else: it is what this run's first
        # commit expects (protocol rule 5.2). A second read later could see a commit another run landed
        # after the checkpoint was chosen, and the fence would then accept an epoch that reads again
        # what that commit holds.
        recorded = self.sink.committed_epoch()
        redone, pending = self._redo(recorded, dry=read_only)
        latest = pending.checkpoint if pending is not None else self.state.latest_checkpoint()
        behind = (
            None if latest is None else sink_behind(self.settings.pipeline, recorded, latest.checkpoint_id)
        )
        if behind is not None:
            raise behind
        chosen = latest
        if checkpoint_id is not None:
            if pending is not None and checkpoint_id == pending.epoch:
                chosen = pending.checkpoint
            else:
                chosen = self.state.load_checkpoint(checkpoint_id)
            if latest is not None and latest.checkpoint_id != chosen.checkpoint_id:
                raise CheckpointError(
                    f"checkpoint {checkpoint_id} is not the latest ({latest.checkpoint_id}): the sink "
                    "already holds the records of checkpoints after it, so restoring it would read them "
                    f"twice; recover from 'latest' (or {latest.checkpoint_id})",
                    checkpoint_id=checkpoint_id,
                    latest=latest.checkpoint_id,
                )
        self._recorded = recorded
        last_planned = self.state.latest_plan_epoch() or 0
        last_done = 0 if chosen is None else chosen.checkpoint_id
        self._next_epoch = max(last_planned, last_done, self._recorded or 0) + 1
        if not read_only:
            # Every epoch up to the last one planned is committed or abandoned for good: this run numbers
            # after them. (Another run still writing one would fail its fenced commit anyway.)
            self.sink.discard_through(max(last_planned, last_done))
        report = self._restore(chosen, parallelism, redone, pending=pending)
        self.opened = report
        return report

    def _redo(self, committed: int | None, *, dry: bool) -> tuple[int | None, EpochDecision | None]:
        """Finish the epoch whose sink commit landed after the latest checkpoint row (protocol rule 5.4).

        ``committed`` is the sink's recorded epoch as :meth:`open` read it. Returns
        (the redone checkpoint id, the decision). A dry redo writes nothing and
        returns the decision so the restore can use it in memory.
        """
        decision = pending_decision(self.state, self.sink, self.settings.pipeline, committed)
        if decision is None:
            return None, None
        if dry:
            return decision.epoch, decision
        self.state.commit_checkpoint(decision)
        log.warning(
            "recovered checkpoint %s from its sink commit (the driver died before its row)", decision.epoch
        )
        # The side effect the dead driver never reached (step 6): the acknowledged regions' positions
        # go to the external store, as the epoch's own commit would have sent them. Without it an
        # external position (a Kafka group offset) lags the checkpoint until the split reads again,
        # and for good when nothing new arrives.
        external = self._external_store()
        if external is not None:
            positions = positions_to_commit(decision.checkpoint, decision.acknowledged)
            if positions:
                external.commit_positions(decision.epoch, positions)
        self.sink.discard(decision.epoch)
        return decision.epoch, None

    def restore(
        self,
        checkpoint: CompletedCheckpoint | None,
        parallelism: int | None = None,
        *,
        redistribution: Redistribution | None = None,
        consecutive_regional: int | None = None,
        register_first: int | None = None,
    ) -> list[ReaderInfo]:
        """A global restore from ``checkpoint`` (None: a fresh start) at ``parallelism``; readers register.

        New context, coordinator and enumerator. Registers the first
        ``register_first`` readers (all when None) and returns every reader's
        ReaderInfo; the caller registers the rest with :meth:`register` (the
        enumerator refuses a checkpoint until every reader has reported, protocol
        rule 1.4).
        """
        if redistribution is not None:
            self.redistribution = redistribution
        report = self._restore(
            checkpoint,
            parallelism or self.parallelism,
            None,
            consecutive_regional=consecutive_regional,
            register_first=register_first,
        )
        self.opened = report if self.opened is None else self.opened
        return list(self._infos)

    def _restore(
        self,
        checkpoint: CompletedCheckpoint | None,
        parallelism: int | None,
        redone: int | None,
        *,
        consecutive_regional: int | None = None,
        register_first: int | None = None,
        pending: EpochDecision | None = None,
    ) -> OpenReport:
        settings = self.settings
        new_p = parallelism or (settings.parallelism if checkpoint is None else checkpoint.parallelism)
        if (
            parallelism is None
            and checkpoint is not None
            and settings.parallelism != checkpoint.parallelism
            and self._configured_parallelism(checkpoint, pending) != settings.parallelism
        ):
            # The configured parallelism changed since the checkpoint: it asks for a rescale. When it is
            # what the checkpoint was taken under, the checkpoint's own parallelism came from an explicit
            # rescale (recover --parallelism, the rescale DAG), which stays (protocol rule 2.8).
            new_p = settings.parallelism
        if isinstance(new_p, bool) or not isinstance(new_p, int) or new_p < 1:
            raise InvalidParameterError("parallelism", new_p, "an integer >= 1")
        context = ReaderStateContext(new_p)
        # The coordinator decides against an in-memory mirror of the checkpoints it may refer to; the
        # state store is written by this driver, after the sink commit (protocol rule 5.3).
        mirror = CheckpointStore()
        if checkpoint is not None:
            for cid in reversed(self._ref_chain(checkpoint, pending)):
                mirror.add(checkpoint if cid == checkpoint.checkpoint_id else self.state.load_checkpoint(cid))
        coordinator = RegionalCheckpointCoordinator(settings.checkpoint, new_p, mirror)
        first_audit = 0
        previous: int | None = None
        if checkpoint is None:
            enumerator = self._enumerator_factory(
                self.source, context, settings.new_strategy(), restored=None
            )
            infos = [ReaderInfo(reader_id=r) for r in range(new_p)]
            self.operator_state = {r: () for r in range(new_p)}
            self.last_restore = None
        else:
            if isinstance(self.source, SupportsInitialDiscovery):
                self.source.mark_initial_discovery_finished()  # splits new to the checkpoint: earliest
            restored = coordinator.restore(
                checkpoint, new_p, self.redistribution, consecutive_regional=consecutive_regional
            )
            strategy = settings.new_strategy()
            if isinstance(strategy, WeightedStrategy):
                # the weights the checkpoint was balanced with (measured rates or configured), until
                # the meter has measured again (protocol rule 1.6)
                recorded = (
                    dict(pending.split_weights)
                    if pending is not None and checkpoint is pending.checkpoint
                    else self.state.split_weights(checkpoint.checkpoint_id)
                )
                strategy.set_weights({**strategy.weights, **recorded})
            enumerator = self._enumerator_factory(
                self.source, context, strategy, restored=restored.enumerator
            )
            first_audit = enumerator.audit_count
            infos = restored.reader_infos()
            self.operator_state = {r.region_id: tuple(r.operator_state) for r in restored.regions}
            self.last_restore = restored
            previous = checkpoint.parallelism
        enumerator.start()
        self._recheck_at = 0  # the first discovery after a restore checks every known split (rule 1.9)
        self.context, self.enumerator, self.coordinator = context, enumerator, coordinator
        self._infos = infos
        disagreements = self._reconcile_external(checkpoint)
        self._unproven = None
        if checkpoint is not None:  # proven once every reader registered (a fresh start restores nothing)
            self._unproven = _Unproven(
                RestoreKind.RESCALE if new_p != checkpoint.parallelism else RestoreKind.GLOBAL_RESTORE,
                checkpoint.checkpoint_id,
                frozenset(checkpoint_split_ids(checkpoint)),
                0,  # the enumerator is new: its whole trail is this restore's (snapshot drops included)
                tuple(range(new_p)),
                disagreements,
            )
        for info in infos if register_first is None else infos[:register_first]:
            self.register(info)
        self.restores += 1
        # run(until_caught_up) may stop before any epoch: the latest checkpoint is global, at this P.
        self._settled = (
            checkpoint is not None and checkpoint.kind is CheckpointKind.GLOBAL and new_p == previous
        )
        self._audit_persisted = first_audit if checkpoint is not None else 0
        return OpenReport(
            restored_from=None if checkpoint is None else checkpoint.checkpoint_id,
            redone_checkpoint=redone,
            parallelism=new_p,
            previous_parallelism=previous,
            decisions=tuple(enumerator.audit_since(first_audit)),
            external_disagreements=disagreements,
            mode_reason=coordinator.mode_reason,
            read_only=self._read_only,
        )

    def _ref_chain(self, checkpoint: CompletedCheckpoint, pending: EpochDecision | None) -> list[int]:
        if pending is not None and checkpoint is pending.checkpoint:
            older = sorted(
                {cid for ref in checkpoint.ref_checkpoint_ids for cid in self.state.ref_chain(ref)}
            )
            return [checkpoint.checkpoint_id, *reversed(older)]
        return self.state.ref_chain(checkpoint.checkpoint_id)

    def _configured_parallelism(
        self, checkpoint: CompletedCheckpoint, pending: EpochDecision | None
    ) -> int | None:
        if pending is not None and checkpoint is pending.checkpoint:
            return pending.configured_parallelism
        return self.state.configured_parallelism(checkpoint.checkpoint_id)

    def register(self, info: ReaderInfo) -> None:
        """A reader (re)starts: it registers with its restored splits and the enumerator places them.

        A legacy reader (no deferred assignment) keeps, and reads, the restored
        splits the enumerator let it keep.
        """
        enumerator, context = self._require_open()
        context.reader_splits[info.reader_id] = {}
        restart_reader(enumerator, context, info.reader_id, info.reported_splits)
        if not enumerator.reassign_on_recovery:
            view = context.reader_splits[info.reader_id]
            owned = set(enumerator.owned_split_ids(info.reader_id))
            for split in info.reported_splits:
                if split.split_id in owned and split.split_id not in view:
                    view[split.split_id] = split
        unproven = self._unproven
        if unproven is not None and not enumerator.pending_readers:
            self._unproven = None
            self._prove(
                unproven.kind,
                unproven.checkpoint_id,
                unproven.must_be_live,
                unproven.audit_mark,
                unproven.readers,
                unproven.notes,
            )

    def fail_reader(self, reader: int) -> FailoverReport:
        """Partial failover of one reader from its last good state (a reader crashed between epochs)."""
        return self.fail_readers([reader])[0]

    def fail_readers(self, readers: Sequence[int]) -> tuple[FailoverReport, ...]:
        """Partial failover of ``readers`` from their last good states (protocol rule 1.3), one after
        the other, then one in-run restart check (``recover --mode partial --readers``)."""
        coordinator = self._require_coordinator()
        for reader in readers:
            if isinstance(reader, bool) or not isinstance(reader, int) or not 0 <= reader < self.parallelism:
                raise InvalidParameterError("reader", reader, f"a reader id in [0, {self.parallelism})")
        if len(set(readers)) != len(readers) or not readers:
            raise InvalidParameterError("readers", list(readers), "one or more distinct reader ids")
        states = {r: coordinator.fallback_state(r) for r in readers}
        refs = [
            s.ref_checkpoint_id for s in states.values() if s is not None and s.ref_checkpoint_id is not None
        ]
        return self._failover(states, RestoreKind.PARTIAL_FAILOVER, max(refs, default=None))

    def _failover(
        self, states: Mapping[int, RegionState | None], kind: RestoreKind, checkpoint_id: int | None
    ) -> tuple[FailoverReport, ...]:
        """Each reader of ``states`` through :meth:`_partial_failover`, then the in-run check of the
        state they left (:mod:`splitkeeper.core.restarts`); ``checkpoint_id`` names where the
        states come from."""
        enumerator, _context = self._require_open()
        mark = enumerator.audit_count
        before = frozenset(placed_split_ids(enumerator))
        reports = tuple(self._partial_failover(r, state) for r, state in states.items())
        self._prove(kind, checkpoint_id, before, mark, tuple(states))
        return reports

    def _prove(
        self,
        kind: RestoreKind,
        checkpoint_id: int | None,
        must_be_live: frozenset[str],
        audit_mark: int,
        readers: tuple[int, ...],
        notes: tuple[str, ...] = (),
    ) -> RestartCheck:
        """The in-run restart check of a restore (protocol section 6): recorded by the state store and
        the hooks; a failed one stops the run with RestartCheckError before anything is read."""
        enumerator, context = self._require_open()
        store = self._require_coordinator().store
        check = check_restart(
            kind,
            enumerator,
            {r: views.keys() for r, views in context.reader_splits.items()},
            must_be_live=must_be_live,
            audit_mark=audit_mark,
            checkpoint_id=checkpoint_id,
            epoch=self._next_epoch,
            readers=readers,
            refs={cid: store.get(cid).ref_checkpoint_ids for cid in store.ids()},
            max_consecutive_failures=self.settings.checkpoint.max_consecutive_failures,
            notes=notes,
        )
        self.restart_checks.append(check)
        del self.restart_checks[:-RESTART_CHECKS_KEPT]
        if not self._read_only:
            self.state.record_restart_checks((check,))
        self.hooks.restart_checked(check)
        if not check.passed:
            raise restart_check_error(check, self.settings.pipeline)
        return check

    def _partial_failover(self, reader: int, state: RegionState | None) -> FailoverReport:
        """``fail_reader`` + re-registration with the reader's fallback state (protocol rule 1.3)."""
        enumerator, context = self._require_open()
        before = enumerator.owners()
        context.reader_splits[reader] = {}
        fail_reader(enumerator, context, reader)
        reported = state.splits if state is not None else ()
        self.register(ReaderInfo(reader_id=reader, reported_splits=tuple(reported)))
        self.operator_state[reader] = tuple(state.operator_state) if state is not None else ()
        after = enumerator.owners()
        moved = tuple(sid for sid, owner in after.items() if sid in before and before[sid] != owner)
        return FailoverReport(
            reader=reader,
            ref_checkpoint_id=None if state is None else state.ref_checkpoint_id,
            moved=moved,
            foreign=sum(1 for sid in moved if before[sid] != reader),
        )

    def _external_store(self) -> ExternallyCheckpointedSource | None:
        """The source when it keeps external positions (protocol section 3) in this configuration."""
        source = self.source
        if isinstance(source, ExternallyCheckpointedSource) and source.keeps_external_positions:
            return source
        return None

    def _reconcile_external(self, checkpoint: CompletedCheckpoint | None) -> tuple[str, ...]:
        external = self._external_store()
        if checkpoint is None or external is None:
            return ()
        positions = {s.split_id: s.position for r in checkpoint.regions.values() for s in r.splits}
        found = reconcile_positions(positions, external.committed_positions())
        for d in found:
            log.warning(
                "external position disagrees with checkpoint %s: %s", checkpoint.checkpoint_id, d.detail
            )
        return tuple(d.detail for d in found)

    # -- epochs ------------------------------------------------------------------------------

    def discover(self) -> int:
        """Ask the source for its splits now; returns how many entered the enumerator's pool.

        A source that :class:`SupportsSplitIdentityCheck` first checks the splits the
        enumerator knows and the enumerator applies ``on_file_change`` to what changed
        (rule 1.9): a SourceError under ``fail``. Live splits are checked at every discovery;
        finished ones at the first discovery after a restore and then once every
        ``recheck_finished_every`` epochs (:meth:`rechecks_finished`); between those the
        source may skip them (``recheck_finished=False``).
        """
        enumerator, _context = self._require_open()
        source = self.source
        self.split_changes = 0
        if isinstance(source, SupportsSplitIdentityCheck):
            recheck = self.rechecks_finished
            if recheck:
                self._recheck_at = self._next_epoch + self.settings.recheck_finished_every
            changes = source.check_splits(
                enumerator.known_splits(), enumerator.finished_identities, recheck_finished=recheck
            )
            for change in changes:
                if change.kind is SplitChangeKind.RECREATED:  # under any policy
                    log.warning("pipeline %s: %s", self.settings.pipeline, change.detail)
                elif change.detail:  # an IDENTIFIED change (same data) has none: nothing to tell
                    log.warning(
                        "pipeline %s: %s (source.on_file_change: %s)",
                        self.settings.pipeline,
                        change.detail,
                        self.settings.on_file_change.value,
                    )
            if changes:
                self.split_changes = enumerator.apply_split_changes(changes, self.settings.on_file_change)
        return enumerator.add_splits(source.discover_splits())

    @property
    def rechecks_finished(self) -> bool:
        """Whether the next discovery checks finished splits against their identity too (rule 1.9):
        the first after a restore, then the first of every ``recheck_finished_every`` epochs."""
        return self._next_epoch >= self._recheck_at

    def _refresh_subscriptions(self) -> None:
        """What the source subscribes to now reaches the enumerator before each epoch's discovery.

        A topic created since (matching a pattern) is read from this epoch on; the splits of
        one that disappeared are dropped, pooled or owned (DROPPED_REMOVED_SUBSCRIPTION),
        and logged (protocol rule 1.5).
        """
        enumerator, _context = self._require_open()
        now = self.source.subscriptions()
        if enumerator.subscriptions is None or now == enumerator.subscriptions:
            return
        added = sorted(now - enumerator.subscriptions)
        dropped = enumerator.set_subscriptions(now)
        if added:
            log.info("pipeline %s subscribes to %s from now on", self.settings.pipeline, added)
        if dropped:
            log.warning(
                "pipeline %s: %d split(s) of subscriptions that no longer exist were dropped: %s",
                self.settings.pipeline,
                len(dropped),
                ", ".join(dropped[:20]),
            )

    def _count_failures(self, runs: Mapping[int, RegionRun], acked: Mapping[int, RegionRun]) -> None:
        """Per split, how many epochs in a row its read failed (rule 1.8): an acknowledged read resets it."""
        for run in acked.values():
            for split_id in run.positions:
                self._failing.pop(split_id, None)
        for run in runs.values():
            if run.outcome is RegionOutcome.DECLINE:
                for split_id in run.failed_splits:
                    count, _error = self._failing.get(split_id, (0, ""))
                    self._failing[split_id] = (count + 1, run.error)

    def _quarantine_failing(self) -> None:
        """Park the splits whose reads failed ``quarantine_after`` epochs in a row (policy QUARANTINE).

        Done before planning, so the epoch reads everything else and can checkpoint globally;
        the split stays parked, with its position (where its records end in the sink), until
        an operator releases it (``recover --release``).
        """
        if self.settings.on_split_failure is not SplitFailurePolicy.QUARANTINE:
            return
        enumerator, _context = self._require_open()
        for split_id, (count, error) in sorted(self._failing.items()):
            if count < self.settings.quarantine_after:
                continue
            split = enumerator.split(split_id)
            position = split.position if split else "?"
            detail = f"reads failed {count} epochs in a row, from its position {position}: {clip(error, 300)}"
            if enumerator.quarantine(split_id, detail):
                log.warning("pipeline %s: split %s quarantined: %s", self.settings.pipeline, split_id, detail)
            del self._failing[split_id]

    def release(self, split_ids: Sequence[str]) -> list[Split]:
        """Put quarantined splits back (``recover --release``): read again from their position (rule 1.8)."""
        enumerator, _context = self._require_open()
        released = [enumerator.release(split_id) for split_id in split_ids]
        for split in released:
            self._failing.pop(split.split_id, None)
        return released

    def drop(self, split_ids: Sequence[str]) -> list[Split]:
        """Drop splits the source no longer has (``recover --drop``): never read again, audited.

        Each must be live or quarantined, and gone from the source's discovery now (its file
        deleted): a split the source still lists would be discovered again and read from its
        start, so it is refused (release it, or remove its file first). Its records up to its
        position stay in the sink; the enumerator forgets it (DROPPED_BY_OPERATOR, with that
        position), and the restart checks count it as dropped, like a removed subscription's.
        """
        enumerator, _context = self._require_open()
        still = {s.split_id for s in self.source.discover_splits()} & set(split_ids)
        if still:
            raise InvalidParameterError(
                "drop",
                sorted(still)[0],
                "a split the source no longer has (its file deleted or moved away)",
                "the source still lists it, so it would be read again from its start: "
                "'recover --release' reads it on from its position, or move the file out of the source first",
            )
        dropped = []
        self._settled = False  # a drop is a change the next checkpoint must commit, even with nothing to read
        for split_id in split_ids:
            dropped.append(enumerator.drop(split_id, "by the operator (recover --drop)"))
            self._failing.pop(split_id, None)
        return dropped

    def _split_weights(self) -> tuple[tuple[str, float], ...]:
        """Each owned split's weight under the weighted strategy (what the balance check weighs)."""
        enumerator, _context = self._require_open()
        strategy = enumerator.strategy
        if not isinstance(strategy, WeightedStrategy):
            return ()
        return tuple((sid, strategy.weight(sid)) for sid in sorted(enumerator.owners()))

    def _reweigh(self) -> None:
        """The weighted strategy's weights follow each split's measured arrival rate (rule 1.6).

        Every live unbounded split's available end is observed each epoch. When the readers'
        imbalance under the measured rates passes ``rebalance_threshold`` (max / min of load
        per capacity), the strategy takes those rates as its weights and the enumerator
        rebalances; below it nothing moves, so noise does not make splits travel.
        """
        enumerator, _context = self._require_open()
        strategy = enumerator.strategy
        if not isinstance(strategy, WeightedStrategy):
            return
        now = self.clock.now()
        live: list[str] = []
        for split_id in enumerator.owners():
            split = enumerator.split(split_id)
            if split is not None and split.end is None:
                self.meter.observe(split_id, now, self.source.available_end(split))
                live.append(split_id)
        self.meter.forget(live)
        rates = self.meter.rates()
        if not rates:
            return
        owned = {r: enumerator.owned_split_ids(r) for r in range(self.parallelism)}
        imbalance = strategy.imbalance(owned, rates)
        if imbalance <= self.settings.rebalance_threshold:
            return
        strategy.set_weights(rates, sum(rates.values()) / len(rates))
        moved = enumerator.rebalance()
        if moved:
            log.info(
                "pipeline %s: %d split(s) rebalanced by measured throughput (imbalance %.2f > %.2f)",
                self.settings.pipeline,
                moved,
                imbalance,
                self.settings.rebalance_threshold,
            )

    def reset_backlog(self) -> dict[str, int]:
        """Every live unbounded split's available end now becomes its new backlog boundary (rule 4.1).

        The pipeline processes backlog (throughput interval and epoch size) until each of them
        reached it again, reported by the reader that owns it. Returns the boundaries set.
        """
        enumerator, _context = self._require_open()
        ends: dict[str, int] = {}
        for split_id in enumerator.owners():
            split = enumerator.split(split_id)
            if split is not None and split.end is None:
                ends[split_id] = self.source.available_end(split)
        enumerator.reset_backlog(ends)
        log.info("pipeline %s: backlog reset on %d split(s)", self.settings.pipeline, len(ends))
        return ends

    def plan(self, records_per_split: int | None = None) -> dict[int, list[PlannedRange]]:
        """This epoch's ranges per region: every owned, unfinished split up to its budget.

        The epoch's record budget (:class:`BacklogConfig`, larger while
        processing backlog) is shared by the splits being read, unless
        ``records_per_split`` is given.
        """
        enumerator, context = self._require_open()
        if records_per_split is None:
            views = context.reader_splits.values()
            active = sum(1 for splits in views for s in splits.values() if not s.finished)
            budget_total = self.settings.backlog.epoch_records(enumerator.processing_backlog)
            records_per_split = max(1, budget_total // max(1, active))
        plan: dict[int, list[PlannedRange]] = {}
        self._unplannable = {}
        for reader in range(self.parallelism):
            ranges = []
            mine = context.reader_splits.get(reader, {})
            for split_id in sorted(mine):  # the ids are unique: the splits' order, without comparing them
                split = mine[split_id]
                if split.finished:
                    continue
                try:
                    if self.source.available_end(split) <= split.position:
                        continue  # nothing new (most splits of a wide topic): no budget arithmetic
                    end = self._plan_end(split, records_per_split)
                except SourceError as err:  # its file is gone or unreadable: a failed read of the split
                    self._unplannable.setdefault(reader, {})[split_id] = str(err)
                    continue
                if end > split.position:
                    ranges.append(PlannedRange(split, split.position, end))
            plan[reader] = ranges
        return plan

    def _unplannable_runs(self, plan: dict[int, list[PlannedRange]]) -> dict[int, RegionRun]:
        """Regions owning a split the source could not plan decline this epoch, naming it (rule 1.8).

        The source raised SourceError for the split while planning (its file deleted or
        unreadable): that is a failed read of the split, counted by ``on_split_failure`` like
        one that fails in the region task, so its region reads nothing this epoch (its plan is
        emptied) and declines. Under ``stall`` the split holds its region back; under
        ``quarantine`` it is parked after ``quarantine_after`` epochs and the rest goes on.
        """
        runs: dict[int, RegionRun] = {}
        for region, failed in sorted(self._unplannable.items()):
            plan[region] = []
            errors = "; ".join(
                f"split {sid!r} cannot be planned: {why}" for sid, why in sorted(failed.items())
            )
            runs[region] = RegionRun(
                region_id=region,
                outcome=RegionOutcome.DECLINE,
                error=errors,
                failed_splits=tuple(sorted(failed)),
            )
        return runs

    def _plan_end(self, split: Split, budget: int) -> int:
        stretched = self.source.plan_end(split, split.position, budget + budget // TAIL_DIVISOR)
        if stretched >= self.source.available_end(split):
            return stretched
        return self.source.plan_end(split, split.position, budget)

    def _unfinished(self) -> int:
        enumerator, context = self._require_open()
        owned = sum(1 for splits in context.reader_splits.values() for s in splits.values() if not s.finished)
        return owned + enumerator.pool_size

    def run_epoch(self, *, final: bool = False, records_per_split: int | None = None) -> EpochReport:
        """Run one checkpoint attempt. ``final`` asks for a bounded job's last (global) checkpoint."""
        enumerator, context = self._require_open()
        coordinator = self._require_coordinator()
        if self._read_only:
            raise _ReadOnly("a read-only driver runs no epoch: open it without read_only to run")
        self._settled = False
        started = self.clock.now()
        epoch = self._next_epoch
        self._next_epoch += 1
        phases: dict[str, float] = {}
        mark = started

        def lap(name: str) -> None:
            nonlocal mark
            now = self.clock.now()
            phases[name] = round(phases.get(name, 0.0) + now - mark, 3)
            mark = now

        if not enumerator.checkpoint_allowed:
            return self._refuse(epoch, started, enumerator.processing_backlog, final)
        self.hooks.before_epoch(epoch)
        self._refresh_subscriptions()
        self.discover()
        self._quarantine_failing()
        self._reweigh()
        backlog = enumerator.processing_backlog
        self._unplannable = {}
        planned = {} if final else self.plan(records_per_split)
        plan = {r: planned.get(r, []) for r in range(self.parallelism)}
        declined = self._unplannable_runs(plan)
        plan, lost = self._check_retention(plan)  # before the plan is persisted: fail, or skip and record
        self._check_fence(epoch)  # a run that another run overtook stops before it writes anything
        self._write_plan(epoch, plan)
        lap("plan")
        self.hooks.crash_point(CrashPoint.AFTER_PLAN, epoch)

        to_run, idle = regions_to_run(plan, declined)
        ran = self.runner.run(epoch, to_run, self.settings.checkpoint.region_timeout_s) if to_run else {}
        runs = {**idle, **ran, **declined}
        lap("read")
        context.on_checkpoint(epoch)
        pending = coordinator.trigger(epoch, final=final, now=self.clock.now())
        acked: dict[int, RegionRun] = {}
        errors: dict[int, str] = {}
        for r in range(self.parallelism):
            run = runs.get(r)
            if run is None:
                errors[r] = "the region runner returned no outcome"
            elif run.outcome is RegionOutcome.ACK:
                acked[r] = run
                pending.acknowledge(r, self._acked_state(r, run, epoch))
            elif run.outcome is RegionOutcome.DECLINE:
                errors[r] = run.error
                pending.decline(r, run.error or "declined")
            else:
                errors[r] = run.error
        coordinator.expire(pending, now=pending.deadline)  # the timed-out (and silent) regions
        self._count_failures(runs, acked)
        self._apply_progress(acked)
        result = coordinator.complete(
            pending,
            lambda fallback: enumerator.snapshot(epoch, fallback),
            processing_backlog=enumerator.processing_backlog,
        )
        lap("decide")
        failures = tuple(
            region_failure(
                r,
                o,
                (runs[r].error if r in runs else "") or errors.get(r) or "",
                runs[r].failed_splits if r in runs else (),
            )
            for r, o in sorted(result.outcomes.items())
            if o is not RegionOutcome.ACK
        )
        committed_records = 0
        failovers: tuple[FailoverReport, ...] = ()
        if result.completed is None:
            self._check_fence(epoch)  # a run another run overtook logs nothing either
            self.state.log_attempt(epoch, result.outcomes, result.reason, failures=failures)
            self.sink.discard(epoch)
            # Nothing of this epoch is committed: every reader restarts from the latest checkpoint (a global
            # restore), keeping the coordinator's counter (an aborted forced global resets it).
            self._restore(
                self.state.latest_checkpoint(),
                self.parallelism,
                None,
                consecutive_regional=coordinator.consecutive_regional,
            )
        else:
            committed_records, failovers = self._commit(epoch, result, acked, lap, phases, failures)
        lap("finish")
        report = EpochReport(
            epoch=epoch,
            kind=result.kind,
            outcomes=dict(result.outcomes),
            records=sum(r.records for r in acked.values()),
            committed_records=committed_records,
            processing_backlog=backlog,
            reason=result.reason,
            elapsed_s=round(self.clock.now() - started, 3),
            region_errors=errors,
            final=final,
            phases=phases,
            lost=lost,
            completed=result.completed,
            failovers=failovers,
            started_at=started,
            region_task_s={r: run.elapsed_s for r, run in acked.items() if r not in idle},
            idle_regions=tuple(sorted(idle)),
        )
        self.hooks.progress(report.line(), epoch=epoch, checkpoint_id=epoch, kind=report.kind.value)
        self.hooks.after_epoch(report)
        return report

    def _refuse(self, epoch: int, started: float, backlog: bool, final: bool) -> EpochReport:
        """A checkpoint requested while a restore still waits for reader reports (protocol rule 1.4).

        The coordinator aborts it before any region runs; nothing is planned or written.
        """
        enumerator, context = self._require_open()
        coordinator = self._require_coordinator()
        context.on_checkpoint(epoch)
        pending = coordinator.trigger(epoch, final=final, now=self.clock.now())
        reason = (
            f"the enumerator refused: readers {list(enumerator.pending_readers)} have not registered and "
            "reported their splits yet"
        )
        result = coordinator.abort(pending, reason)
        return EpochReport(
            epoch=epoch,
            kind=CheckpointKind.ABORTED,
            outcomes=dict(result.outcomes),
            records=0,
            committed_records=0,
            processing_backlog=backlog,
            reason=result.reason,
            elapsed_s=round(self.clock.now() - started, 3),
            final=final,
            refused=True,
            started_at=started,
        )

    def _check_retention(
        self, plan: dict[int, list[PlannedRange]]
    ) -> tuple[dict[int, list[PlannedRange]], tuple[LostRange, ...]]:
        """Check the epoch's ranges against what a source with retention still holds.

        With ``on_offset_out_of_range: fail`` the source raises SourceError and
        nothing of the epoch is written. With ``skip`` a range that starts below
        what the source still has is moved up (possibly to an empty range, which
        still moves the split's position when its region acknowledges), and each
        loss becomes a SKIPPED_LOST_RANGE audit record, persisted with the
        checkpoint. Sources without the capability are not asked.
        """
        source = self.source
        if not isinstance(source, SupportsRetentionCheck):
            return plan, ()
        flat = [(r, PlannedRange(*rng)) for r, ranges in plan.items() for rng in ranges]
        if not flat:
            return plan, ()
        enumerator, _context = self._require_open()
        check = source.check_retention([rng for _r, rng in flat])
        if len(check.ranges) != len(flat):
            raise ProtocolError(
                f"{source.name}: the retention check returned {len(check.ranges)} ranges for "
                f"{len(flat)} planned ones; it must return every range, in order",
                source=source.name,
            )
        checked: dict[int, list[PlannedRange]] = {r: [] for r in plan}
        for (region, _before), after in zip(flat, check.ranges, strict=True):
            checked[region].append(PlannedRange(after.split, after.start, after.end))
        for gone in check.lost:
            enumerator.record_lost_range(gone.split_id, enumerator.owner_of(gone.split_id), gone.detail)
        return checked, check.lost

    def _write_plan(self, epoch: int, plan: Mapping[int, Sequence[PlannedRange]]) -> None:
        """Persist the write-ahead plan of ``epoch``; another run that planned it first stops this one."""
        try:
            self.state.write_plan(epoch, plan)
        except ConcurrentRunError as err:
            raise ConcurrentRunError(
                f"pipeline {self.settings.pipeline!r}: another run planned epoch {epoch} first; only one run "
                f"may drive a pipeline: this run stops without writing, and the state is intact "
                f"({err.message})",
                **{**err.params, "pipeline": self.settings.pipeline, "epoch_id": epoch},
            ) from err

    def _acked_state(self, region: int, run: RegionRun, epoch: int) -> RegionState:
        _enumerator, context = self._require_open()
        mine = context.reader_splits.get(region, {})
        positions = run.positions
        splits = []
        # A reader's splits are keyed by their unique ids: sorting the ids orders the splits as
        # sorting the splits would, without comparing Split objects field by field.
        for split_id in sorted(mine):
            split = mine[split_id]
            position = positions.get(split_id)
            moved = split if position is None else split.at(position)
            if not moved.finished:
                splits.append(moved)
        summary = f"e{epoch}:n{run.records}"
        state = (self.operator_state.get(region, ()) + (summary,))[-OPERATOR_STATE_KEEP:]
        return RegionState(region_id=region, splits=tuple(splits), operator_state=state)

    def _apply_progress(self, acked: Mapping[int, RegionRun]) -> None:
        """Acknowledged regions' new positions, finished splits and backlog reports reach the enumerator.

        All positions first, then finished splits: finishing a split may rebalance, and a split
        moved to another reader must carry its new position, never an older one (re-reading
        records another region already read; protocol rule 1.7).
        """
        enumerator, context = self._require_open()
        moved: list[Split] = []
        for region, run in acked.items():
            mine = context.reader_splits.get(region, {})
            for sid, position in run.positions.items():
                if sid in mine:
                    mine[sid] = mine[sid].at(position)
                    moved.append(mine[sid])
        enumerator.update_positions(moved)
        for split in moved:
            if split.finished:
                owner = enumerator.owner_of(split.split_id)
                if owner is not None:
                    enumerator.split_finished(owner, split.split_id)
                for splits in context.reader_splits.values():
                    splits.pop(split.split_id, None)
        for run in acked.values():
            for sid in run.backlog_finished:
                enumerator.report_backlog_finished(sid)

    def _commit(
        self,
        epoch: int,
        result: CheckpointResult,
        acked: Mapping[int, RegionRun],
        lap: Callable[[str], None],
        phases: Mapping[str, float],
        failures: Sequence[RegionFailure] = (),
    ) -> tuple[int, tuple[FailoverReport, ...]]:
        enumerator, context = self._require_open()
        coordinator = self._require_coordinator()
        completed = result.completed
        assert completed is not None
        notified = tuple(r for r in result.notify_complete if r in acked)
        decision = EpochDecision(
            checkpoint=completed,
            attempt_id=uuid.uuid4().hex,
            audit=tuple(enumerator.audit_since(self._audit_persisted)),
            acknowledged=notified,
            configured_parallelism=self.settings.parallelism,
            reason=result.reason,
            split_weights=self._split_weights(),
        )
        self._check_fence(epoch)
        self.hooks.before_sink_commit(epoch)  # the runtime's lease, re-read: still this run's
        self.state.write_decision(decision)
        self.hooks.crash_point(CrashPoint.AFTER_DECISION, epoch)
        try:
            receipt = self.sink.commit(
                epoch, [acked[r] for r in notified], expected=self._recorded, attempt_id=decision.attempt_id
            )
        except (ConcurrentRunError, StagedOutputError):  # the sink commit certainly did not land
            self._discard_refused(decision)
            raise
        if receipt.replayed:
            raise ConcurrentRunError(
                f"pipeline {self.settings.pipeline!r}: the sink already holds epoch {epoch} from another "
                "run; "
                "only one run may drive a pipeline",
                pipeline=self.settings.pipeline,
                epoch_id=epoch,
            )
        self._recorded = epoch
        lap("sink")
        self.hooks.crash_point(CrashPoint.AFTER_SINK_COMMIT, epoch)
        self.state.commit_checkpoint(
            decision,
            before_row=lambda: self.hooks.crash_point(CrashPoint.BEFORE_CHECKPOINT_ROW, epoch),
            phases_ms={p: round(phases[p] * 1000) for p in ("plan", "read", "sink") if p in phases},
            failures=failures,
        )
        lap("state")
        self.hooks.crash_point(CrashPoint.AFTER_CHECKPOINT_ROW, epoch)
        self._audit_persisted = enumerator.audit_count
        failed = result.notify_partially_completed
        context.on_checkpoint_complete(epoch, failed)
        for r in notified:
            self.operator_state[r] = completed.regions[r].operator_state
        external = self._external_store()
        if external is not None:
            positions = positions_to_commit(completed.regions, notified)
            if positions:
                external.commit_positions(epoch, positions)
        failovers = (
            self._failover({r: completed.regions[r] for r in failed}, RestoreKind.REGION_FALLBACK, epoch)
            if failed
            else ()
        )
        self.sink.discard(epoch)
        deleted = self.state.retain(  # the retention rule, once; the coordinator's mirror follows
            self.settings.retain_checkpoints,
            sorted(coordinator.pinned_checkpoint_ids),
            mid_retention=lambda: self.hooks.crash_point(CrashPoint.DURING_RETENTION, epoch),
        )
        coordinator.forget(deleted)
        lap("retain")
        return receipt.records, failovers

    def _discard_refused(self, decision: EpochDecision) -> None:
        """Remove the decision record of a sink commit that certainly did not land.

        The fence refused the commit, or its staged output was missing or damaged: no
        sink commit names the record. Best effort (the error being raised is what the
        user must see): a record left behind, by a failure here or a run killed before
        it, is never read (a redo reads only the attempt the sink commit names) and
        retention deletes it with its epoch.
        """
        try:
            self.state.discard_decision(decision.epoch, decision.attempt_id)
        except Exception as exc:  # noqa: BLE001 - the error being raised matters more
            log.warning(
                "could not remove the refused decision record of epoch %s (attempt %s): %s",
                decision.epoch,
                decision.attempt_id,
                exc,
            )

    def _check_fence(self, epoch: int) -> None:
        """Stop early when another run committed to the sink since this run looked.

        A read of the same fence the sink commit checks atomically (protocol rule
        5.2): the pipeline's recorded epoch must still be the one this run restored
        or wrote itself. It only saves work; the commit's own check is what holds.
        """
        current = self.sink.committed_epoch()
        if current != self._recorded:
            raise ConcurrentRunError(
                f"pipeline {self.settings.pipeline!r}: another run committed epoch {current} to the sink "
                "while "
                f"this run (at epoch {epoch}, expecting {self._recorded}) was running; only one run may "
                "drive a pipeline: this run stops without writing, and the state is intact",
                pipeline=self.settings.pipeline,
                epoch_id=epoch,
                found=current,
                expected=self._recorded,
            )

    # -- runs --------------------------------------------------------------------------------

    def run(
        self,
        epochs: int | None = None,
        *,
        until_caught_up: bool = False,
        stop_requested: Callable[[], bool] | None = None,
    ) -> RunSummary:
        """Run at most ``epochs`` epochs, or (None) until a bounded source is read and checkpointed globally.

        A bounded run finishes with the global checkpoint of the epoch that read its last
        records (a run that restores such a checkpoint and finds no new split runs no epoch);
        only when that checkpoint is regional (a failed region's splits are read
        again) or aborted does another epoch follow, and once nothing is left to read it is
        a final one, forced global (protocol rule 2.6).

        ``until_caught_up`` does the same for an unbounded source (Kafka) against what was
        there when the run began: the run ends on the global checkpoint at which every live
        split has reached the end it had at the start (Spark's ``Trigger.AvailableNow``,
        Flink's bounded ``KafkaSource`` with latest stopping offsets). Records that arrive
        meanwhile may be read too; splits discovered during the run are not waited for.

        A run cannot be held hostage by what keeps failing: after ``max_consecutive_aborts``
        aborted epochs in a row, or when none of the ``epochs`` it was asked for completed,
        it raises RunStalledError naming the failing splits and regions, their errors and
        what to do (nothing of an aborted epoch was committed). ``stop_requested`` is asked
        before each epoch; once it answers True the run returns with ``interrupted`` set.
        """
        if self.context is None:
            self.open()
        enumerator, _context = self._require_open()
        targets = self._end_positions() if until_caught_up and not self.source.bounded else None
        reports: list[EpochReport] = []
        finished = final = False
        # Restored from a global checkpoint with nothing new to read: no idle epoch.
        caught_up = targets is not None and self._settled and not self._behind(targets)
        if self.source.bounded and self._settled:
            self.discover()
            # a change applied at this discovery (a moved file) is checkpointed (and so audited) by an epoch
            finished = self._unfinished() == 0 and not self.split_changes
        aborted_in_a_row = 0
        interrupted = False
        while not (finished or caught_up) and (epochs is None or len(reports) < epochs):
            if stop_requested is not None and stop_requested():
                interrupted = True
                break
            report = self.run_epoch(final=final)
            reports.append(report)
            final = False
            if report.kind is CheckpointKind.ABORTED:
                aborted_in_a_row += 1
                if aborted_in_a_row >= self.settings.max_consecutive_aborts:
                    raise self._stalled(reports[-aborted_in_a_row:], asked=None)
                continue
            aborted_in_a_row = 0
            enumerator, _context = self._require_open()
            if self.source.bounded and self._unfinished() == 0:
                self.discover()
                if self._unfinished() == 0:
                    finished = report.kind is CheckpointKind.GLOBAL
                    final = not finished
            elif targets is not None and not self._behind(targets):
                caught_up = report.kind is CheckpointKind.GLOBAL
                final = not caught_up
        if reports and not interrupted and all(r.kind is CheckpointKind.ABORTED for r in reports):
            raise self._stalled(reports, asked=epochs or len(reports))
        enumerator, _context = self._require_open()
        parked = enumerator.quarantined
        stuck = all_quarantined(len(parked), len(enumerator.owners()), len(enumerator.finished_split_ids))
        return RunSummary(
            tuple(reports),
            finished,
            sum(r.committed_records for r in reports),
            caught_up and not stuck,
            quarantined=tuple(sorted(parked)),
            interrupted=interrupted,
            all_quarantined=stuck,
        )

    def pending_work(self) -> PendingWork:
        """What :meth:`run` (``until_caught_up`` for an unbounded source) would read if started now,
        asked of the source as the run asks it (its subscriptions, a discovery, the live splits'
        available ends), reading no record; on an opened driver, read-only or not (nothing is
        written). Empty exactly when such a run ends without an epoch: an event-driven
        scheduler starts the ingest only when it is not (``airflow.schedule: on_new_data``).
        """
        enumerator, _context = self._require_open()
        latest = self.opened.restored_from if self.opened is not None else None
        self._refresh_subscriptions()
        self.discover()
        unsettled = not self._settled or bool(self.split_changes)
        if self.source.bounded:  # pooled splits too: owners() maps them to None
            live = [sid for sid in enumerator.owners() if (s := enumerator.split(sid)) and not s.finished]
        else:
            live = self._behind(self._end_positions())
        return PendingWork(tuple(sorted(live)), unsettled, latest)

    def _stalled(self, aborted: Sequence[EpochReport], *, asked: int | None) -> RunStalledError:
        """The error that ends a run whose epochs keep aborting: one paragraph, what failed and what to do."""
        settings = self.settings
        first, last = aborted[0].epoch, aborted[-1].epoch
        span = f"epoch {first}" if first == last else f"epochs {first}-{last}"
        if asked is None:
            head = (
                f"{len(aborted)} epochs in a row were aborted ({span}; "
                f"checkpoint.max_consecutive_aborts={settings.max_consecutive_aborts}), so the run stops"
            )
        else:
            head = f"none of the {asked} epoch(s) this run was asked for completed ({span} aborted)"
        latest = max(self.state.checkpoint_ids(), default=None)
        where = f"latest checkpoint {latest}" if latest is not None else "no checkpoint has completed yet"
        failing = sorted(self._failing.items())
        splits = "; ".join(
            f"split {sid!r} (reads failed {n} epoch(s) in a row: {clip(why, 300)})"
            for sid, (n, why) in failing[:5]
        )
        regions = "; ".join(
            f"region {r}: {clip(why, 300)}" for r, why in sorted(aborted[-1].region_errors.items())
        )
        what = " Failing: " + (splits or regions or clip(aborted[-1].reason, 300)) + "."
        if failing and settings.on_split_failure is SplitFailurePolicy.STALL:
            advice = (
                "Fix or restore the named files and run again; or set checkpoint.on_split_failure: "
                "quarantine, so that a split whose reads keep failing is parked and the others commit"
            )
        elif failing:
            advice = (
                "Fix or restore the named files and run again; a split whose file is gone for good can be "
                "dropped with 'splitkeeper recover --drop SPLIT'"
            )
        else:
            advice = "Fix what makes the regions fail (the errors above) and run again"
        return RunStalledError(
            f"pipeline {settings.pipeline!r}: {head}. Nothing of those epochs was committed ({where})."
            f"{what} {advice}; 'splitkeeper status' shows the checkpoints.",
            pipeline=settings.pipeline,
            epochs=tuple(r.epoch for r in aborted),
            split_ids=tuple(sid for sid, _ in failing),
            region_errors=dict(aborted[-1].region_errors),
        )

    def run_continuously(
        self,
        stop_requested: Callable[[], bool],
        *,
        max_final_attempts: int = 10,
        poll_s: float = 0.5,
    ) -> RunSummary:
        """Checkpoint on an interval until a stop is requested, then end on a global checkpoint.

        Epochs start ``backlog_interval_s`` apart while any split is processing backlog and
        ``normal_interval_s`` apart afterwards, measured start to start (an epoch longer than
        the interval is followed at once); each switch is logged and returned (protocol rule
        4.4). ``stop_requested`` is polled between epochs, at most ``poll_s`` apart. Once it
        answers True, final checkpoints (nothing new read, forced global) run until one is
        global (protocol rule 2.6: a stop with a savepoint is always global); CheckpointError
        after ``max_final_attempts`` aborted ones.

        Before the first epoch the runner is told each region's unfinished splits
        (:meth:`~splitkeeper.core.ports.RegionRunner.prepare`), so long-lived readers get ready
        while nothing is to read yet.
        """
        enumerator, context = self._require_open()
        backlog = self.settings.backlog
        if not stop_requested():
            self.runner.prepare(
                {
                    region: tuple(splits[sid] for sid in sorted(splits) if not splits[sid].finished)
                    for region, splits in sorted(context.reader_splits.items())
                    if region < self.parallelism and any(not s.finished for s in splits.values())
                }
            )
        reports: list[EpochReport] = []
        switches: list[IntervalSwitch] = []
        mode = enumerator.processing_backlog
        while not stop_requested():
            report = self.run_epoch()
            reports.append(report)
            enumerator, _context = self._require_open()  # an aborted epoch restores a new enumerator
            now_mode = enumerator.processing_backlog
            if now_mode != mode:
                switch = IntervalSwitch(report.epoch, now_mode, backlog.interval_s(now_mode))
                switches.append(switch)
                log.info("pipeline %s: %s", self.settings.pipeline, switch.line())
                self.hooks.progress(switch.line(), checkpoint_id=switch.after)
                mode = now_mode
            next_start = report.started_at + backlog.interval_s(mode)
            while not stop_requested():
                left = next_start - self.clock.now()
                if left <= 0:
                    break
                self.clock.sleep(min(poll_s, left))
        for _attempt in range(max_final_attempts):
            report = self.run_epoch(final=True)
            reports.append(report)
            if report.kind is CheckpointKind.GLOBAL:
                return RunSummary(
                    tuple(reports),
                    False,
                    sum(r.committed_records for r in reports),
                    stopped=True,
                    interval_switches=tuple(switches),
                    quarantined=tuple(sorted(self._require_open()[0].quarantined)),
                )
        raise CheckpointError(
            f"pipeline {self.settings.pipeline!r}: the stop could not end on a global checkpoint: "
            f"{max_final_attempts} final checkpoints in a row were aborted (last: {reports[-1].reason}). "
            "Nothing was lost; fix the failing region and stop again",
            attempts=max_final_attempts,
        )

    def _end_positions(self) -> dict[str, int]:
        """Every live split's available end now: what ``run(until_caught_up=True)`` reads up to."""
        enumerator, _context = self._require_open()
        ends: dict[str, int] = {}
        for split_id in enumerator.owners():
            split = enumerator.split(split_id)
            if split is not None:
                ends[split_id] = self.source.available_end(split)
        return ends

    def _behind(self, targets: Mapping[str, int]) -> list[str]:
        """The split ids whose committed position is still short of ``targets`` (finished or dropped
        splits are not behind)."""
        enumerator, _context = self._require_open()
        behind = []
        for split_id, end in targets.items():
            split = enumerator.split(split_id)
            if split is not None and not split.finished and split.position < end:
                behind.append(split_id)
        return behind

    # -- helpers ------------------------------------------------------------------------------

    def _require_open(self) -> tuple[SplitEnumerator, ReaderStateContext]:
        if self.enumerator is None or self.context is None:
            raise ProtocolError("the driver is not open: call open() first")
        return self.enumerator, self.context

    def _require_coordinator(self) -> RegionalCheckpointCoordinator:
        if self.coordinator is None:
            raise ProtocolError("the driver is not open: call open() first")
        return self.coordinator
