"""The Spark runtime of the epoch driver: adapters for the ports of :mod:`splitkeeper.core.ports`.

The protocol (restore and redo, plan, checkpoint, commit order, failover,
rescale, finish) is :class:`splitkeeper.core.driver.EpochDriver`'s. This module
supplies what it runs on:

- :class:`SparkRegionRunner`: every region as its own Spark job
  (:mod:`splitkeeper.runtime.regions`), the region task body
  (:func:`splitkeeper.runtime.staging.run_region_task`) writing one staged parquet
  file per region and attempt;
- :class:`StagedDeltaSink`: the exactly-once Delta sink over those staged files;
- :class:`DeltaState`: the Delta state tables;
- :class:`RuntimeHooks`: crash injection (``SPLITKEEPER_CRASH_AT``) and progress lines.

:class:`Pipeline` puts them together for one pipeline config and Spark session.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from splitkeeper.core import driver as core_driver
from splitkeeper.core.driver import (
    DriverSettings,
    EpochDriver,
    EpochReport,
    OpenReport,
    ReaderStateContext,
    RunSummary,
)
from splitkeeper.core.ports import (
    Clock,
    CrashPoint,
    DriverHooks,
    EpochDecision,
    EpochPlan,
    EpochSink,
    RegionRun,
    RegionRunner,
    SinkReceipt,
    StateStore,
)
from splitkeeper.core.rescale import Redistribution
from splitkeeper.core.source import SourceConnector
from splitkeeper.core.types import CompletedCheckpoint, RegionOutcome
from splitkeeper.errors import ConcurrentRunError
from splitkeeper.runtime import serde
from splitkeeper.runtime.config import PipelineConfig
from splitkeeper.runtime.faults import FaultPlan, crash_if_requested, crash_request
from splitkeeper.runtime.regions import RegionStatus, run_regions
from splitkeeper.runtime.sink import DeltaSink
from splitkeeper.runtime.sources import build_source
from splitkeeper.runtime.staging import FaultKind, RegionResult, run_region_task
from splitkeeper.runtime.state_store import DeltaStateStore
from splitkeeper.runtime.transforms import Transform, resolve_transform

__all__ = [
    "DeltaState",
    "EpochReport",
    "OpenReport",
    "Pipeline",
    "ReaderStateContext",
    "RunSummary",
    "RuntimeHooks",
    "SparkRegionRunner",
    "StagedDeltaSink",
    "SystemClock",
    "driver_settings",
    "run_pipeline",
]

log = logging.getLogger("splitkeeper.runtime.pipeline")
#: One record per epoch and per interval switch: the run's story (the CLI shows them as bare lines).
PROGRESS_LOG = logging.getLogger("splitkeeper.progress")

_EPOCH_DIR = re.compile(r"^epoch=(\d+)$")

OPERATOR_STATE_KEEP = core_driver.OPERATOR_STATE_KEEP


def driver_settings(config: PipelineConfig, redistribution: Redistribution | None = None) -> DriverSettings:
    """The driver's view of a pipeline config (``redistribution`` overrides ``rescale.operator_state``)."""
    return DriverSettings(
        pipeline=config.name,
        parallelism=config.parallelism,
        checkpoint=config.checkpoint,
        backlog=config.backlog,
        retain_checkpoints=config.checkpoint.retain_checkpoints,
        strategy=config.strategy,
        strategy_options={"capacities": dict(config.capacities)} if config.strategy == "weighted" else {},
        redistribution=redistribution or config.operator_state.redistribution,
        rebalance_threshold=config.rebalance_threshold,
    )


# --------------------------------------------------------------------------- adapters


class SystemClock(Clock):
    """The process's monotonic clock."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class RuntimeHooks(DriverHooks):
    """Crash injection at the driver's crash points (``SPLITKEEPER_CRASH_AT``) and progress lines."""

    def __init__(self, progress: Callable[[str], None] | None = None) -> None:
        crash_request()  # a misspelt SPLITKEEPER_CRASH_AT fails here, before anything is written
        self._progress = progress or (lambda line: None)

    def crash_point(self, point: CrashPoint, epoch: int) -> None:
        crash_if_requested(point, epoch)

    def progress(self, line: str, **context: Any) -> None:
        PROGRESS_LOG.info(line, extra=context)
        self._progress(line)


def _region_task(payload: tuple[Any, ...]) -> RegionResult:
    """The body of a region's Spark task (module-level so it pickles by reference).

    A ``flaky`` fault applies to the task's first attempt only: a retry that Spark makes
    (``spark.task.maxFailures`` > 1, as on clusters) runs clean and writes a new attempt.
    """
    fault = payload[-1]
    if fault is not None and fault.kind is FaultKind.FLAKY:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and context.attemptNumber() > 0:
            payload = (*payload[:-1], None)
    return run_region_task(*payload)


class SparkRegionRunner(RegionRunner):
    """Each region of an epoch as its own one-task Spark job; faults from a :class:`FaultPlan`."""

    def __init__(
        self,
        spark: Any,
        pipeline: str,
        connector: SourceConnector,
        transform: Transform,
        staging_path: str,
        faults: FaultPlan,
    ) -> None:
        self.spark = spark
        self.pipeline = pipeline
        self.connector = connector
        self.transform = transform
        self.staging_path = staging_path
        self.faults = faults

    def run(self, epoch: int, plan: EpochPlan, timeout_s: float) -> dict[int, RegionRun]:
        reader = self.connector.reader()
        payloads = {
            r: (
                list(ranges),
                reader,
                self.transform,
                self.staging_path,
                epoch,
                r,
                None,
                self.faults.for_region(epoch, r),
            )
            for r, ranges in plan.items()
        }
        runs = run_regions(self.spark, self.pipeline, epoch, payloads, _region_task, timeout_s)
        out: dict[int, RegionRun] = {}
        for r, run in runs.items():
            if run.status is RegionStatus.FINISHED:
                result: RegionResult = run.result
                out[r] = RegionRun(
                    region_id=r,
                    outcome=RegionOutcome.ACK,
                    positions=dict(result.positions),
                    records=result.records,
                    backlog_finished=tuple(result.backlog_finished),
                    output=result.staged_path,
                    started_after_s=run.started_after_s,
                    elapsed_s=result.elapsed_s,  # the task's own time
                )
            else:
                outcome = (
                    RegionOutcome.DECLINE if run.status is RegionStatus.FAILED else RegionOutcome.TIMEOUT
                )
                out[r] = RegionRun(
                    region_id=r,
                    outcome=outcome,
                    error=run.error,
                    started_after_s=run.started_after_s,
                    elapsed_s=run.elapsed_s,
                )
        return out


class StagedDeltaSink(EpochSink):
    """The Delta sink over the staged files the region tasks wrote under ``staging_path``."""

    def __init__(self, sink: DeltaSink, staging_path: str) -> None:
        self.delta = sink
        self.staging_path = staging_path

    def committed_epoch(self) -> int | None:
        return self.delta.committed_version()

    def committed_attempt(self, epoch: int) -> str | None:
        found = self.delta.committed_metadata(epoch)
        if found is None:
            return None
        attempt = found.metadata.get("attempt_id")
        return None if attempt is None else str(attempt)

    def commit(
        self, epoch: int, outputs: Sequence[RegionRun], *, expected: int | None, attempt_id: str
    ) -> SinkReceipt:
        current = self.delta.committed_version()
        if current != expected:
            raise ConcurrentRunError(
                f"sink {self.delta.path}: pipeline {self.delta.app_id!r} is at epoch {current}, not at "
                f"{expected} as this run expects; another run committed meanwhile",
                pipeline=self.delta.app_id,
                epoch_id=epoch,
                found=current,
                expected=expected,
            )
        staged = [str(o.output) for o in outputs if o.output]
        acked = [o.region_id for o in outputs]
        done = self.delta.commit(epoch, staged, acked, extra_metadata={"attempt_id": attempt_id})
        return SinkReceipt(
            epoch=epoch,
            records=int(done.records or 0) if not done.skipped else 0,
            replayed=done.skipped,
            version=done.table_version,
        )

    def discard(self, epoch: int) -> None:
        shutil.rmtree(os.path.join(self.staging_path, f"epoch={epoch}"), ignore_errors=True)

    def discard_through(self, epoch: int) -> None:
        """Remove what earlier runs left in staging for epochs up to ``epoch`` (on open).

        A driver killed after its checkpoint row, or a cancelled task finishing late, leaves
        ``epoch=N`` folders nobody reads: epochs up to the latest checkpoint are committed
        (or abandoned) for good. Newer folders are kept: another run may be writing them.
        """
        try:
            names = os.listdir(self.staging_path)
        except FileNotFoundError:
            return
        for name in names:
            m = _EPOCH_DIR.match(name)
            if m is not None and int(m[1]) <= epoch:
                shutil.rmtree(os.path.join(self.staging_path, name), ignore_errors=True)


class DeltaState(StateStore):
    """The Delta state tables of one pipeline, through :class:`DeltaStateStore`.

    The decision record of an epoch is written to ``<staging>/epoch=N/decision.json``.
    """

    def __init__(self, store: DeltaStateStore, staging_path: str) -> None:
        self.store = store
        self.staging_path = staging_path

    def latest_checkpoint(self) -> CompletedCheckpoint | None:
        return self.store.latest_checkpoint()

    def load_checkpoint(self, checkpoint_id: int) -> CompletedCheckpoint:
        return self.store.load_checkpoint(checkpoint_id)

    def checkpoint_ids(self) -> list[int]:
        return self.store.checkpoint_ids()

    def ref_chain(self, checkpoint_id: int) -> list[int]:
        return self.store.ref_chain(checkpoint_id)

    def configured_parallelism(self, checkpoint_id: int) -> int | None:
        return self.store.configured_parallelism(checkpoint_id)

    def latest_plan_epoch(self) -> int | None:
        return self.store.latest_plan_epoch()

    def _decision_path(self, epoch: int) -> str:
        return os.path.join(self.staging_path, f"epoch={epoch}", "decision.json")

    def decision(self, epoch: int, attempt_id: str) -> EpochDecision | None:
        try:
            with open(self._decision_path(epoch), encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return None
        if data.get("attempt_id") != attempt_id:
            return None
        completed = serde.checkpoint_from_rows(data["checkpoint"], data["enumerator_rows"])
        return EpochDecision(
            checkpoint=completed,
            attempt_id=attempt_id,
            audit=tuple(serde.audit_from_row(a) for a in data["audit"]),
            acknowledged=tuple(data.get("acknowledged", ())),
            configured_parallelism=data.get("configured_parallelism"),
        )

    def write_plan(self, epoch: int, plan: EpochPlan) -> None:
        self.store.write_plan(epoch, plan)

    def write_decision(self, decision: EpochDecision) -> None:
        completed = decision.checkpoint
        path = self._decision_path(decision.epoch)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(
                {
                    "attempt_id": decision.attempt_id,
                    "checkpoint": serde.checkpoint_to_row(completed),
                    "enumerator_rows": []
                    if completed.enumerator is None
                    else serde.enumerator_to_rows(completed.enumerator),
                    "audit": [serde.audit_to_row(a, seq) for seq, a in enumerate(decision.audit)],
                    "acknowledged": list(decision.acknowledged),
                    "configured_parallelism": decision.configured_parallelism,
                },
                f,
                default=str,
            )
        os.replace(path + ".tmp", path)

    def commit_checkpoint(
        self, decision: EpochDecision, before_row: Callable[[], None] | None = None
    ) -> None:
        self.store.commit_checkpoint(
            decision.checkpoint,
            decision.audit,
            before_row=before_row,
            configured_parallelism=decision.configured_parallelism,
        )

    def log_attempt(self, epoch: int, outcomes: Mapping[int, RegionOutcome], reason: str) -> None:
        self.store.log_attempt(epoch, outcomes, reason)

    def retain(self, keep_latest: int, pinned: Sequence[int] = ()) -> list[int]:
        return self.store.retain(keep_latest, pinned=pinned)


# --------------------------------------------------------------------------- the pipeline


class Pipeline:
    """One pipeline on Spark: the core driver with the Spark runtime's adapters.

    Created on the driver; not thread-safe; one per process. ``open()`` restores
    (or starts fresh), ``run_epoch()`` runs one checkpoint attempt, ``run()`` loops
    with progress. Two runs against the same state never both commit: the sink's
    fence stops the later one with ConcurrentRunError.
    """

    def __init__(
        self,
        config: PipelineConfig,
        spark: Any,
        *,
        faults: FaultPlan | None = None,
        progress: Callable[[str], None] | None = None,
        connector: SourceConnector | None = None,
    ) -> None:
        hooks = RuntimeHooks(progress)
        self.config = config
        self.spark = spark
        self.faults = faults or FaultPlan()
        self.connector = connector or build_source(config.source)
        self.store = DeltaStateStore(spark, config.state_path, config.name, self.connector.fingerprint())
        self.sink = DeltaSink(spark, config.sink_path, app_id=config.name)
        self.transform = resolve_transform(config.transform)
        self.driver = EpochDriver(
            driver_settings(config),
            self.connector,
            SparkRegionRunner(
                spark, config.name, self.connector, self.transform, config.staging_path, self.faults
            ),
            StagedDeltaSink(self.sink, config.staging_path),
            DeltaState(self.store, config.staging_path),
            SystemClock(),
            hooks,
        )

    # -- the driver's view, for callers and tests --

    @property
    def redistribution(self) -> Redistribution:
        return self.driver.redistribution

    @redistribution.setter
    def redistribution(self, value: Redistribution) -> None:
        self.driver.redistribution = value

    @property
    def enumerator(self) -> Any:
        return self.driver.enumerator

    @property
    def context(self) -> ReaderStateContext | None:
        return self.driver.context

    @property
    def coordinator(self) -> Any:
        return self.driver.coordinator

    @property
    def operator_state(self) -> dict[int, tuple[str, ...]]:
        return self.driver.operator_state

    @property
    def parallelism(self) -> int:
        return self.driver.parallelism

    def open(
        self, checkpoint_id: int | None = None, parallelism: int | None = None, *, read_only: bool = False
    ) -> OpenReport:
        """Recover and restore; start fresh when there is no checkpoint. Call once, before run."""
        return self.driver.open(checkpoint_id, parallelism, read_only=read_only)

    def run_epoch(self, *, final: bool = False) -> EpochReport:
        return self.driver.run_epoch(final=final)

    def run(self, epochs: int | None = None, *, until_caught_up: bool = False) -> RunSummary:
        return self.driver.run(epochs, until_caught_up=until_caught_up)

    def close(self) -> None:
        self.sink.close()
        self.connector.close()


def run_pipeline(
    config: PipelineConfig,
    spark: Any,
    epochs: int | None = None,
    faults: Iterable[str] = (),
    progress: Callable[[str], None] | None = None,
    *,
    until_caught_up: bool = False,
) -> RunSummary:
    """Open (recover/restore), run and close: what ``splitkeeper run`` and the epoch job call."""
    pipeline = Pipeline(config, spark, faults=FaultPlan.parse(faults), progress=progress)
    try:
        pipeline.open()
        return pipeline.run(epochs, until_caught_up=until_caught_up)
    finally:
        pipeline.close()
