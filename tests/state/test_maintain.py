"""``splitkeeper maintain``: compaction and VACUUM that never take what a kept chain or a pending epoch needs.

The real driver, store and sink run a files pipeline without Spark (``LocalPipeline``): a
regional checkpoint whose failed region refers to the checkpoint before it (a ref chain that
retention must keep), then a driver that dies after the decision record of the next epoch
and before its sink commit (an epoch not committed yet: its decision row and staged files
must survive). ``maintain`` with a zero-hour history window then compacts and vacuums; the
checkpoints still load as they were, the pending epoch's files are there, and the pipeline
finishes with every record exactly once.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from splitkeeper.app import services
from splitkeeper.cli import main
from splitkeeper.config.settings import load_config
from splitkeeper.core.ports import CrashPoint, EpochPlan, RegionRun, SinkCrashPoint
from splitkeeper.core.types import CheckpointKind, RegionOutcome
from splitkeeper.delta.lease import LeaseHeldError, PipelineLease
from splitkeeper.delta.retention import retention_hours
from splitkeeper.errors import InvalidParameterError
from splitkeeper.spark.faults import CRASH_ENV
from tests.runtime.helpers import splitkeeper_subprocess

from .samples import Crash, CrashAt, LocalPipeline, LocalRegionRunner, assert_sink_is_input, tree


class _FailingRegion(LocalRegionRunner):
    """Region 1 declines epoch 3 (a regional checkpoint whose region 1 refers to checkpoint 2)."""

    def run(self, epoch: int, plan: EpochPlan, timeout_s: float) -> Mapping[int, RegionRun]:
        runs = dict(super().run(epoch, plan, timeout_s))
        if epoch == 3:
            runs[1] = RegionRun(1, RegionOutcome.DECLINE, error="injected")
        return runs


def _config(pipeline: LocalPipeline) -> Path:
    path = pipeline.root / "pipeline.yaml"
    mapping = {
        "name": pipeline.name,
        "parallelism": pipeline.parallelism,
        "source": {"kind": "files", "path": str(pipeline.root / "in"), "format": "lines"},
        "state": {"path": pipeline.state},
        "sink": {"path": pipeline.sink_path},
        "staging": {"path": pipeline.staging},
        "maintenance": {"history_hours": 0},
    }
    path.write_text(yaml.safe_dump(mapping), encoding="utf-8")
    return path


def test_maintain_removes_old_files_but_never_what_a_kept_chain_or_a_pending_epoch_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = LocalPipeline(tmp_path, retain=1)
    pipeline.write_input(files=2, lines=60)
    config_path = _config(pipeline)
    driver = pipeline.driver()
    driver.runner = _FailingRegion(driver.source, pipeline.staging)
    driver.open()
    kinds = [driver.run_epoch().kind for _ in range(4)]
    assert kinds[2] is CheckpointKind.REGIONAL
    store = driver.state
    kept = store.checkpoint_ids()
    latest = store.latest_checkpoint()
    assert latest is not None and kept[-1] == 4
    chain = {cid: store.load_checkpoint(cid) for cid in kept}
    driver.hooks = CrashAt(CrashPoint.AFTER_DECISION, 5)
    with pytest.raises(Crash):
        driver.run_epoch()  # epoch 5's decision is written; its sink commit never happened
    staged = sorted(p for p in (tmp_path / "state" / "_staging").rglob("*.parquet"))
    assert staged and all("epoch=5" in str(p) for p in staged)

    before = tree(tmp_path)
    dry = services.maintain(load_config(config_path), dry_run=True)
    assert dry.dry_run and dry.vacuumed_count > 0  # retention's deletes left files to vacuum
    assert tree(tmp_path) == before  # a dry run changes nothing, _delta_log included

    assert main(["maintain", "--config", str(config_path)]) == 0
    out = capsys.readouterr().out
    removed = [line for line in out.splitlines() if line.startswith("removed ")]
    assert removed and out.strip().splitlines()[-1].endswith(f"removed {len(removed)} file(s) older than 0 h")
    for line in removed:  # what it says it removed is gone
        table, _, path = line.removeprefix("removed ").partition(": ")
        folder = tmp_path / ("sink" if table == "sink" else f"state/{table}")
        assert not (folder / path).exists(), line

    assert all(p.exists() for p in staged)  # the pending epoch's staged files are untouched
    reopened = pipeline.driver()
    assert reopened.state.checkpoint_ids() == kept
    assert {
        cid: reopened.state.load_checkpoint(cid) for cid in kept
    } == chain  # the kept chain reads the same
    assert reopened.state.latest_plan_epoch() == 5
    assert reopened.open().restored_from == 4
    summary = reopened.run()
    assert summary.finished and summary.epochs[0].epoch == 6
    rows = DeltaTable(pipeline.sink_path).to_pyarrow_table(columns=["split_id", "offset"]).to_pylist()
    keys = [(r["split_id"], r["offset"]) for r in rows]
    assert len(keys) == len(set(keys)) == 120  # every line once, none twice
    assert {sid for sid, _ in keys} == {"part-0.txt", "part-1.txt"}


def test_maintain_killed_mid_compaction_leaves_state_that_loads_and_finishes_exactly(tmp_path: Path) -> None:
    pipeline = LocalPipeline(tmp_path, retain=1)
    pipeline.write_input(files=2, lines=50)  # 100 records, 20 per epoch
    config_path = _config(pipeline)
    driver = pipeline.run(epochs=3)
    kept = driver.state.checkpoint_ids()
    chain = {cid: driver.state.load_checkpoint(cid) for cid in kept}
    state_rows = DeltaTable(f"{pipeline.state}/enumerator_state").to_pyarrow_table(columns=["checkpoint_id"])
    assert set(state_rows.column(0).to_pylist()) - set(kept)  # rows of deleted checkpoints to compact

    killed = splitkeeper_subprocess(
        ["maintain", "--config", str(config_path)], **{CRASH_ENV: "mid_compaction"}
    )

    assert killed.returncode == -9, killed.stderr[-3000:]
    assert f"crash injected at mid_compaction of epoch {kept[-1]}" in killed.stderr
    state_rows = DeltaTable(f"{pipeline.state}/enumerator_state").to_pyarrow_table(columns=["checkpoint_id"])
    assert set(state_rows.column(0).to_pylist()) <= set(kept)  # the rows were deleted, then the kill
    reopened = pipeline.driver()
    assert {cid: reopened.state.load_checkpoint(cid) for cid in kept} == chain
    again = services.maintain(load_config(config_path))  # the dead holder's lease is taken over
    assert not again.dry_run and sum(again.compacted_files.values()) > 0  # the bin-packing it missed
    assert {cid: pipeline.driver().state.load_checkpoint(cid) for cid in kept} == chain
    finished = pipeline.run()
    assert finished.state.checkpoint_ids()[-1] > kept[-1]
    assert_sink_is_input(pipeline)


def _age(path: Path, hours: float) -> None:
    then = time.time() - hours * 3600
    os.utime(path, (then, then))


def test_maintain_removes_old_untracked_sink_and_staged_files_but_never_young_or_pending_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = LocalPipeline(tmp_path)
    pipeline.write_input(files=2, lines=50)  # 100 records, 20 per epoch
    config_path = _config(pipeline)  # maintenance.untracked_hours: the default, 24
    pipeline.run(epochs=1)

    def die_after_move(point: SinkCrashPoint, epoch: int) -> None:
        if point is SinkCrashPoint.AFTER_FILES_MOVED:
            raise Crash(f"{point.value}@{epoch}")

    crashed = pipeline.driver(sink_point=die_after_move)
    crashed.open()
    with pytest.raises(Crash):
        crashed.run_epoch()  # epoch 2's files are in the sink's folder, in no commit
    moved = sorted(Path(pipeline.sink_path).glob("sk-e0000000002-*.parquet"))
    assert len(moved) == 2 and not {p.name for p in moved} & _tracked(pipeline)
    pending = pipeline.driver(CrashAt(CrashPoint.AFTER_DECISION, 3))
    pending.open()
    with pytest.raises(Crash):
        pending.run_epoch()  # epoch 3 decided, not committed: its staged files may still be committed
    pending_files = sorted((Path(pipeline.staging) / "epoch=3").rglob("*.parquet"))
    late = Path(pipeline.staging) / "epoch=1" / "region=0" / "attempt=late" / "part.parquet"
    late.parent.mkdir(parents=True)  # a task of committed epoch 1 that finished after its epoch
    late.write_bytes(moved[0].read_bytes())
    for old in (moved[0], late, *pending_files):
        _age(old, 48)
    sizes = {moved[0].name: moved[0].stat().st_size, str(late): late.stat().st_size}

    before = tree(tmp_path)
    dry = services.maintain(load_config(config_path), dry_run=True)
    assert dry.untracked == {"sink": (moved[0].name,), "staging": (str(late),)}
    assert tree(tmp_path) == before  # a dry run changes nothing

    assert main(["maintain", "--config", str(config_path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["untracked"] == {"sink": [moved[0].name], "staging": [str(late)]}
    assert result["untracked_count"] == 2 and result["untracked_bytes"] == sum(sizes.values())
    assert result["untracked_hours"] == 24
    assert not moved[0].exists() and not late.exists()  # old and named by no version: gone
    assert moved[1].exists()  # younger than the window: a commit may be moving its files in right now
    assert pending_files and all(p.exists() for p in pending_files)  # a pending epoch's: never
    main(["maintain", "--config", str(config_path)])
    out = capsys.readouterr().out
    assert "removed 0 untracked file(s), 0 bytes, that no Delta version names, older than 24 h" in out
    pipeline.run()
    assert_sink_is_input(pipeline)  # nothing a version names was removed


def _tracked(pipeline: LocalPipeline) -> set[str]:
    return {Path(uri).name for uri in DeltaTable(pipeline.sink_path).file_uris()}


def test_maintain_holds_the_lease_and_is_refused_while_another_run_holds_it(tmp_path: Path) -> None:
    pipeline = LocalPipeline(tmp_path)
    pipeline.write_input(files=1, lines=10)
    config = load_config(_config(pipeline))
    driver = pipeline.driver()
    driver.open()
    driver.run_epoch()
    lease = PipelineLease(driver.state.tables, pipeline.name)
    lease.take(ttl_s=60)
    try:
        with pytest.raises(LeaseHeldError, match="is driven by"):
            services.maintain(config)
    finally:
        lease.release()
    assert not services.maintain(config).dry_run


@pytest.mark.parametrize(("window", "kept"), [(0, 0), (0.5, 1), (1, 1), (1.01, 2), (168, 168)])
def test_a_fractional_history_window_rounds_up_so_vacuum_never_keeps_less(window: float, kept: int) -> None:
    assert retention_hours(window) == kept


@pytest.mark.parametrize("window", [-1, -0.5, float("nan")])
def test_a_negative_or_nan_history_window_is_refused_naming_the_key(window: float) -> None:
    with pytest.raises(InvalidParameterError) as err:
        retention_hours(window)
    assert "history_hours" in str(err.value) and "hours >= 0" in str(err.value)
