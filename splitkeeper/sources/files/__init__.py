"""The ``files`` source kind: its section (:mod:`.config`), its connector and reader (:mod:`.source`).

Importing this package imports neither: the factory names them (:mod:`splitkeeper.kinds`).
"""

from splitkeeper.kinds import SourceFactory

FACTORY = SourceFactory(
    name="files",
    section="splitkeeper.sources.files.config:FilesSource",
    connector="splitkeeper.sources.files.source:connector",
)
