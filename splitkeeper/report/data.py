"""What the run report shows, read from a pipeline's Delta state tables and its sink.

:func:`collect_report_data` reads the state through :mod:`splitkeeper.delta.history`
(the only reader of the state tables, which applies the orphan-attempt rule) and the
sink table with one small Spark query, and returns plain values. The history is
whole: kept checkpoints from their checkpoints rows, the ones retention deleted from
what ``checkpoint_log`` archived before the delete. The HTML rendering
(:mod:`splitkeeper.report.html`) never touches Spark. Read-only; may run while the
pipeline runs (it sees the checkpoints committed so far).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from splitkeeper.core.lag import SplitLag, by_lag, split_lag_of
from splitkeeper.core.types import CheckpointKind, RecoveryDecision, Split
from splitkeeper.delta.history import TimelineEntry
from splitkeeper.sinks.port import SinkReader, SinkTable

if TYPE_CHECKING:  # pragma: no cover
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.delta.validations import RecordedCheck
    from splitkeeper.records.upsert import FoldResult

#: enumerator_state rows of a live split (with a position): owned, pooled or parked.
LIVE_STATUSES = ("assigned", "pool", "quarantined")

#: Audit decisions that move splits between readers of a running pipeline or on restore.
REBALANCE_DECISIONS = (RecoveryDecision.REBALANCED.value, RecoveryDecision.REDISTRIBUTED_GLOBAL_RESTORE.value)


@dataclass(frozen=True, slots=True)
class CheckpointFacts:
    """One completed checkpoint as the report shows it."""

    checkpoint_id: int
    kind: CheckpointKind
    parallelism: int
    processing_backlog: bool
    commit_ms: int
    backlog_splits: int
    loads: dict[int, int] = field(default_factory=dict)  # reader -> splits assigned
    phases_ms: dict[str, int] = field(default_factory=dict)  # plan, read, sink, commit: those recorded


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One audit record with the checkpoint that committed it."""

    checkpoint_id: int
    seq: int
    split_id: str
    reader_id: int | None
    decision: str
    detail: str


@dataclass(frozen=True, slots=True)
class LoadComparison:
    """Per-reader load at two checkpoints (``before`` may be None) and why these two."""

    before: CheckpointFacts | None
    after: CheckpointFacts | None
    reason: str


@dataclass(frozen=True, slots=True)
class ParkedSplit:
    """A split that was quarantined (protocol rule 1.8): when, why, and whether it is back."""

    split_id: str
    quarantined_at: int  # checkpoint that committed the quarantine
    reader_id: int | None  # the reader that owned it
    error: str  # the audit detail: why its reads failed
    position: int | None  # where it is parked (latest checkpoint); None once released
    released_at: int | None = None  # checkpoint that committed the release (recover --release)
    dropped: bool = False  # released_at is when it was dropped (recover --drop: its file is gone)


@dataclass(frozen=True, slots=True)
class DeadLetterFacts:
    """The dead-letter table as the report shows it: counts per split and per stage, the first errors."""

    path: str
    total: int
    per_split: tuple[tuple[str, int], ...]  # (split, dead letters), most first, ties by split
    per_stage: tuple[tuple[str, int], ...]  # (stage, dead letters), in STAGES order
    first: tuple[tuple[str, int, str, str, str], ...]  # (split, offset, stage, error class, message)


#: Runs of the restart checks and in-run checks the report lists (each kind; the newest).
RESTART_CHECKS_SHOWN = 50

#: How many of the first dead letters (by epoch, split, offset) the report lists.
FIRST_DEAD_LETTERS = 20


def read_dead_letter_facts(sink: SinkReader, first: int = FIRST_DEAD_LETTERS) -> DeadLetterFacts:
    """Count the sink's dead-letter table per split and stage and take its ``first`` errors (read
    without Spark, :meth:`~splitkeeper.sinks.port.SinkReader.rows`; the raw bytes are not read)."""
    import pyarrow.compute as pc

    from splitkeeper.records.decode import STAGES

    columns = ["split_id", "offset", "stage", "error_class", "error_message", "epoch"]
    rows = sink.rows(SinkTable.DEAD_LETTERS, columns)
    path = sink.location(SinkTable.DEAD_LETTERS) or ""
    per_split = Counter(rows["split_id"].to_pylist())
    per_stage = Counter(rows["stage"].to_pylist())
    order = pc.sort_indices(
        rows, [("epoch", "ascending"), ("split_id", "ascending"), ("offset", "ascending")]
    )
    head = rows.take(order[:first]).to_pylist()
    return DeadLetterFacts(
        path=os.fspath(path),
        total=rows.num_rows,
        per_split=tuple(sorted(per_split.items(), key=lambda kv: (-kv[1], kv[0]))),
        per_stage=tuple(
            (stage, per_stage[stage])
            for stage in (*STAGES, *sorted(set(per_stage) - set(STAGES)))
            if per_stage[stage]
        ),
        first=tuple(
            (r["split_id"], int(r["offset"]), r["stage"], r["error_class"], r["error_message"]) for r in head
        ),
    )


@dataclass(frozen=True, slots=True)
class UpsertFacts:
    """An upsert sink as the report shows it: keys, upserts and deletes, and the fold check's verdict.

    ``keys``: rows of the keyed table; ``changes``: records of the change table, of which
    ``deletes`` are deletes (records/upsert.py rule 3, keyless tombstones included) and the rest
    upserts. ``fold``: the last fold check's result (written by the restart checks beside the Data
    Docs), None when validate has not run it."""

    keyed_path: str
    changes_path: str
    key: tuple[str, ...]
    delete_when: str | None
    keys: int
    changes: int
    deletes: int
    fold: FoldResult | None = None

    @property
    def upserts(self) -> int:
        return self.changes - self.deletes


@dataclass(frozen=True, slots=True)
class FilteredFacts:
    """The offsets a Spark transform filtered out: ranges and offsets in all and per function."""

    path: str
    ranges: int
    offsets: int
    per_function: tuple[tuple[str, int, int], ...]  # (function, ranges, offsets), most offsets first


def read_upsert_facts(sink: SinkReader, fold_dir: str | os.PathLike[str] | None = None) -> UpsertFacts:
    """Count an upsert sink's keyed rows and its change table's records and deletes (no Spark:
    :meth:`~splitkeeper.sinks.port.SinkReader.count`, the deletes with
    :meth:`~splitkeeper.records.upsert.UpsertSpec.delete_condition` in its generic dialect), and
    read the fold check's result from ``fold_dir`` (the Data Docs folder)."""
    from splitkeeper.records.upsert import read_fold_result

    upsert = sink.upsert
    assert upsert is not None
    return UpsertFacts(
        keyed_path=sink.location(SinkTable.KEYED) or "",
        changes_path=sink.location(SinkTable.RECORDS) or "",
        key=upsert.key,
        delete_when=upsert.delete_when,
        keys=sink.count(SinkTable.KEYED),
        changes=sink.count(SinkTable.RECORDS),
        deletes=sink.count(SinkTable.RECORDS, upsert.delete_condition()),
        fold=None if fold_dir is None else read_fold_result(fold_dir),
    )


def read_filtered_facts(sink: SinkReader) -> FilteredFacts | None:
    """The sink's ``filtered_offsets`` table counted per function (no Spark); None when it has none."""
    if not sink.location(SinkTable.FILTERED) or sink.files(SinkTable.FILTERED) is None:
        return None
    rows = sink.rows(SinkTable.FILTERED, ["function", "records"]).to_pylist()
    per: dict[str, list[int]] = {}
    for r in rows:
        counts = per.setdefault(r["function"], [0, 0])
        counts[0] += 1
        counts[1] += int(r["records"])
    return FilteredFacts(
        path=sink.location(SinkTable.FILTERED) or "",
        ranges=len(rows),
        offsets=sum(n for _r, n in per.values()),
        per_function=tuple(
            (fn, r, n) for fn, (r, n) in sorted(per.items(), key=lambda kv: (-kv[1][1], kv[0]))
        ),
    )


@dataclass(frozen=True, slots=True)
class ReportData:
    pipeline: str
    state_root: str
    generated_at: datetime
    timeline: tuple[TimelineEntry, ...]
    checkpoints: tuple[CheckpointFacts, ...]
    audit: tuple[AuditRow, ...]
    sink_path: str | None = None
    records: dict[int, dict[int, int]] | None = None  # epoch -> region -> records; None: no sink given
    parked_positions: dict[str, int] = field(default_factory=dict)  # quarantined now -> position
    dead_letters: DeadLetterFacts | None = None  # None: no dead-letter table given
    upsert: UpsertFacts | None = None  # None: an append sink
    filtered: FilteredFacts | None = None  # None: no filtered_offsets table
    # kept checkpoint -> split -> lag (core.backlog.split_lag) of its live splits with a known lag
    lags: dict[int, dict[str, int]] = field(default_factory=dict)
    splits: tuple[SplitLag, ...] = ()  # the latest kept checkpoint's live splits, most lag first
    #: the restart checks' verdicts (validations table), newest first: validate runs and the in-run
    #: checks of the latest restores (at most RESTART_CHECKS_SHOWN of each)
    restart_checks: tuple[RecordedCheck, ...] = ()

    @property
    def latest_validation(self) -> RecordedCheck | None:
        """The newest run of the restart checks (``splitkeeper validate``, the validate task)."""
        return next((c for c in self.restart_checks if not c.in_run), None)

    def decision_counts(self) -> list[tuple[str, int]]:
        """(decision, count), most frequent first, ties by name."""
        counts = Counter(a.decision for a in self.audit)
        return sorted(counts.items(), key=lambda item: (-item[1], item[0]))

    def backlog_switches(self) -> list[tuple[int, bool]]:
        """(checkpoint id, now processing backlog) at every change of mode, oldest first."""
        out: list[tuple[int, bool]] = []
        previous: bool | None = None
        for c in self.checkpoints:
            if previous is not None and c.processing_backlog != previous:
                out.append((c.checkpoint_id, c.processing_backlog))
            previous = c.processing_backlog
        return out

    def load_changes(self) -> list[LoadComparison]:
        """Every rescale and rebalance among the checkpoints of the history, oldest first.

        A change is a checkpoint that committed rebalance/redistribution decisions, or whose
        parallelism differs from the checkpoint before it (a rescale). Each comes with the
        loads of the checkpoint before it (None when that one is no longer kept) and its own.
        """
        moves = Counter(a.checkpoint_id for a in self.audit if a.decision in REBALANCE_DECISIONS)
        changes: list[LoadComparison] = []
        for index, facts in enumerate(self.checkpoints):
            before = self.checkpoints[index - 1] if index > 0 else None
            why: list[str] = []
            if before is not None and before.parallelism != facts.parallelism:
                why.append(f"rescale from parallelism {before.parallelism} to {facts.parallelism}")
            if moves[facts.checkpoint_id]:
                why.append(f"{moves[facts.checkpoint_id]} split move(s)")
            if not why:
                continue
            reason = " and ".join(why) + f" recorded with checkpoint {facts.checkpoint_id}"
            if before is None:
                reason += "; the checkpoint before it is no longer kept"
            changes.append(LoadComparison(before, facts, reason))
        return changes

    def load_comparison(self) -> LoadComparison:
        """The latest of :meth:`load_changes`; without any, the first and the latest checkpoint."""
        changes = self.load_changes()
        if changes:
            return changes[-1]
        if len(self.checkpoints) >= 2:
            return LoadComparison(
                self.checkpoints[0],
                self.checkpoints[-1],
                "no rebalance or rescale recorded: the first and the latest checkpoint",
            )
        only = self.checkpoints[0] if self.checkpoints else None
        return LoadComparison(None, only, "only one checkpoint" if only else "no completed checkpoint yet")

    def parked_splits(self) -> list[ParkedSplit]:
        """Each quarantine in the audit, with its release if one followed, oldest first."""
        out: list[ParkedSplit] = []
        open_: dict[str, int] = {}  # split -> index in out of its unreleased quarantine
        for a in self.audit:
            if a.decision == RecoveryDecision.QUARANTINED.value and a.split_id not in open_:
                open_[a.split_id] = len(out)
                out.append(
                    ParkedSplit(
                        a.split_id,
                        a.checkpoint_id,
                        a.reader_id,
                        a.detail,
                        self.parked_positions.get(a.split_id),
                    )
                )
            elif a.split_id in open_ and a.decision in (
                RecoveryDecision.RELEASED.value,
                RecoveryDecision.DROPPED_BY_OPERATOR.value,
            ):
                i = open_.pop(a.split_id)
                p = out[i]
                out[i] = ParkedSplit(
                    p.split_id,
                    p.quarantined_at,
                    p.reader_id,
                    p.error,
                    None,
                    a.checkpoint_id,
                    dropped=a.decision == RecoveryDecision.DROPPED_BY_OPERATOR.value,
                )
        # parked in a checkpoint whose audit retention already deleted
        for sid, position in sorted(self.parked_positions.items()):
            if sid not in open_:
                out.append(ParkedSplit(sid, -1, None, "(audit record no longer kept)", position))
        return out


def collect_report_data(
    state_store: DeltaStateStore,
    sink: SinkReader | None = None,
    *,
    fold_dir: str | os.PathLike[str] | None = None,
) -> ReportData:
    """Read everything the report shows (the state through :mod:`splitkeeper.delta.history`, the
    sink's tables through its reader, :class:`~splitkeeper.sinks.port.SinkReader`; no Spark). Called
    once per report. An upsert sink (the reader's ``upsert``): the records per epoch are its change
    table's, and the upsert facts (keys, upserts, deletes, the fold check's result read from
    ``fold_dir``) are shown; dead letters and a Spark transform's ``filtered_offsets`` are shown when
    the sink has them."""
    history = state_store.history
    timeline = tuple(history.timeline())
    phases = {e.checkpoint_id: e.phases_ms for e in timeline if e.kind is not CheckpointKind.ABORTED}
    heads = history.checkpoints(
        columns=["checkpoint_id", "kind", "parallelism", "processing_backlog", "commit_ms", "enumerator"]
    ).to_pylist()
    loads: dict[int, dict[int, int]] = {}
    backlog: Counter[int] = Counter()
    parked: dict[int, dict[str, int]] = {}
    lags: dict[int, dict[str, int]] = {}
    live: dict[int, list[SplitLag]] = {}
    for r in history.enumerator_rows().to_pylist():
        cid = int(r["checkpoint_id"])
        if r["status"] in LIVE_STATUSES and r["position"] is not None:
            split = Split(
                r["split_id"], position=int(r["position"]), end=r["end"], backlog_end=r["backlog_end"]
            )
            owner = None if r["owner"] is None else int(r["owner"])
            line = split_lag_of(split, r["status"], owner)
            live.setdefault(cid, []).append(line)
            if line.lag is not None:
                lags.setdefault(cid, {})[line.split_id] = line.lag
        if r["status"] == "assigned" and r["owner"] is not None:
            per_reader = loads.setdefault(cid, {})
            per_reader[int(r["owner"])] = per_reader.get(int(r["owner"]), 0) + 1
        elif r["status"] == "backlog" and r["backlog_end"] is not None and not r["backlog_finished"]:
            backlog[cid] += 1
        elif r["status"] == "quarantined":
            parked.setdefault(cid, {})[r["split_id"]] = int(r["position"])
    facts = []
    for r in heads:
        cid = int(r["checkpoint_id"])
        header = r["enumerator"] or {}
        per_reader = dict.fromkeys((int(x) for x in header.get("readers") or ()), 0)
        per_reader.update(loads.get(cid, {}))
        facts.append(
            CheckpointFacts(
                checkpoint_id=cid,
                kind=CheckpointKind(r["kind"]),
                parallelism=int(r["parallelism"]),
                processing_backlog=bool(r["processing_backlog"]),
                commit_ms=int(r["commit_ms"]),
                backlog_splits=backlog.get(cid, 0),
                loads=dict(sorted(per_reader.items())),
                phases_ms=phases.get(cid, {}),
            )
        )
    # Checkpoints retention deleted: their facts were archived to checkpoint_log before the delete.
    for r in history.archived_checkpoints().to_pylist():
        facts.append(
            CheckpointFacts(
                checkpoint_id=int(r["checkpoint_id"]),
                kind=CheckpointKind(r["kind"]),
                parallelism=int(r["parallelism"]),
                processing_backlog=bool(r["processing_backlog"]),
                commit_ms=int(r["commit_ms"]),
                backlog_splits=int(r["backlog_splits"] or 0),
                loads={
                    int(g["region_id"]): int(g["splits"] or 0)
                    for g in sorted(r["regions"] or [], key=lambda g: g["region_id"])
                },
                phases_ms=phases.get(int(r["checkpoint_id"]), {}),
            )
        )
    facts.sort(key=lambda f: f.checkpoint_id)
    audit = tuple(
        AuditRow(
            checkpoint_id=int(r["checkpoint_id"]),
            seq=int(r["seq"]),
            split_id=r["split_id"],
            reader_id=None if r["reader_id"] is None else int(r["reader_id"]),
            decision=r["decision"],
            detail=r["detail"] or "",
        )
        for r in history.committed_audit().to_pylist()
    )
    latest_kept = max((int(r["checkpoint_id"]) for r in heads), default=-1)
    records: dict[int, dict[int, int]] | None = None
    sink_text = None if sink is None else sink.location(SinkTable.KEYED if sink.upsert else SinkTable.RECORDS)
    upsert_facts = None
    if sink is not None and sink.upsert is not None:
        upsert_facts = read_upsert_facts(sink, fold_dir)
    if sink is not None:
        records = _records_per_epoch(sink)
    return ReportData(
        pipeline=state_store.pipeline_name,
        state_root=str(state_store.root),
        generated_at=datetime.now(UTC),
        timeline=timeline,
        checkpoints=tuple(facts),
        audit=audit,
        sink_path=sink_text,
        records=records,
        # where the latest kept checkpoint parks its quarantined splits
        parked_positions=parked.get(latest_kept, {}),
        dead_letters=(
            None
            if sink is None or not sink.location(SinkTable.DEAD_LETTERS)
            else read_dead_letter_facts(sink)
        ),
        upsert=upsert_facts,
        filtered=None if sink is None else read_filtered_facts(sink),
        lags=lags,
        splits=by_lag(live.get(latest_kept, [])),
        restart_checks=_restart_checks(state_store),
    )


def _restart_checks(state_store: DeltaStateStore) -> tuple[RecordedCheck, ...]:
    """The newest RESTART_CHECKS_SHOWN validate runs and in-run checks, newest first (delta-rs)."""
    from splitkeeper.delta.validations import ValidationRecords

    rows = ValidationRecords(state_store.tables, state_store.pipeline_name).recorded()
    validate = [r for r in rows if not r.in_run][:RESTART_CHECKS_SHOWN]
    in_run = [r for r in rows if r.in_run][:RESTART_CHECKS_SHOWN]
    return tuple(sorted((*validate, *in_run), key=lambda r: r.at, reverse=True))


def _records_per_epoch(sink: SinkReader) -> dict[int, dict[int, int]]:
    """Epoch -> region -> records of the sink's records table (an upsert sink's change table); empty
    when there is no table.

    Read without Spark (the two columns only, :meth:`~splitkeeper.sinks.port.SinkReader.rows`): the
    report runs where an Airflow task runs, and a group-by count needs no cluster application.
    """
    records: dict[int, dict[int, int]] = {}
    rows = sink.rows(SinkTable.RECORDS, ["epoch", "region"])
    counted = rows.group_by(["epoch", "region"]).aggregate([([], "count_all")])
    for epoch, region, count in zip(
        counted["epoch"].to_pylist(),
        counted["region"].to_pylist(),
        counted["count_all"].to_pylist(),
        strict=True,
    ):
        records.setdefault(int(epoch), {})[int(region)] = int(count)
    return records
