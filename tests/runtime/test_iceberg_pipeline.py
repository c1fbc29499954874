"""Pipelines into an Iceberg sink (``sink.kind: iceberg``) on the real runtime: files source, Spark
region tasks, the Delta state, and each catalog (``iceberg_catalog``): the embedded SQL catalog on
SQLite, and ``sink.catalog`` naming Iceberg's REST catalog test server. The table is read back with
pyiceberg (``scan().to_arrow()``) and compared with the files by content; the restart checks
(GX, protocol section 6) run on it; the rewind restores it; a driver killed between the Iceberg
commit and the checkpoint row is redone without a duplicate."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.app import incident, services
from splitkeeper.config.settings import PipelineConfig, config_from_mapping
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.spark.faults import CRASH_ENV, CrashPoint

from .helpers import iceberg_table, pipeline_mapping, run_killed_at, source_records, write_config, write_input

pytestmark = [pytest.mark.spark]


def _iceberg(
    tmp_path: Path, name: str, input_dir: Path, catalog: dict[str, str] | None, **options: Any
) -> dict[str, Any]:
    mapping = pipeline_mapping(tmp_path, name, input_dir, **options)
    mapping["sink"] = {"kind": "iceberg", "table": "ingest.lines", "warehouse": str(tmp_path / "warehouse")}
    if catalog is not None:
        mapping["sink"]["catalog"] = catalog
    return mapping


def _table_rows(config: PipelineConfig) -> list[tuple[str, int, int, bytes]]:
    """The Iceberg table as pyiceberg reads it, on its own catalog object (not the sink's)."""
    data = iceberg_table(config).scan().to_arrow()
    return [
        (r["split_id"], r["offset"], r["next_offset"], r["value"])
        for r in data.select(["split_id", "offset", "next_offset", "value"]).to_pylist()
    ]


def _assert_table_equals_source(config: PipelineConfig, input_dir: Path) -> None:
    rows = _table_rows(config)
    twice = [k for k, n in Counter((r[0], r[1]) for r in rows).items() if n > 1]
    assert not twice, f"records in the Iceberg table more than once: {twice[:5]}"
    want = sorted((sid, o, n, v) for sid, recs in source_records(input_dir).items() for o, n, v in recs)
    assert sorted(rows) == want


def test_files_into_an_iceberg_table_equal_the_source_and_pass_the_restart_checks(
    spark: Any, tmp_path: Path, iceberg_catalog: dict[str, str] | None
) -> None:
    input_dir = tmp_path / "in"
    write_input(input_dir, files=2, lines=20)
    config = config_from_mapping(
        _iceberg(tmp_path, "ice", input_dir, iceberg_catalog, parallelism=2, epoch_records=40)
    )
    first = services.run(config)
    assert first.committed_records == 40
    _assert_table_equals_source(config, input_dir)
    result = services.validate(config, content=True)  # the GX restart checks, read through the port
    assert result.success and result.suites, result
    page = services.report(config).read_text(encoding="utf-8")
    # embedded: <warehouse>/ingest.db/lines; REST: iceberg://rest/ingest.lines
    assert config.sink.path in page
    status = services.status(config)
    assert status.latest_checkpoint is not None and status.latest_checkpoint.id == first.epochs[-1].epoch


@pytest.mark.slow
def test_an_iceberg_pipeline_proves_its_restores_rewinds_and_reads_on_exactly_once(
    spark: Any, tmp_path: Path, iceberg_catalog: dict[str, str] | None
) -> None:
    input_dir = tmp_path / "in"
    write_input(input_dir, files=2, lines=30)
    config = config_from_mapping(
        _iceberg(tmp_path, "ice", input_dir, iceberg_catalog, parallelism=2, epoch_records=40)
    )
    first = services.run(config)
    latest = first.epochs[-1].epoch
    at_first = sorted(_table_rows(config))

    # new files, a region declining once: the next run restores, falls back, proves each restore
    write_input(input_dir, files=2, lines=30, first_file=2)
    second = services.run(config, faults=[f"fail:1@{latest + 1}"])
    assert second.restart_checks and all(line.endswith("passed") for line in second.restart_checks)
    _assert_table_equals_source(config, input_dir)

    # maintain keeps the state and leaves the table to the Iceberg tools; the rewind still restores
    kept = services.maintain(config, history_hours=0)
    assert kept.compacted_files["sink"] == 0 and kept.vacuumed["sink"] == ()
    # rewind to the first run's checkpoint: the table holds exactly the first run's records again
    done = incident.rewind(config, latest, yes=True, reason="test")
    assert done.applied
    assert sorted(_table_rows(config)) == at_first
    again = services.run(config)  # reads the second run's files again: once
    assert again.finished
    _assert_table_equals_source(config, input_dir)
    assert services.validate(config, content=True).success


@pytest.mark.slow
def test_a_driver_killed_after_the_iceberg_commit_is_redone_without_a_duplicate(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, iceberg_catalog: dict[str, str] | None
) -> None:
    monkeypatch.delenv(CRASH_ENV, raising=False)
    input_dir = tmp_path / "in"
    write_input(input_dir, files=3, lines=60)
    mapping = _iceberg(
        tmp_path, "ice-crash", input_dir, iceberg_catalog, epoch_records=60, region_timeout_s=60
    )
    config_path = write_config(tmp_path / "pipeline.yaml", mapping)
    config: PipelineConfig = config_from_mapping(mapping)

    run_killed_at(config_path, CrashPoint.AFTER_SINK_COMMIT.value, 2)
    from splitkeeper.app.sink import sink_reader

    assert sink_reader(config).committed_epoch() == 2  # the Iceberg snapshot of epoch 2 landed...
    store = DeltaStateStore(config.state.path, config.name, None, read_only=True)
    assert 2 not in store.checkpoint_ids()  # ...its checkpoint row did not

    summary = services.run(config)
    assert summary.finished
    assert store.checkpoint_ids()[-1] >= 2  # epoch 2's decision redone on open, then the rest read
    _assert_table_equals_source(config, input_dir)
