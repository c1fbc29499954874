"""Columnar reads: a planned range as Arrow columns instead of one Python object per record.

A :class:`~splitkeeper.core.source.RegionReader` yields :class:`SourceRecord`
tuples; that stays the contract every source implements. A reader that can do
better also implements :class:`SupportsColumnarRead`, and the region task
(:func:`splitkeeper.runtime.staging.run_region_task`) then reads, transforms and
stages the range without a Python step per record. Contract of
:meth:`SupportsColumnarRead.read_range_columns`:

1. it returns exactly the records ``read_range(split, start, end)`` yields, in
   order: ``offsets[i]``, ``next_offsets[i]`` and ``values[i]`` are the fields
   of the i-th record (``values`` never holds a null; records carry no
   metadata, so the staged metadata columns are null);
2. it raises what ``read_range`` raises, with the same message, naming the
   split and the offset of the first bad record; it raises on the call (never
   later), so a caller gets either all the records or an error;
3. ``offsets`` and ``next_offsets`` are int64 arrays, ``values`` a string or
   large_string array, all three of the same length.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import NamedTuple

import pyarrow as pa

from splitkeeper.core.source import SourceRecord
from splitkeeper.core.types import Split


class RangeColumns(NamedTuple):
    """The records of one planned range, column by column (see the module doc)."""

    offsets: pa.Array
    next_offsets: pa.Array
    values: pa.Array

    @property
    def last_next_offset(self) -> int | None:
        """The ``next_offset`` of the last record; ``None`` for an empty range."""
        return int(self.next_offsets[-1].as_py()) if len(self.next_offsets) else None

    def records(self) -> Iterator[SourceRecord]:
        """The same records one by one (the :meth:`RegionReader.read_range` form)."""
        for offset, next_offset, value in zip(
            self.offsets.to_pylist(), self.next_offsets.to_pylist(), self.values.to_pylist(), strict=True
        ):
            yield SourceRecord(offset, next_offset, value)


class SupportsColumnarRead(abc.ABC):
    """A :class:`~splitkeeper.core.source.RegionReader` mix-in: read a range as Arrow columns."""

    @abc.abstractmethod
    def read_range_columns(self, split: Split, start: int, end: int) -> RangeColumns:
        """The records of ``split`` whose offset lies in ``[start, end)`` (see the module doc)."""
