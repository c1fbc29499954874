"""Property test: random ack/decline/timeout outcomes, restores, rescales and retention.

Whatever happens, the ref chain stays within max_consecutive_failures (protocol
rule 6.6), every completed checkpoint has a state for every region, every ref
resolves in the store, and only acknowledged regions are told to commit.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from splitkeeper.core.checkpoint import (
    CheckpointConfig,
    CheckpointStore,
    RegionalCheckpointCoordinator,
)
from splitkeeper.core.rescale import Redistribution
from splitkeeper.core.types import CheckpointKind, RegionOutcome, RegionState, Split

OUTCOMES = st.sampled_from(
    [RegionOutcome.ACK, RegionOutcome.ACK, RegionOutcome.DECLINE, RegionOutcome.TIMEOUT]
)

checkpoint_step = st.tuples(st.just("checkpoint"), st.lists(OUTCOMES, min_size=6, max_size=6), st.booleans())
restore_step = st.tuples(
    st.just("restore"),
    st.integers(min_value=0, max_value=20),
    st.integers(min_value=1, max_value=5),
    st.sampled_from(list(Redistribution)),
)
retain_step = st.tuples(st.just("retain"), st.integers(min_value=1, max_value=3))
steps = st.lists(
    st.one_of(checkpoint_step, checkpoint_step, checkpoint_step, restore_step, retain_step), max_size=40
)
configs = st.builds(
    CheckpointConfig,
    max_consecutive_failures=st.integers(min_value=0, max_value=3),
    max_failure_ratio=st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]),
    region_timeout_s=st.just(10.0),
    regions_independent=st.booleans(),
)


def check_store(store: CheckpointStore, config: CheckpointConfig) -> None:
    for checkpoint_id in store.ids():
        checkpoint = store.get(checkpoint_id)
        assert sorted(checkpoint.regions) == list(range(checkpoint.parallelism))
        split_ids = [split.split_id for s in checkpoint.regions.values() for split in s.splits]
        assert len(split_ids) == len(set(split_ids))  # each split in exactly one region
        assert all(s.region_id == r for r, s in checkpoint.regions.items())
        assert store.chain_depth(checkpoint_id) <= config.max_consecutive_failures
        assert checkpoint.consecutive_regional <= config.max_consecutive_failures
        assert all(ref < checkpoint_id and ref in store for ref in checkpoint.ref_checkpoint_ids)
        store.ref_chain(checkpoint_id)  # resolves without a missing link
        for s in checkpoint.regions.values():
            assert (s.outcome is RegionOutcome.ACK) == (s.ref_checkpoint_id is None) == (s.ref_depth == 0)
        if checkpoint.kind is CheckpointKind.GLOBAL:
            assert checkpoint.failed_regions == () and checkpoint.consecutive_regional == 0
        else:
            assert checkpoint.failed_regions != ()


@settings(max_examples=300, deadline=None)
@given(config=configs, parallelism=st.integers(min_value=1, max_value=5), plan=steps)
def test_random_outcomes_never_deepen_a_chain_beyond_the_limit_and_every_region_has_state(
    config: CheckpointConfig, parallelism: int, plan: list[tuple]
) -> None:
    coordinator = RegionalCheckpointCoordinator(config, parallelism, CheckpointStore())
    store = coordinator.store
    now = 0.0
    for step in plan:
        if step[0] == "checkpoint":
            _, outcomes, final = step
            p = coordinator.parallelism
            counter_before = coordinator.consecutive_regional
            expected_fallback = {r: coordinator.fallback_state(r) for r in range(p)}
            pending = coordinator.trigger(final=final, now=now)
            acked_states: dict[int, RegionState] = {}
            for region, outcome in enumerate(outcomes[:p]):
                if outcome is RegionOutcome.ACK:
                    # A reader acknowledges the splits it owns (its last good ones), further on.
                    owned = expected_fallback[region]
                    splits = owned.splits if owned is not None else (Split(f"s{region}"),)
                    acked_states[region] = RegionState(
                        region,
                        splits=tuple(split.at(pending.checkpoint_id) for split in splits),
                        operator_state=(f"{pending.checkpoint_id}/{region}",),
                    )
                    pending.acknowledge(region, acked_states[region])
                elif outcome is RegionOutcome.DECLINE:
                    pending.decline(region, "random decline")
            now += config.region_timeout_s
            coordinator.expire(pending, now)
            result = coordinator.complete(pending)
            failed = tuple(r for r in range(p) if r not in acked_states)

            if not failed:
                assert result.kind is CheckpointKind.GLOBAL
            if pending.forced_global and failed:
                assert result.kind is CheckpointKind.ABORTED
                assert coordinator.consecutive_regional == 0
            if final:
                assert result.kind is not CheckpointKind.REGIONAL
                assert result.may_finish_job == (result.kind is CheckpointKind.GLOBAL)
            if result.kind is CheckpointKind.ABORTED:
                assert result.completed is None and result.notify_complete == ()
                assert result.checkpoint_id not in store
            else:
                completed = result.completed
                assert completed is not None and store.latest() == completed
                assert result.notify_complete == tuple(sorted(acked_states))
                assert result.notify_partially_completed == failed
                assert set(completed.regions) == set(range(p))
                for region, acked in acked_states.items():
                    assert completed.regions[region] == acked
                for region in failed:
                    fallback = expected_fallback[region]
                    assert fallback is not None
                    assert completed.regions[region] == replace(fallback, outcome=pending.outcomes[region])
                expected_counter = 0 if result.kind is CheckpointKind.GLOBAL else counter_before + 1
                assert completed.consecutive_regional == expected_counter == coordinator.consecutive_regional
        elif step[0] == "restore":
            _, pick, new_parallelism, mode = step
            ids = store.ids()
            if ids:
                restored = coordinator.restore(store.get(ids[pick % len(ids)]), new_parallelism, mode)
                assert coordinator.parallelism == new_parallelism == len(restored.regions)
                reported = [s.split_id for info in restored.reader_infos() for s in info.reported_splits]
                assert len(reported) == len(set(reported))  # a split is never duplicated by a rescale
        else:
            coordinator.retain(step[1])
        assert coordinator.consecutive_regional <= config.max_consecutive_failures
        check_store(store, config)
