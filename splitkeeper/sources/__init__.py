"""The source kinds: one package per kind (:mod:`.files`, :mod:`.kafka`), each a connector of the
source contract (:mod:`splitkeeper.core.source`), and the contract tests every connector passes
(:mod:`.contract`). A third party's kind is its own distribution (:mod:`splitkeeper.kinds`).

:func:`build_source` is the one place that turns a validated ``source`` section into a
:class:`~splitkeeper.core.source.SourceConnector`: the kind's factory builds it.
"""

from __future__ import annotations

from typing import Any

from splitkeeper.core.source import SourceConnector

__all__ = ["build_source"]


def build_source(source: Any) -> SourceConnector:
    """The driver-side connector of a validated ``source`` section (any kind's): its kind's factory
    (:func:`splitkeeper.kinds.source_factory`) builds it; EnvironmentNotReadyError when the kind's
    package is not installed."""
    from splitkeeper.kinds import source_factory

    connector: SourceConnector = source_factory(source.kind_name).build(source)
    return connector
