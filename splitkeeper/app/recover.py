"""The ``recover`` use case (a restore, a rescale, a repair) and its preview."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from splitkeeper.app.assembly import (
    Progress,
    _local_state_missing,
    _named,
    _no_state_error,
    _open_summary,
    _pipeline,
    _state_store,
    writer_lease,
)
from splitkeeper.app.results import (
    AUDIT_SHOWN,
    AuditLine,
    EpochLine,
    RecoverResult,
    RecoveryPreview,
)
from splitkeeper.config.limits import check_parallelism
from splitkeeper.config.settings import PipelineConfig, ReaderMode, with_reader_mode
from splitkeeper.core.rescale import Redistribution
from splitkeeper.errors import (
    CheckpointError,
    InvalidParameterError,
    StateError,
)

if TYPE_CHECKING:
    from splitkeeper.app.pipeline import Pipeline
    from splitkeeper.delta.repair import RepairReport

log = logging.getLogger("splitkeeper.app")


RECOVERY_MODES = ("auto", "global", "partial")


def recovery_mode(mode: str, readers: Sequence[int]) -> str:
    """The mode a recovery runs in: ``auto`` with readers named is ``partial``; the others as given.
    InvalidParameterError for an unknown mode, readers with ``global``, or ``partial`` without readers."""
    if mode not in RECOVERY_MODES:
        raise InvalidParameterError("mode", mode, f"one of {', '.join(RECOVERY_MODES)}")
    if readers and mode == "global":
        raise InvalidParameterError(
            "readers",
            list(readers),
            "none with mode 'global' (a global restore restarts every reader)",
            "name readers with mode 'partial' (or 'auto') to restart only them",
        )
    if mode == "partial" and not readers:
        raise InvalidParameterError(
            "readers",
            list(readers),
            "one or more reader ids with mode 'partial' (the readers to restart, e.g. --readers 2,5)",
            "status shows the per-reader loads; mode 'global' restarts every reader",
        )
    return "partial" if readers else mode


def check_recovery_mode(
    mode: str, parallelism: int | None, parallelism_before: int | None, readers: Sequence[int] = ()
) -> None:
    """``partial`` restarts named readers of the latest checkpoint's parallelism and cannot rescale
    (a partial failover keeps the parallelism, protocol rule 1.3)."""
    mode = recovery_mode(mode, readers)
    if mode == "partial" and parallelism is not None and parallelism != parallelism_before:
        raise InvalidParameterError(
            "mode", mode, "'auto' or 'global' when the parallelism changes (a rescale is a global restore)"
        )
    if len(set(readers)) != len(readers):
        raise InvalidParameterError("readers", list(readers), "distinct reader ids")
    wrong = [r for r in readers if isinstance(r, bool) or not isinstance(r, int) or r < 0]
    if parallelism_before is not None:
        wrong += [r for r in readers if isinstance(r, int) and r >= parallelism_before and r not in wrong]
    if wrong:
        top = (
            ""
            if parallelism_before is None
            else f" < {parallelism_before}, the parallelism of the latest checkpoint"
        )
        raise InvalidParameterError("readers", list(readers), f"reader ids >= 0{top}")


@_named
def recover(
    config: PipelineConfig,
    *,
    checkpoint_id: int | None = None,
    parallelism: int | None = None,
    redistribution: Redistribution | None = None,
    mode: str = "auto",
    dry_run: bool = False,
    epochs: int = 1,
    faults: Iterable[str] = (),
    progress: Progress | None = None,
    release: Iterable[str] = (),
    drop: Iterable[str] = (),
    readers: Sequence[int] = (),
    reader_mode: ReaderMode | None = None,
) -> RecoverResult:
    """A global restore from ``checkpoint_id`` (latest by default), optionally a rescale.

    ``mode`` ``partial`` with ``readers`` (``auto`` with readers is partial): after the restore
    (a restarted driver restores every region: no enumerator survives between processes) the
    named readers restart the way a running job restarts a failed reader (protocol rule 1.3,
    FLIP-537's partial failover: each unregisters, the splits assigned to it since the checkpoint
    are added back, it registers again reporting its region's last good state, and the enumerator
    decides each split), the in-run check proves the result, and the epochs' checkpoints may be
    regional as usual. The other readers keep what the restore gave them.

    Every split's recovery decision is in the result. Unless ``dry_run``, ``epochs``
    epochs run so that the new assignment is committed by a checkpoint at the new
    parallelism. A dry run opens read-only: nothing is written anywhere. ``release``:
    quarantined splits to put back (protocol rule 1.8); they are read again from their
    position, and the release is committed with the next checkpoint (so ``epochs`` >= 1).
    ``drop``: live or quarantined splits whose file is gone, forgotten for good (audited
    DROPPED_BY_OPERATOR; refused while the source still lists one), committed the same way.
    """
    config = with_reader_mode(config, reader_mode)  # this recovery's (None: the file's)
    release = tuple(dict.fromkeys(release))
    drop = tuple(dict.fromkeys(drop))
    both = sorted(set(release) & set(drop))
    if both:
        raise InvalidParameterError(
            "drop", both[0], "a split not also given to --release", "release reads it on, drop forgets it"
        )
    if parallelism is not None:
        check_parallelism(parallelism, or_else=", or None to keep it")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise InvalidParameterError("epochs", epochs, "an integer >= 0")
    if epochs == 0 and not dry_run:
        raise InvalidParameterError(
            "epochs",
            epochs,
            "an integer >= 1, or 0 with --dry-run",
            "a recovery (and a release or a drop) is applied by the checkpoint of the epoch after it, so "
            "with 0 epochs nothing would be applied; --dry-run shows the plan without writing",
        )
    if _local_state_missing(config):
        raise _no_state_error(config, "there is nothing to recover")
    if checkpoint_id is not None:  # checked before the lease: a refused recover writes nothing
        _check_restorable(config, checkpoint_id)
    with contextlib.ExitStack() as stack:
        lease = None if dry_run else stack.enter_context(writer_lease(config))  # a dry run writes nothing
        _require_checkpoint_to_recover(config)  # after the lease: a run starting now is refused by it first
        pipeline = _pipeline(config, lease, faults=faults, progress=progress, read_only=dry_run)
        if redistribution is not None:
            pipeline.redistribution = redistribution
        try:
            latest = pipeline.latest_checkpoint()
            check_recovery_mode(mode, parallelism, None if latest is None else latest.parallelism, readers)
            opened = _open_summary(
                pipeline,
                pipeline.open(checkpoint_id=checkpoint_id, parallelism=parallelism, read_only=dry_run),
            )
            failovers: tuple[str, ...] = ()
            failover_audit: tuple[AuditLine, ...] = ()
            if readers:
                failovers, failover_audit = _partial_failover(pipeline, readers)
            released = tuple(s.split_id for s in pipeline.release(release)) if release else ()
            for split_id in released:
                log.warning("split %s released from quarantine: it is read again from its position", split_id)
            dropped = tuple((s.split_id, s.position) for s in pipeline.drop(drop)) if drop else ()
            for split_id, position in dropped:
                log.warning(
                    "split %s dropped by the operator at position %s: its records before it stay in the "
                    "sink, the rest is never read",
                    split_id,
                    position,
                )
            if dry_run or epochs == 0:
                return RecoverResult(
                    config.name,
                    opened,
                    dry_run,
                    released=released,
                    dropped=dropped,
                    restart_checks=tuple(c.line() for c in pipeline.driver.restart_checks),
                    failovers=failovers,
                    failover_audit=failover_audit,
                )
            summary = pipeline.run(epochs)
        finally:
            pipeline.close()
    return RecoverResult(
        config.name,
        opened,
        dry_run,
        epochs=tuple(EpochLine.of(e) for e in summary.epochs),
        checkpoints=summary.counts(),
        committed_records=summary.committed_records,
        released=released,
        dropped=dropped,
        restart_checks=tuple(c.line() for c in pipeline.driver.restart_checks),
        failovers=failovers,
        failover_audit=failover_audit,
    )


def _partial_failover(
    pipeline: Pipeline, readers: Sequence[int]
) -> tuple[tuple[str, ...], tuple[AuditLine, ...]]:
    """``recover --mode partial --readers``: the named readers through the core's partial failover
    (:meth:`~splitkeeper.core.driver.EpochDriver.fail_readers`); a line per reader and the decisions."""
    enumerator = pipeline.enumerator
    assert enumerator is not None
    mark = enumerator.audit_count
    reports = pipeline.driver.fail_readers(list(readers))
    lines = tuple(
        f"reader {f.reader} restarted from its state in checkpoint {f.ref_checkpoint_id} "
        f"(protocol rule 1.3): {len(f.moved)} split(s) changed owner"
        + (f", {f.foreign} from other readers" if f.foreign else "")
        for f in reports
    )
    for line in lines:
        log.warning("partial recovery: %s", line)
    audit = tuple(
        AuditLine(d.split_id, d.reader_id, d.decision.value, d.detail)
        for d in enumerator.audit_since(mark)[:AUDIT_SHOWN]
    )
    return lines, audit


def repair(config: PipelineConfig, *, dry_run: bool = False) -> RepairReport:
    """Rebuild the rows of kept checkpoints lost or damaged after their commit (``recover --repair``,
    :mod:`splitkeeper.delta.repair`); returns its RepairReport. Holds the lease unless ``dry_run``
    (then nothing is written). No Spark: run the pipeline afterwards as usual."""
    from splitkeeper.app.sink import config_sink
    from splitkeeper.delta import storage
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.delta.repair import repair_files, repair_rows, repair_sink_resets
    from splitkeeper.delta.tables import StateTables

    if storage.is_local(config.state.path) and not os.path.isdir(config.state.path):
        raise StateError(
            f"pipeline {config.name!r} has no state at {config.state.path}: nothing to repair",
            path=config.state.path,
        )
    with contextlib.ExitStack() as stack:
        if not dry_run:
            stack.enter_context(writer_lease(config))
        report = repair_files(StateTables(config.state.path, read_only=dry_run), dry_run=dry_run)
        store = DeltaStateStore(config.state.path, config.name, None, read_only=dry_run)
        repair_rows(store, report)
        repair_sink_resets(store, config_sink(config, read_only=True), report, lambda: config_sink(config))
    for path in report.moved:
        log.warning("state repair: %s %s", "would move" if dry_run else "moved aside", path)
    return report


def rescale(
    config: PipelineConfig,
    parallelism: int,
    redistribution: Redistribution = Redistribution.EVEN_SPLIT,
    *,
    checkpoint_id: int | None = None,
    progress: Progress | None = None,
) -> RecoverResult:
    """Change the parallelism from the latest checkpoint (protocol rule 2.8); one epoch commits it.

    ``checkpoint_id``: the checkpoint the caller previewed (None: the latest); a
    CheckpointError when it is no longer the latest.
    """
    return recover(
        config,
        checkpoint_id=checkpoint_id,
        parallelism=parallelism,
        redistribution=redistribution,
        mode="global",
        progress=progress,
    )


@_named
def preview_recovery(config: PipelineConfig, checkpoint_id: int | None = None) -> RecoveryPreview:
    """The checkpoint a recovery would restore and what every reader would report on registration.

    Read-only. CheckpointError when there is no completed checkpoint, or ``checkpoint_id``
    is not the latest (the sink holds what later checkpoints committed).
    """
    store = _state_store(config)
    ids = store.checkpoint_ids()
    if not ids:
        raise CheckpointError(f"pipeline {config.name!r} has no completed checkpoint to recover from")
    cid = checkpoint_id or ids[-1]
    _check_restorable(config, cid, ids)
    checkpoint = store.load_checkpoint(cid)
    enum = checkpoint.enumerator
    return RecoveryPreview(
        pipeline=config.name,
        checkpoint_id=cid,
        kind=checkpoint.kind.value,
        parallelism_before=checkpoint.parallelism,
        pool=0 if enum is None else len(enum.pool),
        owned={} if enum is None else {str(r): len(s) for r, s in sorted(enum.assignments.items())},
        finished=0 if enum is None else len(enum.finished),
        ref_chain=tuple(store.ref_chain(cid)),
        reports={
            str(r): tuple(s.split_id for s in state.splits) for r, state in sorted(checkpoint.regions.items())
        },
    )


def _check_restorable(config: PipelineConfig, checkpoint_id: int, ids: Sequence[int] | None = None) -> None:
    """``recover --checkpoint N`` restores the latest checkpoint only (the sink holds what later ones
    committed); an older one is a rewind. A CheckpointError saying which, with the ids, otherwise."""
    store = _state_store(config)
    ids = list(store.checkpoint_ids() if ids is None else ids)
    if not ids or checkpoint_id == ids[-1]:
        return
    if checkpoint_id in ids:
        raise CheckpointError(
            f"pipeline {config.name!r}: checkpoint {checkpoint_id} is not the latest ({ids[-1]}): the sink "
            "holds the records of the checkpoints after it, so restoring only the state would read them "
            "twice. To go back to it, rewind state and sink together: "
            f"splitkeeper recover --checkpoint {checkpoint_id} --rewind (prints the plan; --yes applies it). "
            f"Nothing was done; checkpoints that can be restored: {ids[:-1]}",
            checkpoint_id=checkpoint_id,
        )
    why = store.history.why_not_kept(checkpoint_id)
    raise CheckpointError(
        f"pipeline {config.name!r}: checkpoint {checkpoint_id} {why}; nothing was done. available: {ids} "
        f"(recover restores the latest, {ids[-1]}; an older one with --rewind)",
        checkpoint_id=checkpoint_id,
    )


def _require_checkpoint_to_recover(config: PipelineConfig) -> None:
    """``recover`` restores a checkpoint: refused (nothing written but the lease) when the pipeline has none.

    A first epoch whose sink commit landed without its checkpoint row still counts: the
    restore finishes it from its decision record (a redo).
    """
    from splitkeeper.app.sink import sink_reader

    if _state_store(config).checkpoint_ids():
        return
    if sink_reader(config).committed_epoch() is not None:
        return  # a redo: the sink holds an epoch whose checkpoint row is missing
    raise CheckpointError(
        f"pipeline {config.name!r} has no completed checkpoint to recover from (state at "
        f"{config.state.path}); nothing was done. 'splitkeeper run' starts the pipeline",
        pipeline=config.name,
    )
