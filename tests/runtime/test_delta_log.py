"""The Delta log helpers on real Delta tables: txn versions without Spark jobs, commits read back, appends."""

from __future__ import annotations

import glob
import os
from typing import Any

import pytest

from splitkeeper.errors import InvalidParameterError
from splitkeeper.runtime.delta_log import (
    COMMIT_ID_KEY,
    DataFile,
    _add_json,
    _commit_actions,
    _read_txn_version,
    _transaction_api,
    _write_operation,
    append_logged,
    append_once,
    commit_files_once,
    delta_file_count,
    delta_snapshot,
    delta_table_version,
    is_concurrent_modification,
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


def _parquet_file(table: str, name: str, ids: list[int]) -> DataFile:
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = os.path.join(table, name)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), target)
    info = os.stat(target)
    return DataFile(name, info.st_size, int(info.st_mtime * 1000), len(ids))


def test_commit_files_once_checks_the_txn_version_from_the_checksum_without_a_spark_job(
    spark: Any, table: str
) -> None:
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # a cold snapshot: no state computed
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup("probe", "commit files")
    try:
        first = commit_files_once(spark, table, "app", 1, [_parquet_file(table, "a.parquet", [1, 2, 3])])
        replay = commit_files_once(spark, table, "app", 1, [_parquet_file(table, "b.parquet", [9])])
    finally:
        spark.sparkContext.setJobGroup("", "")
    assert tracker.getJobIdsForGroup("probe") == []
    assert first is not None and first.version == 1 and first.transactions == {"app": 1}
    assert replay is None  # the replay added nothing
    assert sorted(r.id for r in spark.read.format("delta").load(table).collect()) == [1, 2, 3]
    assert txn_version(delta_snapshot(spark, table), "app") == 1


def test_a_transaction_that_read_the_txn_version_conflicts_with_a_commit_of_the_same_app(
    spark: Any, table: str
) -> None:
    api = _transaction_api(spark, table, _write_operation("{}"))
    slow = api[0].startTransaction()
    assert _read_txn_version(slow, "app") == -1  # read from the checksum, recorded as read
    assert commit_files_once(spark, table, "app", 1, [_parquet_file(table, "a.parquet", [1])]) is not None
    late = _parquet_file(table, "b.parquet", [2])
    txn = '{"txn": {"appId": "app", "version": 1, "lastUpdated": 0}}'
    with pytest.raises(Exception) as info:
        _commit_actions(spark, slow, api, [_add_json(late), txn])
    assert is_concurrent_modification(info.value)
    assert [r.id for r in spark.read.format("delta").load(table).collect()] == [1]


def test_the_txn_version_without_a_checksum_comes_from_the_transaction(spark: Any, table: str) -> None:
    commit_files_once(spark, table, "app", 3, [_parquet_file(table, "a.parquet", [1])])
    for crc in glob.glob(os.path.join(table, "_delta_log", "*.crc")):
        os.remove(crc)
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    txn = _transaction_api(spark, table, _write_operation("{}"))[0].startTransaction()
    assert _read_txn_version(txn, "app") == 3
    assert commit_files_once(spark, table, "app", 3, [_parquet_file(table, "b.parquet", [2])]) is None
