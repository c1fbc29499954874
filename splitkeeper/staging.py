"""The staging layout: where region tasks stage an epoch's records, and how a sink finds them.

The one definition, for the writers (the region task, :mod:`splitkeeper.spark.task`; its dead
letters, :mod:`splitkeeper.spark.dead_letters`; a Spark transform's new attempt,
:mod:`splitkeeper.spark.transform`) and the committer (a sink kind, e.g.
:mod:`splitkeeper.sinks.delta`):

1. A region's attempt of an epoch stages under ``<root>/epoch=<N>/region=<R>/attempt=<id>/``
   (:func:`attempt_dir`): its records in :data:`PART_FILE`, or, for a partitioned sink, one file
   per partition value under Hive-style ``<col>=<value>/`` folders named by the manifest
   :data:`PARTS_FILE` (their paths, relative to it); beside them the side files
   :data:`DEAD_FILE` (bad records) and :data:`FILTERED_FILE` (offsets a Spark transform dropped).
   Only a whole file is ever visible (rule 5 says how, on disk and on an object store).
2. What a region task publishes is a :class:`StagedRegion` (picklable, the ``output`` of its
   :class:`~splitkeeper.core.ports.RegionRun`): the root, epoch, region and attempt it was written
   for and the file it published. A sink reads those fields; it never parses a path the writer
   built. :meth:`StagedRegion.at` reads the layout back from a path given by hand (tests, tools,
   an older run's output), here and nowhere else.
3. :meth:`StagedRegion.adopted_name` is the name a staged file takes in a table: one per epoch,
   region and attempt (and partition file), so a commit redone after a crash finds its own files.
4. ``epoch=<N>`` folders of epochs that are committed or abandoned are garbage
   (:func:`epoch_folders` finds them for the cleanup).
5. The root is a local folder or an object-store prefix (``s3://``/``s3a://``; the default
   ``<state>/_staging`` of a state on an object store). Every read, write, list and delete of a
   staged file goes through :class:`StagedTarget` and the functions below, on the ``pyarrow.fs``
   file system :func:`splitkeeper.delta.storage.filesystem` gives for the path (one credentials
   mechanism: the same ``AWS_*`` options delta-rs gets), on the driver and on every executor alike.
   A local folder is then a choice for one host, not a requirement: on a cluster the driver and
   the executors share only the store. "Only a whole file is visible" (rule 1) holds on both: a
   local file is written under a temporary name and renamed; an object is visible only once its
   upload completed (a PUT, or the completion of a multipart upload), so it is written under its
   final name, and a task killed mid-write leaves no object (at most an incomplete multipart
   upload, which the store's lifecycle rule for them aborts).
6. Why a staging prefix on the store, not the table's data folder: the protocol stays the one of a
   local folder. The commit copies each staged file to its adopted name (rule 3; a server-side
   copy on the same store) and names it in one fenced commit, so (a) a region attempt that never
   commits (declined, timed out, a retried Spark task, a fence loser's epoch) writes nothing into
   any table's folder, (b) the side files (dead letters, filtered offsets) and an upsert's change
   files go to their own tables from the same folder, and (c) every crash point leaves what it
   leaves with a local folder: staged objects under ``epoch=<N>/`` (removed by the epoch cleanup,
   or by ``maintain`` once the sink recorded epoch N) and copies in a table's folder that no
   commit names (``maintain``'s untracked files). A commit redone after a crash finds its copies
   under their adopted names, exactly as after a rename.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

from splitkeeper.delta import storage

__all__ = [
    "DEAD_FILE",
    "FILTERED_FILE",
    "HIVE_NULL",
    "PARTS_FILE",
    "PART_FILE",
    "StagedFile",
    "StagedRegion",
    "StagedTarget",
    "adopted_name",
    "attempt_dir",
    "copy_file",
    "exists",
    "epoch_folder",
    "epoch_folders",
    "parquet_options",
    "partition_folder",
    "partition_text",
    "read_table",
    "relative_to",
    "remove",
    "write_manifest",
    "write_table",
]

PART_FILE = "part.parquet"
#: A partitioned region's manifest: its files (one per partition value), relative to it.
PARTS_FILE = "parts.json"
#: A region attempt's bad records (``errors.tolerance: all``), beside its output.
DEAD_FILE = "dead.parquet"
#: The offsets a Spark transform dropped, as ranges, beside a region's output.
FILTERED_FILE = "filtered.parquet"
#: How a partition folder names a null value (Hive's and Delta's).
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"

_FOLDERS = re.compile(r"(?:^|/)epoch=(\d+)/region=(\d+)/attempt=([A-Za-z0-9_-]+)(?:/|$)")
_EPOCH_FOLDER = re.compile(r"^epoch=(\d+)$")


def attempt_dir(root: str, epoch: int, region: int, attempt: str) -> str:
    """The folder of one region's attempt of ``epoch`` (rule 1)."""
    return os.path.join(root, f"epoch={epoch}", f"region={region}", f"attempt={attempt}")


def new_attempt() -> str:
    """A fresh attempt id (a retried task never shares a file with an earlier attempt)."""
    return uuid.uuid4().hex


def epoch_folder(epoch: int) -> str:
    """The name of epoch ``epoch``'s folder under the staging root."""
    return f"epoch={int(epoch)}"


def epoch_folders(names: Sequence[str]) -> Iterator[tuple[str, int]]:
    """``(name, epoch)`` of each ``epoch=<N>`` folder among ``names`` (the staging root's entries)."""
    for name in names:
        found = _EPOCH_FOLDER.match(name)
        if found is not None:
            yield name, int(found[1])


def partition_text(value: Any) -> str:
    """A partition value as Delta's ``partitionValues`` and the Hive-style folder name write it."""
    if value is None:
        return HIVE_NULL
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)


def partition_folder(values: Mapping[str, Any]) -> str:
    """The ``<col>=<value>/...`` folder of a partitioned file's values (rule 1)."""
    return "/".join(f"{name}={quote(partition_text(value), safe='')}" for name, value in values.items())


def relative_to(path: str, folder: str) -> str:
    """``path`` relative to ``folder`` (``/``-separated), for local paths and URIs alike."""
    text, base = os.fspath(path).replace(os.sep, "/"), os.fspath(folder).replace(os.sep, "/").rstrip("/")
    if text.startswith(base + "/"):
        return text[len(base) + 1 :]
    return os.path.relpath(text, base).replace(os.sep, "/")


def write_manifest(folder: str, files: Sequence[str]) -> str:
    """Write :data:`PARTS_FILE` in ``folder`` atomically: the list of the region's files, relative to
    ``folder`` (each under its :func:`partition_folder`). Its path."""
    manifest = os.path.join(folder, PARTS_FILE)
    listed = [relative_to(path, folder) for path in files]
    with StagedTarget(manifest) as target:
        with target.filesystem.open_output_stream(target.where) as out:
            out.write(json.dumps(listed).encode("utf-8"))
        target.publish()
    return manifest


class StagedTarget:
    """One staged file being written so that only a whole file is ever visible at ``path`` (rule 5).

    A writer writes to :attr:`where` on :attr:`filesystem` (a ``pyarrow.fs`` file system: pass both
    to ``pq.ParquetWriter``/``pq.write_table`` or open :attr:`where` as an output stream), then calls
    :meth:`publish`. Locally :attr:`where` is ``<path>.tmp-<random>`` and :meth:`publish` renames it;
    on an object store it is the object itself (visible once its upload completed). Leaving a
    ``with`` block unpublished (an exception) deletes what was written. Single use, one thread.
    """

    def __init__(self, path: str) -> None:
        self.path = os.fspath(path)
        self.filesystem, self._inner = storage.filesystem(self.path)
        self.local = storage.is_local(self.path)
        if self.local:
            os.makedirs(os.path.dirname(self._inner) or ".", exist_ok=True)
            self.where = f"{self._inner}.tmp-{uuid.uuid4().hex}"
        else:
            self.where = self._inner
        self.published = False

    def publish(self) -> int:
        """Make the written file visible at :attr:`path` (locally: the rename); its size in bytes."""
        if self.local:
            os.replace(self.where, self._inner)
        self.published = True
        return int(self.filesystem.get_file_info(self._inner).size or 0)

    def discard(self) -> None:
        """Delete what was written (best effort; idempotent). A published file too: a writer that
        aborts after some of its files were published takes them back."""
        with contextlib.suppress(OSError):
            self.filesystem.delete_file(self._inner if self.published else self.where)
        self.published = False

    def __enter__(self) -> StagedTarget:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self.published:
            self.discard()


#: Staged columns with one value per file or split (dictionary pages), the record positions (ascending
#: integers: delta-encoded, a few bits a row instead of eight bytes), and the raw record bytes
#: (binary ``value``: no min/max statistics; no reader prunes on them, the sink's Delta statistics
#: leave them out, and computing them is a pass over every value).
_DICTIONARY = ("split_id", "epoch", "region", "ingested_at", "topic", "partition")
_DELTA_ENCODED = ("offset", "next_offset")
_NO_STATISTICS = ("value",)
#: Rows per row group of a staged file (a region task writes whole groups as its rows arrive).
ROW_GROUP_ROWS = 128 * 1024


def parquet_options(schema: Any, *, data_dictionary: bool = False) -> dict[str, Any]:
    """The writer settings of every staged file of ``schema`` (see the constants above).

    ``data_dictionary``: the other columns (a typed decode's data columns) get dictionary pages too,
    as Arrow's defaults give them: the files a writer keeps rows for (partitioned, widened) were
    written with those defaults before these settings, and their low-cardinality columns keep them."""
    import pyarrow as pa

    names = schema.names
    unpruned = {
        f.name
        for f in schema
        if f.name in _NO_STATISTICS and (pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type))
    }
    return {
        "use_dictionary": [
            n
            for n in names
            if n in _DICTIONARY or (data_dictionary and n not in unpruned and n not in _DELTA_ENCODED)
        ],
        "column_encoding": {n: "DELTA_BINARY_PACKED" for n in _DELTA_ENCODED if n in names},
        "write_statistics": [n for n in names if n not in unpruned],
    }


def write_table(table: Any, path: str, **options: Any) -> int:
    """Write the Arrow ``table`` as a parquet file at ``path`` (rule 5: only whole); its size.
    ``options`` go to ``pyarrow.parquet.write_table``."""
    import pyarrow.parquet as pq

    with StagedTarget(path) as target:
        pq.write_table(table, target.where, filesystem=target.filesystem, **options)
        return target.publish()


def read_table(path: str, **options: Any) -> Any:
    """The parquet file at ``path`` as an Arrow table (``options`` go to ``pyarrow.parquet.read_table``)."""
    import pyarrow.parquet as pq

    fs, inner = storage.filesystem(path)
    return pq.read_table(inner, filesystem=fs, **options)


def exists(path: str) -> bool:
    """A staged file is at ``path``."""
    import pyarrow.fs as pafs

    fs, inner = storage.filesystem(path)
    return bool(fs.get_file_info(inner).type == pafs.FileType.File)


def copy_file(source: str, target: str) -> int:
    """Copy the staged file ``source`` to ``target`` (rule 5: only whole; a server-side copy within
    one store); the copy's size."""
    import pyarrow.fs as pafs

    src_fs, src_inner = storage.filesystem(source)
    with StagedTarget(target) as out:
        pafs.copy_files(src_inner, out.where, source_filesystem=src_fs, destination_filesystem=out.filesystem)
        return out.publish()


def remove(path: str) -> None:
    """Delete the staged file at ``path`` if it is there."""
    fs, inner = storage.filesystem(path)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(inner)


@dataclass(frozen=True, slots=True)
class StagedFile:
    """One staged data file: where it is, its name in a table (rule 3), its partition values."""

    path: str
    name: str
    values: Mapping[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StagedRegion:
    """What one region attempt published (rule 2): ``published`` is :data:`PART_FILE` or
    :data:`PARTS_FILE`, relative to the attempt's folder."""

    root: str
    epoch: int
    region: int
    attempt: str
    published: str = PART_FILE

    @property
    def folder(self) -> str:
        return attempt_dir(self.root, self.epoch, self.region, self.attempt)

    @property
    def path(self) -> str:
        """The published file (the manifest of a partitioned region)."""
        return os.path.join(self.folder, self.published)

    @property
    def partitioned(self) -> bool:
        return self.published == PARTS_FILE

    def side(self, name: str) -> StagedFile:
        """The side file ``name`` (:data:`DEAD_FILE`, :data:`FILTERED_FILE`) of this attempt."""
        return StagedFile(os.path.join(self.folder, name), self.adopted_name(name))

    def adopted_name(self, relative: str = PART_FILE) -> str:
        """The table-relative name of this attempt's file ``relative`` (rule 3): one per epoch, region
        and attempt, and, for a partitioned sink's file, under its ``<col>=<value>/`` folders."""
        name = f"sk-e{self.epoch:010d}-r{self.region:05d}-{self.attempt}"
        parts = relative.replace(os.sep, "/").strip("/").split("/")
        if len(parts) > 1:
            return "/".join([*parts[:-1], f"{name}-{parts[-1].removesuffix('.parquet')}.parquet"])
        return f"{name}.parquet"

    def files(self) -> list[StagedFile]:
        """The staged data files: :data:`PART_FILE`, or every file the manifest names. OSError or
        ValueError when the manifest cannot be read."""
        if not self.partitioned:
            return [StagedFile(self.path, self.adopted_name())]
        fs, inner = storage.filesystem(self.path)
        with fs.open_input_stream(inner) as handle:
            listed = json.loads(handle.read())
        return [
            StagedFile(
                os.path.join(self.folder, relative), self.adopted_name(relative), partition_values(relative)
            )
            for relative in map(str, listed)
        ]

    @classmethod
    def at(cls, path: str) -> StagedRegion | None:
        """The region attempt a published path given by hand belongs to (rule 2), or None when the
        path is not in the layout."""
        text = os.fspath(path).replace(os.sep, "/")
        found = _FOLDERS.search(text)
        if found is None:
            return None
        root = text[: found.start()] or "/"
        published = text[found.end() :] or PART_FILE
        return cls(root, int(found[1]), int(found[2]), found[3], published)


def adopted_name(path: str) -> str:
    """The table-relative name of a staged file given by path (rule 3; a path outside the layout is
    its attempt ``once``): :meth:`StagedRegion.adopted_name` of the region attempt it belongs to."""
    text = os.fspath(path).replace(os.sep, "/")
    region = StagedRegion.at(text)
    if region is None:
        return f"sk-once-{os.path.basename(text)}"
    return region.adopted_name(relative_to(text, region.folder))


def partition_values(relative: str) -> dict[str, str | None]:
    """The partition values of a partitioned file, from the ``<col>=<value>`` folders
    :func:`partition_folder` made (the layout read back here, nowhere else); None for null."""
    values: dict[str, str | None] = {}
    for segment in relative.split("/")[:-1]:
        name, sep, value = segment.partition("=")
        if sep:
            values[name] = None if value == HIVE_NULL else unquote(value)
    return values
