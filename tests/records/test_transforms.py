"""transforms.apply_to_table: the three transform forms over a range's decoded table, the
columnar form's contract, and record-level failures (tolerate=True) isolated by bisection."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from splitkeeper.records.ddl import parse_ddl
from splitkeeper.records.decode import decode_values
from splitkeeper.records.spec import DecodeSpec
from splitkeeper.transforms import (
    TransformError,
    add_amount_cents,
    apply_to_table,
    batch_transform,
    identity,
    is_batch,
    is_vectorized,
    resolve_transform,
    transform,
    transform_values,
    vectorized,
)

SEEN: list[list[str]] = []


@batch_transform
def doubles_and_drops(batch: pa.RecordBatch) -> pa.RecordBatch:
    SEEN.append(batch.schema.names)
    ids = batch.column("id")
    return pa.RecordBatch.from_arrays([ids, pc.multiply(ids, 2)], names=["id", "twice"])


@batch_transform
def poison(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Raises on any batch holding an id divisible by 7."""
    if any(i % 7 == 0 for i in batch.column("id").to_pylist()):
        raise ValueError("seven")
    return batch


@batch_transform
def loses_a_row(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.slice(1)


@batch_transform
def returns_a_table(batch: pa.RecordBatch) -> pa.Table:
    return pa.Table.from_batches([batch])


@batch_transform
def writes_offset(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("offset", pa.array([0] * batch.num_rows, pa.int64()))


@transform
def shout(value: str) -> str:
    if value.startswith("bad"):
        raise ValueError(f"cannot shout {value!r}")
    return value.upper()


@transform
def returns_none(value: str) -> str | None:
    return None if value == "b" else value


@vectorized
def shout_column(values: pa.Array) -> pa.Array:
    if pc.any(pc.starts_with(values, "bad")).as_py():
        raise ValueError("a bad value")
    return pc.utf8_upper(values)


@vectorized
def short_column(values: pa.Array) -> pa.Array:
    return values.slice(1)


@batch_transform
def value_upper(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pc.utf8_upper(batch.column("value"))], names=["value"])


@batch_transform
def value_lengths(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pc.utf8_length(batch.column("value"))], names=["value"])


def typed(n: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "amount": pa.array([Decimal(i) / 4 for i in range(n)], pa.decimal128(10, 2)),
            "split_id": ["s"] * n,
            "offset": pa.array(range(100, 100 + n), pa.int64()),
        }
    )


def offsets(table: pa.Table) -> pa.Array:
    return table.column("offset").combine_chunks()


def test_the_marks_and_resolve() -> None:
    assert is_batch(add_amount_cents) and not is_vectorized(add_amount_cents)
    assert resolve_transform("splitkeeper.transforms:add_amount_cents") is add_amount_cents
    assert resolve_transform(f"{__name__}:poison") is poison
    assert not is_batch(identity) and not is_batch(shout)


def test_a_batch_transform_gets_data_columns_only_and_the_bookkeeping_is_kept() -> None:
    SEEN.clear()
    table = typed(4)
    out = apply_to_table(doubles_and_drops, table, offsets(table), "s")
    assert SEEN == [["id", "amount"]], "the batch holds the data columns only"
    assert out.column_names == ["id", "twice", "split_id", "offset"]
    assert out.column("twice").to_pylist() == [0, 2, 4, 6]
    assert out.column("offset").to_pylist() == [100, 101, 102, 103]


def test_the_sample_batch_transform_on_decoded_json() -> None:
    spec = DecodeSpec(kind="json", columns=parse_ddl("id BIGINT, amount DECIMAL(10,3)"))
    decoded = decode_values(
        spec,
        pa.array([b'{"id": 1, "amount": 1.25}', b'{"id": 2, "amount": 0.005}', b'{"id": 3}'], pa.binary()),
    )
    at = pa.array([10, 11, 12], pa.int64())
    with pytest.raises(TransformError) as caught:
        apply_to_table(add_amount_cents, decoded.table, at, "s")
    assert (
        "splitkeeper.transforms:add_amount_cents failed on split 's' in the 3 records from offset 10"
        in str(caught.value)
    )
    out, kept, bad = apply_to_table(add_amount_cents, decoded.table, at, "s", tolerate=True)
    assert out.column("amount_cents").to_pylist() == [125, None]
    assert kept.to_pylist() == [0, 2] and bad.indices == [1] and bad.stages == ["transform"]
    assert "at offset 11" in bad.messages[0] and bad.error_classes == ["ArrowInvalid"]


@pytest.mark.parametrize("n", [1, 2, 7, 50, 333])
def test_bisection_isolates_exactly_the_failing_records(n: int) -> None:
    table = typed(n)
    out, kept, bad = apply_to_table(poison, table, offsets(table), "s", tolerate=True)
    want_bad = [i for i in range(n) if i % 7 == 0]
    assert bad.indices == want_bad and set(bad.stages) == {"transform"}
    assert kept.to_pylist() == [i for i in range(n) if i % 7]
    assert out.column("id").to_pylist() == kept.to_pylist(), "order kept"
    assert out.column("offset").to_pylist() == [100 + i for i in kept.to_pylist()], (
        "bookkeeping follows its row"
    )
    assert all("ValueError: seven" in m for m in bad.messages)


@pytest.mark.parametrize(
    ("function", "what"),
    [
        (
            loses_a_row,
            "returned 2 rows for 3 records of split 's' from offset 100: a batch transform must keep",
        ),
        (returns_a_table, "returned Table for split 's': a batch transform must return a pa.RecordBatch"),
        (writes_offset, "returned the bookkeeping columns ['offset']"),
    ],
)
@pytest.mark.parametrize("tolerate", [False, True])
def test_a_broken_batch_contract_raises_naming_the_function(
    function: object, what: str, tolerate: bool
) -> None:
    table = typed(3)
    with pytest.raises(TransformError) as caught:
        apply_to_table(function, table, offsets(table), "s", tolerate=tolerate)  # type: ignore[call-overload]
    assert f"{__name__}:{function.__name__}" in str(caught.value) and what in str(caught.value)  # type: ignore[attr-defined]


def text_table(values: list[str]) -> pa.Table:
    return pa.table({"value": pa.array(values, pa.string()), "offset": pa.array(range(10, 10 + len(values)))})


def test_text_transforms_per_record_and_vectorised_tolerate_bad_records() -> None:
    table = text_table(["a", "bad1", "c", "bad2", "e"])
    for function in (shout, shout_column):
        out, kept, bad = apply_to_table(function, table, offsets(table), "s", tolerate=True)
        assert out.column("value").to_pylist() == ["A", "C", "E"]
        assert out.column("offset").to_pylist() == [10, 12, 14]
        assert kept.to_pylist() == [0, 2, 4] and bad.indices == [1, 3] and bad.stages == ["transform"] * 2
        assert "at offset 11" in bad.messages[0] and bad.error_classes == ["ValueError"] * 2
        with pytest.raises(TransformError, match="offset 1[01]"):
            apply_to_table(function, table, offsets(table), "s")
    out, kept, bad = apply_to_table(
        returns_none, text_table(["a", "b"]), pa.array([10, 11]), "s", tolerate=True
    )
    assert (
        out.column("value").to_pylist() == ["a"]
        and bad.indices == [1]
        and "returned NoneType" in bad.messages[0]
    )


def test_a_broken_vectorised_contract_raises_even_when_tolerating() -> None:
    table = text_table(["a", "b"])
    with pytest.raises(TransformError, match="returned 1 values for 2 records"):
        apply_to_table(short_column, table, offsets(table), "s", tolerate=True)


def test_a_text_transform_on_typed_columns_says_what_to_use() -> None:
    table = typed(2)
    with pytest.raises(TransformError, match="use decode.kind text, or a @batch_transform"):
        apply_to_table(shout, table, offsets(table), "s")


def test_identity_and_empty_ranges() -> None:
    table = typed(3)
    assert apply_to_table(identity, table, offsets(table), "s") is table
    out, kept, bad = apply_to_table(identity, table, offsets(table), "s", tolerate=True)
    assert out is table and kept.to_pylist() == [0, 1, 2] and not bad
    empty = typed(0)
    out = apply_to_table(doubles_and_drops, empty, offsets(empty), "s")
    assert out.num_rows == 0 and out.column_names == ["id", "twice", "split_id", "offset"]


def test_a_batch_transform_on_a_text_column() -> None:
    values = pa.array(["a", "b"])
    assert transform_values(value_upper, values, pa.array([1, 2]), "s").to_pylist() == ["A", "B"]
    with pytest.raises(TransformError, match="must return the one STRING column 'value'"):
        transform_values(value_lengths, values, pa.array([1, 2]), "s")


def test_a_null_value_stays_null_and_is_not_given_to_a_text_transform() -> None:
    table = pa.table({"value": pa.array(["a", None, "bad", "d"], pa.string()), "offset": [10, 11, 12, 13]})
    for function in (shout, shout_column):
        out, kept, bad = apply_to_table(function, table, offsets(table), "s", tolerate=True)
        assert out.column("value").to_pylist() == ["A", None, "D"] and out.column("offset").to_pylist() == [
            10,
            11,
            13,
        ]
        assert kept.to_pylist() == [0, 1, 3] and bad.indices == [2]
        with pytest.raises(TransformError, match="at offset 12|from offset 10"):
            apply_to_table(function, table, offsets(table), "s")
    ok = table.filter(pc.invert(pc.fill_null(pc.equal(table.column("value"), "bad"), False)))
    assert apply_to_table(shout, ok, offsets(ok), "s").column("value").to_pylist() == ["A", None, "D"]
