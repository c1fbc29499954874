"""Retention, compaction and vacuum (splitkeeper.delta.retention): chain safety, nothing needed removed.

No Spark."""

from __future__ import annotations

import dataclasses
import os
from datetime import UTC, datetime

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from splitkeeper.core.ports import EpochDecision
from splitkeeper.core.types import AuditRecord, CheckpointKind, RecoveryDecision, Split
from splitkeeper.delta import serde
from splitkeeper.delta.checkpoints import DeltaStateStore, decision_for
from splitkeeper.delta.retention import vacuum
from splitkeeper.delta.schemas import STATE_TABLES, TABLES
from splitkeeper.errors import CheckpointError

from .samples import global_, regional


def _snapshot_of(checkpoint_id: int):
    found = global_(checkpoint_id).enumerator
    assert found is not None
    return found


@pytest.fixture
def root(tmp_path) -> str:
    return str(tmp_path / "state")


def _open(root, **kwargs) -> DeltaStateStore:
    # every checkpoint a full snapshot: these tests are about the ref-chain rules; the bases of
    # incremental enumerator state are tests/state/test_incremental.py's
    kwargs.setdefault("full_snapshot_every", 1)
    return DeltaStateStore(root, "orders", "files:/in", **kwargs)


def _ids_in(root: str, table: str) -> set[int]:
    return set(DeltaTable(f"{root}/{table}").to_pyarrow_table().column("checkpoint_id").to_pylist())


def test_retention_keeps_the_ref_chain_and_deletes_it_after_a_global(root):
    store = _open(root)
    c100 = global_(100)
    c101 = regional(101, c100)
    c102 = regional(102, c101)
    for completed in (c100, c101, c102):
        store.commit_checkpoint(
            decision_for(
                completed, [AuditRecord("s0", 0, RecoveryDecision.ASSIGNED, completed.checkpoint_id)]
            )
        )
    assert store.ref_chain(102) == [102, 101, 100]
    assert store.retain(1) == []
    assert store.checkpoint_ids() == [100, 101, 102]
    assert store.load_checkpoint(100) == c100  # still restorable: 102 depends on it

    store.commit_checkpoint(decision_for(global_(103)))
    assert store.retain(1) == [100, 101, 102]
    assert store.checkpoint_ids() == [103]
    assert store.latest_checkpoint() == global_(103)
    store.compact()  # the state rows the deleted checkpoints named go in the next compaction
    assert _ids_in(root, "enumerator_state") <= {103}
    assert _ids_in(root, "audit") == {100, 101, 102}  # the audit trail is history: kept for the report
    with pytest.raises(CheckpointError, match="available: \\[103\\]"):
        store.load_checkpoint(101)

    timeline = store.history.timeline()  # the whole history: the deleted checkpoints were archived first
    assert [(e.checkpoint_id, e.kind) for e in timeline] == [
        (100, CheckpointKind.GLOBAL),
        (101, CheckpointKind.REGIONAL),
        (102, CheckpointKind.REGIONAL),
        (103, CheckpointKind.GLOBAL),
    ]
    assert timeline[2].failed_regions == (1,) and timeline[2].ref_checkpoint_ids == {1: 101}
    assert all(e.commit_ms is not None for e in timeline)
    assert store.retain(1) == []  # nothing more to delete, nothing archived twice
    assert [e.checkpoint_id for e in store.history.timeline()] == [100, 101, 102, 103]

    from splitkeeper.report.data import collect_report_data

    data = collect_report_data(store)
    assert [c.checkpoint_id for c in data.checkpoints] == [100, 101, 102, 103]
    assert [c.kind for c in data.checkpoints][1:3] == [CheckpointKind.REGIONAL] * 2
    assert data.checkpoints[0].loads == {0: 1, 1: 1} == data.checkpoints[-1].loads
    assert sorted({a.checkpoint_id for a in data.audit}) == [100, 101, 102]


def test_pinned_checkpoints_and_their_chains_are_kept(root):
    store = _open(root)
    store.commit_checkpoint(decision_for(global_(1)))
    store.commit_checkpoint(decision_for(regional(2, global_(1))))
    store.commit_checkpoint(decision_for(global_(3)))
    store.commit_checkpoint(decision_for(global_(4)))
    assert store.retain(1, [2]) == [3]
    assert store.checkpoint_ids() == [1, 2, 4]


def _backlogged(checkpoint_id: int, ref=None):
    """Region 0: three splits, two of them short of their backlog end; region 1: one split."""
    base = global_(checkpoint_id) if ref is None else regional(checkpoint_id, ref)
    region0 = dataclasses.replace(
        base.regions[0],
        splits=(
            Split("b-0", "t", 5, backlog_end=9),
            Split("b-1", "t", 9, backlog_end=9),  # reached its backlog end
            Split("b-2", "t", 0, backlog_end=4),
        ),
    )
    return dataclasses.replace(base, regions={**base.regions, 0: region0}, processing_backlog=True)


def test_retention_archives_the_timeline_facts_of_the_rows_it_deletes(root):
    store = _open(root)
    second = _backlogged(2)
    for completed in (_backlogged(1), second, _backlogged(3, second), global_(4)):
        store.commit_checkpoint(decision_for(completed))
    written = {
        r["checkpoint_id"]: r for r in DeltaTable(f"{root}/checkpoints").to_pyarrow_table().to_pylist()
    }
    assert store.retain(2) == [1]  # 3 refers to 2
    assert _open(root).retain(1) == [2, 3]  # a new store (a restarted driver)

    log = {r["checkpoint_id"]: r for r in DeltaTable(f"{root}/checkpoint_log").to_pyarrow_table().to_pylist()}
    assert sorted(log) == [1, 2, 3]
    for checkpoint_id in (1, 2, 3):
        row, original = log[checkpoint_id], written[checkpoint_id]
        assert [
            (g["region_id"], g["outcome"], g["ref_checkpoint_id"], g["splits"]) for g in row["regions"]
        ] == [
            (g["region_id"], g["outcome"], g["ref_checkpoint_id"], len(g["splits"]))
            for g in original["regions"]
        ]
        assert (row["kind"], row["reason"], row["run_id"], row["attempt_id"]) == (
            original["kind"],
            "",
            store.run_id,
            original["attempt_id"],
        )
        assert (row["parallelism"], row["processing_backlog"], row["commit_ms"], row["created_at"]) == (
            original["parallelism"],
            True,
            original["commit_ms"],
            original["created_at"],
        )
        assert row["logged_at"] >= original["created_at"]
    assert log[1]["backlog_splits"] == log[2]["backlog_splits"] == 2  # b-0, b-2; b-1 reached its end
    assert log[3]["regions"][1]["ref_checkpoint_id"] == 2 and log[3]["regions"][1]["outcome"] == "decline"
    assert [e.checkpoint_id for e in store.history.timeline()] == [1, 2, 3, 4]


def test_retention_deletes_whole_partitions_in_one_delete_commit(root):
    store = _open(root)
    for checkpoint_id in (1, 2, 3):
        store.commit_checkpoint(decision_for(global_(checkpoint_id)))
    assert store.retain(1) == [1, 2]
    assert _ids_in(root, "checkpoints") == {3}  # the rows are gone from the table, not just the cache
    assert _open(root).checkpoint_ids() == [3]
    assert [e.checkpoint_id for e in store.history.timeline()] == [1, 2, 3]
    last = DeltaTable(f"{root}/checkpoints").history(1)[0]
    assert last["operation"] == "DELETE"
    assert (
        last["operationMetrics"]["num_removed_files"] == 2
        and last["operationMetrics"]["num_added_files"] == 0
    )


def test_retention_after_another_store_compacted_still_deletes_what_the_core_lets_go(root):
    store = _open(root)
    for checkpoint_id in (1, 2, 3):
        store.commit_checkpoint(decision_for(global_(checkpoint_id)))
    _open(root).compact()  # another process rewrote the files
    assert store.retain(1) == [1, 2]
    assert _ids_in(root, "checkpoints") == {3}
    assert _open(root).latest_checkpoint() == global_(3)
    store.commit_checkpoint(decision_for(global_(4)))
    store.compact()
    store.commit_checkpoint(decision_for(global_(5)))
    assert store.retain(1) == [3, 4]
    assert _ids_in(root, "checkpoints") == {5}
    assert [e.checkpoint_id for e in store.history.timeline()] == [1, 2, 3, 4, 5]


def test_every_k_checkpoints_retention_purges_unreferenced_rows_and_compacts(root):
    from splitkeeper.core.types import RegionOutcome

    store = _open(root, compact_every=2)

    def optimized(table: str) -> bool:
        return any(h["operation"] == "OPTIMIZE" for h in DeltaTable(f"{root}/{table}").history())

    def attempts() -> set[tuple[int, str]]:
        rows = DeltaTable(f"{root}/enumerator_state").to_pyarrow_table().to_pylist()
        return {(r["checkpoint_id"], r["attempt_id"]) for r in rows}

    store.commit_checkpoint(decision_for(global_(1)))
    ghost = [
        {**r, "checkpoint_id": 1, "attempt_id": "lost"} for r in serde.enumerator_to_rows(_snapshot_of(1))
    ]
    write_deltalake(f"{root}/enumerator_state", TABLES["enumerator_state"].rows(ghost), mode="append")
    lost = _open(root, run_id="lost")  # an attempt of checkpoint 2 killed before its row
    with pytest.raises(RuntimeError):
        lost.commit_checkpoint(
            decision_for(global_(2)), before_row=lambda: (_ for _ in ()).throw(RuntimeError())
        )
    store.log_attempt(2, {0: RegionOutcome.DECLINE}, "declined")
    store.log_attempt(3, {0: RegionOutcome.TIMEOUT}, "timed out")
    store.retain(5)
    assert (1, "lost") in attempts() and any(cid == 2 for cid, _ in attempts())
    assert not optimized("checkpoint_log")
    store.commit_checkpoint(decision_for(global_(4)))
    store.retain(5)  # the second commit since the last compaction: compact now
    assert (1, "lost") not in attempts()
    assert {cid for cid, _ in attempts()} == {1, 4}  # checkpoint 2's orphan rows went too
    assert optimized("checkpoint_log")  # two small files became one
    assert store.load_checkpoint(1) == global_(1) and store.latest_checkpoint() == global_(4)
    assert [e.checkpoint_id for e in store.history.timeline()] == [1, 2, 3, 4]


def test_compaction_and_vacuum_never_remove_a_file_a_kept_chain_or_an_uncommitted_epoch_needs(root):
    store = _open(root)
    c1 = global_(1)
    c2 = regional(2, c1)
    c3 = regional(3, c2)
    for completed in (global_(0), c1, c2, c3):
        store.commit_checkpoint(decision_for(completed, [AuditRecord("s0", 0, RecoveryDecision.ASSIGNED, 1)]))
    assert store.retain(1) == [0]
    store.write_plan(4, {0: [("s0", 3, 9)], 1: []})  # epoch 4: planned, decided, not committed
    pending = EpochDecision(global_(4), "pending-attempt", (), (0, 1))
    store.write_decision(pending)
    store.compact()
    removed = vacuum(store, 0)
    assert removed["checkpoints"] and removed["enumerator_state"]  # checkpoint 0's files are gone
    assert set(removed) == set(STATE_TABLES)

    fresh = _open(root)  # everything the chain 3 -> 2 -> 1 and epoch 4 need is still there
    assert fresh.checkpoint_ids() == [1, 2, 3] and fresh.ref_chain(3) == [3, 2, 1]
    assert [fresh.load_checkpoint(i) for i in (1, 2, 3)] == [c1, c2, c3]
    assert fresh.read_plan(4).regions[0][0].end == 9
    assert fresh.decision(4, "pending-attempt") == pending
    assert fresh.history.audit_for(3) == [AuditRecord("s0", 0, RecoveryDecision.ASSIGNED, 1)]

    before_global = datetime.now(UTC)
    store.commit_checkpoint(decision_for(global_(5)))
    assert store.retain(1) == [1, 2, 3]
    store.compact()
    assert vacuum(store, 0)["checkpoints"]
    assert _open(root).latest_checkpoint() == global_(5)
    with pytest.raises(CheckpointError):  # time travel ends where vacuum removed the files
        store.load_checkpoint(3, as_of=before_global)
    for table in STATE_TABLES:  # every file the log references exists
        for uri in DeltaTable(f"{root}/{table}").file_uris():
            assert os.path.exists(uri), uri


@pytest.mark.slow
def test_history_does_not_grow_what_restore_reads_after_compaction(tmp_path):
    """Restore time must not grow with history: what it reads is bounded, whatever the count.

    After 12 checkpoints with compaction every 6, every state table holds a bounded number
    of files (without compaction each checkpoint adds at least one per table), and restore
    reads only the rows of the checkpoint it restores.
    """
    from splitkeeper_tools.bench.state import measure_state_store

    root = str(tmp_path / "measure")
    figures = measure_state_store(root, checkpoints=12, marks=(6, 12), compact_every=6, restore_repeats=1)
    print("\n" + figures.summary())
    assert len(figures.commit_ms) == 12 and set(figures.restore_ms) == {6, 12}
    files = {t: len(DeltaTable(f"{root}/{t}").file_uris()) for t in STATE_TABLES}
    assert max(files.values()) <= 6, files  # 12 checkpoints, compacted every 6 (3 kept; history compacted)
    store = DeltaStateStore(root, "measure", "synthetic")
    latest = store.latest_checkpoint()
    assert latest is not None and latest.checkpoint_id == 12
    assert store.checkpoint_ids() == [1, 10, 11, 12]  # 1: the full snapshot 10-12 are deltas against
    checkpoint_files = DeltaTable(f"{root}/checkpoints").file_uris(
        file_pruning_predicate=[("checkpoint_id", "=", 12)]
    )
    assert len(checkpoint_files) == 1  # restore prunes to the one partition
    assert pc.max(DeltaTable(f"{root}/checkpoints").to_pyarrow_table().column("checkpoint_id")).as_py() == 12


def test_a_rewind_to_a_checkpoint_retention_removed_says_so_naming_the_oldest_retained(tmp_path):
    """Issue 36: with an older checkpoint still kept (pinned), a rewind to one retention removed after
    it said "never completed". Now: removed by retention, the oldest retained named; an aborted epoch
    is the one that never completed."""
    from splitkeeper.app import incident
    from splitkeeper.config.settings import config_from_mapping
    from tests.report.states import incident_state

    store = incident_state(tmp_path, checkpoints=8, regional_at=4, aborted_at=6, pipeline="orders")
    store.retain(2, pinned=[2])
    assert store.checkpoint_ids() == [1, 2, 7, 8]  # 1: the base of 2's enumerator delta
    config = config_from_mapping(
        {
            "name": "orders",
            "source": {"kind": "kafka", "bootstrap_servers": "127.0.0.1:1", "topics": ["orders"]},
            "state": {"path": str(tmp_path / "state")},
            "sink": {"path": str(tmp_path / "sink")},
        }
    )
    with pytest.raises(CheckpointError) as err:
        incident.rewind(config, 4, dry_run=True)
    assert "checkpoint 4 was removed by retention" in str(err.value)
    assert "the oldest checkpoint retained is 1" in str(err.value)
    assert "checkpoints that can be restored: [1, 2, 7]" in str(err.value)
    with pytest.raises(CheckpointError, match="checkpoint 6 never completed"):
        incident.rewind(config, 6, dry_run=True)


def test_compaction_and_vacuum_take_the_validations_table_too_and_keep_every_verdict(root):
    """Every run appends the in-run check of its restore to ``validations``: compaction bin-packs it
    with the state tables (nothing of it is deleted: it is history) and vacuum cleans it."""
    from splitkeeper.core.restarts import IN_RUN_RULES, RestartCheck, RestoreKind
    from splitkeeper.delta.validations import ValidationRecords

    store = DeltaStateStore(root, "p", "fp")
    store.commit_checkpoint(decision_for(global_(1)))
    for epoch in (2, 3, 4):  # three runs, three appends
        store.record_restart_checks([RestartCheck(RestoreKind.GLOBAL_RESTORE, 1, epoch, (0,), IN_RUN_RULES)])
    assert len(DeltaTable(f"{root}/validations").file_uris()) == 3
    compaction = store.compact()
    assert compaction.compacted_files["validations"] == 3
    assert len(DeltaTable(f"{root}/validations").file_uris()) == 1
    assert [r.epoch for r in ValidationRecords(store.tables, "p").recorded(in_run=True)] == [4, 3, 2]
    assert "validations" in vacuum(store, 0)


def test_the_store_follows_its_own_commits_and_retention_without_rereading_and_sees_another_writers(
    root, monkeypatch
):
    """Issue 41: the checkpoints mirror follows this store's own row appends and retention deletes
    without reading the table again (a continuous run's every epoch did twice), equal to what a fresh
    read says; a commit of another writer in between makes it read again."""
    from splitkeeper.delta import tables

    store = _open(root)
    reads: list[str] = []
    real = tables.read_rows

    def counted(table, spec, **kwargs):
        reads.append(spec.name)
        return real(table, spec, **kwargs)

    monkeypatch.setattr(tables, "read_rows", counted)
    store.commit_checkpoint(decision_for(global_(1)))
    store.retain(2)
    for checkpoint_id in range(2, 8):
        before = len(reads)
        store.commit_checkpoint(decision_for(global_(checkpoint_id)))
        assert store.retain(2) == ([checkpoint_id - 2] if checkpoint_id > 2 else [])
        # the archive reads the deleted rows, nothing reads the kept ones again
        assert reads[before:].count("checkpoints") == (1 if checkpoint_id > 2 else 0)
        fresh = _open(root, read_only=True)
        assert store.kept() == fresh.kept()
        assert store.mirror().ids() == fresh.mirror().ids() == [checkpoint_id - 1, checkpoint_id]
    other = _open(root)  # another writer's commit between two of this store's
    other.commit_checkpoint(decision_for(global_(8)))
    assert store.ids() == [6, 7, 8]
    store.commit_checkpoint(decision_for(global_(9)))
    assert store.retain(2) == [6, 7]
    assert store.ids() == _open(root, read_only=True).ids() == [8, 9]
