"""The ``maintain`` use case: upkeep of the state tables and the sink, holding the lease."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from splitkeeper.app.assembly import _named, _state_store, writer_lease
from splitkeeper.app.results import (
    MaintenanceResult,
)
from splitkeeper.config.settings import PipelineConfig
from splitkeeper.errors import (
    InvalidParameterError,
)

if TYPE_CHECKING:
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.sinks.port import Sink, SupportsUpkeep

log = logging.getLogger("splitkeeper.app")


@_named
def maintain(
    config: PipelineConfig, *, history_hours: float | None = None, dry_run: bool = False
) -> MaintenanceResult:
    """Compaction and VACUUM of the state tables and the sink, holding the pipeline's lease.

    Deletes state rows nothing reads any more (deleted checkpoints' enumerator rows, losing
    attempts, plans and decisions older than every kept checkpoint), bin-packs small files,
    and VACUUMs the files commits removed more than ``history_hours`` ago (default:
    ``maintenance.history_hours``). Never a file of a kept checkpoint (and so of a retained
    ref chain) or of an epoch not committed yet. Then removes the leftovers no Delta version names
    once older than ``maintenance.untracked_hours``: files in the sink's folder (a fence loser's, a
    crashed commit's) and staged files of epochs the sink recorded; the staged files of later epochs
    never. ``dry_run`` lists what VACUUM and the leftover removal would remove and changes nothing.
    """
    from splitkeeper.app.sink import config_sink
    from splitkeeper.core.ports import UpkeepCrashPoint
    from splitkeeper.delta import retention
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.spark.faults import crash_if_requested

    hours = config.maintenance.history_hours if history_hours is None else history_hours
    if isinstance(hours, bool) or not isinstance(hours, int | float) or hours < 0:
        raise InvalidParameterError("history_hours", hours, "hours >= 0")
    untracked_window = config.maintenance.untracked_hours
    if dry_run:
        store = _state_store(config)
        sink = _upkeep(config_sink(config, read_only=True))
        vacuumed = {name: tuple(files) for name, files in retention.vacuum_plan(store, hours).items()}
        sink_hours = _sink_hours(store, sink, hours)
        vacuumed["sink"] = tuple(sink.vacuum(sink_hours, dry_run=True))
        leftovers = {
            "sink": sink.remove_untracked(untracked_window, sink_hours, dry_run=True),
            "staging": sink.remove_staged_leftovers(untracked_window, dry_run=True),
        }
        return MaintenanceResult(
            config.name, True, hours, {}, {}, vacuumed, *_untracked(leftovers), untracked_window
        )
    with writer_lease(config):  # no run of the pipeline commits while this holds the lease
        store = DeltaStateStore(config.state.path, config.name, None)
        sink = _upkeep(config_sink(config))
        latest = (store.checkpoint_ids() or [0])[-1]
        compaction = retention.compact(
            store, mid_compaction=lambda: crash_if_requested(UpkeepCrashPoint.MID_COMPACTION, latest)
        )
        compacted = {**compaction.compacted_files, "sink": sink.compact()}
        vacuumed = {name: tuple(files) for name, files in retention.vacuum(store, hours).items()}
        sink_hours = _sink_hours(store, sink, hours)
        vacuumed["sink"] = tuple(sink.vacuum(sink_hours))
        leftovers = {
            "sink": sink.remove_untracked(untracked_window, sink_hours),
            "staging": sink.remove_staged_leftovers(untracked_window),
        }
    for table, files in vacuumed.items():
        for path in files:
            log.info("vacuumed %s: %s", table, path)
    for where, found in leftovers.items():
        for path, size in found:
            log.info(
                "removed untracked %s file (%d bytes, older than %g h): %s",
                where,
                size,
                untracked_window,
                path,
            )
    return MaintenanceResult(
        config.name,
        False,
        hours,
        dict(compaction.deleted_rows),
        compacted,
        vacuumed,
        *_untracked(leftovers),
        untracked_window,
    )


def _upkeep(sink: Sink) -> SupportsUpkeep:
    """``sink`` as one ``maintain`` keeps; InvalidParameterError for a sink kind that keeps itself."""
    from splitkeeper.sinks.port import SupportsUpkeep

    if not isinstance(sink, SupportsUpkeep):
        raise InvalidParameterError("sink.kind", type(sink).__name__, "a sink kind that maintain keeps")
    return sink


def _untracked(found: Mapping[str, Sequence[tuple[str, int]]]) -> tuple[dict[str, tuple[str, ...]], int]:
    """The paths per place, and their bytes in all, of what :func:`maintain` found untracked."""
    paths = {where: tuple(path for path, _size in items) for where, items in found.items()}
    return paths, sum(size for items in found.values() for _path, size in items)


def _sink_hours(store: DeltaStateStore, sink: SupportsUpkeep, hours: float) -> float:
    """The sink's VACUUM keeps at least what a rewind to the oldest retained checkpoint restores."""
    from splitkeeper.sinks.port import SupportsRewind

    ids = store.checkpoint_ids()
    if not ids or not isinstance(sink, SupportsRewind):
        return hours
    needed = sink.hours_since(ids[0])
    if needed > hours:
        log.info(
            "sink VACUUM keeps %.1f h (not %.1f h): a rewind to checkpoint %s restores files removed since",
            needed,
            hours,
            ids[0],
        )
    return max(hours, needed)
