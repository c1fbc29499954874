"""Spark's own task retry never turns a region into a duplicate (protocol rules 5.1 and 2.5).

On a cluster ``spark.task.maxFailures`` is 4: Spark reruns a region task whose attempt
raised. Each attempt writes its own staged file under ``attempt=<id>``, and only the path
a finished attempt returns is committed, so a retried region acknowledges once, with
the retry's records. A ``flaky`` fault fails a task's first attempt only (after reading,
before publishing), the way a lost executor or a transient error would.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.app.pipeline import Pipeline
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.core.types import CheckpointKind, RegionOutcome
from splitkeeper.spark.faults import FaultPlan

from .helpers import (
    assert_sink_equals_source,
    pipeline_mapping,
    splitkeeper_subprocess,
    write_config,
    write_input,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_a_region_retried_by_spark_acknowledges_once_and_the_sink_equals_the_source(tmp_path: Path) -> None:
    input_dir = tmp_path / "in"
    write_input(input_dir, files=3, lines=60)
    mapping = pipeline_mapping(tmp_path, "task-retry", input_dir, epoch_records=90)
    config_path = write_config(tmp_path / "pipeline.yaml", mapping)

    # local[2,2]: two attempts per task, as on a cluster. Region 1's first attempt of epoch 1 fails;
    # region 2 fails in every attempt of epoch 2 (Spark's retry cannot save a real failure).
    done = splitkeeper_subprocess(
        ["run", "--config", str(config_path), "--fault", "flaky:1@1", "--fault", "fail:2@2", "--json"],
        SPLITKEEPER_SPARK_MASTER="local[2,2]",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.lstrip().startswith("epoch ")]
    assert "epoch    1 global   3/3 regions ack" in lines[0], lines
    assert "epoch    2 regional 2/3 regions ack (r2 decline)" in lines[1], lines
    assert "first task attempt only" in done.stderr  # Spark logged the failed first attempt
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["finished"] is True

    config = config_from_mapping(mapping)
    from splitkeeper.spark.session import get_spark

    rows = assert_sink_equals_source(get_spark(), config.sink.path, input_dir)
    assert {r.region for r in rows if r.epoch == 1} == {0, 1, 2}  # the retry's records, once
    staged = (
        [p for p in Path(config.staging.path).rglob("*.parquet")]
        if os.path.isdir(config.staging.path)
        else []
    )
    assert staged == [], f"staging not cleaned: {staged}"


def test_without_task_retry_a_flaky_region_declines_and_is_read_again(spark: Any, tmp_path: Path) -> None:
    input_dir = tmp_path / "in"
    write_input(input_dir, files=3, lines=30)
    config = config_from_mapping(pipeline_mapping(tmp_path, "no-retry", input_dir, epoch_records=45))
    assert spark.sparkContext.getConf().get("spark.master").startswith("local[")  # one attempt per task
    pipeline = Pipeline(config, spark, faults=FaultPlan.parse(["flaky:1@2"]))
    try:
        pipeline.open()
        assert pipeline.run_epoch().kind is CheckpointKind.GLOBAL
        second = pipeline.run_epoch()
        rest = pipeline.run()
    finally:
        pipeline.close()
    assert second.kind is CheckpointKind.REGIONAL and second.outcomes[1] is RegionOutcome.DECLINE
    assert "first task attempt only" in second.region_errors[1]
    assert rest.finished
    assert_sink_equals_source(spark, config.sink.path, input_dir)


_RETRIED_REGIONS = r"""
import json, sys, time
from pyspark import TaskContext
from pyspark.sql import SparkSession
from splitkeeper.spark.regions import run_regions

def task(region):
    attempt = TaskContext.get().attemptNumber()
    if region == 0:  # every attempt raises after SLOW seconds: each inside the timeout, not all three
        time.sleep(SLOW)
        raise RuntimeError(f"region 0 is broken (attempt {attempt})")
    if region == 1:  # the first attempt raises at once, the retry stalls
        if attempt == 0:
            raise RuntimeError("region 1 raised first")
        time.sleep(600)
    return region * 10

SLOW, TIMEOUT = float(sys.argv[1]), float(sys.argv[2])
spark = SparkSession.builder.master("local[2,3]").appName("retried-regions").getOrCreate()
spark.sparkContext.setLogLevel("OFF")
runs = run_regions(spark, "retried", 1, {0: 0, 1: 1, 2: 2}, task, timeout_s=TIMEOUT)
print(json.dumps({r: [run.status.value, run.error, run.result] for r, run in runs.items()}))
"""


def test_an_attempt_that_raises_and_is_retried_is_not_silence_and_a_later_timeout_names_its_error(
    tmp_path: Path,
) -> None:
    """On a cluster Spark gives a raising region task ``spark.task.maxFailures`` attempts. Region 0
    raises in each of its 3 attempts (``local[2,3]``) after 3 s: each attempt is inside the 8 s
    timeout, their sum is not. Each retried attempt tells the driver it raised, so the region is FAILED
    with its error (it was timed out from its first start before, under load on the chaos cluster
    run). Region 1's first attempt raises and its retry stalls: it times out, and the timeout says
    what the earlier attempt raised. Region 2 finishes."""
    import subprocess
    import sys

    from .helpers import REPO, subprocess_env

    script = tmp_path / "retried.py"
    script.write_text(_RETRIED_REGIONS)
    done = subprocess.run(
        [sys.executable, str(script), "3", "8"],
        env=subprocess_env(),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    status, error, _ = runs["0"]
    assert status == "failed", runs
    assert "RuntimeError: region 0 is broken (attempt 2)" in error, runs  # the last attempt's own report
    status, error, _ = runs["1"]
    assert status == "timed_out", runs
    assert (
        error == "no result within 8s after 1 attempt that raised (last: RuntimeError: region 1 raised first)"
    )
    assert runs["2"] == ["finished", "", 20]
    assert "attempt 0 raised, Spark retries it: RuntimeError: region 0 is broken (attempt 0)" in done.stderr
