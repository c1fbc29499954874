"""Operator checkpoints: a rewind to a retained checkpoint, and a split's offset set by hand.

An on-call engineer changes where the pipeline stands in two ways, and both are one
mechanism: an *operator checkpoint*, a checkpoint the operator's command decides instead of
a run. Rules (``docs/protocol.md`` section 8 states them with the other protocol rules):

1. **One epoch of its own.** The change gets a new epoch id ``E`` (after every epoch ever
   planned or committed) and is committed as that epoch is by a run (protocol section 5):
   its decision record first, then the sink's fenced commit of ``E`` (what the change does to
   the records: a rewind restores the sink's tables to their versions as of the target
   checkpoint; a backward reset deletes the split's records that will be read again), then
   the ``checkpoints`` row. A command dying in between leaves a decision and maybe the sink
   commit: the next writer's open finishes it from the decision (a redo, protocol rule 5.4),
   as it does for a run. So the pipeline is either as it was or fully changed, never between.
2. **Global, every region acknowledged.** The checkpoint ``E`` is GLOBAL; each region holds
   the state the change gives it, acknowledged in ``E`` (no ref, depth 0), so no ref chain
   leads from ``E`` to a checkpoint retention may delete.
3. **A rewind to N** (:func:`rewind_decision`): ``E``'s regions and enumerator are ``N``'s,
   split by split (positions, owners, pool, finished, quarantined, backlog). Every split whose
   place differs between the latest checkpoint and ``N`` is audited ``REWOUND`` with both
   places (:func:`rewind_changes`); the detail names who, why, and the two checkpoints.
4. **A reset of one split** (:func:`reset_decision`): ``E`` is the latest checkpoint with that
   split's position set (where it is: a region, the pool, the quarantine). Forward, the
   offsets ``[old, new)`` are never read: audited ``SKIPPED_BY_OPERATOR`` with the range, which
   the restart checks accept as a gap, as they do a range lost to retention. Backward, the
   offsets ``[new, old)`` are read again: audited ``RESET_BY_OPERATOR``; the sink commit of
   ``E`` deletes the split's records from ``new`` on, so they are in the sink once. A
   finished split is not reset (its end is not known here): rewind instead. An offset outside
   the source's log now (``bounds``: Kafka's log start and end) is clamped to it, as
   ``kafka-consumer-groups --reset-offsets`` does, and the change says so: past the end, a
   split would wait at an offset no record reaches while its lag shows 0; below the start,
   its next plan would fail or skip as aged out.
5. **Nothing without the checks first.** Every argument and the target checkpoint are
   checked before the lease is taken (the services do that); a refused command writes nothing.

No engine imports: this module is part of the protocol core.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from splitkeeper.core.lag import split_places
from splitkeeper.core.ports import EpochDecision
from splitkeeper.core.types import (
    AuditRecord,
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    RecoveryDecision,
    RegionOutcome,
    RegionState,
    Split,
)
from splitkeeper.errors import InvalidParameterError

__all__ = [
    "SKIPPED_DETAIL_PATTERN",
    "OperatorChange",
    "read_again_from",
    "reset_action",
    "reset_decision",
    "rewind_changes",
    "rewind_decision",
    "skipped_range",
]

#: ``detail`` of a SKIPPED_BY_OPERATOR record begins with the range; the restart checks parse it.
SKIPPED_DETAIL = "offsets [{start}, {end}) of {split} skipped by {operator}"
SKIPPED_DETAIL_PATTERN = re.compile(r"^offsets \[(\d+), (\d+)\) of ")
#: The place after a REWOUND record's change ends its detail: ``-> at P (where)`` or ``-> unknown (...)``.
_REWOUND_AFTER = re.compile(r"-> (?:at (\d+) \([^()]*\)|(unknown) \([^()]*\))$")


@dataclass(frozen=True, slots=True)
class OperatorChange:
    """One split's change by an operator checkpoint: its place before and after, and how many of
    its offsets are undone (read again; a rewind or a backward reset) or skipped (a forward
    reset); None when not known (a finished split has no position)."""

    split_id: str
    before: str
    after: str
    undone: int | None = None
    skipped: int = 0
    # a reset asked for this offset, outside the source's log: the position is clamped to the log
    requested: int | None = None
    clamped_to: str = ""  # "the log end" or "the log start", with ``requested``

    def to_dict(self) -> dict[str, object]:
        return {
            "split_id": self.split_id,
            "before": self.before,
            "after": self.after,
            "undone": self.undone,
            "skipped": self.skipped,
            "requested": self.requested,
            "clamped_to": self.clamped_to,
        }


def rewind_changes(latest: CompletedCheckpoint, target: CompletedCheckpoint) -> tuple[OperatorChange, ...]:
    """The splits whose place differs between ``latest`` and ``target`` (rule 3), in id order."""
    now, then = split_places(latest), split_places(target)
    changes: list[OperatorChange] = []
    for split_id in sorted(now.keys() | then.keys()):
        before, after = now.get(split_id), then.get(split_id)
        if before is not None and after is not None and before == after:
            continue
        undone: int | None = None
        if before is not None and after is not None and before.position is not None:
            if after.position is not None:
                undone = max(0, before.position - after.position)
        elif before is not None and after is None and before.position is not None:
            undone = before.position  # discovered after the target: read again from its start
        changes.append(
            OperatorChange(
                split_id,
                "unknown" if before is None else before.describe(),
                "unknown (discovered again by the next run)" if after is None else after.describe(),
                undone,
            )
        )
    return tuple(changes)


def _global(checkpoint: CompletedCheckpoint, epoch: int) -> CompletedCheckpoint:
    """``checkpoint``'s state as checkpoint ``epoch``: GLOBAL, every region acknowledged (rule 2)."""
    regions = {
        r: replace(s, ref_checkpoint_id=None, outcome=RegionOutcome.ACK, ref_depth=0)
        for r, s in checkpoint.regions.items()
    }
    enum = None if checkpoint.enumerator is None else replace(checkpoint.enumerator, checkpoint_id=epoch)
    return replace(
        checkpoint,
        checkpoint_id=epoch,
        kind=CheckpointKind.GLOBAL,
        regions=regions,
        enumerator=enum,
        consecutive_regional=0,
    )


def _check_epoch(epoch: int, latest: CompletedCheckpoint) -> None:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch <= latest.checkpoint_id:
        raise InvalidParameterError(
            "epoch", epoch, f"an epoch id after the latest checkpoint {latest.checkpoint_id}"
        )


def rewind_decision(
    latest: CompletedCheckpoint,
    target: CompletedCheckpoint,
    epoch: int,
    *,
    attempt_id: str,
    operator: str,
    reason: str,
    configured_parallelism: int | None = None,
) -> EpochDecision:
    """The decision of a rewind from ``latest`` to ``target`` committed as checkpoint ``epoch`` (rule 3)."""
    _check_epoch(epoch, latest)
    if target.checkpoint_id >= latest.checkpoint_id:
        raise InvalidParameterError(
            "checkpoint",
            target.checkpoint_id,
            f"a checkpoint before the latest one ({latest.checkpoint_id}): a rewind goes back",
        )
    places = split_places(target)
    why = f"by {operator}: {reason}" if reason else f"by {operator}"
    audit = tuple(
        AuditRecord(
            c.split_id,
            places[c.split_id].owner if c.split_id in places else None,
            RecoveryDecision.REWOUND,
            target.checkpoint_id,
            f"rewound to checkpoint {target.checkpoint_id} from {latest.checkpoint_id} {why}; "
            f"{c.before} -> {c.after}",
        )
        for c in rewind_changes(latest, target)
    )
    return EpochDecision(
        checkpoint=_global(target, epoch),
        attempt_id=attempt_id,
        audit=audit,
        acknowledged=tuple(sorted(target.regions)),
        configured_parallelism=configured_parallelism,
        reason=f"rewind to checkpoint {target.checkpoint_id} {why}",
    )


def _moved(split: Split, position: int) -> Split:
    return replace(split, position=position)


def reset_decision(
    latest: CompletedCheckpoint,
    split_id: str,
    position: int,
    epoch: int,
    *,
    attempt_id: str,
    operator: str,
    reason: str = "",
    configured_parallelism: int | None = None,
    bounds: tuple[int, int] | None = None,
) -> tuple[EpochDecision, OperatorChange]:
    """The decision of setting ``split_id``'s position to ``position``, committed as checkpoint
    ``epoch`` (rule 4), and the change it makes. ``bounds``: the source's log start and end now
    (None: not known); a position outside them is clamped to them (the change's ``requested``
    keeps what was asked). InvalidParameterError for an unknown or finished split, a negative
    position, a position past the split's end, or no change."""
    _check_epoch(epoch, latest)
    places = split_places(latest)
    place = places.get(split_id)
    if place is None:
        known = ", ".join(list(places)[:10]) + (" ..." if len(places) > 10 else "")
        raise InvalidParameterError("split", split_id, f"a split of the latest checkpoint ({known})")
    if place.split is None:
        raise InvalidParameterError(
            "split",
            split_id,
            "a split that is not finished (owned, pooled or quarantined)",
            "a finished split's end is not kept; rewind to a checkpoint before it finished "
            "(splitkeeper recover --checkpoint N --rewind) to read it again",
        )
    split = place.split
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        raise InvalidParameterError("position", position, "an offset >= 0")
    if split.end is not None and position > split.end:
        raise InvalidParameterError("position", position, f"an offset <= the split's end {split.end}")
    requested, clamped_to = position, ""
    if bounds is not None:
        low, high = bounds
        if position > high:
            position, clamped_to = high, f"the log end {high}"
        elif position < low:
            position, clamped_to = low, f"the log start {low}"
    if position == split.position:
        if clamped_to:
            raise InvalidParameterError(
                "position",
                requested,
                f"an offset within the split's log [{bounds[0] if bounds else 0}, "
                f"{bounds[1] if bounds else ''}] other than its position now ({split.position}): "
                f"{requested} is outside it, and {clamped_to} is where the split stands already",
            )
        raise InvalidParameterError(
            "position", position, f"an offset other than the split's position now ({split.position})"
        )
    old = split.position
    who = f"by {operator}: {reason}" if reason else f"by {operator}"
    asked = None if not clamped_to else requested
    if position > old:
        detail = SKIPPED_DETAIL.format(start=old, end=position, split=split_id, operator=who)
        decision = RecoveryDecision.SKIPPED_BY_OPERATOR
        change = OperatorChange(
            split_id, place.describe(), f"at {position}", 0, position - old, asked, clamped_to
        )
    else:
        detail = f"offsets [{position}, {old}) of {split_id} read again, reset {who}"
        decision = RecoveryDecision.RESET_BY_OPERATOR
        change = OperatorChange(
            split_id, place.describe(), f"at {position}", old - position, 0, asked, clamped_to
        )
    if clamped_to:
        detail += f" (offset {requested} asked for, clamped to {clamped_to})"
    checkpoint = _global(_with_position(latest, split_id, position), epoch)
    audit = (AuditRecord(split_id, place.owner, decision, latest.checkpoint_id, detail),)
    return (
        EpochDecision(
            checkpoint=checkpoint,
            attempt_id=attempt_id,
            audit=audit,
            acknowledged=tuple(sorted(checkpoint.regions)),
            configured_parallelism=configured_parallelism,
            reason=f"offset of {split_id} set to {position} {who}",
        ),
        change,
    )


def reset_action(decision: EpochDecision) -> dict[str, object] | None:
    """What the sink commit of a reset's checkpoint does (rule 4), from its decision alone: delete
    the split's records from its new position on (backward), or only record the epoch (forward,
    ``forward`` true). None for a decision that is not a reset (a run's epoch, a rewind).

    The one definition :func:`splitkeeper.app.incident.reset_offset` commits and ``recover --repair``
    commits again for a reset checkpoint whose sink commit is missing."""
    kinds = (RecoveryDecision.RESET_BY_OPERATOR, RecoveryDecision.SKIPPED_BY_OPERATOR)
    resets = [a for a in decision.audit if a.decision in kinds]
    if len(resets) != 1 or len(decision.audit) != 1:
        return None
    (record,) = resets
    place = split_places(decision.checkpoint).get(record.split_id)
    if place is None or place.position is None:
        return None
    return {
        "kind": "reset",
        "split": record.split_id,
        "from": place.position,
        "forward": record.decision is RecoveryDecision.SKIPPED_BY_OPERATOR,
    }


def _with_position(checkpoint: CompletedCheckpoint, split_id: str, position: int) -> CompletedCheckpoint:
    """``checkpoint`` with ``split_id`` at ``position`` wherever it is held."""

    def move_all(splits: tuple[Split, ...]) -> tuple[Split, ...]:
        return tuple(_moved(s, position) if s.split_id == split_id else s for s in splits)

    regions: Mapping[int, RegionState] = {
        r: replace(s, splits=move_all(s.splits)) for r, s in checkpoint.regions.items()
    }
    enum: EnumeratorSnapshot | None = checkpoint.enumerator
    if enum is not None:
        enum = replace(
            enum,
            pool=move_all(enum.pool),
            quarantined=move_all(enum.quarantined),
            assignments={r: move_all(s) for r, s in enum.assignments.items()},
        )
    return replace(checkpoint, regions=dict(regions), enumerator=enum)


def read_again_from(record: AuditRecord) -> int | None:
    """The offset from which an operator checkpoint reads ``record``'s split again: a backward reset's
    new position (RESET_BY_OPERATOR), a rewind's position in its target (REWOUND; 0 for a split the
    target did not know: it is discovered again). None for any other record, or a rewound split that
    is finished in the target. A range skipped earlier (SKIPPED_BY_OPERATOR, SKIPPED_LOST_RANGE) from
    that offset on is no longer a gap: the restart checks expect its offsets once again."""
    if record.decision is RecoveryDecision.RESET_BY_OPERATOR:
        match = SKIPPED_DETAIL_PATTERN.match(record.detail)
        return None if match is None else int(match.group(1))
    if record.decision is RecoveryDecision.REWOUND:
        found = _REWOUND_AFTER.search(record.detail)
        if found is None:
            return None
        return 0 if found.group(2) else int(found.group(1))
    return None


def skipped_range(record: AuditRecord) -> tuple[int, int] | None:
    """The offsets ``[start, end)`` a SKIPPED_BY_OPERATOR record skipped; None for any other record."""
    match = SKIPPED_DETAIL_PATTERN.match(record.detail)
    if record.decision is not RecoveryDecision.SKIPPED_BY_OPERATOR or match is None:
        return None
    return int(match.group(1)), int(match.group(2))
