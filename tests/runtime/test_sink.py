"""The exactly-once Delta sink: idempotent epoch commits, acked regions only, read-back checks."""

from __future__ import annotations

import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from splitkeeper.core.invariants import ViolationKind
from splitkeeper.errors import InvalidParameterError
from splitkeeper.runtime.delta_log import DIRECT_WRITES_ENV
from splitkeeper.runtime.sink import STAGED_COLUMNS, DeltaSink, SinkCommit, staged_arrow_schema
from splitkeeper.runtime.staging import STAGED_FILE_SCHEMA, StagedWriter

pytestmark = pytest.mark.spark


def _stage(root: str, epoch: int, region: int, records: list[tuple[str, int, int]]) -> str:
    """Write a staged file the way a region task does: .../epoch=N/region=R/attempt=<id>/part.parquet."""
    folder = os.path.join(root, f"epoch={epoch}", f"region={region}", f"attempt={uuid.uuid4().hex}")
    path = os.path.join(folder, "part.parquet")
    with StagedWriter(path, epoch, region) as writer:
        for split_id, offset, next_offset in records:
            writer.add(split_id, [(offset, next_offset, f"{split_id}@{offset}")])
        return writer.commit().path


def _stage_records_only(root: str, epoch: int, region: int, records: list[tuple[str, int, int]]) -> str:
    """A staged file without ``ingested_at`` (an older writer's): the sink must not adopt it as is."""
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
    pq.write_table(pa.table(columns, schema=staged_arrow_schema()), path)
    return path


def _kafka_like(split_id: str, start: int, end: int) -> list[tuple[str, int, int]]:
    return [(split_id, o, o + 1) for o in range(start, end)]


@pytest.fixture
def sink(spark, scratch):
    return DeltaSink(spark, scratch.table("sink"), app_id="orders")


@pytest.fixture
def staging(scratch):
    return str(scratch.path("staging"))


def _rows(sink: DeltaSink) -> list[tuple[str, int, int, int]]:
    return sorted(
        (r.split_id, r.offset, r.epoch, r.region)
        for r in sink.records().select("split_id", "offset", "epoch", "region").collect()
    )


def test_staged_schema_matches_the_sink_table_columns(sink):
    schema = staged_arrow_schema()
    assert tuple(schema.names) == STAGED_COLUMNS
    table_columns = sink.records().schema.fieldNames()
    assert table_columns == [*STAGED_COLUMNS, "ingested_at"]
    assert STAGED_FILE_SCHEMA.names == table_columns  # what region tasks write: adoptable as is


def test_committed_version_of_a_fresh_table_is_none(sink):
    assert sink.committed_version() is None
    assert sink.committed_metadata(1) is None


def test_commit_records_the_epoch_and_its_regions(sink, staging):
    paths = [_stage(staging, 1, 0, _kafka_like("t-0", 0, 5)), _stage(staging, 1, 1, _kafka_like("t-1", 0, 3))]
    commit = sink.commit(1, paths, [0, 1], extra_metadata={"decision": "/staging/epoch=1/decision.json"})
    assert not commit.skipped
    assert (commit.epoch_id, commit.regions, commit.records) == (1, (0, 1), 8)
    assert sink.committed_version() == 1
    recorded = sink.committed_metadata(1)
    assert recorded is not None
    assert recorded.table_version == commit.table_version
    assert recorded.metadata["decision"] == "/staging/epoch=1/decision.json"
    assert recorded.metadata["app_id"] == "orders"
    with pytest.raises(InvalidParameterError, match="extra_metadata"):
        sink.commit(2, [], [0], extra_metadata={"epoch": 99})


def test_committing_the_same_epoch_twice_writes_its_rows_once(sink, staging):
    first = sink.commit(1, [_stage(staging, 1, 0, _kafka_like("t-0", 0, 10))], [0])
    before = _rows(sink)
    # a crash replay: the same planned range read again into a new staged file
    replay = sink.commit(1, [_stage(staging, 1, 0, _kafka_like("t-0", 0, 10))], [0])
    assert replay.skipped
    assert (replay.table_version, replay.regions, replay.commit_id) == (
        first.table_version,
        (0,),
        first.commit_id,
    )
    assert _rows(sink) == before and len(before) == 10
    assert sink.committed_version() == 1
    # an older epoch than the recorded one is skipped as well
    sink.commit(2, [_stage(staging, 2, 0, _kafka_like("t-0", 10, 12))], [0])
    assert sink.commit(1, [], [0]).skipped
    assert len(_rows(sink)) == 12


def test_only_acknowledged_regions_files_are_committed(sink, staging):
    staged = {r: _stage(staging, 3, r, _kafka_like(f"t-{r}", 0, 4)) for r in range(3)}
    with pytest.raises(InvalidParameterError, match=r"acknowledged region \[0, 2\]"):
        sink.commit(3, list(staged.values()), [0, 2])
    assert sink.committed_version() is None  # nothing written by the refused call
    commit = sink.commit(3, [staged[0], staged[2]], [0, 2])
    assert commit.regions == (0, 2)
    assert {region for *_, region in _rows(sink)} == {0, 2}
    assert sink.records_per_split().keys() == {"t-0", "t-2"}


def test_a_staged_file_of_another_epoch_or_outside_the_layout_is_refused(sink, staging):
    other_epoch = _stage(staging, 4, 0, _kafka_like("t-0", 0, 1))
    with pytest.raises(InvalidParameterError, match="a staged file of epoch 5"):
        sink.commit(5, [other_epoch], [0])
    with pytest.raises(InvalidParameterError, match="epoch=<N>/region=<R>"):
        sink.commit(5, ["/tmp/somewhere/part.parquet"], [0])


def test_an_epoch_with_no_output_is_still_recorded(sink):
    commit = sink.commit(1, [], [])
    assert (commit.records, commit.regions, commit.skipped) == (0, (), False)
    assert sink.committed_version() == 1
    assert sink.records().count() == 0


def test_committed_version_reads_log_checkpoints_and_survives_a_cold_log_cache(spark, sink, staging):
    for epoch in range(1, 13):  # Delta writes a log checkpoint at table version 10
        sink.commit(epoch, [_stage(staging, epoch, 0, _kafka_like("t-0", epoch * 10, epoch * 10 + 2))], [0])
    log_dir = os.path.join(sink.path, "_delta_log")
    assert any(name.endswith(".checkpoint.parquet") for name in os.listdir(log_dir))
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # what a restarted driver sees
    assert DeltaSink(spark, sink.path, app_id="orders").committed_version() == 12
    assert DeltaSink(spark, sink.path, app_id="another-pipeline").committed_version() is None
    assert sink.committed_metadata(3).regions == (0,)


def test_records_per_split_counts_and_spans(sink, staging):
    sink.commit(1, [_stage(staging, 1, 0, _kafka_like("a", 5, 9) + _kafka_like("b", 0, 2))], [0])
    per_split = sink.records_per_split()
    assert (per_split["a"].records, per_split["a"].first_offset, per_split["a"].last_next_offset) == (4, 5, 9)
    assert per_split["b"].records == 2


def test_exactly_once_holds_for_contiguous_unique_offsets(sink, staging):
    sink.commit(
        1,
        [_stage(staging, 1, 0, _kafka_like("a", 0, 5)), _stage(staging, 1, 1, _kafka_like("b", 3, 6))],
        [0, 1],
    )
    sink.commit(2, [_stage(staging, 2, 0, _kafka_like("a", 5, 8))], [0])
    assert sink.check_exactly_once({"a": (0, 8), "b": (3, 6)}) == []


def test_exactly_once_reports_duplicates_gaps_and_unexpected_offsets(spark, sink, staging):
    sink.commit(1, [_stage(staging, 1, 0, _kafka_like("a", 0, 5) + _kafka_like("b", 0, 2))], [0])
    # a writer that bypassed the idempotent commit appended offset 3 again and skipped 5..6
    rogue = _stage(staging, 9, 0, [("a", 3, 4), ("a", 7, 8)])
    spark.read.parquet(rogue).write.format("delta").mode("append").save(sink.path)
    violations = sink.check_exactly_once({"a": (0, 8), "b": (0, 3)})
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
    sink.commit(1, [_stage(staging, 1, 0, [("f", 0, 12), ("f", 12, 30)])], [0])
    sink.commit(2, [_stage(staging, 2, 0, [("f", 30, 31), ("g", 0, 7)])], [0])
    assert sink.check_exactly_once({"f": (0, 31), "g": (0, 7)}) == []
    violations = sink.check_exactly_once({"f": (0, 40), "g": (0, 7)})
    assert [(v.kind, v.split_ids) for v in violations] == [(ViolationKind.OFFSET_MISSING, ("f",))]
    assert "31-39" in violations[0].detail


def test_two_runs_committing_the_same_epoch_at_once_write_it_once(spark, sink, staging):
    import threading

    from splitkeeper.errors import ConcurrentRunError

    sinks = [DeltaSink(spark, sink.path, app_id="orders") for _ in range(2)]
    staged = [_stage(staging, 1, 0, _kafka_like("t-0", 0, 6)) for _ in range(2)]
    barrier = threading.Barrier(2)
    outcomes: dict[int, object] = {}

    def commit(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = sinks[i].commit(1, [staged[i]], [0])
        except ConcurrentRunError as err:
            outcomes[i] = err

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    written = [o for o in outcomes.values() if isinstance(o, SinkCommit) and not o.skipped]
    assert len(written) == 1, outcomes
    assert len(_rows(sink)) == 6
    assert sink.committed_version() == 1


def _data_files(spark, sink: DeltaSink) -> list[str]:
    return sorted(os.path.basename(p) for p in spark.read.format("delta").load(sink.path).inputFiles())


def test_a_local_sink_adopts_staged_files_without_rewriting_them(spark, sink, staging):
    paths = [_stage(staging, 3, 0, _kafka_like("t-0", 0, 4)), _stage(staging, 3, 2, _kafka_like("t-2", 7, 9))]
    content = [pq.read_table(p) for p in paths]
    commit = sink.commit(3, paths, [0, 2])
    assert (commit.records, commit.regions) == (6, (0, 2))
    assert not any(os.path.exists(p) for p in paths)  # moved, not copied
    files = _data_files(spark, sink)
    assert len(files) == 2 and all(f.startswith("sk-e0000000003-r0000") or "-r00002-" in f for f in files)
    for table in content:  # byte for byte the task's file: every column, ingested_at included
        name = [f for f in files if f"-r{table.column('region')[0].as_py():05d}-" in f][0]
        assert pq.read_table(os.path.join(sink.path, name)).equals(table)
    assert sink.records().where("ingested_at IS NULL").count() == 0
    assert sink.committed_metadata(3).records == 6
    again = sink.commit(3, paths, [0, 2])  # a replay: the files are gone from staging, nothing is written
    assert again.skipped and _rows(sink) == sorted(
        [("t-0", o, 3, 0) for o in range(4)] + [("t-2", o, 3, 2) for o in (7, 8)]
    )


def test_a_commit_after_a_crash_between_moving_and_committing_finds_the_moved_files(sink, staging):
    from splitkeeper.runtime.sink import adopted_name

    paths = [_stage(staging, 1, 0, _kafka_like("t-0", 0, 3)), _stage(staging, 1, 1, _kafka_like("t-1", 0, 2))]
    os.replace(paths[0], os.path.join(sink.path, adopted_name(paths[0])))  # moved, then the driver died
    commit = sink.commit(1, paths, [0, 1])
    assert commit.records == 5 and not commit.skipped
    assert _rows(sink) == [
        ("t-0", 0, 1, 0),
        ("t-0", 1, 1, 0),
        ("t-0", 2, 1, 0),
        ("t-1", 0, 1, 1),
        ("t-1", 1, 1, 1),
    ]


def test_staged_files_without_ingested_at_or_with_adoption_off_are_rewritten_by_spark(
    spark, sink, staging, monkeypatch
):
    old = _stage_records_only(staging, 1, 0, _kafka_like("t-0", 0, 3))
    assert sink.commit(1, [old], [0]).records == 3
    assert os.path.exists(old)  # read, not moved
    monkeypatch.setenv(DIRECT_WRITES_ENV, "0")
    new = _stage(staging, 2, 0, _kafka_like("t-0", 3, 5))
    assert sink.commit(2, [new], [0]).records == 2
    assert os.path.exists(new)
    assert not any(f.startswith("sk-") for f in _data_files(spark, sink))
    assert sink.records().where("ingested_at IS NULL").count() == 0
    assert [r[1] for r in _rows(sink)] == [0, 1, 2, 3, 4]
