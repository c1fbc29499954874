"""Files pipelines of keyed change records (inserts, updates, deletes by ``op = 'd'``) into an Iceberg
sink in ``sink.mode: upsert`` on the real runtime: Spark region tasks, the embedded SQL catalog on
SQLite, the Delta state. The keyed table is read back with pyiceberg and compared by content with
the generator's own fold of the lines; the change table holds every line once; the GX restart
checks (the upsert fold suite on Spark included) pass; a driver SIGKILLed after the keyed table's
commit (before the change table's, and before the checkpoint row) is redone without applying an
epoch twice."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.app import incident, services
from splitkeeper.app.sink import sink_reader
from splitkeeper.config.settings import PipelineConfig, config_from_mapping
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.errors import ConfigError
from splitkeeper.spark.faults import CRASH_ENV

from .helpers import pipeline_mapping, run_killed_at, write_config

pytestmark = [pytest.mark.spark]


def _write_cdc(input_dir: Path, files: int = 2, lines: int = 36) -> dict[tuple[str, int], dict[str, Any]]:
    """CDC lines ``{id, name, op}`` over 12 ids per file (ids are updated, deleted, re-inserted): the
    oracle (file, offset) -> the record."""
    input_dir.mkdir(parents=True, exist_ok=True)
    oracle: dict[tuple[str, int], dict[str, Any]] = {}
    for f in range(files):
        name = f"cdc-{f:03d}.jsonl"
        data = b""
        for i in range(lines):
            op = "d" if i % 5 == 4 else ("c" if i < 12 else "u")
            record = {"id": f * 100 + i % 12, "name": f"v{f}-{i}", "op": op}
            oracle[(name, len(data))] = record
            data += json.dumps(record).encode() + b"\n"
        (input_dir / name).write_bytes(data)
    return oracle


def _generator_fold(oracle: dict[tuple[str, int], dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What the keyed table must hold: per id its last line (each id lives in one file), unless a delete."""
    latest: dict[int, dict[str, Any]] = {}
    for (_name, _offset), record in sorted(oracle.items()):
        latest[record["id"]] = record
    return sorted((r["id"], r["name"], r["op"]) for r in latest.values() if r["op"] != "d")


def _config(tmp_path: Path, name: str) -> tuple[dict[tuple[str, int], dict[str, Any]], Path, PipelineConfig]:
    input_dir = tmp_path / "in"
    oracle = _write_cdc(input_dir)
    mapping = pipeline_mapping(
        tmp_path, name, input_dir, parallelism=2, epoch_records=24, region_timeout_s=60
    )
    mapping["decode"] = {"kind": "json", "schema": "id BIGINT, name STRING, op STRING"}
    mapping["sink"] = {
        "kind": "iceberg",
        "table": "ingest.people",
        "warehouse": str(tmp_path / "warehouse"),
        "mode": "upsert",
        "key": ["id"],
        "delete_when": "op = 'd'",
    }
    path = write_config(tmp_path / "pipeline.yaml", mapping)
    return oracle, path, config_from_mapping(mapping)


def _table(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    """An Iceberg table as pyiceberg reads it, on its own catalog object (not the sink's)."""
    from pyiceberg.catalog import load_catalog

    warehouse = tmp_path / "warehouse"
    catalog = load_catalog(
        "splitkeeper", type="sql", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}"
    )
    return list(catalog.load_table(name).scan().to_arrow().to_pylist())


def _assert_exact(
    tmp_path: Path, config: PipelineConfig, oracle: dict[tuple[str, int], dict[str, Any]]
) -> None:
    """The change table holds every line once, by content; the keyed table is the generator's fold,
    one row per key; the GX restart checks, the upsert fold suite included, pass."""
    changes = _table(tmp_path, "ingest.people_changes")
    places = Counter((Path(r["split_id"]).name, r["offset"]) for r in changes)
    assert [k for k, n in places.items() if n > 1] == []  # no line twice
    assert set(places) == set(oracle)  # none lost
    for r in changes:
        want = oracle[(Path(r["split_id"]).name, r["offset"])]
        assert (r["id"], r["name"], r["op"], r["tombstone"]) == (want["id"], want["name"], want["op"], False)
    keyed = sorted((r["id"], r["name"], r["op"]) for r in _table(tmp_path, "ingest.people"))
    assert keyed == _generator_fold(oracle) and len(keyed) > 0
    result = services.validate(config)
    assert result.success and result.suites.get("upsert_fold") == "passed", result


def test_change_records_into_an_iceberg_upsert_sink_equal_the_generators_fold(
    spark: Any, tmp_path: Path
) -> None:
    oracle, _path, config = _config(tmp_path, "iceup")
    summary = services.run(config)
    assert summary.finished and summary.committed_records == len(oracle)
    assert len(summary.epochs) >= 3  # several epochs: keys updated and deleted across them
    _assert_exact(tmp_path, config, oracle)

    page = services.report(config).read_text(encoding="utf-8")
    assert "warehouse/ingest.db/people" in page and "warehouse/ingest.db/people_changes" in page
    status = services.status(config)
    assert status.latest_checkpoint is not None and status.latest_checkpoint.id == summary.epochs[-1].epoch
    # a rewind of an upsert sink on Iceberg is refused, saying why and what to do instead
    with pytest.raises(ConfigError, match=r"\[CONFIG_ERROR\] recover --rewind .*sink.kind: iceberg"):
        incident.rewind(config, summary.epochs[0].epoch, yes=True, reason="test")
    assert sorted(
        (r["id"], r["name"], r["op"]) for r in _table(tmp_path, "ingest.people")
    ) == _generator_fold(oracle)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after_sink_commit", "before_side_commit"])
def test_a_driver_killed_after_the_keyed_commit_is_redone_without_applying_twice(
    point: str, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CRASH_ENV, raising=False)
    oracle, path, config = _config(tmp_path, f"iceup-{point}".replace("_", "-"))

    run_killed_at(path, point, 2)
    reader = sink_reader(config)
    assert reader.committed_epoch() == 2  # the keyed table's commit of epoch 2 landed...
    store = DeltaStateStore(config.state.path, config.name, None, read_only=True)
    assert 2 not in store.checkpoint_ids()  # ...its checkpoint row did not
    changed = len(_table(tmp_path, "ingest.people_changes"))
    if point == "before_side_commit":  # and the change table does not have epoch 2 yet
        assert {r["epoch"] for r in _table(tmp_path, "ingest.people_changes")} == {1}

    summary = services.run(config)
    assert summary.finished
    assert store.checkpoint_ids()[-1] >= 2  # epoch 2's decision redone on open, then the rest read
    assert len(_table(tmp_path, "ingest.people_changes")) >= changed
    _assert_exact(tmp_path, config, oracle)
