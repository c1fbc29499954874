"""The deterministic fault simulator: the epoch driver run through random failures, in memory.

:class:`Simulator` runs one :class:`~splitkeeper.sim.events.Scenario` through
the very :class:`~splitkeeper.core.driver.EpochDriver` the Spark runtime runs,
with in-memory adapters for its ports instead of Spark and Delta: a source
whose unbounded splits grow, region runners that read planned ranges into a
staged buffer (or decline, or time out, as the scenario says), the simulated
exactly-once sink and an in-memory state store. Every protocol decision (plan,
acknowledgement, completion, partial failover, restore, rescale) is the
driver's; this module only injects events and checks the outcome.

Between epochs the scenario injects reader failures after a checkpoint,
global restarts, rescales (even-split or union operator state), new splits,
removed subscriptions (the source stops subscribing; the driver drops the
splits at its next epoch or restore, protocol rule 1.5) and checkpoints
requested in the middle of a restore (protocol rule 1.4: the enumerator must
refuse).

After every step the invariants of protocol section 6 are checked with
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
from dataclasses import dataclass, field
from typing import Any

from splitkeeper.core import defaults
from splitkeeper.core.assignment import STRATEGIES, WeightedStrategy, strategy_by_name
from splitkeeper.core.checkpoint import CheckpointConfig, CheckpointStore
from splitkeeper.core.driver import DriverSettings, EpochDriver, EpochReport, FailoverReport
from splitkeeper.core.enumerator import (
    RecordingEnumeratorContext,
    SplitEnumerator,
    enumerator_for,
)
from splitkeeper.core.failures import RegionFailure as FailureCause
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
from splitkeeper.core.ports import (
    Clock,
    EpochDecision,
    EpochPlan,
    EpochSink,
    RegionRun,
    RegionRunner,
    SinkReceipt,
    StateStore,
)
from splitkeeper.core.rescale import Redistribution
from splitkeeper.core.restarts import RestartCheck, RestartCheckError
from splitkeeper.core.source import (
    RegionReader,
    SourceConnector,
    StaticSplitSource,
    SupportsSplitReassignmentOnRecovery,
)
from splitkeeper.core.types import (
    Assignment,
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    RegionOutcome,
    Split,
)
from splitkeeper.errors import ConcurrentRunError, InvalidParameterError, SplitkeeperError
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

#: Simulated seconds an epoch takes (the simulator's only clock).
CHECKPOINT_INTERVAL_S = 1000.0


# --------------------------------------------------------------------------- findings


class SimCheck(enum.Enum):
    """Rules the simulator checks beyond protocol section 6 (those are :class:`ViolationKind`)."""

    PROTOCOL_ERROR = "protocol_error"  # the core raised on a legal event sequence
    CHECKPOINT_DURING_RESTORE = "checkpoint_during_restore"  # protocol rule 1.4, scenario 2: must be refused
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
    strategy: str = defaults.STRATEGY
    max_consecutive_failures: int = defaults.MAX_CONSECUTIVE_FAILURES
    max_failure_ratio: float = defaults.MAX_FAILURE_RATIO
    reassign_on_recovery: bool = True
    retain_checkpoints: int = 2
    max_parallelism: int | None = None
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
        if not _is_int(self.retain_checkpoints) or self.retain_checkpoints < 1:
            raise InvalidParameterError("retain_checkpoints", self.retain_checkpoints, "an integer >= 1")
        if self.max_parallelism is not None and (
            not _is_int(self.max_parallelism) or self.max_parallelism < 1
        ):
            raise InvalidParameterError("max_parallelism", self.max_parallelism, "an integer >= 1 or None")
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


# --------------------------------------------------------------------------- adapters of the driver's ports


class SimSource(StaticSplitSource, SourceConnector):
    """The in-memory source: splits of the scenario, unbounded ones growing every epoch.

    ``ends`` is the source's current end offset per split (records exist below it).
    """

    def __init__(self, subscriptions: Iterable[str]) -> None:
        StaticSplitSource.__init__(self, "sim", (), subscriptions=subscriptions)
        self.ends: dict[str, int] = {}

    @property
    def bounded(self) -> bool:
        return False

    def discover_splits(self) -> list[Split]:
        return list(StaticSplitSource.discover_splits(self))

    def available_end(self, split: Split) -> int:
        return self.ends[split.split_id]

    def reader(self) -> RegionReader:
        raise InvalidParameterError("reader", "sim", "a Spark source: the simulator reads nothing")

    def fingerprint(self) -> str:
        return "sim"


class ReassignableSimSource(SimSource, SupportsSplitReassignmentOnRecovery):
    """A :class:`SimSource` whose readers use deferred assignment (FLIP-537)."""


class SimRegionRunner(RegionRunner):
    """Reads planned ranges into a staged buffer; the regions in ``failures`` decline or time out.

    ``failures`` applies to the next epoch run; ``schedule`` maps ``(epoch, region)`` to a
    failure for a scripted run (the same schedule a Spark run's fault plan injects).
    ``staged`` holds every region's runs of epoch ``epoch``, the last it ran (failed regions' too: a
    broken sink may commit them, and the simulator must catch it). A region that reads a
    split in ``poison`` declines naming it in ``failed_splits`` (a record that cannot be
    read, protocol rule 1.8), every epoch until the split leaves ``poison``.
    """

    def __init__(
        self,
        schedule: Mapping[tuple[int, int], RegionFailure] | None = None,
        poison: set[str] | None = None,
    ) -> None:
        self.failures: dict[int, RegionFailure] = {}
        self.schedule: dict[tuple[int, int], RegionFailure] = dict(schedule or {})
        self.poison: set[str] = set(poison or ())
        self.staged: dict[int, list[Run]] = {}
        self.epoch: int | None = None

    def run(self, epoch: int, plan: EpochPlan, timeout_s: float) -> dict[int, RegionRun]:
        out: dict[int, RegionRun] = {}
        self.staged = {}
        self.epoch = epoch
        for region, ranges in plan.items():
            runs = [(split.split_id, start, end) for split, start, end in ranges if end > start]
            self.staged[region] = runs
            failure = self.failures.get(region) or self.schedule.get((epoch, region))
            poisoned = tuple(sid for sid, _start, _end in runs if sid in self.poison)
            if poisoned and failure is None:
                out[region] = RegionRun(
                    region,
                    RegionOutcome.DECLINE,
                    error=f"simulated unreadable record in {', '.join(poisoned)}",
                    failed_splits=poisoned,
                )
            elif failure is None:
                out[region] = RegionRun(
                    region_id=region,
                    outcome=RegionOutcome.ACK,
                    positions={split.split_id: end for split, _start, end in ranges},
                    records=sum(end - start for _sid, start, end in runs),
                    backlog_finished=tuple(
                        split.split_id
                        for split, _start, end in ranges
                        if split.backlog_end is not None and end >= split.backlog_end
                    ),
                    output=runs,
                )
            elif failure is RegionFailure.TIMEOUT:
                out[region] = RegionRun(region, RegionOutcome.TIMEOUT, error="simulated timeout")
            else:
                out[region] = RegionRun(region, RegionOutcome.DECLINE, error=f"simulated {failure.value}")
        return out


class SimEpochSink(EpochSink):
    """The driver's sink port over a :class:`SimulatedSink`, with the fence on the recorded epoch.

    ``replay_next`` replays the next commit with the same epoch (a driver that died
    after its sink commit and committed again): the sink must ignore the replay.
    """

    def __init__(self, sink: SimulatedSink, runner: SimRegionRunner) -> None:
        self.sink = sink
        self.runner = runner
        # a sink remembers its recorded epoch: a port opened again over the same ledger (a restart) too
        self.recorded: int | None = max(sink.committed_checkpoint_ids, default=None)
        self.attempts: dict[int, str] = {}
        self.receipts: dict[int, int] = {}  # records of the recorded epoch's commit (a replay's receipt)
        self.replay_next = False

    def committed_epoch(self) -> int | None:
        return self.recorded

    def committed_attempt(self, epoch: int) -> str | None:
        return self.attempts.get(epoch)

    def commit(
        self, epoch: int, outputs: Sequence[RegionRun], *, expected: int | None, attempt_id: str
    ) -> SinkReceipt:
        if self.recorded == epoch and self.attempts.get(epoch) == attempt_id:  # the port's replay rule
            return SinkReceipt(epoch=epoch, records=self.receipts.get(epoch, 0), replayed=True)
        if self.recorded != expected:
            raise ConcurrentRunError(
                f"sink at epoch {self.recorded}, not {expected}", found=self.recorded, expected=expected
            )
        acked = [o.region_id for o in outputs]
        # an epoch whose regions were all idle ran no task: nothing of it is staged
        staged = self.runner.staged if self.runner.epoch == epoch else {}
        records = self.sink.commit(epoch, staged, acked)
        if self.replay_next:
            self.replay_next = False
            self.sink.commit(epoch, staged, acked)
        self.recorded = epoch
        self.attempts = {epoch: attempt_id}
        self.receipts = {epoch: records}
        return SinkReceipt(epoch=epoch, records=records)

    def discard(self, epoch: int) -> None:
        """Nothing staged outlives its epoch in memory."""

    def discard_through(self, epoch: int) -> None:
        """Nothing staged outlives its epoch in memory."""


class SimState(StateStore):
    """The in-memory state store: completed checkpoints (chain-safe retention), plans and decisions."""

    def __init__(self) -> None:
        self.store = CheckpointStore()
        self.planned: int | None = None
        self.decisions: dict[tuple[int, str], EpochDecision] = {}
        self.configured: dict[int, int | None] = {}
        self.weights: dict[int, dict[str, float]] = {}
        self.aborted = 0
        self.restart_checks: list[RestartCheck] = []  # every in-run restart check, as recorded

    def latest_checkpoint(self) -> CompletedCheckpoint | None:
        return self.store.latest()

    def load_checkpoint(self, checkpoint_id: int) -> CompletedCheckpoint:
        return self.store.get(checkpoint_id)

    def checkpoint_ids(self) -> list[int]:
        return self.store.ids()

    def ref_chain(self, checkpoint_id: int) -> list[int]:
        return self.store.ref_chain(checkpoint_id)

    def configured_parallelism(self, checkpoint_id: int) -> int | None:
        return self.configured.get(checkpoint_id)

    def split_weights(self, checkpoint_id: int) -> Mapping[str, float]:
        return self.weights.get(checkpoint_id, {})

    def latest_plan_epoch(self) -> int | None:
        return self.planned

    def decision(self, epoch: int, attempt_id: str) -> EpochDecision | None:
        return self.decisions.get((epoch, attempt_id))

    def write_plan(self, epoch: int, plan: EpochPlan) -> None:
        if self.planned is not None and epoch <= self.planned:
            raise ConcurrentRunError(f"epoch {epoch} is not after the latest planned epoch {self.planned}")
        self.planned = epoch

    def write_decision(self, decision: EpochDecision) -> None:
        self.decisions = {(decision.epoch, decision.attempt_id): decision}  # only the latest is ever redone

    def discard_decision(self, epoch: int, attempt_id: str) -> None:
        self.decisions.pop((epoch, attempt_id), None)

    def record_restart_checks(self, checks: Sequence[RestartCheck]) -> None:
        self.restart_checks.extend(checks)

    def commit_checkpoint(
        self,
        decision: EpochDecision,
        before_row: Callable[[], None] | None = None,
        *,
        phases_ms: Mapping[str, int] | None = None,
        failures: Sequence[FailureCause] = (),
    ) -> None:
        if decision.epoch in self.store:
            return
        if before_row is not None:
            before_row()
        self.store.add(decision.checkpoint)
        self.configured[decision.epoch] = decision.configured_parallelism
        self.weights[decision.epoch] = dict(decision.split_weights)

    def log_attempt(
        self,
        epoch: int,
        outcomes: Mapping[int, RegionOutcome],
        reason: str,
        *,
        failures: Sequence[FailureCause] = (),
    ) -> None:
        self.aborted += 1

    def retain(
        self,
        keep_latest: int,
        pinned: Sequence[int] = (),
        mid_retention: Callable[[], None] | None = None,
    ) -> list[int]:
        if mid_retention is not None:  # the in-memory store deletes in one step: nothing is half done
            mid_retention()
        return self.store.retain(keep_latest, pinned=pinned)


class SimClock(Clock):
    """Simulated time: each epoch takes :data:`CHECKPOINT_INTERVAL_S`."""

    def __init__(self) -> None:
        self.time = 0.0

    def now(self) -> float:
        return self.time

    def sleep(self, seconds: float) -> None:
        self.time += max(0.0, seconds)


# --------------------------------------------------------------------------- components

EnumeratorFactory = Callable[..., SplitEnumerator]


def default_enumerator(
    source: SourceConnector,
    context: RecordingEnumeratorContext,
    strategy: Any,
    restored: EnumeratorSnapshot | None = None,
) -> SplitEnumerator:
    """The real enumerator, through the one factory that inspects the source's capabilities."""
    return enumerator_for(source, context, strategy, restored=restored)


@dataclass(frozen=True, slots=True)
class Components:
    """The parts a run is built from; tests swap one for a deliberately broken one.

    ``driver`` is the driver class (a broken subclass in :mod:`splitkeeper.sim.broken`
    breaks one protocol decision on purpose).
    """

    sink: Callable[[], SimulatedSink] = SimulatedSink
    enumerator: EnumeratorFactory = default_enumerator
    driver: type[EpochDriver] = EpochDriver


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
    """Runs one scenario through the epoch driver; one instance per run, :meth:`run` called once.

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
        strategy_options = self._strategy_options_for(self.scenario)
        probe = strategy_by_name(config.strategy, **strategy_options)
        self._balanced = probe.balanced and config.reassign_on_recovery
        self._weights: dict[str, float] | None = None
        self._capacities: dict[int, float] | None = None
        if isinstance(probe, WeightedStrategy):
            self._weights, self._capacities = dict(probe.weights), dict(probe.capacities)
        # the adapters of the driver's ports
        source_cls = ReassignableSimSource if config.reassign_on_recovery else SimSource
        self.source: SimSource = source_cls(subscriptions=[*TOPICS, FILES])
        self._specs: dict[str, SplitSpec] = {}
        self._end = self.source.ends  # the source's current end offset per split
        self.sink = self.components.sink()
        self.runner = SimRegionRunner()
        self.sink_port = SimEpochSink(self.sink, self.runner)
        self.state = SimState()
        self.store = self.state.store
        self.clock = SimClock()
        self.driver = self.components.driver(
            DriverSettings(
                pipeline="sim",
                parallelism=self.scenario.parallelism,
                checkpoint=config.checkpoint_config(),
                retain_checkpoints=config.retain_checkpoints,
                strategy=config.strategy,
                strategy_options=strategy_options,
            ),
            self.source,
            self.runner,
            self.sink_port,
            self.state,
            self.clock,
            enumerator_factory=self.components.enumerator,
        )
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
        # The subscriptions the pipeline must honour now: the source's, as of the driver's latest
        # epoch or restore (a live change reaches the enumerator there, protocol rule 1.5).
        self._subscribed: frozenset[str] = self.source.subscriptions()
        self._sink_checked: dict[str, tuple[int, int | None]] = {}  # split -> (spans, committed) checked

    # -- the driver's live state (for the checks) ----------------------------------------------

    @property
    def enumerator(self) -> SplitEnumerator | None:
        return self.driver.enumerator

    @property
    def context(self) -> Any:
        return self.driver.context

    @property
    def coordinator(self) -> Any:
        return self.driver.coordinator

    @property
    def operator_state(self) -> dict[int, tuple[str, ...]]:
        return self.driver.operator_state

    @property
    def parallelism(self) -> int:
        return self.driver.parallelism if self.driver.context is not None else self.scenario.parallelism

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
            if isinstance(err, RestartCheckError):  # the driver's own in-run check caught a broken rule
                self._record_violations("restart", err.params["check"].violations)
                return
            self._record(SimCheck.PROTOCOL_ERROR, "core", (), str(err))

    # -- job lifecycle ------------------------------------------------------------------------

    def _start(self, initial: Sequence[SplitSpec]) -> None:
        self._add_to_source(initial)
        self._restore(None, self.scenario.parallelism)

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
        register_first: int | None = None,
    ) -> list[Any]:
        """A global restore through the driver; checks the operator-state redistribution it did."""
        infos = self.driver.restore(
            checkpoint, parallelism, redistribution=redistribution, register_first=register_first
        )
        self._subscribed = self.source.subscriptions()  # a restore's enumerator starts from them
        restored = self.driver.last_restore
        if checkpoint is not None and restored is not None:
            self._check_operator_state(
                checkpoint, [r.operator_state for r in restored.regions], redistribution
            )
        return infos

    def _global_restore(self, why: str, parallelism: int | None = None, **kwargs: Any) -> str:
        latest = self.store.latest()
        self._restore(latest, parallelism or self.parallelism, **kwargs)
        self._global_restores += 1
        origin = "fresh start (no completed checkpoint)" if latest is None else f"from {latest.checkpoint_id}"
        return f"{why}: global restore {origin} at {self.parallelism} reader(s)"

    def _count_failover(self, report: FailoverReport) -> int:
        self._failovers += 1
        self._moves += len(report.moved)
        self._foreign_moves += report.foreign
        return len(report.moved)

    # -- events -------------------------------------------------------------------------------

    def _epoch(self, event: Epoch) -> str:
        p = self.parallelism
        if event.growth:
            for split_id, spec in self._specs.items():
                if not spec.bounded:
                    self._end[split_id] += event.growth
        failures: dict[int, RegionFailure] = {}
        for region, kind in event.failures:
            failures.setdefault(region % p, kind)
        self.runner.failures = failures
        self.sink_port.replay_next = event.commit_retry
        self.clock.time += CHECKPOINT_INTERVAL_S
        report: EpochReport = self.driver.run_epoch(records_per_split=event.budget)
        self._epoch_ran(report)
        failed_text = "".join(f" r{r}={failures[r].value}" for r in sorted(failures) if r < p)
        if report.completed is None:
            self._global_restores += 1  # the driver restored from the latest completed checkpoint
            origin = self.store.latest()
            restored = "fresh start" if origin is None else f"from {origin.checkpoint_id}"
            return (
                f"checkpoint {report.epoch} aborted ({failed_text.strip()}); aborted: global restore "
                f"{restored} at {self.parallelism} reader(s)"
            )
        self._note_checkpoint(report.completed)
        moved = sum(self._count_failover(f) for f in report.failovers)
        text = f"checkpoint {report.epoch} {report.kind.value}"
        if failed_text:
            text += f" ({failed_text.strip()}; {moved} split(s) moved by the failover)"
        return text + f", {report.committed_records} record(s) committed"

    def _epoch_ran(self, report: EpochReport) -> None:
        self._counts[report.kind] += 1
        if not report.refused:  # the epoch read the source's subscriptions before its discovery
            self._subscribed = self.source.subscriptions()

    def _reader_failure(self, event: ReaderFailure) -> str:
        reader = event.reader % self.parallelism
        report = self.driver.fail_reader(reader)
        moved = self._count_failover(report)
        ref = report.ref_checkpoint_id
        origin = "no state" if ref is None else f"state of checkpoint {ref}"
        return f"reader {reader} restarted from {origin}; {moved} split(s) moved"

    def _rescale(self, event: Rescale) -> str:
        if not _is_int(event.parallelism) or event.parallelism < 1:
            raise InvalidParameterError("parallelism", event.parallelism, "an integer >= 1")
        previous = self.parallelism
        self._rescales += 1
        return self._global_restore(
            f"rescale {previous} -> {event.parallelism}",
            parallelism=event.parallelism,
            redistribution=event.redistribution,
        )

    def _discover(self, event: DiscoverSplits) -> str:
        self._add_to_source(event.splits)
        added = self.driver.discover()
        return f"{added} new split(s) entered the pool"

    def _remove_subscription(self, event: RemoveSubscription) -> str:
        subscriptions = self.source.subscriptions()
        if event.subscription not in subscriptions:
            return f"{event.subscription!r} is not subscribed; nothing to do"
        # Only the source changes: the driver's next epoch (or restore) drops the splits (rule 1.5).
        self.source.set_subscriptions(subscriptions - {event.subscription})
        return f"unsubscribed {event.subscription!r}: dropped by the next epoch or restore"

    def _checkpoint_during_restore(self, event: CheckpointDuringRestore) -> str:
        latest = self.store.latest()
        p = self.parallelism
        first = event.registered_first % p
        infos = self._restore(latest, p, register_first=first)
        self._global_restores += 1
        self.runner.failures = {}
        self.clock.time += CHECKPOINT_INTERVAL_S
        report = self.driver.run_epoch()
        self._epoch_ran(report)
        if report.refused:
            self._refused += 1
            outcome = f"checkpoint {report.epoch} refused by the enumerator (readers still reporting)"
        else:
            self._record(
                SimCheck.CHECKPOINT_DURING_RESTORE,
                "enumerator",
                (),
                f"checkpoint {report.epoch} became {report.kind.value} after only {first} of "
                f"{p} reader(s) registered; the enumerator must refuse until all reported",
            )
            if report.completed is not None:
                self._note_checkpoint(report.completed)
            outcome = f"checkpoint {report.epoch} was NOT refused"
        for info in infos[first:]:
            self.driver.register(info)
        origin = "fresh start" if latest is None else f"restore from {latest.checkpoint_id}"
        return f"{origin} at {p} reader(s): {outcome}"

    # -- ground truth and checks --------------------------------------------------------------

    def _truth(self) -> tuple[list[str], list[str]]:
        """(live split ids, finished split ids) by the simulator's own account.

        Live: in the source, subscribed (as of the driver's latest epoch or restore), not
        finished. Finished: a bounded split whose last record is in the sink (or that has no
        records).
        """
        subscriptions = self._subscribed
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
        subscriptions = self._subscribed
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
        """Every protocol section 6 rule, on the live job, the readers, the sink and the checkpoint store."""
        assert self.enumerator is not None and self.context is not None
        live, finished = self._truth()
        p = self.parallelism
        state = self.enumerator.assignment()
        weights = self._weights
        strategy = self.enumerator.strategy
        if weights is not None and isinstance(strategy, WeightedStrategy):
            # the weights the strategy balances by now (the driver feeds it measured throughput)
            weights = {s.split_id: strategy.weight(s.split_id) for ss in state.readers.values() for s in ss}
        self._record_violations(
            "enumerator",
            check_enumerator_state(
                state,
                known_live=live,
                finished=finished,
                subscriptions=self._subscribed,
                balanced=self._balanced,
                readers=range(p),
                weights=weights,
                capacities=self._capacities,
            ),
        )
        loads = {r: len(state.readers.get(r, ())) for r in range(p)}
        self._max_imbalance = max(self._max_imbalance, count_spread(loads))
        # what the readers actually read: each split once, and exactly what the enumerator says
        views = self.context.reader_splits
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
