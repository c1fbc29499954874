"""Pipeline configuration: the one file an operator writes to describe a pipeline.

:func:`load_config` reads a YAML (``.yaml``/``.yml``) or TOML (``.toml``) file
and returns an immutable :class:`PipelineConfig`; :func:`config_from_mapping`
does the same for an already-parsed mapping (Airflow ``dag_run.conf``, tests).
Everything is validated here, at the boundary, before any Spark job starts
(protocol rule 2.9: a configuration that cannot be honoured is rejected at
submission). Each mistake raises :class:`~splitkeeper.errors.ConfigError`
whose message names the dotted key, the value and what is allowed; unknown
keys are mistakes too and the message suggests the closest known key.
Relative paths resolve against the directory of the config file. The
``checkpoint`` and ``backlog`` sections are the protocol core's own config
classes (the core decides what values are valid; this module names the key).

Shape of a file (YAML)::

    name: orders
    parallelism: 4
    regions: per_reader          # or: global
    strategy: least-loaded
    source:
      kind: files                # or: kafka
      path: ./incoming
      format: jsonl
      split_bytes: 67108864
    checkpoint: {max_consecutive_failures: 3, max_failure_ratio: 0.5,
                 region_timeout_s: 300, retain_checkpoints: 3,
                 on_split_failure: stall, quarantine_after: 3}   # or: quarantine
    backlog: {backlog_epoch_records: 200000, normal_epoch_records: 20000,
              backlog_interval_s: 60, normal_interval_s: 5}
    rescale: {operator_state: even-split}   # or union (protocol rule 2.8)
    weighted: {capacities: {0: 4}, rebalance_threshold: 1.25}   # strategy: weighted only
    notifications: {on_failure: mypkg.alerts:page_oncall}   # called by a failed Airflow task
    lease: {ttl_s: 60}   # one writer per pipeline; a dead writer's lease is taken over after this
    maintenance: {history_hours: 168}   # splitkeeper maintain: VACUUM keeps a week of history
    metrics: {otlp_endpoint: http://otel-collector:4318}   # optional; <state>/metrics.prom always
    state: {path: ./state}
    sink: {path: ./sink}
    staging: {path: ./state/_staging}   # default <state>/_staging
    transform: splitkeeper.runtime.transforms:identity

``${NAME}`` inside any string value is replaced by the environment variable ``NAME``
(e.g. ``bootstrap_servers: ${SPLITKEEPER_KAFKA_BOOTSTRAP_SERVERS}``, what the local
cluster's env file exports); an unset variable is a mistake naming the key; ``$${``
stands for a literal ``${``. Values from the environment are never shown in messages.

This module imports the standard library and the protocol core (PyYAML lazily,
for YAML files).
"""

from __future__ import annotations

import difflib
import enum
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from splitkeeper.core.assignment import STRATEGIES, validate_parallelism
from splitkeeper.core.backlog import BacklogConfig
from splitkeeper.core.checkpoint import CheckpointConfig
from splitkeeper.core.rescale import Redistribution
from splitkeeper.core.types import SplitFailurePolicy
from splitkeeper.errors import ConfigError, InvalidParameterError
from splitkeeper.runtime.transforms import resolve_callable, resolve_transform

#: The assignment strategies of the protocol core (protocol rule 1.6), by config name.
STRATEGY_NAMES: tuple[str, ...] = tuple(sorted(STRATEGIES))

IDENTITY_TRANSFORM = "splitkeeper.runtime.transforms:identity"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_HOST_PORT_RE = re.compile(r"^[^\s:,]+:\d{1,5}$")
_TRANSFORM_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_ENV_REF_RE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class SourceKind(enum.Enum):
    FILES = "files"
    KAFKA = "kafka"


class FileFormat(enum.Enum):
    """How a file's bytes become records.

    ``LINES``: one record per line, the value is the line without its line
    terminator. ``JSONL``: one JSON document per non-blank line; blank lines are
    not records (their bytes count towards the neighbouring record's offsets).
    """

    LINES = "lines"
    JSONL = "jsonl"


class RegionMode(enum.Enum):
    """Whether readers form independent regions (protocol rule 2.9).

    ``PER_READER``: each reader and what follows it without a shuffle is a
    region; regional checkpoints are allowed. ``GLOBAL``: readers are not
    independent (a shuffle between them), so every checkpoint is global.
    """

    PER_READER = "per_reader"
    GLOBAL = "global"


class OffsetOutOfRange(enum.Enum):
    """What a Kafka reader does when a planned offset was deleted by retention."""

    FAIL = "fail"
    SKIP = "skip"


class OperatorState(enum.Enum):
    """How list-style operator state is redistributed when the parallelism changes (protocol rule 2.8)."""

    EVEN_SPLIT = "even-split"
    UNION = "union"

    @property
    def redistribution(self) -> Redistribution:
        return Redistribution.UNION if self is OperatorState.UNION else Redistribution.EVEN_SPLIT


class StartingMode(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    TIMESTAMP = "timestamp"
    GROUP = "group"


#: librdkafka settings splitkeeper sets itself (from other keys); ``source.client`` may not set them.
KAFKA_MANAGED_CLIENT_KEYS = frozenset(
    {"bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store", "logger"}
)
_SECRET_WORDS = ("password", "secret", "token", "jaas", "credential", "private", ".pem", "key.pem")
REDACTED = "***"


def is_secret_key(key: str) -> bool:
    """Whether a client setting holds a secret (its value is never printed, logged or returned)."""
    lowered = key.lower()
    return any(word in lowered for word in _SECRET_WORDS)


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Settings passed as they are to every Kafka client of a pipeline (``source.client``).

    librdkafka names (``security.protocol``, ``sasl.mechanism``, ``sasl.username``,
    ``sasl.password``, ``ssl.ca.location`` ...), values as strings. Secret values never
    appear in its ``repr``, in :meth:`PipelineConfig.to_dict` or in errors.
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


@dataclass(frozen=True, slots=True)
class SourceConfig:
    """The ``source`` section. Options of the other kind keep their defaults.

    files: ``path`` (a directory, scanned recursively, or one file), ``format``,
    ``split_bytes`` (0 = one split per file, else byte ranges of about that
    size). kafka: ``bootstrap_servers`` (comma-separated host:port), ``topics``
    or ``topic_pattern`` (exactly one), ``starting`` (``earliest``, ``latest``,
    ``timestamp:<ms>`` or ``group``: the consumer group's committed offsets),
    ``group_id`` (required for ``starting: group``), ``on_offset_out_of_range``,
    ``connect_timeout_s`` (how long a Kafka request may wait for the broker) and
    ``read_timeout_s`` (how long a reader may make no progress); None: the connector's defaults;
    ``client``: librdkafka settings for every client (SASL/SSL), see :class:`ClientConfig`.
    """

    kind: SourceKind
    path: str | None = None
    format: FileFormat = FileFormat.LINES
    split_bytes: int = 0
    bootstrap_servers: str | None = None
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    starting: str = "earliest"
    group_id: str | None = None
    on_offset_out_of_range: OffsetOutOfRange = OffsetOutOfRange.FAIL
    connect_timeout_s: float | None = None
    read_timeout_s: float | None = None
    client: ClientConfig = field(default_factory=ClientConfig)

    @property
    def starting_mode(self) -> StartingMode:
        return StartingMode(self.starting.split(":", 1)[0])

    @property
    def starting_timestamp_ms(self) -> int | None:
        """The ``<ms>`` of ``starting: timestamp:<ms>``, else ``None``."""
        if self.starting_mode is StartingMode.TIMESTAMP:
            return int(self.starting.split(":", 1)[1])
        return None


@dataclass(frozen=True, slots=True)
class CheckpointSettings(CheckpointConfig):
    """The ``checkpoint`` section: the core :class:`CheckpointConfig` plus retention.

    It *is* a core ``CheckpointConfig`` (the core validates the shared fields
    and the coordinator takes it as is); ``regions_independent`` comes from the
    top-level ``regions`` key. ``retain_checkpoints``: completed checkpoints kept
    besides those a later checkpoint still references (protocol rule 2.7).
    ``on_split_failure``: ``stall`` (a split whose reads keep failing blocks the
    pipeline until fixed) or ``quarantine`` (after ``quarantine_after`` failed epochs
    in a row it is parked and the rest goes on; protocol rule 1.8).
    """

    retain_checkpoints: int = 3
    on_split_failure: SplitFailurePolicy = SplitFailurePolicy.STALL
    quarantine_after: int = 3

    def __post_init__(self) -> None:
        CheckpointConfig.__post_init__(self)
        value = self.retain_checkpoints
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidParameterError("retain_checkpoints", value, "an integer >= 1")
        after = self.quarantine_after
        if isinstance(after, bool) or not isinstance(after, int) or after < 1:
            raise InvalidParameterError("quarantine_after", after, "an integer >= 1 (failed epochs in a row)")


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """One pipeline, validated. Paths are absolute (or URIs, kept as given)."""

    name: str
    source: SourceConfig
    state_path: str
    sink_path: str
    staging_path: str
    parallelism: int = 1
    regions: RegionMode = RegionMode.PER_READER
    strategy: str = "least-loaded"
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    backlog: BacklogConfig = field(default_factory=BacklogConfig)
    transform: str = IDENTITY_TRANSFORM
    operator_state: OperatorState = OperatorState.EVEN_SPLIT  # rescale.operator_state
    capacities: tuple[tuple[int, float], ...] = ()  # weighted.capacities: reader -> capacity
    rebalance_threshold: float = 1.25  # weighted.rebalance_threshold
    on_failure: str | None = None  # notifications.on_failure: 'module:function' an Airflow task calls
    lease_ttl_s: float = 60.0  # lease.ttl_s: a writer that stops heartbeating loses the lease after this
    history_hours: float = 168.0  # maintenance.history_hours: how far back time travel reaches after VACUUM
    otlp_endpoint: str | None = None  # metrics.otlp_endpoint: OTLP/HTTP collector (None: the text file only)
    origin: str = ""  # the file it was loaded from (for messages), "" if built from a mapping

    @property
    def regional_checkpoints(self) -> bool:
        """False when regions are not independent: every checkpoint must then be global."""
        return self.regions is RegionMode.PER_READER

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (enums as their values), e.g. for status output or XCom."""
        return _plain(self)


def _plain(value: Any) -> Any:
    if isinstance(value, ClientConfig):
        return value.redacted()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    return value


# --------------------------------------------------------------------------- loading


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> PipelineConfig:
    """Read and validate a pipeline config file (``.yaml``, ``.yml`` or ``.toml``).

    Relative paths inside the file resolve against the file's directory; ``${NAME}``
    references take their values from ``env`` (default: this process's environment).
    Raises :class:`ConfigError` for a missing/unreadable file, a syntax error
    or any invalid value.
    """
    file = Path(path).expanduser().resolve()
    suffix = file.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise ConfigError(
            f"config file {str(file)!r} has extension {suffix or '(none)'!r}: "
            "allowed are .yaml, .yml (YAML) and .toml (TOML)",
            key="",
            value=str(file),
        )
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise ConfigError(f"config file {str(file)!r} does not exist", key="", value=str(file)) from err
    except OSError as err:
        raise ConfigError(
            f"config file {str(file)!r} cannot be read: {err}", key="", value=str(file)
        ) from err
    if suffix == ".toml":
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{file}: not valid TOML: {err}", key="", value=str(file)) from err
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"{file}: not valid YAML: {err}", key="", value=str(file)) from err
    return config_from_mapping(data, base_dir=file.parent, origin=str(file), env=env)


def expand_env(data: Any, env: Mapping[str, str] | None = None, origin: str = "pipeline config") -> Any:
    """``data`` with every ``${NAME}`` in its string values replaced by ``env[NAME]`` (default:
    ``os.environ``) and every ``$${`` by ``${``. ConfigError names the key of an unset variable."""
    environ = os.environ if env is None else env

    def walk(value: Any, key: str) -> Any:
        if isinstance(value, str):

            def sub(match: re.Match[str]) -> str:
                name = match.group(1)
                if name is None:
                    return "${"
                if name not in environ:
                    raise ConfigError(
                        f"{origin}: {key or '(top level)'} refers to ${{{name}}}, but the environment "
                        f"variable {name} is not set; set it, or write the value itself",
                        key=key,
                        value=f"${{{name}}}",
                    )
                return environ[name]

            return _ENV_REF_RE.sub(sub, value)
        if isinstance(value, Mapping):
            return {k: walk(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, f"{key}[{i}]") for i, v in enumerate(value)]
        return value

    return walk(data, "")


def config_from_mapping(
    data: Any,
    base_dir: str | os.PathLike[str] | None = None,
    origin: str = "",
    env: Mapping[str, str] | None = None,
) -> PipelineConfig:
    """Validate an already-parsed config mapping (same rules as :func:`load_config`).

    ``base_dir`` is where relative paths resolve (default: the working directory); ``env``
    gives the values of ``${NAME}`` references (default: this process's environment).
    """
    where = origin or "pipeline config"
    data = expand_env(data, env, where)
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{where}: the top level must be a mapping of keys, got {type(data).__name__}",
            key="",
            value=data,
        )
    base = Path(base_dir if base_dir is not None else os.getcwd()).expanduser().resolve()
    top = _Section(data, "", where, base, _TOP_KEYS)

    name = top.string("name", required=True, allowed="a pipeline name: letters, digits, '_', '.', '-' (1-64)")
    if not _NAME_RE.match(name):
        raise top.invalid(
            "name", name, "letters, digits, '_', '.', '-', starting with a letter or digit (1-64)"
        )

    source = _source(top.section("source", _SOURCE_KEYS, required=True))
    parallelism = top.core(validate_parallelism, top.raw("parallelism", default=1))
    regions = top.choice("regions", RegionMode, RegionMode.PER_READER)
    strategy = top.string("strategy", default="least-loaded", allowed="one of " + ", ".join(STRATEGY_NAMES))
    if strategy not in STRATEGY_NAMES:
        hint = _did_you_mean(strategy, STRATEGY_NAMES)
        raise top.invalid("strategy", strategy, "one of " + ", ".join(STRATEGY_NAMES), hint)

    cp = top.section("checkpoint", _CHECKPOINT_KEYS)
    checkpoint = cp.core(
        CheckpointSettings,
        regions_independent=regions is RegionMode.PER_READER,
        **{
            **cp.values(),
            "on_split_failure": cp.choice("on_split_failure", SplitFailurePolicy, SplitFailurePolicy.STALL),
        },
    )
    bl = top.section("backlog", _BACKLOG_KEYS)
    backlog = bl.core(BacklogConfig, **bl.values())
    operator_state = top.section("rescale", _RESCALE_KEYS).choice(
        "operator_state", OperatorState, OperatorState.EVEN_SPLIT
    )
    capacities, rebalance_threshold = _weighted(top.section("weighted", _WEIGHTED_KEYS), strategy)
    lease_ttl_s = top.section("lease", _LEASE_KEYS).seconds("ttl_s") or 60.0
    maintenance = top.section("maintenance", _MAINTENANCE_KEYS)
    history_hours = maintenance.raw("history_hours", default=168.0)
    if (
        isinstance(history_hours, bool)
        or not isinstance(history_hours, int | float)
        or not history_hours >= 0
    ):
        raise maintenance.invalid(
            "history_hours",
            history_hours,
            "hours >= 0: VACUUM keeps the files removed less than this long ago (time travel reaches back "
            "that far)",
        )
    metrics = top.section("metrics", _METRICS_KEYS)
    otlp_endpoint = metrics.string("otlp_endpoint", default=None, allowed="an http(s):// URL")
    if otlp_endpoint is not None and not re.match(r"^https?://[^\s/]+", otlp_endpoint):
        raise metrics.invalid(
            "otlp_endpoint",
            otlp_endpoint,
            "an http(s):// URL of an OTLP/HTTP collector, e.g. http://localhost:4318",
        )
    notifications = top.section("notifications", _NOTIFICATION_KEYS)
    on_failure = notifications.string("on_failure", default=None, allowed="'module:function'")
    if on_failure is not None:
        if not _TRANSFORM_RE.match(on_failure):
            raise notifications.invalid(
                "on_failure", on_failure, "'module:function', e.g. 'mypkg.alerts:page_oncall'"
            )
        try:
            resolve_callable(on_failure, "notifications.on_failure")
        except ConfigError as err:
            raise ConfigError(f"{err.message} ({where})", **err.params) from err.__cause__

    state_path = top.section("state", _PATH_KEYS, required=True).required_path("path")
    sink_path = top.section("sink", _PATH_KEYS, required=True).required_path("path")
    staging = top.section("staging", _PATH_KEYS)
    staging_path = staging.path("path")
    if staging_path is None:
        if _URI_RE.match(state_path):
            # region tasks write their staged files with local file I/O: an object store won't do
            raise staging.missing(
                "path",
                f"a local directory the driver and every executor share (state.path {state_path} is on "
                "an object store, so the default <state>/_staging cannot be used)",
            )
        staging_path = _join(state_path, "_staging")
    elif _URI_RE.match(staging_path):
        raise staging.invalid(
            "path",
            staging_path,
            "a local directory the driver and every executor share (region tasks "
            "write staged files with local file I/O)",
        )
    if _same_location(state_path, sink_path):
        raise top.invalid("sink.path", sink_path, "a location different from state.path")
    for key, inner in (("state.path", state_path), ("staging.path", staging_path)):
        if _inside(inner, sink_path):
            raise top.invalid(
                key, inner, f"a location outside sink.path {sink_path}", "VACUUM on the sink would delete it"
            )

    transform = top.string("transform", default=IDENTITY_TRANSFORM, allowed="'module:function'")
    if not _TRANSFORM_RE.match(transform):
        raise top.invalid("transform", transform, "'module:function', e.g. 'mypkg.transforms:enrich'")
    try:
        resolve_transform(transform)  # fail at submission, not on an executor
    except ConfigError as err:
        raise ConfigError(f"{err.message} ({where})", **err.params) from err.__cause__

    return PipelineConfig(
        name=name,
        source=source,
        state_path=state_path,
        sink_path=sink_path,
        staging_path=staging_path,
        parallelism=parallelism,
        regions=regions,
        strategy=strategy,
        checkpoint=checkpoint,
        backlog=backlog,
        transform=transform,
        operator_state=operator_state,
        capacities=capacities,
        rebalance_threshold=rebalance_threshold,
        on_failure=on_failure,
        lease_ttl_s=lease_ttl_s,
        history_hours=float(history_hours),
        otlp_endpoint=otlp_endpoint,
        origin=origin,
    )


_TOP_KEYS = (
    "name",
    "source",
    "parallelism",
    "regions",
    "strategy",
    "checkpoint",
    "backlog",
    "state",
    "sink",
    "staging",
    "transform",
    "rescale",
    "weighted",
    "notifications",
    "lease",
    "maintenance",
    "metrics",
)
_METRICS_KEYS = ("otlp_endpoint",)
_NOTIFICATION_KEYS = ("on_failure",)
_LEASE_KEYS = ("ttl_s",)
_MAINTENANCE_KEYS = ("history_hours",)
_RESCALE_KEYS = ("operator_state",)
_WEIGHTED_KEYS = ("capacities", "rebalance_threshold")


def _weighted(sec: _Section, strategy: str) -> tuple[tuple[tuple[int, float], ...], float]:
    """``weighted``: reader capacities and the imbalance that re-weights (strategy ``weighted`` only)."""
    if sec.given() and strategy != "weighted":
        raise sec.invalid(
            sec.given()[0],
            sec.raw(sec.given()[0]),
            "nothing unless strategy is 'weighted'",
            "set strategy: weighted",
        )
    raw = sec.raw("capacities", default={})
    allowed = "a mapping of reader id (an integer >= 0) to a capacity > 0, e.g. {0: 4, 1: 1}"
    if not isinstance(raw, Mapping):
        raise sec.invalid("capacities", raw, allowed, f"got {_type_name(raw)}")
    capacities: list[tuple[int, float]] = []
    for key, value in raw.items():
        reader = int(key) if isinstance(key, str) and key.isdigit() else key
        if isinstance(reader, bool) or not isinstance(reader, int) or reader < 0:
            raise sec.invalid(f"capacities.{key}", value, allowed, "the key is a reader id")
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise sec.invalid(f"capacities.{key}", value, allowed)
        capacities.append((reader, float(value)))
    threshold = sec.raw("rebalance_threshold", default=1.25)
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not threshold >= 1.0:
        raise sec.invalid(
            "rebalance_threshold",
            threshold,
            "a ratio >= 1.0: the readers' max / min load that makes them rebalance",
        )
    return tuple(sorted(capacities)), float(threshold)


_FILE_KEYS = ("path", "format", "split_bytes")
_KAFKA_KEYS = (
    "bootstrap_servers",
    "topics",
    "topic_pattern",
    "starting",
    "group_id",
    "on_offset_out_of_range",
    "connect_timeout_s",
    "read_timeout_s",
    "client",
)
_SOURCE_KEYS = ("kind", *_FILE_KEYS, *_KAFKA_KEYS)
_CHECKPOINT_KEYS = tuple(f.name for f in fields(CheckpointSettings) if f.name != "regions_independent")
_BACKLOG_KEYS = tuple(f.name for f in fields(BacklogConfig))
_PATH_KEYS = ("path",)


def _source(sec: _Section) -> SourceConfig:
    kind = sec.choice("kind", SourceKind, required=True)
    own, other = (_FILE_KEYS, _KAFKA_KEYS) if kind is SourceKind.FILES else (_KAFKA_KEYS, _FILE_KEYS)
    for key in sec.given():
        if key in other:
            raise sec.invalid(
                key,
                sec.raw(key),
                f"no {key} for source.kind {kind.value!r}; its options are: {', '.join(own)}",
            )
    if kind is SourceKind.FILES:
        return SourceConfig(
            kind=kind,
            path=sec.required_path("path", allowed="the directory (or file) to ingest"),
            format=sec.choice("format", FileFormat, FileFormat.LINES),
            split_bytes=sec.integer("split_bytes", 0, minimum=0),
        )

    servers = _bootstrap_servers(sec)
    topics = sec.string_list("topics")
    pattern = sec.string("topic_pattern", default=None, allowed="a regular expression over topic names")
    one_of = "exactly one of source.topics (a list of topic names) or source.topic_pattern (a regex)"
    if not topics and not pattern:
        raise sec.missing("topics", one_of)
    if topics and pattern:
        raise sec.invalid("topics", {"topics": list(topics), "topic_pattern": pattern}, one_of)
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as err:
            raise sec.invalid("topic_pattern", pattern, "a valid regular expression", str(err)) from err
    allowed_starting = "'earliest', 'latest', 'timestamp:<epoch ms>' or 'group'"
    starting = sec.string("starting", default="earliest", allowed=allowed_starting)
    head, _, tail = starting.partition(":")
    if head not in {m.value for m in StartingMode} or (head == "timestamp") != bool(tail):
        raise sec.invalid("starting", starting, allowed_starting)
    if head == "timestamp" and not tail.isdigit():
        raise sec.invalid("starting", starting, allowed_starting, "the timestamp is in epoch milliseconds")
    group_id = sec.string("group_id", default=None, allowed="a consumer group id")
    if head == "group" and not group_id:
        raise sec.missing("group_id", "a consumer group id, required when source.starting is 'group'")
    return SourceConfig(
        kind=kind,
        bootstrap_servers=servers,
        topics=topics,
        topic_pattern=pattern,
        starting=starting,
        group_id=group_id,
        on_offset_out_of_range=sec.choice("on_offset_out_of_range", OffsetOutOfRange, OffsetOutOfRange.FAIL),
        connect_timeout_s=sec.seconds("connect_timeout_s"),
        read_timeout_s=sec.seconds("read_timeout_s"),
        client=_client_config(sec),
    )


def _client_config(sec: _Section) -> ClientConfig:
    """``source.client``: a mapping of librdkafka setting -> string, number or boolean."""
    raw = sec.raw("client", default={})
    allowed = "a mapping of Kafka client settings (librdkafka names) to strings, numbers or booleans"
    if not isinstance(raw, Mapping):
        raise sec.invalid("client", "<not shown>", allowed, f"got {_type_name(raw)}")
    items: list[tuple[str, str]] = []
    for key, value in raw.items():
        dotted = f"client.{key}"
        shown = REDACTED if is_secret_key(str(key)) else value
        if not isinstance(key, str) or not key.strip():
            raise sec.invalid("client", key, "setting names that are non-empty strings")
        if key in KAFKA_MANAGED_CLIENT_KEYS:
            raise sec.invalid(
                dotted,
                shown,
                "a setting splitkeeper does not set itself",
                "use source.bootstrap_servers / source.group_id instead"
                if key in ("bootstrap.servers", "group.id")
                else "splitkeeper commits offsets only when a checkpoint completes",
            )
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int | float | str) and str(value).strip():
            text = str(value)
        else:
            raise sec.invalid(dotted, shown, "a string, number or boolean", f"got {_type_name(value)}")
        items.append((key, text))
    return ClientConfig(tuple(sorted(items)))


def _bootstrap_servers(sec: _Section) -> str:
    allowed = "'host:port[,host:port...]' or a list of 'host:port'"
    raw = sec.raw("bootstrap_servers", required=True, allowed=allowed)
    if isinstance(raw, str):
        items = [s.strip() for s in raw.split(",")]
    elif isinstance(raw, list) and all(isinstance(s, str) for s in raw):
        items = [s.strip() for s in raw]
    else:
        raise sec.invalid("bootstrap_servers", raw, allowed, f"got {_type_name(raw)}")
    bad = [s for s in items if not _HOST_PORT_RE.match(s) or not 0 < int(s.rsplit(":", 1)[1]) < 65536]
    if not items or bad:
        raise sec.invalid("bootstrap_servers", raw, allowed, f"not host:port: {bad}" if bad else "")
    return ",".join(items)


# --------------------------------------------------------------------------- helpers

_MISSING: Any = object()
_T = TypeVar("_T")


def _type_name(value: Any) -> str:
    names = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "a list"}
    if isinstance(value, Mapping):
        return "a mapping"
    return names.get(type(value), type(value).__name__)


def _did_you_mean(word: str, choices: tuple[str, ...] | list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {prefix + close[0]!r}?" if close else ""


def _join(base: str, child: str) -> str:
    return f"{base.rstrip('/')}/{child}" if _URI_RE.match(base) else str(Path(base) / child)


def _same_location(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def _inside(inner: str, outer: str) -> bool:
    return inner.rstrip("/").startswith(outer.rstrip("/") + "/")


class _Section:
    """A mapping being read under a dotted prefix; unknown keys are rejected on entry."""

    def __init__(self, data: Mapping[str, Any], prefix: str, where: str, base: Path, known: tuple[str, ...]):
        self.data = data
        self.prefix = prefix
        self.where = where
        self.base = base
        for key in data:
            if not isinstance(key, str) or key not in known:
                value = data[key]
                hint = _did_you_mean(str(key), known, prefix=prefix)
                section = f"under {prefix.rstrip('.')}" if prefix else "at the top level"
                message = (
                    f"unknown key {prefix}{key}={value!r} ({where}): allowed keys {section} are "
                    f"{', '.join(known)}"
                )
                if hint:
                    message += f"; {hint}"
                raise ConfigError(message, key=f"{prefix}{key}", value=value, allowed=known)

    def given(self) -> list[str]:
        """The keys present in this section."""
        return list(self.data)

    def invalid(self, key: str, value: Any, allowed: str, hint: str = "") -> ConfigError:
        dotted = key if "." in key and not self.prefix else f"{self.prefix}{key}"
        message = f"{dotted}={value!r} is not allowed: {allowed}"
        if hint:
            message += f"; {hint}"
        return ConfigError(f"{message} ({self.where})", key=dotted, value=value, allowed=allowed)

    def raw(self, key: str, required: bool = False, allowed: str = "", default: Any = _MISSING) -> Any:
        """The value given for ``key`` (``None`` counts as not given), else ``default``."""
        value = self.data.get(key, _MISSING)
        if value is None:
            value = _MISSING
        if value is _MISSING and not required:
            return default
        if value is _MISSING:
            raise self.missing(key, allowed)
        return value

    def missing(self, key: str, allowed: str) -> ConfigError:
        dotted = f"{self.prefix}{key}"
        return ConfigError(
            f"{dotted} is required but missing ({self.where}): {allowed or 'set it'}",
            key=dotted,
            value=None,
            allowed=allowed,
        )

    def section(self, key: str, known: tuple[str, ...], required: bool = False) -> _Section:
        value = self.raw(key, required=required, allowed=f"a mapping with keys {', '.join(known)}")
        if value is _MISSING:
            value = {}
        if not isinstance(value, Mapping):
            raise self.invalid(
                key, value, f"a mapping with keys {', '.join(known)}", f"got {_type_name(value)}"
            )
        return _Section(value, f"{self.prefix}{key}.", self.where, self.base, known)

    def string(
        self, key: str, default: Any = _MISSING, required: bool = False, allowed: str = "a string"
    ) -> Any:
        value = self.raw(key, required=required, allowed=allowed)
        if value is _MISSING:
            return default
        if not isinstance(value, str) or not value.strip():
            raise self.invalid(
                key, value, allowed, f"got {_type_name(value)}" if not isinstance(value, str) else ""
            )
        return value.strip()

    def string_list(self, key: str) -> tuple[str, ...]:
        value = self.raw(key)
        if value is _MISSING:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise self.invalid(key, value, "a list of non-empty strings", f"got {_type_name(value)}")
        return tuple(v.strip() for v in value)

    def integer(self, key: str, default: int, minimum: int) -> int:
        allowed = f"an integer >= {minimum}"
        value = self.raw(key)
        if value is _MISSING:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.invalid(key, value, allowed, f"got {_type_name(value)}")
        if value < minimum:
            raise self.invalid(key, value, allowed)
        return value

    def seconds(self, key: str) -> float | None:
        """A finite number of seconds > 0, or None when the key is absent."""
        allowed = "a number of seconds > 0"
        value = self.raw(key)
        if value is _MISSING or value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.invalid(key, value, allowed, f"got {_type_name(value)}")
        if not math.isfinite(value) or value <= 0:
            raise self.invalid(key, value, allowed)
        return float(value)

    def values(self) -> dict[str, Any]:
        """The keys given in this section (unknown ones were rejected on entry), without nulls."""
        return {k: v for k, v in self.data.items() if v is not None}

    def core(self, factory: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Build/validate with a core constructor; its InvalidParameterError becomes a ConfigError here."""
        floats = (
            {f.name for f in fields(factory) if f.type == "float"} if isinstance(factory, type) else set()
        )
        for name in floats & set(kwargs):
            if isinstance(kwargs[name], int) and not isinstance(kwargs[name], bool):
                kwargs[name] = float(kwargs[name])
        try:
            return factory(*args, **kwargs)
        except InvalidParameterError as err:
            value = err.value
            wrong_type = isinstance(value, bool) or not isinstance(value, int | float)
            raise self.invalid(
                err.name, value, err.allowed, f"got {_type_name(value)}" if wrong_type else ""
            ) from err

    def choice(self, key: str, enum_type: type[Any], default: Any = _MISSING, required: bool = False) -> Any:
        names = [m.value for m in enum_type]
        allowed = "one of " + ", ".join(names)
        value = self.raw(key, required=required, allowed=allowed)
        if value is _MISSING:
            return default
        if not isinstance(value, str) or value not in names:
            hint = _did_you_mean(value, names) if isinstance(value, str) else f"got {_type_name(value)}"
            raise self.invalid(key, value, allowed, hint)
        return enum_type(value)

    def required_path(self, key: str, allowed: str = "a path") -> str:
        path = self.path(key, required=True, allowed=allowed)
        if path is None:  # unreachable: a missing required key raised already
            raise self.missing(key, allowed)
        return path

    def path(self, key: str, required: bool = False, allowed: str = "a path") -> str | None:
        """A local path resolved against the base directory, or a URI as given; ``None`` if absent."""
        value = self.string(key, default=None, required=required, allowed=allowed)
        if value is None:
            return None
        if _URI_RE.match(value):
            if value.startswith("file://"):
                value = value[len("file://") :]
            else:
                return value
        return str((self.base / Path(value).expanduser()).resolve())
