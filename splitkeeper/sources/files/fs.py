"""Where the file source's files are: a local folder or an object-store prefix, behind one seam.

The file source (:mod:`.source`) reaches its files only through :func:`files_for`: a
:class:`LocalFiles` for a local path (``os`` calls, as fast as before), an
:class:`ObjectFiles` for ``s3://``, ``s3a://``, ``gs://`` or ``abfss://`` (``pyarrow.fs``).
Both give the same operations: what a path is, a file's :class:`FileStat`, a binary file
open for ``seek``/``read``/``readline`` and the paths inside the root.

Object stores (contract):

1. The file system is built from the location and the environment, never from a pickled
   object: :func:`splitkeeper.delta.storage.filesystem` builds it as the state and the sink get
   theirs (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
   ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``; ``gs://`` and ``abfss://`` through
   ``pyarrow.fs.FileSystem.from_uri`` with those libraries' default credentials). A region
   reader, shipped to an executor as its root URI, builds it there (cached per process and
   environment, :func:`files_for`).
2. A listing is one recursive ``ListObjectsV2`` walk (``get_file_info(FileSelector(...,
   recursive=True))``); a path component starting with ``.`` or ``_`` is skipped as on disk,
   and so are empty objects and folder markers. A read opens the object with the size and mtime
   the listing gave, so a range is ranged GETs (one per ``read``, a line end through a 64 KiB buffer).
3. A :class:`FileStat` of an object is its size and Last-Modified; an object has no ctime, so its
   ``ctime_ns`` is :data:`SETTLED` (0), or, for an object whose Last-Modified is less than
   :data:`SETTLE_NS` before now, the time of the listing (driver clock), which no later stat
   repeats. Last-Modified has a resolution of one second on S3: an overwrite of the same size
   within the second of the previous write keeps size and mtime. An identity taken while its
   object was unsettled never matches a later stat, so each check reads its content sample again
   (ranged GETs) until the object is settled: the same data is taken as settled (IDENTIFIED), an
   overwrite is a change (CHANGED, GREW), and the same-second overwrite is not missed; a settled
   identity is compared by size and mtime alone, as on disk (no read). The ETag would say it too,
   but a listing through ``pyarrow.fs`` does not give it (only a HEAD per object does, which a
   check of every known file cannot afford), so the identity stays ``size, mtime, sample digest``
   as on disk. A store whose clock is behind the driver's by more than :data:`SETTLE_NS` less a
   second defeats this.
4. Incremental discovery (``source.discovery: incremental``) lists from its cursor, the last key
   seen (:meth:`ObjectFiles.walk_after`): ``pyarrow.fs`` has no ``StartAfter``, so the prefix is
   walked one level at a time (``ListObjectsV2`` with the ``/`` delimiter) and a folder whose every
   key sorts before the cursor is not listed. Drops in dated folders (``in/2026/12/05/...``) cost
   a LIST per level down to the cursor plus one per 1,000 new keys; a flat prefix is still listed
   whole (one LIST per 1,000 keys), as a full listing is.
"""

from __future__ import annotations

import datetime as dt
import functools
import io
import os
import stat
import time
from collections.abc import Callable, Iterator
from typing import IO, Any, NamedTuple

from splitkeeper.errors import SourceError
from splitkeeper.sources.files.config import OBJECT_SCHEMES

__all__ = [
    "OBJECT_SCHEMES",
    "SETTLED",
    "SETTLE_NS",
    "FileStat",
    "Files",
    "LocalFiles",
    "ObjectFiles",
    "files_for",
    "is_object_store",
    "object_root",
]

#: An object written less than this before now is unsettled (contract 3).
SETTLE_NS = 2_000_000_000
SETTLED = 0
#: Tries of the bucket check (:meth:`ObjectFiles.bucket_error`), against the readers' 10.
CHECK_ATTEMPTS = 2
#: The read buffer of an object (the content sample's size): a line end past a range's last byte,
#: a sample's head or tail, costs one GET of this size.
_OBJECT_BUFFER = 64 * 1024


class FileStat(NamedTuple):
    """What a ``stat`` (or a listing) says of a file, for its identity."""

    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStat:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def is_object_store(path: str) -> bool:
    """``path`` names an object store (a scheme of :data:`OBJECT_SCHEMES`)."""
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.lower() in OBJECT_SCHEMES


class Files:
    """The operations of the file source on its files (see the module doc). ``root`` is
    ``source.path`` as given (an absolute path or a URI)."""

    root: str

    def join(self, base: str, rel: str) -> str:
        raise NotImplementedError

    def parent(self, path: str) -> str:
        raise NotImplementedError

    def name(self, path: str) -> str:
        raise NotImplementedError

    def kind(self, path: str) -> str | None:
        """``"file"``, ``"dir"`` or None (nothing there)."""
        raise NotImplementedError

    def stat(self, path: str) -> FileStat:
        raise NotImplementedError

    def open(self, path: str) -> IO[bytes]:
        """``path`` open for binary reads (``seek``, ``read``, ``readline``); OSError if not."""
        raise NotImplementedError

    def open_with_stat(self, path: str) -> tuple[IO[bytes], FileStat]:
        """``path`` open, with its stat at the open."""
        raise NotImplementedError


class LocalFiles(Files):
    """A local folder: ``os`` and ``open``, as the file source always read them."""

    def __init__(self, root: str) -> None:
        self.root = root

    def join(self, base: str, rel: str) -> str:
        return os.path.join(base, *rel.split("/"))

    def parent(self, path: str) -> str:
        return os.path.dirname(path)

    def name(self, path: str) -> str:
        return os.path.basename(path)

    def kind(self, path: str) -> str | None:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return None
        return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else None

    def stat(self, path: str) -> FileStat:
        return FileStat.of(os.stat(path))

    def open(self, path: str) -> IO[bytes]:
        return open(path, "rb")  # noqa: SIM115 - the caller closes it

    def open_with_stat(self, path: str) -> tuple[IO[bytes], FileStat]:
        f = open(path, "rb")  # noqa: SIM115 - the caller closes it
        return f, FileStat.of(os.fstat(f.fileno()))


class ObjectFiles(Files):
    """An object-store prefix through ``pyarrow.fs`` (contract of the module doc)."""

    def __init__(self, root: str, fs: Any, fs_root: str) -> None:
        self.root = root
        self._fs = fs
        self._fs_root = fs_root.rstrip("/")  # the root as the file system spells it (no scheme)

    def _inner(self, path: str) -> str:
        """``path`` (a URI of this store) as the file system spells it."""
        if path == self.root or path.startswith(self.root + "/"):
            return self._fs_root + path[len(self.root) :]
        if self.root.endswith(self._fs_root):  # s3://b/k is b/k: the scheme off
            scheme = self.root[: len(self.root) - len(self._fs_root)]
            if path.startswith(scheme):
                return path[len(scheme) :]
        raise ValueError(f"{path} is not under {self.root}")

    def join(self, base: str, rel: str) -> str:
        return base.rstrip("/") + "/" + rel.strip("/")

    def parent(self, path: str) -> str:
        return path.rstrip("/").rsplit("/", 1)[0]

    def name(self, path: str) -> str:
        return path.rstrip("/").rsplit("/", 1)[-1]

    def _info(self, path: str) -> Any:
        return self._fs.get_file_info(self._inner(path))

    def kind(self, path: str) -> str | None:
        import pyarrow.fs as pafs

        try:
            kind = self._info(path).type
        except OSError as err:
            raise SourceError(
                f"source.path {self.root} cannot be read: {err}; fix source.path, or AWS_ENDPOINT_URL and "
                "the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) so the store can be reached",
                path=self.root,
            ) from err
        return "file" if kind == pafs.FileType.File else "dir" if kind == pafs.FileType.Directory else None

    @staticmethod
    def _stat(size: int, mtime_ns: int, now_ns: int) -> FileStat:
        return FileStat(size, mtime_ns, now_ns if now_ns - mtime_ns < SETTLE_NS else SETTLED)

    def stat(self, path: str) -> FileStat:
        import pyarrow.fs as pafs

        info = self._info(path)
        if info.type != pafs.FileType.File:
            raise FileNotFoundError(f"{path}: no such object")
        return self._stat(int(info.size or 0), int(info.mtime_ns or 0), time.time_ns())

    def open(self, path: str) -> IO[bytes]:
        return io.BufferedReader(self._fs.open_input_file(self._inner(path)), _OBJECT_BUFFER)

    def open_with_stat(self, path: str) -> tuple[IO[bytes], FileStat]:
        """The object open (one HEAD) with the size and Last-Modified that HEAD answered."""
        raw = self._fs.open_input_file(self._inner(path))
        now = time.time_ns()
        try:
            head = {k.lower(): v for k, v in (raw.metadata() or {}).items()}
            modified = head[b"last-modified" if isinstance(next(iter(head), ""), bytes) else "last-modified"]
            text = modified.decode() if isinstance(modified, bytes) else str(modified)
            mtime_ns = int(dt.datetime.fromisoformat(text).timestamp()) * 1_000_000_000
            st = self._stat(raw.size(), mtime_ns, now)
        except (KeyError, StopIteration, ValueError):  # no Last-Modified in the answer: a listing of it
            st = self.stat(path)
        return io.BufferedReader(raw, _OBJECT_BUFFER), st

    def bucket_error(self) -> str | None:
        """Why the root's bucket cannot be listed (missing, refused, unreachable); None if it can.
        Asked with :data:`CHECK_ATTEMPTS` tries, so an unreachable store is named in seconds."""
        import pyarrow.fs as pafs

        from splitkeeper.delta.storage import filesystem

        bucket = self._fs_root.split("/", 1)[0]
        try:
            fs = (
                filesystem(self.root, attempts=CHECK_ATTEMPTS)[0]
                if self.root.startswith("s3://")
                else self._fs
            )
            if fs.get_file_info(bucket).type != pafs.FileType.Directory:
                return f"bucket {bucket!r} does not exist"
        except OSError as err:
            return str(err)
        return None

    def walk(self, skipped: Callable[[str], bool]) -> Iterator[tuple[str, FileStat]]:
        """``(relative path, stat)`` of every non-empty object under the root whose path components
        are not ``skipped``, by path; SourceError naming ``source.path`` if the listing fails."""
        import pyarrow.fs as pafs

        try:
            infos = self._fs.get_file_info(
                pafs.FileSelector(self._fs_root, recursive=True, allow_not_found=True)
            )
        except OSError as err:
            raise SourceError(
                f"source.path {self.root}: cannot list the objects under it ({err}); check the bucket "
                "exists and AWS_ENDPOINT_URL and the credentials (AWS_ACCESS_KEY_ID, "
                "AWS_SECRET_ACCESS_KEY) reach it",
                path=self.root,
            ) from err
        now = time.time_ns()
        prefix = len(self._fs_root) + 1
        for info in sorted(infos, key=lambda i: i.path):
            if info.type != pafs.FileType.File or not info.size:
                continue
            rel = info.path[prefix:]
            if any(skipped(part) for part in rel.split("/")):
                continue
            yield rel, self._stat(int(info.size), int(info.mtime_ns or 0), now)

    def walk_after(
        self, skipped: Callable[[str], bool], after: str, empty: set[str]
    ) -> Iterator[tuple[str, FileStat]]:
        """``(relative path, stat)`` of the non-empty objects whose relative path sorts after
        ``after`` (contract 4), by path; the empty ones after it go into ``empty``. A folder (a
        common prefix) whose every key sorts before ``after`` is not listed."""
        import pyarrow.fs as pafs

        now = time.time_ns()
        stack = [""]
        while stack:
            prefix = stack.pop()
            base = self._fs_root + ("/" + prefix.rstrip("/") if prefix else "")
            try:
                infos = self._fs.get_file_info(pafs.FileSelector(base, recursive=False, allow_not_found=True))
            except OSError as err:
                raise SourceError(
                    f"source.path {self.root}: cannot list the objects under it ({err}); check the "
                    "bucket exists and AWS_ENDPOINT_URL and the credentials (AWS_ACCESS_KEY_ID, "
                    "AWS_SECRET_ACCESS_KEY) reach it",
                    path=self.root,
                ) from err
            folders: list[str] = []
            for info in sorted(infos, key=lambda i: i.path):
                name = info.path[len(base) + 1 :]
                if not name or skipped(name):
                    continue
                rel = prefix + name
                if info.type == pafs.FileType.Directory:
                    key = rel + "/"
                    if not (key < after and not after.startswith(key)):  # not every key before it
                        folders.append(key)
                    continue
                if info.type != pafs.FileType.File or rel <= after:
                    continue
                if not info.size:
                    empty.add(rel)
                    continue
                yield rel, self._stat(int(info.size), int(info.mtime_ns or 0), now)
            stack.extend(reversed(folders))


def object_root(path: str) -> str:
    """The root a ``source.path`` on an object store is known by: no trailing ``/``, ``s3a://``
    as ``s3://`` (:func:`splitkeeper.delta.storage.table_uri`)."""
    from splitkeeper.delta.storage import table_uri

    return table_uri(path) if path.lower().startswith(("s3://", "s3a://", "s3n://")) else path.rstrip("/")


_ENV_KEYS = (
    "AWS_ENDPOINT_URL",
    "SPLITKEEPER_S3A_ENDPOINT",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_ALLOW_HTTP",
)


def files_for(path: str) -> Files:
    """The :class:`Files` of a source root: local, or an object store (built once per process and
    environment, contract 1)."""
    if not is_object_store(path):
        return LocalFiles(path)
    return _object_files(object_root(path), tuple(os.environ.get(k, "") for k in _ENV_KEYS))


@functools.lru_cache(maxsize=16)
def _object_files(root: str, _env: tuple[str, ...]) -> ObjectFiles:
    from splitkeeper.delta.storage import filesystem

    fs, inner = filesystem(root)
    return ObjectFiles(root, fs, inner)
