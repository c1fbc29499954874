"""The pipeline's sink as its config describes it: the one place the application opens a sink, of
the pipeline's sink kind (:mod:`splitkeeper.kinds`), behind the sink port
(:mod:`splitkeeper.sinks.port`): the runtime, ``maintain``, the incident commands, the checks and
the report reach a sink through here only.

What the region tasks do with a pipeline's records is here too (:func:`record_policy`): the
pipeline's decode, errors and staging settings (the sink kind's partitions and upsert rule) in one
small picklable value shipped with every region task; its ``schema`` is the sink's columns.

Light to import (no Spark module): a read-only sink (status, dry runs) needs no record policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from splitkeeper.config.models import TransformKind
from splitkeeper.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from splitkeeper.config.settings import PipelineConfig
    from splitkeeper.sinks.port import Sink, SinkReader
    from splitkeeper.spark.task import RecordPolicy

__all__ = ["config_sink", "record_policy", "sink_reader"]


def config_sink(
    config: PipelineConfig,
    *,
    read_only: bool = False,
    policy: RecordPolicy | None = None,
    crash_point: Callable[[Any, int], None] | None = None,
) -> Sink:
    """``config``'s sink, opened by its kind: for writing with the columns and partitions of ``policy``
    (default: the config's :func:`record_policy`; an existing table is
    checked against them and its side tables repaired on open), or ``read_only`` (needs none)."""
    from splitkeeper.kinds import sink_factory

    if policy is None and not read_only:
        policy = record_policy(config)
    sink: Sink = sink_factory(config.sink.kind_name).open(
        config, read_only=read_only, policy=policy, crash_point=crash_point
    )
    return sink


def sink_reader(config: PipelineConfig) -> SinkReader:
    """The read side of ``config``'s sink (its kind's reader): it opens nothing for writing."""
    from splitkeeper.kinds import sink_factory

    reader: SinkReader = sink_factory(config.sink.kind_name).read(config)
    return reader


def record_policy(config: PipelineConfig, spark: Any = None) -> RecordPolicy:
    """What the region tasks do with the records' bytes: the pipeline's decode, errors and
    sink.partition_by settings in one small picklable value; its ``schema`` is the sink's.

    A spark transform (``transform.kind: spark``) makes the sink's data columns: what it returns
    for an empty DataFrame of the staged columns, run on ``spark``
    (:meth:`~splitkeeper.spark.transform.SparkTransform.output_data`); the upsert key and
    ``delete_when`` are checked against them (ConfigError). Without a session (maintenance),
    the existing sink table's data columns stand in for them."""
    from dataclasses import replace

    from splitkeeper.delta.schemas import data_schema
    from splitkeeper.spark.task import RecordPolicy
    from splitkeeper.transforms import is_batch, output_schema, resolve_transform

    policy = RecordPolicy(
        decode=config.decode,
        tolerance=config.errors.tolerance.value,
        max_bad_ratio=config.errors.max_bad_ratio,
        partition_by=config.sink.staged_partition_by,
        upsert=config.sink.upsert,
    )
    if config.transform_kind is TransformKind.SPARK:
        return _spark_transform_policy(config, policy, spark)
    transform = resolve_transform(config.transform_function)
    if not is_batch(transform):
        return policy
    return replace(policy, data=output_schema(transform, data_schema(config.decode)))


def _spark_transform_policy(config: PipelineConfig, policy: RecordPolicy, spark: Any) -> RecordPolicy:
    from dataclasses import replace

    import pyarrow as pa

    from splitkeeper.errors import UpsertError
    from splitkeeper.records.spec import NOT_DATA_COLUMNS
    from splitkeeper.spark.transform import SparkTransform

    if spark is not None:
        data = SparkTransform(spark, config.transform_function, policy, config.staging.folder).output_data()
    else:
        from splitkeeper.sinks.port import SinkTable

        try:
            schema = sink_reader(config).schema(SinkTable.RECORDS)
        except Exception:  # noqa: BLE001 - no sink table to read: the decoded columns
            schema = None
        if schema is None:
            return policy
        data = pa.schema(
            [pa.field(f.name, f.type, nullable=True) for f in schema if f.name not in NOT_DATA_COLUMNS]
        )
    policy = replace(policy, data=data)
    if config.sink.upsert is not None:
        try:
            config.sink.upsert.check_columns(policy.schema.names)
        except UpsertError as err:
            value = list(config.sink.upsert.key) if err.key == "key" else config.sink.upsert.delete_when
            raise ConfigError(
                f"sink.{err.key}={value!r} is not allowed: {err.message} (the sink's columns are what the "
                f"spark transform {config.transform_function} returns)",
                key=f"sink.{err.key}",
                value=value,
            ) from None
    return policy
