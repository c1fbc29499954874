"""Dead letters staged by a region task: the bad records of an epoch, beside its sink file.

STUB of issue 21 (being filled in by the dead-letter work): the interface the region task
writes to. A region task with ``errors.tolerance: all`` writes its bad records to
``<attempt dir>/dead.parquet`` (:data:`DEAD_FILE`, beside ``part.parquet``), with the raw key and
value bytes, the stage that failed, the error class and message; the sink commit adopts it
into the dead-letter table under the same fence as the sink's own files.
"""

from __future__ import annotations

import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

from splitkeeper.records.decode import BadRecords

DEAD_FILE = "dead.parquet"

#: The columns of a staged dead-letter file (the table adds nothing to them).
DEAD_LETTER_SCHEMA = pa.schema(
    [
        pa.field("split_id", pa.string(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("next_offset", pa.int64(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("error_class", pa.string(), nullable=False),
        pa.field("error_message", pa.string(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("region", pa.int32(), nullable=False),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)


class DeadLetterWriter:
    """Collects one region attempt's bad records; :meth:`commit` writes ``dead.parquet`` atomically."""

    def __init__(self, path: str, epoch: int, region: int) -> None:
        self.path = path
        self.epoch = epoch
        self.region = region
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
        ``next_offsets``, ``keys`` and ``values``, the range's raw columns). Returns how many."""
        n = len(bad)
        if not n:
            return 0
        take = pa.array(bad.indices, pa.int64())
        keys = keys.take(take) if keys is not None else pa.nulls(n, pa.binary())
        topic = meta[1].take(take) if meta is not None else pa.nulls(n, pa.string())
        partition = meta[2].take(take) if meta is not None else pa.nulls(n, pa.int32())
        timestamp = meta[3].take(take) if meta is not None else pa.nulls(n, pa.timestamp("us", tz="UTC"))
        self._tables.append(
            pa.table(
                [
                    pa.repeat(pa.scalar(split_id, pa.string()), n),
                    offsets.take(take),
                    next_offsets.take(take),
                    keys.cast(pa.binary()),
                    values.take(take).cast(pa.binary()),
                    pa.array(bad.stages, pa.string()),
                    pa.array(bad.error_classes, pa.string()),
                    pa.array(bad.messages, pa.string()),
                    pa.repeat(pa.scalar(self.epoch, pa.int64()), n),
                    pa.repeat(pa.scalar(self.region, pa.int32()), n),
                    topic,
                    partition,
                    timestamp,
                ],
                schema=DEAD_LETTER_SCHEMA,
            )
        )
        self.records += n
        return n

    def commit(self) -> str | None:
        """Write the collected bad records (tmp name, then rename); the path, or None when there were none."""
        if not self.records:
            return None
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        tmp = f"{self.path}.tmp-{uuid.uuid4().hex}"
        pq.write_table(pa.concat_tables(self._tables), tmp)
        os.replace(tmp, self.path)
        return self.path
