"""End to end, with real SIGKILLs: a files pipeline in ``sink.mode: upsert`` on keyed JSON records
(inserts, updates, deletes by ``op = 'd'``, malformed lines as dead letters) killed between the
MERGE and the change table's commit, and by the driver after the sink commit and before the
checkpoint row; then run again to completion. Afterwards the change table plus the dead letters
hold every source line exactly once, and the keyed table equals the fold of the change table.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from splitkeeper.app import incident, services
from splitkeeper.app.pipeline import Pipeline
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.sinks.delta.read import read_dead_letters, read_sink
from splitkeeper.sinks.delta.sink import DeltaSink
from splitkeeper.spark.faults import CRASH_ENV

from .helpers import pipeline_mapping, run_killed_at, run_pipeline, splitkeeper_subprocess, write_config

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CRASH_EPOCH = 2


def _write_cdc(input_dir: Path, files: int = 2, lines: int = 45) -> dict[tuple[str, int], bytes]:
    """CDC lines ``{id, name, op}`` over 12 ids per file (so ids are updated and deleted), every 11th
    line malformed: the oracle (split, offset) -> the line's bytes."""
    input_dir.mkdir(parents=True, exist_ok=True)
    oracle: dict[tuple[str, int], bytes] = {}
    for f in range(files):
        name = f"cdc-{f:03d}.jsonl"
        data = b""
        for i in range(lines):
            op = "d" if i % 5 == 4 else ("c" if i < 12 else "u")
            line = json.dumps({"id": f * 100 + i % 12, "name": f"v{i}", "op": op}).encode()
            if i % 11 == 7:
                line = line[:-5]  # not JSON any more: a dead letter
            oracle[(name, len(data))] = line
            data += line + b"\n"
        (input_dir / name).write_bytes(data)
    return oracle


def _fold(changes: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The reference fold: per id the max (epoch, offset, split_id); deletes dropped."""
    latest: dict[Any, dict[str, Any]] = {}
    for r in changes:
        order = (r["epoch"], r["offset"], r["split_id"])
        if r["id"] not in latest or order > tuple(
            latest[r["id"]][c] for c in ("epoch", "offset", "split_id")
        ):
            latest[r["id"]] = r
    return sorted(
        (r["id"], r["name"], r["op"], r["split_id"], r["offset"], r["epoch"])
        for r in latest.values()
        if not r["tombstone"] and r["op"] != "d"
    )


def _cdc_pipeline(tmp_path: Path, name: str) -> tuple[dict[tuple[str, int], bytes], Path, Any]:
    """A files pipeline in ``sink.mode: upsert`` over :func:`_write_cdc`'s lines, malformed ones as
    dead letters: (the oracle, the config file, the config)."""
    input_dir = tmp_path / "in"
    oracle = _write_cdc(input_dir)
    mapping = pipeline_mapping(tmp_path, name, input_dir, epoch_records=30)
    mapping["decode"] = {"kind": "json", "schema": "id BIGINT, name STRING, op STRING"}
    mapping["sink"].update({"mode": "upsert", "key": ["id"], "delete_when": "op = 'd'"})
    mapping["errors"] = {
        "tolerance": "all",
        "dead_letter": {"path": str(tmp_path / "dead")},
        "max_bad_ratio": 0.5,
    }
    config_path = write_config(tmp_path / "pipeline.yaml", mapping)
    return oracle, config_path, config_from_mapping(mapping)


def _assert_exact(config: Any, oracle: dict[tuple[str, int], bytes]) -> list[tuple[Any, ...]]:
    """The change table plus the dead letters hold every source line once, by content; the keyed
    table is the fold of the change table; the restart checks pass. Returns the keyed rows."""
    changes = read_sink(config.sink.changes_path).to_pylist()
    dead = read_dead_letters(config.errors.dead_letter.path, ["split_id", "offset", "value"]).to_pylist()
    places = Counter((Path(r["split_id"]).name, r["offset"]) for r in [*changes, *dead])
    assert [k for k, n in places.items() if n > 1] == []  # no record twice, in either table or across
    assert set(places) == set(oracle)  # none lost
    for r in dead:
        assert r["value"] == oracle[(Path(r["split_id"]).name, r["offset"])]
    for r in changes:
        want = json.loads(oracle[(Path(r["split_id"]).name, r["offset"])])
        assert (r["id"], r["name"], r["op"], r["tombstone"]) == (want["id"], want["name"], want["op"], False)
    keyed = DeltaTable(config.sink.path).to_pyarrow_table(
        columns=["id", "name", "op", "split_id", "offset", "epoch"]
    )
    got = sorted(tuple(r.values()) for r in keyed.to_pylist())
    assert got == _fold(changes) and len(got) > 0
    assert len({r[0] for r in got}) == len(got)  # one row per key
    # the restart checks: change table + dead letters exact, and the GE fold suite on Spark holds
    result = services.validate(config)
    assert result.success and result.suites.get("upsert_fold") == "passed", result
    return got


@pytest.mark.parametrize(
    "point",
    [
        "before_side_commit",
        "before_checkpoint_row",
        pytest.param("after_sink_commit", marks=pytest.mark.slow_variant),
    ],
)
def test_an_upsert_pipeline_killed_around_its_merge_recovers_to_the_fold_of_its_change_table(
    point: str, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CRASH_ENV, raising=False)
    oracle, config_path, config = _cdc_pipeline(tmp_path, f"upsert-{point}".replace("_", "-"))

    run_killed_at(config_path, point, CRASH_EPOCH)
    reader = DeltaSink(
        config.sink.path,
        config.name,
        read_only=True,
        upsert=config.sink.upsert,
        changes_path=config.sink.changes_path,
    )
    if point == "before_side_commit":  # the MERGE landed, naming change files not committed yet
        assert reader.committed_epoch() == CRASH_EPOCH and reader.change_epoch() == CRASH_EPOCH - 1

    pipeline = Pipeline(config, spark)
    try:
        pipeline.open()
        assert pipeline.sink.change_epoch() == pipeline.sink.committed_epoch()
        summary = pipeline.run()
    finally:
        pipeline.close()
    assert summary.finished

    got = _assert_exact(config, oracle)
    if point == "before_checkpoint_row":  # maintain opens the keyed table as an upsert sink and keeps it
        services.maintain(config, history_hours=0)
        again = DeltaTable(config.sink.path).to_pyarrow_table(
            columns=["id", "name", "op", "split_id", "offset", "epoch"]
        )
        assert sorted(tuple(r.values()) for r in again.to_pylist()) == got


def _logs(root: Path) -> dict[str, list[str]]:
    """Every Delta table under ``root`` but the state's: its log's file names (what a commit changes)."""
    return {
        str(log.parent): sorted(p.name for p in log.iterdir())
        for log in root.rglob("_delta_log")
        if "state" not in log.parts
    }


def test_a_rewind_of_an_upsert_pipeline_killed_before_its_side_tables_finishes_on_open_and_stays_exact(
    spark: Any, tmp_path: Path
) -> None:
    """The keyed table, the change table and the dead letters go back to checkpoint 1 together: the
    rewind's command is killed after the keyed table's restore, before the side tables' (the next
    open finishes them from the sink commit), and only the tables its plan named change."""
    oracle, config_path, config = _cdc_pipeline(tmp_path, "upsert-rewind")
    run_pipeline(config, spark, epochs=2)

    plan = incident.rewind(config, 1, dry_run=True)
    named = {t["path"].removeprefix("file://").rstrip("/"): t for t in plan.tables}
    assert {t["table"] for t in plan.tables} == {"keyed", "dead-letter", "change"}
    assert (
        named[str(tmp_path / "dead")]["rows_leaving"] > 0
        or named[str(tmp_path / "sink_changes")]["rows_leaving"] > 0
    )
    logs = _logs(tmp_path)

    argv = [
        "recover",
        "--config",
        str(config_path),
        "--checkpoint",
        "1",
        "--rewind",
        "--yes",
        "--reason",
        "test",
    ]
    crashed = splitkeeper_subprocess(argv, **{CRASH_ENV: "before_side_commit@3"})
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    reader = DeltaSink(
        config.sink.path,
        config.name,
        read_only=True,
        upsert=config.sink.upsert,
        changes_path=config.sink.changes_path,
    )
    assert reader.committed_epoch() == 3 and reader.change_epoch() == 2  # keyed restored, changes not yet
    changed = {path for path, files in _logs(tmp_path).items() if files != logs.get(path)}
    assert changed and changed <= set(named), (changed, set(named))  # only tables the plan named

    # the open finishes the rewind (sides restored, checkpoint 3's row), then reads on
    run_pipeline(config, spark)
    _assert_exact(config, oracle)
