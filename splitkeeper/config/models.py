"""The pipeline file: pydantic v2 models, the one definition of its shape, defaults and rules.

Contract:

1. :class:`PipelineConfig` and its section models name every key a pipeline file may
   hold (``extra="forbid"``), the type of each value, the choices of each enum-like key,
   its default and its range. They are frozen. Each field's ``description`` is the "what is
   allowed" of its error message and of the JSON Schema. The defaults the protocol core and
   the simulator need too come from :mod:`splitkeeper.core.defaults` (stated there once).
   A validated :class:`PipelineConfig` is what the rest of splitkeeper reads: its sections
   themselves, their locations resolved (absolute, or URIs as given).
2. ``source`` and ``sink`` are sections of their kind (:mod:`splitkeeper.kinds`: the files and
   Kafka sources, the Delta sink, a plug-in's): ``kind`` chooses the section's model (a sink
   without ``kind`` is a Delta sink), which names every other key and validates it
   (:mod:`splitkeeper.config.base` contract 2); an option of another kind of the same role is
   refused naming the kind that has it.
3. The ``checkpoint`` and ``backlog`` sections are the protocol core's own dataclasses
   (:class:`~splitkeeper.core.settings.CheckpointSettings`,
   :class:`~splitkeeper.core.backlog.BacklogConfig`), and ``decode`` is the records package's
   :class:`~splitkeeper.records.spec.DecodeSpec`: each section validates into its dataclass, whose
   own checks decide the values (the message is theirs); ``parallelism``'s top is
   :data:`splitkeeper.config.limits.MAX_PARALLELISM`.
4. Every rule that spans keys (the ``weighted`` section only with ``strategy: weighted``, an
   importable ``notifications.on_failure``, ``checks.actions`` and ``transform`` (marked for their place:
   :mod:`splitkeeper.callables`), the staging location, the dead-letter table, the sink's own
   rules (:meth:`~splitkeeper.config.base.SinkSection.checked`), and the placement of every
   location) lives in one validator, :meth:`PipelineConfig._cross_keys`, which runs once the shape
   is valid and resolves the locations against the validation context's ``base`` directory.
5. :func:`validate_shape` turns the first pydantic error into a
   :class:`~splitkeeper.errors.ConfigError` in the house format: the dotted key, the value
   given, what is allowed, and for an unknown key the allowed keys of its section and the
   closest one ("did you mean"). Values of ``source.client`` are never shown, and no
   ConfigError shows a secret whatever its key (:class:`~splitkeeper.errors.ConfigError`).
6. A ``null`` value counts as not given (the default applies; a required key is missing), but
   for ``airflow.schedule``, where null means the ingest DAG is triggered only.
7. :func:`json_schema` is the JSON Schema (draft 2020-12) of the file, what
   ``splitkeeper config schema`` prints and the Airflow trigger form validates against: ``source``
   and ``sink`` are one of their kinds' sections.

:mod:`splitkeeper.config.settings` reads files into these models, and
:func:`~splitkeeper.config.settings.core_settings` gives the driver its settings. This module
imports the config's base and limits, the kinds' registry, the core, the records' decode spec and
the callables.
"""

from __future__ import annotations

import enum
import json
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic.fields import FieldInfo

from splitkeeper import kinds
from splitkeeper.callables import Role, resolve_callable
from splitkeeper.config.base import (
    CONN_ID_PATTERN,
    SECONDS,
    STORE_CONNECTION,
    Location,
    Section,
    SinkSection,
    SourceKind,
    SourceSection,
    Text,
    Where,
    choice,
    core_section,
    did_you_mean,
    is_uri,
    join,
    one_of,
    section_model,
    type_name,
    validated_as,
    where_of,
)
from splitkeeper.config.limits import (
    MAX_CONCURRENT_REGIONS,
    MAX_PARALLELISM,
    check_max_concurrent_regions,
    check_parallelism,
)
from splitkeeper.core import defaults
from splitkeeper.core.assignment import STRATEGIES
from splitkeeper.core.backlog import BacklogConfig
from splitkeeper.core.rescale import Redistribution
from splitkeeper.core.settings import CheckpointSettings
from splitkeeper.errors import REDACTED, ConfigError, InvalidParameterError, is_secret_key
from splitkeeper.records.spec import DecodeSpec, decode_spec_of
from splitkeeper.transforms import is_batch, resolve_transform

__all__ = [
    "DEFAULT_SCHEDULE",
    "GUARDED_OVERRIDES",
    "IDENTITY_TRANSFORM",
    "ON_NEW_DATA",
    "OVERRIDABLE",
    "REDACTED",
    "STRATEGY_NAMES",
    "DecodeKind",
    "NewFields",
    "OperatorState",
    "PipelineConfig",
    "Readers",
    "RegionMode",
    "SourceKind",
    "Tolerance",
    "TransformKind",
    "is_secret_key",
    "json_schema",
    "overrides_json_schema",
    "validate_shape",
]

#: The assignment strategies of the protocol core (protocol rule 1.6), by config name.
STRATEGY_NAMES: tuple[str, ...] = tuple(sorted(STRATEGIES))
IDENTITY_TRANSFORM = "splitkeeper.transforms:identity"
SCHEMA_ID = "https://splitkeeper.invalid/schemas/pipeline.json"

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
CALLABLE_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
OTLP_PATTERN = r"^https?://[^\s/]+"

_CRON_FIELD_RE = re.compile(r"^[0-9A-Za-z*/,?#-]+$")
_Text = Text
_Section = Section
_one_of = one_of
_choice = choice
_SECONDS = SECONDS
_STORE_CONNECTION = STORE_CONNECTION


# --------------------------------------------------------------------------- choices


class RegionMode(enum.Enum):
    """Whether readers form independent regions (protocol rule 2.9).

    ``PER_READER``: each reader and what follows it without a shuffle is a
    region; regional checkpoints are allowed. ``GLOBAL``: readers are not
    independent (a shuffle between them), so every checkpoint is global.
    """

    PER_READER = "per_reader"
    GLOBAL = "global"


class Readers(enum.Enum):
    """How an epoch's region tasks are launched (:mod:`splitkeeper.spark.readers`).

    ``PER_EPOCH`` (the default): each epoch's regions are the tasks of a Spark job of their own,
    which ends with the epoch (no core is held between epochs). ``LONG_LIVED``: one Spark job,
    started with the first epoch that reads, keeps a task per core that serves the regions of every
    epoch until the run ends (no job launch per epoch: for continuous runs with a latency goal).
    """

    PER_EPOCH = "per_epoch"
    LONG_LIVED = "long_lived"


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
    JSON_SCHEMA = "json_schema"  # JSON in the Confluent wire format, checked by its registry schema


class NewFields(enum.Enum):
    """``decode.on_new_fields``: a field the declared schema does not name (Auto Loader's meanings)."""

    RESCUE = "rescue"  # into the ``_rescued`` column as JSON: nothing lost
    ADD_COLUMNS = "add_columns"  # the sink's schema widens in the epoch's own commit
    FAIL = "fail"  # the region fails naming the field, split and offset


class Tolerance(enum.Enum):
    """``errors.tolerance``: what a bad record does (Kafka Connect's ``errors.tolerance``)."""

    NONE = "none"  # it fails its region, naming split and offset
    ALL = "all"  # it goes to the dead-letter table, with its stage and error


class TransformKind(enum.Enum):
    """``transform.kind``: where the pipeline's transform runs."""

    PYTHON = "python"  # in each region task, on its records (a @transform/@vectorized/@batch_transform)
    SPARK = "spark"  # on Spark, over an epoch's acknowledged records: fn(DataFrame) -> DataFrame


def _strategy(value: str) -> str:
    if value not in STRATEGY_NAMES:
        raise ValueError(_one_of(STRATEGY_NAMES))
    return value


def _parallelism(value: Any) -> int:
    return check_parallelism(value)


def _max_concurrent_regions(value: Any) -> int | None:
    return None if value is None else check_max_concurrent_regions(value)


class RequiredPath(_Section):
    path: _Text = Field(description="a path (relative to the file's directory) or a URI")
    connection: _Text | None = Field(None, pattern=CONN_ID_PATTERN, description=_STORE_CONNECTION)


class OptionalPath(_Section):
    path: _Text | None = Field(
        None,
        description="a local directory (one host) or an S3 prefix (s3://, s3a://; a cluster's choice); "
        "default <state>/_staging",
    )

    @property
    def folder(self) -> str:
        """The staging folder of a validated pipeline (resolved; default ``<state>/_staging``)."""
        if self.path is None:
            raise ConfigError(
                "staging.path was not resolved: validate the pipeline first", key="staging.path"
            )
        return self.path


class RegistrySection(_Section):
    """``decode.registry``: a Confluent-compatible schema registry and how to reach it (kind avro).
    The connection (inside Airflow) fills in the keys the file leaves out."""

    url: _Text | None = Field(
        None, pattern=r"^https?://[^\s/]+", description="the registry's 'http(s)://host:port[/path]'"
    )
    connection: _Text | None = Field(
        None,
        pattern=CONN_ID_PATTERN,
        description="an Airflow connection id of type 'splitkeeper_schema_registry': inside Airflow "
        "its URL, user, password and TLS settings fill the ones this file leaves out",
    )
    user: _Text | None = Field(None, description="HTTP basic auth user (with password)")
    password: _Text | None = Field(None, description="HTTP basic auth password (with user)")
    bearer_token: _Text | None = Field(None, description="a static bearer token (not with user/password)")
    logical_cluster: _Text | None = Field(
        None, description="Confluent Cloud's logical cluster id, sent with a bearer token"
    )
    ssl_ca_location: _Text | None = Field(None, description="a CA certificate file (or folder) to trust")
    ssl_certificate_location: _Text | None = Field(None, description="the client certificate file (mTLS)")
    ssl_key_location: _Text | None = Field(None, description="the client key file (mTLS)")
    ssl_key_password: _Text | None = Field(None, description="the client key's password")


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
    registry: RegistrySection | None = Field(
        None, description="a schema registry: url or connection, auth and TLS (kind avro)"
    )
    reader_schema_file: _Text | None = Field(
        None,
        description="an Avro reader schema (.avsc), kind avro with a registry: each record is resolved "
        "from its writer schema to it, and its fields are the sink's columns",
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


def _decode_spec(section: Any, info: ValidationInfo) -> DecodeSpec:
    """The spec of a validated ``decode`` section (:func:`~splitkeeper.records.spec.decode_spec_of`)."""
    at = where_of(info)
    return decode_spec_of(section, base=at.base, where=at.where)


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


class ChecksSection(_Section):
    """``checks``: what the restart checks (``validate``) do beyond their suites."""

    actions: list[Annotated[_Text, Field(pattern=CALLABLE_PATTERN)]] = Field(
        default_factory=list,
        description="Great Expectations actions the restart checks' checkpoint runs after its Data Docs "
        "update, passed or failed: each 'module:function' naming a function marked "
        "@splitkeeper.checkpoint_action that returns a great_expectations.checkpoint.ValidationAction, "
        "e.g. 'mypkg.gx_actions:notify_slack' (default none)",
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


def _transform_form(value: Any) -> str:
    """``transform`` is a ``'module:function'`` string or a ``{kind, function}`` mapping."""
    return "[mapping]" if isinstance(value, Mapping | TransformSection) else "[module:function]"


if TYPE_CHECKING:  # the values the rest reads (pydantic validates them through their sections)
    CheckpointField = CheckpointSettings
    BacklogField = BacklogConfig
    DecodeField = DecodeSpec
else:
    CheckpointField = core_section(
        CheckpointSettings,
        "CheckpointSection",
        exclude=("regions_independent",),
        doc="The ``checkpoint`` section: the core's checkpoint settings plus retention.",
    )
    BacklogField = core_section(
        BacklogConfig,
        "BacklogSection",
        doc="Epoch size and checkpoint interval while processing backlog versus afterwards.",
    )
    DecodeField = validated_as(DecodeSpec, DecodeSection, _decode_spec)


class PipelineConfig(_Section):
    """A splitkeeper pipeline file (YAML or TOML), or an Airflow ``dag_run.conf`` mapping; validated,
    the pipeline as the rest of splitkeeper reads it (contract 1)."""

    model_config = ConfigDict(title="splitkeeper pipeline")

    name: _Text = Field(
        pattern=NAME_PATTERN,
        description="letters, digits, '_', '.', '-', starting with a letter or digit (1-64)",
    )
    source: SourceSection = Field(
        description="where records come from: a source kind's section (files, kafka, or a plug-in's)"
    )
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
    readers: Readers = _choice(Readers, Readers.PER_EPOCH)
    strategy: Annotated[str, AfterValidator(_strategy)] = Field(
        defaults.STRATEGY,
        description=_one_of(STRATEGY_NAMES),
        json_schema_extra={"enum": list(STRATEGY_NAMES)},
    )
    checkpoint: CheckpointField = CheckpointSettings()
    backlog: BacklogField = BacklogConfig()
    state: RequiredPath = Field(description="where the state tables live")
    sink: SinkSection = Field(description="where records go: a sink kind's section (delta, the default)")
    decode: DecodeField = DecodeSpec()
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
    checks: ChecksSection = ChecksSection.model_validate({})
    lease: LeaseSection = LeaseSection.model_validate({})
    maintenance: MaintenanceSection = MaintenanceSection.model_validate({})
    metrics: MetricsSection = MetricsSection.model_validate({})
    airflow: AirflowSection = AirflowSection.model_validate({})
    overrides: OverridesSection = OverridesSection.model_validate({})

    _origin: str = PrivateAttr("")

    @model_validator(mode="before")
    @classmethod
    def _by_kind(cls, data: Any, info: ValidationInfo) -> Any:
        """Contract 2: ``source`` and ``sink`` validated by their kind's section model; a mistake in
        one raises the house ConfigError at once."""
        if not isinstance(data, Mapping):
            return data
        at = where_of(info)
        data = dict(data)
        for role in ("source", "sink"):
            raw = data.get(role)
            if isinstance(raw, Mapping):
                data[role] = _section_of_kind(role, raw, at, info.context)
        return data

    @model_validator(mode="after")
    def _cross_keys(self, info: ValidationInfo) -> PipelineConfig:
        """Every rule that spans keys (contract 4), in this order; ConfigError names the key.
        Returns the pipeline with its locations resolved."""
        at = where_of(info)
        _check_weighted(self, at)
        on_failure = self.notifications.on_failure
        if on_failure is not None and at.imports:
            try:
                resolve_callable(on_failure, "notifications.on_failure", Role.NOTIFICATION)
            except ConfigError as err:
                raise at.named(err) from err.__cause__
        for i, spec in enumerate(self.checks.actions if at.imports else ()):
            try:
                resolve_callable(spec, f"checks.actions[{i}]", Role.CHECKPOINT_ACTION)
            except ConfigError as err:
                raise at.named(err) from err.__cause__
        state, staging = _check_locations(self, at)
        _check_transform(self, at)
        if self.readers is Readers.LONG_LIVED and self.transform_kind is TransformKind.SPARK:
            raise at.invalid(
                "readers",
                Readers.LONG_LIVED.value,
                "per_epoch with transform.kind 'spark' (long-lived readers hold their Spark cores for "
                "the run, and the transform's jobs need cores too)",
                "remove readers (per_epoch is the default) or use a Python transform",
            )
        errors = _check_errors(self, at)
        resolved = self.model_copy(
            update={
                "state": state,
                "staging": staging,
                "errors": errors,
                "checkpoint": replace(
                    self.checkpoint, regions_independent=self.regions is RegionMode.PER_READER
                ),
            }
        )
        sink = self.sink.checked(resolved, at)
        sink_places = sink.locations()
        dead = errors.dead_letter.path
        _check_placement(
            [
                *self.source.locations(),
                Location("state.path", state.path, "the state folder holds splitkeeper's own tables"),
                *sink_places[:1],  # the sink's own table first: the messages name the later key
                Location("staging.path", str(staging.path), "staged files are removed after every epoch"),
                *(
                    [Location("errors.dead_letter.path", dead, _DEAD_LETTERS_APART)]
                    if dead is not None
                    else []
                ),
                *sink_places[1:],
            ],
            at,
        )
        resolved = resolved.model_copy(update={"sink": sink})
        resolved._origin = str((info.context or {}).get("origin") or "")
        return resolved

    # -- what the rest reads --------------------------------------------------------------

    @property
    def origin(self) -> str:
        """The file it was loaded from (for messages), "" if built from a mapping."""
        return self._origin

    @property
    def transform_kind(self) -> TransformKind:
        return self.transform.kind if isinstance(self.transform, TransformSection) else TransformKind.PYTHON

    @property
    def transform_function(self) -> str:
        return self.transform.function if isinstance(self.transform, TransformSection) else self.transform

    @property
    def regional_checkpoints(self) -> bool:
        """False when regions are not independent: every checkpoint must then be global."""
        return self.regions is RegionMode.PER_READER

    @property
    def store_connections(self) -> tuple[str, ...]:
        """The Airflow connections the state, the sink and the source (files) name for their
        stores (each once)."""
        named = (self.state.connection, *self.sink.connections(), *self.source.store_connections())
        return tuple(dict.fromkeys(c for c in named if c))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (enums as their values, secrets redacted), e.g. for status output.
        Sections validated into the core's settings (dataclasses, not the declared section models)
        are turned plain by :func:`_plain`, so pydantic's type warnings for them are off."""
        return _plain(self.model_dump(mode="python", by_alias=True, warnings=False))


_DEAD_LETTERS_APART = "it is the dead-letter Delta table, whose upkeep removes what it does not own"


def _plain(value: Any) -> Any:
    import dataclasses

    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if callable(getattr(value, "redacted", None)):  # settings holding secrets (a registry's client)
        return _plain(value.redacted())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def _section_of_kind(role: str, raw: Mapping[str, Any], at: Where, context: Any) -> Any:
    """The section of ``raw``'s kind for ``role`` (``source`` or ``sink``), validated (contract 2)."""
    names = kinds.source_factories() if role == "source" else kinds.sink_factories()
    kind = raw.get("kind")
    if kind is None and role == "sink":
        kind = kinds.DEFAULT_SINK
    allowed = one_of(list(names))
    if kind is None:
        raise at.missing(f"{role}.kind", allowed)
    if not isinstance(kind, str) or kind not in names:
        hint = did_you_mean(kind, list(names)) if isinstance(kind, str) else f"got {type_name(kind)}"
        message = f"{role}.kind={kind!r} is not allowed: {allowed}" + (f"; {hint}" if hint else "")
        raise ConfigError(f"{message} ({at.where})", key=f"{role}.kind", value=kind, allowed=allowed)
    model = _kind_model(role, kind)
    try:
        return model.model_validate(raw, context=context)
    except ValidationError as err:
        errors = err.errors()
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        other = _other_kind(role, kind, first, model)
        if other is not None:
            raise other_kind_error(role, kind, first, model, at) from None
        raise _config_error(first, at.where, root=model, prefix=(role,)) from None


def _kind_model(role: str, kind: str) -> type[BaseModel]:
    factory = kinds.source_factory(kind) if role == "source" else kinds.sink_factory(kind)
    model: type[BaseModel] = factory.section_class()
    return model


def _other_kind(role: str, kind: str, error: Any, model: type[BaseModel]) -> str | None:
    """The kind of ``role`` whose option an unknown key of a ``kind`` section is, or None."""
    if error["type"] != "extra_forbidden" or len(error["loc"]) != 1:
        return None
    key = str(error["loc"][0])
    names = kinds.source_factories() if role == "source" else kinds.sink_factories()
    for other in names:
        if other == kind:
            continue
        try:
            fields = _kind_model(role, other).model_fields
        except Exception:  # noqa: BLE001 - a kind that cannot be loaded has no options to name
            continue
        if key in fields:
            return other
    return None


def other_kind_error(role: str, kind: str, error: Any, model: type[BaseModel], at: Where) -> ConfigError:
    """An option of another kind given to a ``kind`` section: ConfigError naming the kind's own options."""
    key = str(error["loc"][0])
    own = [name for name in model.model_fields if name != "kind"]
    value = error.get("input")
    shown = "<not shown>" if key == "client" or is_secret_key(key) else value
    return at.invalid(
        f"{role}.{key}",
        shown,
        f"no {key} for {role}.kind {kind!r}; its options are: {', '.join(own)}",
    )


# --------------------------------------------------------------------------- cross-key rules


def _check_transform(file: PipelineConfig, at: Where) -> None:
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
    if spec != IDENTITY_TRANSFORM and not is_batch(function) and file.decode.kind != DecodeKind.TEXT.value:
        raise at.invalid(
            key,
            spec,
            "a @batch_transform (RecordBatch -> RecordBatch) for decode.kind "
            f"{file.decode.kind!r}; a @transform or @vectorized function works on text values",
            "set decode.kind: text to give it each record's value as a string (invalid UTF-8 becomes a "
            "bad record), or mark it @batch_transform",
        )


def _check_weighted(file: PipelineConfig, at: Where) -> None:
    """``weighted``: reader capacities and the imbalance that re-weights (strategy ``weighted`` only)."""
    given = file.weighted.given()
    if given and file.strategy != "weighted":
        raise at.invalid(
            f"weighted.{given[0]}",
            getattr(file.weighted, given[0]),
            "nothing unless strategy is 'weighted'",
            "set strategy: weighted",
        )


def _check_errors(file: PipelineConfig, at: Where) -> ErrorsSection:
    """``errors``: the dead-letter table is given exactly when ``tolerance: all``; resolved."""
    errors = file.errors
    dead = errors.dead_letter.path
    if errors.tolerance is Tolerance.ALL and dead is None:
        raise at.missing(
            "errors.dead_letter.path",
            "the dead-letter Delta table bad records go to (errors.tolerance is 'all')",
        )
    if errors.tolerance is Tolerance.NONE and dead is not None:
        raise at.invalid(
            "errors.dead_letter.path",
            dead,
            "nothing unless errors.tolerance is 'all' (with 'none' a bad record fails its region)",
            "set errors.tolerance: all",
        )
    if dead is None:
        return errors
    return errors.model_copy(
        update={"dead_letter": errors.dead_letter.model_copy(update={"path": at.path(dead)})}
    )


def _check_locations(file: PipelineConfig, at: Where) -> tuple[RequiredPath, OptionalPath]:
    """The state and staging locations, resolved. Staging is a local folder or an S3 prefix
    (:mod:`splitkeeper.staging` rule 5); its default is ``<state>/_staging``, on the store when state is."""
    state_path = at.path(file.state.path)
    staging_path = None if file.staging.path is None else at.path(file.staging.path)
    allowed = "a local directory (one host) or an S3 prefix (s3://, s3a://; a cluster's choice)"
    if staging_path is None:
        staging_path = join(state_path, "_staging")
        if is_uri(staging_path) and not _S3_URI.match(staging_path):
            raise at.missing(
                "staging.path",
                f"{allowed}: state.path {state_path} is on a store staged files cannot use (region tasks "
                "and the sink reach them with pyarrow's S3 file system), so the default <state>/_staging "
                "cannot be used",
            )
    elif is_uri(staging_path) and not _S3_URI.match(staging_path):
        raise at.invalid(
            "staging.path",
            staging_path,
            allowed,
            "region tasks and the sink reach staged files with pyarrow's S3 file system",
        )
    return (
        file.state.model_copy(update={"path": state_path}),
        file.staging.model_copy(update={"path": staging_path}),
    )


#: The object-store URIs staging can be on (:mod:`splitkeeper.staging` rule 5).
_S3_URI = re.compile(r"^s3[an]?://[^/]+", re.IGNORECASE)


def _check_placement(places: list[Location], at: Where) -> None:
    """The source, state, sink, staging, dead-letter and change table locations (resolved: absolute,
    ``~`` expanded, symlinks followed) may not be one another or lie inside one another; the one
    exception is staging inside state (the default ``<state>/_staging``). A local path and a URI never
    overlap; ``s3a://`` and ``s3n://`` are ``s3://``. ConfigError names the inner (or later) key."""
    for i, (key, path, _why) in enumerate((p.key, p.path, p.why) for p in places):
        for j, (other_key, other, why) in enumerate((p.key, p.path, p.why) for p in places):
            if i == j:
                continue
            if _same_location(path, other) and j < i:
                allowed = f"a location different from {other_key} {other}"
            elif _inside(path, other) and (key, other_key) != ("staging.path", "state.path"):
                allowed = f"a location outside {other_key} {other}"
            else:
                continue
            if key.startswith("source."):
                why = f"splitkeeper writes and cleans up {other_key}"
            raise at.invalid(key, path, allowed, f"{why}; move one of them")


def _location(path: str) -> str:
    return re.sub(r"^s3[an]://", "s3://", path, flags=re.IGNORECASE).rstrip("/")


def _same_location(a: str, b: str) -> bool:
    return _location(a) == _location(b)


def _inside(inner: str, outer: str) -> bool:
    return _location(inner).startswith(_location(outer) + "/")


#: The sections a run may override (the ingest DAG's ``pipeline`` Param): tuning only, never
#: what identifies the pipeline or its data (name, source, state, sink, parallelism, strategy);
#: their keys that name a host or code only where the file allows it (:data:`GUARDED_OVERRIDES`).
OVERRIDABLE: tuple[str, ...] = ("checkpoint", "backlog", "lease", "notifications", "metrics")


# --------------------------------------------------------------------------- JSON Schema


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a pipeline file: ``source`` and ``sink`` are one of their
    kinds' sections (contract 7)."""
    schema = PipelineConfig.model_json_schema(mode="validation")
    defs = schema.setdefault("$defs", {})
    for role, names in (("source", kinds.source_factories()), ("sink", kinds.sink_factories())):
        options = []
        for name in names:
            model = _kind_model(role, name)
            part = model.model_json_schema(mode="validation", ref_template="#/$defs/{model}")
            defs.update(part.pop("$defs", {}))
            defs[model.__name__] = part
            options.append({"$ref": f"#/$defs/{model.__name__}"})
        described = schema["properties"][role].get("description")
        schema["properties"][role] = {"oneOf": options, "description": described}
    for base in ("SourceSection", "SinkSection"):
        defs.pop(base, None)
    for prop in schema["properties"].values():  # a section's default: its keys' defaults
        ref = prop.get("$ref", "")
        section = defs.get(ref.rpartition("/")[2]) if ref else None
        if section is not None and "default" in prop:
            keys = section.get("properties", {})
            prop["default"] = {key: value["default"] for key, value in keys.items() if "default" in value}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}


def overrides_json_schema() -> dict[str, Any]:
    """The JSON Schema of a run's overrides (the ingest DAG's ``pipeline`` Param): the
    sections of :data:`OVERRIDABLE`, each as in the file."""
    schema = json_schema()
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
    data: Mapping[str, Any],
    where: str,
    base: str | os.PathLike[str] | None = None,
    *,
    imports: bool = True,
    origin: str = "",
) -> PipelineConfig:
    """``data`` as a :class:`PipelineConfig`, its locations resolved against ``base`` (default: the
    working directory); the first mistake raises ConfigError (contracts 4 and 5). ``imports=False``:
    the callables and client settings are not imported to be checked (a read-only command)."""
    context = {"where": where, "base": base, "imports": imports, "origin": origin}
    try:
        return PipelineConfig.model_validate(data, context=context)
    except ValidationError as err:
        errors = err.errors()
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        raise _config_error(first, where) from None


_TYPE_ERRORS = ("_type", "_parsing")
_UNION_TAGS = frozenset({"str", "int", "float", "bool", "none", "constrained-str"})


_UNION_TAGS = frozenset(
    {
        "str",
        "int",
        "float",
        "bool",
        "none",
        "constrained-str",
        "tuple[constrained-str, ...]",
        "list[constrained-str]",
    }
)


def _field_model(info: FieldInfo) -> type[BaseModel] | None:
    """The section model a field's keys are (its own model, or the section it validates through)."""
    nested = info.annotation
    if isinstance(nested, type) and issubclass(nested, BaseModel):
        return nested
    return section_model(list(info.metadata))


def _walk(loc: tuple[int | str, ...], root: type[BaseModel]) -> tuple[FieldInfo | None, list[str]]:
    """The field the last named part of ``loc`` is (None past a mapping of free keys), and the
    dotted key's parts."""
    model: type[BaseModel] | None = root
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
            model = _field_model(info)
        else:
            model = None
    return info, parts


def _allowed(info: FieldInfo | None) -> str:
    if info is None:
        return "a value of the documented type"
    nested = _field_model(info)
    for base, role in ((SourceSection, "source"), (SinkSection, "sink")):
        if nested is base:  # ``kind`` first, then every kind's own keys, then those all kinds have
            keys = dict.fromkeys(["kind"])
            names = kinds.source_factories() if role == "source" else kinds.sink_factories()
            for name in names:
                keys.update(
                    dict.fromkeys(
                        k for k in _kind_model(role, name).model_fields if k not in base.model_fields
                    )
                )
            keys.update(dict.fromkeys(base.model_fields))
            return "a mapping with keys " + ", ".join(keys)
    if nested is not None:
        return "a mapping with keys " + ", ".join(nested.model_fields)
    return info.description or "a value of the documented type"


def _choices(info: FieldInfo | None) -> list[str]:
    if info is None:
        return []
    annotation = info.annotation
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [m.value for m in annotation]
    extra = info.json_schema_extra
    return list(extra["enum"]) if isinstance(extra, dict) and "enum" in extra else []  # type: ignore[arg-type]


def _config_error(
    error: Any, where: str, *, root: type[BaseModel] = PipelineConfig, prefix: tuple[str, ...] = ()
) -> ConfigError:
    loc: tuple[int | str, ...] = tuple(error["loc"])
    info, inner = _walk(loc, root)
    parts = [*prefix, *inner]
    dotted = ".".join(parts)
    value = error.get("input")
    if "client" in parts[:2] and parts[0] == "source":
        value = "<not shown>"  # client settings may hold secrets
    kind = error["type"]
    if kind == "extra_forbidden":
        known = tuple(_model_at(inner[:-1], root).model_fields)
        prefix_text = ".".join(parts[:-1]) + "." if len(parts) > 1 else ""
        section = f"under {prefix_text.rstrip('.')}" if prefix_text else "at the top level"
        message = f"unknown key {dotted}={value!r} ({where}): allowed keys {section} are {', '.join(known)}"
        hint = did_you_mean(parts[-1], known, prefix=prefix_text)
        if hint:
            message += f"; {hint}"
        return ConfigError(message, key=dotted, value=value, allowed=known)
    core_error = error.get("ctx", {}).get("error")
    if isinstance(core_error, InvalidParameterError):  # the core rejected it (contract 3)
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


def _model_at(parts: list[str], root: type[BaseModel]) -> type[BaseModel]:
    model: type[BaseModel] = root
    for part in parts:
        nested = _field_model(model.model_fields[part])
        if nested is None:
            break
        model = nested
    return model
