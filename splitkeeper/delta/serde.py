"""Lossless conversion between the core value types and rows of the Delta state tables.

A *row* is a plain ``dict`` keyed by column name whose values are what pyarrow's
``Table.from_pylist`` takes and ``to_pylist`` returns (and Spark's ``Row.asDict``): ints,
strings, bools, ``None``, lists and nested dicts for ``ARRAY``/``STRUCT`` columns. The
column layout of every table is defined once, in :mod:`splitkeeper.delta.schemas`; this
module fills those columns from the core types and back.

Conversions are lossless: ``x_from_row(x_to_row(v)) == v`` for every value the core
types can hold (tuple order, empty readers, backlog entries of splits that are not live
any more, ``None`` positions). A value with a field this module does not know (a field
added to ``splitkeeper.core.types`` later) fails loudly with :class:`StateError` instead
of being dropped.

A row that cannot hold what the core types allow (a split position that is NULL or
negative) is refused with :class:`StateError` naming the table, the checkpoint id and
the split, before any value is built from it.

Only the standard library is imported: no engine is needed to convert. Columns that do
not come from the core types (``attempt_id``, ``run_id``, timestamps, ``commit_ms``) are
added by :mod:`splitkeeper.delta.checkpoints`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from splitkeeper.core.failures import RegionFailure
from splitkeeper.core.ports import EpochDecision
from splitkeeper.core.types import (
    AuditRecord,
    BacklogSnapshot,
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    RecoveryDecision,
    RegionOutcome,
    RegionState,
    Split,
)
from splitkeeper.errors import InvalidParameterError, StateError

Row = dict[str, Any]

#: Bumped when a table layout changes incompatibly; stored in the ``pipeline`` row.
STATE_FORMAT = 1


# ---------------------------------------------------------------------------------------
# Runtime value types persisted by the state store (engine-free, picklable)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlannedRange:
    """One split range a region must read in an epoch: offsets ``[start, end)``.

    ``start`` is the split's position when the epoch was planned; ``end`` is exclusive
    (``end == start`` means nothing to read this epoch). A replay reads exactly this range.
    """

    split_id: str
    start: int
    end: int

    def __post_init__(self) -> None:
        if not self.split_id:
            raise InvalidParameterError("split_id", self.split_id, "a non-empty string")
        if self.start < 0:
            raise InvalidParameterError("start", self.start, "an offset >= 0", hint=f"split {self.split_id}")
        if self.end < self.start:
            raise InvalidParameterError(
                "end", self.end, f"an offset >= start {self.start}", hint=f"split {self.split_id}"
            )


@dataclass(frozen=True, slots=True)
class EpochPlan:
    """The write-ahead plan of epoch ``epoch_id``: per region, the ranges it must read.

    Every region of the epoch is a key, regions with nothing to read map to ``()``.
    Written once by the driver before any region reads (``DeltaStateStore.write_plan``);
    read back unchanged to replay the epoch after a crash.
    """

    epoch_id: int
    regions: dict[int, tuple[PlannedRange, ...]] = field(default_factory=dict)
    run_id: str = ""

    def ranges(self) -> dict[str, PlannedRange]:
        """Split id -> planned range, over all regions."""
        return {r.split_id: r for ranges in self.regions.values() for r in ranges}


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------

E = TypeVar("E", bound=enum.Enum)


def _enum(kind: type[E], value: Any, column: str) -> E:
    try:
        return kind(value)
    except ValueError as err:
        allowed = ", ".join(repr(m.value) for m in kind)
        raise StateError(
            f"column {column} holds {value!r}, which is not a {kind.__name__}: allowed are {allowed}",
            column=column,
            value=value,
        ) from err


@functools.lru_cache(maxsize=64)
def _unpersisted(cls: type, known: frozenset[str]) -> tuple[dataclasses.Field[Any], ...]:
    """The fields of dataclass ``cls`` outside ``known`` (once per type: a checkpoint of 10,000
    splits guards 50,000 values)."""
    return tuple(f for f in dataclasses.fields(cls) if f.name not in known)


def _guard_fields(value: Any, known: frozenset[str]) -> None:
    """Refuse to persist a value whose type gained a field this module does not write."""
    kind: type = type(value)
    for f in _unpersisted(kind, known):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = object()
        if getattr(value, f.name) != default:
            raise StateError(
                f"{type(value).__name__}.{f.name} is not persisted by splitkeeper.delta.serde; "
                "add it to the state table schema (splitkeeper/delta/schemas.py, state/*.ddl) and to serde "
                "before storing it",
                type=type(value).__name__,
                field=f.name,
            )


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True, slots=True)
class RowPlace:
    """Where a row was read from, for error messages: the table and the checkpoint id."""

    table: str
    checkpoint_id: int | None


# ---------------------------------------------------------------------------------------
# Split
# ---------------------------------------------------------------------------------------

SPLIT_FIELDS = frozenset({"split_id", "subscription", "position", "end", "backlog_end", "identity"})


def split_to_row(split: Split) -> Row:
    """A split as the ``STRUCT<split_id, subscription, position, end, backlog_end>`` value.

    Without its ``identity``: a region's state (``checkpoints.regions``) does not keep it;
    the enumerator's rows of the same checkpoint do (:func:`enumerator_to_rows`), and a
    restore takes it from there.
    """
    _guard_fields(split, SPLIT_FIELDS)
    return {
        "split_id": split.split_id,
        "subscription": split.subscription,
        "position": split.position,
        "end": split.end,
        "backlog_end": split.backlog_end,
    }


def _damaged_row_advice(table: str) -> str:
    """What to do about a damaged row of ``table`` (every piece of advice is tried by a test)."""
    from splitkeeper.delta.tables import REPAIR_ADVICE, REPAIRABLE

    if table in REPAIRABLE:
        return REPAIR_ADVICE
    return "Restore the state directory from a backup taken after this checkpoint"


def split_from_row(row: Mapping[str, Any], where: RowPlace | None = None) -> Split:
    """The split of a row; ``where`` names the row's table and checkpoint in errors."""
    position = row.get("position")
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        place = where or RowPlace("(unknown table)", None)
        raise StateError(
            f"state table {place.table}: checkpoint {place.checkpoint_id} holds split "
            f"{row.get('split_id')!r} at position {position!r}, but a position is an offset >= 0. The row "
            f"was not written by splitkeeper or was damaged; the checkpoint cannot be restored as it is. "
            f"{_damaged_row_advice(place.table)}",
            table=place.table,
            checkpoint_id=place.checkpoint_id,
            split_id=row.get("split_id"),
            position=position,
        )
    end = row.get("end")
    if end is not None and (isinstance(end, bool) or not isinstance(end, int) or end < position):
        place = where or RowPlace("(unknown table)", None)
        raise StateError(
            f"state table {place.table}: checkpoint {place.checkpoint_id} holds split "
            f"{row.get('split_id')!r} with end {end!r} before its position {position}. "
            f"{_damaged_row_advice(place.table)}",
            table=place.table,
            checkpoint_id=place.checkpoint_id,
            split_id=row.get("split_id"),
        )
    return Split(
        split_id=row["split_id"],
        subscription=row["subscription"] if row.get("subscription") is not None else "",
        position=position,
        end=end,
        backlog_end=_opt_int(row.get("backlog_end")),
        identity=row.get("identity") or "",
    )


# ---------------------------------------------------------------------------------------
# RegionState (element of checkpoints.regions)
# ---------------------------------------------------------------------------------------

REGION_FIELDS = frozenset(
    {"region_id", "splits", "operator_state", "ref_checkpoint_id", "outcome", "ref_depth"}
)


def region_to_row(state: RegionState) -> Row:
    _guard_fields(state, REGION_FIELDS)
    return {
        "region_id": state.region_id,
        "outcome": state.outcome.value,
        "ref_checkpoint_id": state.ref_checkpoint_id,
        "ref_depth": state.ref_depth,
        "operator_state": list(state.operator_state),
        "splits": [split_to_row(s) for s in state.splits],
    }


def region_from_row(row: Mapping[str, Any], where: RowPlace | None = None) -> RegionState:
    return RegionState(
        region_id=int(row["region_id"]),
        splits=tuple(split_from_row(s, where) for s in row.get("splits") or ()),
        operator_state=tuple(row.get("operator_state") or ()),
        ref_checkpoint_id=_opt_int(row.get("ref_checkpoint_id")),
        outcome=_enum(RegionOutcome, row["outcome"], "checkpoints.regions.outcome"),
        ref_depth=int(row.get("ref_depth") or 0),
    )


# ---------------------------------------------------------------------------------------
# BacklogSnapshot (enumerator_state rows with status 'backlog')
# ---------------------------------------------------------------------------------------

BACKLOG_FIELDS = frozenset({"boundaries", "finished"})


def backlog_to_rows(backlog: BacklogSnapshot) -> list[Row]:
    """One ``backlog`` row per split id that has a boundary or finished its backlog."""
    _guard_fields(backlog, BACKLOG_FIELDS)
    split_ids = sorted(set(backlog.boundaries) | set(backlog.finished))
    return [
        {
            "status": "backlog",
            "owner": None,
            "seq": seq,
            "split_id": split_id,
            "subscription": None,
            "position": None,
            "end": None,
            "backlog_end": backlog.boundaries.get(split_id),
            "backlog_finished": split_id in backlog.finished,
            "identity": None,
        }
        for seq, split_id in enumerate(split_ids)
    ]


def backlog_from_rows(rows: Iterable[Mapping[str, Any]]) -> BacklogSnapshot:
    boundaries: dict[str, int] = {}
    finished: set[str] = set()
    for row in rows:
        if row["status"] != "backlog":
            continue
        if row.get("backlog_end") is not None:
            boundaries[row["split_id"]] = int(row["backlog_end"])
        if row.get("backlog_finished"):
            finished.add(row["split_id"])
    return BacklogSnapshot(boundaries=boundaries, finished=frozenset(finished))


# ---------------------------------------------------------------------------------------
# EnumeratorSnapshot (enumerator_state rows + the checkpoints.enumerator header)
# ---------------------------------------------------------------------------------------

ENUMERATOR_FIELDS = frozenset(
    {
        "checkpoint_id",
        "parallelism",
        "pool",
        "assignments",
        "finished",
        "subscriptions",
        "backlog",
        "quarantined",
        "finished_identities",
        "discovery",
    }
)
ENUMERATOR_STATUSES = ("assigned", "pool", "finished", "backlog", "quarantined")


def _split_state_row(status: str, owner: int | None, seq: int, split: Split) -> Row:
    row = split_to_row(split)
    row.update(status=status, owner=owner, seq=seq, backlog_finished=None, identity=split.identity or None)
    return row


def enumerator_header(snapshot: EnumeratorSnapshot) -> Row:
    """The ``checkpoints.enumerator`` struct: what the per-split rows cannot carry."""
    _guard_fields(snapshot, ENUMERATOR_FIELDS)
    return {
        "checkpoint_id": snapshot.checkpoint_id,
        "parallelism": snapshot.parallelism,
        "readers": sorted(snapshot.assignments),
        "subscriptions": sorted(snapshot.subscriptions),
    }


def enumerator_to_rows(snapshot: EnumeratorSnapshot) -> list[Row]:
    """The ``enumerator_state`` rows of a snapshot (without checkpoint_id / attempt_id)."""
    _guard_fields(snapshot, ENUMERATOR_FIELDS)
    rows: list[Row] = []
    for reader_id in sorted(snapshot.assignments):
        for seq, split in enumerate(snapshot.assignments[reader_id]):
            rows.append(_split_state_row("assigned", reader_id, seq, split))
    for seq, split in enumerate(snapshot.pool):
        rows.append(_split_state_row("pool", None, seq, split))
    for seq, split in enumerate(snapshot.quarantined):
        rows.append(_split_state_row("quarantined", None, seq, split))
    for seq, split_id in enumerate(sorted(snapshot.finished)):
        rows.append(
            {
                "status": "finished",
                "owner": None,
                "seq": seq,
                "split_id": split_id,
                "subscription": None,
                "position": None,
                "end": None,
                "backlog_end": None,
                "backlog_finished": None,
                "identity": snapshot.finished_identities.get(split_id),
            }
        )
    rows.extend(backlog_to_rows(snapshot.backlog))
    return rows


def enumerator_from_rows(
    header: Mapping[str, Any],
    rows: Iterable[Mapping[str, Any]],
    table: str = "enumerator_state",
    *,
    finished: tuple[Sequence[str], Sequence[str | None]] = ((), ()),
) -> EnumeratorSnapshot:
    """Rebuild a snapshot from its header struct and its ``enumerator_state`` rows (any order).

    ``finished``: the ``split_id`` and ``identity`` columns of more rows of status ``finished``,
    given apart by a reader that has the rows as columns (most of a large state is finished
    splits: two columns, not a mapping per row)."""
    rows = list(rows)
    where = RowPlace(table, _opt_int(header.get("checkpoint_id")))
    for row in rows:
        if row["status"] not in ENUMERATOR_STATUSES:
            raise StateError(
                f"column enumerator_state.status holds {row['status']!r}: allowed are "
                f"{', '.join(ENUMERATOR_STATUSES)}",
                column="enumerator_state.status",
                value=row["status"],
            )
    identities = {sid: identity for sid, identity in zip(*finished, strict=True) if identity}
    identities.update(
        (r["split_id"], r["identity"]) for r in rows if r["status"] == "finished" and r.get("identity")
    )
    assigned: dict[int, list[tuple[int, Split]]] = {int(r): [] for r in header.get("readers") or ()}
    pool: list[tuple[int, Split]] = []
    quarantined: list[tuple[int, Split]] = []
    for row in rows:
        if row["status"] == "assigned":
            owner = int(row["owner"])
            assigned.setdefault(owner, []).append((int(row["seq"]), split_from_row(row, where)))
        elif row["status"] == "pool":
            pool.append((int(row["seq"]), split_from_row(row, where)))
        elif row["status"] == "quarantined":
            quarantined.append((int(row["seq"]), split_from_row(row, where)))
    return EnumeratorSnapshot(
        checkpoint_id=int(header["checkpoint_id"]),
        parallelism=int(header["parallelism"]),
        pool=tuple(s for _, s in sorted(pool, key=lambda p: p[0])),
        assignments={
            owner: tuple(s for _, s in sorted(splits, key=lambda p: p[0]))
            for owner, splits in assigned.items()
        },
        finished=frozenset(r["split_id"] for r in rows if r["status"] == "finished").union(finished[0]),
        finished_identities=identities,
        subscriptions=frozenset(header.get("subscriptions") or ()),
        backlog=backlog_from_rows(rows),
        quarantined=tuple(s for _, s in sorted(quarantined, key=lambda p: p[0])),
    )


# ---------------------------------------------------------------------------------------
# Incremental enumerator_state: a delta against a full snapshot (the base)
# ---------------------------------------------------------------------------------------

#: Statuses only a delta holds: the base row of that split (split statuses) or of its backlog
#: entry is gone in the delta's checkpoint.
ENUMERATOR_TOMBSTONES = ("removed", "backlog_removed")
#: The statuses of backlog entries (the other statuses are split places).
BACKLOG_STATUSES = ("backlog", "backlog_removed")


def _live_rows(snapshot: EnumeratorSnapshot) -> dict[str, Row] | None:
    """The assigned, pool and quarantined rows of ``snapshot`` by split id (as
    :func:`enumerator_to_rows` writes them); None when a split id is there twice."""
    rows: dict[str, Row] = {}
    places: list[tuple[str, int | None, tuple[Split, ...]]] = [
        ("assigned", r, snapshot.assignments[r]) for r in sorted(snapshot.assignments)
    ]
    places += [("pool", None, snapshot.pool), ("quarantined", None, snapshot.quarantined)]
    count = 0
    for status, owner, splits in places:
        for seq, split in enumerate(splits):
            rows[split.split_id] = _split_state_row(status, owner, seq, split)
            count += 1
    return rows if len(rows) == count else None


def _entry_row(status: str, split_id: str, **values: Any) -> Row:
    row: Row = {
        "status": status,
        "owner": None,
        "seq": 0,
        "split_id": split_id,
        "subscription": None,
        "position": None,
        "end": None,
        "backlog_end": None,
        "backlog_finished": None,
        "identity": None,
    }
    row.update(values)
    return row


def enumerator_delta(
    base: EnumeratorSnapshot, snapshot: EnumeratorSnapshot, *, base_rows: dict[str, Any] | None = None
) -> list[Row] | None:
    """The ``enumerator_state`` rows that turn ``base``'s full snapshot rows into ``snapshot``'s;
    None when ``snapshot`` cannot be a delta against ``base`` (a split id in two places: the
    caller writes a full snapshot). Its cost grows with the live splits and what changed, not
    with the finished ones (set operations).

    Rules:

    1. An entry is a split's place (assigned with its owner and seq, pool, quarantined,
       finished) or its backlog entry (boundary, finished flag). An entry of ``snapshot``
       that ``base`` lacks or holds differently is in the delta as :func:`enumerator_to_rows`
       writes it, except that a finished or backlog row's ``seq`` is 0 (it is only their
       sort order; readers ignore it).
    2. An entry of ``base`` that ``snapshot`` no longer has gets a tombstone: status
       ``removed`` (split place) or ``backlog_removed`` (backlog entry), split id only.
    3. Applying the delta to ``base``'s rows (:func:`splitkeeper.delta.history.merge_delta`)
       decodes (:func:`enumerator_from_rows`) to ``snapshot``.

    ``base_rows``: a cache of ``base``'s live rows by split id (empty, or filled by a call with the
    same ``base``): filled on first use, then reused, as the deltas of one base are many (at 10,000
    splits making them cost about as much as the delta's own rows). Never changed after filled.
    """
    _guard_fields(base, ENUMERATOR_FIELDS)
    _guard_fields(snapshot, ENUMERATOR_FIELDS)
    before = base_rows or _live_rows(base)
    if base_rows is not None and not base_rows and before:
        base_rows.update(before)
    now = _live_rows(snapshot)
    if before is None or now is None:
        return None
    if not before.keys().isdisjoint(base.finished) or not now.keys().isdisjoint(snapshot.finished):
        return None
    out = [row for split_id, row in now.items() if before.get(split_id) != row]
    identities, old_identities = snapshot.finished_identities, base.finished_identities
    # set operations on the identities' items (in C), not a Python loop over every finished split
    touched = {s for s, _identity in identities.items() - old_identities.items()}
    touched |= old_identities.keys() - identities.keys()
    renewed = touched & snapshot.finished & base.finished
    out += [
        _entry_row("finished", s, identity=identities.get(s))
        for s in sorted((snapshot.finished - base.finished) | renewed)
    ]
    gone = ((base.finished - snapshot.finished) | (before.keys() - snapshot.finished)) - now.keys()
    out += [_entry_row("removed", s) for s in sorted(gone)]
    old, new = base.backlog, snapshot.backlog
    old_ids = old.boundaries.keys() | old.finished
    new_ids = new.boundaries.keys() | new.finished
    moved = {s for s, _end in old.boundaries.items() ^ new.boundaries.items()} | (old.finished ^ new.finished)
    for split_id in sorted(moved & new_ids):
        out.append(
            _entry_row(
                "backlog",
                split_id,
                backlog_end=new.boundaries.get(split_id),
                backlog_finished=split_id in new.finished,
            )
        )
    out += [_entry_row("backlog_removed", s) for s in sorted(old_ids - new_ids)]
    return out


# ---------------------------------------------------------------------------------------
# CompletedCheckpoint (checkpoints row + enumerator_state rows)
# ---------------------------------------------------------------------------------------

CHECKPOINT_FIELDS = frozenset(
    {
        "checkpoint_id",
        "kind",
        "parallelism",
        "regions",
        "enumerator",
        "consecutive_regional",
        "processing_backlog",
    }
)


def checkpoint_to_row(completed: CompletedCheckpoint) -> Row:
    """The ``checkpoints`` columns that come from the checkpoint itself.

    An ABORTED checkpoint has no row (it goes to ``checkpoint_log``): InvalidParameterError.
    """
    _guard_fields(completed, CHECKPOINT_FIELDS)
    if completed.kind is CheckpointKind.ABORTED:
        raise InvalidParameterError(
            "kind",
            completed.kind.value,
            "global or regional: only completed checkpoints have a checkpoints row",
            hint="record aborted attempts with DeltaStateStore.log_attempt",
        )
    for key, state in completed.regions.items():
        if key != state.region_id:
            raise InvalidParameterError(
                "regions",
                key,
                f"the key of each region equal to its RegionState.region_id ({state.region_id})",
                hint=f"checkpoint {completed.checkpoint_id}",
            )
    return {
        "checkpoint_id": completed.checkpoint_id,
        "kind": completed.kind.value,
        "parallelism": completed.parallelism,
        "consecutive_regional": completed.consecutive_regional,
        "processing_backlog": completed.processing_backlog,
        "regions": [region_to_row(completed.regions[r]) for r in sorted(completed.regions)],
        "enumerator": None if completed.enumerator is None else enumerator_header(completed.enumerator),
        "discovery": None
        if completed.enumerator is None
        else discovery_to_rows(completed.enumerator.discovery),
    }


def discovery_to_rows(positions: Mapping[str, int]) -> list[Row] | None:
    """The ``discovery`` column: the source's own discovery positions (None: it has none)."""
    return [{"key": k, "position": int(v)} for k, v in sorted(positions.items())] or None


def discovery_from_rows(rows: Iterable[Mapping[str, Any]] | None) -> dict[str, int]:
    """The positions of a ``discovery`` column (NULL, in state written before it existed: none)."""
    return {str(r["key"]): int(r["position"]) for r in rows or () if r.get("position") is not None}


def checkpoint_from_rows(
    row: Mapping[str, Any],
    enumerator_rows: Iterable[Mapping[str, Any]] = (),
    *,
    table: str = "checkpoints",
    enumerator_table: str = "enumerator_state",
    finished: tuple[Sequence[str], Sequence[str | None]] = ((), ()),
) -> CompletedCheckpoint:
    """Rebuild a checkpoint from its ``checkpoints`` row and its ``enumerator_state`` rows
    (``finished``: more finished rows as two columns, :func:`enumerator_from_rows`).

    ``table``/``enumerator_table`` name where the rows came from in errors (a decision
    record keeps both in the ``decisions`` table).
    """
    where = RowPlace(table, _opt_int(row.get("checkpoint_id")))
    regions = [region_from_row(r, where) for r in row.get("regions") or ()]
    header = row.get("enumerator")
    return CompletedCheckpoint(
        checkpoint_id=int(row["checkpoint_id"]),
        kind=_enum(CheckpointKind, row["kind"], "checkpoints.kind"),
        parallelism=int(row["parallelism"]),
        regions={r.region_id: r for r in regions},
        enumerator=None
        if header is None
        else replace(
            enumerator_from_rows(header, enumerator_rows, enumerator_table, finished=finished),
            discovery=discovery_from_rows(row.get("discovery")),
        ),
        consecutive_regional=int(row["consecutive_regional"]),
        processing_backlog=bool(row["processing_backlog"]),
    )


# ---------------------------------------------------------------------------------------
# AuditRecord
# ---------------------------------------------------------------------------------------

AUDIT_FIELDS = frozenset({"split_id", "reader_id", "decision", "checkpoint_id", "detail"})


def audit_to_row(record: AuditRecord, seq: int) -> Row:
    """An audit row (without the committing checkpoint_id / attempt_id); ``seq`` keeps order."""
    _guard_fields(record, AUDIT_FIELDS)
    return {
        "seq": seq,
        "split_id": record.split_id,
        "reader_id": record.reader_id,
        "decision": record.decision.value,
        "decision_checkpoint_id": record.checkpoint_id,
        "detail": record.detail,
    }


def audit_from_row(row: Mapping[str, Any]) -> AuditRecord:
    return AuditRecord(
        split_id=row["split_id"],
        reader_id=_opt_int(row.get("reader_id")),
        decision=_enum(RecoveryDecision, row["decision"], "audit.decision"),
        checkpoint_id=_opt_int(row.get("decision_checkpoint_id")),
        detail=row.get("detail") or "",
    )


def audit_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[AuditRecord]:
    """Audit records in their committed order."""
    return [audit_from_row(r) for r in sorted(rows, key=lambda r: int(r["seq"]))]


# ---------------------------------------------------------------------------------------
# EpochPlan
# ---------------------------------------------------------------------------------------


def coerce_plan(epoch_id: int, plan: EpochPlan | Mapping[int, Iterable[Any]], run_id: str = "") -> EpochPlan:
    """An :class:`EpochPlan` from a plan or from ``{region: [range, ...]}``.

    A range is a :class:`PlannedRange`, an object with ``split_id`` (or ``split``),
    ``start`` and ``end`` attributes, or a ``(split, start, end)`` tuple whose first item
    is a :class:`Split` or a split id. A split planned twice in one epoch
    is rejected (InvalidParameterError).
    """
    if isinstance(plan, EpochPlan):
        if plan.epoch_id != epoch_id:
            raise InvalidParameterError(
                "plan.epoch_id", plan.epoch_id, f"the epoch being planned ({epoch_id})"
            )
        regions_in: Mapping[int, Iterable[Any]] = plan.regions
        run_id = run_id or plan.run_id
    else:
        regions_in = plan
    regions: dict[int, tuple[PlannedRange, ...]] = {}
    seen: dict[str, int] = {}
    for region_id, ranges in regions_in.items():
        converted: list[PlannedRange] = []
        for item in ranges:
            if isinstance(item, PlannedRange):
                planned = item
            elif isinstance(item, Sequence) and not isinstance(item, str) and len(item) == 3:
                planned = PlannedRange(_split_id_of(item[0]), int(item[1]), int(item[2]))
            else:
                split = getattr(item, "split", None)
                split_id = _split_id_of(split) if split is not None else str(item.split_id)
                planned = PlannedRange(split_id, int(item.start), int(item.end))
            if planned.split_id in seen:
                raise InvalidParameterError(
                    "plan",
                    planned.split_id,
                    "each split planned at most once per epoch",
                    hint=f"epoch {epoch_id}: regions {seen[planned.split_id]} and {region_id} both read it",
                )
            seen[planned.split_id] = int(region_id)
            converted.append(planned)
        regions[int(region_id)] = tuple(converted)
    return EpochPlan(epoch_id=epoch_id, regions=regions, run_id=run_id)


def _split_id_of(value: Any) -> str:
    """A split id from a :class:`Split` (or anything with ``split_id``) or a plain id."""
    return str(value.split_id) if hasattr(value, "split_id") else str(value)


def plan_to_rows(plan: EpochPlan) -> list[Row]:
    """``epoch_plans`` rows (without run_id / planned_at); empty regions get a marker row."""
    rows: list[Row] = []
    for region_id in sorted(plan.regions):
        ranges = plan.regions[region_id]
        if not ranges:
            rows.append(
                {
                    "epoch_id": plan.epoch_id,
                    "region_id": region_id,
                    "seq": -1,
                    "split_id": None,
                    "start": None,
                    "end": None,
                }
            )
        for seq, r in enumerate(ranges):
            rows.append(
                {
                    "epoch_id": plan.epoch_id,
                    "region_id": region_id,
                    "seq": seq,
                    "split_id": r.split_id,
                    "start": r.start,
                    "end": r.end,
                }
            )
    return rows


def plan_from_rows(epoch_id: int, rows: Iterable[Mapping[str, Any]]) -> EpochPlan:
    regions: dict[int, list[tuple[int, PlannedRange]]] = {}
    run_ids: set[str] = set()
    for row in rows:
        region = regions.setdefault(int(row["region_id"]), [])
        if row.get("run_id"):
            run_ids.add(row["run_id"])
        if row.get("split_id") is None:
            continue
        region.append((int(row["seq"]), PlannedRange(row["split_id"], int(row["start"]), int(row["end"]))))
    if len(run_ids) > 1:
        raise StateError(
            f"epoch {epoch_id} has plan rows of several runs ({', '.join(sorted(run_ids))}): the plan is "
            "corrupt; delete the epoch_plans rows of this epoch and replan it",
            epoch_id=epoch_id,
            run_ids=sorted(run_ids),
        )
    return EpochPlan(
        epoch_id=epoch_id,
        regions={r: tuple(p for _, p in sorted(items, key=lambda i: i[0])) for r, items in regions.items()},
        run_id=next(iter(run_ids), ""),
    )


# ---------------------------------------------------------------------------------------
# EpochDecision (decisions rows)
# ---------------------------------------------------------------------------------------

DECISION_FIELDS = frozenset(
    {"checkpoint", "attempt_id", "audit", "acknowledged", "configured_parallelism", "reason", "split_weights"}
)


def split_weights_to_rows(weights: Sequence[tuple[str, float]]) -> list[Row] | None:
    """The ``split_weights`` column: None unless the strategy is weighted."""
    return [{"split_id": sid, "weight": float(w)} for sid, w in weights] or None


def split_weights_from_rows(rows: Iterable[Mapping[str, Any]] | None) -> dict[str, float]:
    return {str(r["split_id"]): float(r["weight"]) for r in rows or ()}


def decision_to_row(
    decision: EpochDecision, entries: Sequence[Row] | None = None, base: int | None = None
) -> Row:
    """The ``decisions`` columns of a decision (without run_id / decided_at).

    ``entries``: the ``enumerator_state`` rows of its checkpoint as its commit writes them, a
    delta against kept checkpoint ``base`` (state rule 6) or, with ``base`` None, a full snapshot
    (default: the full snapshot of the decision's enumerator). A decision with a base is decoded
    with that base's rows (:func:`decision_from_row`'s ``enumerator``)."""
    _guard_fields(decision, DECISION_FIELDS)
    completed = decision.checkpoint
    row = checkpoint_to_row(completed)
    epoch_id = row.pop("checkpoint_id")
    if entries is None:
        base = None
        entries = [] if completed.enumerator is None else enumerator_to_rows(completed.enumerator)
    return {
        "epoch_id": epoch_id,
        "attempt_id": decision.attempt_id,
        **row,
        "enumerator_rows": [],
        "enumerator_base": base,
        "enumerator_entries": list(entries),
        "audit": [audit_to_row(record, seq) for seq, record in enumerate(decision.audit)],
        "acknowledged": [int(r) for r in decision.acknowledged],
        "configured_parallelism": decision.configured_parallelism,
        "reason": decision.reason,
        "split_weights": split_weights_to_rows(decision.split_weights),
    }


def decision_from_row(
    row: Mapping[str, Any],
    enumerator: tuple[Iterable[Mapping[str, Any]], tuple[Sequence[str], Sequence[str | None]]] | None = None,
) -> EpochDecision:
    """Rebuild a decision from its ``decisions`` row. ``enumerator``: its checkpoint's full
    ``enumerator_state`` rows, as (the rows not finished, (the finished ids, their identities)),
    when its ``enumerator_entries`` are a delta (``enumerator_base`` set: the caller applies them to
    the base's rows); otherwise the row's own entries (or, in a row written before them, its
    ``enumerator_rows``) are the full snapshot."""
    header = {**row, "checkpoint_id": row["epoch_id"]}
    if enumerator is None and row.get("enumerator_base") is not None:
        raise StateError(
            f"decision of epoch {row['epoch_id']} (attempt {row['attempt_id']}): its enumerator entries "
            "are a "
            f"delta against checkpoint {row['enumerator_base']}, whose rows were not given",
            table="decisions",
        )
    if enumerator is not None:
        rows, finished = enumerator
    else:
        entries = row.get("enumerator_entries")
        rows, finished = (row.get("enumerator_rows") or () if entries is None else entries), ((), ())
    completed = checkpoint_from_rows(
        header, rows, table="decisions", enumerator_table="decisions", finished=finished
    )
    return EpochDecision(
        checkpoint=completed,
        attempt_id=str(row["attempt_id"]),
        audit=tuple(audit_from_rows(row.get("audit") or ())),
        acknowledged=tuple(int(r) for r in row.get("acknowledged") or ()),
        configured_parallelism=_opt_int(row.get("configured_parallelism")),
        reason=row.get("reason") or "",
        split_weights=tuple(split_weights_from_rows(row.get("split_weights")).items()),
    )


# ---------------------------------------------------------------------------------------
# A checkpoint's phase times and failed regions' causes (checkpoints / checkpoint_log columns)
# ---------------------------------------------------------------------------------------


def incident_columns(phases_ms: Mapping[str, int] | None, failures: Sequence[RegionFailure]) -> Row:
    """The ``plan_ms``, ``read_ms``, ``sink_ms`` and ``failures`` columns of a row (NULL when unknown)."""
    phases = dict(phases_ms or {})
    return {
        **{f"{p}_ms": None if phases.get(p) is None else int(phases[p]) for p in ("plan", "read", "sink")},
        "failures": [
            {
                "region_id": int(f.region_id),
                "outcome": f.outcome,
                "error_class": f.error_class,
                "message": f.message,
                "split_id": f.split_id,
                "offset": f.offset,
            }
            for f in sorted(failures, key=lambda f: f.region_id)
        ]
        or None,
    }


def failures_from_rows(rows: Iterable[Mapping[str, Any]] | None) -> tuple[RegionFailure, ...]:
    """The ``failures`` column back as :class:`RegionFailure` values (empty for NULL)."""
    return tuple(
        RegionFailure(
            region_id=int(r["region_id"]),
            outcome=str(r["outcome"] or ""),
            error_class=str(r["error_class"] or ""),
            message=str(r["message"] or ""),
            split_id=r.get("split_id"),
            offset=_opt_int(r.get("offset")),
        )
        for r in rows or ()
    )
