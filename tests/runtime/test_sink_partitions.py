"""A partitioned sink end to end (issue 21): a files pipeline on real Spark and Delta with
``sink.partition_by: [ingested_date]`` on a raw sink, read back with Spark and with ``read_sink``,
and the restart checks green; a text sink (``decode.kind: text``) keeps the lines as STRING.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.app import services
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.sinks.delta.read import read_sink

from .helpers import assert_sink_equals_source, pipeline_mapping, run_pipeline, source_records, write_input

pytestmark = pytest.mark.spark


def test_a_raw_sink_partitioned_by_ingested_date_holds_every_line_once(spark: Any, tmp_path: Path) -> None:
    write_input(tmp_path / "in", files=3, lines=90)
    mapping = pipeline_mapping(tmp_path, "parted", tmp_path / "in", parallelism=2, epoch_records=120)
    mapping["sink"]["partition_by"] = ["ingested_date"]
    config = config_from_mapping(mapping)
    assert run_pipeline(config, spark).finished

    rows = assert_sink_equals_source(spark, tmp_path / "sink", tmp_path / "in")  # bytes, once, in order
    assert len(rows) == 270
    today = datetime.datetime.now(datetime.UTC).date()
    table = read_sink(config.sink.path)
    assert table.schema.names[-1] == "ingested_date"
    assert set(table.column("ingested_date").to_pylist()) == {today}

    frame = spark.read.format("delta").load(config.sink.path)
    got = sorted((r.split_id, r.offset, bytes(r.value), r.ingested_date) for r in frame.collect())
    want = sorted(
        (sid, offset, value, today)
        for sid, recs in source_records(tmp_path / "in").items()
        for offset, _n, value in recs
    )
    assert got == want
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{config.sink.path}`").collect()[0]
    assert list(detail["partitionColumns"]) == ["ingested_date"]
    services.validate(config, content=True)  # the restart checks, the values' bytes compared with the files


def test_a_text_sink_keeps_the_lines_as_strings(spark: Any, tmp_path: Path) -> None:
    write_input(tmp_path / "in", files=2, lines=40)
    mapping = pipeline_mapping(tmp_path, "texted", tmp_path / "in", parallelism=2, epoch_records=100)
    mapping["decode"] = {"kind": "text"}
    config = config_from_mapping(mapping)
    assert run_pipeline(config, spark).finished
    table = read_sink(config.sink.path, ["split_id", "offset", "value"])
    assert str(table.schema.field("value").type) == "string"
    want = {
        (sid, o): v.decode() for sid, recs in source_records(tmp_path / "in").items() for o, _n, v in recs
    }
    assert {(r["split_id"], r["offset"]): r["value"] for r in table.to_pylist()} == want
    services.validate(config, content=True)
