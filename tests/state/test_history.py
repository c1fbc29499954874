"""The history API (splitkeeper.delta.history): the orphan-attempt rule, the whole timeline. No Spark."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from splitkeeper.core.ports import CrashPoint
from splitkeeper.core.types import AuditRecord, CheckpointKind, RecoveryDecision, RegionOutcome
from splitkeeper.delta.checkpoints import DeltaStateStore, decision_for
from splitkeeper.delta.schemas import TABLES

from .samples import Crash, CrashAt, global_, regional


def _audit(split: str, checkpoint_id: int, decision=RecoveryDecision.ASSIGNED) -> AuditRecord:
    return AuditRecord(split, 0, decision, checkpoint_id, f"{split}@{checkpoint_id}")


def _orphan_rows(root: str, checkpoint_id: int, attempt: str, *splits: str) -> None:
    """Audit rows of an attempt no checkpoints row names (a driver killed before its row)."""
    rows = [
        {"checkpoint_id": checkpoint_id, "attempt_id": attempt, "seq": seq, "split_id": s,
         "reader_id": 0, "decision": "assigned", "decision_checkpoint_id": checkpoint_id, "detail": "orphan"}
        for seq, s in enumerate(splits)
    ]  # fmt: skip
    write_deltalake(f"{root}/audit", TABLES["audit"].rows(rows), mode="append")


@pytest.fixture
def store(tmp_path) -> DeltaStateStore:
    # every checkpoint full: these tests delete checkpoints by retention (bases: test_incremental.py)
    return DeltaStateStore(tmp_path / "state", "orders", "files:/in", full_snapshot_every=1)


def test_only_the_attempt_a_checkpoints_row_or_its_archive_names_counts(store):
    root = store.root
    store.commit_checkpoint(decision_for(global_(1), [_audit("a", 1)]))
    _orphan_rows(root, 1, "lost-run", "x")  # another run lost checkpoint 1: its rows are orphans
    store.commit_checkpoint(decision_for(global_(2), [_audit("b", 2)]))
    died = decision_for(global_(3), [_audit("c", 3)])
    with pytest.raises(Crash):
        store.commit_checkpoint(
            died, before_row=lambda: CrashAt(CrashPoint.BEFORE_CHECKPOINT_ROW, 3).crash_point(
                CrashPoint.BEFORE_CHECKPOINT_ROW, 3
            )
        )  # fmt: skip
    store.commit_checkpoint(died)  # the redo: the same decision, fresh rows; the first rows are orphans
    store.commit_checkpoint(decision_for(global_(4), [_audit("d", 4)]))
    _orphan_rows(root, 5, "in-flight", "e")  # an epoch whose row is not written yet
    all_audit = DeltaTable(f"{root}/audit").to_pyarrow_table()
    assert sorted(all_audit.column("split_id").to_pylist()) == ["a", "b", "c", "c", "d", "e", "x"]

    assert store.retain(2) == [1, 2]  # 1 and 2 are archived, then deleted
    history = store.history
    committed = history.committed_audit()
    assert [(r["checkpoint_id"], r["split_id"]) for r in committed.to_pylist()] == [
        (1, "a"),
        (2, "b"),
        (3, "c"),
        (4, "d"),
    ]
    assert [r["split_id"] for r in history.committed_audit(up_to=2).to_pylist()] == ["a", "b"]
    dropped = history.committed_audit(decisions=["dropped_unknown"])
    assert dropped.num_rows == 0
    assert history.audit_for(3) == [_audit("c", 3)]
    kept_rows = history.enumerator_rows()
    assert set(kept_rows.column("checkpoint_id").to_pylist()) == {3, 4}
    attempts = {k.light.checkpoint_id: k.attempt_id for k in store.kept()[1]}
    for cid in (3, 4):
        rows = kept_rows.filter(pc.field("checkpoint_id") == cid)
        assert set(rows.column("attempt_id").to_pylist()) == {attempts[cid]}
    assert history.committed_attempts()[1] != "lost-run"


def test_rows_of_a_checkpoint_no_table_knows_count_only_below_the_newest_known_one(store):
    root = store.root
    _orphan_rows(root, 1, "legacy", "old")  # state from before archiving: its row was deleted unarchived
    store.commit_checkpoint(decision_for(global_(2), [_audit("b", 2)]))
    _orphan_rows(root, 3, "not-yet", "new")
    assert [r["split_id"] for r in store.history.committed_audit().to_pylist()] == ["old", "b"]


def test_the_timeline_is_whole_and_shows_a_checkpoint_kept_and_archived_once(store):
    first = global_(1)
    store.commit_checkpoint(decision_for(first))
    store.log_attempt(2, {0: RegionOutcome.ACK, 1: RegionOutcome.TIMEOUT}, "region 1 timed out")
    store.commit_checkpoint(decision_for(regional(3, first)))
    store.commit_checkpoint(decision_for(global_(4)))
    assert store.retain(1) == [1, 3]
    # a retention that died between its archive and its delete: 4 is archived and still kept
    row = store.history.checkpoints().to_pylist()[0]
    from splitkeeper.delta.retention import archived_row

    write_deltalake(
        f"{store.root}/checkpoint_log", TABLES["checkpoint_log"].rows([archived_row(row, datetime.now(UTC))]),
        mode="append",
    )  # fmt: skip
    timeline = store.history.timeline()
    assert [(e.checkpoint_id, e.kind) for e in timeline] == [
        (1, CheckpointKind.GLOBAL),
        (2, CheckpointKind.ABORTED),
        (3, CheckpointKind.REGIONAL),
        (4, CheckpointKind.GLOBAL),
    ]
    assert timeline[2].ref_checkpoint_ids == {1: 1} and timeline[2].failed_regions == (1,)
    assert all(e.commit_ms is not None for e in timeline if e.kind is not CheckpointKind.ABORTED)
    assert [r["checkpoint_id"] for r in store.history.archived_checkpoints().to_pylist()] == [1, 3]
