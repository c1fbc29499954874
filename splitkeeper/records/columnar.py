"""Columnar reads: a planned range as Arrow columns instead of one Python object per record.

A :class:`~splitkeeper.core.source.RegionReader` yields :class:`SourceRecord`
tuples; that stays the contract every source implements. A reader that can do
better also implements :class:`SupportsColumnarRead`, and the region task
(:func:`splitkeeper.spark.task.run_region_task`) then reads, transforms and
stages the range without a Python step per record. Contract of
:meth:`SupportsColumnarRead.read_range_columns`:

1. it returns exactly the records ``read_range(split, start, end)`` yields, in
   order: ``offsets[i]``, ``next_offsets[i]`` and ``values[i]`` are the fields
   of the i-th record (``values[i]`` is its bytes as the source holds them, a
   null for a Kafka null value, never decoded); ``meta`` is ``None`` when
   the records carry no metadata (the staged metadata columns are null), else
   the key, topic, partition, timestamp and headers columns (the types of
   :data:`~splitkeeper.delta.schemas.META_COLUMNS` in ``STAGED_FILE_SCHEMA``),
   ``meta[k][i]`` being what ``read_range``'s i-th record carries in its
   :class:`~splitkeeper.core.source.RecordMeta`;
2. it raises what ``read_range`` raises, with the same message, naming the
   split and the offset of the first bad record; it raises on the call (never
   later), so a caller gets either all the records or an error. One exception:
   a record the source's format refuses (a ``jsonl`` line that is not JSON or
   not UTF-8) is returned as a record (its bytes as they are) and listed in
   ``bad`` with the error ``read_range`` raises for it, so that the record
   path applies ``errors.tolerance`` to it (a dead letter under ``all``), and
   the range's other records are read;
3. ``offsets`` and ``next_offsets`` are int64 arrays, ``values`` a binary or
   large_binary array that may hold nulls, all of the same length (the ``meta``
   arrays too).

A region reads all its ranges of an epoch with
:meth:`SupportsColumnarRead.read_ranges_columns`: one :class:`RangeColumns`
per range, in the order given, each exactly what ``read_range_columns`` returns
for it. The default reads the ranges one after another; a reader that can
fetch several at once (Kafka: one consumer assigned every partition) overrides
it. An error names the split it belongs to (``params["split_id"]``) when the
reader knows it, so the region task names that split even when the ranges are
read together.
"""

from __future__ import annotations

import abc
import datetime
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import pyarrow as pa

from splitkeeper.core.source import RecordMeta, SourceRecord
from splitkeeper.core.types import Split

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MS = datetime.timedelta(milliseconds=1)


class BadRead(NamedTuple):
    """A record of a range that the source's format refuses (contract 2): its row in the range,
    the error's class, its message (what ``read_range`` raises for it) and the offset it names."""

    row: int
    error_class: str
    message: str
    offset: int


class RangeColumns(NamedTuple):
    """The records of one planned range, column by column (see the module doc)."""

    offsets: pa.Array
    next_offsets: pa.Array
    values: pa.Array
    meta: tuple[pa.Array, ...] | None = None
    bad: tuple[BadRead, ...] = ()  # records the source's format refuses, by index (contract 2)

    @property
    def last_next_offset(self) -> int | None:
        """The ``next_offset`` of the last record; ``None`` for an empty range."""
        return int(self.next_offsets[-1].as_py()) if len(self.next_offsets) else None

    def records(self) -> Iterator[SourceRecord]:
        """The same records one by one (the :meth:`RegionReader.read_range` form)."""
        rows = zip(
            self.offsets.to_pylist(), self.next_offsets.to_pylist(), self.values.to_pylist(), strict=True
        )
        if self.meta is None:
            for offset, next_offset, value in rows:
                yield SourceRecord(offset, next_offset, value)
            return
        keys, topics, partitions, timestamps, headers = (column.to_pylist() for column in self.meta)
        for (offset, next_offset, value), key, topic, partition, timestamp, header in zip(
            rows, keys, topics, partitions, timestamps, headers, strict=True
        ):
            meta = RecordMeta(
                key,
                topic,
                partition,
                None if timestamp is None else (timestamp - _EPOCH) // _MS,
                tuple((h["key"], h["value"]) for h in header or ()),
            )
            yield SourceRecord(offset, next_offset, value, meta)


class SupportsColumnarRead(abc.ABC):
    """A :class:`~splitkeeper.core.source.RegionReader` mix-in: read a range as Arrow columns."""

    @abc.abstractmethod
    def read_range_columns(self, split: Split, start: int, end: int) -> RangeColumns:
        """The records of ``split`` whose offset lies in ``[start, end)`` (see the module doc)."""

    def read_ranges_columns(self, ranges: Sequence[tuple[Split, int, int]]) -> Iterator[RangeColumns]:
        """The records of every ``(split, start, end)`` of ``ranges``: one :class:`RangeColumns` per
        range, in the order given, each what :meth:`read_range_columns` returns for it.

        The default reads each range when the iteration reaches it. An override may read them all
        at the first step; it raises what ``read_range_columns`` raises for the failing range,
        with ``params["split_id"]`` naming its split.
        """
        for split, start, end in ranges:
            yield self.read_range_columns(split, start, end)
