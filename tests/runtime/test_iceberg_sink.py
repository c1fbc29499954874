"""The ``iceberg`` sink kind at its port, without Spark: the fenced epoch commit on a real SQL
catalog on SQLite (pyiceberg) and on Iceberg's REST catalog test server (``iceberg_catalog``), its
replay, a rival writer, the rewind, the reader, bad config.

The staged files are what a region task writes (the staging layout of :mod:`splitkeeper.staging`);
everything is read back from the Iceberg table with pyiceberg and compared by content."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from splitkeeper.app.sink import config_sink, sink_reader
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.core.ports import RegionRun
from splitkeeper.core.types import RegionOutcome
from splitkeeper.delta.schemas import STAGED_FILE_SCHEMA
from splitkeeper.errors import ConcurrentRunError, ConfigError, StateError
from splitkeeper.sinks.iceberg.config import IcebergSink
from splitkeeper.sinks.iceberg.sink import IcebergEpochSink
from splitkeeper.sinks.port import SinkTable, SupportsRewind
from splitkeeper.staging import PART_FILE, StagedRegion, attempt_dir

from .helpers import iceberg_table


def _mapping(root: Path, **sink: Any) -> dict[str, Any]:
    (root / "in").mkdir(exist_ok=True)
    return {
        "name": "ice",
        "source": {"kind": "files", "path": str(root / "in"), "format": "lines"},
        "state": {"path": str(root / "state")},
        "sink": {"kind": "iceberg", "table": "ingest.events", **sink},
    }


def _stage(root: Path, epoch: int, region: int, split: str, offsets: range) -> RegionRun:
    """A region task's staged output: the sink's columns, one record per offset of ``split``."""
    attempt = f"a{epoch}r{region}"
    folder = Path(attempt_dir(str(root / "staging"), epoch, region, attempt))
    folder.mkdir(parents=True)
    n = len(offsets)
    columns = {
        "split_id": [split] * n,
        "offset": list(offsets),
        "next_offset": [o + 1 for o in offsets],
        "value": [f"{split}:{o}".encode() for o in offsets],
        "epoch": [epoch] * n,
        "region": [region] * n,
        "ingested_at": [pa.scalar(0, pa.timestamp("us", "UTC")).as_py()] * n,
    }
    table = pa.table(
        {f.name: pa.array(columns.get(f.name, [None] * n), f.type) for f in STAGED_FILE_SCHEMA},
        schema=STAGED_FILE_SCHEMA,
    )
    pq.write_table(table, folder / PART_FILE)
    staged = StagedRegion(str(root / "staging"), epoch, region, attempt)
    return RegionRun(region, RegionOutcome.ACK, records=n, output=staged)


def _content(reader: Any) -> list[tuple[str, int, bytes, int]]:
    rows = reader.rows(SinkTable.RECORDS, ["split_id", "offset", "value", "epoch"]).to_pylist()
    return sorted((r["split_id"], r["offset"], r["value"], r["epoch"]) for r in rows)


def test_epochs_commit_once_replay_and_a_rival_is_fenced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, iceberg_catalog: dict[str, str] | None
) -> None:
    """Through either catalog: the REST catalog's compare-and-swap (its server checks the commit's
    requirements on the table it holds) refuses the rival as the SQL catalog's does."""
    sink_catalog = {} if iceberg_catalog is None else {"catalog": iceberg_catalog}
    config = config_from_mapping(_mapping(tmp_path, **sink_catalog), base_dir=tmp_path)
    sink = config_sink(config)
    assert sink.committed_epoch() is None
    one = [_stage(tmp_path, 1, 0, "a", range(0, 5)), _stage(tmp_path, 1, 1, "b", range(0, 3))]
    receipt = sink.commit(1, one, expected=None, attempt_id="x1")
    assert (receipt.records, receipt.replayed) == (8, False)
    assert sink.committed_epoch() == 1

    # a commit redone after a crash (same epoch, same attempt) finds its snapshot: nothing appended
    again = config_sink(config).commit(1, one, expected=None, attempt_id="x1")
    assert again.replayed and again.records == 8
    # an empty epoch is recorded too
    assert sink.commit(2, [], expected=1, attempt_id="x2").records == 0
    assert sink.committed_epoch() == 2

    # a rival with a stale view: the recorded epoch is not what it expects
    with pytest.raises(ConcurrentRunError, match="records epoch 2 but this run expected 1"):
        config_sink(config).commit(2, [], expected=1, attempt_id="other")
    # two writers that both passed the check: the catalog's compare-and-swap refuses the later
    first, second = config_sink(config), config_sink(config)
    assert isinstance(second, IcebergEpochSink)
    three = [_stage(tmp_path, 3, 0, "a", range(5, 7))]
    stale = second._writable()  # read before the first commits
    first.commit(3, three, expected=2, attempt_id="x3")
    monkeypatch.setattr(second, "_get", lambda: stale)  # its view stays the one it read
    with pytest.raises(ConcurrentRunError, match="records epoch 3 but this run expected 2") as refused:
        second.commit(3, [_stage(tmp_path, 3, 1, "c", range(0, 9))], expected=2, attempt_id="rival")
    from pyiceberg.exceptions import CommitFailedException

    assert isinstance(refused.value.__context__, CommitFailedException)  # the catalog's refusal (REST: 409)
    snapshot = stale.current_snapshot()  # read again only after the catalog refused its commit
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.additional_properties["splitkeeper.epoch"] == "3"

    # what pyiceberg reads back: every record once, of its epoch
    table = iceberg_table(config)
    epochs = [
        s.summary.additional_properties.get("splitkeeper.epoch") for s in table.snapshots() if s.summary
    ]
    assert epochs == ["1", "2", "3"]  # one snapshot per epoch: the replay and the rival added none
    read = table.scan().to_arrow()
    assert sorted(zip(read["split_id"].to_pylist(), read["offset"].to_pylist(), strict=True)) == sorted(
        [("a", o) for o in range(7)] + [("b", o) for o in range(3)]
    )
    reader = sink_reader(config)
    assert reader.committed_epoch() == 3
    assert [r[3] for r in _content(reader) if r[0] == "a" and r[1] >= 5] == [3, 3]
    assert reader.count(SinkTable.RECORDS, "split_id = 'a'") == 7
    assert reader.rows(SinkTable.RECORDS, ["offset"], epoch=1).num_rows == 8
    assert reader.files(SinkTable.RECORDS) == 2  # one data file per epoch with records
    assert reader.location(SinkTable.DEAD_LETTERS) is None
    commit = sink.committed_metadata(1)
    assert commit is not None and (commit.regions, commit.records, commit.attempt_id) == ((0, 1), 8, "x1")


def test_rewind_restores_the_content_as_of_a_checkpoint_and_records_the_operator_epoch(
    tmp_path: Path,
) -> None:
    config = config_from_mapping(_mapping(tmp_path), base_dir=tmp_path)
    sink = config_sink(config)
    assert isinstance(sink, SupportsRewind)
    sink.commit(1, [_stage(tmp_path, 1, 0, "a", range(0, 4))], expected=None, attempt_id="x1")
    before = _content(sink.reader())
    sink.commit(2, [_stage(tmp_path, 2, 0, "a", range(4, 9))], expected=1, attempt_id="x2")
    sink.commit(3, [_stage(tmp_path, 3, 0, "b", range(0, 2))], expected=2, attempt_id="x3")
    assert sink.rows_from("a", 2) == {"sink": 7}

    (plan,) = sink.rewind_plan(1)
    assert (plan.rows_now, plan.rows_after) == (11, 4) and plan.changes
    action = {"kind": "rewind", "to": 1, "versions": {plan.label: plan.version_after}}
    sink.operator_commit(4, action, expected=3, attempt_id="op4")
    assert _content(sink.reader()) == before
    assert sink.committed_epoch() == 4
    assert sink.operator_commit(4, action, expected=3, attempt_id="op4").replayed  # redone: nothing more

    # a backward reset deletes one split's rows from an offset on, in the operator's snapshot
    sink.operator_commit(5, {"kind": "reset", "split": "a", "from": 2}, expected=4, attempt_id="op5")
    assert [r[1] for r in _content(sink.reader())] == [0, 1]
    sink.commit(6, [_stage(tmp_path, 6, 0, "a", range(2, 4))], expected=5, attempt_id="x6")
    assert [r[1] for r in _content(sink.reader())] == [0, 1, 2, 3]
    assert sink.hours_since(1) >= 1.0


def test_a_bad_catalog_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"sink.catalog.type='rset' is not allowed: one of rest, hive"):
        config_from_mapping(_mapping(tmp_path, catalog={"type": "rset", "uri": "http://x"}))
    with pytest.raises(ConfigError, match=r"sink.catalog.uri is required"):
        config_from_mapping(_mapping(tmp_path, catalog={"type": "rest"}))
    with pytest.raises(ConfigError, match=r"sink.table='events' is not allowed: namespace.name"):
        config_from_mapping(_mapping(tmp_path, table="events"))
    with pytest.raises(ConfigError, match=r"errors.dead_letter.path=.* nothing with sink.kind 'iceberg'"):
        mapping = _mapping(tmp_path)
        mapping["errors"] = {"tolerance": "all", "dead_letter": {"path": str(tmp_path / "dead")}}
        config_from_mapping(mapping)
    # a REST catalog nobody serves: the open names sink.catalog, the catalog and the reason
    closed = config_from_mapping(
        _mapping(tmp_path, catalog={"type": "rest", "uri": "http://127.0.0.1:9"}), base_dir=tmp_path
    )
    with pytest.raises(ConfigError, match=r"sink.catalog: the Iceberg catalog 'splitkeeper' .*127.0.0.1:9"):
        config_sink(closed)
    assert not os.path.exists(tmp_path / "iceberg")


def test_a_catalog_named_by_config_is_the_one_written(tmp_path: Path) -> None:
    """``sink.catalog`` (here pyiceberg's SQL catalog at a URI of its own, as a cluster's Postgres
    would be) replaces the embedded one: the table is in that catalog and its warehouse."""
    shared = tmp_path / "shared"
    shared.mkdir()
    catalog = {
        "name": "lake",
        "type": "sql",
        "uri": f"sqlite:///{shared}/lake.db",
        "warehouse": f"file://{shared}/lake",
    }
    config = config_from_mapping(_mapping(tmp_path, catalog=catalog), base_dir=tmp_path)
    assert isinstance(config.sink, IcebergSink)
    assert config.sink.path == "iceberg://lake/ingest.events"
    sink = config_sink(config)
    sink.commit(1, [_stage(tmp_path, 1, 0, "a", range(0, 3))], expected=None, attempt_id="x1")
    assert not (tmp_path / "iceberg").exists()  # nothing in the embedded default

    from pyiceberg.catalog import load_catalog

    table = load_catalog("lake", **{k: v for k, v in catalog.items() if k != "name"}).load_table(
        "ingest.events"
    )
    assert table.location().startswith(f"file://{shared}/lake")
    assert sorted(table.scan().to_arrow()["offset"].to_pylist()) == [0, 1, 2]
    assert sink_reader(config).committed_epoch() == 1


def test_a_rest_catalog_killed_before_a_commit_stops_it_cleanly_and_the_next_run_lands_it(
    tmp_path: Path, iceberg_rest: Any
) -> None:
    """The catalog server SIGKILLed: the commit is a house error naming the table and the catalog,
    nothing is recorded; the server started again on the same catalog, the next run's sink finds
    epoch 1 recorded and commits epoch 2 once."""
    catalog = {"name": "rest", **iceberg_rest.catalog_properties()}
    config = config_from_mapping(_mapping(tmp_path, catalog=catalog), base_dir=tmp_path)
    sink = config_sink(config)
    sink.commit(1, [_stage(tmp_path, 1, 0, "a", range(0, 4))], expected=None, attempt_id="x1")
    iceberg_rest.kill()
    two = [_stage(tmp_path, 2, 0, "a", range(4, 6))]
    with pytest.raises(StateError, match=r"ingest\.events.*catalog"):
        sink.commit(2, two, expected=1, attempt_id="x2")
    iceberg_rest.start()
    again = config_sink(config)  # the next run
    assert again.committed_epoch() == 1
    assert again.commit(2, two, expected=1, attempt_id="x3").records == 2
    assert sorted(r[1] for r in _content(sink_reader(config))) == list(range(6))
