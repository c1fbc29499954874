"""The typed record path end to end (issue 36, part B): real files, the real Spark region tasks, the
real Delta sink and dead-letter table. After each run the sink, the dead letters and the rescued
values are compared with what was written, by content: every record is in the sink, a dead letter
with its reason at its own offset, or a rescued value; none is dropped or folded away.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.app import services
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.errors import RunStalledError
from splitkeeper.sinks.delta.read import read_dead_letters, read_sink

from .helpers import pipeline_mapping, run_pipeline


def _config(root: Path, *, fmt: str = "lines", tolerance: str = "all", **decode: Any) -> Any:
    mapping = pipeline_mapping(root, "typed", root / "in", parallelism=2, epoch_records=400)
    mapping["source"]["format"] = fmt
    mapping["decode"] = {"kind": "json", **decode}
    if tolerance == "all":
        mapping["errors"] = {
            "tolerance": "all",
            "dead_letter": {"path": str(root / "dead")},
            "max_bad_ratio": 1.0,
        }
    else:  # a bad record fails its region: stop after two epochs instead of quarantining the split
        mapping["checkpoint"].update(on_split_failure="stall", max_consecutive_aborts=2)
    return config_from_mapping(mapping)


def _write(root: Path, name: str, lines: list[bytes]) -> list[int]:
    """Write the lines of one input file; their byte offsets."""
    (root / "in").mkdir(parents=True, exist_ok=True)
    (root / "in" / name).write_bytes(b"".join(line + b"\n" for line in lines))
    offsets, at = [], 0
    for line in lines:
        offsets.append(at)
        at += len(line) + 1
    return offsets


def _dead(root: Path) -> dict[tuple[str, int], dict[str, Any]]:
    rows = read_dead_letters(root / "dead", ["split_id", "offset", "value", "error_class", "error_message"])
    return {(r["split_id"], r["offset"]): r for r in rows.to_pylist()}


def test_jsonl_under_tolerance_all_dead_letters_a_malformed_line_and_the_rest_lands(
    spark: Any, tmp_path: Path
) -> None:
    """Item 12: the jsonl reader's own JSON check failed the read before decode saw the line: 5
    aborted epochs, [RUN_STALLED], nothing committed. Now each bad line is a dead letter."""
    produced: dict[tuple[str, int], bytes] = {}
    for f in range(3):
        lines = [json.dumps({"id": f * 100 + i, "name": f"n{i}"}).encode() for i in range(60)]
        for i in (7, 31, 59):  # truncated, as a writer killed mid-line leaves them
            lines[i] = lines[i][:-9]
        for name, offset in zip(lines, _write(tmp_path, f"part-{f}.jsonl", lines), strict=True):
            produced[(f"part-{f}.jsonl", offset)] = name
    config = _config(tmp_path, fmt="jsonl", schema="id BIGINT, name STRING")
    assert run_pipeline(config, spark).finished
    sink = {
        (r["split_id"], r["offset"]): (r["id"], r["name"])
        for r in read_sink(tmp_path / "sink", ["split_id", "offset", "id", "name"]).to_pylist()
    }
    dead = _dead(tmp_path)
    assert len(sink) == 171 and len(dead) == 9 and not set(sink) & set(dead)
    assert set(sink) | set(dead) == set(produced)  # every line once
    for key, (ident, name) in sink.items():
        assert json.loads(produced[key]) == {"id": ident, "name": name}
    for key, row in dead.items():
        assert row["value"] == produced[key] and row["error_class"] == "JSONDecodeError"
        assert f"line at byte {key[1]} is not valid JSON" in row["error_message"]
    services.validate(config)


def test_a_json_value_nested_too_deep_is_one_dead_letter_at_its_own_offset(
    spark: Any, tmp_path: Path
) -> None:
    """Item 13: one value nested ~1,000 levels raised RecursionError for the whole split, which was
    quarantined naming the range start (offset 0); resetting to it skipped 7 good records."""
    lines = [json.dumps({"id": i}).encode() for i in range(12)]
    lines[7] = b'{"id": 7, "n": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    offsets = _write(tmp_path, "deep.json", lines)
    config = _config(tmp_path, schema="id BIGINT")
    assert run_pipeline(config, spark).finished
    ids = sorted(r["id"] for r in read_sink(tmp_path / "sink", ["id"]).to_pylist())
    assert ids == [i for i in range(12) if i != 7]
    (row,) = _dead(tmp_path).values()
    assert row["offset"] == offsets[7] and row["value"] == lines[7] and row["error_class"] == "NestedTooDeep"
    assert "nests 1001 levels deep" in row["error_message"]
    services.validate(config)
    strict = tmp_path / "strict"  # tolerance none: the region fails naming the record's own offset
    _write(strict, "deep.json", lines)
    with pytest.raises(RunStalledError) as caught:
        run_pipeline(_config(strict, tolerance="none", schema="id BIGINT"), spark)
    assert f'split "deep.json" at offset {offsets[7]}' in str(caught.value.params["region_errors"])
    assert "NestedTooDeep" in str(caught.value)


def test_add_columns_keeps_every_field_across_runs_in_columns_or_rescued(spark: Any, tmp_path: Path) -> None:
    """Items 4 and 16 and the _rescued object: bookkeeping-named fields were dropped, id beside ID
    crashed every commit (delta-rs: duplicate field name), an object under _rescued failed. Each
    run's sink is compared with the records written."""
    first = [
        b'{"id": 1, "timestamp": "2024-05-05T10:00:00Z", "key": "user-key", "headers": "h", '
        b'"next_offset": 5, "ingested_at": "x", "Color": "red"}',
        b'{"id": 2, "ID": 20, "_rescued": {"a": 1}, "Color": "blue"}',
        b'{"id": 3, "offset": 9, "split_id": "s", "epoch": 1, "region": 2, "topic": "t", "partition": 3}',
    ]
    config = _config(tmp_path, schema="id BIGINT", on_new_fields="add_columns")
    offsets = _write(tmp_path, "a.json", first)
    assert run_pipeline(config, spark).finished
    _write(tmp_path, "b.json", [b'{"id": 4, "color": "green", "COLOR": "x", "size": 2}'])
    assert run_pipeline(config, spark).finished  # a second run: the sink has Color from the first
    rows = read_sink(tmp_path / "sink").to_pylist()
    got = {r["id"]: r for r in rows}
    assert sorted(got) == [1, 2, 3, 4]
    for line in [*first, b'{"id": 4, "color": "green", "COLOR": "x", "size": 2}']:
        record = json.loads(line)
        row = got[record["id"]]
        rescued = json.loads(row["_rescued"] or "{}")
        for field, value in record.items():  # every field: its own column, or rescued with its value
            if field in rescued:
                assert rescued[field] == value, (record["id"], field)
            else:
                assert field in ("id", "Color", "size") and row[field] == value, (record["id"], field)
    assert json.loads(got[4]["_rescued"]) == {"color": "green", "COLOR": "x"}  # Color is the sink's
    assert (got[3]["split_id"], got[3]["offset"], got[3]["epoch"]) == ("a.json", offsets[2], 1)  # its own
    assert not (tmp_path / "dead").exists() or read_dead_letters(tmp_path / "dead").num_rows == 0
    services.validate(config)
