"""The exactly-once Delta sink on delta-rs: fenced epoch commits of staged files, replays, and the one
reader of its rows (``read_sink``) with the core's exactly-once rule on them. No Spark.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from splitkeeper.core.invariants import ViolationKind, check_sink_ranges
from splitkeeper.core.ports import RegionRun, SinkCrashPoint, SinkReceipt
from splitkeeper.core.source import RecordMeta, SourceRecord
from splitkeeper.core.types import RegionOutcome
from splitkeeper.delta.schemas import META_COLUMNS, STAGED_COLUMNS, STAGED_FILE_SCHEMA, STAGED_SCHEMA
from splitkeeper.errors import ConcurrentRunError, InvalidParameterError, StateError
from splitkeeper.sinks.delta.read import read_sink
from splitkeeper.sinks.delta.sink import DeltaSink
from splitkeeper.sinks.delta.stats import file_statistics
from splitkeeper.spark.task import StagedWriter
from splitkeeper.staging import adopted_name


def _stage(root: str, epoch: int, region: int, records: list[tuple[str, int, int]]) -> str:
    """Write a staged file the way a region task does: .../epoch=N/region=R/attempt=<id>/part.parquet."""
    folder = os.path.join(root, f"epoch={epoch}", f"region={region}", f"attempt={uuid.uuid4().hex}")
    path = os.path.join(folder, "part.parquet")
    with StagedWriter(path, epoch, region) as writer:
        for split_id, offset, next_offset in records:
            writer.add(split_id, [(offset, next_offset, f"{split_id}@{offset}")])
        return writer.commit().path


def _stage_records_only(root: str, epoch: int, region: int, records: list[tuple[str, int, int]]) -> str:
    """A staged file without ``ingested_at`` (an older writer's): the sink rewrites it, never adopts it."""
    folder = os.path.join(root, f"epoch={epoch}", f"region={region}", f"attempt={uuid.uuid4().hex}")
    os.makedirs(folder)
    columns = {
        "split_id": [r[0] for r in records],
        "offset": [r[1] for r in records],
        "next_offset": [r[2] for r in records],
        "value": [f"{r[0]}@{r[1]}" for r in records],
        "epoch": [epoch] * len(records),
        "region": [region] * len(records),
    }
    path = os.path.join(folder, "part.parquet")
    pq.write_table(pa.table(columns, schema=STAGED_SCHEMA), path)
    return path


def _kafka_like(split_id: str, start: int, end: int) -> list[tuple[str, int, int]]:
    return [(split_id, o, o + 1) for o in range(start, end)]


def _ack(region: int, path: str | None) -> RegionRun:
    return RegionRun(region_id=region, outcome=RegionOutcome.ACK, output=path)


@pytest.fixture
def staging(tmp_path) -> str:
    return str(tmp_path / "staging")


@pytest.fixture
def sink(tmp_path, staging) -> DeltaSink:
    return DeltaSink(tmp_path / "sink", "orders", staging_path=staging)


def _rows(sink: DeltaSink) -> list[tuple[str, int, int, int]]:
    table = DeltaTable(sink.path).to_pyarrow_table(columns=["split_id", "offset", "epoch", "region"])
    return sorted((r["split_id"], r["offset"], r["epoch"], r["region"]) for r in table.to_pylist())


def _data_files(sink: DeltaSink) -> list[str]:
    return sorted(os.path.basename(p) for p in DeltaTable(sink.path).file_uris())


def test_the_sink_table_has_the_staged_files_columns(sink):
    schema = pa.schema(DeltaTable(sink.path).schema().to_arrow())
    assert schema.names == [*STAGED_COLUMNS, "ingested_at", *META_COLUMNS] == STAGED_FILE_SCHEMA.names
    assert [(f.name, f.type) for f in schema] == [(f.name, f.type) for f in STAGED_FILE_SCHEMA]


def test_committed_epoch_of_a_fresh_table_is_none(sink):
    assert sink.committed_epoch() is None
    assert sink.committed_metadata(1) is None and sink.committed_attempt(1) is None


def test_commit_records_the_epoch_its_regions_and_its_attempt(sink, staging):
    paths = [_stage(staging, 1, 0, _kafka_like("t-0", 0, 5)), _stage(staging, 1, 1, _kafka_like("t-1", 0, 3))]
    receipt = sink.commit(1, [_ack(0, paths[0]), _ack(1, paths[1])], expected=None, attempt_id="decision-1")
    assert (receipt.epoch, receipt.records, receipt.replayed) == (1, 8, False)
    assert sink.committed_epoch() == 1 and sink.committed_attempt(1) == "decision-1"
    recorded = sink.committed_metadata(1)
    assert recorded is not None
    assert recorded.table_version == receipt.version == 1
    assert (recorded.regions, recorded.records) == ((0, 1), 8)
    assert {k: recorded.metadata[k] for k in ("app_id", "epoch", "regions", "attempt_id", "records")} == {
        "app_id": "orders",
        "epoch": 1,
        "regions": [0, 1],
        "attempt_id": "decision-1",
        "records": 8,
    }
    with pytest.raises(InvalidParameterError, match="attempt_id"):
        sink.commit(2, [], expected=1, attempt_id="")


def test_a_replay_of_the_same_attempt_writes_its_rows_once_and_another_attempt_is_refused(sink, staging):
    first = sink.commit(
        1, [_ack(0, _stage(staging, 1, 0, _kafka_like("t-0", 0, 10)))], expected=None, attempt_id="a"
    )
    before = _rows(sink)
    # a crash replay: the same planned range read again into a new staged file
    again = _stage(staging, 1, 0, _kafka_like("t-0", 0, 10))
    replay = sink.commit(1, [_ack(0, again)], expected=None, attempt_id="a")
    assert replay.replayed and (replay.records, replay.version) == (10, first.version)
    assert os.path.exists(again)  # nothing was moved
    with pytest.raises(ConcurrentRunError) as err:
        sink.commit(1, [_ack(0, again)], expected=None, attempt_id="another-run")
    assert err.value.params["found"] == 1 and err.value.params["expected"] is None
    assert _rows(sink) == before and len(before) == 10
    sink.commit(2, [_ack(0, _stage(staging, 2, 0, _kafka_like("t-0", 10, 12)))], expected=1, attempt_id="b")
    with pytest.raises(ConcurrentRunError, match="it records epoch 2 but this run expected 1"):
        sink.commit(3, [], expected=1, attempt_id="c")  # a run that restored epoch 1: another committed 2
    assert len(_rows(sink)) == 12 and sink.committed_epoch() == 2


def test_only_acknowledged_regions_own_files_are_committed(sink, staging):
    staged = {r: _stage(staging, 3, r, _kafka_like(f"t-{r}", 0, 4)) for r in range(3)}
    declined = RegionRun(region_id=1, outcome=RegionOutcome.DECLINE, output=staged[1])
    with pytest.raises(InvalidParameterError, match="acknowledged regions' outputs only"):
        sink.commit(3, [_ack(0, staged[0]), declined], expected=None, attempt_id="a")
    with pytest.raises(InvalidParameterError, match="a staged file of region 2"):
        sink.commit(3, [_ack(2, staged[1])], expected=None, attempt_id="a")
    assert sink.committed_epoch() is None and all(os.path.exists(p) for p in staged.values())
    receipt = sink.commit(3, [_ack(0, staged[0]), _ack(2, staged[2])], expected=None, attempt_id="a")
    assert receipt.records == 8 and sink.committed_metadata(3).regions == (0, 2)
    assert {region for *_, region in _rows(sink)} == {0, 2}
    assert os.path.exists(staged[1])  # the declined region's file stays in staging


def test_a_staged_file_of_another_epoch_or_outside_the_layout_is_refused(sink, staging):
    other_epoch = _stage(staging, 4, 0, _kafka_like("t-0", 0, 1))
    with pytest.raises(InvalidParameterError, match="a staged file of epoch 5"):
        sink.commit(5, [_ack(0, other_epoch)], expected=None, attempt_id="a")
    with pytest.raises(InvalidParameterError, match="epoch=<N>/region=<R>"):
        sink.commit(5, [_ack(0, "/tmp/somewhere/part.parquet")], expected=None, attempt_id="a")


def test_an_epoch_with_no_output_is_still_recorded(sink):
    receipt = sink.commit(1, [_ack(0, None)], expected=None, attempt_id="a")
    assert (receipt.records, receipt.replayed) == (0, False)
    assert sink.committed_epoch() == 1 and sink.committed_metadata(1).regions == (0,)
    assert DeltaTable(sink.path).to_pyarrow_table().num_rows == 0


def test_committed_epoch_reads_log_checkpoints_and_a_fresh_sink_object(sink, staging):
    for epoch in range(1, 13):  # a log checkpoint at table version 10
        path = _stage(staging, epoch, 0, _kafka_like("t-0", epoch * 10, epoch * 10 + 2))
        sink.commit(epoch, [_ack(0, path)], expected=epoch - 1 or None, attempt_id=f"a{epoch}")
    log_dir = os.path.join(sink.path, "_delta_log")
    assert any(name.endswith(".checkpoint.parquet") for name in os.listdir(log_dir))
    assert DeltaSink(sink.path, "orders", read_only=True).committed_epoch() == 12  # a restarted driver
    assert DeltaSink(sink.path, "another-pipeline", read_only=True).committed_epoch() is None
    assert sink.committed_metadata(3).regions == (0,) and sink.committed_attempt(3) == "a3"


def test_two_runs_committing_the_same_epoch_at_once_write_it_once(sink, staging):
    barrier = threading.Barrier(2, timeout=60)

    def pause(point: SinkCrashPoint, epoch: int) -> None:
        if point is SinkCrashPoint.AFTER_FILES_MOVED:
            barrier.wait()  # both past the fence's check, their files moved: both commit now

    sinks = [DeltaSink(sink.path, "orders", crash_point=pause) for _ in range(2)]
    staged = [_stage(staging, 1, 0, _kafka_like("t-0", 0, 6)) for _ in range(2)]
    outcomes: dict[int, object] = {}

    def commit(i: int) -> None:
        try:
            outcomes[i] = sinks[i].commit(1, [_ack(0, staged[i])], expected=None, attempt_id=f"run-{i}")
        except BaseException as err:  # noqa: BLE001 - every outcome is asserted below
            outcomes[i] = err

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not barrier.broken and len(outcomes) == 2, outcomes
    written = [o for o in outcomes.values() if isinstance(o, SinkReceipt) and not o.replayed]
    losers = [o for o in outcomes.values() if not isinstance(o, SinkReceipt)]
    assert len(written) == 1 and len(losers) == 1, outcomes
    assert type(losers[0]) is ConcurrentRunError and losers[0].code == "CONCURRENT_RUN", repr(losers[0])
    assert losers[0].params["found"] == 1 and losers[0].params["expected"] is None
    assert len(_rows(sink)) == 6 and sink.committed_epoch() == 1


def test_a_local_sink_adopts_staged_files_as_they_are_with_footer_statistics(sink, staging):
    paths = [_stage(staging, 3, 0, _kafka_like("t-0", 0, 4)), _stage(staging, 3, 2, _kafka_like("t-2", 7, 9))]
    content = [pq.read_table(p) for p in paths]
    receipt = sink.commit(3, [_ack(0, paths[0]), _ack(2, paths[1])], expected=None, attempt_id="a")
    assert receipt.records == 6
    assert not any(os.path.exists(p) for p in paths)  # moved, not copied
    files = _data_files(sink)
    assert files == sorted(adopted_name(p) for p in paths)
    for table in content:  # byte for byte the task's file: every column, ingested_at included
        name = [f for f in files if f"-r{table.column('region')[0].as_py():05d}-" in f][0]
        assert pq.read_table(os.path.join(sink.path, name)).equals(table)
    assert DeltaTable(sink.path).to_pyarrow_table().column("ingested_at").null_count == 0
    actions = DeltaTable(sink.path).get_add_actions(flatten=True)
    stats = {row["path"]: row for row in pa.table(actions).to_pylist()}
    region2 = stats[adopted_name(paths[1])]
    assert region2["num_records"] == 2
    assert (region2["min.offset"], region2["max.offset"], region2["null_count.offset"]) == (7, 8, 0)
    assert (region2["min.split_id"], region2["max.split_id"]) == ("t-2", "t-2")
    assert region2["min.region"] == region2["max.region"] == 2
    assert "min.value" not in region2  # only the columns that carry statistics
    again = sink.commit(3, [_ack(0, paths[0]), _ack(2, paths[1])], expected=None, attempt_id="a")
    assert again.replayed and len(_rows(sink)) == 6  # a replay: the files are gone from staging


def test_a_moved_file_is_as_old_as_its_move_so_maintains_untracked_window_counts_from_there(sink, staging):
    path = _stage(staging, 1, 0, _kafka_like("t-0", 0, 3))
    os.utime(path, (1_000_000_000, 1_000_000_000))  # staged long ago (a paused run)
    sink.commit(1, [_ack(0, path)], expected=None, attempt_id="a")
    moved = os.path.join(sink.path, adopted_name(path))
    assert os.path.getmtime(moved) > 1_000_000_000 + 3600
    assert sink.remove_untracked(1, 0) == []  # tracked: never listed, whatever its age


def test_timestamp_statistics_are_rounded_outwards_to_milliseconds(tmp_path):
    moment = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    data = pa.table(
        {"at": pa.array([moment, moment.replace(microsecond=1000)], pa.timestamp("us", tz="UTC"))}
    )
    pq.write_table(data, tmp_path / "t.parquet")
    stats = file_statistics(pq.read_metadata(tmp_path / "t.parquet"), ["at", "missing"])
    assert stats == {
        "numRecords": 2,
        "minValues": {"at": "2026-01-02T03:04:05.001Z"},
        "maxValues": {"at": "2026-01-02T03:04:05.679Z"},  # .678901 rounded up: still an upper bound
        "nullCount": {"at": 0},
    }
    long = pa.table({"s": ["a" * 40, "b"]})
    pq.write_table(long, tmp_path / "s.parquet")
    string_stats = file_statistics(pq.read_metadata(tmp_path / "s.parquet"), ["s"])
    assert string_stats["minValues"] == {"s": "a" * 32} and string_stats["maxValues"] == {"s": "b"}
    json.dumps(stats)


def test_a_commit_after_a_crash_between_moving_and_committing_finds_the_moved_files(sink, staging):
    paths = [_stage(staging, 1, 0, _kafka_like("t-0", 0, 3)), _stage(staging, 1, 1, _kafka_like("t-1", 0, 2))]
    os.replace(paths[0], os.path.join(sink.path, adopted_name(paths[0])))  # moved, then the driver died
    receipt = sink.commit(1, [_ack(0, paths[0]), _ack(1, paths[1])], expected=None, attempt_id="a")
    assert receipt.records == 5 and not receipt.replayed
    assert _rows(sink) == [
        ("t-0", 0, 1, 0),
        ("t-0", 1, 1, 0),
        ("t-0", 2, 1, 0),
        ("t-1", 0, 1, 1),
        ("t-1", 1, 1, 1),
    ]


def test_staged_files_of_an_older_writer_without_ingested_at_are_rewritten(sink, staging):
    old = _stage_records_only(staging, 1, 0, _kafka_like("t-0", 0, 3))
    assert sink.commit(1, [_ack(0, old)], expected=None, attempt_id="a").records == 3
    assert os.path.exists(old)  # read, not moved
    table = DeltaTable(sink.path).to_pyarrow_table()
    assert table.column("ingested_at").null_count == 0 and table.schema.names == STAGED_FILE_SCHEMA.names
    assert [r[1] for r in _rows(sink)] == [0, 1, 2]


def test_kafka_metadata_lands_in_the_key_topic_partition_timestamp_and_headers_columns(sink, staging):
    folder = os.path.join(staging, "epoch=1", "region=0", f"attempt={uuid.uuid4().hex}")
    with StagedWriter(os.path.join(folder, "part.parquet"), 1, 0) as writer:
        writer.add(
            "orders-3",
            [
                SourceRecord(7, 8, "a", RecordMeta(b"k\x00", "orders", 3, 1_700_000_000_123, (("h", b"v"),))),
                SourceRecord(8, 9, "b", RecordMeta(None, "orders", 3, None, (("h", None), ("h", b"2")))),
            ],
        )
        path = writer.commit().path
    sink.commit(1, [_ack(0, path)], expected=None, attempt_id="a")

    rows = sorted(DeltaTable(sink.path).to_pyarrow_table().to_pylist(), key=lambda r: r["offset"])
    assert [(r["key"], r["topic"], r["partition"]) for r in rows] == [
        (b"k\x00", "orders", 3),
        (None, "orders", 3),
    ]
    assert rows[0]["timestamp"] == datetime.fromtimestamp(1_700_000_000.123, UTC)
    assert rows[1]["timestamp"] is None
    assert rows[0]["headers"] == [{"key": "h", "value": b"v"}]
    assert rows[1]["headers"] == [{"key": "h", "value": None}, {"key": "h", "value": b"2"}]


def test_an_older_sink_table_gains_the_metadata_columns_and_keeps_its_rows(tmp_path, staging):
    """Schema migration: a sink written before the metadata columns existed (its 7 columns, one
    epoch committed) gains them when a run opens it; its rows read NULL there, new rows fill them."""
    from deltalake import write_deltalake
    from deltalake.transaction import CommitProperties, Transaction

    old_schema = pa.schema(list(STAGED_FILE_SCHEMA)[: len(STAGED_COLUMNS) + 1])
    old_rows = pa.table(
        {
            "split_id": ["t-0"],
            "offset": [0],
            "next_offset": [1],
            "value": [b"old"],
            "epoch": [1],
            "region": [0],
            "ingested_at": [datetime.now(UTC)],
        },
        schema=old_schema,
    )
    path = str(tmp_path / "old-sink")
    write_deltalake(
        path, old_rows, commit_properties=CommitProperties(app_transactions=[Transaction("orders", 1)])
    )
    assert DeltaSink(path, "orders", read_only=True).committed_epoch() == 1  # read-only: not migrated
    assert pa.schema(DeltaTable(path).schema().to_arrow()).names == old_schema.names

    sink = DeltaSink(path, "orders", staging_path=staging)
    folder = os.path.join(staging, "epoch=2", "region=0", f"attempt={uuid.uuid4().hex}")
    with StagedWriter(os.path.join(folder, "part.parquet"), 2, 0) as writer:
        writer.add("t-0", [SourceRecord(1, 2, b"new", RecordMeta(b"k", "t", 0, 5, ()))])
        staged = writer.commit().path
    sink.commit(2, [_ack(0, staged)], expected=1, attempt_id="b")

    table = DeltaTable(path).to_pyarrow_table()
    assert table.schema.names == STAGED_FILE_SCHEMA.names
    rows = {r["value"]: r for r in table.to_pylist()}
    assert [rows[b"old"][c] for c in META_COLUMNS] == [None] * len(META_COLUMNS)
    assert (rows[b"new"]["key"], rows[b"new"]["topic"], rows[b"new"]["partition"]) == (b"k", "t", 0)
    assert rows[b"new"]["headers"] == []


# --------------------------------------------------------------------------- bad input


def test_a_missing_staging_folder_at_commit_names_the_path_and_what_to_do_and_moves_nothing(sink, staging):
    good = _stage(staging, 1, 0, _kafka_like("t-0", 0, 3))
    gone = _stage(staging, 1, 1, _kafka_like("t-1", 0, 3))
    shutil.rmtree(os.path.dirname(os.path.dirname(gone)))  # region=1 removed under the driver
    with pytest.raises(StateError) as err:
        sink.commit(1, [_ack(0, good), _ack(1, gone)], expected=None, attempt_id="a")
    text = str(err.value)
    assert f"staged file {gone} of epoch 1 is gone, and was not moved into the table" in text
    assert "Nothing was committed: recover the pipeline (splitkeeper recover --checkpoint latest)" in text
    assert err.value.params["path"] == gone
    assert sink.committed_epoch() is None and os.path.exists(good)  # the good file was not moved
    assert _data_files(sink) == []


def test_a_corrupt_staged_file_at_commit_names_the_path_and_commits_nothing(sink, staging):
    good = _stage(staging, 1, 0, _kafka_like("t-0", 0, 3))
    bad = _stage(staging, 1, 1, _kafka_like("t-1", 0, 3))
    data = Path(bad).read_bytes()
    Path(bad).write_bytes(data[: len(data) // 2])  # truncated: no footer
    with pytest.raises(StateError) as err:
        sink.commit(1, [_ack(0, good), _ack(1, bad)], expected=None, attempt_id="a")
    assert f"staged file {bad} of epoch 1 is not a complete parquet file" in str(err.value)
    assert "recover the pipeline" in str(err.value)
    assert sink.committed_epoch() is None and os.path.exists(good) and _data_files(sink) == []


def test_a_truncated_sink_log_names_the_log_file(sink, staging):
    sink.commit(1, [_ack(0, _stage(staging, 1, 0, _kafka_like("t-0", 0, 3)))], expected=None, attempt_id="a")
    log_file = os.path.join(sink.path, "_delta_log", f"{1:020d}.json")
    Path(log_file).write_bytes(Path(log_file).read_bytes()[:-30])
    with pytest.raises(
        StateError, match=rf"cannot be read: log file {log_file} is not a complete Delta log entry"
    ):
        DeltaSink(sink.path, "orders", read_only=True).committed_epoch()


def test_discard_removes_one_epoch_and_discard_through_every_older_one(sink, staging):
    for epoch in (1, 2, 3, 4):
        _stage(staging, epoch, 0, _kafka_like("t-0", 0, 1))
    sink.discard(2)
    assert sorted(os.listdir(staging)) == ["epoch=1", "epoch=3", "epoch=4"]
    sink.discard_through(3)
    assert os.listdir(staging) == ["epoch=4"]
    sink.discard(9)  # idempotent, nothing there
    DeltaSink(sink.path, "orders", staging_path=staging, read_only=True).discard_through(9)
    assert os.listdir(staging) == ["epoch=4"]  # a read-only sink removes nothing


# --------------------------------------------------------------------------- reading back (read_sink)


def _exactly_once(path: str, expected: dict[str, tuple[int, int]]):
    """Protocol section 6 on the sink's rows as :func:`read_sink` returns them, sorted."""
    rows = read_sink(path, ["split_id", "offset", "next_offset"]).sort_by(
        [("split_id", "ascending"), ("offset", "ascending")]
    )
    runs = zip(*(rows.column(c).to_pylist() for c in rows.column_names), strict=True)
    return check_sink_ranges(
        runs, {k: v[0] for k, v in expected.items()}, {k: v[1] for k, v in expected.items()}
    )


def test_read_sink_returns_the_columns_asked_for_and_an_empty_table_when_there_is_none(
    tmp_path, sink, staging
):
    absent = read_sink(tmp_path / "nothing", ["split_id", "offset"])
    assert absent.num_rows == 0 and absent.schema == pa.schema(
        [STAGED_FILE_SCHEMA.field(c) for c in ("split_id", "offset")]
    )
    sink.commit(1, [_ack(0, _stage(staging, 1, 0, _kafka_like("a", 0, 3)))], expected=None, attempt_id="a")
    whole = read_sink(sink.path)
    assert whole.schema.names == STAGED_FILE_SCHEMA.names and whole.num_rows == 3
    assert sorted(read_sink(sink.path, ["offset"]).column("offset").to_pylist()) == [0, 1, 2]
    with pytest.raises(InvalidParameterError, match="columns of the sink table"):
        read_sink(sink.path, ["offset", "nope"])


def test_exactly_once_holds_for_contiguous_unique_offsets(sink, staging):
    sink.commit(
        1,
        [
            _ack(0, _stage(staging, 1, 0, _kafka_like("a", 0, 5))),
            _ack(1, _stage(staging, 1, 1, _kafka_like("b", 3, 6))),
        ],
        expected=None,
        attempt_id="a",
    )
    sink.commit(2, [_ack(0, _stage(staging, 2, 0, _kafka_like("a", 5, 8)))], expected=1, attempt_id="b")
    assert _exactly_once(sink.path, {"a": (0, 8), "b": (3, 6)}) == []


def test_exactly_once_reports_duplicates_gaps_and_unexpected_offsets(sink, staging):
    sink.commit(
        1, [_ack(0, _stage(staging, 1, 0, _kafka_like("a", 0, 5) + _kafka_like("b", 0, 2)))], expected=None,
        attempt_id="a",
    )  # fmt: skip
    # a writer that bypassed the fenced commit appended offset 3 again and skipped 5..6
    rogue = _stage(staging, 9, 0, [("a", 3, 4), ("a", 7, 8)])
    write_deltalake(sink.path, pq.read_table(rogue), mode="append")
    violations = _exactly_once(sink.path, {"a": (0, 8), "b": (0, 3)})
    kinds = {(v.kind, v.split_ids) for v in violations}
    assert (ViolationKind.OFFSET_DUPLICATE, ("a",)) in kinds
    assert (ViolationKind.OFFSET_MISSING, ("a",)) in kinds  # 5, 6
    assert (ViolationKind.OFFSET_MISSING, ("b",)) in kinds  # 2
    missing_a = next(
        v for v in violations if v.kind is ViolationKind.OFFSET_MISSING and v.split_ids == ("a",)
    )
    assert "5-6" in missing_a.detail


def test_exactly_once_checks_records_spanning_byte_ranges(sink, staging):
    # byte offsets of lines in a file: next_offset is the next line's start, not offset + 1
    sink.commit(
        1, [_ack(0, _stage(staging, 1, 0, [("f", 0, 12), ("f", 12, 30)]))], expected=None, attempt_id="a"
    )
    sink.commit(2, [_ack(0, _stage(staging, 2, 0, [("f", 30, 31), ("g", 0, 7)]))], expected=1, attempt_id="b")
    assert _exactly_once(sink.path, {"f": (0, 31), "g": (0, 7)}) == []
    violations = _exactly_once(sink.path, {"f": (0, 40), "g": (0, 7)})
    assert [(v.kind, v.split_ids) for v in violations] == [(ViolationKind.OFFSET_MISSING, ("f",))]
    assert "31-39" in violations[0].detail
