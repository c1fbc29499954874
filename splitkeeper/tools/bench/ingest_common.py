"""What the two ingest benchmarks (``bench ingest``, files and ``--source kafka``) build alike.

- :func:`pipeline_config`: our side's pipeline config: regional checkpoints on, identity
  transform, one epoch size for backlog and normal, state and sink under the run's folder;
  only the source, the region timeout and the decoding (``--decode``) differ;
- ``--decode json``: both inputs are JSON objects of :data:`JSON_SCHEMA`'s shape (the lines
  ``examples/make_files.py`` writes); ours decodes them with ``decode.kind: json`` and that
  schema, the baseline with :func:`typed_frame` (Spark's ``from_json`` and the same schema);
  :func:`same_typed_rows` compares both sinks' typed rows;
- :func:`run_available_now` and :func:`reading_batches`: the baseline's Structured
  Streaming query into a Delta sink with ``Trigger.AvailableNow``, waited for, a failure
  raised (naming the run), its micro-batches that read records.

The figures, samplers, charts and the repetition loop they share are in
:mod:`splitkeeper.tools.bench.ingest`, which the Kafka benchmark imports them from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from splitkeeper.errors import SplitkeeperError

if TYPE_CHECKING:
    import pyarrow as pa

    from splitkeeper.config.settings import PipelineConfig

#: ``--decode``: ``raw`` (the record's bytes into one ``value`` column, as before) or ``json``.
DECODES = ("raw", "json")
#: The declared schema of ``--decode json``: the fields of ``examples/make_files.py``'s JSON lines
#: (``{"id": 17, "user": "u0042", "amount": 12.5, "ts": 1700000000017, "note": "..."}``).
JSON_SCHEMA = "id BIGINT, user STRING, amount DOUBLE, ts BIGINT, note STRING"
JSON_COLUMNS = ("id", "user", "amount", "ts", "note")


def pipeline_config(
    name: str,
    root: str,
    source: Mapping[str, Any],
    *,
    parallelism: int,
    epoch_records: int,
    region_timeout_s: float,
    decode: str = "raw",
) -> PipelineConfig:
    """A benchmark pipeline ``name`` reading ``source``, with state and sink under ``root``; with
    ``decode="json"`` it decodes every record with :data:`JSON_SCHEMA` into typed columns."""
    from splitkeeper.config.settings import IDENTITY_TRANSFORM, config_from_mapping

    typed = {"decode": {"kind": "json", "schema": JSON_SCHEMA}} if decode == "json" else {}
    return config_from_mapping(
        {
            **typed,
            "name": name,
            "parallelism": parallelism,
            "regions": "per_reader",  # regional checkpoints on
            "source": dict(source),
            "checkpoint": {"region_timeout_s": region_timeout_s, "retain_checkpoints": 3},
            # bounded file splits are not backlog-tracked: the normal size applies; set both alike
            "backlog": {"backlog_epoch_records": epoch_records, "normal_epoch_records": epoch_records},
            "state": {"path": os.path.join(root, "state")},
            "sink": {"path": os.path.join(root, "sink")},
            "transform": IDENTITY_TRANSFORM,
        },
        base_dir=root,
    )


def typed_frame(frame: Any, value: str, keep: tuple[tuple[str, str], ...]) -> Any:
    """The baseline's typed frame: the ``keep`` columns (name, SQL expression over ``frame``) and the
    :data:`JSON_SCHEMA` columns parsed from the JSON text ``value`` (a SQL expression) with Spark's
    ``from_json``: what a Structured Streaming user writes to get typed columns into Delta."""
    return frame.selectExpr(
        *(f"{expr} AS {name}" for name, expr in keep), f"from_json({value}, '{JSON_SCHEMA}') AS _record"
    ).selectExpr(*(name for name, _expr in keep), *(f"_record.`{c}` AS `{c}`" for c in JSON_COLUMNS))


def typed_rows(table: pa.Table) -> pa.Table:
    """``table``'s :data:`JSON_SCHEMA` columns in one canonical Arrow schema, every row once, sorted by
    all of them: two sinks hold the same typed rows when these tables are equal."""
    import pyarrow as pa

    canonical = pa.schema(
        [
            ("id", pa.int64()),
            ("user", pa.large_string()),
            ("amount", pa.float64()),
            ("ts", pa.int64()),
            ("note", pa.large_string()),
        ]
    )
    rows = table.select(list(JSON_COLUMNS)).cast(canonical)
    return rows.sort_by([(c, "ascending") for c in JSON_COLUMNS]).combine_chunks()


def same_typed_rows(ours: str, baseline: str) -> bool:
    """True when our sink (:func:`splitkeeper.delta.sink.read_sink`) and the baseline's Delta table
    (read with delta-rs) hold the same multiset of typed rows (:func:`typed_rows`)."""
    from deltalake import DeltaTable

    from splitkeeper.delta.sink import read_sink

    mine = typed_rows(read_sink(ours, list(JSON_COLUMNS)))
    theirs = typed_rows(DeltaTable(baseline).to_pyarrow_table(columns=list(JSON_COLUMNS)))
    return bool(mine.equals(theirs))


def run_available_now(frame: Any, sink_path: str, checkpoint: str, query_name: str) -> Any:
    """Write ``frame`` (a streaming DataFrame) into the Delta table at ``sink_path`` with
    ``Trigger.AvailableNow`` and a checkpoint at ``checkpoint``; returns the query once it ended."""
    query = (
        frame.writeStream.format("delta")
        .option("checkpointLocation", checkpoint)
        .queryName(query_name)
        .trigger(availableNow=True)
        .start(sink_path)
    )
    query.awaitTermination()
    return query


def reading_batches(query: Any, label: str) -> list[dict[str, Any]]:
    """A finished streaming query's micro-batches that read records: their progress as plain dicts;
    a SplitkeeperError naming ``label`` when the query failed."""
    if query.exception() is not None:
        raise SplitkeeperError(f"{label}: the Structured Streaming query failed: {query.exception()}")
    items = [json.loads(p.json) for p in query.recentProgress]
    return [p for p in items if p.get("numInputRows", 0) > 0]
