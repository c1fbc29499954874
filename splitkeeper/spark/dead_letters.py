"""Dead letters staged by a region task: the bad records of an epoch, beside its sink file.

A region task with ``errors.tolerance: all`` writes its bad records to
``<staging>/epoch=N/region=R/attempt=<id>/dead.parquet`` (:data:`DEAD_FILE`, beside
``part.parquet``) with :class:`DeadLetterWriter`: the raw key and value bytes, the stage that
failed (``decode``, ``schema``, ``transform``), the error class and message, the epoch, region,
region attempt and ``failed_at``, and the Kafka metadata. The file has every column of the
dead-letter table (:data:`~splitkeeper.delta.schemas.DEAD_LETTER_SCHEMA`, the one definition),
so the sink's epoch commit adopts it into that table as it is
(:meth:`~splitkeeper.delta.sink.DeltaSink.commit`). Like ``part.parquet`` it is written through
:func:`splitkeeper.staging.write_table` (local disk or an object store): a visible ``dead.parquet`` is
always complete.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from splitkeeper.delta.schemas import DEAD_LETTER_SCHEMA
from splitkeeper.records.decode import BadRecords
from splitkeeper.staging import DEAD_FILE, StagedRegion, write_table

__all__ = ["DEAD_FILE", "DEAD_LETTER_SCHEMA", "DeadLetterWriter", "attempt_of"]

_ROW_GROUP = 64 * 1024


def attempt_of(path: str) -> str:
    """The region attempt id of a staged file's path given by hand (the layout reads it back,
    :meth:`~splitkeeper.staging.StagedRegion.at`), or ``once`` outside the layout."""
    found = StagedRegion.at(path)
    return "once" if found is None else found.attempt


class DeadLetterWriter:
    """Collects one region attempt's bad records; :meth:`commit` writes ``dead.parquet`` atomically.

    ``path`` is the file to write (``<attempt dir>/dead.parquet``); ``attempt`` is the rows'
    ``attempt_id`` (None: the one the path names, :func:`attempt_of`). Nothing is written when no
    record was added.
    """

    def __init__(self, path: str, epoch: int, region: int, attempt: str | None = None) -> None:
        self.path = path
        self.epoch = epoch
        self.region = region
        self.attempt_id = attempt if attempt is not None else attempt_of(path)
        self._tables: list[pa.Table] = []
        self.records = 0

    def add(
        self,
        split_id: str,
        offsets: pa.Array,
        next_offsets: pa.Array,
        keys: pa.Array | None,
        values: pa.Array,
        bad: BadRecords,
        meta: tuple[pa.Array, ...] | None = None,
    ) -> int:
        """Add the ``bad`` records of one range of ``split_id`` (``bad.indices`` index ``offsets``,
        ``next_offsets``, ``keys`` and ``values``, the range's raw columns; ``meta`` the range's
        metadata columns ``(key, topic, partition, timestamp, ...)`` as the columnar reader gives
        them, or None for a files source). Returns how many."""
        n = len(bad)
        if not n:
            return 0
        take = pa.array(bad.indices, pa.int64())
        schema = DEAD_LETTER_SCHEMA

        def column(name: str, data: pa.Array | pa.ChunkedArray | None) -> pa.Array:
            wanted = schema.field(name).type
            if data is None:
                return pa.nulls(n, wanted)
            picked = data.take(take)
            if isinstance(picked, pa.ChunkedArray):
                picked = picked.combine_chunks()
            return picked if picked.type == wanted else picked.cast(wanted)

        now = pa.scalar(datetime.now(UTC), schema.field("failed_at").type)
        self._tables.append(
            pa.Table.from_arrays(
                [
                    pa.repeat(pa.scalar(split_id, pa.string()), n),
                    column("offset", offsets),
                    column("next_offset", next_offsets),
                    column("key", keys),
                    column("value", values),
                    pa.array(bad.stages, pa.string()),
                    pa.array(bad.error_classes, pa.string()),
                    pa.array(bad.messages, pa.string()),
                    pa.repeat(pa.scalar(self.epoch, pa.int64()), n),
                    pa.repeat(pa.scalar(self.region, pa.int32()), n),
                    pa.repeat(pa.scalar(self.attempt_id, pa.string()), n),
                    pa.repeat(now, n),
                    column("topic", meta[1] if meta is not None and len(meta) > 1 else None),
                    column("partition", meta[2] if meta is not None and len(meta) > 2 else None),
                    column("timestamp", meta[3] if meta is not None and len(meta) > 3 else None),
                ],
                schema=schema,
            )
        )
        self.records += n
        return n

    def commit(self) -> str | None:
        """Write the collected bad records (only a whole file is ever visible); the path, or None
        when there were none."""
        if not self.records:
            return None
        write_table(
            pa.concat_tables(self._tables), self.path, row_group_size=_ROW_GROUP, write_statistics=True
        )
        self._tables = []
        return self.path
