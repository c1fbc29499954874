"""Row conversions (splitkeeper.delta.serde): lossless, loud on unknown fields and on bad rows. No Spark."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitkeeper.core.ports import EpochDecision
from splitkeeper.core.types import (
    AuditRecord,
    BacklogSnapshot,
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    RegionOutcome,
    RegionState,
    Split,
)
from splitkeeper.delta import serde
from splitkeeper.delta.serde import EpochPlan, PlannedRange
from splitkeeper.errors import InvalidParameterError, StateError

from .samples import AUDIT, checkpoint, snapshot


def test_split_round_trips_with_open_end_and_backlog_boundary():
    for split in (Split("a"), Split("b", "topic", 5, end=9, backlog_end=7), Split("c", "", 3, backlog_end=3)):
        assert serde.split_from_row(serde.split_to_row(split)) == split


def test_enumerator_snapshot_round_trips_with_empty_reader_order_finished_and_backlog():
    snap = snapshot()
    rows = serde.enumerator_to_rows(snap)
    header = serde.enumerator_header(snap)
    restored = serde.enumerator_from_rows(header, list(reversed(rows)))  # row order must not matter
    assert restored == snap
    assert restored.pool == snap.pool  # tuple order kept, not re-sorted
    assert restored.assignments[1] == ()
    assert {r["status"] for r in rows} == {"assigned", "pool", "finished", "backlog"}


def test_backlog_snapshot_round_trips_including_ids_that_are_not_live_splits():
    backlog = BacklogSnapshot(boundaries={"a": 3, "gone": 9}, finished=frozenset({"a", "only-finished"}))
    assert serde.backlog_from_rows(serde.backlog_to_rows(backlog)) == backlog


def test_completed_checkpoint_round_trips_regional_and_global_through_json():
    for completed in (checkpoint(7, ref=6), checkpoint(8, ref=None)):
        assert completed.enumerator is not None
        row = serde.checkpoint_to_row(completed)
        rows = serde.enumerator_to_rows(completed.enumerator)
        row, rows = json.loads(json.dumps(row)), json.loads(json.dumps(rows))
        assert serde.checkpoint_from_rows(row, rows) == completed


def test_checkpoint_without_enumerator_round_trips():
    completed = dataclasses.replace(checkpoint(), enumerator=None)
    assert serde.checkpoint_from_rows(serde.checkpoint_to_row(completed)) == completed


def test_audit_records_round_trip_in_order():
    rows = [serde.audit_to_row(a, seq) for seq, a in enumerate(AUDIT)]
    assert serde.audit_from_rows(reversed(rows)) == list(AUDIT)


def test_decision_round_trips_with_its_checkpoint_audit_and_acknowledged_regions():
    decision = EpochDecision(
        checkpoint=checkpoint(7, ref=6),
        attempt_id="attempt-7",
        audit=AUDIT,
        acknowledged=(0, 1),
        configured_parallelism=4,
        reason="region 2 timed out",
    )
    row = json.loads(json.dumps(serde.decision_to_row(decision)))
    assert row["epoch_id"] == 7 and row["attempt_id"] == "attempt-7"
    assert serde.decision_from_row(row) == decision
    bare = EpochDecision(dataclasses.replace(checkpoint(8, ref=None), enumerator=None), "a")
    assert serde.decision_from_row(serde.decision_to_row(bare)) == bare


def test_plan_round_trips_with_empty_region_and_split_tuples():
    plan = serde.coerce_plan(4, {0: [(Split("a", position=3), 3, 9), ("b", 0, 2)], 1: []}, "run-1")
    assert plan == EpochPlan(4, {0: (PlannedRange("a", 3, 9), PlannedRange("b", 0, 2)), 1: ()}, "run-1")
    rows = [{**r, "run_id": "run-1"} for r in serde.plan_to_rows(plan)]
    assert serde.plan_from_rows(4, rows) == plan


def test_plan_reading_one_split_in_two_regions_is_refused():
    with pytest.raises(InvalidParameterError, match="regions 0 and 1 both read it"):
        serde.coerce_plan(1, {0: [("a", 0, 1)], 1: [("a", 1, 2)]})


def test_aborted_checkpoint_has_no_checkpoints_row():
    aborted = dataclasses.replace(checkpoint(), kind=CheckpointKind.ABORTED)
    with pytest.raises(InvalidParameterError, match="log_attempt"):
        serde.checkpoint_to_row(aborted)


def test_unknown_enum_value_in_a_row_names_the_column_and_allowed_values():
    row = serde.checkpoint_to_row(checkpoint())
    row["kind"] = "partial"
    with pytest.raises(StateError, match=r"checkpoints.kind holds 'partial'.*'global'"):
        serde.checkpoint_from_rows(row)


@pytest.mark.parametrize("position", [None, -1])
def test_a_split_position_that_is_null_or_negative_names_the_table_checkpoint_and_split(position):
    completed = checkpoint(7, ref=6)
    assert completed.enumerator is not None
    row = serde.checkpoint_to_row(completed)
    row["regions"][0]["splits"][1]["position"] = position
    with pytest.raises(StateError) as err:
        serde.checkpoint_from_rows(row, serde.enumerator_to_rows(completed.enumerator))
    text = str(err.value)
    assert f"state table checkpoints: checkpoint 7 holds split 't-2' at position {position!r}" in text
    assert "restore the state directory from a backup" in text.lower()
    assert err.value.params == {
        "table": "checkpoints",
        "checkpoint_id": 7,
        "split_id": "t-2",
        "position": position,
    }

    rows = serde.enumerator_to_rows(completed.enumerator)
    pooled = next(r for r in rows if r["status"] == "pool")
    pooled["position"] = position
    with pytest.raises(StateError, match=r"state table enumerator_state: checkpoint 7 holds split 't-9'"):
        serde.checkpoint_from_rows(serde.checkpoint_to_row(completed), rows)


def test_serde_knows_every_field_of_the_persisted_core_types():
    """A field added to core/types.py must be added to the tables and serde too."""
    known = {
        Split: serde.SPLIT_FIELDS,
        RegionState: serde.REGION_FIELDS,
        BacklogSnapshot: serde.BACKLOG_FIELDS,
        EnumeratorSnapshot: serde.ENUMERATOR_FIELDS,
        CompletedCheckpoint: serde.CHECKPOINT_FIELDS,
        AuditRecord: serde.AUDIT_FIELDS,
        EpochDecision: serde.DECISION_FIELDS,
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
    snap = EnumeratorSnapshot(
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
    completed = CompletedCheckpoint(6, CheckpointKind.REGIONAL, 4, regions, snap, 1, False)
    rows = serde.enumerator_to_rows(snap)
    assert serde.checkpoint_from_rows(serde.checkpoint_to_row(completed), rows) == completed
