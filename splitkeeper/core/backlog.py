"""Backlog tracking (protocol section 4; FLIP-309 ``ProcessingBacklog``, the Fluss backlog proposal).

At start or reset the enumerator records, per split, the backlog boundary:
the split's end offset at that moment. Splits carry it as ``backlog_end``.
A reader reports "backlog finished" for a split once it reaches the boundary;
the tracker deduplicates reports and persists which splits are done, so a
restart never reports again. Bounded and snapshot-only splits are not
tracked. While any tracked split is unfinished the pipeline is
*processing backlog* and uses the throughput settings of
:class:`BacklogConfig`; afterwards the latency ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from splitkeeper.core import defaults
from splitkeeper.core.types import BacklogSnapshot, Split
from splitkeeper.errors import InvalidParameterError


@dataclass(frozen=True, slots=True)
class BacklogConfig:
    """Epoch size and checkpoint interval while processing backlog versus afterwards."""

    backlog_epoch_records: int = defaults.BACKLOG_EPOCH_RECORDS
    normal_epoch_records: int = defaults.NORMAL_EPOCH_RECORDS
    backlog_interval_s: float = defaults.BACKLOG_INTERVAL_S
    normal_interval_s: float = defaults.NORMAL_INTERVAL_S

    def __post_init__(self) -> None:
        for name in ("backlog_epoch_records", "normal_epoch_records"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParameterError(name, value, "an integer >= 1 (records per epoch)")
        for name in ("backlog_interval_s", "normal_interval_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidParameterError(name, value, "a number of seconds > 0")

    def epoch_records(self, processing_backlog: bool) -> int:
        """Records per epoch: throughput-sized during backlog, latency-sized afterwards."""
        return self.backlog_epoch_records if processing_backlog else self.normal_epoch_records

    def interval_s(self, processing_backlog: bool) -> float:
        """Checkpoint interval in seconds for the current mode."""
        return self.backlog_interval_s if processing_backlog else self.normal_interval_s


def is_backlog_tracked(split: Split) -> bool:
    """Only unbounded splits with a recorded boundary are tracked (protocol section 4)."""
    return split.backlog_end is not None and split.end is None


class BacklogTracker:
    """The enumerator's backlog state: boundaries per split and which splits are done.

    Owned by one :class:`~splitkeeper.core.enumerator.SplitEnumerator`; not
    thread-safe. Everything it knows goes into :meth:`snapshot`.
    """

    def __init__(self) -> None:
        self._boundaries: dict[str, int] = {}
        self._finished: set[str] = set()

    # -- recording boundaries -------------------------------------------------------------------

    def track(self, split: Split) -> bool:
        """Start tracking a newly known split from its ``backlog_end``; False if not tracked.

        A split already tracked keeps its recorded boundary (a rediscovered
        split does not move it); use :meth:`reset` to record a new one.
        """
        if not is_backlog_tracked(split):
            return False
        assert split.backlog_end is not None
        self._boundaries.setdefault(split.split_id, split.backlog_end)
        return True

    def track_all(self, splits: Iterable[Split]) -> None:
        for split in splits:
            if split.backlog_end is not None and split.end is None:
                self._boundaries.setdefault(split.split_id, split.backlog_end)

    def reset(self, end_offsets: Mapping[str, int]) -> None:
        """Record new boundaries (the end offsets now) and mark those splits as in backlog again.

        Called by the enumerator at a backlog reset (e.g. after a long outage
        the operator wants throughput mode until caught up).
        """
        for split_id, end in end_offsets.items():
            if end < 0:
                raise InvalidParameterError(f"end_offsets[{split_id!r}]", end, "an offset >= 0")
            self._boundaries[split_id] = end
            self._finished.discard(split_id)

    def forget(self, split_id: str) -> None:
        """Stop tracking a split that left the pipeline (removed subscription, finished)."""
        self._boundaries.pop(split_id, None)
        self._finished.discard(split_id)

    # -- reports --------------------------------------------------------------------------------

    def boundary(self, split_id: str) -> int | None:
        return self._boundaries.get(split_id)

    def reached(self, split_id: str, position: int) -> bool:
        """True when a tracked split at ``position`` (next offset to read) passed its boundary."""
        end = self._boundaries.get(split_id)
        return end is not None and position >= end

    def report_finished(self, split_id: str) -> bool:
        """A reader says ``split_id`` caught up with its boundary; True only the first time.

        Reports for untracked splits, and repeated reports (also after a
        restore, since the done set is in the snapshot), return False.
        """
        if split_id not in self._boundaries or split_id in self._finished:
            return False
        self._finished.add(split_id)
        return True

    @property
    def processing_backlog(self) -> bool:
        """True while any tracked split has not reported backlog finished."""
        return len(self._finished) < len(self._boundaries)

    def splits_in_backlog(self) -> list[str]:
        return sorted(s for s in self._boundaries if s not in self._finished)

    # -- snapshot -------------------------------------------------------------------------------

    def snapshot(self) -> BacklogSnapshot:
        return BacklogSnapshot(boundaries=dict(self._boundaries), finished=frozenset(self._finished))

    def restore(self, snapshot: BacklogSnapshot) -> None:
        """Replace all state with ``snapshot`` (called once, on enumerator restore)."""
        self._boundaries = dict(snapshot.boundaries)
        self._finished = {s for s in snapshot.finished if s in self._boundaries}


def split_lag(split: Split) -> int | None:
    """Offsets left to read of ``split`` at its position: the one definition of a split's lag
    (metrics, ``status``, ``offsets`` and the report all use it).

    To its end when the split is bounded; while in backlog, to its backlog boundary; a split
    past its backlog boundary is caught up (0); None when neither is known (an unbounded split
    never tracked for backlog).
    """
    in_backlog = split.backlog_end is not None and split.position < split.backlog_end
    target = split.end if split.end is not None else (split.backlog_end if in_backlog else None)
    if target is not None:
        return max(0, target - split.position)
    if split.backlog_end is not None:
        return 0  # past its backlog boundary: caught up with it
    return None
