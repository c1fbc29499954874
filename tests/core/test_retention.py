"""Retention never breaks a ref chain (protocol rule 2.7), driven through the coordinator."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from splitkeeper.core.checkpoint import (
    CheckpointConfig,
    CheckpointResult,
    CheckpointStore,
    RegionalCheckpointCoordinator,
)
from splitkeeper.core.types import CheckpointKind, RegionState
from splitkeeper.errors import CheckpointError, InvalidParameterError


def run(
    coordinator: RegionalCheckpointCoordinator, checkpoint_id: int, declines: Collection[int] = ()
) -> CheckpointResult:
    pending = coordinator.trigger(checkpoint_id, now=float(checkpoint_id))
    for region in range(coordinator.parallelism):
        if region in declines:
            pending.decline(region)
        else:
            pending.acknowledge(region, RegionState(region, operator_state=(f"{checkpoint_id}/{region}",)))
    return coordinator.complete(pending)


def make(parallelism: int = 2, max_consecutive_failures: int = 2) -> RegionalCheckpointCoordinator:
    return RegionalCheckpointCoordinator(
        CheckpointConfig(max_consecutive_failures=max_consecutive_failures), parallelism, CheckpointStore()
    )


def test_keep_latest_one_keeps_a_whole_regional_chain() -> None:
    coordinator = make()
    run(coordinator, 100)
    run(coordinator, 101, declines={1})
    run(coordinator, 102, declines={1})
    assert coordinator.retain(1) == []
    assert coordinator.store.ids() == [100, 101, 102]


def test_after_a_global_checkpoint_keep_latest_one_deletes_the_old_chain() -> None:
    coordinator = make()
    run(coordinator, 100)
    run(coordinator, 101, declines={1})
    run(coordinator, 102, declines={1})
    assert run(coordinator, 103).kind is CheckpointKind.GLOBAL
    assert coordinator.retain(1) == [100, 101, 102]
    assert coordinator.store.ids() == [103]


def test_keep_latest_two_keeps_their_refs_and_deletes_older_unreferenced_ones() -> None:
    coordinator = make(max_consecutive_failures=3)
    run(coordinator, 100)
    run(coordinator, 101)
    run(coordinator, 102, declines={0})  # ref 101
    run(coordinator, 103, declines={1})  # ref 102
    assert coordinator.retain(2) == [100]
    assert coordinator.store.ids() == [101, 102, 103]


def test_retention_keeps_a_restored_older_checkpoint_that_fallback_states_refer_to() -> None:
    coordinator = make()
    run(coordinator, 100)
    run(coordinator, 101)
    run(coordinator, 102)
    coordinator.restore(coordinator.store.get(100))
    assert coordinator.pinned_checkpoint_ids == frozenset({100})
    assert coordinator.retain(1) == [101]
    assert coordinator.store.ids() == [100, 102]
    result = run(coordinator, 103, declines={1})
    assert result.kind is CheckpointKind.REGIONAL
    assert result.completed is not None and result.completed.regions[1].ref_checkpoint_id == 100


def test_store_retention_without_the_pins_would_break_the_next_regional_checkpoint() -> None:
    coordinator = make()
    run(coordinator, 100)
    run(coordinator, 101)
    coordinator.restore(coordinator.store.get(100))
    assert coordinator.store.retain(1) == [100]  # the store alone does not know about the restore
    pending = coordinator.trigger(102, now=102.0)
    pending.acknowledge(0, RegionState(0))
    pending.decline(1)
    asked: list[object] = []
    with pytest.raises(CheckpointError, match=r"checkpoint 102 references checkpoints \[100\] that are not"):
        coordinator.complete(pending, asked.append)  # type: ignore[arg-type]
    assert asked == []  # refused before the enumerator was asked for a snapshot
    assert coordinator.pending is pending  # nothing was committed


def test_chain_kept_by_retention_after_an_aborted_forced_global() -> None:
    coordinator = make()
    run(coordinator, 100)
    run(coordinator, 101, declines={1})
    run(coordinator, 102, declines={1})
    assert run(coordinator, 103, declines={1}).kind is CheckpointKind.ABORTED
    # the chain of 102 is full (2 hops): 104 is forced global too, and a failure aborts it
    assert run(coordinator, 104, declines={0}).kind is CheckpointKind.ABORTED
    assert coordinator.store.ref_chain(102) == [102, 101, 100]
    assert coordinator.retain(1) == []  # 102 is kept, and with it its chain
    assert coordinator.store.chain_depth(102) == 2
    assert run(coordinator, 105).kind is CheckpointKind.GLOBAL
    assert coordinator.retain(1) == [100, 101, 102]  # only what a restore of 105 reaches stays


def test_retain_rejects_keeping_nothing_and_unknown_pins() -> None:
    coordinator = make()
    run(coordinator, 100)
    with pytest.raises(InvalidParameterError) as err:
        coordinator.retain(0)
    assert err.value.message == "keep_latest=0 is not allowed: an integer >= 1"
    with pytest.raises(CheckpointError) as pinned:
        coordinator.store.retain(1, pinned=[42])
    assert pinned.value.message == "pinned checkpoints [42] are not in the store (available: [100])"
    assert coordinator.store.ids() == [100]
