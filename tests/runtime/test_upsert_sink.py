"""The upsert sink (``sink.mode: upsert``): each epoch is ONE fenced delta-rs MERGE of its winners
into the keyed table, and its records land once in the change table (a side table). The keyed table
always equals the fold of the change table (splitkeeper.records.upsert). Staged files are written by
the real region task body (json decode, tombstones), no Spark.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from splitkeeper.core.ports import RegionRun, SinkCrashPoint
from splitkeeper.core.source import RecordMeta, RegionReader, SourceRecord
from splitkeeper.core.types import RegionOutcome, Split
from splitkeeper.errors import ConcurrentRunError, InvalidParameterError, StateError
from splitkeeper.records.spec import Column, DecodeSpec
from splitkeeper.records.upsert import UpsertSpec
from splitkeeper.sinks.delta.read import read_dead_letters, read_sink
from splitkeeper.sinks.delta.sink import DeltaSink
from splitkeeper.sinks.delta.upsert import winners
from splitkeeper.spark.task import RecordPolicy, run_region_task
from splitkeeper.transforms import identity

DECODE = DecodeSpec(
    kind="json", columns=(Column("id", "BIGINT"), Column("name", "STRING"), Column("op", "STRING"))
)
BY_ID = UpsertSpec.of(("id",), "op = 'd'")
BY_KEY = UpsertSpec.of(("key",), None)
DATA = ("id", "name", "op")


class _Records(RegionReader):
    """Prepared records per split (offset = index), served by range."""

    def __init__(self, records: Mapping[str, Sequence[SourceRecord]]) -> None:
        self.records = records

    def read_range(self, split: Split, start: int, end: int) -> Iterator[SourceRecord]:
        return iter([r for r in self.records[split.split_id] if start <= r[0] < end])


def _record(offset: int, value: dict[str, Any] | None, key: bytes | None = None) -> SourceRecord:
    body = None if value is None else json.dumps(value).encode()
    return SourceRecord(offset, offset + 1, body, RecordMeta(key, "cdc", 0, 1_700_000_000_000 + offset))


class _Pipeline:
    """A sink and the region tasks of one test: ``epoch`` stages each region's splits and commits."""

    def __init__(
        self,
        root: Path,
        upsert: UpsertSpec,
        partition_by: tuple[str, ...] = (),
        tolerance: str = "none",
        **sink: Any,
    ) -> None:
        self.root = root
        self.policy = RecordPolicy(
            decode=DECODE, upsert=upsert, partition_by=partition_by, tolerance=tolerance, max_bad_ratio=1.0
        )
        self.staging = str(root / "staging")
        self.path = str(root / "keyed")
        self.changes = str(root / "keyed_changes")
        self.sink = self.open(**sink)
        self.positions: dict[str, int] = {}

    def open(self, **sink: Any) -> DeltaSink:
        return DeltaSink(
            self.path,
            "cdc",
            staging_path=self.staging,
            schema=self.policy.schema,
            partition_by=self.policy.partition_by,
            upsert=self.policy.upsert,
            changes_path=self.changes,
            **sink,
        )

    def stage(
        self, epoch: int, regions: Mapping[int, Mapping[str, Sequence[SourceRecord]]]
    ) -> list[RegionRun]:
        runs = []
        for region, splits in regions.items():
            plan = []
            for split_id, records in splits.items():
                start = self.positions.get(split_id, 0)
                end = max(r[0] for r in records) + 1
                plan.append((Split(split_id), start, end))
                self.positions[split_id] = end
            result = run_region_task(
                plan, _Records(splits), identity, self.staging, epoch, region, policy=self.policy
            )
            runs.append(RegionRun(region_id=region, outcome=RegionOutcome.ACK, output=result.staged_path))
        return runs

    def epoch(
        self, epoch: int, regions: Mapping[int, Mapping[str, Sequence[SourceRecord]]], attempt: str = ""
    ) -> Any:
        runs = self.stage(epoch, regions)
        return self.sink.commit(
            epoch, runs, expected=epoch - 1 if epoch > 1 else None, attempt_id=attempt or f"a{epoch}"
        )


def _rows(path: str, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    table = read_sink(path, list(columns))
    return sorted((tuple(r[c] for c in columns) for r in table.to_pylist()), key=repr)


def _fold(changes: str, upsert: UpsertSpec, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """The reference fold of the change table, in Python (the module doc of records.upsert): keyless
    tombstones dropped; per key the max (epoch, offset, split_id); deletes dropped."""
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in read_sink(changes).to_pylist():
        if row["tombstone"] and not upsert.keyed_tombstones:
            continue
        key = tuple(row[k] for k in upsert.key)
        order = (row["epoch"], row["offset"], row["split_id"])
        if key not in latest or order > tuple(latest[key][c] for c in ("epoch", "offset", "split_id")):
            latest[key] = row
    kept = [r for r in latest.values() if not r["tombstone"] and not (upsert.delete_when and r["op"] == "d")]
    return sorted((tuple(r[c] for c in columns) for r in kept), key=repr)


COLUMNS = ("split_id", "offset", "epoch", "key", *DATA)


def _change_offsets(changes: str) -> list[tuple[str, int]]:
    return sorted(
        (r["split_id"], r["offset"]) for r in read_sink(changes, ["split_id", "offset"]).to_pylist()
    )


def test_last_writer_wins_per_key_within_and_across_epochs_with_deletes(tmp_path: Path) -> None:
    p = _Pipeline(tmp_path, BY_ID)
    one = {
        0: {
            "s0": [
                _record(0, {"id": 1, "name": "a", "op": "c"}),
                _record(1, {"id": 2, "name": "b", "op": "c"}),
                _record(2, {"id": 3, "name": "c", "op": "c"}),
                _record(3, {"id": 1, "name": "a2", "op": "u"}),  # a later offset of id 1 wins
                _record(4, {"id": 2, "name": "b", "op": "d"}),  # delete by predicate, same epoch
                _record(5, {"id": 5, "name": "s0", "op": "c"}),
            ]
        },
        1: {
            "s1": [
                _record(0, {"id": 6, "name": "s1", "op": "c"}),
                _record(1, None),  # a tombstone without its key (key is a data column): changes only
                _record(
                    2, {"id": 3, "name": "c-s1", "op": "u"}
                ),  # offset 2 of s1 < offset 2 of s0? tie: s1 wins
                _record(5, {"id": 5, "name": "s1", "op": "u"}),  # same offset as s0's: higher split_id wins
            ]
        },
    }
    receipt = p.epoch(1, one)
    assert receipt.records == 10 and not receipt.replayed
    assert _rows(p.path, ("id", "name")) == sorted([(1, "a2"), (3, "c-s1"), (5, "s1"), (6, "s1")], key=repr)
    meta = p.sink.committed_metadata(1)
    assert meta is not None and meta.records == 10
    assert meta.metadata["upserts"] == 4 and meta.metadata["deletes"] == 0  # id 2 was never in the table
    two = {
        0: {
            "s0": [
                _record(6, {"id": 1, "name": "a3", "op": "u"}),
                _record(7, {"id": 3, "name": "x", "op": "d"}),
                _record(8, {"id": 4, "name": "d", "op": "c"}),
            ]
        },
        1: {
            "s1": [
                _record(6, {"id": 6, "name": "s1 again", "op": "u"}),
                _record(7, {"id": 1, "name": "old?", "op": "u"}),
            ]
        },
    }
    p.epoch(2, two)
    # id 1: s1 offset 7 beats s0 offset 6 in the same epoch (offset first, then split_id)
    assert _rows(p.path, ("id", "name")) == sorted(
        [(1, "old?"), (4, "d"), (5, "s1"), (6, "s1 again")], key=repr
    )
    meta = p.sink.committed_metadata(2)
    assert meta is not None and meta.metadata["deletes"] == 1 and meta.metadata["upserts"] == 3
    status = DeltaSink(p.path, "cdc", read_only=True).committed_metadata(2)  # any reader sees the counts
    assert status is not None and (status.metadata["upserts"], status.metadata["deletes"]) == (3, 1)
    assert _rows(p.path, COLUMNS) == _fold(p.changes, BY_ID, COLUMNS)
    expected = [("s0", o) for o in range(9)] + [("s1", o) for o in (0, 1, 2, 5, 6, 7)]
    assert _change_offsets(p.changes) == sorted(expected)  # every record once, the keyless tombstone too
    tomb = [r for r in read_sink(p.changes).to_pylist() if r["tombstone"]]
    assert [(r["split_id"], r["offset"], r["id"], r["name"]) for r in tomb] == [("s1", 1, None, None)]
    keyed = DeltaTable(p.path)
    assert "tombstone" not in keyed.schema().to_arrow().names
    assert keyed.metadata().configuration["splitkeeper.sink.key"] == "id"


def test_a_record_without_its_key_is_a_dead_letter_never_a_null_key_row(tmp_path: Path) -> None:
    """Issue 36 item 10: a missing, null or wrongly typed key folded into one NULL-key row that
    overwrote the records before it. Each such record is now a dead letter naming its key."""
    dead = str(tmp_path / "dead")
    p = _Pipeline(tmp_path, BY_ID, tolerance="all", dead_letter_path=dead)
    p.epoch(
        1,
        {
            0: {
                "s0": [
                    _record(0, {"id": 1, "name": "a", "op": "c"}),
                    _record(1, {"name": "no id", "op": "c"}),
                    _record(2, {"id": None, "name": "null id", "op": "c"}),
                    _record(3, {"id": "abc", "name": "a string id", "op": "c"}),  # rescued: id is null
                    _record(4, {"id": 2, "name": "b", "op": "c"}),
                    _record(5, None),  # a tombstone without its key: changes nothing (rule 4), not bad
                ]
            }
        },
    )
    p.epoch(
        2, {0: {"s0": [_record(6, {"name": "no id again", "op": "u"}), _record(7, {"id": 1, "name": "a2"})]}}
    )
    assert _rows(p.path, ("id", "name")) == [(1, "a2"), (2, "b")]  # no NULL-key row
    assert _rows(p.path, COLUMNS) == _fold(p.changes, BY_ID, COLUMNS)
    assert _change_offsets(p.changes) == [("s0", o) for o in (0, 4, 5, 7)]
    letters = {
        r["offset"]: r
        for r in read_dead_letters(
            dead, ["offset", "value", "stage", "error_class", "error_message"]
        ).to_pylist()
    }
    assert sorted(letters) == [1, 2, 3, 6]  # every record once: in the change table or a dead letter
    for offset in (1, 2, 3, 6):
        row = letters[offset]
        assert (row["stage"], row["error_class"]) == ("schema", "NullKey")
        assert (
            "key column 'id' is null" in row["error_message"] and "sink.key is ['id']" in row["error_message"]
        )
    assert json.loads(letters[3]["value"]) == {"id": "abc", "name": "a string id", "op": "c"}
    assert '_rescued: {"id":"abc"}' in letters[3]["error_message"]  # the value that did not fit is named


def test_a_record_without_its_kafka_key_is_a_dead_letter(tmp_path: Path) -> None:
    dead = str(tmp_path / "dead")
    p = _Pipeline(tmp_path, BY_KEY, tolerance="all", dead_letter_path=dead)
    p.epoch(
        1,
        {
            0: {
                "s0": [
                    _record(0, {"id": 0, "name": "k", "op": "c"}, key=b"k"),
                    _record(1, {"id": 1, "name": "no key", "op": "c"}, key=None),
                    _record(2, {"id": 2, "name": "no key 2", "op": "c"}, key=None),
                    _record(3, None, key=None),  # a tombstone without a key: changes nothing
                ]
            }
        },
    )
    assert _rows(p.path, ("key", "id")) == [(b"k", 0)]
    letters = read_dead_letters(dead, ["offset", "error_class", "error_message"]).to_pylist()
    assert [(r["offset"], r["error_class"]) for r in letters] == [(1, "NullKey"), (2, "NullKey")]
    assert "the record has no Kafka key" in letters[0]["error_message"]
    assert _change_offsets(p.changes) == [("s0", 0), ("s0", 3)]


def test_tombstones_delete_their_kafka_key(tmp_path: Path) -> None:
    p = _Pipeline(tmp_path, BY_KEY)
    p.epoch(
        1, {0: {"s0": [_record(o, {"id": o, "name": f"n{o}", "op": "c"}, key=b"k%d" % o) for o in range(4)]}}
    )
    p.epoch(
        2,
        {
            0: {
                "s0": [
                    _record(4, None, key=b"k1"),  # a Kafka tombstone deletes k1
                    _record(5, {"id": 20, "name": "again", "op": "u"}, key=b"k2"),
                    _record(6, None, key=b"k2"),  # ... and the later tombstone of k2 wins over its update
                    _record(7, None, key=b"nope"),  # a delete of a key that is not there changes nothing
                    _record(8, None, key=None),  # a null Kafka key is a key too (null-safe)
                ]
            }
        },
    )
    assert _rows(p.path, ("key", "id")) == [(b"k0", 0), (b"k3", 3)]
    assert _rows(p.path, COLUMNS) == _fold(p.changes, BY_KEY, COLUMNS)
    assert len(read_sink(p.changes)) == 9


def test_winners_are_computed_per_key_null_safely() -> None:
    policy = RecordPolicy(decode=DECODE, upsert=BY_ID)
    import pyarrow as pa

    rows = pa.table(
        {
            "split_id": ["a", "a", "b", "a", "b"],
            "offset": pa.array([1, 2, 2, 3, 0], pa.int64()),
            "id": pa.array([7, 7, 7, None, None], pa.int64()),
            "tombstone": [False, False, False, False, True],
        }
    )
    picked = winners(rows, BY_ID)
    assert sorted(zip(picked["split_id"].to_pylist(), picked["offset"].to_pylist(), strict=True)) == [
        ("a", 3),
        ("b", 2),
    ]
    assert policy.schema.field("id").nullable  # an upsert sink's data columns hold tombstones' nulls


def test_a_replay_is_a_no_op_and_another_attempt_is_refused(tmp_path: Path) -> None:
    p = _Pipeline(tmp_path, BY_ID)
    runs = p.stage(1, {0: {"s0": [_record(0, {"id": 1, "name": "a", "op": "c"})]}})
    first = p.sink.commit(1, runs, expected=None, attempt_id="x")
    version = DeltaTable(p.path).version()
    again = p.sink.commit(1, runs, expected=None, attempt_id="x")
    assert again.replayed and again.records == first.records == 1
    assert DeltaTable(p.path).version() == version and len(read_sink(p.changes)) == 1
    with pytest.raises(ConcurrentRunError):
        p.sink.commit(1, runs, expected=None, attempt_id="other")
    assert _rows(p.path, ("id", "name")) == [(1, "a")]


def test_a_crash_between_the_merge_and_the_change_commit_is_repaired_on_reopen(tmp_path: Path) -> None:
    def crash(point: SinkCrashPoint, epoch: int) -> None:
        if point is SinkCrashPoint.BEFORE_SIDE_COMMIT and epoch == 2:
            raise RuntimeError("killed between the commits")

    p = _Pipeline(tmp_path, BY_ID, crash_point=crash)
    p.epoch(
        1,
        {
            0: {
                "s0": [
                    _record(0, {"id": 1, "name": "a", "op": "c"}),
                    _record(1, {"id": 2, "name": "b", "op": "c"}),
                ]
            }
        },
    )
    with pytest.raises(RuntimeError, match="killed"):
        p.epoch(
            2, {0: {"s0": [_record(2, {"id": 1, "name": "a2", "op": "u"}), _record(3, {"id": 2, "op": "d"})]}}
        )
    assert p.sink.committed_epoch() == 2 and p.sink.change_epoch() == 1
    assert _change_offsets(p.changes) == [("s0", 0), ("s0", 1)]  # the redo is pending
    reopened = p.open()
    assert reopened.change_epoch() == 2
    assert _change_offsets(p.changes) == [("s0", o) for o in range(4)]
    assert _rows(p.path, COLUMNS) == _fold(p.changes, BY_ID, COLUMNS) and _rows(p.path, ("id", "name")) == [
        (1, "a2")
    ]
    p.sink = reopened
    p.epoch(3, {0: {"s0": [_record(4, {"id": 3, "name": "c", "op": "c"})]}})
    assert _change_offsets(p.changes) == [("s0", o) for o in range(5)]
    assert _rows(p.path, COLUMNS) == _fold(p.changes, BY_ID, COLUMNS)


def test_a_replay_after_a_crash_before_the_change_commit_commits_the_changes(tmp_path: Path) -> None:
    fail = {"on": True}

    def crash(point: SinkCrashPoint, epoch: int) -> None:
        if point is SinkCrashPoint.BEFORE_SIDE_COMMIT and fail["on"]:
            raise RuntimeError("killed between the commits")

    p = _Pipeline(tmp_path, BY_ID, crash_point=crash)
    runs = p.stage(1, {0: {"s0": [_record(0, {"id": 1, "name": "a", "op": "c"})]}})
    with pytest.raises(RuntimeError):
        p.sink.commit(1, runs, expected=None, attempt_id="x")
    fail["on"] = False
    receipt = p.sink.commit(1, runs, expected=None, attempt_id="x")
    assert receipt.replayed and receipt.records == 1 and p.sink.change_epoch() == 1
    assert _change_offsets(p.changes) == [("s0", 0)]


def test_the_mode_and_key_of_a_table_do_not_change(tmp_path: Path) -> None:
    p = _Pipeline(tmp_path, BY_ID)
    p.epoch(1, {0: {"s0": [_record(0, {"id": 1, "name": "a", "op": "c"})]}})
    append = RecordPolicy(decode=DECODE)
    with pytest.raises(
        StateError, match=r"upsert sink keyed by \[id\].*sink.mode: upsert and sink.key: \[id\]"
    ):
        DeltaSink(p.path, "cdc", schema=append.schema)
    with pytest.raises(StateError, match=r"keyed by \[id\].*sink.key \[key\]"):
        DeltaSink(p.path, "cdc", schema=p.policy.schema, upsert=BY_KEY, changes_path=p.changes)
    plain = str(tmp_path / "plain")
    DeltaSink(plain, "cdc", schema=append.schema)
    with pytest.raises(StateError, match=r"an append sink.*set sink.mode: append"):
        DeltaSink(plain, "cdc", schema=p.policy.schema, upsert=BY_ID, changes_path=p.changes)
    with pytest.raises(InvalidParameterError, match="decode.on_new_fields"):
        DeltaSink(tmp_path / "wide", "cdc", schema=p.policy.schema, upsert=BY_ID, widen=True)


def test_a_partitioned_upsert_sink_keeps_its_partitions_and_moves_a_key_between_them(tmp_path: Path) -> None:
    p = _Pipeline(tmp_path, BY_ID, partition_by=("op",))
    p.epoch(
        1,
        {
            0: {
                "s0": [
                    _record(0, {"id": 1, "name": "a", "op": "c"}),
                    _record(1, {"id": 2, "name": "b", "op": "c"}),
                ]
            }
        },
    )
    p.epoch(
        2,
        {
            0: {
                "s0": [
                    _record(2, {"id": 1, "name": "a2", "op": "u"}),
                    _record(3, {"id": 2, "name": "b", "op": "d"}),
                ]
            }
        },
    )
    assert _rows(p.path, ("id", "name", "op")) == [(1, "a2", "u")]  # moved from op=c to op=u; 2 deleted
    assert DeltaTable(p.path).metadata().partition_columns == ["op"]
    assert DeltaTable(p.changes).metadata().partition_columns == ["op"]
    assert _rows(p.path, COLUMNS) == _fold(p.changes, BY_ID, COLUMNS)
    assert _change_offsets(p.changes) == [("s0", o) for o in range(4)]
    assert sorted(r["op"] for r in read_sink(p.changes, ["op"]).to_pylist()) == ["c", "c", "d", "u"]


def test_filtered_offsets_beside_a_region_output_are_a_side_table_of_an_append_sink(tmp_path: Path) -> None:
    """The same side-table mechanism for the filtered offsets a Spark transform drops: moved before the
    fenced commit, listed in it, committed after it; a crash between is repaired on reopen."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from splitkeeper.delta.schemas import FILTERED_SCHEMA
    from splitkeeper.staging import FILTERED_FILE

    policy = RecordPolicy(decode=DECODE)
    staging, filtered = str(tmp_path / "staging"), str(tmp_path / "sink_filtered")

    def crash(point: SinkCrashPoint, epoch: int) -> None:
        if point is SinkCrashPoint.BEFORE_SIDE_COMMIT and epoch == 2:
            raise RuntimeError("killed between the commits")

    def sink(**extra: Any) -> DeltaSink:
        return DeltaSink(
            tmp_path / "sink",
            "f",
            staging_path=staging,
            schema=policy.schema,
            filtered_path=filtered,
            **extra,
        )

    def region(epoch: int, dropped: list[tuple[int, int]] | None) -> RegionRun:
        records = {"s0": [_record(10 * epoch + o, {"id": o, "name": "x", "op": "c"}) for o in range(3)]}
        plan = [(Split("s0"), 10 * epoch, 10 * epoch + 3)]
        result = run_region_task(plan, _Records(records), identity, staging, epoch, 0, policy=policy)
        if dropped is not None:
            rows = [
                {
                    "split_id": "s0",
                    "start_offset": a,
                    "end_offset": b,
                    "records": b - a,
                    "epoch": epoch,
                    "region": 0,
                    "function": "m:f",
                }
                for a, b in dropped
            ]
            pq.write_table(
                pa.Table.from_pylist(rows, FILTERED_SCHEMA),
                os.path.join(os.path.dirname(result.staged_path or ""), FILTERED_FILE),
            )
        return RegionRun(region_id=0, outcome=RegionOutcome.ACK, output=result.staged_path)

    first = sink(crash_point=crash)
    assert not os.path.exists(filtered)  # created with its first files
    first.commit(1, [region(1, [(13, 15)])], expected=None, attempt_id="a1")
    assert read_sink(filtered).num_rows == 1
    meta = first.committed_metadata(1)
    assert meta is not None and meta.metadata["filtered_records"] == 1
    with pytest.raises(RuntimeError, match="killed"):
        first.commit(2, [region(2, [(23, 24), (25, 27)])], expected=1, attempt_id="a2")
    assert sorted(read_sink(filtered, ["start_offset"])["start_offset"].to_pylist()) == [13]
    again = sink()  # the redo on open
    assert sorted(
        read_sink(filtered, ["start_offset", "end_offset", "epoch"]).to_pylist(), key=repr
    ) == sorted(
        [
            {"start_offset": 13, "end_offset": 15, "epoch": 1},
            {"start_offset": 23, "end_offset": 24, "epoch": 2},
            {"start_offset": 25, "end_offset": 27, "epoch": 2},
        ],
        key=repr,
    )
    again.commit(3, [region(3, None)], expected=2, attempt_id="a3")  # an output without the file has none
    assert read_sink(filtered).num_rows == 3 and DeltaTable(filtered).transaction_version("f") == 2
    assert len(read_sink(tmp_path / "sink")) == 9


def test_staged_tombstones_raw_keeps_the_null_value_and_typed_not_null_is_still_checked(
    tmp_path: Path,
) -> None:
    import pyarrow.parquet as pq

    from splitkeeper.spark.task import SplitReadError

    records = {
        "s0": [_record(0, {"id": 1}, key=b"a"), _record(1, None, key=b"a"), _record(2, {"id": 2}, key=b"b")]
    }
    plan = [(Split("s0"), 0, 3)]
    raw = RecordPolicy(upsert=BY_KEY)  # raw decode, the fast path: the value stays null
    staged = run_region_task(plan, _Records(records), identity, str(tmp_path / "raw"), 1, 0, policy=raw)
    rows = pq.read_table(staged.staged_path or "", columns=["offset", "value", "tombstone"]).to_pylist()
    assert [(r["offset"], r["value"] is None, r["tombstone"]) for r in rows] == [
        (0, False, False),
        (1, True, True),
        (2, False, False),
    ]
    strict = DecodeSpec(kind="json", columns=(Column("id", "BIGINT", nullable=False),))
    typed = RecordPolicy(decode=strict, upsert=BY_KEY)
    staged = run_region_task(plan, _Records(records), identity, str(tmp_path / "typed"), 1, 0, policy=typed)
    rows = pq.read_table(staged.staged_path or "", columns=["offset", "id", "key", "tombstone"]).to_pylist()
    assert rows == [
        {"offset": 0, "id": 1, "key": b"a", "tombstone": False},
        {"offset": 1, "id": None, "key": b"a", "tombstone": True},  # a tombstone: null data, not a bad record
        {"offset": 2, "id": 2, "key": b"b", "tombstone": False},
    ]
    missing = {"s0": [_record(0, {"name": "no id"}, key=b"a")]}
    with pytest.raises(SplitReadError, match="offset 0"):  # a value without its NOT NULL column is still bad
        run_region_task(
            [(Split("s0"), 0, 1)], _Records(missing), identity, str(tmp_path / "bad"), 1, 0, policy=typed
        )


def test_a_commit_after_a_crash_between_moving_and_merging_finds_the_moved_files(tmp_path: Path) -> None:
    p = _Pipeline(tmp_path, BY_ID)
    runs = p.stage(
        1,
        {
            0: {
                "s0": [
                    _record(0, {"id": 1, "name": "a", "op": "c"}),
                    _record(1, {"id": 1, "name": "b", "op": "u"}),
                ]
            }
        },
    )
    from splitkeeper.staging import StagedRegion

    staged = [str(r.output) for r in runs]
    regions = [StagedRegion.at(path) for path in staged]
    # step (a) of a commit that then died: moved, not merged
    p.sink._side_entries(1, regions, p.sink._staged_files(regions))
    assert not os.path.exists(staged[0]) and p.sink.committed_epoch() is None
    receipt = p.sink.commit(1, runs, expected=None, attempt_id="redo")
    assert receipt.records == 2 and not receipt.replayed
    assert _rows(p.path, ("id", "name")) == [(1, "b")] and _change_offsets(p.changes) == [
        ("s0", 0),
        ("s0", 1),
    ]
