"""The native (Arrow) file read path against the per-record reader it replaced, and vectorised transforms.

The oracle is the old per-record reader, kept unchanged in ``file_reader_reference.py``:
for every range of awkward files, the native reader must yield the same records (offset,
next_offset, value) and raise the same errors, and the region task must stage the same rows.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitkeeper.core.source import RegionReader, SourceRecord
from splitkeeper.core.types import Split
from splitkeeper.errors import SourceError
from splitkeeper.records.columnar import RangeColumns, SupportsColumnarRead
from splitkeeper.records.spec import Column, DecodeSpec
from splitkeeper.sources.files.config import FileFormat
from splitkeeper.sources.files.source import FileRegionReader, bad_read_error
from splitkeeper.spark.task import (
    _ROW_GROUP,
    RecordPolicy,
    SplitReadError,
    StagedWriter,
    failed_splits,
    read_staged,
    run_region_task,
)
from splitkeeper.transforms import (
    TransformError,
    apply_transform,
    identity,
    is_vectorized,
    resolve_transform,
    transform,
    transform_values,
    vectorized,
)
from tests.runtime.file_reader_reference import read_range_reference

AWKWARD = {
    "crlf": b"one\r\ntwo\r\n\r\nthree\r\n",
    "unterminated": b"alpha\nbeta\ngamma",
    "unterminated_cr": b"alpha\nbeta\r",
    "empty_lines": b"\n\na\n\n\nb\n\n",
    "only_newlines": b"\n\n\n",
    "utf8": "é€𝄞\nnaïve\n\n日本語のテキスト\r\nx\n".encode(),
    "bom": b"\xef\xbb\xbfhead\nbody\n",
    "bom_only": b"\xef\xbb\xbf\r\nx",
    "cr_inside": b"a\rb\nc\r\r\n",
    "jsonl": b'{"a": 1}\r\n\n  \n[1, 2]\n"s"\n\t\n{"b": "\xc3\xa9"}\n \xc2\xa0 \n',
    "jsonl_trailing_blank": b'{"a":1}\n\n   \n',
    "jsonl_blank_only": b"  \n\t\n",
    # no \r and no BOM: the values are the data without its \n bytes (one bytes.replace)
    "lf_only": b"a\nbb\n\nccc\n",
    "lf_unterminated": b'[1]\n\n{}\n"last"',
    "one_line_no_newline": b'{"only": true}',
    "bom_then_lf": b"\xef\xbb\xbf\nx\n",
}
BAD = {
    "bad_utf8": b"fine\nbad \xff byte\nlater\n",
    "bad_utf8_after_bom": b"\xef\xbb\xbf\xc3\x28\n",
    "truncated_utf8_at_eof": b"ok\n\xe2\x82",
    "bad_json": b'{"a": 1}\n\n{"a": \n{"b": 2}\n',
    "json_then_utf8": b"{}\nnot json\n\xff\n",
    "utf8_then_json": b"{}\n\xff\nnot json\n",
    "two_objects_on_a_line": b'{"a":1} {"b":2}\n',
    "bad_utf8_lf_unterminated": b'"x"\n\xff\xfe\n"last"',
}


def _split(path: Path) -> Split:
    return Split(path.name, subscription=str(path.parent), position=0, end=path.stat().st_size)


def _outcome(call: object) -> tuple[str, object]:
    try:
        return "ok", call()  # type: ignore[operator]
    except SourceError as err:
        return "error", (str(err), err.params.get("offset"))


def _native_records(reader: FileRegionReader, split: Split, a: int, b: int) -> list[SourceRecord]:
    """The records of the native read; a record it lists as refused (``bad``: a jsonl line that is
    not JSON) raises the error the per-record reader raises for it."""
    columns = reader.read_range_columns(split, a, b)
    if columns.bad:
        raise bad_read_error(columns, split.split_id)
    return list(columns.records())


def _compare_every_range(path: Path, fmt: FileFormat) -> int:
    """Compare native and reference on every ``[a, b)`` of the file; returns how many ranges had records."""
    split = _split(path)
    size = split.end or 0
    reader = FileRegionReader(str(path.parent), fmt)
    jsonl = fmt is FileFormat.JSONL
    with_records = 0
    for a in range(size + 1):
        for b in range(a, size + 1):
            want = _outcome(lambda a=a, b=b: read_range_reference(str(path), split.split_id, a, b, jsonl))
            native = _outcome(lambda a=a, b=b: _native_records(reader, split, a, b))
            records = _outcome(lambda a=a, b=b: list(reader.read_range(split, a, b)))
            assert native == want, (path.name, fmt, a, b)
            assert records == want, (path.name, fmt, a, b)
            if want[0] == "ok" and want[1]:
                with_records += 1
    return with_records


@pytest.mark.parametrize("fmt", [FileFormat.LINES, FileFormat.JSONL])
@pytest.mark.parametrize("name", sorted(AWKWARD))
def test_every_range_of_an_awkward_file_matches_the_per_record_reader(
    tmp_path: Path, name: str, fmt: FileFormat
) -> None:
    path = tmp_path / name
    path.write_bytes(AWKWARD[name])
    with_records = _compare_every_range(path, fmt)  # other files are not JSON: every range raises (the same)
    if fmt is FileFormat.LINES or name in ("jsonl", "jsonl_trailing_blank"):
        assert with_records > 0


@pytest.mark.parametrize("fmt", [FileFormat.LINES, FileFormat.JSONL])
@pytest.mark.parametrize("name", sorted(BAD))
def test_errors_match_the_per_record_reader_on_every_range(
    tmp_path: Path, name: str, fmt: FileFormat
) -> None:
    path = tmp_path / name
    path.write_bytes(BAD[name])
    _compare_every_range(path, fmt)


def test_known_offsets_crlf_unterminated_empty_lines_multibyte_and_mid_line_start(tmp_path: Path) -> None:
    data = "a\r\n\r\né€\n\n𝄞x".encode()  # lines start at 0, 3, 5, 11, 12; the last has no newline
    (tmp_path / "f").write_bytes(data)
    split = _split(tmp_path / "f")
    reader = FileRegionReader(str(tmp_path))
    assert list(reader.read_range_columns(split, 0, len(data)).records()) == [
        SourceRecord(0, 3, b"a"),
        SourceRecord(3, 5, b""),
        SourceRecord(5, 11, "é€".encode()),
        SourceRecord(11, 12, b""),
        SourceRecord(12, 17, "𝄞x".encode()),
    ]
    # a range starting mid-line (inside "é") begins at the next line start; its last line runs past end
    assert list(reader.read_range_columns(split, 6, 12).records()) == [SourceRecord(11, 12, b"")]
    assert list(reader.read_range_columns(split, 4, 6).records()) == [SourceRecord(5, 11, "é€".encode())]
    columns = reader.read_range_columns(split, 1, len(data))
    assert columns.offsets.type == pa.int64() and columns.next_offsets.type == pa.int64()
    assert columns.values.type == pa.binary()
    assert columns.values.to_pylist() == [b"", "é€".encode(), b"", "𝄞x".encode()]
    assert columns.last_next_offset == len(data)


def test_lines_keep_invalid_utf8_bytes_and_jsonl_names_split_and_offset_of_the_bad_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "f").write_bytes(b"fine\n\xc3\xa9 then \xff\nlater\n")
    split = _split(tmp_path / "f")
    values = FileRegionReader(str(tmp_path)).read_range_columns(split, 0, split.end or 0).values
    assert values.to_pylist() == [b"fine", b"\xc3\xa9 then \xff", b"later"]  # the bytes, nothing decoded
    (tmp_path / "f").write_bytes(b'1\n"\xc3\xa9 then \xff"\n2\n')
    split = _split(tmp_path / "f")
    reader = FileRegionReader(str(tmp_path), FileFormat.JSONL)
    message = (
        f"split 'f': {tmp_path / 'f'} line at byte 2 is not valid UTF-8 (invalid start byte at byte 11); "
        "fix or remove the file"
    )
    columns = reader.read_range_columns(split, 0, split.end or 0)  # the bad line is a record, listed
    assert columns.values.to_pylist() == [b"1", b'"\xc3\xa9 then \xff"', b"2"]
    assert [tuple(b) for b in columns.bad] == [(1, "UnicodeDecodeError", message, 2)]
    with pytest.raises(SourceError) as caught:  # the per-record reader raises it
        list(reader.read_range(split, 0, split.end or 0))
    assert caught.value.message == message
    assert caught.value.params["offset"] == 2 and caught.value.params["split_id"] == "f"


def test_invalid_json_names_split_and_offset_of_the_line_not_the_blank_lines_before(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b'{"a": 1}\n\n\n{"a": \n' + b"[" * 600 + b"]" * 600 + b"\n{}\n")
    split = _split(tmp_path / "f")
    reader = FileRegionReader(str(tmp_path), FileFormat.JSONL)
    columns = reader.read_range_columns(split, 0, split.end or 0)
    assert columns.offsets.to_pylist() == [0, 9, 18, 1219]  # the blank lines belong to the bad record
    assert [(b.row, b.error_class, b.offset) for b in columns.bad] == [
        (1, "JSONDecodeError", 11),
        (2, "NestedTooDeep", 18),
    ]
    assert "line at byte 11 is not valid JSON" in columns.bad[0].message
    assert "line at byte 18 nests 600 levels deep, more than the 512" in columns.bad[1].message
    with pytest.raises(
        SourceError, match=r"^\[SOURCE_ERROR\] split 'f': .* line at byte 11 is not valid JSON"
    ) as caught:
        list(reader.read_range(split, 0, split.end or 0))
    assert caught.value.params["offset"] == 11


def test_a_region_task_with_a_bad_line_declines_naming_the_split_and_publishes_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "f").write_bytes(b"ok\nbad \xff\n")
    split = _split(tmp_path / "in" / "f")
    with pytest.raises(SplitReadError) as caught:
        run_region_task(
            [(split, 0, split.end or 0)],
            FileRegionReader(str(tmp_path / "in")),
            identity,
            str(tmp_path / "st"),
            1,
            0,
            policy=RecordPolicy(decode=DecodeSpec(kind="text")),
        )
    assert failed_splits(str(caught.value)) == ("f",)
    assert 'split "f" at offset 3: BadRecordError' in str(caught.value)
    assert "decode failed: UnicodeDecodeError: not valid UTF-8" in str(caught.value)
    assert not [p for p in (tmp_path / "st").rglob("*") if p.is_file()]


@pytest.mark.parametrize("kind", ["raw", "json"])
def test_a_jsonl_line_that_is_not_json_is_a_dead_letter_at_its_offset_and_the_rest_lands(
    tmp_path: Path, kind: str
) -> None:
    """Issue 36 item 12: under errors.tolerance all, the jsonl reader's own JSON check failed the
    whole range before decode saw the line, so nothing ever committed. The line is a bad record."""
    (tmp_path / "in").mkdir()
    lines = [
        b'{"id": 1}',
        b'{"id": 2, "na',  # truncated
        b"",
        b'{"id": 3}',
        b'{"id": "\xff"}',  # not UTF-8
        b"[" * 600 + b"]" * 600,  # nested too deep for a JSON line
        b'{"id": 4}',
    ]
    data = b"\n".join(lines) + b"\n"
    (tmp_path / "in" / "f.jsonl").write_bytes(data)
    split = _split(tmp_path / "in" / "f.jsonl")
    starts = [sum(len(x) + 1 for x in lines[:k]) for k in range(len(lines))]
    decode = DecodeSpec(kind="json", columns=(Column("id", "BIGINT"),)) if kind == "json" else DecodeSpec()
    reader = FileRegionReader(str(tmp_path / "in"), FileFormat.JSONL)
    result = run_region_task(
        [(split, 0, split.end or 0)],
        reader,
        identity,
        str(tmp_path / "st"),
        1,
        0,
        policy=RecordPolicy(decode=decode, tolerance="all", max_bad_ratio=1.0),
    )
    assert result.ack and result.positions == {split.split_id: len(data)} and result.dead_letters == 3
    staged = pq.read_table(result.staged_path or "").to_pylist()
    got = [(r["offset"], r["id"] if kind == "json" else r["value"]) for r in staged]
    want = [1, 3, 4] if kind == "json" else [lines[0], lines[3], lines[6]]
    assert got == [
        (starts[0], want[0]),
        (starts[2], want[1]),
        (starts[6], want[2]),
    ]  # the blank line after the bad one belongs to the next record (id 3)
    dead = pq.read_table(result.dead_letter_path or "").to_pylist()
    assert [(r["offset"], r["value"], r["stage"], r["error_class"]) for r in dead] == [
        (starts[1], lines[1], "decode", "JSONDecodeError"),
        (starts[4], lines[4], "decode", "UnicodeDecodeError"),
        (starts[5], lines[5], "decode", "NestedTooDeep"),
    ]
    assert f"line at byte {starts[1]} is not valid JSON" in dead[0]["error_message"]
    with pytest.raises(SplitReadError) as caught:  # tolerance none: the region fails at the line's offset
        run_region_task(
            [(split, 0, split.end or 0)],
            reader,
            identity,
            str(tmp_path / "st2"),
            1,
            0,
            policy=RecordPolicy(decode=decode),
        )
    assert f'split "f.jsonl" at offset {starts[1]}: BadRecordError' in str(caught.value)
    assert f"line at byte {starts[1]} is not valid JSON" in str(caught.value)


# hypothesis: random files of awkward pieces, random ranges, both formats
PIECES = [
    b"a",
    b"bc",
    b"\n",
    b"\r\n",
    b"\r",
    b"\xc3\xa9",
    b"\xf0\x9d\x84\x9e",
    b" ",
    b"\t",
    b"\xef\xbb\xbf",
    b"{}",
    b"[1]",
    b'{"k":"v"}',
    b"\xc2\xa0",
    b"\xff",
    b"1 2",
]


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.sampled_from(PIECES), max_size=30),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
    jsonl=st.booleans(),
)
def test_random_files_and_ranges_match_the_per_record_reader(
    parts: list[bytes], cut: tuple[float, float], jsonl: bool
) -> None:
    data = b"".join(parts)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f"
        path.write_bytes(data)
        a, b = sorted(int(c * len(data)) for c in cut)
        split = _split(path)
        reader = FileRegionReader(tmp, FileFormat.JSONL if jsonl else FileFormat.LINES)
        want = _outcome(lambda: read_range_reference(str(path), "f", a, b, jsonl))
        assert _outcome(lambda: _native_records(reader, split, a, b)) == want


# --------------------------------------------------------------------------- the region task


class PerRecordOnly(RegionReader):
    """The same file reader without the columnar capability: the region task's per-record path."""

    def __init__(self, inner: FileRegionReader) -> None:
        self.inner = inner

    def read_range(self, split: Split, start: int, end: int):  # type: ignore[no-untyped-def]
        return self.inner.read_range(split, start, end)


@transform
def upper(value: str) -> str:
    return value.upper()


@vectorized
def upper_column(values: pa.Array) -> pa.Array:
    return pc.utf8_upper(values)


@vectorized
def drops_one(values: pa.Array) -> pa.Array:
    return values.slice(1)


@vectorized
def nulls_the_second(values: pa.Array) -> pa.Array:
    return pa.array([v if i != 1 else None for i, v in enumerate(values.to_pylist())], pa.string())


@vectorized
def returns_ints(values: pa.Array) -> pa.Array:
    return pa.array(range(len(values)))


@vectorized
def raises(values: pa.Array) -> pa.Array:
    raise ValueError("no")


def _staged_rows(
    tmp_path: Path, reader: RegionReader, split: Split, transform: object, name: str
) -> list[dict[str, object]]:
    result = run_region_task([(split, 0, split.end or 0)], reader, transform, str(tmp_path / name), 1, 0)  # type: ignore[arg-type]
    assert result.ack and result.positions == {split.split_id: split.end}
    return read_staged(result.staged_path or "").to_pylist()


@pytest.mark.parametrize(
    "transform", [identity, upper, upper_column], ids=["identity", "per-record", "vectorised"]
)
def test_region_task_stages_the_same_rows_natively_as_record_by_record(
    tmp_path: Path, transform: object
) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "f").write_bytes(AWKWARD["utf8"] + AWKWARD["crlf"] + b"tail")
    split = _split(tmp_path / "in" / "f")
    native = FileRegionReader(str(tmp_path / "in"))
    assert isinstance(native, SupportsColumnarRead)
    got = _staged_rows(tmp_path, native, split, transform, "native")
    want = _staged_rows(tmp_path, PerRecordOnly(native), split, transform, "records")
    assert got == want and len(got) == 10
    assert got[-1]["value"] == (b"TAIL" if transform is not identity else b"tail")


def test_staged_file_of_the_native_path_has_the_sink_schema_and_whole_row_groups(tmp_path: Path) -> None:
    lines = _ROW_GROUP + 5
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "f").write_bytes(b"".join(b"%d\n" % i for i in range(lines)))
    split = _split(tmp_path / "in" / "f")
    reader = FileRegionReader(str(tmp_path / "in"))
    half = int(reader.read_range_columns(split, 0, 100_000).last_next_offset or 0)
    with StagedWriter(str(tmp_path / "p.parquet"), 3, 1) as writer:
        first = reader.read_range_columns(split, 0, half)
        assert writer.add_columns("f", first) == len(first.values)
        assert writer.add("g", [SourceRecord(0, 1, b"x")]) == 1
        assert writer.add_columns("f", reader.read_range_columns(split, half, split.end or 0)) == lines - len(
            first.values
        )
        assert writer.last_next_offset == split.end
        staged = writer.commit()
    meta = pq.ParquetFile(staged.path).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [_ROW_GROUP, 6]
    table = read_staged(staged.path)
    assert table.num_rows == staged.records == lines + 1
    values = table.column("value").to_pylist()
    assert values[: len(first.values)] == [b"%d" % i for i in range(len(first.values))]
    assert values[len(first.values)] == b"x" and values[-1] == b"%d" % (lines - 1)
    assert table.column("split_id").to_pylist().count("g") == 1
    assert set(table.column("epoch").to_pylist()) == {3}


# --------------------------------------------------------------------------- vectorised transforms


def test_identity_is_vectorised_and_a_plain_function_is_not() -> None:
    assert is_vectorized(identity) and not is_vectorized(upper)
    assert is_vectorized(resolve_transform("splitkeeper.transforms:identity"))
    assert apply_transform(upper_column, "abc", "s", 0) == "ABC"


def _columns(values: list[str]) -> RangeColumns:
    offsets = list(range(10, 10 + 2 * len(values), 2))
    return RangeColumns(
        pa.array(offsets, pa.int64()), pa.array([o + 2 for o in offsets], pa.int64()), pa.array(values)
    )


def test_transform_values_runs_a_vectorised_transform_once_and_a_per_record_one_per_value() -> None:
    columns = _columns(["a", "b", "c"])
    assert transform_values(upper_column, columns.values, columns.offsets, "s").to_pylist() == ["A", "B", "C"]
    assert transform_values(upper, columns.values, columns.offsets, "s").to_pylist() == ["A", "B", "C"]


@pytest.mark.parametrize(
    ("transform", "offset", "text"),
    [
        (drops_one, 10, "returned 2 values for 3 records of split 's' from offset 10"),
        (nulls_the_second, 12, "returned null for split 's' at offset 12"),
        (returns_ints, 10, "returned int64 for split 's' from offset 10"),
        (raises, 10, "failed on split 's' in the 3 records from offset 10: ValueError: no"),
    ],
)
def test_a_broken_vectorised_transform_names_split_and_offset(
    transform: object, offset: int, text: str
) -> None:
    columns = _columns(["a", "b", "c"])
    with pytest.raises(TransformError) as caught:
        transform_values(transform, columns.values, columns.offsets, "s")  # type: ignore[arg-type]
    assert text in str(caught.value)
    assert caught.value.params["split_id"] == "s" and caught.value.params["offset"] == offset
