"""The pipeline's sink as its config describes it: the one place a ``DeltaSink`` is built for a
pipeline (the runtime, ``maintain``, the incident commands).

Light to import (no Spark module): a read-only sink (status, dry runs) needs no record policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from splitkeeper.config.settings import PipelineConfig
    from splitkeeper.delta.sink import DeltaSink
    from splitkeeper.spark.task import RecordPolicy

__all__ = ["config_sink"]


def config_sink(
    config: PipelineConfig,
    *,
    read_only: bool = False,
    policy: RecordPolicy | None = None,
    crash_point: Callable[[Any, int], None] | None = None,
) -> DeltaSink:
    """``config``'s sink: its records table (an upsert sink's keyed table), dead letters, filtered
    offsets and change table, with the columns and partitions of ``policy`` (a writable sink's
    default: the config's :func:`~splitkeeper.app.pipeline.record_policy`; a read-only one needs
    none). A writable one checks an existing table against them and repairs its side tables on open."""
    from splitkeeper.delta.sink import DeltaSink

    if policy is None and not read_only:
        from splitkeeper.app.pipeline import record_policy

        policy = record_policy(config)
    shape: dict[str, Any] = (
        {}
        if policy is None
        else {"schema": policy.schema, "partition_by": policy.partition_by, "widen": policy.widen}
    )
    return DeltaSink(
        config.sink_path,
        config.name,
        staging_path=config.staging_path,
        read_only=read_only,
        dead_letter_path=config.dead_letter_path,
        crash_point=crash_point,
        upsert=config.upsert,  # an upsert sink's keyed table is opened as one (mode and key checked)
        changes_path=config.changes_path,
        filtered_path=config.filtered_path,
        **shape,
    )
