"""The upkeep of the Delta sink (``maintain``): bin-packing, VACUUM, removing files no commit names
and staged files of epochs the sink recorded; and the staging cleanup of the epoch port."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from splitkeeper.delta import storage
from splitkeeper.delta.retention import retention_hours
from splitkeeper.delta.tables import guarded
from splitkeeper.errors import StateError
from splitkeeper.sinks.port import SupportsUpkeep
from splitkeeper.staging import epoch_folder, epoch_folders

if TYPE_CHECKING:  # pragma: no cover
    from deltalake import DeltaTable

__all__ = ["Upkeep"]


class Upkeep(SupportsUpkeep):
    """The Delta sink's upkeep (part of :class:`~splitkeeper.sinks.delta.sink.DeltaSink`)."""

    path: str
    read_only: bool
    staging_path: str | None

    if TYPE_CHECKING:

        def _get(self) -> DeltaTable | None: ...

        def committed_epoch(self) -> int | None: ...

    def compact(self) -> int:
        """Bin-pack the sink's small files (one per region and epoch) into larger ones; files rewritten.

        The records stay as they are (same rows, new files); the old files stay on disk until
        :meth:`vacuum` removes them, so readers of older versions keep working until then.
        """
        table = self._writable_table("compact the sink")
        metrics: dict[str, Any] = guarded(self.path, table.optimize.compact)
        return int(metrics.get("numFilesRemoved") or 0)

    def vacuum(self, history_hours: float, *, dry_run: bool = False) -> list[str]:
        """Delete the files commits removed more than ``history_hours`` ago (delta-rs's lite vacuum).

        Only files the log tombstoned: never a file of the current version, and never an
        untracked one (a staged file moved in by a commit that did not land yet). ``dry_run``
        lists them and deletes nothing.
        """
        hours = retention_hours(history_hours)
        table = self._get() if dry_run else self._writable_table("vacuum the sink")
        if table is None:
            return []
        files = guarded(
            self.path,
            lambda: table.vacuum(retention_hours=hours, dry_run=dry_run, enforce_retention_duration=False),
        )
        if not dry_run:
            guarded(self.path, table.cleanup_metadata)
        return sorted(files)

    def remove_untracked(
        self, untracked_hours: float, history_hours: float, *, dry_run: bool = False
    ) -> list[tuple[str, int]]:
        """Delete the files in the sink's folder that no Delta version names and that are older than
        ``untracked_hours`` (at least the VACUUM window ``history_hours``); ``(path, bytes)`` of each.

        Listed by delta-rs's full VACUUM (a dry run) less what its lite VACUUM lists: files of a
        commit that died after moving them in, or of a fence loser (rule 3), older than the window
        by their modification time (a move sets it), so a commit moving its files in right now keeps
        them. Only those are deleted (no VACUUM commit); tombstoned files are :meth:`vacuum`'s.
        ``dry_run`` lists them and deletes nothing.
        """
        hours = retention_hours(max(untracked_hours, history_hours))
        table = self._get() if dry_run else self._writable_table("remove untracked files from the sink")
        if table is None:
            return []

        def listing(full: bool) -> set[str]:
            return set(
                guarded(
                    self.path,
                    lambda: table.vacuum(
                        retention_hours=hours, dry_run=True, enforce_retention_duration=False, full=full
                    ),
                )
            )

        untracked = sorted(listing(True) - listing(False))
        fs, inner = storage.filesystem(self.path)
        found = [(path, fs.get_file_info(storage.join(inner, path)).size or 0) for path in untracked]
        if dry_run or not found:
            return found
        for path, _size in found:  # only these: a file that became tracked since is not touched
            fs.delete_file(storage.join(inner, path))
        return found

    def remove_staged_leftovers(
        self, untracked_hours: float, *, dry_run: bool = False
    ) -> list[tuple[str, int]]:
        """Delete the staged files of epochs the sink already recorded (``epoch=N``, N at most
        :meth:`committed_epoch`) that are older than ``untracked_hours``; ``(path, bytes)`` of each.

        No run commits such an epoch again (the fence), so nothing reads them; a later epoch's
        files, which a running or pending epoch may still commit, are never touched.
        """
        if self.staging_path is None:
            return []
        import time

        import pyarrow.fs as pafs

        recorded = self.committed_epoch()
        if recorded is None:
            return []
        cutoff = time.time() - retention_hours(untracked_hours) * 3600
        fs, inner = storage.filesystem(self.staging_path)
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
                if (
                    item.type == pafs.FileType.File
                    and item.mtime is not None
                    and item.mtime.timestamp() < cutoff
                ):
                    found.append((item.path, item.size or 0))
        if not storage.is_local(self.staging_path):  # named as a location (s3://bucket/key), not a key
            found = [(f"{self.staging_path.split('://', 1)[0]}://{p}", n) for p, n in found]
        if not dry_run and not self.read_only:
            for path, _size in found:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(storage.filesystem(path)[1])
        return sorted(found)

    def _writable_table(self, what: str) -> DeltaTable:
        if self.read_only:
            raise StateError(f"the sink at {self.path} is open read-only; cannot {what}", path=self.path)
        table = self._get()
        assert table is not None  # a writable sink created its table
        return table

    def discard(self, epoch: int) -> None:
        """Drop what regions staged for ``epoch`` (idempotent, best effort)."""
        if self.staging_path is None or self.read_only:
            return
        fs, inner = storage.filesystem(self.staging_path)
        with contextlib.suppress(OSError):
            fs.delete_dir(storage.join(inner, epoch_folder(epoch)))

    def discard_through(self, epoch: int) -> None:
        """On open: remove the staged output of epochs up to ``epoch`` (committed or abandoned).

        A driver killed after its checkpoint row, or a cancelled task finishing late,
        leaves ``epoch=N`` folders nobody reads. Newer folders stay: another run may be
        writing them.
        """
        if self.staging_path is None or self.read_only:
            return
        import pyarrow.fs as pafs

        fs, inner = storage.filesystem(self.staging_path)
        try:
            infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True))
        except OSError:
            return
        epochs = dict(epoch_folders([info.base_name for info in infos]))
        for info in infos:
            if info.base_name in epochs and epochs[info.base_name] <= epoch:
                with contextlib.suppress(OSError):
                    fs.delete_dir(info.path)
