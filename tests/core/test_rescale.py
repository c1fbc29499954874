"""Operator-state redistribution on rescale, and the P=4 -> 2 -> 1 walk-through of protocol rule 2.8."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitkeeper.core.checkpoint import (
    CheckpointConfig,
    CheckpointMode,
    CheckpointStore,
    RegionalCheckpointCoordinator,
)
from splitkeeper.core.rescale import (
    Redistribution,
    even_split_sizes,
    redistribute,
    reported_splits,
    restore_regions,
)
from splitkeeper.core.types import (
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    ReaderInfo,
    RegionOutcome,
    RegionState,
    Split,
)
from splitkeeper.errors import CheckpointError, InvalidParameterError

EVEN = Redistribution.EVEN_SPLIT
UNION = Redistribution.UNION
#: The operator state of each subtask at P=4 in the example of protocol rule 2.8 (ckp100).
RULE_2_8_P4 = [["A0", "A1"], ["B0", "B1"], ["C0", "C1"], ["D0", "D1"]]


# ------------------------------------------------------------------ redistribute()


def test_even_split_p4_to_p2_cuts_the_concatenation_into_contiguous_halves() -> None:
    assert redistribute(RULE_2_8_P4, 2, EVEN) == [["A0", "A1", "B0", "B1"], ["C0", "C1", "D0", "D1"]]


def test_even_split_to_p1_concatenates_in_subtask_order() -> None:
    assert redistribute([["E0", "E1", "E2", "E3"], ["C0", "C1", "D0", "D1"]], 1, EVEN) == [
        ["E0", "E1", "E2", "E3", "C0", "C1", "D0", "D1"]
    ]


def test_even_split_gives_the_first_len_mod_p_sublists_one_more_element() -> None:
    assert redistribute([["a", "b", "c"], ["d", "e"]], 3, EVEN) == [["a", "b"], ["c", "d"], ["e"]]
    assert even_split_sizes(5, 3) == [2, 2, 1]
    assert even_split_sizes(7, 4) == [2, 2, 2, 1]
    assert even_split_sizes(1, 3) == [1, 0, 0]


def test_even_split_at_unchanged_parallelism_moves_nothing() -> None:
    uneven = [["A0"], ["B0", "B1", "B2"]]
    assert redistribute(uneven, 2, EVEN) == [["A0"], ["B0", "B1", "B2"]]


def test_scale_up_leaves_trailing_subtasks_empty_when_state_is_short() -> None:
    assert redistribute([["x", "y"]], 3, EVEN) == [["x"], ["y"], []]


def test_union_gives_every_new_subtask_the_full_concatenation() -> None:
    full = ["A0", "A1", "B0", "B1", "C0", "C1", "D0", "D1"]
    assert redistribute(RULE_2_8_P4, 2, UNION) == [full, full]
    assert redistribute(RULE_2_8_P4, 4, UNION) == [full, full, full, full]


def test_redistribute_returns_new_lists_and_leaves_the_input_alone() -> None:
    states = [["a"], ["b"]]
    result = redistribute(states, 2, EVEN)
    result[0].append("z")
    assert states == [["a"], ["b"]]


@pytest.mark.parametrize(
    ("new_parallelism", "message"),
    [
        (0, "new_parallelism=0 is not allowed: an integer >= 1"),
        (-2, "new_parallelism=-2 is not allowed: an integer >= 1"),
        (1.5, "new_parallelism=1.5 is not allowed: an integer >= 1"),
    ],
)
def test_redistribute_rejects_a_bad_parallelism(new_parallelism: int, message: str) -> None:
    with pytest.raises(InvalidParameterError) as err:
        redistribute(RULE_2_8_P4, new_parallelism, EVEN)
    assert err.value.message == message


def test_redistribute_rejects_an_unknown_mode() -> None:
    with pytest.raises(
        InvalidParameterError, match="mode='even' is not allowed: Redistribution.EVEN_SPLIT or"
    ):
        redistribute(RULE_2_8_P4, 2, "even")  # type: ignore[arg-type]


@given(
    states=st.lists(st.lists(st.integers(), max_size=6), min_size=1, max_size=6),
    new_parallelism=st.integers(min_value=1, max_value=8),
)
def test_even_split_property_order_preserved_sizes_within_one_larger_first(
    states: list[list[int]], new_parallelism: int
) -> None:
    result = redistribute(states, new_parallelism, EVEN)
    assert len(result) == new_parallelism
    assert [x for part in result for x in part] == [x for s in states for x in s]
    if new_parallelism != len(states):
        sizes = [len(part) for part in result]
        assert sizes == even_split_sizes(sum(sizes), new_parallelism)
        assert max(sizes) - min(sizes) <= 1
        assert sizes == sorted(sizes, reverse=True)


@given(
    states=st.lists(st.lists(st.integers(), max_size=6), min_size=1, max_size=6),
    new_parallelism=st.integers(min_value=1, max_value=8),
)
def test_union_property_every_subtask_gets_everything(states: list[list[int]], new_parallelism: int) -> None:
    full = [x for s in states for x in s]
    assert redistribute(states, new_parallelism, UNION) == [full] * new_parallelism


# ------------------------------------------------------------------ restore_regions(): splits even-split


def _checkpoint(parallelism: int, splits_per_region: int = 1) -> CompletedCheckpoint:
    regions = {
        r: RegionState(
            region_id=r,
            splits=tuple(Split(f"t-{r}-{i}", position=10 * r + i) for i in range(splits_per_region)),
            operator_state=(f"s{r}",),
        )
        for r in range(parallelism)
    }
    return CompletedCheckpoint(
        checkpoint_id=7, kind=CheckpointKind.GLOBAL, parallelism=parallelism, regions=regions
    )


def test_splits_are_even_split_on_rescale_even_when_operator_state_is_union() -> None:
    restored = restore_regions(_checkpoint(4), 2, UNION)
    assert [r.operator_state for r in restored] == [("s0", "s1", "s2", "s3")] * 2
    assert [[s.split_id for s in r.splits] for r in restored] == [["t-0-0", "t-1-0"], ["t-2-0", "t-3-0"]]
    every = [s.split_id for r in restored for s in r.splits]
    assert len(every) == len(set(every)) == 4
    assert [r.source_regions for r in restored] == [frozenset({0, 1, 2, 3})] * 2


def test_reported_splits_keep_positions_and_feed_reader_infos() -> None:
    restored = restore_regions(_checkpoint(3, splits_per_region=2), 2, EVEN)
    assert reported_splits(restored) == [
        ReaderInfo(
            reader_id=0,
            reported_splits=(
                Split("t-0-0", position=0),
                Split("t-0-1", position=1),
                Split("t-1-0", position=10),
            ),
        ),
        ReaderInfo(
            reader_id=1,
            reported_splits=(
                Split("t-1-1", position=11),
                Split("t-2-0", position=20),
                Split("t-2-1", position=21),
            ),
        ),
    ]
    assert [r.source_regions for r in restored] == [frozenset({0, 1}), frozenset({1, 2})]


def test_restore_regions_refuses_a_checkpoint_missing_a_region_state() -> None:
    broken = CompletedCheckpoint(
        checkpoint_id=9,
        kind=CheckpointKind.GLOBAL,
        parallelism=3,
        regions={0: RegionState(0), 2: RegionState(2)},
    )
    with pytest.raises(CheckpointError) as err:
        restore_regions(broken, 2)
    assert err.value.message == (
        "checkpoint 9 has region states for [0, 2], expected one for each of regions 0..2; "
        "it cannot be restored"
    )


# ------------------------------------------------------------- protocol rule 2.8 walk-through (coordinator)


def _ops(*names: str) -> tuple[str, ...]:
    return tuple(names)


def _walkthrough_start(config: CheckpointConfig, mode: Redistribution) -> RegionalCheckpointCoordinator:
    """ckp100 (GLOBAL) at P=4, then a failover restores it at P=2."""
    coordinator = RegionalCheckpointCoordinator(config, 4, CheckpointStore())
    pending = coordinator.trigger(100, now=0.0)
    for region, ops in enumerate(RULE_2_8_P4):
        pending.acknowledge(
            region,
            RegionState(region, splits=(Split(f"t-{region}", position=100),), operator_state=tuple(ops)),
        )
    assert coordinator.complete(pending).kind is CheckpointKind.GLOBAL
    coordinator.restore(coordinator.store.get(100), 2, mode)
    return coordinator


def test_rule_2_8_even_split_walkthrough_p4_to_p2_to_p1() -> None:
    config = CheckpointConfig(max_consecutive_failures=2, max_failure_ratio=1.0)
    coordinator = RegionalCheckpointCoordinator(config, 4, CheckpointStore())
    pending = coordinator.trigger(100, now=0.0)
    for region, ops in enumerate(RULE_2_8_P4):
        pending.acknowledge(region, RegionState(region, operator_state=tuple(ops)))
    assert coordinator.complete(pending).kind is CheckpointKind.GLOBAL
    store = coordinator.store

    # First downscale: P=4 -> P=2 from ckp100.
    at_p2 = coordinator.restore(store.get(100), 2, EVEN)
    assert at_p2.rescaled and at_p2.previous_parallelism == 4 and at_p2.parallelism == 2
    assert [r.operator_state for r in at_p2.regions] == [
        _ops("A0", "A1", "B0", "B1"),
        _ops("C0", "C1", "D0", "D1"),
    ]

    # ckp101 (REGIONAL): subtask 0 acks [E0..E3]; subtask 1 declines, falls back to ckp100: [C0,C1,D0,D1].
    pending = coordinator.trigger(101, now=1.0)
    pending.acknowledge(0, RegionState(0, operator_state=_ops("E0", "E1", "E2", "E3")))
    pending.decline(1, "region 1 failed")
    ckp101 = coordinator.complete(pending)
    assert ckp101.kind is CheckpointKind.REGIONAL
    assert ckp101.completed is not None
    assert ckp101.completed.regions[0].operator_state == _ops("E0", "E1", "E2", "E3")
    assert ckp101.completed.regions[0].ref_checkpoint_id is None
    assert ckp101.completed.regions[1].operator_state == _ops("C0", "C1", "D0", "D1")
    assert ckp101.completed.regions[1].ref_checkpoint_id == 100
    assert ckp101.completed.consecutive_regional == 1

    # Second downscale: P=2 -> P=1 from ckp101.
    at_p1 = coordinator.restore(store.get(101), 1, EVEN)
    assert at_p1.consecutive_regional == 1
    assert [r.operator_state for r in at_p1.regions] == [_ops("E0", "E1", "E2", "E3", "C0", "C1", "D0", "D1")]

    # ckp102 (REGIONAL): subtask 0 declines and falls back to ckp101's redistributed state, ref=101.
    pending = coordinator.trigger(102, now=2.0)
    pending.decline(0, "region 0 failed")
    ckp102 = coordinator.complete(pending)
    assert ckp102.kind is CheckpointKind.REGIONAL
    assert ckp102.completed is not None
    assert ckp102.completed.regions[0].operator_state == _ops("E0", "E1", "E2", "E3", "C0", "C1", "D0", "D1")
    assert ckp102.completed.regions[0].ref_checkpoint_id == 101
    assert ckp102.completed.consecutive_regional == 2
    assert store.ref_chain(102) == [102, 101, 100]
    assert store.chain_depth(102) == 2
    # 101 consecutive=1 -> 102 consecutive=2 across the restore, so ckp103 is forced global.
    assert coordinator.trigger(103, now=3.0).forced_global


def test_rule_2_8_union_walkthrough_p4_to_p2_to_p1() -> None:
    config = CheckpointConfig(max_consecutive_failures=2, max_failure_ratio=1.0)
    coordinator = RegionalCheckpointCoordinator(config, 4, CheckpointStore())
    pending = coordinator.trigger(100, now=0.0)
    for region, ops in enumerate(RULE_2_8_P4):
        pending.acknowledge(region, RegionState(region, operator_state=tuple(ops)))
    coordinator.complete(pending)
    store = coordinator.store
    full = _ops("A0", "A1", "B0", "B1", "C0", "C1", "D0", "D1")
    e0_e7 = tuple(f"E{i}" for i in range(8))

    at_p2 = coordinator.restore(store.get(100), 2, UNION)
    assert [r.operator_state for r in at_p2.regions] == [full, full]

    pending = coordinator.trigger(101, now=1.0)
    pending.acknowledge(0, RegionState(0, operator_state=e0_e7))
    pending.decline(1)
    ckp101 = coordinator.complete(pending)
    assert ckp101.completed is not None
    assert ckp101.completed.regions[0].operator_state == e0_e7
    assert ckp101.completed.regions[1].operator_state == full
    assert ckp101.completed.regions[1].ref_checkpoint_id == 100

    at_p1 = coordinator.restore(store.get(101), 1, UNION)
    assert [r.operator_state for r in at_p1.regions] == [e0_e7 + full]

    pending = coordinator.trigger(102, now=2.0)
    pending.decline(0)
    ckp102 = coordinator.complete(pending)
    assert ckp102.completed is not None
    assert ckp102.completed.regions[0].operator_state == e0_e7 + full
    assert ckp102.completed.regions[0].ref_checkpoint_id == 101
    assert store.ref_chain(102) == [102, 101, 100]


def test_rule_2_8_at_p1_a_decline_is_aborted_with_the_default_failure_ratio() -> None:
    coordinator = _walkthrough_start(CheckpointConfig(), EVEN)
    pending = coordinator.trigger(101, now=1.0)
    pending.acknowledge(0, RegionState(0, operator_state=_ops("E0", "E1", "E2", "E3")))
    pending.decline(1)
    assert coordinator.complete(pending).kind is CheckpointKind.REGIONAL  # 1 of 2 = 0.5 is allowed
    coordinator.restore(coordinator.store.get(101), 1, EVEN)
    assert coordinator.mode is CheckpointMode.GLOBAL_ONLY
    assert "max_failure_ratio=0.5 lets no region fail at parallelism 1" in coordinator.mode_reason
    pending = coordinator.trigger(102, now=2.0)
    pending.decline(0)
    result = coordinator.complete(pending)
    assert result.kind is CheckpointKind.ABORTED
    assert coordinator.store.ids() == [100, 101]


def test_restored_assignment_is_the_fallback_until_the_first_checkpoint_at_the_new_parallelism() -> None:
    coordinator = _walkthrough_start(CheckpointConfig(), EVEN)
    # Before any checkpoint at P=2, region 1 falls back to its redistributed state, not ckp100's region 1.
    fallback = coordinator.fallback_state(1)
    assert fallback is not None
    assert fallback.operator_state == _ops("C0", "C1", "D0", "D1")
    assert [s.split_id for s in fallback.splits] == ["t-2", "t-3"]
    assert fallback.ref_checkpoint_id == 100
    assert fallback.ref_depth == 1
    assert coordinator.pinned_checkpoint_ids == frozenset({100})

    # The first checkpoint at P=2 completes globally: from now on the fallback is its state.
    pending = coordinator.trigger(101, now=1.0)
    pending.acknowledge(0, RegionState(0, operator_state=_ops("F0")))
    pending.acknowledge(1, RegionState(1, operator_state=_ops("G0")))
    coordinator.complete(pending)
    after = coordinator.fallback_state(1)
    assert after is not None
    assert (after.operator_state, after.ref_checkpoint_id, after.ref_depth) == (_ops("G0"), 101, 1)


def test_enumerator_is_told_the_split_ids_of_the_redistributed_fallback_state() -> None:
    coordinator = _walkthrough_start(CheckpointConfig(), EVEN)
    seen: list[dict[int, tuple[str, ...]]] = []

    def snapshot(fallback):  # noqa: ANN001, ANN202
        seen.append({r: tuple(ids) for r, ids in fallback.items()})
        return EnumeratorSnapshot(checkpoint_id=101, parallelism=2)

    pending = coordinator.trigger(101, now=1.0)
    pending.acknowledge(0, RegionState(0, splits=(Split("t-0", position=150), Split("t-1", position=170))))
    pending.decline(1)
    result = coordinator.complete(pending, snapshot)
    assert seen == [{1: ("t-2", "t-3")}]
    assert result.completed is not None
    assert result.completed.regions[1].splits == (Split("t-2", position=100), Split("t-3", position=100))
    assert result.completed.regions[1].outcome is RegionOutcome.DECLINE


def test_restore_without_rescale_keeps_each_regions_own_state_and_depth() -> None:
    config = CheckpointConfig(max_consecutive_failures=3)
    coordinator = RegionalCheckpointCoordinator(config, 2, CheckpointStore())
    pending = coordinator.trigger(1, now=0.0)
    pending.acknowledge(0, RegionState(0, operator_state=_ops("a")))
    pending.acknowledge(1, RegionState(1, operator_state=_ops("b", "c", "d")))
    coordinator.complete(pending)
    pending = coordinator.trigger(2, now=1.0)
    pending.acknowledge(0, RegionState(0, operator_state=_ops("a2")))
    pending.decline(1)
    coordinator.complete(pending)  # region 1 at depth 1 in ckp2

    restored = coordinator.restore(coordinator.store.get(2))
    assert not restored.rescaled
    assert [r.operator_state for r in restored.regions] == [_ops("a2"), _ops("b", "c", "d")]
    fallback0, fallback1 = coordinator.fallback_state(0), coordinator.fallback_state(1)
    assert fallback0 is not None and fallback1 is not None
    assert (fallback0.ref_checkpoint_id, fallback0.ref_depth) == (2, 1)
    assert (fallback1.ref_checkpoint_id, fallback1.ref_depth) == (2, 2)


def test_a_second_restore_replaces_the_first() -> None:
    coordinator = _walkthrough_start(CheckpointConfig(), EVEN)
    coordinator.restore(coordinator.store.get(100), 1, EVEN)
    assert coordinator.parallelism == 1
    fallback = coordinator.fallback_state(0)
    assert fallback is not None
    assert fallback.operator_state == _ops("A0", "A1", "B0", "B1", "C0", "C1", "D0", "D1")
    assert coordinator.fallback_state(1) is None
