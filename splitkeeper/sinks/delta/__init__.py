"""The ``delta`` sink kind (the default): its section (:mod:`.config`), its sink behind the port of
:mod:`splitkeeper.sinks.port` (commit, rewind, upkeep, reads, side tables: the modules of this
package) and its reader.

Importing this package imports none of them: the factory names them (:mod:`splitkeeper.kinds`).
"""

from splitkeeper.kinds import SinkFactory

FACTORY = SinkFactory(
    name="delta",
    section="splitkeeper.sinks.delta.config:DeltaSink",
    sink="splitkeeper.sinks.delta.sink:open_sink",
    reader="splitkeeper.sinks.delta.read:open_reader",
)
