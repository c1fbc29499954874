"""Named scenarios of split ownership and recovery (protocol section 1), with exact outcomes."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import pytest

from splitkeeper.core.assignment import AssignmentStrategy, OwnedView, Placement, strategy_by_name
from splitkeeper.core.enumerator import (
    AssignmentCall,
    EnumeratorPhase,
    RecordingEnumeratorContext,
    RevocationCall,
    SplitEnumerator,
    enumerator_for,
    fail_reader,
    restart_reader,
)
from splitkeeper.core.invariants import ViolationKind, check_balance, check_enumerator_state
from splitkeeper.core.source import ReassignableStaticSplitSource, StaticSplitSource
from splitkeeper.core.types import EnumeratorSnapshot, RecoveryDecision, Split
from splitkeeper.errors import InvalidParameterError, ProtocolError

A, B = 0, 1


def s(n: int, topic: str = "t", **kw: int) -> Split:
    return Split(f"{topic}-{n}", topic, **kw)


def ids(splits: Sequence[Split]) -> list[str]:
    return sorted(x.split_id for x in splits)


def started(
    parallelism: int,
    strategy: str | AssignmentStrategy = "round-robin",
    *,
    reassign: bool = True,
    restored: EnumeratorSnapshot | None = None,
    subscriptions: set[str] | None = None,
) -> tuple[RecordingEnumeratorContext, SplitEnumerator]:
    ctx = RecordingEnumeratorContext(parallelism)
    chosen = strategy_by_name(strategy) if isinstance(strategy, str) else strategy
    enum = SplitEnumerator(ctx, chosen, reassign_on_recovery=reassign, subscriptions=subscriptions)
    if restored is not None:
        enum.restore(restored)
    enum.start()
    return ctx, enum


def owned(enum: SplitEnumerator, reader: int) -> list[str]:
    return sorted(enum.owned_split_ids(reader))


def decisions(enum: SplitEnumerator, split_id: str) -> list[RecoveryDecision]:
    return [r.decision for r in enum.audit_for(split_id)]


def checkpoint(ctx: RecordingEnumeratorContext, enum: SplitEnumerator, cid: int) -> EnumeratorSnapshot:
    snap = enum.snapshot(cid)
    ctx.on_checkpoint(cid)
    ctx.on_checkpoint_complete(cid)
    return snap


class FirstSplitPerReader(AssignmentStrategy):
    """A test strategy that places at most one split per reader (the rest stay pooled)."""

    name = "one-per-reader"

    def place(self, splits: Collection[Split], owned: OwnedView, parallelism: int) -> Placement:
        ordered = sorted(splits, key=lambda x: x.split_id)
        readers = sorted(owned)
        return Placement(
            by_reader={r: [sp] for r, sp in zip(readers, ordered, strict=False)},
            unplaced=ordered[len(readers) :],
        )


# ---------------------------------------------------------------------------------------------
# Scenarios 1 and 2 of protocol rule 1.4 (Becket's replies)


def test_scenario1_reported_but_unassigned_splits_stay_in_the_enumerator_snapshot_pool():
    ctx, enum = started(2, FirstSplitPerReader())
    restart_reader(enum, ctx, A, [s(1, position=10), s(2, position=20)])
    restart_reader(enum, ctx, B, [s(3, position=30), s(4, position=40)])

    assert owned(enum, A) == ["t-1"] and owned(enum, B) == ["t-2"]
    snap = enum.snapshot(1)
    assert ids(snap.pool) == ["t-3", "t-4"]
    assert {x.split_id: x.position for x in snap.pool} == {"t-3": 30, "t-4": 40}
    assert ids(snap.assignments[A]) == ["t-1"] and ids(snap.assignments[B]) == ["t-2"]
    assert decisions(enum, "t-3") == [RecoveryDecision.REDISTRIBUTED_GLOBAL_RESTORE]

    # Restarting from that checkpoint loses nothing: the readers report 1 and 2, the pool has 3 and 4.
    ctx2, enum2 = started(2, "round-robin", restored=snap)
    restart_reader(enum2, ctx2, A, snap.assignments[A])
    restart_reader(enum2, ctx2, B, snap.assignments[B])
    assert sorted(owned(enum2, A) + owned(enum2, B)) == ["t-1", "t-2", "t-3", "t-4"]
    assert enum2.pool_size == 0


def test_scenario2_checkpoint_before_all_restore_reports_arrived_is_refused():
    restored = EnumeratorSnapshot(
        checkpoint_id=7, parallelism=2, assignments={A: (s(1), s(2)), B: (s(3), s(4))}
    )
    ctx, enum = started(2, restored=restored)
    restart_reader(enum, ctx, A, [s(1), s(2)])

    assert enum.checkpoint_allowed is False
    assert enum.phase is EnumeratorPhase.AWAITING_READERS
    with pytest.raises(ProtocolError, match=r"checkpoint 8 refused.*readers \[1\]"):
        enum.snapshot(8)
    assert ctx.assignment_calls == []  # nothing assigned before every reader reported

    restart_reader(enum, ctx, B, [s(3), s(4)])
    assert enum.checkpoint_allowed is True
    snap = enum.snapshot(8)
    assert ids([x for splits in snap.assignments.values() for x in splits]) == ["t-1", "t-2", "t-3", "t-4"]
    assert snap.pool == ()


# ---------------------------------------------------------------------------------------------
# Stale report and the "A re-reports (1)" sequence (protocol rule 1.3)


def test_stale_report_after_splits_moved_to_b_is_ignored_and_audited():
    ctx, enum = started(2)
    restart_reader(enum, ctx, A, [s(1), s(2), s(3), s(4)])
    restart_reader(enum, ctx, B, [])
    assert owned(enum, A) == ["t-1", "t-3"] and owned(enum, B) == ["t-2", "t-4"]

    # A fails before any checkpoint: 1 and 3 (assigned since) are added back; A re-reports its old state.
    added_back = fail_reader(enum, ctx, A)
    assert ids(added_back) == ["t-1", "t-3"]
    restart_reader(enum, ctx, A, [s(1), s(2), s(3), s(4)])

    assert owned(enum, A) == ["t-1", "t-3"] and owned(enum, B) == ["t-2", "t-4"]
    stale = [r for r in enum.audit if r.decision is RecoveryDecision.IGNORED_STALE_REPORT]
    assert [(r.split_id, r.reader_id) for r in stale] == [("t-2", A), ("t-4", A)]
    assert all("owned by reader 1" in r.detail for r in stale)
    assert decisions(enum, "t-1")[-3:] == [
        RecoveryDecision.ADDED_BACK,
        RecoveryDecision.IGNORED_ALREADY_PENDING,
        RecoveryDecision.ASSIGNED,
    ]


def test_a_fails_before_checkpointing_and_re_reports_split1_no_loss_and_split2_stays_with_b():
    ctx, enum = started(2)
    restart_reader(enum, ctx, A, [s(1), s(2)])
    restart_reader(enum, ctx, B, [])
    assert owned(enum, A) == ["t-1"] and owned(enum, B) == ["t-2"]

    fail_reader(enum, ctx, A)  # adds back split 1: assigned after the last checkpoint
    restart_reader(enum, ctx, A, [s(1)])

    assert owned(enum, A) == ["t-1"] and owned(enum, B) == ["t-2"]
    assert enum.pool_size == 0
    assert decisions(enum, "t-1")[-2:] == [
        RecoveryDecision.IGNORED_ALREADY_PENDING,
        RecoveryDecision.ASSIGNED,
    ]
    assert check_enumerator_state(enum.assignment(), known_live={"t-1", "t-2"}) == []


def test_a_fails_after_a_checkpoint_and_re_reports_split1_it_is_returned_and_reassigned():
    ctx, enum = started(2)
    restart_reader(enum, ctx, A, [s(1), s(2)])
    restart_reader(enum, ctx, B, [])
    snap = checkpoint(ctx, enum, 1)

    assert fail_reader(enum, ctx, A) == []  # nothing assigned since the completed checkpoint
    restart_reader(enum, ctx, A, snap.assignments[A])

    assert owned(enum, A) == ["t-1"] and owned(enum, B) == ["t-2"]
    assert decisions(enum, "t-1")[-2:] == [
        RecoveryDecision.RETURNED_PARTIAL_FAILOVER,
        RecoveryDecision.ASSIGNED,
    ]


# ---------------------------------------------------------------------------------------------
# The three ways a split reaches the enumerator (protocol rule 1.3)


def test_way1_split_reported_during_global_restore_is_redistributed_by_the_strategy():
    ctx, enum = started(2)
    restart_reader(enum, ctx, A, [s(1), s(2), s(3), s(4)])
    assert enum.pool_size == 4 and ctx.assignment_calls == []  # waits for B
    restart_reader(enum, ctx, B, [])

    assert enum.loads() == {A: 2, B: 2}
    for n in (1, 2, 3, 4):
        assert decisions(enum, f"t-{n}") == [
            RecoveryDecision.REDISTRIBUTED_GLOBAL_RESTORE,
            RecoveryDecision.ASSIGNED,
        ]


def test_way2_split_reported_by_its_owner_during_partial_failover_goes_back_to_pending_and_is_reassigned():
    ctx, enum = started(2)
    for r in (A, B):
        restart_reader(enum, ctx, r)
    enum.add_splits([s(1), s(2)])
    snap = checkpoint(ctx, enum, 1)

    fail_reader(enum, ctx, B)
    assert owned(enum, B) == ["t-2"]  # still B's while B is away: its checkpointed state has it
    restart_reader(enum, ctx, B, snap.assignments[B])
    assert owned(enum, B) == ["t-2"]
    assert decisions(enum, "t-2") == [
        RecoveryDecision.DISCOVERED,
        RecoveryDecision.ASSIGNED,
        RecoveryDecision.RETURNED_PARTIAL_FAILOVER,
        RecoveryDecision.ASSIGNED,
    ]


def test_way3_split_assigned_after_the_last_checkpoint_is_added_back_and_removed_from_the_map():
    ctx, enum = started(2)
    for r in (A, B):
        restart_reader(enum, ctx, r)
    enum.add_splits([s(1), s(2)])
    checkpoint(ctx, enum, 1)
    enum.add_splits([s(3), s(4)])  # 3 -> A, 4 -> B, after checkpoint 1

    added_back = fail_reader(enum, ctx, A)
    assert ids(added_back) == ["t-3"]
    assert enum.owner_of("t-3") is None and "t-3" not in owned(enum, A)  # as if never assigned
    assert enum.pool_size == 1  # waits for A (sticky), B is not given A's split
    restart_reader(enum, ctx, A, [s(1)])
    assert owned(enum, A) == ["t-1", "t-3"] and owned(enum, B) == ["t-2", "t-4"]
    assert decisions(enum, "t-3")[-2:] == [RecoveryDecision.ADDED_BACK, RecoveryDecision.ASSIGNED]


def test_add_splits_back_for_a_registered_reader_is_a_protocol_error():
    ctx, enum = started(1)
    restart_reader(enum, ctx, A)
    with pytest.raises(ProtocolError, match="reader 0, which is registered"):
        enum.add_splits_back([s(1)], A)


# ---------------------------------------------------------------------------------------------
# Legacy versus deferred assignment (protocol rule 1.2)


def test_legacy_readers_keep_their_restored_splits_deferred_ones_get_them_redistributed():
    outcomes = {}
    for reassign in (False, True):
        ctx, enum = started(2, reassign=reassign)
        restart_reader(enum, ctx, A, [s(1), s(2), s(3), s(4)])
        restart_reader(enum, ctx, B, [])
        outcomes[reassign] = (enum.loads(), decisions(enum, "t-2"))

    assert outcomes[False] == ({A: 4, B: 0}, [RecoveryDecision.KEPT_LEGACY])
    assert outcomes[True] == (
        {A: 2, B: 2},
        [RecoveryDecision.REDISTRIBUTED_GLOBAL_RESTORE, RecoveryDecision.ASSIGNED],
    )


def test_enumerator_for_sets_deferred_assignment_only_for_sources_with_the_mix_in():
    ctx = RecordingEnumeratorContext(1)
    legacy = enumerator_for(StaticSplitSource("plain", [s(1)]), ctx)
    deferred = enumerator_for(ReassignableStaticSplitSource("flip537", [s(1)]), ctx)
    assert legacy.reassign_on_recovery is False
    assert deferred.reassign_on_recovery is True
    assert deferred.subscriptions == frozenset({"t"})


def test_enumerator_for_discovers_through_the_source_on_start():
    source = ReassignableStaticSplitSource("src", [s(1), s(2)])
    ctx = RecordingEnumeratorContext(1)
    enum = enumerator_for(source, ctx, "least-loaded")
    enum.start()
    restart_reader(enum, ctx, A)
    assert owned(enum, A) == ["t-1", "t-2"]
    source.add([s(3)])
    assert enum.discover() == 1
    assert owned(enum, A) == ["t-1", "t-2", "t-3"]


# ---------------------------------------------------------------------------------------------
# Hongshun's two-split example (protocol rule 1.6): legacy/naive ends 2 apart, balanced within 1


def _two_splits_each_then_a_fails(reassign: bool, strategy: str) -> SplitEnumerator:
    ctx, enum = started(2, strategy, reassign=reassign)
    for r in (A, B):
        restart_reader(enum, ctx, r)
    enum.add_splits([s(1), s(2)])  # 1 -> A, 2 -> B
    snap = checkpoint(ctx, enum, 1)
    enum.add_splits([s(3), s(4)])  # 3 -> A, 4 -> B after the checkpoint: each reader owns 2
    assert enum.loads() == {A: 2, B: 2}
    fail_reader(enum, ctx, A)  # split 3 is added back
    restart_reader(enum, ctx, A, snap.assignments[A])  # A restores split 1
    return enum


def test_hongshun_example_legacy_least_loaded_leaves_loads_two_apart():
    enum = _two_splits_each_then_a_fails(reassign=False, strategy="least-loaded")
    # The added-back split went eagerly to B, the only registered reader; A kept its restored one.
    assert enum.loads() == {A: 1, B: 3}
    assert owned(enum, B) == ["t-2", "t-3", "t-4"]
    violations = check_balance(enum.assignment())
    assert [v.kind for v in violations] == [ViolationKind.UNBALANCED]
    assert "differ by 2" in violations[0].detail


@pytest.mark.parametrize("strategy", ["round-robin", "least-loaded", "weighted"])
def test_hongshun_example_balanced_deferred_ends_within_one_and_moves_only_a_splits(strategy: str):
    enum = _two_splits_each_then_a_fails(reassign=True, strategy=strategy)
    assert enum.loads() == {A: 2, B: 2}
    assert owned(enum, A) == ["t-1", "t-3"] and owned(enum, B) == ["t-2", "t-4"]
    assert check_balance(enum.assignment()) == []


# ---------------------------------------------------------------------------------------------
# Subscriptions and finished splits (protocol rule 1.5)


def test_removed_subscription_splits_are_dropped_on_restart_and_logged():
    snap = EnumeratorSnapshot(
        checkpoint_id=3,
        parallelism=2,
        pool=(s(9, "b"),),
        assignments={A: (s(1, "a"), s(1, "b")), B: (s(2, "a"), s(2, "b"))},
        subscriptions=frozenset({"a", "b"}),
    )
    ctx, enum = started(2, restored=snap, subscriptions={"a"})
    restart_reader(enum, ctx, A, snap.assignments[A])
    restart_reader(enum, ctx, B, snap.assignments[B])

    assert sorted(owned(enum, A) + owned(enum, B)) == ["a-1", "a-2"]
    assert enum.pool_size == 0
    dropped = sorted(
        r.split_id for r in enum.audit if r.decision is RecoveryDecision.DROPPED_REMOVED_SUBSCRIPTION
    )
    assert dropped == ["b-1", "b-2", "b-9"]
    assert check_enumerator_state(enum.snapshot(4)) == []


def test_live_subscription_change_revokes_owned_splits_through_the_context():
    ctx, enum = started(1, subscriptions={"a", "b"})
    restart_reader(enum, ctx, A)
    enum.add_splits([s(1, "a"), s(1, "b"), s(2, "b")])
    dropped = enum.set_subscriptions({"a"})

    assert sorted(dropped) == ["b-1", "b-2"]
    assert owned(enum, A) == ["a-1"]
    assert isinstance(ctx.calls[-1], RevocationCall)
    assert sorted(ctx.calls[-1].revocation[A]) == ["b-1", "b-2"]
    enum.add_splits([s(3, "b")])  # rediscovered split of a removed subscription: dropped again
    assert enum.split("b-3") is None
    assert decisions(enum, "b-3") == [RecoveryDecision.DROPPED_REMOVED_SUBSCRIPTION]


def test_finished_split_is_never_assigned_again():
    ctx, enum = started(2)
    for r in (A, B):
        restart_reader(enum, ctx, r)
    enum.add_splits([s(1, end=10), s(2, end=10)])
    snap = checkpoint(ctx, enum, 1)
    assert enum.split_finished(A, "t-1") is True
    assert enum.split_finished(A, "t-1") is False  # repeated report

    enum.add_splits([s(1, end=10)])  # rediscovered
    assert enum.split("t-1") is None
    fail_reader(enum, ctx, A)
    restart_reader(enum, ctx, A, snap.assignments[A])  # A's old state still has split 1 at position 0
    assert "t-1" not in owned(enum, A) + owned(enum, B)
    assert decisions(enum, "t-1")[-1] is RecoveryDecision.DROPPED_FINISHED

    snap2 = enum.snapshot(2)
    assert "t-1" in snap2.finished
    ctx2, enum2 = started(2, restored=snap2)
    restart_reader(enum2, ctx2, A, snap.assignments[A])
    restart_reader(enum2, ctx2, B, snap2.assignments[B])
    assert enum2.owners() == {"t-2": enum2.owner_of("t-2")} and "t-1" not in enum2.owners()


def test_split_finished_by_a_reader_that_does_not_own_it_is_a_protocol_error():
    ctx, enum = started(2)
    for r in (A, B):
        restart_reader(enum, ctx, r)
    enum.add_splits([s(1), s(2)])
    with pytest.raises(ProtocolError, match=r"'t-2'\): the split is owned by reader 1"):
        enum.split_finished(A, "t-2")


def test_reported_split_at_its_end_is_recorded_finished_and_not_reassigned():
    ctx, enum = started(1)
    restart_reader(enum, ctx, A, [s(1, position=10, end=10), s(2, end=10)])
    assert owned(enum, A) == ["t-2"]
    assert enum.finished_split_ids == frozenset({"t-1"})


# ---------------------------------------------------------------------------------------------
# Regional fallback in the enumerator snapshot (protocol rule 2.4)


def test_region_fallback_pools_splits_assigned_after_the_referenced_state_in_the_snapshot_only():
    ctx, enum = started(2)
    for r in (A, B):
        restart_reader(enum, ctx, r)
    enum.add_splits([s(1), s(2)])
    checkpoint(ctx, enum, 1)  # A's state: [1]
    enum.add_splits([s(3), s(4)])  # 3 -> A after checkpoint 1

    snap = enum.snapshot(2, fallback={A: ["t-1"]})  # A declined 2 and contributes its state of 1
    ctx.on_checkpoint(2)
    ctx.on_checkpoint_complete(2, failed_readers=[A])

    assert ids(snap.pool) == ["t-3"]
    assert ids(snap.assignments[A]) == ["t-1"] and ids(snap.assignments[B]) == ["t-2", "t-4"]
    assert enum.owner_of("t-3") == A  # live ownership unchanged: A keeps reading it
    last = enum.audit_for("t-3")[-1]
    assert (last.decision, last.reader_id, last.checkpoint_id) == (
        RecoveryDecision.RETURNED_REGION_FALLBACK,
        A,
        2,
    )
    # The tracker keeps A's split 3 (its region's state in checkpoint 2 lacks it).
    assert ids(ctx.splits_assigned_since_last_checkpoint(A)) == ["t-3"]

    ctx2, enum2 = started(2, restored=snap)
    restart_reader(enum2, ctx2, A, [s(1)])
    restart_reader(enum2, ctx2, B, [s(2), s(4)])
    assert sorted(enum2.owners()) == ["t-1", "t-2", "t-3", "t-4"]
    assert enum2.pool_size == 0


def test_snapshot_carries_positions_from_acknowledged_states():
    ctx, enum = started(1)
    restart_reader(enum, ctx, A)
    enum.add_splits([s(1), s(2)])
    assert enum.update_positions([s(1, position=42), s(99, position=5)]) == 1
    snap = enum.snapshot(1)
    assert {x.split_id: x.position for x in snap.assignments[A]} == {"t-1": 42, "t-2": 0}


# ---------------------------------------------------------------------------------------------
# Rebalance, removal, contract errors


def test_new_reader_after_scale_up_gets_splits_moved_by_rebalance_through_revocations():
    ctx, enum = started(2)
    for r in (A, B):
        restart_reader(enum, ctx, r)
    enum.add_splits([s(n) for n in range(6)])
    ctx.set_parallelism(3)
    restart_reader(enum, ctx, 2)

    assert enum.loads() == {0: 2, 1: 2, 2: 2}
    moved = [r for r in enum.audit if r.decision is RecoveryDecision.REBALANCED]
    assert len(moved) == 2 and {r.reader_id for r in moved} == {2}
    revocations = [c for c in ctx.calls if isinstance(c, RevocationCall)]
    assert sum(len(v) for c in revocations for v in c.revocation.values()) == 2
    assert isinstance(ctx.calls[-1], AssignmentCall) and list(ctx.calls[-1].assignment) == [2]


def test_removed_reader_splits_go_to_the_others_and_assignment_no_longer_waits_for_it():
    ctx, enum = started(3)
    for r in (0, 1, 2):
        restart_reader(enum, ctx, r)
    enum.add_splits([s(n) for n in range(6)])
    gone = owned(enum, 2)
    ctx.unregister_reader(2)
    assert sorted(enum.remove_reader(2)) == gone
    assert enum.loads() == {0: 3, 1: 3}
    assert enum.expected_readers == (0, 1)


def test_bad_inputs_give_clear_errors():
    with pytest.raises(InvalidParameterError, match=r"parallelism=0 is not allowed: an integer >= 1"):
        RecordingEnumeratorContext(0)
    with pytest.raises(
        InvalidParameterError, match=r"strategy='fastest' is not allowed: one of least-loaded"
    ):
        strategy_by_name("fastest")
    ctx, enum = started(1)
    restart_reader(enum, ctx, A)
    enum.snapshot(5)
    with pytest.raises(
        InvalidParameterError,
        match=r"checkpoint_id=4 is not allowed: an id greater than the previous checkpoint id 5",
    ):
        enum.snapshot(4)
    with pytest.raises(InvalidParameterError, match=r"checkpoint_id=5 is not allowed"):
        enum.snapshot(5)
    with pytest.raises(InvalidParameterError, match=r"reader_id=3 is not allowed: an integer in 0\.\.0"):
        ctx.register_reader(3)


def test_protocol_order_errors():
    ctx = RecordingEnumeratorContext(2)
    enum = SplitEnumerator(ctx, strategy_by_name("round-robin"), reassign_on_recovery=True)
    with pytest.raises(ProtocolError, match=r"add_splits\(\) called before start\(\)"):
        enum.add_splits([s(1)])
    enum.start()
    with pytest.raises(ProtocolError, match="already called"):
        enum.start()
    with pytest.raises(ProtocolError, match="before start"):
        enum.restore(EnumeratorSnapshot(checkpoint_id=1, parallelism=2))
    with pytest.raises(ProtocolError, match="reader 1 is not registered in the context"):
        enum.add_reader(1)
    restart_reader(enum, ctx, A)
    with pytest.raises(ProtocolError, match="already registered"):
        ctx.register_reader(A)
    with pytest.raises(ProtocolError, match="unregister the reader from the context first"):
        enum.remove_reader(A)


@pytest.mark.parametrize("reassign", [True, False])
def test_owned_splits_a_restarted_reader_does_not_report_return_to_the_pool_even_without_add_back(reassign):
    # A runtime that lost its assignment tracker calls add_splits_back with nothing: the reader's
    # unreported splits must still not be lost (a deferred reader holds nothing until assigned).
    ctx, enum = started(2, "least-loaded", reassign=reassign)
    for r in (A, B):
        restart_reader(enum, ctx, r)
    enum.add_splits([s(1), s(2), s(3), s(4)])
    assert owned(enum, A) == ["t-1", "t-3"]
    ctx.unregister_reader(A)
    enum.add_splits_back([], A)
    restart_reader(enum, ctx, A, [s(1)])

    assert sorted(enum.owners()) == ["t-1", "t-2", "t-3", "t-4"]
    assert enum.pool_size == 0
    returned = [r for r in enum.audit_for("t-3") if r.decision is RecoveryDecision.RETURNED_PARTIAL_FAILOVER]
    assert [r.detail for r in returned] == ["owned but not reported"]


def test_bulk_assignment_of_a_large_pool_is_complete_balanced_and_restores_the_gc_state():
    import gc

    from splitkeeper.core.enumerator import BULK_SPLITS

    ctx, enum = started(64)
    enum.add_splits([Split(f"p-{n:06d}", "p") for n in range(BULK_SPLITS + 7)])
    for r in range(64):
        restart_reader(enum, ctx, r)
    assert gc.isenabled()
    assert enum.pool_size == 0
    loads = enum.loads()
    assert sum(loads.values()) == BULK_SPLITS + 7 and max(loads.values()) - min(loads.values()) <= 1
    gc.disable()
    try:  # a caller that disabled the GC itself keeps it disabled
        enum.add_splits([Split(f"q-{n:06d}", "p") for n in range(BULK_SPLITS)])
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_unreported_snapshot_split_is_pooled_unless_its_subscription_was_removed_meanwhile():
    snap = EnumeratorSnapshot(
        checkpoint_id=4, parallelism=2, assignments={A: (s(1, "a"), s(2, "b")), B: (s(3, "a"),)}
    )
    ctx, enum = started(2, restored=snap, subscriptions={"a", "b"})
    restart_reader(enum, ctx, A, [])  # A lost its state: reports nothing
    enum.set_subscriptions({"a"})  # while the restore still waits for B
    restart_reader(enum, ctx, B, [s(3, "a")])

    assert sorted(enum.owners()) == ["a-1", "a-3"]  # a-1 pooled from the snapshot, b-2 dropped
    assert decisions(enum, "a-1") == [
        RecoveryDecision.REDISTRIBUTED_GLOBAL_RESTORE,
        RecoveryDecision.ASSIGNED,
    ]
    assert "reported by no reader" in enum.audit_for("a-1")[0].detail
    assert decisions(enum, "b-2") == [RecoveryDecision.DROPPED_REMOVED_SUBSCRIPTION]


def test_audit_since_and_audit_count_match_slicing_the_full_audit_without_building_it():
    ctx, enum = started(2)
    restart_reader(enum, ctx, A, [s(1), s(2), s(3)])
    restart_reader(enum, ctx, B, [])
    enum.add_splits([s(n) for n in range(4, 9)])
    full = enum.audit
    assert enum.audit_count == len(full) > 10
    for start in range(len(full) + 2):
        assert enum.audit_since(start) == full[start:]
    assert enum.audit_counts()[RecoveryDecision.ASSIGNED] == 8
    with pytest.raises(InvalidParameterError, match=r"start=-1 is not allowed"):
        enum.audit_since(-1)
