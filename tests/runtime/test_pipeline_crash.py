"""Driver crashes at each of protocol rule 5.5's crash points: SIGKILL, then recovery, then sink == source.

For every crash point (and the sink's ``after_files_moved``), ``splitkeeper run`` runs in a
child process (its own driver and JVM) with ``SPLITKEEPER_CRASH_AT=<point>@2`` and must die by
SIGKILL in epoch 2. What the crash left behind is checked (plan, sink commit,
checkpoint row), then the pipeline is run again to completion in this process
(so the :class:`~splitkeeper.app.pipeline.OpenReport` of the recovery is
observable) and the sink must equal the source exactly.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from splitkeeper.app import services
from splitkeeper.app.pipeline import Pipeline
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.core.ports import SinkCrashPoint
from splitkeeper.core.types import CheckpointKind
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.sinks.delta.sink import DeltaSink
from splitkeeper.sources import build_source
from splitkeeper.spark.faults import CRASH_ENV, CrashPoint
from tests.state.samples import tree

from .helpers import (
    assert_sink_equals_source,
    pipeline_mapping,
    run_cli,
    run_killed_at,
    write_config,
    write_input,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CRASH_EPOCH = 2

# point -> (sink txnVersion after the crash, latest checkpoint row after the crash, redone on open)
AFTER_CRASH = {
    CrashPoint.AFTER_PLAN: (1, 1, None),
    CrashPoint.AFTER_DECISION: (1, 1, None),
    CrashPoint.AFTER_SINK_COMMIT: (2, 1, 2),
    CrashPoint.BEFORE_CHECKPOINT_ROW: (2, 1, 2),
    CrashPoint.AFTER_CHECKPOINT_ROW: (2, 2, None),
    CrashPoint.DURING_RETENTION: (2, 2, None),
    SinkCrashPoint.AFTER_FILES_MOVED: (1, 1, None),
}


def _sink_parquet(sink_path: str, epoch: int) -> set[str]:
    """The parquet files of ``epoch`` in the sink's folder, tracked by the log or not."""
    return {p.name for p in Path(sink_path).glob(f"sk-e{epoch:010d}-*.parquet")}


#: every point with a job per epoch (issue 39) and with long-lived readers (issue 41): the killed
#: driver's reader job dies with its JVM wherever the driver stood
CASES = [
    pytest.param(p, readers, id=p.value if readers == "per_epoch" else f"{p.value}-long_lived")
    for readers in ("per_epoch", "long_lived")
    for p in AFTER_CRASH
]


@pytest.mark.parametrize(("point", "readers"), CASES)
def test_driver_killed_at_crash_point_recovers_to_sink_equals_source(
    point: CrashPoint | SinkCrashPoint,
    readers: str,
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CRASH_ENV, raising=False)
    input_dir = tmp_path / "in"
    write_input(input_dir, files=3, lines=60)  # 3 epochs of 60: epoch 3 is left after the crash in 2
    # no region is slowed here: a generous timeout keeps a loaded host's slow start (long-lived reader
    # slots took 44-56 s to say hello at load 25) from aborting epoch 1 or 2, where the crash is due
    mapping = pipeline_mapping(
        tmp_path,
        f"crash-{point.value}".replace("_", "-"),
        input_dir,
        epoch_records=60,
        retain_checkpoints=1,
        region_timeout_s=90,
    )
    # retain 1 and full snapshots only (no delta against checkpoint 1 keeps it): epoch 2's retention
    # archives, then deletes checkpoint 1
    mapping["checkpoint"]["full_snapshot_every"] = 1
    mapping["readers"] = readers  # long_lived: the killed driver's reader job dies with its JVM
    config_path = write_config(tmp_path / "pipeline.yaml", mapping)
    config = config_from_mapping(mapping)

    crashed = run_killed_at(config_path, point.value, CRASH_EPOCH)
    assert "epoch    1 global" in crashed.stderr  # epoch 1 completed before the crash

    sink_version, latest_row, redone = AFTER_CRASH[point]
    store = DeltaStateStore(
        config.state.path, config.name, build_source(config.source).fingerprint(), read_only=True
    )
    assert DeltaSink(config.sink.path, config.name, read_only=True).committed_epoch() == sink_version
    assert store.checkpoint_ids()[-1] == latest_row
    assert store.latest_plan_epoch() == CRASH_EPOCH
    if point is CrashPoint.BEFORE_CHECKPOINT_ROW:  # killed between the state rows and the checkpoints row
        state_rows = spark.read.format("delta").load(store.table_path("enumerator_state"))
        assert state_rows.where(f"checkpoint_id = {CRASH_EPOCH}").count() > 0
    if point is CrashPoint.DURING_RETENTION:  # checkpoint 1 archived to the log, its row not deleted yet
        assert store.checkpoint_ids() == [1, 2]
        assert 1 in store.tables.read("checkpoint_log").column("checkpoint_id").to_pylist()
        assert [e.checkpoint_id for e in store.history.timeline()].count(1) == 1  # shown once
    moved = _sink_parquet(config.sink.path, CRASH_EPOCH)
    tracked = {Path(f).name for f in DeltaTable(config.sink.path).file_uris()}
    if point is SinkCrashPoint.AFTER_FILES_MOVED:  # epoch 2's files in the sink's folder, in no commit
        assert moved and not moved & tracked

    if redone is not None:  # a redo is pending: a dry-run recovery (with a rescale) must write nothing
        before = tree(tmp_path)
        dry = services.recover(config, dry_run=True, parallelism=3)
        assert dry.dry_run and dry.opened.redone_checkpoint == redone
        assert tree(tmp_path) == before  # state, sink and staging byte for byte, _delta_log included
        # the redo record is in Delta: losing the local staging folder (another machine, a cleaned
        # disk) must not keep the pipeline from opening
        shutil.rmtree(Path(config.staging.path), ignore_errors=True)

    pipeline = Pipeline(config, spark)
    try:
        opened = pipeline.open()
        restored = CRASH_EPOCH if redone or latest_row == CRASH_EPOCH else 1
        assert opened.redone_checkpoint == redone
        assert opened.restored_from == restored
        assert store.checkpoint_ids()[-1] == restored
        if redone is not None:  # the decision record was committed as checkpoint 2, staging cleaned up
            assert not (Path(config.staging.path) / f"epoch={CRASH_EPOCH}").exists()
        summary = pipeline.run()
    finally:
        pipeline.close()
    assert summary.finished and summary.epochs[-1].kind is CheckpointKind.GLOBAL
    assert summary.epochs[0].epoch == CRASH_EPOCH + 1  # an abandoned plan's id is never reused
    rows = assert_sink_equals_source(spark, config.sink.path, input_dir)
    assert (CRASH_EPOCH in {r.epoch for r in rows}) == (sink_version == CRASH_EPOCH)
    if point is CrashPoint.DURING_RETENTION:  # the next retention finished what the crash left
        assert 1 not in store.checkpoint_ids()
        assert [e.checkpoint_id for e in store.history.timeline()].count(1) == 1
    assert sorted(p.name for p in Path(config.staging.path).glob("epoch=*")) == []  # no crash leftovers


def test_misspelt_crash_point_is_refused_before_anything_is_written(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    input_dir = tmp_path / "in"
    write_input(input_dir, files=1, lines=5)
    config_path = write_config(tmp_path / "p.yaml", pipeline_mapping(tmp_path, "typo", input_dir))
    monkeypatch.setenv(CRASH_ENV, "after_sink@2")

    code, _out, err = run_cli(["run", "--config", str(config_path)])

    assert code == 2
    assert "SPLITKEEPER_CRASH_AT='after_sink@2' is not allowed" in err
    assert "after_sink_commit" in err
    assert not (tmp_path / "state").exists() and not (tmp_path / "sink").exists()
