"""State store figures: commit, retention and restore times of the delta-rs state store.

:func:`measure_state_store` commits synthetic checkpoints the way the driver does and
times each commit, each retention and, after chosen counts, a cold restore (a fresh
store: what a restarted driver does). ``splitkeeper-tools bench ingest`` reports these
figures; tests use small runs to check that restore does not grow with history.
No Spark: the store is delta-rs only.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

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
from splitkeeper.errors import InvalidParameterError, StateError

__all__ = ["StateStoreMeasurement", "measure_state_store", "synthetic_checkpoint"]


@dataclass(frozen=True, slots=True)
class StateStoreMeasurement:
    """Figures of :func:`measure_state_store` (milliseconds)."""

    checkpoints: int
    splits: int
    parallelism: int
    keep_latest: int | None
    commit_ms: tuple[int, ...]  # the commit_ms recorded in each checkpoints row
    total_commit_ms: tuple[int, ...]  # commit_checkpoint wall time, checkpoints row included
    retain_ms: tuple[int, ...]
    # after N checkpoints -> median over the repeats of a cold latest_checkpoint() / DeltaStateStore(...)
    restore_ms: dict[int, int] = field(default_factory=dict)
    open_ms: dict[int, int] = field(default_factory=dict)

    def summary(self) -> str:
        def stats(values: Sequence[int]) -> str:
            if not values:
                return "-"
            ordered = sorted(values)
            p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
            return f"median {statistics.median(ordered):.0f} ms, p90 {p90} ms, max {ordered[-1]} ms"

        lines = [
            f"{self.checkpoints} checkpoints, {self.splits} splits, parallelism {self.parallelism}, "
            f"retain keep_latest={self.keep_latest}",
            f"  state commit (recorded commit_ms): {stats(self.commit_ms)}",
            f"  commit_checkpoint incl. checkpoints row: {stats(self.total_commit_ms)}",
            f"  retain: {stats(self.retain_ms)}",
        ]
        for n in sorted(self.restore_ms):
            lines.append(
                f"  after {n} checkpoints (a fresh store, median): open store {self.open_ms[n]} ms, "
                f"restore latest {self.restore_ms[n]} ms"
            )
        return "\n".join(lines)


def synthetic_checkpoint(
    checkpoint_id: int, previous: CompletedCheckpoint | None, splits: int, parallelism: int, step: int
) -> CompletedCheckpoint:
    """Checkpoint ``checkpoint_id`` of a synthetic pipeline: every 4th is regional (region 0 failed)."""
    regional = previous is not None and checkpoint_id % 4 == 0 and previous.kind is CheckpointKind.GLOBAL
    regions: dict[int, RegionState] = {}
    owned: dict[int, tuple[Split, ...]] = {}
    for r in range(parallelism):
        if regional and r == 0 and previous is not None:
            regions[r] = replace(
                previous.regions[r],
                ref_checkpoint_id=previous.checkpoint_id,
                outcome=RegionOutcome.DECLINE,
                ref_depth=1,
            )
        else:
            regions[r] = RegionState(
                region_id=r,
                splits=tuple(
                    Split(f"topic-{s}", "topic", position=checkpoint_id * step, backlog_end=1_000_000)
                    for s in range(r, splits, parallelism)
                ),
                operator_state=(f"reader-{r}@{checkpoint_id}",),
            )
        owned[r] = regions[r].splits
    enumerator = EnumeratorSnapshot(
        checkpoint_id=checkpoint_id,
        parallelism=parallelism,
        assignments=owned,
        subscriptions=frozenset({"topic"}),
    )
    return CompletedCheckpoint(
        checkpoint_id=checkpoint_id,
        kind=CheckpointKind.REGIONAL if regional else CheckpointKind.GLOBAL,
        parallelism=parallelism,
        regions=regions,
        enumerator=enumerator,
        consecutive_regional=1 if regional else 0,
        processing_backlog=True,
    )


def measure_state_store(
    root: str | os.PathLike[str] | None = None,
    *,
    checkpoints: int = 200,
    marks: Sequence[int] = (10, 200),
    splits: int = 64,
    parallelism: int = 4,
    keep_latest: int | None = 3,
    compact_every: int = 50,
    audit_per_checkpoint: int = 4,
    restore_repeats: int = 3,
) -> StateStoreMeasurement:
    """Commit ``checkpoints`` synthetic checkpoints the way the driver does and time it.

    Each checkpoint: commit_checkpoint (``splits`` splits over ``parallelism`` regions,
    every 4th checkpoint regional), then retain(keep_latest) unless ``keep_latest`` is
    None. After each count in ``marks`` a fresh store is opened (no table loaded: what a
    restarted driver does) and latest_checkpoint() is timed; repeated ``restore_repeats``
    times, the median kept. ``root`` defaults to a fresh temporary directory.
    """
    from splitkeeper.delta.checkpoints import DeltaStateStore, decision_for

    if checkpoints < 1:
        raise InvalidParameterError("checkpoints", checkpoints, "an integer >= 1")
    if restore_repeats < 1:
        raise InvalidParameterError("restore_repeats", restore_repeats, "an integer >= 1")
    bad_marks = [m for m in marks if not 1 <= m <= checkpoints]
    if bad_marks:
        raise InvalidParameterError("marks", list(marks), f"counts between 1 and checkpoints={checkpoints}")
    root_text = os.fspath(root) if root is not None else tempfile.mkdtemp(prefix="splitkeeper-measure-")
    store = DeltaStateStore(root_text, "measure", "synthetic", compact_every=compact_every)
    commit_ms: list[int] = []
    total_ms: list[int] = []
    retain_ms: list[int] = []
    restore_ms: dict[int, int] = {}
    open_ms: dict[int, int] = {}
    previous: CompletedCheckpoint | None = None
    for n in range(1, checkpoints + 1):
        completed = synthetic_checkpoint(n, previous, splits, parallelism, step=100)
        audit = [
            AuditRecord(f"topic-{i}", i % parallelism, RecoveryDecision.ASSIGNED, n, detail="synthetic")
            for i in range(audit_per_checkpoint)
        ]
        store.commit_checkpoint(decision_for(completed, audit))
        receipt = store.last_commit
        assert receipt is not None
        commit_ms.append(receipt.commit_ms)
        total_ms.append(receipt.total_ms)
        if keep_latest is not None:
            started = time.perf_counter()
            store.retain(keep_latest)
            retain_ms.append(round((time.perf_counter() - started) * 1000))
        previous = completed
        if n in marks:
            opens: list[int] = []
            restores: list[int] = []
            for _ in range(restore_repeats):
                started = time.perf_counter()
                fresh = DeltaStateStore(root_text, "measure", "synthetic")
                opens.append(round((time.perf_counter() - started) * 1000))
                started = time.perf_counter()
                restored = fresh.latest_checkpoint()
                restores.append(round((time.perf_counter() - started) * 1000))
                if restored != completed:
                    raise StateError(
                        f"measurement: checkpoint {n} did not restore equal to what was committed"
                    )
            open_ms[n] = round(statistics.median(opens))
            restore_ms[n] = round(statistics.median(restores))
    return StateStoreMeasurement(
        checkpoints=checkpoints,
        splits=splits,
        parallelism=parallelism,
        keep_latest=keep_latest,
        commit_ms=tuple(commit_ms),
        total_commit_ms=tuple(total_ms),
        retain_ms=tuple(retain_ms),
        restore_ms=restore_ms,
        open_ms=open_ms,
    )
