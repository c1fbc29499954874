"""The incident workflow's use cases: a rewind to a retained checkpoint, and offsets by hand.

``recover --checkpoint N --rewind`` (:func:`rewind`), ``offsets`` (:func:`offsets`) and ``offsets
reset`` (:func:`reset_offset`). None of them starts Spark or asks the source for records: they
read and write the Delta tables with delta-rs, so a dry run answers in about a second.

Each change is an operator checkpoint (:mod:`splitkeeper.core.operator`): its decision record,
the sink's fenced commit (a restore of every table to its version as of N; or a delete of the
records a backward reset reads again), then the checkpoint row. Everything a command can refuse
(the arguments, the checkpoint, a run holding the lease) is checked before anything is written,
the lease included. A command killed part way is finished by the next writer's open (a redo),
or by running the same command again.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from splitkeeper.app.results import _Result
from splitkeeper.config.settings import PipelineConfig
from splitkeeper.core.lag import split_lag_of, split_places
from splitkeeper.core.operator import reset_action, reset_decision, rewind_changes, rewind_decision
from splitkeeper.core.ports import CrashPoint
from splitkeeper.errors import CheckpointError, ConcurrentRunError, InvalidParameterError

if TYPE_CHECKING:  # pragma: no cover
    from splitkeeper.core.ports import EpochDecision
    from splitkeeper.core.types import CompletedCheckpoint
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.sinks.port import Sink, SupportsRewind

__all__ = [
    "OffsetsResult",
    "ResetResult",
    "RewindResult",
    "offsets",
    "operator_name",
    "reset_offset",
    "rewind",
]

log = logging.getLogger(__name__)

OPERATOR_ENV = "SPLITKEEPER_OPERATOR"


def operator_name() -> str:
    """Who runs the command, for the audit trail: ``$SPLITKEEPER_OPERATOR`` (the Airflow task sets
    the DAG run's user there), else ``user@host``."""
    named = os.environ.get(OPERATOR_ENV, "").strip()
    if named:
        return named
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class RewindResult(_Result):
    """What ``recover --rewind`` did or would do. ``applied``: the rewind was committed as
    checkpoint ``epoch``. ``tables``: every table it restores, with its Delta versions and rows
    now and after (``rows_leaving`` per table); ``changes``: every split whose place changes."""

    pipeline: str
    to_checkpoint: int
    from_checkpoint: int
    epoch: int
    applied: bool
    dry_run: bool
    operator: str
    reason: str
    changes: tuple[dict[str, Any], ...] = ()
    tables: tuple[dict[str, Any], ...] = ()
    redone: int | None = None
    restorable: tuple[int, ...] = ()

    @property
    def offsets_undone(self) -> int:
        return sum(int(c["undone"] or 0) for c in self.changes)

    def text(self) -> str:
        """The rewind plan or outcome as the CLI and the recovery DAG's log print it."""
        lines = []
        verb = "rewound" if self.applied else "would rewind"
        lines.append(
            f"pipeline {self.pipeline}: {verb} from checkpoint {self.from_checkpoint} to checkpoint "
            f"{self.to_checkpoint} (committed as checkpoint {self.epoch})"
        )
        if self.redone is not None:
            lines.append(f"checkpoint {self.redone} is finished first from its sink commit (a redo)")
        lines.append(f"splits: {len(self.changes)} change, {self.offsets_undone:,} offsets are read again")
        for change in self.changes[:20]:
            undone = "" if change["undone"] is None else f" ({change['undone']:,} offsets read again)"
            lines.append(f"  {change['split_id']:<40} {change['before']} -> {change['after']}{undone}")
        if len(self.changes) > 20:
            lines.append(f"  ... and {len(self.changes) - 20} more (--json lists every split)")
        lines.append("tables:")
        for table in self.tables:
            lines.append(
                f"  {table['table']:<16} version {table['version_now']} -> {table['version_after']}, rows "
                f"{table['rows_now']:,} -> {table['rows_after']:,} ({table['rows_leaving']:,} leave) "
                f"{table['path']}"
            )
        if not self.applied:
            lines.append("nothing was written; apply it with --yes --reason '...'")
        else:
            lines.append(f"by {self.operator}: {self.reason}; the next run reads on from these positions")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class SplitOffsets(_Result):
    split_id: str
    status: str
    owner: int | None
    position: int | None
    end: int | None
    lag: int | None
    backlog: bool
    checkpoint: int


@dataclass(frozen=True, slots=True)
class OffsetsResult(_Result):
    """``offsets``: every split of the latest checkpoint (and a pending redo's, when one is pending)."""

    pipeline: str
    checkpoint: int | None
    splits: tuple[SplitOffsets, ...] = ()
    lease: str | None = None


@dataclass(frozen=True, slots=True)
class ResetResult(_Result):
    """What ``offsets reset`` did or would do; ``applied``: committed as checkpoint ``epoch``."""

    pipeline: str
    split_id: str
    to: str
    position_before: int
    position_after: int
    epoch: int
    applied: bool
    dry_run: bool
    operator: str
    reason: str
    change: dict[str, Any] = field(default_factory=dict)
    rows_leaving: dict[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------------- shared


def _require_state(config: PipelineConfig) -> None:
    from splitkeeper.app.assembly import _local_state_missing, _no_state_error

    if _local_state_missing(config):
        raise _no_state_error(config, "there is nothing to change")


def _rewinds(sink: Sink) -> SupportsRewind:
    """``sink`` as one that takes operator checkpoints; InvalidParameterError for a sink kind that
    does not (its kind cannot rewind or reset offsets)."""
    from splitkeeper.sinks.port import SupportsRewind

    if not isinstance(sink, SupportsRewind):
        raise InvalidParameterError(
            "sink.kind",
            type(sink).__name__,
            "a sink kind that takes operator checkpoints (a rewind, an offset reset)",
        )
    return sink


def _read_sink(config: PipelineConfig) -> Sink:
    from splitkeeper.app.sink import config_sink

    return config_sink(config, read_only=True)


def _write_sink(config: PipelineConfig) -> Sink:
    from splitkeeper.app.sink import config_sink
    from splitkeeper.spark.faults import crash_if_requested

    return config_sink(config, crash_point=crash_if_requested)


def _latest(store: DeltaStateStore, sink: Sink, pipeline: str) -> tuple[CompletedCheckpoint, int | None]:
    """The pipeline's latest checkpoint, a pending redo's included (then its id is returned too)."""
    from splitkeeper.core.driver import pending_decision

    pending = pending_decision(store, sink, pipeline, sink.committed_epoch())
    if pending is not None:
        return pending.checkpoint, pending.epoch
    latest = store.latest_checkpoint()
    if latest is None:
        raise CheckpointError(f"pipeline {pipeline!r} has no completed checkpoint yet; nothing to change")
    return latest, None


def _next_epoch(store: DeltaStateStore, sink: Sink, latest: int) -> int:
    """The operator checkpoint's id: after every epoch ever planned or committed (rule 1)."""
    return max(latest, store.latest_plan_epoch() or 0, sink.committed_epoch() or 0) + 1


def _refuse_if_leased(
    store: DeltaStateStore, what: str, restorable: tuple[int, ...] = (), wait_s: float = 0.0
) -> None:
    """A run holding the lease refuses the command before anything is written (the lease included).
    With ``lease.wait_s`` > 0 the take decides (it watches the holder for its ttl)."""
    from splitkeeper.delta.lease import PipelineLease

    holder = PipelineLease(store.tables, store.pipeline_name).holder()
    if holder is not None and holder.live() and wait_s <= 0:
        listed = f"; checkpoints that can be restored: {list(restorable)}" if restorable else ""
        raise ConcurrentRunError(
            f"pipeline {store.pipeline_name!r}: {what} refused: a run holds the pipeline's lease "
            f"({holder.owner.describe()}, generation {holder.generation}). Stop it first "
            f"(splitkeeper stop --config ...), then run this again; nothing was written{listed}",
            pipeline=store.pipeline_name,
            holder=holder.owner.describe(),
        )


def _finish_pending(store: DeltaStateStore, sink: Sink, pipeline: str) -> int | None:
    """Under the lease: finish an epoch whose sink commit landed without its row (a killed run or
    operator command; the redo of protocol rule 5.4). Its id, or None."""
    from splitkeeper.core.driver import pending_decision

    decision = pending_decision(store, sink, pipeline, sink.committed_epoch())
    if decision is None:
        return None
    store.commit_checkpoint(decision)
    log.warning(
        "checkpoint %s was finished from its sink commit (the last writer died before its row)",
        decision.epoch,
    )
    return decision.epoch


def _commit(store: DeltaStateStore, sink: Sink, decision: EpochDecision, action: dict[str, Any]) -> None:
    """Operator rule 1: the decision record, the sink's fenced commit of ``action``, the checkpoint
    row; a crash point after each step (``SPLITKEEPER_CRASH_AT``, for the kill tests)."""
    from splitkeeper.spark.faults import crash_if_requested

    epoch = decision.epoch
    store.write_decision(decision)
    crash_if_requested(CrashPoint.AFTER_DECISION, epoch)
    _rewinds(sink).operator_commit(
        epoch, action, expected=sink.committed_epoch(), attempt_id=decision.attempt_id
    )
    crash_if_requested(CrashPoint.BEFORE_CHECKPOINT_ROW, epoch)
    store.commit_checkpoint(decision)
    crash_if_requested(CrashPoint.AFTER_CHECKPOINT_ROW, epoch)


# --------------------------------------------------------------------------- rewind


def _target(store: DeltaStateStore, pipeline: str, checkpoint_id: int, latest: int) -> CompletedCheckpoint:
    """Checkpoint ``checkpoint_id`` when a rewind may go there; else a CheckpointError saying why and
    listing the checkpoints that can be restored."""
    ids = store.checkpoint_ids()
    restorable = [i for i in ids if i < latest]
    listed = f"checkpoints that can be restored: {restorable or 'none (only the latest is kept)'}"
    if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int) or checkpoint_id < 1:
        raise InvalidParameterError("checkpoint", checkpoint_id, f"a checkpoint id ({listed})")
    if checkpoint_id >= latest:
        what = "is the latest checkpoint" if checkpoint_id == latest else f"is after the latest ({latest})"
        raise CheckpointError(
            f"pipeline {pipeline!r}: checkpoint {checkpoint_id} {what}: a rewind goes back to an older "
            f"one; nothing was done. {listed}",
            checkpoint_id=checkpoint_id,
        )
    if checkpoint_id not in ids:
        why = store.history.why_not_kept(checkpoint_id)
        raise CheckpointError(
            f"pipeline {pipeline!r}: checkpoint {checkpoint_id} {why}; nothing was done. {listed}",
            checkpoint_id=checkpoint_id,
        )
    return store.load_checkpoint(checkpoint_id)


def rewind(
    config: PipelineConfig,
    checkpoint_id: int,
    *,
    yes: bool = False,
    dry_run: bool = False,
    reason: str = "",
    operator: str | None = None,
) -> RewindResult:
    """Rewind the pipeline to retained checkpoint ``checkpoint_id`` (``recover --rewind``).

    The state goes back to that checkpoint's, and the sink, the dead-letter table, the filtered
    offsets and an upsert sink's change table go back to their Delta versions as of it, in one
    fenced, audited operator checkpoint (:mod:`splitkeeper.core.operator`); the next run reads on
    from the checkpoint's positions. Without ``yes`` (or with ``dry_run``) nothing is written and
    the result is the plan: per split the offsets that will be read again, per table the rows
    that leave. A refusal (a bad id, a checkpoint retention removed, a run holding the lease)
    writes nothing.
    """
    from splitkeeper.app.assembly import writer_lease
    from splitkeeper.delta.checkpoints import DeltaStateStore

    who = operator or operator_name()
    reason = (reason or "").strip()
    _require_state(config)
    store = DeltaStateStore(config.state.path, config.name, None, read_only=True)
    sink = _read_sink(config)
    latest, pending = _latest(store, sink, config.name)
    target = _target(store, config.name, checkpoint_id, latest.checkpoint_id)
    restorable = tuple(i for i in store.checkpoint_ids() if i < latest.checkpoint_id)
    epoch = _next_epoch(store, sink, latest.checkpoint_id)
    tables = _rewinds(sink).rewind_plan(checkpoint_id)
    changes = rewind_changes(latest, target)
    plan = RewindResult(
        config.name,
        checkpoint_id,
        latest.checkpoint_id,
        epoch,
        False,
        dry_run or not yes,
        who,
        reason,
        tuple(c.to_dict() for c in changes),
        tuple({**t.to_dict(), "rows_leaving": max(0, t.rows_now - t.rows_after)} for t in tables),
        pending,
        restorable,
    )
    if dry_run or not yes:
        return plan
    if not reason:
        raise InvalidParameterError(
            "reason", reason, "a few words on why (the audit trail keeps who, when and why): --reason '...'"
        )
    _refuse_if_leased(store, f"rewind to checkpoint {checkpoint_id}", restorable, config.lease.wait_s)
    with writer_lease(config):
        store = DeltaStateStore(config.state.path, config.name, None)
        sink = _write_sink(config)
        redone = _finish_pending(store, sink, config.name)
        now = store.latest_checkpoint()
        assert now is not None
        latest = now
        target = _target(store, config.name, checkpoint_id, latest.checkpoint_id)
        epoch = _next_epoch(store, sink, latest.checkpoint_id)
        tables = _rewinds(sink).rewind_plan(checkpoint_id)
        decision = rewind_decision(
            latest,
            target,
            epoch,
            attempt_id=uuid.uuid4().hex,
            operator=who,
            reason=reason,
            configured_parallelism=store.configured_parallelism(checkpoint_id),
        )
        versions = {t.label: t.version_after for t in tables}
        _commit(store, sink, decision, {"kind": "rewind", "to": checkpoint_id, "versions": versions})
    log.warning(
        "pipeline %s rewound to checkpoint %s (from %s) as checkpoint %s by %s: %s",
        config.name,
        checkpoint_id,
        latest.checkpoint_id,
        epoch,
        who,
        reason,
    )
    return RewindResult(
        config.name,
        checkpoint_id,
        latest.checkpoint_id,
        epoch,
        True,
        False,
        who,
        reason,
        tuple(c.to_dict() for c in rewind_changes(latest, target)),
        tuple({**t.to_dict(), "rows_leaving": max(0, t.rows_now - t.rows_after)} for t in tables),
        redone if redone is not None else pending,
        restorable,
    )


# --------------------------------------------------------------------------- offsets


def offsets(config: PipelineConfig) -> OffsetsResult:
    """Every split of the latest checkpoint: owner, position, end, lag, backlog flag and the
    checkpoint its position comes from (a failed region's state is an older checkpoint's). Read-only."""
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.delta.lease import PipelineLease

    _require_state(config)
    store = DeltaStateStore(config.state.path, config.name, None, read_only=True)
    latest, _pending = _latest(store, _read_sink(config), config.name)
    refs = {
        split.split_id: state.ref_checkpoint_id or latest.checkpoint_id
        for state in latest.regions.values()
        for split in state.splits
    }
    rows = []
    for place in split_places(latest).values():
        lag = None if place.split is None else split_lag_of(place.split, place.status, place.owner)
        rows.append(
            SplitOffsets(
                place.split_id,
                place.status,
                place.owner,
                place.position,
                None if lag is None else lag.end,
                None if lag is None else lag.lag,
                lag is not None and lag.in_backlog,
                refs.get(place.split_id, latest.checkpoint_id),
            )
        )
    holder = PipelineLease(store.tables, config.name).holder()
    live = holder is not None and holder.live()
    return OffsetsResult(
        config.name, latest.checkpoint_id, tuple(rows), holder.owner.describe() if live and holder else None
    )


def parse_target(to: str) -> tuple[str, int | None]:
    """``--to`` as (kind, number): ``offset:N``, ``timestamp:MS``, ``shift:K`` (K may be negative),
    ``earliest`` or ``latest``. InvalidParameterError naming the forms otherwise."""
    forms = "offset:N, timestamp:MS (epoch milliseconds), earliest, latest or shift:K (K may be negative)"
    text = (to or "").strip()
    if text in ("earliest", "latest"):
        return text, None
    kind, _, number = text.partition(":")
    if kind in ("offset", "timestamp", "shift"):
        try:
            value = int(number)
        except ValueError:
            value = None
        if value is not None and (kind == "shift" or value >= 0):
            return kind, value
    raise InvalidParameterError("--to", to, forms)


def _resolve(
    config: PipelineConfig, split: Any, kind: str, value: int | None
) -> tuple[int, tuple[int, int] | None]:
    """The offset ``--to`` means for ``split``, and the source's log bounds now (None when it has
    none to tell: a file split's end is the split's own). The source looks up earliest, latest and
    timestamp (Kafka), and checks a file offset starts a line (a file's offsets are bytes)."""
    from splitkeeper.sources import build_source

    source = build_source(config.source)
    try:
        bounds_of = getattr(source, "offset_bounds", None)
        bounds = None if bounds_of is None else bounds_of(split)
        if kind == "offset":
            assert value is not None
            position = value
        elif kind == "shift":
            assert value is not None
            position = max(0, split.position + value)
        else:
            lookup = getattr(source, "offset_for", None)
            if lookup is None:
                raise InvalidParameterError("--to", kind, "offset:N or shift:K for this source")
            position = int(lookup(split, kind, value))
        check = getattr(source, "check_offset", None)
        if check is not None:
            check(split, position)
        return position, bounds
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()


def reset_offset(
    config: PipelineConfig,
    split_id: str,
    to: str,
    *,
    dry_run: bool = False,
    reason: str = "",
    operator: str | None = None,
) -> ResetResult:
    """Set ``split_id``'s position (``offsets reset``), as an audited operator checkpoint.

    Forward: the offsets skipped are recorded (SKIPPED_BY_OPERATOR) and the restart checks accept
    exactly that gap. Backward: the split's records from the new offset on leave the sink (and its
    dead letters and filtered ranges) in the same fenced commit, so they are read again once; an
    upsert sink refuses (rewind instead). Refused, writing nothing, while a run holds the lease.
    """
    from splitkeeper.app.assembly import writer_lease
    from splitkeeper.delta.checkpoints import DeltaStateStore

    who = operator or operator_name()
    reason = (reason or "").strip()
    kind, value = parse_target(to)
    _require_state(config)
    store = DeltaStateStore(config.state.path, config.name, None, read_only=True)
    sink = _read_sink(config)
    latest, _pending = _latest(store, sink, config.name)
    place = split_places(latest).get(split_id)
    if place is None or place.split is None:
        # the core names the known splits or says what to do with a finished one
        reset_decision(latest, split_id, 0, latest.checkpoint_id + 1, attempt_id="-", operator=who)
        raise AssertionError("unreachable")  # pragma: no cover
    requested, bounds = _resolve(config, place.split, kind, value)
    epoch = _next_epoch(store, sink, latest.checkpoint_id)
    decision, change = reset_decision(
        latest,
        split_id,
        requested,
        epoch,
        attempt_id=uuid.uuid4().hex,
        operator=who,
        reason=reason,
        bounds=bounds,
    )
    position = split_places(decision.checkpoint)[split_id].position or 0  # clamped to the log
    backward = position < place.split.position
    if backward and config.sink.upsert is not None:
        raise InvalidParameterError(
            "--to",
            to,
            f"an offset >= the split's position {place.split.position} with sink.mode: upsert (its keyed "
            "table cannot take back one split's changes)",
            "rewind the pipeline to a checkpoint before those offsets instead "
            "(splitkeeper recover --checkpoint N --rewind)",
        )
    leaving = dict(_rewinds(sink).rows_from(split_id, position)) if backward else {}
    result = ResetResult(
        config.name,
        split_id,
        to,
        place.split.position,
        position,
        epoch,
        False,
        dry_run,
        who,
        reason,
        change.to_dict(),
        leaving,
    )
    if dry_run:
        return result
    _refuse_if_leased(store, f"offset reset of {split_id}", wait_s=config.lease.wait_s)
    with writer_lease(config):
        store = DeltaStateStore(config.state.path, config.name, None)
        sink = _write_sink(config)
        _finish_pending(store, sink, config.name)
        now = store.latest_checkpoint()
        assert now is not None
        latest = now
        epoch = _next_epoch(store, sink, latest.checkpoint_id)
        decision, change = reset_decision(
            latest,
            split_id,
            requested,
            epoch,
            attempt_id=uuid.uuid4().hex,
            operator=who,
            reason=reason,
            configured_parallelism=store.configured_parallelism(latest.checkpoint_id),
            bounds=bounds,
        )
        action = reset_action(decision)
        assert action is not None and action["forward"] == (not backward)
        _commit(store, sink, decision, action)
    log.warning(
        "pipeline %s: split %s set from offset %s to %s as checkpoint %s by %s",
        config.name,
        split_id,
        result.position_before,
        position,
        epoch,
        who,
    )
    return ResetResult(
        config.name,
        split_id,
        to,
        result.position_before,
        position,
        epoch,
        True,
        False,
        who,
        reason,
        change.to_dict(),
        leaving,
    )
