"""Where each split stands at a checkpoint, and its lag, as ``status``, the report, a rewind and
a reset see them.

:func:`split_places` is the one walk of a checkpoint's splits: the regions' states are
authoritative for assigned splits (their read positions), the enumerator snapshot for the pool,
the quarantine and the finished ids. :func:`split_lags` lists its live splits with their lag,
which is :func:`splitkeeper.core.backlog.split_lag` (the one definition).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from splitkeeper.core.backlog import split_lag
from splitkeeper.core.types import CompletedCheckpoint, Split

__all__ = [
    "SplitLag",
    "SplitPlace",
    "all_quarantined",
    "by_lag",
    "split_lag_of",
    "split_lags",
    "split_places",
]

#: A split's place in a checkpoint, as the enumerator rows of the state store spell it.
ASSIGNED, POOL, QUARANTINED, FINISHED = "assigned", "pool", "quarantined", "finished"


@dataclass(frozen=True, slots=True)
class SplitPlace:
    """Where one split stands in a checkpoint: ``status`` assigned/pool/quarantined/finished, its
    owner (a reader id, for an assigned split) and the split (None for a finished one: the
    snapshot keeps only its id)."""

    split_id: str
    status: str
    owner: int | None
    split: Split | None

    @property
    def position(self) -> int | None:
        return None if self.split is None else self.split.position

    def describe(self) -> str:
        if self.status == FINISHED:
            return FINISHED
        where = f"reader {self.owner}" if self.status == ASSIGNED else self.status
        return f"at {self.position} ({where})"


def split_places(checkpoint: CompletedCheckpoint) -> dict[str, SplitPlace]:
    """Every split the checkpoint knows, by id. The regions' states are authoritative for assigned
    splits (their read positions); the enumerator snapshot for the pool, the quarantine and the
    finished ids."""
    places: dict[str, SplitPlace] = {}
    enum = checkpoint.enumerator
    if enum is not None:
        for split_id in sorted(enum.finished):
            places[split_id] = SplitPlace(split_id, FINISHED, None, None)
        for split in enum.pool:
            places[split.split_id] = SplitPlace(split.split_id, POOL, None, split)
        for split in enum.quarantined:
            places[split.split_id] = SplitPlace(split.split_id, QUARANTINED, None, split)
        for reader, splits in enum.assignments.items():
            for split in splits:
                places[split.split_id] = SplitPlace(split.split_id, ASSIGNED, reader, split)
    for region_id, state in checkpoint.regions.items():
        for split in state.splits:
            places[split.split_id] = SplitPlace(split.split_id, ASSIGNED, region_id, split)
    return dict(sorted(places.items()))


def all_quarantined(quarantined: int, live: int, finished: int) -> bool:
    """Every split the pipeline knows is quarantined (``quarantined`` > 0, none ``live`` or
    ``finished``): nothing is read until one is released (protocol rule 1.8), so a run that ends so
    did not catch up with anything. The rule of ``run`` (it ends with an error) and ``status`` (it
    names the problem); a pipeline whose other splits finished or are read is not stuck."""
    return quarantined > 0 and live == 0 and finished == 0


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


def split_lags(checkpoint: CompletedCheckpoint) -> tuple[SplitLag, ...]:
    """Every live split of ``checkpoint`` (:func:`split_places` without the finished ones, which
    have no position), most lag first."""
    return by_lag(
        split_lag_of(p.split, p.status, p.owner)
        for p in split_places(checkpoint).values()
        if p.split is not None
    )
