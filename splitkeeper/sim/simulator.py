"""The deterministic fault simulator: the protocol core driven through random failures, in memory.

:class:`Simulator` runs one :class:`~splitkeeper.sim.events.Scenario` the way
the Spark runtime (``splitkeeper/runtime/pipeline.py``) drives the core each
epoch, with simulated readers, an in-memory source and a simulated
exactly-once sink instead of Spark and Delta:

1. unbounded splits grow; discovery hands the source's splits to the enumerator;
2. every reader reads up to ``budget`` records of each split it owns into a
   per-epoch staged buffer;
3. the coordinator triggers the checkpoint; regions acknowledge with their new
   state, decline, or time out (``expire``);
4. acknowledged regions' positions reach the enumerator, then their finished
   bounded splits (``split_finished``);
5. ``complete`` decides GLOBAL / REGIONAL / ABORTED. Completed: the sink
   commits the acknowledged regions' staged records under the checkpoint id
   (failed regions' records are discarded), the assignment tracker is told,
   failed regions' readers go through ``fail_reader`` + ``restart_reader``
   with their fallback state, retention runs. Aborted: everything staged is
   discarded and the job restores globally from the latest completed
   checkpoint, keeping the coordinator's consecutive counter.

Between epochs the scenario injects reader failures after a checkpoint,
global restarts, rescales (even-split or union operator state), new splits,
removed subscriptions (effective on restart) and checkpoints requested in the
middle of a restore (seed scenario 2: the enumerator must refuse).

After every step the DESIGN 6 invariants are checked with
:mod:`splitkeeper.core.invariants` against the simulator's own ground truth
(which splits exist, are subscribed and finished; what the sink holds; what the
latest completed checkpoint says was committed). A broken rule becomes a
:class:`Finding`; the run goes on (the core raising on a legal event sequence
is itself a finding, and ends the run).

No wall clock, no threads, no random numbers here: the same scenario gives
the same run, which is what :mod:`splitkeeper.sim.shrink` relies on.
"""

from __future__ import annotations

import contextlib
import enum
import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from splitkeeper.core.assignment import STRATEGIES, AssignmentStrategy, WeightedStrategy, strategy_by_name
from splitkeeper.core.checkpoint import CheckpointConfig, CheckpointStore, RegionalCheckpointCoordinator
from splitkeeper.core.enumerator import (
    RecordingEnumeratorContext,
    SplitEnumerator,
    enumerator_for,
    fail_reader,
    restart_reader,
)
from splitkeeper.core.invariants import (
    Violation,
    ViolationKind,
    check_enumerator_state,
    check_finished_not_assigned,
    check_ownership,
    check_ref_chains,
    check_sink_ranges,
    check_subscriptions,
    count_spread,
)
from splitkeeper.core.rescale import Redistribution
from splitkeeper.core.source import ReassignableStaticSplitSource, SplitSource, StaticSplitSource
from splitkeeper.core.types import (
    Assignment,
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    ReaderInfo,
    RegionState,
    Split,
)
from splitkeeper.errors import InvalidParameterError, ProtocolError, SplitkeeperError
from splitkeeper.sim.events import (
    FILES,
    TOPICS,
    CheckpointDuringRestore,
    DiscoverSplits,
    Epoch,
    Event,
    EventMix,
    GlobalRestart,
    ReaderFailure,
    RegionFailure,
    RemoveSubscription,
    Rescale,
    Scenario,
    SplitSpec,
    generate_scenario,
)
from splitkeeper.sim.sink import Run, SimulatedSink

#: Elements a region keeps in its list-style operator state (one per acknowledged checkpoint).
OPERATOR_STATE_KEEP = 4
#: Simulated seconds between two checkpoint triggers (the simulator's only clock).
CHECKPOINT_INTERVAL_S = 1000.0


# --------------------------------------------------------------------------- findings


class SimCheck(enum.Enum):
    """Rules the simulator checks beyond DESIGN 6 (those are :class:`ViolationKind`)."""

    PROTOCOL_ERROR = "protocol_error"  # the core raised on a legal event sequence
    CHECKPOINT_DURING_RESTORE = "checkpoint_during_restore"  # seed scenario 2: must be refused
    READER_VIEW_DIVERGED = "reader_view_diverged"  # a reader reads what the enumerator says it does not own
    OPERATOR_STATE = "operator_state_redistribution"  # a restore lost or invented operator-state elements


FindingKind = ViolationKind | SimCheck


@dataclass(frozen=True, slots=True)
class Finding:
    """One broken rule: at which step, after which event, where (enumerator, readers, sink...), what."""

    step: int
    kind: FindingKind
    where: str
    split_ids: tuple[str, ...]
    detail: str
    event: str

    def __str__(self) -> str:
        return f"step {self.step} [{self.event}] {self.where}: {self.kind.value}: {self.detail}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "kind": self.kind.value,
            "where": self.where,
            "split_ids": list(self.split_ids),
            "detail": self.detail,
            "event": self.event,
        }


# --------------------------------------------------------------------------- config


class ProgressOrder(enum.Enum):
    """How acknowledged regions' progress reaches the enumerator before ``complete``."""

    #: Positions of every acknowledged region first, then the finished splits (sound).
    BATCH = "batch"
    #: Region by region, positions then finished splits (``runtime/pipeline.py``'s ``_apply_progress``).
    PER_REGION = "per_region"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """What to simulate, validated on construction (the CLI's options map one to one).

    ``readers``: starting parallelism; ``splits``: splits the source has at
    start; ``steps``: events after the start; ``failure_rate``: probability
    that a step is a fault; ``seed``: the generator's seed; ``strategy``: an
    assignment strategy name. The rest tune the checkpoint rules and the run.
    """

    readers: int = 4
    splits: int = 16
    steps: int = 200
    failure_rate: float = 0.1
    seed: int = 0
    strategy: str = "least-loaded"
    max_consecutive_failures: int = 3
    max_failure_ratio: float = 0.5
    reassign_on_recovery: bool = True
    keep_checkpoints: int = 2
    max_parallelism: int | None = None
    progress_order: ProgressOrder = ProgressOrder.BATCH
    mix: EventMix = field(default_factory=EventMix)

    def __post_init__(self) -> None:
        if not _is_int(self.readers) or self.readers < 1:
            raise InvalidParameterError("readers", self.readers, "an integer >= 1")
        if not _is_int(self.splits) or self.splits < 0:
            raise InvalidParameterError("splits", self.splits, "an integer >= 0")
        if not _is_int(self.steps) or self.steps < 0:
            raise InvalidParameterError("steps", self.steps, "an integer >= 0")
        rate = self.failure_rate
        if (
            isinstance(rate, bool)
            or not isinstance(rate, int | float)
            or not math.isfinite(rate)
            or not 0.0 <= rate <= 1.0
        ):
            raise InvalidParameterError("failure_rate", rate, "a number from 0 to 1 (a probability per step)")
        if not _is_int(self.seed):
            raise InvalidParameterError("seed", self.seed, "an integer")
        if self.strategy not in STRATEGIES:
            raise InvalidParameterError("strategy", self.strategy, "one of " + ", ".join(sorted(STRATEGIES)))
        if not _is_int(self.keep_checkpoints) or self.keep_checkpoints < 1:
            raise InvalidParameterError("keep_checkpoints", self.keep_checkpoints, "an integer >= 1")
        if self.max_parallelism is not None and (
            not _is_int(self.max_parallelism) or self.max_parallelism < 1
        ):
            raise InvalidParameterError("max_parallelism", self.max_parallelism, "an integer >= 1 or None")
        if not isinstance(self.progress_order, ProgressOrder):
            raise InvalidParameterError("progress_order", self.progress_order, "a ProgressOrder")
        self.checkpoint_config()  # validates max_consecutive_failures and max_failure_ratio

    def checkpoint_config(self) -> CheckpointConfig:
        return CheckpointConfig(
            max_consecutive_failures=self.max_consecutive_failures,
            max_failure_ratio=self.max_failure_ratio,
        )

    def scenario(self) -> Scenario:
        """The seeded scenario of this configuration (same config, same scenario)."""
        return generate_scenario(
            self.readers,
            self.splits,
            self.steps,
            self.failure_rate,
            self.seed,
            mix=self.mix,
            max_parallelism=self.max_parallelism,
        )


# --------------------------------------------------------------------------- components

EnumeratorFactory = Callable[
    [SplitSource, RecordingEnumeratorContext, AssignmentStrategy, EnumeratorSnapshot | None], SplitEnumerator
]


def default_enumerator(
    source: SplitSource,
    context: RecordingEnumeratorContext,
    strategy: AssignmentStrategy,
    restored: EnumeratorSnapshot | None,
) -> SplitEnumerator:
    """The real enumerator, through the one factory that inspects the source's capabilities."""
    return enumerator_for(source, context, strategy, restored=restored)


@dataclass(frozen=True, slots=True)
class Components:
    """The parts a run is built from; tests swap one for a deliberately broken one."""

    sink: Callable[[], SimulatedSink] = SimulatedSink
    enumerator: EnumeratorFactory = default_enumerator


class SimContext(RecordingEnumeratorContext):
    """The recording context whose assignments land in the simulated readers' views.

    ``reader_view[r]`` is what reader ``r`` reads next epoch, with the position
    it reads from. Only the enumerator changes it (assign/revoke), plus what a
    legacy reader keeps from its restored state.
    """

    def __init__(self, parallelism: int) -> None:
        super().__init__(parallelism)
        self.reader_view: dict[int, dict[str, Split]] = {}

    def assign_splits(self, assignment: Mapping[int, Sequence[Split]]) -> None:
        super().assign_splits(assignment)
        for reader, splits in assignment.items():
            mine = self.reader_view.setdefault(reader, {})
            for split in splits:
                mine[split.split_id] = split

    def revoke_splits(self, revocation: Mapping[int, Sequence[str]]) -> None:
        super().revoke_splits(revocation)
        for reader, ids in revocation.items():
            mine = self.reader_view.get(reader, {})
            for split_id in ids:
                mine.pop(split_id, None)


# --------------------------------------------------------------------------- result


@dataclass(frozen=True, slots=True)
class CheckpointCounts:
    global_: int = 0
    regional: int = 0
    aborted: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"global": self.global_, "regional": self.regional, "aborted": self.aborted}


@dataclass(frozen=True, slots=True)
class ShrinkResult:
    """The shortest scenario found that still breaks the rule of the first finding."""

    kind: FindingKind
    scenario: Scenario
    finding: Finding
    original_events: int
    runs: int

    def describe(self) -> list[str]:
        return self.scenario.describe()

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "parallelism": self.scenario.parallelism,
            "initial_splits": [s.describe() for s in self.scenario.initial_splits],
            "events": [e.describe() for e in self.scenario.events],
            "finding": self.finding.to_dict(),
            "original_events": self.original_events,
            "runs": self.runs,
        }


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """What one run found and measured. ``ok`` is True when no rule broke."""

    steps_run: int
    splits_lost: int
    splits_duplicated: int
    records_lost: int
    records_duplicated: int
    records_unexpected: int
    records_committed: int
    max_imbalance: int
    max_ref_chain_depth: int
    checkpoints: CheckpointCounts
    moves_per_failover: float
    partial_failovers: int
    foreign_moves: int  # splits of other readers moved by partial failovers (sticky strategies: 0)
    refused_during_restore: int
    stale_fallback_claims: int  # fallback-state splits finished or unsubscribed since (dropped on restore)
    global_restores: int
    rescales: int
    final_parallelism: int
    violations: tuple[Finding, ...]
    event_log: tuple[str, ...]
    stopped_early: bool = False
    shrunk: ShrinkResult | None = None

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "steps_run": self.steps_run,
            "splits_lost": self.splits_lost,
            "splits_duplicated": self.splits_duplicated,
            "records_lost": self.records_lost,
            "records_duplicated": self.records_duplicated,
            "records_unexpected": self.records_unexpected,
            "records_committed": self.records_committed,
            "max_imbalance": self.max_imbalance,
            "max_ref_chain_depth": self.max_ref_chain_depth,
            "checkpoints": self.checkpoints.to_dict(),
            "moves_per_failover": self.moves_per_failover,
            "partial_failovers": self.partial_failovers,
            "foreign_moves": self.foreign_moves,
            "refused_during_restore": self.refused_during_restore,
            "stale_fallback_claims": self.stale_fallback_claims,
            "global_restores": self.global_restores,
            "rescales": self.rescales,
            "final_parallelism": self.final_parallelism,
            "stopped_early": self.stopped_early,
            "violations": [f.to_dict() for f in self.violations],
            "shortest_failing_sequence": None if self.shrunk is None else self.shrunk.to_dict(),
            "event_log": list(self.event_log),
        }


def _moved(split: Split, position: int) -> Split:
    """``split.at(position)`` without ``dataclasses.replace`` (the simulator's hottest call)."""
    return Split(split.split_id, split.subscription, position, split.end, split.backlog_end)


def coverage_counts(spans: Iterable[tuple[int, int]], start: int, end: int) -> tuple[int, int, int]:
    """``(missing, duplicated, unexpected)`` record counts of one split's sink spans against ``[start, end)``.

    A measure for reports; whether a rule broke is decided by
    :func:`splitkeeper.core.invariants.check_sink_ranges`.
    """
    missing = duplicated = unexpected = 0
    covered_to = start
    for a, b in sorted(spans):
        if b <= a:
            continue
        unexpected += max(0, min(b, start) - a) + max(0, b - max(a, end))
        lo, hi = max(a, start), min(b, end)
        if lo >= hi:
            continue
        if lo < covered_to:
            duplicated += min(hi, covered_to) - lo
        elif lo > covered_to:
            missing += lo - covered_to
        covered_to = max(covered_to, hi)
    missing += max(0, end - covered_to)
    return missing, duplicated, unexpected


# --------------------------------------------------------------------------- simulator


class _Stop(Exception):
    """Internal: the stop predicate matched a finding."""


class Simulator:
    """Runs one scenario against the protocol core; one instance per run, :meth:`run` called once.

    ``config`` supplies the strategy, checkpoint rules and run options (its
    ``readers``/``splits``/``steps``/``seed`` only matter when ``scenario`` is
    None and the scenario is generated from them).
    """

    def __init__(
        self, config: SimConfig, scenario: Scenario | None = None, components: Components | None = None
    ) -> None:
        self.config = config
        self.scenario = scenario if scenario is not None else config.scenario()
        self.components = components or Components()
        if not _is_int(self.scenario.parallelism) or self.scenario.parallelism < 1:
            raise InvalidParameterError("scenario.parallelism", self.scenario.parallelism, "an integer >= 1")
        self._checkpoint_config = config.checkpoint_config()
        self._strategy_options = self._strategy_options_for(self.scenario)
        probe = strategy_by_name(config.strategy, **self._strategy_options)
        self._balanced = probe.balanced and config.reassign_on_recovery
        self._weights: dict[str, float] | None = None
        self._capacities: dict[int, float] | None = None
        if isinstance(probe, WeightedStrategy):
            self._weights, self._capacities = dict(probe.weights), dict(probe.capacities)
        # the in-memory source
        source_cls = ReassignableStaticSplitSource if config.reassign_on_recovery else StaticSplitSource
        self.source: StaticSplitSource = source_cls("sim", (), subscriptions=[*TOPICS, FILES])
        self._specs: dict[str, SplitSpec] = {}
        self._end: dict[str, int] = {}  # the source's current end offset per split (records exist below it)
        self.sink = self.components.sink()
        self.store = CheckpointStore()
        # the job (replaced on every global restore)
        self.parallelism = self.scenario.parallelism
        self.context: SimContext | None = None
        self.enumerator: SplitEnumerator | None = None
        self.coordinator: RegionalCheckpointCoordinator | None = None
        self.operator_state: dict[int, tuple[str, ...]] = {}
        self._next_checkpoint_id = 1
        self._clock = 0.0
        # ground truth of what was committed: per split, the next offset the latest completed
        # checkpoint (or the split's last one, once finished or unsubscribed) says was committed
        self._committed: dict[str, int] = {}
        # measures
        self._counts = {kind: 0 for kind in CheckpointKind}
        self._refused = 0
        self._stale_claims = 0
        self._global_restores = 0
        self._rescales = 0
        self._failovers = 0
        self._moves = 0
        self._foreign_moves = 0
        self._max_imbalance = 0
        self._max_depth = 0
        self._findings: list[Finding] = []
        self._finding_keys: set[tuple[Any, ...]] = set()
        self._log: list[str] = []
        self._step = 0
        self._event_text = "start"
        self._stop_on: Callable[[Finding], bool] | None = None
        self._truth_cache: tuple[Any, tuple[list[str], list[str]]] | None = None
        self._sink_checked: dict[str, tuple[int, int | None]] = {}  # split -> (spans, committed) checked

    # -- read-only views (for tests and reports, after run()) ----------------------------------

    @property
    def committed_positions(self) -> dict[str, int]:
        """Per split, the next offset the latest completed checkpoint says was committed (a copy)."""
        return dict(self._committed)

    def source_end(self, split_id: str) -> int:
        """The source's current end offset of ``split_id`` (records exist below it)."""
        return self._end[split_id]

    # -- strategy -----------------------------------------------------------------------------

    def _strategy_options_for(self, scenario: Scenario) -> dict[str, Any]:
        if self.config.strategy != WeightedStrategy.name:
            return {}
        # deterministic per-split throughput (1..4) and per-reader capacity (1, 1.5, 2)
        weights = {s.split_id: 1.0 + zlib.crc32(s.split_id.encode()) % 4 for s in scenario.all_specs()}
        top = max([scenario.parallelism, self.config.max_parallelism or 0, 2 * scenario.parallelism])
        for event in scenario.events:
            if isinstance(event, Rescale):
                top = max(top, event.parallelism)
        capacities = {r: 1.0 + 0.5 * (r % 3) for r in range(top)}
        return {"weights": weights, "capacities": capacities}

    def _new_strategy(self) -> AssignmentStrategy:
        return strategy_by_name(self.config.strategy, **self._strategy_options)

    # -- run ----------------------------------------------------------------------------------

    def run(
        self,
        *,
        stop_on: Callable[[Finding], bool] | None = None,
        progress: Callable[[int, int, SimulationResult], None] | None = None,
        progress_every: int = 0,
    ) -> SimulationResult:
        """Start the job, apply every event, check the invariants after each; return the result.

        ``stop_on`` ends the run at the first finding it accepts (shrinking
        uses it). ``progress(step, total, partial result)`` is called every
        ``progress_every`` steps.
        """
        self._stop_on = stop_on
        events = self.scenario.events
        stopped = False
        try:
            try:
                self._start(self.scenario.initial_splits)
                self._log.append(f"start: {self.parallelism} reader(s), {len(self._specs)} split(s)")
            except SplitkeeperError as err:
                self._protocol_error(err)
                raise _Stop from err
            self._check()
            for index, event in enumerate(events, start=1):
                self._step = index
                self._event_text = event.describe()
                try:
                    outcome = self._apply(event)
                except SplitkeeperError as err:
                    self._log.append(f"step {index}: {self._event_text} -> raised {err}")
                    self._protocol_error(err)
                    raise _Stop from err
                self._log.append(f"step {index}: {self._event_text} -> {outcome}")
                self._check()
                if progress is not None and progress_every > 0 and index % progress_every == 0:
                    progress(index, len(events), self._result(False))
        except _Stop:
            stopped = True
        return self._result(stopped and self._step < len(events))

    def _apply(self, event: Event) -> str:
        if isinstance(event, Epoch):
            return self._epoch(event)
        if isinstance(event, ReaderFailure):
            return self._reader_failure(event)
        if isinstance(event, GlobalRestart):
            return self._global_restore("global restart")
        if isinstance(event, Rescale):
            return self._rescale(event)
        if isinstance(event, DiscoverSplits):
            return self._discover(event)
        if isinstance(event, RemoveSubscription):
            return self._remove_subscription(event)
        if isinstance(event, CheckpointDuringRestore):
            return self._checkpoint_during_restore(event)
        raise InvalidParameterError("event", event, "an event of splitkeeper.sim.events")

    # -- findings -----------------------------------------------------------------------------

    def _record(self, kind: FindingKind, where: str, split_ids: Iterable[str], detail: str) -> None:
        ids = tuple(sorted(split_ids))
        key = (kind, where, ids)
        if key in self._finding_keys:
            return
        self._finding_keys.add(key)
        finding = Finding(self._step, kind, where, ids, detail, self._event_text)
        self._findings.append(finding)
        if self._stop_on is not None and self._stop_on(finding):
            raise _Stop

    def _record_violations(self, where: str, violations: Iterable[Violation]) -> None:
        for v in violations:
            self._record(v.kind, where, v.split_ids, v.detail)

    def _protocol_error(self, err: SplitkeeperError) -> None:
        with contextlib.suppress(_Stop):  # the run ends here anyway
            self._record(SimCheck.PROTOCOL_ERROR, "core", (), str(err))

    # -- job lifecycle ------------------------------------------------------------------------

    def _start(self, initial: Sequence[SplitSpec]) -> None:
        self._add_to_source(initial)
        self._restore(None, self.parallelism)

    def _add_to_source(self, specs: Iterable[SplitSpec]) -> list[Split]:
        new = []
        for spec in specs:
            if spec.split_id in self._specs:
                continue
            self._specs[spec.split_id] = spec
            self._end[spec.split_id] = spec.start + spec.length
            new.append(spec.to_split())
        self.source.add(new)
        return new

    def _restore(
        self,
        checkpoint: CompletedCheckpoint | None,
        parallelism: int,
        redistribution: Redistribution = Redistribution.EVEN_SPLIT,
        consecutive_regional: int | None = None,
        register_first: int | None = None,
    ) -> list[ReaderInfo]:
        """A (global) restore: new context, coordinator and enumerator, readers re-register.

        Registers the first ``register_first`` readers (all when None) and
        returns every reader's ``ReaderInfo`` (the caller registers the rest).
        Whatever was staged is gone: nothing of it was committed.
        """
        context = SimContext(parallelism)
        coordinator = RegionalCheckpointCoordinator(self._checkpoint_config, parallelism, self.store)
        if checkpoint is None:
            enumerator = self.components.enumerator(self.source, context, self._new_strategy(), None)
            infos = [ReaderInfo(reader_id=r) for r in range(parallelism)]
            operator_state: dict[int, tuple[str, ...]] = {r: () for r in range(parallelism)}
        else:
            restored = coordinator.restore(
                checkpoint, parallelism, redistribution, consecutive_regional=consecutive_regional
            )
            self._check_operator_state(
                checkpoint, [r.operator_state for r in restored.regions], redistribution
            )
            enumerator = self.components.enumerator(
                self.source, context, self._new_strategy(), restored.enumerator
            )
            infos = restored.reader_infos()
            operator_state = {r.region_id: tuple(r.operator_state) for r in restored.regions}
        enumerator.start()
        self.context, self.coordinator, self.enumerator = context, coordinator, enumerator
        self.parallelism = parallelism
        self.operator_state = operator_state
        for info in infos if register_first is None else infos[:register_first]:
            self._register(info)
        return infos

    def _register(self, info: ReaderInfo) -> None:
        assert self.enumerator is not None and self.context is not None
        self.context.reader_view[info.reader_id] = {}
        restart_reader(self.enumerator, self.context, info.reader_id, info.reported_splits)
        if not self.enumerator.reassign_on_recovery:
            # a legacy reader keeps (and reads) the restored splits the enumerator let it keep
            view = self.context.reader_view[info.reader_id]
            owned = set(self.enumerator.owned_split_ids(info.reader_id))
            for split in info.reported_splits:
                if split.split_id in owned and split.split_id not in view:
                    view[split.split_id] = split

    def _latest(self) -> CompletedCheckpoint | None:
        return self.store.latest()

    def _global_restore(self, why: str, parallelism: int | None = None, **kwargs: Any) -> str:
        latest = self._latest()
        self._restore(latest, parallelism or self.parallelism, **kwargs)
        self._global_restores += 1
        origin = "fresh start (no completed checkpoint)" if latest is None else f"from {latest.checkpoint_id}"
        return f"{why}: global restore {origin} at {self.parallelism} reader(s)"

    def _partial_failover(self, reader: int, state: RegionState | None) -> int:
        """``fail_reader`` + ``restart_reader`` with the reader's last good state; returns splits moved."""
        assert self.enumerator is not None and self.context is not None
        before = self.enumerator.owners()
        self.context.reader_view[reader] = {}
        fail_reader(self.enumerator, self.context, reader)
        reported = state.splits if state is not None else ()
        self._register(ReaderInfo(reader_id=reader, reported_splits=tuple(reported)))
        self.operator_state[reader] = tuple(state.operator_state) if state is not None else ()
        after = self.enumerator.owners()
        moved = [sid for sid, owner in after.items() if sid in before and before[sid] != owner]
        self._failovers += 1
        self._moves += len(moved)
        self._foreign_moves += sum(1 for sid in moved if before[sid] != reader)
        return len(moved)

    # -- events -------------------------------------------------------------------------------

    def _epoch(self, event: Epoch) -> str:
        assert self.enumerator is not None and self.context is not None and self.coordinator is not None
        checkpoint_id = self._next_checkpoint_id
        self._next_checkpoint_id += 1
        p = self.parallelism
        # 1. the source grows; discovery
        if event.growth:
            for split_id, spec in self._specs.items():
                if not spec.bounded:
                    self._end[split_id] += event.growth
        self.enumerator.add_splits(self.source.discover_splits())
        # 2. read into the staged buffer
        failures: dict[int, RegionFailure] = {}
        for region, kind in event.failures:
            failures.setdefault(region % p, kind)
        staged: dict[int, list[Run]] = {}
        reads: dict[int, dict[str, Split]] = {}  # per reader, each split it read at its new position
        source_end = self._end
        for reader in range(p):
            budget = event.budget // 2 if failures.get(reader) is RegionFailure.CRASH else event.budget
            runs: list[Run] = []
            advanced: dict[str, Split] = {}
            for split_id, split in self.context.reader_view.get(reader, {}).items():
                end = min(split.position + budget, source_end[split_id])
                if end > split.position:
                    runs.append((split_id, split.position, end))
                    advanced[split_id] = _moved(split, end)
            staged[reader], reads[reader] = runs, advanced
        # 3. the checkpoint
        self.context.on_checkpoint(checkpoint_id)
        pending = self.coordinator.trigger(checkpoint_id, now=self._clock)
        self._clock += CHECKPOINT_INTERVAL_S
        acked: list[int] = []
        for region in range(p):
            failure = failures.get(region)
            if failure is None:
                pending.acknowledge(region, self._acked_state(region, reads[region], checkpoint_id))
                acked.append(region)
            elif failure is not RegionFailure.TIMEOUT:
                pending.decline(region, f"simulated {failure.value}")
        self.coordinator.expire(pending, pending.deadline)
        # 4. acknowledged progress reaches the enumerator
        if self.config.progress_order is ProgressOrder.BATCH:
            self._apply_progress_batch(acked, reads)
        else:
            self._apply_progress_per_region(acked, reads)
        # 5. decide
        enumerator = self.enumerator
        result = self.coordinator.complete(
            pending, lambda fallback: enumerator.snapshot(checkpoint_id, fallback)
        )
        self._counts[result.kind] += 1
        failed_text = "".join(f" r{r}={failures[r].value}" for r in sorted(failures) if r < p)
        if result.completed is None:
            restored = self._global_restore(
                "aborted", consecutive_regional=self.coordinator.consecutive_regional
            )
            return f"checkpoint {checkpoint_id} aborted ({failed_text.strip()}); {restored}"
        completed = result.completed
        committed = self.sink.commit(checkpoint_id, staged, result.notify_complete)
        if event.commit_retry:
            self.sink.commit(checkpoint_id, staged, result.notify_complete)
        self.context.on_checkpoint_complete(checkpoint_id, result.notify_partially_completed)
        for region in result.notify_complete:
            self.operator_state[region] = tuple(completed.regions[region].operator_state)
        self._note_checkpoint(completed)
        moved = 0
        for region in result.notify_partially_completed:
            moved += self._partial_failover(region, completed.regions[region])
        self.coordinator.retain(self.config.keep_checkpoints)
        text = f"checkpoint {checkpoint_id} {result.kind.value}"
        if failed_text:
            text += f" ({failed_text.strip()}; {moved} split(s) moved by the failover)"
        return text + f", {committed} record(s) committed"

    def _acked_state(self, region: int, advanced: Mapping[str, Split], checkpoint_id: int) -> RegionState:
        """The region's new state: each split it reads at the position it read to, finished ones left out."""
        assert self.context is not None
        splits = []
        for split_id, split in self.context.reader_view.get(region, {}).items():
            moved = advanced.get(split_id, split)
            if not moved.finished:
                splits.append(moved)
        splits.sort(key=lambda s: s.split_id)
        state = (self.operator_state.get(region, ()) + (f"c{checkpoint_id}r{region}",))[-OPERATOR_STATE_KEEP:]
        return RegionState(region_id=region, splits=tuple(splits), operator_state=state)

    def _apply_progress_batch(self, acked: Sequence[int], reads: Mapping[int, Mapping[str, Split]]) -> None:
        assert self.enumerator is not None and self.context is not None
        moved: list[Split] = []
        finished: list[str] = []
        for region in acked:
            view = self.context.reader_view.get(region, {})
            for split_id, split in reads[region].items():
                view[split_id] = split
                moved.append(split)
                if split.finished:
                    finished.append(split_id)
        self.enumerator.update_positions(moved)
        for split_id in finished:
            # an earlier split_finished may have rebalanced this (at-end) split to another reader
            owner = self.enumerator.owner_of(split_id)
            reader = owner if owner is not None else next(r for r in acked if split_id in reads[r])
            self.context.reader_view.get(reader, {}).pop(split_id, None)
            self.enumerator.split_finished(reader, split_id)

    def _apply_progress_per_region(
        self, acked: Sequence[int], reads: Mapping[int, Mapping[str, Split]]
    ) -> None:
        """The order of ``runtime/pipeline.py``'s ``_apply_progress``: region by region."""
        assert self.enumerator is not None and self.context is not None
        for region in acked:
            mine = self.context.reader_view.get(region, {})
            moved = []
            for split_id, split in reads[region].items():
                if split_id in mine:
                    mine[split_id] = split
                    moved.append(split)
            self.enumerator.update_positions(moved)
            for split in moved:
                if split.finished:
                    self.enumerator.split_finished(region, split.split_id)
                    mine.pop(split.split_id, None)

    def _reader_failure(self, event: ReaderFailure) -> str:
        assert self.coordinator is not None
        reader = event.reader % self.parallelism
        state = self.coordinator.fallback_state(reader)
        moved = self._partial_failover(reader, state)
        origin = "no state" if state is None else f"state of checkpoint {state.ref_checkpoint_id}"
        return f"reader {reader} restarted from {origin}; {moved} split(s) moved"

    def _rescale(self, event: Rescale) -> str:
        if not _is_int(event.parallelism) or event.parallelism < 1:
            raise InvalidParameterError("parallelism", event.parallelism, "an integer >= 1")
        previous = self.parallelism
        self._rescales += 1
        text = self._global_restore(
            f"rescale {previous} -> {event.parallelism}",
            parallelism=event.parallelism,
            redistribution=event.redistribution,
        )
        return text

    def _discover(self, event: DiscoverSplits) -> str:
        assert self.enumerator is not None
        new = self._add_to_source(event.splits)
        added = self.enumerator.add_splits(new)
        return f"{added} new split(s) entered the pool"

    def _remove_subscription(self, event: RemoveSubscription) -> str:
        subscriptions = self.source.subscriptions()
        if event.subscription not in subscriptions:
            return f"{event.subscription!r} is not subscribed; nothing to do"
        self.source.set_subscriptions(subscriptions - {event.subscription})
        return self._global_restore(f"unsubscribed {event.subscription!r}")

    def _checkpoint_during_restore(self, event: CheckpointDuringRestore) -> str:
        latest = self._latest()
        first = event.registered_first % self.parallelism
        infos = self._restore(latest, self.parallelism, register_first=first)
        self._global_restores += 1
        assert self.coordinator is not None and self.enumerator is not None and self.context is not None
        checkpoint_id = self._next_checkpoint_id
        self._next_checkpoint_id += 1
        self.context.on_checkpoint(checkpoint_id)
        pending = self.coordinator.trigger(checkpoint_id, now=self._clock)
        self._clock += CHECKPOINT_INTERVAL_S
        for info in infos:
            # a pending reader's snapshot is its last good (restored) state, never an empty one
            pending.acknowledge(
                info.reader_id,
                RegionState(
                    region_id=info.reader_id,
                    splits=tuple(info.reported_splits),
                    operator_state=self.operator_state.get(info.reader_id, ()),
                ),
            )
        enumerator = self.enumerator
        try:
            result = self.coordinator.complete(
                pending, lambda fallback: enumerator.snapshot(checkpoint_id, fallback)
            )
        except ProtocolError as err:
            if "pending_readers" not in err.params:
                raise
            self.coordinator.abort(pending, f"the enumerator refused: {err.message}")
            self._counts[CheckpointKind.ABORTED] += 1
            self._refused += 1
            outcome = f"checkpoint {checkpoint_id} refused by the enumerator (readers still reporting)"
        else:
            self._counts[result.kind] += 1
            self._record(
                SimCheck.CHECKPOINT_DURING_RESTORE,
                "enumerator",
                (),
                f"checkpoint {checkpoint_id} became {result.kind.value} after only {first} of "
                f"{self.parallelism} reader(s) registered; the enumerator must refuse until all reported",
            )
            if result.completed is not None:
                self.context.on_checkpoint_complete(checkpoint_id, result.notify_partially_completed)
                self._note_checkpoint(result.completed)
            outcome = f"checkpoint {checkpoint_id} was NOT refused"
        for info in infos[first:]:
            self._register(info)
        origin = "fresh start" if latest is None else f"restore from {latest.checkpoint_id}"
        return f"{origin} at {self.parallelism} reader(s): {outcome}"

    # -- ground truth and checks --------------------------------------------------------------

    def _truth(self) -> tuple[list[str], list[str]]:
        """(live split ids, finished split ids) by the simulator's own account.

        Live: in the source, subscribed, not finished. Finished: a bounded
        split whose last record is in the sink (or that has no records).
        """
        subscriptions = self.source.subscriptions()
        key = (self.sink.records, len(self._specs), subscriptions)
        if self._truth_cache is not None and self._truth_cache[0] == key:
            return self._truth_cache[1]
        live: list[str] = []
        finished: list[str] = []
        high = self.sink.high_water
        for split_id, spec in self._specs.items():
            if spec.subscription not in subscriptions:
                continue
            if spec.bounded:
                end = spec.start + spec.length
                if end == spec.start or (high(split_id) or -1) >= end:
                    finished.append(split_id)
                    continue
            live.append(split_id)
        self._truth_cache = (key, (live, finished))
        return live, finished

    def _note_checkpoint(self, completed: CompletedCheckpoint) -> None:
        """Check a completed checkpoint's ownership view and record what it says was committed."""
        snapshot = completed.enumerator
        finished = snapshot.finished if snapshot is not None else frozenset()
        subscriptions = self.source.subscriptions()
        # A failed region's fallback state may still list a split another reader finished since, or
        # one of a subscription removed since: a restore drops those (snapshot.finished, the
        # subscriptions), so they are not part of what this checkpoint restores.
        readers: dict[int, tuple[Split, ...]] = {}
        for r, state in completed.regions.items():
            kept = tuple(
                s for s in state.splits if s.split_id not in finished and s.subscription in subscriptions
            )
            self._stale_claims += len(state.splits) - len(kept)
            readers[r] = kept
        in_regions = {split.split_id for splits in readers.values() for split in splits}
        elsewhere: list[Split] = []
        if snapshot is not None:
            elsewhere = [s for s in snapshot.pool if s.split_id not in in_regions]
            for splits in snapshot.assignments.values():
                elsewhere.extend(s for s in splits if s.split_id not in in_regions)
        view = Assignment(readers=readers, pool=tuple(elsewhere))
        live, truly_finished = self._truth()
        where = "checkpoint"
        self._record_violations(where, check_ownership(view, live))
        self._record_violations(where, check_finished_not_assigned(view, truly_finished))
        self._record_violations(where, check_subscriptions(view, subscriptions))
        self._max_depth = max(self._max_depth, self.store.chain_depth(completed.checkpoint_id))
        for split_id in finished:
            spec = self._specs.get(split_id)
            if spec is not None and spec.bounded:
                self._committed[split_id] = spec.start + spec.length
        positions: dict[str, int] = {}
        for split in [s for splits in readers.values() for s in splits] + elsewhere:
            positions.setdefault(split.split_id, split.position)
        beyond = sorted(sid for sid, pos in positions.items() if pos > self._end.get(sid, 0))
        if beyond:
            self._record(
                ViolationKind.OFFSET_UNEXPECTED,
                where,
                beyond,
                f"checkpoint {completed.checkpoint_id} claims positions beyond the source's last record "
                f"for {len(beyond)} split(s): {', '.join(beyond[:10])}",
            )
        self._committed.update(positions)

    def _check_sink(self) -> None:
        """``check_sink_ranges`` on every split whose sink records or committed position changed.

        The rule is per split, so a split whose inputs are unchanged since the
        last step has the same outcome as then (already recorded).
        """
        checked = self._sink_checked
        committed = self._committed
        changed = [
            sid
            for sid in set(committed) | set(self.sink.split_ids())
            if checked.get(sid) != (self.sink.version(sid), committed.get(sid))
        ]
        if not changed:
            return
        runs = [(sid, a, b) for sid in changed for a, b in self.sink.spans(sid)]
        starts = {sid: self._specs[sid].start for sid in changed if sid in self._specs}
        positions = {sid: committed[sid] for sid in changed if sid in committed}
        self._record_violations("sink", check_sink_ranges(runs, starts, positions))
        for sid in changed:
            checked[sid] = (self.sink.version(sid), committed.get(sid))

    def _check_operator_state(
        self,
        checkpoint: CompletedCheckpoint,
        restored: Sequence[tuple[str, ...]],
        redistribution: Redistribution,
    ) -> None:
        before = [e for r in sorted(checkpoint.regions) for e in checkpoint.regions[r].operator_state]
        if redistribution is Redistribution.UNION:
            bad = [i for i, state in enumerate(restored) if list(state) != before]
            ok = not bad
        else:
            ok = [e for state in restored for e in state] == before
        if not ok:
            self._record(
                SimCheck.OPERATOR_STATE,
                "restore",
                (),
                f"restoring checkpoint {checkpoint.checkpoint_id} at {len(restored)} reader(s) "
                f"({redistribution.value}) did not redistribute its {len(before)} operator-state elements",
            )

    def _check(self) -> None:
        """Every DESIGN 6 rule, on the live job, the readers, the sink and the checkpoint store."""
        assert self.enumerator is not None and self.context is not None
        live, finished = self._truth()
        p = self.parallelism
        state = self.enumerator.assignment()
        self._record_violations(
            "enumerator",
            check_enumerator_state(
                state,
                known_live=live,
                finished=finished,
                subscriptions=self.source.subscriptions(),
                balanced=self._balanced,
                readers=range(p),
                weights=self._weights,
                capacities=self._capacities,
            ),
        )
        loads = {r: len(state.readers.get(r, ())) for r in range(p)}
        self._max_imbalance = max(self._max_imbalance, count_spread(loads))
        # what the readers actually read: each split once, and exactly what the enumerator says
        views = self.context.reader_view
        diverged = False
        for r in range(p):
            owned = {s.split_id for s in state.readers.get(r, ())}
            read = set(views.get(r, {}))
            if owned != read:
                diverged = True
                extra, missing = sorted(read - owned), sorted(owned - read)
                self._record(
                    SimCheck.READER_VIEW_DIVERGED,
                    "readers",
                    extra + missing,
                    f"reader {r} reads {extra} that the enumerator does not give it and not {missing} "
                    "that it does",
                )
        if diverged:  # otherwise what readers read is exactly the enumerator's state, checked above
            reading = Assignment(
                readers={r: tuple(views.get(r, {}).values()) for r in range(p)}, pool=state.pool
            )
            self._record_violations("readers", check_ownership(reading, live))
        # the sink: per split, [start, committed) exactly once
        self._check_sink()
        # the store: refs resolve and point back; no region state deeper than the bound
        mcf = self.config.max_consecutive_failures
        refs = {cid: self.store.get(cid).ref_checkpoint_ids for cid in self.store.ids()}
        depths = {cid: self.store.chain_depth(cid) for cid in refs}
        self._record_violations("store", check_ref_chains(refs, mcf, depths))

    # -- result -------------------------------------------------------------------------------

    def _result(self, stopped_early: bool) -> SimulationResult:
        lost = {s for f in self._findings if f.kind is ViolationKind.NOT_OWNED for s in f.split_ids}
        duplicated = {
            s for f in self._findings if f.kind is ViolationKind.OWNED_MORE_THAN_ONCE for s in f.split_ids
        }
        records_lost = records_duplicated = records_unexpected = 0
        for split_id in set(self._committed) | set(self.sink.split_ids()):
            spec = self._specs.get(split_id)
            start = spec.start if spec is not None else 0
            end = self._committed.get(split_id, start)
            missing, twice, outside = coverage_counts(self.sink.spans(split_id), start, end)
            records_lost += missing
            records_duplicated += twice
            records_unexpected += outside
        counts = self._counts
        return SimulationResult(
            steps_run=self._step,
            splits_lost=len(lost),
            splits_duplicated=len(duplicated),
            records_lost=records_lost,
            records_duplicated=records_duplicated,
            records_unexpected=records_unexpected,
            records_committed=self.sink.records,
            max_imbalance=self._max_imbalance,
            max_ref_chain_depth=self._max_depth,
            checkpoints=CheckpointCounts(
                counts[CheckpointKind.GLOBAL], counts[CheckpointKind.REGIONAL], counts[CheckpointKind.ABORTED]
            ),
            moves_per_failover=round(self._moves / self._failovers, 4) if self._failovers else 0.0,
            partial_failovers=self._failovers,
            foreign_moves=self._foreign_moves,
            refused_during_restore=self._refused,
            stale_fallback_claims=self._stale_claims,
            global_restores=self._global_restores,
            rescales=self._rescales,
            final_parallelism=self.parallelism,
            violations=tuple(self._findings),
            event_log=tuple(self._log),
            stopped_early=stopped_early,
        )


# --------------------------------------------------------------------------- entry points


def run_scenario(
    config: SimConfig,
    scenario: Scenario | None = None,
    components: Components | None = None,
    *,
    stop_on: Callable[[Finding], bool] | None = None,
    progress: Callable[[int, int, SimulationResult], None] | None = None,
    progress_every: int = 0,
) -> SimulationResult:
    """Run one scenario (default: the config's seeded one) without shrinking."""
    return Simulator(config, scenario, components).run(
        stop_on=stop_on, progress=progress, progress_every=progress_every
    )


def simulate(
    config: SimConfig,
    scenario: Scenario | None = None,
    components: Components | None = None,
    *,
    shrink: bool = True,
    max_shrink_runs: int = 400,
    progress: Callable[[int, int, SimulationResult], None] | None = None,
    progress_every: int = 0,
) -> SimulationResult:
    """Run, and when a rule broke, shrink to the shortest scenario that still breaks the first one.

    The result's ``shrunk`` holds that scenario (None when nothing broke or
    ``shrink`` is False). Deterministic: same arguments, same result.
    """
    from splitkeeper.sim.shrink import shrink_finding

    scenario = scenario if scenario is not None else config.scenario()
    result = run_scenario(config, scenario, components, progress=progress, progress_every=progress_every)
    if shrink and result.violations:
        shrunk = shrink_finding(config, scenario, result.violations[0], components, max_runs=max_shrink_runs)
        result = replace(result, shrunk=shrunk)
    return result
