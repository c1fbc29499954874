"""The restart checks over the sink and the dead-letter table together, on real Delta tables: a healthy
pair passes; a broken dead-letter table (an overlap, a gap, a duplicate) fails the named expectation
for the named split; the content digest of Spark SQL is the core's."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from splitkeeper.core.invariants import content_digest
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.delta.schemas import DEAD_LETTER_SCHEMA
from splitkeeper.errors import InvariantViolation
from splitkeeper.quality.checks import build_restart_frames, raise_on_failure, resolve_strategy, scan_sink
from splitkeeper.sinks.delta.read import DeltaSinkReader
from tests.quality.test_expectations import (
    PIPELINE,
    SOURCE_SPLITS,
    SUB,
    failing,
    healthy,
    run_checks,
    write,
)

pytestmark = pytest.mark.spark

#: Records of the healthy scenario that failed: in the dead-letter table, not in the sink.
DEAD = [("orders-2", 3, 1), ("orders-2", 7, 2), ("orders-9", 1, 1)]


def _dead_rows(rows: list[tuple[str, int, int]]) -> pa.Table:
    now = datetime.now(UTC)
    return pa.Table.from_pylist(
        [
            {
                "split_id": sid,
                "offset": o,
                "next_offset": o + 1,
                "key": None,
                "value": b"\xff" + str(o).encode(),
                "stage": "decode",
                "error_class": "UnicodeDecodeError",
                "error_message": "not valid UTF-8",
                "epoch": e,
                "region": 0,
                "attempt_id": "a",
                "failed_at": now,
            }
            for sid, o, e in rows
        ],
        DEAD_LETTER_SCHEMA,
    )


@pytest.fixture(scope="module")
def with_dead_letters(spark, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dead")
    _store, sink_path = write(spark, root, healthy())
    table = DeltaTable(sink_path)
    for sid, o, _e in DEAD:
        table.delete(f"split_id = '{sid}' AND offset = {o}")
    write_deltalake(str(root / "dead"), _dead_rows(DEAD))
    return root


def _copy(root: Path, tmp_path: Path) -> tuple[DeltaStateStore, str, str]:
    shutil.copytree(root, tmp_path / "copy")
    base = tmp_path / "copy"
    return DeltaStateStore(base / "state", PIPELINE, "kafka:orders"), str(base / "sink"), str(base / "dead")


def test_sink_and_dead_letters_together_pass_and_the_sink_alone_fails(spark, with_dead_letters, tmp_path):
    store, sink, dead = _copy(with_dead_letters, tmp_path)
    report = run_checks(spark, store, sink, tmp_path / "docs", dead_letter_path=dead)
    assert report.success, report.summary()
    frames = build_restart_frames(
        spark,
        store,
        DeltaSinkReader(str(sink), store.pipeline_name, dead_letter_path=str(dead)),
        2,
        strategy=resolve_strategy("round-robin"),
        subscriptions={SUB},
        max_consecutive_failures=2,
        source_splits=SOURCE_SPLITS,
    )
    rows = {r["split_id"]: r for r in frames.frames["sink_records"].to_pylist()}
    assert (rows["orders-2"]["records"], rows["orders-2"]["dead_letters"]) == (10, 2)
    assert rows["orders-0"]["dead_letters"] == 0
    alone = run_checks(spark, store, sink, tmp_path / "docs2")
    assert not alone.success  # the dead letters are what accounts for those offsets
    assert set(failing(alone)) >= {("sink_records", "expect_column_values_to_be_null(offset_missing)")}


def _overlap(dead: str) -> None:
    write_deltalake(dead, _dead_rows([("orders-0", 1, 1)]), mode="append")  # also in the sink


def _gap(dead: str) -> None:
    DeltaTable(dead).delete("split_id = 'orders-2' AND offset = 3")


def _duplicate(dead: str) -> None:
    write_deltalake(dead, _dead_rows([("orders-2", 7, 2)]), mode="append")


@pytest.mark.parametrize(
    ("corrupt", "rule", "split_id"),
    [
        (_overlap, "dead_letter_overlap", "orders-0"),
        (_gap, "offset_missing", "orders-2"),
        (_duplicate, "offset_duplicate", "orders-2"),
    ],
    ids=["overlap", "gap", "duplicate"],
)
def test_a_broken_dead_letter_table_fails_the_named_rule(
    spark, with_dead_letters, tmp_path, corrupt, rule, split_id
):
    store, sink, dead = _copy(with_dead_letters, tmp_path)
    corrupt(dead)
    report = run_checks(spark, store, sink, tmp_path / "docs", dead_letter_path=dead)
    assert failing(report) == {("sink_records", f"expect_column_values_to_be_null({rule})"): (split_id,)}, (
        report.summary()
    )
    with pytest.raises(InvariantViolation, match=rule):
        raise_on_failure(report)


def test_the_content_digest_of_the_scan_is_the_cores_over_sink_and_dead_letter_bytes(spark):
    sink = spark.createDataFrame(
        [("s", 0, 1, "héllo", 1), ("s", 2, 3, None, 1), ("s", 3, 4, "", 1)],
        "split_id STRING, offset BIGINT, next_offset BIGINT, value STRING, epoch BIGINT",
    )
    dead = spark.createDataFrame(
        [("s", 1, 2, bytearray(b"\xff\xfe"), 1)],
        "split_id STRING, offset BIGINT, next_offset BIGINT, value BINARY, epoch BIGINT",
    )
    scan = scan_sink(sink, 1, ["s"], dead)
    assert scan.hashes["s"] == content_digest(["héllo".encode(), b"\xff\xfe", None, b""])
    assert scan.summaries["s"].dead_letters == 1 and scan.summaries["s"].islands == ((0, 4),)
    assert scan_sink(sink, 1, ["s"]).hashes["s"] == content_digest(["héllo", None, ""])
