"""The decode spec: what a record's bytes are, and the sink columns they become.

Contract:

1. :class:`DecodeSpec` is built once from the ``decode`` section (:func:`decode_spec_of`, at
   config validation) and shipped to the region tasks; it is frozen, picklable, and imports
   neither pyarrow nor Spark (the base install validates configs).
2. :meth:`DecodeSpec.data_columns` is the one definition of the sink's data columns:
   ``raw`` -> ``value BINARY``; ``text`` -> ``value STRING``; ``json``/``csv``/``avro`` ->
   the declared columns, plus ``_rescued STRING`` when ``on_new_fields`` is ``rescue``.
   :func:`splitkeeper.delta.schemas.sink_schema` puts the bookkeeping columns around them.
3. Every rule of the ``decode`` section that spans its keys is here, raised as a ConfigError
   naming the key, the value and what is allowed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from splitkeeper.errors import REDACTED, ConfigError, is_secret_key
from splitkeeper.records.ddl import Column, avro_columns, decodable_problem, parse_ddl

__all__ = [
    "BOOKKEEPING_COLUMNS",
    "NOT_DATA_COLUMNS",
    "TOMBSTONE",
    "RESCUED",
    "RESERVED_NAMES",
    "Column",
    "DecodeSpec",
    "RegistryConf",
    "decode_spec_of",
    "name_clash",
    "registry_client_conf",
]

#: The column that keeps, as JSON, the fields the declared schema does not name (``rescue``).
RESCUED = "_rescued"
#: The columns every sink has besides the data columns (the record's place and its Kafka metadata).
BOOKKEEPING_COLUMNS: tuple[str, ...] = (
    "split_id",
    "offset",
    "next_offset",
    "epoch",
    "region",
    "ingested_at",
    "key",
    "topic",
    "partition",
    "timestamp",
    "headers",
)
#: The bookkeeping column of an upsert sink's rows (sink.mode upsert only): the value was null, a
#: Kafka tombstone (see :mod:`splitkeeper.records.upsert`).
TOMBSTONE = "tombstone"
#: A derived column a sink may be partitioned by: the UTC date of ``ingested_at``.
INGESTED_DATE = "ingested_date"
#: Every sink column that is not a data column (what a schema's data columns are told apart by).
NOT_DATA_COLUMNS: frozenset[str] = frozenset((*BOOKKEEPING_COLUMNS, INGESTED_DATE, TOMBSTONE))
#: The names no data column may have: the bookkeeping columns and ``_rescued``. Like every column
#: name they compare case-insensitively (as Delta and Spark compare column names): see :func:`name_clash`.
RESERVED_NAMES: frozenset[str] = NOT_DATA_COLUMNS | {RESCUED}
KINDS = ("raw", "text", "json", "csv", "avro", "json_schema")
TYPED_KINDS = ("json", "csv", "avro", "json_schema")


class RegistryConf:
    """The schema registry client's settings beyond its URL: ``confluent_kafka.schema_registry``'s
    ``SchemaRegistryClient`` conf keys (``basic.auth.user.info``, ``bearer.auth.*``, ``ssl.*``).
    Immutable and hashable; secret values never appear in its ``repr`` or the config's dump (not a
    dataclass: pydantic would dump its fields)."""

    __slots__ = ("items",)
    items: tuple[tuple[str, Any], ...]

    def __init__(self, items: tuple[tuple[str, Any], ...] = ()) -> None:
        object.__setattr__(self, "items", tuple(items))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("RegistryConf is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RegistryConf) and other.items == self.items

    def __hash__(self) -> int:
        return hash(self.items)

    def __reduce__(self) -> tuple[Any, ...]:
        return (RegistryConf, (self.items,))

    def as_dict(self) -> dict[str, Any]:
        """The real values, for the registry client only."""
        return dict(self.items)

    def redacted(self) -> dict[str, Any]:
        return {k: REDACTED if is_secret_key(k) or k == "basic.auth.user.info" else v for k, v in self.items}

    def __repr__(self) -> str:
        return f"RegistryConf({self.redacted()!r})"

    def __bool__(self) -> bool:
        return bool(self.items)


#: ``decode.registry``'s keys and the ``SchemaRegistryClient`` conf key each becomes (user and
#: password become ``basic.auth.user.info``; a bearer token ``bearer.auth.*`` with a static token).
REGISTRY_CONF_KEYS = {
    "ssl_ca_location": "ssl.ca.location",
    "ssl_certificate_location": "ssl.certificate.location",
    "ssl_key_location": "ssl.key.location",
    "ssl_key_password": "ssl.key.password",
}


@dataclass(frozen=True, slots=True)
class DecodeSpec:
    """How a record's bytes become columns (module doc). ``columns``: the declared columns
    (typed kinds only); ``avro_schema``: the writer schema's JSON text (kind ``avro`` with a
    schema file); ``schema_registry_url`` and ``registry``: the schema registry and its client's
    auth and TLS settings; ``reader_schema``: the Avro reader schema's JSON text every record is
    resolved to from its writer schema (``decode.reader_schema_file``)."""

    kind: str = "raw"
    columns: tuple[Column, ...] = ()
    on_new_fields: str = "rescue"
    csv_delimiter: str = ","
    avro_schema: str | None = None
    schema_registry_url: str | None = None
    registry: RegistryConf = RegistryConf()
    reader_schema: str | None = None
    extra: tuple[tuple[str, Any], ...] = field(default=())

    @property
    def typed(self) -> bool:
        return self.kind in TYPED_KINDS

    def data_columns(self) -> tuple[Column, ...]:
        """The sink's data columns (contract 2)."""
        if self.kind == "raw":
            return (Column("value", "BINARY"),)
        if self.kind == "text":
            return (Column("value", "STRING"),)
        rescued = (Column(RESCUED, "STRING"),) if self.on_new_fields == "rescue" else ()
        return self.columns + rescued

    def sink_column_names(self) -> tuple[str, ...]:
        """Every column a sink of this spec may have (what ``sink.partition_by`` may name)."""
        return (
            BOOKKEEPING_COLUMNS[:3]
            + tuple(c.name for c in self.data_columns())
            + BOOKKEEPING_COLUMNS[3:]
            + (INGESTED_DATE,)
        )


def name_clash(name: str, taken: Mapping[str, str]) -> str | None:
    """Why ``name`` cannot be a data column beside ``taken`` (lower-case name -> the column that
    has it), or None when it can. Delta and Spark compare column names case-insensitively, so any
    spelling of a taken name is taken; a name equal to a taken data column is that column. Every
    :data:`RESERVED_NAMES` is always taken."""
    folded = name.lower()
    have = taken.get(folded)
    if folded in RESERVED_NAMES:
        which = "the _rescued column" if folded == RESCUED else "a bookkeeping column of the sink"
        spelled = "" if name == folded else f" (as {folded!r}: column names compare case-insensitively)"
        return f"{name!r} is {which}{spelled}"
    if have is None or have == name:
        return None
    return f"{name!r} differs from the column {have!r} only in case (column names compare case-insensitively)"


class DecodeSection(Protocol):
    """What :func:`decode_spec_of` reads of the ``decode`` section (the config's model of it,
    :class:`splitkeeper.config.models.DecodeSection`; the records package does not import it)."""

    kind: Any  # an enum whose value is the kind's name
    schema_: str | None
    schema_file: str | None
    schema_registry_url: str | None
    registry: Any  # the ``decode.registry`` section (RegistrySection) or None
    reader_schema_file: str | None
    on_new_fields: Any  # an enum whose value is the setting's name
    csv_delimiter: str

    def given(self) -> list[str]: ...


def decode_spec_of(section: DecodeSection, *, base: str | os.PathLike[str], where: str) -> DecodeSpec:
    """The spec of a validated ``decode`` section (contract 3); ``base`` resolves ``schema_file``."""
    kind = section.kind.value
    given = set(section.given())

    def invalid(key: str, value: Any, allowed: str, hint: str = "") -> ConfigError:
        message = f"decode.{key}={value!r} is not allowed: {allowed}" + (f"; {hint}" if hint else "")
        return ConfigError(f"{message} ({where})", key=f"decode.{key}", value=value, allowed=allowed)

    def missing(key: str, allowed: str) -> ConfigError:
        return ConfigError(
            f"decode.{key} is required but missing ({where}): {allowed}",
            key=f"decode.{key}",
            value=None,
            allowed=allowed,
        )

    typed_only = (
        "schema_",
        "schema_file",
        "schema_registry_url",
        "registry",
        "reader_schema_file",
        "on_new_fields",
    )
    if kind in ("raw", "text"):
        for key in typed_only:
            if key in given:
                name = key.rstrip("_")
                raise invalid(
                    name,
                    getattr(section, key),
                    f"nothing for decode.kind {kind!r} (it has one value column)",
                    "set decode.kind to json, csv or avro to declare columns",
                )
    if kind != "csv" and "csv_delimiter" in given:
        raise invalid("csv_delimiter", section.csv_delimiter, "nothing unless decode.kind is 'csv'")
    columns: tuple[Column, ...] = ()
    avro_schema = None
    registry_url: str | None = None
    registry = RegistryConf()
    if kind in ("json", "csv", "json_schema"):
        only = ("schema_file", "reader_schema_file") if kind == "json_schema" else ()
        for key in ("schema_file", "schema_registry_url", "registry", "reader_schema_file"):
            if key in given and (kind != "json_schema" or key in only):
                raise invalid(key, getattr(section, key), f"nothing for decode.kind {kind!r} (Avro only)")
        if kind == "json_schema":
            registry_url, registry = _registry_of(section, invalid, missing)
            if registry_url is None:
                raise missing(
                    "registry",
                    "the schema registry that holds each record's JSON Schema (decode.registry.url)",
                )
        if section.schema_ is None:
            raise missing(
                "schema", f"a Spark DDL string of the {kind} record's columns, e.g. 'id BIGINT, name STRING'"
            )
        try:
            columns = parse_ddl(section.schema_)
        except ValueError as err:
            raise invalid("schema", section.schema_, "a Spark DDL string 'name TYPE, ...'", str(err)) from err
        if kind == "csv" and section.on_new_fields.value == "add_columns":
            raise invalid(
                "on_new_fields", "add_columns", "rescue or fail for csv (its extra fields have no names)"
            )
    if kind == "avro":
        if "schema_" in given:
            raise invalid(
                "schema", section.schema_, "nothing for kind 'avro': use decode.schema_file (.avsc)"
            )
        registry_url, registry = _registry_of(section, invalid, missing)
        if section.reader_schema_file is not None:
            if registry_url is None:
                raise invalid(
                    "reader_schema_file",
                    section.reader_schema_file,
                    "a reader schema with a schema registry (decode.registry), which gives each "
                    "record's writer schema",
                )
            if section.schema_file is not None:
                raise invalid(
                    "schema_file",
                    section.schema_file,
                    "nothing beside decode.reader_schema_file (the reader schema's fields are the columns)",
                )
        if section.schema_file is None and section.reader_schema_file is None and registry_url is None:
            raise missing("schema_file", "an Avro schema file (.avsc), or decode.registry")
        key = "schema_file" if section.schema_file is not None else "reader_schema_file"
        file_name = getattr(section, key)
        if file_name is not None:
            path = Path(file_name).expanduser()
            path = path if path.is_absolute() else Path(base) / path
            try:
                avro_schema = path.read_text(encoding="utf-8")
                parsed = json.loads(avro_schema)
            except (OSError, ValueError) as err:
                raise invalid(key, file_name, "a readable Avro schema file (JSON)", str(err)) from err
            try:
                columns = avro_columns(parsed)
            except ValueError as err:
                raise invalid(key, file_name, "an Avro record schema", str(err)) from err
    if columns:
        problem = decodable_problem(kind, columns)
        if problem is not None:
            key = (
                "schema" if kind != "avro" else "schema_file" if section.schema_file else "reader_schema_file"
            )
            raise invalid(
                key, getattr(section, "schema_" if key == "schema" else key), "decodable columns", problem
            )
    taken: dict[str, str] = {}
    for c in columns:
        clash = name_clash(c.name, taken)
        if clash is not None:
            raise invalid(
                "schema",
                section.schema_ or section.schema_file,
                f"column names other than {sorted(RESERVED_NAMES)}, each once in any spelling",
                clash,
            )
        taken[c.name.lower()] = c.name
    return DecodeSpec(
        kind=kind,
        columns=columns,
        on_new_fields=section.on_new_fields.value,
        csv_delimiter=section.csv_delimiter,
        avro_schema=avro_schema if section.reader_schema_file is None else None,
        schema_registry_url=registry_url,
        registry=registry,
        reader_schema=avro_schema if section.reader_schema_file is not None else None,
    )


def _registry_of(section: DecodeSection, invalid: Any, missing: Any) -> tuple[str | None, RegistryConf]:
    """The registry's URL and client settings of an avro ``decode`` section (None: no registry)."""
    given = section.registry
    if given is None:
        return section.schema_registry_url, RegistryConf()
    if section.schema_registry_url is not None:
        raise invalid(
            "schema_registry_url",
            section.schema_registry_url,
            "nothing beside decode.registry (its url key is the same)",
            "move the URL to decode.registry.url",
        )
    if given.url is None:
        if given.connection:
            raise missing(
                "registry.url",
                f"the registry's URL: decode.registry.connection {given.connection!r} gives it only inside "
                "Airflow (set decode.registry.url to run outside Airflow)",
            )
        raise missing("registry.url", "the registry's 'http(s)://host:port', or decode.registry.connection")
    if (given.user is None) != (given.password is None):
        which = "user" if given.user is None else "password"
        raise missing(f"registry.{which}", "HTTP basic auth takes both decode.registry.user and .password")
    if given.bearer_token is not None and given.user is not None:
        raise invalid(
            "registry.bearer_token", REDACTED, "one of basic auth (user and password) or a bearer token"
        )
    if given.ssl_key_location is not None and given.ssl_certificate_location is None:
        raise missing(
            "registry.ssl_certificate_location", "the client certificate of decode.registry.ssl_key_location"
        )
    if "@" in given.url.split("//", 1)[-1].split("/", 1)[0] and given.user is not None:
        raise invalid(
            "registry.user",
            given.user,
            "nothing when decode.registry.url holds a user",
            "keep one of the two",
        )
    keys = ("url", "user", "password", "bearer_token", "logical_cluster", *REGISTRY_CONF_KEYS)
    return registry_client_conf({k: getattr(given, k) for k in keys})


def registry_client_conf(keys: Mapping[str, Any], where: str = "decode.registry") -> tuple[str, RegistryConf]:
    """The URL and the ``SchemaRegistryClient`` conf of ``decode.registry`` keys (user and password
    as ``basic.auth.user.info``, a bearer token as a static ``bearer.auth.token``, ``ssl_*`` as
    ``ssl.*``); ConfigError without a URL."""
    url = keys.get("url")
    if not url:
        raise ConfigError(
            f"{where} gives no schema registry URL",
            key="decode.registry.url",
            value=None,
            allowed="http(s)://",
        )
    conf: dict[str, str] = {}
    if keys.get("user") is not None:
        conf["basic.auth.user.info"] = f"{keys['user']}:{keys.get('password') or ''}"
    if keys.get("bearer_token") is not None:
        conf["bearer.auth.credentials.source"] = "STATIC_TOKEN"
        conf["bearer.auth.token"] = keys["bearer_token"]
        conf["bearer.auth.logical.cluster"] = keys.get("logical_cluster") or ""
    for key, name in REGISTRY_CONF_KEYS.items():
        if keys.get(key) is not None:
            conf[name] = keys[key]
    return str(url), RegistryConf(tuple(conf.items()))
