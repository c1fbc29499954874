"""The in-run restart proof (issue 39 item 1): the driver checks protocol section 6 at every restore
inside a run, records each check, and stops with [STATE_ERROR] naming the rule, the split and the
checkpoint when one fails. The simulator's in-memory adapters; the same driver Spark runs."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from splitkeeper.core.backlog import BacklogConfig
from splitkeeper.core.checkpoint import CheckpointConfig
from splitkeeper.core.driver import DriverSettings, EpochDriver
from splitkeeper.core.enumerator import RecordingEnumeratorContext, SplitEnumerator, enumerator_for
from splitkeeper.core.ports import DriverHooks
from splitkeeper.core.restarts import IN_RUN_RULES, RestartCheck, RestartCheckError, RestoreKind
from splitkeeper.core.source import SplitSource
from splitkeeper.core.types import (
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    RegionOutcome,
    RegionState,
    Split,
)
from splitkeeper.sim.events import RegionFailure
from splitkeeper.sim.simulator import ReassignableSimSource, SimClock, SimEpochSink, SimRegionRunner, SimState
from splitkeeper.sim.sink import SimulatedSink


class _Seen(DriverHooks):
    def __init__(self) -> None:
        self.checks: list[RestartCheck] = []

    def restart_checked(self, check: RestartCheck) -> None:
        self.checks.append(check)


def _source(n: int = 4, end: int = 40) -> ReassignableSimSource:
    source = ReassignableSimSource(subscriptions={"t"})
    source.add([Split(f"t-{i}", "t", 0) for i in range(n)])
    source.ends.update({f"t-{i}": end for i in range(n)})
    return source


# one sink per state; the state is kept with it, so its id is never another state's (an id is
# reused once its object is gone: a new state then met an old test's sink, epoch 3 and all)
_LEDGERS: dict[int, tuple[SimState, SimulatedSink]] = {}


def _driver(
    source: SplitSource,
    state: SimState,
    *,
    parallelism: int = 2,
    schedule: dict | None = None,
    enumerator_factory=None,  # noqa: ANN001
    mcf: int = 2,
) -> tuple[EpochDriver, _Seen]:
    hooks = _Seen()
    runner = SimRegionRunner(schedule)
    driver = EpochDriver(
        DriverSettings(
            pipeline="t",
            parallelism=parallelism,
            checkpoint=CheckpointConfig(max_consecutive_failures=mcf, max_failure_ratio=0.5),
            backlog=BacklogConfig(backlog_epoch_records=8, normal_epoch_records=8),
            strategy="least-loaded",
        ),
        source,
        runner,
        SimEpochSink(_LEDGERS.setdefault(id(state), (state, SimulatedSink()))[1], runner),
        state,
        SimClock(),
        hooks,
        enumerator_factory=enumerator_factory,
    )
    return driver, hooks


def test_every_restore_inside_a_run_is_checked_and_recorded() -> None:
    source, state = _source(), SimState()
    first, _ = _driver(source, state)
    first.open()  # a fresh start restores nothing: no check
    first.run_epoch(records_per_split=4)
    assert state.restart_checks == []

    driver, hooks = _driver(source, state, schedule={(3, 1): RegionFailure.DECLINE})
    driver.open()  # a global restore of checkpoint 1
    report = driver.run_epoch(records_per_split=4)  # epoch 2: global
    report = driver.run_epoch(records_per_split=4)  # epoch 3: region 1 declines -> regional, fallback
    assert report.kind is CheckpointKind.REGIONAL
    driver.fail_reader(0)  # a reader crashed between epochs: partial failover
    driver.restore(state.latest_checkpoint(), 3)  # a rescale

    kinds = [(c.restore, c.checkpoint_id, c.readers, c.epoch) for c in hooks.checks]
    assert kinds == [
        (RestoreKind.GLOBAL_RESTORE, 1, (0, 1), 2),
        (RestoreKind.REGION_FALLBACK, 3, (1,), 4),
        (RestoreKind.PARTIAL_FAILOVER, 3, (0,), 4),
        (RestoreKind.RESCALE, 3, (0, 1, 2), 4),
    ]
    assert all(c.passed and c.rules == IN_RUN_RULES for c in hooks.checks)
    assert state.restart_checks == hooks.checks == driver.restart_checks  # recorded when made
    assert hooks.checks[0].line() == (
        "global restore of checkpoint 1 (readers 0-1), before epoch 2: rules 6.1, 6.2, 6.3, 6.5, 6.6 passed"
    )


class _LosingEnumerator(SplitEnumerator):
    """Forgets split t-2 on a global restore, without a decision (a lost split)."""

    def add_splits(self, splits):  # noqa: ANN001, ANN201 - discovery does not bring it back either
        return super().add_splits([s for s in splits if s.split_id != "t-2"])

    def restore(self, snapshot: EnumeratorSnapshot) -> None:
        super().restore(snapshot)
        self._restore_expected.pop("t-2", None)

    def _accept_restore_reports(self, reader_id: int, reported: Sequence[Split]) -> None:
        super()._accept_restore_reports(reader_id, [s for s in reported if s.split_id != "t-2"])


def _losing(source, context: RecordingEnumeratorContext, strategy, restored=None):  # noqa: ANN001, ANN202
    return enumerator_for(source, context, strategy, restored=restored, enumerator_class=_LosingEnumerator)


def test_a_restore_that_loses_a_split_stops_the_run_naming_rule_split_and_checkpoint() -> None:
    source, state = _source(), SimState()
    first, _ = _driver(source, state)
    first.open()
    first.run_epoch(records_per_split=4)
    driver, hooks = _driver(source, state, enumerator_factory=_losing)
    with pytest.raises(RestartCheckError) as err:
        driver.open()
    assert str(err.value).startswith(
        "[STATE_ERROR] pipeline 't': the global restore of checkpoint 1 is not proven: protocol rule 6.1 "
        "(not_owned) fails for split(s) t-2: 1 live split(s) neither pooled nor owned: t-2. The run "
        "stopped before reading anything from this state"
    )
    assert (err.value.params["rule"], err.value.params["split_ids"], err.value.params["checkpoint_id"]) == (
        "6.1",
        ("t-2",),
        1,
    )
    [check] = state.restart_checks  # recorded before the run stopped
    assert check.verdict == "failed" and check.failed_rules == ("6.1",) and hooks.checks == [check]
    assert state.planned == 1  # nothing of epoch 2 was planned


def _checkpoint(cid: int, refs: dict[int, int]) -> CompletedCheckpoint:
    """Checkpoint ``cid`` at P=2; ``refs`` maps a failed region to the checkpoint it falls back to."""
    regions = {
        r: RegionState(
            r,
            splits=(Split(f"t-{r}", "t", cid),),
            ref_checkpoint_id=refs.get(r),
            outcome=RegionOutcome.DECLINE if r in refs else RegionOutcome.ACK,
            ref_depth=1 if r in refs else 0,
        )
        for r in range(2)
    }
    snapshot = EnumeratorSnapshot(
        cid, 2, assignments={r: s.splits for r, s in regions.items()}, subscriptions=frozenset({"t"})
    )
    kind = CheckpointKind.REGIONAL if refs else CheckpointKind.GLOBAL
    return CompletedCheckpoint(cid, kind, 2, regions, snapshot, consecutive_regional=len(refs) and 1)


def test_a_restore_of_the_probes_chain_stops_naming_rule_6_6_and_the_checkpoint() -> None:
    """The audit's probe: 105 -> 104 -> 102 -> 101 -> 100 with max_consecutive_failures 2, each region
    one fallback deep, as the coordinator built it before the chain was bounded whole. A run that
    restores 105 stops before reading; the state store names the checkpoints too deep."""
    state = SimState()
    for cid, refs in ((100, {}), (101, {1: 100}), (102, {1: 101}), (104, {0: 102}), (105, {1: 104})):
        state.store.add(_checkpoint(cid, refs))
    driver, _hooks = _driver(_source(2), state)
    driver.sink.recorded = 105  # type: ignore[attr-defined]  # the sink holds what the state counts
    with pytest.raises(RestartCheckError) as err:
        driver.open()
    assert err.value.params["rule"] == "6.6"
    assert err.value.params["checkpoint_ids"] == (104,)
    assert "protocol rule 6.6 (ref_chain_too_deep)" in str(err.value)
    assert "checkpoint 104 has a ref chain of depth 3; max_consecutive_failures=2" in str(err.value)
    assert "checkpoint 105 has a ref chain of depth 4" in str(err.value)
    assert state.restart_checks[0].failed_rules == ("6.6",)


def test_readers_that_do_not_read_what_the_enumerator_gives_them_are_caught() -> None:
    """Rule 6.1's second half, through a driver whose restarted reader keeps reading a split the
    enumerator gave another reader (read twice)."""

    class _StrayDriver(EpochDriver):
        def _partial_failover(self, reader: int, state: RegionState | None):  # noqa: ANN202
            report = super()._partial_failover(reader, state)
            enumerator, context = self._require_open()
            other = next(sid for sid, owner in enumerator.owners().items() if owner not in (None, reader))
            context.reader_splits[reader][other] = Split(other, "t", 0)
            return report

    source, state = _source(), SimState()
    first, _ = _driver(source, state)
    first.open()
    first.run_epoch(records_per_split=4)
    driver, _hooks = _driver(source, state)
    driver.open()
    driver.__class__ = _StrayDriver
    with pytest.raises(RestartCheckError) as err:
        driver.fail_reader(1)
    assert err.value.params["rule"] == "6.1" and err.value.params["kind"] == "owned_more_than_once"
    assert "is read by reader 1, but the enumerator places it in reader 0" in str(err.value)
    assert state.restart_checks[-1].restore is RestoreKind.PARTIAL_FAILOVER


def test_splits_dropped_by_the_restore_itself_leave_with_their_decision_and_pass() -> None:
    """A subscription removed between runs: the restore drops its splits (audited while the enumerator
    is restored from the snapshot, before any reader registers); they are not lost."""
    source, state = _source(), SimState()
    source.add([Split("b-0", "b", 0)])
    source.ends["b-0"] = 40
    source.set_subscriptions({"t", "b"})
    first, _ = _driver(source, state)
    first.open()
    first.run_epoch(records_per_split=4)
    source.set_subscriptions({"t"})  # topic b is gone: not subscribed, not discovered
    source._splits = [s for s in source._splits if s.split_id != "b-0"]
    driver, hooks = _driver(source, state)
    driver.open()
    assert hooks.checks[0].passed, hooks.checks[0].line()
    assert driver.enumerator is not None and driver.enumerator.split("b-0") is None
