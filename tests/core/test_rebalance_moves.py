"""A rebalance that moves a split twice still leaves it with exactly one owner (protocol rules 1.1, 1.6).

A strategy's ``rebalance`` returns a sequence of moves, each applied to the ownership the
previous ones left; the weighted strategy's greedy loop can move one split twice (from
reader 1 to 0, then from 0 to 2). The enumerator tells the readers (its context) every
revocation before every assignment, so it must compose the sequence into one net move per
split first. It did not: the split was revoked from 1 and from 0 (which did not hold it yet),
then assigned to 0 and to 2, and both regions read it in the next epoch ("region 8
acknowledged checkpoint 24 with split 'payments-2', which region 2 already acknowledged"; the
seeded property run seed=0, readers=6, splits=7, failure_rate=0.375, weighted, global
checkpoints only).
"""

from __future__ import annotations

from collections.abc import Collection

from splitkeeper.core.assignment import AssignmentStrategy, Move, OwnedView, Placement, WeightedStrategy
from splitkeeper.core.driver import ReaderStateContext
from splitkeeper.core.enumerator import AssignmentCall, RevocationCall, SplitEnumerator, restart_reader
from splitkeeper.core.invariants import check_reader_views
from splitkeeper.core.rescale import Redistribution
from splitkeeper.core.types import RecoveryDecision, Split
from splitkeeper.sim import SimConfig, Simulator, run_scenario
from splitkeeper.sim.events import DiscoverSplits, Epoch, RegionFailure, Rescale, Scenario, SplitSpec


def readers_holding(ctx: ReaderStateContext, split_id: str) -> list[int]:
    return sorted(r for r, view in ctx.reader_splits.items() if split_id in view)


def enumerator_with_readers(
    strategy: AssignmentStrategy, parallelism: int
) -> tuple[ReaderStateContext, SplitEnumerator]:
    ctx = ReaderStateContext(parallelism)
    enum = SplitEnumerator(ctx, strategy, reassign_on_recovery=True)
    enum.start()
    for reader in range(parallelism):
        restart_reader(enum, ctx, reader)
    return ctx, enum


def test_a_split_the_weighted_rebalance_moves_twice_is_held_by_its_last_target_only() -> None:
    """Rule 1.1: after any rebalance each split is in exactly one reader's view, the enumerator's owner's.

    Measured weights change (the driver's ``_reweigh``); the weighted strategy's moves are
    s1 0->1, s2 1->0, s3 2->0, s2 0->2. The readers are told the net moves: s1 0->1,
    s2 1->2, s3 2->0, each revoked from its owner before and assigned to its new owner.
    """
    strategy = WeightedStrategy(
        weights={"s0": 2.0, "s1": 3.0, "s2": 3.0, "s3": 3.0}, capacities={0: 1.0, 1: 1.5, 2: 2.0}
    )
    ctx, enum = enumerator_with_readers(strategy, 3)
    enum.add_splits([Split(f"s{i}", "t") for i in range(4)])
    assert {r: sorted(enum.owned_split_ids(r)) for r in range(3)} == {0: ["s1"], 1: ["s2"], 2: ["s0", "s3"]}
    strategy.set_weights({"s0": 4.0, "s1": 4.0, "s2": 1.0, "s3": 2.0})
    owned_now = {r: dict.fromkeys(enum.owned_split_ids(r)) for r in range(3)}
    assert strategy.rebalance(owned_now, 3) == [
        Move("s1", 0, 1),
        Move("s2", 1, 0),
        Move("s3", 2, 0),
        Move("s2", 0, 2),
    ]
    calls = len(ctx.calls)

    moved = enum.rebalance()

    assert {r: sorted(enum.owned_split_ids(r)) for r in range(3)} == {0: ["s3"], 1: ["s1"], 2: ["s0", "s2"]}
    for sid in ("s0", "s1", "s2", "s3"):
        assert readers_holding(ctx, sid) == [enum.owner_of(sid)], sid
    assert moved == 3  # three splits moved; s2 moved once, not twice
    assert check_reader_views(enum.assignment(), {r: v.keys() for r, v in ctx.reader_splits.items()}) == []
    told = ctx.calls[calls:]
    assert [type(c) for c in told] == [RevocationCall, AssignmentCall]
    revoked, assigned = told
    assert isinstance(revoked, RevocationCall) and isinstance(assigned, AssignmentCall)
    assert {r: sorted(v) for r, v in revoked.revocation.items()} == {0: ["s1"], 1: ["s2"], 2: ["s3"]}
    assert {r: sorted(s.split_id for s in v) for r, v in assigned.assignment.items()} == {
        0: ["s3"],
        1: ["s1"],
        2: ["s2"],
    }
    rebalanced = [
        (a.reader_id, a.detail) for a in enum.audit_for("s2") if a.decision is RecoveryDecision.REBALANCED
    ]
    assert rebalanced == [(2, "from reader 1")]


class Scripted(AssignmentStrategy):
    """Places everything on reader 0; its next rebalance returns the moves it is given (once)."""

    name = "scripted"
    balanced = True

    def __init__(self) -> None:
        self.moves: list[Move] = []

    def place(self, splits: Collection[Split], owned: OwnedView, parallelism: int) -> Placement:
        return Placement(by_reader={0: list(splits)})

    def rebalance(self, owned: OwnedView, parallelism: int) -> list[Move]:
        moves, self.moves = self.moves, []
        return moves


def test_a_split_moved_away_and_back_in_one_rebalance_never_leaves_its_reader() -> None:
    """Rule 1.6 (sticky): moves that bring a split back to its owner are no move at all.

    a goes 0->1->2 (net 0->2), b goes 0->1->0 (no move: neither revoked nor audited).
    """
    strategy = Scripted()
    ctx, enum = enumerator_with_readers(strategy, 3)
    enum.add_splits([Split("a", "t"), Split("b", "t")])
    calls = len(ctx.calls)
    strategy.moves = [Move("a", 0, 1), Move("b", 0, 1), Move("a", 1, 2), Move("b", 1, 0)]

    moved = enum.rebalance()

    assert readers_holding(ctx, "a") == [2] == [enum.owner_of("a")]
    assert readers_holding(ctx, "b") == [0] == [enum.owner_of("b")]
    assert moved == 1
    told = ctx.calls[calls:]
    assert len(told) == 2
    revoked, assigned = told
    assert isinstance(revoked, RevocationCall) and isinstance(assigned, AssignmentCall)
    assert dict(revoked.revocation) == {0: ("a",)}
    assert {r: [s.split_id for s in v] for r, v in assigned.assignment.items()} == {2: ["a"]}
    assert RecoveryDecision.REBALANCED not in [a.decision for a in enum.audit_for("b")]


def spec(split_id: str, start: int, length: int, bounded: bool = False) -> SplitSpec:
    return SplitSpec(split_id, split_id.rsplit("-", 1)[0], start, length, bounded)


# The seeded property run's failure, shrunk (splitkeeper.sim.shrink): after the abort of step 13
# the driver restores checkpoint 5 and, in step 14, the measured rates make the weighted strategy
# move payments-9 from reader 7 to 8 and then from 8 to 0; regions 0 and 8 both read it.
SHRUNK = Scenario(
    parallelism=1,
    initial_splits=(
        spec("payments-0", 0, 32),
        spec("payments-1", 12, 37),
        spec("orders-0", 0, 18),
        spec("payments-2", 18, 38),
        spec("payments-3", 0, 4),
        spec("clicks-0", 0, 35),
    ),
    events=(
        DiscoverSplits((spec("files-1", 0, 4, True), spec("payments-4", 0, 20), spec("payments-5", 0, 35))),
        DiscoverSplits((spec("files-2", 0, 13, True), spec("payments-6", 0, 4), spec("payments-7", 0, 3))),
        DiscoverSplits((spec("payments-8", 0, 22),)),
        DiscoverSplits(
            (spec("files-3", 0, 8, True), spec("files-4", 0, 24, True), spec("payments-9", 0, 22))
        ),
        Epoch(budget=1, growth=4),
        Rescale(9, Redistribution.UNION),
        Epoch(budget=1, growth=0),
        Epoch(budget=1, growth=3),
        DiscoverSplits((spec("payments-10", 17, 39),)),
        Epoch(
            budget=2,
            growth=2,
            failures=(
                (0, RegionFailure.TIMEOUT),
                (2, RegionFailure.CRASH),
                (3, RegionFailure.CRASH),
                (4, RegionFailure.DECLINE),
                (5, RegionFailure.DECLINE),
            ),
        ),
        Epoch(budget=6, growth=0),
        DiscoverSplits((spec("clicks-2", 15, 40), spec("payments-11", 0, 37), spec("payments-12", 0, 21))),
        Epoch(budget=5, growth=1, failures=((0, RegionFailure.CRASH),)),
        Epoch(budget=3, growth=2),
    ),
)
GLOBAL_ONLY_WEIGHTED = SimConfig(strategy="weighted", max_consecutive_failures=0)


def test_the_shrunk_simulator_run_keeps_every_split_with_one_owner() -> None:
    """Rule 1.1 end to end: the replayed sequence breaks no rule, and payments-9 has one reader."""
    sim = Simulator(GLOBAL_ONLY_WEIGHTED, SHRUNK)
    result = sim.run()
    assert result.ok, [str(v) for v in result.violations]
    ctx = sim.context
    assert isinstance(ctx, ReaderStateContext)
    assert readers_holding(ctx, "payments-9") == [sim.enumerator.owner_of("payments-9")]
    assert (
        check_reader_views(sim.enumerator.assignment(), {r: v.keys() for r, v in ctx.reader_splits.items()})
        == []
    )


def test_the_seeded_run_that_found_it_keeps_every_invariant() -> None:
    """The property test's failing example (seed 0), replayed."""
    config = SimConfig(
        readers=6,
        splits=7,
        steps=60,
        failure_rate=0.375,
        seed=0,
        strategy="weighted",
        max_consecutive_failures=0,
    )
    result = run_scenario(config)
    assert result.ok, [str(v) for v in result.violations]
