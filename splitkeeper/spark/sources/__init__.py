"""Sources: the connectors of the source contract (:mod:`splitkeeper.core.source`), and the
contract tests each of them passes (:mod:`.contract`).

``build_source(config.source)`` is the one place that turns a ``source``
config section into a :class:`SourceConnector`.
"""

from __future__ import annotations

import importlib

from splitkeeper.config.settings import SourceConfig, SourceKind
from splitkeeper.core.source import PlannedRange, RecordMeta, RegionReader, SourceConnector, SourceRecord
from splitkeeper.errors import EnvironmentNotReadyError
from splitkeeper.spark.sources.files import FileRegionReader, FileSource

__all__ = [
    "FileRegionReader",
    "FileSource",
    "PlannedRange",
    "RegionReader",
    "SourceConnector",
    "RecordMeta",
    "SourceRecord",
    "build_source",
]

KAFKA_MODULE = "splitkeeper.spark.sources.kafka"


def build_source(source: SourceConfig) -> SourceConnector:
    """Create the driver-side connector for a validated ``source`` section.

    Kafka lives in :data:`KAFKA_MODULE`, which must expose
    ``KafkaSource.from_config(source: SourceConfig)``; it is imported only for
    ``kind: kafka``.
    """
    if source.kind is SourceKind.FILES:
        return FileSource.from_config(source)
    try:
        module = importlib.import_module(KAFKA_MODULE)
    except ModuleNotFoundError as err:
        if err.name and KAFKA_MODULE.startswith(err.name):
            raise EnvironmentNotReadyError(
                f"source.kind 'kafka' needs {KAFKA_MODULE}, which is not in this build", module=KAFKA_MODULE
            ) from err
        raise
    connector: SourceConnector = module.KafkaSource.from_config(source)
    return connector
