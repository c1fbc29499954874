"""The only read API for a pipeline's history: timeline, audit trail, archived checkpoints.

The restart checks (:mod:`splitkeeper.quality.checks`), the report
(:mod:`splitkeeper.report.data`) and ``status`` read the state tables through this
module only; none of them opens a state table by path. Everything is read with
delta-rs and pyarrow (no Spark); results are pyarrow tables or typed values, and a
Spark user builds frames from them with ``spark.createDataFrame(table)``.

Rules:

1. *The orphan-attempt rule*, decided here and nowhere else: the ``enumerator_state``
   and ``audit`` rows of checkpoint N count only for the attempt that N's
   ``checkpoints`` row names, or, once retention deleted that row, the attempt its
   ``checkpoint_log`` archive names. Rows of other attempts (a driver killed before
   its row, a run that lost the fence) are never returned. Rows of a checkpoint id
   neither table knows count as they are when the id is below the newest known
   checkpoint (state written before archiving existed), and never above it (an epoch
   whose row is not written yet).
2. The timeline is whole: kept checkpoints (their rows), completed checkpoints
   retention deleted (archived to ``checkpoint_log`` just before), aborted attempts
   (logged there); ordered by id, then time. A checkpoint both kept and archived (a
   driver died between the archive and the delete) shows once.
3. *Whole enumerator snapshots.* Which ``enumerator_state`` rows make up checkpoint N (the
   attempt N's row names; for a delta, its base's rows under the same rule with the delta
   applied; the row counts of rule 4; one StateError when a base is gone) is decided by
   :func:`snapshot_rows` and nowhere else: the store's restore and the readers below
   call it. :meth:`StateHistory.enumerator_rows` returns every
   checkpoint's full snapshot rows, also of a checkpoint whose stored rows are a delta
   against a base (``checkpoints.enumerator_base``, store rule 6): the base's rows
   (under rule 1) with the delta applied, re-encoded as a full snapshot would have
   been written (:func:`serde.enumerator_to_rows`), stamped with the checkpoint's own id
   and attempt. Readers never see a delta or a tombstone.
4. *Whole rows.* A checkpoints row records how many ``enumerator_state`` rows its attempt
   wrote (``enumerator_row_count``; NULL in older state: not checked). Every reader of a
   checkpoint's enumerator rows (:func:`snapshot_rows`) compares, and another number is a
   StateError naming the table, its log and ``recover --repair`` (:func:`rows_error`): rows
   lost to a removed log entry or data file are never read as an older or smaller snapshot.
5. Read-only: never writes; a missing table reads as empty. May run while the
   pipeline runs (it sees the commits landed so far).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from splitkeeper.core.failures import PHASES, RegionFailure
from splitkeeper.core.types import AuditRecord, CheckpointKind, RegionOutcome
from splitkeeper.delta import serde
from splitkeeper.delta.schemas import spec
from splitkeeper.delta.tables import REPAIR_ADVICE, StateTables
from splitkeeper.errors import CheckpointError, StateError

__all__ = [
    "StateHistory",
    "TimelineEntry",
    "base_missing_error",
    "merge_delta",
    "rows_error",
    "snapshot_rows",
]


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One checkpoint attempt as the timeline shows it: completed (global/regional) or aborted."""

    checkpoint_id: int
    kind: CheckpointKind
    outcomes: dict[int, RegionOutcome]
    ref_checkpoint_ids: dict[int, int]
    at: datetime
    commit_ms: int | None = None
    reason: str = ""
    run_id: str = ""
    processing_backlog: bool | None = None  # completed: the mode once it completed; aborted: None
    # milliseconds per phase (core.failures.PHASES) that the row recorded: plan, read, sink, commit
    phases_ms: dict[str, int] = field(default_factory=dict)
    failures: tuple[RegionFailure, ...] = ()  # why each failed region failed, where recorded

    @property
    def failed_regions(self) -> tuple[int, ...]:
        return tuple(sorted(r for r, o in self.outcomes.items() if o is not RegionOutcome.ACK))


#: The columns of a checkpoint's phase times and failed regions' causes (checkpoints, checkpoint_log).
INCIDENT_COLUMNS = ("plan_ms", "read_ms", "sink_ms", "failures")


def _phases(row: Mapping[str, Any]) -> dict[str, int]:
    """The phase times a row recorded (``<phase>_ms`` columns that are not NULL), in PHASES order."""
    return {p: int(row[f"{p}_ms"]) for p in PHASES if row.get(f"{p}_ms") is not None}


def _at(value: Any) -> datetime:
    if value is None:
        return datetime.fromtimestamp(0, tz=UTC)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _pairs_mask(table: pa.Table, pairs: Mapping[int, str], floor_unknown: int | None) -> pa.Array:
    """Rule 1 as a boolean mask over ``table`` (``checkpoint_id``, ``attempt_id`` columns)."""
    ids = table.column("checkpoint_id").to_pylist()
    attempts = table.column("attempt_id").to_pylist()
    mask = []
    for cid, attempt in zip(ids, attempts, strict=True):
        named = pairs.get(int(cid))
        if named is not None:
            mask.append(named == attempt)
        else:
            mask.append(floor_unknown is not None and int(cid) < floor_unknown)
    return pa.array(mask, pa.bool_())


def merge_delta(base: pa.Table, delta: pa.Table) -> pa.Table:
    """The full ``enumerator_state`` rows of a delta's checkpoint (store rule 6): the rows of
    its base's full snapshot ``base`` without the entries ``delta`` names (a split's place,
    or its backlog entry: :func:`serde.enumerator_delta`), then ``delta``'s rows without its
    tombstones. Both tables have the ``enumerator_state`` columns; the ``checkpoint_id`` and
    ``attempt_id`` of the result are mixed (callers decode or stamp their own). Arrow
    compute only: no Python loop over the rows."""
    backlog = pa.array(serde.BACKLOG_STATUSES, pa.string())
    in_backlog = pc.is_in(delta.column("status"), value_set=backlog)
    ids = delta.column("split_id").combine_chunks()
    backlog_ids = pc.filter(ids, in_backlog.combine_chunks())
    place_ids = pc.filter(ids, pc.invert(in_backlog).combine_chunks())
    named = pc.if_else(
        pc.is_in(base.column("status"), value_set=backlog),
        pc.is_in(base.column("split_id"), value_set=backlog_ids),
        pc.is_in(base.column("split_id"), value_set=place_ids),
    )
    tombstones = pa.array(serde.ENUMERATOR_TOMBSTONES, pa.string())
    live = delta.filter(pc.invert(pc.is_in(delta.column("status"), value_set=tombstones)))
    return pa.concat_tables([base.filter(pc.invert(named)), live.select(base.schema.names).cast(base.schema)])


def rows_error(
    tables: StateTables, pipeline: str, checkpoint_id: int, attempt: str, expected: int, found: int
) -> StateError:
    """The StateError of rule 4: checkpoint ``checkpoint_id``'s enumerator rows are not all there."""
    uri = tables.uri("enumerator_state")
    version = tables.version("enumerator_state")
    return StateError(
        f"checkpoint {checkpoint_id} of pipeline {pipeline!r} cannot be read: its checkpoints row names "
        f"{expected} rows of attempt {attempt} in state table enumerator_state ({uri}), and {found} are "
        f"there. Rows were lost after the commit (an entry of {uri}/_delta_log removed or rolled back, "
        f"or a data file dropped; the table's log is at version {version}). Nothing was restored and "
        f"nothing was changed. {REPAIR_ADVICE}",
        table="enumerator_state",
        path=uri,
        checkpoint_id=int(checkpoint_id),
        expected=expected,
        found=found,
    )


def base_missing_error(
    tables: StateTables, pipeline: str, deltas: Mapping[int, int], missing: Sequence[int]
) -> StateError:
    """The StateError of rule 3: checkpoints ``deltas`` (id -> base id) hold their enumerator state as
    deltas against checkpoints ``missing``, which are not in the state store."""
    named = sorted(cid for cid, base in deltas.items() if base in missing)
    return StateError(
        f"checkpoints {named} of pipeline {pipeline!r} hold their enumerator state as deltas against "
        f"checkpoints {list(missing)}, which are not in the state store at {tables.root}: the state is "
        "incomplete (retention keeps every kept checkpoint's base); restore an older checkpoint or a backup "
        "of the state directory",
        checkpoint_ids=named,
        missing=list(missing),
    )


#: The ``checkpoints`` columns :func:`snapshot_rows` reads of a checkpoint.
HEAD_COLUMNS = ("checkpoint_id", "attempt_id", "enumerator", "enumerator_base", "enumerator_row_count")


def _attempts_filter(pairs: Mapping[int, str]) -> Any:
    """Rows of checkpoint id ``i`` and attempt ``pairs[i]`` (rule 1), as a filter pushed into the read."""
    expression: Any = None
    for cid, attempt in sorted(pairs.items()):
        one = (pc.field("checkpoint_id") == cid) & (pc.field("attempt_id") == attempt)
        expression = one if expression is None else expression | one
    return expression


def snapshot_rows(
    tables: StateTables,
    pipeline: str,
    heads: Mapping[int, Mapping[str, Any]],
    wanted: Collection[int],
    *,
    checkpoints: Any = None,
    enumerator_state: Any = None,
) -> dict[int, pa.Table]:
    """The attempt/base rule (rules 1, 3, 4), decided here and nowhere else: per checkpoint id of
    ``wanted`` (each with its ``checkpoints`` row in ``heads``, :data:`HEAD_COLUMNS` at least), the
    ``enumerator_state`` rows its snapshot is made of: the rows of the attempt its row names; for a
    delta (``enumerator_base`` = B), B's rows under the same rule with the delta applied
    (:func:`merge_delta`; ids and attempts of the result mixed). Each checkpoint's row count is checked
    (:func:`rows_error`); a base neither in ``heads`` nor in the ``checkpoints`` table is
    :func:`base_missing_error`. ``checkpoints`` and ``enumerator_state``: tables loaded at an older
    version (time travel) instead of the latest."""
    heads = dict(heads)
    bases = {
        cid: int(head["enumerator_base"])
        for cid in wanted
        if (head := heads[cid]).get("enumerator") is not None and head.get("enumerator_base") is not None
    }
    unknown = sorted(set(bases.values()) - set(heads))
    if unknown:
        found = tables.read(
            "checkpoints",
            partitions=[("checkpoint_id", "in", unknown)],
            columns=list(HEAD_COLUMNS),
            table=checkpoints,
        ).to_pylist()
        heads.update({int(r["checkpoint_id"]): r for r in found if int(r["checkpoint_id"]) in unknown})
        missing = sorted(set(unknown) - set(heads))
        if missing:
            raise base_missing_error(tables, pipeline, bases, missing)
    read_ids = sorted(set(wanted) | set(bases.values()))
    if not read_ids:
        return {}
    data = tables.read(
        "enumerator_state",
        partitions=[("checkpoint_id", "in", read_ids)],
        filter=_attempts_filter({i: str(heads[i]["attempt_id"]) for i in read_ids}),
        table=enumerator_state,
    )
    counts = Counter(  # counted by Arrow: a Python int per row cost 0.6 s at 1,000,000 rows
        {
            int(v["values"]): int(v["counts"])
            for v in pc.value_counts(data.column("checkpoint_id")).to_pylist()
        }
    )
    for cid in read_ids:
        head = heads[cid]
        expected = head.get("enumerator_row_count")
        if (
            head.get("enumerator") is not None
            and expected is not None
            and int(expected) != counts.get(cid, 0)
        ):
            raise rows_error(
                tables, pipeline, cid, str(head["attempt_id"]), int(expected), counts.get(cid, 0)
            )

    def of(cid: int) -> pa.Table:
        return data.filter(pc.field("checkpoint_id") == cid)

    return {cid: merge_delta(of(bases[cid]), of(cid)) if cid in bases else of(cid) for cid in wanted}


class StateHistory:
    """The history of one pipeline's state under ``tables`` (see the module doc)."""

    def __init__(self, tables: StateTables, pipeline: str) -> None:
        self.tables = tables
        self.pipeline = pipeline

    # -- checkpoints -----------------------------------------------------------------

    def checkpoints(self, up_to: int | None = None, columns: Sequence[str] | None = None) -> pa.Table:
        """The kept checkpoints' rows (ids ascending), up to ``up_to`` when given."""
        data = self.tables.read("checkpoints", columns=columns)
        if up_to is not None:
            data = data.filter(pc.field("checkpoint_id") <= up_to)
        return data.sort_by("checkpoint_id")

    def split_weights(self, checkpoint_id: int) -> dict[str, float]:
        """The owned splits' weights checkpoint ``checkpoint_id`` recorded (strategy weighted; else empty)."""
        from splitkeeper.delta.serde import split_weights_from_rows

        rows = (
            self.tables.read("checkpoints", columns=["checkpoint_id", "split_weights"])
            .filter(pc.field("checkpoint_id") == checkpoint_id)
            .column("split_weights")
            .to_pylist()
        )
        return split_weights_from_rows(rows[0] if rows else None)

    def kept_ids(self) -> list[int]:
        return sorted(
            int(i) for i in self.tables.read("checkpoints", columns=["checkpoint_id"]).column(0).to_pylist()
        )

    def archived_checkpoints(self) -> pa.Table:
        """The ``checkpoint_log`` rows of completed checkpoints retention deleted: one per id, none kept."""
        return self.timeline_tables()[1].sort_by("checkpoint_id")

    def timeline_tables(
        self, columns: Sequence[str] | None = None, log_columns: Sequence[str] = ()
    ) -> tuple[pa.Table, pa.Table, pa.Table]:
        """Rule 2, column-wise: the rows of the timeline's attempts as three tables, ``(kept, archived,
        aborted)``: the ``checkpoints`` rows; the ``checkpoint_log`` rows of completed checkpoints
        retention deleted (the first logged per id, none kept); the aborted attempts logged. With
        ``columns`` (names both tables have; ``checkpoint_id`` and ``kind`` are read anyway) only those,
        and ``log_columns`` of the log too. What :meth:`timeline` lists, and what the metrics count at
        start without building an entry per attempt."""
        wanted = None if columns is None else list(dict.fromkeys(["checkpoint_id", "kind", *columns]))
        kept = self.tables.read("checkpoints", columns=wanted)
        logged = self.tables.read(
            "checkpoint_log", columns=None if wanted is None else [*wanted, *log_columns]
        )
        aborted = logged.filter(pc.field("kind") == CheckpointKind.ABORTED.value)
        completed = logged.filter(
            (pc.field("kind") != CheckpointKind.ABORTED.value)
            & ~pc.field("checkpoint_id").isin(kept.column("checkpoint_id"))
        )
        index = pa.array(range(completed.num_rows), pa.int64())
        rows = pa.table({"checkpoint_id": completed.column("checkpoint_id"), "row": index})
        first = rows.group_by("checkpoint_id", use_threads=False).aggregate([("row", "min")])["row_min"]
        return kept, completed.take(first.take(pc.sort_indices(first))), aborted  # in the log's order

    def why_not_kept(self, checkpoint_id: int) -> str:
        """Why ``checkpoint_id`` is not a kept checkpoint, for an error's words: removed by retention
        (archived, or older than every kept one), naming the oldest retained; else never completed."""
        kept = self.kept_ids()
        archived = set(self.archived_checkpoints().column("checkpoint_id").to_pylist())
        if checkpoint_id in archived or (kept and checkpoint_id < kept[0]):
            oldest = f"the oldest checkpoint retained is {kept[0]}" if kept else "no checkpoint is retained"
            return (
                "was removed by retention (checkpoint.retain_checkpoints keeps the newest ones, and those "
                f"a kept checkpoint refers to; {oldest})"
            )
        return "never completed (its epoch was aborted, or never ran)"

    def committed_attempts(self) -> dict[int, str]:
        """Checkpoint id -> the attempt whose rows count (rule 1): kept rows first, then archives."""
        pairs: dict[int, str] = {}
        archived = self.archived_checkpoints().select(["checkpoint_id", "attempt_id"]).to_pylist()
        for row in archived:
            if row["attempt_id"] is not None:
                pairs[int(row["checkpoint_id"])] = str(row["attempt_id"])
        for row in self.tables.read("checkpoints", columns=["checkpoint_id", "attempt_id"]).to_pylist():
            pairs[int(row["checkpoint_id"])] = str(row["attempt_id"])
        return pairs

    # -- rows under the orphan-attempt rule ----------------------------------------------

    def committed_audit(self, up_to: int | None = None, decisions: Collection[str] | None = None) -> pa.Table:
        """The audit rows that count (rule 1) of checkpoints up to ``up_to`` (all when None),
        optionally only ``decisions``; ordered by checkpoint id and seq."""
        pairs = self.committed_attempts()
        data = self.tables.read("audit")
        if up_to is not None:
            data = data.filter(pc.field("checkpoint_id") <= up_to)
        if decisions is not None:
            data = data.filter(pc.is_in(pc.field("decision"), pa.array(sorted(decisions), pa.string())))
        floor = max(pairs) if pairs else None
        data = data.filter(_pairs_mask(data, pairs, floor))
        return data.sort_by([("checkpoint_id", "ascending"), ("seq", "ascending")])

    def audit_for(self, checkpoint_id: int) -> list[AuditRecord]:
        """The audit records committed with kept checkpoint ``checkpoint_id``, in their order;
        CheckpointError naming the available ids when it is not kept."""
        heads = {
            int(r["checkpoint_id"]): r["attempt_id"]
            for r in self.tables.read("checkpoints", columns=["checkpoint_id", "attempt_id"]).to_pylist()
        }
        if int(checkpoint_id) not in heads:
            raise CheckpointError(
                f"checkpoint {checkpoint_id} of pipeline {self.pipeline!r} is not in the state store "
                f"(available: {sorted(heads)})",
                checkpoint_id=checkpoint_id,
            )
        rows = self.tables.read(
            "audit",
            partitions=[("checkpoint_id", "=", int(checkpoint_id))],
            filter=(pc.field("checkpoint_id") == int(checkpoint_id))
            & (pc.field("attempt_id") == heads[int(checkpoint_id)]),
        ).to_pylist()
        return serde.audit_from_rows(rows)

    def enumerator_rows(self, checkpoint_ids: Collection[int] | None = None) -> pa.Table:
        """The full ``enumerator_state`` rows (rules 1 and 3) of the kept checkpoints ``checkpoint_ids``
        (all kept ones when None), each stamped with its checkpoint's id and attempt."""
        rows = self.tables.read("checkpoints", columns=[*HEAD_COLUMNS, "parallelism"]).to_pylist()
        heads = {int(r["checkpoint_id"]): r for r in rows}
        wanted = sorted(heads if checkpoint_ids is None else set(checkpoint_ids) & set(heads))
        parts: list[pa.Table] = []
        rebuilt: list[dict[str, Any]] = []
        for cid, data in snapshot_rows(self.tables, self.pipeline, heads, wanted).items():
            head = heads[cid]
            if head["enumerator"] is None or head["enumerator_base"] is None:
                parts.append(data)  # stored as a full snapshot: the rows as they are
                continue
            snapshot = serde.enumerator_from_rows(head["enumerator"], data.to_pylist())
            key = {"checkpoint_id": cid, "attempt_id": str(head["attempt_id"])}
            rebuilt.extend({**r, **key} for r in serde.enumerator_to_rows(snapshot))
        if rebuilt:
            parts.append(spec("enumerator_state").rows(rebuilt))
        if not parts:
            return spec("enumerator_state").empty()
        return pa.concat_tables(parts, promote_options="permissive").sort_by("checkpoint_id")

    # -- the timeline ------------------------------------------------------------------

    def timeline(self) -> list[TimelineEntry]:
        """Every checkpoint attempt of the pipeline's history, by id then time (rule 2)."""

        def ref_ids(regions: Sequence[Mapping[str, Any]]) -> dict[int, int]:
            return {
                int(g["region_id"]): int(g["ref_checkpoint_id"])
                for g in regions
                if g.get("ref_checkpoint_id") is not None
            }

        def outcomes(regions: Sequence[Mapping[str, Any]]) -> dict[int, RegionOutcome]:
            return {int(g["region_id"]): RegionOutcome(g["outcome"]) for g in regions}

        entries: list[TimelineEntry] = []
        kept, archived, aborted = self.timeline_tables(
            ["regions", "created_at", "commit_ms", "run_id", "processing_backlog", *INCIDENT_COLUMNS],
            log_columns=["logged_at", "reason"],
        )
        # a kept checkpoint's reason is its decision record's (the coordinator's sentence); an epoch
        # has one unless a run died after its decision (then the latest, the one a redo committed)
        decided = self.tables.read(
            "decisions",
            columns=["epoch_id", "reason", "decided_at"],
            filter=pc.field("epoch_id").isin(kept.column("checkpoint_id")),
        )
        reasons = {
            int(r["epoch_id"]): r["reason"] or ""
            for r in sorted(decided.to_pylist(), key=lambda r: r["decided_at"])
        }
        completed = [*kept.to_pylist(), *archived.sort_by("checkpoint_id").to_pylist()]
        for row in completed:
            regions = row["regions"] or []
            entries.append(
                TimelineEntry(
                    checkpoint_id=int(row["checkpoint_id"]),
                    kind=CheckpointKind(row["kind"]),
                    outcomes=outcomes(regions),
                    ref_checkpoint_ids=ref_ids(regions),
                    at=_at(row["created_at"]),
                    commit_ms=None if row["commit_ms"] is None else int(row["commit_ms"]),
                    run_id=row["run_id"],
                    processing_backlog=row["processing_backlog"],
                    phases_ms=_phases(row),
                    failures=serde.failures_from_rows(row.get("failures")),
                    reason=reasons.get(int(row["checkpoint_id"]), row.get("reason") or ""),
                )
            )
        for row in aborted.to_pylist():
            entries.append(
                TimelineEntry(
                    checkpoint_id=int(row["checkpoint_id"]),
                    kind=CheckpointKind(row["kind"]),
                    outcomes=outcomes(row["regions"] or []),
                    ref_checkpoint_ids={},
                    at=_at(row["logged_at"]),
                    reason=row["reason"],
                    run_id=row["run_id"],
                    failures=serde.failures_from_rows(row.get("failures")),
                )
            )
        return sorted(entries, key=lambda e: (e.checkpoint_id, e.at))
