"""``SplitkeeperNewDataTrigger``: wakes a pipeline's ingest when its source has something new.

An Airflow 3 event trigger (``BaseEventTrigger``): an ``AssetWatcher`` runs it in the triggerer,
and every event it yields is an asset event that schedules the DAGs watching the asset.
:func:`splitkeeper.airflow.splitkeeper_dags` wires it for a pipeline file with
``airflow.schedule: on_new_data``; it works the same under a deferrable task.

Every ``poll_interval`` seconds it asks :func:`splitkeeper.app.services.pending_work`, in a
thread: the pipeline's latest checkpoint restored read-only, then the driver's own discovery
(the file listing; Kafka's end offsets) against it. No Spark, no lease, nothing written, no
record read. It fires once for what it found, and again only when something else is pending
(another split, or the same split after a checkpoint moved on), so a slow ingest is not queued
twice for the same data. A failed look (the object store or the broker unreachable) is logged
and the next one is tried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

try:
    from airflow.triggers.base import BaseEventTrigger, TriggerEvent
except ImportError:  # pragma: no cover - Airflow before 3.0 has no event-driven scheduling
    from airflow.triggers.base import BaseTrigger as BaseEventTrigger  # type: ignore[assignment]
    from airflow.triggers.base import TriggerEvent

log = logging.getLogger("splitkeeper.airflow")

#: How often a trigger looks at the source when none is given (``airflow.poll_interval_s``).
POLL_INTERVAL_S = 60.0


def look(pipeline_config: str) -> dict[str, Any]:
    """One look at the pipeline's source: what a run started now would read (no Spark).

    The pipeline file is read through :class:`~splitkeeper.airflow.hooks.SplitkeeperHook` (its
    connections filled in, the store connections' variables applied). Returns the event payload:
    pipeline, latest checkpoint id, the pending split ids (at most 20 named) and their count,
    and whether the state itself asks for a checkpoint.
    """
    from splitkeeper.airflow.hooks import SplitkeeperHook
    from splitkeeper.app import services

    config = SplitkeeperHook(pipeline_config).open()
    work = services.pending_work(config)
    return {
        "pipeline": config.name,
        "pipeline_config": pipeline_config,
        "checkpoint_id": work.checkpoint_id,
        "pending": work.any,
        "unsettled": work.unsettled,
        "splits": list(work.splits[:20]),
        "split_count": len(work.splits),
    }


class SplitkeeperNewDataTrigger(BaseEventTrigger):
    """Fires when the pipeline's source has something a run would read.

    :param pipeline_config: the pipeline file (as the operators take it)
    :param poll_interval: seconds between two looks at the source (``airflow.poll_interval_s``)
    """

    def __init__(self, pipeline_config: str, poll_interval: float = POLL_INTERVAL_S) -> None:
        super().__init__()
        self.pipeline_config = pipeline_config
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"pipeline_config": self.pipeline_config, "poll_interval": self.poll_interval},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        fired: tuple[Any, ...] | None = None
        while True:
            try:
                found = await asyncio.to_thread(look, self.pipeline_config)
            except Exception as err:  # noqa: BLE001 - a failed look is retried at the next interval
                log.warning("splitkeeper: looking at %s for new data failed: %s", self.pipeline_config, err)
                found = None
            if found is not None:
                if not found["pending"]:
                    fired = None
                else:
                    key = (found["checkpoint_id"], found["unsettled"], found["split_count"], *found["splits"])
                    if key != fired:
                        fired = key
                        log.info(
                            "splitkeeper: pipeline %s has new data (%d split(s)): firing",
                            found["pipeline"],
                            found["split_count"],
                        )
                        yield TriggerEvent(found)
            await asyncio.sleep(self.poll_interval)
