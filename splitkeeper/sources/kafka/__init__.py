"""The ``kafka`` source kind: its section (:mod:`.config`), its connector and reader (:mod:`.source`),
what an Airflow connection gives it (:func:`.config.connection_settings`).

Importing this package imports none of them: the factory names them (:mod:`splitkeeper.kinds`).
"""

from splitkeeper.kinds import SourceFactory

FACTORY = SourceFactory(
    name="kafka",
    section="splitkeeper.sources.kafka.config:KafkaSource",
    connector="splitkeeper.sources.kafka.source:connector",
    connection="splitkeeper.sources.kafka.config:connection_settings",
)
