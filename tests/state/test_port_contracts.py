"""The port contracts (tests/core/port_contracts.py) on the Delta adapters: ``DeltaStateStore`` and
``DeltaSink``, on local tables. No Spark."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from core.port_contracts import EpochSinkContract, Run, StateStoreContract

from splitkeeper.core.ports import EpochSink, RegionRun, StateStore
from splitkeeper.core.types import RegionOutcome
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.delta.validations import ValidationRecords
from splitkeeper.sinks.delta.read import read_sink
from splitkeeper.sinks.delta.sink import DeltaSink
from splitkeeper.spark.task import StagedWriter


class TestDeltaStateStore(StateStoreContract):
    @pytest.fixture(autouse=True)
    def _root(self, tmp_path: Path) -> None:
        self.root = tmp_path / "state"

    def make_store(self) -> StateStore:
        return DeltaStateStore(self.root, "contract", "source-fingerprint")

    def restart_checks(self, store: StateStore) -> list[tuple[str, int | None, str, tuple[int, ...]]]:
        assert isinstance(store, DeltaStateStore)
        rows = ValidationRecords(store.tables, "contract").recorded(in_run=True)
        return [(r.restore or "", r.checkpoint_id, r.verdict, r.readers) for r in reversed(rows)]


class TestDeltaSink(EpochSinkContract):
    @pytest.fixture(autouse=True)
    def _root(self, tmp_path: Path) -> None:
        self.root = tmp_path

    def make_sink(self) -> EpochSink:
        return DeltaSink(self.root / "sink", "contract", staging_path=self.root / "staging")

    def stage(self, sink: EpochSink, epoch: int, runs: Mapping[int, Sequence[Run]]) -> list[RegionRun]:
        outputs = []
        for region, region_runs in runs.items():
            folder = (
                self.root / "staging" / f"epoch={epoch}" / f"region={region}" / f"attempt={uuid.uuid4().hex}"
            )
            with StagedWriter(os.path.join(folder, "part.parquet"), epoch, region) as writer:
                for split_id, start, end in region_runs:
                    writer.add(split_id, [(o, o + 1, f"{split_id}@{o}") for o in range(start, end)])
                path = writer.commit().path
            outputs.append(
                RegionRun(
                    region, RegionOutcome.ACK, records=sum(b - a for _, a, b in region_runs), output=path
                )
            )
        return outputs

    def committed(self, sink: EpochSink) -> list[tuple[str, int]]:
        assert isinstance(sink, DeltaSink)
        rows = read_sink(sink.path, ["split_id", "offset"])
        return sorted(
            zip(rows.column("split_id").to_pylist(), rows.column("offset").to_pylist(), strict=True)
        )
