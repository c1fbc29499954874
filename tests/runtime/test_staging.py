"""Staged parquet output and the region task body, run without Spark."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from splitkeeper.core.source import PlannedRange, RegionReader, SourceRecord
from splitkeeper.core.types import Split
from splitkeeper.errors import InvalidParameterError, ProtocolError, SourceError
from splitkeeper.sources.files.source import FileSource
from splitkeeper.spark.task import (
    PART_FILE,
    STAGED_SCHEMA,
    FaultKind,
    InjectedFault,
    RegionFault,
    RegionResult,
    SplitReadError,
    StagedWriter,
    failed_splits,
    read_staged,
    run_region_task,
    write_staged,
)
from splitkeeper.transforms import TransformError, enrich_json, identity, transform


@dataclass(frozen=True)
class CountingReader(RegionReader):
    """Kafka-like offsets: record n has offset n and value 'v<n>'."""

    def read_range(self, split: Split, start: int, end: int) -> Iterator[SourceRecord]:
        return (SourceRecord(n, n + 1, f"v{n}") for n in range(start, end))


@transform
def upper(value: str) -> str:
    return value.upper()


@transform
def explode_on_v3(value: str) -> str:
    if value == "v3":
        raise ValueError("boom")
    return value


@transform
def returns_none(value: str) -> str:
    return None  # type: ignore[return-value]


def all_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


# --------------------------------------------------------------------------- staged files


def test_write_then_read_staged_round_trips_with_the_schema(tmp_path: Path) -> None:
    records = [SourceRecord(0, 4, "héllo".encode()), SourceRecord(4, 9, b""), SourceRecord(9, 10, None)]
    records.append(SourceRecord(10, 12, b"\xff\x00"))  # not UTF-8: kept as it is
    out = write_staged(records, "f.txt", str(tmp_path / "part.parquet"), epoch=7, region=2)
    table = read_staged(out.path)
    assert table.schema.equals(STAGED_SCHEMA)
    assert table.to_pylist() == [
        {
            "split_id": "f.txt",
            "offset": 0,
            "next_offset": 4,
            "value": "héllo".encode(),
            "epoch": 7,
            "region": 2,
        },  # noqa: E501
        {"split_id": "f.txt", "offset": 4, "next_offset": 9, "value": b"", "epoch": 7, "region": 2},
        {"split_id": "f.txt", "offset": 9, "next_offset": 10, "value": None, "epoch": 7, "region": 2},
        {"split_id": "f.txt", "offset": 10, "next_offset": 12, "value": b"\xff\x00", "epoch": 7, "region": 2},
    ]
    assert out.records == 4 and out.bytes == os.path.getsize(out.path) > 0
    assert all_files(tmp_path) == ["part.parquet"]


def test_write_staged_with_one_split_id_per_record(tmp_path: Path) -> None:
    out = write_staged(
        [SourceRecord(0, 1, "a"), SourceRecord(5, 6, "b")],
        ["s1", "s2"],
        str(tmp_path / "p.parquet"),
        epoch=1,
        region=0,
    )
    assert read_staged(out.path).column("split_id").to_pylist() == ["s1", "s2"]


def test_a_failing_writer_leaves_no_file_behind(tmp_path: Path) -> None:
    def broken() -> Iterator[SourceRecord]:
        yield SourceRecord(0, 1, "a")
        raise RuntimeError("reader died")

    with pytest.raises(RuntimeError, match="reader died"):
        write_staged(broken(), "s", str(tmp_path / "part.parquet"), epoch=1, region=0)
    assert all_files(tmp_path) == []


def test_writer_flushes_many_row_groups(tmp_path: Path) -> None:
    n = 300_000
    with StagedWriter(str(tmp_path / "p.parquet"), epoch=3, region=1) as writer:
        assert writer.add("a", CountingReader().read_range(Split("a"), 0, n // 2)) == n // 2
        assert writer.add("b", CountingReader().read_range(Split("b"), 0, n // 2)) == n // 2
        out = writer.commit()
    table = read_staged(out.path)
    assert table.num_rows == n == out.records
    assert table.column("split_id").to_pylist()[n // 2 - 1 : n // 2 + 1] == ["a", "b"]
    assert table.column("offset").to_pylist()[n // 2] == 0


def test_staged_files_carry_the_writer_settings_of_every_staged_file(tmp_path: Path) -> None:
    """Positions delta-encoded, per-file columns dictionary-encoded, no statistics on the raw bytes
    (the sink's Delta statistics leave them out), the positions' statistics kept (they are)."""
    import pyarrow.parquet as pq

    n = 200_000
    with StagedWriter(str(tmp_path / "p.parquet"), epoch=3, region=1) as writer:
        writer.add("a", CountingReader().read_range(Split("a"), 0, n))
        out = writer.commit()
    meta = pq.ParquetFile(out.path).metadata
    names = meta.schema.to_arrow_schema().names
    group = meta.row_group(0)

    def column(name: str) -> pq.ColumnChunkMetaData:
        return group.column(names.index(name))

    for name in ("offset", "next_offset"):
        assert "DELTA_BINARY_PACKED" in column(name).encodings, column(name).encodings
        assert column(name).statistics is not None and column(name).statistics.has_min_max
    for name in ("split_id", "epoch", "region", "ingested_at"):
        assert "RLE_DICTIONARY" in column(name).encodings or "PLAIN_DICTIONARY" in column(name).encodings
    assert column("value").statistics is None
    assert read_staged(out.path).column("offset").to_pylist() == list(range(n))
    assert read_staged(out.path).column("next_offset").to_pylist() == list(range(1, n + 1))


def test_a_committed_writer_cannot_commit_again(tmp_path: Path) -> None:
    writer = StagedWriter(str(tmp_path / "p.parquet"), epoch=1, region=0)
    writer.commit()
    with pytest.raises(ProtocolError, match="already committed"):
        writer.commit()


# --------------------------------------------------------------------------- the region task


def test_region_task_reads_the_plan_and_stages_every_record(tmp_path: Path) -> None:
    data_dir = tmp_path / "in"
    data_dir.mkdir()
    (data_dir / "a.txt").write_text("".join(f"line {i}\n" for i in range(100)))
    (data_dir / "b.txt").write_text("x\ny\nz")
    source = FileSource(data_dir)
    a, b = source.discover_splits()
    a_end = source.plan_end(a, 0, 30)
    plan = [PlannedRange(a, 0, a_end), (b, 0, b.end or 0)]

    result = run_region_task(plan, source.reader(), identity, str(tmp_path / "staging"), epoch=4, region=1)

    assert result.ack and result.error is None
    assert result.positions == {"a.txt": a_end, "b.txt": b.end}
    a_records = len(list(source.reader().read_range(a, 0, a_end)))
    assert 25 <= a_records <= 35  # plan_end estimates lines from the mean line length
    assert result.records_by_split == {"a.txt": a_records, "b.txt": 3}
    assert result.records == a_records + 3
    assert result.staged_path == str(
        tmp_path / "staging" / "epoch=4" / "region=1" / f"attempt={result.attempt}" / PART_FILE
    )
    rows = read_staged(result.staged_path).to_pylist()
    expected = [("a.txt", r) for r in source.reader().read_range(a, 0, a_end)]
    expected += [("b.txt", r) for r in source.reader().read_range(b, 0, b.end or 0)]
    assert [
        (r["split_id"], SourceRecord(r["offset"], r["next_offset"], r["value"])) for r in rows
    ] == expected
    assert {(r["epoch"], r["region"]) for r in rows} == {(4, 1)}
    assert result.staged_bytes == os.path.getsize(result.staged_path)


def test_replaying_a_plan_stages_identical_rows_in_a_new_attempt(tmp_path: Path) -> None:
    plan = [(Split("t-0", position=10), 10, 50), (Split("t-1"), 0, 5)]
    first = run_region_task(plan, CountingReader(), upper, str(tmp_path), epoch=2, region=0)
    again = run_region_task(plan, CountingReader(), upper, str(tmp_path), epoch=2, region=0)
    assert first.attempt != again.attempt and first.staged_path != again.staged_path
    assert read_staged(first.staged_path or "").equals(read_staged(again.staged_path or ""))
    assert read_staged(first.staged_path or "").column("value").to_pylist()[:2] == [b"V10", b"V11"]


def test_transform_is_applied_to_each_value(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "o.jsonl").write_text('{"user": "u1", "amount": 5}\n{"user": "u2", "amount": 250.5}\n')
    source = FileSource(tmp_path / "in", format="jsonl")
    (split,) = source.discover_splits()
    result = run_region_task(
        [(split, 0, split.end or 0)], source.reader(), enrich_json, str(tmp_path / "s"), 1, 0
    )
    values = [json.loads(v) for v in read_staged(result.staged_path or "").column("value").to_pylist()]
    assert [v["amount_band"] for v in values] == ["small", "large"]
    assert all(0 <= v["user_bucket"] < 16 for v in values)


def test_transform_failure_names_split_and_offset_and_publishes_nothing(tmp_path: Path) -> None:
    plan = [(Split("p-3"), 0, 10)]
    with pytest.raises(
        SplitReadError, match=r"explode_on_v3 failed on split 'p-3' at offset 3: ValueError: boom"
    ) as err:
        run_region_task(plan, CountingReader(), explode_on_v3, str(tmp_path), epoch=1, region=0)
    assert isinstance(err.value.__cause__, TransformError)
    assert failed_splits(str(err.value)) == ("p-3",)  # what the driver reads from the task's error text
    assert all_files(tmp_path) == []


def test_failed_splits_finds_awkward_ids_in_spark_error_text() -> None:
    ids = ["orders-3", 'dir/with "quotes"/f.jsonl', "tab\tand\\slash"]
    text = "\n".join(
        f"Traceback ...\nsplitkeeper.spark.task.SplitReadError: {SplitReadError(i, 7, ValueError('x'))}"
        for i in ids
    )
    text += "\n" + text  # Spark repeats the cause; each split once
    assert failed_splits("pyspark.errors.PythonException: " + text) == tuple(ids)
    assert failed_splits("[INJECTED_FAULT] injected fault: region 2 fails") == ()


def test_transform_must_return_a_string(tmp_path: Path) -> None:
    with pytest.raises(SplitReadError, match="TransformError: .*returned NoneType for split 'p' at offset 0"):
        run_region_task(
            [(Split("p"), 0, 2)], CountingReader(), returns_none, str(tmp_path), epoch=1, region=0
        )


def test_injected_failure_raises_after_reading_and_publishes_nothing(tmp_path: Path) -> None:
    plan = [(Split("p"), 0, 10)]
    with pytest.raises(InjectedFault, match=r"injected fault: region 2 fails at epoch 9 .* 10 records read"):
        run_region_task(
            plan,
            CountingReader(),
            identity,
            str(tmp_path),
            epoch=9,
            region=2,
            fault=RegionFault(FaultKind.FAIL),
        )
    assert all_files(tmp_path) == []


def test_injected_stall_sleeps_before_reading(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_region_task(
        [(Split("p"), 0, 3)],
        CountingReader(),
        identity,
        str(tmp_path),
        epoch=1,
        region=0,
        fault=RegionFault(FaultKind.STALL, 0.3),
    )
    assert time.monotonic() - started >= 0.3
    assert result.ack and result.records == 3


def test_missing_file_raises_a_source_error_and_publishes_nothing(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "f.txt").write_text("a\n")
    source = FileSource(tmp_path / "in")
    (split,) = source.discover_splits()
    (tmp_path / "in" / "f.txt").unlink()
    with pytest.raises(
        SplitReadError, match=r"SourceError: \[SOURCE_ERROR\] .*does not exist any more"
    ) as err:
        run_region_task([(split, 0, 2)], source.reader(), identity, str(tmp_path / "s"), epoch=1, region=0)
    assert isinstance(err.value.__cause__, SourceError)
    assert all_files(tmp_path / "s") == []


def test_backlog_finished_lists_splits_whose_position_reached_the_boundary(tmp_path: Path) -> None:
    plan = [
        (Split("reached", backlog_end=20), 0, 20),
        (Split("short", backlog_end=50), 0, 20),
        (Split("untracked"), 0, 20),
        (Split("past", position=60, backlog_end=50), 60, 61),
    ]
    result = run_region_task(plan, CountingReader(), identity, str(tmp_path), epoch=1, region=0)
    assert result.backlog_finished == ("reached", "past")


def test_range_planned_mid_line_moves_the_position_to_the_next_line_start(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "f.txt").write_text("aaaa\nbbbb\ncccc\n")
    source = FileSource(tmp_path / "in")
    (split,) = source.discover_splits()
    result = run_region_task(
        [(split, 0, 7)], source.reader(), identity, str(tmp_path / "s"), epoch=1, region=0
    )
    assert result.positions == {"f.txt": 10}
    assert read_staged(result.staged_path or "").column("value").to_pylist() == [b"aaaa", b"bbbb"]


def test_empty_plan_still_stages_an_empty_file(tmp_path: Path) -> None:
    result = run_region_task(
        [(Split("p", position=5), 5, 5)], CountingReader(), identity, str(tmp_path), 3, 1
    )
    assert result.ack and result.records == 0 and result.positions == {"p": 5}
    table = read_staged(result.staged_path or "")
    assert table.num_rows == 0 and table.schema.equals(STAGED_SCHEMA)


def test_a_split_planned_twice_is_a_protocol_error(tmp_path: Path) -> None:
    with pytest.raises(ProtocolError, match="split 'p' is planned twice"):
        run_region_task(
            [(Split("p"), 0, 1), (Split("p"), 1, 2)], CountingReader(), identity, str(tmp_path), 1, 0
        )


def test_region_result_pickles_and_declined_results_carry_the_error() -> None:
    declined = RegionResult.declined(3, epoch=8, error="timed out after 60s")
    assert not declined.ack and declined.error == "timed out after 60s" and declined.positions == {}
    assert pickle.loads(pickle.dumps(declined)) == declined


def test_region_fault_parses_and_validates() -> None:
    assert RegionFault.parse("fail") == RegionFault(FaultKind.FAIL)
    assert RegionFault.parse("stall:2.5") == RegionFault(FaultKind.STALL, 2.5)
    with pytest.raises(InvalidParameterError, match="'fail', 'flaky' or 'stall:<seconds>'"):
        RegionFault.parse("explode")
    with pytest.raises(InvalidParameterError, match="> 0 for a stall"):
        RegionFault(FaultKind.STALL, 0)


def test_staging_and_sources_do_not_import_pyspark() -> None:
    code = (
        "import sys, splitkeeper.spark.task, splitkeeper.sources, splitkeeper.config.settings; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'delta', 'airflow')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_staged_schema_matches_the_sink_columns() -> None:
    assert [(f.name, f.type) for f in STAGED_SCHEMA] == [
        ("split_id", pa.string()),
        ("offset", pa.int64()),
        ("next_offset", pa.int64()),
        ("value", pa.binary()),
        ("epoch", pa.int64()),
        ("region", pa.int32()),
    ]
