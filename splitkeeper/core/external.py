"""Externally checkpointed sources (protocol section 3; the Pravega FLIP-27 discussion, FLINK-22133).

A source may keep its own position (Kafka consumer-group offsets, a Pravega
reader group). Two rules, decided here:

- commit: the external position is written only after a checkpoint completes,
  tagged with that checkpoint's id (``commit_positions(checkpoint_id, ...)``),
  and only for regions that acknowledged it (:func:`positions_to_commit`);
- restore: the checkpoint's positions win; every external position that
  disagrees is reported, never silently used (:func:`reconcile_positions`).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from splitkeeper.core.source import ExternalPosition
from splitkeeper.core.types import CompletedCheckpoint, RegionOutcome, RegionState
from splitkeeper.errors import ProtocolError


class DisagreementKind(enum.Enum):
    DIFFERENT_POSITION = "different_position"  # both know the split, positions differ
    MISSING_EXTERNALLY = "missing_externally"  # the checkpoint has the split, the external store not
    ONLY_EXTERNAL = "only_external"  # the external store has a split the checkpoint does not


@dataclass(frozen=True, slots=True)
class PositionDisagreement:
    """One split where the external store and the checkpoint differ. The checkpoint's value is used."""

    split_id: str
    kind: DisagreementKind
    checkpoint_position: int | None
    external_position: int | None
    external_checkpoint_id: int | None

    @property
    def detail(self) -> str:
        tag = (
            " (set outside splitkeeper: no checkpoint tag)"
            if self.external_checkpoint_id is None
            else f" (tagged checkpoint {self.external_checkpoint_id})"
        )
        if self.kind is DisagreementKind.DIFFERENT_POSITION:
            return (
                f"split {self.split_id}: checkpoint position {self.checkpoint_position} is used; "
                f"external position {self.external_position}{tag} ignored"
            )
        if self.kind is DisagreementKind.MISSING_EXTERNALLY:
            return (
                f"split {self.split_id}: checkpoint position {self.checkpoint_position} is used; "
                "the external store has no position"
            )
        return (
            f"split {self.split_id}: external position {self.external_position}{tag} ignored; "
            "not in the checkpoint"
        )


def reconcile_positions(
    checkpoint_positions: Mapping[str, int], external_positions: Mapping[str, ExternalPosition]
) -> list[PositionDisagreement]:
    """Compare restored checkpoint positions with the external store; report every difference.

    Called by the runtime on restore, after reading
    :meth:`ExternallyCheckpointedSource.committed_positions`. The caller
    restores from ``checkpoint_positions`` regardless of the result; the list
    (sorted by split id) goes to the logs and the restore report.
    """
    out: list[PositionDisagreement] = []
    for split_id in sorted(set(checkpoint_positions) | set(external_positions)):
        ckpt = checkpoint_positions.get(split_id)
        ext = external_positions.get(split_id)
        if ext is None:
            out.append(PositionDisagreement(split_id, DisagreementKind.MISSING_EXTERNALLY, ckpt, None, None))
        elif ckpt is None:
            out.append(
                PositionDisagreement(
                    split_id, DisagreementKind.ONLY_EXTERNAL, None, ext.position, ext.checkpoint_id
                )
            )
        elif ckpt != ext.position:
            out.append(
                PositionDisagreement(
                    split_id, DisagreementKind.DIFFERENT_POSITION, ckpt, ext.position, ext.checkpoint_id
                )
            )
    return out


def positions_to_commit(
    completed_checkpoint_regions: Mapping[int, RegionState] | CompletedCheckpoint,
    acked_region_ids: Collection[int],
) -> dict[str, int]:
    """Split positions to commit externally after a checkpoint completed: acknowledged regions only.

    ``completed_checkpoint_regions`` are the completed checkpoint's regions
    (or the :class:`CompletedCheckpoint` itself); ``acked_region_ids`` the
    regions the coordinator notified complete. The caller passes the result
    to :meth:`ExternallyCheckpointedSource.commit_positions` with the
    checkpoint id, which tags every position with it. A listed region must
    have acknowledged this very checkpoint (outcome ACK, no
    ``ref_checkpoint_id``), else ProtocolError: committing a fallback state
    would tag old positions with a new checkpoint id. Regions not listed
    contribute nothing (protocol rule 2.5).
    """
    if isinstance(completed_checkpoint_regions, CompletedCheckpoint):
        regions: Mapping[int, RegionState] = completed_checkpoint_regions.regions
        which = f"checkpoint {completed_checkpoint_regions.checkpoint_id}"
    else:
        regions = completed_checkpoint_regions
        which = "the completed checkpoint"
    positions: dict[str, int] = {}
    for region_id in sorted(acked_region_ids):
        state = regions.get(region_id)
        if state is None:
            raise ProtocolError(
                f"region {region_id} is not part of {which} (regions: {sorted(regions)})",
                region_id=region_id,
            )
        if state.outcome is not RegionOutcome.ACK or state.ref_checkpoint_id is not None:
            raise ProtocolError(
                f"region {region_id} did not acknowledge {which} "
                f"(outcome {state.outcome.value}, ref_checkpoint_id {state.ref_checkpoint_id}); "
                "only acknowledged regions may commit external positions",
                region_id=region_id,
            )
        for split in state.splits:
            positions[split.split_id] = split.position
    return positions
