"""End to end, with real SIGKILLs: a files pipeline with bad records (lines that are not valid UTF-8,
``decode.kind: text``, ``errors.tolerance: all``) killed at the dead-letter crash point and at the
driver's crash points around the sink commit, then run again to completion: the sink and the
dead-letter table TOGETHER hold every source line exactly once, byte for byte, and the restart checks
pass over both.

Needs the region task's side (helper "bytes-sink": ``run_region_task`` writes the region's bad records
with :class:`~splitkeeper.spark.dead_letters.DeadLetterWriter`); before it is merged the child run
fails its regions on the first bad line instead of dying at the crash point.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from splitkeeper.app import services
from splitkeeper.app.pipeline import Pipeline
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.sinks.delta.sink import DeltaSink
from splitkeeper.spark.faults import CRASH_ENV

from .helpers import pipeline_mapping, run_killed_at, write_config

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CRASH_EPOCH = 2


def _write_input(
    input_dir: Path, files: int = 3, lines: int = 60
) -> dict[tuple[str, int], tuple[int, bytes]]:
    """Text files where every 7th line is not valid UTF-8; the oracle: (split, offset) -> (next, bytes)."""
    input_dir.mkdir(parents=True, exist_ok=True)
    oracle: dict[tuple[str, int], tuple[int, bytes]] = {}
    for f in range(files):
        name = f"part-{f:03d}.txt"
        data = b""
        for i in range(lines):
            line = (b"\xff\xfe bad %d/%d" % (f, i)) if i % 7 == 3 else (b"line %d/%d caf\xc3\xa9" % (f, i))
            oracle[(name, len(data))] = (len(data) + len(line) + 1, line)
            data += line + b"\n"
        (input_dir / name).write_bytes(data)
    return oracle


def _held(config: Any) -> Counter[tuple[str, int, int, bytes]]:
    """(split, offset, next_offset, value bytes) of every sink row and every dead letter, counted."""
    held: Counter[tuple[str, int, int, bytes]] = Counter()
    for path in (config.sink.path, config.errors.dead_letter.path):
        rows = DeltaTable(path).to_pyarrow_table(columns=["split_id", "offset", "next_offset", "value"])
        for r in rows.to_pylist():
            value = r["value"].encode("utf-8") if isinstance(r["value"], str) else r["value"]
            held[(Path(r["split_id"]).name, r["offset"], r["next_offset"], value)] += 1
    return held


@pytest.mark.parametrize(
    "point",
    [
        "before_dead_letter_commit",
        "after_sink_commit",  # the redo commits the epoch's dead letters too
        # slow variants: the upsert crash test kills before the side commit and before the checkpoint
        # row with dead letters too
        pytest.param("before_checkpoint_row", marks=pytest.mark.slow_variant),
        pytest.param("after_decision", marks=pytest.mark.slow_variant),
    ],
)
def test_killed_with_dead_letters_pending_recovers_to_sink_and_dead_letters_equal_to_the_source(
    point: str, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CRASH_ENV, raising=False)
    input_dir = tmp_path / "in"
    oracle = _write_input(input_dir)
    mapping = pipeline_mapping(tmp_path, f"dead-{point}".replace("_", "-"), input_dir, epoch_records=60)
    mapping["decode"] = {"kind": "text"}
    mapping["errors"] = {
        "tolerance": "all",
        "dead_letter": {"path": str(tmp_path / "dead")},
        "max_bad_ratio": 0.5,
    }
    config_path = write_config(tmp_path / "pipeline.yaml", mapping)
    config = config_from_mapping(mapping)

    run_killed_at(config_path, point, CRASH_EPOCH)
    reader = DeltaSink(
        config.sink.path, config.name, read_only=True, dead_letter_path=config.errors.dead_letter.path
    )
    if point == "before_dead_letter_commit":  # the sink commit landed, naming dead letters not committed yet
        assert reader.committed_epoch() == CRASH_EPOCH and reader.dead_letter_epoch() == CRASH_EPOCH - 1

    pipeline = Pipeline(config, spark)
    try:
        pipeline.open()
        assert pipeline.sink.dead_letter_epoch() == (
            CRASH_EPOCH if reader.committed_epoch() == CRASH_EPOCH else 1
        )
        summary = pipeline.run()
    finally:
        pipeline.close()
    assert summary.finished

    held = _held(config)
    assert [k for k, n in held.items() if n > 1] == []  # no record twice, in either table or across
    want = Counter((split, offset, nxt, value) for (split, offset), (nxt, value) in oracle.items())
    assert held == want  # none lost, byte for byte
    dead = DeltaTable(config.errors.dead_letter.path).to_pyarrow_table(columns=["stage", "offset"])
    assert set(dead["stage"].to_pylist()) == {"decode"}
    assert dead.num_rows == sum(1 for _n, v in oracle.values() if v.startswith(b"\xff"))

    # the restart checks over sink and dead letters, with the content: their values are the source's bytes
    assert services.validate(config, content=True).success


def _write_json_input(input_dir: Path, files: int = 2, lines: int = 60) -> dict[tuple[str, int], bytes]:
    """JSON lines of ``id, kind, amount`` where every 9th line is malformed (cut short): the oracle
    (split, offset) -> the line's bytes."""
    input_dir.mkdir(parents=True, exist_ok=True)
    oracle: dict[tuple[str, int], bytes] = {}
    for f in range(files):
        name = f"orders-{f:03d}.jsonl"
        data = b""
        for i in range(lines):
            n = f * 1000 + i
            line = b'{"id": %d, "kind": "%s", "amount": %d.%02d}' % (n, b"ab"[i % 2 : i % 2 + 1], n, i)
            if i % 9 == 4:
                line = line[:-9]  # not JSON any more
            oracle[(name, len(data))] = line
            data += line + b"\n"
        (input_dir / name).write_bytes(data)
    return oracle


def test_killed_mid_commit_with_a_typed_partitioned_sink_and_a_batch_transform_recovers_exactly(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crash-point test again with what a typed pipeline has: JSON decoded into declared columns,
    a batch transform adding a column, the sink partitioned by a typed column, malformed lines as
    dead letters; killed between the sink commit and the dead-letter commit. Afterwards every
    line is in exactly one table: the good ones as their typed rows (checked by value), the
    malformed ones as their raw bytes."""
    import json
    from decimal import Decimal

    monkeypatch.delenv(CRASH_ENV, raising=False)
    input_dir = tmp_path / "in"
    oracle = _write_json_input(input_dir)
    mapping = pipeline_mapping(tmp_path, "typed-dead", input_dir, epoch_records=40)
    mapping["decode"] = {"kind": "json", "schema": "id BIGINT, kind STRING, amount DECIMAL(10,2)"}
    mapping["transform"] = "splitkeeper.transforms:add_amount_cents"
    mapping["sink"]["partition_by"] = ["kind"]
    mapping["errors"] = {
        "tolerance": "all",
        "dead_letter": {"path": str(tmp_path / "dead")},
        "max_bad_ratio": 0.5,
    }
    config_path = write_config(tmp_path / "pipeline.yaml", mapping)
    config = config_from_mapping(mapping)

    point = "before_dead_letter_commit"
    run_killed_at(config_path, point, CRASH_EPOCH)
    pipeline = Pipeline(config, spark)
    try:
        pipeline.open()
        summary = pipeline.run()
    finally:
        pipeline.close()
    assert summary.finished

    sink = DeltaTable(config.sink.path)
    assert sink.metadata().partition_columns == ["kind"]
    rows = sink.to_pyarrow_table(
        columns=["split_id", "offset", "id", "kind", "amount", "amount_cents", "_rescued"]
    )
    dead = DeltaTable(config.errors.dead_letter.path).to_pyarrow_table(
        columns=["split_id", "offset", "value", "stage"]
    )
    places = Counter(
        (Path(s).name, o)
        for table in (rows, dead)
        for s, o in zip(table["split_id"].to_pylist(), table["offset"].to_pylist(), strict=True)
    )
    assert [k for k, n in places.items() if n > 1] == []
    assert set(places) == set(oracle)
    for r in rows.to_pylist():
        want = json.loads(oracle[(Path(r["split_id"]).name, r["offset"])])
        assert (r["id"], r["kind"], r["amount"]) == (want["id"], want["kind"], Decimal(str(want["amount"])))
        assert r["amount_cents"] == int(Decimal(str(want["amount"])) * 100) and r["_rescued"] is None
    for r in dead.to_pylist():
        assert r["value"] == oracle[(Path(r["split_id"]).name, r["offset"])] and r["stage"] == "decode"
    assert dead.num_rows == sum(1 for v in oracle.values() if not v.endswith(b"}"))
    assert services.validate(config).success
