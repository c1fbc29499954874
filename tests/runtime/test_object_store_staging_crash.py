"""A real ``splitkeeper run`` SIGKILLed mid-commit with its staging on the object store.

State, sink and staging (the default ``<state>/_staging``) on versitygw, no local folder: the region
tasks (Spark's Python workers) write their staged files to the store with ``pyarrow.fs``, the sink
copies them to the table's folder and names them in one fenced commit. The driver dies by SIGKILL at
a crash point of epoch 2 (``SPLITKEEPER_CRASH_AT``), a second ``splitkeeper run`` recovers and
finishes, and the sink must hold every input line exactly once, by content.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from splitkeeper.config.settings import config_from_mapping
from splitkeeper.delta import storage
from splitkeeper.sinks.delta.sink import DeltaSink

from .helpers import (
    assert_sink_equals_source,
    pipeline_mapping,
    run_killed_at,
    splitkeeper_subprocess,
    write_config,
    write_input,
)

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
