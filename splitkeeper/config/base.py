"""What every section of the pipeline file is built from, the kinds' sections too.

Contract:

1. :class:`Section` is a mapping of the file: unknown keys are mistakes (``extra="forbid"``),
   types are not coerced (``"4"`` is no int), frozen; a ``null`` value counts as not given.
2. :class:`SourceSection` and :class:`SinkSection` are the bases of a source kind's and a sink
   kind's section (``source:``, ``sink:``): ``kind`` names the kind
   (:mod:`splitkeeper.kinds`), the subclass names every other key. A kind's section validates
   its own keys and resolves its locations in its own validators, against :class:`Where`, the
   validation context (:func:`where_of`); :meth:`SourceSection.locations` and
   :meth:`SinkSection.locations` name them for the rule that keeps locations apart, and
   :meth:`SinkSection.checked` applies the sink's rules that span other sections (the decode
   spec, the errors section, the transform).
3. :func:`core_section` validates a section into a dataclass of the protocol core (or of the
   records package): the section's keys are the dataclass's fields, any value reaches the
   dataclass's own checks (its message is the error's), and the value the rest of splitkeeper
   reads is the dataclass. The core stays free of pydantic; the keys are written once.

Imports the standard library, pydantic, the core and :mod:`splitkeeper.errors` only: the kinds'
packages import this module, and the pipeline file's model (:mod:`splitkeeper.config.models`)
imports the kinds only through :mod:`splitkeeper.kinds`.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetPydanticSchema,
    StringConstraints,
    ValidationInfo,
    create_model,
    model_validator,
)
from pydantic_core import core_schema

from splitkeeper.errors import ConfigError

__all__ = [
    "CONN_ID_PATTERN",
    "SECONDS",
    "Location",
    "ReaderMode",
    "KindSection",
    "Section",
    "SinkSection",
    "SourceKind",
    "SourceSection",
    "Text",
    "Where",
    "choice",
    "core_section",
    "section_model",
    "validated_as",
    "did_you_mean",
    "is_uri",
    "join",
    "one_of",
    "sibling",
    "type_name",
    "where_of",
]

CONN_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,250}$"
SECONDS = "a number of seconds > 0"
STORE_CONNECTION = (
    "an Airflow connection id of the Amazon provider's type, e.g. 'aws_default': inside Airflow its "
    "keys, endpoint and region reach the object store (never secrets in this file)"
)

_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
"""A non-empty string, stripped."""


def one_of(values: tuple[str, ...] | list[str]) -> str:
    return "one of " + ", ".join(values)


def choice(enum_type: type[enum.Enum], default: Any = ...) -> Any:
    """A key whose value is one of ``enum_type``'s values (given as the value's text)."""
    return Field(default, strict=False, description=one_of([m.value for m in enum_type]))


def is_uri(value: str) -> bool:
    return _URI_RE.match(value) is not None


def join(base: str, child: str) -> str:
    """``child`` inside ``base`` (a local path or a URI)."""
    return f"{base.rstrip('/')}/{child}" if is_uri(base) else str(Path(base) / child)


def sibling(path: str, suffix: str) -> str:
    """``<path><suffix>``: a table beside ``path`` (a local path or a URI), e.g. the sink's change table."""
    return path.rstrip("/") + suffix


_NAMES = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "a list"}


def type_name(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    return _NAMES.get(type(value), type(value).__name__)


def did_you_mean(word: str, choices: tuple[str, ...] | list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {prefix + close[0]!r}?" if close else ""


class ReaderMode(enum.Enum):
    """What a reader does with the splits restored from its state (protocol rule 1.2, FLIP-537).

    ``DEFERRED`` (the default): it reports them and reads nothing until the enumerator assigns
    (the enumerator places every split, balanced strategies stay balanced). ``LEGACY``: it keeps,
    and reads, what it restored (the behaviour without ``SupportsSplitReassignmentOnRecovery``).
    """

    DEFERRED = "deferred"
    LEGACY = "legacy"


class SourceKind(enum.StrEnum):
    """The product's source kinds (``source.kind``); a plug-in's kind is its own name, a string."""

    FILES = "files"
    KAFKA = "kafka"


# --------------------------------------------------------------------------- where


@dataclass(frozen=True, slots=True)
class Where:
    """The validation context: raises the cross-key mistakes in the house format and resolves paths
    against ``base`` (the file's folder). ``imports``: import what the file names (a transform, a
    notification, a client library) to check it; False for the read-only commands."""

    where: str
    base: Path
    imports: bool = True

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

    def named(self, err: ConfigError) -> ConfigError:
        """``err`` (raised by a check that does not know the file) naming this file."""
        return ConfigError(f"{err.message} ({self.where})", **err.params)

    def path(self, value: str) -> str:
        """A local path resolved against the base directory, or a URI as given."""
        if is_uri(value):
            if value.startswith("file://"):
                value = value[len("file://") :]
            else:
                return value
        return str((self.base / Path(value).expanduser()).resolve())


def where_of(info: ValidationInfo) -> Where:
    """The :class:`Where` of a validation (its context: ``where``, ``base``, ``imports``)."""
    import os

    context = info.context if isinstance(info.context, Mapping) else {}
    return Where(
        str(context.get("where") or "pipeline config"),
        Path(context.get("base") or os.getcwd()).expanduser().resolve(),
        imports=context.get("imports", True) is not False,
    )


# --------------------------------------------------------------------------- sections


class Section(BaseModel):
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


@dataclass(frozen=True, slots=True)
class Location:
    """A place the pipeline reads or writes: its dotted key, where it is (resolved), and why no other
    location may lie inside it (for the message)."""

    key: str
    path: str
    why: str


class KindSection(Section):
    """A section of some kind (``source:``, ``sink:``): ``kind`` names the kind; the subclass
    declares ``kind`` as its one name and every other key of the kind."""

    kind: Any

    @property
    def kind_name(self) -> str:
        """The kind's name, as the file writes it."""
        return str(self.kind.value if isinstance(self.kind, enum.Enum) else self.kind)

    def locations(self) -> list[Location]:
        """The locations this section reads or writes, resolved (none for one that is no path)."""
        return []


class SourceSection(KindSection):
    """``source:``: the base of every source kind's section (contract 2). Every kind has
    ``reader_mode`` (``deferred``: readers wait to be assigned on recovery, FLIP-537; ``legacy``:
    they keep what they restored; protocol rule 1.2)."""

    reader_mode: ReaderMode = choice(ReaderMode, ReaderMode.DEFERRED)
    connection: Text | None = Field(None, pattern=CONN_ID_PATTERN, description=STORE_CONNECTION)

    def store_connections(self) -> tuple[str, ...]:
        """The Airflow connections this source names for its object store (``aws``); a kind that
        reads a connection of its own (Kafka's brokers) overrides this with none."""
        return (self.connection,) if self.connection else ()

    @property
    def deferred_assignment(self) -> bool:
        """Readers wait to be assigned on recovery (``reader_mode: deferred``, protocol rule 1.2)."""
        return self.reader_mode is ReaderMode.DEFERRED

    @property
    def split_change_policy(self) -> Any:
        """What the core does when a split's data changed under it (protocol rule 1.9): the
        source's own setting (files: ``source.on_file_change``), else the core's default (``fail``)."""
        from splitkeeper.core import defaults

        return defaults.ON_FILE_CHANGE

    @property
    def recheck_finished_epochs(self) -> int:
        """Epochs between the checks of finished splits' data (protocol rule 1.9): the source's own
        setting (files: ``source.recheck_finished_every``), else the core's default."""
        from splitkeeper.core import defaults

        return defaults.RECHECK_FINISHED_EVERY


class SinkSection(KindSection):
    """``sink:``: the base of every sink kind's section (contract 2); a file without ``sink.kind`` has
    the product's default sink kind (:data:`splitkeeper.kinds.DEFAULT_SINK`). Its
    :meth:`~KindSection.locations` are the tables it writes, resolved after :meth:`checked`."""

    def connections(self) -> tuple[str, ...]:
        """The Airflow connections this sink names for its store."""
        return ()

    @property
    def staged_partition_by(self) -> tuple[str, ...]:
        """The columns the region tasks partition their staged files by (the sink's partitions)."""
        return ()

    @property
    def upsert(self) -> Any:
        """The sink's upsert rule (:class:`~splitkeeper.records.upsert.UpsertSpec`: the staged rows
        carry a tombstone, a Spark transform's columns are checked against its key), or None."""
        return None

    def checked(self, file: Any, at: Where) -> SinkSection:
        """The rules of this sink that span other sections of ``file`` (the validated pipeline file:
        its ``decode`` spec, ``errors``, ``transform``), applied; returns the section with its
        locations resolved. ConfigError names the key."""
        return self


# --------------------------------------------------------------------------- core sections

D = TypeVar("D")

_JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}


def validated_as(target: type[D], model: type[BaseModel], convert: Callable[[Any, ValidationInfo], D]) -> Any:
    """The annotation of a field whose keys are ``model``'s (its messages, its JSON Schema) and whose
    value is ``convert(validated section, info)``, a ``target`` (contract 3)."""
    return Annotated[
        target,
        GetPydanticSchema(
            lambda _tp, handler: core_schema.with_info_after_validator_function(
                convert, handler.generate_schema(model)
            )
        ),
        _SectionOf(model),
    ]


def core_section(target: type[D], name: str, *, exclude: tuple[str, ...] = (), doc: str = "") -> Any:
    """The annotation of a section validated into the dataclass ``target`` (contract 3).

    The section model (``name``, in the JSON Schema) has one key per field of ``target`` but those
    of ``exclude``: a field typed by an enum is a choice of its values, any other takes any value
    (``target`` checks it; an integer given for a number field arrives as a float) and states the
    JSON type of its annotation. The value is ``target(**keys)``.
    """
    hints = typing.get_type_hints(target)
    fields: dict[str, Any] = {}
    numbers: set[str] = set()
    for f in dataclasses.fields(target):  # type: ignore[arg-type]
        if f.name in exclude:
            continue
        hint = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else ...
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            fields[f.name] = (hint, choice(hint, default))
            continue
        json_type = _JSON_TYPES.get(hint, "string")
        if hint is float:
            numbers.add(f.name)
        description = f"{json_type} (the protocol core checks its range)"
        fields[f.name] = (Any, Field(default, description=description, json_schema_extra={"type": json_type}))
    model: type[Section] = create_model(name, __base__=Section, __doc__=doc or target.__doc__, **fields)

    def build(section: Section, _info: ValidationInfo) -> D:
        values = {name: getattr(section, name) for name in type(section).model_fields}
        return target(**{k: _number(v) if k in numbers else v for k, v in values.items()})

    return validated_as(target, model, build)


def _number(value: Any) -> Any:
    """An integer given for a number key, as a float (other values go to the core's check as they are)."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


@dataclass(frozen=True, slots=True)
class _SectionOf:
    """Marks a field validated through a section model (:func:`core_section`): the model that names
    its keys, for the messages (:func:`section_model`)."""

    model: type[BaseModel]


def section_model(metadata: list[Any]) -> type[BaseModel] | None:
    """The section model a field's ``metadata`` names (:func:`core_section`), or None."""
    return next((m.model for m in metadata if isinstance(m, _SectionOf)), None)
