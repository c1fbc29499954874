"""``readers: long_lived``: one Spark job's tasks serve the regions of every epoch of a run
(:mod:`splitkeeper.spark.readers`), and a region that raises, stalls or loses its Python worker
falls back alone while the sink ends equal to the source, by content."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from splitkeeper.config.settings import config_from_mapping
from splitkeeper.core.types import RegionOutcome

from .helpers import assert_sink_equals_source, pipeline_mapping, run_pipeline, write_input

pytestmark = [pytest.mark.spark]


def _reader_jobs(spark: Any, pipeline: str) -> dict[int, list[str]]:
    """The pipeline's reader jobs: job number -> the statuses of the Spark jobs of its group."""
    tracker = spark.sparkContext.statusTracker()
    out: dict[int, list[str]] = {}
    for number in range(1, 20):
        ids = tracker.getJobIdsForGroup(f"splitkeeper-{pipeline}-readers-{number}")
        if ids:
            out[number] = [str(tracker.getJobInfo(i).status) for i in ids]
    return out


def _failed(summary: Any) -> dict[int, dict[int, RegionOutcome]]:
    """epoch -> the regions that did not acknowledge, with their outcome."""
    out = {}
    for report in summary.epochs:
        failed = {r: o for r, o in report.outcomes.items() if o is not RegionOutcome.ACK}
        if failed:
            out[report.epoch] = failed
    return out


def test_one_job_serves_every_epoch_and_a_raising_and_a_stalled_region_fall_back_alone(
    spark: Any, tmp_path: Path
) -> None:
    """Many epochs on one reader job: region 1 raises in epoch 2 (declined, its task serves the next
    epoch) and region 0 stalls in epoch 4 (timed out, its task attempt killed; Spark's next attempt
    of it says hello for the same slot): only those regions fall back, the job is never replaced,
    and the sink equals the source."""
    input_dir = tmp_path / "in"
    write_input(input_dir, files=4, lines=50)
    mapping = pipeline_mapping(
        tmp_path, "long-lived", input_dir, parallelism=2, epoch_records=40, region_timeout_s=4
    )
    mapping["readers"] = "long_lived"
    config = config_from_mapping(mapping)

    summary = run_pipeline(config, spark, faults=["fail:1@2", "stall:60:0@4"])

    assert summary.finished
    assert len(summary.epochs) >= 6
    assert _failed(summary) == {2: {1: RegionOutcome.DECLINE}, 4: {0: RegionOutcome.TIMEOUT}}
    assert "InjectedFault" in summary.epochs[1].region_errors[1]
    assert list(_reader_jobs(spark, "long-lived")) == [1]  # one reader job for the whole run
    assert_sink_equals_source(spark, config.sink.path, input_dir)


@pytest.mark.slow
def test_a_killed_python_worker_fails_its_region_alone_and_a_new_job_serves_the_rest(
    spark: Any, tmp_path: Path
) -> None:
    """A reader's Python worker is SIGKILLed mid-run (the transform kills its own pid on the record
    ``KILL:<file>``): on ``local[2]`` (one attempt per task) Spark aborts the reader job, the region whose
    worker died declines alone (the other slot's region runs again on the replacement job's slots),
    the next epochs run on a new reader job, and the sink equals the source."""
    input_dir = tmp_path / "in"
    write_input(input_dir, files=4, lines=50)
    marker = tmp_path / "armed"
    marker.touch()
    (input_dir / "kill.txt").write_text("".join(f"k{i}\n" for i in range(30)) + f"KILL:{marker}\nafter\n")
    mapping = pipeline_mapping(
        tmp_path, "long-killed", input_dir, parallelism=2, epoch_records=40, region_timeout_s=30
    )
    mapping["readers"] = "long_lived"
    mapping["transform"] = "tests.runtime.long_lived_functions:kill_once"
    mapping["decode"] = {"kind": "text"}
    config = config_from_mapping(mapping)

    summary = run_pipeline(config, spark)

    assert summary.finished and not marker.exists()  # the kill fired once
    failed = _failed(summary)
    assert len(failed) == 1, failed
    [(epoch, regions)] = failed.items()
    assert list(regions.values()) == [RegionOutcome.DECLINE], failed
    report = next(e for e in summary.epochs if e.epoch == epoch)
    assert "Python worker exited" in next(iter(report.region_errors.values())), report.region_errors
    assert len(_reader_jobs(spark, "long-killed")) == 2  # the first aborted, a second served the rest
    assert_sink_equals_source(spark, config.sink.path, input_dir)
