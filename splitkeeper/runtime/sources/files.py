"""The file source: files in a directory tree (or one file), read line by line.

Splits. Every regular, non-empty file under the source root is one bounded split
whose id is its path relative to the root (``/`` separators). With
``split_bytes > 0`` a larger file is cut into byte ranges ``[a, b)`` with id
``relative/path#a-b``. Names starting with ``.`` or ``_`` are skipped (write a
file under such a name and rename it when complete: files must not change once
visible).

Positions are byte offsets of line starts. A range ``[a, b)`` holds every line
that STARTS in ``[a, b)`` (Hadoop's rule: unless ``a == 0`` the partial line
around ``a`` belongs to the range before, and the last line is read past ``b``
to its end). Split boundaries are snapped to line starts at discovery (the
nominal cut ``k * split_bytes`` moves forward to the next line start), so the
lines of a split end exactly at ``Split.end``, record offsets per split are
contiguous from ``Split.position`` to ``Split.end``, and a position is always
where the next line starts. The reader still applies Hadoop's rule to any range
it is given, so a range cut mid-line neither loses nor repeats a line.

A record's ``offset`` is the byte offset of its line, ``next_offset`` the byte
offset after its newline (the file size for a last line without one), and its
value is the line decoded as UTF-8 without the ``\\n`` / ``\\r\\n`` terminator
(and without a UTF-8 byte order mark at offset 0).

The reader reads a range natively (:meth:`FileRegionReader.read_range_columns`:
numpy finds the line boundaries, Arrow holds and validates the values, see
:func:`_read_columns`); :meth:`FileRegionReader.read_range` yields the same
records one by one.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from splitkeeper.core.source import (
    RegionReader,
    SourceConnector,
    SourceRecord,
    SupportsSplitReassignmentOnRecovery,
)
from splitkeeper.core.types import Split
from splitkeeper.errors import InvalidParameterError, SourceError
from splitkeeper.runtime.columnar import RangeColumns, SupportsColumnarRead
from splitkeeper.runtime.config import FileFormat, SourceConfig, SourceKind

log = logging.getLogger("splitkeeper.sources.files")

_RANGE_SUFFIX = re.compile(r"#(\d+)-(\d+)$")
_SAMPLE_BYTES = 64 * 1024
_BOM = codecs.BOM_UTF8


def relative_path_of(split_id: str) -> str:
    """The file path (relative to the source root) of a file split id."""
    match = _RANGE_SUFFIX.search(split_id)
    return split_id[: match.start()] if match else split_id


def _skipped(name: str) -> bool:
    return name.startswith((".", "_"))


def _line_start_at_or_after(f: IO[bytes], offset: int) -> int:
    """The offset of the first line that starts at or after ``offset`` (``offset > 0``); EOF if none."""
    f.seek(offset - 1)
    return offset - 1 + len(f.readline())


@dataclass(frozen=True, slots=True)
class FileRegionReader(RegionReader, SupportsColumnarRead):
    """Reads ranges of file splits on an executor. Picklable, stateless.

    ``root`` is the directory split ids are relative to; it must be visible
    under the same path on every executor (local disk on one machine, a shared
    mount on a cluster).
    """

    root: str
    format: FileFormat = FileFormat.LINES

    def path_of(self, split: Split) -> str:
        return os.path.join(self.root, *relative_path_of(split.split_id).split("/"))

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
        yield from _read_columns(f, path, split_id, start, end, self.format).records()

    def read_range_columns(self, split: Split, start: int, end: int) -> RangeColumns:
        """The lines of ``split`` that start in ``[start, end)`` as Arrow columns, read natively.

        The same records and errors as :meth:`read_range` (every error raises
        on the call); see :func:`_read_columns` for how.
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
            f = open(path, "rb")  # noqa: SIM115 - closed by _read_columns
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
        size = os.fstat(f.fileno()).st_size
        if split.end is not None and size < split.end:
            f.close()
            raise SourceError(
                f"split {split.split_id!r}: file {path} has {size} bytes but the split ends at {split.end}: "
                "the file was truncated or replaced after discovery (files must not change once visible)",
                split_id=split.split_id,
                path=path,
            )
        return f, path


_EMPTY = RangeColumns(pa.array([], pa.int64()), pa.array([], pa.int64()), pa.array([], pa.string()))
#: Every character ``str.isspace`` accepts: a jsonl line of only these is blank (``not line.strip()``).
_BLANK_LINE = "^[" + "".join(f"\\x{{{c:x}}}" for c in range(0x110000) if chr(c).isspace()) + "]*$"


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
       and a BOM at offset 0, gathered into one buffer by a numpy mask; the
       string array is built on that buffer and validated as UTF-8 by Arrow
       (skipped for ASCII data).
    4. jsonl: blank lines are found by one regex over the column; the other
       values are checked by :func:`json.loads` (Python's JSON rules, one C
       call per record); blank lines' bytes join the next record (or the last).
    5. On a bad line the range is walked line by line (:func:`_first_error`)
       to raise exactly the error of the first bad line.
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
    keep = np.ones(len(data), np.bool_)
    keep[newlines] = False
    if b"\r" in data:  # a line ending in \r (before its \n, or at EOF) loses it
        crlf = (ends > starts) & (buf[np.maximum(ends - 1, 0)] == 0x0D)
        keep[ends[crlf] - 1] = False
        ends = ends - crlf
    value_starts = starts
    if pos == 0 and ends[0] >= 3 and data[:3] == _BOM:
        keep[:3] = False
        value_starts = starts.copy()
        value_starts[0] = 3
    lengths = ends - value_starts
    value_offsets = np.zeros(len(starts) + 1, np.int64)
    np.cumsum(lengths, out=value_offsets[1:])
    body = buf[keep] if not keep.all() else buf
    kind = pa.string() if len(body) < 2**31 else pa.large_string()
    offsets_type = np.int32 if kind == pa.string() else np.int64
    values = pa.Array.from_buffers(
        kind,
        len(starts),
        [None, pa.py_buffer(value_offsets.astype(offsets_type)), pa.py_buffer(body)],
    )
    record_offsets = starts + pos
    record_nexts = nexts + pos
    if not data.isascii():
        try:
            values.validate(full=True)
        except pa.ArrowInvalid:
            _first_error(data, starts, pos, path, split_id, fmt)
            raise  # pragma: no cover - _first_error raises for invalid UTF-8
    if fmt is not FileFormat.JSONL:
        return RangeColumns(pa.array(record_offsets), pa.array(record_nexts), values)
    blank = np.asarray(pc.match_substring_regex(values, _BLANK_LINE).to_numpy(zero_copy_only=False), np.bool_)
    kept = np.flatnonzero(~blank)
    if len(kept) == 0:
        return _EMPTY
    kept_values = values.take(pa.array(kept))
    loads = json.loads
    try:
        for text in kept_values.to_pylist():
            loads(text)
    except ValueError:
        _first_error(data, starts, pos, path, split_id, fmt)
        raise  # pragma: no cover - _first_error raises for invalid JSON
    kept_offsets = np.empty(len(kept), np.int64)
    kept_offsets[0] = record_offsets[0]
    kept_offsets[1:] = record_nexts[kept[:-1]]
    kept_nexts = record_nexts[kept]
    kept_nexts[-1] = record_nexts[-1]
    return RangeColumns(pa.array(kept_offsets), pa.array(kept_nexts), kept_values)


def _first_error(
    data: bytes,
    starts: np.ndarray[Any, np.dtype[np.int64]],
    pos: int,
    path: str,
    split_id: str,
    fmt: FileFormat,
) -> None:
    """Raise the error of the first bad line of ``data`` (its lines start at ``starts``, byte ``pos`` on)."""
    bounds = [*starts.tolist(), len(data)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        raw = data[a:b]
        if raw[-1:] == b"\n":
            raw = raw[:-1]
        value = _decode(raw, pos + a, path, split_id)
        if fmt is FileFormat.JSONL and value.strip():
            try:
                json.loads(value)
            except ValueError as err:
                raise SourceError(
                    f"split {split_id!r}: {path} line at byte {pos + a} is not valid JSON ({err}); "
                    "fix the file or use source.format 'lines'",
                    split_id=split_id,
                    offset=pos + a,
                ) from err


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


class FileSource(SourceConnector, SupportsSplitReassignmentOnRecovery):
    """Driver side of the file source (see the module doc for splits and positions).

    ``path`` is a directory (scanned recursively) or a single file; it is the
    subscription of every split. Regions keep no split state of their own, so
    the source opts into deferred assignment (FLIP-537): on restore the
    enumerator places every split. Created once per driver run; keeps, for the
    life of the process, the split layout of each file it has seen (first
    layout wins: a file that changes afterwards is logged, not re-split).
    """

    def __init__(
        self, path: str | os.PathLike[str], format: FileFormat | str = FileFormat.LINES, split_bytes: int = 0
    ) -> None:
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
        self._path = os.path.abspath(os.fspath(path))
        self._split_bytes = split_bytes
        self._layouts: dict[str, tuple[int, int, tuple[Split, ...]]] = {}  # rel -> (size, mtime_ns, splits)
        self._line_bytes: dict[str, float] = {}
        self._removed: tuple[str, ...] = ()
        self._warned_names: set[str] = set()

    @classmethod
    def from_config(cls, source: SourceConfig) -> FileSource:
        if source.kind is not SourceKind.FILES or source.path is None:
            raise InvalidParameterError(
                "source.kind", source.kind.value, "'files' with a path for a FileSource"
            )
        return cls(source.path, source.format, source.split_bytes)

    @property
    def path(self) -> str:
        return self._path

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
        return os.path.dirname(self._path) if os.path.isfile(self._path) else self._path

    def _missing_root(self) -> SourceError:
        return SourceError(
            f"source.path {self._path} does not exist: create the directory (files are picked up as they "
            "appear) or fix source.path in the pipeline config",
            path=self._path,
        )

    def subscriptions(self) -> frozenset[str]:
        if not os.path.exists(self._path):
            raise self._missing_root()
        return frozenset({self._path})

    def discover_splits(self) -> list[Split]:
        """All splits of the files present now, by path then position, each at its initial position.

        Files gone since the previous call are logged (warning, naming the path)
        and listed in :attr:`removed_paths`.
        """
        files = self._scan()
        splits: list[Split] = []
        for rel, (size, mtime_ns) in files.items():
            splits.extend(self._layout(rel, size, mtime_ns))
        removed = sorted(set(self._layouts) - set(files))
        root = self._root()
        for rel in removed:
            ids = [s.split_id for s in self._layouts.pop(rel)[2]]
            self._line_bytes.pop(rel, None)
            log.warning(
                "input file %s was removed from source %s; its splits %s can no longer be read",
                os.path.join(root, rel),
                self._path,
                ids,
            )
        self._removed = tuple(os.path.join(root, rel) for rel in removed)
        return sorted(splits, key=lambda s: (relative_path_of(s.split_id), s.position))

    def _scan(self) -> dict[str, tuple[int, int]]:
        if os.path.isfile(self._path):
            st = os.stat(self._path)
            name = os.path.basename(self._path)
            return {name: (st.st_size, st.st_mtime_ns)} if st.st_size > 0 else {}
        if not os.path.isdir(self._path):
            raise self._missing_root()
        found: dict[str, tuple[int, int]] = {}

        def fail(err: OSError) -> None:
            raise SourceError(
                f"source.path {self._path}: cannot list {err.filename}: {err.strerror}"
            ) from err

        for dirpath, dirnames, filenames in os.walk(self._path, onerror=fail):
            dirnames[:] = sorted(d for d in dirnames if not _skipped(d))
            rel_dir = os.path.relpath(dirpath, self._path)
            for name in sorted(filenames):
                if _skipped(name):
                    continue
                rel = name if rel_dir == "." else f"{rel_dir.replace(os.sep, '/')}/{name}"
                if _RANGE_SUFFIX.search(name):
                    if rel not in self._warned_names:
                        self._warned_names.add(rel)
                        log.warning("skipping input file %s: a name ending in '#<a>-<b>' is reserved", rel)
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue  # removed while listing: the next discovery reports it
                if st.st_size > 0 and os.path.isfile(os.path.join(dirpath, name)):
                    found[rel] = (st.st_size, st.st_mtime_ns)
        return found

    def _layout(self, rel: str, size: int, mtime_ns: int) -> tuple[Split, ...]:
        known = self._layouts.get(rel)
        if known is not None:
            if (known[0], known[1]) != (size, mtime_ns):
                log.warning(
                    "input file %s changed after discovery (%d -> %d bytes); the change is not read: "
                    "files must be complete when they appear (write under a '.' or '_' name, then rename)",
                    rel,
                    known[0],
                    size,
                )
                self._layouts[rel] = (size, mtime_ns, known[2])
            return known[2]
        bounds = [0]
        if 0 < self._split_bytes < size:
            with open(os.path.join(self._root(), *rel.split("/")), "rb") as f:
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
            splits: tuple[Split, ...] = (Split(rel, subscription=self._path, position=0, end=size),)
        else:
            splits = tuple(
                Split(f"{rel}#{a}-{b}", subscription=self._path, position=a, end=b)
                for a, b in zip(bounds, bounds[1:], strict=False)
            )
        self._layouts[rel] = (size, mtime_ns, splits)
        return splits

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
        planned range ends exactly where its last line ends.
        """
        limit = self.available_end(split)
        if start >= limit:
            return max(start, limit)
        if max_records < 1:
            raise InvalidParameterError("max_records", max_records, "an integer >= 1")
        path = FileRegionReader(self._root(), self._format).path_of(split)
        rel = relative_path_of(split.split_id)
        try:
            with open(path, "rb") as f:
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
