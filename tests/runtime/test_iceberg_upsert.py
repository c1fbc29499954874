"""The ``iceberg`` sink in ``sink.mode: upsert`` at its port, without Spark: each epoch's staged
change records (inserts, updates, deletes by ``delete_when`` and by tombstone) folded per key into
the keyed Iceberg table in ONE fenced catalog commit, the change table kept exactly once beside it
(committed after it, repaired on open), a replay that applies nothing twice, a rival fenced, and
the bad configs. Everything is read back with pyiceberg on its own catalog object and compared with
a reference fold written here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from splitkeeper.app.sink import config_sink, record_policy, sink_reader
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.core.ports import RegionRun, SinkCrashPoint
from splitkeeper.core.types import RegionOutcome
from splitkeeper.errors import ConcurrentRunError, ConfigError
from splitkeeper.sinks.iceberg.sink import IcebergEpochSink
from splitkeeper.sinks.port import SinkTable, SupportsRewind, SupportsSideTables
from splitkeeper.staging import PART_FILE, StagedRegion, attempt_dir

COLUMNS = ["id", "name", "op", "split_id", "offset", "epoch"]


def _mapping(root: Path, **sink: Any) -> dict[str, Any]:
    (root / "in").mkdir(exist_ok=True)
    return {
        "name": "iceup",
        "source": {"kind": "files", "path": str(root / "in"), "format": "lines"},
        "decode": {"kind": "json", "schema": "id BIGINT, name STRING, op STRING"},
        "state": {"path": str(root / "state")},
        "sink": {
            "kind": "iceberg",
            "table": "ingest.people",
            "mode": "upsert",
            "key": ["id"],
            "delete_when": "op = 'd'",
            **sink,
        },
    }


def _stage(
    root: Path, schema: pa.Schema, epoch: int, region: int, split: str, rows: list[tuple[int, Any, Any]]
) -> RegionRun:
    """A region task's staged output of change records ``(offset, id, op)`` of ``split`` (``op``
    None: a tombstone, its data columns null)."""
    attempt = f"a{epoch}r{region}"
    folder = Path(attempt_dir(str(root / "staging"), epoch, region, attempt))
    folder.mkdir(parents=True)
    n = len(rows)
    tomb = [op is None for _, _, op in rows]
    columns = {
        "split_id": [split] * n,
        "offset": [o for o, _, _ in rows],
        "next_offset": [o + 1 for o, _, _ in rows],
        "epoch": [epoch] * n,
        "region": [region] * n,
        "ingested_at": [pa.scalar(0, pa.timestamp("us", "UTC")).as_py()] * n,
        "id": [None if t else i for (_, i, _), t in zip(rows, tomb, strict=True)],
        "name": [None if op is None else f"{split}{o}" for o, _, op in rows],
        "op": [op for _, _, op in rows],
        "tombstone": tomb,
    }
    table = pa.table(
        {f.name: pa.array(columns.get(f.name, [None] * n), f.type) for f in schema}, schema=schema
    )
    pq.write_table(table, folder / PART_FILE)
    return RegionRun(
        region,
        RegionOutcome.ACK,
        records=n,
        output=StagedRegion(str(root / "staging"), epoch, region, attempt),
    )


def _catalog(root: Path) -> Any:
    from pyiceberg.catalog import load_catalog

    warehouse = root / "iceberg"
    return load_catalog(
        "splitkeeper", type="sql", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}"
    )


def _read(root: Path, name: str) -> list[dict[str, Any]]:
    return list(_catalog(root).load_table(name).scan().to_arrow().to_pylist())


def _fold(changes: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The reference fold: per id the max (epoch, offset, split_id); deletes and tombstones drop it."""
    latest: dict[Any, dict[str, Any]] = {}
    for r in changes:
        if r["tombstone"]:
            continue  # keyed by a data column: a tombstone carries no key (rule 4)
        order = (r["epoch"], r["offset"], r["split_id"])
        best = latest.get(r["id"])
        if best is None or order > (best["epoch"], best["offset"], best["split_id"]):
            latest[r["id"]] = r
    return sorted(tuple(r[c] for c in COLUMNS) for r in latest.values() if r["op"] != "d")


def _keyed(root: Path) -> list[tuple[Any, ...]]:
    return sorted(tuple(r[c] for c in COLUMNS) for r in _read(root, "ingest.people"))


def test_epochs_fold_into_the_keyed_table_once_with_their_change_table(tmp_path: Path) -> None:
    config = config_from_mapping(_mapping(tmp_path), base_dir=tmp_path)
    schema = record_policy(config).schema
    sink = config_sink(config)
    assert isinstance(sink, SupportsSideTables) and isinstance(sink, IcebergEpochSink)
    one = [
        _stage(tmp_path, schema, 1, 0, "a", [(0, 1, "c"), (1, 2, "c"), (2, 1, "u"), (3, 3, "c")]),
        _stage(tmp_path, schema, 1, 1, "b", [(0, 4, "c"), (1, 4, "d"), (2, 5, "c")]),
    ]
    receipt = sink.commit(1, one, expected=None, attempt_id="x1")
    assert (receipt.records, receipt.replayed) == (7, False)
    assert [r[0] for r in _keyed(tmp_path)] == [1, 2, 3, 5]  # 4 inserted and deleted in one epoch
    assert dict((r[0], r[1]) for r in _keyed(tmp_path))[1] == "a2"  # the later offset won

    # epoch 2: an update, a delete of an earlier key, a re-insert of the deleted one, a tombstone
    two = [
        _stage(tmp_path, schema, 2, 0, "a", [(4, 2, "u"), (5, 3, "d"), (6, 0, None)]),
        _stage(tmp_path, schema, 2, 1, "b", [(3, 4, "c"), (4, 9, "d")]),
    ]
    sink.commit(2, two, expected=1, attempt_id="x2")
    changes = _read(tmp_path, "ingest.people_changes")
    assert len(changes) == 12 and sum(r["tombstone"] for r in changes) == 1
    assert _keyed(tmp_path) == _fold(changes)
    assert [r[0] for r in _keyed(tmp_path)] == [1, 2, 4, 5]

    # the keyed table's commit of each epoch is one catalog commit whose snapshots all carry the fence
    table = _catalog(tmp_path).load_table("ingest.people")
    props = [s.summary.additional_properties for s in table.snapshots() if s.summary is not None]
    assert {p["splitkeeper.epoch"] for p in props} == {"1", "2"}
    assert all(p["splitkeeper.app-id"] == "iceup" for p in props)
    assert table.properties["splitkeeper.sink.mode"] == "upsert"
    assert table.properties["splitkeeper.sink.key"] == "id"

    # a replay of epoch 2 (the same attempt, redone after a crash) applies nothing twice
    before = len(table.snapshots())
    again = config_sink(config).commit(2, two, expected=1, attempt_id="x2")
    assert again.replayed
    assert len(_catalog(tmp_path).load_table("ingest.people").snapshots()) == before
    assert len(_read(tmp_path, "ingest.people_changes")) == 12
    # a rival's attempt of the recorded epoch is fenced
    with pytest.raises(ConcurrentRunError, match="records epoch 2 but this run expected 1"):
        config_sink(config).commit(2, two, expected=1, attempt_id="rival")
    # an empty epoch is recorded in both tables
    sink.commit(3, [], expected=2, attempt_id="x3")
    assert (sink.committed_epoch(), sink.change_epoch()) == (3, 3)

    # the reader: the change table is the records, the keyed table is KEYED
    reader = sink_reader(config)
    assert reader.upsert is not None and reader.upsert.key == ("id",)
    assert reader.committed_epoch() == 3
    assert reader.count(SinkTable.RECORDS) == 12 and reader.count(SinkTable.KEYED) == 4
    assert reader.rows(SinkTable.RECORDS, ["offset"], epoch=1).num_rows == 7
    assert str(reader.location(SinkTable.KEYED)).endswith("ingest.db/people")
    assert str(reader.location(SinkTable.RECORDS)).endswith("ingest.db/people_changes")
    assert set(reader.versions()) == {"sink", "changes"}


def test_a_crash_between_the_keyed_commit_and_the_change_commit_is_repaired_on_open(
    tmp_path: Path,
) -> None:
    config = config_from_mapping(_mapping(tmp_path), base_dir=tmp_path)
    schema = record_policy(config).schema

    class Killed(Exception):
        pass

    def crash(point: SinkCrashPoint, epoch: int) -> None:
        if point is SinkCrashPoint.BEFORE_SIDE_COMMIT and epoch == 2:
            raise Killed

    sink = config_sink(config, crash_point=crash)
    sink.commit(
        1, [_stage(tmp_path, schema, 1, 0, "a", [(0, 1, "c"), (1, 2, "c")])], expected=None, attempt_id="x1"
    )
    two = [_stage(tmp_path, schema, 2, 0, "a", [(2, 1, "u"), (3, 2, "d"), (4, 7, "c")])]
    with pytest.raises(Killed):
        sink.commit(2, two, expected=1, attempt_id="x2")
    reader = config_sink(config, read_only=True)
    assert isinstance(reader, IcebergEpochSink)
    assert (reader.committed_epoch(), reader.change_epoch()) == (2, 1)  # the keyed commit landed alone
    assert len(_read(tmp_path, "ingest.people_changes")) == 2

    reopened = config_sink(config)  # the open commits the change table's part of epoch 2
    assert isinstance(reopened, IcebergEpochSink)
    assert reopened.change_epoch() == 2
    changes = _read(tmp_path, "ingest.people_changes")
    assert len(changes) == 5 and _keyed(tmp_path) == _fold(changes)
    # the redo of epoch 2 by the same attempt: a replay, nothing applied or kept twice
    assert reopened.commit(2, two, expected=1, attempt_id="x2").replayed
    assert len(_read(tmp_path, "ingest.people_changes")) == 5
    assert _keyed(tmp_path) == _fold(changes)


def test_a_rewind_is_refused_and_a_forward_reset_recorded_in_both_tables(tmp_path: Path) -> None:
    config = config_from_mapping(_mapping(tmp_path), base_dir=tmp_path)
    schema = record_policy(config).schema
    sink = config_sink(config)
    assert isinstance(sink, SupportsRewind) and isinstance(sink, IcebergEpochSink)
    sink.commit(1, [_stage(tmp_path, schema, 1, 0, "a", [(0, 1, "c")])], expected=None, attempt_id="x1")
    with pytest.raises(
        ConfigError, match=r"\[CONFIG_ERROR\] recover --rewind .* not supported with sink.kind"
    ):
        sink.rewind_plan(1)
    with pytest.raises(ConfigError, match="not supported"):
        sink.operator_commit(2, {"kind": "rewind", "to": 1, "versions": {}}, expected=1, attempt_id="op")
    action = {"kind": "reset", "split": "a", "from": 9, "forward": True}
    sink.operator_commit(2, action, expected=1, attempt_id="op2")
    assert (sink.committed_epoch(), sink.change_epoch()) == (2, 2)
    assert [r[0] for r in _keyed(tmp_path)] == [1]


def test_bad_upsert_config_is_a_clear_error(tmp_path: Path) -> None:
    mapping = _mapping(tmp_path)
    del mapping["sink"]["key"]
    with pytest.raises(ConfigError, match=r"sink.key is required but missing .*sink.mode is 'upsert'"):
        config_from_mapping(mapping)
    with pytest.raises(ConfigError, match=r"sink.key=\['nope'\] is not allowed: names of the sink's columns"):
        config_from_mapping(_mapping(tmp_path, key=["nope"]))
    with pytest.raises(ConfigError, match=r"sink.delete_when=.* pyiceberg's row filter reads"):
        config_from_mapping(_mapping(tmp_path, delete_when="lower(op) = 'd'"))
    append = _mapping(tmp_path, mode="append")
    with pytest.raises(ConfigError, match=r"sink.key=\['id'\] is not allowed: nothing unless sink.mode"):
        config_from_mapping(append)
    with pytest.raises(ConfigError, match=r"sink.changes_table='ingest.people' is not allowed"):
        config_from_mapping(_mapping(tmp_path, changes_table="ingest.people"))
    # an existing upsert table opened as an append sink (or with another key): the table says what it is
    config = config_from_mapping(_mapping(tmp_path), base_dir=tmp_path)
    config_sink(config)
    other = config_from_mapping(_mapping(tmp_path, key=["name"]), base_dir=tmp_path)
    from splitkeeper.errors import StateError

    with pytest.raises(
        StateError, match=r"is an upsert sink keyed by \[id\].*set sink.mode: upsert and sink.key: \[id\]"
    ):
        config_sink(other)


def test_the_reader_counts_the_deletes_by_the_generic_sql_condition(tmp_path: Path) -> None:
    """The report counts an upsert sink's deletes with the delete condition in generic SQL
    (``COALESCE``), which pyiceberg's row filter does not read; a plain filter still goes to it."""
    config = config_from_mapping(_mapping(tmp_path), base_dir=tmp_path)
    schema = record_policy(config).schema
    sink = config_sink(config)
    rows = [(0, 1, "c"), (1, 1, "d"), (2, 2, "d"), (3, 0, None), (4, 3, "u")]
    sink.commit(1, [_stage(tmp_path, schema, 1, 0, "a", rows)], expected=None, attempt_id="x1")
    reader = sink_reader(config)
    assert reader.upsert is not None
    assert reader.count(SinkTable.RECORDS, reader.upsert.delete_condition()) == 3  # two 'd', one tombstone
    assert reader.count(SinkTable.RECORDS, "op = 'c'") == 1
    assert reader.count(SinkTable.KEYED) == 1  # only id 3 is live
