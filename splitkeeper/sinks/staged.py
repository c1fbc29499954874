"""What every sink kind does with the region tasks' staged output (:mod:`splitkeeper.staging`):
check that an epoch's outputs may be committed (:func:`acknowledged_outputs`) and drop the staged
folders of epochs that are committed or abandoned (:func:`discard_epoch`,
:func:`discard_epochs_through`: the cleanup of :class:`~splitkeeper.core.ports.EpochSink`; and
:func:`staged_leftovers`, what ``maintain`` removes)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

from splitkeeper.core.ports import RegionRun
from splitkeeper.delta import storage
from splitkeeper.errors import InvalidParameterError
from splitkeeper.staging import StagedRegion, epoch_folder, epoch_folders

__all__ = ["acknowledged_outputs", "discard_epoch", "discard_epochs_through", "staged_leftovers"]


def acknowledged_outputs(epoch: int, outputs: Sequence[RegionRun]) -> list[StagedRegion]:
    """The staged outputs of ``epoch``'s acknowledged regions, each a staged file of this epoch and
    of its own region (its :class:`StagedRegion` says so; a path given by hand is read back by the
    staging layout); anything else is InvalidParameterError and nothing may be committed."""
    found: list[StagedRegion] = []
    for run in outputs:
        if not run.acknowledged:
            raise InvalidParameterError(
                "outputs",
                f"region {run.region_id} ({run.outcome.value})",
                "acknowledged regions' outputs only",
                hint="only acknowledged regions' output may be committed (protocol rule 2.5)",
            )
        if not run.output:
            continue
        staged = (
            run.output if isinstance(run.output, StagedRegion) else StagedRegion.at(os.fspath(run.output))
        )
        if staged is None:
            raise InvalidParameterError(
                "outputs",
                os.fspath(run.output),
                "a staged file under .../epoch=<N>/region=<R>/ (the layout region tasks write)",
            )
        if staged.epoch != epoch:
            raise InvalidParameterError(
                "outputs", staged.path, f"a staged file of epoch {epoch}", hint="it belongs to another epoch"
            )
        if staged.region != run.region_id:
            raise InvalidParameterError(
                "outputs",
                staged.path,
                f"a staged file of region {run.region_id}",
                hint="a region's output must be its own staged file",
            )
        found.append(staged)
    return found


def discard_epoch(staging_path: str, epoch: int) -> None:
    """Drop what regions staged for ``epoch`` under ``staging_path`` (idempotent, best effort)."""
    fs, inner = storage.filesystem(staging_path)
    with contextlib.suppress(OSError):
        fs.delete_dir(storage.join(inner, epoch_folder(epoch)))


def discard_epochs_through(staging_path: str, epoch: int) -> None:
    """Remove the staged output of epochs up to ``epoch`` (committed or abandoned).

    A driver killed after its checkpoint row, or a cancelled task finishing late, leaves
    ``epoch=N`` folders nobody reads. Newer folders stay: another run may be writing them.
    """
    import pyarrow.fs as pafs

    fs, inner = storage.filesystem(staging_path)
    try:
        infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True))
    except OSError:
        return
    epochs = dict(epoch_folders([info.base_name for info in infos]))
    for info in infos:
        if info.base_name in epochs and epochs[info.base_name] <= epoch:
            with contextlib.suppress(OSError):
                fs.delete_dir(info.path)


def staged_leftovers(
    staging_path: str, recorded: int | None, untracked_hours: float, *, delete: bool
) -> list[tuple[str, int]]:
    """The staged files of epochs the sink already recorded (``epoch=N``, N at most ``recorded``)
    older than ``untracked_hours``, ``(path, bytes)`` of each; deleted when ``delete``.

    No run commits such an epoch again (the fence), so nothing reads them; a later epoch's files,
    which a running or pending epoch may still commit, are never touched.
    """
    import time

    import pyarrow.fs as pafs

    from splitkeeper.delta.retention import retention_hours

    if recorded is None:
        return []
    cutoff = time.time() - retention_hours(untracked_hours) * 3600
    fs, inner = storage.filesystem(staging_path)
    found: list[tuple[str, int]] = []
    try:
        infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True))
    except OSError:
        return []
    epochs = dict(epoch_folders([info.base_name for info in infos]))
    for info in infos:
        if info.base_name not in epochs or epochs[info.base_name] > recorded:
            continue
        for item in fs.get_file_info(pafs.FileSelector(info.path, recursive=True)):
            if item.type == pafs.FileType.File and item.mtime is not None and item.mtime.timestamp() < cutoff:
                found.append((item.path, item.size or 0))
    if delete:
        for path, _size in found:
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(path)
    if not storage.is_local(staging_path):  # named as a location (s3://bucket/key), not a key
        scheme = staging_path.split("://", 1)[0]
        found = [(f"{scheme}://{path}", size) for path, size in found]
    return sorted(found)
