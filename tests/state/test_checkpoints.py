"""The delta-rs state store (splitkeeper.delta.checkpoints): the StateStore port, its fences, restore,
read-only opens and bad rows. No Spark: everything is read back with deltalake."""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
import time
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from splitkeeper.core.ports import CrashPoint, DriverHooks, EpochDecision
from splitkeeper.core.types import AuditRecord, CheckpointKind, RecoveryDecision, RegionOutcome, Split
from splitkeeper.delta import checkpoints as checkpoints_module
from splitkeeper.delta import serde
from splitkeeper.delta.checkpoints import DeltaStateStore, decision_for
from splitkeeper.delta.schemas import STATE_TABLES, TABLES
from splitkeeper.delta.serde import EpochPlan, PlannedRange
from splitkeeper.errors import (
    CheckpointError,
    ConcurrentRunError,
    InvalidParameterError,
    StagedOutputError,
    StateError,
)

from .samples import AUDIT, Crash, CrashAt, LocalPipeline, checkpoint, global_, regional, tree


@pytest.fixture
def root(tmp_path) -> str:
    return str(tmp_path / "state")


def _open(root, name="orders", fingerprint="files:/in", **kwargs) -> DeltaStateStore:
    return DeltaStateStore(root, name, fingerprint, **kwargs)


def _rows(root: str, table: str) -> pa.Table:
    return DeltaTable(f"{root}/{table}").to_pyarrow_table()


# --------------------------------------------------------------------------- the directory


def test_tables_are_created_once_and_reopening_writes_nothing(root):
    store = _open(root)
    versions = {t: store.table_version(t) for t in STATE_TABLES}
    assert all(v == 0 for v in versions.values()), versions
    again = _open(root)
    assert {t: again.table_version(t) for t in STATE_TABLES} == versions
    for table in STATE_TABLES:
        found = DeltaTable(f"{root}/{table}")
        assert pa.schema(found.schema().to_arrow()).names == TABLES[table].schema.names
        assert found.metadata().partition_columns == TABLES[table].partition_by
        assert found.metadata().configuration["delta.checkpointInterval"] == "10"
        assert found.metadata().configuration["delta.enableDeletionVectors"] == "false"
    assert _rows(root, "pipeline").num_rows == 1


def test_state_dir_of_another_pipeline_is_refused_naming_both(root):
    _open(root, name="orders")
    with pytest.raises(StateError) as err:
        _open(root, name="payments")
    assert "belongs to pipeline 'orders', not to pipeline 'payments'" in str(err.value)
    assert "its own state.path" in str(err.value)


def test_changed_source_fingerprint_is_refused_unless_accepted(root):
    _open(root, fingerprint="files:/in")
    with pytest.raises(StateError, match="fingerprint 'files:/in', but the configured source has"):
        _open(root, fingerprint="files:/other")
    _open(root, fingerprint="files:/other", accept_source_change=True)
    _open(root, fingerprint="files:/other")  # adopted: no error any more
    assert _rows(root, "pipeline").column("source_fingerprint").to_pylist() == ["files:/other"]


def test_without_a_fingerprint_the_check_is_skipped_but_nothing_is_claimed(root):
    with pytest.raises(InvalidParameterError, match="source_fingerprint=None"):
        _open(root, fingerprint=None)  # a writer must claim the directory for its source
    _open(root, fingerprint="files:/in")
    assert _open(root, fingerprint=None).checkpoint_ids() == []  # status: no source needed


# --------------------------------------------------------------------------- plans


def test_plan_is_stored_once_and_a_second_plan_of_the_epoch_is_a_concurrent_run(root):
    store = _open(root, run_id="run-a")
    assert store.latest_plan_epoch() is None
    store.write_plan(3, {0: [(Split("s0", position=5), 5, 15)], 1: []})
    written = EpochPlan(3, {0: (PlannedRange("s0", 5, 15),), 1: ()}, "run-a")
    assert store.read_plan(3) == written
    other = _open(root, run_id="run-b")
    with pytest.raises(ConcurrentRunError) as err:
        other.write_plan(3, {0: [("s0", 5, 99)], 1: []})
    assert "pipeline 'orders': epoch 3 is already planned (by run run-a)" in str(err.value)
    assert err.value.params["epoch_id"] == 3
    with pytest.raises(ConcurrentRunError, match="epoch 2 is older than the latest planned epoch 3"):
        other.write_plan(2, {0: []})
    assert store.read_plan(3) == written  # the first plan is intact
    assert store.latest_plan_epoch() == 3
    with pytest.raises(StateError, match="no plan for epoch 4"):
        store.read_plan(4)


def test_two_planners_of_the_same_epoch_at_once_one_wins(root):
    stores = [_open(root, run_id=f"run-{i}") for i in range(2)]
    barrier = threading.Barrier(2)
    outcomes: dict[int, object] = {}

    def plan(i: int) -> None:
        barrier.wait()
        try:
            stores[i].write_plan(1, {0: [(f"split-{i}", 0, 10)]})
            outcomes[i] = "planned"
        except ConcurrentRunError as err:
            outcomes[i] = err

    threads = [threading.Thread(target=plan, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, o in outcomes.items() if o == "planned"]
    losers = [o for o in outcomes.values() if isinstance(o, ConcurrentRunError)]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    assert stores[0].read_plan(1).regions == {0: (PlannedRange(f"split-{winners[0]}", 0, 10),)}
    assert _rows(root, "epoch_plans").num_rows == 1  # the loser's rows are in no commit


def test_a_planner_that_checked_before_a_rival_planned_loses_and_leaves_no_rows(root, monkeypatch):
    rival = _open(root, run_id="run-a")
    late = _open(root, run_id="run-b")
    real = checkpoints_module.fenced_commit
    calls: list[str] = []

    def rival_plans_first(table, **kwargs):  # run-b has checked (nothing planned); run-a plans now
        calls.append(kwargs["metadata"]["run_id"])
        if len(calls) == 1:
            rival.write_plan(1, {0: [("s0", 0, 10)]})
        return real(table, **kwargs)

    monkeypatch.setattr(checkpoints_module, "fenced_commit", rival_plans_first)
    with pytest.raises(ConcurrentRunError, match=r"epoch 1 is already planned \(by run run-a\)"):
        late.write_plan(1, {0: [("s0", 0, 99)]})
    monkeypatch.undo()
    assert calls == ["run-b", "run-a"]
    assert _open(root).read_plan(1) == EpochPlan(1, {0: (PlannedRange("s0", 0, 10),)}, "run-a")
    assert _open(root).latest_plan_epoch() == 1


# --------------------------------------------------------------------------- decisions and checkpoints


def test_a_decision_round_trips_through_delta_and_only_its_attempt_is_found(root):
    store = _open(root)
    decision = EpochDecision(checkpoint(7, ref=6), "attempt-a", AUDIT, (0, 1), 3, "region 2 timed out")
    store.write_decision(decision)
    store.write_decision(EpochDecision(checkpoint(7, ref=6), "attempt-b"))  # another run's attempt
    fresh = _open(root)
    assert fresh.decision(7, "attempt-a") == decision
    assert fresh.decision(7, "attempt-b") == EpochDecision(checkpoint(7, ref=6), "attempt-b")
    assert fresh.decision(7, "attempt-c") is None and fresh.decision(8, "attempt-a") is None


def test_a_refused_decision_is_discarded_by_its_attempt_alone(root):
    """Protocol rule 5.2: the loser of the fence removes its own decision record, no other."""
    store = _open(root)
    winner = EpochDecision(checkpoint(7, ref=6), "attempt-won")
    store.write_decision(winner)
    store.write_decision(EpochDecision(checkpoint(7, ref=6), "attempt-o'refused"))
    store.discard_decision(7, "attempt-o'refused")
    fresh = _open(root)
    assert fresh.decision(7, "attempt-o'refused") is None
    assert fresh.decision(7, "attempt-won") == winner
    assert _rows(root, "decisions").num_rows == 1


def test_checkpoint_round_trip_equals_the_original(root):
    store = _open(root)
    store.commit_checkpoint(decision_for(global_(6)))
    completed = checkpoint(7, ref=6)
    store.commit_checkpoint(decision_for(completed, AUDIT))
    receipt = store.last_commit
    assert receipt is not None and receipt.checkpoint_id == 7 and 0 <= receipt.commit_ms <= receipt.total_ms

    fresh = _open(root)  # a restarted driver
    assert fresh.load_checkpoint(7) == completed
    assert fresh.latest_checkpoint() == completed
    assert fresh.get(7) == completed and 7 in fresh
    assert fresh.latest_global() == global_(6)
    assert fresh.checkpoint_ids() == [6, 7]
    assert fresh.history.audit_for(7) == list(AUDIT)
    assert fresh.history.audit_for(6) == []
    assert fresh.ref_chain(7) == [7, 6]
    assert fresh.chain_depth(7) == 1


def test_the_same_decision_again_writes_nothing_once_its_row_landed(root):
    store = _open(root)
    decision = decision_for(global_(1), [AuditRecord("s0", 0, RecoveryDecision.ASSIGNED, 1)])
    store.commit_checkpoint(decision)
    versions = {t: store.table_version(t) for t in STATE_TABLES}
    _open(root).commit_checkpoint(decision)  # a redo by a restarted driver
    assert {t: store.table_version(t) for t in STATE_TABLES} == versions
    assert store.last_commit is not None and not store.last_commit.replayed
    store.commit_checkpoint(decision)
    assert store.last_commit.replayed
    assert store.history.audit_for(1) == [AuditRecord("s0", 0, RecoveryDecision.ASSIGNED, 1)]


def test_unknown_checkpoint_names_the_id_and_the_available_ids(root):
    store = _open(root)
    assert store.latest_checkpoint() is None
    store.commit_checkpoint(decision_for(global_(1)))
    store.commit_checkpoint(decision_for(global_(2)))
    with pytest.raises(CheckpointError, match=r"checkpoint 5 of pipeline 'orders' .*\(available: \[1, 2\]\)"):
        store.load_checkpoint(5)
    with pytest.raises(CheckpointError, match=r"checkpoint 5 .*available: \[1, 2\]"):
        store.history.audit_for(5)


def test_commit_of_an_old_or_repeated_id_is_a_concurrent_run_and_changes_nothing(root):
    store = _open(root)
    store.commit_checkpoint(decision_for(global_(4)))
    versions = {t: store.table_version(t) for t in STATE_TABLES}
    with pytest.raises(ConcurrentRunError, match="checkpoint 4 is already committed"):
        store.commit_checkpoint(decision_for(global_(4, position=50)))
    with pytest.raises(
        ConcurrentRunError, match="checkpoint 3 is older than the latest committed checkpoint 4"
    ):
        store.commit_checkpoint(decision_for(global_(3)))
    assert {t: store.table_version(t) for t in STATE_TABLES} == versions
    assert store.load_checkpoint(4) == global_(4)
    assert store.checkpoint_ids() == [4]


def test_checkpoint_referring_to_a_missing_checkpoint_is_refused_by_the_core_rule(root):
    store = _open(root)
    store.commit_checkpoint(decision_for(global_(1)))
    with pytest.raises(CheckpointError, match="would break its ref chain"):
        store.commit_checkpoint(decision_for(regional(3, global_(2))))
    aborted = dataclasses.replace(global_(4), kind=CheckpointKind.ABORTED)
    with pytest.raises(InvalidParameterError, match="log_attempt"):
        store.commit_checkpoint(decision_for(aborted))
    assert store.checkpoint_ids() == [1]


def test_two_runs_committing_the_same_checkpoint_at_once_exactly_one_wins(root):
    base = _open(root)
    base.commit_checkpoint(decision_for(global_(1)))
    stores = [_open(root, run_id=f"run-{i}") for i in range(2)]
    candidates = [global_(2, position=100), global_(2, position=200)]
    barrier = threading.Barrier(2)
    outcomes: dict[int, object] = {}

    def commit(i: int) -> None:
        barrier.wait()
        try:
            stores[i].commit_checkpoint(
                decision_for(candidates[i], [AuditRecord(f"s{i}", i, RecoveryDecision.ASSIGNED, 2)])
            )
            outcomes[i] = "committed"
        except ConcurrentRunError as err:
            outcomes[i] = err

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [i for i, o in outcomes.items() if o == "committed"]
    lost = [o for o in outcomes.values() if isinstance(o, ConcurrentRunError)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert "pipeline 'orders'" in str(lost[0]) and lost[0].params["epoch_id"] == 2
    winner = won[0]
    reader = _open(root)  # state intact: exactly the winner's checkpoint, enumerator rows and audit
    assert reader.load_checkpoint(2) == candidates[winner]
    assert reader.history.audit_for(2) == [AuditRecord(f"s{winner}", winner, RecoveryDecision.ASSIGNED, 2)]
    assert reader.load_checkpoint(1) == global_(1)
    assert reader.checkpoint_ids() == [1, 2]


def test_a_checkpoint_committer_that_checked_before_a_rival_committed_loses_at_its_row(root):
    _open(root).commit_checkpoint(decision_for(global_(1)))
    rival = _open(root, run_id="run-a")
    late = _open(root, run_id="run-b")

    def rival_commits() -> None:  # between run-b's state rows and its checkpoints row
        rival.commit_checkpoint(decision_for(global_(2, position=100)))

    with pytest.raises(ConcurrentRunError, match="pipeline 'orders'"):
        late.commit_checkpoint(
            decision_for(global_(2, position=200), [AuditRecord("s1", 1, RecoveryDecision.ASSIGNED, 2)]),
            before_row=rival_commits,
        )
    reader = _open(root)
    assert reader.checkpoint_ids() == [1, 2]
    assert reader.load_checkpoint(2) == global_(2, position=100)
    assert reader.history.audit_for(2) == []  # run-b's audit rows are orphans: never read
    rows = _rows(root, "checkpoints").filter(pc.field("checkpoint_id") == 2)
    assert rows.num_rows == 1  # run-b's row is in no commit


def test_rows_of_a_commit_that_died_before_its_checkpoint_row_are_never_read(root):
    store = _open(root)
    store.commit_checkpoint(decision_for(global_(1)))
    died = decision_for(global_(2), [AuditRecord("s0", 0, RecoveryDecision.ASSIGNED, 2)])
    with pytest.raises(Crash):
        store.commit_checkpoint(
            died,
            before_row=lambda: CrashAt(CrashPoint.BEFORE_CHECKPOINT_ROW, 2).crash_point(
                CrashPoint.BEFORE_CHECKPOINT_ROW, 2
            ),
        )
    assert _rows(root, "enumerator_state").filter(pc.field("checkpoint_id") == 2).num_rows == 2
    assert store.checkpoint_ids() == [1]
    assert store.latest_checkpoint() == global_(1)
    store.commit_checkpoint(died)  # the redo commits checkpoint 2 for real, with fresh rows
    assert store.load_checkpoint(2) == global_(2)
    assert store.history.audit_for(2) == [AuditRecord("s0", 0, RecoveryDecision.ASSIGNED, 2)]
    store.commit_checkpoint(decision_for(global_(3)))
    # 2 and 3 are deltas against 1's full snapshot (store rule 6): 1 stays while 3 is kept
    assert store.retain(1) == [2]
    store.compact()
    leftover = _rows(root, "enumerator_state")
    assert set(leftover.column("attempt_id").to_pylist()) == {k.attempt_id for k in store.kept()[1]}
    assert store.checkpoint_ids() == [1, 3]
    assert _open(root).load_checkpoint(3) == global_(3)


def test_aborted_attempts_show_in_the_timeline_but_never_as_checkpoints(root):
    store = _open(root)
    first = global_(1)
    store.commit_checkpoint(decision_for(first))
    store.log_attempt(
        2, {0: RegionOutcome.ACK, 1: RegionOutcome.TIMEOUT}, "forced global, region 1 timed out"
    )
    store.commit_checkpoint(decision_for(regional(3, first)))
    with pytest.raises(InvalidParameterError, match="commit_checkpoint"):
        store.log_attempt(4, {0: RegionOutcome.ACK}, kind=CheckpointKind.GLOBAL)
    timeline = store.history.timeline()
    assert [(e.checkpoint_id, e.kind) for e in timeline] == [
        (1, CheckpointKind.GLOBAL),
        (2, CheckpointKind.ABORTED),
        (3, CheckpointKind.REGIONAL),
    ]
    assert timeline[1].failed_regions == (1,) and "timed out" in timeline[1].reason
    assert timeline[2].failed_regions == (1,) and timeline[2].ref_checkpoint_ids == {1: 1}
    assert timeline[0].commit_ms is not None and timeline[0].at <= timeline[2].at
    assert store.checkpoint_ids() == [1, 3]


def test_time_travel_restores_a_checkpoint_that_retention_deleted(root):
    store = _open(root, full_snapshot_every=1)  # 1 is no base of 2: retention deletes it
    store.commit_checkpoint(decision_for(global_(1)))
    time.sleep(1.1)
    moment = datetime.now(UTC)
    time.sleep(1.1)
    store.commit_checkpoint(decision_for(global_(2)))
    assert store.retain(1) == [1]
    with pytest.raises(CheckpointError):
        store.load_checkpoint(1)
    assert store.load_checkpoint(1, as_of=moment) == global_(1)


# --------------------------------------------------------------------------- read-only


def test_a_read_only_open_writes_nothing_byte_for_byte_even_with_a_redo_pending(tmp_path):
    pipeline = LocalPipeline(tmp_path)
    pipeline.write_input(files=2, lines=30)
    pipeline.run(2)
    crashing = pipeline.driver(CrashAt(CrashPoint.AFTER_SINK_COMMIT, 3))
    crashing.open()
    with pytest.raises(Crash):
        crashing.run(1)  # epoch 3 is in the sink; its checkpoint row is not written
    before = tree(tmp_path)
    assert any(name.startswith("state/_staging/epoch=3/") for name in before)

    reader = pipeline.driver(read_only=True)
    opened = reader.open(read_only=True)
    assert (opened.redone_checkpoint, opened.restored_from, opened.read_only) == (3, 3, True)
    store, sink = reader.state, reader.sink
    assert store.checkpoint_ids() == [1, 2] and sink.committed_epoch() == 3
    assert store.latest_plan_epoch() == 3 and [e.checkpoint_id for e in store.history.timeline()] == [1, 2]
    attempt = sink.committed_attempt(3)
    assert attempt is not None and store.decision(3, attempt) is not None  # the redo record is in Delta
    for write in (
        lambda: store.write_plan(4, {0: []}),
        lambda: store.write_decision(store.decision(3, attempt)),
        lambda: store.commit_checkpoint(store.decision(3, attempt)),
        lambda: store.log_attempt(4, {0: RegionOutcome.ACK}, "x"),
        lambda: store.retain(1),
        lambda: store.compact(),
        lambda: sink.commit(4, [], expected=3, attempt_id="x"),
    ):
        with pytest.raises(StateError, match="read-only"):
            write()
    sink.discard(3)
    sink.discard_through(3)
    assert tree(tmp_path) == before  # state, sink and staging, _delta_log included

    writer = pipeline.driver()
    assert writer.open().redone_checkpoint == 3  # a writing open does the redo from Delta alone
    assert writer.state.checkpoint_ids() == [1, 2, 3]
    assert tree(tmp_path) != before


def test_a_read_only_store_of_a_missing_directory_reads_empty_and_creates_nothing(tmp_path):
    store = _open(tmp_path / "nothing", fingerprint=None, read_only=True)
    assert store.latest_checkpoint() is None and store.checkpoint_ids() == []
    assert store.latest_plan_epoch() is None and store.decision(1, "a") is None
    assert store.history.timeline() == [] and store.history.committed_audit().num_rows == 0
    assert not (tmp_path / "nothing").exists()


# --------------------------------------------------------------------------- bad rows


@pytest.mark.parametrize("position", [None, -5])
def test_a_checkpoint_row_with_a_bad_position_names_table_checkpoint_and_split_and_changes_nothing(
    root, position
):
    store = _open(root)
    store.commit_checkpoint(decision_for(global_(1)))
    enumerator = global_(2).enumerator
    assert enumerator is not None
    row = serde.checkpoint_to_row(global_(2))
    row["regions"][1]["splits"][0]["position"] = position  # written by something else than splitkeeper
    row.update(attempt_id="bad", run_id="other", created_at=datetime.now(UTC), commit_ms=0)
    write_deltalake(f"{root}/checkpoints", TABLES["checkpoints"].rows([row]), mode="append")
    enum_rows = [{**r, "checkpoint_id": 2, "attempt_id": "bad"} for r in serde.enumerator_to_rows(enumerator)]
    write_deltalake(f"{root}/enumerator_state", TABLES["enumerator_state"].rows(enum_rows), mode="append")
    before = tree(root)
    with pytest.raises(StateError) as err:
        _open(root).latest_checkpoint()
    assert f"state table checkpoints: checkpoint 2 holds split 's1' at position {position!r}" in str(
        err.value
    )
    assert err.value.params["table"] == "checkpoints" and err.value.params["split_id"] == "s1"
    assert tree(root) == before
    assert _open(root).load_checkpoint(1) == global_(1)  # what was committed is still readable


@pytest.mark.parametrize("position", [None, -1])
def test_an_enumerator_row_with_a_bad_position_is_refused_naming_it_and_changes_nothing(root, position):
    store = _open(root)
    enumerator = global_(1).enumerator
    assert enumerator is not None
    store.commit_checkpoint(decision_for(global_(1)))
    attempt = store.kept()[1][0].attempt_id
    table = DeltaTable(f"{root}/enumerator_state")
    value = "NULL" if position is None else str(position)
    table.update(updates={"position": value}, predicate=f"split_id = 's0' AND attempt_id = '{attempt}'")
    before = tree(root)
    with pytest.raises(StateError) as err:
        _open(root).latest_checkpoint()
    assert f"state table enumerator_state: checkpoint 1 holds split 's0' at position {position!r}" in str(
        err.value
    )
    assert tree(root) == before


class _RemoveStaging(DriverHooks):
    """Removes the epoch's staging folder after its decision record: lost under the driver."""

    def __init__(self, staging: str, epoch: int) -> None:
        self.staging, self.epoch = staging, epoch

    def crash_point(self, point: CrashPoint, epoch: int) -> None:
        if (point, epoch) == (CrashPoint.AFTER_DECISION, self.epoch):
            shutil.rmtree(os.path.join(self.staging, f"epoch={epoch}"))


def test_a_staging_folder_lost_before_the_sink_commit_names_the_path_and_leaves_no_rows(tmp_path):
    pipeline = LocalPipeline(tmp_path)
    pipeline.write_input(files=2, lines=30)
    pipeline.run(1)
    sink_before = tree(pipeline.sink_path)
    decisions_before = _rows(pipeline.state, "decisions").num_rows
    driver = pipeline.driver(_RemoveStaging(pipeline.staging, 2))
    driver.open()
    with pytest.raises(StagedOutputError) as err:
        driver.run(1)
    assert "[STATE_ERROR]" in str(err.value) and f"{pipeline.staging}/epoch=2/" in str(err.value)
    assert "Nothing was committed: recover the pipeline" in str(err.value)
    assert tree(pipeline.sink_path) == sink_before  # nothing reached the sink
    assert _rows(pipeline.state, "decisions").num_rows == decisions_before  # its decision is gone
    assert driver.state.checkpoint_ids() == [1]
    again = pipeline.run()  # recovery reads epoch 2's ranges again
    assert again.state.checkpoint_ids()[-1] > 1
