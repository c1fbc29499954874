"""Where the file source's files are: a local folder or an object-store prefix, behind one seam.

The file source (:mod:`.source`) reaches its files only through :func:`files_for`: a
:class:`LocalFiles` for a local path (``os`` calls, as fast as before), an
:class:`ObjectFiles` for ``s3://``, ``s3a://``, ``gs://`` or ``abfss://`` (``pyarrow.fs``).
Both give the same operations: what a path is, a file's :class:`FileStat`, a binary file
open for ``seek``/``read``/``readline`` and the paths inside the root.

Object stores (contract):

1. The file system is built from the location and the environment, never from a pickled
   object: :func:`splitkeeper.delta.storage.filesystem` (its rule 6) builds it as the state and the
   sink get theirs. ``s3://``: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
   ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``. ``gs://``:
   Google's default credentials (``GOOGLE_APPLICATION_CREDENTIALS``), or an emulator at
   ``STORAGE_EMULATOR_HOST`` (``http://host:port``, no credentials; google-cloud-cpp's
   ``CLOUD_STORAGE_EMULATOR_ENDPOINT`` too). ``abfss://container@account.dfs.core.windows.net``:
   ``AZURE_STORAGE_ACCOUNT_KEY`` or ``AZURE_STORAGE_SAS_TOKEN`` (neither: Azure's default
   credential chain), Azurite with ``AZURE_STORAGE_USE_EMULATOR=true`` and
   ``AZURITE_BLOB_STORAGE_URL`` (delta-rs's names). A region reader, shipped to an executor as its
   root URI, builds it there (cached per process and environment, :func:`files_for`). Proven
   against versitygw (S3), fake-gcs-server (GCS) and Azurite (Azure Blob, no hierarchical
   namespace).
2. A listing is one recursive ``ListObjectsV2`` walk (``get_file_info(FileSelector(...,
   recursive=True))``); a path component starting with ``.`` or ``_`` is skipped as on disk,
   and so are empty objects and folder markers. A read opens the object with the size and mtime
   the listing gave, so a range is ranged GETs (one per ``read``, a line end through a 64 KiB buffer).
3. A :class:`FileStat` of an object is its size and Last-Modified (GCS: its creation time, which
   pyarrow reports, to the microsecond: an overwrite is a new object); an object has no ctime, so its
   ``ctime_ns`` is :data:`SETTLED` (0), or, for an object whose Last-Modified is less than
   :data:`SETTLE_NS` before now, the time of the listing (driver clock), which no later stat
   repeats. Last-Modified has a resolution of one second on S3 and Azure: an overwrite of the same size
   within the second of the previous write keeps size and mtime. An identity taken while its
   object was unsettled never matches a later stat, so each check reads its content sample again
   (ranged GETs) until the object is settled: the same data is taken as settled (IDENTIFIED), an
   overwrite is a change (CHANGED, GREW), and the same-second overwrite is not missed; a settled
   identity is compared by size and mtime alone, as on disk (no read). The ETag would say it too,
   but a listing through ``pyarrow.fs`` does not give it (only a HEAD per object does, which a
   check of every known file cannot afford), so the identity stays ``size, mtime, sample digest``
   as on disk. A store whose clock is behind the driver's by more than :data:`SETTLE_NS` less a
   second defeats this.
4. An object new to the driver (named by a bucket event, :mod:`.notify`) is stat-ed and sampled by
   :meth:`ObjectFiles.open_sampled`: on S3 with an endpoint and keys in the environment, one
   SigV4-signed ranged GET of its first 64 KiB (``bytes=0-65535``), whose ``Content-Range`` total,
   ``Last-Modified`` and ``ETag`` are the stat a HEAD gives (the same size and whole-second mtime,
   so the same identity), on a connection kept per thread; bytes past it (a sample's tail) are
   ranged GETs with ``If-Match`` on that ETag, so the sample is of one version (an overwrite in
   between fails the read: the sample is read again later). A 5xx or no answer is tried again
   (``source_sample`` of :mod:`splitkeeper.delta.retries`); any other answer (no such key: the
   ``FileNotFoundError``; a refusal, the last 5xx, no answer) and any other store or credential source
   (``gs://``, ``abfss://``, AWS's own credential chain) is :meth:`ObjectFiles.open_with_stat`
   (one HEAD, then GETs, with pyarrow's retries and errors): a pyarrow open costs a HEAD before
   its first GET, twice the requests of a content sample. The HEAD's answer is the stat
   (``Last-Modified``; GCS's object metadata: ``timeCreated``), as a listing gives it.
5. Incremental discovery (``source.discovery: incremental``) lists from its cursor, the last key
   seen (:meth:`ObjectFiles.walk_after`): ``pyarrow.fs`` has no ``StartAfter``, so the prefix is
   walked one level at a time (``ListObjectsV2`` with the ``/`` delimiter) and a folder whose every
   key sorts before the cursor is not listed. Drops in dated folders (``in/2026/12/05/...``) cost
   a LIST per level down to the cursor plus one per 1,000 new keys; a flat prefix is still listed
   whole (one LIST per 1,000 keys), as a full listing is.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import functools
import http.client
import io
import os
import stat
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
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
    "RangedGets",
    "files_for",
    "is_object_store",
    "object_root",
    "reach_hint",
]

#: An object written less than this before now is unsettled (contract 3).
SETTLE_NS = 2_000_000_000
SETTLED = 0
#: Tries of the bucket check (:meth:`ObjectFiles.bucket_error`), against the readers' 10.
CHECK_ATTEMPTS = 2
#: The read buffer of an object (the content sample's size): a line end past a range's last byte,
#: a sample's head or tail, costs one GET of this size.
_OBJECT_BUFFER = 64 * 1024
#: Seconds a sample's GET (contract 4) waits for the store; tries of it (5xx, no answer) before the
#: pyarrow open takes over.
_GET_TIMEOUT_S = 10.0
_GET_ATTEMPTS = 5
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


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

    def open_sampled(self, path: str) -> tuple[IO[bytes], FileStat]:
        """``path`` open to read its content sample (its head and tail), with its stat at the open:
        :meth:`open_with_stat` but where fewer requests do (contract 4)."""
        return self.open_with_stat(path)


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

    def __init__(self, root: str, fs: Any, fs_root: str, gets: RangedGets | None = None) -> None:
        self.root = root
        self._fs = fs
        self._fs_root = fs_root.rstrip("/")  # the root as the file system spells it (no scheme)
        self._gets = gets  # contract 4: signed ranged GETs of an S3 endpoint (None: pyarrow only)

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
                f"source.path {self.root} cannot be read: {err}; fix source.path, or "
                f"{reach_hint(self.root)} so the store can be reached",
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
            head = {_text(k).lower(): _text(v) for k, v in (raw.metadata() or {}).items()}
            if "last-modified" in head:  # S3, Azure: whole seconds
                mtime_ns = int(dt.datetime.fromisoformat(head["last-modified"]).timestamp()) * 1_000_000_000
            else:  # GCS: the creation time, as its listing (contract 3)
                created = dt.datetime.fromisoformat(head["timecreated"]) - _EPOCH
                mtime_ns = created // dt.timedelta(microseconds=1) * 1000
            st = self._stat(raw.size(), mtime_ns, now)
        except (KeyError, StopIteration, ValueError):  # no Last-Modified in the answer: a listing of it
            st = self.stat(path)
        return io.BufferedReader(raw, _OBJECT_BUFFER), st

    def open_sampled(self, path: str) -> tuple[IO[bytes], FileStat]:
        """The object open from one ranged GET of its first 64 KiB, whose answer is its stat
        (contract 4); :meth:`open_with_stat` when that GET cannot say. FileNotFoundError when
        there is no such key."""
        if self._gets is None:
            return self.open_with_stat(path)
        inner = self._inner(path)
        try:
            status, head, body = self._gets.get(inner, 0, _OBJECT_BUFFER)
        except OSError:  # no answer: the pyarrow open, with its retries and its error
            return self.open_with_stat(path)
        now = time.time_ns()
        if status == 404 and b"<Code>NoSuchKey</Code>" in body:
            raise FileNotFoundError(f"{path}: no such object")
        size = _object_size(status, head, body)
        modified = head.get("last-modified")
        etag = head.get("etag")
        if size is None or not modified or not etag:
            return self.open_with_stat(path)
        try:
            mtime_ns = int(email.utils.parsedate_to_datetime(modified).timestamp()) * 1_000_000_000
        except (TypeError, ValueError):
            return self.open_with_stat(path)
        gets = self._gets

        def rest(start: int, end: int) -> bytes:  # bytes past the first GET's, of the same version
            got_status, _head, got = gets.get(inner, start, end, if_match=etag)
            if got_status == 206 and len(got) == end - start:
                return got
            raise OSError(
                f"{path}: the object changed while its content sample was read (HTTP {got_status} "
                f"for bytes {start}-{end - 1} of ETag {etag})"
            )

        raw = _SampledObject(body[:size], size, rest)
        return io.BufferedReader(raw, _OBJECT_BUFFER), self._stat(size, mtime_ns, now)

    def bucket_error(self) -> str | None:
        """Why the root's bucket cannot be listed (missing, refused, unreachable); None if it can.
        Asked with :data:`CHECK_ATTEMPTS` tries, so an unreachable store is named in seconds."""
        import pyarrow.fs as pafs

        from splitkeeper.delta.storage import filesystem

        bucket = self._fs_root.split("/", 1)[0]
        try:
            fs = filesystem(self.root, attempts=CHECK_ATTEMPTS)[0]
            if fs.get_file_info(bucket).type != pafs.FileType.Directory:
                what = "container" if self.root.lower().startswith("abfss://") else "bucket"
                return f"{what} {bucket!r} does not exist"
        except OSError as err:
            return str(err)
        return None

    def _listing_error(self, err: OSError) -> SourceError:
        """The error of a listing of the root that failed, naming ``source.path`` and the fix."""
        return SourceError(
            f"source.path {self.root}: cannot list the objects under it ({err}); check the bucket "
            f"exists and {reach_hint(self.root)} reach it",
            path=self.root,
        )

    def walk(self, skipped: Callable[[str], bool]) -> Iterator[tuple[str, FileStat]]:
        """``(relative path, stat)`` of every non-empty object under the root whose path components
        are not ``skipped``, by path; SourceError naming ``source.path`` if the listing fails."""
        import pyarrow.fs as pafs

        try:
            infos = self._fs.get_file_info(
                pafs.FileSelector(self._fs_root, recursive=True, allow_not_found=True)
            )
        except OSError as err:
            raise self._listing_error(err) from err
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
        ``after`` (contract 5), by path; the empty ones after it go into ``empty``. A folder (a
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
                raise self._listing_error(err) from err
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


def _text(value: Any) -> str:
    """A metadata key or value of a pyarrow input file (bytes or str) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _object_size(status: int, head: Mapping[str, str], body: bytes) -> int | None:
    """The object's size from a ranged GET's answer: the total of its ``Content-Range`` (206), the
    body (200: the store sent the whole object); None for any other answer."""
    if status == 200:
        return len(body)
    if status != 206:
        return None
    total = head.get("content-range", "").rpartition("/")[2]
    return int(total) if total.isdigit() else None


class _SampledObject(io.RawIOBase):
    """An object as one GET's first bytes (``head``) of its ``size``; a read past them is
    ``rest(start, end)`` (contract 4)."""

    def __init__(self, head: bytes, size: int, rest: Callable[[int, int], bytes]) -> None:
        super().__init__()
        self._head = head
        self._size = size
        self._rest = rest
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self._size - self._pos)
        if want <= 0:
            return 0
        if self._pos < len(self._head):
            data = self._head[self._pos : self._pos + want]
        else:
            data = self._rest(self._pos, self._pos + want)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


class RangedGets:
    """Signed (SigV4) ranged GETs of one S3 endpoint, path-style, on one kept connection per thread
    (contract 4)."""

    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        region: str,
        session_token: str | None = None,
        timeout_s: float = _GET_TIMEOUT_S,
    ) -> None:
        parts = urllib.parse.urlsplit(endpoint)
        self._endpoint = endpoint.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.netloc
        self._base = parts.path.rstrip("/")
        self._keys = (access_key, secret_key, region, session_token)
        self._timeout_s = timeout_s
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = self._local.conn = kind(self._host, timeout=self._timeout_s)
        return conn

    def get(
        self, key: str, start: int, end: int, *, if_match: str | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """``GET /<key>`` (``key``: ``bucket/key``) of bytes ``[start, end)``: the status, the headers
        (lower-case names) and the body. A 5xx or no answer is sent again (on a new connection),
        :data:`_GET_ATTEMPTS` tries in all (``retries`` operation ``source_sample``); then the last
        5xx is returned, or OSError when the store did not answer."""
        from splitkeeper.delta import retries
        from splitkeeper.delta.storage import signed_headers

        path = self._base + "/" + urllib.parse.quote(key)
        wanted = {"range": f"bytes={start}-{end - 1}"}
        if if_match is not None:
            wanted["if-match"] = if_match
        access_key, secret_key, region, token = self._keys
        attempt = 0
        while True:
            headers = signed_headers(
                "GET", self._endpoint, path, access_key, secret_key, region, b"", wanted, token
            )
            conn = self._connection()
            try:
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException) as err:
                conn.close()
                self._local.conn = None
                if attempt + 1 >= _GET_ATTEMPTS:
                    raise OSError(f"GET {self._endpoint}{path}: {err}") from err
            else:
                if response.will_close or response.status >= 500:
                    conn.close()
                    self._local.conn = None
                if response.status < 500 or attempt + 1 >= _GET_ATTEMPTS:
                    return response.status, {k.lower(): v for k, v in response.getheaders()}, body
            if attempt:  # the first retry is at once: a kept connection the store closed meanwhile
                retries.back_off("source_sample", attempt - 1, first_s=0.05, cap_s=1.0)
            else:
                retries.count("source_sample")
            attempt += 1


def reach_hint(root: str) -> str:
    """What reaches the store of ``root`` (contract 1), for an error's fix."""
    scheme = root.partition("://")[0].lower()
    if scheme == "gs":
        return "STORAGE_EMULATOR_HOST (an emulator) or Google's credentials (GOOGLE_APPLICATION_CREDENTIALS)"
    if scheme == "abfss":
        return (
            "the account's credentials (AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN; "
            "AZURE_STORAGE_USE_EMULATOR and AZURITE_BLOB_STORAGE_URL for Azurite)"
        )
    return "AWS_ENDPOINT_URL and the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"


def object_root(path: str) -> str:
    """The root a ``source.path`` on an object store is known by: no trailing ``/``, ``s3a://``
    as ``s3://`` (:func:`splitkeeper.delta.storage.table_uri`)."""
    from splitkeeper.delta.storage import table_uri

    return table_uri(path) if path.lower().startswith(("s3://", "s3a://", "s3n://")) else path.rstrip("/")


def files_for(path: str) -> Files:
    """The :class:`Files` of a source root: local, or an object store (built once per process and
    environment, contract 1)."""
    from splitkeeper.delta.storage import FILESYSTEM_ENV

    if not is_object_store(path):
        return LocalFiles(path)
    return _object_files(object_root(path), tuple(os.environ.get(k, "") for k in FILESYSTEM_ENV))


@functools.lru_cache(maxsize=16)
def _object_files(root: str, _env: tuple[str, ...]) -> ObjectFiles:
    from splitkeeper.delta.storage import filesystem, storage_options

    fs, inner = filesystem(root)
    options = storage_options(root) or {}
    endpoint = options.get("AWS_ENDPOINT_URL", "")
    gets = None
    keys = options.get("AWS_ACCESS_KEY_ID") and options.get("AWS_SECRET_ACCESS_KEY")
    if endpoint.startswith(("http://", "https://")) and keys:
        gets = RangedGets(  # contract 4: a custom endpoint, path-style as pyarrow reaches it
            endpoint,
            options["AWS_ACCESS_KEY_ID"],
            options["AWS_SECRET_ACCESS_KEY"],
            options.get("AWS_REGION") or "us-east-1",
            options.get("AWS_SESSION_TOKEN"),
        )
    return ObjectFiles(root, fs, inner, gets)
