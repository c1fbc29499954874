"""Per-record transforms: ``'module:function'`` specs, the identity default, a sample.

A transform is a module-level function ``(value: str) -> str`` applied to every
record on the executor, inside the region task (:mod:`splitkeeper.spark.task`),
that its module marks as one with :func:`transform` (``from splitkeeper import
transform``; ``@transform``) or :func:`vectorized`. A config may name no other
callable: ``transform: os:system`` would run every record as a shell command.
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
"""

from __future__ import annotations

import importlib
import json
import pickle
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa

from splitkeeper.errors import ConfigError, SplitkeeperError

Transform = Callable[[str], str]

_ALLOWED = (
    "'module:function' naming a module-level function marked @transform, (value: str) -> str (or "
    "@vectorized, pa.Array -> pa.Array), importable on the executors"
)
_MARK = "__splitkeeper_transform__"


class TransformError(SplitkeeperError):
    """A transform failed on one record, or returned something other than a string."""

    code = "TRANSFORM_ERROR"


F = TypeVar("F", bound=Callable[..., Any])


def transform(function: F) -> F:
    """Mark ``function`` as a transform a pipeline config may name: ``(value: str) -> str``.

    Returns ``function`` itself with the mark as an attribute (no wrapper), so it still
    pickles by module and name: an executor that unpickles it imports the module and gets
    the marked function. Use on module-level ``def``s only (module doc).
    """
    setattr(function, _MARK, True)
    return function


def vectorized(function: F) -> F:
    """Mark ``function`` as a vectorised transform: ``(values: pa.Array) -> pa.Array`` of strings
    (it is then a transform too: no ``@transform`` needed)."""
    function.vectorized = True  # type: ignore[attr-defined]
    return transform(function)


def is_transform(candidate: Any) -> bool:
    """Whether ``candidate`` was marked with :func:`transform` or :func:`vectorized`."""
    return getattr(candidate, _MARK, False) is True


def is_vectorized(transform: Callable[..., Any]) -> bool:
    """Whether ``transform`` takes a column (see the module doc) rather than one value."""
    return getattr(transform, "vectorized", False) is True


@vectorized
def identity(value: Any) -> Any:
    """The default transform: the records as read (a column in, the same column out)."""
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


def resolve_transform(spec: str) -> Transform:
    """Import the function named by ``'module:function'`` (attribute paths allowed after ':').

    Called at config load (so a wrong name fails at submission) and on the
    driver before an epoch. Raises :class:`ConfigError` (key ``transform``)
    when the module or function is missing, not callable, not marked with
    :func:`transform` (or :func:`vectorized`), or not picklable by reference.
    May be called any number of times (modules are cached).
    """
    function: Transform = resolve_callable(spec, "transform")
    if not is_transform(function):
        raise _error(
            spec,
            f"{spec} is not marked as a transform; if it is your transform, decorate it in its module "
            "with @transform (from splitkeeper import transform)",
        )
    return function


def resolve_callable(spec: str, key: str) -> Callable[..., Any]:
    """The module-level function named by ``'module:function'``; ConfigError naming ``key`` if not."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise _error(spec, "the spec has no ':' between module and function", key)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise _error(
            spec,
            f"module {module_name!r} cannot be imported ({err}); install it or add it to PYTHONPATH "
            "on the driver and the executors",
            key,
        ) from err
    target: Any = module
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as err:
            raise _error(spec, f"module {module_name!r} has no attribute {attr_path!r}", key) from err
    if not callable(target):
        raise _error(spec, f"{attr_path!r} is a {type(target).__name__}, not a function", key)
    try:
        same = pickle.loads(pickle.dumps(target)) is target
    except Exception as err:  # noqa: BLE001 - any pickling failure means "not by reference"
        raise _error(spec, f"it cannot be pickled by reference ({err}); use a module-level def", key) from err
    if not same:
        raise _error(spec, "it does not pickle by reference; use a module-level def", key)
    function: Callable[..., Any] = target
    return function


def transform_values(transform: Transform, values: pa.Array, offsets: pa.Array, split_id: str) -> pa.Array:
    """Apply ``transform`` to a column of values whose records start at ``offsets``.

    A vectorised transform is called once; a per-record one value by value
    (:func:`apply_transform`). Failures raise :class:`TransformError` (module doc).
    """
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


def _error(spec: str, why: str, key: str = "transform") -> ConfigError:
    return ConfigError(
        f"{key}={spec!r} is not allowed: {_ALLOWED}; {why}", key=key, value=spec, allowed=_ALLOWED
    )


def apply_to_table(transform: Transform, table: pa.Table, offsets: pa.Array, split_id: str) -> pa.Table:
    """Apply ``transform`` to a range's decoded columns (``table``, one row per record at ``offsets``).

    STUB of issue 21's columnar transform (being filled in): a per-record or vectorised
    transform maps the ``value`` column (text sinks); failures raise :class:`TransformError`
    naming the split and offset. The finished form also takes Arrow ``RecordBatch -> RecordBatch``
    transforms over typed columns and returns the records a transform failed on as bad
    records (stage ``transform``) instead of raising, when the caller tolerates them.
    """
    if transform is identity or table.num_rows == 0:
        return table
    column = table.column("value").combine_chunks()
    out = transform_values(transform, column, offsets, split_id)
    return table.set_column(table.schema.get_field_index("value"), "value", out)
