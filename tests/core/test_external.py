"""Externally checkpointed sources (protocol section 3): commits after completion; the checkpoint wins."""

from __future__ import annotations

import pytest

from splitkeeper.core.external import (
    DisagreementKind,
    positions_to_commit,
    reconcile_positions,
)
from splitkeeper.core.source import ExternallyCheckpointedSource, ExternalPosition
from splitkeeper.core.types import CheckpointKind, CompletedCheckpoint, RegionOutcome, RegionState, Split
from splitkeeper.errors import InvalidParameterError, ProtocolError


def regional_checkpoint() -> CompletedCheckpoint:
    return CompletedCheckpoint(
        checkpoint_id=101,
        kind=CheckpointKind.REGIONAL,
        parallelism=2,
        regions={
            0: RegionState(0, splits=(Split("p-0", position=50), Split("p-2", position=7))),
            1: RegionState(
                1, splits=(Split("p-1", position=30),), ref_checkpoint_id=100, outcome=RegionOutcome.DECLINE
            ),
        },
    )


def test_only_acknowledged_regions_positions_are_committed_tagged_with_the_checkpoint_id():
    completed = regional_checkpoint()
    assert positions_to_commit(completed.regions, acked_region_ids=[0]) == {"p-0": 50, "p-2": 7}
    assert positions_to_commit(completed, acked_region_ids=[0]) == {"p-0": 50, "p-2": 7}


def test_no_acknowledged_region_means_nothing_to_commit():
    assert positions_to_commit(regional_checkpoint(), acked_region_ids=[]) == {}


def test_committing_a_region_that_fell_back_or_is_unknown_is_a_protocol_error():
    with pytest.raises(
        ProtocolError,
        match=r"region 1 did not acknowledge checkpoint 101 \(outcome decline, ref_checkpoint_id 100\)",
    ):
        positions_to_commit(regional_checkpoint(), [0, 1])
    with pytest.raises(ProtocolError, match=r"region 5 is not part of checkpoint 101"):
        positions_to_commit(regional_checkpoint(), [5])
    with pytest.raises(ProtocolError, match=r"region 1 did not acknowledge the completed checkpoint"):
        positions_to_commit(regional_checkpoint().regions, [1])


def test_reconcile_reports_every_disagreement_and_the_checkpoint_position_wins():
    checkpoint_positions = {"p-0": 50, "p-1": 30, "p-2": 7}
    external = {
        "p-0": ExternalPosition(50, 101),  # agrees
        "p-1": ExternalPosition(44, 102),  # ahead: committed for a later checkpoint we are not restoring
        "p-9": ExternalPosition(3, 90),  # a partition the checkpoint does not know
    }
    found = reconcile_positions(checkpoint_positions, external)
    assert [(d.split_id, d.kind) for d in found] == [
        ("p-1", DisagreementKind.DIFFERENT_POSITION),
        ("p-2", DisagreementKind.MISSING_EXTERNALLY),
        ("p-9", DisagreementKind.ONLY_EXTERNAL),
    ]
    assert (
        found[0].detail
        == "split p-1: checkpoint position 30 is used; external position 44 (tagged checkpoint 102) ignored"
    )
    assert (found[0].checkpoint_position, found[0].external_checkpoint_id) == (30, 102)
    assert reconcile_positions({"a": 1}, {"a": ExternalPosition(1, 5)}) == []


def test_external_position_rejects_negative_offsets_and_the_source_contract_is_abstract():
    with pytest.raises(InvalidParameterError, match=r"position=-1 is not allowed: an offset >= 0"):
        ExternalPosition(-1, 3)
    with pytest.raises(TypeError):
        ExternallyCheckpointedSource()  # type: ignore[abstract]
