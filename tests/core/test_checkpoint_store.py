"""CheckpointStore contract (protocol rules 2.1, 2.7).

``CheckpointStoreContract`` holds the tests every store must pass; a store's
test class subclasses it and overrides ``make_store``. ``TestInMemoryCheckpointStore``
runs it on the core store, ``tests/state/test_checkpoint_store_contract.py`` on the
Delta state store (``DeltaStateStore``).
"""

from __future__ import annotations

import pytest

from splitkeeper.core.checkpoint import CheckpointStore
from splitkeeper.core.types import CheckpointKind, CompletedCheckpoint, RegionOutcome, RegionState
from splitkeeper.errors import CheckpointError, InvalidParameterError


def global_checkpoint(checkpoint_id: int, parallelism: int = 2) -> CompletedCheckpoint:
    return CompletedCheckpoint(
        checkpoint_id=checkpoint_id,
        kind=CheckpointKind.GLOBAL,
        parallelism=parallelism,
        regions={r: RegionState(r, operator_state=(f"{checkpoint_id}/{r}",)) for r in range(parallelism)},
    )


def regional_checkpoint(
    checkpoint_id: int, refs: dict[int, tuple[int, int]], parallelism: int = 2, consecutive: int = 1
) -> CompletedCheckpoint:
    """``refs`` maps failed region -> (ref_checkpoint_id, ref_depth)."""
    regions = {}
    for r in range(parallelism):
        if r in refs:
            ref, depth = refs[r]
            regions[r] = RegionState(r, ref_checkpoint_id=ref, outcome=RegionOutcome.DECLINE, ref_depth=depth)
        else:
            regions[r] = RegionState(r, operator_state=(f"{checkpoint_id}/{r}",))
    return CompletedCheckpoint(
        checkpoint_id=checkpoint_id,
        kind=CheckpointKind.REGIONAL,
        parallelism=parallelism,
        regions=regions,
        consecutive_regional=consecutive,
    )


class CheckpointStoreContract:
    """Every CheckpointStore implementation passes these."""

    def make_store(self) -> CheckpointStore:
        raise NotImplementedError

    def chain(self) -> CheckpointStore:
        """100 (global) <- 101 (region 1 ref 100) <- 102 (region 0 ref 101)."""
        store = self.make_store()
        store.add(global_checkpoint(100))
        store.add(regional_checkpoint(101, {1: (100, 1)}))
        store.add(regional_checkpoint(102, {0: (101, 1)}, consecutive=2))
        return store

    def test_empty_store_has_no_latest_and_no_ids(self) -> None:
        store = self.make_store()
        assert store.latest() is None
        assert store.latest_global() is None
        assert store.ids() == []
        assert len(store) == 0

    def test_added_checkpoints_are_found_by_id_and_latest_is_the_newest(self) -> None:
        store = self.chain()
        assert store.ids() == [100, 101, 102]
        assert store.get(101) == regional_checkpoint(101, {1: (100, 1)})
        assert store.latest() == store.get(102)
        assert store.latest_global() == store.get(100)
        assert 101 in store and 99 not in store
        assert len(store) == 3

    def test_get_of_an_unknown_id_names_it_and_the_available_ids(self) -> None:
        store = self.chain()
        with pytest.raises(CheckpointError) as err:
            store.get(7)
        assert err.value.message == "checkpoint 7 is not in the store (available: [100, 101, 102])"
        assert err.value.params["checkpoint_id"] == 7

    def test_ref_chain_lists_every_transitively_referenced_checkpoint_newest_first(self) -> None:
        store = self.chain()
        assert store.ref_chain(102) == [102, 101, 100]
        assert store.ref_chain(101) == [101, 100]
        assert store.ref_chain(100) == [100]

    def test_chain_depth_is_the_whole_chains_not_a_regions(self) -> None:
        store = self.chain()
        # region 1 fell back once (its own ref depth 1), but through 102 -> 101 -> 100: 3 hops
        store.add(regional_checkpoint(103, {0: (102, 2), 1: (102, 1)}, consecutive=3))
        assert [store.chain_depth(i) for i in (100, 101, 102, 103)] == [0, 1, 2, 3]

    def test_ids_must_strictly_increase(self) -> None:
        store = self.chain()
        with pytest.raises(CheckpointError) as err:
            store.add(global_checkpoint(102))
        assert (
            err.value.message
            == "checkpoint 102 cannot be added after checkpoint 102: ids must strictly increase"
        )
        with pytest.raises(CheckpointError, match="checkpoint 50 cannot be added after checkpoint 102"):
            store.add(global_checkpoint(50))

    def test_a_checkpoint_whose_ref_is_not_stored_is_refused(self) -> None:
        store = self.make_store()
        store.add(global_checkpoint(100))
        with pytest.raises(CheckpointError) as err:
            store.add(regional_checkpoint(102, {1: (101, 1)}))
        assert err.value.message == (
            "checkpoint 102 references checkpoints [101] that are not in the store (available: [100]); "
            "adding it would break its ref chain"
        )
        assert store.ids() == [100]

    def test_an_aborted_checkpoint_is_not_stored(self) -> None:
        store = self.make_store()
        aborted = CompletedCheckpoint(checkpoint_id=5, kind=CheckpointKind.ABORTED, parallelism=1)
        with pytest.raises(
            CheckpointError, match="checkpoint 5 was aborted; only completed checkpoints are stored"
        ):
            store.add(aborted)
        with pytest.raises(InvalidParameterError, match="completed=.* is not allowed: a CompletedCheckpoint"):
            store.add("checkpoint 5")  # type: ignore[arg-type]

    def test_retain_keeps_the_whole_chain_of_the_latest(self) -> None:
        store = self.chain()
        assert store.retain(1) == []
        assert store.ids() == [100, 101, 102]
        store.add(global_checkpoint(103))
        assert store.retain(1) == [100, 101, 102]
        assert store.ids() == [103]
        with pytest.raises(CheckpointError, match="checkpoint 101 is not in the store"):
            store.get(101)


class TestInMemoryCheckpointStore(CheckpointStoreContract):
    def make_store(self) -> CheckpointStore:
        return CheckpointStore()
