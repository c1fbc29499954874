"""What the two ingest benchmarks (``bench ingest``, files and ``--source kafka``) build alike.

- :func:`pipeline_config`: our side's pipeline config: regional checkpoints on, identity
  transform, one epoch size for backlog and normal, state and sink under the run's folder;
  only the source and the region timeout differ;
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
    from splitkeeper.config.settings import PipelineConfig


def pipeline_config(
    name: str,
    root: str,
    source: Mapping[str, Any],
    *,
    parallelism: int,
    epoch_records: int,
    region_timeout_s: float,
) -> PipelineConfig:
    """A benchmark pipeline ``name`` reading ``source``, with state and sink under ``root``."""
    from splitkeeper.config.settings import IDENTITY_TRANSFORM, config_from_mapping

    return config_from_mapping(
        {
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
