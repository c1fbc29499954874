"""The file source: byte-range splits, Hadoop's line rule, exact resume, discovery, unicode."""

from __future__ import annotations

import logging
import os
import pickle
import random
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitkeeper import kinds
from splitkeeper.config.base import SourceSection
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.core.source import (
    SourceRecord,
    SplitChangeKind,
    SplitSource,
    SupportsSplitReassignmentOnRecovery,
)
from splitkeeper.core.types import Split
from splitkeeper.errors import EnvironmentNotReadyError, SourceError
from splitkeeper.sources import build_source
from splitkeeper.sources.contract import SourceContractTests, read_planned
from splitkeeper.sources.files.source import FileRegionReader, FileSource

ALPHABET = "abcxyz 0123456789é€𝄞\t"


def random_lines(rng: random.Random, count: int) -> list[str]:
    lines = ["".join(rng.choices(ALPHABET, k=rng.choice([0, 1, 5, 40, 300]))) for _ in range(count)]
    lines[count // 2] = ""  # at least one empty line
    return lines


def write(path: Path, lines: list[str], trailing_newline: bool = True) -> bytes:
    data = "\n".join(lines).encode("utf-8") + (b"\n" if trailing_newline else b"")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def expected_records(data: bytes) -> list[SourceRecord]:
    """The records of a whole file, computed independently of the reader."""
    out, pos = [], 0
    for chunk in data.split(b"\n"):
        if pos >= len(data):
            break
        nxt = min(pos + len(chunk) + 1, len(data))
        out.append(SourceRecord(pos, nxt, chunk.removesuffix(b"\r")))
        pos = nxt
    return out


def read_all(source: FileSource, splits: list[Split]) -> list[SourceRecord]:
    reader = source.reader()
    return [r for s in splits for r in reader.read_range(s, s.position, s.end or 0)]


def assert_contiguous(records: list[SourceRecord], start: int, end: int) -> None:
    assert records[0].offset == start
    assert records[-1].next_offset == end
    for before, after in zip(records, records[1:], strict=False):
        assert before.next_offset == after.offset


# --------------------------------------------------------------------------- byte ranges


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_file_cut_into_three_byte_ranges_yields_every_line_once_with_contiguous_offsets(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    data = write(tmp_path / "in" / "f.txt", random_lines(rng, 200), trailing_newline=False)
    source = FileSource(tmp_path / "in", split_bytes=len(data) // 3 + 1)
    splits = source.discover_splits()

    assert len(splits) == 3
    assert [s.split_id for s in splits] == [f"f.txt#{s.position}-{s.end}" for s in splits]
    assert splits[0].position == 0 and splits[-1].end == len(data)
    for left, right in zip(splits, splits[1:], strict=False):
        assert left.end == right.position  # ranges tile the file
    for split in splits:
        part = list(source.reader().read_range(split, split.position, split.end or 0))
        assert_contiguous(part, split.position, split.end or 0)
    assert read_all(source, splits) == expected_records(data)


def test_range_boundaries_snap_forward_to_line_starts(tmp_path: Path) -> None:
    data = write(tmp_path / "f.txt", ["aaaa", "bbbbbbbbbb", "c", "dddddd"])  # lines start at 0, 5, 16, 18
    splits = FileSource(tmp_path, split_bytes=6).discover_splits()
    assert [(s.position, s.end) for s in splits] == [(0, 16), (16, 18), (18, len(data))]


def test_a_line_longer_than_split_bytes_stays_in_one_split(tmp_path: Path) -> None:
    data = write(tmp_path / "f.txt", ["x" * 100, "y"])
    splits = FileSource(tmp_path, split_bytes=10).discover_splits()
    assert [(s.split_id, s.position, s.end) for s in splits] == [
        ("f.txt#0-101", 0, 101),
        ("f.txt#101-103", 101, len(data)),
    ]


def test_small_file_is_one_split_named_by_its_relative_path(tmp_path: Path) -> None:
    data = write(tmp_path / "sub" / "f.txt", ["a", "b"])
    (split,) = FileSource(tmp_path, split_bytes=1 << 20).discover_splits()
    assert replace(split, identity="") == Split(
        "sub/f.txt", subscription=str(tmp_path), position=0, end=len(data)
    )
    st = (tmp_path / "sub" / "f.txt").stat()
    assert split.identity.startswith(f"f1:{len(data)}:{st.st_mtime_ns}:")


@settings(max_examples=150, deadline=None)
@given(
    lines=st.lists(st.text(alphabet=ALPHABET + "\r", max_size=30), min_size=1, max_size=40),
    cuts=st.lists(st.integers(min_value=1, max_value=2000), max_size=8),
    trailing=st.booleans(),
)
def test_arbitrary_cuts_follow_hadoops_rule_no_line_lost_or_repeated(
    lines: list[str], cuts: list[int], trailing: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = write(Path(tmp) / "f.txt", lines, trailing_newline=trailing)
        if not data:
            return
        (split,) = FileSource(tmp).discover_splits()
        bounds = sorted({0, len(data), *(c % len(data) for c in cuts)})
        reader = FileRegionReader(tmp)
        got = [r for a, b in zip(bounds, bounds[1:], strict=False) for r in reader.read_range(split, a, b)]
        assert got == expected_records(data)


# --------------------------------------------------------------------------- resume and replay


def test_reading_from_a_mid_position_resumes_exactly(tmp_path: Path) -> None:
    data = write(tmp_path / "f.txt", random_lines(random.Random(9), 120))
    (split,) = FileSource(tmp_path).discover_splits()
    whole = list(FileRegionReader(str(tmp_path)).read_range(split, 0, len(data)))
    for k in (1, 37, 60, 119):
        mid = whole[k].offset
        resumed = list(FileRegionReader(str(tmp_path)).read_range(split.at(mid), mid, len(data)))
        assert resumed == whole[k:]
        sub = list(
            FileRegionReader(str(tmp_path)).read_range(
                split, mid, whole[k + 1].next_offset if k < 119 else len(data)
            )
        )
        assert sub == whole[k : k + 2]


def test_planned_epochs_chain_and_end_on_line_starts(tmp_path: Path) -> None:
    data = write(tmp_path / "f.txt", random_lines(random.Random(3), 500))
    source = FileSource(tmp_path, split_bytes=len(data) // 2)
    starts = {r.offset for r in expected_records(data)} | {len(data)}
    for split in source.discover_splits():
        ranges = read_planned(source, split, budget=17)
        flat = [r for rng in ranges for r in rng]
        assert_contiguous(flat, split.position, split.end or 0)
        assert all(rng and rng[-1].next_offset in starts for rng in ranges)
        assert len(ranges) > 1


def test_reader_is_picklable_and_stateless(tmp_path: Path) -> None:
    write(tmp_path / "f.txt", ["one", "two", "three"])
    source = FileSource(tmp_path)
    (split,) = source.discover_splits()
    reader = pickle.loads(pickle.dumps(source.reader()))
    first = list(reader.read_range(split, 0, split.end or 0))
    assert [r.value for r in first] == [b"one", b"two", b"three"]
    assert list(reader.read_range(split, 0, split.end or 0)) == first


# --------------------------------------------------------------------------- discovery


def test_new_file_is_discovered_at_the_next_call(tmp_path: Path) -> None:
    write(tmp_path / "a.txt", ["a"])
    source = FileSource(tmp_path)
    assert [s.split_id for s in source.discover_splits()] == ["a.txt"]
    write(tmp_path / "nested" / "b.txt", ["b"])
    assert [s.split_id for s in source.discover_splits()] == ["a.txt", "nested/b.txt"]


def test_removed_file_is_logged_by_path_and_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path / "a.txt", ["a"])
    write(tmp_path / "b.txt", ["b"])
    source = FileSource(tmp_path)
    source.discover_splits()
    (tmp_path / "a.txt").unlink()
    with caplog.at_level(logging.WARNING, logger="splitkeeper.sources.files"):
        splits = source.discover_splits()
    assert [s.split_id for s in splits] == ["b.txt"]
    assert source.removed_paths == (str(tmp_path / "a.txt"),)
    (record,) = [r for r in caplog.records if r.name == "splitkeeper.sources.files"]
    assert str(tmp_path / "a.txt") in record.getMessage() and "removed" in record.getMessage()
    assert source.subscriptions() == frozenset({str(tmp_path)})


def test_hidden_underscore_and_empty_files_are_skipped(tmp_path: Path) -> None:
    write(tmp_path / "ok.txt", ["x"])
    write(tmp_path / ".part.tmp", ["x"])
    write(tmp_path / "_SUCCESS", ["x"])
    write(tmp_path / "_tmp" / "a.txt", ["x"])
    (tmp_path / "empty.txt").write_bytes(b"")
    assert [s.split_id for s in FileSource(tmp_path).discover_splits()] == ["ok.txt"]


def test_a_changed_file_keeps_its_layout_in_discovery_and_check_splits_reports_it(tmp_path: Path) -> None:
    write(tmp_path / "f.txt", ["a", "b"])
    source = FileSource(tmp_path)
    first = source.discover_splits()
    with open(tmp_path / "f.txt", "ab") as f:
        f.write(b"c\n")
    assert source.discover_splits() == first
    (change,) = source.check_splits(first, {})
    assert change.kind is SplitChangeKind.GREW and (change.start, change.end) == (4, 6)
    assert f"file {tmp_path / 'f.txt'} grew from 4 to 6 bytes" in change.detail


def test_a_plan_stats_each_file_once_whatever_the_number_of_finished_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26 item 5 (100,000 file splits): the identity check and the discovery of a plan (one
    scan, shared) stat every file once and source.path once; building a file's
    path stat'ed source.path again for each known file (two stats per file per plan)."""
    for i in range(120):
        write(tmp_path / f"f{i:03d}.txt", [f"line {i}"])
    source = FileSource(tmp_path)
    splits = source.discover_splits()
    finished = {s.split_id: s.identity for s in splits[:100]}  # finished files are checked too
    calls: list[str] = []
    real_stat = os.stat

    def counting(path: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(os.fspath(path))
        return real_stat(path, *args, **kwargs)

    write(tmp_path / "new.txt", ["new"])
    monkeypatch.setattr(os, "stat", counting)
    assert source.check_splits(splits[100:], finished) == []  # nothing changed
    assert [s.split_id for s in source.discover_splits()] == sorted(
        [s.split_id for s in splits] + ["new.txt"]
    )
    monkeypatch.setattr(os, "stat", real_stat)
    assert sorted(c for c in calls if c != str(tmp_path)) == sorted(str(p) for p in tmp_path.iterdir())
    assert calls.count(str(tmp_path)) == 1  # source.path: one stat per scan says file or folder


def test_single_file_path_is_a_source_of_one_split(tmp_path: Path) -> None:
    data = write(tmp_path / "only.txt", ["a", "b"])
    write(tmp_path / "other.txt", ["z"])
    source = FileSource(tmp_path / "only.txt")
    (split,) = source.discover_splits()
    assert split.split_id == "only.txt" and split.end == len(data)
    assert split.subscription == str(tmp_path / "only.txt")
    assert [r.value for r in source.reader().read_range(split, 0, len(data))] == [b"a", b"b"]


def test_missing_root_names_the_path_and_the_fix(tmp_path: Path) -> None:
    source = FileSource(tmp_path / "nope")
    with pytest.raises(SourceError, match=r"source.path .*nope does not exist: create the directory"):
        source.discover_splits()
    with pytest.raises(SourceError, match="does not exist"):
        source.subscriptions()


def test_deleted_file_fails_the_read_with_the_split_and_path(tmp_path: Path) -> None:
    write(tmp_path / "f.txt", ["a"])
    source = FileSource(tmp_path)
    (split,) = source.discover_splits()
    (tmp_path / "f.txt").unlink()
    with pytest.raises(SourceError, match=r"split 'f.txt': file .*f.txt does not exist any more"):
        source.reader().read_range(split, 0, split.end or 0)


def test_truncated_file_fails_the_read(tmp_path: Path) -> None:
    write(tmp_path / "f.txt", ["aaaa", "bbbb"])
    source = FileSource(tmp_path)
    (split,) = source.discover_splits()
    (tmp_path / "f.txt").write_bytes(b"aa\n")
    with pytest.raises(SourceError, match="truncated or replaced after discovery"):
        source.reader().read_range(split, 0, split.end or 0)


def test_range_outside_the_split_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "f.txt", ["aaaa"])
    (split,) = FileSource(tmp_path).discover_splits()
    with pytest.raises(SourceError, match=r"range \[0, 99\) is not allowed"):
        FileRegionReader(str(tmp_path)).read_range(split, 0, 99)


def test_fingerprint_changes_with_the_split_layout(tmp_path: Path) -> None:
    assert FileSource(tmp_path).fingerprint() == FileSource(tmp_path).fingerprint()
    assert FileSource(tmp_path).fingerprint() != FileSource(tmp_path, split_bytes=1024).fingerprint()
    assert FileSource(tmp_path).fingerprint() != FileSource(tmp_path, format="jsonl").fingerprint()


def test_file_source_is_a_core_split_source_with_deferred_assignment(tmp_path: Path) -> None:
    source = FileSource(tmp_path)
    assert isinstance(source, SplitSource)
    assert isinstance(source, SupportsSplitReassignmentOnRecovery)
    assert source.bounded


# --------------------------------------------------------------------------- unicode and formats


def test_unicode_offsets_are_bytes_and_values_are_the_lines_bytes(tmp_path: Path) -> None:
    lines = ["é", "€€", "𝄞 clef", "", "plain"]
    data = write(tmp_path / "u.txt", lines)
    source = FileSource(tmp_path, split_bytes=5)
    splits = source.discover_splits()
    records = read_all(source, splits)
    assert [r.value for r in records] == [line.encode() for line in lines]
    assert [r.offset for r in records] == [0, 3, 10, 20, 21]
    assert records[-1].next_offset == len(data)
    assert all(s.end is not None and data[s.end - 1 : s.end] == b"\n" for s in splits)


def test_crlf_and_bom_are_not_part_of_values(tmp_path: Path) -> None:
    (tmp_path / "w.txt").write_bytes(b"\xef\xbb\xbfhead\r\nbody\r\n")
    source = FileSource(tmp_path)
    (split,) = source.discover_splits()
    records = list(source.reader().read_range(split, 0, split.end or 0))
    assert records == [SourceRecord(0, 9, b"head"), SourceRecord(9, 15, b"body")]


def test_invalid_utf8_is_kept_in_lines_and_named_by_byte_offset_in_jsonl(tmp_path: Path) -> None:
    (tmp_path / "bad.txt").write_bytes(b"ok\nbad \xff here\n")
    source = FileSource(tmp_path)
    (split,) = source.discover_splits()
    records = list(source.reader().read_range(split, 0, split.end or 0))
    assert [r.value for r in records] == [b"ok", b"bad \xff here"]  # the bytes, exactly
    (tmp_path / "bad.txt").write_bytes(b'1\n"bad \xff here"\n')
    source = FileSource(tmp_path, format="jsonl")
    (split,) = source.discover_splits()
    with pytest.raises(SourceError, match=r"line at byte 2 is not valid UTF-8 .* at byte 7"):
        list(source.reader().read_range(split, 0, split.end or 0))


def test_jsonl_blank_lines_are_absorbed_and_offsets_stay_contiguous(tmp_path: Path) -> None:
    data = write(tmp_path / "j.jsonl", ["", '{"a": 1}', "  ", "", '{"a": 2}', ""])
    source = FileSource(tmp_path, format="jsonl")
    (split,) = source.discover_splits()
    records = list(source.reader().read_range(split, 0, len(data)))
    assert [r.value for r in records] == [b'{"a": 1}', b'{"a": 2}']
    assert_contiguous(records, 0, len(data))


def test_jsonl_rejects_a_line_that_is_not_json(tmp_path: Path) -> None:
    write(tmp_path / "j.jsonl", ['{"a": 1}', "{oops"])
    source = FileSource(tmp_path, format="jsonl")
    (split,) = source.discover_splits()
    with pytest.raises(SourceError, match=r"line at byte 9 is not valid JSON"):
        list(source.reader().read_range(split, 0, split.end or 0))


def test_a_growing_files_last_line_without_its_newline_is_not_a_split_yet(tmp_path: Path) -> None:
    """on_file_change: append (``growing``): a writer may be mid-line, so the split ends at the last
    newline, with split_bytes too; a file of one unended line has no split until it is ended. The
    splits grow from that end (GREW), never from the middle of a line."""
    (tmp_path / "only.txt").write_bytes(b"half a li")
    (tmp_path / "log.txt").write_bytes(b"one\ntwo\nthree\nfou")
    source = FileSource(tmp_path, split_bytes=5, growing=True)
    splits = source.discover_splits()
    assert [(s.split_id, s.position, s.end) for s in splits] == [
        ("log.txt#0-8", 0, 8),
        ("log.txt#8-14", 8, 14),
    ]
    plain = FileSource(tmp_path, split_bytes=5)  # other policies: files are final, read to their end
    assert [s.end for s in plain.discover_splits()] == [8, 14, 17, 9]
    with open(tmp_path / "log.txt", "ab") as f:
        f.write(b"r\nfi")
    with open(tmp_path / "only.txt", "ab") as f:
        f.write(b"ne\n")
    finished = {s.split_id: s.identity for s in splits}
    changes = source.check_splits([], finished)
    assert [(c.split_id, c.kind, c.start, c.end) for c in changes] == [
        ("log.txt#0-8", SplitChangeKind.GREW, 8, 8),
        ("log.txt#8-14", SplitChangeKind.GREW, 14, 19),  # "four\n" is read now, "fi" not yet
    ]
    assert [(s.split_id, s.end) for s in source.discover_splits() if s.split_id == "only.txt"] == [
        ("only.txt", 12)
    ]


# --------------------------------------------------------------------------- factory


def _source_config(tmp_path: Path, **source: Any) -> SourceSection:
    """The ``source`` of a pipeline whose state and sink lie beside ``tmp_path``."""
    places = {"state": {"path": str(tmp_path.parent / f"{tmp_path.name}-state")}}
    places["sink"] = {"path": str(tmp_path.parent / f"{tmp_path.name}-sink")}
    return config_from_mapping({"name": "t", "source": source, **places}).source


def test_build_source_makes_a_file_source_from_config(tmp_path: Path) -> None:
    built = build_source(_source_config(tmp_path, kind="files", path=str(tmp_path), split_bytes=64))
    assert isinstance(built, FileSource) and built.path == str(tmp_path)


def test_build_source_for_kafka_without_the_module_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import dataclasses

    config = _source_config(tmp_path, kind="kafka", bootstrap_servers="b:1", topics=["t"])
    kafka = dataclasses.replace(
        kinds.source_factory("kafka"), connector="splitkeeper.sources.no_such_kafka:connector"
    )
    monkeypatch.setattr(kinds, "source_factory", lambda name: kafka)
    with pytest.raises(EnvironmentNotReadyError, match="source.kind 'kafka' needs"):
        build_source(config)


# --------------------------------------------------------------------------- contract


class TestFileSourceContract(SourceContractTests):
    def make_source(self, tmp_path: Path) -> FileSource:
        write(tmp_path / "in" / "a.txt", random_lines(random.Random(5), 50))
        write(tmp_path / "in" / "b.txt", ["x", "y", "z"], trailing_newline=False)
        return FileSource(tmp_path / "in", split_bytes=400)


class TestJsonlFileSourceContract(SourceContractTests):
    def make_source(self, tmp_path: Path) -> FileSource:
        write(tmp_path / "in" / "a.jsonl", [f'{{"n": {i}}}' if i % 7 else "" for i in range(60)])
        return FileSource(tmp_path / "in", format="jsonl", split_bytes=200)


def test_os_sep_never_leaks_into_split_ids(tmp_path: Path) -> None:
    write(tmp_path / "x" / "y" / "z.txt", ["a"])
    (split,) = FileSource(tmp_path).discover_splits()
    assert split.split_id == "x/y/z.txt" and os.sep not in split.split_id.replace("/", "")


def test_reader_mode_legacy_makes_the_file_source_keep_restored_splits(tmp_path: Path) -> None:
    """``source.reader_mode: legacy`` (issue 39 item 6): the source still has the capability, but
    answers that its readers keep what they restored; the enumerator factory builds a legacy one."""
    from splitkeeper.config.settings import config_from_mapping
    from splitkeeper.core.assignment import strategy_by_name
    from splitkeeper.core.enumerator import RecordingEnumeratorContext, enumerator_for
    from splitkeeper.sources.files.source import FileSource

    base = {"name": "modes", "source": {"kind": "files", "path": str(tmp_path)}, "state": {"path": "s"}}
    for mode, deferred in (("deferred", True), ("legacy", False)):
        config = config_from_mapping(
            {**base, "source": {**base["source"], "reader_mode": mode}, "sink": {"path": "k"}}
        )
        source = FileSource.from_config(config.source)
        assert source.reassigns_on_recovery is deferred
        enumerator = enumerator_for(source, RecordingEnumeratorContext(2), strategy_by_name("least-loaded"))
        assert enumerator.reassign_on_recovery is deferred


# --------------------------------------------------------------------------- discovery that costs what is new


def _stats(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ``os.stat`` is asked about from now on."""
    calls: list[str] = []
    real_stat = os.stat

    def counting(path: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(os.fspath(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counting)
    return calls


def _started(source: FileSource) -> tuple[list[Split], dict[str, str]]:
    """A first check and discovery (what a restore does); every split counted finished but the last."""
    splits = source.discover_splits()
    finished = {s.split_id: s.identity for s in splits[:-1]}
    assert source.check_splits(splits[-1:], finished) == []
    source.discover_splits()
    return splits, finished


@pytest.mark.parametrize("discovery", ["full", "incremental"])
def test_an_epoch_without_a_recheck_stats_only_new_and_live_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, discovery: str
) -> None:
    """Issue 38 item 3: finished files are not stat'ed nor compared between rechecks; a change to
    one is reported by the next check that rechecks finished files."""
    for i in range(20):
        write(tmp_path / f"f{i:03d}.txt", [f"line {i}"])
    source = FileSource(tmp_path, discovery=discovery)
    splits, finished = _started(source)
    write(tmp_path / "f003.txt", ["rewritten, longer than before"])  # a finished file changes
    write(tmp_path / "f100.txt", ["new"])
    calls = _stats(monkeypatch)
    assert source.check_splits(splits[-1:], finished, recheck_finished=False) == []
    assert [s.split_id for s in source.discover_splits()] == ["f019.txt", "f100.txt"]  # live, new
    assert sorted(c for c in calls if c != str(tmp_path)) == [
        str(tmp_path / "f019.txt"),
        str(tmp_path / "f100.txt"),
    ]
    (change,) = source.check_splits(splits[-1:], finished)  # a recheck
    assert change.split_id == "f003.txt" and change.kind is SplitChangeKind.CHANGED


def test_incremental_discovery_lists_names_after_the_last_seen_and_a_full_listing_catches_a_late_name(
    tmp_path: Path,
) -> None:
    for day in ("2026-01-01", "2026-01-02"):
        for i in range(3):
            write(tmp_path / day / f"part-{i}.txt", [f"{day} {i}"])
    source = FileSource(tmp_path, discovery="incremental")
    splits, finished = _started(source)
    finished = {s.split_id: s.identity for s in splits}
    write(tmp_path / "2026-01-02" / "part-3.txt", ["in order"])
    write(tmp_path / "2026-01-03" / "part-0.txt", ["a new folder"])
    write(tmp_path / "2026-01-01" / "part-9.txt", ["late: sorts before the last name seen"])
    (tmp_path / "2026-01-01" / "part-0.txt").unlink()  # gone: seen by the next full listing
    assert source.check_splits([], finished, recheck_finished=False) == []
    assert [s.split_id for s in source.discover_splits()] == [
        "2026-01-02/part-3.txt",
        "2026-01-03/part-0.txt",
    ]
    assert source.removed_paths == ()
    assert source.check_splits([], finished) == []  # a recheck lists everything
    assert "2026-01-01/part-9.txt" in [s.split_id for s in source.discover_splits()]
    assert source.removed_paths == (str(tmp_path / "2026-01-01" / "part-0.txt"),)


def test_incremental_discovery_lists_an_empty_file_again_until_it_has_data(tmp_path: Path) -> None:
    write(tmp_path / "a.txt", ["a"])
    source = FileSource(tmp_path, discovery="incremental")
    _splits, finished = _started(source)
    (tmp_path / "b.txt").write_bytes(b"")  # created, not written yet
    write(tmp_path / "c.txt", ["c"])
    source.check_splits([], finished, recheck_finished=False)
    assert [s.split_id for s in source.discover_splits()] == ["c.txt"]
    write(tmp_path / "b.txt", ["b"])
    source.check_splits([], finished, recheck_finished=False)
    assert [s.split_id for s in source.discover_splits()] == ["b.txt"]


@pytest.mark.parametrize("discovery", ["full", "incremental"])
def test_a_finished_file_moved_between_rechecks_is_moved_not_new(tmp_path: Path, discovery: str) -> None:
    """A rename must not read the data again as a new file, whatever the listing."""
    for name in ("a.txt", "b.txt"):
        write(tmp_path / name, [f"{name} line"])
    source = FileSource(tmp_path, discovery=discovery)
    splits = source.discover_splits()
    finished = {s.split_id: s.identity for s in splits}
    source.check_splits([], finished)
    source.discover_splits()
    os.rename(tmp_path / "a.txt", tmp_path / "z-archive.txt")
    (change,) = source.check_splits([], finished, recheck_finished=False)
    assert (change.split_id, change.kind, change.moved_to) == (
        "a.txt",
        SplitChangeKind.MOVED,
        "z-archive.txt",
    )
    (moved,) = [s for s in source.discover_splits() if s.split_id == "z-archive.txt"]
    assert moved.identity == change.identity  # the known layout under its new path: the core's to apply


def test_the_discovery_keys_reach_the_source_and_the_driver_and_bad_values_name_the_key(
    tmp_path: Path,
) -> None:
    from splitkeeper.config.settings import core_settings
    from splitkeeper.errors import ConfigError

    base = {"name": "keys", "state": {"path": "s"}, "sink": {"path": "k"}}
    source = {"kind": "files", "path": str(tmp_path), "recheck_finished_every": 3, "discovery": "incremental"}
    config = config_from_mapping({**base, "source": source})
    assert FileSource.from_config(config.source)._discovery.value == "incremental"
    assert core_settings(config).recheck_finished_every == 3
    for key, value in (("recheck_finished_every", 0), ("discovery", "sometimes")):
        with pytest.raises(ConfigError, match=f"source.{key}"):
            config_from_mapping({**base, "source": {**source, key: value}})
