"""The Delta state store and its row conversions (serde).

The serde tests need no Spark; the store tests (marked ``spark``) run on the shared
session against a fresh state directory per test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitkeeper.core.types import (
    AuditRecord,
    BacklogSnapshot,
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    RecoveryDecision,
    RegionOutcome,
    RegionState,
    Split,
)
from splitkeeper.errors import CheckpointError, ConcurrentRunError, InvalidParameterError, StateError
from splitkeeper.runtime import serde
from splitkeeper.runtime.serde import EpochPlan, PlannedRange
from splitkeeper.runtime.state_store import PARTITION_COLUMNS, is_concurrent_modification

# ---------------------------------------------------------------------------------------
# sample values
# ---------------------------------------------------------------------------------------


def _snapshot(checkpoint_id: int = 7) -> EnumeratorSnapshot:
    return EnumeratorSnapshot(
        checkpoint_id=checkpoint_id,
        parallelism=3,
        pool=(Split("t-9", "t", 4, backlog_end=20), Split("t-1", "t", 0)),
        assignments={
            0: (Split("t-3", "t", 11, end=50), Split("t-2", "t", 5)),
            1: (),  # a registered reader that owns nothing
            2: (Split("f-0", "files", 100, end=100),),
        },
        finished=frozenset({"f-old", "t-0"}),
        subscriptions=frozenset({"t", "files", "gone-but-listed"}),
        backlog=BacklogSnapshot(
            boundaries={"t-9": 20, "t-3": 40, "t-dead": 7}, finished=frozenset({"t-3", "x"})
        ),
    )


def _checkpoint(checkpoint_id: int = 7, ref: int | None = 6) -> CompletedCheckpoint:
    regions = {
        0: RegionState(0, (Split("t-3", "t", 11, end=50), Split("t-2", "t", 5)), ("e7:n10", "e6:n3")),
        1: RegionState(1, (), ()),
    }
    if ref is not None:
        regions[2] = RegionState(
            2, (Split("f-0", "files", 90, end=100),), ("e6:n1",), ref_checkpoint_id=ref,
            outcome=RegionOutcome.TIMEOUT, ref_depth=1,
        )  # fmt: skip
    else:
        regions[2] = RegionState(2, (Split("f-0", "files", 100, end=100),), ("e7:n0",))
    return CompletedCheckpoint(
        checkpoint_id=checkpoint_id,
        kind=CheckpointKind.REGIONAL if ref is not None else CheckpointKind.GLOBAL,
        parallelism=3,
        regions=regions,
        enumerator=_snapshot(checkpoint_id),
        consecutive_regional=1 if ref is not None else 0,
        processing_backlog=True,
    )


AUDIT = (
    AuditRecord("t-1", None, RecoveryDecision.DISCOVERED, None),
    AuditRecord("t-2", 0, RecoveryDecision.ASSIGNED, 7, "least-loaded"),
    AuditRecord("f-0", 2, RecoveryDecision.RETURNED_REGION_FALLBACK, 6, "region 2 timed out"),
)


# ---------------------------------------------------------------------------------------
# serde: lossless, loud on unknown fields (no Spark)
# ---------------------------------------------------------------------------------------


def test_split_round_trips_with_open_end_and_backlog_boundary():
    for split in (Split("a"), Split("b", "topic", 5, end=9, backlog_end=7), Split("c", "", 3, backlog_end=3)):
        assert serde.split_from_row(serde.split_to_row(split)) == split


def test_enumerator_snapshot_round_trips_with_empty_reader_order_finished_and_backlog():
    snapshot = _snapshot()
    rows = serde.enumerator_to_rows(snapshot)
    header = serde.enumerator_header(snapshot)
    restored = serde.enumerator_from_rows(header, list(reversed(rows)))  # row order must not matter
    assert restored == snapshot
    assert restored.pool == snapshot.pool  # tuple order kept, not re-sorted
    assert restored.assignments[1] == ()
    assert {r["status"] for r in rows} == {"assigned", "pool", "finished", "backlog"}


def test_backlog_snapshot_round_trips_including_ids_that_are_not_live_splits():
    backlog = BacklogSnapshot(boundaries={"a": 3, "gone": 9}, finished=frozenset({"a", "only-finished"}))
    assert serde.backlog_from_rows(serde.backlog_to_rows(backlog)) == backlog


def test_completed_checkpoint_round_trips_regional_and_global_through_json():
    for completed in (_checkpoint(7, ref=6), _checkpoint(8, ref=None)):
        assert completed.enumerator is not None
        row = serde.checkpoint_to_row(completed)
        rows = serde.enumerator_to_rows(completed.enumerator)
        # the driver keeps these rows in a JSON decision file before the sink commit
        row, rows = json.loads(json.dumps(row)), json.loads(json.dumps(rows))
        assert serde.checkpoint_from_rows(row, rows) == completed


def test_checkpoint_without_enumerator_round_trips():
    completed = dataclasses.replace(_checkpoint(), enumerator=None)
    assert serde.checkpoint_from_rows(serde.checkpoint_to_row(completed)) == completed


def test_audit_records_round_trip_in_order():
    rows = [serde.audit_to_row(a, seq) for seq, a in enumerate(AUDIT)]
    assert serde.audit_from_rows(reversed(rows)) == list(AUDIT)


def test_plan_round_trips_with_empty_region_and_split_tuples():
    plan = serde.coerce_plan(4, {0: [(Split("a", position=3), 3, 9), ("b", 0, 2)], 1: []}, "run-1")
    assert plan == EpochPlan(4, {0: (PlannedRange("a", 3, 9), PlannedRange("b", 0, 2)), 1: ()}, "run-1")
    rows = [{**r, "run_id": "run-1"} for r in serde.plan_to_rows(plan)]
    assert serde.plan_from_rows(4, rows) == plan


def test_plan_reading_one_split_in_two_regions_is_refused():
    with pytest.raises(InvalidParameterError, match="regions 0 and 1 both read it"):
        serde.coerce_plan(1, {0: [("a", 0, 1)], 1: [("a", 1, 2)]})


def test_aborted_checkpoint_has_no_checkpoints_row():
    aborted = dataclasses.replace(_checkpoint(), kind=CheckpointKind.ABORTED)
    with pytest.raises(InvalidParameterError, match="log_attempt"):
        serde.checkpoint_to_row(aborted)


def test_unknown_enum_value_in_a_row_names_the_column_and_allowed_values():
    row = serde.checkpoint_to_row(_checkpoint())
    row["kind"] = "partial"
    with pytest.raises(StateError, match=r"checkpoints.kind holds 'partial'.*'global'"):
        serde.checkpoint_from_rows(row)


def test_serde_knows_every_field_of_the_persisted_core_types():
    """A field added to core/types.py must be added to the tables and serde too."""
    known = {
        Split: serde.SPLIT_FIELDS,
        RegionState: serde.REGION_FIELDS,
        BacklogSnapshot: serde.BACKLOG_FIELDS,
        EnumeratorSnapshot: serde.ENUMERATOR_FIELDS,
        CompletedCheckpoint: serde.CHECKPOINT_FIELDS,
        AuditRecord: serde.AUDIT_FIELDS,
    }
    for kind, fields in known.items():
        assert {f.name for f in dataclasses.fields(kind)} == set(fields), kind.__name__


def test_a_value_with_a_field_serde_does_not_persist_is_refused_not_dropped():
    @dataclasses.dataclass(frozen=True, slots=True)
    class TaggedSplit(Split):
        tag: str = ""

    assert serde.split_to_row(TaggedSplit("a"))["split_id"] == "a"  # default value: nothing lost
    with pytest.raises(StateError, match=r"TaggedSplit.tag is not persisted"):
        serde.split_to_row(TaggedSplit("a", tag="x"))


_ids = st.text("abcxyz-0123", min_size=1, max_size=5)
_splits = st.builds(
    Split,
    split_id=_ids,
    subscription=st.sampled_from(["", "t", "files"]),
    position=st.integers(0, 50),
    end=st.none() | st.integers(50, 90),
    backlog_end=st.none() | st.integers(0, 90),
)


@settings(max_examples=60, deadline=None)
@given(
    pool=st.lists(_splits, max_size=4),
    owned=st.dictionaries(st.integers(0, 3), st.lists(_splits, max_size=3), max_size=4),
    finished=st.frozensets(_ids, max_size=3),
    boundaries=st.dictionaries(_ids, st.integers(0, 99), max_size=4),
    backlog_done=st.frozensets(_ids, max_size=3),
    refs=st.dictionaries(st.integers(0, 3), st.none() | st.integers(0, 5), min_size=1, max_size=4),
)
def test_any_checkpoint_round_trips(pool, owned, finished, boundaries, backlog_done, refs):
    snapshot = EnumeratorSnapshot(
        checkpoint_id=6,
        parallelism=4,
        pool=tuple(pool),
        assignments={r: tuple(s) for r, s in owned.items()},
        finished=finished,
        subscriptions=frozenset({"t"}),
        backlog=BacklogSnapshot(boundaries, backlog_done),
    )
    regions = {
        r: RegionState(
            r,
            tuple(owned.get(r, ())),
            (f"op-{r}",),
            ref,
            RegionOutcome.ACK if ref is None else RegionOutcome.DECLINE,
            0 if ref is None else 1,
        )
        for r, ref in refs.items()
    }
    completed = CompletedCheckpoint(6, CheckpointKind.REGIONAL, 4, regions, snapshot, 1, False)
    rows = serde.enumerator_to_rows(snapshot)
    assert serde.checkpoint_from_rows(serde.checkpoint_to_row(completed), rows) == completed


# ---------------------------------------------------------------------------------------
# conflict detection (no Spark)
# ---------------------------------------------------------------------------------------


class _JavaClass:
    def __init__(self, name: str) -> None:
        self._name = name

    def getName(self) -> str:  # noqa: N802 - py4j naming
        return self._name


class _JavaThrowable:
    def __init__(self, name: str, cause: _JavaThrowable | None = None) -> None:
        self._class = _JavaClass(name)
        self._cause = cause

    def getClass(self) -> _JavaClass:  # noqa: N802
        return self._class

    def getCause(self) -> _JavaThrowable | None:  # noqa: N802
        return self._cause


def test_delta_conflicts_are_recognised_by_class_name_through_wrappers():
    class ConcurrentAppendException(Exception):
        pass

    assert is_concurrent_modification(ConcurrentAppendException("x"))
    wrapped = RuntimeError("job failed")
    wrapped.java_exception = _JavaThrowable(  # type: ignore[attr-defined]
        "org.apache.spark.SparkException",
        _JavaThrowable("io.delta.exceptions.ConcurrentTransactionException"),
    )
    assert is_concurrent_modification(wrapped)
    try:
        try:
            raise ConcurrentAppendException("inner")
        except ConcurrentAppendException as inner:
            raise ValueError("outer") from inner
    except ValueError as outer:
        assert is_concurrent_modification(outer)
    plain = RuntimeError("boom")
    plain.java_exception = _JavaThrowable("java.io.IOException")  # type: ignore[attr-defined]
    assert not is_concurrent_modification(plain)
    assert not is_concurrent_modification(ValueError("ConcurrentAppendException in the text only"))


# ---------------------------------------------------------------------------------------
# the store on Delta
# ---------------------------------------------------------------------------------------


@pytest.fixture
def store_root(scratch):
    return str(scratch.path("state"))


def _open(spark, root, name="orders", fingerprint="files:/in", **kwargs):
    from splitkeeper.runtime.state_store import DeltaStateStore

    return DeltaStateStore(spark, root, name, fingerprint, **kwargs)


def _global(checkpoint_id: int, position: int = 0) -> CompletedCheckpoint:
    regions = {
        r: RegionState(r, (Split(f"s{r}", "t", position + checkpoint_id),), (f"op{r}",)) for r in range(2)
    }
    enumerator = EnumeratorSnapshot(checkpoint_id, 2, assignments={r: s.splits for r, s in regions.items()})
    return CompletedCheckpoint(checkpoint_id, CheckpointKind.GLOBAL, 2, regions, enumerator)


def _regional(checkpoint_id: int, ref: CompletedCheckpoint, failed: int = 1) -> CompletedCheckpoint:
    fresh = _global(checkpoint_id)
    regions = dict(fresh.regions)
    fallback = ref.regions[failed]
    regions[failed] = dataclasses.replace(
        fallback,
        ref_checkpoint_id=ref.checkpoint_id,
        outcome=RegionOutcome.DECLINE,
        ref_depth=fallback.ref_depth + 1,
    )
    return dataclasses.replace(
        fresh,
        kind=CheckpointKind.REGIONAL,
        regions=regions,
        consecutive_regional=ref.consecutive_regional + 1,
    )


@pytest.mark.spark
def test_tables_are_created_once_and_reopening_writes_nothing(spark, store_root):
    from delta.tables import DeltaTable

    store = _open(spark, store_root)
    versions = {t: store.table_version(t) for t in serde.STATE_TABLES}
    again = _open(spark, store_root)
    assert {t: again.table_version(t) for t in serde.STATE_TABLES} == versions
    for table in serde.STATE_TABLES:
        path = store.table_path(table)
        assert DeltaTable.isDeltaTable(spark, path)
        assert spark.read.format("delta").load(path).schema == store.schema(table)
        detail = DeltaTable.forPath(spark, path).detail().first()
        assert detail is not None
        properties = detail["properties"]
        partition = PARTITION_COLUMNS[table]
        assert detail["partitionColumns"] == ([partition] if partition else [])
        assert properties["delta.checkpointInterval"] == "10"
        assert properties["delta.isolationLevel"] == "Serializable"
    assert spark.read.format("delta").load(store.table_path("pipeline")).count() == 1


@pytest.mark.spark
def test_state_dir_of_another_pipeline_is_refused_naming_both(spark, store_root):
    _open(spark, store_root, name="orders")
    with pytest.raises(StateError) as err:
        _open(spark, store_root, name="payments")
    assert "belongs to pipeline 'orders', not to pipeline 'payments'" in str(err.value)
    assert "its own state.path" in str(err.value)


@pytest.mark.spark
def test_changed_source_fingerprint_is_refused_unless_accepted(spark, store_root):
    _open(spark, store_root, fingerprint="files:/in")
    with pytest.raises(StateError, match="fingerprint 'files:/in', but the configured source has"):
        _open(spark, store_root, fingerprint="files:/other")
    _open(spark, store_root, fingerprint="files:/other", accept_source_change=True)
    _open(spark, store_root, fingerprint="files:/other")  # adopted: no error any more


@pytest.mark.spark
def test_plan_is_stored_once_and_a_second_plan_of_the_epoch_is_a_concurrent_run(spark, store_root):
    store = _open(spark, store_root, run_id="run-a")
    assert store.latest_plan_epoch() is None
    written = store.write_plan(3, {0: [(Split("s0", position=5), 5, 15)], 1: []})
    assert store.read_plan(3) == written == EpochPlan(3, {0: (PlannedRange("s0", 5, 15),), 1: ()}, "run-a")
    other = _open(spark, store_root, run_id="run-b")
    with pytest.raises(ConcurrentRunError) as err:
        other.write_plan(3, {0: [("s0", 5, 99)], 1: []})
    assert "pipeline 'orders': epoch 3 is already planned (by run run-a)" in str(err.value)
    assert err.value.params["epoch_id"] == 3
    assert store.read_plan(3) == written  # the first plan is intact
    assert store.latest_plan_epoch() == 3
    with pytest.raises(StateError, match="no plan for epoch 4"):
        store.read_plan(4)


@pytest.mark.spark
def test_two_planners_of_the_same_epoch_at_once_one_wins(spark, store_root):
    stores = [_open(spark, store_root, run_id=f"run-{i}") for i in range(2)]
    barrier = threading.Barrier(2)
    outcomes: dict[int, object] = {}

    def plan(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = stores[i].write_plan(1, {0: [(f"split-{i}", 0, 10)]})
        except ConcurrentRunError as err:
            outcomes[i] = err

    threads = [threading.Thread(target=plan, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes.values() if isinstance(o, EpochPlan)]
    losers = [o for o in outcomes.values() if isinstance(o, ConcurrentRunError)]
    assert len(winners) == 1 and len(losers) == 1
    assert stores[0].read_plan(1) == winners[0]


@pytest.mark.spark
def test_a_planner_that_checked_before_a_rival_planned_loses_and_removes_its_rows(spark, store_root):
    rival = _open(spark, store_root, run_id="run-a")
    late = _open(spark, store_root, run_id="run-b")
    checked = late._latest_plan_claim()  # run-b checks: nothing planned yet
    written = rival.write_plan(1, {0: [("s0", 0, 10)]})
    late._latest_plan_claim = lambda: checked  # run-b appends after run-a's commit, on its old check
    with pytest.raises(ConcurrentRunError, match=r"epoch 1 is already planned \(by run run-a\)"):
        late.write_plan(1, {0: [("s0", 0, 99)]})
    assert _open(spark, store_root).read_plan(1) == written  # run-b's rows are gone again
    assert _open(spark, store_root).latest_plan_epoch() == 1


@pytest.mark.spark
def test_a_checkpoint_committer_that_checked_before_a_rival_committed_loses_and_removes_its_rows(
    spark, store_root
):
    _open(spark, store_root).commit_checkpoint(_global(1))
    rival = _open(spark, store_root, run_id="run-a")
    late = _open(spark, store_root, run_id="run-b")
    checked = late._metadata()  # run-b checks: checkpoint 1 is the latest
    rival.commit_checkpoint(_global(2, position=100))
    late._metadata = lambda: checked  # run-b appends its row after run-a's, on its old check
    with pytest.raises(ConcurrentRunError, match="pipeline 'orders'"):
        late.commit_checkpoint(_global(2, position=200), [AuditRecord("s1", 1, RecoveryDecision.ASSIGNED, 2)])
    reader = _open(spark, store_root)
    assert reader.checkpoint_ids() == [1, 2]
    assert reader.load_checkpoint(2) == _global(2, position=100)
    assert reader.audit_for(2) == []
    rows = spark.read.format("delta").load(reader.table_path("checkpoints")).where("checkpoint_id = 2")
    assert rows.count() == 1  # run-b's row was deleted again


@pytest.mark.spark
def test_checkpoint_round_trip_equals_the_original(spark, store_root):
    store = _open(spark, store_root)
    store.commit_checkpoint(_global(6))
    completed = _checkpoint(7, ref=6)
    receipt = store.commit_checkpoint(completed, AUDIT)
    assert receipt.checkpoint_id == 7 and 0 <= receipt.commit_ms <= receipt.total_ms

    fresh = _open(spark, store_root)  # a restarted driver
    assert fresh.load_checkpoint(7) == completed
    assert fresh.latest_checkpoint() == completed
    assert fresh.get(7) == completed and 7 in fresh
    assert fresh.latest_global() == _global(6)
    assert fresh.checkpoint_ids() == [6, 7]
    assert fresh.audit_for(7) == list(AUDIT)
    assert fresh.audit_for(6) == []
    assert fresh.ref_chain(7) == [7, 6]
    assert fresh.chain_depth(7) == 1


@pytest.mark.spark
def test_unknown_checkpoint_names_the_id_and_the_available_ids(spark, store_root):
    store = _open(spark, store_root)
    assert store.latest_checkpoint() is None
    store.commit_checkpoint(_global(1))
    store.commit_checkpoint(_global(2))
    with pytest.raises(CheckpointError, match=r"checkpoint 5 of pipeline 'orders' .*\(available: \[1, 2\]\)"):
        store.load_checkpoint(5)
    with pytest.raises(CheckpointError, match=r"checkpoint 5 .*available: \[1, 2\]"):
        store.audit_for(5)


@pytest.mark.spark
def test_commit_of_an_old_or_repeated_id_is_a_concurrent_run_and_changes_nothing(spark, store_root):
    store = _open(spark, store_root)
    store.commit_checkpoint(_global(4))
    with pytest.raises(ConcurrentRunError, match="checkpoint 4 is already committed"):
        store.commit_checkpoint(_global(4, position=50))
    with pytest.raises(
        ConcurrentRunError, match="checkpoint 3 is older than the latest committed checkpoint 4"
    ):
        store.commit_checkpoint(_global(3))
    assert store.load_checkpoint(4) == _global(4)
    assert store.checkpoint_ids() == [4]


@pytest.mark.spark
def test_checkpoint_referring_to_a_missing_checkpoint_is_refused_by_the_core_rule(spark, store_root):
    store = _open(spark, store_root)
    store.commit_checkpoint(_global(1))
    with pytest.raises(CheckpointError, match="would break its ref chain"):
        store.commit_checkpoint(_regional(3, _global(2)))
    assert store.checkpoint_ids() == [1]


@pytest.mark.spark
def test_two_runs_committing_the_same_checkpoint_at_once_exactly_one_wins(spark, store_root):
    base = _open(spark, store_root)
    base.commit_checkpoint(_global(1))
    stores = [_open(spark, store_root, run_id=f"run-{i}") for i in range(2)]
    candidates = [_global(2, position=100), _global(2, position=200)]
    barrier = threading.Barrier(2)
    outcomes: dict[int, object] = {}

    def commit(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = stores[i].commit_checkpoint(
                candidates[i], [AuditRecord(f"s{i}", i, RecoveryDecision.ASSIGNED, 2)]
            )
        except ConcurrentRunError as err:
            outcomes[i] = err

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [i for i, o in outcomes.items() if not isinstance(o, Exception)]
    lost = [o for o in outcomes.values() if isinstance(o, ConcurrentRunError)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert "pipeline 'orders'" in str(lost[0]) and lost[0].params["epoch_id"] == 2
    winner = won[0]
    # state intact: exactly the winner's checkpoint, enumerator rows and audit
    reader = _open(spark, store_root)
    assert reader.load_checkpoint(2) == candidates[winner]
    assert reader.audit_for(2) == [AuditRecord(f"s{winner}", winner, RecoveryDecision.ASSIGNED, 2)]
    assert reader.load_checkpoint(1) == _global(1)
    assert reader.checkpoint_ids() == [1, 2]


@pytest.mark.spark
def test_rows_of_a_commit_that_died_before_its_checkpoint_row_are_never_read(spark, store_root):
    store = _open(spark, store_root)
    store.commit_checkpoint(_global(1))
    # a driver wrote the enumerator rows of checkpoint 2 and was killed before the checkpoints row
    ghost = serde.enumerator_to_rows(_snapshot(2))
    store._append("enumerator_state", [{**r, "checkpoint_id": 2, "attempt_id": "dead"} for r in ghost])
    assert store.checkpoint_ids() == [1]
    assert store.latest_checkpoint() == _global(1)
    store.commit_checkpoint(_global(2))  # the restarted run commits checkpoint 2 for real
    assert store.load_checkpoint(2) == _global(2)
    store.commit_checkpoint(_global(3))
    assert store.retain(1) == [1, 2]
    store.compact()
    leftover = spark.read.format("delta").load(store.table_path("enumerator_state"))
    assert {r.attempt_id for r in leftover.collect()} == {store._metadata()[1][-1][1]}


@pytest.mark.spark
def test_aborted_attempts_show_in_the_timeline_but_never_as_checkpoints(spark, store_root):
    store = _open(spark, store_root)
    first = _global(1)
    store.commit_checkpoint(first)
    store.log_attempt(
        2, {0: RegionOutcome.ACK, 1: RegionOutcome.TIMEOUT}, "forced global, region 1 timed out"
    )
    store.commit_checkpoint(_regional(3, first))
    with pytest.raises(InvalidParameterError, match="commit_checkpoint"):
        store.log_attempt(4, {0: RegionOutcome.ACK}, kind=CheckpointKind.GLOBAL)
    timeline = store.timeline()
    assert [(e.checkpoint_id, e.kind) for e in timeline] == [
        (1, CheckpointKind.GLOBAL),
        (2, CheckpointKind.ABORTED),
        (3, CheckpointKind.REGIONAL),
    ]
    assert timeline[1].failed_regions == (1,) and "timed out" in timeline[1].reason
    assert timeline[2].failed_regions == (1,) and timeline[2].ref_checkpoint_ids == {1: 1}
    assert timeline[0].commit_ms is not None and timeline[0].at <= timeline[2].at
    assert store.checkpoint_ids() == [1, 3]


@pytest.mark.spark
def test_retention_keeps_the_ref_chain_and_deletes_it_after_a_global(spark, store_root):
    store = _open(spark, store_root)
    c100 = _global(100)
    c101 = _regional(101, c100)
    c102 = _regional(102, c101)
    for completed in (c100, c101, c102):
        store.commit_checkpoint(
            completed, [AuditRecord("s0", 0, RecoveryDecision.ASSIGNED, completed.checkpoint_id)]
        )
    assert store.ref_chain(102) == [102, 101, 100]
    assert store.retain(1) == []
    assert store.checkpoint_ids() == [100, 101, 102]
    assert store.load_checkpoint(100) == c100  # still restorable: 102 depends on it

    store.commit_checkpoint(_global(103))
    assert store.retain(1) == [100, 101, 102]
    assert store.checkpoint_ids() == [103]
    assert store.latest_checkpoint() == _global(103)
    store.compact()  # the state rows the deleted checkpoints named go in the next compaction

    def ids_in(table: str) -> set[int]:
        return {r.checkpoint_id for r in spark.read.format("delta").load(store.table_path(table)).collect()}

    assert ids_in("enumerator_state") <= {103}
    assert ids_in("audit") == {100, 101, 102}  # the audit trail is history: kept for the report
    with pytest.raises(CheckpointError, match="available: \\[103\\]"):
        store.load_checkpoint(101)

    # The timeline still shows the whole history: the deleted checkpoints were archived first.
    timeline = store.timeline()
    assert [(e.checkpoint_id, e.kind) for e in timeline] == [
        (100, CheckpointKind.GLOBAL),
        (101, CheckpointKind.REGIONAL),
        (102, CheckpointKind.REGIONAL),
        (103, CheckpointKind.GLOBAL),
    ]
    assert timeline[2].failed_regions == (1,) and timeline[2].ref_checkpoint_ids == {1: 101}
    assert all(e.commit_ms is not None for e in timeline)
    assert store.retain(1) == []  # nothing more to delete, nothing archived twice
    assert [e.checkpoint_id for e in store.timeline()] == [100, 101, 102, 103]

    from splitkeeper.report.data import collect_report_data

    data = collect_report_data(store)
    assert [c.checkpoint_id for c in data.checkpoints] == [100, 101, 102, 103]
    assert [c.kind for c in data.checkpoints][1:3] == [CheckpointKind.REGIONAL] * 2
    assert data.checkpoints[0].loads == {0: 1, 1: 1} == data.checkpoints[-1].loads
    assert sorted({a.checkpoint_id for a in data.audit}) == [100, 101, 102]


@pytest.mark.spark
def test_time_travel_restores_a_checkpoint_that_retention_deleted(spark, store_root):
    store = _open(spark, store_root)
    store.commit_checkpoint(_global(1))
    time.sleep(1.1)
    moment = datetime.now(UTC)
    time.sleep(1.1)
    store.commit_checkpoint(_global(2))
    assert store.retain(1) == [1]
    with pytest.raises(CheckpointError):
        store.load_checkpoint(1)
    assert store.load_checkpoint(1, as_of=moment) == _global(1)


@pytest.mark.spark
def test_every_k_checkpoints_retention_purges_unreferenced_rows_and_compacts(spark, store_root):
    from delta.tables import DeltaTable

    store = _open(spark, store_root, compact_every=2)

    def optimized(table: str) -> bool:
        history = DeltaTable.forPath(spark, store.table_path(table)).history().collect()
        return any(h.operation == "OPTIMIZE" for h in history)

    def attempts() -> set[tuple[int, str]]:
        rows = spark.read.format("delta").load(store.table_path("enumerator_state")).collect()
        return {(r.checkpoint_id, r.attempt_id) for r in rows}

    store.commit_checkpoint(_global(1))
    # a lost attempt of checkpoint 1 (another run's rows) and two aborted attempts
    ghost = serde.enumerator_to_rows(_snapshot(1))
    store._append("enumerator_state", [{**r, "checkpoint_id": 1, "attempt_id": "lost"} for r in ghost])
    store.log_attempt(2, {0: RegionOutcome.DECLINE}, "declined")
    store.log_attempt(3, {0: RegionOutcome.TIMEOUT}, "timed out")
    store.retain(5)
    assert (1, "lost") in attempts() and not optimized("checkpoint_log")
    store.commit_checkpoint(_global(4))
    store.retain(5)  # the second commit since the last compaction: compact now
    assert (1, "lost") not in attempts()
    assert {cid for cid, _ in attempts()} == {1, 4}
    assert optimized("checkpoint_log")  # two small files became one
    assert store.load_checkpoint(1) == _global(1) and store.latest_checkpoint() == _global(4)
    assert [e.checkpoint_id for e in store.timeline()] == [1, 2, 3, 4]


@pytest.mark.spark
@pytest.mark.slow
def test_history_does_not_grow_what_restore_reads_after_compaction(spark, scratch):
    """Restore time must not grow with history: what it reads is bounded, whatever the count.

    The timing itself (after 10 and after 200 checkpoints) is the benchmark's
    (``splitkeeper bench ingest`` prints it); here the structure behind it is checked:
    after 12 checkpoints with compaction every 6, every state table holds a bounded
    number of files (without compaction each checkpoint adds at least one per table),
    and restore reads only the rows of the checkpoint it restores.
    """
    from splitkeeper.runtime.state_store import DeltaStateStore, measure_state_store

    root = str(scratch.path("measure"))
    figures = measure_state_store(
        spark, root, checkpoints=12, marks=(6, 12), compact_every=6, restore_repeats=1
    )
    print("\n" + figures.summary())
    assert len(figures.commit_ms) == 12 and set(figures.restore_ms) == {6, 12}

    store = DeltaStateStore(spark, root, "measure", "synthetic")
    files = {
        t: spark.sql(f"DESCRIBE DETAIL delta.`{store.table_path(t)}`").first()["numFiles"]
        for t in serde.STATE_TABLES
    }
    assert max(files.values()) <= 6, files  # 12 checkpoints, compacted every 6 (3 kept; history compacted)
    latest = store.latest_checkpoint()
    assert latest is not None and latest.checkpoint_id == 12
    assert store.checkpoint_ids() == [10, 11, 12]  # keep_latest=3, every checkpoint global or short chains


@pytest.mark.spark
def test_a_checkpoints_table_of_older_state_gains_configured_parallelism_and_reads_null_there(
    spark, store_root
):
    # State written before configured_parallelism existed: its checkpoints table lacks the column.
    old_ddl = serde.read_ddl("checkpoints").replace(", configured_parallelism INT", "")
    assert "configured_parallelism" not in old_ddl
    path = os.path.join(store_root, "checkpoints")
    spark.sql(f"CREATE TABLE delta.`{path}` ({old_ddl}) USING DELTA PARTITIONED BY (checkpoint_id)")

    store = _open(spark, store_root)  # migrates: ALTER TABLE ADD COLUMNS, no error
    assert store.table_path("checkpoints") == path
    assert spark.read.format("delta").load(path).schema == store.schema("checkpoints")
    store.commit_checkpoint(_global(1))  # a writer that does not say: NULL, like the old rows
    store.commit_checkpoint(_global(2), configured_parallelism=3)
    again = _open(spark, store_root)
    assert again.configured_parallelism(1) is None  # not loaded yet
    again.load_checkpoint(1)
    assert again.load_checkpoint(2) == _global(2)
    assert (again.configured_parallelism(1), again.configured_parallelism(2)) == (None, 3)


def _backlogged(checkpoint_id: int, ref: CompletedCheckpoint | None = None) -> CompletedCheckpoint:
    """Region 0: three splits, two of them short of their backlog end; region 1: one split."""
    base = _global(checkpoint_id) if ref is None else _regional(checkpoint_id, ref)
    region0 = dataclasses.replace(
        base.regions[0],
        splits=(
            Split("b-0", "t", 5, backlog_end=9),
            Split("b-1", "t", 9, backlog_end=9),  # reached its backlog end
            Split("b-2", "t", 0, backlog_end=4),
        ),
    )
    return dataclasses.replace(base, regions={**base.regions, 0: region0}, processing_backlog=True)


@pytest.mark.spark
def test_retention_archives_the_same_facts_from_remembered_and_from_read_rows(spark, store_root):
    store = _open(spark, store_root)
    second = _backlogged(2)
    for completed in (_backlogged(1), second, _backlogged(3, second), _global(4)):
        store.commit_checkpoint(completed)
    written = {
        r.checkpoint_id: r for r in spark.read.format("delta").load(store.table_path("checkpoints")).collect()
    }
    assert store.retain(2) == [1]  # 3 refers to 2. This store wrote 1: archived from memory
    assert _open(spark, store_root).retain(1) == [2, 3]  # a new store (a restarted driver): read

    log = {
        r.checkpoint_id: r
        for r in spark.read.format("delta").load(store.table_path("checkpoint_log")).collect()
    }
    assert sorted(log) == [1, 2, 3]
    for checkpoint_id in (1, 2, 3):
        row, original = log[checkpoint_id], written[checkpoint_id]
        assert [(g.region_id, g.outcome, g.ref_checkpoint_id, g.splits) for g in row.regions] == [
            (g.region_id, g.outcome, g.ref_checkpoint_id, len(g.splits)) for g in original.regions
        ]
        assert (row.kind, row.reason, row.run_id, row.attempt_id) == (
            original.kind,
            "",
            store.run_id,
            original.attempt_id,
        )
        assert (row.parallelism, row.processing_backlog, row.commit_ms, row.created_at) == (
            original.parallelism,
            True,
            original.commit_ms,
            original.created_at,
        )
        assert row.logged_at >= original.created_at
    assert log[1].backlog_splits == log[2].backlog_splits == 2  # b-0, b-2; b-1 reached its end
    assert log[3].regions[1].ref_checkpoint_id == 2 and log[3].regions[1].outcome == "decline"
    assert [e.checkpoint_id for e in store.timeline()] == [1, 2, 3, 4]


def _rows_of(spark, store, table: str = "checkpoints") -> list[int]:
    return sorted(r.checkpoint_id for r in spark.read.format("delta").load(store.table_path(table)).collect())


@pytest.mark.spark
def test_retention_of_its_own_checkpoints_runs_no_spark_job(spark, store_root):
    store = _open(spark, store_root)
    for checkpoint_id in (1, 2, 3):
        store.commit_checkpoint(_global(checkpoint_id))
    store.latest_checkpoint()  # the ids are known, as after a run's first epoch
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup("retain", "retention")
    try:
        assert store.retain(1) == [1, 2]
    finally:
        spark.sparkContext.setJobGroup("", "")
    assert tracker.getJobIdsForGroup("retain") == []
    assert _rows_of(spark, store) == [3]  # the rows are gone from the table, not just the cache
    assert _open(spark, store_root).checkpoint_ids() == [3]
    assert [e.checkpoint_id for e in store.timeline()] == [1, 2, 3]
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, store.table_path("checkpoints")).history(1).collect()
    assert history[0].operation == "DELETE"


@pytest.mark.spark
def test_retention_after_another_store_compacted_deletes_with_spark(spark, store_root):
    store = _open(spark, store_root)
    for checkpoint_id in (1, 2, 3):
        store.commit_checkpoint(_global(checkpoint_id))
    _open(spark, store_root).compact()  # another process rewrote the checkpoints files
    assert store.retain(1) == [1, 2]
    assert _rows_of(spark, store) == [3]
    assert _open(spark, store_root).latest_checkpoint() == _global(3)

    store.commit_checkpoint(_global(4))
    store.compact()  # its own compaction: what it remembered of 3 and 4 is stale too
    store.commit_checkpoint(_global(5))
    assert store.retain(1) == [3, 4]
    assert _rows_of(spark, store) == [5]
    assert [e.checkpoint_id for e in store.timeline()] == [1, 2, 3, 4, 5]
