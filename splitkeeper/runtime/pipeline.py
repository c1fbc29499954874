"""The epoch runner: one pipeline's driver, from restore to checkpoint, exactly-once into Delta.

One epoch is one checkpoint attempt with a strictly increasing id ``N``:

1. discovery: new splits enter the enumerator (the core decides who owns what);
2. the write-ahead plan of ``N`` (per region, the ranges it reads) is persisted;
3. every region runs as its own Spark job (:mod:`splitkeeper.runtime.regions`):
   a task that raises declines, one past its timeout is cancelled;
4. the core coordinator decides GLOBAL / REGIONAL / ABORTED;
5. the decision is written to ``<staging>/epoch=N/decision.json``, then the
   acknowledged regions' staged output is committed to the sink in one
   idempotent Delta transaction (``txnAppId`` = pipeline, ``txnVersion`` = N)
   whose commit metadata names that decision;
6. the state tables are written (the state rows while the sink commits: nothing reads
   them before the ``checkpoints`` row names them), the ``checkpoints`` row last, once
   the sink commit is in;
7. side effects for acknowledged regions only (external offset commits), the
   failed regions' readers go through partial failover, staging is cleaned,
   retention runs.

Recovery on open: if the sink holds a commit newer than the latest checkpoint
row (the driver died between 5 and 6), the decision file it names is
committed as that checkpoint (a redo); then the latest checkpoint is restored
(a global restore). Epoch ids continue after every id ever planned, so an
abandoned plan is never reused; staging folders of epochs up to the latest
checkpoint, which nothing reads any more, are removed. An ABORTED checkpoint
is followed by a global restore from the latest completed checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from splitkeeper.core.checkpoint import CheckpointResult, CheckpointStore, RegionalCheckpointCoordinator
from splitkeeper.core.enumerator import (
    RecordingEnumeratorContext,
    SplitEnumerator,
    enumerator_for,
    fail_reader,
    restart_reader,
)
from splitkeeper.core.external import positions_to_commit, reconcile_positions
from splitkeeper.core.rescale import Redistribution
from splitkeeper.core.source import ExternallyCheckpointedSource
from splitkeeper.core.types import (
    AuditRecord,
    CheckpointKind,
    CompletedCheckpoint,
    RegionOutcome,
    RegionState,
    Split,
)
from splitkeeper.errors import CheckpointError, ConcurrentRunError, InvalidParameterError, ProtocolError
from splitkeeper.runtime import serde
from splitkeeper.runtime.config import PipelineConfig
from splitkeeper.runtime.faults import CrashPoint, FaultPlan, crash_if_requested, crash_request
from splitkeeper.runtime.regions import RegionStatus, run_regions
from splitkeeper.runtime.sink import DeltaSink, SinkCommit
from splitkeeper.runtime.sources import build_source
from splitkeeper.runtime.sources.base import (
    LostRange,
    PlannedRange,
    SourceConnector,
    SupportsInitialDiscovery,
    SupportsRetentionCheck,
)
from splitkeeper.runtime.staging import FaultKind, RegionResult, run_region_task
from splitkeeper.runtime.state_store import DeltaStateStore
from splitkeeper.runtime.transforms import resolve_transform

log = logging.getLogger("splitkeeper.runtime.pipeline")

_EPOCH_DIR = re.compile(r"^epoch=(\d+)$")

OPERATOR_STATE_KEEP = 8  # epoch summaries each region keeps in its list-style operator state
TAIL_DIVISOR = 4  # a split with less than budget / TAIL_DIVISOR left after its budget is read to its end


class ReaderStateContext(RecordingEnumeratorContext):
    """The enumerator context of the Spark runtime: assignments land in the readers' driver-side state.

    Readers are logical in the driver (reader ``r`` runs as region ``r``'s Spark
    task each epoch); what a reader owns and where it stands is kept here and
    becomes the next plan. Only the enumerator changes it, through
    :meth:`assign_splits` and :meth:`revoke_splits` (and restored splits a
    legacy reader keeps).
    """

    def __init__(self, parallelism: int) -> None:
        super().__init__(parallelism)
        self.reader_splits: dict[int, dict[str, Split]] = {}

    def assign_splits(self, assignment: Mapping[int, Sequence[Split]]) -> None:
        super().assign_splits(assignment)
        for reader, splits in assignment.items():
            mine = self.reader_splits.setdefault(reader, {})
            for split in splits:
                mine[split.split_id] = split

    def revoke_splits(self, revocation: Mapping[int, Sequence[str]]) -> None:
        super().revoke_splits(revocation)
        for reader, ids in revocation.items():
            mine = self.reader_splits.get(reader, {})
            for sid in ids:
                mine.pop(sid, None)


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


@dataclass(frozen=True, slots=True)
class EpochReport:
    """What one epoch did, for progress output, status and tests."""

    epoch: int
    kind: CheckpointKind
    outcomes: dict[int, RegionOutcome]
    records: int
    committed_records: int
    processing_backlog: bool
    reason: str
    elapsed_s: float
    region_errors: dict[int, str] = field(default_factory=dict)
    final: bool = False
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase: plan, read, sink, state
    lost: tuple[LostRange, ...] = ()  # ranges the plan skipped because the source no longer had them

    def line(self) -> str:
        failed = {r: o.value for r, o in self.outcomes.items() if o is not RegionOutcome.ACK}
        regions = f"{len(self.outcomes) - len(failed)}/{len(self.outcomes)} regions ack"
        if failed:
            regions += " (" + ", ".join(f"r{r} {o}" for r, o in sorted(failed.items())) + ")"
        mode = "backlog" if self.processing_backlog else "normal"
        lost = ""
        if self.lost:
            lost = f" LOST {sum(r.count for r in self.lost):,} offsets of {len(self.lost)} split(s) (skip)"
        return (
            f"epoch {self.epoch:>4} {self.kind.value:<8} {regions:<34} "
            f"committed {self.committed_records:>9,} records  [{mode}] {self.elapsed_s:6.2f}s "
            + " ".join(f"{k}={v:.1f}" for k, v in self.phases.items())
            + lost
        )


@dataclass(frozen=True, slots=True)
class RunSummary:
    epochs: tuple[EpochReport, ...]
    finished: bool  # a bounded source was read completely and ended on a global checkpoint
    committed_records: int
    caught_up: bool = False  # until_caught_up: every split reached its end at the start, globally

    def counts(self) -> dict[str, int]:
        out = {k.value: 0 for k in CheckpointKind}
        for e in self.epochs:
            out[e.kind.value] += 1
        return out


@dataclass(frozen=True, slots=True)
class OpenReport:
    """How the pipeline started: fresh, or restored from which checkpoint, and what recovery did."""

    restored_from: int | None
    redone_checkpoint: int | None
    parallelism: int
    previous_parallelism: int | None
    decisions: tuple[AuditRecord, ...]
    external_disagreements: tuple[str, ...] = ()
    mode_reason: str = ""


class Pipeline:
    """Drives one pipeline on Spark. Created on the driver; not thread-safe; one per process.

    ``open()`` restores (or starts fresh), ``run_epoch()`` runs one checkpoint
    attempt, ``run()`` loops with progress. Two runs against the same state fail
    through Delta's optimistic concurrency (ConcurrentRunError), never both act.
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
        crash_request()  # a misspelt SPLITKEEPER_CRASH_AT fails here, before anything is written
        self.config = config
        self.spark = spark
        self.faults = faults or FaultPlan()
        self.progress = progress or (lambda line: None)
        self.connector = connector or build_source(config.source)
        self.store = DeltaStateStore(spark, config.state_path, config.name, self.connector.fingerprint())
        self.sink = DeltaSink(spark, config.sink_path, app_id=config.name)
        self.transform = resolve_transform(config.transform)
        self.redistribution = Redistribution.EVEN_SPLIT
        self.context: ReaderStateContext | None = None
        self.enumerator: SplitEnumerator | None = None
        self.coordinator: RegionalCheckpointCoordinator | None = None
        self.operator_state: dict[int, tuple[str, ...]] = {}
        self._audit_persisted = 0
        self._settled = False  # see open()
        self._next_epoch = 1
        self._sink_version: int | None = None  # the sink's txnVersion this run expects (fencing)
        self._opened: OpenReport | None = None

    # -- start / restore -------------------------------------------------------------------

    def open(self, checkpoint_id: int | None = None, parallelism: int | None = None) -> OpenReport:
        """Recover and restore; start fresh when there is no checkpoint. Call once, before run."""
        redone = self._redo_decided_epoch()
        chosen = None
        if checkpoint_id is not None:
            chosen = self.store.load_checkpoint(checkpoint_id)
            latest = self.store.latest_checkpoint()
            if latest is not None and latest.checkpoint_id != chosen.checkpoint_id:
                raise CheckpointError(
                    f"checkpoint {checkpoint_id} is not the latest ({latest.checkpoint_id}): the sink "
                    "already holds the records of checkpoints after it, so restoring it would read them "
                    f"twice; recover from 'latest' (or {latest.checkpoint_id})",
                    checkpoint_id=checkpoint_id,
                )
        else:
            chosen = self.store.latest_checkpoint()
        self._sink_version = self.sink.committed_version()
        last_planned = self.store.latest_plan_epoch() or 0
        last_done = 0 if chosen is None else chosen.checkpoint_id
        self._next_epoch = max(last_planned, last_done, self._sink_version or 0) + 1
        self._cleanup_completed_staging(last_done)
        report = self._restore(chosen, parallelism, redone)
        self._opened = report
        return report

    def _restore(
        self,
        checkpoint: CompletedCheckpoint | None,
        parallelism: int | None,
        redone: int | None,
        consecutive_regional: int | None = None,
    ) -> OpenReport:
        new_p = parallelism or (self.config.parallelism if checkpoint is None else checkpoint.parallelism)
        if (
            parallelism is None
            and checkpoint is not None
            and self.config.parallelism != checkpoint.parallelism
            and self.store.configured_parallelism(checkpoint.checkpoint_id) != self.config.parallelism
        ):
            # The config's parallelism changed since the checkpoint: it asks for a rescale. When it is
            # what the checkpoint was taken under, the checkpoint's own parallelism came from an
            # explicit rescale (recover --parallelism, the rescale DAG), which stays.
            new_p = self.config.parallelism
        if new_p < 1:
            raise InvalidParameterError("parallelism", new_p, "an integer >= 1")
        context = ReaderStateContext(new_p)
        # The coordinator decides against an in-memory mirror of the checkpoints it may refer to;
        # the Delta store is written by this runner, after the sink commit (DESIGN 5 order).
        mirror = CheckpointStore()
        if checkpoint is not None:
            for cid in reversed(self.store.ref_chain(checkpoint.checkpoint_id)):
                mirror.add(checkpoint if cid == checkpoint.checkpoint_id else self.store.load_checkpoint(cid))
        coordinator = RegionalCheckpointCoordinator(self.config.checkpoint, new_p, mirror)
        first_audit = 0
        if checkpoint is None:
            enumerator = enumerator_for(self.connector, context, self.config.strategy)
            enumerator.start()
            for reader in range(new_p):
                restart_reader(enumerator, context, reader, ())
            self.operator_state = {r: () for r in range(new_p)}
            previous = None
        else:
            if isinstance(self.connector, SupportsInitialDiscovery):
                self.connector.mark_initial_discovery_finished()  # splits new to the checkpoint: earliest
            restored = coordinator.restore(
                checkpoint, new_p, self.redistribution, consecutive_regional=consecutive_regional
            )
            enumerator = enumerator_for(
                self.connector, context, self.config.strategy, restored=restored.enumerator
            )
            first_audit = enumerator.audit_count
            enumerator.start()
            for info in restored.reader_infos():
                restart_reader(enumerator, context, info.reader_id, info.reported_splits)
                if not enumerator.reassign_on_recovery:  # legacy readers keep what they restored
                    context.reader_splits.setdefault(info.reader_id, {}).update(
                        {s.split_id: s for s in info.reported_splits}
                    )
            self.operator_state = {r.region_id: tuple(r.operator_state) for r in restored.regions}
            previous = checkpoint.parallelism
        self.context, self.enumerator, self.coordinator = context, enumerator, coordinator
        # run(until_caught_up) may stop before any epoch: the latest checkpoint is global, at this P.
        self._settled = (
            checkpoint is not None and checkpoint.kind is CheckpointKind.GLOBAL and new_p == previous
        )
        self._audit_persisted = first_audit if checkpoint is not None else 0
        disagreements = self._reconcile_external(checkpoint)
        decisions = tuple(enumerator.audit_since(first_audit))
        return OpenReport(
            restored_from=None if checkpoint is None else checkpoint.checkpoint_id,
            redone_checkpoint=redone,
            parallelism=new_p,
            previous_parallelism=previous,
            decisions=decisions,
            external_disagreements=disagreements,
            mode_reason=coordinator.mode_reason,
        )

    def _external_store(self) -> ExternallyCheckpointedSource | None:
        """The connector when it keeps external positions (DESIGN 3) in this configuration, else None."""
        connector = self.connector
        if isinstance(connector, ExternallyCheckpointedSource) and connector.keeps_external_positions:
            return connector
        return None

    def _reconcile_external(self, checkpoint: CompletedCheckpoint | None) -> tuple[str, ...]:
        external = self._external_store()
        if checkpoint is None or external is None:
            return ()
        positions = {s.split_id: s.position for r in checkpoint.regions.values() for s in r.splits}
        found = reconcile_positions(positions, external.committed_positions())
        for d in found:
            log.warning("external position disagrees with checkpoint %s: %s", checkpoint.checkpoint_id, d)
        return tuple(str(d) for d in found)

    def _decision_path(self, epoch: int) -> str:
        return os.path.join(self.config.staging_path, f"epoch={epoch}", "decision.json")

    def _redo_decided_epoch(self) -> int | None:
        """The driver died after the sink commit of N but before its checkpoint row: write that row now."""
        committed = self.sink.committed_version()
        latest_id = max(self.store.checkpoint_ids(), default=0)
        if committed is None or committed <= latest_id:
            return None
        path = self._decision_path(committed)
        with open(path, encoding="utf-8") as f:
            decision = json.load(f)
        completed = serde.checkpoint_from_rows(decision["checkpoint"], decision["enumerator_rows"])
        audit = [serde.audit_from_row(a) for a in decision["audit"]]
        self.store.commit_checkpoint(completed, audit, configured_parallelism=self.config.parallelism)
        log.warning("recovered checkpoint %s from its sink commit (driver died before its row)", committed)
        self._cleanup_staging(committed)
        return committed

    # -- epochs ------------------------------------------------------------------------------

    @property
    def parallelism(self) -> int:
        assert self.context is not None, "open() first"
        return self.context.parallelism

    def _plan(self, epoch: int) -> dict[int, list[tuple[Split, int, int]]]:
        assert self.context is not None and self.enumerator is not None
        budget_total = self.config.backlog.epoch_records(self.enumerator.processing_backlog)
        active = [
            s for splits in self.context.reader_splits.values() for s in splits.values() if not s.finished
        ]
        per_split = max(1, budget_total // max(1, len(active)))
        plan: dict[int, list[tuple[Split, int, int]]] = {}
        for reader in range(self.parallelism):
            ranges = []
            for split in sorted(self.context.reader_splits.get(reader, {}).values()):
                if split.finished:
                    continue
                end = self._plan_end(split, per_split)
                if end > split.position:
                    ranges.append((split, split.position, end))
            plan[reader] = ranges
        return plan

    def _plan_end(self, split: Split, budget: int) -> int:
        """Where ``split``'s range of this epoch ends: ``budget`` records on, or the split's available
        end when less than a quarter of a budget would be left after that (no tiny remainder that
        costs a whole epoch of its own)."""
        stretched = self.connector.plan_end(split, split.position, budget + budget // TAIL_DIVISOR)
        if stretched >= self.connector.available_end(split):
            return stretched
        return self.connector.plan_end(split, split.position, budget)

    def _unfinished(self) -> int:
        assert self.context is not None
        return sum(
            1 for splits in self.context.reader_splits.values() for s in splits.values() if not s.finished
        ) + (self.enumerator.pool_size if self.enumerator else 0)

    def run_epoch(self, *, final: bool = False) -> EpochReport:
        """Run one checkpoint attempt. ``final`` asks for the bounded job's last (global) checkpoint."""
        assert self.context and self.enumerator and self.coordinator, "open() first"
        self._settled = False
        started = time.monotonic()
        epoch = self._next_epoch
        self._next_epoch += 1
        phases: dict[str, float] = {}
        mark = time.monotonic()

        def lap(name: str) -> None:
            nonlocal mark
            now = time.monotonic()
            phases[name] = round(phases.get(name, 0.0) + now - mark, 3)
            mark = now

        self.sink.prepare_commit()  # Delta's idempotency check of this epoch's sink commit, ahead of time
        self.enumerator.add_splits(self.connector.discover_splits())
        backlog = self.enumerator.processing_backlog
        plan = {} if final else self._plan(epoch)
        plan = {r: plan.get(r, []) for r in range(self.parallelism)}
        plan, lost = self._check_retention(plan)  # before the plan is persisted: fail, or skip and record
        self._check_sink_fence(epoch)  # a run that another run overtook stops before it writes anything
        self._write_plan(epoch, plan)
        lap("plan")
        crash_if_requested(CrashPoint.AFTER_PLAN, epoch)

        reader = self.connector.reader()
        payloads = {
            r: (
                ranges,
                reader,
                self.transform,
                self.config.staging_path,
                epoch,
                r,
                None,
                self.faults.for_region(epoch, r),
            )
            for r, ranges in plan.items()
        }
        runs = run_regions(
            self.spark,
            self.config.name,
            epoch,
            payloads,
            _region_task,
            self.config.checkpoint.region_timeout_s,
        )
        lap("read")
        self.context.on_checkpoint(epoch)
        pending = self.coordinator.trigger(epoch, final=final, now=time.monotonic())
        results: dict[int, RegionResult] = {}
        errors: dict[int, str] = {}
        for r, run in runs.items():
            if run.status is RegionStatus.FINISHED:
                region_result: RegionResult = run.result
                results[r] = region_result
                pending.acknowledge(r, self._acked_state(r, region_result, epoch))
            elif run.status is RegionStatus.FAILED:
                errors[r] = run.error
                pending.decline(r, run.error)
            else:
                errors[r] = run.error
        self.coordinator.expire(pending, now=pending.deadline)  # the timed-out regions
        self._apply_progress(results)
        result = self.coordinator.complete(
            pending,
            lambda fallback: self.enumerator.snapshot(epoch, fallback),  # type: ignore[union-attr]
            processing_backlog=self.enumerator.processing_backlog,
        )
        committed_records = 0
        if result.completed is None:
            self._check_sink_fence(epoch)  # a run another run overtook logs nothing either
            self.store.log_attempt(epoch, result.outcomes, result.reason)
            self._cleanup_staging(epoch)
            # Nothing of this epoch is committed: every reader restarts from the latest checkpoint
            # (a global restore), keeping the coordinator's counter (an aborted forced global resets it).
            self._restore(
                self.store.latest_checkpoint(), self.parallelism, None, self.coordinator.consecutive_regional
            )
        else:
            committed_records = self._commit(epoch, result, results, lap)
        lap("finish")
        report = EpochReport(
            epoch=epoch,
            kind=result.kind,
            outcomes=dict(result.outcomes),
            records=sum(r.records for r in results.values()),
            committed_records=committed_records,
            processing_backlog=backlog,
            reason=result.reason,
            elapsed_s=round(time.monotonic() - started, 3),
            region_errors=errors,
            final=final,
            phases=phases,
            lost=lost,
        )
        self.progress(report.line())
        return report

    def _check_retention(
        self, plan: dict[int, list[tuple[Split, int, int]]]
    ) -> tuple[dict[int, list[tuple[Split, int, int]]], tuple[LostRange, ...]]:
        """Check the epoch's ranges against what a source with retention still holds.

        With ``on_offset_out_of_range: fail`` the source raises SourceError and
        nothing of the epoch is written. With ``skip`` a range that starts below
        what the source still has is moved up (possibly to an empty range, which
        still moves the split's position when its region acknowledges), and each
        loss becomes a SKIPPED_LOST_RANGE audit record, persisted with the
        checkpoint. Sources without the capability are not asked.
        """
        connector = self.connector
        flat = [(r, PlannedRange(*rng)) for r, ranges in plan.items() for rng in ranges]
        if not flat or not isinstance(connector, SupportsRetentionCheck):
            return plan, ()
        assert self.enumerator is not None
        check = connector.check_retention([rng for _r, rng in flat])
        if len(check.ranges) != len(flat):
            raise ProtocolError(
                f"{connector.name}: the retention check returned {len(check.ranges)} ranges for "
                f"{len(flat)} planned ones; it must return every range, in order",
                source=connector.name,
            )
        checked: dict[int, list[tuple[Split, int, int]]] = {r: [] for r in plan}
        for (region, _before), after in zip(flat, check.ranges, strict=True):
            checked[region].append((after.split, after.start, after.end))
        for gone in check.lost:
            self.enumerator.record_lost_range(
                gone.split_id, self.enumerator.owner_of(gone.split_id), gone.detail
            )
        return checked, check.lost

    def _write_plan(self, epoch: int, plan: Mapping[int, Sequence[tuple[Split, int, int]]]) -> None:
        """Persist the write-ahead plan of ``epoch``; another run that planned it first stops this one."""
        try:
            self.store.write_plan(epoch, plan)
        except ConcurrentRunError as err:
            raise ConcurrentRunError(
                f"pipeline {self.config.name!r}: another run planned epoch {epoch} first; only one run may "
                f"drive a pipeline: this run stops without writing, and the state is intact ({err.message})",
                **{**err.params, "pipeline": self.config.name, "epoch_id": epoch},
            ) from err

    def _acked_state(self, region: int, result: RegionResult, epoch: int) -> RegionState:
        assert self.context is not None
        splits = []
        for split in self.context.reader_splits.get(region, {}).values():
            moved = split.at(result.positions.get(split.split_id, split.position))
            if not moved.finished:
                splits.append(moved)
        summary = f"e{epoch}:n{result.records}"
        state = (self.operator_state.get(region, ()) + (summary,))[-OPERATOR_STATE_KEEP:]
        return RegionState(region_id=region, splits=tuple(sorted(splits)), operator_state=state)

    def _apply_progress(self, results: Mapping[int, RegionResult]) -> None:
        """Acknowledged regions' new positions, finished splits and backlog events reach the enumerator.

        All positions first, then finished splits: finishing a split may rebalance, and a split
        moved to another reader must carry its new position, never an older one (re-reading
        records another region already read).
        """
        assert self.context is not None and self.enumerator is not None
        moved: list[Split] = []
        for region, result in results.items():
            mine = self.context.reader_splits.get(region, {})
            for sid, position in result.positions.items():
                if sid in mine:
                    mine[sid] = mine[sid].at(position)
                    moved.append(mine[sid])
        self.enumerator.update_positions(moved)
        for split in moved:
            if split.finished:
                owner = self.enumerator.owner_of(split.split_id)
                if owner is not None:
                    self.enumerator.split_finished(owner, split.split_id)
                for splits in self.context.reader_splits.values():
                    splits.pop(split.split_id, None)
        for result in results.values():
            for sid in result.backlog_finished:
                self.enumerator.report_backlog_finished(sid)

    def _commit(
        self,
        epoch: int,
        result: CheckpointResult,
        results: Mapping[int, RegionResult],
        lap: Callable[[str], None],
    ) -> int:
        assert self.enumerator is not None and self.context is not None and self.coordinator is not None
        assert result.completed is not None
        completed = result.completed
        audit = self.enumerator.audit_since(self._audit_persisted)
        path = self._decision_path(epoch)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(
                {
                    "checkpoint": serde.checkpoint_to_row(completed),
                    "enumerator_rows": []
                    if completed.enumerator is None
                    else serde.enumerator_to_rows(completed.enumerator),
                    "audit": [serde.audit_to_row(a, seq) for seq, a in enumerate(audit)],
                },
                f,
                default=str,
            )
        os.replace(path + ".tmp", path)
        acked = [r for r in result.notify_complete if r in results]
        staged = [staged_path for staged_path in (results[r].staged_path for r in acked) if staged_path]
        lap("decide")
        self._check_sink_fence(epoch)

        # The sink commits while the state store writes the checkpoint's state rows (nothing reads
        # them before the checkpoints row names them); that row waits for the sink commit.
        def commit_sink() -> SinkCommit:
            done = self.sink.commit(epoch, staged, acked, extra_metadata={"decision": path})
            if not done.skipped:
                crash_if_requested(CrashPoint.AFTER_SINK_COMMIT, epoch)  # the state rows may be half written
            return done

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="splitkeeper-sink") as pool:
            sink_commit = pool.submit(commit_sink)

            def after_sink_commit() -> None:
                if sink_commit.result().skipped:
                    raise ConcurrentRunError(
                        f"pipeline {self.config.name!r}: the sink already holds epoch {epoch} from another "
                        "run; only one run may drive a pipeline",
                        pipeline=self.config.name,
                        epoch_id=epoch,
                    )
                self._sink_version = epoch
                lap("sink")
                crash_if_requested(CrashPoint.BEFORE_CHECKPOINT_ROW, epoch)

            self.store.commit_checkpoint(
                completed, audit, before_row=after_sink_commit, configured_parallelism=self.config.parallelism
            )
        commit = sink_commit.result()
        lap("state")
        crash_if_requested(CrashPoint.AFTER_CHECKPOINT_ROW, epoch)
        self._audit_persisted = self.enumerator.audit_count
        failed = result.notify_partially_completed
        self.context.on_checkpoint_complete(epoch, failed)
        for r in acked:
            self.operator_state[r] = completed.regions[r].operator_state
        external = self._external_store()
        if external is not None:
            positions = positions_to_commit(completed.regions, acked)
            if positions:
                external.commit_positions(epoch, positions)
        for r in failed:  # partial failover of the failed regions' readers
            self._restart_failed_reader(r, completed.regions[r])
        self._cleanup_staging(epoch)
        keep = self.config.checkpoint.retain_checkpoints
        self.coordinator.retain(keep)
        self.store.retain(keep, pinned=self.coordinator.pinned_checkpoint_ids)
        lap("retain")
        return int(getattr(commit, "records", 0) or sum(results[r].records for r in acked))

    def _check_sink_fence(self, epoch: int) -> None:
        """Refuse to commit when another run committed to the sink since this run looked (fencing).

        Two runs of one pipeline never both write: the sink's last ``txnVersion`` for this
        app id must still be the one this run saw at open or wrote itself. Concurrent
        commits are caught by Delta itself (concurrent transactions of one app id conflict).
        """
        current = self.sink.committed_version()
        if current != self._sink_version:
            raise ConcurrentRunError(
                f"pipeline {self.config.name!r}: another run committed epoch {current} to the sink while "
                f"this run (at epoch {epoch}, expecting {self._sink_version}) was running; only one run "
                "may drive a pipeline: this run stops without writing, and the state is intact",
                pipeline=self.config.name,
                epoch_id=epoch,
                found=current,
                expected=self._sink_version,
            )

    def _restart_failed_reader(self, region: int, fallback: RegionState) -> None:
        assert self.enumerator is not None and self.context is not None
        self.context.reader_splits[region] = {}
        fail_reader(self.enumerator, self.context, region)
        if not self.enumerator.reassign_on_recovery:
            self.context.reader_splits[region] = {s.split_id: s for s in fallback.splits}
        restart_reader(self.enumerator, self.context, region, fallback.splits)
        self.operator_state[region] = tuple(fallback.operator_state)

    def _cleanup_staging(self, epoch: int) -> None:
        shutil.rmtree(os.path.join(self.config.staging_path, f"epoch={epoch}"), ignore_errors=True)

    def _cleanup_completed_staging(self, latest_checkpoint_id: int) -> None:
        """Remove what earlier runs left in staging for epochs up to the latest checkpoint (on open).

        A driver killed after its checkpoint row, or a cancelled task finishing late, leaves
        ``epoch=N`` folders nobody reads: epochs up to the latest checkpoint are committed
        (or abandoned) for good. Newer folders are kept: another run may be writing them.
        """
        try:
            names = os.listdir(self.config.staging_path)
        except FileNotFoundError:
            return
        for name in names:
            m = _EPOCH_DIR.match(name)
            if m is not None and int(m[1]) <= latest_checkpoint_id:
                shutil.rmtree(os.path.join(self.config.staging_path, name), ignore_errors=True)

    def run(self, epochs: int | None = None, *, until_caught_up: bool = False) -> RunSummary:
        """Run at most ``epochs`` epochs, or (None) until a bounded source is read and checkpointed globally.

        A bounded run finishes with the global checkpoint of the epoch that read its last
        records (a run that restores such a checkpoint and finds no new split runs no epoch);
        only when that checkpoint is regional (a failed region's splits are read
        again) or aborted does another epoch follow, and once nothing is left to read it is
        a final one, forced global (DESIGN 2.6).

        ``until_caught_up`` does the same for an unbounded source (Kafka) against what was
        there when the run began: the run ends on the global checkpoint at which every live
        split has reached the end it had at the start (Spark's ``Trigger.AvailableNow``,
        Flink's bounded ``KafkaSource`` with latest stopping offsets). Records that arrive
        meanwhile may be read too; splits discovered during the run are not waited for.
        """
        if self.context is None:
            self.open()
        targets = self._end_positions() if until_caught_up and not self.connector.bounded else None
        reports: list[EpochReport] = []
        finished = final = False
        # Restored from a global checkpoint with nothing new to read: no idle epoch.
        caught_up = targets is not None and self._settled and not self._behind(targets)
        if self.connector.bounded and self._settled:
            self.enumerator.add_splits(self.connector.discover_splits())  # type: ignore[union-attr]
            finished = self._unfinished() == 0
        while not (finished or caught_up) and (epochs is None or len(reports) < epochs):
            report = self.run_epoch(final=final)
            reports.append(report)
            final = False
            if report.kind is CheckpointKind.ABORTED:
                continue
            if self.connector.bounded and self._unfinished() == 0:
                self.enumerator.add_splits(self.connector.discover_splits())  # type: ignore[union-attr]
                if self._unfinished() == 0:
                    finished = report.kind is CheckpointKind.GLOBAL
                    final = not finished
            elif targets is not None and not self._behind(targets):
                caught_up = report.kind is CheckpointKind.GLOBAL
                final = not caught_up
        return RunSummary(tuple(reports), finished, sum(r.committed_records for r in reports), caught_up)

    def _end_positions(self) -> dict[str, int]:
        """Every live split's available end now: what ``run(until_caught_up=True)`` reads up to."""
        assert self.enumerator is not None, "open() first"
        ends: dict[str, int] = {}
        for split_id in self.enumerator.owners():
            split = self.enumerator.split(split_id)
            if split is not None:
                ends[split_id] = self.connector.available_end(split)
        return ends

    def _behind(self, targets: Mapping[str, int]) -> list[str]:
        """The split ids whose committed position is still short of ``targets`` (finished or
        dropped splits are not behind)."""
        assert self.enumerator is not None
        behind = []
        for split_id, end in targets.items():
            split = self.enumerator.split(split_id)
            if split is not None and not split.finished and split.position < end:
                behind.append(split_id)
        return behind

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


def new_run_id() -> str:
    return uuid.uuid4().hex
