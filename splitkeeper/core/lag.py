"""Each split's position and lag at a checkpoint, as ``status`` and the report list them.

The lag is :func:`splitkeeper.core.backlog.split_lag` (the one definition); this module only
says which splits a checkpoint holds, who owns them and where they are: the enumerator
snapshot's assigned, pooled and quarantined splits, at the positions the regions' states
recorded (authoritative for owned splits) where given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from splitkeeper.core.backlog import split_lag
from splitkeeper.core.types import CompletedCheckpoint, EnumeratorSnapshot, Split

__all__ = ["SplitLag", "by_lag", "region_positions", "split_lag_of", "split_lags"]


@dataclass(frozen=True, slots=True)
class SplitLag:
    """One live split at a checkpoint: owner (None: pooled or quarantined), position, end, lag."""

    split_id: str
    status: str  # "assigned" | "pool" | "quarantined"
    owner: int | None
    position: int
    end: int | None
    backlog_end: int | None
    lag: int | None  # split_lag: None when neither an end nor a backlog boundary is known
    in_backlog: bool  # before its backlog boundary


def split_lag_of(split: Split, status: str, owner: int | None) -> SplitLag:
    return SplitLag(
        split_id=split.split_id,
        status=status,
        owner=owner,
        position=split.position,
        end=split.end,
        backlog_end=split.backlog_end,
        lag=split_lag(split),
        in_backlog=split.backlog_end is not None and split.position < split.backlog_end,
    )


def by_lag(lags: Iterable[SplitLag]) -> tuple[SplitLag, ...]:
    """Most lag first (unknown lag last), ties by split id."""
    return tuple(sorted(lags, key=lambda s: (s.lag is None, -(s.lag or 0), s.split_id)))


def split_lags(
    snapshot: EnumeratorSnapshot, positions: Mapping[str, int] | None = None
) -> tuple[SplitLag, ...]:
    """Every live split of ``snapshot`` (finished ones are not listed), most lag first;
    ``positions`` (split -> position, e.g. :func:`region_positions`) override the snapshot's."""
    where = dict(positions or {})

    def at(split: Split) -> Split:
        position = where.get(split.split_id)
        if position is None or (split.end is not None and position > split.end):
            return split
        return split.at(position)

    out = [split_lag_of(at(s), "assigned", reader) for reader, ss in snapshot.assignments.items() for s in ss]
    out += [split_lag_of(at(s), "pool", None) for s in snapshot.pool]
    out += [split_lag_of(s, "quarantined", None) for s in snapshot.quarantined]
    return by_lag(out)


def region_positions(completed: CompletedCheckpoint) -> dict[str, int]:
    """Split -> position in the regions' states of ``completed`` (what a restore reads from)."""
    return {s.split_id: s.position for region in completed.regions.values() for s in region.splits}
