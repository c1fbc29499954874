"""Named scenarios driven through the fault simulator, and proof that it catches broken components.

Each scenario is a hand-written event list (or a seeded one) replayed by
:class:`splitkeeper.sim.Simulator`, which checks every protocol section 6 invariant
after every step; the tests then assert the specific behaviour the scenario is
about (who owns what, what the sink holds, what the checkpoints were).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from splitkeeper.core.assignment import AssignmentStrategy
from splitkeeper.core.checkpoint import CheckpointConfig, CheckpointStore, RegionalCheckpointCoordinator
from splitkeeper.core.driver import EpochDriver
from splitkeeper.core.enumerator import RecordingEnumeratorContext, SplitEnumerator, enumerator_for
from splitkeeper.core.invariants import ViolationKind, check_ref_chains
from splitkeeper.core.rescale import Redistribution
from splitkeeper.core.source import SplitSource
from splitkeeper.core.types import CheckpointKind, EnumeratorSnapshot, RecoveryDecision, RegionState, Split
from splitkeeper.sim import (
    Components,
    SimCheck,
    SimConfig,
    SimulationResult,
    Simulator,
    run_scenario,
    simulate,
)
from splitkeeper.sim.broken import BUGS
from splitkeeper.sim.events import (
    FILES,
    CheckpointDuringRestore,
    DiscoverSplits,
    Epoch,
    GlobalRestart,
    ReaderFailure,
    RegionFailure,
    RemoveSubscription,
    Rescale,
    Scenario,
    epochs,
    specs,
)
from splitkeeper.sim.shrink import _Budget, ddmin
from splitkeeper.sim.simulator import coverage_counts


def run(scenario: Scenario, **config: Any) -> tuple[Simulator, SimulationResult]:
    sim = Simulator(SimConfig(**config), scenario)
    return sim, sim.run()


def enumerator_of(sim: Simulator) -> SplitEnumerator:
    assert sim.enumerator is not None, "the simulator has run"
    return sim.enumerator


def assert_exactly_once(sim: Simulator) -> None:
    """Every split's sink records are one contiguous run from its start to its committed position.

    An independent re-check of the sink, in the test's own words, after the run.
    """
    starts = {s.split_id: s.start for s in sim.scenario.all_specs()}
    committed = sim.committed_positions
    assert committed, "nothing was committed"
    assert set(sim.sink.split_ids()) <= set(committed), "records of splits no checkpoint committed"
    for split_id, position in committed.items():
        merged: list[list[int]] = []
        for a, b in sorted(sim.sink.spans(split_id)):
            assert not merged or a >= merged[-1][1], f"{split_id}: records {a}..{b - 1} written twice"
            if merged and a == merged[-1][1]:
                merged[-1][1] = b
            else:
                merged.append([a, b])
        expected = [[starts[split_id], position]] if position > starts[split_id] else []
        assert merged == expected, f"{split_id}: sink holds {merged}, committed {expected}"


# --------------------------------------------------------------------------- clean runs


@pytest.mark.parametrize("strategy", ["least-loaded", "round-robin", "weighted", "legacy-hash"])
def test_seeded_faulty_run_keeps_every_invariant_and_commits_each_record_once(strategy: str) -> None:
    config = SimConfig(readers=5, splits=40, steps=400, failure_rate=0.25, seed=11, strategy=strategy)
    sim = Simulator(config)
    result = sim.run()
    assert result.ok, "\n".join(map(str, result.violations[:5]))
    assert (result.records_lost, result.records_duplicated, result.records_unexpected) == (0, 0, 0)
    assert (result.splits_lost, result.splits_duplicated) == (0, 0)
    c = result.checkpoints
    assert c.global_ > 0 and c.regional > 0 and c.aborted > 0, "the run exercised every checkpoint kind"
    assert result.rescales > 0 and result.refused_during_restore > 0 and result.partial_failovers > 0
    assert result.max_ref_chain_depth <= config.max_consecutive_failures
    committed = sim.committed_positions
    assert result.records_committed == sum(
        committed.get(s.split_id, s.start) - s.start for s in sim.scenario.all_specs()
    )
    assert_exactly_once(sim)


def test_balanced_strategy_stays_within_one_and_legacy_hash_skews() -> None:
    base = SimConfig(readers=6, splits=60, steps=300, failure_rate=0.2, seed=4)
    balanced = run_scenario(replace(base, strategy="round-robin"))
    legacy = run_scenario(replace(base, strategy="legacy-hash"))
    assert balanced.ok and legacy.ok
    assert balanced.max_imbalance <= 1
    assert legacy.max_imbalance > 1  # the Kafka hash owner skews (kept to show it)


def test_same_seed_gives_the_same_run_and_another_seed_another_run() -> None:
    config = SimConfig(readers=3, splits=20, steps=150, failure_rate=0.3, seed=7)
    first, second = run_scenario(config), run_scenario(config)
    assert first.to_dict() == second.to_dict()
    other = run_scenario(replace(config, seed=8))
    assert other.event_log != first.event_log


def test_legacy_readers_keep_their_splits_and_lose_nothing() -> None:
    result = run_scenario(
        SimConfig(readers=4, splits=30, steps=300, failure_rate=0.3, seed=5, reassign_on_recovery=False)
    )
    assert result.ok, "\n".join(map(str, result.violations[:5]))
    assert result.partial_failovers > 0 and result.records_committed > 0


# --------------------------------------------------------------------------- partial failover


@pytest.mark.parametrize("strategy", ["least-loaded", "round-robin", "legacy-hash"])
@pytest.mark.parametrize("kind", list(RegionFailure))
def test_partial_failover_moves_only_the_failed_readers_splits(strategy: str, kind: RegionFailure) -> None:
    splits = specs(12, length=100)
    healthy = Scenario(4, splits, (*epochs(3), Epoch(budget=4, growth=2)))
    failing = Scenario(4, splits, (*epochs(3), Epoch(budget=4, growth=2, failures=((1, kind),))))
    sim_ok, ok = run(healthy, strategy=strategy)
    sim_bad, bad = run(failing, strategy=strategy)
    assert ok.ok and bad.ok, "\n".join(map(str, bad.violations[:5]))
    assert bad.checkpoints.regional == 1 and bad.partial_failovers == 1
    assert bad.foreign_moves == 0 and bad.moves_per_failover == 0.0  # sticky: reader 1 got its own back
    for reader in (0, 2, 3):  # untouched, in the same order
        assert enumerator_of(sim_bad).owned_split_ids(reader) == enumerator_of(sim_ok).owned_split_ids(reader)
    assert set(enumerator_of(sim_bad).owned_split_ids(1)) == set(enumerator_of(sim_ok).owned_split_ids(1))
    # reader 1's epoch-4 records were discarded and re-read from its fallback positions
    assert bad.records_committed < ok.records_committed
    failed_ids = enumerator_of(sim_bad).owned_split_ids(1)
    for split_id in failed_ids:
        assert sim_bad.committed_positions[split_id] < sim_ok.committed_positions[split_id]
    assert_exactly_once(sim_bad)


def test_reader_failure_after_a_checkpoint_restarts_from_its_last_good_state() -> None:
    scenario = Scenario(3, specs(9, length=50), (*epochs(2), ReaderFailure(2), *epochs(2)))
    sim, result = run(scenario)
    assert result.ok and result.partial_failovers == 1 and result.foreign_moves == 0
    decisions = [a.decision for a in enumerator_of(sim).audit if a.reader_id == 2]
    assert RecoveryDecision.RETURNED_PARTIAL_FAILOVER in decisions
    assert_exactly_once(sim)


def test_failure_before_any_checkpoint_aborts_and_restarts_fresh_without_losing_splits() -> None:
    scenario = Scenario(2, specs(4), (Epoch(failures=((0, RegionFailure.CRASH),)), *epochs(2)))
    sim, result = run(scenario)
    assert result.ok
    assert result.checkpoints.aborted == 1  # no state to fall back to yet
    assert "fresh start" in result.event_log[1]
    assert_exactly_once(sim)


# --------------------------------------------------------------------------- checkpoints


def test_forced_global_checkpoint_after_max_consecutive_failures_aborts_and_restores() -> None:
    fail = (1, RegionFailure.DECLINE)
    scenario = Scenario(
        4, specs(8, length=200), (*epochs(1), Epoch(failures=(fail,)), Epoch(failures=(fail,)), *epochs(2))
    )
    sim, result = run(scenario, max_consecutive_failures=1)
    assert result.ok
    assert (result.checkpoints.regional, result.checkpoints.aborted) == (1, 1)
    assert "aborted" in result.event_log[3] and "global restore from 2" in result.event_log[3]
    assert result.max_ref_chain_depth == 1
    assert_exactly_once(sim)


def test_too_many_failed_regions_abort_the_checkpoint() -> None:
    failures = tuple((r, RegionFailure.TIMEOUT) for r in range(3))
    scenario = Scenario(4, specs(8, length=200), (*epochs(1), Epoch(failures=failures), *epochs(1)))
    sim, result = run(scenario, max_failure_ratio=0.5)
    assert result.ok and result.checkpoints.aborted == 1 and result.checkpoints.regional == 0
    assert_exactly_once(sim)


def test_checkpoint_requested_during_a_restore_is_refused_until_every_reader_reported() -> None:
    scenario = Scenario(3, specs(9, length=60), (*epochs(2), CheckpointDuringRestore(2), *epochs(2)))
    sim, result = run(scenario)
    assert result.ok
    assert result.refused_during_restore == 1 and result.checkpoints.aborted == 1
    assert "refused by the enumerator" in result.event_log[3]
    assert sim.store.ids()[-1] == 5  # checkpoint 3 (the refused one) was never stored
    assert_exactly_once(sim)


class _SnapshotsTooEarly(SplitEnumerator):
    """Broken: lets a checkpoint snapshot while a restore still waits for reports (protocol rule 1.4)."""

    @property
    def checkpoint_allowed(self) -> bool:
        return True


def test_an_enumerator_that_snapshots_during_a_restore_is_caught() -> None:
    def factory(
        source: SplitSource,
        context: RecordingEnumeratorContext,
        strategy: AssignmentStrategy,
        restored: EnumeratorSnapshot | None,
    ) -> SplitEnumerator:
        return enumerator_for(
            source, context, strategy, restored=restored, enumerator_class=_SnapshotsTooEarly
        )

    scenario = Scenario(3, specs(6), (*epochs(1), CheckpointDuringRestore(1), *epochs(1)))
    result = Simulator(SimConfig(), scenario, Components(enumerator=factory)).run()
    assert SimCheck.CHECKPOINT_DURING_RESTORE in {f.kind for f in result.violations}
    assert result.refused_during_restore == 0


# ----------------------------------------------------------------- rescale, discovery, subscriptions


@pytest.mark.parametrize("redistribution", list(Redistribution))
def test_regional_checkpoint_then_rescale_keeps_every_record_exactly_once(
    redistribution: Redistribution,
) -> None:
    decline = (2, RegionFailure.DECLINE)
    scenario = Scenario(
        4,
        specs(10, length=300) + specs(4, subscription=FILES, length=9, bounded=True),
        (
            *epochs(2),
            Epoch(failures=(decline,)),  # regional: region 2 falls back
            Rescale(2, redistribution),  # restore the regional checkpoint at P=2
            *epochs(2),
            Epoch(failures=((0, RegionFailure.TIMEOUT),)),
            Rescale(5, redistribution),
            *epochs(3),
        ),
    )
    sim, result = run(scenario, strategy="round-robin")
    assert result.ok, "\n".join(map(str, result.violations[:5]))
    assert result.checkpoints.regional == 2 and result.rescales == 2 and result.final_parallelism == 5
    assert (result.records_lost, result.records_duplicated, result.records_unexpected) == (0, 0, 0)
    assert_exactly_once(sim)
    assert enumerator_of(sim).finished_split_ids == {f"{FILES}-{i}" for i in range(4)}
    if redistribution is Redistribution.UNION:
        states = [sim.operator_state[r] for r in range(5)]
        assert all(len(s) > 0 for s in states)


def test_bounded_splits_finish_are_never_read_again_and_new_splits_are_read() -> None:
    files = specs(3, subscription=FILES, length=6, bounded=True)
    newcomers = specs(2, length=20, first=50)
    scenario = Scenario(
        2,
        files,
        (*epochs(3, budget=4), DiscoverSplits(newcomers), *epochs(3, budget=4), GlobalRestart(), *epochs(1)),
    )
    sim, result = run(scenario)
    assert result.ok
    assert enumerator_of(sim).finished_split_ids == {s.split_id for s in files}
    for spec in files:
        assert sim.sink.spans(spec.split_id) == [(0, 6)]  # read to its end once, never again
    for spec in newcomers:
        assert sim.committed_positions[spec.split_id] > 0
    assert_exactly_once(sim)


def test_removed_subscription_is_dropped_by_the_drivers_next_epoch_and_its_records_stop() -> None:
    orders, clicks = specs(4, subscription="orders", length=500), specs(4, subscription="clicks", length=500)
    scenario = Scenario(
        2,
        orders + clicks,
        (*epochs(2), RemoveSubscription("orders"), *epochs(3), RemoveSubscription("orders")),
    )
    sim, result = run(scenario)
    assert result.ok
    # The simulator only changed the source: the driver's own live path dropped the splits (rule 1.5).
    assert result.global_restores == 0
    assert "dropped by the next epoch" in result.event_log[3]
    owned = enumerator_of(sim).owners()
    assert owned and all(split_id.startswith("clicks-") for split_id in owned)
    dropped = [
        a for a in enumerator_of(sim).audit if a.decision is RecoveryDecision.DROPPED_REMOVED_SUBSCRIPTION
    ]
    assert {a.split_id for a in dropped} == {s.split_id for s in orders}
    # revoked from the readers that owned them by epoch 3, the first after the change (a live
    # change, not a restore); later discoveries of them are dropped again, owned by nobody
    revoked = [a for a in dropped if a.reader_id is not None]
    assert sorted(a.split_id for a in revoked) == sorted(s.split_id for s in orders)
    assert {a.checkpoint_id for a in revoked} == {2}
    for spec in orders:  # committed through checkpoint 2, nothing after
        assert sim.committed_positions[spec.split_id] == 8
    assert "nothing to do" in result.event_log[-1]
    assert_exactly_once(sim)


class _IgnoresSubscriptionChanges(EpochDriver):
    """A driver that never passes a live subscription change to the enumerator (breaks rule 1.5)."""

    def _refresh_subscriptions(self) -> None:
        return


def test_a_driver_that_ignores_a_removed_subscription_is_caught_at_its_next_epoch() -> None:
    orders, clicks = specs(4, subscription="orders", length=500), specs(4, subscription="clicks", length=500)
    scenario = Scenario(2, orders + clicks, (*epochs(2), RemoveSubscription("orders"), *epochs(2)))
    result = Simulator(SimConfig(), scenario, Components(driver=_IgnoresSubscriptionChanges)).run()
    kinds = {(f.step, f.kind) for f in result.violations}
    assert (4, ViolationKind.REMOVED_SUBSCRIPTION) in kinds
    assert min(f.step for f in result.violations) == 4  # not before the epoch that should drop them


# --------------------------------------------------------------------------- broken components are caught


# the broken driver needs finishing splits and a rebalance: its own test above shrinks it
COMPONENT_BUGS = sorted(name for name, bug in BUGS.items() if bug.components.driver is EpochDriver)


@pytest.mark.parametrize("bug_name", COMPONENT_BUGS)
def test_a_deliberately_broken_component_is_caught_and_shrunk_to_a_short_failing_sequence(
    bug_name: str,
) -> None:
    bug = BUGS[bug_name]
    config = SimConfig(readers=6, splits=40, steps=400, failure_rate=0.2, seed=21)
    result = simulate(config, components=bug.components)
    assert not result.ok
    first = result.violations[0]
    assert first.kind.value in bug.breaks
    shrunk = result.shrunk
    assert shrunk is not None and shrunk.kind is first.kind
    assert len(shrunk.scenario.events) <= 3 and len(shrunk.scenario.initial_splits) <= 2
    assert len(shrunk.scenario.events) < shrunk.original_events
    # the shrunk sequence still fails with the broken component, and passes with the real ones
    replay = run_scenario(config, shrunk.scenario, bug.components)
    assert first.kind in {f.kind for f in replay.violations}
    assert run_scenario(config, shrunk.scenario).ok


def test_leaky_sink_duplicates_are_counted_in_records() -> None:
    scenario = Scenario(
        2,
        specs(2, length=100),
        (*epochs(1), Epoch(budget=5, failures=((0, RegionFailure.DECLINE),)), *epochs(1)),
    )
    result = run_scenario(SimConfig(), scenario, BUGS["leaky-sink"].components)
    kinds = {f.kind for f in result.violations}
    assert ViolationKind.OFFSET_DUPLICATE in kinds or ViolationKind.OFFSET_UNEXPECTED in kinds
    assert result.records_duplicated > 0


def test_a_driver_applying_progress_per_region_rereads_committed_records() -> None:
    """A driver that applies acknowledged progress region by region breaks protocol rule 1.7.

    A region that finishes bounded splits triggers a rebalance that moves a
    split away from a region whose new position has not reached the
    enumerator yet; the new owner re-reads records already committed. No
    failure is needed. The real driver (every position first) is clean on the
    same scenario: the simulator runs the driver users run, and catches a
    driver that decides this wrongly.
    """
    config = SimConfig(readers=5, splits=28, steps=60, failure_rate=0.0, seed=4)
    result = simulate(config, components=BUGS["per-region-progress"].components)
    assert ViolationKind.OFFSET_DUPLICATE in {f.kind for f in result.violations}
    assert result.shrunk is not None
    assert all(isinstance(e, Epoch) and not e.failures for e in result.shrunk.scenario.events)
    assert not run_scenario(config, result.shrunk.scenario, BUGS["per-region-progress"].components).ok
    assert run_scenario(config, result.shrunk.scenario).ok


# --------------------------------------------------------------------------- pieces


def test_ddmin_finds_the_two_events_that_matter() -> None:
    calls: list[int] = []

    def fails(items: list[int]) -> bool:
        calls.append(1)
        return 3 in items and 17 in items

    assert ddmin(list(range(40)), fails, _Budget(500)) == [3, 17]
    assert len(calls) < 120


def test_ddmin_returns_the_best_so_far_when_the_budget_runs_out() -> None:
    result = ddmin(list(range(64)), lambda items: 5 in items, _Budget(3))
    assert 5 in result and len(result) < 64


def test_coverage_counts_lost_duplicated_and_unexpected_records() -> None:
    assert coverage_counts([(0, 5), (5, 10)], 0, 10) == (0, 0, 0)
    assert coverage_counts([(0, 5), (3, 10)], 0, 10) == (0, 2, 0)
    assert coverage_counts([(0, 4), (6, 10)], 0, 10) == (2, 0, 0)
    assert coverage_counts([(2, 12)], 2, 10) == (0, 0, 2)


def test_normalized_scenario_names_regions_modulo_parallelism_and_replays_identically() -> None:
    scenario = Scenario(
        2,
        specs(4, length=50),
        (
            *epochs(1),
            Epoch(failures=((5, RegionFailure.DECLINE),)),
            ReaderFailure(7),
            Rescale(3),
            ReaderFailure(4),
        ),
    )
    normalized = scenario.normalized()
    assert normalized.events[1] == Epoch(failures=((1, RegionFailure.DECLINE),))
    assert normalized.events[2] == ReaderFailure(1) and normalized.events[4] == ReaderFailure(1)
    original, replayed = run_scenario(SimConfig(), scenario), run_scenario(SimConfig(), normalized)
    assert replace(original, event_log=()) == replace(replayed, event_log=())
    outcomes = [line.split(" -> ")[-1] for line in original.event_log]
    assert outcomes == [line.split(" -> ")[-1] for line in replayed.event_log]


# --------------------------------------------------------------------------- core findings


def test_check_ref_chains_agrees_with_the_store_after_an_aborted_forced_global() -> None:
    store = CheckpointStore()
    coordinator = RegionalCheckpointCoordinator(
        CheckpointConfig(max_consecutive_failures=1, max_failure_ratio=0.5), 2, store
    )

    def attempt(checkpoint_id: int, failed: int | None) -> CheckpointKind:
        pending = coordinator.trigger(checkpoint_id, now=float(checkpoint_id))
        for region in range(2):
            if region == failed:
                pending.decline(region, "test")
            else:
                split = Split(f"s{region}", position=checkpoint_id)
                pending.acknowledge(region, RegionState(region_id=region, splits=(split,)))
        return coordinator.complete(pending).kind

    assert attempt(1, None) is CheckpointKind.GLOBAL
    assert attempt(2, 0) is CheckpointKind.REGIONAL  # region 0 -> 1
    assert attempt(3, 1) is CheckpointKind.ABORTED  # forced global fails; the counter resets
    assert attempt(4, 1) is CheckpointKind.ABORTED  # the chain of 2 is full: forced global again
    assert attempt(5, None) is CheckpointKind.GLOBAL
    assert max(store.chain_depth(c) for c in store.ids()) == 1  # protocol section 6 holds
    refs = {c: store.get(c).ref_checkpoint_ids for c in store.ids()}
    depths = {c: store.chain_depth(c) for c in store.ids()}
    assert check_ref_chains(refs, 1, depths) == check_ref_chains(refs, 1) == []
    # a chain as the probe built it (4 -> 2 -> 1, region by region) is what the check catches
    probe = {1: frozenset[int](), 2: frozenset({1}), 4: frozenset({2})}
    assert [(v.kind, v.checkpoint_ids) for v in check_ref_chains(probe, 1)] == [
        (ViolationKind.REF_CHAIN_TOO_DEEP, (4,))
    ]
