"""The epoch driver with the simulator's in-memory adapters: decisions that are the driver's own."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import pytest

from splitkeeper.core.backlog import BacklogConfig
from splitkeeper.core.checkpoint import CheckpointConfig
from splitkeeper.core.driver import DriverSettings, EpochDriver
from splitkeeper.core.ports import CrashPoint, DriverHooks, EpochPlan, RegionRun
from splitkeeper.core.source import (
    ExternallyCheckpointedSource,
    ExternalPosition,
    SplitChange,
    SplitChangeKind,
    SupportsSplitIdentityCheck,
)
from splitkeeper.core.types import (
    CheckpointKind,
    RecoveryDecision,
    Split,
    SplitChangePolicy,
    SplitFailurePolicy,
)
from splitkeeper.errors import (
    ConcurrentRunError,
    InvalidParameterError,
    ProtocolError,
    RunStalledError,
    SourceError,
)
from splitkeeper.sim.events import RegionFailure
from splitkeeper.sim.simulator import (
    ReassignableSimSource,
    SimClock,
    SimEpochSink,
    SimRegionRunner,
    SimState,
)
from splitkeeper.sim.sink import SimulatedSink


def _driver(
    source: ReassignableSimSource,
    *,
    parallelism: int = 2,
    schedule: dict | None = None,
    epoch_records: int = 8,
) -> tuple[EpochDriver, SimulatedSink, SimState, SimEpochSink]:
    runner = SimRegionRunner(schedule)
    ledger = SimulatedSink()
    sink = SimEpochSink(ledger, runner)
    state = SimState()
    driver = EpochDriver(
        DriverSettings(
            pipeline="t",
            parallelism=parallelism,
            checkpoint=CheckpointConfig(),
            backlog=BacklogConfig(backlog_epoch_records=epoch_records, normal_epoch_records=epoch_records),
        ),
        source,
        runner,
        sink,
        state,
        SimClock(),
    )
    return driver, ledger, state, sink


def _source(subscriptions: set[str], splits: dict[str, tuple[str, int]]) -> ReassignableSimSource:
    source = ReassignableSimSource(subscriptions=subscriptions)
    source.add([Split(sid, sub, 0) for sid, (sub, _end) in splits.items()])
    source.ends.update({sid: end for sid, (_sub, end) in splits.items()})
    return source


def test_a_subscription_created_mid_run_is_read_from_the_next_epoch_and_a_removed_one_is_dropped() -> None:
    source = _source({"a"}, {"a-0": ("a", 10), "a-1": ("a", 10)})
    driver, ledger, _state, _sink = _driver(source)
    driver.open()
    driver.run_epoch(records_per_split=4)
    assert set(ledger.split_ids()) == {"a-0", "a-1"}

    # a new topic matching the pattern appears while the pipeline runs
    source.add([Split("b-0", "b", 0)])
    source.ends["b-0"] = 6
    source.set_subscriptions({"a", "b"})
    report = driver.run_epoch(records_per_split=4)
    assert report.kind is CheckpointKind.GLOBAL
    assert ledger.spans("b-0") == [(0, 4)]  # read in the very next epoch

    # topic "a" is deleted: its splits are dropped (pooled or owned), audited, never read again
    source.set_subscriptions({"b"})
    before = {sid: ledger.spans(sid) for sid in ("a-0", "a-1")}
    report = driver.run_epoch(records_per_split=4)
    assert {sid: ledger.spans(sid) for sid in ("a-0", "a-1")} == before
    assert report.completed is not None
    owned = {s.split_id for r in report.completed.regions.values() for s in r.splits}
    assert owned == {"b-0"}
    assert driver.enumerator is not None
    dropped = [
        a for a in driver.enumerator.audit if a.decision is RecoveryDecision.DROPPED_REMOVED_SUBSCRIPTION
    ]
    assert {a.split_id for a in dropped} == {"a-0", "a-1"}


def test_the_fence_refuses_a_commit_when_another_writer_committed_since_the_restore() -> None:
    source = _source({"a"}, {"a-0": ("a", 100)})
    driver, _ledger, _state, sink = _driver(source, parallelism=1)
    driver.open()
    driver.run_epoch(records_per_split=5)
    sink.recorded = 7  # another run committed epoch 7 meanwhile
    with pytest.raises(ConcurrentRunError) as err:
        driver.run_epoch(records_per_split=5)
    assert err.value.params["found"] == 7 and err.value.params["expected"] == 1


class _Crash(Exception):
    pass


class _CrashAt(DriverHooks):
    """Dies (raises) at one crash point of one epoch, as a killed driver would stop there."""

    def __init__(self, point: CrashPoint, epoch: int) -> None:
        self.point, self.epoch = point, epoch

    def crash_point(self, point: CrashPoint, epoch: int) -> None:
        if (point, epoch) == (self.point, self.epoch):
            raise _Crash(f"{point.value}@{epoch}")


class _ExternalSimSource(ReassignableSimSource, ExternallyCheckpointedSource):
    """The simulator's source keeping external positions in memory, as Kafka keeps group offsets."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.external: dict[str, ExternalPosition] = {}

    def commit_positions(self, checkpoint_id: int, positions: Mapping[str, int]) -> None:
        for sid, position in positions.items():
            self.external[sid] = ExternalPosition(position, checkpoint_id)

    def committed_positions(self) -> Mapping[str, ExternalPosition]:
        return dict(self.external)


def test_a_redone_checkpoint_commits_its_external_positions_as_its_epoch_would_have() -> None:
    """Found by the chaos run on a faulty store: a driver died after epoch 19's sink commit, the next
    run redid checkpoint 19 from its decision, and the group offsets stayed at 18 for good (nothing new
    to read). The redo now sends the acknowledged regions' positions, tagged with the redone id."""
    source = _ExternalSimSource(subscriptions={"a"})
    source.add([Split("a-0", "a", 0), Split("a-1", "a", 0)])
    source.ends.update({"a-0": 10, "a-1": 10})
    driver, _ledger, state, sink = _driver(source, parallelism=2)
    driver.hooks = _CrashAt(CrashPoint.BEFORE_CHECKPOINT_ROW, 2)
    driver.open()
    driver.run_epoch(records_per_split=5)
    assert {sid: (p.position, p.checkpoint_id) for sid, p in source.external.items()} == {
        "a-0": (5, 1),
        "a-1": (5, 1),
    }
    with pytest.raises(_Crash):  # dies after the sink commit of epoch 2, before its row
        driver.run_epoch(records_per_split=5)
    assert sink.recorded == 2 and state.checkpoint_ids() == [1]
    assert {p.checkpoint_id for p in source.external.values()} == {1}  # never sent for epoch 2

    again, _l, _s, _k = _driver(source, parallelism=2)
    again.state, again.sink = state, sink
    opened = again.open()
    assert opened.redone_checkpoint == 2 and state.checkpoint_ids() == [1, 2]
    assert {sid: (p.position, p.checkpoint_id) for sid, p in source.external.items()} == {
        "a-0": (10, 2),
        "a-1": (10, 2),
    }
    assert opened.external_disagreements == ()  # the restore finds them aligned


def test_a_disagreeing_external_position_is_reported_as_a_sentence_and_noted_by_the_restart_check() -> None:
    """Protocol rule 3.3: the checkpoint's position wins; the open's report and the in-run check of
    the restore name the split, both positions and which one is used (a sentence, not a repr)."""
    source = _ExternalSimSource(subscriptions={"a"})
    source.add([Split("a-0", "a", 0)])
    source.ends["a-0"] = 10
    driver, _ledger, state, sink = _driver(source, parallelism=1)
    driver.open()
    driver.run_epoch(records_per_split=5)
    source.external["a-0"] = ExternalPosition(2, None)  # moved by hand between runs
    again, _l, _s, _k = _driver(source, parallelism=1)
    again.state, again.sink = state, sink
    opened = again.open()
    said = "split a-0: checkpoint position 5 is used; external position 2 (set outside splitkeeper: no "
    said += "checkpoint tag) ignored"
    assert opened.external_disagreements == (said,)
    [check] = again.restart_checks
    assert check.passed and check.notes == (said,)
    assert again.plan(records_per_split=5)[0][0][1:] == (5, 10)  # read on from 5, not from 2


def test_a_read_only_open_applies_a_pending_redo_in_memory_and_refuses_to_run() -> None:
    source = _source({"a"}, {"a-0": ("a", 100)})
    driver, _ledger, state, sink = _driver(source, parallelism=1)
    driver.hooks = _CrashAt(CrashPoint.BEFORE_CHECKPOINT_ROW, 2)
    driver.open()
    driver.run_epoch(records_per_split=5)
    with pytest.raises(_Crash):  # the driver dies after the sink commit of epoch 2, before its row
        driver.run_epoch(records_per_split=5)
    assert sink.recorded == 2 and state.checkpoint_ids() == [1]

    dry, _l, _s, _k = _driver(source, parallelism=1)
    dry.state, dry.sink = state, sink
    opened = dry.open(read_only=True)
    assert opened.redone_checkpoint == 2 and opened.restored_from == 2 and opened.read_only
    assert state.checkpoint_ids() == [1]  # nothing was written
    with pytest.raises(ProtocolError, match="read-only"):
        dry.run_epoch()

    again, _l, _s, _k = _driver(source, parallelism=1)
    again.state, again.sink = state, sink
    assert again.open().redone_checkpoint == 2
    assert state.checkpoint_ids() == [1, 2]
    assert again.run_epoch(records_per_split=5).epoch == 3


def test_a_timed_out_region_falls_back_and_its_splits_are_read_again() -> None:
    source = _source({"a"}, {"a-0": ("a", 12), "a-1": ("a", 12)})
    driver, ledger, _state, _sink = _driver(source, schedule={(2, 1): RegionFailure.TIMEOUT})
    driver.open()
    reports = driver.run(until_caught_up=True).epochs
    kinds = [r.kind for r in reports]
    assert kinds[1] is CheckpointKind.REGIONAL and kinds[-1] is CheckpointKind.GLOBAL
    assert {sid: ledger.spans(sid) for sid in ("a-0", "a-1")} == {"a-0": [(0, 12)], "a-1": [(0, 12)]}


class _TimedRunner(SimRegionRunner):
    """A region runner whose every answer says its task took ``epoch + region / 10`` seconds."""

    def run(self, epoch: int, plan: EpochPlan, timeout_s: float) -> dict[int, RegionRun]:
        runs = super().run(epoch, plan, timeout_s)
        return {r: replace(run, elapsed_s=epoch + r / 10) for r, run in runs.items()}


def test_the_epoch_report_gives_each_acknowledged_region_tasks_time() -> None:
    source = _source({"a"}, {"a-0": ("a", 12), "a-1": ("a", 12)})
    driver, ledger, _state, sink = _driver(source)
    driver.runner = sink.runner = _TimedRunner({(2, 1): RegionFailure.TIMEOUT})
    driver.open()
    reports = driver.run(until_caught_up=True).epochs
    assert reports[0].region_task_s == {0: 1.0, 1: 1.1}
    assert reports[1].kind is CheckpointKind.REGIONAL
    assert reports[1].region_task_s == {0: 2.0}  # the timed-out region's answer is not a task time
    assert {sid: ledger.spans(sid) for sid in ("a-0", "a-1")} == {"a-0": [(0, 12)], "a-1": [(0, 12)]}


def test_a_continuous_run_follows_the_backlog_then_the_normal_interval_and_stops_on_a_global_checkpoint() -> (
    None
):
    source = ReassignableSimSource(subscriptions={"a"})
    source.add([Split(f"a-{i}", "a", 0, backlog_end=12) for i in range(2)])
    source.ends.update({"a-0": 12, "a-1": 12})
    runner = SimRegionRunner()
    clock = SimClock()
    driver = EpochDriver(
        DriverSettings(
            pipeline="t",
            parallelism=2,
            backlog=BacklogConfig(
                backlog_epoch_records=8, normal_epoch_records=2, backlog_interval_s=60, normal_interval_s=5
            ),
        ),
        source,
        runner,
        SimEpochSink(SimulatedSink(), runner),
        SimState(),
        clock,
    )
    driver.open()
    grow = iter(range(1, 1000))

    def stop_requested() -> bool:
        for sid in ("a-0", "a-1"):  # a trickle after the backlog
            source.ends[sid] = 12 + next(grow)
        if clock.now() < 200:
            return False
        # a fault for the final epoch: it plans nothing, so no region runs a task and none can fail
        # (a failed final checkpoint is retried: tests/core/test_checkpoint_coordinator.py)
        runner.schedule.setdefault((driver.next_epoch, 0), RegionFailure.DECLINE)
        return True

    summary = driver.run_continuously(stop_requested, poll_s=1)

    starts = [r.started_at for r in summary.epochs]
    backlog = [r.processing_backlog for r in summary.epochs]
    assert backlog[:3] == [True, True, True] and not any(backlog[3:])  # 4 records per split per epoch
    assert starts[:3] == [0, 60, 120]  # the backlog interval while processing backlog
    regular = [r.started_at for r in summary.epochs if not r.final]
    gaps = [b - a for a, b in zip(regular[2:], regular[3:], strict=False)]
    assert len(gaps) >= 10 and set(gaps) == {5}, gaps  # then the normal interval, from the switch on
    assert [s.processing_backlog for s in summary.interval_switches] == [False]
    assert summary.interval_switches[0].after == 3 and summary.interval_switches[0].interval_s == 5
    final = [r for r in summary.epochs if r.final]
    assert [r.kind for r in final] == [CheckpointKind.GLOBAL] and final[0].idle_regions == (0, 1)
    assert summary.stopped and summary.epochs[-1].kind is CheckpointKind.GLOBAL


class _PreparedRunner(SimRegionRunner):
    """A simulated region runner that logs ``prepare`` (with each region's split ids) and ``run`` calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, object]] = []

    def prepare(self, regions: Mapping[int, Sequence[Split]]) -> None:
        self.calls.append(("prepare", {r: [s.split_id for s in splits] for r, splits in regions.items()}))

    def run(self, epoch: int, plan: EpochPlan, timeout_s: float) -> dict[int, RegionRun]:
        self.calls.append(("run", epoch))
        return super().run(epoch, plan, timeout_s)


def test_a_continuous_run_prepares_its_runner_once_with_each_regions_splits_before_its_first_epoch() -> None:
    # P=3 over two splits: region 2 owns none and is left out; a bounded run never prepares; a run
    # stopped before it starts neither
    source = _source({"a"}, {"a-0": ("a", 4), "a-1": ("a", 4)})
    driver, _ledger, _state, sink = _driver(source, parallelism=3)
    runner = _PreparedRunner()
    driver.runner = sink.runner = runner
    driver.open()
    owners = {sid: r for r, splits in driver.context.reader_splits.items() for sid in splits}  # type: ignore[union-attr]
    asked = iter([False, False, True])
    summary = driver.run_continuously(lambda: next(asked, True), poll_s=0.001)

    assert summary.stopped
    assert runner.calls[0] == ("prepare", {owners["a-0"]: ["a-0"], owners["a-1"]: ["a-1"]})
    assert [c for c, _ in runner.calls].count("prepare") == 1 and runner.calls[1] == ("run", 1)

    bounded = _PreparedRunner()
    driver, _ledger, _state, sink = _driver(_source({"a"}, {"a-0": ("a", 4)}))
    driver.runner = sink.runner = bounded
    driver.open()
    driver.run(until_caught_up=True)
    stopped = _PreparedRunner()
    other, _ledger, _state, sink = _driver(_source({"a"}, {"a-0": ("a", 4)}))
    other.runner = sink.runner = stopped
    other.open()
    other.run_continuously(lambda: True)
    assert [c for c, _ in bounded.calls + stopped.calls if c == "prepare"] == []


def test_a_backlog_reset_reaches_the_owning_reader_and_finishes_when_it_reaches_the_new_boundary() -> None:
    source = _source({"a"}, {"a-0": ("a", 4), "a-1": ("a", 4)})
    driver, _ledger, _state, _sink = _driver(source, epoch_records=8)
    driver.open()
    driver.run_epoch()  # both splits read to 4; no backlog tracked yet
    assert driver.enumerator is not None and not driver.enumerator.processing_backlog
    source.ends.update({"a-0": 20, "a-1": 20})  # an outage: the source ran ahead

    assert driver.reset_backlog() == {"a-0": 20, "a-1": 20}
    context = driver.context
    assert context is not None
    owned = {sid: s for splits in context.reader_splits.values() for sid, s in splits.items()}
    assert {sid: (s.position, s.backlog_end) for sid, s in owned.items()} == {"a-0": (4, 20), "a-1": (4, 20)}
    modes = []
    for _ in range(5):
        report = driver.run_epoch()
        modes.append(report.processing_backlog)
    assert modes == [True, True, True, True, False]  # 4 records per split per epoch: 4 -> 8 -> ... -> 20
    assert not driver.enumerator.processing_backlog
    assert report.completed is not None and report.completed.enumerator is not None
    assert report.completed.enumerator.backlog.finished == {"a-0", "a-1"}


def _poisoned(policy: SplitFailurePolicy, poison: set[str]) -> tuple[EpochDriver, SimulatedSink, SimState]:
    source = _source({"a"}, {f"a-{i}": ("a", 40) for i in range(4)})
    runner = SimRegionRunner(poison=poison)
    ledger = SimulatedSink()
    state = SimState()
    settings = DriverSettings(
        pipeline="t",
        parallelism=2,
        checkpoint=CheckpointConfig(max_consecutive_failures=2),
        backlog=BacklogConfig(backlog_epoch_records=8, normal_epoch_records=8),
        on_split_failure=policy,
        quarantine_after=2,
    )
    driver = EpochDriver(settings, source, runner, SimEpochSink(ledger, runner), state, SimClock())
    return driver, ledger, state


def test_a_split_whose_reads_keep_failing_stalls_its_region_under_the_default_policy() -> None:
    driver, ledger, _state = _poisoned(SplitFailurePolicy.STALL, {"a-1"})
    driver.open()
    kinds = [driver.run_epoch(records_per_split=4).kind for _ in range(5)]
    assert CheckpointKind.GLOBAL not in kinds  # the poisoned region declines every epoch
    assert ledger.spans("a-1") == []
    assert driver.enumerator is not None and driver.enumerator.quarantined == {}


def test_quarantine_parks_a_failing_split_so_the_rest_checkpoints_globally_and_release_resumes_it() -> None:
    driver, ledger, state = _poisoned(SplitFailurePolicy.QUARANTINE, {"a-1"})
    driver.open()
    first, second = (driver.run_epoch(records_per_split=4) for _ in range(2))
    assert first.kind is not CheckpointKind.GLOBAL and second.kind is not CheckpointKind.GLOBAL
    third = driver.run_epoch(records_per_split=4)  # a-1 failed 2 epochs in a row: parked before planning
    assert third.kind is CheckpointKind.GLOBAL
    assert third.completed is not None
    owned = {s.split_id for r in third.completed.regions.values() for s in r.splits}
    assert "a-1" not in owned and owned == {"a-0", "a-2", "a-3"}
    assert ledger.spans("a-1") == []
    assert driver.enumerator is not None
    (parked,) = [a for a in driver.enumerator.audit if a.decision is RecoveryDecision.QUARANTINED]
    assert parked.split_id == "a-1" and "reads failed 2 epochs in a row, from its position 0" in parked.detail
    assert "unreadable record in a-1" in parked.detail

    # a restart keeps it parked (the checkpoint holds it) and reads everything else to the end
    source = driver.source
    runner = SimRegionRunner(poison={"a-1"})
    again = EpochDriver(driver.settings, source, runner, SimEpochSink(ledger, runner), state, SimClock())
    again.open()
    assert again.enumerator is not None and set(again.enumerator.quarantined) == {"a-1"}
    for _ in range(12):
        again.run_epoch(records_per_split=4)
    assert ledger.spans("a-1") == []
    for sid in ("a-0", "a-2", "a-3"):
        assert ledger.spans(sid) == [(0, 40)]  # every record once

    # the operator fixes the record and releases the split: read from where its records end, once
    runner.poison.clear()
    (released,) = again.release(["a-1"])
    assert released.position == 0
    with pytest.raises(InvalidParameterError, match=r"a quarantined split \(quarantined now: none\)"):
        again.release(["a-1"])
    for _ in range(12):
        again.run_epoch(records_per_split=4)
    assert ledger.spans("a-1") == [(0, 40)]
    decisions = [a.decision for a in again.enumerator.audit if a.split_id == "a-1"]
    assert RecoveryDecision.RELEASED in decisions
    assert again.enumerator.quarantined == {}


def test_a_bounded_run_stops_with_a_summary_after_max_consecutive_aborts_under_stall() -> None:
    """Issue 19: a split that cannot be read made ``run`` loop through aborted epochs for ever."""
    driver, ledger, _state = _poisoned(SplitFailurePolicy.STALL, {"a-1"})
    driver.open()
    with pytest.raises(RunStalledError) as caught:
        driver.run(
            100
        )  # no epoch can complete: a first run, the poisoned region has no state to fall back to
    message = str(caught.value)
    assert message.startswith("[RUN_STALLED] pipeline 't': 5 epochs in a row were aborted (epochs 1-5;")
    assert "split 'a-1' (reads failed 5 epoch(s) in a row: simulated unreadable record in a-1)" in message
    assert "no checkpoint has completed yet" in message
    assert "set checkpoint.on_split_failure: quarantine" in message
    assert caught.value.params["split_ids"] == ("a-1",)
    assert driver.next_epoch == 6  # it stopped there, not later
    assert ledger.split_ids() == []


def test_a_run_asked_for_epochs_fails_when_none_of_them_completed() -> None:
    """Issue 19: ``run --epochs 6`` exited 0 when all 6 epochs aborted."""
    driver, _ledger, _state = _poisoned(SplitFailurePolicy.STALL, {"a-1"})
    driver.open()
    with pytest.raises(RunStalledError, match=r"none of the 3 epoch\(s\) this run was asked for completed"):
        driver.run(3)


def test_quarantine_lets_a_first_run_commit_the_other_splits_within_the_abort_limit() -> None:
    driver, ledger, _state = _poisoned(SplitFailurePolicy.QUARANTINE, {"a-1"})
    driver.open()
    summary = driver.run(6)  # epochs 1-2 abort (no fallback yet), a-1 is parked, the rest commits
    kinds = [e.kind for e in summary.epochs]
    assert kinds[:2] == [CheckpointKind.ABORTED] * 2 and kinds[2] is CheckpointKind.GLOBAL
    assert summary.quarantined == ("a-1",)
    assert {sid for sid in ledger.split_ids()} == {"a-0", "a-2", "a-3"}


def test_the_abort_limit_must_outlast_quarantine() -> None:
    with pytest.raises(
        InvalidParameterError, match=r"max_consecutive_aborts=3 is not allowed: an integer > "
    ):
        DriverSettings(pipeline="t", parallelism=1, quarantine_after=3, max_consecutive_aborts=3)
    DriverSettings(
        pipeline="t",
        parallelism=1,
        quarantine_after=3,
        max_consecutive_aborts=1,
        on_split_failure=SplitFailurePolicy.STALL,
    )


class _DeletingSource(ReassignableSimSource):
    """A source whose files can be deleted: a gone split is no longer discovered and cannot be planned."""

    def __init__(self, subscriptions: set[str]) -> None:
        super().__init__(subscriptions)
        self.gone: set[str] = set()

    def discover_splits(self) -> list[Split]:
        return [s for s in super().discover_splits() if s.split_id not in self.gone]

    def plan_end(self, split: Split, start: int, max_records: int) -> int:
        if split.split_id in self.gone:
            raise SourceError(
                f"split {split.split_id!r}: file does not exist any more", split_id=split.split_id
            )
        return super().plan_end(split, start, max_records)


def test_a_split_whose_file_is_deleted_is_quarantined_then_dropped_by_the_operator() -> None:
    """Issue 19: a partly read file deleted from the source stopped the pipeline for good."""
    source = _DeletingSource({"a"})
    source.add([Split(f"a-{i}", "a", 0) for i in range(4)])
    source.ends.update({f"a-{i}": 40 for i in range(4)})
    runner = SimRegionRunner()
    ledger = SimulatedSink()
    settings = DriverSettings(
        pipeline="t",
        parallelism=2,
        checkpoint=CheckpointConfig(max_consecutive_failures=2),
        backlog=BacklogConfig(backlog_epoch_records=8, normal_epoch_records=8),
        quarantine_after=2,
    )
    driver = EpochDriver(settings, source, runner, SimEpochSink(ledger, runner), SimState(), SimClock())
    driver.open()
    assert driver.run_epoch(records_per_split=4).kind is CheckpointKind.GLOBAL
    source.gone.add("a-1")  # deleted after it was partly read
    declined = driver.run_epoch(records_per_split=4)
    assert declined.kind is CheckpointKind.REGIONAL  # its region falls back; planning raised no error
    assert "split 'a-1' cannot be planned" in " ".join(declined.region_errors.values())
    driver.run_epoch(records_per_split=4)
    parked = driver.run_epoch(records_per_split=4)  # failed 2 epochs in a row: parked before planning
    assert parked.kind is CheckpointKind.GLOBAL
    assert driver.enumerator is not None and set(driver.enumerator.quarantined) == {"a-1"}
    assert ledger.spans("a-1") == [(0, 4)]

    source.gone.discard("a-1")  # a split the source still has is not dropped: it would be read again
    with pytest.raises(InvalidParameterError, match="a split the source no longer has"):
        driver.drop(["a-1"])
    source.gone.add("a-1")
    (dropped,) = driver.drop(["a-1"])
    assert dropped.position == 4
    assert driver.enumerator.quarantined == {}
    for _ in range(12):
        driver.run_epoch(records_per_split=4)
    assert ledger.spans("a-1") == [(0, 4)]  # what it committed stays, nothing more is read
    for sid in ("a-0", "a-2", "a-3"):
        assert ledger.spans(sid) == [(0, 40)]
    (audit,) = [a for a in driver.enumerator.audit if a.decision is RecoveryDecision.DROPPED_BY_OPERATOR]
    assert audit.split_id == "a-1" and audit.detail.endswith("; at 4")
    with pytest.raises(InvalidParameterError, match="a live or quarantined split"):
        driver.enumerator.drop("a-1", "again")


class _RacedSink(SimEpochSink):
    """A sink whose first read of the recorded epoch is followed at once by another run's commit."""

    def __init__(self, shared: SimEpochSink, runner: SimRegionRunner, landed: int) -> None:
        super().__init__(shared.sink, runner)
        self.recorded, self.attempts = shared.recorded, dict(shared.attempts)
        self._landed: int | None = landed

    def committed_epoch(self) -> int | None:
        seen = self.recorded
        if self._landed is not None:  # the other run's commit lands right after this read
            self.recorded, self.attempts, self._landed = self._landed, {self._landed: "other"}, None
        return seen


def test_open_reads_the_recorded_epoch_once_so_a_commit_landing_during_open_is_refused_later() -> None:
    """Protocol rule 5.2: the epoch a run expects is the one it restored, read before the restore.

    Another run commits epoch 2 right after this run's open first looks at the sink
    (its checkpoint row not yet written). Were the sink read again later, this run
    would restore checkpoint 1, expect epoch 2, and its next commit would pass the
    fence while reading again what epoch 2 holds.
    """
    source = _source({"a"}, {"a-0": ("a", 100)})
    first, ledger, state, sink = _driver(source, parallelism=1)
    first.open()
    first.run_epoch(records_per_split=5)
    assert sink.recorded == 1

    runner = SimRegionRunner(None)
    raced = _RacedSink(sink, runner, landed=2)
    second = EpochDriver(first.settings, source, runner, raced, state, SimClock())
    report = second.open()
    assert report.restored_from == 1
    with pytest.raises(ConcurrentRunError) as err:
        second.run_epoch(records_per_split=5)
    assert err.value.params["found"] == 2 and err.value.params["expected"] == 1
    assert ledger.spans("a-0") == [(0, 5)]  # nothing read twice reached the sink
    assert not [key for key in state.decisions if key[0] > 1]  # no record of a refused epoch


def test_a_commit_the_fence_refuses_leaves_no_decision_record() -> None:
    source = _source({"a"}, {"a-0": ("a", 100)})
    driver, _ledger, state, sink = _driver(source, parallelism=1)
    driver.open()
    driver.run_epoch(records_per_split=5)

    def other_run_commits(epoch: int) -> None:  # lands between this run's decision and its sink commit
        sink.recorded, sink.attempts = 7, {7: "other"}

    driver.hooks = _AtPoint(CrashPoint.AFTER_DECISION, 2, other_run_commits)
    with pytest.raises(ConcurrentRunError):
        driver.run_epoch(records_per_split=5)
    assert not [key for key in state.decisions if key[0] == 2]  # the refused epoch's record is gone


class _AtPoint(DriverHooks):
    def __init__(self, point: CrashPoint, epoch: int, action: Callable[[int], None]) -> None:
        self.point, self.epoch, self.action = point, epoch, action

    def crash_point(self, point: CrashPoint, epoch: int) -> None:
        if (point, epoch) == (self.point, self.epoch):
            self.action(epoch)


def test_a_restore_weighs_the_splits_with_the_weights_its_checkpoint_recorded() -> None:
    """Protocol rule 1.6: a restarted driver balances with the recorded weights until it measured again."""
    rates = {"e-0": 10.0, "e-1": 1.0, "e-2": 1.0, "e-3": 1.0}
    source = _source({"e"}, {sid: ("e", 0) for sid in rates})
    for sid in rates:
        source.ends[sid] = 0
    settings = DriverSettings(
        pipeline="t",
        parallelism=2,
        checkpoint=CheckpointConfig(),
        backlog=BacklogConfig(backlog_epoch_records=10_000, normal_epoch_records=10_000),
        strategy="weighted",
        rebalance_threshold=1.25,
    )
    runner, ledger, state, clock = SimRegionRunner(None), SimulatedSink(), SimState(), SimClock()
    sink = SimEpochSink(ledger, runner)
    first = EpochDriver(settings, source, runner, sink, state, clock)
    first.open()
    for _ in range(4):
        clock.sleep(10)
        for sid, rate in rates.items():
            source.ends[sid] += int(rate * 100)
        first.run_epoch()
    recorded = dict(state.split_weights(max(state.checkpoint_ids())))
    assert recorded["e-0"] > 5 * recorded["e-1"]  # measured: the hot split weighs ten times more

    again = SimRegionRunner(None)
    restarted_sink = SimEpochSink(ledger, again)
    restarted_sink.recorded, restarted_sink.attempts = sink.recorded, dict(sink.attempts)
    second = EpochDriver(settings, source, again, restarted_sink, state, SimClock())
    second.open()
    assert second.enumerator is not None
    strategy = second.enumerator.strategy
    assert {sid: strategy.weight(sid) for sid in rates} == recorded
    clock.sleep(10)
    second.run_epoch()  # the meter has one observation: nothing measured yet, the weights carry on
    assert dict(state.split_weights(max(state.checkpoint_ids()))) == recorded


def test_a_run_whose_lease_check_before_the_sink_commit_fails_writes_nothing_of_that_epoch() -> None:
    """The runtime re-reads its lease in ``before_sink_commit``; a lost lease stops the epoch before
    its decision record and its sink commit (a paused holder woken after a takeover)."""

    class _LeaseLost(ConcurrentRunError):
        code = "LEASE_LOST"

    class _LeaseTakenAt(DriverHooks):
        def __init__(self) -> None:
            self.checked: list[int] = []

        def before_sink_commit(self, epoch: int) -> None:
            self.checked.append(epoch)
            if epoch == 2:
                raise _LeaseLost("taken over", pipeline="t")

    source = _source({"a"}, {"a-0": ("a", 100)})
    driver, ledger, state, sink = _driver(source, parallelism=1)
    driver.hooks = hooks = _LeaseTakenAt()
    driver.open()
    driver.run_epoch(records_per_split=5)
    with pytest.raises(_LeaseLost):
        driver.run_epoch(records_per_split=5)
    assert hooks.checked == [1, 2]
    assert sink.recorded == 1 and ledger.spans("a-0") == [(0, 5)]  # epoch 2 reached no sink
    assert not [key for key in state.decisions if key[0] == 2]  # and left no decision record


def test_pending_work_is_empty_exactly_when_a_run_until_caught_up_would_run_no_epoch() -> None:
    """What the event-driven ingest polls (``airflow.schedule: on_new_data``): the driver's own
    discovery and end offsets against the restored state, on a read-only open, writing nothing."""
    source = _source({"a"}, {"a-0": ("a", 10), "a-1": ("a", 10)})
    driver, _ledger, state, sink = _driver(source)

    def look() -> tuple[tuple[str, ...], bool, int | None]:
        probe, _l, _s, _k = _driver(source)
        probe.state, probe.sink = state, sink
        probe.open(read_only=True)
        work = probe.pending_work()
        assert work.any == (bool(work.splits) or work.unsettled)
        return work.splits, work.unsettled, work.checkpoint_id

    assert look() == (("a-0", "a-1"), True, None)  # never checkpointed: the first run does
    driver.open()
    assert driver.run(until_caught_up=True).caught_up
    latest = state.checkpoint_ids()[-1]
    assert look() == ((), False, latest)
    assert state.checkpoint_ids()[-1] == latest  # looking wrote nothing

    source.ends["a-1"] = 13  # three new records in one partition
    assert look() == (("a-1",), False, latest)
    source.add([Split("b-0", "b", 0)])  # a new topic matching the subscription, with records
    source.ends["b-0"] = 2
    source.set_subscriptions({"a", "b"})
    assert look() == (("a-1", "b-0"), False, latest)

    again, _l, _s, _k = _driver(source)
    again.state, again.sink = state, sink
    again.open()
    assert again.run(until_caught_up=True).epochs  # what was pending is read
    assert look() == ((), False, state.checkpoint_ids()[-1])
    idle, _l, _s, _k = _driver(source)
    idle.state, idle.sink = state, sink
    idle.open()
    assert idle.run(until_caught_up=True).epochs == ()  # nothing pending: no epoch


class _RecordingRunner(SimRegionRunner):
    """A simulated region runner that remembers which regions it was asked to run, per epoch."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.asked: dict[int, dict[int, int]] = {}  # epoch -> region -> planned ranges

    def run(self, epoch: int, plan: EpochPlan, timeout_s: float) -> dict[int, RegionRun]:
        self.asked[epoch] = {r: len(ranges) for r, ranges in plan.items()}
        return super().run(epoch, plan, timeout_s)


def test_regions_with_nothing_to_read_get_no_task_and_are_acknowledged_with_their_state_unchanged() -> None:
    # P=6 over two splits of an unbounded source: a-1 is read to its end (4) in epoch 1 and stays
    # owned, unfinished, with nothing new: its region is idle from epoch 2 on, like the 4 that own none.
    source = _source({"a"}, {"a-0": ("a", 24), "a-1": ("a", 4)})
    driver, ledger, state, sink = _driver(source, parallelism=6, epoch_records=8)
    runner = _RecordingRunner({(2, 5): RegionFailure.DECLINE})  # a fault for an idle region: no task
    driver.runner = sink.runner = runner
    driver.open()
    reports = driver.run(until_caught_up=True).epochs
    assert len(reports) >= 3 and all(r.kind is CheckpointKind.GLOBAL for r in reports)
    owner = {s.split_id: r for r, st in reports[0].completed.regions.items() for s in st.splits}
    for report in reports:
        asked = runner.asked.get(report.epoch, {})
        assert asked and all(n > 0 for n in asked.values()) or not asked  # only regions with ranges ran
        assert set(asked).isdisjoint(report.idle_regions)
        assert set(asked) | set(report.idle_regions) == set(range(6))
        assert set(report.region_task_s) == set(asked)  # an idle region has no task time
    assert set(runner.asked[1]) == {owner["a-0"], owner["a-1"]}
    assert set(runner.asked[2]) == {owner["a-0"]}  # a-1 is at its end: its region is idle
    final = driver.run_epoch(final=True)  # nothing planned anywhere: the runner is not called at all
    assert final.kind is CheckpointKind.GLOBAL and final.epoch not in runner.asked
    assert final.idle_regions == tuple(range(6)) and final.region_task_s == {}
    idle = owner["a-1"]
    before, after = reports[0].completed.regions[idle], reports[1].completed.regions[idle]
    assert after.ref_checkpoint_id is None and after.splits == before.splits  # acked, a-1 still at 4
    assert [(s.split_id, s.position) for s in after.splits] == [("a-1", 4)]
    assert after.operator_state == (*before.operator_state, "e2:n0")  # what a no-op task's ACK adds
    assert {sid: ledger.spans(sid) for sid in ("a-0", "a-1")} == {"a-0": [(0, 24)], "a-1": [(0, 4)]}
    latest = state.latest_checkpoint()
    assert latest is not None and latest.checkpoint_id == final.epoch
    assert [(s.split_id, s.position) for s in latest.regions[idle].splits] == [("a-1", 4)]


class _GrowingFiles(ReassignableSimSource, SupportsSplitIdentityCheck):
    """Bounded splits whose identity is their length: a split whose data grew past it is GREW."""

    def __init__(self) -> None:
        super().__init__({"in"})
        self.rechecks: list[bool] = []

    def check_splits(
        self, live: Sequence[Split], finished: Mapping[str, str], *, recheck_finished: bool = True
    ) -> list[SplitChange]:
        self.rechecks.append(recheck_finished)
        known = {s.split_id: s.identity for s in live}
        if recheck_finished:
            known.update(finished)
        return [
            SplitChange(
                sid, SplitChangeKind.GREW, str(self.ends[sid]), f"file {sid} grew", int(old), self.ends[sid]
            )
            for sid, old in sorted(known.items())
            if self.ends[sid] > int(old)
        ]


def test_finished_splits_are_rechecked_after_a_restore_and_then_every_recheck_finished_every_epochs() -> None:
    """Issue 38 item 3: an epoch checks the live splits' data; the finished ones' only at the cadence.
    A finished file that grew is read on at the first recheck after the growth (append), exactly once."""
    source = _GrowingFiles()
    source.add([Split(sid, "in", 0, 4, identity="4") for sid in ("a", "b")])
    source.ends.update({"a": 4, "b": 4})
    settings = DriverSettings(
        pipeline="t",
        parallelism=1,
        backlog=BacklogConfig(backlog_epoch_records=8, normal_epoch_records=8),
        on_file_change=SplitChangePolicy.APPEND,
        recheck_finished_every=3,
    )
    runner, ledger, state = SimRegionRunner(), SimulatedSink(), SimState()
    driver = EpochDriver(settings, source, runner, SimEpochSink(ledger, runner), state, SimClock())
    driver.open()
    driver.run_epoch(records_per_split=4)  # reads both; they finish
    assert driver.enumerator is not None and driver.enumerator.finished_split_ids == {"a", "b"}
    source.ends["a"] = 9  # appended to after it finished
    driver.run_epoch(records_per_split=8)
    driver.run_epoch(records_per_split=8)
    assert ledger.spans("a") == [(0, 4)]  # not looked at between rechecks
    driver.run_epoch(records_per_split=8)  # the third epoch after the last recheck
    assert source.rechecks == [True, True, False, False, True]  # open, epochs 1 and 4
    assert RecoveryDecision.EXTENDED in [d.decision for d in driver.enumerator.audit_for("a")]
    assert ledger.spans("a") == [(0, 9)]  # on from where it ended, once
    assert driver.enumerator.finished_split_ids == {"a", "b"}

    source.ends["b"] = 6  # grows while no driver runs: a restarted driver checks it at once
    source.rechecks.clear()
    restarted = EpochDriver(settings, source, runner, SimEpochSink(ledger, runner), state, SimClock())
    restarted.open()
    restarted.run_epoch(records_per_split=8)
    assert source.rechecks == [True, True]
    assert ledger.spans("b") == [(0, 6)] and ledger.spans("a") == [(0, 9)]


def test_recheck_finished_every_must_be_a_positive_number_of_epochs() -> None:
    with pytest.raises(InvalidParameterError, match="source.recheck_finished_every"):
        DriverSettings(pipeline="t", parallelism=1, recheck_finished_every=0)
