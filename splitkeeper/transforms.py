"""Per-record transforms: ``'module:function'`` specs, the identity default, a sample.

A transform is a module-level function ``(value: str) -> str`` applied to every
record on the executor, inside the region task (:mod:`splitkeeper.spark.task`),
that its module marks as one with :func:`transform` (``from splitkeeper import
transform``; ``@transform``) or :func:`vectorized`. A config may name no other
callable: ``transform: os:system`` would run every record as a shell command (the one
rule for every callable a config names: :mod:`splitkeeper.callables`).
Contract:

- **one record in, one record out**: it may not drop or split records (the sink
  invariant "offsets contiguous per split" counts every source record);
- **deterministic and pure**: a replay of an epoch must produce the same output,
  so no clocks, randomness or external lookups that can change;
- **importable by reference** on the driver and on every executor: it crosses to
  executors pickled by module and name, so lambdas, closures and functions
  defined in ``__main__`` are rejected by :func:`resolve_transform`.

A transform that raises (or returns a non-string) fails the region task with a
:class:`TransformError` naming the split and offset of the record.

Vectorised form. A function marked with :func:`vectorized` (it carries
``vectorized = True``) takes the values of a whole range as an Arrow string
array and returns an Arrow string array: the same contract, column by column:

1. **one value in, one value out, in order**: the result has the input's length
   and no nulls;
2. **deterministic and pure**, and **importable by reference**, as above;
3. a failure (raising, the wrong length or type, a null) fails the region task
   with a :class:`TransformError` naming the split and the offset of the first
   record of the range (or of the null's record).

:func:`transform_values` applies either form to a column: a vectorised
transform in one call, a per-record one value by value (the fallback path).
:func:`identity` is vectorised. A vectorised function is also called with a
single string by :func:`apply_transform` (it then gets a one-value array).

Columnar form over typed data. A function marked with :func:`batch_transform` takes a
``pa.RecordBatch`` of the range's **data columns only** (the decoded columns, ``_rescued``
included; never the bookkeeping columns ``split_id``, ``offset``, Kafka metadata: the
caller keeps those and puts them back) and returns a ``pa.RecordBatch``:

1. it may add, drop or change data columns, but keeps the **row count and order** (row
   ``i`` out is record ``i`` in), and returns no column named like a bookkeeping one;
2. **deterministic and pure**, and **importable by reference**, as above;
3. a broken contract (not a RecordBatch, another row count, a bookkeeping column) raises
   :class:`TransformError` naming the function, the split and what it broke.

:func:`apply_to_table` applies any form to a range's decoded table. With ``tolerate=True``
(``errors.tolerance: all``) it returns ``(table, kept, bad)``: a per-record transform that
raises (or returns a non-string) on a record makes that record a bad record (stage
``transform``); a vectorised or batch transform that raises is called again on the two
halves of the range, down to the single records it raises on (bisection), which become bad
records. A broken contract (row count, returned type) is a bug of the function, not of a
record: it raises even then.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import pyarrow as pa

from splitkeeper.callables import Role, is_marked, mark, resolve_callable, spark_transform
from splitkeeper.errors import TransformError

if TYPE_CHECKING:  # pragma: no cover
    from splitkeeper.records.decode import BadRecords

Transform = Callable[[str], str]


F = TypeVar("F", bound=Callable[..., Any])


def transform(function: F) -> F:
    """Mark ``function`` as a transform a pipeline config may name: ``(value: str) -> str``.

    Returns ``function`` itself with the mark as an attribute (no wrapper), so it still
    pickles by module and name: an executor that unpickles it imports the module and gets
    the marked function. Use on module-level ``def``s only (module doc).
    """
    return mark(function, Role.TRANSFORM)


def vectorized(function: F) -> F:
    """Mark ``function`` as a vectorised transform: ``(values: pa.Array) -> pa.Array`` of strings
    (it is then a transform too: no ``@transform`` needed)."""
    function.vectorized = True  # type: ignore[attr-defined]
    return transform(function)


def batch_transform(function: F) -> F:
    """Mark ``function`` as a columnar transform over typed data: ``(batch: pa.RecordBatch) ->
    pa.RecordBatch`` of the data columns (module doc; it is then a transform too)."""
    function.batch = True  # type: ignore[attr-defined]
    return transform(function)


def is_batch(transform: Callable[..., Any]) -> bool:
    """Whether ``transform`` is a :func:`batch_transform` (RecordBatch in, RecordBatch out)."""
    return getattr(transform, "batch", False) is True


def is_transform(candidate: Any) -> bool:
    """Whether ``candidate`` was marked with :func:`transform` or :func:`vectorized`."""
    return is_marked(candidate, Role.TRANSFORM)


def is_vectorized(transform: Callable[..., Any]) -> bool:
    """Whether ``transform`` takes a column (see the module doc) rather than one value."""
    return getattr(transform, "vectorized", False) is True


@spark_transform
@vectorized
def identity(value: Any) -> Any:
    """The default transform: the records as read (a column in, the same column out; as a Spark
    transform, the epoch's DataFrame as it is)."""
    return value


@transform
def enrich_json(value: str) -> str:
    """Sample transform for JSON records (see ``examples/make_files.py``).

    Adds ``amount_band`` ('small' < 10 <= 'medium' < 100 <= 'large', from
    ``amount``) and ``user_bucket`` (crc32 of ``user`` modulo 16, stable across
    processes unlike ``hash``). Raises ``ValueError`` for a line that is not a
    JSON object.
    """
    doc = json.loads(value)
    if not isinstance(doc, dict):
        raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
    amount = doc.get("amount")
    if isinstance(amount, int | float) and not isinstance(amount, bool):
        doc["amount_band"] = "small" if amount < 10 else "medium" if amount < 100 else "large"
    user = doc.get("user")
    if isinstance(user, str):
        doc["user_bucket"] = zlib.crc32(user.encode("utf-8")) % 16
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


@batch_transform
def add_amount_cents(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Sample batch transform for typed records with a DECIMAL ``amount`` column: adds
    ``amount_cents`` (BIGINT, ``amount * 100``; null where ``amount`` is null). Raises on an
    amount with fractions of a cent (``1.005``) rather than rounding it."""
    from decimal import Decimal

    import pyarrow.compute as pc

    amount = batch.column("amount")
    if not pa.types.is_decimal(amount.type):
        amount = amount.cast(pa.decimal128(38, 2))
    cents = pc.multiply(amount, pa.scalar(Decimal(100), pa.decimal128(3, 0))).cast(pa.int64())
    return pa.RecordBatch.from_arrays([*batch.columns, cents], names=[*batch.schema.names, "amount_cents"])


@spark_transform
def amount_cents(df: Any) -> Any:
    """Sample PySpark transform (``transform: {kind: spark, function:
    splitkeeper.transforms:amount_cents}``): adds ``amount_cents BIGINT``, the ``amount`` column in
    cents (rounded), to an epoch's records; keeps every row and its bookkeeping columns. (A SQL
    expression, so this module imports no pyspark: the config loads it on machines without Spark.)"""
    return df.selectExpr("*", "CAST(ROUND(amount * 100) AS BIGINT) AS amount_cents")


def resolve_transform(spec: str) -> Transform:
    """Import the function named by ``'module:function'`` (attribute paths allowed after ':').

    Called at config load (so a wrong name fails at submission) and on the
    driver before an epoch. Raises :class:`~splitkeeper.errors.ConfigError` (key ``transform``)
    when the module or function is missing, not callable, not marked with
    :func:`transform` (or :func:`vectorized`, :func:`batch_transform`), or not picklable by
    reference: the one rule of :func:`splitkeeper.callables.resolve_callable`. May be called any
    number of times (modules are cached).
    """
    function: Transform = resolve_callable(spec, "transform", Role.TRANSFORM)
    return function


def transform_values(transform: Transform, values: pa.Array, offsets: pa.Array, split_id: str) -> pa.Array:
    """Apply ``transform`` to a column of values whose records start at ``offsets``.

    A vectorised transform is called once; a per-record one value by value
    (:func:`apply_transform`); a batch transform gets one ``value`` column and must return
    it as strings. Failures raise :class:`TransformError` (module doc).
    """
    if is_batch(transform):
        out_table = apply_to_table(transform, pa.table({"value": values}), offsets, split_id)
        column = out_table.column("value") if "value" in out_table.column_names else None
        if out_table.num_columns != 1 or column is None or not pa.types.is_string(column.type):
            raise TransformError(
                f"transform {_name(transform)} returned the columns {out_table.column_names} for split "
                f"{split_id!r}: on a text sink a batch transform must return the one STRING column 'value'",
                split_id=split_id,
            )
        return column.combine_chunks()
    if not is_vectorized(transform):
        texts = values.to_pylist()
        return pa.array(
            [
                apply_transform(transform, value, split_id, offset)
                for value, offset in zip(texts, offsets.to_pylist(), strict=True)
            ],
            pa.string(),
        )
    first = offsets[0].as_py() if len(offsets) else 0
    try:
        out = transform(values)
    except Exception as err:
        raise TransformError(
            f"transform {_name(transform)} failed on split {split_id!r} in the {len(values)} records from "
            f"offset {first}: {type(err).__name__}: {err}",
            split_id=split_id,
            offset=first,
        ) from err
    if isinstance(out, pa.ChunkedArray):
        out = out.combine_chunks()
    if not isinstance(out, pa.Array) or not (
        pa.types.is_string(out.type) or pa.types.is_large_string(out.type)
    ):
        what = out.type if isinstance(out, pa.Array) else type(out).__name__
        raise TransformError(
            f"transform {_name(transform)} returned {what} for split {split_id!r} from offset {first}: a "
            "vectorised transform must return an Arrow string array",
            split_id=split_id,
            offset=first,
        )
    if len(out) != len(values):
        raise TransformError(
            f"transform {_name(transform)} returned {len(out)} values for {len(values)} records of split "
            f"{split_id!r} from offset {first}: a transform must return exactly one string per record",
            split_id=split_id,
            offset=first,
        )
    if out.null_count:
        offset = offsets[out.is_null().index(True).as_py()].as_py()
        raise TransformError(
            f"transform {_name(transform)} returned null for split {split_id!r} at offset {offset}: a "
            "transform must return exactly one string per record",
            split_id=split_id,
            offset=offset,
        )
    return out


def apply_transform(transform: Transform, value: str, split_id: str, offset: int) -> str:
    """Apply ``transform`` to one record; failures become :class:`TransformError` naming the record."""
    if is_batch(transform):
        values, offsets = pa.array([value], pa.string()), pa.array([offset], pa.int64())
        one = transform_values(transform, values, offsets, split_id)
        text: str = one[0].as_py()
        return text
    try:
        if is_vectorized(transform):
            column: Any = transform(pa.array([value], pa.string()))  # a vectorised transform: a column
            out = column[0].as_py() if isinstance(column, pa.Array) and len(column) == 1 else column
        else:
            out = transform(value)
    except Exception as err:
        raise TransformError(
            f"transform {_name(transform)} failed on split {split_id!r} at offset {offset}: "
            f"{type(err).__name__}: {err}",
            split_id=split_id,
            offset=offset,
        ) from err
    if not isinstance(out, str):
        raise TransformError(
            f"transform {_name(transform)} returned {type(out).__name__} for split {split_id!r} at offset "
            f"{offset}: a transform must return exactly one string per record",
            split_id=split_id,
            offset=offset,
        )
    return out


def _name(transform: Transform) -> str:
    return f"{getattr(transform, '__module__', '?')}:{getattr(transform, '__qualname__', repr(transform))}"


@overload
def apply_to_table(
    transform: Transform,
    table: pa.Table,
    offsets: pa.Array,
    split_id: str,
    *,
    tolerate: Literal[False] = False,
) -> pa.Table: ...


@overload
def apply_to_table(
    transform: Transform, table: pa.Table, offsets: pa.Array, split_id: str, *, tolerate: Literal[True]
) -> tuple[pa.Table, pa.Array, BadRecords]: ...


def apply_to_table(
    transform: Transform, table: pa.Table, offsets: pa.Array, split_id: str, *, tolerate: bool = False
) -> pa.Table | tuple[pa.Table, pa.Array, BadRecords]:
    """Apply ``transform`` to a range's decoded table (one row per record, record ``i`` at
    ``offsets[i]``; module doc).

    A per-record or vectorised transform maps the text column ``value`` (decode.kind text);
    a batch transform gets the data columns (the bookkeeping columns, when ``table`` has
    them, are set aside and put back after). ``tolerate=False``: any failure raises
    :class:`TransformError` naming the function, the split and the offset. ``tolerate=True``:
    returns ``(table, kept, bad)`` with ``kept`` the int64 input row of each output row and
    ``bad`` the records the transform failed on (stage ``transform``, their input rows).
    """
    from splitkeeper.records.decode import BadRecords
    from splitkeeper.records.spec import BOOKKEEPING_COLUMNS

    bad = BadRecords()
    if isinstance(offsets, pa.ChunkedArray):
        offsets = offsets.combine_chunks()
    if transform is identity:
        return (table, pa.array(range(table.num_rows), pa.int64()), bad) if tolerate else table
    if is_batch(transform):
        books = [n for n in table.column_names if n in BOOKKEEPING_COLUMNS]
        data = table.drop_columns(books) if books else table
        out, kept = _apply_batch(transform, data, offsets, split_id, bad, tolerate)
        if books:
            rest = table.select(books)
            if len(kept) != table.num_rows:
                rest = rest.take(kept)
            for name in books:
                out = out.append_column(rest.schema.field(name), rest.column(name))
    else:
        if table.num_rows == 0:
            return (table, pa.array([], pa.int64()), bad) if tolerate else table
        index = table.schema.get_field_index("value")
        if index < 0 or not pa.types.is_string(table.schema.field(index).type):
            raise TransformError(
                f"transform {_name(transform)} maps the text column 'value' (a per-record or vectorised "
                f"transform), but the range of split {split_id!r} has the columns {table.column_names}: use "
                "decode.kind text, or a @batch_transform (pa.RecordBatch -> pa.RecordBatch) for typed "
                "columns",
                split_id=split_id,
            )
        column = table.column(index).combine_chunks()
        if column.null_count:  # a null value (a Kafka tombstone) has no text: it stays null, untransformed
            return _around_nulls(transform, table, column, offsets, split_id, tolerate)
        if not tolerate:
            return table.set_column(index, "value", transform_values(transform, column, offsets, split_id))
        if is_vectorized(transform):
            values, kept = _bisect(
                lambda rows: transform_values(transform, column.take(rows), offsets.take(rows), split_id),
                table.num_rows,
                offsets,
                transform,
                bad,
            )
            values = pa.concat_arrays(values) if values else pa.array([], pa.string())
        else:
            texts, rows = [], []
            for i, (value, offset) in enumerate(zip(column.to_pylist(), offsets.to_pylist(), strict=True)):
                try:
                    texts.append(apply_transform(transform, value, split_id, offset))
                    rows.append(i)
                except TransformError as err:
                    cause = err.__cause__
                    bad.add(i, "transform", err.message, type(cause).__name__ if cause else "TransformError")
            values, kept = pa.array(texts, pa.string()), pa.array(rows, pa.int64())
        out = table.take(kept) if len(kept) != table.num_rows else table
        out = out.set_column(index, "value", values)
    return (out, kept, bad) if tolerate else out


def _around_nulls(
    transform: Transform, table: pa.Table, column: pa.Array, offsets: pa.Array, split_id: str, tolerate: bool
) -> pa.Table | tuple[pa.Table, pa.Array, BadRecords]:
    """A text transform over the non-null values; the null ones kept in place, as they are."""
    import numpy as np

    valid = np.asarray(column.is_valid())
    present, absent = np.flatnonzero(valid), np.flatnonzero(~valid)
    done = apply_to_table(transform, table.take(present), offsets.take(present), split_id, tolerate=True)
    if not tolerate and done[2]:
        apply_to_table(transform, table.take(present), offsets.take(present), split_id)  # raises as it should
    out, kept, bad = done
    rows = np.concatenate([present[np.asarray(kept, np.int64)], absent])
    order = np.argsort(rows, kind="stable")
    merged = pa.concat_tables([out, table.take(absent)]).take(pa.array(order))
    bad.indices[:] = [int(present[i]) for i in bad.indices]
    return (merged, pa.array(rows[order], pa.int64()), bad) if tolerate else merged


def _apply_batch(
    transform: Transform, data: pa.Table, offsets: pa.Array, split_id: str, bad: BadRecords, tolerate: bool
) -> tuple[pa.Table, pa.Array]:
    """A batch transform over ``data`` (the data columns), its contract checked."""

    def call(rows: pa.Array | None) -> pa.Table:
        part = data if rows is None else data.take(rows)
        first = (
            (offsets[0] if rows is None or not len(rows) else offsets[rows[0].as_py()]).as_py()
            if len(offsets)
            else 0
        )
        batch = part.combine_chunks().to_batches()
        given = batch[0] if batch else pa.RecordBatch.from_pylist([], schema=part.schema)
        try:
            out = transform(given)
        except Exception as err:
            raise TransformError(
                f"transform {_name(transform)} failed on split {split_id!r} in the {part.num_rows} records "
                f"from offset {first}: {type(err).__name__}: {err}",
                split_id=split_id,
                offset=first,
            ) from err
        if not isinstance(out, pa.RecordBatch):
            raise _Broken(
                f"transform {_name(transform)} returned {type(out).__name__} for split {split_id!r}: a batch "
                "transform must return a pa.RecordBatch"
            )
        if out.num_rows != part.num_rows:
            raise _Broken(
                f"transform {_name(transform)} returned {out.num_rows} rows for {part.num_rows} records of "
                f"split {split_id!r} from offset {first}: a batch transform must keep the row count and order"
            )
        touched = sorted(set(out.schema.names) & set(_bookkeeping()))
        if touched:
            raise _Broken(
                f"transform {_name(transform)} returned the bookkeeping columns {touched} for split "
                f"{split_id!r}: a batch transform gets and returns data columns only"
            )
        return pa.Table.from_batches([out])

    try:
        if not tolerate or data.num_rows == 0:
            return call(None), pa.array(range(data.num_rows), pa.int64())
        parts, kept = _bisect(call, data.num_rows, offsets, transform, bad)
    except _Broken as err:
        raise TransformError(str(err), split_id=split_id) from None
    if not parts:
        return call(pa.array([], pa.int64())), kept
    try:
        return pa.concat_tables(parts), kept
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise TransformError(
            f"transform {_name(transform)} returned different columns for parts of one range of split "
            f"{split_id!r} ({err}): a batch transform must return the same schema for any rows",
            split_id=split_id,
        ) from None


class _Broken(Exception):
    """A transform broke its contract (not a record's fault: never isolated, always raised)."""


def _bookkeeping() -> tuple[str, ...]:
    from splitkeeper.records.spec import BOOKKEEPING_COLUMNS

    return BOOKKEEPING_COLUMNS


def _bisect(
    call: Callable[[pa.Array], Any], n: int, offsets: pa.Array, transform: Transform, bad: BadRecords
) -> tuple[list[Any], pa.Array]:
    """``call`` on rows ``0..n``; where it raises TransformError, on halves down to single
    rows, which become bad records. Returns the outputs in row order and their rows."""
    outputs: list[Any] = []
    kept: list[pa.Array] = []

    def run(lo: int, hi: int) -> None:
        rows = pa.array(range(lo, hi), pa.int64())
        try:
            outputs.append(call(rows))
            kept.append(rows)
            return
        except TransformError as err:
            if err.__cause__ is None:  # a broken contract (length, type, null): the function's bug
                raise
            if hi - lo == 1:
                cause = err.__cause__
                offset = offsets[lo].as_py()
                kind = type(cause).__name__ if cause else "TransformError"
                why = cause or err.message
                message = f"transform {_name(transform)} failed at offset {offset}: {kind}: {why}"
                bad.add(lo, "transform", message, kind)
                return
        mid = (lo + hi) // 2
        run(lo, mid)
        run(mid, hi)

    if n:
        run(0, n)
    return outputs, (pa.concat_arrays(kept) if kept else pa.array([], pa.int64()))


def output_schema(transform: Transform, data: pa.Schema) -> pa.Schema:
    """The data columns ``transform`` makes of records with the data columns ``data``: ``data``
    itself for a per-record or vectorised transform (they map ``value`` to ``value``); for a
    :func:`batch_transform`, the schema of what it returns for an empty batch of ``data``. This is
    how the sink's schema follows a batch transform that adds, drops or changes columns (it is
    called on the driver when the pipeline is built, so a transform that cannot take an empty
    batch fails there, with a TransformError naming it)."""
    if not is_batch(transform):
        return data
    try:
        out = transform(pa.RecordBatch.from_pylist([], schema=data))
    except Exception as err:
        raise TransformError(
            f"transform {_name(transform)} failed on an empty batch of its input columns ({data.names}): "
            f"{type(err).__name__}: {err}; a batch transform must accept an empty batch (the sink's "
            "columns are what it returns for one)"
        ) from err
    if not isinstance(out, pa.RecordBatch):
        raise TransformError(
            f"transform {_name(transform)} returned {type(out).__name__} for an empty batch: a batch "
            "transform must return a pa.RecordBatch"
        )
    touched = sorted(set(out.schema.names) & set(_bookkeeping()))
    if touched:
        raise TransformError(
            f"transform {_name(transform)} returned the bookkeeping columns {touched}: a batch transform "
            "gets and returns data columns only"
        )
    return out.schema
