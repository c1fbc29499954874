"""The file source: files in a directory tree (or one file), read line by line.

Splits. Every regular, non-empty file under the source root is one bounded split
whose id is its path relative to the root (``/`` separators). With
``split_bytes > 0`` a larger file is cut into byte ranges ``[a, b)`` with id
``relative/path#a-b``. Names starting with ``.`` or ``_`` are skipped (write a
file under such a name and rename it when complete), and so are files that are
not regular files (a FIFO, a socket, a device: never opened, since opening a FIFO
blocks). An entry that cannot be examined (a symlink loop, a dangling symlink) is
one split ``[0, 1)`` with identity ``unreadable``: its read fails with a
SourceError naming the path, so ``checkpoint.on_split_failure`` applies to it and
the other files are read; once it can be read it is taken as it is then.

File identity (protocol rule 1.9). Every split carries its file's identity,
``f1:<size>:<mtime_ns>:<ctime_ns>:<digest>``, taken at discovery: ``digest`` is a
SHA-256 of the file's first 64 KiB and its last 64 KiB up to ``size`` (the bytes
a growing file keeps, and those a rewrite most likely touches: a header, the last
lines). Not a hash of the whole file: that would read every file again at every
check. Size, mtime and ctime are compared first (a ``stat``, no read): any write,
and any replacement of the file (``os.replace``, ``cp -p``; ctime cannot be set
back), changes one of them; only then is the sample read. The same sample with
only ctime changed (``chmod``, a rename) is the same data; a file of at most
128 KiB is sampled whole, so there a changed mtime with the same sample is the
same data too. What is not caught: a rewrite of bytes in the middle of a file
larger than 128 KiB that keeps its size, its first and last 64 KiB and its mtime
(a deliberate forgery; ``touch -r`` after an in-place edit).
:meth:`FileSource.check_splits` compares the known splits (live and finished,
the identities persisted in the checkpoint; finished ones only when the core asks, at its
``source.recheck_finished_every`` cadence, else only new and live files are looked at) with the
files now: a file that grew
with its first ``size`` bytes unchanged GREW, any other difference CHANGED (its replacement splits get the ids
``relative/path#v<12 hex>``, plus ``#a-b`` for byte ranges), and a file gone from
its path whose size and digest appear at a path no split has is MOVED there. The
core applies ``source.on_file_change``. The region reader refuses to read a split
whose file no longer matches its identity up to the split's data (SourceError):
a planned range is never a mix of old and new bytes.

Positions are byte offsets of line starts. A range ``[a, b)`` holds every line
that STARTS in ``[a, b)`` (Hadoop's rule: unless ``a == 0`` the partial line
around ``a`` belongs to the range before, and the last line is read past ``b``
to its end). Split boundaries are snapped to line starts at discovery (the
nominal cut ``k * split_bytes`` moves forward to the next line start), so the
lines of a split end exactly at ``Split.end``, record offsets per split are
contiguous from ``Split.position`` to ``Split.end``, and a position is always
where the next line starts. The reader still applies Hadoop's rule to any range
it is given, so a range cut mid-line neither loses nor repeats a line.

A file that may grow (``source.on_file_change: append``, ``growing``) is read up to its last
newline: a last line without one may be half written, so it is not part of any split until a
newline ends it (the split ends before it; a file of one such line has no split yet); the split
then grows from there (GREW), so the line is read whole. Under the other policies files are
final, and a last line without a newline is read as it is.

A record's ``offset`` is the byte offset of its line, ``next_offset`` the byte
offset after its newline (the file size for a last line without one), and its
value is the line's bytes, exactly, without the ``\\n`` / ``\\r\\n`` terminator
(and without a UTF-8 byte order mark at offset 0). Nothing is decoded here: turning the
bytes into text is ``decode.kind: text``'s job in the region task, where invalid UTF-8 is
a bad record. Only ``format: jsonl`` reads its lines as text (JSON is UTF-8), and checks them.

Object stores. ``source.path`` may be an ``s3://``, ``s3a://``, ``gs://`` or ``abfss://`` prefix
(or object); every file operation goes through :mod:`splitkeeper.sources.files.fs` (the
seam: ``os`` for a local path, ``pyarrow.fs`` for a store). There a split's file is an object,
the listing replaces the walk (no symlinks, FIFOs or unreadable entries), an object has no
ctime (the fs module's contract 3 says what its identity's third number is and why an
overwrite within Last-Modified's one second is still found), and a region reader builds the
store's file system on the executor from its root URI and the environment (``AWS_*`` for S3; the fs
module's contract 1 for ``gs://`` and ``abfss://``).

Discovery (``source.discovery``): ``full`` lists every name, ``incremental`` the names after the
last one seen; ``notifications`` (an object store) reads the bucket's object events from a Kafka
topic since its checkpointed offsets and looks only at the keys they name
(:mod:`splitkeeper.sources.files.notify`: its contract says when it still lists whole).

The reader reads a range natively (:meth:`FileRegionReader.read_range_columns`:
numpy finds the line boundaries, Arrow holds and validates the values, see
:func:`_read_columns`); :meth:`FileRegionReader.read_range` yields the same
records one by one.
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import json
import logging
import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from splitkeeper.core.source import (
    RegionReader,
    SourceConnector,
    SourceRecord,
    SplitChange,
    SplitChangeKind,
    SupportsDiscoveryCounts,
    SupportsDiscoveryPositions,
    SupportsSplitIdentityCheck,
    SupportsSplitReassignmentOnRecovery,
)
from splitkeeper.core.types import Split, SplitChangePolicy
from splitkeeper.errors import InvalidParameterError, SourceError
from splitkeeper.records.columnar import BadRead, RangeColumns, SupportsColumnarRead
from splitkeeper.sources.files.config import Discovery, FileFormat, FilesSource
from splitkeeper.sources.files.fs import (
    Files,
    FileStat,
    ObjectFiles,
    files_for,
    is_object_store,
    object_root,
    reach_hint,
)
from splitkeeper.sources.files.notify import EventError, EventFeed, parse_events

log = logging.getLogger("splitkeeper.sources.files")

_RANGE_SUFFIX = re.compile(r"#(\d+)-(\d+)$")
_VERSION_SUFFIX = re.compile(r"#v[0-9a-f]{12}$")
_SAMPLE_BYTES = 64 * 1024
_BOM = codecs.BOM_UTF8
#: Objects named by events looked at at once (HEAD and content sample; notification mode).
_LOOKUPS = 32
#: The identity of a split whose file could not be examined at discovery (see the module doc).
UNREADABLE = "unreadable"


def relative_path_of(split_id: str) -> str:
    """The file path (relative to the source root) of a file split id (without range or version)."""
    if "#" not in split_id:  # a whole file's first version: most ids (no regex for them)
        return split_id
    match = _RANGE_SUFFIX.search(split_id)
    rest = split_id[: match.start()] if match else split_id
    version = _VERSION_SUFFIX.search(rest)
    return rest[: version.start()] if version else rest


def _suffix_of(split_id: str) -> str:
    """The ``#a-b`` range suffix of a split id ("" for a whole file)."""
    match = _RANGE_SUFFIX.search(split_id)
    return match.group(0) if match else ""


@functools.lru_cache(maxsize=1 << 18)
def _parsed_identity(text: str) -> FileIdentity | None:
    """:meth:`FileIdentity.parse`, remembered: every plan compares every known file's identity
    (finished ones too), and they rarely change between plans."""
    return FileIdentity.parse(text)


def _reserved(name: str) -> bool:
    return _RANGE_SUFFIX.search(name) is not None or _VERSION_SUFFIX.search(name) is not None


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """A file's identity as a split carries it: ``f1:<size>:<mtime_ns>:<ctime_ns>:<digest>`` (module doc)."""

    size: int
    mtime_ns: int
    ctime_ns: int
    digest: str

    def __str__(self) -> str:
        return f"f1:{self.size}:{self.mtime_ns}:{self.ctime_ns}:{self.digest}"

    @classmethod
    def parse(cls, text: str) -> FileIdentity | None:
        """The identity of ``text``; None for "" or ``unreadable`` (nothing to compare)."""
        parts = text.split(":")
        if len(parts) != 5 or parts[0] != "f1":
            return None
        try:
            return cls(int(parts[1]), int(parts[2]), int(parts[3]), parts[4])
        except ValueError:
            return None

    def same_stat(self, st: FileStat) -> bool:
        """Size, mtime and ctime as at discovery: the file was not written nor replaced since."""
        return (self.size, self.mtime_ns, self.ctime_ns) == st

    @property
    def version(self) -> str:
        """The ``#v<12 hex>`` suffix of the ids of a new version with this identity."""
        return "#v" + hashlib.sha256(str(self).encode()).hexdigest()[:12]


def sample_digest(f: IO[bytes], size: int) -> str:
    """SHA-256 (24 hex) of the first 64 KiB of ``f`` and its last 64 KiB up to byte ``size``."""
    digest = hashlib.sha256()
    f.seek(0)
    head = f.read(min(size, _SAMPLE_BYTES))
    digest.update(head)
    tail_start = max(len(head), size - _SAMPLE_BYTES)
    if tail_start < size:
        f.seek(tail_start)
        digest.update(f.read(size - tail_start))
    digest.update(str(size).encode())
    return digest.hexdigest()[:24]


def _skipped(name: str) -> bool:
    return name[:1] in (".", "_")


def _all_before(prefix: str, key: str) -> bool:
    """Every name that starts with ``prefix`` sorts before ``key``."""
    return prefix < key and not key.startswith(prefix)


def _range_start(split_id: str) -> int:
    match = _RANGE_SUFFIX.search(split_id)
    return int(match.group(1)) if match else 0


@dataclass(frozen=True, slots=True)
class _Scan:
    """One listing of the source: regular non-empty files (rel -> their stat) and entries
    that could not be examined (rel -> why).

    A listing for an epoch that does not recheck finished files (:meth:`FileSource.check_splits`)
    leaves out what it need not look at: ``unchecked`` are files present, known and finished, not
    ``stat``-ed; ``complete`` False: only names after the cursor were listed (incremental), and of
    the known files only those in ``missing`` are known to be gone. ``pending``: names listed
    that were not taken (empty files), which incremental discovery lists again."""

    files: dict[str, FileStat]
    bad: dict[str, str]
    unchecked: frozenset[str] = frozenset()
    complete: bool = True
    missing: set[str] = field(default_factory=set)
    pending: frozenset[str] = frozenset()

    def gone(self, rel: str) -> bool:
        """The file at ``rel`` is not there any more (as far as this listing can tell)."""
        if rel in self.files or rel in self.bad or rel in self.unchecked:
            return False
        return self.complete or rel in self.missing


@dataclass(frozen=True, slots=True)
class _Known:
    """A split the enumerator knows, for :meth:`FileSource.check_splits` (``split`` None: finished)."""

    split_id: str
    identity: str
    split: Split | None


def _line_start_at_or_after(f: IO[bytes], offset: int) -> int:
    """The offset of the first line that starts at or after ``offset`` (``offset > 0``); EOF if none."""
    f.seek(offset - 1)
    return offset - 1 + len(f.readline())


@dataclass(frozen=True, slots=True)
class FileRegionReader(RegionReader, SupportsColumnarRead):
    """Reads ranges of file splits on an executor. Picklable, stateless.

    ``root`` is the directory split ids are relative to; it must be visible
    under the same path on every executor (local disk on one machine, a shared
    mount on a cluster), or an object-store URI: the executor builds its file
    system from it and its environment (:func:`~splitkeeper.sources.files.fs.files_for`).
    """

    root: str
    format: FileFormat = FileFormat.LINES

    def path_of(self, split: Split) -> str:
        return files_for(self.root).join(self.root, relative_path_of(split.split_id))

    def read_range(self, split: Split, start: int, end: int) -> Iterator[SourceRecord]:
        """Yield the lines of ``split`` that start in ``[start, end)`` (see the module doc).

        Opens the file on the call: a missing file, a file shorter than the
        split, or a range outside ``[0, split.end]`` raise SourceError here; a
        line that is not UTF-8 (or, for jsonl, not JSON) raises while iterating.
        The records are those of :meth:`read_range_columns`, one by one.
        """
        f, path = self._open(split, start, end)
        return self._records(f, path, split.split_id, start, end)

    def _records(
        self, f: IO[bytes], path: str, split_id: str, start: int, end: int
    ) -> Iterator[SourceRecord]:
        columns = _read_columns(f, path, split_id, start, end, self.format)
        if columns.bad:
            raise bad_read_error(columns, split_id)
        yield from columns.records()

    def read_range_columns(self, split: Split, start: int, end: int) -> RangeColumns:
        """The lines of ``split`` that start in ``[start, end)`` as Arrow columns, read natively.

        The same records and errors as :meth:`read_range` (every error raises on the call),
        but for a jsonl line that is not UTF-8 or not JSON: it is a record listed in
        ``bad`` (contract 2 of :mod:`~splitkeeper.records.columnar`); see :func:`_read_columns`.
        """
        f, path = self._open(split, start, end)
        return _read_columns(f, path, split.split_id, start, end, self.format)

    def _open(self, split: Split, start: int, end: int) -> tuple[IO[bytes], str]:
        """The split's file, open, after checking the range and the file size; SourceError if not."""
        if not 0 <= start <= end or (split.end is not None and end > split.end):
            raise SourceError(
                f"split {split.split_id!r}: range [{start}, {end}) is not allowed: "
                f"0 <= start <= end <= split end {split.end}",
                split_id=split.split_id,
                start=start,
                end=end,
            )
        path = self.path_of(split)
        try:
            f, st = files_for(self.root).open_with_stat(path)  # closed by _read_columns
        except FileNotFoundError as err:
            raise SourceError(
                f"split {split.split_id!r}: file {path} does not exist any more (deleted or moved after "
                "discovery); restore it, or let the split be dropped with its subscription",
                split_id=split.split_id,
                path=path,
            ) from err
        except OSError as err:
            raise SourceError(
                f"split {split.split_id!r}: file {path} cannot be opened: {err}",
                split_id=split.split_id,
                path=path,
            ) from err
        size = st.size
        if split.end is not None and size < split.end:
            f.close()
            raise SourceError(
                f"split {split.split_id!r}: file {path} has {size} bytes but the split ends at {split.end}: "
                "the file was truncated or replaced after discovery (files must not change once visible)",
                split_id=split.split_id,
                path=path,
            )
        known = FileIdentity.parse(split.identity)
        # Changed since the plan: only growth past the identity's bytes may be read around.
        if (
            known is not None
            and not known.same_stat(st)
            and (size < known.size or sample_digest(f, known.size) != known.digest)
        ):
            f.close()
            raise SourceError(
                f"split {split.split_id!r}: file {path} changed after the range was planned "
                f"({known.size} -> {size} bytes, its first and last bytes differ): nothing of it is read; "
                "the next plan applies source.on_file_change",
                split_id=split.split_id,
                path=path,
            )
        return f, path


def bad_read_error(columns: RangeColumns, split_id: str) -> SourceError:
    """The error :meth:`FileRegionReader.read_range` raises for the first record ``columns.bad`` lists."""
    first = columns.bad[0]
    return SourceError(first.message, split_id=split_id, offset=first.offset)


_EMPTY = RangeColumns(pa.array([], pa.int64()), pa.array([], pa.int64()), pa.array([], pa.binary()))


@functools.cache
def _blank_line() -> str:
    """A regex of the lines of only the characters ``str.isspace`` accepts: a jsonl line of only
    these is blank (``not line.strip()``). Built on first use: scanning every code point costs
    ~0.2 s, which a run that reads nothing should not pay at import."""
    return "^[" + "".join(f"\\x{{{c:x}}}" for c in range(0x110000) if chr(c).isspace()) + "]*$"


def _read_columns(
    f: IO[bytes], path: str, split_id: str, start: int, end: int, fmt: FileFormat
) -> RangeColumns:
    """The lines starting in ``[start, end)`` of the open file ``f`` (closed here), as columns.

    1. The range's bytes are read in one call (plus the rest of the last line,
       which may run past ``end``), from the first line start at or after
       ``start`` (Hadoop's rule, as the module doc says).
    2. Line boundaries are the positions of ``\\n`` bytes, found by numpy; the
       offsets are the line starts, each ``next_offset`` the next line start
       (the byte after the data for a last line without a newline).
    3. The values are the line bytes without the newline, a trailing ``\\r``
       and a BOM at offset 0, gathered into one buffer (the data without its
       ``\\n`` bytes by one ``bytes.replace`` when it has no ``\\r`` and no BOM,
       else by a numpy mask); the binary array is built on that buffer,
       nothing decoded (jsonl: validated as UTF-8 by Arrow, skipped for ASCII
       data).
    4. jsonl: blank lines are found by one regex over the column; the other
       values are checked by :func:`json.loads` (Python's JSON rules, one C
       call per record; a line nested deeper than ``MAX_JSON_DEPTH`` is found
       first, before any parser recurses); blank lines' bytes join the next
       record (or the last).
    5. jsonl: a line that is not UTF-8 or not JSON stays a record, its bytes as
       they are, listed in ``bad`` with its error (found line by line, only in
       a range that has one): the region task makes it a bad record, so
       ``errors.tolerance`` decides (:meth:`FileRegionReader.read_range` raises
       the first).
    """
    with f:
        if start >= end:
            return _EMPTY
        pos = 0 if start == 0 else _line_start_at_or_after(f, start)
        if pos >= end:
            return _EMPTY
        f.seek(pos)
        data = f.read(end - pos)
        if data and data[-1:] != b"\n":
            data += f.readline()  # the last line starting before end runs to its newline (or EOF)
    if not data:
        return _EMPTY
    buf = np.frombuffer(data, np.uint8)
    newlines = np.flatnonzero(buf == 0x0A)
    starts = np.empty(len(newlines) + 1, np.int64)
    starts[0] = 0
    starts[1:] = newlines + 1
    if data[-1:] == b"\n":
        starts = starts[:-1]
        ends = newlines
    else:
        ends = np.append(newlines, len(data))
    nexts = np.append(starts[1:], len(data))
    value_starts = starts
    bom = pos == 0 and data[:3] == _BOM
    if b"\r" not in data and not (bom and ends[0] >= 3):
        # The common case: a value is its line without the \n, so the values are the bytes without
        # their \n bytes, in order: one C pass (bytes.replace), no byte mask, one copy.
        body: Any = data.replace(b"\n", b"") if len(newlines) else data
    else:
        keep = np.ones(len(data), np.bool_)
        keep[newlines] = False
        if b"\r" in data:  # a line ending in \r (before its \n, or at EOF) loses it
            crlf = (ends > starts) & (buf[np.maximum(ends - 1, 0)] == 0x0D)
            keep[ends[crlf] - 1] = False
            ends = ends - crlf
        if bom and ends[0] >= 3:
            keep[:3] = False
            value_starts = starts.copy()
            value_starts[0] = 3
        body = buf[keep] if not keep.all() else buf
    lengths = ends - value_starts
    value_offsets = np.zeros(len(starts) + 1, np.int64)
    np.cumsum(lengths, out=value_offsets[1:])
    large = len(body) >= 2**31
    buffers = [None, pa.py_buffer(value_offsets.astype(np.int64 if large else np.int32)), pa.py_buffer(body)]
    record_offsets = starts + pos
    record_nexts = nexts + pos
    if fmt is not FileFormat.JSONL:  # the line's bytes, as they are
        binary = pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), len(starts), buffers)
        return RangeColumns(pa.array(record_offsets), pa.array(record_nexts), binary)
    binary_type = pa.large_binary() if large else pa.binary()
    values = pa.Array.from_buffers(pa.large_string() if large else pa.string(), len(starts), buffers)
    refused: dict[int, tuple[str, str]] = {}  # line -> (error class, message): bad records, not read errors
    if not data.isascii():
        try:
            values.validate(full=True)
        except pa.ArrowInvalid:
            refused.update(_not_utf8(data, starts, pos, path, split_id))
            nulled = np.zeros(len(starts), np.bool_)
            nulled[list(refused)] = True
            binary = pa.Array.from_buffers(binary_type, len(starts), buffers)
            values = pc.if_else(pa.array(nulled), pa.scalar(None, binary_type), binary).cast(values.type)
    blank = np.asarray(
        pc.fill_null(pc.match_substring_regex(values, _blank_line()), False).to_numpy(zero_copy_only=False),
        np.bool_,
    )
    kept = np.flatnonzero(~blank)
    if len(kept) == 0:
        return _EMPTY
    kept_values = values.take(pa.array(kept))
    refused.update(_not_json(kept_values, kept, refused, record_offsets, path, split_id))
    kept_offsets = np.empty(len(kept), np.int64)
    kept_offsets[0] = record_offsets[0]
    kept_offsets[1:] = record_nexts[kept[:-1]]
    kept_nexts = record_nexts[kept]
    kept_nexts[-1] = record_nexts[-1]
    if not refused:
        return RangeColumns(pa.array(kept_offsets), pa.array(kept_nexts), kept_values.cast(binary_type))
    raw = pa.Array.from_buffers(binary_type, len(starts), buffers).take(pa.array(kept))  # their bytes as read
    where = {int(line): j for j, line in enumerate(kept)}
    bad = tuple(
        BadRead(where[line], cls, message, int(record_offsets[line]))
        for line, (cls, message) in sorted(refused.items())
    )
    return RangeColumns(pa.array(kept_offsets), pa.array(kept_nexts), raw, None, bad)


def _not_utf8(
    data: bytes, starts: np.ndarray[Any, np.dtype[np.int64]], pos: int, path: str, split_id: str
) -> dict[int, tuple[str, str]]:
    """The lines of ``data`` (starting at ``starts``, byte ``pos`` on) that are not UTF-8, with
    their error (one Python step per line: only a range with invalid UTF-8 comes here)."""
    out: dict[int, tuple[str, str]] = {}
    bounds = [*starts.tolist(), len(data)]
    for k, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        raw = data[a:b]
        if raw[-1:] == b"\n":
            raw = raw[:-1]
        try:
            _decode(raw, pos + a, path, split_id)
        except SourceError as err:
            out[k] = ("UnicodeDecodeError", err.message)
    return out


def _not_json(
    texts: pa.Array,
    lines: np.ndarray[Any, np.dtype[np.int64]],
    skip: Mapping[int, object],
    offsets: np.ndarray[Any, np.dtype[np.int64]],
    path: str,
    split_id: str,
) -> dict[int, tuple[str, str]]:
    """The lines (``lines[j]`` is the line of ``texts[j]``; those in ``skip`` are bad already) that
    are not one JSON document, with their error: nested deeper than
    :data:`~splitkeeper.records.decode.MAX_JSON_DEPTH` (found before any parser recurses), or
    refused by :func:`json.loads` (one C call per line)."""
    from splitkeeper.records.decode import MAX_JSON_DEPTH, too_deep

    out: dict[int, tuple[str, str]] = {}
    for j, depth in too_deep(texts).items():
        line = int(lines[j])
        if line not in skip:
            out[line] = (
                "NestedTooDeep",
                f"split {split_id!r}: {path} line at byte {offsets[line]} nests {depth} levels deep, more "
                f"than the {MAX_JSON_DEPTH} a JSON line may",
            )
    loads = json.loads
    every = texts.to_pylist()
    if not skip and not out:
        try:
            for text in every:
                loads(text)
            return out
        except (ValueError, RecursionError):
            pass
    for j, text in enumerate(every):  # only a range with a bad line comes here
        line = int(lines[j])
        if line in skip or line in out:
            continue
        try:
            loads(text)
        except (ValueError, RecursionError) as err:
            out[line] = (
                "JSONDecodeError",
                f"split {split_id!r}: {path} line at byte {offsets[line]} is not valid JSON ({err}); "
                "fix the file or use source.format 'lines'",
            )
    return out


def _decode(raw: bytes, pos: int, path: str, split_id: str) -> str:
    """A line's bytes (without its newline) as text: no trailing CR, no BOM at offset 0."""
    if raw[-1:] == b"\r":
        raw = raw[:-1]
    skipped = 0
    if pos == 0 and raw[:3] == _BOM:
        raw, skipped = raw[3:], 3
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SourceError(
            f"split {split_id!r}: {path} line at byte {pos} is not valid UTF-8 ({err.reason} at byte "
            f"{pos + skipped + err.start}); fix or remove the file",
            split_id=split_id,
            offset=pos,
        ) from err


class FileSource(
    SourceConnector,
    SupportsSplitReassignmentOnRecovery,
    SupportsSplitIdentityCheck,
    SupportsDiscoveryPositions,
    SupportsDiscoveryCounts,
):
    """Driver side of the file source (see the module doc for splits, positions and identity).

    ``path`` is a directory (scanned recursively) or a single file; it is the
    subscription of every split. Regions keep no split state of their own, so
    the source opts into deferred assignment (FLIP-537): on restore the
    enumerator places every split. Created once per driver run; keeps, for the
    life of the process, the split layout of each file it has seen, first
    learned from the known splits (:meth:`check_splits`), else cut at discovery.
    A change of a known file is found by :meth:`check_splits` and decided by the
    core (``source.on_file_change``); discovery keeps the known layout.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        format: FileFormat | str = FileFormat.LINES,
        split_bytes: int = 0,
        *,
        growing: bool = False,
        deferred_assignment: bool = True,
        discovery: Discovery | str = Discovery.FULL,
        events: EventFeed | None = None,
    ) -> None:
        self._deferred = bool(deferred_assignment)
        try:
            self._discovery = Discovery(discovery)
        except ValueError as err:
            raise InvalidParameterError(
                "source.discovery", discovery, "one of " + ", ".join(d.value for d in Discovery)
            ) from err
        if isinstance(split_bytes, bool) or not isinstance(split_bytes, int) or split_bytes < 0:
            raise InvalidParameterError(
                "split_bytes", split_bytes, "an integer >= 0 (0 = one split per file)"
            )
        try:
            self._format = FileFormat(format)
        except ValueError as err:
            raise InvalidParameterError(
                "format", format, "one of " + ", ".join(f.value for f in FileFormat)
            ) from err
        text = os.fspath(path)
        self._path = object_root(text) if is_object_store(text) else os.path.abspath(text)
        self._files: Files = files_for(self._path)
        self._split_bytes = split_bytes
        self._layouts: dict[str, tuple[Split, ...]] = {}  # rel -> its splits (the first layout seen)
        self._line_bytes: dict[str, float] = {}
        self._removed: tuple[str, ...] = ()
        self._warned_names: set[str] = set()
        self._scanned: _Scan | None = None  # check_splits' scan, for the discovery right after it
        self._root_dir: str | None = None  # the folder of the files, as the last scan found source.path
        self._growing = growing  # on_file_change append: a last line without its newline is not read yet
        # incremental discovery: names up to this one were listed and taken (start-after); None: list all
        self._cursor: str | None = None
        # finished ids seen by check_splits: id -> rel, rel -> ids, digest -> id (the last with it)
        self._finished_rel: dict[str, str] = {}
        self._finished_ids: dict[str, list[str]] = {}
        self._finished_digest: dict[str, str] = {}
        self._fresh: dict[tuple[str, FileStat], FileIdentity | None] = {}  # this check's identities
        # discovery: notifications (module notify): the event topic, the offsets up to which its events'
        # splits were handed over (None: none known, the next discovery lists), those of the
        # discovery under way (taken over by discover_splits), and the post-restore discoveries
        # the events still serve (contract 3)
        if (events is None) != (self._discovery is not Discovery.NOTIFICATIONS) or (
            events is not None and not isinstance(self._files, ObjectFiles)
        ):
            raise InvalidParameterError(
                "source.notifications",
                None if events is None else events.topic,
                "an event topic exactly when source.discovery is notifications, with an object-store "
                "source.path",
            )
        self._events = events
        self._event_offsets: dict[int, int] | None = None
        self._pending_offsets: dict[int, int] | None = None
        self._restore_rounds = 0
        self._lookups: ThreadPoolExecutor | None = None  # the event scans' lookups (threads kept)
        self.skipped_events = 0  # messages of the event topic that were not S3 events (notify contract 4)
        self.listings = 0  # full listings discovery made (notification mode: contract 3)

    @classmethod
    def from_config(cls, source: FilesSource) -> FileSource:
        """The file source of a validated ``source`` section of kind ``files``."""
        if not isinstance(source, FilesSource):
            raise InvalidParameterError(
                "source.kind", getattr(source, "kind", None), "'files' for a FileSource"
            )
        notified = source.notifications
        return cls(
            source.path,
            source.format,
            source.split_bytes,
            growing=source.on_file_change is SplitChangePolicy.APPEND,
            deferred_assignment=source.deferred_assignment,
            discovery=source.discovery,
            events=None
            if notified is None
            else EventFeed(
                notified.servers,
                notified.topic,
                notified.client_settings,
                notified.connect_timeout_s or EventFeed.DEFAULT_TIMEOUT_S,
            ),
        )

    @property
    def path(self) -> str:
        return self._path

    @property
    def reassigns_on_recovery(self) -> bool:
        """``source.reader_mode``: deferred (True, the default) or legacy (protocol rule 1.2)."""
        return self._deferred

    @property
    def name(self) -> str:
        return f"files:{self._path}"

    @property
    def bounded(self) -> bool:
        return True

    @property
    def removed_paths(self) -> tuple[str, ...]:
        """Absolute paths of files seen by the previous discovery and gone at the last one."""
        return self._removed

    def _root(self) -> str:
        """The folder relative paths are under: source.path, or its folder when it is one file. Known
        from the last scan (one stat of source.path per scan, not one per file path built)."""
        if self._root_dir is None:
            is_file = self._files.kind(self._path) == "file"
            self._root_dir = self._files.parent(self._path) if is_file else self._path
        return self._root_dir

    def _abs(self, rel: str) -> str:
        return self._files.join(self._root(), rel)

    def _missing_root(self) -> SourceError:
        return SourceError(
            f"source.path {self._path} does not exist: create the directory (files are picked up as they "
            "appear) or fix source.path in the pipeline config",
            path=self._path,
        )

    def subscriptions(self) -> frozenset[str]:
        if isinstance(self._files, ObjectFiles):
            self._check_bucket(self._files)  # an empty prefix is an empty folder: objects appear there
        elif self._files.kind(self._path) is None:
            raise self._missing_root()
        return frozenset({self._path})

    def _check_bucket(self, files: ObjectFiles) -> None:
        why = files.bucket_error()
        if why is not None:
            raise SourceError(
                f"source.path {self._path} cannot be read: {why}; create the bucket, or fix source.path "
                f"(or {reach_hint(self._path)})",
                path=self._path,
            )

    def offset_for(self, split: Split, kind: str, timestamp_ms: int | None = None) -> int:
        """``offsets reset --to latest`` of a file split: its end. A file has no timestamps, and its
        first record's offset is in ``splitkeeper offsets``: other kinds are refused."""
        if kind == "latest" and split.end is not None:
            return split.end
        raise InvalidParameterError(
            "--to",
            kind,
            "offset:N (a byte offset where a line starts), shift:K (bytes) or latest for a file split "
            "(a file has no timestamps; 'splitkeeper offsets' shows where each split stands)",
        )

    def check_offset(self, split: Split, offset: int) -> None:
        """A file split's offsets are bytes, and a record starts at 0 or right after a newline:
        InvalidParameterError naming the nearest line starts otherwise (a reset there would cut a line)."""
        if offset == 0 or self._format is not FileFormat.LINES:
            return
        path = self._abs(split.split_id.split("#", 1)[0])
        try:
            with self._files.open(path) as f:
                f.seek(max(0, offset - 4096))
                before = f.read(min(offset, 4096))
                after = f.read(4096)
        except OSError as err:
            raise SourceError(
                f"split {split.split_id!r}: file {path} cannot be read: {err}", path=path
            ) from err
        if before.endswith(b"\n"):
            return
        back = (
            offset - len(before) + before.rfind(b"\n") + 1
            if b"\n" in before
            else max(0, offset - len(before))
        )
        ahead = offset + after.find(b"\n") + 1 if b"\n" in after else None
        raise InvalidParameterError(
            "--to",
            offset,
            f"a byte offset where a line of {split.split_id} starts (nearest: {back}"
            + ("" if ahead is None else f" or {ahead}")
            + ")",
        )

    def discover_splits(self) -> list[Split]:
        """All splits of the files present now, by path then position, each at its initial position.

        Files gone since the previous call are logged (warning, naming the path)
        and listed in :attr:`removed_paths`. A file that cannot be examined is
        one ``unreadable`` split (see the module doc). Right after
        :meth:`check_splits` with ``recheck_finished=False``: only the splits of the files
        that check looked at (new ones, live ones); the finished ones are the caller's.
        """
        scan, self._scanned = self._scanned or self._scan(), None
        self._read_identities(scan)
        splits: list[Split] = []
        pending = set(scan.pending)
        for rel, st in scan.files.items():
            layout = self._layout(rel, st)
            if not layout:
                pending.add(rel)  # unreadable now, or one line without its newline yet
            splits.extend(layout)
        for rel, error in scan.bad.items():
            known = self._layouts.get(rel)
            if known is not None:
                splits.extend(known)  # known before: its reader fails and names the error
                continue
            log.warning(
                "input file %s cannot be examined (%s); its reads fail until it can", self._abs(rel), error
            )
            splits.append(Split(rel, subscription=self._path, position=0, end=1, identity=UNREADABLE))
        self._advance_cursor(scan, pending)
        if scan.complete:
            removed = sorted(self._layouts.keys() - scan.unchecked - scan.files.keys() - scan.bad.keys())
        else:
            removed = sorted(scan.missing & self._layouts.keys())
        for rel in removed:
            ids = [s.split_id for s in self._layouts.pop(rel)]
            self._line_bytes.pop(rel, None)
            log.warning(
                "input file %s was removed from source %s; its splits %s can no longer be read",
                self._abs(rel),
                self._path,
                ids,
            )
        self._removed = tuple(self._abs(rel) for rel in removed)
        if self._pending_offsets is not None:  # the events' splits are handed over: their offsets too
            self._event_offsets, self._pending_offsets = self._pending_offsets, None
        return sorted(splits, key=lambda s: (relative_path_of(s.split_id), s.position))

    def _exists(self, rel: str) -> bool:
        """Something is at ``rel`` (a local entry, a dangling symlink too; an object)."""
        if isinstance(self._files, ObjectFiles):
            return self._files.kind(self._abs(rel)) is not None
        return os.path.lexists(self._abs(rel))

    # -- discovery: notifications (module notify) ------------------------------------------------

    def discovery_positions(self) -> dict[str, int]:
        """``<topic>:<partition>`` -> the event offset up to which discovery handed its splits over
        (notify contract 1); empty without an event topic or before the first discovery."""
        if self._events is None or self._event_offsets is None:
            return {}
        return {f"{self._events.topic}:{p}": o for p, o in sorted(self._event_offsets.items())}

    def discovery_counts(self) -> dict[str, int]:
        """In notification mode: the full listings and the skipped messages of the event topic (not
        S3 events) of this process so far; empty in listing mode (every discovery lists)."""
        if self._events is None:
            return {}
        return {"listings": self.listings, "skipped_events": self.skipped_events}

    def restore_discovery_positions(self, positions: Mapping[str, int] | None) -> None:
        """Read the events from ``positions`` (those of this topic) on; none: the next discovery lists
        the prefix whole. The discoveries right after a restore with positions (the enumerator's
        first and the first epoch's, which recheck finished files) are served by the events."""
        if self._events is None:
            return
        offsets: dict[int, int] = {}
        for key, offset in (positions or {}).items():
            topic, _, partition = key.rpartition(":")
            if topic == self._events.topic and partition.isdigit():
                offsets[int(partition)] = int(offset)
        self._event_offsets = offsets or None
        self._pending_offsets = None
        self._scanned = None
        self._restore_rounds = 2 if offsets else 0

    def _notified_scan(self, recheck_finished: bool) -> _Scan:
        """This discovery's scan in notification mode: the objects the events since the positions
        name (an incomplete scan: ``missing`` the keys gone), or a full listing (notify contract 3);
        either way the topic's end offsets, taken first, are the positions discovery goes on from."""
        events = self._events
        assert events is not None
        marks = events.partitions()
        ends = {p: high for p, (_low, high) in marks.items()}
        offsets = self._event_offsets
        why = None
        if offsets is None:
            why = "no event offsets are checkpointed yet (a first run, or state written before them)"
        elif aged := sorted(p for p, (low, _high) in marks.items() if offsets.get(p, low) < low):
            why = f"events of partitions {aged} aged out of the topic (retention) before they were read"
        elif recheck_finished and not self._restore_rounds:
            why = "the periodic full listing (source.recheck_finished_every)"
        self._restore_rounds = self._restore_rounds - 1 if recheck_finished and self._restore_rounds else 0
        if why is None:
            assert offsets is not None
            scan = self._event_scan({p: offsets.get(p, low) for p, (low, _high) in marks.items()}, ends)
            if scan is not None:
                self._pending_offsets = ends
                return scan
            why = "a message of the topic was not an S3 event notification (skipped)"
        log.info(
            "source %s lists its objects whole (event topic %r up to offsets %s): %s",
            self._path,
            events.topic,
            ends,
            why,
        )
        self.listings += 1
        scan = self._scan()
        self._pending_offsets = ends
        return scan

    def _event_scan(self, start: Mapping[int, int], ends: Mapping[int, int]) -> _Scan | None:
        """The objects the events in ``[start, ends)`` name, as they are now (one HEAD each: found,
        or gone); None when a message was not an event (counted, logged: notify contract 4)."""
        assert self._events is not None
        names: set[str] = set()
        unparsed = False
        for partition, offset, value in self._events.read(start, ends):
            try:
                found = parse_events(value)
            except EventError as err:
                self.skipped_events += 1
                unparsed = True
                log.warning(
                    "source.notifications.topic %r partition %d offset %d: skipped a message that is not "
                    "an S3 event notification (%s; it begins %r): this discovery lists %s whole instead",
                    self._events.topic,
                    partition,
                    offset,
                    err,
                    (value or b"")[:120],
                    self._path,
                )
                continue
            for event in found:
                for key in event.keys:
                    rel = self._event_rel(event.bucket, key)
                    if rel is not None:
                        names.add(rel)
        if unparsed:
            return None
        files: dict[str, FileStat] = {}
        missing: set[str] = set()
        self._look_up(names, files, missing, ", named by an event,")
        return _Scan(files, {}, complete=False, missing=missing)

    def _look_up(self, rels: Iterable[str], files: dict[str, FileStat], missing: set[str], why: str) -> None:
        """:meth:`_look` at each of ``rels``, :data:`_LOOKUPS` at a time: an object found goes into
        ``files`` (a new one's identity into :attr:`_fresh`), one gone or empty into ``missing``; a
        store that fails is a SourceError naming the object (``why``: how it came to be looked at)."""
        rels = sorted(rels)
        if not rels:
            return
        self._root()  # known before the lookups run in parallel
        for rel, st, identity in self._lookup_pool().map(self._look, rels):
            if isinstance(st, OSError):
                raise SourceError(
                    f"source.path {self._path}: object {self._abs(rel)}{why} cannot be read ({st}); "
                    f"check {reach_hint(self._path)} reach the store",
                    path=self._abs(rel),
                ) from st
            if st is None:
                missing.add(rel)  # gone; or empty: not a file to a listing either
                continue
            files[rel] = st
            if identity is not None:
                self._fresh[(rel, st)] = identity

    def _look(self, rel: str) -> tuple[str, FileStat | OSError | None, FileIdentity | None]:
        """An object named by an event, now: its stat (None: gone or empty; the OSError when the
        store fails), and, when it is new to this process, its identity. A known object costs one
        HEAD; a new one one ranged GET of up to 64 KiB whose answer is its stat too, and one more
        GET for the tail of an object past 64 KiB (``open_sampled``, fs contract 4), nothing
        else. Run in parallel: no state of the source is written here."""
        path = self._abs(rel)
        if rel in self._layouts:  # known: compared by its stat first (check_splits), no read
            try:
                st = self._files.stat(path)
            except FileNotFoundError:
                return rel, None, None
            except OSError as err:
                return rel, err, None
            return (rel, st, None) if st.size else (rel, None, None)
        try:  # new: the stat is the sample's own GET, the sample read through the same file
            f, st = self._files.open_sampled(path)
        except FileNotFoundError:
            return rel, None, None
        except OSError as err:  # not an object (a folder): gone to a listing too; else the store's error
            try:
                self._files.stat(path)
            except FileNotFoundError:
                return rel, None, None
            except OSError:
                pass
            return rel, err, None
        with f:
            if st.size == 0:
                return rel, None, None
            try:
                return rel, st, FileIdentity(*st, sample_digest(f, st.size))
            except OSError:
                return rel, st, None  # read again (and its failure named) when its layout is cut

    def _event_rel(self, bucket: str, key: str) -> str | None:
        """The path, relative to the source's folder, of the object ``key`` of ``bucket``; None for an
        object the source does not read (another bucket or prefix, a skipped or reserved name)."""
        root = self._root()
        folder = root.split("://", 1)[1].rstrip("/")
        where = f"{bucket}/{key}"
        if not where.startswith(folder + "/"):
            return None
        rel = where[len(folder) + 1 :]
        if not rel or any(not part or _skipped(part) for part in rel.split("/")):
            return None
        if _reserved(rel.rsplit("/", 1)[-1]):
            return None
        if root != self._path and self._files.join(root, rel) != self._path:
            return None  # source.path is one object: only its events
        return rel

    def _lookup_pool(self) -> ThreadPoolExecutor:
        """The threads of the object look-ups (events' keys, new objects' samples): kept across
        discoveries, so each keeps its connection to the store (fs contract 4)."""
        if self._lookups is None:
            self._lookups = ThreadPoolExecutor(max_workers=_LOOKUPS, thread_name_prefix="splitkeeper-lookups")
        return self._lookups

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
        if self._lookups is not None:
            self._lookups.shutdown()
            self._lookups = None

    def _advance_cursor(self, scan: _Scan, pending: set[str]) -> None:
        """Incremental discovery's start-after cursor: the greatest name listed (or the cursor the
        listing started after), but below the first name not taken yet (an empty file, one line
        without its newline), which is listed again. Not checkpointed: the first discovery after
        a restore lists everything (it rechecks finished files) and sets it again."""
        listed = [*scan.files, *scan.bad, *scan.unchecked, *scan.pending]
        if not scan.complete and self._cursor is not None:
            listed.append(self._cursor)  # every name listed sorts after it
        if pending:
            first = min(pending)
            listed = [r for r in listed if r < first]
        self._cursor = max(listed, default=None)

    def _folders(self, after: str | None = None) -> Iterator[tuple[str, str, list[str], dict[str, Any]]]:
        """``(folder path, rel prefix, names, looked)`` of every folder under source.path: the names
        that may be input files (not skipped, not reserved; a symbolic link to a folder is not
        followed); ``after``: only the names whose rel sorts after it, in name order (a folder whose
        every name sorts before it is not listed). A name known as a file (one with a layout) is
        taken as one; the others are ``stat``-ed to tell the folders, and ``looked`` has what that
        gave for the names (an ``os.stat_result``, or the OSError), so each is ``stat``-ed once."""
        layouts = self._layouts
        stack = [(self._path, "")]
        while stack:
            dirpath, prefix = stack.pop()
            try:
                listed = os.listdir(dirpath)
            except OSError as err:
                raise SourceError(
                    f"source.path {self._path}: cannot list {err.filename}: {err.strerror}"
                ) from err
            if after is not None and after.startswith(prefix):
                # the names after it (few of many), and folders whose names may be (a prefix of it)
                tail = after[len(prefix) :]
                listed = sorted(n for n in listed if (n > tail or tail.startswith(n)) and not _skipped(n))
            else:
                listed = [n for n in listed if not _skipped(n)]  # the callers' order is their own
            names: list[str] = []
            folders: list[str] = []
            looked: dict[str, Any] = {}
            for name in listed:
                rel = prefix + name
                if rel not in layouts:
                    full = os.path.join(dirpath, name)
                    try:
                        st: Any = os.stat(full)
                    except OSError as err:
                        st = err
                    folder = isinstance(st, os.stat_result) and stat.S_ISDIR(st.st_mode)
                    if folder and not os.path.islink(full):
                        if after is None or not _all_before(rel + "/", after):
                            folders.append(name)
                        continue
                    looked[name] = st
                if after is not None and rel <= after:
                    continue
                if "#" in name and _reserved(name):
                    self._warn_once(rel, "a name ending in '#<a>-<b>' or '#v<12 hex>' is reserved")
                    continue
                names.append(name)
            stack.extend((os.path.join(dirpath, d), prefix + d + "/") for d in sorted(folders, reverse=True))
            yield dirpath, prefix, names, looked

    def _stat_into(
        self,
        rel: str,
        full: str,
        found: dict[str, FileStat],
        bad: dict[str, str],
        looked: os.stat_result | OSError | None = None,
    ) -> bool:
        """Put the file at ``full`` into ``found`` (a regular non-empty file) or ``bad`` (cannot be
        examined); leave out what is none (removed meanwhile, empty, not a regular file). True for
        an empty file (it may be written still: listed again by incremental discovery). ``looked``:
        what a ``stat`` of it gave already."""
        try:
            if isinstance(looked, OSError):
                raise looked
            st = looked or os.stat(full)  # follows a symlink: a loop or a dangling one raises
        except FileNotFoundError:
            if os.path.islink(full):
                bad[rel] = "a symbolic link to a path that does not exist"
            return False  # else removed while listing: the next discovery reports it
        except OSError as err:
            bad[rel] = err.strerror or str(err)
            return False
        if stat.S_ISDIR(st.st_mode):
            return False  # a symbolic link to a folder: not followed
        if not stat.S_ISREG(st.st_mode):
            self._warn_once(rel, "not a regular file (a FIFO, socket or device is never opened)")
            return False
        if st.st_size > 0:
            found[rel] = FileStat.of(st)
            return False
        return True

    def _scan(self) -> _Scan:
        kind = self._files.kind(self._path)
        is_file = kind == "file"
        self._root_dir = self._files.parent(self._path) if is_file else self._path
        if is_file:
            one = self._files.stat(self._path)
            name = self._files.name(self._path)
            return _Scan({name: one} if one.size > 0 else {}, {})
        if isinstance(self._files, ObjectFiles):
            return self._scan_objects(self._files)
        if kind != "dir":
            raise self._missing_root()
        found: dict[str, FileStat] = {}
        bad: dict[str, str] = {}
        skipped: set[str] = set()
        for dirpath, prefix, names, looked in self._folders():
            for name in names:
                if self._stat_into(prefix + name, os.path.join(dirpath, name), found, bad, looked.get(name)):
                    skipped.add(prefix + name)
        return _Scan(found, bad, pending=frozenset(skipped))

    def _scan_new(self, live: set[str]) -> _Scan:
        """The listing of an epoch that does not recheck finished files: ``stat`` only the names
        without a layout yet (new) and the files of live splits; incremental discovery lists only
        the names after the cursor (a live file before it is ``stat``-ed by its path). An object
        store is listed whole (one LIST per 1,000 keys, no request per object), or, incremental, from
        the cursor (:meth:`_scan_objects_after`)."""
        incremental = self._discovery is Discovery.INCREMENTAL and self._cursor is not None
        if isinstance(self._files, ObjectFiles) and incremental and self._root_dir == self._path:
            return self._scan_objects_after(self._files, live)
        if isinstance(self._files, ObjectFiles) or os.path.isfile(self._path):
            return self._scan()
        if not os.path.isdir(self._path):
            raise self._missing_root()
        self._root_dir = self._path
        found: dict[str, FileStat] = {}
        bad: dict[str, str] = {}
        unchecked: set[str] = set()
        skipped: set[str] = set()
        for dirpath, prefix, names, looked in self._folders(self._cursor if incremental else None):
            rels = [prefix + n for n in names] if prefix else names
            known = (self._layouts.keys() & rels) - live
            unchecked |= known
            for rel, name in zip(rels, names, strict=True):
                full = os.path.join(dirpath, name)
                if rel not in known and self._stat_into(rel, full, found, bad, looked.get(name)):
                    skipped.add(rel)
        missing: set[str] = set()
        if incremental:
            for rel in live - found.keys() - bad.keys():
                self._stat_into(rel, self._abs(rel), found, bad)
                if rel not in found and rel not in bad and not os.path.lexists(self._abs(rel)):
                    missing.add(rel)
        return _Scan(
            found,
            bad,
            frozenset(unchecked),
            complete=not incremental,
            missing=missing,
            pending=frozenset(skipped),
        )

    def _scan_objects(self, files: ObjectFiles) -> _Scan:
        """The objects under source.path (a prefix: none yet is an empty folder; no bucket, an error)."""
        found: dict[str, FileStat] = {}
        for rel, st in files.walk(_skipped):
            if _reserved(rel.rsplit("/", 1)[-1]):
                self._warn_once(rel, "a name ending in '#<a>-<b>' or '#v<12 hex>' is reserved")
                continue
            found[rel] = st
        if not found:
            self._check_bucket(files)
        return _Scan(found, {})

    def _scan_objects_after(self, files: ObjectFiles, live: set[str]) -> _Scan:
        """Incremental discovery on an object store: the objects after the cursor (a walk that skips
        the folders wholly before it, fs contract 5), and the live files before it by their key
        (:meth:`_look_up`: one HEAD each, found or known gone)."""
        assert self._cursor is not None
        found: dict[str, FileStat] = {}
        empty: set[str] = set()
        unchecked: set[str] = set()
        for rel, st in files.walk_after(_skipped, self._cursor, empty):
            if _reserved(rel.rsplit("/", 1)[-1]):
                self._warn_once(rel, "a name ending in '#<a>-<b>' or '#v<12 hex>' is reserved")
                continue
            if rel in self._layouts and rel not in live:
                unchecked.add(rel)  # known and finished: not compared between rechecks
                continue
            found[rel] = st
        missing: set[str] = set()
        self._look_up(live - found.keys(), found, missing, ", a live file before the cursor,")
        return _Scan(
            found, {}, frozenset(unchecked), complete=False, missing=missing, pending=frozenset(empty)
        )

    def _warn_once(self, rel: str, why: str) -> None:
        if rel not in self._warned_names:
            self._warned_names.add(rel)
            log.warning("skipping input file %s: %s", rel, why)

    def _read_identities(self, scan: _Scan) -> None:
        """On an object store, the identities of the scan's files without a layout yet (new), read
        :data:`_LOOKUPS` at a time (:meth:`_lookup_pool`) into this check's :attr:`_fresh`: each is a
        content sample's ranged GET (:meth:`_sample`), which one after another would cost the plan a
        round trip per new object. Local files are read when their layout is cut, as before."""
        if not isinstance(self._files, ObjectFiles):
            return
        new = [
            (rel, st)
            for rel, st in scan.files.items()
            if rel not in self._layouts and (rel, st) not in self._fresh
        ]
        if len(new) < 2:
            return
        self._root()  # known before the reads run in parallel
        pool = self._lookup_pool()
        for key, identity in zip(new, pool.map(lambda item: self._sample(*item), new), strict=True):
            self._fresh[key] = identity

    def _sample(self, rel: str, st: FileStat) -> FileIdentity | None:
        """The identity of the file at ``rel`` with stat ``st`` read now; None if it cannot be read,
        or, on an object store, if the object read is not the one listed (its size or Last-Modified
        moved since: it is looked at again by the next discovery). An object's sample is one ranged
        GET (two past 64 KiB) where the store allows (:meth:`ObjectFiles.open_sampled`)."""
        try:
            if isinstance(self._files, ObjectFiles):
                f, now = self._files.open_sampled(self._abs(rel))
                second = 1_000_000_000  # an answer's Last-Modified has whole seconds
                if (now.size, now.mtime_ns // second) != (st.size, st.mtime_ns // second):
                    f.close()
                    return None
            else:
                f = self._files.open(self._abs(rel))
            with f:
                return FileIdentity(*st, sample_digest(f, st.size))
        except OSError:
            return None

    def _identity(self, rel: str, st: FileStat) -> FileIdentity | None:
        """The identity of the file at ``rel`` with stat ``st``; None if it cannot be read. Read once
        per check (:meth:`check_splits` and the discovery after it)."""
        if (rel, st) in self._fresh:
            return self._fresh[(rel, st)]
        identity = self._fresh[(rel, st)] = self._sample(rel, st)
        return identity

    def _layout(self, rel: str, st: FileStat) -> tuple[Split, ...]:
        known = self._layouts.get(rel)
        if known is not None:
            return known  # a change is check_splits' to report and the core's to decide
        identity = self._identity(rel, st)
        if identity is None:
            return ()  # unreadable between the listing and now: the next discovery sees it
        splits = self._cut(rel, st.size, str(identity))
        if splits:  # none: one line without its newline yet (growing); the next discovery sees it
            self._layouts[rel] = splits
        return splits

    def _terminated(self, rel: str, size: int) -> int:
        """Where the data of the file at ``rel`` that is read now ends, of its first ``size`` bytes:
        ``size``, but for a growing file (``on_file_change: append``) whose last line has no newline
        yet: right after its last newline (0 if none). That line is read once it is ended (a
        writer appending it may be mid-line): reading it now would make a fragment of it a
        record, and its rest the start of a range nobody reads (issue 36 item 9)."""
        if not self._growing or size == 0:
            return size
        try:
            with self._files.open(self._abs(rel)) as f:
                end = size
                while end > 0:
                    start = max(0, end - _SAMPLE_BYTES)
                    f.seek(start)
                    chunk = f.read(end - start)
                    if end == size and chunk.endswith(b"\n"):
                        return size
                    newline = chunk.rfind(b"\n")
                    if newline >= 0:
                        log.info(
                            "input file %s ends with a line without its newline (%d bytes): "
                            "source.on_file_change is append, so it is read once a newline ends it",
                            self._abs(rel),
                            size - (start + newline + 1),
                        )
                        return start + newline + 1
                    end = start
        except OSError:
            return size  # cannot be read now: its read fails and names the error
        return 0

    def _cut(self, rel: str, size: int, identity: str, base: str | None = None) -> tuple[Split, ...]:
        """The splits of the file at ``rel`` (``size`` bytes, of which :meth:`_terminated` are read
        now), ids ``base`` (default ``rel``) + range; none when nothing is read yet."""
        base = rel if base is None else base
        size = self._terminated(rel, size)
        if size == 0:
            return ()
        bounds = [0]
        if 0 < self._split_bytes < size:
            with self._files.open(self._abs(rel)) as f:
                nominal = self._split_bytes
                while nominal < size:
                    cut = _line_start_at_or_after(f, nominal)
                    if cut >= size:
                        break
                    if cut > bounds[-1]:
                        bounds.append(cut)
                    nominal += self._split_bytes
        bounds.append(size)
        if len(bounds) == 2:
            return (Split(base, subscription=self._path, position=0, end=size, identity=identity),)
        return tuple(
            Split(f"{base}#{a}-{b}", subscription=self._path, position=a, end=b, identity=identity)
            for a, b in zip(bounds, bounds[1:], strict=False)
        )

    # -- identity check (protocol rule 1.9) ------------------------------------------------------

    def check_splits(
        self, live: Sequence[Split], finished: Mapping[str, str], *, recheck_finished: bool = True
    ) -> list[SplitChange]:
        """The known splits whose file grew, changed or moved (see the module doc); learns their layout.

        Reads the first and last 64 KiB of a file only when its size or mtime differ from
        a known identity (and of a same-size file at another path when a known one is
        gone). Unreadable files are not reported: their reads fail.

        ``recheck_finished`` False (the core's cadence, rule 1.9): the files of finished splits
        that are present are not ``stat``-ed nor compared; only new names and the files of live
        splits are (:meth:`_scan_new`). A finished file gone from its path is still followed to
        where it moved: at once with ``discovery: full`` (the listing has every name), and with
        ``incremental`` when its new name is listed (a new file with the same size and digest).
        """
        self._fresh = {}
        if self._events is not None:  # the events say what changed, or a full listing (notify contract 3)
            scan = self._notified_scan(recheck_finished)
            everything = scan.complete
        else:  # a process that knows no layout learns them all
            everything = recheck_finished or not self._layouts
            scan = (
                self._scan() if everything else self._scan_new({relative_path_of(s.split_id) for s in live})
            )
        self._read_identities(scan)
        checked: Mapping[str, str]
        if everything:
            checked = finished
            self._index_finished(finished)
        else:
            checked = self._finished_to_check(finished, scan, {relative_path_of(s.split_id) for s in live})
        self._scanned = scan
        known: dict[str, list[_Known]] = {}
        for split in live:
            known.setdefault(relative_path_of(split.split_id), []).append(
                _Known(split.split_id, split.identity, split)
            )
        for sid, identity in checked.items():
            known.setdefault(relative_path_of(sid), []).append(_Known(sid, identity, None))
        changes: list[SplitChange] = []
        for rel in sorted(known):
            if rel in scan.bad:
                continue
            entries = known[rel]
            if len(entries) > 1:
                entries.sort(key=lambda k: _range_start(k.split_id))
            if rel in scan.files:
                changes.extend(self._compare(rel, scan.files[rel], entries))
            elif scan.gone(rel):
                changes.extend(self._moved(rel, entries, scan, known))
        if any(c.moved_to or c.replacement for c in changes):
            # a caller may hold the ids these changes name until the driver applies them (the
            # enumerator's first discovery): the events are read again from where they were, so the
            # next discovery finds the change again if it was not applied
            self._pending_offsets = None
        return sorted(changes, key=lambda c: c.split_id)

    def _finished_to_check(
        self, finished: Mapping[str, str], scan: _Scan, live_rels: set[str]
    ) -> dict[str, str]:
        """Of ``finished`` (id -> identity), those an epoch without a recheck still looks at: the
        finished ranges of live files, and those of files gone from their path (to follow a move:
        with an incomplete listing, a known file is known gone when a new file has its digest and
        its own path is empty). Indexes are kept across calls: only ids new since are parsed."""
        self._index_finished(finished)
        index = self._finished_rel
        rels = set(live_rels)
        if scan.complete:
            rels |= self._layouts.keys() - scan.unchecked - scan.files.keys() - scan.bad.keys()
        else:
            # finished files named by events (notifications): written again, or removed
            rels |= (scan.files.keys() | scan.missing) & self._finished_ids.keys()
            for rel, st in scan.files.items():
                if rel in self._layouts or rel in live_rels:
                    continue
                now = self._identity(rel, st)
                sid = None if now is None else self._finished_digest.get(now.digest)
                old = None if sid is None or sid not in finished else index[sid]
                if old is not None and old != rel and not self._exists(old):
                    rels.add(old)
                    scan.missing.add(old)
        by_rel = self._finished_ids
        return {sid: finished[sid] for rel in rels for sid in by_rel.get(rel, ()) if sid in finished}

    def _index_finished(self, finished: Mapping[str, str]) -> None:
        """Index the finished ids not indexed yet (by path, by digest); one parse per id and process."""
        index, by_rel, by_digest = self._finished_rel, self._finished_ids, self._finished_digest
        for sid in finished.keys() - index.keys():
            rel = index[sid] = relative_path_of(sid)
            by_rel.setdefault(rel, []).append(sid)
            identity = finished[sid]
            if identity.startswith("f1:"):
                by_digest[identity.rsplit(":", 1)[-1]] = sid

    def _compare(self, rel: str, st: FileStat, entries: list[_Known]) -> list[SplitChange]:
        size = st.size
        now: FileIdentity | None = None
        changes: list[SplitChange] = []
        by_identity: dict[str, list[_Known]] = {}
        for entry in entries:
            by_identity.setdefault(entry.identity, []).append(entry)
        for identity, group in by_identity.items():
            old = _parsed_identity(identity)
            if old is not None and old.same_stat(st):
                self._learn(rel, group, old)
                continue
            path = self._abs(rel)  # for the messages (not built for the unchanged files: most of them)
            now = now or self._identity(rel, st)
            if now is None:
                continue  # cannot be read now: its reads fail and name the error
            if old is None:
                if identity == UNREADABLE:
                    fresh = self._cut(rel, size, str(now))
                    changes += [
                        SplitChange(
                            e.split_id,
                            SplitChangeKind.CHANGED,
                            str(now),
                            f"file {path} can be read now ({size} bytes)",
                            start=_range_start(e.split_id),
                            replacement=fresh,
                        )
                        for e in group
                    ]
                else:  # no identity: state of an older version, taken as it is
                    changes += [
                        SplitChange(e.split_id, SplitChangeKind.IDENTIFIED, str(now), "") for e in group
                    ]
                continue
            same_prefix = size >= old.size and self._prefix_digest(rel, old.size) == old.digest
            if (
                same_prefix
                and size == old.size
                and (size <= 2 * _SAMPLE_BYTES or st.mtime_ns == old.mtime_ns)
            ):
                # every byte was sampled, or only its ctime changed (chmod, rename): the same data
                changes += [SplitChange(e.split_id, SplitChangeKind.IDENTIFIED, str(now), "") for e in group]
                continue
            self._learn(rel, group, old)  # discovery keeps the known ids; the core decides the rest
            last = max(_range_start(e.split_id) for e in group)
            if same_prefix and size > old.size:
                replacement = self._cut(rel, size, str(now), rel + now.version)
                was, now_end = self._terminated(rel, old.size), self._terminated(rel, size)
                for e in group:
                    end = self._known_end(e, old, last, rel)
                    grows = end == was  # the last split: it goes on where the file's read data ended
                    changes.append(
                        SplitChange(
                            e.split_id,
                            SplitChangeKind.GREW,
                            str(now),
                            f"file {path} grew from {old.size} to {size} bytes, the old ones unchanged",
                            start=end,
                            end=now_end if grows else end,
                            replacement=replacement,
                        )
                    )
                continue
            what = (
                f"was truncated from {old.size} to {size} bytes"
                if size < old.size
                else f"was rewritten ({old.size} -> {size} bytes, its first and last bytes differ)"
                if size > old.size or not same_prefix
                else f"was modified in place ({size} bytes, mtime changed)"
            )
            replacement = self._cut(rel, size, str(now), rel + now.version)
            changes += [
                SplitChange(
                    e.split_id,
                    SplitChangeKind.CHANGED,
                    str(now),
                    f"file {path} {what} after split {e.split_id} was discovered",
                    start=_range_start(e.split_id),
                    end=size,
                    replacement=replacement,
                )
                for e in group
            ]
        return changes

    def _known_end(self, entry: _Known, old: FileIdentity, last_start: int, rel: str) -> int:
        """Where a known split of a file with identity ``old`` ends (a finished one: from its id;
        the file's data is at ``rel``, its first ``old.size`` bytes unchanged)."""
        if entry.split is not None and entry.split.end is not None:
            return entry.split.end
        match = _RANGE_SUFFIX.search(entry.split_id)
        if match is None or int(match.group(1)) == last_start:
            # the whole file, or its last range (which may have grown since its id)
            return self._terminated(rel, old.size)
        return int(match.group(2))

    def _learn(self, rel: str, group: list[_Known], identity: FileIdentity) -> None:
        """Take the known splits of an unchanged file as its layout, when this process has none."""
        if rel in self._layouts:
            return
        self._layouts[rel] = self._known_layout(group, identity, identity, rel)

    def _known_layout(
        self,
        group: list[_Known],
        old: FileIdentity,
        now: FileIdentity,
        rel: str,
        moved_to: str | None = None,
    ) -> tuple[Split, ...]:
        """The splits of a file as the known ones cut it (their ranges, ``old`` their file's identity
        when they were cut), with the identity ``now``; its data is at ``rel``; ``moved_to``: their
        file's new path (the ids become that path with their range suffix)."""
        last = max(_range_start(e.split_id) for e in group)
        return tuple(
            Split(
                e.split_id if moved_to is None else moved_to + _suffix_of(e.split_id),
                subscription=self._path,
                position=_range_start(e.split_id),
                end=self._known_end(e, old, last, rel),
                identity=str(now),
            )
            for e in group
        )

    def _prefix_digest(self, rel: str, size: int) -> str | None:
        try:
            with self._files.open(self._abs(rel)) as f:
                return sample_digest(f, size)
        except OSError:
            return None

    def _moved(
        self, rel: str, entries: list[_Known], scan: _Scan, known: Mapping[str, list[_Known]]
    ) -> list[SplitChange]:
        """MOVED changes for the splits of a file gone from ``rel`` whose data is at a path no split has."""
        changes: list[SplitChange] = []
        for identity in sorted({e.identity for e in entries}):
            old = FileIdentity.parse(identity)
            if old is None:
                continue
            candidates = [
                r for r, st in scan.files.items() if st.size == old.size and r not in known and r != rel
            ]
            candidates.sort(
                key=lambda r: (scan.files[r].mtime_ns != old.mtime_ns, r)
            )  # same mtime first (mv)
            target = next((r for r in candidates if self._prefix_digest(r, old.size) == old.digest), None)
            if target is None:
                continue
            group = [e for e in entries if e.identity == identity]
            now = FileIdentity(*scan.files[target], old.digest)
            moved = self._known_layout(group, old, now, target, moved_to=target)
            self._layouts[target] = moved
            log.info(
                "input file %s was moved to %s: its splits keep their progress",
                self._abs(rel),
                self._abs(target),
            )
            changes += [
                SplitChange(
                    e.split_id,
                    SplitChangeKind.MOVED,
                    str(now),
                    f"file {self._abs(rel)} was moved to {self._abs(target)} (same size and content digest)",
                    start=_range_start(e.split_id),
                    end=m.end,
                    moved_to=m.split_id,
                )
                for e, m in zip(group, moved, strict=True)
            ]
        return changes

    def available_end(self, split: Split) -> int:
        if split.end is None:
            raise SourceError(
                f"split {split.split_id!r} has no end: file splits are bounded", split_id=split.split_id
            )
        return split.end

    def plan_end(self, split: Split, start: int, max_records: int) -> int:
        """A line start about ``max_records`` lines after ``start`` (at least one line), within the split.

        The line count is estimated from the mean line length of the file's
        first 64 KiB; the end is then snapped to the next line start, so the
        planned range ends exactly where its last line ends. A file that cannot
        be opened now gets the rest of its split: its read fails (SourceError).
        """
        limit = self.available_end(split)
        if start >= limit:
            return max(start, limit)
        if max_records < 1:
            raise InvalidParameterError("max_records", max_records, "an integer >= 1")
        if limit - start <= max_records:
            return limit  # every line has a byte at least: the rest holds at most max_records lines
        path = FileRegionReader(self._root(), self._format).path_of(split)
        rel = relative_path_of(split.split_id)
        try:
            with self._files.open(path) as f:
                if rel not in self._line_bytes:
                    sample = f.read(_SAMPLE_BYTES)
                    self._line_bytes[rel] = len(sample) / max(1, sample.count(b"\n"))
                guess = start + max(1, int(max_records * self._line_bytes[rel]))
                return limit if guess >= limit else min(limit, _line_start_at_or_after(f, guess))
        except FileNotFoundError as err:
            raise SourceError(
                f"split {split.split_id!r}: file {path} does not exist any more (deleted after discovery)",
                split_id=split.split_id,
                path=path,
            ) from err
        except OSError as err:  # unreadable (permission denied, ...): a failed read of the split
            raise SourceError(
                f"split {split.split_id!r}: file {path} cannot be read: {err.strerror or err}",
                split_id=split.split_id,
                path=path,
            ) from err

    def reader(self) -> FileRegionReader:
        return FileRegionReader(self._root(), self._format)

    def fingerprint(self) -> str:
        identity = {
            "kind": "files",
            "path": self._path,
            "format": self._format.value,
            "split_bytes": self._split_bytes,
        }
        return "files-" + hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def connector(section: Any) -> FileSource:
    """The files source of a validated ``source`` section (the kind's builder, :mod:`splitkeeper.kinds`)."""
    return FileSource.from_config(section)
