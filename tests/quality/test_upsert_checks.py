"""An upsert sink's restart checks on real Delta tables (written with delta-rs), on the shared Spark
session: the keyed table equals the fold of the change table (the ``upsert_fold`` Great Expectations
suite, on Spark) and fails naming the key when a key is missing, extra, stale or should have been
deleted; the change table, the dead letters and a Spark transform's filtered ranges account for every
offset exactly once (an overlap or a gap fails naming the split); the report shows the verdict.

The expected keyed table is folded here in plain Python (rule 5 of records/upsert.py), not with the
code under test."""

from __future__ import annotations

import re
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.delta.schemas import DEAD_LETTER_SCHEMA, FILTERED_SCHEMA, sink_schema
from splitkeeper.errors import InvariantViolation
from splitkeeper.quality.checks import FOLD_SUITE, SUITES, SuiteStatus, raise_on_failure
from splitkeeper.quality.upsert import read_fold_result
from splitkeeper.records.upsert import UpsertSpec
from splitkeeper.sinks.delta.read import DeltaSinkReader
from tests.quality.test_expectations import PIPELINE, failing, healthy, run_checks, write

pytestmark = pytest.mark.spark

UPSERT = UpsertSpec.of(["id"], "op = 'd'")
DATA = pa.schema([pa.field("id", pa.int64()), pa.field("op", pa.string()), pa.field("v", pa.string())])
CHANGES_SCHEMA = sink_schema(data=DATA, tombstone=True)
KEYED_SCHEMA = sink_schema(data=DATA)

#: Offsets a Spark transform dropped: (split, start, end exclusive, epoch), not in the change table.
FILTERED = [("orders-0", 2, 4, 1), ("orders-2", 6, 9, 2)]
#: Records that failed: in the dead-letter table, not in the change table.
DEAD = [("orders-1", 3, 1)]
DELETE = ("orders-0", 7)  # op = 'd': key 0's latest record
TOMBSTONE_AT = ("orders-3", 4)  # a Kafka tombstone: no key (id is a data column), changes nothing
NULL_KEY_AT = ("orders-9", 1)  # id NULL: a key like any other


def _change(sid: str, o: int, e: int, r: int, now: datetime) -> dict:
    tomb = (sid, o) == TOMBSTONE_AT
    return {
        "split_id": sid,
        "offset": o,
        "next_offset": o + 1,
        "id": None if tomb or (sid, o) == NULL_KEY_AT else o % 7,
        "op": None if tomb else ("d" if (sid, o) == DELETE else "u"),
        "v": None if tomb else f"v{sid}:{o}",
        "epoch": e,
        "region": r,
        "ingested_at": now,
        "tombstone": tomb,
    }


def change_rows() -> list[dict]:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    dropped = {(sid, o) for sid, a, b, _e in FILTERED for o in range(a, b)} | {(s, o) for s, o, _e in DEAD}
    return [_change(sid, o, e, r, now) for sid, o, _n, e, r in healthy().sink if (sid, o) not in dropped]


def python_fold(rows: list[dict]) -> dict[int | None, dict]:
    """Rule 5 by hand: keyless tombstones out; per key the greatest (epoch, offset, split_id); deletes out."""
    winners: dict[int | None, dict] = {}
    for row in rows:
        if row["tombstone"]:
            continue
        best = winners.get(row["id"])
        if best is None or (row["epoch"], row["offset"], row["split_id"]) > (
            best["epoch"],
            best["offset"],
            best["split_id"],
        ):
            winners[row["id"]] = row
    return {k: row for k, row in winners.items() if row["op"] != "d"}


def _keyed(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{n: r.get(n) for n in KEYED_SCHEMA.names} for r in rows], KEYED_SCHEMA)


@pytest.fixture(scope="module")
def upsert_state(spark, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("upsert")
    write(spark, root, healthy())  # the state (the append sink it writes is not used here)
    rows = change_rows()
    write_deltalake(str(root / "changes"), pa.Table.from_pylist(rows, CHANGES_SCHEMA))
    write_deltalake(str(root / "keyed"), _keyed(list(python_fold(rows).values())))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    dead = [
        {
            "split_id": sid,
            "offset": o,
            "next_offset": o + 1,
            "value": b"\xff",
            "stage": "decode",
            "error_class": "UnicodeDecodeError",
            "error_message": "not valid UTF-8",
            "epoch": e,
            "region": 0,
            "attempt_id": "a",
            "failed_at": now,
        }
        for sid, o, e in DEAD
    ]
    write_deltalake(str(root / "dead"), pa.Table.from_pylist(dead, DEAD_LETTER_SCHEMA))
    write_deltalake(str(root / "filtered"), _filtered(FILTERED))
    return root


def _filtered(ranges: list[tuple[str, int, int, int]]) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "split_id": sid,
                "start_offset": a,
                "end_offset": b,
                "records": b - a,
                "epoch": e,
                "region": 0,
                "function": "tests.transforms:only_updates",
            }
            for sid, a, b, e in ranges
        ],
        FILTERED_SCHEMA,
    )


def _copy(root: Path, tmp_path: Path) -> Path:
    shutil.copytree(root, tmp_path / "copy")
    return tmp_path / "copy"


def check(spark, base: Path, docs: Path, **overrides):
    store = DeltaStateStore(base / "state", PIPELINE, "kafka:orders")
    options = {
        "dead_letter_path": str(base / "dead"),
        "filtered_path": str(base / "filtered"),
        "upsert": UPSERT,
        "changes_path": str(base / "changes"),
    }
    options.update(overrides)
    return run_checks(spark, store, str(base / "keyed"), docs, **options)


@pytest.fixture(scope="module")
def passing(spark, upsert_state, tmp_path_factory):
    """The restart checks on the healthy upsert state, once: (report, its Data Docs folder)."""
    docs = tmp_path_factory.mktemp("reports") / PIPELINE / "data_docs"
    return check(spark, upsert_state, docs), docs


def test_a_keyed_table_equal_to_the_fold_passes_every_suite_with_filtered_ranges(
    spark, upsert_state, passing
):
    fold = python_fold(change_rows())
    assert 0 not in fold and None in fold and 4 in fold  # the scenario: a delete, a null key, a tombstone
    report, docs = passing

    assert report.success, report.summary()
    assert [s.key for s in report.suites] == [*SUITES, FOLD_SUITE]
    suite = report.suite(FOLD_SUITE)
    assert suite.status is SuiteStatus.PASSED and suite.rows == len(fold)
    assert [e.expectation for e in suite.expectations] == ["expect_column_values_to_be_null"] * 4
    result = read_fold_result(docs)
    assert result is not None and result.success and result.status == "passed"
    assert (result.keys_in_fold, result.keyed_rows, result.change_rows) == (len(fold), len(fold), 27)
    assert result.deletes == 2  # the op = 'd' record and the tombstone
    assert report.notes[-1].startswith("upsert_fold: the keyed table (") and "are equal" in report.notes[-1]
    assert report.notes[0].startswith("upsert sink: the records accounted are the change table's")
    rows = {r["split_id"]: r for r in _frame(spark, upsert_state)}
    assert (rows["orders-0"]["records"], rows["orders-0"]["filtered_ranges"]) == (8, 1)
    assert (rows["orders-1"]["records"], rows["orders-1"]["dead_letters"]) == (5, 1)


def _frame(spark, base: Path) -> list[dict]:
    from splitkeeper.quality.checks import build_restart_frames, resolve_strategy
    from tests.quality.test_expectations import SOURCE_SPLITS, SUB

    frames = build_restart_frames(
        spark,
        DeltaStateStore(base / "state", PIPELINE, "kafka:orders"),
        DeltaSinkReader(
            str(base / "changes"),
            PIPELINE,
            dead_letter_path=str(base / "dead"),
            filtered_path=str(base / "filtered"),
        ),
        2,
        strategy=resolve_strategy("round-robin"),
        subscriptions={SUB},
        max_consecutive_failures=2,
        source_splits=SOURCE_SPLITS,
    )
    return frames.frames["sink_records"].to_pylist()


def _rows_of(key: int | None) -> list[dict]:
    return [r for r in change_rows() if r["id"] == key and not r["tombstone"]]


def test_a_keyed_table_that_is_not_the_fold_fails_naming_each_key(spark, upsert_state, tmp_path):
    """Four faults at once, each on its own key: a missing key, an extra key, a stale value (an older
    offset's row) and a row its latest record deleted."""
    base = _copy(upsert_state, tmp_path)
    keyed = DeltaTable(str(base / "keyed"))
    keyed.delete("id = 3")  # missing
    keyed.delete("id = 1")
    older = min(_rows_of(1), key=lambda r: (r["epoch"], r["offset"]))  # stale: not the latest offset
    alive = [r for r in _rows_of(0) if r["op"] != "d"]  # key 0's latest record deletes it
    revived = max(alive, key=lambda r: (r["epoch"], r["offset"]))
    extra = {**_rows_of(2)[0], "id": 99}
    write_deltalake(str(base / "keyed"), _keyed([older, revived, extra]), mode="append")

    report = check(spark, base, tmp_path / "docs")

    assert not report.success
    assert {k: v for k, v in failing(report).items()} == {
        (FOLD_SUITE, "expect_column_values_to_be_null(missing_key)"): ("orders-3",),
        (FOLD_SUITE, "expect_column_values_to_be_null(extra_key)"): tuple(
            sorted({revived["split_id"], extra["split_id"]})
        ),
        (FOLD_SUITE, "expect_column_values_to_be_null(stale_row)"): ("orders-0",),
    }, report.summary()
    keys = {e.target: e.keys for e in report.suite(FOLD_SUITE).failed}
    assert keys == {
        "missing_key": ('{"id":3}',),
        "extra_key": ('{"id":0}', '{"id":99}'),
        "stale_row": ('{"id":1}',),
    }
    result = read_fold_result(tmp_path / "docs")
    assert result is not None and not result.success and result.status == "failed"
    assert (result.missing_key, result.extra_key, result.stale_row, result.duplicate_key) == (1, 2, 1, 0)
    assert result.first_keys == ('{"id":0}', '{"id":1}', '{"id":3}', '{"id":99}')
    stale = next(r for r in result.first if r["verdict"] == "stale_row")
    assert stale["detail"] == (
        "columns differ from the fold: offset, next_offset, v, epoch (keyed row: split orders-0 offset 1, "
        "epoch 1; the latest record: split orders-0 offset 8, epoch 2)"
    )
    with pytest.raises(InvariantViolation, match=r"fold_mismatch: .*keys \{\"id\":3\}") as err:
        raise_on_failure(report)
    assert "orders-3" in err.value.params["split_ids"]  # the offending record's split


def test_a_duplicate_key_in_the_keyed_table_fails(spark, upsert_state, tmp_path):
    base = _copy(upsert_state, tmp_path)
    twice = python_fold(change_rows())[5]
    write_deltalake(str(base / "keyed"), _keyed([twice]), mode="append")
    from splitkeeper.quality.upsert import scan_fold

    keyed = DeltaSinkReader(str(base / "keyed"), PIPELINE, upsert=UPSERT, changes_path=str(base / "changes"))
    result, frame = scan_fold(spark, keyed, UPSERT)
    assert frame is not None
    frame.unpersist()
    assert (result.duplicate_key, result.first_keys) == (2, ('{"id":5}',))
    assert result.first[0]["detail"] == "the key is 2 times in the keyed table"


def test_broken_accounting_of_changes_dead_letters_and_filtered_fails_naming_split_and_offsets(
    spark, upsert_state, tmp_path
):
    base = _copy(upsert_state, tmp_path)
    write_deltalake(str(base / "filtered"), _filtered([("orders-3", 1, 2, 1)]), mode="append")  # overlap
    DeltaTable(str(base / "filtered")).delete("split_id = 'orders-2'")  # a gap: [6, 9) of orders-2

    report = check(spark, base, tmp_path / "docs")

    assert failing(report) == {
        ("sink_records", "expect_column_values_to_be_null(filtered_overlap)"): ("orders-3",),
        ("sink_records", "expect_column_values_to_be_null(offset_missing)"): ("orders-2",),
    }, report.summary()
    with pytest.raises(InvariantViolation) as err:
        raise_on_failure(report)
    assert re.search(r"split orders-3: offsets both in a filtered range .*: 1\b", str(err.value))
    assert re.search(r"split orders-2: 3 offset\(s\) missing between records .*: 6-8", str(err.value))


def test_without_the_filtered_ranges_their_offsets_are_missing(spark, upsert_state, tmp_path):
    report = check(spark, upsert_state, tmp_path / "docs", filtered_path=None)
    assert failing(report) == {
        ("sink_records", "expect_column_values_to_be_null(offset_missing)"): ("orders-0", "orders-2")
    }


def test_the_report_shows_keys_upserts_deletes_the_fold_verdict_and_the_filtered_offsets(
    upsert_state, passing
):
    from splitkeeper.report.html import render_report

    _report, docs = passing
    page = render_report(
        DeltaStateStore(upsert_state / "state", PIPELINE, "kafka:orders"),
        docs.parent,
        sink=DeltaSinkReader(
            str(upsert_state / "keyed"),
            PIPELINE,
            dead_letter_path=str(upsert_state / "dead"),
            upsert=UPSERT,
            changes_path=str(upsert_state / "changes"),
            filtered_path=str(upsert_state / "filtered"),
        ),
        title="upsert report",
        data_docs_index=docs / "index.html",
    ).read_text(encoding="utf-8")

    keys = len(python_fold(change_rows()))
    assert 'id="upsert"' in page and 'id="filtered"' in page
    assert f"{keys} keys, 25 upserts, 2 deletes; fold check PASSED" in page
    assert "Fold check: PASSED: the keyed table" in page and "are equal" in page
    assert "expect_column_values_to_be_null(stale_row)" in page
    assert "filtered 5 offset(s) out, recorded as 2 range(s)" in page
    assert "tests.transforms:only_updates" in page
    assert "Records in the change table" in page  # the records per epoch are the change table's


def test_the_spark_scan_and_the_core_account_records_dead_letters_and_filtered_ranges_alike(spark):
    from splitkeeper.core.invariants import check_sink_ranges, summarize_sink_records
    from splitkeeper.quality.checks import scan_sink

    records = [("s", 0, 1), ("s", 1, 2), ("s", 5, 6), ("s", 9, 10), ("t", 0, 1), ("t", 1, 2)]
    dead = [("s", 2, 3), ("t", 1, 2)]
    filtered = [("s", 3, 5), ("s", 6, 9), ("s", 7, 8), ("t", 2, 4), ("u", 0, 3)]
    row = "split_id STRING, offset BIGINT, next_offset BIGINT, epoch BIGINT"
    scan = scan_sink(
        spark.createDataFrame([(*r, 1) for r in records], row),
        1,
        dead=spark.createDataFrame([(*r, 1) for r in dead], row),
        filtered=spark.createDataFrame(
            [(*r, 1) for r in filtered],
            "split_id STRING, start_offset BIGINT, end_offset BIGINT, epoch BIGINT",
        ),
    )
    assert scan.summaries == summarize_sink_records(records, dead, filtered)
    assert scan.summaries["s"].filtered == 3 and scan.summaries["s"].islands == ((0, 10),)
    assert scan.summaries["s"].duplicates == ((7, 8),)  # a range filtered twice
    assert scan.summaries["t"].overlaps == ((1, 2),) and scan.summaries["t"].filtered_overlaps == ()
    kinds = {
        (v.kind.value, v.split_ids)
        for v in check_sink_ranges(
            records, {}, {"s": 10, "t": 4, "u": 3}, dead_letters=dead, filtered=filtered
        )
    }
    assert kinds == {("offset_duplicate", ("s",)), ("dead_letter_overlap", ("t",))}
    overlapping = [*filtered, ("t", 0, 1)]
    assert [
        v.detail
        for v in check_sink_ranges(records, {}, {"t": 4}, filtered=overlapping)
        if v.split_ids == ("t",)
    ] == [
        "split t: offsets both in a filtered range (filtered_offsets) and in the records or dead letters: 0"
    ]
