"""Spark transforms (``transform: {kind: spark, function: 'tests.runtime.spark_functions:<fn>'}``) for
tests/runtime/test_spark_transform.py: a realistic one and ones that break the contract on purpose,
each marked ``@spark_transform`` (a config may name no other callable).

Registered with cloudpickle by value, so a UDF defined here reaches the Python workers without
this module being importable there.
"""

from __future__ import annotations

import sys
from typing import Any

from pyspark import cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql import functions as F  # noqa: N812

from splitkeeper import spark_transform

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MIN_AMOUNT = 10


@spark_transform
def orders(df: DataFrame) -> DataFrame:
    """What a PySpark team writes: filter, withColumn, a join with a small dimension table (built
    with the active session), dropDuplicates on the business key (which row of a key it keeps is
    Spark's choice; the duplicates of the tests' data are equal but for their offsets)."""
    kinds = df.sparkSession.createDataFrame([("a", "Alpha"), ("b", "Beta")], "kind STRING, kind_name STRING")
    return (
        df.filter(F.col("amount") >= MIN_AMOUNT)
        .withColumn("amount_cents", (F.col("amount") * 100).cast("bigint"))
        .join(F.broadcast(kinds), "kind", "left")
        .dropDuplicates(["order_no"])
        .drop("next_offset", "ingested_at")  # bookkeeping it drops is put back by splitkeeper
    )


@spark_transform
def narrow(df: DataFrame) -> DataFrame:
    """Row by row only: filter, withColumn and a broadcast join with a static table. Its plan shuffles
    none of the epoch's records, so regions stay independent."""
    kinds = df.sparkSession.createDataFrame([("a", "Alpha"), ("b", "Beta")], "kind STRING, kind_name STRING")
    return (
        df.filter(F.col("amount") >= MIN_AMOUNT)
        .withColumn("amount_cents", (F.col("amount") * 100).cast("bigint"))
        .join(F.broadcast(kinds), "kind", "left")
    )


def _boom(amount: Any) -> Any:
    if amount is not None and amount > 40:
        raise ValueError(f"amount {amount} is too large for this function")
    return amount


@spark_transform
def raising(df: DataFrame) -> DataFrame:
    """Raises on an executor, inside a Python UDF, for the records with amount > 40."""
    check = F.udf(_boom, "decimal(10,2)")
    return orders(df).withColumn("amount", check(F.col("amount")))


@spark_transform
def raising_on_driver(df: DataFrame) -> DataFrame:
    """Raises while building the plan (on the driver), but not for the empty frame at open."""
    if not df.isEmpty():
        raise RuntimeError("the plan cannot be built")
    return orders(df)


@spark_transform
def inventing(df: DataFrame) -> DataFrame:
    """Emits a row at an offset no record has (a made-up record)."""
    return orders(df).withColumn("offset", F.col("offset") + 1)


@spark_transform
def keyless(df: DataFrame) -> DataFrame:
    """Emits rows whose offset is null (it aggregated its bookkeeping away)."""
    return orders(df).withColumn("offset", F.when(F.col("amount") > 40, None).otherwise(F.col("offset")))


@spark_transform
def duplicating(df: DataFrame) -> DataFrame:
    """Emits every row twice."""
    out = orders(df)
    return out.unionByName(out)


@spark_transform
def drifting(df: DataFrame) -> DataFrame:
    """Returns amount_cents as a string once there are records (a bigint for the empty frame)."""
    out = orders(df)
    return out if df.isEmpty() else out.withColumn("amount_cents", F.col("amount_cents").cast("string"))


def _hang(amount: Any) -> Any:
    import time

    time.sleep(3600)
    return amount


@spark_transform
def hanging(df: DataFrame) -> DataFrame:
    """A UDF that never returns (it waits an hour on every record), as one waiting on a dead service."""
    wait = F.udf(_hang, "decimal(10,2)")
    return orders(df).withColumn("amount", wait(F.col("amount")))
