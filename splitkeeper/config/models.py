"""The schema of the pipeline file: pydantic v2 models, the one definition of its shape.

Contract:

1. :class:`PipelineFile` and its section models name every key a pipeline file may
   hold (``extra="forbid"``), the type of each value, the choices of each enum-like key
   (taken from the enums of :mod:`splitkeeper.config.settings` and the core's strategy
   table) and the ranges of the keys the protocol core does not own. Each field's
   ``description`` is the "what is allowed" of its error message and of the JSON Schema.
2. The ``checkpoint`` and ``backlog`` sections are generated from the core's own config
   dataclasses (names, types, defaults): their valid values stay the core's decision
   (:func:`splitkeeper.config.settings.config_from_mapping` builds the core objects, which
   validate them); the same goes for ``parallelism``, whose maximum is the runtime's limit
   (:data:`splitkeeper.spark.regions.MAX_PARALLELISM`).
3. :func:`validate_shape` turns the first pydantic error into a
   :class:`~splitkeeper.errors.ConfigError` in the house format: the dotted key, the value
   given, what is allowed, and for an unknown key the allowed keys of its section and the
   closest one ("did you mean"). Values of ``source.client`` are never shown.
4. A ``null`` value counts as not given (the default applies; a required key is missing).
5. :func:`json_schema` is the JSON Schema (draft 2020-12) of the file, what
   ``splitkeeper config schema`` prints and the Airflow trigger form validates against.

Cross-key rules (the options of the other source kind, topics xor topic_pattern, path
resolution, state/sink/staging placement, importable transform) are checked after the
shape, by the builder in :mod:`splitkeeper.config.settings`.
"""

from __future__ import annotations

import difflib
import enum
import json
from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic.fields import FieldInfo

from splitkeeper.config import settings as _config  # config imports this module lazily, when it validates
from splitkeeper.core.assignment import validate_parallelism
from splitkeeper.core.backlog import BacklogConfig
from splitkeeper.core.types import SplitChangePolicy
from splitkeeper.errors import ConfigError, InvalidParameterError
from splitkeeper.spark.regions import MAX_PARALLELISM, check_parallelism

STRATEGY_NAMES = _config.STRATEGY_NAMES
SCHEMA_ID = "https://splitkeeper.invalid/schemas/pipeline.json"

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
CALLABLE_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
STARTING_PATTERN = r"^(earliest|latest|group|timestamp:[0-9]+)$"
OTLP_PATTERN = r"^https?://[^\s/]+"

_Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


def _one_of(values: tuple[str, ...] | list[str]) -> str:
    return "one of " + ", ".join(values)


def _strategy(value: str) -> str:
    if value not in STRATEGY_NAMES:
        raise ValueError(_one_of(STRATEGY_NAMES))
    return value


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


_SECONDS = "a number of seconds > 0"


class SourceSection(_Section):
    """``source``: ``kind`` chooses the reader; the options of the other kind may not be given."""

    kind: _config.SourceKind = _choice(_config.SourceKind)
    # files
    path: _Text | None = Field(None, description="the directory (or file) to ingest")
    format: _config.FileFormat = _choice(_config.FileFormat, _config.FileFormat.LINES)
    split_bytes: int = Field(0, ge=0, description="an integer >= 0 (0: one split per file)")
    on_file_change: SplitChangePolicy = _choice(SplitChangePolicy, SplitChangePolicy.FAIL)
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
    on_offset_out_of_range: _config.OffsetOutOfRange = _choice(
        _config.OffsetOutOfRange, _config.OffsetOutOfRange.FAIL
    )
    connect_timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False, description=_SECONDS)
    read_timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False, description=_SECONDS)
    client: dict[str, Any] = Field(
        default_factory=dict,
        description="a mapping of Kafka client settings (librdkafka names) to strings, numbers or booleans",
        json_schema_extra={"additionalProperties": {"type": ["string", "number", "boolean"]}},
    )


FILE_KEYS = ("path", "format", "split_bytes", "on_file_change")
KAFKA_KEYS = tuple(k for k in SourceSection.model_fields if k != "kind" and k not in FILE_KEYS)

_JSON_TYPES = {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}


class _CoreSection(_Section):
    """A section that is a core config dataclass: the core's constructor validates it (contract 2)."""

    core_type: ClassVar[type[Any]]

    @model_validator(mode="after")
    def _core_validates(self) -> _CoreSection:
        self.build()
        return self

    def build(self, **extra: Any) -> Any:
        """The core object of the keys given (the core's own defaults for the others)."""
        values = {name: getattr(self, name) for name in self.given()}
        floats = {f.name for f in fields(self.core_type) if f.type == "float"}
        for name in floats & set(values):
            if isinstance(values[name], int) and not isinstance(values[name], bool):
                values[name] = float(values[name])
        return self.core_type(**values, **extra)


def _core_section(name: str, dataclass: type[Any], skip: tuple[str, ...] = ()) -> type[_CoreSection]:
    """A section model with the fields (names, types, defaults) of a core config dataclass."""
    spec: dict[str, Any] = {}
    for f in fields(dataclass):
        if f.name in skip:
            continue
        default = f.default if f.default is not MISSING else ...
        if isinstance(default, enum.Enum):
            spec[f.name] = (type(default), _choice(type(default), default))
            continue
        json_type = _JSON_TYPES[str(f.type)]
        description = f"{json_type} (the protocol core checks its range)"
        spec[f.name] = (Any, Field(default, description=description, json_schema_extra={"type": json_type}))
    doc = (dataclass.__doc__ or name).strip().splitlines()[0]
    model = create_model(name, __base__=_CoreSection, __doc__=doc, **spec)
    model.core_type = dataclass
    return model


if TYPE_CHECKING:  # generated classes: to mypy, what they have in common
    CheckpointSection = _CoreSection
    BacklogSection = _CoreSection
else:
    CheckpointSection = _core_section(
        "CheckpointSection", _config.CheckpointSettings, skip=("regions_independent",)
    )
    BacklogSection = _core_section("BacklogSection", BacklogConfig)


class RequiredPath(_Section):
    path: _Text = Field(description="a path (relative to the file's directory) or a URI")


class OptionalPath(_Section):
    path: _Text | None = Field(None, description="a local directory (default <state>/_staging)")


class RescaleSection(_Section):
    operator_state: _config.OperatorState = _choice(_config.OperatorState, _config.OperatorState.EVEN_SPLIT)


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
        1.25, ge=1.0, description="a ratio >= 1.0: the readers' max / min load that makes them rebalance"
    )


class NotificationsSection(_Section):
    on_failure: _Text | None = Field(
        None, pattern=CALLABLE_PATTERN, description="'module:function', e.g. 'mypkg.alerts:page_oncall'"
    )


class LeaseSection(_Section):
    ttl_s: float = Field(60.0, gt=0, allow_inf_nan=False, description=_SECONDS)


class MaintenanceSection(_Section):
    history_hours: float = Field(
        168.0,
        ge=0,
        description="hours >= 0: VACUUM keeps the files removed less than this long ago (time travel "
        "reaches back that far); a fraction of an hour rounds up to the next whole hour",
    )


class MetricsSection(_Section):
    otlp_endpoint: _Text | None = Field(
        None,
        pattern=OTLP_PATTERN,
        description="an http(s):// URL of an OTLP/HTTP collector, e.g. http://localhost:4318",
    )


class PipelineFile(_Section):
    """A splitkeeper pipeline file (YAML or TOML), or an Airflow ``dag_run.conf`` mapping."""

    model_config = ConfigDict(title="splitkeeper pipeline")

    name: _Text = Field(
        pattern=NAME_PATTERN,
        description="letters, digits, '_', '.', '-', starting with a letter or digit (1-64)",
    )
    source: SourceSection = Field(description="where records come from: files or kafka")
    parallelism: Annotated[Any, AfterValidator(validate_parallelism), AfterValidator(check_parallelism)] = (
        Field(
            1,
            description=f"integer from 1 to {MAX_PARALLELISM} (the core checks >= 1, the runtime the top)",
            json_schema_extra={"type": "integer", "maximum": MAX_PARALLELISM},
        )
    )
    regions: _config.RegionMode = _choice(_config.RegionMode, _config.RegionMode.PER_READER)
    strategy: Annotated[str, AfterValidator(_strategy)] = Field(
        "least-loaded", description=_one_of(STRATEGY_NAMES), json_schema_extra={"enum": list(STRATEGY_NAMES)}
    )
    checkpoint: CheckpointSection = CheckpointSection.model_validate({})
    backlog: BacklogSection = BacklogSection.model_validate({})
    state: RequiredPath = Field(description="where the state tables live")
    sink: RequiredPath = Field(description="the sink Delta table")
    staging: OptionalPath = OptionalPath.model_validate({})
    transform: _Text = Field(
        _config.IDENTITY_TRANSFORM,
        pattern=CALLABLE_PATTERN,
        description="'module:function' naming a function marked @splitkeeper.transform, e.g. "
        "'mypkg.transforms:enrich'",
    )
    rescale: RescaleSection = RescaleSection.model_validate({})
    weighted: WeightedSection = WeightedSection.model_validate({})
    notifications: NotificationsSection = NotificationsSection.model_validate({})
    lease: LeaseSection = LeaseSection.model_validate({})
    maintenance: MaintenanceSection = MaintenanceSection.model_validate({})
    metrics: MetricsSection = MetricsSection.model_validate({})


# --------------------------------------------------------------------------- JSON Schema


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a pipeline file."""
    schema = PipelineFile.model_json_schema(mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}


def overrides_json_schema() -> dict[str, Any]:
    """The JSON Schema of a run's overrides (the ingest DAG's ``pipeline`` Param): the
    sections of :data:`~splitkeeper.config.settings.OVERRIDABLE`, each as in the file."""
    schema = PipelineFile.model_json_schema(mode="validation")
    properties = {key: schema["properties"][key] for key in _config.OVERRIDABLE}
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


def validate_shape(data: Mapping[str, Any], where: str) -> PipelineFile:
    """``data`` as a :class:`PipelineFile`; the first mistake raises ConfigError (contract 3)."""
    try:
        return PipelineFile.model_validate(data)
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
