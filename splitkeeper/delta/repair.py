"""``recover --repair``: rebuild the rows of kept checkpoints that were lost or damaged after their commit.

A checkpoint's ``enumerator_state`` and ``audit`` rows are also in the decision record of
its epoch (the ``decisions`` table, written before the sink commit and kept for every kept
checkpoint), so they can be written again exactly. Nothing else is rebuilt: a damaged
``checkpoints``, ``decisions`` or sink table is restored from a backup.

Contract (one call, by a process that holds the pipeline's lease; idempotent; with nothing
damaged it writes nothing):

1. *Log.* For each of :data:`~splitkeeper.delta.tables.REPAIRABLE`: a newest
   ``_delta_log/<version>.json`` that is not valid JSON lines is moved to
   ``<root>/_damaged/<table>/_delta_log/`` (the table rolls back one version: its rows are
   rebuilt by step 3). A damaged older entry is a StateError naming it (restore it from a
   backup: later versions depend on it).
2. *Data files.* Every active data file of those tables is opened (its parquet footer);
   one that is missing, truncated or damaged is moved to ``<root>/_damaged/<table>/`` and
   dropped from the table by one FSCK commit (``DeltaTable.repair``).
3. *Rows.* For every kept checkpoint, ascending (a delta's base before the delta), its
   enumerator rows are read as a restore reads them (row count, decoding); when that
   fails, its rows of the attempt its row names are deleted and written again from the
   decision of its epoch whose checkpoint is the row's (a full snapshot, or the delta
   against its base, as the store wrote them), then read back. Audit rows of that
   attempt are written again from the decision when none are left. A checkpoint with no
   matching decision is a StateError (restore from a backup).
4. *Offset resets the sink misses.* When the sink records an older epoch than the latest
   checkpoint and EVERY checkpoint after it is an offset reset (``offsets reset``), each is
   committed to the sink again from its decision, oldest first
   (:func:`~splitkeeper.core.operator.reset_action`; :func:`repair_sink_resets`). A splitkeeper
   before issue 36 (item 14) made no sink commit for a backward reset whose delete matched no
   row (back to where a forward reset left the split), so every later open refused the
   pipeline. A sink that misses any other commit is left alone (restore it from a backup, as
   the open's error says).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from splitkeeper.core.ports import EpochDecision
from splitkeeper.delta import serde, storage
from splitkeeper.delta.schemas import spec
from splitkeeper.delta.tables import REPAIRABLE, StateTables, guarded, open_table, sql_string
from splitkeeper.errors import DamagedTableError, StateError

__all__ = ["RepairReport", "repair_files", "repair_rows", "repair_sink_resets"]

log = logging.getLogger(__name__)

_LOG_ENTRY = re.compile(r"\d{20}\.json")
#: The checkpoints columns a decision row repeats (decisions.ddl: "up to enumerator").
_SHARED = ("kind", "parallelism", "consecutive_regional", "processing_backlog", "regions", "enumerator")


@dataclass(slots=True)
class RepairReport:
    """What :func:`repair_files` and :func:`repair_rows` found and did."""

    moved: list[str] = field(default_factory=list)  # damaged files and log entries, where they were
    rewritten: list[int] = field(default_factory=list)  # checkpoints whose rows were written again
    audit_rewritten: list[int] = field(default_factory=list)
    unchecked: list[int] = field(default_factory=list)  # a dry run cannot read them before the moves
    dry_run: bool = False
    # offset-reset checkpoints whose sink commit was missing, now recorded in the sink (issue 36)
    sink_recorded: list[int] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.moved or self.rewritten or self.audit_rewritten or self.sink_recorded)

    def to_dict(self) -> dict[str, Any]:
        return {
            "moved": list(self.moved),
            "rewritten": list(self.rewritten),
            "audit_rewritten": list(self.audit_rewritten),
            "unchecked": list(self.unchecked),
            "sink_recorded": list(self.sink_recorded),
            "dry_run": self.dry_run,
        }


def _aside(tables: StateTables, table: str, inner: str, *, dry_run: bool) -> str:
    """Move ``<table>/<inner>`` to ``<root>/_damaged/<table>/<inner>``; return the old path."""
    fs, root = storage.filesystem(tables.root)
    source = storage.join(root, table, inner)
    if not dry_run:
        target = storage.join(root, "_damaged", table, inner)
        fs.create_dir(os.path.dirname(target), recursive=True)
        fs.move(source, target)
        log.warning("moved damaged %s aside to %s", source, target)
    return storage.join(tables.root, table, inner)


def _damaged_newest_log(tables: StateTables, table: str) -> str | None:
    """The newest log entry's name when it is not valid JSON lines; StateError for an older damaged one."""
    import pyarrow.fs as pafs

    fs, root = storage.filesystem(tables.root)
    log_dir = storage.join(root, table, "_delta_log")
    infos = fs.get_file_info(pafs.FileSelector(log_dir, allow_not_found=True))
    names = sorted(os.path.basename(i.path) for i in infos if _LOG_ENTRY.fullmatch(os.path.basename(i.path)))
    damaged = []
    for name in names:
        try:
            with fs.open_input_stream(storage.join(log_dir, name)) as stream:
                for line in stream.read().decode("utf-8").splitlines():
                    if line.strip():
                        json.loads(line)
        except (ValueError, UnicodeDecodeError):
            damaged.append(name)
    if not damaged:
        return None
    if damaged != [names[-1]]:
        older = [n for n in damaged if n != names[-1]]
        raise StateError(
            f"table {table} at {tables.uri(table)}: log entries {older} are damaged and later versions "
            "depend on them, so they cannot be moved aside; restore them (or the state directory) from a "
            "backup",
            table=table,
            path=tables.uri(table),
            log_files=older,
        )
    return names[-1]


def repair_files(tables: StateTables, *, dry_run: bool = False) -> RepairReport:
    """Steps 1 and 2 of the contract, on the tables under ``tables`` (opened writable unless ``dry_run``)."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    report = RepairReport(dry_run=dry_run)
    for name in REPAIRABLE:
        entry = _damaged_newest_log(tables, name)
        if entry is not None:
            report.moved.append(_aside(tables, name, f"_delta_log/{entry}", dry_run=dry_run))
            if dry_run:
                continue  # the table cannot be opened as it is; the rows are rebuilt after the move
        table = open_table(tables.uri(name), missing_ok=True)
        if table is None:
            continue
        fs, root = storage.filesystem(tables.uri(name))
        damaged = []
        actions = pa.table(guarded(table.table_uri, functools.partial(table.get_add_actions, flatten=True)))
        for inner in actions.column("path").to_pylist():
            relative = unquote(str(inner))  # the log's paths are URL-encoded
            try:
                pq.read_metadata(storage.join(root, relative), filesystem=fs)
            except Exception:  # noqa: BLE001 - missing, truncated or not parquet: all damaged
                damaged.append(relative)
        for relative in damaged:
            if fs.get_file_info(storage.join(root, relative)).type != pafs.FileType.NotFound:
                report.moved.append(_aside(tables, name, relative, dry_run=dry_run))
            else:
                report.moved.append(storage.join(tables.uri(name), relative) + " (missing)")
        if damaged and not dry_run:
            guarded(table.table_uri, table.repair)
    return report


def _decision_for_row(store: Any, checkpoint_id: int, row: Mapping[str, Any]) -> EpochDecision:
    """The decision of epoch ``checkpoint_id`` whose checkpoint is the one its checkpoints ``row`` holds."""
    candidates = store.tables.read(
        "decisions", partitions=[("epoch_id", "=", int(checkpoint_id))]
    ).to_pylist()
    for candidate in candidates:
        if all(candidate.get(c) == row.get(c) for c in _SHARED):
            return store.decision_from_row(candidate)
    raise StateError(
        f"checkpoint {checkpoint_id} of pipeline {store.pipeline_name!r}: its rows are lost or damaged and "
        f"no decision record of epoch {checkpoint_id} in {store.tables.uri('decisions')} matches its row "
        f"({len(candidates)} found), so they cannot be rebuilt; restore the state directory from a backup",
        checkpoint_id=checkpoint_id,
        table="decisions",
        path=store.tables.uri("decisions"),
    )


def repair_rows(store: Any, report: RepairReport | None = None) -> RepairReport:
    """Step 3 of the contract on ``store`` (a writable :class:`DeltaStateStore`)."""
    from deltalake import write_deltalake

    report = report if report is not None else RepairReport()
    for entry in store.kept()[1]:
        cid, attempt = entry.light.checkpoint_id, entry.attempt_id
        try:
            store.load_checkpoint(cid)
            intact = True
        except DamagedTableError:
            if not report.dry_run:
                raise  # damage step 2 does not repair (another table): its error says what to do
            report.unchecked.append(cid)  # readable only once the damaged files are moved aside
            continue
        except StateError:
            intact = False
        row = store.tables.read("checkpoints", partitions=[("checkpoint_id", "=", cid)]).to_pylist()[0]
        decision = None
        predicate = f"checkpoint_id = {int(cid)} AND attempt_id = {sql_string(attempt)}"
        if not intact:
            decision = _decision_for_row(store, cid, row)
            snapshot = decision.checkpoint.enumerator
            rows: list[dict[str, Any]] = []
            if snapshot is not None:
                base_id = row.get("enumerator_base")
                if base_id is None:
                    rows = serde.enumerator_to_rows(snapshot)
                else:
                    base = store.load_checkpoint(int(base_id)).enumerator
                    delta = None if base is None else serde.enumerator_delta(base, snapshot)
                    if delta is None:
                        raise StateError(
                            f"checkpoint {cid}: its enumerator rows are a delta against checkpoint "
                            f"{base_id}, which cannot be rebuilt from the decision record; restore the "
                            "state directory from a backup",
                            checkpoint_id=cid,
                        )
                    rows = delta
            report.rewritten.append(cid)
            if not report.dry_run:
                table = store.tables.require("enumerator_state")
                guarded(table.table_uri, functools.partial(table.delete, predicate))
                key = {"checkpoint_id": cid, "attempt_id": attempt}
                data = spec("enumerator_state").rows([{**r, **key} for r in rows])
                guarded(table.table_uri, functools.partial(write_deltalake, table, data, mode="append"))
                store.forget_mirror()
                store.load_checkpoint(cid)  # read back as a restore reads it: a StateError if still wrong
        audit = store.tables.read(
            "audit", filter=(pc.field("checkpoint_id") == cid) & (pc.field("attempt_id") == attempt)
        )
        if audit.num_rows == 0:
            decision = decision or _matching_or_none(store, cid, row)
            if decision is not None and decision.audit:
                report.audit_rewritten.append(cid)
                if not report.dry_run:
                    key = {"checkpoint_id": cid, "attempt_id": attempt}
                    audit_rows = [
                        {**serde.audit_to_row(r, seq), **key} for seq, r in enumerate(decision.audit)
                    ]
                    store.tables.append("audit", spec("audit").rows(audit_rows))
    return report


def _matching_or_none(store: Any, checkpoint_id: int, row: Mapping[str, Any]) -> EpochDecision | None:
    try:
        return _decision_for_row(store, checkpoint_id, row)
    except StateError:
        return None


def repair_sink_resets(
    store: Any, sink: Any, report: RepairReport | None = None, writable: Callable[[], Any] | None = None
) -> RepairReport:
    """Step 4 of the contract: ``store`` a :class:`DeltaStateStore`, ``sink`` the pipeline's
    :class:`~splitkeeper.delta.sink.DeltaSink` (read-only is enough to look), ``writable`` opens it
    for writing (called only when there is a reset to commit, and not in a dry run; None: ``sink``
    is writable). The checkpoints recorded go to ``report.sink_recorded``."""
    from splitkeeper.core.operator import reset_action

    report = report if report is not None else RepairReport()
    recorded = sink.committed_epoch()
    if recorded is None:
        return report  # no commit of this pipeline at all: a lost sink, not a missing reset
    plans: list[tuple[EpochDecision, dict[str, Any]]] = []
    for entry in store.kept()[1]:
        cid = entry.light.checkpoint_id
        if cid <= recorded:
            continue
        row = store.tables.read("checkpoints", partitions=[("checkpoint_id", "=", cid)]).to_pylist()[0]
        decision = _matching_or_none(store, cid, row)
        action = None if decision is None else reset_action(decision)
        if decision is None or action is None:
            return report
        plans.append((decision, action))
    report.sink_recorded.extend(d.epoch for d, _a in plans)
    if not plans or report.dry_run:
        return report
    sink = sink if writable is None else writable()
    for decision, action in plans:
        sink.operator_commit(
            decision.epoch, action, expected=sink.committed_epoch(), attempt_id=decision.attempt_id
        )
        log.warning(
            "sink %s: the offset reset of %s (checkpoint %s) was recorded (its sink commit was missing)",
            sink.path,
            action["split"],
            decision.epoch,
        )
    return report
