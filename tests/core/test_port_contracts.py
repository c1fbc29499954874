"""The port contracts (tests/core/port_contracts.py) on the simulator's in-memory adapters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from core.port_contracts import EpochSinkContract, Run, StateStoreContract
from splitkeeper.core.ports import EpochSink, RegionRun, StateStore
from splitkeeper.core.types import Split
from splitkeeper.sim.simulator import SimEpochSink, SimRegionRunner, SimState
from splitkeeper.sim.sink import SimulatedSink


class TestSimStateStore(StateStoreContract):
    def make_store(self) -> StateStore:
        return SimState()

    def restart_checks(self, store: StateStore) -> list[tuple[str, int | None, str, tuple[int, ...]]]:
        assert isinstance(store, SimState)
        return [(c.restore.value, c.checkpoint_id, c.verdict, c.readers) for c in store.restart_checks]


class TestSimEpochSink(EpochSinkContract):
    def make_sink(self) -> EpochSink:
        return SimEpochSink(SimulatedSink(), SimRegionRunner())

    def stage(self, sink: EpochSink, epoch: int, runs: Mapping[int, Sequence[Run]]) -> list[RegionRun]:
        assert isinstance(sink, SimEpochSink)
        plan = {region: [(Split(sid, "t", a), a, b) for sid, a, b in rs] for region, rs in runs.items()}
        return list(sink.runner.run(epoch, plan, timeout_s=1.0).values())

    def committed(self, sink: EpochSink) -> list[tuple[str, int]]:
        assert isinstance(sink, SimEpochSink)
        return sorted((sid, offset) for sid, a, b in sink.sink.runs() for offset in range(a, b))
