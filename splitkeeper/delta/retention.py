"""Retention, compaction and vacuum of a pipeline's state tables.

Rules:

1. :func:`retain` asks the core (:meth:`splitkeeper.core.checkpoint.CheckpointStore.retain`)
   which checkpoints may go: never one a kept checkpoint references, directly or
   transitively, nor a pinned one, nor the full enumerator snapshot a kept checkpoint's
   delta is against (``checkpoints.enumerator_base``, store rule 6). It archives their timeline facts to
   ``checkpoint_log`` (one append), then deletes their ``checkpoints`` rows (one
   delete on the partition column: whole files, nothing rewritten). From that commit
   on they do not exist. A driver dying between the two leaves a checkpoint both kept
   and archived; the history shows it once and the next retention deletes it.
   :func:`delete_checkpoints` refuses (CheckpointError) to delete a base a checkpoint it
   keeps still needs.
2. :func:`compact` deletes rows nothing reads any more: ``enumerator_state`` rows of
   checkpoints up to the newest kept one that are not the attempt a kept row names
   (deleted checkpoints, killed or losing attempts), ``audit`` rows of attempts no kept
   row or archive names (the audit of committed checkpoints is history and stays), and
   ``epoch_plans``/``decisions`` of epochs older than every kept checkpoint. Rows of
   epochs after the newest checkpoint (a plan being read, a decision waiting for its
   redo) are never touched. Then it bin-packs small files (``optimize.compact``), of the
   ``validations`` table too when it exists (one small append per run: every run records the
   in-run check of its restore; its rows are history and all stay).
3. :func:`vacuum` physically deletes the files that commits removed more than
   ``history_hours`` ago (delta-rs's "lite" vacuum: only files the log tombstoned, never
   an untracked file such as a staged file moved into the sink before its commit) and
   the expired log files. Files of kept checkpoints are live in the log, so a retained
   ref chain, and every epoch not yet committed, keeps everything it needs. Time
   travel (``load_checkpoint(as_of=...)``) reaches back ``history_hours`` afterwards.

Each function returns what it removed. Called on the driver by the store (retain,
every ``compact_every`` checkpoints compact) or by an operator; safe to call again.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from splitkeeper.core.checkpoint import CheckpointStore
from splitkeeper.delta.history import StateHistory
from splitkeeper.delta.schemas import STATE_TABLES, spec
from splitkeeper.delta.tables import StateTables, guarded, sql_string
from splitkeeper.errors import CheckpointError


class RetainedStore(Protocol):
    """What retention needs of a pipeline's state store
    (:class:`~splitkeeper.delta.checkpoints.DeltaStateStore`, which calls it; this module does not
    import the store)."""

    tables: StateTables
    pipeline_name: str
    history: StateHistory

    def kept(self) -> tuple[int, tuple[Any, ...]]: ...

    def mirror(self) -> CheckpointStore: ...

    def forget_mirror(self, table: Any = None, deleted: Collection[int] = ()) -> None: ...

    def _writable(self, what: str) -> None: ...


#: The restart checks' verdicts (:mod:`splitkeeper.delta.validations`): compacted and vacuumed with the
#: state tables when it exists, never deleted from.
VALIDATIONS = "validations"


__all__ = [
    "Compaction",
    "archived_row",
    "compact",
    "delete_checkpoints",
    "retain",
    "retention_hours",
    "vacuum",
    "vacuum_plan",
]

log = logging.getLogger(__name__)


def archived_row(row: Mapping[str, Any], logged_at: datetime) -> dict[str, Any]:
    """The ``checkpoint_log`` row of a completed checkpoint, from its ``checkpoints`` row.

    ``regions[*].splits`` becomes the region's split count; ``backlog_splits`` counts the
    splits still short of their backlog end.
    """
    regions = list(row.get("regions") or ())
    splits = [split for region in regions for split in region.get("splits") or ()]
    in_backlog = sum(
        1 for s in splits if s.get("backlog_end") is not None and int(s["position"]) < int(s["backlog_end"])
    )
    return {
        "checkpoint_id": row["checkpoint_id"],
        "kind": row["kind"],
        "regions": [
            {
                "region_id": region["region_id"],
                "outcome": region["outcome"],
                "ref_checkpoint_id": region.get("ref_checkpoint_id"),
                "splits": len(region.get("splits") or ()),
            }
            for region in regions
        ],
        "reason": "",
        "run_id": row["run_id"],
        "logged_at": logged_at,
        "attempt_id": row["attempt_id"],
        "parallelism": row["parallelism"],
        "processing_backlog": row["processing_backlog"],
        "backlog_splits": in_backlog,
        "commit_ms": row["commit_ms"],
        "created_at": row["created_at"],
        **{name: row.get(name) for name in ("plan_ms", "read_ms", "sink_ms", "failures")},
    }


def retain(
    store: RetainedStore,
    keep_latest: int,
    pinned: Collection[int] = (),
    *,
    mid_retention: Callable[[], None] | None = None,
) -> list[int]:
    """Rule 1; returns the deleted checkpoint ids, ascending. ``mid_retention`` (a crash point) is
    called between the archive and the delete (when nothing is deleted: at the end)."""
    store._writable("apply retention")
    base_of = {e.light.checkpoint_id: e.enumerator_base for e in store.kept()[1]}
    mirror = store.mirror()
    pins = set(pinned)
    while True:  # the core's rule decides; the bases of the checkpoints it keeps are pinned too
        deleted = mirror.expired(keep_latest, pinned=pins)
        survivors = set(base_of) - set(deleted)
        needed = {b for c in survivors if (b := base_of[c]) is not None and b in base_of} - pins
        if not needed & set(deleted):
            break
        pins |= needed
    delete_checkpoints(store, deleted, mid_retention=mid_retention)
    return deleted


def delete_checkpoints(
    store: RetainedStore,
    checkpoint_ids: Sequence[int],
    *,
    mid_retention: Callable[[], None] | None = None,
) -> None:
    """Archive, then delete, the ``checkpoints`` rows of ``checkpoint_ids`` (no chain check: see
    :func:`retain`); ``mid_retention`` is called in between."""
    store._writable("delete checkpoints")
    wanted = sorted({int(i) for i in checkpoint_ids})
    if not wanted:
        if mid_retention is not None:
            mid_retention()
        return
    needed = {
        e.light.checkpoint_id: e.enumerator_base
        for e in store.kept()[1]
        if e.enumerator_base in wanted and e.light.checkpoint_id not in wanted
    }
    if needed:
        raise CheckpointError(
            f"cannot delete checkpoints {sorted(set(needed.values()))} of pipeline {store.pipeline_name!r}: "
            f"kept checkpoints {sorted(needed)} hold their enumerator state as a delta against them; "
            "delete those checkpoints too, or keep their bases",
            checkpoint_ids=wanted,
            needed_by=sorted(needed),
        )
    rows = store.tables.read("checkpoints", partitions=[("checkpoint_id", "in", wanted)]).to_pylist()
    logged_at = datetime.now(UTC)
    if rows:
        store.tables.append(
            "checkpoint_log", spec("checkpoint_log").rows([archived_row(r, logged_at) for r in rows])
        )
    if mid_retention is not None:
        mid_retention()
    ids_sql = ", ".join(str(i) for i in wanted)
    store.tables.delete("checkpoints", f"checkpoint_id IN ({ids_sql})")
    # the mirror drops them without reading the table again (when no other commit came between)
    store.forget_mirror(store.tables.get("checkpoints", fresh=False), wanted)


@dataclass(frozen=True, slots=True)
class Compaction:
    """What :func:`compact` removed: rows per table, and files rewritten per table by the bin-packing."""

    deleted_rows: dict[str, int] = field(default_factory=dict)
    compacted_files: dict[str, int] = field(default_factory=dict)


def _or_pairs(pairs: Sequence[tuple[int, str]]) -> str:
    return " OR ".join(f"(checkpoint_id = {cid} AND attempt_id = {sql_string(a)})" for cid, a in pairs)


def _delete(store: RetainedStore, table_name: str, predicate: str) -> int:
    return store.tables.delete(table_name, predicate)


def compact(store: RetainedStore, *, mid_compaction: Callable[[], None] | None = None) -> Compaction:
    """Rule 2; returns the rows deleted and the files compacted, per table. ``mid_compaction`` (a
    crash point) is called after the rows were deleted, before the files are bin-packed."""
    store._writable("compact the state tables")
    kept = store.kept()[1]
    deleted: dict[str, int] = {}
    if kept:
        heads = {k.light.checkpoint_id: k.attempt_id for k in kept}
        latest, oldest = max(heads), min(heads)
        # enumerator_state: only the rows a kept row names are ever read
        present = store.tables.read("enumerator_state", columns=["checkpoint_id", "attempt_id"])
        pairs = {
            (int(c), str(a)) for c, a in zip(*(present.column(i).to_pylist() for i in (0, 1)), strict=True)
        }
        gone_ids = sorted({c for c, _a in pairs if c <= latest and c not in heads})
        lost = sorted((c, a) for c, a in pairs if c in heads and heads[c] != a)
        count = 0
        if gone_ids:
            count += _delete(store, "enumerator_state", f"checkpoint_id IN ({', '.join(map(str, gone_ids))})")
        if lost:
            count += _delete(store, "enumerator_state", _or_pairs(lost))
        deleted["enumerator_state"] = count
        # audit: history; only attempts that no kept row or archive names go
        committed = store.history.committed_attempts()
        present = store.tables.read("audit", columns=["checkpoint_id", "attempt_id"])
        pairs = {
            (int(c), str(a)) for c, a in zip(*(present.column(i).to_pylist() for i in (0, 1)), strict=True)
        }
        orphans = sorted((c, a) for c, a in pairs if c in committed and committed[c] != a)
        deleted["audit"] = _delete(store, "audit", _or_pairs(orphans)) if orphans else 0
        deleted["epoch_plans"] = _delete(store, "epoch_plans", f"epoch_id < {oldest}")
        deleted["decisions"] = _delete(store, "decisions", f"epoch_id < {oldest}")
    if mid_compaction is not None:
        mid_compaction()
    compacted: dict[str, int] = {}
    for name in STATE_TABLES:
        table = store.tables.require(name)
        metrics: dict[str, Any] = guarded(table.table_uri, table.optimize.compact)
        compacted[name] = int(metrics.get("numFilesRemoved") or 0)
    history = store.tables.get(VALIDATIONS)  # created by the first restart check: maybe not yet
    if history is not None:
        metrics = guarded(history.table_uri, history.optimize.compact)
        compacted[VALIDATIONS] = int(metrics.get("numFilesRemoved") or 0)
    store.forget_mirror()
    return Compaction(deleted, compacted)


def retention_hours(history_hours: float) -> int:
    """The whole hours VACUUM keeps for a history window of ``history_hours``: rounded up, never down.

    delta-rs takes whole hours; rounding down would delete history the window
    promises (0.5 would keep none).
    """
    if not history_hours >= 0:  # also refuses NaN
        from splitkeeper.errors import InvalidParameterError

        raise InvalidParameterError("history_hours", history_hours, "hours >= 0")
    return math.ceil(history_hours)


def _vacuum_lite(table: Any, hours: int) -> list[str]:
    return list(table.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False))


def vacuum_plan(store: RetainedStore, history_hours: float) -> dict[str, list[str]]:
    """What :func:`vacuum` would delete now, per table (read-only: nothing is deleted)."""
    hours = retention_hours(history_hours)
    planned: dict[str, list[str]] = {}
    for name in (*STATE_TABLES, VALIDATIONS):
        table = store.tables.get(name)
        if table is None:
            continue
        listing = functools.partial(
            table.vacuum, retention_hours=hours, dry_run=True, enforce_retention_duration=False
        )
        planned[name] = sorted(guarded(table.table_uri, listing))
    return planned


def vacuum(store: RetainedStore, history_hours: float) -> dict[str, list[str]]:
    """Rule 3; returns the files deleted, per table."""
    store._writable("vacuum the state tables")
    hours = retention_hours(history_hours)
    removed: dict[str, list[str]] = {}
    for name in (*STATE_TABLES, VALIDATIONS):
        found = store.tables.get(name) if name == VALIDATIONS else store.tables.require(name)
        if found is None:
            continue
        table = found
        files = guarded(table.table_uri, functools.partial(_vacuum_lite, table, hours))
        guarded(table.table_uri, table.cleanup_metadata)
        removed[name] = sorted(files)
    return removed
