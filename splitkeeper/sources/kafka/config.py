"""``source.kind: kafka``: the section of the Kafka source.

Keys: ``bootstrap_servers`` (comma-separated host:port, or a list), ``topics`` or ``topic_pattern``
(exactly one), ``starting`` (``earliest``, ``latest``, ``timestamp:<ms>`` or ``group``: the consumer
group's committed offsets), ``group_id`` (required for ``starting: group``),
``on_offset_out_of_range``, ``connect_timeout_s`` (how long a Kafka request may wait for the broker)
and ``read_timeout_s`` (how long a reader may make no progress; None: the connector's defaults),
``metadata_interval_s`` (how long discovery reuses the topics, partitions and topic ids it asked
for; 0, the default: it asks every epoch),
``client``: librdkafka settings for every client (SASL/SSL; :class:`ClientConfig`), and
``connection``: an Airflow connection whose servers and client settings fill what the file leaves
out (:func:`connection_settings`).

Validated, the section holds the servers joined (``"a:1,b:2"``), the topics as a tuple and the
client settings as a :class:`ClientConfig` (secrets never in its ``repr``, in a dump or an error).
"""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_serializer, model_validator

from splitkeeper.config.base import (
    CONN_ID_PATTERN,
    SECONDS,
    SourceKind,
    SourceSection,
    Text,
    Where,
    choice,
    did_you_mean,
    type_name,
    where_of,
)
from splitkeeper.errors import REDACTED, is_secret_key

__all__ = [
    "KAFKA_MANAGED_CLIENT_KEYS",
    "ClientConfig",
    "KafkaSource",
    "OffsetOutOfRange",
    "StartingMode",
    "connection_settings",
]

STARTING_PATTERN = r"^(earliest|latest|group|timestamp:[0-9]+)$"
_HOST_PORT_RE = re.compile(r"^[^\s:,]+:\d{1,5}$")


class OffsetOutOfRange(enum.Enum):
    """What a Kafka reader does when a planned offset was deleted by retention."""

    FAIL = "fail"
    SKIP = "skip"


class StartingMode(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    TIMESTAMP = "timestamp"
    GROUP = "group"


#: librdkafka settings splitkeeper sets itself (from other keys, or always: its readers read
#: committed records only); ``source.client`` may not set them, in any spelling of their case.
KAFKA_MANAGED_CLIENT_KEYS = frozenset(
    {
        "bootstrap.servers",
        "group.id",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "isolation.level",
        "auto.offset.reset",
        "enable.partition.eof",
        "logger",
    }
)
#: Where librdkafka lists its settings (the version splitkeeper's client library bundles is in the message).
LIBRDKAFKA_SETTINGS_URL = "https://github.com/confluentinc/librdkafka/blob/v{version}/CONFIGURATION.md"


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Settings passed as they are to every Kafka client of a pipeline (``source.client``).

    librdkafka names (``security.protocol``, ``sasl.mechanism``, ``sasl.username``,
    ``sasl.password``, ``ssl.ca.location`` ...), values as strings. Secret values never
    appear in its ``repr``, in the config's dump or in errors.
    """

    items: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, str]:
        """The real values, for the Kafka clients only."""
        return dict(self.items)

    def redacted(self) -> dict[str, str]:
        return {k: REDACTED if is_secret_key(k) else v for k, v in self.items}

    def __repr__(self) -> str:
        return f"ClientConfig({self.redacted()!r})"

    def __bool__(self) -> bool:
        return bool(self.items)


class KafkaSource(SourceSection):
    """``source`` with ``kind: kafka``: Kafka topics, one split per partition."""

    kind: Literal[SourceKind.KAFKA]
    bootstrap_servers: Text | list[Text] | None = Field(
        None, description="'host:port[,host:port...]' or a list of 'host:port'"
    )
    topics: tuple[Text, ...] = Field((), strict=False, description="a list of non-empty strings")
    topic_pattern: Text | None = Field(None, description="a regular expression over topic names")
    starting: Text = Field(
        "earliest",
        pattern=STARTING_PATTERN,
        description="'earliest', 'latest', 'timestamp:<epoch ms>' or 'group'",
    )
    group_id: Text | None = Field(None, description="a consumer group id")
    on_offset_out_of_range: OffsetOutOfRange = choice(OffsetOutOfRange, OffsetOutOfRange.FAIL)
    connect_timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False, description=SECONDS)
    read_timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False, description=SECONDS)
    metadata_interval_s: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds >= 0 between discovery's metadata and topic-id requests (0: every epoch)",
    )
    client: Any = Field(
        default_factory=dict,
        description="a mapping of Kafka client settings (librdkafka names) to strings, numbers or booleans",
        json_schema_extra={
            "type": "object",
            "additionalProperties": {"type": ["string", "number", "boolean"]},
        },
    )
    connection: Text | None = Field(
        None,
        pattern=CONN_ID_PATTERN,
        description="an Airflow connection id of the Kafka provider's type, e.g. 'kafka_default': inside "
        "Airflow its bootstrap servers and client settings (SASL) fill the ones this file leaves out",
    )

    def store_connections(self) -> tuple[str, ...]:
        """None: ``source.connection`` is the brokers' (a ``kafka`` connection), not a store's."""
        return ()

    @model_validator(mode="after")
    def _checked(self, info: ValidationInfo) -> KafkaSource:
        """The rules across the keys; the servers joined, the topics a tuple, the client settings
        checked (ConfigError naming the key)."""
        if isinstance(self.client, ClientConfig):
            return self  # validated already (a copy)
        at = where_of(info)
        servers = _bootstrap_servers(self.bootstrap_servers, at, self.connection)
        topics = tuple(self.topics)
        pattern = self.topic_pattern
        one_of = "exactly one of source.topics (a list of topic names) or source.topic_pattern (a regex)"
        if not topics and not pattern:
            raise at.missing("source.topics", one_of)
        if topics and pattern:
            raise at.invalid("source.topics", {"topics": list(topics), "topic_pattern": pattern}, one_of)
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as err:
                raise at.invalid(
                    "source.topic_pattern", pattern, "a valid regular expression", str(err)
                ) from err
        if self.starting == "group" and not self.group_id:
            raise at.missing(
                "source.group_id", "a consumer group id, required when source.starting is 'group'"
            )
        if not isinstance(self.client, Mapping):
            allowed = KafkaSource.model_fields["client"].description or ""
            raise at.invalid("source.client", "<not shown>", allowed, f"got {type_name(self.client)}")
        client = ClientConfig(_client_settings(self.client, at))
        return self.model_copy(update={"bootstrap_servers": servers, "topics": topics, "client": client})

    @field_serializer("client")
    def _shown(self, client: Any) -> Any:
        return client.redacted() if isinstance(client, ClientConfig) else "<not shown>"

    @property
    def servers(self) -> str:
        """The bootstrap servers, joined (``host:port,host:port``)."""
        return str(self.bootstrap_servers)

    @property
    def client_config(self) -> ClientConfig:
        """The client settings, checked."""
        client = self.client
        return client if isinstance(client, ClientConfig) else ClientConfig()

    @property
    def starting_mode(self) -> StartingMode:
        return StartingMode(self.starting.split(":", 1)[0])

    @property
    def starting_timestamp_ms(self) -> int | None:
        """The ``<ms>`` of ``starting: timestamp:<ms>``, else ``None``."""
        if self.starting_mode is StartingMode.TIMESTAMP:
            return int(self.starting.split(":", 1)[1])
        return None


_ClientItems = tuple[tuple[str, str], ...]


_MANAGED_HINTS = {
    "bootstrap.servers": "use source.bootstrap_servers / source.group_id instead",
    "group.id": "use source.bootstrap_servers / source.group_id instead",
    "isolation.level": "splitkeeper reads committed records only (read_committed): an aborted "
    "transaction's records are never ingested",
    "auto.offset.reset": "a reader never lets the client skip offsets: source.on_offset_out_of_range "
    "decides what happens to offsets retention removed",
    "enable.partition.eof": "the readers need the partition-end events to end a range",
    "logger": "splitkeeper routes the client's log to its own",
}


def _client_settings(raw: Mapping[str, Any], at: Where, key_name: str = "source.client") -> _ClientItems:
    """``source.client``: a mapping of librdkafka setting -> string, number or boolean; none that
    splitkeeper sets itself (:data:`KAFKA_MANAGED_CLIENT_KEYS`, whatever the case of the name), and,
    where the file's imports are checked, only settings librdkafka knows with values it takes."""
    items: list[tuple[str, str]] = []
    for key, value in raw.items():
        dotted = f"{key_name}.{key}"
        shown = REDACTED if is_secret_key(str(key)) else value
        if not key.strip():
            raise at.invalid(key_name, key, "setting names that are non-empty strings")
        if key.lower() in KAFKA_MANAGED_CLIENT_KEYS:
            raise at.invalid(
                dotted,
                shown,
                "a setting splitkeeper does not set itself",
                _MANAGED_HINTS.get(
                    key.lower(), "splitkeeper commits offsets only when a checkpoint completes"
                ),
            )
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int | float | str) and str(value).strip():
            text = str(value)
        else:
            raise at.invalid(dotted, shown, "a string, number or boolean", f"got {type_name(value)}")
        items.append((key, text))
    if items and at.imports:
        _check_librdkafka(items, at, key_name)
    return tuple(sorted(items))


def _check_librdkafka(items: list[tuple[str, str]], at: Where, key_name: str = "source.client") -> None:
    """librdkafka's own check of the settings, without connecting: a consumer configured with them
    (and no bootstrap servers) is created and closed at once. ConfigError names the setting it
    refuses (an unknown name, names being case-sensitive, or a value it does not take) and where
    its settings are listed. What fails once the settings are taken (a CA file or SASL plugin the
    machine loading the file lacks: the scheduler parsing the DAGs is not the worker) is left to the
    client's first use there. Skipped where the Kafka client library is not installed (the run then
    fails on the missing ``kafka`` extra)."""

    try:
        from confluent_kafka import Consumer, KafkaException, libversion
    except ImportError:
        return
    quiet = logging.getLogger("splitkeeper.config.librdkafka")  # the check's own warnings go nowhere
    if not quiet.handlers:
        quiet.propagate = False
        quiet.addHandler(logging.NullHandler())

    def refusal(settings: Mapping[str, str]) -> str | None:
        try:
            Consumer({"group.id": "splitkeeper-config-check", **settings, "logger": quiet}).close()
        except KafkaException as err:
            return str(err.args[0].str() if err.args and hasattr(err.args[0], "str") else err)
        except (TypeError, ValueError) as err:
            return str(err)
        return None

    reason = refusal(dict(items))
    if reason is None or not _SETTING_REFUSED.match(reason):
        return  # the settings parse; what failed is the client's environment (a CA file, a SASL plugin)
    named = re.search(r'property "([^"]+)"|property: "([^"]+)"', reason)
    name = next((g for g in named.groups() if g), "") if named else ""
    key = next((k for k, _ in items if k == name), None)
    where = LIBRDKAFKA_SETTINGS_URL.format(version=libversion()[0])
    listed = f"librdkafka's settings (and the values each takes) are listed at {where}"
    if key is None:  # a message naming no setting of the file: say what librdkafka said
        raise at.invalid(key_name, "<not shown>", listed, f"librdkafka refuses them: {reason}")
    value = dict(items)[key]
    if reason.startswith("No such configuration property"):
        lower = key.lower()
        if lower != key and not (refusal({lower: value}) or "").startswith("No such configuration property"):
            close = f"did you mean {lower!r}?"
        else:
            close = did_you_mean(lower, _COMMON_CLIENT_KEYS)
        hint = "no such librdkafka setting (names are case-sensitive)" + (f"; {close}" if close else "")
        raise at.invalid(f"{key_name}.{key}", REDACTED if is_secret_key(key) else value, listed, hint)
    raise at.invalid(
        f"{key_name}.{key}",
        REDACTED if is_secret_key(key) else value,
        listed,
        "librdkafka refuses it" + ("" if is_secret_key(key) else f": {reason}"),
    )


#: librdkafka's refusals of a setting itself (its name or value), as opposed to a client that cannot
#: start where the file is loaded ("Failed to create consumer: ssl.ca.location failed ...").
_SETTING_REFUSED = re.compile(r"^(No such configuration property|Invalid value|.*for configuration property)")

#: Client settings a pipeline typically sets (for "did you mean" on an unknown one).
_COMMON_CLIENT_KEYS = [
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "sasl.oauthbearer.config",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "client.id",
    "fetch.max.bytes",
    "max.partition.fetch.bytes",
    "socket.keepalive.enable",
    "socket.timeout.ms",
    "session.timeout.ms",
]


def _bootstrap_servers(
    raw: str | list[str] | None,
    at: Where,
    connection: str | None = None,
    key: str = "source.bootstrap_servers",
    connection_key: str = "source.connection",
) -> str:
    allowed = "'host:port[,host:port...]' or a list of 'host:port'"
    if raw is None and connection is not None:
        raise at.missing(
            key,
            f"{allowed}; {connection_key} {connection!r} gives them only inside Airflow "
            f"(splitkeeper.airflow.hooks.SplitkeeperHook); elsewhere set {key}",
        )
    if raw is None:
        raise at.missing(key, allowed)
    items = [s.strip() for s in raw.split(",")] if isinstance(raw, str) else list(raw)
    bad = [s for s in items if not _HOST_PORT_RE.match(s) or not 0 < int(s.rsplit(":", 1)[1]) < 65536]
    if not items or bad:
        raise at.invalid(key, raw, allowed, f"not host:port: {bad}" if bad else "")
    return ",".join(items)


#: librdkafka settings a connection's extra may hold that the pipeline file owns itself.
_FILE_OWNED = ("bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store", "logger")


def connection_settings(hook: Any, conn_id: str) -> dict[str, Any]:
    """What a Kafka connection (the Kafka provider's ``kafka`` type) gives the pipeline's source:
    ``bootstrap_servers`` (the extra's ``bootstrap.servers``, else host:port), ``group_id``
    (``group.id``) and ``client`` (the rest of the extra: SASL, TLS; login and password as the SASL
    user and password). ``hook`` reads the connection
    (:class:`~splitkeeper.airflow.hooks.SplitkeeperHook`)."""
    conn = hook.connection(conn_id)
    extra = dict(conn.extra_dejson or {})
    servers = extra.get("bootstrap.servers") or (
        f"{conn.host}:{conn.port}" if conn.host and conn.port else conn.host
    )
    client = {k: v for k, v in extra.items() if k not in _FILE_OWNED and isinstance(v, str | int | float)}
    if conn.login and "sasl.username" not in client:
        client["sasl.username"] = conn.login
    if conn.password and "sasl.password" not in client:
        client["sasl.password"] = conn.password
    return {"bootstrap_servers": servers, "group_id": extra.get("group.id"), "client": client}
