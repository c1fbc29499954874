"""The ``iceberg`` sink kind: an Apache Iceberg table written through pyiceberg, its catalog an
embedded SQL catalog on SQLite (the default) or one the config names (REST, Hive, Glue, ...).

Its section (:mod:`.config`), its catalog (:mod:`.catalog`), its sink behind the port of
:mod:`splitkeeper.sinks.port` (:mod:`.sink`: the fenced commit, the rewind) and its reader
(:mod:`.read`). The pipeline's state stays in Delta (``state.path``).

Importing this package imports none of them: the factory names them (:mod:`splitkeeper.kinds`).
"""

from splitkeeper.kinds import SinkFactory

FACTORY = SinkFactory(
    name="iceberg",
    section="splitkeeper.sinks.iceberg.config:IcebergSink",
    sink="splitkeeper.sinks.iceberg.sink:open_sink",
    reader="splitkeeper.sinks.iceberg.read:open_reader",
)
