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
:mod:`splitkeeper_tools.bench.ingest`, which the Kafka benchmark imports them from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from splitkeeper.config.models import Readers
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


#: ``--sink``: ``append`` (every record a row) or ``upsert`` (keyed CDC records, one MERGE per epoch).
SINKS = ("append", "upsert")
#: Our pipeline's ``readers`` setting, as ``bench ingest --readers`` takes it (the default first).
READERS = tuple(r.value for r in Readers)
#: The keyed change records of ``--sink upsert`` (:func:`write_cdc_files`): ``op`` is c (a new key),
#: u (an update of a key of the same file) or d (a delete of one).
CDC_SCHEMA = "id BIGINT, op STRING, user STRING, amount DOUBLE, ts BIGINT, note STRING"
CDC_COLUMNS = ("id", "op", "user", "amount", "ts", "note")
CDC_KEY = ("id",)
CDC_DELETE_WHEN = "op = 'd'"
#: ``--sink upsert``'s mix: of the records after a file's first, these shares update and delete a key.
UPDATE_SHARE = 0.20
DELETE_SHARE = 0.02


def write_cdc_files(
    directory: str, files: int, lines: int, line_bytes: int = 100, seed: int = 7
) -> tuple[dict[str, int], dict[int, dict[str, Any]]]:
    """Write ``files`` files of ``lines`` keyed change records (JSON lines of :data:`CDC_SCHEMA`) and
    return (file name -> line count, the expected table: id -> the latest record of every live key).

    Each file has keys of its own (as a Kafka partition does: a key's changes are in one split, in
    order), so the latest record of a key is its last line in its file; ``ts`` grows with every
    line. Of the lines, :data:`UPDATE_SHARE` update and :data:`DELETE_SHARE` delete a live key of
    the file (drawn at random), the rest insert a new key. Deterministic for ``seed``; written
    under a hidden name, then renamed (the file source's rule for producers)."""
    import random

    os.makedirs(directory, exist_ok=True)
    rng = random.Random(seed)
    expected: dict[int, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    seq = 0
    for index in range(files):
        live: list[int] = []
        next_id = index * lines
        out: list[str] = []
        for _ in range(lines):
            draw = rng.random()
            if live and draw < DELETE_SHARE:
                op = "d"
                key = live.pop(rng.randrange(len(live)))
            elif live and draw < DELETE_SHARE + UPDATE_SHARE:
                op, key = "u", live[rng.randrange(len(live))]
            else:
                op, key = "c", next_id
                next_id += 1
                live.append(key)
            record: dict[str, Any] = {
                "id": key,
                "op": op,
                "user": f"u{rng.randrange(1000):04d}",
                "amount": round(rng.lognormvariate(2.5, 1.2), 2),
                "ts": 1_700_000_000_000 + seq,
            }
            head = json.dumps(record)[:-1] + ', "note": "'
            pad = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz ", k=max(0, line_bytes - len(head) - 2)))
            record["note"] = pad
            out.append(head + pad + '"}')
            if op == "d":
                expected.pop(key, None)
            else:
                expected[key] = record
            seq += 1
        name = f"cdc-{index:05d}.jsonl"
        hidden = os.path.join(directory, f".{name}.tmp")
        with open(hidden, "w", encoding="utf-8") as handle:
            handle.write("\n".join(out) + "\n")
        os.replace(hidden, os.path.join(directory, name))
        counts[name] = lines
    return counts, expected


def cdc_rows(table: pa.Table) -> pa.Table:
    """``table``'s :data:`CDC_COLUMNS` in one canonical schema, sorted by ``id``: two keyed tables
    hold the same rows when these are equal."""
    import pyarrow as pa

    canonical = pa.schema(
        [
            ("id", pa.int64()),
            ("op", pa.large_string()),
            ("user", pa.large_string()),
            ("amount", pa.float64()),
            ("ts", pa.int64()),
            ("note", pa.large_string()),
        ]
    )
    return table.select(list(CDC_COLUMNS)).cast(canonical).sort_by("id").combine_chunks()


def expected_cdc_rows(expected: Mapping[int, Mapping[str, Any]]) -> pa.Table:
    """The expected keyed table of :func:`write_cdc_files` as :func:`cdc_rows` gives a table."""
    import pyarrow as pa

    rows = [dict(expected[k]) for k in sorted(expected)]
    return cdc_rows(pa.Table.from_pylist(rows) if rows else _empty_cdc())


def _empty_cdc() -> pa.Table:
    import pyarrow as pa

    return pa.table(
        {
            "id": pa.array([], pa.int64()),
            "op": pa.array([], pa.string()),
            "user": pa.array([], pa.string()),
            "amount": pa.array([], pa.float64()),
            "ts": pa.array([], pa.int64()),
            "note": pa.array([], pa.string()),
        }
    )


def pipeline_config(
    name: str,
    root: str,
    source: Mapping[str, Any],
    *,
    parallelism: int,
    epoch_records: int,
    region_timeout_s: float,
    decode: str = "raw",
    sink: str = "append",
    interval_s: float | None = None,
    readers: str = "per_epoch",
) -> PipelineConfig:
    """A benchmark pipeline ``name`` reading ``source``, with state and sink under ``root``; with
    ``decode="json"`` it decodes every record with :data:`JSON_SCHEMA` into typed columns; with
    ``sink="upsert"`` it decodes :data:`CDC_SCHEMA` and upserts by :data:`CDC_KEY`, deleting on
    :data:`CDC_DELETE_WHEN`; ``interval_s`` sets both checkpoint intervals of a continuous run
    (``backlog.backlog_interval_s`` and ``normal_interval_s``; None: the defaults); ``readers`` is
    the pipeline's ``readers`` setting."""
    from splitkeeper.config.settings import IDENTITY_TRANSFORM, config_from_mapping

    typed: dict[str, Any] = {"decode": {"kind": "json", "schema": JSON_SCHEMA}} if decode == "json" else {}
    keyed: dict[str, Any] = {}
    if sink == "upsert":
        typed = {"decode": {"kind": "json", "schema": CDC_SCHEMA}}
        keyed = {"mode": "upsert", "key": list(CDC_KEY), "delete_when": CDC_DELETE_WHEN}
    return config_from_mapping(
        {
            **typed,
            "name": name,
            "parallelism": parallelism,
            "readers": readers,
            "regions": "per_reader",  # regional checkpoints on
            "source": dict(source),
            "checkpoint": {"region_timeout_s": region_timeout_s, "retain_checkpoints": 3},
            # bounded file splits are not backlog-tracked: the normal size applies; set both alike
            "backlog": {
                "backlog_epoch_records": epoch_records,
                "normal_epoch_records": epoch_records,
                **(
                    {"backlog_interval_s": interval_s, "normal_interval_s": interval_s}
                    if interval_s is not None
                    else {}
                ),
            },
            "state": {"path": os.path.join(root, "state")},
            "sink": {"path": os.path.join(root, "sink"), **keyed},
            "transform": IDENTITY_TRANSFORM,
        },
        base_dir=root,
    )


def typed_frame(
    frame: Any,
    value: str,
    keep: tuple[tuple[str, str], ...],
    schema: str = JSON_SCHEMA,
    columns: tuple[str, ...] = JSON_COLUMNS,
) -> Any:
    """The baseline's typed frame: the ``keep`` columns (name, SQL expression over ``frame``) and the
    ``schema`` columns (default :data:`JSON_SCHEMA`) parsed from the JSON text ``value`` (a SQL
    expression) with Spark's ``from_json``: what a Structured Streaming user writes to get typed
    columns into Delta."""
    return frame.selectExpr(
        *(f"{expr} AS {name}" for name, expr in keep), f"from_json({value}, '{schema}') AS _record"
    ).selectExpr(*(name for name, _expr in keep), *(f"_record.`{c}` AS `{c}`" for c in columns))


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
    """True when our sink (:func:`splitkeeper.sinks.delta.read.read_sink`) and the baseline's Delta table
    (read with delta-rs) hold the same multiset of typed rows (:func:`typed_rows`)."""
    from deltalake import DeltaTable

    from splitkeeper.sinks.delta.read import read_sink

    mine = typed_rows(read_sink(ours, list(JSON_COLUMNS)))
    theirs = typed_rows(DeltaTable(baseline).to_pyarrow_table(columns=list(JSON_COLUMNS)))
    return bool(mine.equals(theirs))


def merge_available_now(frame: Any, sink_path: str, checkpoint: str, query_name: str) -> Any:
    """The baseline of ``--sink upsert``, as a Structured Streaming user writes it: ``foreachBatch``
    keeps each key's latest record of the micro-batch (by ``ts``) and applies it with one Delta
    ``MERGE`` (delete on :data:`CDC_DELETE_WHEN`), idempotent per batch through Delta's
    ``txnAppId``/``txnVersion`` write settings; ``frame`` has the :data:`CDC_COLUMNS`. The keyed
    table at ``sink_path`` is created first (empty). Returns the query once it ended."""
    from delta.tables import DeltaTable
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    spark = frame.sparkSession
    spark.createDataFrame([], CDC_SCHEMA).write.format("delta").save(sink_path)
    latest = Window.partitionBy("id").orderBy(F.col("ts").desc())

    def merge(batch: Any, batch_id: int) -> None:
        rows = batch.withColumn("_rank", F.row_number().over(latest)).where("_rank = 1").drop("_rank")
        session = batch.sparkSession
        session.conf.set("spark.databricks.delta.write.txnAppId", query_name)
        session.conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        try:
            (
                DeltaTable.forPath(session, sink_path)
                .alias("t")
                .merge(rows.alias("s"), "t.id = s.id")
                .whenMatchedDelete(condition=f"s.{CDC_DELETE_WHEN}")
                .whenMatchedUpdateAll()
                .whenNotMatchedInsertAll(condition=f"NOT (s.{CDC_DELETE_WHEN})")
                .execute()
            )
        finally:
            session.conf.unset("spark.databricks.delta.write.txnAppId")
            session.conf.unset("spark.databricks.delta.write.txnVersion")

    query = (
        frame.writeStream.foreachBatch(merge)
        .option("checkpointLocation", checkpoint)
        .queryName(query_name)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query


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
