"""The sink's schema from the decode spec (issue 21): bytes kept exactly, an older STRING sink refused
under the raw decode (and kept writing under ``text``), partitioned sinks, ``add_columns``, and the
region task's record flow with bad records. Real Delta tables (delta-rs), real parquet; no Spark.
"""

from __future__ import annotations

import datetime
import json
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from splitkeeper.core.ports import RegionRun
from splitkeeper.core.types import RegionOutcome
from splitkeeper.delta.schemas import SCHEMAS, STAGED_FILE_SCHEMA, sink_schema
from splitkeeper.errors import StagedOutputError, StateError
from splitkeeper.records.spec import Column, DecodeSpec
from splitkeeper.sinks.delta.read import read_sink
from splitkeeper.sinks.delta.sink import DeltaSink
from splitkeeper.sources.files.source import FileSource
from splitkeeper.spark.dead_letters import DEAD_FILE
from splitkeeper.spark.task import RecordPolicy, SplitReadError, StagedWriter, run_region_task
from splitkeeper.transforms import identity, transform

RAW_LINES = [b"plain", "h\u00e9llo".encode(), b"\xff\xfe not utf-8", b"", b"\x00\x01\x02", b"{}"]


def _ack(region: int, path: str | None) -> RegionRun:
    return RegionRun(region_id=region, outcome=RegionOutcome.ACK, output=path)


def _folder(staging: str, epoch: int, region: int = 0) -> str:
    return os.path.join(staging, f"epoch={epoch}", f"region={region}", f"attempt={uuid.uuid4().hex}")


def _file_source(tmp_path: Path, lines: list[bytes]) -> FileSource:
    (tmp_path / "in").mkdir(exist_ok=True)
    (tmp_path / "in" / "f.txt").write_bytes(b"\n".join(lines) + b"\n")
    return FileSource(tmp_path / "in")


def _run(tmp_path: Path, source: FileSource, policy: RecordPolicy, epoch: int = 1, transform=identity):  # type: ignore[no-untyped-def]
    split = source.discover_splits()[0]
    return run_region_task(
        [(split, 0, split.end or 0)],
        source.reader(),
        transform,
        str(tmp_path / "staging"),
        epoch,
        0,
        policy=policy,
    )


# --------------------------------------------------------------------------- the one schema


def test_sink_schema_is_the_raw_sink_by_default_and_follows_the_decode_spec() -> None:
    assert sink_schema() == sink_schema(DecodeSpec()) == STAGED_FILE_SCHEMA
    assert STAGED_FILE_SCHEMA.field("value").type == pa.binary()
    assert sink_schema(DecodeSpec(kind="text")).field("value").type == pa.string()
    typed = DecodeSpec(kind="json", columns=(Column("id", "BIGINT"), Column("amount", "DECIMAL(10,2)")))
    schema = sink_schema(typed, ["ingested_date"])
    assert schema.names == [
        "split_id", "offset", "next_offset", "id", "amount", "_rescued", "epoch", "region", "ingested_at",
        "key", "topic", "partition", "timestamp", "headers", "ingested_date",
    ]  # fmt: skip
    assert schema.field("amount").type == pa.decimal128(10, 2)
    assert schema.field("ingested_date").type == pa.date32()
    assert "ingested_date" not in sink_schema(typed).names


# --------------------------------------------------------------------------- bytes, region task


def test_raw_records_reach_the_sink_byte_exact(tmp_path: Path) -> None:
    """The files reader keeps each line's bytes (invalid UTF-8 too); the raw sink stores them as they are."""
    source = _file_source(tmp_path, RAW_LINES)
    result = run_region_task(
        [(s, 0, s.end or 0) for s in source.discover_splits()], source.reader(), identity,
        str(tmp_path / "staging"), 1, 0,
    )  # fmt: skip
    sink = DeltaSink(tmp_path / "sink", "p", staging_path=str(tmp_path / "staging"))
    sink.commit(1, [_ack(0, result.staged_path)], expected=None, attempt_id="a")
    rows = read_sink(tmp_path / "sink").sort_by("offset")
    assert rows.schema.field("value").type == pa.binary()
    assert rows.column("value").to_pylist() == RAW_LINES


def test_text_decode_bad_utf8_fails_the_region_naming_split_offset_and_stage(tmp_path: Path) -> None:
    source = _file_source(tmp_path, RAW_LINES)
    with pytest.raises(SplitReadError) as err:
        _run(tmp_path, source, RecordPolicy(decode=DecodeSpec(kind="text")))
    bad_offset = len(RAW_LINES[0]) + 1 + len(RAW_LINES[1]) + 1
    assert f'split "f.txt" at offset {bad_offset}:' in str(err.value)
    assert "decode failed: UnicodeDecodeError: not valid UTF-8" in str(err.value)
    assert not list((tmp_path / "staging").rglob("*.parquet"))  # nothing published


def test_text_decode_with_tolerance_all_stages_dead_letters_and_counts_them(tmp_path: Path) -> None:
    source = _file_source(tmp_path, RAW_LINES)
    policy = RecordPolicy(decode=DecodeSpec(kind="text"), tolerance="all", max_bad_ratio=0.5)
    result = _run(tmp_path, source, policy)
    assert result.dead_letters == 1 and result.dead_letters_by_split == {"f.txt": 1}
    assert result.records == len(RAW_LINES) - 1 and result.records_by_split == {"f.txt": 5}
    assert result.dead_letter_path == os.path.join(os.path.dirname(result.staged_path or ""), DEAD_FILE)
    dead = pq.read_table(result.dead_letter_path).to_pylist()
    assert [(d["value"], d["stage"], d["error_class"]) for d in dead] == [
        (RAW_LINES[2], "decode", "UnicodeDecodeError")
    ]
    staged = pq.read_table(result.staged_path or "")
    assert staged.schema.field("value").type == pa.string()
    assert staged.column("value").to_pylist() == [v.decode() for v in RAW_LINES if v != RAW_LINES[2]]
    offsets = sorted(staged.column("offset").to_pylist() + [d["offset"] for d in dead])
    nexts = sorted(staged.column("next_offset").to_pylist() + [d["next_offset"] for d in dead])
    assert offsets[1:] == nexts[:-1]  # sink and dead letters together: contiguous, disjoint
    assert result.positions == {"f.txt": nexts[-1]}


@transform
def _refuses_empty(value: str) -> str:
    """A text transform that raises on an empty value (a record-level failure)."""
    if not value:
        raise ValueError("empty value")
    return value.upper()


def test_a_record_its_transform_fails_on_is_a_dead_letter_under_tolerance_all(tmp_path: Path) -> None:
    source = _file_source(tmp_path, RAW_LINES)
    policy = RecordPolicy(decode=DecodeSpec(kind="text"), tolerance="all", max_bad_ratio=0.5)
    result = _run(tmp_path, source, policy, transform=_refuses_empty)
    dead = pq.read_table(result.dead_letter_path or "").to_pylist()
    assert [(d["value"], d["stage"]) for d in dead] == [(RAW_LINES[2], "decode"), (b"", "transform")]
    assert "empty value" in dead[1]["error_message"]
    staged = pq.read_table(result.staged_path or "")
    assert staged.column("value").to_pylist() == [
        v.decode().upper() for v in RAW_LINES if v not in (RAW_LINES[2], b"")
    ]
    offsets = sorted(staged.column("offset").to_pylist() + [d["offset"] for d in dead])
    nexts = sorted(staged.column("next_offset").to_pylist() + [d["next_offset"] for d in dead])
    assert offsets[1:] == nexts[:-1] and len(offsets) == len(RAW_LINES)  # contiguous, disjoint
    with pytest.raises(SplitReadError, match="empty value"):  # tolerance none: the region fails
        _run(tmp_path, source, RecordPolicy(decode=DecodeSpec(kind="text")), transform=_refuses_empty)


def test_more_bad_records_than_max_bad_ratio_fail_the_region(tmp_path: Path) -> None:
    source = _file_source(tmp_path, RAW_LINES)
    policy = RecordPolicy(decode=DecodeSpec(kind="text"), tolerance="all", max_bad_ratio=0.1)
    with pytest.raises(SplitReadError, match=r"1 of the 6 records .* more than errors.max_bad_ratio 0.1"):
        _run(tmp_path, source, policy)
    assert not list((tmp_path / "staging").rglob("*.parquet"))


# --------------------------------------------------------------------------- an older STRING sink


def _old_string_sink(path: str) -> None:
    """A sink as the previous splitkeeper wrote it: ``value STRING``, one epoch committed."""
    old = pa.schema([f.with_type(pa.string()) if f.name == "value" else f for f in SCHEMAS["sink_records"]])
    row = {"split_id": "t-0", "offset": 0, "next_offset": 1, "value": "old", "epoch": 1, "region": 0}
    row["ingested_at"] = datetime.datetime.now(datetime.UTC)
    write_deltalake(
        path,
        pa.Table.from_pylist([row], old),
        commit_properties=CommitProperties(app_transactions=[Transaction("orders", 1)]),
    )


def test_an_old_string_sink_is_refused_under_raw_and_kept_writing_under_text(tmp_path: Path) -> None:
    path = str(tmp_path / "sink")
    _old_string_sink(path)
    with pytest.raises(StateError) as err:
        DeltaSink(path, "orders", schema=sink_schema(DecodeSpec()))
    text = str(err.value)
    assert "has the data columns [value STRING]" in text and "makes [value BINARY]" in text
    assert "set decode.kind: text" in text and "point sink.path at a new table" in text
    assert len(DeltaTable(path).history()) == 1  # nothing written

    text_schema = sink_schema(DecodeSpec(kind="text"))
    sink = DeltaSink(path, "orders", staging_path=str(tmp_path / "staging"), schema=text_schema)
    staged = os.path.join(_folder(str(tmp_path / "staging"), 2), "part.parquet")
    with StagedWriter(staged, 2, 0, text_schema) as writer:
        writer.add_table(
            "t-0", pa.array([1], pa.int64()), pa.array([2], pa.int64()),
            pa.table({"value": pa.array(["new"])}), None, 2,
        )  # fmt: skip
        staged = writer.commit().path
    sink.commit(2, [_ack(0, staged)], expected=1, attempt_id="b")
    assert sorted(read_sink(path).column("value").to_pylist()) == ["new", "old"]


# --------------------------------------------------------------------------- partitions


def test_a_sink_partitioned_by_ingested_date_adds_one_file_per_partition(tmp_path: Path) -> None:
    staging = str(tmp_path / "staging")
    schema = sink_schema(DecodeSpec(), ["ingested_date"])
    sink = DeltaSink(
        tmp_path / "sink", "p", staging_path=staging, schema=schema, partition_by=["ingested_date"]
    )
    folder = _folder(staging, 1)
    with StagedWriter(
        os.path.join(folder, "part.parquet"), 1, 0, schema, partition_by=["ingested_date"]
    ) as w:
        w.add_table(
            "s", pa.array([0, 1], pa.int64()), pa.array([1, 2], pa.int64()),
            pa.table({"value": pa.array([b"a", None], pa.binary())}), None, 2,
        )  # fmt: skip
        out = w.commit()
    assert out.path.endswith("parts.json") and out.records == 2
    today = datetime.datetime.now(datetime.UTC).date()
    (part,) = json.loads(Path(out.path).read_text())
    assert part.startswith(f"ingested_date={today.isoformat()}/")
    assert "ingested_date" not in pq.read_schema(os.path.join(folder, part)).names
    sink.commit(1, [_ack(0, out.path)], expected=None, attempt_id="a")

    table = DeltaTable(str(tmp_path / "sink"))
    assert table.metadata().partition_columns == ["ingested_date"]
    (add,) = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert add["partition.ingested_date"] == today and add["path"].startswith(f"ingested_date={today}/")
    rows = read_sink(tmp_path / "sink").sort_by("offset").to_pylist()
    assert [(r["value"], r["ingested_date"]) for r in rows] == [(b"a", today), (None, today)]
    with pytest.raises(StateError, match=r"partitioned by \['ingested_date'\], but .* is \[\]"):
        DeltaSink(tmp_path / "sink", "p", schema=schema)


# --------------------------------------------------------------------------- add_columns


def _typed(on_new_fields: str) -> DecodeSpec:
    return DecodeSpec(kind="json", columns=(Column("id", "BIGINT"),), on_new_fields=on_new_fields)


def _staged_with(staging: str, epoch: int, schema: pa.Schema, extra: dict[str, pa.Array]) -> str:
    path = os.path.join(_folder(staging, epoch), "part.parquet")
    with StagedWriter(path, epoch, 0, schema, widen=True) as writer:
        data = pa.table({"id": pa.array([epoch * 10], pa.int64()), **extra})
        writer.add_table("s", pa.array([epoch], pa.int64()), pa.array([epoch + 1], pa.int64()), data, None, 0)
        return writer.commit().path


def test_a_widened_file_keeps_dictionary_pages_for_its_data_columns(tmp_path: Path) -> None:
    """The files a writer keeps rows for (widened, partitioned) had Arrow's default dictionary
    pages on their data columns; the staged files' settings keep them there, beside the settings
    every staged file has (positions delta-encoded, no statistics on raw bytes)."""
    schema = sink_schema(_typed("add_columns"))
    staged = _staged_with(str(tmp_path / "staging"), 1, schema, {"colour": pa.array(["red"])})
    meta = pq.ParquetFile(staged).metadata
    group = meta.row_group(0)
    encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(meta.num_columns)}
    assert "RLE_DICTIONARY" in encodings["id"] and "RLE_DICTIONARY" in encodings["colour"]
    assert "DELTA_BINARY_PACKED" in encodings["offset"] and "RLE_DICTIONARY" not in encodings["offset"]


def test_add_columns_widens_the_table_with_the_epoch_commit(tmp_path: Path) -> None:
    staging = str(tmp_path / "staging")
    spec = _typed("add_columns")
    schema = sink_schema(spec)
    sink = DeltaSink(tmp_path / "sink", "p", staging_path=staging, schema=schema, widen=True)
    sink.commit(1, [_ack(0, _staged_with(staging, 1, schema, {}))], expected=None, attempt_id="a")
    staged = _staged_with(staging, 2, schema, {"colour": pa.array(["red"])})
    assert pq.read_schema(staged).names[-1] == "colour"  # the new column, after the declared ones
    sink.commit(2, [_ack(0, staged)], expected=1, attempt_id="b")

    rows = read_sink(tmp_path / "sink").sort_by("offset").to_pylist()
    assert [(r["id"], r["colour"]) for r in rows] == [(10, None), (20, "red")]
    assert DeltaTable(str(tmp_path / "sink")).transaction_version("p") == 2
    # the table now has the column; a new run of the same config opens it
    again = DeltaSink(tmp_path / "sink", "p", staging_path=staging, schema=schema, widen=True)
    assert again.schema.names[-1] == "colour"
    # a type change of an existing column is refused, nothing committed
    bad = _staged_with(staging, 3, schema, {"colour": pa.array([7], pa.int64())})
    with pytest.raises(
        StagedOutputError, match="column colour of type int64, but the sink's colour is string"
    ):
        again.commit(3, [_ack(0, bad)], expected=2, attempt_id="c")
    assert DeltaTable(str(tmp_path / "sink")).transaction_version("p") == 2


def test_two_regions_that_disagree_on_a_new_column_are_named_both(tmp_path: Path) -> None:
    """Issue 36: a type clash between two regions' new columns said "the sink's newcol is string"
    when the sink had no newcol; a case clash between them was a delta-rs traceback."""
    staging = str(tmp_path / "staging")
    schema = sink_schema(_typed("add_columns"))
    sink = DeltaSink(tmp_path / "sink", "p", staging_path=staging, schema=schema, widen=True)

    def staged(region: int, extra: dict[str, pa.Array]) -> str:
        path = os.path.join(_folder(staging, 1, region), "part.parquet")
        with StagedWriter(path, 1, region, schema, widen=True) as writer:
            data = pa.table({"id": pa.array([region], pa.int64()), **extra})
            writer.add_table(
                f"s{region}", pa.array([0], pa.int64()), pa.array([1], pa.int64()), data, None, 1
            )
            return writer.commit().path

    first = staged(0, {"newcol": pa.array(["a"])})
    with pytest.raises(StagedOutputError) as typed:
        sink.commit(
            1,
            [_ack(0, first), _ack(1, staged(1, {"newcol": pa.array([7], pa.int64())}))],
            expected=None,
            attempt_id="a",
        )
    assert "the sink's newcol" not in str(typed.value)
    assert f"but staged file {first} of the same epoch (another region's records) has it as string" in str(
        typed.value
    )
    with pytest.raises(StagedOutputError) as cased:
        sink.commit(
            1,
            [_ack(0, first), _ack(1, staged(1, {"NewCol": pa.array(["b"])}))],
            expected=None,
            attempt_id="b",
        )
    assert "has the new column NewCol, which differs only in case from the column newcol" in str(cased.value)
    assert "Nothing was committed" in str(cased.value)
    assert DeltaTable(str(tmp_path / "sink")).transaction_version("p") is None


def test_without_add_columns_a_staged_file_with_new_columns_is_refused(tmp_path: Path) -> None:
    staging = str(tmp_path / "staging")
    schema = sink_schema(_typed("rescue"))
    sink = DeltaSink(tmp_path / "sink", "p", staging_path=staging, schema=schema)
    staged = _staged_with(staging, 1, schema, {"colour": pa.array(["red"])})
    with pytest.raises(StagedOutputError, match="has columns"):
        sink.commit(1, [_ack(0, staged)], expected=None, attempt_id="a")


def test_a_partitioned_commit_redone_after_some_files_moved_still_adds_every_file(tmp_path: Path) -> None:
    """Partitioned by a column with several values (``topic``): one staged file per value and the
    manifest naming them; a commit that died after moving one file is redone from the manifest."""
    from splitkeeper.staging import adopted_name

    staging = str(tmp_path / "staging")
    schema = sink_schema(DecodeSpec(kind="text"))
    sink = DeltaSink(tmp_path / "sink", "p", staging_path=staging, schema=schema, partition_by=["topic"])
    folder = _folder(staging, 1)
    topics = pa.array(["a", "b", "a", None])
    meta = [pa.nulls(4, pa.binary()), topics, pa.nulls(4, pa.int32())]
    meta += [pa.nulls(4, STAGED_FILE_SCHEMA.field(c).type) for c in ("timestamp", "headers")]
    with StagedWriter(os.path.join(folder, "part.parquet"), 1, 0, schema, partition_by=["topic"]) as w:
        w.add_table(
            "s", pa.array(range(4), pa.int64()), pa.array(range(1, 5), pa.int64()),
            pa.table({"value": pa.array(["v0", "v1", "v2", "v3"])}), meta, 4,
        )  # fmt: skip
        out = w.commit()
    parts = json.loads(Path(out.path).read_text())
    assert sorted(p.split("/")[0] for p in parts) == [
        "topic=__HIVE_DEFAULT_PARTITION__",
        "topic=a",
        "topic=b",
    ]
    first = os.path.join(folder, parts[0])  # the crash: moved into the table, not committed
    target = tmp_path / "sink" / adopted_name(first)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(first, target)

    receipt = sink.commit(1, [_ack(0, out.path)], expected=None, attempt_id="a")
    assert receipt.records == 4
    rows = read_sink(tmp_path / "sink").sort_by("offset").to_pylist()
    assert [(r["offset"], r["value"], r["topic"]) for r in rows] == [
        (0, "v0", "a"), (1, "v1", "b"), (2, "v2", "a"), (3, "v3", None),
    ]  # fmt: skip


def test_a_pipeline_passes_its_decode_to_the_sink_an_old_string_sink_refused_under_raw(
    tmp_path: Path,
) -> None:
    """Pipeline assembly (no Spark needed to open the sink): the config's decode and partition_by
    reach DeltaSink; an older sink's ``value STRING`` is refused under the raw default, kept under text."""
    from splitkeeper.app.pipeline import Pipeline, record_policy
    from splitkeeper.config.settings import config_from_mapping

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "f.txt").write_bytes(b"a\n")
    mapping = {
        "name": "orders",
        "source": {"kind": "files", "path": str(tmp_path / "in")},
        "state": {"path": str(tmp_path / "state")},
        "sink": {"path": str(tmp_path / "sink")},
    }
    _old_string_sink(str(tmp_path / "sink"))
    with pytest.raises(StateError, match=r"\[value STRING\].*makes \[value BINARY\].*decode.kind: text"):
        Pipeline(config_from_mapping(mapping), None)
    config = config_from_mapping({**mapping, "decode": {"kind": "text"}})
    policy = record_policy(config)
    assert policy == RecordPolicy(decode=DecodeSpec(kind="text"))
    pipeline = Pipeline(config, None)
    assert pipeline.sink.schema == sink_schema(DecodeSpec(kind="text"))


def test_a_map_column_commits_and_a_new_run_opens_the_table_it_made(tmp_path: Path) -> None:
    """A MAP column (decode.kind avro has them): Arrow names a map's entries ``entries`` and the
    staged file may name its value field after the column; Delta's log names them ``key_value`` /
    ``key`` / ``value``. The same type either way: the commit and the next run's check of the
    existing table must take it (a MAP column was refused as a changed type)."""
    staging = str(tmp_path / "staging")
    spec = DecodeSpec(kind="avro", columns=(Column("id", "BIGINT"), Column("tags", "MAP<STRING, BIGINT>")))
    schema = sink_schema(spec)
    named = pa.map_(pa.field("key", pa.string(), nullable=False), pa.field("tags", pa.int64()))

    def staged(epoch: int, tags: list[list[tuple[str, int]]]) -> str:
        path = os.path.join(_folder(staging, epoch), "part.parquet")
        with StagedWriter(path, epoch, 0, schema) as writer:
            data = pa.table(
                {"id": pa.array([epoch * 10 + i for i in range(len(tags))], pa.int64()),
                 "tags": pa.array(tags, named)}
            )  # fmt: skip
            writer.add_table(
                "s", pa.array(range(len(tags)), pa.int64()), pa.array(range(1, len(tags) + 1), pa.int64()),
                data, None, 0,
            )  # fmt: skip
            return writer.commit().path

    sink = DeltaSink(tmp_path / "sink", "p", staging_path=staging, schema=schema)
    sink.commit(1, [_ack(0, staged(1, [[("a", 1), ("b", 2)], []]))], expected=None, attempt_id="a")
    again = DeltaSink(tmp_path / "sink", "p", staging_path=staging, schema=schema)  # the existing table
    again.commit(2, [_ack(0, staged(2, [[("c", 3)]]))], expected=1, attempt_id="b")
    rows = read_sink(tmp_path / "sink", ["id", "tags"]).sort_by("id").to_pylist()
    assert [(r["id"], sorted(r["tags"])) for r in rows] == [
        (10, [("a", 1), ("b", 2)]), (11, []), (20, [("c", 3)])
    ]  # fmt: skip
