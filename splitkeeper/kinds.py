"""The kinds of sources and sinks: which package serves ``source.kind: X`` and ``sink.kind: Y``.

A kind is one package, cut the way Flink's connector modules and Airflow's providers are: its
config section (a subclass of :class:`~splitkeeper.config.base.SourceSection` or
:class:`~splitkeeper.config.base.SinkSection`), its builder, its reader or writer, its upkeep
(``docs/architecture.md``, "Add a source or sink kind"). The package declares itself with one
:class:`SourceFactory` or :class:`SinkFactory`; this registry finds it by the kind's name:

1. the product's own kinds are :data:`BUILTIN_SOURCES` and :data:`BUILTIN_SINKS`;
2. a third party's come from the entry-point groups :data:`SOURCE_GROUP` (``splitkeeper.sources``)
   and :data:`SINK_GROUP` (``splitkeeper.sinks``) of the installed distributions: the entry point's
   name is the kind's, its object the factory (``acme = "acme_splitkeeper:SOURCE"``). A product
   kind's name cannot be taken by a plug-in;
3. the factory names its section and its builders as ``'module:attribute'`` strings, imported
   when first needed: loading a pipeline file imports a kind's section only, running it its reader
   or writer, and a kind whose module is missing is an EnvironmentNotReadyError naming it.

Lookups are cached per process (:func:`reload` forgets them). Imports nothing of splitkeeper at
import time but :mod:`splitkeeper.errors`: the config, the application and the tools ask it.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from splitkeeper.errors import EnvironmentNotReadyError, InvalidParameterError

__all__ = [
    "BUILTIN_SINKS",
    "BUILTIN_SOURCES",
    "DEFAULT_SINK",
    "SINK_GROUP",
    "SOURCE_GROUP",
    "SinkFactory",
    "SourceFactory",
    "load",
    "reload",
    "sink_factories",
    "sink_factory",
    "source_factories",
    "source_factory",
]

log = logging.getLogger(__name__)

SOURCE_GROUP = "splitkeeper.sources"
SINK_GROUP = "splitkeeper.sinks"
#: The product's source kinds: name -> ``'module:attribute'`` of its factory.
BUILTIN_SOURCES: dict[str, str] = {
    "files": "splitkeeper.sources.files:FACTORY",
    "kafka": "splitkeeper.sources.kafka:FACTORY",
}
#: The product's sink kinds: name -> ``'module:attribute'`` of its factory.
BUILTIN_SINKS: dict[str, str] = {
    "delta": "splitkeeper.sinks.delta:FACTORY",
    "iceberg": "splitkeeper.sinks.iceberg:FACTORY",
}
#: The sink kind of a file that names none (every file written before ``sink.kind`` existed).
DEFAULT_SINK = "delta"


def load(spec: str, what: str) -> Any:
    """The object ``spec`` (``'module:attribute'``) names; EnvironmentNotReadyError when its module is
    not installed (``what`` names who needs it, e.g. "source.kind 'kafka'")."""
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            raise EnvironmentNotReadyError(
                f"{what} needs {module_name}, which is not in this build (install the distribution that "
                "ships the kind)",
                module=module_name,
            ) from err
        raise
    found = module
    for part in attribute.split(".") if attribute else ():
        found = getattr(found, part)
    return found


@dataclass(frozen=True, slots=True)
class SourceFactory:
    """What a source kind's package declares (contract 3; Flink's ``DynamicTableSourceFactory``).

    ``name``: the kind (``source.kind``). ``section``: ``'module:Class'`` of its config section, a
    :class:`~splitkeeper.config.base.SourceSection`. ``connector``: ``'module:function'`` taking the
    validated section and returning the driver-side
    :class:`~splitkeeper.core.source.SourceConnector` (whose ``reader()`` is what the region tasks
    read with). ``connection``: ``'module:function'`` ``(hook, conn_id) -> source keys``, the
    settings an Airflow connection named by ``source.connection`` gives (None: the kind reads none).
    """

    name: str
    section: str
    connector: str
    connection: str | None = None

    def section_class(self) -> Any:
        return load(self.section, f"source.kind {self.name!r}")

    def build(self, section: Any) -> Any:
        """The kind's connector for a validated ``source`` section."""
        return load(self.connector, f"source.kind {self.name!r}")(section)


@dataclass(frozen=True, slots=True)
class SinkFactory:
    """What a sink kind's package declares (contract 3; Flink's ``DynamicTableSinkFactory``).

    ``name``: the kind (``sink.kind``). ``section``: ``'module:Class'`` of its config section, a
    :class:`~splitkeeper.config.base.SinkSection`. ``sink``: ``'module:function'``
    ``(config, *, read_only, policy, crash_point) -> Sink`` (:mod:`splitkeeper.sinks.port`), the
    sink of a validated pipeline; ``reader``: ``'module:function'`` ``(config) -> SinkReader``, what
    the checks and the report read, opening nothing for writing.
    """

    name: str
    section: str
    sink: str
    reader: str

    def section_class(self) -> Any:
        return load(self.section, f"sink.kind {self.name!r}")

    def open(self, config: Any, **options: Any) -> Any:
        """The kind's sink for ``config`` (the validated pipeline)."""
        return load(self.sink, f"sink.kind {self.name!r}")(config, **options)

    def read(self, config: Any) -> Any:
        """The kind's reader for ``config``'s sink tables."""
        return load(self.reader, f"sink.kind {self.name!r}")(config)


def _entry_points(group: str) -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {point.name: point for point in entry_points(group=group)}


def _factories(builtin: Mapping[str, str], group: str) -> dict[str, Any]:
    found: dict[str, Any] = {name: spec for name, spec in builtin.items()}
    for name, point in sorted(_entry_points(group).items()):
        if name in builtin:
            log.warning(
                "entry point %s of group %s is ignored: %r is a kind of splitkeeper", point, group, name
            )
            continue
        found[name] = point
    return found


@functools.cache
def _sources() -> dict[str, Any]:
    return _factories(BUILTIN_SOURCES, SOURCE_GROUP)


@functools.cache
def _sinks() -> dict[str, Any]:
    return _factories(BUILTIN_SINKS, SINK_GROUP)


def source_factories() -> tuple[str, ...]:
    """The source kinds' names: the product's, then the plug-ins' (sorted)."""
    return tuple(_sources())


def sink_factories() -> tuple[str, ...]:
    """The sink kinds' names: the product's, then the plug-ins' (sorted)."""
    return tuple(_sinks())


@functools.cache
def source_factory(name: str) -> SourceFactory:
    """The factory of source kind ``name``; InvalidParameterError naming the kinds when it is none."""
    factory: SourceFactory = _resolve(_sources(), name, "source.kind", SourceFactory)
    return factory


@functools.cache
def sink_factory(name: str) -> SinkFactory:
    """The factory of sink kind ``name``; InvalidParameterError naming the kinds when it is none."""
    factory: SinkFactory = _resolve(_sinks(), name, "sink.kind", SinkFactory)
    return factory


def _resolve(known: Mapping[str, Any], name: str, key: str, kind: type) -> Any:
    if name not in known:
        raise InvalidParameterError(key, name, "one of " + ", ".join(known))
    entry = known[name]
    factory = load(entry, f"{key} {name!r}") if isinstance(entry, str) else entry.load()
    if not isinstance(factory, kind) or getattr(factory, "name", None) != name:
        raise InvalidParameterError(
            key,
            name,
            f"a kind whose package declares a {kind.__name__} named {name!r}",
            hint=f"{entry if isinstance(entry, str) else entry.value} gives {factory!r}",
        )
    return factory


def reload() -> None:
    """Forget the kinds found so far (a distribution installed since is found on the next lookup)."""
    for cached in (_sources, _sinks, source_factory, sink_factory):
        cached.cache_clear()
