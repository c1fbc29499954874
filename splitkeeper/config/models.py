"""The pipeline file: pydantic v2 models, the one definition of its shape, defaults and rules.

Contract:

1. :class:`PipelineFile` and its section models name every key a pipeline file may
   hold (``extra="forbid"``), the type of each value, the choices of each enum-like key,
   its default and its range. They are frozen. Each field's ``description`` is the "what is
   allowed" of its error message and of the JSON Schema. The defaults the protocol core and
   the simulator need too come from :mod:`splitkeeper.core.defaults` (stated there once).
2. The ranges of the ``checkpoint`` and ``backlog`` keys and of ``parallelism`` are the core's
   own invariants: the section validators call the core's checks (its dataclasses and
   ``check_*`` functions), so the message is the core's; the top of ``parallelism`` is
   :data:`splitkeeper.config.limits.MAX_PARALLELISM`.
3. Every rule that spans keys (the options of the other source kind, topics xor
   topic_pattern, the ``weighted`` section only with ``strategy: weighted``, an importable
   ``notifications.on_failure`` and ``transform`` (marked for their place:
   :mod:`splitkeeper.callables`), the Kafka client settings (librdkafka's own check), the staging
   location, the placement of source, state, sink, staging, dead-letter and change tables) lives
   in one validator, :meth:`PipelineFile._cross_keys`,
   which runs once the shape is valid and resolves the locations against the validation
   context's ``base`` directory (:attr:`PipelineFile.resolved`).
4. :func:`validate_shape` turns the first pydantic error into a
   :class:`~splitkeeper.errors.ConfigError` in the house format: the dotted key, the value
   given, what is allowed, and for an unknown key the allowed keys of its section and the
   closest one ("did you mean"). Values of ``source.client`` are never shown, and no
   ConfigError shows a secret whatever its key (:class:`~splitkeeper.errors.ConfigError`).
5. A ``null`` value counts as not given (the default applies; a required key is missing), but
   for ``airflow.schedule``, where null means the ingest DAG is triggered only.
6. :func:`json_schema` is the JSON Schema (draft 2020-12) of the file, what
   ``splitkeeper config schema`` prints and the Airflow trigger form validates against.

:mod:`splitkeeper.config.settings` reads files into these models and derives the typed view
the rest of splitkeeper uses (:class:`~splitkeeper.config.settings.PipelineConfig`) and the
core's settings (:func:`~splitkeeper.config.settings.core_settings`). This module imports no
other module of the config package but :mod:`splitkeeper.config.limits`.
"""

from __future__ import annotations

import difflib
import enum
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    StringConstraints,
    Tag,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic.fields import FieldInfo

from splitkeeper.callables import Role, resolve_callable
from splitkeeper.config.limits import (
    MAX_CONCURRENT_REGIONS,
    MAX_PARALLELISM,
    check_max_concurrent_regions,
    check_parallelism,
)
from splitkeeper.core import defaults
from splitkeeper.core.assignment import STRATEGIES
from splitkeeper.core.backlog import BacklogConfig
from splitkeeper.core.checkpoint import CheckpointConfig, check_full_snapshot_every
from splitkeeper.core.driver import check_abort_limit, check_quarantine_after, check_retain_checkpoints
from splitkeeper.core.rescale import Redistribution
from splitkeeper.core.types import SplitChangePolicy, SplitFailurePolicy
from splitkeeper.errors import REDACTED, ConfigError, InvalidParameterError, is_secret_key
from splitkeeper.transforms import is_batch, resolve_transform

#: The assignment strategies of the protocol core (protocol rule 1.6), by config name.
STRATEGY_NAMES: tuple[str, ...] = tuple(sorted(STRATEGIES))
IDENTITY_TRANSFORM = "splitkeeper.transforms:identity"
SCHEMA_ID = "https://splitkeeper.invalid/schemas/pipeline.json"

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
CALLABLE_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
STARTING_PATTERN = r"^(earliest|latest|group|timestamp:[0-9]+)$"
OTLP_PATTERN = r"^https?://[^\s/]+"
CONN_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,250}$"

_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_HOST_PORT_RE = re.compile(r"^[^\s:,]+:\d{1,5}$")
_CRON_FIELD_RE = re.compile(r"^[0-9A-Za-z*/,?#-]+$")


# --------------------------------------------------------------------------- choices


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


class ReaderMode(enum.Enum):
    """What a reader does with the splits restored from its state (protocol rule 1.2, FLIP-537).

    ``DEFERRED`` (the default): it reports them and reads nothing until the enumerator assigns
    (the enumerator places every split, balanced strategies stay balanced). ``LEGACY``: it keeps,
    and reads, what it restored (the behaviour without ``SupportsSplitReassignmentOnRecovery``).
    """

    DEFERRED = "deferred"
    LEGACY = "legacy"


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


class DecodeKind(enum.Enum):
    """``decode.kind``: what a record's bytes are (:mod:`splitkeeper.records`)."""

    RAW = "raw"  # the bytes as they left the source (value BINARY)
    TEXT = "text"  # UTF-8 text (value STRING); invalid UTF-8 is a bad record
    JSON = "json"  # one JSON object per record, typed by decode.schema
    CSV = "csv"  # one CSV row per record, typed by decode.schema (by position)
    AVRO = "avro"  # Avro, Confluent wire format, typed by decode.schema_file / the registry


class NewFields(enum.Enum):
    """``decode.on_new_fields``: a field the declared schema does not name (Auto Loader's meanings)."""

    RESCUE = "rescue"  # into the ``_rescued`` column as JSON: nothing lost
    ADD_COLUMNS = "add_columns"  # the sink's schema widens in the epoch's own commit
    FAIL = "fail"  # the region fails naming the field, split and offset


class Tolerance(enum.Enum):
    """``errors.tolerance``: what a bad record does (Kafka Connect's ``errors.tolerance``)."""

    NONE = "none"  # it fails its region, naming split and offset
    ALL = "all"  # it goes to the dead-letter table, with its stage and error


class SinkMode(enum.Enum):
    """``sink.mode``: what an epoch's records do to the sink table."""

    APPEND = "append"  # every record is a new row (the table is the change log)
    UPSERT = "upsert"  # the latest row per sink.key, one Delta MERGE per epoch; deletes by sink.delete_when


class TransformKind(enum.Enum):
    """``transform.kind``: where the pipeline's transform runs."""

    PYTHON = "python"  # in each region task, on its records (a @transform/@vectorized/@batch_transform)
    SPARK = "spark"  # on Spark, over an epoch's acknowledged records: fn(DataFrame) -> DataFrame


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


# --------------------------------------------------------------------------- sections


_Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


def _one_of(values: tuple[str, ...] | list[str]) -> str:
    return "one of " + ", ".join(values)


def _strategy(value: str) -> str:
    if value not in STRATEGY_NAMES:
        raise ValueError(_one_of(STRATEGY_NAMES))
    return value


def _parallelism(value: Any) -> int:
    return check_parallelism(value)


def _max_concurrent_regions(value: Any) -> int | None:
    return None if value is None else check_max_concurrent_regions(value)


class _Section(BaseModel):
    """A mapping of the file: unknown keys are mistakes, types are not coerced (``"4"`` is no int)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, str_strip_whitespace=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_not_given(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return {k: v for k, v in data.items() if v is not None}
        return data

    def given(self) -> list[str]:
        """The keys present (non-null) in this section, in the model's order."""
        return [name for name in type(self).model_fields if name in self.model_fields_set]


def _choice(enum_type: type[enum.Enum], default: Any = ...) -> Any:
    return Field(default, strict=False, description=_one_of([m.value for m in enum_type]))


def _core(default: Any, json_type: str) -> Any:
    """A key whose range is the protocol core's invariant (contract 2): any value reaches the core's check."""
    description = f"{json_type} (the protocol core checks its range)"
    return Field(default, description=description, json_schema_extra={"type": json_type})


_SECONDS = "a number of seconds > 0"


class SourceSection(_Section):
    """``source``: ``kind`` chooses the reader; the options of the other kind may not be given."""

    kind: SourceKind = _choice(SourceKind)
    # files
    path: _Text | None = Field(None, description="the directory (or file) to ingest")
    format: FileFormat = _choice(FileFormat, FileFormat.LINES)
    split_bytes: int = Field(0, ge=0, description="an integer >= 0 (0: one split per file)")
    on_file_change: SplitChangePolicy = _choice(SplitChangePolicy, defaults.ON_FILE_CHANGE)
    # both kinds
    reader_mode: ReaderMode = _choice(ReaderMode, ReaderMode.DEFERRED)
    # kafka
    bootstrap_servers: _Text | list[_Text] | None = Field(
        None, description="'host:port[,host:port...]' or a list of 'host:port'"
    )
    topics: list[_Text] = Field(default_factory=list, description="a list of non-empty strings")
    topic_pattern: _Text | None = Field(None, description="a regular expression over topic names")
    starting: _Text = Field(
        "earliest",
        pattern=STARTING_PATTERN,
        description="'earliest', 'latest', 'timestamp:<epoch ms>' or 'group'",
    )
    group_id: _Text | None = Field(None, description="a consumer group id")
    on_offset_out_of_range: OffsetOutOfRange = _choice(OffsetOutOfRange, OffsetOutOfRange.FAIL)
    connect_timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False, description=_SECONDS)
    read_timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False, description=_SECONDS)
    client: dict[str, Any] = Field(
        default_factory=dict,
        description="a mapping of Kafka client settings (librdkafka names) to strings, numbers or booleans",
        json_schema_extra={"additionalProperties": {"type": ["string", "number", "boolean"]}},
    )
    connection: _Text | None = Field(
        None,
        pattern=CONN_ID_PATTERN,
        description="an Airflow connection id of the Kafka provider's type, e.g. 'kafka_default': inside "
        "Airflow its bootstrap servers and client settings (SASL) fill the ones this file leaves out",
    )


FILE_KEYS = ("path", "format", "split_bytes", "on_file_change")
SHARED_SOURCE_KEYS = ("kind", "reader_mode")
KAFKA_KEYS = tuple(
    k for k in SourceSection.model_fields if k not in SHARED_SOURCE_KEYS and k not in FILE_KEYS
)


class CheckpointSection(_Section):
    """The ``checkpoint`` section: the core :class:`CheckpointConfig` plus retention."""

    max_consecutive_failures: Any = _core(defaults.MAX_CONSECUTIVE_FAILURES, "integer")
    max_failure_ratio: Any = _core(defaults.MAX_FAILURE_RATIO, "number")
    region_timeout_s: Any = _core(defaults.REGION_TIMEOUT_S, "number")
    retain_checkpoints: Any = _core(defaults.RETAIN_CHECKPOINTS, "integer")
    on_split_failure: SplitFailurePolicy = _choice(SplitFailurePolicy, defaults.ON_SPLIT_FAILURE)
    quarantine_after: Any = _core(defaults.QUARANTINE_AFTER, "integer")
    full_snapshot_every: Any = _core(defaults.FULL_SNAPSHOT_EVERY, "integer")
    max_consecutive_aborts: Any = _core(defaults.MAX_CONSECUTIVE_ABORTS, "integer")

    @model_validator(mode="after")
    def _core_validates(self) -> CheckpointSection:
        """The core's checks, in the order of its settings (contract 2)."""
        self.core(regions_independent=True)
        check_retain_checkpoints(self.retain_checkpoints)
        check_quarantine_after(self.quarantine_after)
        check_full_snapshot_every(self.full_snapshot_every)
        check_abort_limit(self.max_consecutive_aborts, self.on_split_failure, self.quarantine_after)
        return self

    def core(self, regions_independent: bool) -> CheckpointConfig:
        """The core's checkpoint settings of this section."""
        return CheckpointConfig(
            max_consecutive_failures=self.max_consecutive_failures,
            max_failure_ratio=_number(self.max_failure_ratio),
            region_timeout_s=_number(self.region_timeout_s),
            regions_independent=regions_independent,
        )


def _number(value: Any) -> Any:
    """An integer given for a number key, as a float (other values go to the core's check as they are)."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


class BacklogSection(_Section):
    """Epoch size and checkpoint interval while processing backlog versus afterwards."""

    backlog_epoch_records: Any = _core(defaults.BACKLOG_EPOCH_RECORDS, "integer")
    normal_epoch_records: Any = _core(defaults.NORMAL_EPOCH_RECORDS, "integer")
    backlog_interval_s: Any = _core(defaults.BACKLOG_INTERVAL_S, "number")
    normal_interval_s: Any = _core(defaults.NORMAL_INTERVAL_S, "number")

    @model_validator(mode="after")
    def _core_validates(self) -> BacklogSection:
        self.core()
        return self

    def core(self) -> BacklogConfig:
        """The core's backlog settings of this section (the core checks the ranges, contract 2)."""
        return BacklogConfig(
            backlog_epoch_records=self.backlog_epoch_records,
            normal_epoch_records=self.normal_epoch_records,
            backlog_interval_s=_number(self.backlog_interval_s),
            normal_interval_s=_number(self.normal_interval_s),
        )


_STORE_CONNECTION = (
    "an Airflow connection id of the Amazon provider's type, e.g. 'aws_default': inside Airflow its "
    "keys, endpoint and region reach the object store (never secrets in this file)"
)


class RequiredPath(_Section):
    path: _Text = Field(description="a path (relative to the file's directory) or a URI")
    connection: _Text | None = Field(None, pattern=CONN_ID_PATTERN, description=_STORE_CONNECTION)


class OptionalPath(_Section):
    path: _Text | None = Field(None, description="a local directory (default <state>/_staging)")


class DecodeSection(_Section):
    """``decode``: how a record's bytes become the sink's columns (:mod:`splitkeeper.records`)."""

    kind: DecodeKind = _choice(DecodeKind, DecodeKind.RAW)
    schema_: _Text | None = Field(
        None,
        alias="schema",
        description="a Spark DDL string of the record's columns ('id BIGINT, name STRING, ...')",
    )
    schema_file: _Text | None = Field(None, description="an Avro schema file (.avsc), for kind 'avro'")
    schema_registry_url: _Text | None = Field(
        None, pattern=r"^https?://[^\s/]+", description="a Confluent schema registry 'http(s)://host:port'"
    )
    on_new_fields: NewFields = _choice(NewFields, NewFields.RESCUE)
    csv_delimiter: str = Field(",", min_length=1, max_length=1, description="one character")


class DeadLetterSection(_Section):
    path: _Text | None = Field(None, description="the dead-letter Delta table (a path or URI)")


class ErrorsSection(_Section):
    """``errors``: bad records (Kafka Connect's ``errors.*``, Delta Live Tables' drop/fail)."""

    tolerance: Tolerance = _choice(Tolerance, Tolerance.NONE)
    dead_letter: DeadLetterSection = DeadLetterSection.model_validate({})
    max_bad_ratio: float = Field(
        defaults.MAX_BAD_RATIO,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="a number in [0, 1]: the share of a region's records in an epoch that may be bad",
    )


class SinkSection(_Section):
    path: _Text = Field(description="a path (relative to the file's directory) or a URI")
    connection: _Text | None = Field(None, pattern=CONN_ID_PATTERN, description=_STORE_CONNECTION)
    partition_by: list[_Text] = Field(
        default_factory=list, description="a list of sink column names (Delta partition columns)"
    )
    mode: SinkMode = _choice(SinkMode, SinkMode.APPEND)
    key: list[_Text] = Field(
        default_factory=list,
        description="a list of sink column names: the row key of an upsert sink (mode 'upsert')",
    )
    delete_when: _Text | None = Field(
        None,
        description="a SQL predicate over the record's columns that makes it a delete of its key, "
        "e.g. \"op = 'd'\" (mode 'upsert'; a null Kafka value deletes too)",
    )
    changes_path: _Text | None = Field(
        None,
        description="the change table of an upsert sink: every record of every epoch (default: "
        "<sink.path>_changes beside the sink)",
    )


class TransformSection(_Section):
    """``transform`` as a mapping: ``{kind: spark, function: 'module:fn'}``."""

    kind: TransformKind = _choice(TransformKind, TransformKind.PYTHON)
    function: _Text = Field(
        pattern=CALLABLE_PATTERN,
        description="'module:function': for kind 'spark' fn(pyspark.sql.DataFrame) -> DataFrame, for kind "
        "'python' a function marked @splitkeeper.transform",
    )


class RescaleSection(_Section):
    operator_state: OperatorState = _choice(OperatorState, OperatorState.EVEN_SPLIT)


_CAPACITIES = "a mapping of reader id (an integer >= 0) to a capacity > 0, e.g. {0: 4, 1: 1}"


class WeightedSection(_Section):
    capacities: dict[
        Annotated[int, Field(strict=False, ge=0)], Annotated[float, Field(gt=0, allow_inf_nan=False)]
    ] = Field(
        default_factory=dict,
        description=_CAPACITIES,
        json_schema_extra={"propertyNames": {"pattern": "^[0-9]+$"}},
    )
    rebalance_threshold: float = Field(
        defaults.REBALANCE_THRESHOLD,
        ge=1.0,
        description="a ratio >= 1.0: the readers' max / min load that makes them rebalance",
    )


class NotificationsSection(_Section):
    on_failure: _Text | None = Field(
        None, pattern=CALLABLE_PATTERN, description="'module:function', e.g. 'mypkg.alerts:page_oncall'"
    )


class LeaseSection(_Section):
    ttl_s: float = Field(defaults.LEASE_TTL_S, gt=0, allow_inf_nan=False, description=_SECONDS)
    wait_s: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds >= 0 a writer waits for the lease's holder to prove stale (no heartbeat "
        "for its ttl by this writer's clock); 0: a held lease refuses at once",
    )


class MaintenanceSection(_Section):
    history_hours: float = Field(
        168.0,
        ge=0,
        description="hours >= 0: VACUUM keeps the files removed less than this long ago (time travel "
        "reaches back that far); a fraction of an hour rounds up to the next whole hour",
    )
    untracked_hours: float = Field(
        24.0,
        ge=0,
        allow_inf_nan=False,
        description="hours >= 0: maintain removes sink files no Delta version references, and staged "
        "files of epochs the sink already recorded, once they are this old (a fenced-out loser's or a "
        "crashed commit's leftovers); a fraction of an hour rounds up to the next whole hour",
    )


#: The ingest DAG's schedule when the file names none: every 30 minutes.
DEFAULT_SCHEDULE = "*/30 * * * *"
SCHEDULE_PRESETS = (
    "@once",
    "@continuous",
    "@hourly",
    "@daily",
    "@weekly",
    "@monthly",
    "@quarterly",
    "@yearly",
)
#: ``airflow.schedule: on_new_data``: the ingest DAG runs when its sources have something new
#: (an Asset watched by :class:`splitkeeper.airflow.triggers.SplitkeeperNewDataTrigger`).
ON_NEW_DATA = "on_new_data"
_SCHEDULE_ALLOWED = (
    "a cron expression of 5 fields (e.g. '*/30 * * * *'), one of "
    + ", ".join(SCHEDULE_PRESETS)
    + f", {ON_NEW_DATA} (when the source has something new; Airflow 3 event-driven, polled "
    "every airflow.poll_interval_s without Spark), or null (triggered only)"
)


def _schedule(value: str | None) -> str | None:
    if value is None or value in SCHEDULE_PRESETS or value == ON_NEW_DATA:
        return value
    fields = value.split()
    if len(fields) != 5 or not all(_CRON_FIELD_RE.match(f) for f in fields):
        raise ValueError(f"{value!r} is not {_SCHEDULE_ALLOWED}")
    try:  # Airflow's own cron parser, where it is installed: it knows every field's range
        from croniter import croniter
    except ImportError:
        return value
    if not croniter.is_valid(value):
        raise ValueError(f"{value!r} is not {_SCHEDULE_ALLOWED}: a field is out of its range")
    return value


class AirflowSection(_Section):
    """``airflow``: how :func:`splitkeeper.airflow.splitkeeper_dags` schedules the pipeline's DAGs.

    Unlike other keys, an explicit ``schedule: null`` is a value: the ingest DAG is triggered only.
    """

    @model_validator(mode="before")
    @classmethod
    def _null_is_not_given(cls, data: Any) -> Any:  # overrides _Section's: here null means "no schedule"
        return data

    schedule: Annotated[_Text | None, AfterValidator(_schedule)] = Field(
        DEFAULT_SCHEDULE,
        description="the ingest DAG's schedule: " + _SCHEDULE_ALLOWED,
        json_schema_extra={"type": ["string", "null"]},
    )
    poll_interval_s: float = Field(
        60.0,
        ge=1.0,
        le=86400.0,
        description=f"seconds between two looks at the source when schedule is {ON_NEW_DATA} (1 to 86400): "
        "a file listing, or Kafka end offsets, against the latest checkpoint; no Spark",
    )


class MetricsSection(_Section):
    otlp_endpoint: _Text | None = Field(
        None,
        pattern=OTLP_PATTERN,
        description="an http(s):// URL of an OTLP/HTTP collector, e.g. http://localhost:4318",
    )


#: The keys of the sections a run may override (:data:`OVERRIDABLE`) that name where data goes or
#: what code runs, and why: a run's overrides (the ingest DAG's ``pipeline`` Param, ``run
#: --pipeline-json``, ``run_epochs(pipeline=...)``) may set them only where the pipeline file lists
#: them under ``overrides.allow``. Every other key of those sections is a number or a choice.
GUARDED_OVERRIDES: dict[str, str] = {
    "metrics.otlp_endpoint": "it names the host the metrics are sent to",
    "notifications.on_failure": "it names the code a failed task runs",
}


def _guarded(key: str) -> str:
    if key not in GUARDED_OVERRIDES:
        raise ValueError(
            f"{_one_of(list(GUARDED_OVERRIDES))} (a run may set every other key of "
            f"{', '.join(OVERRIDABLE)} without it; no other section at all)"
        )
    return key


class OverridesSection(_Section):
    """``overrides``: what a run's overrides may set beyond the tuning values (numbers and choices)."""

    allow: list[Annotated[str, AfterValidator(_guarded)]] = Field(
        default_factory=list,
        description="keys a run's overrides may set although they name a host or code: any of "
        + ", ".join(GUARDED_OVERRIDES)
        + " (default none: only this file sets them)",
        json_schema_extra={"items": {"enum": list(GUARDED_OVERRIDES)}},
    )


@dataclass(frozen=True, slots=True)
class Resolved:
    """What :meth:`PipelineFile._cross_keys` derived from the file: absolute locations (URIs as
    given), the Kafka bootstrap servers joined, the client settings as sorted string pairs."""

    source_path: str | None
    state_path: str
    sink_path: str
    staging_path: str
    bootstrap_servers: str | None
    client: tuple[tuple[str, str], ...]
    dead_letter_path: str | None
    decode: Any  # splitkeeper.records.spec.DecodeSpec
    changes_path: str | None  # sink.changes_path (mode upsert only; default beside the sink)
    filtered_path: str  # where the offsets a Spark transform dropped are recorded (beside the sink)


def _transform_form(value: Any) -> str:
    """``transform`` is a ``'module:function'`` string or a ``{kind, function}`` mapping."""
    return "[mapping]" if isinstance(value, Mapping | TransformSection) else "[module:function]"


class PipelineFile(_Section):
    """A splitkeeper pipeline file (YAML or TOML), or an Airflow ``dag_run.conf`` mapping."""

    model_config = ConfigDict(title="splitkeeper pipeline")

    name: _Text = Field(
        pattern=NAME_PATTERN,
        description="letters, digits, '_', '.', '-', starting with a letter or digit (1-64)",
    )
    source: SourceSection = Field(description="where records come from: files or kafka")
    parallelism: Annotated[Any, AfterValidator(_parallelism)] = Field(
        1,
        description=f"integer from 1 to {MAX_PARALLELISM} (the core checks >= 1, the runtime the top)",
        json_schema_extra={"type": "integer", "maximum": MAX_PARALLELISM},
    )
    max_concurrent_regions: Annotated[Any, AfterValidator(_max_concurrent_regions)] = Field(
        None,
        description=f"integer from 1 to {MAX_CONCURRENT_REGIONS}, ignored with a warning: an epoch's "
        "regions are the tasks of one Spark job, and Spark's cores bound how many run at once",
        json_schema_extra={"type": "integer", "minimum": 1, "maximum": MAX_CONCURRENT_REGIONS},
    )
    regions: RegionMode = _choice(RegionMode, RegionMode.PER_READER)
    strategy: Annotated[str, AfterValidator(_strategy)] = Field(
        defaults.STRATEGY,
        description=_one_of(STRATEGY_NAMES),
        json_schema_extra={"enum": list(STRATEGY_NAMES)},
    )
    checkpoint: CheckpointSection = CheckpointSection.model_validate({})
    backlog: BacklogSection = BacklogSection.model_validate({})
    state: RequiredPath = Field(description="where the state tables live")
    sink: SinkSection = Field(description="the sink Delta table")
    decode: DecodeSection = DecodeSection.model_validate({})
    errors: ErrorsSection = ErrorsSection.model_validate({})
    staging: OptionalPath = OptionalPath.model_validate({})
    transform: Annotated[
        Annotated[Annotated[_Text, Field(pattern=CALLABLE_PATTERN)], Tag("[module:function]")]
        | Annotated[TransformSection, Tag("[mapping]")],
        Discriminator(_transform_form),
    ] = Field(
        IDENTITY_TRANSFORM,
        description="'module:function' naming a function marked @splitkeeper.transform, e.g. "
        "'mypkg.transforms:enrich', or {kind: spark, function: 'module:fn'} for a PySpark DataFrame "
        "transform",
    )
    rescale: RescaleSection = RescaleSection.model_validate({})
    weighted: WeightedSection = WeightedSection.model_validate({})
    notifications: NotificationsSection = NotificationsSection.model_validate({})
    lease: LeaseSection = LeaseSection.model_validate({})
    maintenance: MaintenanceSection = MaintenanceSection.model_validate({})
    metrics: MetricsSection = MetricsSection.model_validate({})
    airflow: AirflowSection = AirflowSection.model_validate({})
    overrides: OverridesSection = OverridesSection.model_validate({})

    _resolved: Resolved | None = PrivateAttr(None)

    @property
    def resolved(self) -> Resolved:
        """The locations, servers and client settings :meth:`_cross_keys` derived (contract 3)."""
        if self._resolved is None:  # only a model built without validation (model_construct)
            raise ConfigError("pipeline config was not validated", key="", value=None)
        return self._resolved

    @model_validator(mode="after")
    def _cross_keys(self, info: ValidationInfo) -> PipelineFile:
        """Every rule that spans keys (contract 3), in this order; ConfigError names the key."""
        context = info.context if isinstance(info.context, Mapping) else {}
        at = _Where(
            str(context.get("where") or "pipeline config"),
            Path(context.get("base") or os.getcwd()).expanduser().resolve(),
            imports=context.get("imports", True) is not False,
        )
        source_path, servers, client = _check_source(self.source, at)
        _check_weighted(self, at)
        on_failure = self.notifications.on_failure
        if on_failure is not None and at.imports:
            try:
                resolve_callable(on_failure, "notifications.on_failure", Role.NOTIFICATION)
            except ConfigError as err:
                raise ConfigError(f"{err.message} ({at.where})", **err.params) from err.__cause__
        state_path, sink_path, staging_path = _check_locations(self, source_path, at)
        _check_transform(self, at)
        decode, dead_letter_path = _check_records(self, sink_path, at)
        changes_path = _check_upsert(self, decode, sink_path, dead_letter_path, at)
        _check_placement(
            _places(source_path, state_path, sink_path, staging_path)
            + [
                (k, p)
                for k, p in (
                    ("errors.dead_letter.path", dead_letter_path),
                    ("sink.changes_path", changes_path),
                )
                if p
            ],
            at,
        )
        self._resolved = Resolved(
            source_path,
            state_path,
            sink_path,
            staging_path,
            servers,
            client,
            dead_letter_path,
            decode,
            changes_path,
            _sibling(sink_path, "_filtered"),
        )
        return self

    @property
    def transform_kind(self) -> TransformKind:
        return self.transform.kind if isinstance(self.transform, TransformSection) else TransformKind.PYTHON

    @property
    def transform_function(self) -> str:
        return self.transform.function if isinstance(self.transform, TransformSection) else self.transform


# --------------------------------------------------------------------------- cross-key rules


def _sibling(path: str, suffix: str) -> str:
    """``<path><suffix>``: a table beside ``path`` (a local path or a URI), e.g. the sink's change table."""
    return path.rstrip("/") + suffix


def _check_transform(file: PipelineFile, at: _Where) -> None:
    """``transform``: the function imports (at submission, not on an executor); a python transform
    fits the decode kind; a spark one is a plain callable (its output schema is known once Spark runs
    it on an empty frame, when the pipeline opens)."""
    spec = file.transform_function
    key = "transform" if isinstance(file.transform, str) else "transform.function"
    if not at.imports:
        return  # a read-only command (status, offsets): the transform is never called
    try:
        if file.transform_kind is TransformKind.SPARK:
            resolve_callable(spec, key, Role.SPARK_TRANSFORM)
            return
        function = resolve_transform(spec)
    except ConfigError as err:
        raise ConfigError(f"{err.message} ({at.where})", **err.params) from err.__cause__
    if spec != IDENTITY_TRANSFORM and not is_batch(function) and file.decode.kind is not DecodeKind.TEXT:
        raise at.invalid(
            key,
            spec,
            "a @batch_transform (RecordBatch -> RecordBatch) for decode.kind "
            f"{file.decode.kind.value!r}; a @transform or @vectorized function works on text values",
            "set decode.kind: text to give it each record's value as a string (invalid UTF-8 becomes a "
            "bad record), or mark it @batch_transform",
        )


_ClientItems = tuple[tuple[str, str], ...]


def _check_source(sec: SourceSection, at: _Where) -> tuple[str | None, str | None, _ClientItems]:
    """``source``: no option of the other kind; the kind's required options; the resolved path
    (files) or the joined servers and client settings (kafka)."""
    kind = sec.kind
    own, other = (FILE_KEYS, KAFKA_KEYS) if kind is SourceKind.FILES else (KAFKA_KEYS, FILE_KEYS)
    for key in sec.given():
        if key in other:
            value = getattr(sec, key)
            raise at.invalid(
                f"source.{key}",
                "<not shown>" if key == "client" else value,
                f"no {key} for source.kind {kind.value!r}; its options are: {', '.join(own)}",
            )
    if kind is SourceKind.FILES:
        if sec.path is None:
            raise at.missing("source.path", "the directory (or file) to ingest")
        return at.path(sec.path), None, ()

    servers = _bootstrap_servers(sec.bootstrap_servers, at, sec.connection)
    topics = tuple(sec.topics)
    pattern = sec.topic_pattern
    one_of = "exactly one of source.topics (a list of topic names) or source.topic_pattern (a regex)"
    if not topics and not pattern:
        raise at.missing("source.topics", one_of)
    if topics and pattern:
        raise at.invalid("source.topics", {"topics": list(topics), "topic_pattern": pattern}, one_of)
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as err:
            raise at.invalid("source.topic_pattern", pattern, "a valid regular expression", str(err)) from err
    if sec.starting == "group" and not sec.group_id:
        raise at.missing("source.group_id", "a consumer group id, required when source.starting is 'group'")
    return None, servers, _client_settings(sec.client, at)


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


def _client_settings(raw: Mapping[str, Any], at: _Where) -> _ClientItems:
    """``source.client``: a mapping of librdkafka setting -> string, number or boolean; none that
    splitkeeper sets itself (:data:`KAFKA_MANAGED_CLIENT_KEYS`, whatever the case of the name), and,
    where the file's imports are checked, only settings librdkafka knows with values it takes."""
    items: list[tuple[str, str]] = []
    for key, value in raw.items():
        dotted = f"source.client.{key}"
        shown = REDACTED if is_secret_key(str(key)) else value
        if not key.strip():
            raise at.invalid("source.client", key, "setting names that are non-empty strings")
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
        _check_librdkafka(items, at)
    return tuple(sorted(items))


def _check_librdkafka(items: list[tuple[str, str]], at: _Where) -> None:
    """librdkafka's own check of the settings, without connecting: a consumer configured with them
    (and no bootstrap servers) is created and closed at once. ConfigError names the setting it
    refuses (an unknown name, names being case-sensitive, or a value it does not take) and where
    its settings are listed. What fails once the settings are taken (a CA file or SASL plugin the
    machine loading the file lacks: the scheduler parsing the DAGs is not the worker) is left to the
    client's first use there. Skipped where the Kafka client library is not installed (the run then
    fails on the missing ``kafka`` extra)."""
    import logging

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
        raise at.invalid("source.client", "<not shown>", listed, f"librdkafka refuses them: {reason}")
    value = dict(items)[key]
    if reason.startswith("No such configuration property"):
        lower = key.lower()
        if lower != key and not (refusal({lower: value}) or "").startswith("No such configuration property"):
            close = f"did you mean {lower!r}?"
        else:
            close = did_you_mean(lower, _COMMON_CLIENT_KEYS)
        hint = "no such librdkafka setting (names are case-sensitive)" + (f"; {close}" if close else "")
        raise at.invalid(f"source.client.{key}", REDACTED if is_secret_key(key) else value, listed, hint)
    raise at.invalid(
        f"source.client.{key}",
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


def _bootstrap_servers(raw: str | list[str] | None, at: _Where, connection: str | None = None) -> str:
    allowed = "'host:port[,host:port...]' or a list of 'host:port'"
    if raw is None and connection is not None:
        raise at.missing(
            "source.bootstrap_servers",
            f"{allowed}; source.connection {connection!r} gives them only inside Airflow "
            "(splitkeeper.airflow.hooks.SplitkeeperHook); elsewhere set source.bootstrap_servers",
        )
    if raw is None:
        raise at.missing("source.bootstrap_servers", allowed)
    items = [s.strip() for s in raw.split(",")] if isinstance(raw, str) else list(raw)
    bad = [s for s in items if not _HOST_PORT_RE.match(s) or not 0 < int(s.rsplit(":", 1)[1]) < 65536]
    if not items or bad:
        raise at.invalid("source.bootstrap_servers", raw, allowed, f"not host:port: {bad}" if bad else "")
    return ",".join(items)


def _check_records(file: PipelineFile, sink_path: str, at: _Where) -> tuple[Any, str | None]:
    """``decode``, ``errors`` and ``sink.partition_by`` together: the decode spec builds (its
    schema parses, its options fit its kind), the dead-letter table is given exactly when
    ``tolerance: all`` and is not the sink, and the partition columns are sink columns. Returns
    the decode spec and the resolved dead-letter path."""
    from splitkeeper.records.spec import decode_spec_of

    spec = decode_spec_of(file.decode, base=at.base, where=at.where)
    errors = file.errors
    dead = errors.dead_letter.path
    dead_path = None if dead is None else at.path(dead)
    if errors.tolerance is Tolerance.ALL and dead_path is None:
        raise at.missing(
            "errors.dead_letter.path",
            "the dead-letter Delta table bad records go to (errors.tolerance is 'all')",
        )
    if errors.tolerance is Tolerance.NONE and dead_path is not None:
        raise at.invalid(
            "errors.dead_letter.path",
            dead,
            "nothing unless errors.tolerance is 'all' (with 'none' a bad record fails its region)",
            "set errors.tolerance: all",
        )
    if dead_path is not None and dead_path.rstrip("/") == sink_path.rstrip("/"):
        raise at.invalid("errors.dead_letter.path", dead, "a table other than sink.path")
    columns = spec.sink_column_names()
    for name in file.sink.partition_by:
        if name not in columns:
            raise at.invalid(
                "sink.partition_by",
                list(file.sink.partition_by),
                f"names of the sink's columns: {', '.join(columns)}",
                f"{name!r} is not one",
            )
    if len(set(file.sink.partition_by)) != len(file.sink.partition_by):
        raise at.invalid("sink.partition_by", list(file.sink.partition_by), "distinct column names")
    return spec, dead_path


def _check_upsert(
    file: PipelineFile, decode: Any, sink_path: str, dead_letter_path: str | None, at: _Where
) -> str | None:
    """``sink.mode``, ``sink.key``, ``sink.delete_when`` and ``sink.changes_path`` together: an upsert
    sink has a key of distinct sink columns, a delete predicate that parses and names sink columns
    only, and a change table that is no other table of the pipeline; an append sink has none of
    them. A Spark transform may change the columns, so its key and predicate are checked again
    against its output when the pipeline opens. Returns the resolved change table path (or None)."""
    from splitkeeper.records.upsert import UpsertError, UpsertSpec

    sink = file.sink
    if sink.mode is not SinkMode.UPSERT:
        for key in ("key", "delete_when", "changes_path"):
            if key in sink.given():
                raise at.invalid(
                    f"sink.{key}",
                    getattr(sink, key),
                    "nothing unless sink.mode is 'upsert' (an append sink keeps every record)",
                    "set sink.mode: upsert",
                )
        return None
    if not sink.key:
        raise at.missing("sink.key", "the list of sink columns that identify a row (sink.mode is 'upsert')")
    columns = decode.sink_column_names()
    try:
        UpsertSpec.of(
            sink.key,
            sink.delete_when,
            columns=None if file.transform_kind is TransformKind.SPARK else columns,
        )
    except UpsertError as err:
        value = list(sink.key) if err.key == "key" else sink.delete_when
        raise at.invalid(f"sink.{err.key}", value, str(err)) from None
    if file.decode.on_new_fields is NewFields.ADD_COLUMNS:
        raise at.invalid(
            "decode.on_new_fields",
            file.decode.on_new_fields.value,
            "rescue or fail with sink.mode 'upsert' (a MERGE does not widen the keyed table's columns)",
            "keep new fields in the _rescued column (rescue), or declare them in decode.schema",
        )
    changes = at.path(sink.changes_path) if sink.changes_path is not None else _sibling(sink_path, "_changes")
    for name, other in (("sink.path", sink_path), ("errors.dead_letter.path", dead_letter_path)):
        if other is not None and changes.rstrip("/") == other.rstrip("/"):
            raise at.invalid("sink.changes_path", sink.changes_path, f"a table other than {name}")
    return changes


def _check_weighted(file: PipelineFile, at: _Where) -> None:
    """``weighted``: reader capacities and the imbalance that re-weights (strategy ``weighted`` only)."""
    given = file.weighted.given()
    if given and file.strategy != "weighted":
        raise at.invalid(
            f"weighted.{given[0]}",
            getattr(file.weighted, given[0]),
            "nothing unless strategy is 'weighted'",
            "set strategy: weighted",
        )


def _check_locations(file: PipelineFile, source_path: str | None, at: _Where) -> tuple[str, str, str]:
    """The state, sink and staging locations, resolved; staging local; none inside another."""
    state_path = at.path(file.state.path)
    sink_path = at.path(file.sink.path)
    staging_path = None if file.staging.path is None else at.path(file.staging.path)
    if staging_path is None:
        if _URI_RE.match(state_path):
            # region tasks write their staged files with local file I/O: an object store won't do
            raise at.missing(
                "staging.path",
                f"a local directory the driver and every executor share (state.path {state_path} is on "
                "an object store, so the default <state>/_staging cannot be used)",
            )
        staging_path = _join(state_path, "_staging")
    elif _URI_RE.match(staging_path):
        raise at.invalid(
            "staging.path",
            staging_path,
            "a local directory the driver and every executor share (region tasks "
            "write staged files with local file I/O)",
        )
    _check_placement(_places(source_path, state_path, sink_path, staging_path), at)
    return state_path, sink_path, staging_path


def _places(source: str | None, state: str, sink: str, staging: str) -> list[tuple[str, str]]:
    places = [("source.path", source)] if source is not None else []
    return places + [("state.path", state), ("sink.path", sink), ("staging.path", staging)]


def _join(base: str, child: str) -> str:
    return f"{base.rstrip('/')}/{child}" if _URI_RE.match(base) else str(Path(base) / child)


#: Why a location may not lie inside (or be) another one, by the other one's key.
_APART = {
    "source.path": "the pipeline would read what it writes there as input",
    "state.path": "the state folder holds splitkeeper's own tables",
    "sink.path": "VACUUM on the sink would delete it",
    "staging.path": "staged files are removed after every epoch",
    "errors.dead_letter.path": "it is the dead-letter Delta table, whose upkeep removes what it does not own",
    "sink.changes_path": "it is the change Delta table, whose upkeep removes what it does not own",
}


def _check_placement(places: list[tuple[str, str]], at: _Where) -> None:
    """The source, state, sink, staging, dead-letter and change table locations (resolved: absolute,
    ``~`` expanded, symlinks followed) may not be one another or lie inside one another; the one
    exception is staging inside state (the default ``<state>/_staging``). A local path and a URI never
    overlap; ``s3a://`` and ``s3n://`` are ``s3://``. ConfigError names the inner (or later) key."""
    for i, (key, path) in enumerate(places):
        for j, (other_key, other) in enumerate(places):
            if i == j:
                continue
            if _same_location(path, other) and j < i:
                allowed = f"a location different from {other_key} {other}"
            elif _inside(path, other) and (key, other_key) != ("staging.path", "state.path"):
                allowed = f"a location outside {other_key} {other}"
            else:
                continue
            why = (
                _APART[other_key] if key != "source.path" else f"splitkeeper writes and cleans up {other_key}"
            )
            raise at.invalid(key, path, allowed, f"{why}; move one of them")


def _location(path: str) -> str:
    return re.sub(r"^s3[an]://", "s3://", path, flags=re.IGNORECASE).rstrip("/")


def _same_location(a: str, b: str) -> bool:
    return _location(a) == _location(b)


def _inside(inner: str, outer: str) -> bool:
    return _location(inner).startswith(_location(outer) + "/")


@dataclass(frozen=True, slots=True)
class _Where:
    """Raises the cross-key mistakes in the house format; resolves paths against ``base``."""

    where: str
    base: Path
    imports: bool = True  # import what the file names (transform, notification, Kafka client library)

    def invalid(self, dotted: str, value: Any, allowed: str, hint: str = "") -> ConfigError:
        message = f"{dotted}={value!r} is not allowed: {allowed}"
        if hint:
            message += f"; {hint}"
        return ConfigError(f"{message} ({self.where})", key=dotted, value=value, allowed=allowed)

    def missing(self, dotted: str, allowed: str) -> ConfigError:
        return ConfigError(
            f"{dotted} is required but missing ({self.where}): {allowed or 'set it'}",
            key=dotted,
            value=None,
            allowed=allowed,
        )

    def path(self, value: str) -> str:
        """A local path resolved against the base directory, or a URI as given."""
        if _URI_RE.match(value):
            if value.startswith("file://"):
                value = value[len("file://") :]
            else:
                return value
        return str((self.base / Path(value).expanduser()).resolve())


#: The sections a run may override (the ingest DAG's ``pipeline`` Param): tuning only, never
#: what identifies the pipeline or its data (name, source, state, sink, parallelism, strategy);
#: their keys that name a host or code only where the file allows it (:data:`GUARDED_OVERRIDES`).
OVERRIDABLE: tuple[str, ...] = ("checkpoint", "backlog", "lease", "notifications", "metrics")


# --------------------------------------------------------------------------- JSON Schema


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a pipeline file."""
    schema = PipelineFile.model_json_schema(mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}


def overrides_json_schema() -> dict[str, Any]:
    """The JSON Schema of a run's overrides (the ingest DAG's ``pipeline`` Param): the
    sections of :data:`OVERRIDABLE`, each as in the file."""
    schema = PipelineFile.model_json_schema(mode="validation")
    properties = {key: schema["properties"][key] for key in OVERRIDABLE}
    used = json.dumps(properties)
    defs = {name: d for name, d in schema["$defs"].items() if f'"#/$defs/{name}"' in used}
    for d in list(defs.values()):  # one level of nesting: a section's enums
        text = json.dumps(d)
        defs.update({n: x for n, x in schema["$defs"].items() if f'"#/$defs/{n}"' in text})
    return {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
        "$defs": defs,
    }


# --------------------------------------------------------------------------- validation


def validate_shape(
    data: Mapping[str, Any], where: str, base: str | os.PathLike[str] | None = None, *, imports: bool = True
) -> PipelineFile:
    """``data`` as a :class:`PipelineFile`, its locations resolved against ``base`` (default: the
    working directory); the first mistake raises ConfigError (contracts 3 and 4). ``imports=False``:
    the callables and Kafka client settings are not imported to be checked (a read-only command)."""
    try:
        return PipelineFile.model_validate(data, context={"where": where, "base": base, "imports": imports})
    except ValidationError as err:
        errors = err.errors()
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        raise _config_error(first, where) from None


_TYPE_ERRORS = ("_type", "_parsing")
_NAMES = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "a list"}


def type_name(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    return _NAMES.get(type(value), type(value).__name__)


def did_you_mean(word: str, choices: tuple[str, ...] | list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {prefix + close[0]!r}?" if close else ""


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "none", "constrained-str"})


def _walk(loc: tuple[int | str, ...]) -> tuple[FieldInfo | None, list[str]]:
    """The field the last named part of ``loc`` is (None past a mapping of free keys), and the
    dotted key's parts."""
    model: type[BaseModel] | None = PipelineFile
    info: FieldInfo | None = None
    parts: list[str] = []
    for item in loc:
        if item == "[mapping]":  # the mapping form of transform (its discriminator's tag)
            model = TransformSection
            continue
        if isinstance(item, str) and (item in _UNION_TAGS or "[" in item):
            continue  # "[key]", and the branch of a union pydantic tried ("str", "list[str]")
        parts.append(str(item))
        if model is not None and isinstance(item, str) and item in model.model_fields:
            info = model.model_fields[item]
            nested = info.annotation
            model = nested if isinstance(nested, type) and issubclass(nested, BaseModel) else None
        else:
            model = None
    return info, parts


def _allowed(info: FieldInfo | None) -> str:
    if info is None:
        return "a value of the documented type"
    annotation = info.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "a mapping with keys " + ", ".join(annotation.model_fields)
    return info.description or "a value of the documented type"


def _choices(info: FieldInfo | None) -> list[str]:
    if info is None:
        return []
    annotation = info.annotation
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [m.value for m in annotation]
    extra = info.json_schema_extra
    return list(extra["enum"]) if isinstance(extra, dict) and "enum" in extra else []  # type: ignore[arg-type]


def _config_error(error: Any, where: str) -> ConfigError:
    loc: tuple[int | str, ...] = tuple(error["loc"])
    info, parts = _walk(loc)
    dotted = ".".join(parts)
    value = error.get("input")
    if "client" in parts[:2] and parts[0] == "source":
        value = "<not shown>"  # client settings may hold secrets (contract 3)
    kind = error["type"]
    if kind == "extra_forbidden":
        known = tuple(_model_at(parts[:-1]).model_fields)
        prefix = ".".join(parts[:-1]) + "." if len(parts) > 1 else ""
        section = f"under {prefix.rstrip('.')}" if prefix else "at the top level"
        message = f"unknown key {dotted}={value!r} ({where}): allowed keys {section} are {', '.join(known)}"
        hint = did_you_mean(parts[-1], known, prefix=prefix)
        if hint:
            message += f"; {hint}"
        return ConfigError(message, key=dotted, value=value, allowed=known)
    core_error = error.get("ctx", {}).get("error")
    if isinstance(core_error, InvalidParameterError):  # the core rejected it (contract 2)
        dotted = dotted if core_error.name == parts[-1] else f"{dotted}.{core_error.name}"
        value = core_error.value
        wrong_type = isinstance(value, bool) or not isinstance(value, int | float)
        hint = f"; got {type_name(value)}" if wrong_type else ""
        if core_error.hint:
            hint += f"; {core_error.hint}"
        return ConfigError(
            f"{dotted}={value!r} is not allowed: {core_error.allowed}{hint} ({where})",
            key=dotted,
            value=value,
            allowed=core_error.allowed,
        )
    allowed = _allowed(info)
    if kind == "missing":
        return ConfigError(
            f"{dotted} is required but missing ({where}): {allowed}", key=dotted, value=None, allowed=allowed
        )
    hint = ""
    choices = _choices(info)
    if choices and isinstance(value, str):
        hint = did_you_mean(value, choices)
    elif kind.endswith(_TYPE_ERRORS) or (kind in ("enum", "value_error") and not isinstance(value, str)):
        hint = f"got {type_name(value)}"
    message = f"{dotted}={value!r} is not allowed: {allowed}"
    if hint:
        message += f"; {hint}"
    return ConfigError(f"{message} ({where})", key=dotted, value=value, allowed=allowed)


def _model_at(parts: list[str]) -> type[BaseModel]:
    model: type[BaseModel] = PipelineFile
    for part in parts:
        annotation = model.model_fields[part].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            break
        model = annotation
    return model
