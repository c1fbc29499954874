"""Staging on the object store (:mod:`splitkeeper.staging` rule 5): state, sink and staging on a real
S3 store (versitygw), the region tasks writing their staged files there with ``pyarrow.fs``.

The real driver, store and sink run a files pipeline without Spark (``LocalPipeline``), so these
tests are fast; the SIGKILL of a real ``splitkeeper run`` mid-commit with object-store staging is in
tests/runtime/test_object_store_staging_crash.py. Each test checks the sink by content: every input
line exactly once.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from splitkeeper.app import services
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.core.ports import CrashPoint, SinkCrashPoint
from splitkeeper.delta import storage
from splitkeeper.sinks.delta.read import read_sink
from splitkeeper.spark.dead_letters import DeadLetterWriter
from splitkeeper.spark.task import StagedWriter
from splitkeeper.staging import PARTS_FILE, StagedRegion, attempt_dir, copy_file, exists, read_table

from .samples import Crash, CrashAt, LocalPipeline, file_lines


@dataclasses.dataclass
class StorePipeline(LocalPipeline):
    """:class:`LocalPipeline` with its state, sink and staging (the default ``<state>/_staging``)
    on the object store; the input stays local."""

    base: str = ""

    @property
    def state(self) -> str:
        return f"{self.base}/state"

    @property
    def sink_path(self) -> str:
        return f"{self.base}/sink"

    @property
    def staging(self) -> str:
        return f"{self.base}/state/_staging"

    def mapping(self, **extra: Any) -> dict[str, Any]:
        return {
            "name": self.name,
            "parallelism": self.parallelism,
            "source": {"kind": "files", "path": str(self.root / "in"), "format": "lines"},
            "state": {"path": self.state},
            "sink": {"path": self.sink_path},
            **extra,
        }


def _objects(location: str) -> list[str]:
    """Every object under ``location`` (paths relative to it)."""
    fs, inner = storage.filesystem(location)
    found = fs.get_file_info(pafs.FileSelector(inner, recursive=True, allow_not_found=True))
    return sorted(i.path[len(inner) + 1 :] for i in found if i.type == pafs.FileType.File)


def _sink_lines(sink: str) -> dict[str, list[tuple[int, str]]]:
    rows = read_sink(sink, ["split_id", "offset", "value"]).to_pylist()
    out: dict[str, list[tuple[int, str]]] = {}
    for row in sorted(rows, key=lambda r: (r["split_id"], r["offset"])):
        out.setdefault(Path(row["split_id"]).name, []).append((int(row["offset"]), row["value"].decode()))
    return out


def test_the_default_staging_of_a_state_on_the_store_is_the_store(s3_store: Any, tmp_path: Path) -> None:
    pipeline = StorePipeline(tmp_path, base=s3_store.location("default"))
    config = config_from_mapping(pipeline.mapping())
    assert config.staging.path == f"{pipeline.state}/_staging"  # no local folder anywhere


def test_every_crash_point_on_object_store_staging_ends_exactly_once_and_maintain_counts_the_orphans(
    s3_store: Any, tmp_path: Path
) -> None:
    pipeline = StorePipeline(tmp_path, base=s3_store.location("crashes"))
    pipeline.write_input(files=2, lines=120)  # 240 records, 20 per epoch: 12 epochs
    pipeline.run(epochs=1)
    assert not (tmp_path / "state").exists()  # nothing local: the staged files went to the store

    epoch = 2
    for point in CrashPoint:
        driver = pipeline.driver(CrashAt(point, epoch))
        driver.open()
        with pytest.raises(Crash):
            for _ in range(2):  # the epoch may be planned by the first call (a redo finished on open)
                driver.run_epoch()
        epoch = driver.state.latest_plan_epoch() + 1
    orphans: list[str] = []
    for sink_point in SinkCrashPoint:

        def die(point: SinkCrashPoint, at: int, wanted: SinkCrashPoint = sink_point) -> None:
            if point is wanted:
                raise Crash(f"{point.value}@{at}")

        driver = pipeline.driver(sink_point=die)
        driver.open()
        if sink_point is SinkCrashPoint.AFTER_FILES_MOVED:
            with pytest.raises(Crash):
                driver.run_epoch()
            # copied into the sink's folder under their adopted names, named by no commit
            crashed = driver.state.latest_plan_epoch()
            orphans = [p for p in _objects(pipeline.sink_path) if p.startswith(f"sk-e{crashed:010d}-")]
            assert orphans
            assert any(name.startswith(f"epoch={crashed}/") for name in _objects(pipeline.staging))
        else:
            driver.run_epoch()  # no side tables in this pipeline: the point is not reached

    pipeline.run()  # to the end: every open recovers what its crash left
    assert _sink_lines(pipeline.sink_path) == file_lines(tmp_path / "in")  # every line exactly once
    assert not [p for p in _objects(pipeline.staging) if p.startswith("epoch=")]  # cleaned up on open

    # a task of committed epoch 1 that finished after its epoch: an object nobody reads
    late = f"{attempt_dir(pipeline.staging, 1, 0, 'late')}/part.parquet"
    copy_file(f"{pipeline.sink_path}/{orphans[0]}", late)
    for key in [f"{pipeline.sink_path}/{name}" for name in orphans] + [late]:
        _age(s3_store, key, hours=48)  # the store reports them two days old (maintain's window is 24 h)
    config = config_from_mapping(pipeline.mapping(maintenance={"history_hours": 0}))
    dry = services.maintain(config, dry_run=True)
    want = {"sink": set(orphans), "staging": {storage.table_uri(late)}}
    assert {where: set(found) for where, found in dry.untracked.items()} == want  # counted, not removed
    assert set(orphans) <= set(_objects(pipeline.sink_path)) and exists(late)
    result = services.maintain(config)
    assert {where: set(found) for where, found in result.untracked.items()} == want
    assert result.untracked_bytes > 0
    assert not set(orphans) & set(_objects(pipeline.sink_path)) and not exists(late)  # removed
    assert _sink_lines(pipeline.sink_path) == file_lines(tmp_path / "in")  # nothing a version names went


def _age(store: Any, location: str, hours: float) -> None:
    """Set the modification time the store reports for the object at ``location`` (versitygw's posix
    backend keeps an object as a file under its data folder, ``<workdir>/s3/<bucket>/<key>``)."""
    _fs, key = storage.filesystem(location)
    then = time.time() - hours * 3600
    os.utime(store.workdir / "s3" / key, (then, then))


def test_staged_writers_publish_only_whole_objects_and_an_abort_leaves_none(s3_store: Any) -> None:
    root = s3_store.location("writers/_staging")
    folder = attempt_dir(root, 3, 1, "a1")
    rows = [(0, 4, b"one"), (4, 8, b"two"), (8, 12, None)]
    with StagedWriter(f"{folder}/part.parquet", 3, 1, partition_by=("split_id",)) as writer:
        writer.add("s-1", rows[:2])
        writer.add("s-2", rows[2:])
        published = writer.commit()
    region = StagedRegion.at(published.path)
    assert region is not None and region.published == PARTS_FILE and region.root == storage.table_uri(root)
    files = region.files()  # the manifest, read from the store
    assert [f.values for f in files] == [{"split_id": "s-1"}, {"split_id": "s-2"}]
    assert all(exists(f.path) for f in files)
    assert read_table(files[0].path, columns=["offset"]).column("offset").to_pylist() == [0, 4]

    dead = DeadLetterWriter(f"{folder}/dead.parquet", 3, 1)
    assert dead.commit() is None and not exists(f"{folder}/dead.parquet")  # none: no object

    aborted = StagedWriter(f"{attempt_dir(root, 3, 2, 'a2')}/part.parquet", 3, 2)
    aborted.add("s-1", rows)
    aborted.abort()  # a task that failed after writing rows: nothing of it stays on the store
    assert _objects(attempt_dir(root, 3, 2, "a2")) == []
    with (
        pytest.raises(RuntimeError),
        StagedWriter(f"{attempt_dir(root, 3, 2, 'a3')}/part.parquet", 3, 2) as w,
    ):
        w.add("s-1", rows)
        raise RuntimeError("the transform failed")
    assert _objects(attempt_dir(root, 3, 2, "a3")) == []
