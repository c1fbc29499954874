"""The file source on an object store (issue 38 item 1), against real servers: S3 (versitygw), and,
for the tests taking ``store``, GCS (fake-gcs-server, ``gs://``) and Azure Blob (Azurite,
``abfss://``) too, each reached through the environment alone (``AWS_*``; ``STORAGE_EMULATOR_HOST``;
``AZURE_STORAGE_USE_EMULATOR`` and ``AZURITE_BLOB_STORAGE_URL``).

- A ``splitkeeper run`` from a drop folder on each store into a local Delta sink: the sink holds
  every line of every object exactly once, bytes exact.
- Identity: an overwrite (later, or within the second of the first write: Last-Modified keeps its
  second), a copy under another key with the old key deleted (a move) or kept, a longer object with
  the same first bytes (append by overwrite): the changes :meth:`FileSource.check_splits` reports
  are those of the same changes on disk.
- The region reader on an executor reads from the URI and the environment alone (pickled), and
  refuses an object that changed after its range was planned.
- A ``source.path`` of an unknown scheme, or of a bucket (container) that does not exist, or of a
  store that does not answer, is refused naming ``source.path`` and the variables that reach it.
- The S3-only tests count the requests through versitygw's proxy (a settled plan reads nothing,
  incremental listing, the one-GET content sample and its retries).
"""

from __future__ import annotations

import pickle
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.config.settings import config_from_mapping
from splitkeeper.core.source import SplitChangeKind
from splitkeeper.core.types import Split
from splitkeeper.errors import ConfigError, SourceError
from splitkeeper.sources.files import fs as files_fs
from splitkeeper.sources.files.source import FileIdentity, FileRegionReader, FileSource

from .helpers import (
    assert_sink_equals_source,
    pipeline_mapping,
    sink_rows,
    splitkeeper_subprocess,
    write_config,
    write_input,
)

STORES = ("s3", "gs", "abfss")
#: A variable the fix names, per store (fs.reach_hint).
HINTS = {"s3": "AWS_ENDPOINT_URL", "gs": "STORAGE_EMULATOR_HOST", "abfss": "AZURITE_BLOB_STORAGE_URL"}


@dataclass(frozen=True)
class Store:
    """The object store of a test: its locations and the environment that reaches it (already set
    in this process by its fixture)."""

    scheme: str
    location: Callable[[str], str]
    env: dict[str, str]
    missing: str  # a source.path whose bucket (container) does not exist


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Store:
    """versitygw (``s3_store``), fake-gcs-server (``gcs_store``) and Azurite (``azure_store``)."""
    from splitkeeper.delta.storage import AZURITE_ACCOUNT

    if request.param == "s3":
        s3 = request.getfixturevalue("s3_store")
        return Store("s3", s3.location, s3.store_env(), "s3://no-such-bucket/in")
    if request.param == "gs":
        gcs = request.getfixturevalue("gcs_store")
        return Store("gs", gcs.location, gcs.env(), "gs://no-such-bucket/in")
    azure = request.getfixturevalue("azure_store")
    missing = f"abfss://no-such-bucket@{AZURITE_ACCOUNT}.dfs.core.windows.net/in"
    return Store("abfss", azure.location, azure.env(), missing)


def _fs(location: str = "s3://chaos") -> tuple[Any, str]:
    """The product's file system of ``location`` and its path there (the environment's store)."""
    from splitkeeper.delta.storage import filesystem

    return filesystem(location)


def _put(uri: str, data: bytes) -> None:
    fs, inner = _fs(uri)
    with fs.open_output_stream(inner) as out:
        out.write(data)


def _copy(src: str, dst: str) -> None:
    fs, inner = _fs(src)
    fs.copy_file(inner, _fs(dst)[1])


def _delete(uri: str) -> None:
    fs, inner = _fs(uri)
    fs.delete_file(inner)


def _upload(local: Path, uri: str) -> None:
    for path in sorted(local.rglob("*")):
        if path.is_file():
            _put(f"{uri}/{path.relative_to(local).as_posix()}", path.read_bytes())


def _settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every object counts as settled (the store's second of Last-Modified is long past)."""
    monkeypatch.setattr(files_fs, "SETTLE_NS", -(10**12))


def test_a_run_from_a_drop_folder_on_each_store_fills_the_sink_with_every_line_once_bytes_exact(
    store: Store, tmp_path: Path
) -> None:
    local = tmp_path / "drops"
    write_input(local, files=3, lines=40)
    (local / "sub").mkdir()
    (local / "sub" / "crlf.txt").write_bytes(b"caf\xc3\xa9\r\nno newline at the end")
    (local / "_hidden.txt").write_bytes(b"never read\n")
    drops = store.location("drops")
    _upload(local, drops)
    mapping = pipeline_mapping(
        tmp_path / "run", "objects", local, parallelism=2, epoch_records=60, region_timeout_s=90
    )
    mapping["source"]["path"] = drops
    config_path = write_config(tmp_path / "pipeline.yaml", mapping)

    done = splitkeeper_subprocess(["run", "--config", str(config_path)], **store.env)

    assert done.returncode == 0, done.stderr[-3000:]
    assert "source finished" in done.stdout, done.stdout
    (local / "_hidden.txt").unlink()  # the oracle reads what the source should: not _ names
    rows = assert_sink_equals_source(None, tmp_path / "run" / "sink", local)
    assert {r.split_id for r in rows} == {
        "part-00000.txt",
        "part-00001.txt",
        "part-00002.txt",
        "sub/crlf.txt",
    }


@pytest.mark.slow  # two runs, each with its own JVM: ~35 s on an idle machine
@pytest.mark.parametrize(
    "store",
    ["s3", *(pytest.param(s, marks=pytest.mark.slow_variant) for s in STORES[1:])],  # the same code
    indirect=True,
)
def test_an_overwrite_and_a_move_between_runs_read_nothing_twice_and_skip_nothing(
    store: Store, tmp_path: Path
) -> None:
    """``on_file_change: new_version`` on an object store, as on disk: a partly read object
    overwritten with the same size ends where it stood and its new version is read whole; an object
    copied under another key and deleted (a move) goes on from where it stood, nothing of it read
    twice. gs:// and abfss:// are slow variants (the path they take is the one of the fast tests)."""
    a = [b"a-%03d " % i + b"." * 20 for i in range(120)]
    b = [b"b-%03d " % i + b"." * 20 for i in range(40)]
    drops = store.location("runs")
    _put(f"{drops}/a.txt", b"\n".join(a) + b"\n")
    _put(f"{drops}/b.txt", b"\n".join(b) + b"\n")
    mapping = pipeline_mapping(
        tmp_path / "run", "moves", tmp_path, parallelism=2, epoch_records=60, region_timeout_s=90
    )
    mapping["source"].update(path=drops, on_file_change="new_version")
    config_path = write_config(tmp_path / "pipeline.yaml", mapping)
    env = store.env

    first = splitkeeper_subprocess(["run", "--config", str(config_path), "--epochs", "1"], **env)
    assert first.returncode == 0, first.stderr[-3000:]
    read_a = [
        r.value
        for r in sorted(sink_rows(tmp_path / "run" / "sink"), key=lambda r: r.offset)
        if r.split_id == "a.txt"
    ]
    assert 0 < len(read_a) < len(a)
    shuffled = a[1:] + a[:1]  # same size, other bytes; written seconds after the first version
    _put(f"{drops}/a.txt", b"\n".join(shuffled) + b"\n")
    _copy(f"{drops}/b.txt", f"{drops}/moved/b.txt")
    _delete(f"{drops}/b.txt")

    second = splitkeeper_subprocess(["run", "--config", str(config_path)], **env)
    assert second.returncode == 0, second.stderr[-3000:]
    rows = sink_rows(tmp_path / "run" / "sink")
    by_split: dict[str, list[Any]] = {}
    for r in sorted(rows, key=lambda r: (r.split_id, r.offset)):
        by_split.setdefault(r.split_id, []).append(r)
    (version,) = [sid for sid in by_split if sid.startswith("a.txt#v")]
    assert [r.value for r in by_split["a.txt"]] == read_a  # the old version ended where it stood
    assert [r.value for r in by_split[version]] == shuffled  # the new one, whole, in order
    moved = sorted(by_split.get("b.txt", []) + by_split.get("moved/b.txt", []), key=lambda r: r.offset)
    assert [r.value for r in moved] == b  # each line of b once, across its move
    assert [r.offset for r in moved[1:]] == [r.next_offset for r in moved[:-1]]
    assert set(by_split) == {"a.txt", version, "b.txt", "moved/b.txt"} - ({"b.txt"} - set(by_split))


def test_an_overwritten_object_is_changed_whether_or_not_its_second_passed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Overwritten with the same size within the second of the first write (the listing says the
    same size and Last-Modified) and overwritten later: both CHANGED, as a rewrite on disk is."""
    drops = store.location("over")
    _put(f"{drops}/a.txt", b"one\ntwo\n")
    source = FileSource(drops)
    (split,) = source.discover_splits()
    assert FileIdentity.parse(split.identity).ctime_ns != files_fs.SETTLED  # type: ignore[union-attr]

    _put(f"{drops}/a.txt", b"ONE\nTWO\n")  # same size, most likely the same second
    (change,) = source.check_splits([split], {})
    assert change.kind is SplitChangeKind.CHANGED and change.split_id == "a.txt"
    assert [s.end for s in change.replacement] == [8]

    _settle(monkeypatch)
    fresh = FileSource(drops)
    (now,) = fresh.discover_splits()
    assert fresh.check_splits([now], {}) == []  # settled and untouched: no read, no change
    time.sleep(1.05)  # the next second: a settled identity is compared by size and Last-Modified
    _put(f"{drops}/a.txt", b"uno\ndos\n")
    (change,) = fresh.check_splits([now], {})
    assert change.kind is SplitChangeKind.CHANGED


def test_an_unsettled_identity_of_an_untouched_object_is_taken_again_as_the_same_data(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    drops = store.location("same")
    _put(f"{drops}/a.txt", b"x\n" * 10)
    source = FileSource(drops)
    (split,) = source.discover_splits()
    _settle(monkeypatch)
    (change,) = source.check_splits([split], {})
    assert change.kind is SplitChangeKind.IDENTIFIED
    assert FileIdentity.parse(change.identity).ctime_ns == files_fs.SETTLED  # type: ignore[union-attr]
    assert source.check_splits([], {split.split_id: change.identity}) == []


def test_a_copy_under_another_key_is_a_move_when_the_old_key_goes_and_a_new_file_when_it_stays(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _settle(monkeypatch)
    drops = store.location("copy")
    data = b"".join(b"line %d\n" % i for i in range(50))
    _put(f"{drops}/a.txt", data)
    source = FileSource(drops)
    (split,) = source.discover_splits()

    _copy(f"{drops}/a.txt", f"{drops}/kept.txt")  # cp: a new file, the old one untouched
    assert source.check_splits([], {split.split_id: split.identity}) == []
    listed = source.discover_splits()
    assert [s.split_id for s in listed] == ["a.txt", "kept.txt"]

    _copy(f"{drops}/a.txt", f"{drops}/moved/a.txt")  # mv: copy, then delete
    _delete(f"{drops}/a.txt")
    live = Split("a.txt", subscription=drops, position=100, end=len(data), identity=split.identity)
    (change,) = source.check_splits([live], {"kept.txt": listed[1].identity})
    assert change.kind is SplitChangeKind.MOVED and change.moved_to == "moved/a.txt"
    assert change.end == len(data)  # the core keeps the live split's progress (position 100)


def test_an_object_overwritten_longer_with_the_same_first_bytes_grew(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _settle(monkeypatch)
    drops = store.location("grow")
    _put(f"{drops}/a.txt", b"one\ntwo\n")
    source = FileSource(drops, growing=True)
    (split,) = source.discover_splits()
    _put(f"{drops}/a.txt", b"one\ntwo\nthree\nhalf")
    (change,) = source.check_splits([], {split.split_id: split.identity})
    assert change.kind is SplitChangeKind.GREW
    assert (change.start, change.end) == (8, 14)  # the unterminated last line waits for its newline


def test_the_reader_builds_its_store_from_the_uri_and_refuses_a_changed_object(store: Store) -> None:
    """The identity is unsettled (just written): the reader compares the content sample, so an
    overwrite of the same size within the same second is refused."""
    drops = store.location("read")
    lines = [b"%05d " % i + b"x" * 30 for i in range(3000)]  # ~110 KB: more than one 64 KiB buffer
    data = b"\n".join(lines) + b"\n"
    _put(f"{drops}/big.txt", data)
    source = FileSource(drops, split_bytes=40_000)
    splits = source.discover_splits()
    assert len(splits) == 3 and splits[-1].end == len(data)
    reader = pickle.loads(pickle.dumps(source.reader()))  # what an executor gets
    assert isinstance(reader, FileRegionReader) and reader.root == drops
    files_fs._object_files.cache_clear()  # nothing cached from the driver
    got = [r.value for s in splits for r in reader.read_range(s, s.position, s.end or 0)]
    assert got == lines
    middle = splits[1]
    cut = source.plan_end(middle, middle.position, 100)
    first = list(reader.read_range(middle, middle.position, cut))
    assert len(first) >= 1 and first[0].offset == middle.position and data[cut - 1 : cut] == b"\n"

    _put(f"{drops}/big.txt", data.replace(b"x", b"y"))
    with pytest.raises(SourceError, match="changed after the range was planned"):
        list(reader.read_range(middle, middle.position, middle.end or 0))


@pytest.mark.parametrize("path", ["ftp://drops/in", "s3:///in", "hdfs://nn/in"])
def test_a_source_path_of_another_scheme_is_refused_naming_the_key_and_the_fix(
    tmp_path: Path, path: str
) -> None:
    mapping = pipeline_mapping(tmp_path, "bad", tmp_path)
    mapping["source"]["path"] = path
    with pytest.raises(ConfigError) as err:
        config_from_mapping(mapping)
    assert "source.path" in str(err.value) and "s3://<bucket>/<prefix>" in str(err.value)
    assert str(err.value).startswith("[CONFIG_ERROR]")


def test_a_bucket_that_does_not_exist_is_named_with_the_fix(store: Store) -> None:
    source = FileSource(store.missing)
    with pytest.raises(SourceError) as err:
        source.subscriptions()
    message = str(err.value)
    what = "container" if store.scheme == "abfss" else "bucket"
    assert message.startswith(f"[SOURCE_ERROR] source.path {store.missing} cannot be read")
    assert f"{what} 'no-such-bucket' does not exist" in message and "create the bucket" in message
    assert HINTS[store.scheme] in message
    with pytest.raises(SourceError, match="no-such-bucket"):
        source.discover_splits()


def test_an_empty_prefix_is_an_empty_folder(store: Store) -> None:
    source = FileSource(store.location("nothing-yet") + "/")
    assert source.subscriptions() == frozenset({store.location("nothing-yet")})
    assert source.discover_splits() == []


def test_an_objects_open_and_ranged_reads_give_what_its_listing_and_content_say(store: Store) -> None:
    """fs contracts 2 to 4 on each store: the stat an open answers (S3, Azure: Last-Modified; GCS: the
    creation time) is the listing's, so an identity taken from either matches; a seek and read is
    those bytes; an overwrite is a new stat."""
    drops = store.location("stat")
    data = bytes(range(256)) * 1000  # 256 KB: several 64 KiB buffers
    _put(f"{drops}/a.bin", data)
    files = files_fs.files_for(drops)
    assert isinstance(files, files_fs.ObjectFiles)
    ((rel, listed),) = list(files.walk(lambda name: False))
    f, opened = files.open_with_stat(f"{drops}/a.bin")
    with f:
        assert (rel, listed.size) == ("a.bin", len(data))
        assert (opened.size, opened.mtime_ns) == (listed.size, listed.mtime_ns)
        for start, n in [(0, 10), (70_000, 5), (200_000, 60_000), (len(data) - 3, 100)]:
            f.seek(start)
            assert f.read(n) == data[start : start + n], (start, n)
    time.sleep(1.05)  # the next second (S3, Azure)
    _put(f"{drops}/a.bin", data[::-1])
    assert files.stat(f"{drops}/a.bin").mtime_ns > listed.mtime_ns


@pytest.mark.parametrize(
    ("uri", "inner"),
    [
        ("s3a://drops/in/", "drops/in"),
        ("gs://drops/in", "drops/in"),
        ("abfss://drops@account.dfs.core.windows.net/in", "drops/in"),
    ],
)
def test_every_object_scheme_gets_pyarrows_file_system_for_its_root(uri: str, inner: str) -> None:
    """Built without a request (the credentials are used on the first one)."""
    files = files_fs.files_for(uri)
    assert isinstance(files, files_fs.ObjectFiles)
    root = files_fs.object_root(uri)
    assert files.root == root and files.join(root, "a/b.txt") == f"{root}/a/b.txt"
    assert files._inner(f"{root}/a/b.txt") == f"{inner}/a/b.txt"
    assert isinstance(files_fs.files_for("/data/in"), files_fs.LocalFiles)


@pytest.mark.parametrize("scheme", STORES)
def test_an_unreachable_store_is_named_in_seconds(monkeypatch: pytest.MonkeyPatch, scheme: str) -> None:
    from splitkeeper_tools.kafka_broker import free_port

    nothing = f"http://127.0.0.1:{free_port()}"  # nothing listens
    env = {
        "s3": {"AWS_ENDPOINT_URL": nothing, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"},
        "gs": {"STORAGE_EMULATOR_HOST": nothing},
        "abfss": {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": nothing},
    }[scheme]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    path = {
        "s3": "s3://drops/in",
        "gs": "gs://drops/in",
        "abfss": "abfss://drops@devstoreaccount1.dfs.core.windows.net/in",
    }[scheme]
    started = time.monotonic()
    with pytest.raises(SourceError) as err:
        FileSource(path).subscriptions()
    assert time.monotonic() - started < 30  # not the readers' ten tries (two minutes on GCS) with backoff
    assert str(err.value).startswith(f"[SOURCE_ERROR] source.path {path} cannot be read: ")
    assert HINTS[scheme] in str(err.value)


def test_a_run_whose_bucket_does_not_exist_stops_before_spark_naming_source_path(
    store: Store, tmp_path: Path
) -> None:
    from .helpers import run_cli

    mapping = pipeline_mapping(tmp_path / "run", "nobucket", tmp_path)
    mapping["source"]["path"] = store.missing
    config_path = write_config(tmp_path / "pipeline.yaml", mapping)
    code, _out, err = run_cli(["run", "--config", str(config_path)])
    assert code != 0
    what = "container" if store.scheme == "abfss" else "bucket"
    assert f"[SOURCE_ERROR] source.path {store.missing} cannot be read: {what} 'no-such-bucket'" in err


def test_a_plan_of_settled_unchanged_objects_lists_and_reads_nothing(
    s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the store's proxy, counting: discovery reads each object's sample once (ranged GETs);
    the identity check and discovery of the next plan list the prefix and read no object."""
    _settle(monkeypatch)
    drops = s3_store.location("cost")
    for i in range(30):
        _put(f"{drops}/f{i:02d}.txt", b"line %d\n" % i)
    seen: list[tuple[str, str, str]] = []

    def record(request: Any) -> None:
        seen.append(
            (request.method, request.path, request.headers.get("Range", request.headers.get("range", "")))
        )
        return None

    s3_store.proxy.fault = record
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_store.proxy.url)
    source = FileSource(drops)
    splits = source.discover_splits()
    assert len(splits) == 30
    object_gets = [s for s in seen if s[0] == "GET" and "/f" in s[1] and "list-type" not in s[1]]
    assert len({p for _m, p, _r in object_gets}) == 30 and all(
        r.startswith("bytes=") for *_x, r in object_gets
    )
    seen.clear()
    assert source.check_splits([], {s.split_id: s.identity for s in splits}) == []
    assert len(source.discover_splits()) == 30
    assert [s for s in seen if "/f" in s[1].split("?")[0]] == []  # no HEAD, no GET of an object
    assert 1 <= len(seen) <= 4, seen  # source.path's look-up and one listing


def test_incremental_listing_on_s3_lists_from_the_cursor_and_a_recheck_catches_a_late_key(
    s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``discovery: incremental`` on an object store (fs contract 5): an epoch without a recheck lists
    only the folders that are not wholly before the last key seen (no LIST of an older day), takes
    the keys after it, and a live object before it by its key; a key written late (it sorts before
    the cursor) and a deleted one are found by the next recheck's full listing; nothing is read
    twice (each new object's sample once)."""
    _settle(monkeypatch)
    drops = s3_store.location("incr")
    for day in ("2026-01-01", "2026-01-02"):
        for i in range(3):
            _put(f"{drops}/{day}/part-{i}.txt", f"{day} {i}\n".encode())
    seen: list[tuple[str, str]] = []

    def record(request: Any) -> None:
        seen.append((request.method, request.path))
        return None

    s3_store.proxy.fault = record
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_store.proxy.url)
    source = FileSource(drops, discovery="incremental")
    splits = source.discover_splits()
    assert len(splits) == 6
    finished = {s.split_id: s.identity for s in splits[:-1]}
    live = splits[-1:]  # 2026-01-02/part-2.txt, not read to its end yet
    source.check_splits(live, finished)
    source.discover_splits()  # sets the cursor: the last key listed

    _put(f"{drops}/2026-01-02/part-3.txt", b"in order\n")
    _put(f"{drops}/2026-01-03/part-0.txt", b"a new folder\n")
    _put(f"{drops}/2026-01-01/part-9.txt", b"late: sorts before the last key seen\n")
    _put(f"{drops}/2026-01-02/part-2.txt", b"2026-01-02 2\nthe live object grew\n")
    fs, _ = _fs()
    fs.delete_file(f"{drops[len('s3://') :]}/2026-01-01/part-0.txt")
    seen.clear()
    changes = source.check_splits(live, finished, recheck_finished=False)
    assert [(c.split_id, c.kind) for c in changes] == [("2026-01-02/part-2.txt", SplitChangeKind.GREW)]
    new = [s.split_id for s in source.discover_splits()]
    assert new == ["2026-01-02/part-2.txt", "2026-01-02/part-3.txt", "2026-01-03/part-0.txt"]
    assert source.removed_paths == ()  # the deletion is seen by the next full listing
    lists = [p for m, p in seen if m == "GET" and "list-type" in p]
    prefixes = sorted(urllib.parse.parse_qs(urllib.parse.urlsplit(p).query)["prefix"][0] for p in lists)
    root = drops.split("/", 3)[3]
    assert prefixes == [f"{root}/", f"{root}/2026-01-02/", f"{root}/2026-01-03/"]  # not 2026-01-01/
    assert not [p for m, p in seen if m in ("GET", "HEAD") and "2026-01-01" in p.split("?")[0]]

    changes = source.check_splits(live, finished)  # a recheck lists everything
    after = [s.split_id for s in source.discover_splits()]
    assert "2026-01-01/part-9.txt" in after
    assert source.removed_paths == (f"{drops}/2026-01-01/part-0.txt",)


def test_incremental_listing_on_s3_lists_an_empty_object_again_until_it_has_data(
    s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _settle(monkeypatch)
    drops = s3_store.location("incr-empty")
    _put(f"{drops}/a.txt", b"a\n")
    source = FileSource(drops, discovery="incremental")
    splits = source.discover_splits()
    finished = {s.split_id: s.identity for s in splits}
    source.check_splits([], finished)
    source.discover_splits()
    _put(f"{drops}/b.txt", b"")  # created empty: written again later under the same key
    _put(f"{drops}/c.txt", b"c\n")
    source.check_splits([], finished, recheck_finished=False)
    assert [s.split_id for s in source.discover_splits()] == ["c.txt"]
    _put(f"{drops}/b.txt", b"b\n")
    source.check_splits([], finished, recheck_finished=False)
    assert [s.split_id for s in source.discover_splits()] == ["b.txt"]


def _requests_to(s3_store: Any, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, dict[str, str]]]:
    """Every request of the source's store from now on (through the store's proxy, no fault):
    ``(method, path, headers)``."""
    seen: list[tuple[str, str, dict[str, str]]] = []

    def record(request: Any) -> None:
        seen.append((request.method, request.path, {k.lower(): v for k, v in request.headers.items()}))

    s3_store.proxy.fault = record
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_store.proxy.url)
    return seen


def test_a_new_objects_sample_is_one_get_whose_answer_is_the_stat_a_head_gives(
    s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fs contract 4: ``open_sampled`` gives the size, Last-Modified and sample digest the pyarrow open
    (HEAD, then GETs) gives, from one ranged GET up to 64 KiB and one more GET (If-Match its ETag)
    for the tail past it; no such key is FileNotFoundError after that one GET."""
    import hashlib
    import io

    from splitkeeper.sources.files.source import sample_digest

    drops = s3_store.location("sampled")
    sizes = {"one": 15, "at64k": 65_536, "past64k": 65_537, "large": 200_000, "empty": 0, "a b+c=d": 20}
    data = {name: hashlib.shake_256(name.encode()).digest(n) for name, n in sizes.items()}
    for name, blob in data.items():
        _put(f"{drops}/{name}.txt", blob)
    seen = _requests_to(s3_store, monkeypatch)
    files = files_fs.files_for(drops)
    assert isinstance(files, files_fs.ObjectFiles)
    for name, blob in data.items():
        path = f"{drops}/{name}.txt"
        seen.clear()
        f, st = files.open_sampled(path)
        with f:
            digest = sample_digest(f, st.size) if st.size else None
        requests = list(seen)
        g, head_st = files.open_with_stat(path)
        with g:
            assert digest == (sample_digest(g, head_st.size) if head_st.size else None), name
        assert (st.size, st.mtime_ns) == (head_st.size, head_st.mtime_ns) == (len(blob), st.mtime_ns), name
        if blob:
            assert digest == sample_digest(io.BytesIO(blob), len(blob)), name
            assert [m for m, *_ in requests] == ["GET"] * (1 if len(blob) <= 65_536 else 2), (name, requests)
            assert requests[0][2]["range"] == "bytes=0-65535"
            assert all("if-match" in h for _m, _p, h in requests[1:]), requests
    seen.clear()
    with pytest.raises(FileNotFoundError):
        files.open_sampled(f"{drops}/missing.txt")
    assert [m for m, *_ in seen] == ["GET"]


def test_an_overwrite_between_a_samples_first_get_and_its_tail_fails_the_read_not_the_identity(
    s3_store: Any,
) -> None:
    """A sample's tail is read with If-Match on the first GET's ETag: an object overwritten in between
    (same size) fails the read (OSError), so no identity mixes two versions; opened again, the sample
    is the new version's."""
    import io

    from splitkeeper.sources.files.source import sample_digest

    drops = s3_store.location("torn")
    first, second = b"a" * 150_000, b"a" * 100_000 + b"b" * 50_000  # same head, another tail
    _put(f"{drops}/big.txt", first)
    files = files_fs.files_for(drops)
    f, st = files.open_sampled(f"{drops}/big.txt")
    _put(f"{drops}/big.txt", second)
    with f, pytest.raises(OSError, match="changed while its content sample was read"):
        sample_digest(f, st.size)
    g, again = files.open_sampled(f"{drops}/big.txt")
    with g:
        assert sample_digest(g, again.size) == sample_digest(io.BytesIO(second), len(second))


def test_a_sample_get_answered_503_is_sent_again_and_every_new_objects_identity_is_its_own(
    s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40% of the requests answered 503 SlowDown: the look-up of new objects (notification mode)
    sends a refused sample GET again (counted, ``source_sample``), and every object's stat and
    sample digest are its own."""
    import io

    from splitkeeper.delta import retries
    from splitkeeper.sources.files.source import sample_digest
    from splitkeeper_tools.fault_proxy import FaultSchedule

    _settle(monkeypatch)
    drops = s3_store.location("refused")
    blobs = {f"f{i:02d}.txt": b"line %d\n" % i * (1 + 9000 * (i % 3)) for i in range(24)}
    for name, blob in blobs.items():
        _put(f"{drops}/{name}", blob)
    s3_store.proxy.fault = FaultSchedule(seed=7, slowdown=0.4)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_store.proxy.url)
    before = retries.counts()["source_sample"]
    source = FileSource(drops)
    source._root()
    looked = [source._look(name) for name in blobs]
    for name, st, identity in looked:
        blob = blobs[name]
        assert isinstance(st, files_fs.FileStat) and st.size == len(blob), (name, st)
        assert identity is not None and identity.digest == sample_digest(io.BytesIO(blob), len(blob)), name
    counts = s3_store.proxy.counts()
    assert counts["slowdown"] >= 10, counts
    assert retries.counts()["source_sample"] - before >= 10
