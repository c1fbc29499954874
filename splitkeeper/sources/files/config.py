"""``source.kind: files``: the section of the file source (a directory tree, or one file).

Keys: ``path`` (a directory, scanned recursively, or one file; resolved against the pipeline
file's folder; or an object-store prefix or object, :data:`OBJECT_SCHEMES`), ``format``
(:class:`FileFormat`), ``split_bytes`` (0 = one split per file, else byte ranges of about that
size), ``on_file_change`` (a known file grew, changed or moved: ``fail``, ``new_version`` or
``append``; :class:`~splitkeeper.core.types.SplitChangePolicy`), ``recheck_finished_every``
(epochs between the checks of finished files: a change to a finished file is found at the first
discovery after a restore and then at most this many epochs after it happened; live files are
checked every epoch), ``discovery`` (:class:`Discovery`), ``notifications`` (the event topic of
``discovery: notifications``: :class:`Notifications`).
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_serializer, model_validator

from splitkeeper.config.base import (
    CONN_ID_PATTERN,
    SECONDS,
    Location,
    Section,
    SourceKind,
    SourceSection,
    Text,
    choice,
    is_uri,
    type_name,
    where_of,
)
from splitkeeper.core import defaults
from splitkeeper.core.types import SplitChangePolicy

__all__ = ["OBJECT_SCHEMES", "Discovery", "FileFormat", "FilesSource", "Notifications"]

#: The URI schemes ``source.path`` may have besides a local path (``file://`` is one):
#: the object stores :mod:`splitkeeper.sources.files.fs` reads.
OBJECT_SCHEMES = ("s3", "s3a", "gs", "abfss")


class FileFormat(enum.Enum):
    """How a file's bytes become records.

    ``LINES``: one record per line, the value is the line without its line
    terminator. ``JSONL``: one JSON document per non-blank line; blank lines are
    not records (their bytes count towards the neighbouring record's offsets).
    """

    LINES = "lines"
    JSONL = "jsonl"


class Discovery(enum.Enum):
    """How an epoch that does not recheck finished files lists the source (protocol rule 1.9).

    ``FULL``: every name under ``path`` (no ``stat`` of the finished files present; a file gone
    or moved is seen at once). ``INCREMENTAL``: only the names that sort after the last one
    seen (start-after, as an object store lists; on local disk, folders whose every name sorts
    before it are not listed): for drops whose names grow (timestamps, sequence numbers). A
    name that sorts before it (written late) and a finished file moved away are seen at the
    next full listing, the epochs that recheck finished files (``recheck_finished_every``).
    ``NOTIFICATIONS``: an object store's object-created and object-removed events, read from a
    Kafka topic (``source.notifications``), name what changed; the topic's offsets are checkpointed
    with the splits (:mod:`splitkeeper.sources.files.notify`). A full listing still runs at the
    first discovery without event offsets and every ``recheck_finished_every`` epochs.
    """

    FULL = "full"
    INCREMENTAL = "incremental"
    NOTIFICATIONS = "notifications"


class Notifications(Section):
    """``source.notifications``: the Kafka topic an object store publishes its bucket events to
    (S3 event notification JSON: versitygw ``--event-kafka-url/--event-kafka-topic``; S3 through
    EventBridge or SQS bridged to Kafka). ``bootstrap_servers`` and ``client`` (librdkafka
    settings: SASL, TLS) as the Kafka source's; ``connection``: an Airflow connection of the Kafka
    provider's type whose servers and client settings fill what the file leaves out, as
    ``source.connection`` does for a Kafka source (read inside Airflow only:
    :meth:`splitkeeper.airflow.hooks.SplitkeeperHook.named_connections`); ``connect_timeout_s``
    bounds each broker request."""

    bootstrap_servers: Text | list[Text] | None = Field(
        None, description="'host:port[,host:port...]' or a list of 'host:port'"
    )
    topic: Text = Field(description="the Kafka topic the bucket's object events are published to")
    client: Any = Field(
        default_factory=dict,
        description="a mapping of Kafka client settings (librdkafka names) to strings, numbers or booleans",
        json_schema_extra={
            "type": "object",
            "additionalProperties": {"type": ["string", "number", "boolean"]},
        },
    )
    connect_timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False, description=SECONDS)
    connection: Text | None = Field(
        None,
        pattern=CONN_ID_PATTERN,
        description="an Airflow connection id of the Kafka provider's type, e.g. 'kafka_events': inside "
        "Airflow its bootstrap servers and client settings (SASL) fill the ones this section leaves out",
    )

    @model_validator(mode="after")
    def _checked(self, info: ValidationInfo) -> Notifications:
        """The servers joined, the client settings checked as ``source.client``'s (ConfigError naming
        the ``source.notifications`` key)."""
        from splitkeeper.sources.kafka.config import ClientConfig, _bootstrap_servers, _client_settings

        if isinstance(self.client, ClientConfig):
            return self
        at = where_of(info)
        servers = _bootstrap_servers(
            self.bootstrap_servers,
            at,
            self.connection,
            key="source.notifications.bootstrap_servers",
            connection_key="source.notifications.connection",
        )
        if not isinstance(self.client, dict):
            raise at.invalid(
                "source.notifications.client",
                "<not shown>",
                Notifications.model_fields["client"].description or "",
                f"got {type_name(self.client)}",
            )
        client = ClientConfig(_client_settings(self.client, at, "source.notifications.client"))
        return self.model_copy(update={"bootstrap_servers": servers, "client": client})

    @field_serializer("client")
    def _shown(self, client: Any) -> Any:
        return client.redacted() if hasattr(client, "redacted") else "<not shown>"

    @property
    def servers(self) -> str:
        return str(self.bootstrap_servers)

    @property
    def client_settings(self) -> dict[str, str]:
        """The client settings, checked (the real values: for the Kafka client only)."""
        as_dict = getattr(self.client, "as_dict", None)
        return as_dict() if as_dict is not None else {}


class FilesSource(SourceSection):
    """``source`` with ``kind: files``: files in a directory tree (or one file), read line by line."""

    kind: Literal[SourceKind.FILES]
    path: Text = Field(description="the directory (or file) to ingest")
    format: FileFormat = choice(FileFormat, FileFormat.LINES)
    split_bytes: int = Field(0, ge=0, description="an integer >= 0 (0: one split per file)")
    on_file_change: SplitChangePolicy = choice(SplitChangePolicy, defaults.ON_FILE_CHANGE)
    recheck_finished_every: int = Field(
        defaults.RECHECK_FINISHED_EVERY,
        ge=1,
        description="an integer >= 1 (epochs between checks of finished files; 1: every epoch)",
    )
    discovery: Discovery = choice(Discovery, Discovery.FULL)
    notifications: Notifications | None = None

    @model_validator(mode="after")
    def _resolved(self, info: ValidationInfo) -> FilesSource:
        """The path resolved against the pipeline file's folder (a URI as given); a URI of a scheme
        the source cannot read, or without a bucket, is refused; ``discovery: notifications`` needs
        ``notifications`` and an object store, and ``notifications`` needs that discovery."""
        where = where_of(info)
        notified = self.discovery is Discovery.NOTIFICATIONS
        if notified and self.notifications is None:
            raise where.missing(
                "source.notifications",
                "the Kafka topic of the bucket's events, {bootstrap_servers: host:port, topic: <name>}, "
                "required when source.discovery is notifications",
            )
        if self.notifications is not None and not notified:
            raise where.invalid(
                "source.discovery",
                self.discovery.value,
                "notifications when source.notifications is set",
                "set source.discovery: notifications, or remove source.notifications",
            )
        if notified and not (is_uri(self.path) and not self.path.lower().startswith("file:")):
            raise where.invalid(
                "source.path",
                self.path,
                "an object-store URI "
                + ", ".join(f"{s}://<bucket>/<prefix>" for s in OBJECT_SCHEMES)
                + " when source.discovery is notifications (the events are a bucket's)",
                "list a local folder with source.discovery full or incremental",
            )
        if is_uri(self.path) and not self.path.lower().startswith("file:"):
            scheme, _, rest = self.path.partition("://")
            if scheme.lower() not in OBJECT_SCHEMES or not rest.split("/", 1)[0]:
                raise where.invalid(
                    "source.path",
                    self.path,
                    "a local path, or an object-store URI "
                    + ", ".join(f"{s}://<bucket>/<prefix>" for s in OBJECT_SCHEMES),
                    "write the folder of the files as one of these (e.g. s3://drops/in)",
                )
        resolved = where.path(self.path)
        return self if resolved == self.path else self.model_copy(update={"path": resolved})

    @property
    def split_change_policy(self) -> SplitChangePolicy:
        return self.on_file_change

    @property
    def recheck_finished_epochs(self) -> int:
        return self.recheck_finished_every

    def locations(self) -> list[Location]:
        return [Location("source.path", self.path, "the pipeline would read what it writes there as input")]
