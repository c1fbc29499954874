"""A real ``splitkeeper run`` SIGKILLed mid-commit with its staging on the object store.

State, sink and staging (the default ``<state>/_staging``) on versitygw, no local folder: the region
tasks (Spark's Python workers) write their staged files to the store with ``pyarrow.fs``, the sink
copies them to the table's folder and names them in one fenced commit. The driver dies by SIGKILL at
a crash point of epoch 2 (``SPLITKEEPER_CRASH_AT``), a second ``splitkeeper run`` recovers and
finishes, and the sink must hold every input line exactly once, by content.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from splitkeeper.config.settings import config_from_mapping
from splitkeeper.delta import storage
from splitkeeper.sinks.delta.read import read_dead_letters, read_sink
from splitkeeper.sinks.delta.sink import DeltaSink

from .helpers import (
    assert_sink_equals_source,
    pipeline_mapping,
    run_killed_at,
    splitkeeper_subprocess,
    write_config,
    write_input,
)
from .test_dead_letter_crash import _write_input

pytestmark = [pytest.mark.slow]  # two `splitkeeper run` processes, each with its own JVM

CRASH_EPOCH = 2


def _objects(location: str) -> list[str]:
    fs, inner = storage.filesystem(location)
    found = fs.get_file_info(pafs.FileSelector(inner, recursive=True, allow_not_found=True))
    return sorted(i.path[len(inner) + 1 :] for i in found if i.type == pafs.FileType.File)


@pytest.mark.parametrize("point", ["after_files_moved", "after_sink_commit"])
def test_a_driver_killed_mid_commit_with_staging_on_the_store_recovers_to_sink_equals_source(
    point: str, s3_store: Any, tmp_path: Path
) -> None:
    input_dir = tmp_path / "in"
    write_input(input_dir, files=3, lines=60)  # 3 epochs of 60
    mapping = pipeline_mapping(  # a generous region timeout: a loaded machine starts tasks late
        tmp_path, f"s3-{point}".replace("_", "-"), input_dir, epoch_records=60, region_timeout_s=120
    )
    mapping["state"] = {"path": s3_store.location(f"{point}/state").replace("s3://", "s3a://")}
    mapping["sink"] = {"path": s3_store.location(f"{point}/sink")}
    config = config_from_mapping(mapping)
    staging = config.staging.path
    assert staging == f"{config.state.path}/_staging"  # the default, on the store
    config_path = write_config(tmp_path / "pipeline.yaml", mapping)

    run_killed_at(config_path, point, CRASH_EPOCH)  # SIGKILLed there (checked)

    sink = DeltaSink(config.sink.path, config.name, read_only=True)
    staged = [p for p in _objects(staging) if p.startswith(f"epoch={CRASH_EPOCH}/")]
    copies = [p for p in _objects(config.sink.path) if p.startswith(f"sk-e{CRASH_EPOCH:010d}-")]
    assert any(p.endswith("/part.parquet") for p in staged)  # the executors wrote to the store
    if point == "after_files_moved":  # copied to the table, named by no commit
        assert (sink.committed_epoch() or 0) < CRASH_EPOCH and copies
    else:
        assert sink.committed_epoch() == CRASH_EPOCH
    assert not (tmp_path / "state").exists()  # nothing staged on local disk

    finished = splitkeeper_subprocess(["run", "--config", str(config_path)])
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert_sink_equals_source(None, config.sink.path, input_dir)  # every line exactly once, by content
    assert not [p for p in _objects(staging) if p.startswith("epoch=")]  # no staged leftovers


def test_a_driver_killed_before_its_dead_letter_commit_with_everything_on_the_store_recovers_exactly(
    s3_store: Any, tmp_path: Path
) -> None:
    """The side table's crash point: the sink commit landed naming the epoch's dead letters (staged
    on the store beside the records, copied into the dead-letter table's folder), their own commit
    did not; the next run commits them once."""
    input_dir = tmp_path / "in"
    oracle = _write_input(input_dir)  # every 7th line is not UTF-8: a dead letter
    mapping = pipeline_mapping(tmp_path, "s3-dead", input_dir, epoch_records=60, region_timeout_s=120)
    mapping["state"] = {"path": s3_store.location("dead/state")}
    mapping["sink"] = {"path": s3_store.location("dead/sink")}
    mapping["decode"] = {"kind": "text"}
    mapping["errors"] = {
        "tolerance": "all",
        "dead_letter": {"path": s3_store.location("dead/dead_letters")},
        "max_bad_ratio": 0.5,
    }
    config = config_from_mapping(mapping)
    config_path = write_config(tmp_path / "pipeline.yaml", mapping)

    run_killed_at(config_path, "before_dead_letter_commit", CRASH_EPOCH)
    reader = DeltaSink(
        config.sink.path, config.name, read_only=True, dead_letter_path=config.errors.dead_letter.path
    )
    assert reader.committed_epoch() == CRASH_EPOCH and reader.dead_letter_epoch() == CRASH_EPOCH - 1
    assert any(p.endswith("/dead.parquet") for p in _objects(config.staging.path))  # staged on the store

    finished = splitkeeper_subprocess(["run", "--config", str(config_path)])
    assert finished.returncode == 0, finished.stderr[-3000:]
    held: Counter[tuple[str, int, int, bytes]] = Counter()
    for rows in (
        read_sink(config.sink.path, ["split_id", "offset", "next_offset", "value"]),
        read_dead_letters(config.errors.dead_letter.path),
    ):
        for r in rows.select(["split_id", "offset", "next_offset", "value"]).to_pylist():
            value = r["value"].encode("utf-8") if isinstance(r["value"], str) else r["value"]
            held[(Path(r["split_id"]).name, r["offset"], r["next_offset"], value)] += 1
    want = Counter((split, offset, nxt, value) for (split, offset), (nxt, value) in oracle.items())
    assert held == want  # every line once, in the sink or the dead letters, byte for byte
