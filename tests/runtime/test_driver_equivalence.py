"""One scripted fault schedule, two sets of adapters, one driver: the same protocol decisions.

The simulator and the Spark runtime both run :class:`splitkeeper.core.driver.EpochDriver`
(protocol rule 0.2). This test feeds one fault schedule to both: the Spark runtime gets it
as its fault plan (a region task that raises, a region task that stalls past its timeout),
the simulator's in-memory region runner as declines and timeouts. Both plan from the same
file source. The sequence of checkpoint kinds, the refs of the failed regions and the owner
map of every completed checkpoint must be the same, epoch by epoch; and the Spark sink must
hold every record exactly once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from splitkeeper.app.pipeline import Pipeline
from splitkeeper.config.settings import config_from_mapping, core_settings
from splitkeeper.core.driver import EpochDriver, EpochReport
from splitkeeper.sim.events import RegionFailure
from splitkeeper.sim.simulator import SimClock, SimEpochSink, SimRegionRunner, SimState
from splitkeeper.sim.sink import SimulatedSink
from splitkeeper.sources import build_source
from splitkeeper.spark.faults import FaultPlan

from .helpers import assert_sink_equals_source, pipeline_mapping, write_input

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: (region, epoch) -> fault: epoch 2 region 1 raises, epoch 4 region 2 stalls past its 12 s timeout,
#: epoch 5 regions 0 and 1 raise (two of three: more than max_failure_ratio allows, so it aborts).
SCHEDULE = ("fail:1@2", "stall:60:2@4", "fail:0@5", "fail:1@5")


def _sim_schedule(specs: tuple[str, ...]) -> dict[tuple[int, int], RegionFailure]:
    plan = FaultPlan.parse(specs)
    kinds = {"fail": RegionFailure.DECLINE, "stall": RegionFailure.TIMEOUT}
    return {key: kinds[fault.kind.value] for key, fault in plan.faults.items()}


def _decisions(reports: tuple[EpochReport, ...] | list[EpochReport]) -> list[tuple[Any, ...]]:
    """Per epoch: id, kind, failed regions with their refs, and the checkpoint's owner map."""
    out = []
    for report in reports:
        completed = report.completed
        refs: dict[int, int | None] = {}
        owners: dict[str, int | None] = {}
        if completed is not None:
            refs = {r: s.ref_checkpoint_id for r, s in completed.regions.items() if s.ref_checkpoint_id}
            if completed.enumerator is not None:
                owners = {s.split_id: None for s in completed.enumerator.pool}
                for reader, splits in completed.enumerator.assignments.items():
                    owners.update({s.split_id: reader for s in splits})
        out.append((report.epoch, report.kind.value, refs, owners))
    return out


def test_the_simulator_and_the_spark_runtime_decide_the_same_for_one_fault_schedule(
    spark: Any, tmp_path: Path
) -> None:
    input_dir = tmp_path / "in"
    write_input(input_dir, files=5, lines=60)
    mapping = pipeline_mapping(
        tmp_path, "equivalence", input_dir, parallelism=3, epoch_records=75, region_timeout_s=12
    )
    config = config_from_mapping(mapping)

    pipeline = Pipeline(config, spark, faults=FaultPlan.parse(SCHEDULE))
    try:
        pipeline.open()
        spark_run = pipeline.run()
    finally:
        pipeline.close()
    assert spark_run.finished
    assert_sink_equals_source(spark, config.sink.path, input_dir)

    runner = SimRegionRunner(_sim_schedule(SCHEDULE))
    source = build_source(config.source)  # the same driver-side source: discovery and planning
    ledger = SimulatedSink()
    sim = EpochDriver(
        core_settings(config),
        source,
        runner,
        SimEpochSink(ledger, runner),
        SimState(),
        SimClock(),
    )
    sim.open()
    sim_run = sim.run()

    spark_decisions, sim_decisions = _decisions(spark_run.epochs), _decisions(sim_run.epochs)
    kinds = [d[1] for d in spark_decisions]
    # the schedule did what it says: a regional checkpoint for each failure, an abort for the double one
    assert kinds[1] == "regional" and kinds[3] == "regional" and kinds[4] == "aborted", kinds
    assert spark_decisions[1][2] == {1: 1} and spark_decisions[3][2] == {2: 3}
    assert len(spark_decisions) == len(sim_decisions)
    for on_spark, in_sim in zip(spark_decisions, sim_decisions, strict=True):
        assert on_spark == in_sim
    assert sim_run.finished
    sizes = {p.name: p.stat().st_size for p in input_dir.iterdir()}
    assert {sid: ledger.spans(sid) for sid in ledger.split_ids()} == {n: [(0, b)] for n, b in sizes.items()}
