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
      kind: files                # or: kafka, or a plug-in's kind (splitkeeper.kinds)
      path: ./incoming
      format: jsonl
      split_bytes: 67108864
      on_file_change: fail       # or: new_version, append (a known file changed)
      recheck_finished_every: 10 # epochs between checks of finished files (1: every epoch)
      discovery: full            # or: incremental (list only names after the last one seen)
    checkpoint: {max_consecutive_failures: 3, max_failure_ratio: 0.5,
                 region_timeout_s: 300, retain_checkpoints: 3,
                 on_split_failure: quarantine, quarantine_after: 3,   # or: stall
                 max_consecutive_aborts: 5}
    backlog: {backlog_epoch_records: 200000, normal_epoch_records: 20000,
              backlog_interval_s: 60, normal_interval_s: 5}
    rescale: {operator_state: even-split}   # or union (protocol rule 2.8)
    weighted: {capacities: {0: 4}, rebalance_threshold: 1.25}   # strategy: weighted only
    notifications: {on_failure: mypkg.alerts:page_oncall}   # called by a failed Airflow task
    lease: {ttl_s: 60, wait_s: 0}   # one writer per pipeline; wait_s >= ttl_s: a writer takes over a
                                    # holder silent for ttl_s (by its own clock), else it is refused
    maintenance: {history_hours: 168,    # splitkeeper maintain: VACUUM keeps a week of history
                  untracked_hours: 24}   # and removes files no commit names once a day old
    metrics: {otlp_endpoint: http://otel-collector:4318}   # optional; <state>/metrics.prom always
    state: {path: ./state}
    sink: {path: ./sink}                 # kind: delta (the default), or a plug-in's kind
    staging: {path: ./state/_staging}   # default <state>/_staging (on the store when state is);
                                        # local: one host; a cluster: an s3:// prefix
    transform: splitkeeper.transforms:identity
    overrides: {allow: [metrics.otlp_endpoint]}   # what a run's overrides may set beyond tuning values

``${NAME}`` inside any string value of the file is replaced by the environment variable ``NAME``
(e.g. ``bootstrap_servers: ${SPLITKEEPER_KAFKA_BOOTSTRAP_SERVERS}``, what the local
cluster's env file exports); an unset variable is a mistake naming the key; ``$${``
stands for a literal ``${``. Values from the environment are never shown in messages (an error
shows the ``${NAME}`` instead). A run's overrides and the Airflow connections' values are data:
never expanded (:func:`apply_overrides`).

A config is refused before anything expands it (``${NAME}``, YAML aliases, validation)
when it repeats a key in a mapping, nests deeper than :data:`MAX_DEPTH` or holds more than
:data:`MAX_VALUES` values once its aliases are counted (:func:`check_limits`); the source,
state, sink and staging locations may not be one another or lie inside one another
(resolved first; staging inside state is the default and allowed).

The file is defined once, by the frozen pydantic models of :mod:`splitkeeper.config.models`:
every key, its type, choices, default and range, the rules that span keys, and the JSON Schema
(``splitkeeper config schema``). This module reads a file into them: the validated
:class:`PipelineConfig` is what the rest of splitkeeper reads (its sections themselves, the
source's and the sink's of their kind, locations resolved), and :func:`core_settings` gives the
protocol core's driver its settings from it. It imports the standard library, the models and the
protocol core (PyYAML lazily).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from splitkeeper.config.base import ReaderMode
from splitkeeper.config.models import (
    DEFAULT_SCHEDULE,
    GUARDED_OVERRIDES,
    IDENTITY_TRANSFORM,
    OVERRIDABLE,
    REDACTED,
    STRATEGY_NAMES,
    OperatorState,
    PipelineConfig,
    RegionMode,
    SourceKind,
    Tolerance,
    TransformKind,
    is_secret_key,
    validate_shape,
)
from splitkeeper.core.driver import DriverSettings
from splitkeeper.core.rescale import Redistribution
from splitkeeper.errors import ConfigError, hide_value

__all__ = [
    "DEFAULT_SCHEDULE",
    "GUARDED_OVERRIDES",
    "IDENTITY_TRANSFORM",
    "MAX_DEPTH",
    "MAX_VALUES",
    "OVERRIDABLE",
    "REDACTED",
    "STRATEGY_NAMES",
    "OperatorState",
    "PipelineConfig",
    "ReaderMode",
    "RegionMode",
    "SourceKind",
    "Tolerance",
    "TransformKind",
    "apply_overrides",
    "check_limits",
    "config_from_mapping",
    "core_settings",
    "with_reader_mode",
    "expand_env",
    "is_secret_key",
    "load_config",
    "load_json",
]

log = logging.getLogger("splitkeeper.config")
_ENV_REF_RE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


# --------------------------------------------------------------------------- loading


def load_config(
    path: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    connections: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    imports: bool = True,
) -> PipelineConfig:
    """Read and validate a pipeline config file (``.yaml``, ``.yml`` or ``.toml``).

    Relative paths inside the file resolve against the file's directory; ``${NAME}``
    references in the file take their values from ``env`` (default: this process's environment).
    ``overrides`` (the ingest DAG's ``pipeline`` Param, ``run --pipeline-json``,
    ``run_epochs(pipeline=...)``) is merged onto the file, section by section, before validation;
    it is data (:func:`apply_overrides`): only the sections :data:`OVERRIDABLE` names, no
    ``${NAME}`` in it, and a key of :data:`GUARDED_OVERRIDES` only where the file's
    ``overrides.allow`` lists it. Raises :class:`ConfigError` for a missing/unreadable file, a
    syntax error or any invalid value. ``connections`` (from
    :class:`splitkeeper.airflow.hooks.SplitkeeperHook`) maps a connection id to the source keys it
    gives (``bootstrap_servers``, ``client``): the file's ``source.connection`` takes them, the
    file's own keys win. ``imports=False`` (the read-only commands: ``status``, ``offsets``,
    ``stop``) leaves out what only running the pipeline needs, importing the transform, the
    notification and the Kafka client library to check them; every other rule holds.
    """
    file, data = read_config_file(path)
    where = str(file)
    check_limits(data, where)  # before anything walks the tree as a tree (YAML aliases)
    data, from_env = _expand(data, env, where)  # the file only: overrides and connections are data
    if overrides is not None:
        check_limits(overrides, f"{file} (pipeline overrides)")
        data = apply_overrides(data, overrides, where)
    if connections is None:
        connections = connections_from_env(os.environ if env is None else env)
    if connections:
        data = _with_connection(data, connections)
    with _hiding(from_env):
        return _validated(data, file.parent, where, imports)


#: The connections a splitkeeper task resolved, as JSON, for the job it starts with spark-submit
#: (``{"kafka_default": {"bootstrap_servers": ..., "client": {...}}}``): the job runs outside Airflow
#: and cannot read Airflow's connections itself. An environment variable, so no secret is on a
#: command line.
CONNECTIONS_ENV = "SPLITKEEPER_CONNECTIONS"


def connections_from_env(env: Mapping[str, str]) -> dict[str, Mapping[str, Any]] | None:
    """The connections ``$SPLITKEEPER_CONNECTIONS`` carries (None when unset)."""
    raw = env.get(CONNECTIONS_ENV)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        value = err
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ConfigError(
            f"${CONNECTIONS_ENV} must be a JSON object of connection id -> source keys (the ingest "
            "task sets it for spark-submit); unset it, or let the task set it",
            key=CONNECTIONS_ENV,
            value="(not shown: it may hold secrets)",
        )
    return value


def _with_connection(data: Any, connections: Mapping[str, Mapping[str, Any]]) -> Any:
    """``data`` with ``source.connection``'s values under the source keys the file leaves out,
    ``source.notifications.connection``'s (servers, client settings) under the
    ``source.notifications`` keys it leaves out, and ``decode.registry.connection``'s under the
    ``decode.registry`` keys it leaves out."""
    source = data.get("source") if isinstance(data, Mapping) else None
    given = connections.get(source.get("connection") or "") if isinstance(source, Mapping) else None
    if given and source is not None:
        merged = {**source}
        for key, value in given.items():
            if key == "client" and isinstance(source.get("client"), Mapping):
                merged["client"] = {**value, **source["client"]}
            elif value is not None:
                merged.setdefault(key, value)
        data = {**data, "source": merged}
    source = data.get("source") if isinstance(data, Mapping) else None
    events = source.get("notifications") if isinstance(source, Mapping) else None
    given = connections.get(events.get("connection") or "") if isinstance(events, Mapping) else None
    if given and isinstance(source, Mapping) and isinstance(events, Mapping):
        filled = {**events}
        for key in ("bootstrap_servers", "client"):
            value = given.get(key)
            if key == "client" and isinstance(events.get("client"), Mapping) and isinstance(value, Mapping):
                filled["client"] = {**value, **events["client"]}
            elif value is not None:
                filled.setdefault(key, value)
        data = {**data, "source": {**source, "notifications": filled}}
    decode = data.get("decode") if isinstance(data, Mapping) else None
    registry = decode.get("registry") if isinstance(decode, Mapping) else None
    given = connections.get(registry.get("connection") or "") if isinstance(registry, Mapping) else None
    if given and isinstance(decode, Mapping) and isinstance(registry, Mapping):
        filled = {**{k: v for k, v in given.items() if v is not None}, **registry}
        data = {**data, "decode": {**decode, "registry": filled}}
    return data


def read_config_file(path: str | os.PathLike[str]) -> tuple[Path, Any]:
    """The pipeline file's resolved path and its parsed content, not yet validated."""
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
        except RecursionError as err:  # tomllib parses nested arrays and tables recursively
            raise _too_deep("", str(file)) from err
    else:
        data = _load_yaml(text, str(file))
    return file, data


# --------------------------------------------------------------------------- parsing limits

#: The deepest nesting a pipeline config may have (a section's mapping inside the top level is
#: 2; the deepest key of the schema, ``source.client.<setting>`` or ``weighted.capacities.<id>``,
#: is 3): deeper input is a mistake or an attack, and Python's parsers would recurse on it.
MAX_DEPTH = 32
#: The most values (mappings, lists and scalars, each key's value counted once per place it
#: appears) a config may hold once its YAML aliases are expanded: a real pipeline holds a few
#: hundred; an alias "bomb" holds billions in a few lines.
MAX_VALUES = 10_000


def _too_deep(key: str, where: str) -> ConfigError:
    allowed = f"a config nested at most {MAX_DEPTH} levels deep"
    shown = key if len(key) <= 80 else key[:77] + "..."
    return ConfigError(
        f"{shown or '(top level)'} is nested more than {MAX_DEPTH} levels deep, which is not allowed: "
        f"{allowed}; a pipeline config needs 3, remove the nesting ({where})",
        key=key,
        value="<not shown>",
        allowed=allowed,
    )


def _too_many(key: str, where: str) -> ConfigError:
    allowed = f"at most {MAX_VALUES:,} values, each YAML alias (*name) counted as what it stands for"
    key = re.split(r"[.\[]", key, maxsplit=1)[0]  # the top-level key that holds them
    return ConfigError(
        f"{key or '(top level)'} holds more than {MAX_VALUES:,} values, which is not allowed: {allowed}; "
        f"remove the aliases or the key (nothing was expanded) ({where})",
        key=key,
        value="<not shown>",
        allowed=allowed,
    )


def check_limits(data: Any, where: str) -> None:
    """Refuse ``data`` nested deeper than :data:`MAX_DEPTH`, holding more than :data:`MAX_VALUES`
    values once shared parts (YAML aliases) are counted at every place they appear, or holding
    itself (a recursive alias).

    The walk visits each mapping or list once and sums the sizes of its children, so the
    expanded size is known without expanding anything (linear in the document as written).
    Called on every parsed config (file, ``dag_run.conf``, overrides) before ``${NAME}``
    expansion or validation walks it as a tree. ConfigError names the key where a limit is crossed.
    """
    sizes: dict[int, tuple[int, int]] = {}  # id(container) -> (values, depth) once expanded
    on_path: set[int] = set()
    stack: list[tuple[Any, str, bool]] = [(data, "", False)]
    while stack:
        value, key, done = stack.pop()
        if not isinstance(value, Mapping | list):
            continue
        ident = id(value)
        children = list(value.items()) if isinstance(value, Mapping) else list(enumerate(value))
        if done:
            on_path.discard(ident)
            count, depth = 1, 1
            for _, child in children:
                child_count, child_depth = sizes.get(id(child), (1, 0))
                count += child_count
                depth = max(depth, child_depth + 1)
            if depth > MAX_DEPTH:
                raise _too_deep(key, where)
            if count > MAX_VALUES:
                raise _too_many(key, where)
            sizes[ident] = (count, depth)
            continue
        if ident in sizes:
            continue
        if ident in on_path:
            allowed = "a config that does not contain itself"
            raise ConfigError(
                f"{key or '(top level)'} is a mapping or list that contains itself (a YAML alias inside its "
                f"own anchor), which is not allowed: {allowed}; remove the alias ({where})",
                key=key,
                value="<not shown>",
                allowed=allowed,
            )
        on_path.add(ident)
        stack.append((value, key, True))
        for name, child in children:
            if isinstance(child, Mapping | list):
                dotted = (
                    f"{key}[{name}]" if isinstance(value, list) else f"{key}.{name}" if key else str(name)
                )
                stack.append((child, dotted, False))


def load_json(text: str, where: str) -> Any:
    """Parse config text given as JSON (``run --pipeline-json``) with the rules of a file:
    duplicate keys and nesting past :data:`MAX_DEPTH` are ConfigErrors naming ``where``;
    a syntax error raises :class:`json.JSONDecodeError` for the caller to name its option."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        mapping: dict[str, Any] = {}
        for key, value in pairs:
            if key in mapping:
                allowed = "each key once in a mapping"
                raise ConfigError(
                    f"{key} is given twice, which is not allowed: {allowed}; keep one of them ({where})",
                    key=key,
                    value="<not shown>",
                    allowed=allowed,
                )
            mapping[key] = value
        return mapping

    try:
        data = json.loads(text, object_pairs_hook=no_duplicates)
    except RecursionError as err:  # the JSON decoder recurses into nested arrays and objects
        raise _too_deep("", where) from err
    check_limits(data, where)
    return data


def _load_yaml(text: str, where: str) -> Any:
    """Parse a YAML config; duplicate keys and nesting past :data:`MAX_DEPTH` are refused while
    the document is composed (before anything is constructed or expanded). ConfigError otherwise
    for a syntax error."""
    import yaml

    loader = _pipeline_loader()(text, where)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML: {err}", key="", value=where) from err
    finally:
        loader.dispose()


@functools.cache
def _pipeline_loader() -> type[Any]:
    """The SafeLoader of pipeline files (built on first use: PyYAML is imported lazily)."""
    import yaml
    from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

    class PipelineLoader(yaml.SafeLoader):
        """``yaml.SafeLoader`` that refuses, while it composes the document, duplicate mapping
        keys (the last one would win silently), nesting past :data:`MAX_DEPTH` (the composer
        recurses) and more than :data:`MAX_VALUES` nodes as written, naming the key.
        Aliases are counted once here; :func:`check_limits` counts what they expand to."""

        def __init__(self, stream: str, where: str) -> None:
            super().__init__(stream)
            self._where = where
            self._path: list[str] = []
            self._keys: dict[int, dict[Any, int]] = {}  # id(mapping node) -> its keys -> line
            self._nodes = 0

        def compose_node(self, parent: Node | None, index: Any) -> Node:
            self._nodes += 1
            if self._nodes > MAX_VALUES:
                raise _too_many(self._dotted(), self._where)
            part = None
            if isinstance(parent, MappingNode) and isinstance(index, ScalarNode):
                part = index.value
                self._refuse_duplicate(parent, index)
            elif isinstance(parent, SequenceNode) and isinstance(index, int):
                part = f"[{index}]"
            if part is not None:
                self._path.append(part)
            try:
                if len(self._path) > MAX_DEPTH:
                    raise _too_deep(self._dotted(), self._where)
                node: Node = super().compose_node(parent, index)
                return node
            finally:
                if part is not None:
                    self._path.pop()

        def _dotted(self) -> str:
            return "".join(p if p.startswith("[") or i == 0 else f".{p}" for i, p in enumerate(self._path))

        def _refuse_duplicate(self, mapping: MappingNode, key: ScalarNode) -> None:
            if key.tag == "tag:yaml.org,2002:merge":
                return  # '<<: *base' merges; its keys may be overridden on purpose
            seen = self._keys.setdefault(id(mapping), {})
            same = self._key(key)
            line = key.start_mark.line + 1
            if same in seen:
                self._path.append(key.value)
                dotted = self._dotted()
                self._path.pop()
                allowed = "each key once in a mapping"
                raise ConfigError(
                    f"{dotted} is given twice (lines {seen[same]} and {line}), which is not allowed: "
                    f"{allowed}; keep one of them (YAML would silently keep the last) ({self._where})",
                    key=dotted,
                    value="<not shown>",
                    allowed=allowed,
                )
            seen[same] = line

        def _key(self, node: ScalarNode) -> Any:
            try:
                value = self.construct_object(node)  # '1' and '0x1', 'a' and "a" are one key
                hash(value)
            except (yaml.YAMLError, TypeError):
                value = node.value
            return (node.tag, value)

    return PipelineLoader


def apply_overrides(data: Any, overrides: Any, origin: str = "pipeline config") -> Any:
    """``data`` with each section of ``overrides`` merged onto its own (keys of the override win).

    A run's overrides are data, whoever gives them (a DAG trigger, ``--pipeline-json``): a
    ``${NAME}`` in them is refused, never expanded (only the pipeline file, which the platform
    team controls, reads the environment), and a key that names a host or code
    (:data:`GUARDED_OVERRIDES`) only where the file's ``overrides.allow`` lists it. ConfigError
    names ``pipeline.<key>`` for a section that may not be overridden or is no mapping, a
    reference or a guarded key, and shows no value of theirs; the merged mapping is validated as a
    whole afterwards (same messages as a file).
    """
    allowed = "a mapping of sections to override: " + ", ".join(OVERRIDABLE)
    if not isinstance(overrides, Mapping):
        raise ConfigError(
            f"pipeline={overrides!r} is not allowed: {allowed} ({origin})",
            key="pipeline",
            value=overrides,
            allowed=allowed,
        )
    if not isinstance(data, Mapping):
        return data  # config_from_mapping names the mistake
    merged = dict(data)
    _refuse_references(overrides, "pipeline", origin)
    permitted = _allowed_overrides(data)
    for key, value in overrides.items():
        if key not in OVERRIDABLE or not isinstance(value, Mapping):
            reason = "a mapping" if key in OVERRIDABLE else "a section a run may override"
            raise ConfigError(
                f"pipeline.{key}={value!r} is not allowed: {allowed} ({origin}); {key} is not {reason}",
                key=f"pipeline.{key}",
                value=value,
                allowed=allowed,
            )
        for name in value:
            dotted = f"{key}.{name}"
            if dotted in GUARDED_OVERRIDES and dotted not in permitted:
                only = f"only the pipeline file sets {dotted} ({GUARDED_OVERRIDES[dotted]})"
                raise ConfigError(
                    f"pipeline.{dotted} is not allowed: {only}; a run's overrides may set it where the "
                    f"file says so, with overrides: {{allow: [{dotted}]}} ({origin})",
                    key=f"pipeline.{dotted}",
                    value="<not shown>",
                    allowed=only,
                )
        section = data.get(key)
        merged[key] = {**(section if isinstance(section, Mapping) else {}), **value}
    return merged


def _refuse_references(value: Any, key: str, origin: str) -> None:
    """ConfigError naming the first string of a run's overrides that holds ``${`` (a ``${NAME}``
    reference or its ``$${`` escape): overrides are never expanded. Its text is not shown."""
    if isinstance(value, str):
        if "${" in value:
            allowed = (
                "a value as it is: ${NAME} is not expanded in a run's overrides (they are data; only "
                "the pipeline file reads the environment)"
            )
            raise ConfigError(
                f"{key} holds '${{', which is not allowed: {allowed}; write the value itself ({origin})",
                key=key,
                value="<not shown>",
                allowed=allowed,
            )
    elif isinstance(value, Mapping):
        for name, item in value.items():
            _refuse_references(item, f"{key}.{name}", origin)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_references(item, f"{key}[{i}]", origin)


def _allowed_overrides(data: Mapping[str, Any]) -> frozenset[str]:
    """The guarded keys the file's ``overrides.allow`` lists (as written: the file is validated
    with the merged overrides afterwards, and a malformed list is refused there)."""
    section = data.get("overrides")
    listed = section.get("allow") if isinstance(section, Mapping) else None
    return frozenset(k for k in listed if isinstance(k, str)) if isinstance(listed, list) else frozenset()


def expand_env(data: Any, env: Mapping[str, str] | None = None, origin: str = "pipeline config") -> Any:
    """``data`` with every ``${NAME}`` in its string values replaced by ``env[NAME]`` (default:
    ``os.environ``) and every ``$${`` by ``${``. ConfigError names the key of an unset variable."""
    return _expand(data, env, origin)[0]


def _expand(data: Any, env: Mapping[str, str] | None, origin: str) -> tuple[Any, dict[str, str]]:
    """:func:`expand_env`, and each value it took from the environment -> the ``${NAME}`` it
    replaced (for :func:`_hiding`)."""
    environ = os.environ if env is None else env
    found: dict[str, str] = {}

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
                found[environ[name]] = f"${{{name}}}"
                return environ[name]

            return _ENV_REF_RE.sub(sub, value)
        if isinstance(value, Mapping):
            return {k: walk(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, f"{key}[{i}]") for i, v in enumerate(value)]
        return value

    return walk(data, ""), found


#: Values from the environment shorter than this are shown (a two-character value is no secret,
#: and hiding it would garble the message's own numbers and words).
_HIDDEN_MIN = 3


@contextlib.contextmanager
def _hiding(from_env: Mapping[str, str]) -> Iterator[None]:
    """A ConfigError raised inside shows each value the file took from the environment as the
    ``${NAME}`` it was written as (the message and ``params``): values from the environment are
    never shown in messages, whatever key they reached."""
    hidden = sorted((v for v in from_env if len(v) >= _HIDDEN_MIN), key=len, reverse=True)
    try:
        yield
    except ConfigError as err:
        if not hidden:
            raise
        message, params = err.message, dict(err.params)
        for value in hidden:
            message = hide_value(message, value, from_env[value])
        shown = params.get("value")
        if shown is not None and any(v in (shown if isinstance(shown, str) else repr(shown)) for v in hidden):
            params["value"] = "<from the environment, not shown>"
        if message == err.message and params == err.params:
            raise
        raise ConfigError(message, **params) from err.__cause__


def config_from_mapping(
    data: Any,
    base_dir: str | os.PathLike[str] | None = None,
    origin: str = "",
    env: Mapping[str, str] | None = None,
    *,
    imports: bool = True,
) -> PipelineConfig:
    """Validate an already-parsed config mapping (same rules as :func:`load_config`): the
    mapping is a pipeline file's content, expanded as a file is.

    ``base_dir`` is where relative paths resolve (default: the working directory); ``env``
    gives the values of ``${NAME}`` references (default: this process's environment).
    The shape, defaults, ranges and cross-key rules are the models'
    (:mod:`splitkeeper.config.models`); this function limits, expands and builds the view.
    """
    where = origin or "pipeline config"
    check_limits(data, where)  # before anything walks the tree as a tree (YAML aliases)
    data, from_env = _expand(data, env, where)
    with _hiding(from_env):
        return _validated(data, base_dir, origin, imports)


def _validated(
    data: Any, base_dir: str | os.PathLike[str] | None, origin: str, imports: bool
) -> PipelineConfig:
    """The typed view of an expanded (and merged) config mapping: limits, then the models."""
    where = origin or "pipeline config"
    check_limits(data, where)
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{where}: the top level must be a mapping of keys, got {type(data).__name__}",
            key="",
            value=data,
        )
    base = base_dir if base_dir is not None else os.getcwd()
    config = validate_shape(data, where, base, imports=imports, origin=origin)
    if config.max_concurrent_regions is not None:
        log.warning(
            "max_concurrent_regions=%s is ignored: an epoch's regions are the tasks of one Spark job, "
            "and Spark's cores bound how many run at once; remove the key (%s)",
            config.max_concurrent_regions,
            where,
        )
    return config


def with_reader_mode(config: PipelineConfig, reader_mode: ReaderMode | None) -> PipelineConfig:
    """``config`` with this run's ``source.reader_mode`` (None: the file's): the ``--reader-mode``
    option of run and recover, the DAGs' ``reader_mode`` Param."""
    if reader_mode is None or reader_mode is config.source.reader_mode:
        return config
    source = config.source.model_copy(update={"reader_mode": reader_mode})
    return config.model_copy(update={"source": source})


def core_settings(
    config: PipelineConfig, redistribution: Redistribution | None = None, *, regions_dependence: str = ""
) -> DriverSettings:
    """The protocol core's settings of a pipeline, the one place they are built from its config
    (``redistribution`` overrides ``rescale.operator_state``, a recovery's choice): the
    ``checkpoint`` and ``backlog`` sections are the core's own values already.
    ``regions_dependence``: why the regions are not independent although ``regions`` says
    ``per_reader`` (a Spark transform whose plan shuffles the epoch's records, found when the
    pipeline opens): every checkpoint is then global, and the mode says why (protocol rule 2.9)."""
    settings = config.checkpoint
    checkpoint = settings.core()
    if regions_dependence:
        checkpoint = replace(checkpoint, regions_independent=False, dependence=regions_dependence)
    elif not checkpoint.regions_independent:
        checkpoint = replace(checkpoint, dependence="the pipeline file says regions: global")
    return DriverSettings(
        pipeline=config.name,
        parallelism=config.parallelism,
        checkpoint=checkpoint,
        backlog=config.backlog,
        retain_checkpoints=settings.retain_checkpoints,
        strategy=config.strategy,
        strategy_options={"capacities": dict(config.weighted.capacities)}
        if config.strategy == "weighted"
        else {},
        redistribution=redistribution or config.rescale.operator_state.redistribution,
        rebalance_threshold=config.weighted.rebalance_threshold,
        on_split_failure=settings.on_split_failure,
        quarantine_after=settings.quarantine_after,
        max_consecutive_aborts=settings.max_consecutive_aborts,
        on_file_change=config.source.split_change_policy,
        recheck_finished_every=config.source.recheck_finished_epochs,
    )
