"""A third party ships a source kind and a sink kind in its own distribution, and a pipeline runs them.

The distribution exists only in this test: a package ``acme_kinds`` and its ``.dist-info`` with the
entry points of the groups ``splitkeeper.sources`` and ``splitkeeper.sinks`` (what ``pip install``
of its wheel would leave on a path), put on the ``PYTHONPATH`` of a ``splitkeeper`` child process.
No file of the product names it: the kinds' registry (:mod:`splitkeeper.kinds`) finds it. The
source kind ``counter`` has splits of numbered records; the sink kind ``folder`` commits each epoch
as one parquet file and a log of the epochs, fenced on the epoch like any sink of the port
(:mod:`splitkeeper.sinks.port`).
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.runtime.helpers import splitkeeper_subprocess

pytestmark = [pytest.mark.spark, pytest.mark.slow]

INIT = '''
"""Acme's kinds for splitkeeper: the ``counter`` source and the ``folder`` sink."""

from splitkeeper.kinds import SinkFactory, SourceFactory

SOURCE = SourceFactory(
    name="counter", section="acme_kinds.config:CounterSource", connector="acme_kinds.source:connector"
)
SINK = SinkFactory(
    name="folder",
    section="acme_kinds.config:FolderSink",
    sink="acme_kinds.sink:open_sink",
    reader="acme_kinds.sink:open_reader",
)
'''

CONFIG = """
from typing import Any, Literal

from pydantic import Field, ValidationInfo, model_validator

from splitkeeper.config.base import Location, SinkSection, SourceSection, Text, Where, where_of


class CounterSource(SourceSection):
    kind: Literal["counter"]
    splits: int = Field(2, ge=1, description="how many splits")
    records: int = Field(5, ge=0, description="records per split")


class FolderSink(SinkSection):
    kind: Literal["folder"]
    path: Text = Field(description="the folder of the committed epochs")

    def locations(self) -> list[Location]:
        return [Location("sink.path", self.path, "the folder sink rewrites its log there")]

    def checked(self, file: Any, at: Where) -> "FolderSink":
        return self.model_copy(update={"path": at.path(self.path)})
"""

SOURCE = """
from collections.abc import Iterator
from dataclasses import dataclass

from splitkeeper.core.source import RegionReader, SourceConnector, SourceRecord
from splitkeeper.core.types import Split


@dataclass(frozen=True)
class CounterReader(RegionReader):
    def read_range(self, split: Split, start: int, end: int) -> Iterator[SourceRecord]:
        for offset in range(start, end):
            yield SourceRecord(offset, offset + 1, f"{split.split_id}:{offset}".encode())


class CounterConnector(SourceConnector):
    def __init__(self, splits: int, records: int) -> None:
        self._splits = splits
        self._records = records

    @property
    def name(self) -> str:
        return "counter"

    @property
    def bounded(self) -> bool:
        return True

    def discover_splits(self) -> list[Split]:
        return [Split(f"c{i}", end=self._records, subscription="counter") for i in range(self._splits)]

    def subscriptions(self) -> frozenset[str]:
        return frozenset({"counter"})

    def available_end(self, split: Split) -> int:
        return split.end or 0

    def reader(self) -> CounterReader:
        return CounterReader()

    def fingerprint(self) -> str:
        return f"counter:{self._splits}x{self._records}"


def connector(section) -> CounterConnector:
    return CounterConnector(section.splits, section.records)
"""

SINK = '''
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from splitkeeper.core.ports import SinkReceipt
from splitkeeper.errors import ConcurrentRunError
from splitkeeper.sinks.port import Sink, SinkCommit, SinkReader, SinkTable
from splitkeeper.staging import StagedRegion


class FolderSink(Sink):
    """Each epoch one parquet file; ``_log.json`` the epochs committed (the fence: the last one)."""

    def __init__(self, path: str, app_id: str, policy, read_only: bool) -> None:
        self.path = path
        self.app_id = app_id
        self.read_only = read_only
        self.schema = None if policy is None else policy.schema
        if not read_only:
            os.makedirs(path, exist_ok=True)

    def _log(self) -> dict:
        log = Path(self.path, "_log.json")
        return json.loads(log.read_text()) if log.exists() else {}

    def committed_epoch(self):
        epochs = [int(e) for e in self._log()]
        return max(epochs) if epochs else None

    def committed_attempt(self, epoch):
        entry = self._log().get(str(epoch))
        return None if entry is None else entry["attempt"]

    def committed_metadata(self, epoch):
        entry = self._log().get(str(epoch))
        if entry is None:
            return None
        regions = tuple(entry["regions"])
        return SinkCommit(self.app_id, epoch, regions, None, entry["records"], entry["attempt"])

    def commit(self, epoch, outputs, *, expected, attempt_id):
        log = self._log()
        if str(epoch) in log and log[str(epoch)]["attempt"] == attempt_id:
            return SinkReceipt(epoch, log[str(epoch)]["records"], replayed=True)
        if self.committed_epoch() != expected:
            raise ConcurrentRunError(f"folder sink {self.path}: another run committed")
        tables = []
        for run in outputs:
            if run.output is None:
                continue
            region = run.output if isinstance(run.output, StagedRegion) else StagedRegion.at(str(run.output))
            tables += [pq.read_table(f.path) for f in region.files()]
        data = pa.concat_tables(tables) if tables else self.schema.empty_table()
        pq.write_table(data, os.path.join(self.path, f"epoch-{epoch}.parquet"))
        regions = sorted(run.region_id for run in outputs)
        log[str(epoch)] = {"attempt": attempt_id, "records": data.num_rows, "regions": regions}
        tmp = Path(self.path, "_log.json.tmp")
        tmp.write_text(json.dumps(log))
        os.replace(tmp, Path(self.path, "_log.json"))
        return SinkReceipt(epoch, data.num_rows)

    def discard(self, epoch):
        pass

    def discard_through(self, epoch):
        pass

    def reader(self):
        return FolderReader(self.path, self.app_id)


class FolderReader(SinkReader):
    def __init__(self, path: str, app_id: str) -> None:
        self.path = path
        self.app_id = app_id

    def location(self, table):
        return self.path if table is SinkTable.RECORDS else None

    def files(self, table):
        found = sorted(Path(self.path).glob("epoch-*.parquet")) if table is SinkTable.RECORDS else []
        return len(found) if found else None

    def rows(self, table, columns=None, *, epoch=None):
        found = sorted(Path(self.path).glob("epoch-*.parquet"))
        data = pa.concat_tables([pq.read_table(f, columns=columns) for f in found])
        return data if epoch is None else data.filter(pa.compute.field("epoch") == epoch)

    def count(self, table, where=None):
        return self.rows(table).num_rows

    def frame(self, spark, table):
        return spark.read.parquet(*[str(f) for f in sorted(Path(self.path).glob("epoch-*.parquet"))])

    def schema(self, table=SinkTable.RECORDS):
        found = sorted(Path(self.path).glob("epoch-*.parquet"))
        return pq.read_schema(found[0]) if found else None

    def versions(self):
        return {"folder": len(list(Path(self.path).glob("epoch-*.parquet")))}

    def version(self, table):
        return self.versions()["folder"]

    def committed_epoch(self):
        return FolderSink(self.path, self.app_id, None, True).committed_epoch()


def open_sink(config, *, read_only=False, policy=None, crash_point=None):
    return FolderSink(config.sink.path, config.name, policy, read_only)


def open_reader(config):
    return FolderReader(config.sink.path, config.name)
'''

ENTRY_POINTS = """
[splitkeeper.sources]
counter = acme_kinds:SOURCE

[splitkeeper.sinks]
folder = acme_kinds:SINK
"""


def _distribution(root: Path) -> Path:
    """The ``acme-kinds`` distribution as an installed one leaves it: its package and its dist-info."""
    site = root / "site"
    package = site / "acme_kinds"
    package.mkdir(parents=True)
    for name, text in (("__init__", INIT), ("config", CONFIG), ("source", SOURCE), ("sink", SINK)):
        (package / f"{name}.py").write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    info = site / "acme_kinds-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-kinds\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS.lstrip())
    (info / "RECORD").write_text("")
    return site


def test_a_source_kind_and_a_sink_kind_from_another_distribution_run_a_pipeline(tmp_path: Path) -> None:
    site = _distribution(tmp_path)
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        "name: acme\nparallelism: 2\n"
        "source: {kind: counter, splits: 3, records: 7}\n"
        "state: {path: state}\nsink: {kind: folder, path: out}\n"
    )
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])

    first = splitkeeper_subprocess(["run", "--config", str(config), "--json"], PYTHONPATH=path)
    assert first.returncode == 0, first.stderr[-4000:]
    summary = json.loads(first.stdout)
    assert summary["committed_records"] == 21, summary

    rows = sorted(
        (r["split_id"], r["offset"], r["value"])
        for f in sorted((tmp_path / "out").glob("epoch-*.parquet"))
        for r in pq.read_table(f, columns=["split_id", "offset", "value"]).to_pylist()
    )
    assert rows == sorted((f"c{s}", o, f"c{s}:{o}".encode()) for s in range(3) for o in range(7))

    again = splitkeeper_subprocess(["run", "--config", str(config), "--json"], PYTHONPATH=path)
    assert again.returncode == 0, again.stderr[-4000:]
    assert json.loads(again.stdout)["committed_records"] == 0  # every split finished: nothing new

    status = splitkeeper_subprocess(["status", "--config", str(config), "--json"], PYTHONPATH=path)
    assert status.returncode == 0, status.stderr[-4000:]
    assert json.loads(status.stdout)["latest_checkpoint"]["kind"] == "global"

    schema = splitkeeper_subprocess(["config", "schema"], PYTHONPATH=path)
    assert schema.returncode == 0, schema.stderr[-2000:]
    defs = json.loads(schema.stdout)["$defs"]
    assert {"CounterSource", "FolderSink", "FilesSource", "DeltaSink"} <= set(defs)

    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(config.read_text().replace("kind: counter", "kind: countr"))
    refused = splitkeeper_subprocess(["status", "--config", str(wrong)], PYTHONPATH=path)
    assert refused.returncode == 2
    assert "source.kind='countr' is not allowed: one of files, kafka, counter; did you mean 'counter'?" in (
        refused.stderr
    )
