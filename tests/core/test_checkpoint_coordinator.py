"""RegionalCheckpointCoordinator: global / regional / aborted decisions (protocol rules 2.1-2.6, 2.8, 2.9)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import pytest

from splitkeeper.core.checkpoint import (
    CheckpointConfig,
    CheckpointResult,
    CheckpointStore,
    PendingCheckpoint,
    PendingStatus,
    RegionalCheckpointCoordinator,
)
from splitkeeper.core.types import (
    CheckpointKind,
    EnumeratorSnapshot,
    RegionOutcome,
    RegionState,
    Split,
)
from splitkeeper.errors import CheckpointError, InvalidParameterError, ProtocolError


def state(region: int, checkpoint_id: int) -> RegionState:
    """The new state region ``region`` acknowledges checkpoint ``checkpoint_id`` with."""
    return RegionState(
        region_id=region,
        splits=(Split(f"t-{region}", position=checkpoint_id),),
        operator_state=(f"r{region}@{checkpoint_id}",),
    )


def make(parallelism: int = 4, **config: object) -> RegionalCheckpointCoordinator:
    return RegionalCheckpointCoordinator(CheckpointConfig(**config), parallelism, CheckpointStore())  # type: ignore[arg-type]


def run(
    coordinator: RegionalCheckpointCoordinator,
    checkpoint_id: int,
    declines: Collection[int] = (),
    *,
    final: bool = False,
) -> CheckpointResult:
    """Trigger ``checkpoint_id``; regions in ``declines`` decline, the others acknowledge."""
    pending = coordinator.trigger(checkpoint_id, final=final, now=float(checkpoint_id))
    for region in range(coordinator.parallelism):
        if region in declines:
            pending.decline(region, "snapshot failed")
        else:
            pending.acknowledge(region, state(region, checkpoint_id))
    return coordinator.complete(pending)


class RecordingEnumerator:
    """Stands in for the split enumerator: records every fallback mapping it is asked to correct for."""

    def __init__(self) -> None:
        self.calls: list[dict[int, tuple[str, ...]]] = []

    def snapshot_fn(self, checkpoint_id: int):  # noqa: ANN201
        def build(fallback: Mapping[int, Collection[str]]) -> EnumeratorSnapshot:
            self.calls.append({r: tuple(ids) for r, ids in fallback.items()})
            return EnumeratorSnapshot(checkpoint_id=checkpoint_id, parallelism=4)

        return build


# ------------------------------------------------------------------ global and regional


def test_all_regions_ack_gives_a_global_checkpoint_and_notifies_every_region() -> None:
    coordinator = make()
    enumerator = RecordingEnumerator()
    pending = coordinator.trigger(100, now=0.0)
    assert not pending.forced_global
    for region in range(4):
        pending.acknowledge(region, state(region, 100))
    result = coordinator.complete(pending, enumerator.snapshot_fn(100))
    assert result.kind is CheckpointKind.GLOBAL
    assert result.notify_complete == (0, 1, 2, 3)
    assert result.notify_partially_completed == ()
    assert result.notify_aborted == ()
    assert result.reason == "checkpoint 100 is global: all 4 regions acknowledged"
    assert enumerator.calls == [{}]
    assert result.completed is not None
    assert result.completed.enumerator == EnumeratorSnapshot(checkpoint_id=100, parallelism=4)
    assert result.completed.regions == {r: state(r, 100) for r in range(4)}
    assert coordinator.store.latest() == result.completed
    assert coordinator.consecutive_regional == 0
    assert pending.status is PendingStatus.COMPLETED
    assert coordinator.pending is None


def test_declined_region_falls_back_to_its_last_good_state_with_ref_and_only_acked_regions_commit() -> None:
    coordinator = make()
    run(coordinator, 100)
    enumerator = RecordingEnumerator()
    pending = coordinator.trigger(101, now=1.0)
    for region in (0, 1, 3):
        pending.acknowledge(region, state(region, 101))
    pending.decline(2, "executor lost")
    result = coordinator.complete(pending, enumerator.snapshot_fn(101))

    assert result.kind is CheckpointKind.REGIONAL
    assert result.completed is not None
    assert result.completed.regions[2] == RegionState(
        region_id=2,
        splits=(Split("t-2", position=100),),
        operator_state=("r2@100",),
        ref_checkpoint_id=100,
        outcome=RegionOutcome.DECLINE,
        ref_depth=1,
    )
    assert result.completed.regions[0] == state(0, 101)
    assert result.completed.failed_regions == (2,)
    assert result.completed.ref_checkpoint_ids == frozenset({100})
    assert result.completed.consecutive_regional == 1
    # protocol rule 2.5: side effects only for acknowledged regions; the failed one is "partially completed".
    assert result.notify_complete == (0, 1, 3)
    assert result.notify_partially_completed == (2,)
    # protocol rule 2.4: the enumerator learns which splits the failed region falls back to.
    assert enumerator.calls == [{2: ("t-2",)}]
    assert result.reason == (
        "checkpoint 101 is regional: region 2 fell back (region 2 -> 100); "
        "1 consecutive regional of max_consecutive_failures=3"
    )


def test_region_declining_twice_in_a_row_refers_to_the_latest_completed_checkpoint() -> None:
    coordinator = make(max_consecutive_failures=2)
    run(coordinator, 100)
    run(coordinator, 101, declines={1})
    result = run(coordinator, 102, declines={1})
    assert result.completed is not None
    fallen_back = result.completed.regions[1]
    assert fallen_back.ref_checkpoint_id == 101
    assert fallen_back.operator_state == ("r1@100",)
    assert fallen_back.ref_depth == 2
    assert coordinator.store.ref_chain(102) == [102, 101, 100]
    assert coordinator.store.chain_depth(102) == 2


def test_silent_region_is_marked_timeout_after_region_timeout_and_counts_as_failed() -> None:
    coordinator = make(region_timeout_s=30)
    run(coordinator, 100)
    pending = coordinator.trigger(101, now=1000.0)
    pending.acknowledge(0, state(0, 101))
    pending.acknowledge(1, state(1, 101))
    pending.acknowledge(3, state(3, 101))
    assert coordinator.expire(pending, now=1029.9) == ()
    with pytest.raises(ProtocolError) as err:
        coordinator.complete(pending)
    assert "region 2 neither acknowledged nor declined" in err.value.message
    assert coordinator.expire(pending, now=1030.0) == (2,)
    assert pending.outcomes[2] is RegionOutcome.TIMEOUT
    with pytest.raises(ProtocolError, match="region 2 already timed out of checkpoint 101"):
        pending.acknowledge(2, state(2, 101))
    result = coordinator.complete(pending)
    assert result.kind is CheckpointKind.REGIONAL
    assert result.completed is not None
    assert result.completed.regions[2].outcome is RegionOutcome.TIMEOUT
    assert result.completed.regions[2].ref_checkpoint_id == 100
    assert pending.failure_reasons == {2: "no acknowledgement or decline within region_timeout_s=30"}


def test_timeout_of_a_forced_global_checkpoint_names_the_silent_region_in_the_abort_reason() -> None:
    coordinator = make(2, region_timeout_s=30, regions_independent=False)
    pending = coordinator.trigger(1, now=0.0)
    pending.acknowledge(0, state(0, 1))
    assert coordinator.expire(pending, now=31.0) == (1,)
    result = coordinator.complete(pending)
    assert result.kind is CheckpointKind.ABORTED
    assert "region 1 timeout (no acknowledgement or decline within region_timeout_s=30)" in result.reason


def test_too_many_failed_regions_abort_the_checkpoint_without_touching_the_counter() -> None:
    coordinator = make(max_failure_ratio=0.25)
    run(coordinator, 100)
    run(coordinator, 101, declines={3})
    result = run(coordinator, 102, declines={0, 3})
    assert result.kind is CheckpointKind.ABORTED
    assert result.completed is None
    assert result.notify_complete == ()
    assert result.notify_aborted == (0, 1, 2, 3)
    assert "2 of 4 regions failed (ratio 0.50 > max_failure_ratio=0.25)" in result.reason
    assert coordinator.consecutive_regional == 1
    assert coordinator.store.ids() == [100, 101]


def test_failure_before_any_checkpoint_completed_is_aborted_for_lack_of_a_fallback_state() -> None:
    coordinator = make()
    result = run(coordinator, 1, declines={2})
    assert result.kind is CheckpointKind.ABORTED
    assert "region 2 failed with no completed or restored state to fall back to" in result.reason
    assert coordinator.store.ids() == []


def test_split_moved_to_an_acknowledging_region_leaves_the_failed_regions_fallback() -> None:
    coordinator = make(2)
    pending = coordinator.trigger(100, now=0.0)
    pending.acknowledge(0, RegionState(0, splits=(Split("t-0", position=5),)))
    pending.acknowledge(1, RegionState(1, splits=(Split("t-1", position=7), Split("t-2", position=9))))
    coordinator.complete(pending)
    # Region 1 failed over; the enumerator reassigned its split t-2 to region 0, which read on.
    enumerator = RecordingEnumerator()
    pending = coordinator.trigger(101, now=1.0)
    pending.acknowledge(0, RegionState(0, splits=(Split("t-0", position=8), Split("t-2", position=12))))
    pending.decline(1)
    result = coordinator.complete(pending, enumerator.snapshot_fn(101))
    assert result.kind is CheckpointKind.REGIONAL
    assert result.completed is not None
    assert result.completed.regions[1].splits == (Split("t-1", position=7),)
    assert result.completed.regions[0].splits == (Split("t-0", position=8), Split("t-2", position=12))
    assert result.superseded_splits == {1: ("t-2",)}
    assert enumerator.calls == [{1: ("t-1",)}]
    assert (
        "splits now owned by an acknowledging region left the fallback (region 1: ['t-2'])" in result.reason
    )


def test_two_regions_acknowledging_the_same_split_is_a_protocol_error() -> None:
    pending = make(2).trigger(1, now=0.0)
    pending.acknowledge(0, RegionState(0, splits=(Split("t-0"),)))
    with pytest.raises(ProtocolError) as err:
        pending.acknowledge(1, RegionState(1, splits=(Split("t-0", position=3),)))
    assert err.value.message == (
        "region 1 acknowledged checkpoint 1 with split 't-0', which region 0 already acknowledged; "
        "a split is owned by exactly one reader"
    )
    with pytest.raises(ProtocolError, match="with split 't-9' twice"):
        pending.acknowledge(1, RegionState(1, splits=(Split("t-9"), Split("t-9", position=1))))
    assert pending.waiting_for == (1,)


# ------------------------------------------------------------------ two-tier max consecutive failures


def _two_regional(coordinator: RegionalCheckpointCoordinator) -> None:
    assert run(coordinator, 100).kind is CheckpointKind.GLOBAL
    first = run(coordinator, 101, declines={1})
    assert (first.kind, first.consecutive_regional) == (CheckpointKind.REGIONAL, 1)
    second = run(coordinator, 102, declines={1})
    assert (second.kind, second.consecutive_regional) == (CheckpointKind.REGIONAL, 2)


def test_checkpoint_after_max_consecutive_regional_ones_is_forced_global() -> None:
    coordinator = make(2, max_consecutive_failures=2)
    _two_regional(coordinator)
    pending = coordinator.trigger(103, now=103.0)
    assert pending.forced_global
    assert pending.force_reason == "2 consecutive regional checkpoints >= max_consecutive_failures=2"


def test_forced_global_that_succeeds_is_global_and_resets_the_chain() -> None:
    coordinator = make(2, max_consecutive_failures=2)
    _two_regional(coordinator)
    result = run(coordinator, 103)
    assert result.kind is CheckpointKind.GLOBAL
    assert coordinator.consecutive_regional == 0
    assert coordinator.store.ref_chain(103) == [103]
    assert coordinator.store.chain_depth(103) == 0
    assert not coordinator.trigger(104, now=104.0).forced_global


def test_forced_global_with_a_decline_is_aborted_not_a_job_failure_and_resets_the_counter() -> None:
    coordinator = make(2, max_consecutive_failures=2)
    _two_regional(coordinator)
    result = run(coordinator, 103, declines={1})
    assert result.kind is CheckpointKind.ABORTED
    assert result.completed is None
    assert result.notify_aborted == (0, 1)
    assert result.reason.startswith(
        "forced global checkpoint 103 (2 consecutive regional checkpoints >= max_consecutive_failures=2) "
        "aborted: region 1 decline (snapshot failed). Not a job failure; "
        "the consecutive regional counter is reset to 0."
    )
    assert coordinator.consecutive_regional == 0
    assert coordinator.store.ids() == [100, 101, 102]
    # Tier 2 reset the counter, but the chain of 102 is already 2 deep: 104 is forced global by it
    # (protocol rule 2.2, the FLIP-600 thread's bound) and a decline aborts it, not the job.
    pending = coordinator.trigger(104, now=104.0)
    assert pending.force_reason == (
        "the ref chain of checkpoint 102 is 2 deep = max_consecutive_failures=2: a regional checkpoint "
        "would reference it and go deeper (protocol rule 2.2; after an aborted forced global only a "
        "global checkpoint starts the chain afresh)"
    )
    coordinator.abort(pending, "test")
    assert run(coordinator, 105).kind is CheckpointKind.GLOBAL  # a fresh start
    assert coordinator.store.chain_depth(105) == 0
    again = run(coordinator, 106, declines={0})  # and regional checkpoints again
    assert (again.kind, again.consecutive_regional) == (CheckpointKind.REGIONAL, 1)


def test_the_probes_chain_cannot_be_built_any_more() -> None:
    """The audit's probe: max_consecutive_failures 2, an aborted forced global, then two regional
    checkpoints by other regions made the chain 105 -> 104 -> 102 -> 101 -> 100 (four hops). Each
    attempt of it is now forced global, and no chain in the store is ever deeper than 2."""
    coordinator = make(2, max_consecutive_failures=2)
    _two_regional(coordinator)  # 101, 102: region 1 falls back (102 -> 101 -> 100)
    assert run(coordinator, 103, declines={1}).kind is CheckpointKind.ABORTED  # tier 2
    probe_104 = run(coordinator, 104, declines={0})  # the probe's 104: region 0 -> 102
    assert probe_104.kind is CheckpointKind.ABORTED
    assert "forced global checkpoint 104 (the ref chain of checkpoint 102 is 2 deep" in probe_104.reason
    probe_105 = run(coordinator, 105, declines={1})  # the probe's 105: region 1 -> 104
    assert probe_105.kind is CheckpointKind.ABORTED
    assert coordinator.store.ids() == [100, 101, 102]
    assert max(coordinator.store.chain_depth(c) for c in coordinator.store.ids()) == 2
    assert coordinator.store.ref_chain(102) == [102, 101, 100]
    assert run(coordinator, 106).kind is CheckpointKind.GLOBAL
    assert coordinator.retain(1) == [100, 101, 102]  # nothing refers to the old chain any more


def test_a_restore_of_a_checkpoint_whose_chain_is_full_forces_the_next_one_global() -> None:
    coordinator = make(2, max_consecutive_failures=2)
    _two_regional(coordinator)
    restored = make(2, max_consecutive_failures=2)
    for cid in reversed(coordinator.store.ref_chain(102)):
        restored.store.add(coordinator.store.get(cid))
    restored.restore(coordinator.store.get(102), consecutive_regional=0)  # the counter after tier 2
    assert restored.fallback_chain() == (102, 2)
    assert restored.trigger(103, now=103.0).forced_global


# ------------------------------------------------------------------ final checkpoint, global-only pipelines


def test_final_checkpoint_of_a_bounded_job_is_global_and_a_decline_means_retry_not_finish() -> None:
    coordinator = make()
    run(coordinator, 100)
    pending = coordinator.trigger(101, final=True, now=1.0)
    assert pending.forced_global
    assert (
        pending.force_reason == "final checkpoint of a bounded job: it finishes only on a global checkpoint"
    )
    pending.acknowledge(0, state(0, 101))
    pending.acknowledge(1, state(1, 101))
    pending.acknowledge(2, state(2, 101))
    pending.decline(3, "sink busy")
    aborted = coordinator.complete(pending)
    assert aborted.kind is CheckpointKind.ABORTED
    assert not aborted.may_finish_job
    assert aborted.reason.endswith("The bounded job must retry, not finish.")
    retried = run(coordinator, 102, final=True)
    assert retried.kind is CheckpointKind.GLOBAL
    assert retried.may_finish_job


def test_regional_checkpoint_never_lets_a_job_finish() -> None:
    coordinator = make()
    run(coordinator, 100)
    regional = run(coordinator, 101, declines={2})
    assert regional.kind is CheckpointKind.REGIONAL
    assert not regional.may_finish_job


def test_regions_not_independent_forces_every_checkpoint_global_and_says_why() -> None:
    coordinator = make(regions_independent=False)
    run(coordinator, 100)
    pending = coordinator.trigger(101, now=1.0)
    assert pending.forced_global
    assert pending.force_reason is not None and "regions are not independent" in pending.force_reason
    for region in range(3):
        pending.acknowledge(region, state(region, 101))
    pending.decline(3)
    result = coordinator.complete(pending)
    assert result.kind is CheckpointKind.ABORTED
    assert "regions are not independent" in result.reason


# ------------------------------------------------------------------ protocol errors


def test_checkpoint_ids_strictly_increase_and_a_repeated_or_backwards_id_names_both() -> None:
    coordinator = make()
    run(coordinator, 100)
    with pytest.raises(InvalidParameterError) as repeated:
        coordinator.trigger(100, now=1.0)
    assert repeated.value.message == (
        "checkpoint_id=100 is not allowed: an integer greater than 100, the last checkpoint id "
        "(ids strictly increase)"
    )
    with pytest.raises(InvalidParameterError, match=r"checkpoint_id=99 is not allowed: .* greater than 100"):
        coordinator.trigger(99, now=1.0)
    assert coordinator.trigger(now=1.0).checkpoint_id == 101


def test_an_aborted_checkpoint_id_is_not_reused() -> None:
    coordinator = make()
    run(coordinator, 100)
    coordinator.abort(coordinator.trigger(now=1.0), "epoch job failed")
    with pytest.raises(InvalidParameterError, match="greater than 101"):
        coordinator.trigger(101, now=2.0)
    assert coordinator.trigger(now=2.0).checkpoint_id == 102


def test_only_one_checkpoint_may_be_pending() -> None:
    coordinator = make()
    coordinator.trigger(100, now=0.0)
    with pytest.raises(ProtocolError) as err:
        coordinator.trigger(101, now=1.0)
    assert err.value.message == (
        "checkpoint 100 is still pending; complete() or abort() it before triggering another"
    )


def test_acknowledging_or_declining_twice_is_a_protocol_error() -> None:
    pending = make().trigger(100, now=0.0)
    pending.acknowledge(0, state(0, 100))
    with pytest.raises(ProtocolError) as twice:
        pending.acknowledge(0, state(0, 100))
    assert twice.value.message == (
        "region 0 already acknowledged checkpoint 100; each region acknowledges or declines once"
    )
    with pytest.raises(ProtocolError, match="region 0 already acknowledged checkpoint 100"):
        pending.decline(0)
    pending.decline(1)
    with pytest.raises(ProtocolError, match="region 1 already declined checkpoint 100"):
        pending.acknowledge(1, state(1, 100))


@pytest.mark.parametrize("region", [4, -1, True])
def test_answer_for_an_unknown_region_is_a_protocol_error(region: int) -> None:
    pending = make().trigger(100, now=0.0)
    with pytest.raises(ProtocolError) as err:
        pending.decline(region)
    assert err.value.message == f"region {region!r} is not a region of checkpoint 100 (regions 0..3)"


def test_ack_with_another_regions_state_or_a_fallback_state_is_rejected() -> None:
    pending = make().trigger(100, now=0.0)
    with pytest.raises(
        ProtocolError, match="region 0 acknowledged checkpoint 100 with the state of region 1"
    ):
        pending.acknowledge(0, state(1, 100))
    with pytest.raises(ProtocolError, match="an acknowledgement carries new state"):
        pending.acknowledge(0, RegionState(region_id=0, ref_checkpoint_id=99))
    assert pending.waiting_for == (0, 1, 2, 3)


def test_answers_after_completion_and_completing_a_stale_checkpoint_are_rejected() -> None:
    coordinator = make()
    pending = coordinator.trigger(100, now=0.0)
    for region in range(4):
        pending.acknowledge(region, state(region, 100))
    coordinator.complete(pending)
    with pytest.raises(ProtocolError, match="checkpoint 100 is already completed; region 0 cannot decline"):
        pending.decline(0)
    with pytest.raises(ProtocolError, match="checkpoint 100 is not the pending checkpoint"):
        coordinator.complete(pending)
    with pytest.raises(ProtocolError, match="checkpoint 100 is not the pending checkpoint"):
        coordinator.expire(pending, now=10_000.0)


def test_now_must_be_a_finite_time() -> None:
    with pytest.raises(InvalidParameterError, match="now=nan is not allowed: a finite time in seconds"):
        make().trigger(1, now=float("nan"))


# ------------------------------------------------------------------ enumerator snapshot and atomicity


def test_enumerator_snapshot_of_another_checkpoint_is_rejected_and_the_checkpoint_stays_pending() -> None:
    coordinator = make()
    pending = coordinator.trigger(100, now=0.0)
    for region in range(4):
        pending.acknowledge(region, state(region, 100))
    with pytest.raises(ProtocolError) as err:
        coordinator.complete(pending, lambda _fallback: EnumeratorSnapshot(checkpoint_id=99, parallelism=4))
    assert err.value.message == (
        "enumerator_snapshot returned EnumeratorSnapshot for checkpoint 99; "
        "expected an EnumeratorSnapshot of checkpoint 100"
    )
    assert coordinator.pending is pending
    assert coordinator.store.ids() == []
    result = coordinator.complete(pending, RecordingEnumerator().snapshot_fn(100))
    assert result.kind is CheckpointKind.GLOBAL


def test_failing_enumerator_snapshot_leaves_the_coordinator_unchanged() -> None:
    coordinator = make()
    run(coordinator, 100)
    pending = coordinator.trigger(101, now=1.0)
    for region in range(3):
        pending.acknowledge(region, state(region, 101))
    pending.decline(3)

    def broken(_fallback: Mapping[int, Collection[str]]) -> EnumeratorSnapshot:
        raise RuntimeError("enumerator unavailable")

    with pytest.raises(RuntimeError, match="enumerator unavailable"):
        coordinator.complete(pending, broken)
    assert coordinator.consecutive_regional == 0
    assert coordinator.store.ids() == [100]
    assert coordinator.complete(pending).kind is CheckpointKind.REGIONAL


def test_processing_backlog_flag_is_recorded_in_the_completed_checkpoint() -> None:
    coordinator = make(1)
    pending = coordinator.trigger(1, now=0.0)
    pending.acknowledge(0, state(0, 1))
    result = coordinator.complete(pending, processing_backlog=True)
    assert result.completed is not None and result.completed.processing_backlog


# ------------------------------------------------------------------ restore


def test_consecutive_counter_survives_a_restore_from_checkpoint_metadata() -> None:
    store = CheckpointStore()
    first = RegionalCheckpointCoordinator(CheckpointConfig(max_consecutive_failures=2), 4, store)
    run(first, 100)
    run(first, 101, declines={1})
    # The job fails over: a new coordinator restores from the store.
    second = RegionalCheckpointCoordinator(CheckpointConfig(max_consecutive_failures=2), 4, store)
    restored = second.restore(store.get(101))
    assert restored.consecutive_regional == 1
    assert second.consecutive_regional == 1
    result = run(second, 102, declines={2})
    assert result.completed is not None and result.completed.consecutive_regional == 2
    assert second.trigger(103, now=103.0).forced_global


def test_ids_after_a_restore_continue_after_the_store_contents() -> None:
    store = CheckpointStore()
    first = RegionalCheckpointCoordinator(CheckpointConfig(), 2, store)
    run(first, 100)
    run(first, 101)
    second = RegionalCheckpointCoordinator(CheckpointConfig(), 2, store)
    second.restore(store.get(100))
    assert second.trigger(now=0.0).checkpoint_id == 102


def test_restore_while_a_checkpoint_is_pending_is_refused() -> None:
    coordinator = make()
    run(coordinator, 100)
    coordinator.trigger(101, now=1.0)
    with pytest.raises(ProtocolError, match="cannot restore while checkpoint 101 is pending; abort"):
        coordinator.restore(coordinator.store.get(100))


def test_restore_of_a_checkpoint_not_in_the_store_is_refused() -> None:
    coordinator = make()
    result = run(coordinator, 100)
    assert result.completed is not None
    other = make()
    with pytest.raises(CheckpointError) as err:
        other.restore(result.completed)
    assert err.value.message.startswith("checkpoint 100 is not in the store (available: [])")


def test_external_abort_keeps_the_counter_and_closes_the_checkpoint() -> None:
    coordinator = make()
    run(coordinator, 100)
    run(coordinator, 101, declines={0})
    pending = coordinator.trigger(102, now=2.0)
    result = coordinator.abort(pending, "epoch job crashed")
    assert result.kind is CheckpointKind.ABORTED
    assert result.reason == "checkpoint 102 aborted: epoch job crashed"
    assert pending.status is PendingStatus.ABORTED
    assert coordinator.consecutive_regional == 1
    assert isinstance(pending, PendingCheckpoint) and coordinator.pending is None


def test_restore_keeps_a_live_counter_passed_by_the_runtime_after_an_abort():
    from splitkeeper.core.checkpoint import CheckpointConfig, CheckpointStore, RegionalCheckpointCoordinator
    from splitkeeper.core.types import CheckpointKind, CompletedCheckpoint, RegionState

    store = CheckpointStore()
    store.add(
        CompletedCheckpoint(
            checkpoint_id=5,
            kind=CheckpointKind.REGIONAL,
            parallelism=2,
            regions={0: RegionState(region_id=0), 1: RegionState(region_id=1)},
            consecutive_regional=2,
        )
    )
    coordinator = RegionalCheckpointCoordinator(CheckpointConfig(max_consecutive_failures=2), 2, store)
    assert coordinator.restore(store.get(5)).consecutive_regional == 2
    assert coordinator.trigger(6, now=0.0).forced_global
    coordinator.abort(coordinator.pending, "test")
    restored = coordinator.restore(store.get(5), consecutive_regional=0)
    assert restored.consecutive_regional == 0
    assert coordinator.consecutive_regional == 0
    assert not coordinator.trigger(7, now=0.0).forced_global
