"""The protocol section 6 invariant checks: each rule found when broken, silent when it holds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitkeeper.core.invariants import (
    ViolationKind,
    check_balance,
    check_enumerator_state,
    check_finished_not_assigned,
    check_ownership,
    check_ref_chains,
    check_sink_offsets,
    check_sink_ranges,
    check_subscriptions,
    count_spread,
    raise_if_violations,
    ref_chain_depths,
    weighted_deviations,
)
from splitkeeper.core.types import Assignment, EnumeratorSnapshot, Split
from splitkeeper.errors import InvariantViolation


def s(name: str, sub: str = "t") -> Split:
    return Split(name, sub)


def kinds(violations) -> list[ViolationKind]:
    return [v.kind for v in violations]


def test_split_owned_by_two_readers_or_reader_and_pool_is_reported_with_its_places():
    state = Assignment(readers={0: (s("a"), s("b")), 1: (s("b"),)}, pool=(s("a"),))
    violations = check_ownership(state)
    assert kinds(violations) == [ViolationKind.OWNED_MORE_THAN_ONCE] * 2
    assert violations[0].split_ids == ("a",) and "pool, reader 0" in violations[0].detail
    assert violations[1].split_ids == ("b",) and "reader 0, reader 1" in violations[1].detail


def test_known_live_split_missing_everywhere_is_reported_as_not_owned():
    state = EnumeratorSnapshot(checkpoint_id=1, parallelism=1, assignments={0: (s("a"),)})
    violations = check_ownership(state, known_live={"a", "b", "c"})
    assert kinds(violations) == [ViolationKind.NOT_OWNED]
    assert violations[0].split_ids == ("b", "c")
    assert check_ownership(state, known_live={"a"}) == []


def test_finished_split_still_assigned_is_reported_and_snapshot_finished_is_the_default():
    snap = EnumeratorSnapshot(
        checkpoint_id=1, parallelism=1, assignments={0: (s("a"),)}, pool=(s("b"),), finished=frozenset({"b"})
    )
    assert [v.split_ids for v in check_finished_not_assigned(snap)] == [("b",)]
    assert check_finished_not_assigned(snap, finished={"zzz"}) == []


def test_split_of_removed_subscription_is_reported():
    state = Assignment(readers={0: (s("a-1", "a"), s("b-1", "b"))})
    violations = check_subscriptions(state, {"a"})
    assert kinds(violations) == [ViolationKind.REMOVED_SUBSCRIPTION] and violations[0].split_ids == ("b-1",)


def test_count_balance_within_one_including_readers_that_own_nothing():
    state = Assignment(readers={0: (s("a"), s("b")), 1: (s("c"),)})
    assert check_balance(state) == []
    violations = check_balance(state, readers=[0, 1, 2])
    assert kinds(violations) == [ViolationKind.UNBALANCED]
    assert "differ by 2 (reader 0 has 2, reader 2 has 0)" in violations[0].detail
    assert count_spread({0: 5, 1: 3}) == 2 and count_spread({}) == 0


def test_weighted_balance_allows_one_split_weight_from_the_fair_share():
    weights = {"big": 2.0, "x": 1.0, "y": 1.0, "z": 1.0, "w": 1.0}  # total 6, fair share 3 each
    ok = Assignment(readers={0: (s("big"),), 1: (s("x"), s("y"), s("z"), s("w"))})
    assert check_balance(ok, weights=weights) == []
    bad = Assignment(readers={0: (s("big"), s("x"), s("y"), s("z"), s("w")), 1: ()})
    violations = check_balance(bad, weights=weights)  # 6 vs 0: both 3 from fair, more than weight 2
    assert kinds(violations) == [ViolationKind.WEIGHT_UNBALANCED] * 2
    assert "reader 0 weighted load 6 is +3 from its fair share" in violations[0].detail
    # capacity 3:1 makes the 8-weight load's fair shares 6 and 2
    assert weighted_deviations({0: 6.0, 1: 2.0}, {0: 3.0, 1: 1.0}) == {0: 0.0, 1: 0.0}


def test_ref_chain_deeper_than_max_consecutive_failures_is_reported():
    refs = {100: set(), 101: {100}, 102: {101}, 103: {102}}
    assert ref_chain_depths(refs) == {100: 0, 101: 1, 102: 2, 103: 3}
    assert check_ref_chains(refs, 3) == []
    violations = check_ref_chains(refs, 2)
    assert kinds(violations) == [ViolationKind.REF_CHAIN_TOO_DEEP]
    assert "checkpoint 103 has a ref chain of depth 3; max_consecutive_failures=2" in violations[0].detail


def test_ref_to_a_checkpoint_retention_deleted_or_to_a_later_one_is_reported():
    violations = check_ref_chains({101: {100}, 102: {103}, 103: set()}, 5)
    assert kinds(violations) == [ViolationKind.REF_MISSING, ViolationKind.REF_NOT_EARLIER]
    assert "refers to checkpoint 100, which is not kept" in violations[0].detail


def test_sink_offsets_contiguous_and_unique_from_start_to_committed():
    records = [("p0", o) for o in range(5, 10)] + [("p1", o) for o in range(0, 3)]
    assert check_sink_offsets(records, {"p0": 5}, {"p0": 10, "p1": 3}) == []


def test_sink_offsets_gap_duplicate_outside_and_unknown_split_are_each_reported():
    records = [("p0", 0), ("p0", 1), ("p0", 1), ("p0", 4), ("p0", 12), ("px", 0)]
    violations = check_sink_offsets(records, {}, {"p0": 5})
    by_kind = {v.kind: v for v in violations}
    assert set(by_kind) == {
        ViolationKind.OFFSET_DUPLICATE,
        ViolationKind.OFFSET_UNEXPECTED,
        ViolationKind.OFFSET_MISSING,
    }
    assert "written more than once: 1" in by_kind[ViolationKind.OFFSET_DUPLICATE].detail
    assert "2 offset(s) missing in [0, 5): 2-3" in by_kind[ViolationKind.OFFSET_MISSING].detail
    unexpected = [v.detail for v in violations if v.kind is ViolationKind.OFFSET_UNEXPECTED]
    assert any("outside [0, 5): 12" in d for d in unexpected)
    assert any("split px: 1 sink record(s) but no committed position" in d for d in unexpected)


def test_committed_split_with_no_sink_records_is_all_missing():
    violations = check_sink_offsets([], {}, {"p0": 3})
    assert kinds(violations) == [ViolationKind.OFFSET_MISSING]


def test_check_enumerator_state_combines_rules_and_raise_if_violations_lists_them():
    snap = EnumeratorSnapshot(
        checkpoint_id=1,
        parallelism=2,
        assignments={0: (s("a"), s("b"), s("c")), 1: (s("b-x", "b"),)},
        subscriptions=frozenset({"t"}),
    )
    violations = check_enumerator_state(snap, balanced=True)
    assert kinds(violations) == [ViolationKind.REMOVED_SUBSCRIPTION, ViolationKind.UNBALANCED]
    with pytest.raises(
        InvariantViolation, match=r"restart: 2 invariant violation\(s\): removed_subscription"
    ) as info:
        raise_if_violations(violations, "restart")
    assert info.value.params["violations"] == tuple(violations)
    raise_if_violations([])  # nothing to raise


def test_sink_ranges_of_file_lines_tile_start_to_committed_exactly():
    lines = [("f", 0, 17), ("f", 17, 40), ("f", 40, 41), ("f", 41, 90)]  # byte ranges of lines
    assert check_sink_ranges(lines, {}, {"f": 90}) == []
    assert check_sink_ranges(lines[1:], {"f": 17}, {"f": 90}) == []


def test_sink_ranges_overlap_gap_and_record_past_the_committed_position_are_reported():
    records = [("f", 0, 17), ("f", 10, 40), ("f", 50, 60), ("f", 60, 95)]
    by_kind = {v.kind: v.detail for v in check_sink_ranges(records, {}, {"f": 90})}
    assert by_kind == {
        ViolationKind.OFFSET_DUPLICATE: "split f: offsets written more than once: 10-16",
        ViolationKind.OFFSET_UNEXPECTED: "split f: offsets outside [0, 90): 90-94",
        ViolationKind.OFFSET_MISSING: "split f: 10 offset(s) missing in [0, 90): 40-49",
    }


@settings(max_examples=200, deadline=None)
@given(
    widths=st.lists(st.integers(1, 9), min_size=1, max_size=30),
    start=st.integers(0, 50),
    drop=st.integers(0, 29),
    data=st.randoms(use_true_random=False),
)
def test_sink_ranges_property_tiling_passes_dropping_or_repeating_a_record_is_found(
    widths, start, drop, data
):
    bounds = [start]
    for w in widths:
        bounds.append(bounds[-1] + w)
    records = [("s", a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
    end = bounds[-1]
    shuffled = records[:]
    data.shuffle(shuffled)
    assert check_sink_ranges(shuffled, {"s": start}, {"s": end}) == []

    victim = records[drop % len(records)]
    width = victim[2] - victim[1]
    missing = check_sink_ranges([r for r in records if r != victim], {"s": start}, {"s": end})
    assert kinds(missing) == [ViolationKind.OFFSET_MISSING]
    assert f"{width} offset(s) missing" in missing[0].detail
    assert kinds(check_sink_ranges(records + [victim], {"s": start}, {"s": end})) == [
        ViolationKind.OFFSET_DUPLICATE
    ]
