"""The sink port: what the application needs of a sink kind, and nothing of how it stores.

The protocol's part is :class:`~splitkeeper.core.ports.EpochSink` (the core's port: the fenced,
idempotent commit of an epoch's acknowledged output, discarding what was staged). A sink kind
(:mod:`splitkeeper.kinds`, e.g. :mod:`splitkeeper.sinks.delta`) gives the application a
:class:`Sink`, which is that plus, each a small interface of its own (the Flink ``Supports...``
habit: a kind without one is refused where it is needed, checked with ``isinstance``):

1. :class:`Sink`: the commit (``EpochSink``), what an epoch's commit recorded
   (:meth:`Sink.committed_metadata`), the columns the table has now (:attr:`Sink.schema`;
   ``decode.on_new_fields: add_columns`` widens it) and its :meth:`Sink.reader`.
2. :class:`SupportsRewind`: an operator checkpoint's commit (``recover --rewind``, ``offsets
   reset``; :mod:`splitkeeper.core.operator`): the plan of a rewind, the fenced commit of an
   action, how long ago the version a rewind restores was written.
3. :class:`SupportsUpkeep`: ``maintain``: bin-packing, removing what commits removed, removing
   files no commit names and staged files of recorded epochs.
4. :class:`SupportsSideTables`: the tables committed after each epoch's commit, exactly once (the
   dead letters, a Spark transform's filtered offsets, an upsert sink's change table): their
   repair on open and the epochs they record.
5. :class:`SinkReader`: the read side, for the restart checks, the report, ``status`` and the
   metrics: a sink's tables (:class:`SinkTable`) as rows (pyarrow), counts, Spark frames, and
   their versions (what a check read). Opening one writes nothing.

Every method is called on the driver; a :class:`Sink` is one per pipeline and process. The
values of this module cross no executor boundary.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from splitkeeper.core.ports import EpochSink, SinkReceipt

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

    from splitkeeper.records.upsert import UpsertSpec

__all__ = [
    "Sink",
    "SinkCommit",
    "SinkReader",
    "SinkTable",
    "SupportsRewind",
    "SupportsSideTables",
    "SupportsUpkeep",
    "TableRewind",
]


class SinkTable(enum.Enum):
    """The tables a sink's reader reads (:class:`SinkReader`)."""

    RECORDS = "records"  # every record committed, once: an append sink's table, an upsert sink's changes
    KEYED = "keyed"  # an upsert sink's table of the latest row per key (its fold)
    DEAD_LETTERS = "dead_letters"  # the bad records (errors.tolerance: all)
    FILTERED = "filtered"  # the offsets a Spark transform dropped, as ranges


@dataclass(frozen=True, slots=True)
class SinkCommit:
    """One epoch's commit as the sink records it (None fields: not recorded)."""

    app_id: str
    epoch_id: int
    regions: tuple[int, ...] | None
    table_version: int | None
    records: int | None
    attempt_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TableRewind:
    """What a rewind does to one table: its version now and after, and its rows now and after."""

    label: str
    path: str
    version_now: int
    version_after: int
    rows_now: int
    rows_after: int

    @property
    def changes(self) -> bool:
        return self.version_now != self.version_after

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.label,
            "path": self.path,
            "version_now": self.version_now,
            "version_after": self.version_after,
            "rows_now": self.rows_now,
            "rows_after": self.rows_after,
        }


class SinkReader(abc.ABC):
    """The read side of a pipeline's sink (contract 5): for checks, reports, status and metrics.

    ``upsert``: the sink's upsert rule (its key and deletes), None for an append sink; the records
    of an upsert sink are its change table, its keyed table is :attr:`SinkTable.KEYED`.
    """

    upsert: UpsertSpec | None = None

    @abc.abstractmethod
    def location(self, table: SinkTable) -> str | None:
        """Where ``table`` is (for messages and the report), or None when this sink has no such table."""

    @abc.abstractmethod
    def files(self, table: SinkTable) -> int | None:
        """How many data files ``table`` has now (no data read), or None when it does not exist yet:
        whether there is anything to scan before Spark starts."""

    @abc.abstractmethod
    def rows(
        self, table: SinkTable, columns: Sequence[str] | None = None, *, epoch: int | None = None
    ) -> pa.Table:
        """The rows of ``table`` now (``columns`` only; those of ``epoch`` only, when given), read
        without Spark; empty when it does not exist."""

    @abc.abstractmethod
    def version(self, table: SinkTable) -> int | None:
        """``table``'s version now (None: it does not exist), cheap to ask again: a reader that asks
        every epoch reads rows only when it moved."""

    @abc.abstractmethod
    def count(self, table: SinkTable, where: str | None = None) -> int:
        """Rows of ``table`` (where the generic-SQL predicate ``where`` holds); 0 when it does not exist."""

    @abc.abstractmethod
    def frame(self, spark: Any, table: SinkTable) -> Any:
        """``table`` as a Spark DataFrame (a sink can be too large for the driver), once :meth:`files`
        said it has data files."""

    @abc.abstractmethod
    def schema(self, table: SinkTable = SinkTable.RECORDS) -> pa.Schema | None:
        """The columns ``table`` has now, or None when it does not exist yet."""

    @abc.abstractmethod
    def versions(self) -> Mapping[str, int]:
        """Each existing table's version now, by name (what a check that read them read)."""

    @abc.abstractmethod
    def committed_epoch(self) -> int | None:
        """The pipeline's recorded epoch (:meth:`EpochSink.committed_epoch`), read without opening
        the sink."""


class Sink(EpochSink):
    """What the application runs a pipeline's epochs with (contract 1). ``schema``: the sink's
    columns now (those ``decode.on_new_fields: add_columns`` added included)."""

    schema: pa.Schema

    @abc.abstractmethod
    def committed_metadata(self, epoch: int) -> SinkCommit | None:
        """The commit of ``epoch`` by this pipeline as the sink recorded it; None if not found."""

    @abc.abstractmethod
    def reader(self) -> SinkReader:
        """The read side of this sink's tables."""


class SupportsRewind(abc.ABC):
    """A sink that takes operator checkpoints (contract 2; :mod:`splitkeeper.core.operator`)."""

    @abc.abstractmethod
    def rewind_plan(self, epoch: int) -> tuple[TableRewind, ...]:
        """What a rewind to checkpoint ``epoch`` does to each table of the sink; reads only."""

    @abc.abstractmethod
    def operator_commit(
        self, epoch: int, action: Mapping[str, Any], *, expected: int | None, attempt_id: str
    ) -> SinkReceipt:
        """The fenced commit of operator checkpoint ``epoch``: ``action`` (a rewind or a reset) on
        every table of the sink; a replay of the same attempt writes nothing."""

    @abc.abstractmethod
    def rows_from(self, split_id: str, offset: int) -> Mapping[str, int]:
        """Per table, the rows of ``split_id`` at offsets >= ``offset`` (what a backward reset of the
        split to ``offset`` deletes); reads only what it needs."""

    @abc.abstractmethod
    def hours_since(self, epoch: int) -> float:
        """Hours since the sink's version as of ``epoch`` was written (what upkeep must keep for a
        rewind to ``epoch`` to restore it); 0 without a table."""


class SupportsUpkeep(abc.ABC):
    """A sink ``maintain`` keeps (contract 3). ``dry_run``: list, change nothing."""

    @abc.abstractmethod
    def compact(self) -> int:
        """Bin-pack the sink's small files; how many files were rewritten."""

    @abc.abstractmethod
    def vacuum(self, history_hours: float, *, dry_run: bool = False) -> list[str]:
        """Remove the files commits removed more than ``history_hours`` ago; their paths."""

    @abc.abstractmethod
    def remove_untracked(
        self, untracked_hours: float, history_hours: float, *, dry_run: bool = False
    ) -> list[tuple[str, int]]:
        """Remove the files in the sink's folder no version names, older than ``untracked_hours``;
        ``(path, bytes)`` of each."""

    @abc.abstractmethod
    def remove_staged_leftovers(
        self, untracked_hours: float, *, dry_run: bool = False
    ) -> list[tuple[str, int]]:
        """Remove the staged files of epochs the sink recorded, older than ``untracked_hours``."""


class SupportsSideTables(abc.ABC):
    """A sink with side tables (contract 4)."""

    @abc.abstractmethod
    def repair_sides(self) -> int | None:
        """Commit the side tables' files of the recorded epoch that they do not record yet (a driver
        died between the sink's commit and theirs); the epoch repaired, or None."""

    @abc.abstractmethod
    def dead_letter_epoch(self) -> int | None:
        """The last epoch whose dead letters were committed, or None."""

    @abc.abstractmethod
    def change_epoch(self) -> int | None:
        """The last epoch an upsert sink's change table records, or None."""
