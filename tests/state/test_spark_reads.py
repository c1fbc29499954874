"""Spark reads what delta-rs wrote: the state tables the checks and the report build frames from, and
the sink table, with the DDL's schema and with data skipping on the sink's statistics."""

from __future__ import annotations

import pytest

from splitkeeper.core.types import AuditRecord, RecoveryDecision
from splitkeeper.delta.checkpoints import DeltaStateStore, decision_for
from splitkeeper.delta.schemas import ddl

from .samples import LocalPipeline, global_, regional

pytestmark = pytest.mark.spark


def _ddl_schema(table: str):
    from pyspark.sql.types import _parse_datatype_string

    return _parse_datatype_string(" ".join(ddl(table).split()))


def test_spark_reads_the_checkpoints_audit_and_enumerator_tables_deltalake_wrote(spark, tmp_path):
    store = DeltaStateStore(tmp_path / "state", "orders", "files:/in")
    first = global_(1)
    store.commit_checkpoint(decision_for(first, [AuditRecord("s0", 0, RecoveryDecision.ASSIGNED, 1, "x")]))
    store.commit_checkpoint(decision_for(regional(2, first), configured_parallelism=2))
    for table in ("checkpoints", "audit", "enumerator_state", "checkpoint_log", "decisions", "epoch_plans"):
        frame = spark.read.format("delta").load(store.table_path(table))
        assert frame.schema == _ddl_schema(table), table
    checkpoints = spark.read.format("delta").load(store.table_path("checkpoints"))
    rows = {r.checkpoint_id: r for r in checkpoints.collect()}
    assert sorted(rows) == [1, 2]
    assert rows[2].kind == "regional" and rows[2].configured_parallelism == 2
    assert rows[2].regions[1].ref_checkpoint_id == 1  # region 1 fell back to its state of checkpoint 1
    assert rows[2].regions[1].splits[0].position == 1 and rows[2].regions[0].splits[0].position == 2
    assert rows[1].created_at is not None and rows[1].enumerator.readers == [0, 1]
    audit = spark.read.format("delta").load(store.table_path("audit")).collect()
    assert [(a.checkpoint_id, a.split_id, a.decision, a.detail) for a in audit] == [
        (1, "s0", "assigned", "x")
    ]
    assert (
        spark.read.format("delta").load(store.table_path("checkpoints")).where("checkpoint_id = 2").count()
        == 1
    )


def test_spark_reads_the_sink_the_pipeline_committed_and_skips_files_by_its_statistics(spark, tmp_path):
    pipeline = LocalPipeline(tmp_path)
    pipeline.write_input(files=2, lines=30)
    driver = pipeline.driver()
    driver.open()
    summary = driver.run()
    assert summary.finished
    sink = spark.read.format("delta").load(pipeline.sink_path)
    assert sink.schema == _ddl_schema("sink_records")
    assert sink.count() == 60 and sink.select("split_id", "offset").distinct().count() == 60
    assert sink.where("ingested_at IS NULL").count() == 0
    every_file = set(sink.inputFiles())
    last_epoch = max(r.epoch for r in sink.select("epoch").distinct().collect())
    pruned = spark.read.format("delta").load(pipeline.sink_path).where(f"epoch = {last_epoch}")
    assert pruned.count() > 0
    assert set(pruned.inputFiles()) < every_file  # Delta's data skipping used the footer statistics
    offsets = [r.offset for r in sink.where("split_id = 'part-0.txt'").orderBy("offset").collect()]
    assert offsets == sorted(set(offsets)) and len(offsets) == 30
