"""A pipeline state written straight through the Delta state store (no Spark, no driver): what
``status`` and the report read in an incident review, built in a few seconds.

``incident_state`` commits ``checkpoints`` checkpoints of a ``parallelism``-reader pipeline over
``splits`` bounded splits (each ``end`` offsets, backlog until read), every checkpoint with its
phase times; a regional one where region 1 declined on a bad record (its cause recorded), an
aborted attempt where region 2 timed out, and retention keeping the latest ``keep``.
"""

from __future__ import annotations

from pathlib import Path

from splitkeeper.core.failures import RegionFailure
from splitkeeper.core.types import (
    BacklogSnapshot,
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    RegionOutcome,
    RegionState,
    Split,
)
from splitkeeper.delta.checkpoints import DeltaStateStore, decision_for

PIPELINE = "incident-pipeline"
#: Region 1's cause at the regional checkpoint.
DECLINE = RegionFailure(1, "decline", "SplitReadError", "ValueError: not JSON", "orders-1", 120)
TIMEOUT = RegionFailure(2, "timeout", "Timeout", "no result within 12s")


def phases_of(cid: int) -> dict[str, int]:
    return {"plan": 5 + cid % 3, "read": 200 + 10 * (cid % 7), "sink": 40 + cid % 5}


def incident_state(
    root: Path,
    *,
    checkpoints: int = 10,
    parallelism: int = 3,
    splits: int = 9,
    end: int = 1000,
    step: int = 10,
    regional_at: int = 4,
    aborted_at: int = 6,
    keep: int = 100,
    pipeline: str = PIPELINE,
    run_id: str | None = None,
) -> DeltaStateStore:
    """Commit the checkpoints (ids 1..checkpoints, ``aborted_at`` an aborted attempt); split
    ``orders-i`` advances ``step * (i + 1)`` offsets per checkpoint its region acknowledges."""
    store = DeltaStateStore(root / "state", pipeline, "files:/orders", run_id=run_id)
    ids = [f"orders-{i}" for i in range(splits)]
    owner = {sid: i % parallelism for i, sid in enumerate(ids)}
    position = dict.fromkeys(ids, 0)
    previous: dict[int, RegionState] = {}
    consecutive = 0
    for cid in range(1, checkpoints + 1):
        if cid == aborted_at:
            store.log_attempt(
                cid,
                {r: RegionOutcome.TIMEOUT if r == 2 else RegionOutcome.ACK for r in range(parallelism)},
                f"checkpoint {cid} aborted: region 2 timeout",
                failures=[TIMEOUT],
            )
            continue
        failed = {1} if cid == regional_at and parallelism > 1 else set()
        for i, sid in enumerate(ids):
            if owner[sid] not in failed:
                position[sid] = min(end, position[sid] + step * (i + 1))
        live = {sid: Split(sid, "orders", position[sid], end, end) for sid in ids}
        regions: dict[int, RegionState] = {}
        for r in range(parallelism):
            if r in failed and r in previous:
                regions[r] = RegionState(
                    r, previous[r].splits, previous[r].operator_state, cid - 1, RegionOutcome.DECLINE, 1
                )
            else:
                mine = tuple(live[s] for s in ids if owner[s] == r and not live[s].finished)
                regions[r] = RegionState(r, mine, (f"r{r}@{cid}",))
        consecutive = consecutive + 1 if failed else 0
        assignments = {
            r: tuple(live[s] for s in ids if owner[s] == r and not live[s].finished)
            for r in range(parallelism)
        }
        finished = frozenset(s for s in ids if live[s].finished)
        backlog = BacklogSnapshot(boundaries={}, finished=frozenset())
        completed = CompletedCheckpoint(
            checkpoint_id=cid,
            kind=CheckpointKind.REGIONAL if failed else CheckpointKind.GLOBAL,
            parallelism=parallelism,
            regions=regions,
            enumerator=EnumeratorSnapshot(
                cid, parallelism, (), assignments, finished, frozenset({"orders"}), backlog
            ),
            consecutive_regional=consecutive,
            processing_backlog=any(not s.finished for s in live.values()),
        )
        store.commit_checkpoint(
            decision_for(completed),
            phases_ms=phases_of(cid),
            failures=[DECLINE] if failed else [],
        )
        previous = {r: s for r, s in regions.items() if s.outcome is RegionOutcome.ACK} | {
            r: previous[r] for r in failed if r in previous
        }
        if keep < checkpoints:
            store.retain(keep)
    return store


def synthetic_report_data(attempts: int, *, parallelism: int = 4, splits: int = 12, kept: int = 100):
    """The report's input for ``attempts`` checkpoint attempts without any table (10,000 in well under a
    second): every 7th a regional one (region 1 declined on a bad record, ref the one before), every
    50th aborted (region 2 timed out); phase times on each; lags of the latest ``kept``."""
    from datetime import UTC, datetime, timedelta

    from splitkeeper.core.lag import by_lag, split_lag_of
    from splitkeeper.delta.history import TimelineEntry
    from splitkeeper.report.data import CheckpointFacts, ReportData

    start = datetime(2026, 1, 1, tzinfo=UTC)
    timeline, facts = [], []
    last_good = 0
    for cid in range(1, attempts + 1):
        outcomes = dict.fromkeys(range(parallelism), RegionOutcome.ACK)
        refs: dict[int, int] = {}
        failures: tuple[RegionFailure, ...] = ()
        kind = CheckpointKind.GLOBAL
        if cid % 50 == 0:
            kind, outcomes[2], failures = CheckpointKind.ABORTED, RegionOutcome.TIMEOUT, (TIMEOUT,)
        elif cid % 7 == 0 and last_good:
            kind, outcomes[1], refs, failures = (
                CheckpointKind.REGIONAL,
                RegionOutcome.DECLINE,
                {1: last_good},
                (DECLINE,),
            )
        phases = {} if kind is CheckpointKind.ABORTED else {**phases_of(cid), "commit": 30 + cid % 11}
        timeline.append(
            TimelineEntry(
                cid,
                kind,
                outcomes,
                refs,
                start + timedelta(seconds=10 * cid),
                phases.get("commit"),
                f"checkpoint {cid} aborted: region 2 timeout" if kind is CheckpointKind.ABORTED else "",
                "run-1",
                None if kind is CheckpointKind.ABORTED else True,
                phases,
                failures,
            )
        )
        if kind is CheckpointKind.ABORTED:
            continue
        if kind is CheckpointKind.GLOBAL:
            last_good = cid
        loads = {r: splits // parallelism for r in range(parallelism)}
        facts.append(CheckpointFacts(cid, kind, parallelism, True, phases["commit"], splits, loads, phases))
    total = 100 * attempts
    lags = {
        c.checkpoint_id: {f"orders-{i}": total - (i + 1) * 3 * c.checkpoint_id for i in range(splits)}
        for c in facts[-kept:]
    }
    latest = facts[-1].checkpoint_id
    live = by_lag(
        split_lag_of(
            Split(f"orders-{i}", "orders", (i + 1) * 3 * latest, total, total), "assigned", i % parallelism
        )
        for i in range(splits)
    )
    return ReportData(
        pipeline="orders",
        state_root="/var/splitkeeper/orders/state",
        generated_at=start + timedelta(seconds=10 * attempts + 5),
        timeline=tuple(timeline),
        checkpoints=tuple(facts),
        audit=(),
        lags=lags,
        splits=live,
    )
