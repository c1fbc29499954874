"""The fold check of an upsert sink: its keyed table equals the fold of its change table, on Spark.

Who calls it: :func:`splitkeeper.quality.checks.run_restart_checks`, when the pipeline's sink mode
is upsert (``upsert`` given), after the protocol suites; the report reads the result it leaves
beside the Data Docs (:data:`FOLD_RESULT_FILE`).

How: :func:`fold` is rule 5 of :mod:`splitkeeper.records.upsert` in Spark SQL (keyless tombstones
dropped when the key names a data column; per key a window ordered by
:data:`~splitkeeper.records.upsert.ORDER_COLUMNS` descending keeps ``row_number`` 1; rows where
:meth:`~splitkeeper.records.upsert.UpsertSpec.delete_condition` holds dropped; a window partition
groups null key values together, so keys compare null-safely). :func:`fold_comparison` joins the
fold and the keyed table (full outer, on ``<=>`` per key column) into one row per key with the
verdict columns ``missing_key``, ``extra_key``, ``stale_row`` (the columns that differ, compared
null-safely on every column the keyed table has) and ``duplicate_key``, NULL when the key is right.
The ``upsert_fold`` suite (``expectations/upsert_fold.json``) runs on that frame with Great
Expectations' Spark datasource (nothing is collected but GE's metrics and a few offending rows),
and one aggregation counts the keys and the offenders (:class:`FoldResult`). Both tables are read
at their latest version; nothing is written but the result file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from splitkeeper.records.upsert import (
    FIRST_KEYS,
    FOLD_RESULT_FILE,
    ORDER_COLUMNS,
    TOMBSTONE,
    VERDICT_COLUMNS,
    FoldResult,
    UpsertSpec,
    read_fold_result,
)

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from splitkeeper.sinks.port import SinkReader

__all__ = [
    "FOLD_RESULT_FILE",
    "VERDICT_COLUMNS",
    "FoldResult",
    "fold",
    "fold_comparison",
    "read_fold_result",
    "scan_fold",
]


def _col(name: str, table: str | None = None) -> Any:
    from pyspark.sql import functions as F

    quoted = "`" + name.replace("`", "``") + "`"
    return F.col(f"{table}.{quoted}" if table else quoted)


def fold(changes: DataFrame, upsert: UpsertSpec) -> DataFrame:
    """Rule 5 of :mod:`splitkeeper.records.upsert` on the change table's frame: per key the winning
    record (greatest ``(epoch, offset, split_id)``) unless it is a delete; keyless tombstones take no
    part when the key names a data column (rule 4)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rows = changes
    if not upsert.keyed_tombstones:
        rows = rows.where(~F.coalesce(_col(TOMBSTONE), F.lit(False)))
    order = Window.partitionBy(*(_col(k) for k in upsert.key)).orderBy(
        *(_col(c).desc() for c in ORDER_COLUMNS)
    )
    latest = rows.withColumn("__rank", F.row_number().over(order)).where(F.col("__rank") == 1).drop("__rank")
    return latest.where(~F.expr(upsert.delete_condition(dialect="spark")))


def _text(column: Any, data_type: Any) -> Any:
    """A key column as JSON-friendly text (bytes as UTF-8)."""
    return column.cast("string") if data_type.typeName() == "binary" else column


def _where(prefix: str, table: str) -> Any:
    from pyspark.sql import functions as F

    return F.format_string(
        f"{prefix + ' ' if prefix else ''}split %s offset %s, epoch %s",
        _col("split_id", table),
        _col("offset", table),
        _col("epoch", table),
    )


def fold_comparison(
    changes: DataFrame, keyed: DataFrame, upsert: UpsertSpec
) -> tuple[DataFrame, tuple[str, ...]]:
    """One row per key of the fold of ``changes`` or of ``keyed`` (a full outer join, null-safe on
    the key): ``key`` (the key columns as JSON), ``split_id``/``offset`` (the fold's winner, else the
    keyed row's), ``in_fold``, ``in_keyed`` and the :data:`VERDICT_COLUMNS` (a sentence, NULL when
    right). Returns the frame and the columns compared (every keyed column the change table has)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    compared = tuple(c for c in keyed.columns if c in changes.columns)
    copies = Window.partitionBy(*(_col(k) for k in upsert.key))
    f = fold(changes, upsert).select(*(_col(c) for c in compared), F.lit(True).alias("__in")).alias("f")
    k = (
        keyed.select(*(_col(c) for c in compared), F.lit(True).alias("__in"))
        .withColumn("__copies", F.count(F.lit(1)).over(copies))
        .alias("k")
    )
    on = None
    for name in upsert.key:
        match = _col(name, "f").eqNullSafe(_col(name, "k"))
        on = match if on is None else on & match
    joined = f.join(k, on, "full_outer")
    in_fold = F.coalesce(F.col("f.__in"), F.lit(False))
    in_keyed = F.coalesce(F.col("k.__in"), F.lit(False))
    types = {fld.name: fld.dataType for fld in keyed.schema.fields}
    key = F.to_json(
        F.struct(
            *(
                _text(F.when(in_fold, _col(n, "f")).otherwise(_col(n, "k")), types[n]).alias(n)
                for n in upsert.key
            )
        ),
        {"ignoreNullFields": "false"},
    )
    differ = F.concat_ws(", ", *(F.when(~_col(c, "f").eqNullSafe(_col(c, "k")), F.lit(c)) for c in compared))
    frame = joined.select(
        key.alias("key"),
        F.when(in_fold, _col("split_id", "f")).otherwise(_col("split_id", "k")).alias("split_id"),
        F.when(in_fold, _col("offset", "f")).otherwise(_col("offset", "k")).alias("offset"),
        in_fold.alias("in_fold"),
        in_keyed.alias("in_keyed"),
        F.when(
            in_fold & ~in_keyed,
            F.concat(
                F.lit("in the fold of the change table ("),
                _where("the latest record:", "f"),
                F.lit(") but not in the keyed table"),
            ),
        ).alias("missing_key"),
        F.when(
            in_keyed & ~in_fold,
            F.concat(
                F.lit("in the keyed table ("),
                _where("its row is of", "k"),
                F.lit(") but not in the fold of the change table: its latest record is a delete, or none"),
            ),
        ).alias("extra_key"),
        F.when(
            in_fold & in_keyed & (differ != ""),
            F.concat(
                F.lit("columns differ from the fold: "),
                differ,
                F.lit(" (keyed row: "),
                _where("", "k"),
                F.lit("; the latest record: "),
                _where("", "f"),
                F.lit(")"),
            ),
        ).alias("stale_row"),
        F.when(
            F.col("k.__copies") > 1,
            F.format_string("the key is %s times in the keyed table", F.col("k.__copies")),
        ).alias("duplicate_key"),
    )
    return frame, compared


def _empty_like(frame: DataFrame, drop: Sequence[str] = (), add_tombstone: bool = False) -> DataFrame:
    from pyspark.sql import functions as F

    out = frame.drop(*drop).limit(0)
    return out.withColumn(TOMBSTONE, F.lit(False)) if add_tombstone else out


def scan_fold(
    spark: SparkSession | Callable[[], SparkSession],
    sink: SinkReader,
    upsert: UpsertSpec,
) -> tuple[FoldResult, DataFrame | None]:
    """Fold the change table of ``sink`` (its reader) and compare it with its keyed table
    (:func:`fold_comparison`); count the keys and offenders in one aggregation and name the first
    :data:`FIRST_KEYS` offenders by key. Returns the result and the comparison frame (persisted, for
    the suite; the caller unpersists it), or None for the frame when neither table has a data file
    (``spark``, the session or a function returning it, is then not called)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from splitkeeper.sinks.port import SinkTable

    changes_path = sink.location(SinkTable.RECORDS) or ""
    keyed_path = sink.location(SinkTable.KEYED) or ""
    base = FoldResult(changes_path, keyed_path, upsert.key, upsert.delete_when)
    has_changes, has_keyed = sink.files(SinkTable.RECORDS), sink.files(SinkTable.KEYED)
    notes: list[str] = []
    if not has_changes and not has_keyed:
        notes.append("no change table and no keyed table with data yet: nothing to fold")
        return FoldResult(**{**asdict(base), "notes": tuple(notes)}), None
    session = spark() if callable(spark) else spark
    changes = sink.frame(session, SinkTable.RECORDS) if has_changes else None
    keyed = sink.frame(session, SinkTable.KEYED) if has_keyed else None
    if changes is None:
        assert keyed is not None
        changes = _empty_like(keyed, add_tombstone=True)
        notes.append(f"no change table at {changes_path}: its fold is empty")
    if keyed is None:
        keyed = _empty_like(changes, drop=[TOMBSTONE])
        notes.append(f"no keyed table at {keyed_path}: checked as empty")
    unknown = [c for c in keyed.columns if c not in changes.columns]
    if unknown:
        notes.append(f"keyed table columns the change table lacks, not compared: {', '.join(unknown)}")
    frame, compared = fold_comparison(changes, keyed, upsert)
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    counted = frame.agg(
        F.count(F.when(F.col("in_fold"), F.lit(1))).alias("keys_in_fold"),
        F.count(F.when(F.col("in_keyed"), F.lit(1))).alias("keyed_rows"),
        *(F.count(F.col(c)).alias(c) for c in VERDICT_COLUMNS),
    ).first()
    assert counted is not None
    totals = changes.agg(
        F.count(F.lit(1)).alias("rows"),
        F.count(F.when(F.expr(upsert.delete_condition(dialect="spark")), F.lit(1))).alias("deletes"),
    ).first()
    assert totals is not None
    bad = F.coalesce(*(F.col(c) for c in VERDICT_COLUMNS))
    verdict = F.coalesce(*(F.when(F.col(c).isNotNull(), F.lit(c)) for c in VERDICT_COLUMNS))
    first = [
        {
            "key": r["key"],
            "split_id": r["split_id"],
            "offset": r["offset"],
            "verdict": r["verdict"],
            "detail": r["detail"],
        }
        for r in frame.where(bad.isNotNull())
        .select("key", "split_id", "offset", verdict.alias("verdict"), bad.alias("detail"))
        .orderBy("key", "split_id", "offset")
        .limit(FIRST_KEYS)
        .collect()
    ]
    result = FoldResult(
        **{
            **asdict(base),
            "change_rows": int(totals["rows"]),
            "deletes": int(totals["deletes"]),
            "keys_in_fold": int(counted["keys_in_fold"]),
            "keyed_rows": int(counted["keyed_rows"]),
            **{c: int(counted[c]) for c in VERDICT_COLUMNS},
            "compared_columns": compared,
            "first": tuple(first),
            "notes": tuple(notes),
        }
    )
    return result, frame
