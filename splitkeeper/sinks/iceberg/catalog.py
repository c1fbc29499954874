"""The Iceberg sink's catalog and table, and the epochs its snapshots record.

:func:`load_catalog` opens the section's catalog (:mod:`.config`) with pyiceberg's
:func:`pyiceberg.catalog.load_catalog`: the embedded SQL catalog on SQLite (its folder made on
first use) or the one ``sink.catalog`` names. A catalog that cannot be loaded (an unknown type, a
REST server that does not answer, a missing driver) is a ConfigError naming ``sink.catalog``, the
catalog and pyiceberg's reason.

Every epoch's commit is one catalog commit of one snapshot (an upsert sink's keyed table: up to three,
a delete, a rewrite and an append, :mod:`.upsert`) whose summary carries :data:`APP_KEY` (the pipeline),
:data:`EPOCH_KEY`, :data:`ATTEMPT_KEY` (the decision's attempt), :data:`REGIONS_KEY` and
:data:`RECORDS_KEY`; an operator checkpoint's also :data:`OPERATOR_KEY`; an upsert sink's keyed
snapshot also :data:`CHANGES_KEY`. The pipeline's recorded epoch is that of the newest snapshot of
the main branch's lineage (the current snapshot and its ancestors) naming the pipeline
(:func:`recorded`): what Delta's ``txn`` action is to the Delta sink.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from splitkeeper.errors import ConfigError, EnvironmentNotReadyError, StateError

if TYPE_CHECKING:  # pragma: no cover
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import Table

    from splitkeeper.sinks.iceberg.config import IcebergSink

__all__ = [
    "APP_KEY",
    "ATTEMPT_KEY",
    "EPOCH_KEY",
    "CHANGES_KEY",
    "KEY_PROPERTY",
    "MODE_PROPERTY",
    "OPERATOR_KEY",
    "RECORDS_KEY",
    "REGIONS_KEY",
    "RETRIES_PROPERTY",
    "Recorded",
    "as_of",
    "by_version",
    "equal",
    "lineage",
    "load_catalog",
    "load_table",
    "recorded",
    "refresh",
    "split_from",
    "version_of",
]

APP_KEY = "splitkeeper.app-id"
EPOCH_KEY = "splitkeeper.epoch"
ATTEMPT_KEY = "splitkeeper.attempt-id"
REGIONS_KEY = "splitkeeper.regions"
RECORDS_KEY = "splitkeeper.records"
OPERATOR_KEY = "splitkeeper.operator"
#: The table property that makes a commit on a stale view fail instead of being retried on the new one.
RETRIES_PROPERTY = "commit.retry.num-retries"
#: The table's sink mode (``append`` or ``upsert``) and an upsert sink's key (comma-separated),
#: checked on open like the Delta sink's.
MODE_PROPERTY = "splitkeeper.sink.mode"
KEY_PROPERTY = "splitkeeper.sink.key"
#: An upsert sink's keyed snapshots: the epoch's change file, pending until the change table adds it.
CHANGES_KEY = "splitkeeper.changes"


@dataclass(frozen=True, slots=True)
class Recorded:
    """One snapshot of the lineage: its id, sequence number (the sink's version), time and, when a
    commit of the pipeline made it, the epoch and the summary properties it recorded."""

    snapshot_id: int
    sequence_number: int
    timestamp_ms: int
    epoch: int | None
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def attempt_id(self) -> str | None:
        return self.properties.get(ATTEMPT_KEY)

    @property
    def records(self) -> int:
        return int(self.properties.get(RECORDS_KEY) or 0)

    @property
    def regions(self) -> tuple[int, ...] | None:
        text = self.properties.get(REGIONS_KEY)
        return None if text is None else tuple(int(r) for r in json.loads(text))


def load_catalog(section: IcebergSink, *, create: bool = False) -> Catalog:
    """The section's catalog; ``create``: make the embedded catalog's folder first (a writable sink)."""
    try:
        from pyiceberg.catalog import load_catalog as pyiceberg_load
    except ModuleNotFoundError as err:
        raise EnvironmentNotReadyError(
            "sink.kind 'iceberg' needs pyiceberg, which is not installed: pip install 'splitkeeper[iceberg]'",
            module="pyiceberg",
        ) from err

    properties = section.catalog_properties()
    if section.embedded:
        if not create and not os.path.exists(os.path.join(section.warehouse, "catalog.db")):
            # a reader of a sink never written: an in-memory catalog of no table (nothing created)
            properties = {**properties, "uri": "sqlite:///:memory:"}
        else:
            os.makedirs(section.warehouse, exist_ok=True)
    try:
        return pyiceberg_load(section.catalog_name, **properties)
    except Exception as err:  # noqa: BLE001 - pyiceberg raises anything from a bad type to a refused socket
        shown = {k: v for k, v in properties.items() if k in ("type", "uri", "warehouse", "py-catalog-impl")}
        raise ConfigError(
            f"sink.catalog: the Iceberg catalog {section.catalog_name!r} {shown} cannot be loaded "
            f"({type(err).__name__}: {err}); check sink.catalog (its type and uri, and that the catalog "
            "service answers), or drop it for the embedded catalog in sink.warehouse",
            key="sink.catalog",
            value=shown,
        ) from err


def load_table(catalog: Catalog, identifier: str) -> Table | None:
    """The table ``identifier``, or None when the catalog has none (yet)."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    except Exception as err:  # noqa: BLE001 - the catalog's store or service failed
        raise _unloadable(identifier, err) from err


def refresh(table: Table) -> Table:
    """``table`` read again from its catalog (in place); a catalog or store that fails (a REST
    catalog that does not answer) is the StateError of :func:`load_table`."""
    try:
        return table.refresh()
    except Exception as err:  # noqa: BLE001 - the catalog's store or service failed
        raise _unloadable(".".join(table.name()), err) from err


def _unloadable(identifier: str, err: Exception) -> Exception:
    if isinstance(err, (ConfigError, StateError)):
        return err
    return StateError(
        f"sink table {identifier}: the Iceberg catalog cannot load it ({type(err).__name__}: {err}); "
        "check that the catalog service and the warehouse's store answer, then run again",
        table=identifier,
    )


def lineage(table: Table) -> Iterator[Recorded]:
    """The main branch's snapshots, newest first (the current one and its ancestors)."""
    from pyiceberg.table.snapshots import ancestors_of

    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        properties = dict(snapshot.summary.additional_properties) if snapshot.summary is not None else {}
        epoch = properties.get(EPOCH_KEY)
        yield Recorded(
            snapshot.snapshot_id,
            int(snapshot.sequence_number or 0),
            int(snapshot.timestamp_ms),
            None if epoch is None else int(epoch),
            properties,
        )


def recorded(table: Table | None, app_id: str, epoch: int | None = None) -> Recorded | None:
    """The newest snapshot of the lineage committed by ``app_id`` (of ``epoch``, when given), or None."""
    if table is None:
        return None
    for found in lineage(table):
        if found.properties.get(APP_KEY) != app_id or found.epoch is None:
            continue
        if epoch is None or found.epoch == epoch:
            return found
    return None


def equal(column: str, value: Any) -> BooleanExpression:
    """``column = value`` as a pyiceberg row filter."""
    from pyiceberg.expressions import EqualTo, Reference
    from pyiceberg.expressions.literals import literal

    return EqualTo(term=Reference(column), value=literal(value))


def split_from(split_id: str, offset: int) -> BooleanExpression:
    """The rows of split ``split_id`` at offsets >= ``offset`` (what a backward reset deletes)."""
    from pyiceberg.expressions import And, GreaterThanOrEqual, Reference
    from pyiceberg.expressions.literals import literal

    return And(
        equal("split_id", split_id), GreaterThanOrEqual(term=Reference("offset"), value=literal(int(offset)))
    )


def version_of(table: Table | None) -> int | None:
    """The table's version: its current snapshot's sequence number (0 before the first; None: no table)."""
    if table is None:
        return None
    snapshot = table.current_snapshot()
    return 0 if snapshot is None else int(snapshot.sequence_number or 0)


def as_of(table: Table, app_id: str, epoch: int) -> Recorded | None:
    """The snapshot whose content is the sink as of checkpoint ``epoch``: the newest of the lineage
    older than every snapshot of a later epoch (None: the empty table before the first commit).
    Snapshots of other writers (no epoch) go with the epoch before them."""
    for found in lineage(table):
        if found.properties.get(APP_KEY) == app_id and found.epoch is not None and found.epoch <= epoch:
            return found
    return None


def by_version(table: Table, version: int) -> Recorded | None:
    """The lineage's snapshot of sequence number ``version`` (None for 0, the empty table)."""
    if version == 0:
        return None
    for found in lineage(table):
        if found.sequence_number == version:
            return found
    raise StateError(
        f"sink table {table.name()}: no snapshot of sequence number {version} in its lineage (expired, or "
        "another writer rolled the table back); the rewind cannot restore it",
        version=version,
    )
