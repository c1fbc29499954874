"""The Delta log helpers on real Delta tables: txn versions without Spark jobs, commits read back, appends."""

from __future__ import annotations

import glob
import os
from typing import Any

import pytest

from splitkeeper.errors import InvalidParameterError
from splitkeeper.runtime.delta_log import (
    COMMIT_ID_KEY,
    append_logged,
    append_once,
    delta_file_count,
    delta_snapshot,
    delta_table_version,
    read_commit,
    txn_version,
)

pytestmark = pytest.mark.spark


@pytest.fixture
def table(spark: Any, scratch: Any) -> str:
    path = scratch.table("t")
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT) USING DELTA")
    return path


def test_append_once_writes_each_version_once_and_returns_its_commit(spark: Any, table: str) -> None:
    first = append_once(spark.range(3).coalesce(1), table, "app", 1, {"epoch": 1})
    assert first is not None and first.version == 1
    assert first.transactions == {"app": 1}
    assert first.output_rows == 3
    assert first.metadata["epoch"] == 1 and first.commit_id == first.metadata[COMMIT_ID_KEY]

    assert append_once(spark.range(5), table, "app", 1) is None  # a replay writes nothing
    assert append_once(spark.range(5), table, "app", 0) is None  # nor does an older version
    assert delta_table_version(spark, table) == 1
    assert spark.read.format("delta").load(table).count() == 3

    second = append_once(spark.range(2).coalesce(1), table, "app", 2)
    assert second is not None and second.version == 2
    assert txn_version(delta_snapshot(spark, table), "app") == 2
    assert txn_version(delta_snapshot(spark, table), "other") is None
    with pytest.raises(InvalidParameterError, match="commit_id"):
        append_once(spark.range(1), table, "app", 3, {COMMIT_ID_KEY: "mine"})


def test_txn_version_and_file_count_come_from_the_checksum_without_a_spark_job(
    spark: Any, table: str
) -> None:
    snapshot = delta_snapshot(spark, table)
    assert delta_file_count(snapshot) == 0 and txn_version(snapshot, "app") is None
    append_once(spark.range(3).coalesce(1), table, "app", 7)
    spark.range(2).coalesce(1).write.format("delta").mode("append").save(table)  # no txn

    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup("probe", "txn lookups")
    try:
        spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # a restarted driver: cold
        snapshot = delta_snapshot(spark, table)
        assert txn_version(snapshot, "app") == 7
        assert delta_file_count(snapshot) == 2
    finally:
        spark.sparkContext.setJobGroup("", "")
    assert tracker.getJobIdsForGroup("probe") == []


def test_txn_version_without_a_checksum_asks_the_snapshot_state(spark: Any, table: str) -> None:
    append_once(spark.range(3).coalesce(1), table, "app", 4)
    for crc in glob.glob(os.path.join(table, "_delta_log", "*.crc")):
        os.remove(crc)
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    assert txn_version(delta_snapshot(spark, table), "app") == 4


def test_append_logged_reports_the_commits_that_landed_before_it(spark: Any, table: str) -> None:
    since = delta_table_version(spark, table)
    other = append_logged(spark.range(1), table, since, {"claim": "other"})
    mine = append_logged(spark.range(1), table, since, {"claim": "mine"})

    assert other.earlier == ()
    assert [c.version for c in mine.earlier] == [other.commit.version]
    assert mine.earlier[0].metadata["claim"] == "other" and mine.earlier[0].operation == "WRITE"
    assert mine.commit.version == other.commit.version + 1
    assert read_commit(spark, table, mine.commit.version) == mine.commit
    assert read_commit(spark, table, 99) is None
