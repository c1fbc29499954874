"""End-to-end tests of the Spark epoch runner: real Spark jobs, real Delta tables, real faults.

Every test asserts on the data afterwards: the sink equals the source exactly
(:func:`helpers.assert_sink_equals_source`: no duplicate ``(split_id, offset)``,
every line once, per split contiguous byte ranges from 0 to the file size, in
file order). Data is tiny (a few files of tens of lines), parallelism 2 to 4 on
``local[2]``, the epoch budget small so that each file takes a few epochs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from splitkeeper.app.pipeline import EpochReport, Pipeline, RunSummary
from splitkeeper.app.services import leased_pipeline
from splitkeeper.config.settings import PipelineConfig, config_from_mapping
from splitkeeper.core.types import CheckpointKind, RegionOutcome
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.delta.lease import LeaseHeldError
from splitkeeper.errors import ConcurrentRunError
from splitkeeper.sources import build_source

from .helpers import (
    REPO,
    assert_sink_equals_source,
    pipeline_mapping,
    run_cli,
    run_pipeline,
    sink_rows,
    subprocess_env,
    write_config,
    write_input,
)

pytestmark = pytest.mark.spark

ONLY_ONE_RUN = "only one run may drive a pipeline"


def _setup(
    tmp_path: Path, name: str, *, files: int = 3, lines: int = 40, **options: Any
) -> tuple[PipelineConfig, Path, Path]:
    """Input files, a config mapping, its YAML file; returns (config, input dir, config file)."""
    input_dir = tmp_path / "in"
    write_input(input_dir, files=files, lines=lines)
    options.setdefault("epoch_records", 60)
    mapping = pipeline_mapping(tmp_path, name, input_dir, **options)
    config_path = write_config(tmp_path / "pipeline.yaml", mapping)
    return config_from_mapping(mapping), input_dir, config_path


def _run(
    config: PipelineConfig, spark: Any, faults: tuple[str, ...] = (), epochs: int | None = None
) -> RunSummary:
    lines: list[str] = []
    summary = run_pipeline(config, spark, epochs=epochs, faults=faults, progress=lines.append)
    assert len(lines) == len(summary.epochs)  # one progress line per epoch
    for report in summary.epochs:
        print(f"[{config.name}] {report.line()}")  # the phase times, visible with -s
    return summary


def _store(config: PipelineConfig, spark: Any) -> DeltaStateStore:
    return DeltaStateStore(config.state.path, config.name, build_source(config.source).fingerprint())


def _by_epoch(summary: RunSummary) -> dict[int, EpochReport]:
    return {e.epoch: e for e in summary.epochs}


def _regions_by_epoch(rows: list[Any]) -> dict[int, dict[int, int]]:
    """epoch -> region -> records the sink holds from that region's task of that epoch."""
    out: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        out[r.epoch][r.region] += 1
    return {e: dict(regions) for e, regions in out.items()}


def _loads(checkpoint: Any) -> dict[int, int]:
    """Per reader (0..P-1): live splits the checkpoint's enumerator snapshot assigns it."""
    snapshot = checkpoint.enumerator
    assert snapshot is not None
    return {r: len(snapshot.assignments.get(r, ())) for r in range(checkpoint.parallelism)}


# --------------------------------------------------------------------------- happy path


def _cli_child(config_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m splitkeeper run --config FILE`` in a child process (this checkout's code)."""
    return subprocess.run(
        [sys.executable, "-m", "splitkeeper", "run", "--config", str(config_path)],
        env=subprocess_env(PYTHONPATH=str(REPO), **env),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_run_with_nothing_new_starts_no_jvm(spark: Any, tmp_path: Path) -> None:
    """Issue 26: the driver opens, discovers and plans before Spark; Spark starts with the first
    epoch that has ranges to read. The child runs where no JVM can start (JAVA_HOME points at an
    empty folder): with nothing new it ends as before, exit 0 and the same summary; with a new file
    it needs Spark and fails at its start, and the next run reads the file exactly once."""
    config, input_dir, config_path = _setup(tmp_path, "idle", files=2, lines=20)
    code, out, err = run_cli(["run", "--config", str(config_path)])  # on this module's session
    assert code == 0, err
    assert out.startswith(
        "idle: 1 epochs, checkpoints {'global': 1, 'regional': 0, 'aborted': 0}, 40 records"
    )
    before = sink_rows(config.sink.path)
    no_java = {"JAVA_HOME": str(tmp_path / "no-java")}

    started = time.monotonic()
    idle = _cli_child(config_path, **no_java)
    elapsed = time.monotonic() - started
    assert idle.returncode == 0, idle.stderr[-3000:]
    assert idle.stdout == (
        "idle: 0 epochs, checkpoints {'global': 0, 'regional': 0, 'aborted': 0}, 0 records committed, "
        "source finished on a global checkpoint\n"
        "idle: every restore inside the run was proven (1 restart check passed)\n"
    )
    assert "starting the Spark session" not in idle.stderr and "Java gateway" not in idle.stderr
    print(f"nothing new: {elapsed:.2f} s through the CLI, no JVM")  # visible with -s; tests do not time
    assert sink_rows(config.sink.path) == before

    write_input(input_dir, files=1, lines=5, first_file=2)  # something to read: Spark is needed now
    busy = _cli_child(config_path, **no_java)
    assert busy.returncode != 0
    assert "starting the Spark session: the first epoch with ranges to read" in busy.stderr
    assert "JAVA_GATEWAY_EXITED" in busy.stderr, busy.stderr[-3000:]
    code, out, err = run_cli(["run", "--config", str(config_path)])  # redoes the planned epoch
    assert code == 0, err
    assert ", 5 records committed, source finished on a global checkpoint" in out
    assert_sink_equals_source(spark, config.sink.path, input_dir)


def test_bounded_run_finishes_on_a_global_checkpoint_and_sink_equals_source(
    spark: Any, tmp_path: Path
) -> None:
    config, input_dir, config_path = _setup(tmp_path, "happy")

    summary = _run(config, spark)

    assert summary.finished
    last = summary.epochs[-1]
    assert last.kind is CheckpointKind.GLOBAL
    assert all(e.kind is CheckpointKind.GLOBAL for e in summary.epochs)
    # 3 files of 40 lines at 60 records per epoch (20 per file): epoch 2 reads each file's last 20
    # lines, and its global checkpoint ends the run: no empty final epoch follows.
    assert [e.epoch for e in summary.epochs] == [1, 2] and not last.final
    rows = assert_sink_equals_source(spark, config.sink.path, input_dir)
    assert summary.committed_records == len(rows) == 120
    assert {"plan", "read", "sink", "state"} <= set(summary.epochs[0].phases)
    assert {r.epoch for r in rows} == {1, 2}

    code, out, err = run_cli(["status", "--config", str(config_path), "--json"])
    assert code == 0, err
    status = json.loads(out)
    assert status["pipeline"] == "happy"
    latest = status["latest_checkpoint"]
    assert latest["id"] == last.epoch
    assert latest["kind"] == "global"
    assert latest["parallelism"] == 3
    assert latest["finished_splits"] == 3 and latest["pool"] == 0
    line = status["timeline"][-1]
    assert {k: v for k, v in line.items() if k != "phases_ms"} == {
        "id": last.epoch,
        "kind": "global",
        "failed_regions": [],
        "reason": f"checkpoint {last.epoch} is global: all 3 regions acknowledged",  # its decision's
        "failures": [],
    }
    assert set(line["phases_ms"]) == {"plan", "read", "sink", "commit"}  # persisted with the checkpoint
    assert line["phases_ms"]["read"] == round(last.phases["read"] * 1000)
    assert status["splits"] == []  # every split read to its end: none live, no lag

    again = _run(config, spark)  # nothing new since that global checkpoint: not even an empty epoch
    assert again.finished and again.epochs == ()
    write_input(input_dir, files=1, lines=10, first_file=3)  # a new file: read, then finished
    more = _run(config, spark)
    assert more.finished and [e.epoch for e in more.epochs] == [3] and more.committed_records == 10
    assert_sink_equals_source(spark, config.sink.path, input_dir)


def _jobs_of_epoch(spark: Any, pipeline: str, epoch: int) -> list[int]:
    """The number of tasks of each Spark job the region runner started in ``epoch`` (its job group)."""
    from splitkeeper.spark.regions import _job_group

    tracker = spark.sparkContext.statusTracker()
    return [
        sum(tracker.getStageInfo(s).numTasks for s in tracker.getJobInfo(j).stageIds)
        for j in tracker.getJobIdsForGroup(_job_group(pipeline, epoch))
    ]


def test_a_parallelism_far_above_the_split_count_starts_a_task_only_for_regions_with_ranges(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 26: 64 regions over 3 files. The regions with nothing to read are acknowledged by the
    driver (no thread, no task); the epoch is one Spark job whose tasks are exactly its regions
    with ranges.
    A fault asked for an idle region has no task to fire in: the run says so and goes on."""
    config, input_dir, _path = _setup(tmp_path, "wide", parallelism=64, region_timeout_s=120)

    summary = _run(config, spark, faults=("fail:63@1",))

    assert summary.finished and all(e.kind is CheckpointKind.GLOBAL for e in summary.epochs)
    for report in summary.epochs:
        busy = sorted(set(range(64)) - set(report.idle_regions))
        assert report.outcomes == dict.fromkeys(range(64), RegionOutcome.ACK)
        assert len(busy) == 3  # 3 files, 20 lines each per epoch: one region per file
        assert _jobs_of_epoch(spark, "wide", report.epoch) == [len(busy)]  # one job, a task per busy region
        assert sorted(report.region_task_s) == busy  # idle regions have no task time
    assert 63 in summary.epochs[0].idle_regions
    assert "fault 63@1 not injected: region 63 had nothing to read in epoch 1" in caplog.text
    rows = assert_sink_equals_source(spark, config.sink.path, input_dir)
    assert len(rows) == 120 and len({r.region for r in rows}) == 3

    write_input(input_dir, files=1, lines=10, first_file=3)  # a restart: restore, then one new file
    more = _run(config, spark)
    assert more.finished and more.committed_records == 10
    first = more.epochs[0]
    assert len(first.idle_regions) == 63 and _jobs_of_epoch(spark, "wide", first.epoch) == [1]
    assert_sink_equals_source(spark, config.sink.path, input_dir)


def test_a_small_remainder_is_read_in_the_same_epoch_and_epochs_n_runs_at_most_n_epochs(
    spark: Any, tmp_path: Path
) -> None:
    # 2 files of 42 lines at 40 records per epoch (20 per file): after 20 lines, 22 are left, less
    # than 20 + 20/4, so epoch 2 reads to the end instead of leaving 2 lines for an epoch 3.
    config, input_dir, config_path = _setup(tmp_path, "tail", files=2, lines=42, epoch_records=40)
    cfg = ["--config", str(config_path)]

    code, out, err = run_cli(["run", *cfg, "--epochs", "1", "--json"])
    assert code == 0, err
    assert json.loads(out)["epochs"] == 1 and json.loads(out)["finished"] is False
    code, out, err = run_cli(["run", *cfg, "--epochs", "1", "--json"])
    assert code == 0, err
    second = json.loads(out)
    assert second["epochs"] == 1  # the data ends in this epoch: no extra final epoch beyond --epochs 1
    assert second["finished"] is True

    rows = assert_sink_equals_source(spark, config.sink.path, input_dir)
    assert {r.epoch for r in rows} == {1, 2}
    assert sum(1 for r in rows if r.epoch == 1) <= 2 * 21  # epoch 1 kept to its budget


# --------------------------------------------------------------------------- region faults


def test_failed_and_stalled_regions_checkpoint_regionally_and_sink_equals_source(
    spark: Any, tmp_path: Path
) -> None:
    config, input_dir, _ = _setup(tmp_path, "faults", lines=60, region_timeout_s=12)

    summary = _run(config, spark, faults=("fail:1@2", "stall:60:2@3"))

    epochs = _by_epoch(summary)
    assert epochs[1].kind is CheckpointKind.GLOBAL
    e2, e3 = epochs[2], epochs[3]
    assert e2.kind is CheckpointKind.REGIONAL
    assert e2.outcomes == {0: RegionOutcome.ACK, 1: RegionOutcome.DECLINE, 2: RegionOutcome.ACK}
    assert "injected fault" in e2.region_errors[1]
    assert e3.kind is CheckpointKind.REGIONAL
    assert e3.outcomes == {0: RegionOutcome.ACK, 1: RegionOutcome.ACK, 2: RegionOutcome.TIMEOUT}
    assert e3.region_errors[2] == "no result within 12s"
    assert 12 <= e3.phases["read"] < 60  # the stalled region was cancelled at its timeout, not waited for
    assert summary.finished and summary.epochs[-1].kind is CheckpointKind.GLOBAL

    rows = assert_sink_equals_source(spark, config.sink.path, input_dir)
    by_epoch = _regions_by_epoch(rows)
    assert set(by_epoch[1]) == {0, 1, 2}  # one file per reader: every region reads in epoch 1
    # The healthy regions' records of a regional epoch are committed in that epoch; the failed one's are not.
    assert set(by_epoch[2]) == {0, 2}
    assert set(by_epoch[3]) == {0, 1}

    timeline = {(t.checkpoint_id, t.kind): t for t in _store(config, spark).history.timeline()}
    assert timeline[(2, CheckpointKind.REGIONAL)].ref_checkpoint_ids == {1: 1}
    assert timeline[(3, CheckpointKind.REGIONAL)].ref_checkpoint_ids == {2: 2}
    # why each region failed and how long each phase took, persisted with the checkpoint (issue 23)
    [declined] = timeline[(2, CheckpointKind.REGIONAL)].failures
    assert (declined.region_id, declined.outcome, declined.error_class) == (1, "decline", "InjectedFault")
    assert "injected fault" in declined.message and not declined.message.startswith("[")
    [stalled] = timeline[(3, CheckpointKind.REGIONAL)].failures
    assert (stalled.region_id, stalled.outcome, stalled.error_class, stalled.message) == (
        2,
        "timeout",
        "Timeout",
        "no result within 12s",
    )
    assert timeline[(1, CheckpointKind.GLOBAL)].failures == ()
    phases = timeline[(3, CheckpointKind.REGIONAL)].phases_ms
    assert set(phases) == {"plan", "read", "sink", "commit"}
    assert 12_000 <= phases["read"] < 60_000 and phases["read"] == round(e3.phases["read"] * 1000)


def test_failure_at_the_forced_global_checkpoint_aborts_it_and_the_run_still_finishes(
    spark: Any, tmp_path: Path
) -> None:
    config, input_dir, _ = _setup(tmp_path, "forced", lines=60, max_consecutive_failures=1)

    summary = _run(config, spark, faults=("fail:1@2", "fail:0@3"))

    epochs = _by_epoch(summary)
    assert epochs[2].kind is CheckpointKind.REGIONAL
    assert epochs[3].kind is CheckpointKind.ABORTED
    assert "forced global" in epochs[3].reason and "max_consecutive_failures=1" in epochs[3].reason
    assert epochs[3].committed_records == 0
    assert epochs[4].kind is CheckpointKind.GLOBAL  # the aborted forced global reset the counter
    assert summary.finished and summary.epochs[-1].kind is CheckpointKind.GLOBAL

    timeline = _store(config, spark).history.timeline()
    aborted = [t for t in timeline if t.kind is CheckpointKind.ABORTED]
    assert [(t.checkpoint_id, t.failed_regions) for t in aborted] == [(3, (0,))]
    assert "forced global" in aborted[0].reason
    assert [(f.region_id, f.error_class) for f in aborted[0].failures] == [(0, "InjectedFault")]
    assert 3 not in {t.checkpoint_id for t in timeline if t.kind is not CheckpointKind.ABORTED}

    rows = assert_sink_equals_source(spark, config.sink.path, input_dir)
    assert 3 not in {r.epoch for r in rows}  # nothing of the aborted epoch reached the sink


# --------------------------------------------------------------------------- two runs at once


def test_a_second_run_is_refused_by_the_lease_naming_the_holder_and_writes_nothing(
    spark: Any, tmp_path: Path
) -> None:
    config, _input_dir, _ = _setup(tmp_path, "leased", lines=30)
    with leased_pipeline(config, spark, metrics=False) as first:
        first.open()
        assert first.run_epoch().kind is CheckpointKind.GLOBAL
        # refused on taking the lease, before its pipeline is assembled
        with pytest.raises(LeaseHeldError) as refused, leased_pipeline(config, spark, metrics=False):
            pytest.fail("a second run got the lease while the first held it")
        message = str(refused.value)
        assert "[LEASE_HELD]" in message and f"pid {os.getpid()}" in message and "is driven by" in message
        assert first.store.latest_plan_epoch() == 1 and first.store.checkpoint_ids() == [1]  # nothing written
        assert first.run_epoch().epoch == 2  # the holder goes on
    with leased_pipeline(config, spark, metrics=False) as third:  # released: the next run takes it at once
        assert third.open().restored_from == 2


def test_second_run_between_epochs_stops_the_first_with_concurrent_run_error(
    spark: Any, tmp_path: Path
) -> None:
    """The fence, not the lease, is what keeps exactly-once (protocol rule 5.6): with the lease out
    of the way (as after a takeover of an expired one), two runs still never both commit."""
    config, input_dir, _ = _setup(tmp_path, "twice", lines=60)
    first = Pipeline(config, spark)  # no lease: a Pipeline never takes one itself
    second = Pipeline(config, spark)
    try:
        first.open()
        assert first.run_epoch().kind is CheckpointKind.GLOBAL  # epoch 1
        assert second.open().restored_from == 1
        assert second.run_epoch().kind is CheckpointKind.GLOBAL  # epoch 2, by the second run

        with pytest.raises(ConcurrentRunError) as caught:  # the first run, between its epochs
            first.run_epoch()
        assert ONLY_ONE_RUN in str(caught.value)
        assert second.sink.committed_epoch() == 2
        assert second.store.checkpoint_ids()[-1] == 2
        assert second.store.latest_plan_epoch() == 2  # the first run did not even plan

        # A third run planned the next epoch and is reading it: the second run may not plan it again.
        third = Pipeline(config, spark)
        third.open()
        third.store.write_plan(3, {r: [] for r in range(config.parallelism)})
        with pytest.raises(ConcurrentRunError) as caught:
            second.run_epoch()
        assert ONLY_ONE_RUN in str(caught.value)
        assert second.sink.committed_epoch() == 2
    finally:
        first.close()
        second.close()

    rows = sink_rows(config.sink.path)
    assert len({(r.split_id, r.offset) for r in rows}) == len(rows)  # no duplicates so far
    summary = _run(config, spark)  # a fresh run
    assert summary.finished and summary.epochs[0].epoch == 4  # epoch ids never reuse a planned one
    assert_sink_equals_source(spark, config.sink.path, input_dir)


# --------------------------------------------------------------------------- rescale


def test_recover_rescales_three_to_two_to_four_keeping_loads_within_one(spark: Any, tmp_path: Path) -> None:
    config, input_dir, config_path = _setup(tmp_path, "rescale", files=6, lines=50, epoch_records=60)
    cfg = ["--config", str(config_path)]

    code, out, err = run_cli(["run", *cfg, "--epochs", "1", "--json"])
    assert code == 0, err
    assert json.loads(out)["checkpoints"] == {"global": 1, "regional": 0, "aborted": 0}
    store = _store(config, spark)
    assert _loads(store.latest_checkpoint()) == {0: 2, 1: 2, 2: 2}

    for old, new, restored in ((3, 2, 1), (2, 4, 2)):
        code, out, err = run_cli(
            ["recover", *cfg, "--checkpoint", "latest", "--parallelism", str(new), "--json"]
        )
        assert code == 0, err
        report = json.loads(out)
        assert report["restored_from"] == restored
        assert (report["previous_parallelism"], report["parallelism"]) == (old, new)
        assert report["decisions"].get("redistributed_global_restore", 0) == 6  # every live split
        assert set(report["loads"]) == {str(r) for r in range(new)}
        assert max(report["loads"].values()) - min(report["loads"].values()) <= 1
        assert report["checkpoints"]["global"] == 1
        latest = store.latest_checkpoint()
        assert latest is not None and latest.checkpoint_id == restored + 1
        assert latest.parallelism == new
        loads = _loads(latest)
        assert max(loads.values()) - min(loads.values()) <= 1, loads

    code, out, err = run_cli(["run", *cfg, "--json"])
    assert code == 0, err
    assert json.loads(out)["finished"] is True
    rows = assert_sink_equals_source(spark, config.sink.path, input_dir)
    assert {r.region for r in rows if r.epoch == 3} <= {0, 1, 2, 3}
    assert {r.region for r in rows if r.epoch == 3} - {0, 1} != set()  # regions 2, 3 exist only at P=4
    # The explicit rescale stays: the config still says 3, as when the checkpoints were taken.
    assert {c.parallelism for c in map(store.load_checkpoint, store.checkpoint_ids()[-2:])} == {4}
    assert store.configured_parallelism(store.latest_checkpoint().checkpoint_id) == 3

    # Editing the config's parallelism is a rescale request that the next run follows.
    mapping = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    write_config(config_path, {**mapping, "parallelism": 2})
    write_input(input_dir, files=1, lines=30, first_file=6)
    code, out, err = run_cli(["run", *cfg, "--json"])
    assert code == 0, err
    latest = store.latest_checkpoint()
    assert latest.parallelism == 2 and store.configured_parallelism(latest.checkpoint_id) == 2
    assert_sink_equals_source(spark, config.sink.path, input_dir)
