"""The split enumerator: the single source of truth for who owns which split (protocol section 1).

Three pieces:

- :class:`SplitEnumeratorContext`: what the enumerator sees of the runtime
  (parallelism, registered readers) and the only way it assigns or revokes.
- :class:`RecordingEnumeratorContext`: an in-memory context that records every
  call in order and tracks what was assigned since the last completed
  checkpoint (Flink's ``SplitAssignmentTracker``). Tests, the simulator and the
  Spark runtime (which turns the enumerator's assignment into the next epoch
  plan) use it.
- :class:`SplitEnumerator`: one concrete class. Its behaviour is chosen by the
  :class:`~splitkeeper.core.assignment.AssignmentStrategy` and by
  ``reassign_on_recovery`` (FLIP-537 deferred assignment), which
  :func:`enumerator_for` sets from the source's mix-in.

Event order the framework guarantees (and the enumerator relies on):

1. ``start()`` once (after ``restore()`` when restoring);
2. a reader registers in the context, then ``add_reader(reader_id)``;
3. a failed reader: the context unregisters it, then
   ``add_splits_back(splits assigned since the last completed checkpoint, reader_id)``,
   always before the recovered reader registers again;
4. a reader gone for good (rescale down): unregister, then ``remove_reader``.

Everything is single-threaded and deterministic: the same event sequence
gives the same assignments, audit trail and snapshots.
"""

from __future__ import annotations

import abc
import enum
import gc
from bisect import bisect_right
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from operator import attrgetter
from types import MappingProxyType

from splitkeeper.core.assignment import AssignmentStrategy, strategy_by_name, validate_parallelism
from splitkeeper.core.backlog import BacklogTracker
from splitkeeper.core.source import (
    SplitChange,
    SplitChangeKind,
    SplitSource,
    SupportsDiscoveryPositions,
    SupportsSplitIdentityCheck,
    SupportsSplitReassignmentOnRecovery,
)
from splitkeeper.core.types import (
    DISCOVERED_DETAIL,
    Assignment,
    AuditRecord,
    EnumeratorSnapshot,
    ReaderInfo,
    RecoveryDecision,
    Split,
    SplitChangePolicy,
)
from splitkeeper.errors import InvalidParameterError, ProtocolError, SourceError

# ---------------------------------------------------------------------------------------------
# Context


class SplitEnumeratorContext(abc.ABC):
    """The runtime as the enumerator sees it. Assignment happens only through here."""

    @property
    @abc.abstractmethod
    def parallelism(self) -> int:
        """The number of readers (reader ids are ``0 .. parallelism - 1``)."""

    @abc.abstractmethod
    def registered_readers(self) -> Mapping[int, ReaderInfo]:
        """Readers registered now, with what each reported at registration (read-only)."""

    @abc.abstractmethod
    def assign_splits(self, assignment: Mapping[int, Sequence[Split]]) -> None:
        """Hand splits to registered readers; each reader reads them from the given position.

        Called only by the enumerator, after it updated its own ownership map.
        """

    @abc.abstractmethod
    def revoke_splits(self, revocation: Mapping[int, Sequence[str]]) -> None:
        """Tell readers to stop reading splits (rebalance moves, removed subscriptions).

        The runtime applies a revocation at the next epoch boundary, after the
        checkpoint that acknowledges the reader's position of those splits.
        """

    @abc.abstractmethod
    def update_splits(self, updates: Mapping[int, Sequence[Split]]) -> None:
        """Hand readers new metadata of splits they already own (a backlog boundary after a reset).

        Ownership does not change and each reader keeps its own position; only the
        split's other fields (``backlog_end``) are the enumerator's new ones
        (protocol rule 4.1). Called only by the enumerator.
        """


@dataclass(frozen=True, slots=True)
class AssignmentCall:
    """One recorded ``assign_splits`` call; ``sequence`` orders all recorded calls."""

    sequence: int
    assignment: Mapping[int, tuple[Split, ...]]


@dataclass(frozen=True, slots=True)
class RevocationCall:
    """One recorded ``revoke_splits`` call."""

    sequence: int
    revocation: Mapping[int, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class UpdateCall:
    """One recorded ``update_splits`` call."""

    sequence: int
    updates: Mapping[int, tuple[Split, ...]]


class RecordingEnumeratorContext(SplitEnumeratorContext):
    """In-memory context: registers readers, records every call, tracks uncheckpointed assignments.

    The assignment tracker mirrors Flink's ``SplitAssignmentTracker``:
    ``on_checkpoint(id)`` closes the current batch of assignments under that
    id, ``on_checkpoint_complete(id)`` forgets batches up to it (except those
    of readers whose region fell back, protocol rule 2.4), and
    :meth:`splits_assigned_since_last_checkpoint` is what the framework passes
    to ``add_splits_back`` when a reader fails.
    """

    def __init__(self, parallelism: int) -> None:
        self._parallelism = validate_parallelism(parallelism)
        self._readers: dict[int, ReaderInfo] = {}
        self._calls: list[AssignmentCall | RevocationCall | UpdateCall] = []
        self._uncheckpointed: dict[int, list[Split]] = {}
        self._by_checkpoint: dict[int, dict[int, list[Split]]] = {}
        self._carried: dict[int, list[Split]] = {}  # failed regions' assignments kept past completion

    # -- readers --------------------------------------------------------------------------------

    @property
    def parallelism(self) -> int:
        return self._parallelism

    def set_parallelism(self, parallelism: int) -> None:
        """Change the reader count (rescale). Registered readers outside the new range must be gone."""
        validate_parallelism(parallelism)
        beyond = sorted(r for r in self._readers if r >= parallelism)
        if beyond:
            raise ProtocolError(
                f"cannot set parallelism {parallelism}: readers {beyond} are still registered; "
                "unregister them first",
                parallelism=parallelism,
            )
        self._parallelism = parallelism

    def register_reader(
        self, reader_id: int, reported_splits: Iterable[Split] = (), location: str = ""
    ) -> ReaderInfo:
        """Register a (re)started reader with the splits restored from its state."""
        if (
            isinstance(reader_id, bool)
            or not isinstance(reader_id, int)
            or not 0 <= reader_id < self._parallelism
        ):
            raise InvalidParameterError(
                "reader_id",
                reader_id,
                f"an integer in 0..{self._parallelism - 1} (parallelism {self._parallelism})",
            )
        if reader_id in self._readers:
            raise ProtocolError(
                f"reader {reader_id} is already registered; a restarted reader is unregistered first",
                reader_id=reader_id,
            )
        info = ReaderInfo(reader_id=reader_id, reported_splits=tuple(reported_splits), location=location)
        self._readers[reader_id] = info
        return info

    def unregister_reader(self, reader_id: int) -> list[Split]:
        """Unregister a failed or removed reader.

        Returns, and forgets, the splits assigned to it since the last
        completed checkpoint: pass them to ``SplitEnumerator.add_splits_back``.
        """
        if reader_id not in self._readers:
            raise ProtocolError(f"reader {reader_id} is not registered", reader_id=reader_id)
        del self._readers[reader_id]
        since = self.splits_assigned_since_last_checkpoint(reader_id)
        self._carried.pop(reader_id, None)
        self._uncheckpointed.pop(reader_id, None)
        for batch in self._by_checkpoint.values():
            batch.pop(reader_id, None)
        return since

    def registered_readers(self) -> Mapping[int, ReaderInfo]:
        return MappingProxyType(self._readers)

    # -- calls ----------------------------------------------------------------------------------

    def assign_splits(self, assignment: Mapping[int, Sequence[Split]]) -> None:
        unknown = sorted(r for r in assignment if r not in self._readers)
        if unknown:
            raise ProtocolError(f"cannot assign splits to unregistered readers {unknown}", readers=unknown)
        recorded = {r: tuple(splits) for r, splits in assignment.items() if splits}
        if not recorded:
            return
        self._calls.append(AssignmentCall(len(self._calls), MappingProxyType(recorded)))
        for r, splits in recorded.items():
            self._uncheckpointed.setdefault(r, []).extend(splits)

    def revoke_splits(self, revocation: Mapping[int, Sequence[str]]) -> None:
        recorded = {r: tuple(ids) for r, ids in revocation.items() if ids}
        if recorded:
            self._calls.append(RevocationCall(len(self._calls), MappingProxyType(recorded)))

    def update_splits(self, updates: Mapping[int, Sequence[Split]]) -> None:
        recorded = {r: tuple(splits) for r, splits in updates.items() if splits}
        if recorded:
            self._calls.append(UpdateCall(len(self._calls), MappingProxyType(recorded)))

    @property
    def calls(self) -> list[AssignmentCall | RevocationCall | UpdateCall]:
        """Every assign/revoke/update call, in order."""
        return list(self._calls)

    @property
    def assignment_calls(self) -> list[AssignmentCall]:
        return [c for c in self._calls if isinstance(c, AssignmentCall)]

    def splits_sent_to(self, reader_id: int) -> list[Split]:
        """Every split ever assigned to ``reader_id`` through this context, in order."""
        return [
            s for c in self._calls if isinstance(c, AssignmentCall) for s in c.assignment.get(reader_id, ())
        ]

    # -- assignment tracker ---------------------------------------------------------------------

    def on_checkpoint(self, checkpoint_id: int) -> None:
        """Close the batch of assignments made since the previous checkpoint under ``checkpoint_id``.

        Called by the runtime when the checkpoint is triggered, in id order.
        """
        if self._by_checkpoint and checkpoint_id <= max(self._by_checkpoint):
            raise InvalidParameterError(
                "checkpoint_id",
                checkpoint_id,
                f"an id greater than the previous checkpoint id {max(self._by_checkpoint)}",
            )
        self._by_checkpoint[checkpoint_id] = self._uncheckpointed
        self._uncheckpointed = {}

    def on_checkpoint_complete(self, checkpoint_id: int, failed_readers: Collection[int] = ()) -> None:
        """Forget batches up to ``checkpoint_id``: those readers' states now contain the splits.

        ``failed_readers`` are readers whose region did not acknowledge (a
        regional checkpoint): their state in this checkpoint is an older one
        that lacks these splits, so their entries are kept until a checkpoint
        they acknowledge completes (protocol rule 2.4). An aborted checkpoint is
        simply never completed.
        """
        failed = set(failed_readers)
        for r in list(self._carried):
            if r not in failed:
                del self._carried[r]
        for cid in sorted(c for c in self._by_checkpoint if c <= checkpoint_id):
            batch = self._by_checkpoint.pop(cid)
            for r, splits in batch.items():
                if r in failed:
                    self._carried.setdefault(r, []).extend(splits)

    def splits_assigned_since_last_checkpoint(self, reader_id: int) -> list[Split]:
        """Splits assigned to ``reader_id`` that no completed checkpoint of its region contains."""
        out = list(self._carried.get(reader_id, ()))
        for cid in sorted(self._by_checkpoint):
            out.extend(self._by_checkpoint[cid].get(reader_id, ()))
        out.extend(self._uncheckpointed.get(reader_id, ()))
        return out


# ---------------------------------------------------------------------------------------------
# Enumerator


class EnumeratorPhase(enum.Enum):
    CREATED = "created"  # constructed (maybe restored), start() not called yet
    AWAITING_READERS = "awaiting_readers"  # started; waiting until every expected reader registered
    RUNNING = "running"  # the first assignment round happened; later registrations are failovers


_SPLIT_ID = attrgetter("split_id")

#: Pools at least this large are placed with the cyclic garbage collector paused (see _bulk).
BULK_SPLITS = 50_000


@contextmanager
def _bulk(size: int) -> Iterator[None]:
    """Pause the cyclic GC around a bulk operation on ``size`` splits, then restore its state.

    Bulk placement creates no reference cycles (refcounting frees everything),
    but every young-generation pass would traverse the million-element
    working lists: measured at 1M splits, that was ~40% of the assignment.
    Small operations run untouched.
    """
    if size < BULK_SPLITS or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# Compact audit entry: (decision, reader, one split id or a tuple of them, checkpoint id, detail).
_AuditEntry = tuple[RecoveryDecision, int | None, str | tuple[str, ...], int | None, str]


def _expand(entry: _AuditEntry, skip: int = 0) -> list[AuditRecord]:
    decision, reader, ids, cid, detail = entry
    if isinstance(ids, str):
        return [] if skip else [AuditRecord(ids, reader, decision, cid, detail)]
    return [AuditRecord(i, reader, decision, cid, detail) for i in ids[skip:]]


class _AuditLog:
    """The audit trail, stored compactly (one entry per batch) and indexed by record count."""

    __slots__ = ("entries", "ends")

    def __init__(self) -> None:
        self.entries: list[_AuditEntry] = []
        self.ends: list[int] = []  # ends[i]: records in entries[0..i]

    def append(self, entry: _AuditEntry) -> None:
        size = 1 if isinstance(entry[2], str) else len(entry[2])
        self.entries.append(entry)
        self.ends.append((self.ends[-1] if self.ends else 0) + size)

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def since(self, start: int) -> list[AuditRecord]:
        i = bisect_right(self.ends, start)
        if i >= len(self.entries):
            return []
        out = _expand(self.entries[i], start - (self.ends[i - 1] if i else 0))
        for entry in self.entries[i + 1 :]:
            out.extend(_expand(entry))
        return out


class SplitEnumerator:
    """Discovers splits, assigns them through the context, and decides every recovery case.

    State: every live split with its latest known position, the unassigned
    pool, the splits each reader owns, finished split ids, subscriptions, the
    backlog tracker and an audit trail of every decision. :meth:`snapshot`
    writes all of it into an :class:`EnumeratorSnapshot` (positions included).

    With ``reassign_on_recovery`` (FLIP-537) readers hand their restored
    splits to the enumerator: on a global restore they are pooled and
    redistributed by the strategy once every expected reader registered; on a
    partial failover the reader's own splits return to the pool and are
    reassigned. Without it (legacy) readers keep what they restored and
    pooled splits go eagerly to whichever readers are registered.

    Assignment waits for the first round until every expected reader
    (``0 .. parallelism - 1``) has registered; with ``reassign_on_recovery``
    it also waits while any expected reader is away (a partial failover), so
    a failed reader gets its splits back (sticky). Balanced strategies are
    kept balanced by :meth:`AssignmentStrategy.rebalance` after every event.
    """

    def __init__(
        self,
        context: SplitEnumeratorContext,
        strategy: AssignmentStrategy,
        *,
        reassign_on_recovery: bool,
        source: SplitSource | None = None,
        subscriptions: Iterable[str] | None = None,
    ) -> None:
        self._context = context
        self._strategy = strategy
        self._reassign = bool(reassign_on_recovery)
        self._source = source
        self._subscriptions = None if subscriptions is None else frozenset(subscriptions)
        self._backlog = BacklogTracker()
        self._phase = EnumeratorPhase.CREATED
        # Every live split (pooled or owned) with its latest position: the registry of truth.
        self._splits: dict[str, Split] = {}
        # The pool: ids -> the same Split objects as in the registry, in arrival order.
        self._pool: dict[str, Split] = {}
        # Per reader, the ids it owns (an ordered set: oldest assignment first). No global
        # owner map: a bulk assignment then touches only small per-reader containers.
        self._owned: dict[int, dict[str, None]] = {}
        self._finished: set[str] = set()
        self._finished_identities: dict[str, str] = {}  # finished id -> identity when it finished
        self._quarantined: dict[str, Split] = {}  # parked: read by nobody until released
        self._expected: set[int] = set()
        self._active: set[int] = set()  # readers whose add_reader ran and that have not failed since
        self._restored_from: int | None = None
        self._restore_expected: dict[str, tuple[int, Split]] = {}  # snapshot's owned splits, until reported
        self._reporter: dict[str, int] = {}  # during the first round: which reader reported a split
        self._dropped_in_round: set[str] = set()  # first round: drops already audited (snapshot + report)
        self._last_checkpoint_id: int | None = None
        self._audit = _AuditLog()

    # -- read-only views ------------------------------------------------------------------------

    @property
    def context(self) -> SplitEnumeratorContext:
        return self._context

    @property
    def strategy(self) -> AssignmentStrategy:
        return self._strategy

    @property
    def reassign_on_recovery(self) -> bool:
        return self._reassign

    @property
    def phase(self) -> EnumeratorPhase:
        return self._phase

    @property
    def subscriptions(self) -> frozenset[str] | None:
        """The subscribed names, or None when the enumerator does not filter by subscription."""
        return self._subscriptions

    @property
    def expected_readers(self) -> tuple[int, ...]:
        return tuple(sorted(self._expected))

    @property
    def pending_readers(self) -> tuple[int, ...]:
        """Expected readers that are not registered-and-added now (what assignment waits for)."""
        registered = self._context.registered_readers()
        return tuple(sorted(r for r in self._expected if r not in self._active or r not in registered))

    @property
    def finished_split_ids(self) -> frozenset[str]:
        return frozenset(self._finished)

    @property
    def pool_size(self) -> int:
        return len(self._pool)

    @property
    def backlog(self) -> BacklogTracker:
        return self._backlog

    @property
    def processing_backlog(self) -> bool:
        """True while any tracked split has not caught up with its backlog boundary (protocol section 4)."""
        return self._backlog.processing_backlog

    def split(self, split_id: str) -> Split | None:
        """The live split with its latest known position, or None (finished, dropped, unknown)."""
        return self._splits.get(split_id)

    def owner_of(self, split_id: str) -> int | None:
        """The reader owning ``split_id``, or None (pooled, finished or unknown). O(readers)."""
        if split_id in self._pool or split_id not in self._splits:
            return None
        for reader_id in sorted(self._owned):
            if split_id in self._owned[reader_id]:
                return reader_id
        return None  # pragma: no cover - a registry split is always pooled or owned

    def owners(self) -> dict[str, int | None]:
        """A copy of the ownership map: every live split id -> reader, or None when pooled."""
        out: dict[str, int | None] = dict.fromkeys(self._pool)
        for reader_id, ids in self._owned.items():
            out.update(dict.fromkeys(ids, reader_id))
        return out

    def owned_split_ids(self, reader_id: int) -> list[str]:
        """The ids ``reader_id`` owns, oldest assignment first."""
        return list(self._owned.get(reader_id, ()))

    def loads(self) -> dict[int, int]:
        """Split count per expected reader (and any other reader that still owns splits)."""
        return {r: len(self._owned.get(r, ())) for r in sorted(self._expected | set(self._owned))}

    def assignment(self) -> Assignment:
        """An immutable view of the current ownership: per-reader splits and the pool."""
        readers = sorted(self._expected | {r for r, s in self._owned.items() if s})
        splits = self._splits
        return Assignment(
            readers={r: tuple(splits[s] for s in self._owned.get(r, ())) for r in readers},
            pool=tuple(self._pool.values()),
        )

    @property
    def audit(self) -> list[AuditRecord]:
        """Every decision so far, in order, one record per split (builds every record: prefer
        :meth:`audit_since` and :attr:`audit_count` for incremental persistence)."""
        return self._audit.since(0)

    @property
    def audit_count(self) -> int:
        """How many audit records exist (O(1)); ``len(audit)`` without building them."""
        return len(self._audit)

    def audit_since(self, start: int) -> list[AuditRecord]:
        """The audit records from index ``start`` on (``audit[start:]``), building only those."""
        if start < 0:
            raise InvalidParameterError("start", start, "a record index >= 0")
        return self._audit.since(start)

    def departed_since(self, start: int, decisions: Collection[RecoveryDecision]) -> frozenset[str]:
        """The ids of the splits given one of ``decisions`` in the audit records from index ``start``
        on (what :meth:`audit_since` would list), without building the records."""
        if start < 0:
            raise InvalidParameterError("start", start, "a record index >= 0")
        log = self._audit
        i = bisect_right(log.ends, start)
        out: set[str] = set()
        for decision, _reader, ids, _cid, _detail in log.entries[i:]:
            if decision in decisions:
                out.update((ids,) if isinstance(ids, str) else ids)
        return frozenset(out)

    def audit_for(self, split_id: str) -> list[AuditRecord]:
        """The decisions about one split, in order."""
        return [
            AuditRecord(split_id, reader, decision, cid, detail)
            for decision, reader, ids, cid, detail in self._audit.entries
            if (ids == split_id if isinstance(ids, str) else split_id in ids)
        ]

    def audit_counts(self) -> dict[RecoveryDecision, int]:
        """How many splits each decision was applied to (cheap; no record objects)."""
        counts: dict[RecoveryDecision, int] = {}
        for decision, _reader, ids, _cid, _detail in self._audit.entries:
            counts[decision] = counts.get(decision, 0) + (1 if isinstance(ids, str) else len(ids))
        return counts

    # -- lifecycle ------------------------------------------------------------------------------

    def restore(self, snapshot: EnumeratorSnapshot) -> None:
        """Restore from a checkpoint: a **global restore** (protocol rule 1.3).

        Called at most once, before :meth:`start`. The pool, finished splits
        and backlog state come from the snapshot. Ownership is rebuilt from
        the reader reports: the snapshot's per-reader splits are only the
        fallback for splits no reader reports (they are pooled once every
        reader registered, so none is lost). Splits of removed subscriptions
        and finished splits are dropped, each with an audit record.
        """
        if self._phase is not EnumeratorPhase.CREATED or self._restored_from is not None:
            raise ProtocolError(
                "restore() must be called once, on a new enumerator, before start()",
                phase=self._phase.value,
            )
        self._finished = set(snapshot.finished)
        self._finished_identities = {
            sid: ident
            for sid, ident in snapshot.finished_identities.items()
            if sid in self._finished and ident
        }
        self._quarantined = {s.split_id: s for s in snapshot.quarantined}
        self._backlog.restore(snapshot.backlog)
        self._last_checkpoint_id = snapshot.checkpoint_id
        self._restored_from = snapshot.checkpoint_id
        for split in snapshot.pool:
            if self._drop_on_arrival(split, None, "in the restored pool"):
                continue
            self._to_pool(split)
        for reader_id in sorted(snapshot.assignments):
            for split in snapshot.assignments[reader_id]:
                if self._drop_on_arrival(split, reader_id, f"owned by reader {reader_id} in the snapshot"):
                    continue
                self._restore_expected[split.split_id] = (reader_id, split)

    def start(self) -> None:
        """Begin: called once, after construction (and ``restore``), before any other event.

        Runs a first discovery when a source is attached. No split is assigned
        until every expected reader (``0 .. parallelism - 1``) has registered.
        """
        if self._phase is not EnumeratorPhase.CREATED:
            raise ProtocolError("start() was already called", phase=self._phase.value)
        self._expected = set(range(self._context.parallelism))
        self._phase = EnumeratorPhase.AWAITING_READERS
        if self._source is not None:
            self.discover()

    def discover(self) -> int:
        """Ask the attached source for its splits and add the new ones; returns how many were new."""
        if self._source is None:
            raise ProtocolError("discover() needs a source; this enumerator was created without one")
        if isinstance(self._source, SupportsSplitIdentityCheck):
            # The source learns the layout of the splits known here first, so that a restarted
            # process discovers them under their known ids. What changed is the driver's to apply
            # (rule 1.9): until then the ids a change names (a moved file's new id) stay out.
            changes = self._source.check_splits(self.known_splits(), self.finished_identities)
            held = {c.moved_to for c in changes} | {s.split_id for c in changes for s in c.replacement}
            return self.add_splits(s for s in self._source.discover_splits() if s.split_id not in held)
        return self.add_splits(self._source.discover_splits())

    # -- events ---------------------------------------------------------------------------------

    def add_splits(self, splits: Iterable[Split]) -> int:
        """Splits found by discovery. Returns how many entered the pool.

        New ids enter the pool (DISCOVERED) and are assigned by the strategy.
        Ids already known (pooled, owned, reported on restore) or finished are
        ignored silently, so discovery may repeat. Splits of unsubscribed
        names are dropped (DROPPED_REMOVED_SUBSCRIPTION); a bounded split
        already at its end is recorded finished. May be called any number of
        times after start().
        """
        self._require_started("add_splits")
        registry, pool, finished, subs = self._splits, self._pool, self._finished, self._subscriptions
        expected = self._restore_expected
        new: list[str] = []
        dropped: list[str] = []
        empty: list[str] = []
        tracked: list[Split] = []
        quarantined = self._quarantined
        for split in splits:
            sid = split.split_id
            if sid in registry or sid in finished or sid in expected or sid in quarantined:
                continue
            if subs is not None and split.subscription not in subs:
                dropped.append(sid)
                continue
            if split.end is not None and split.position >= split.end:
                finished.add(sid)
                if split.identity:
                    self._finished_identities[sid] = split.identity
                empty.append(sid)
                continue
            registry[sid] = split
            pool[sid] = split
            new.append(sid)
            if split.backlog_end is not None:
                tracked.append(split)
        self._backlog.track_all(tracked)
        cid = self._last_checkpoint_id
        if new:
            starts: dict[int, list[str]] = {}  # one audit entry per start position
            for sid in new:
                starts.setdefault(registry[sid].position, []).append(sid)
            for position, at in starts.items():
                detail = DISCOVERED_DETAIL.format(position=position)
                self._audit.append((RecoveryDecision.DISCOVERED, None, tuple(at), cid, detail))
        if dropped:
            self._audit.append(
                (
                    RecoveryDecision.DROPPED_REMOVED_SUBSCRIPTION,
                    None,
                    tuple(dropped),
                    cid,
                    "discovered, not subscribed",
                )
            )
        if empty:
            self._audit.append((RecoveryDecision.FINISHED, None, tuple(empty), cid, "discovered at its end"))
        self._after_event()
        return len(new)

    def record_lost_range(self, split_id: str, reader_id: int | None, detail: str) -> None:
        """Record that positions of ``split_id`` were skipped because the source no longer has them.

        Called by the runtime's epoch planner on the driver when the source's
        retention check moved a planned range's start past records that aged out
        (``on_offset_out_of_range: skip``); ``detail`` names the offsets. Adds a
        SKIPPED_LOST_RANGE audit record and nothing else: the split's position
        moves when its region acknowledges the moved range. A replanned epoch
        records the loss again (the restart checks merge repeats).
        """
        self._audit.append(
            (RecoveryDecision.SKIPPED_LOST_RANGE, reader_id, split_id, self._last_checkpoint_id, detail)
        )

    def set_subscriptions(self, subscriptions: Iterable[str]) -> list[str]:
        """Change what is subscribed; splits of removed names are dropped now. Returns the dropped ids.

        Pooled splits are removed; owned ones are revoked through the context.
        Each gets DROPPED_REMOVED_SUBSCRIPTION. Idempotent.
        """
        self._require_started("set_subscriptions")
        subs = frozenset(subscriptions)
        self._subscriptions = subs
        cid = self._last_checkpoint_id
        registry = self._splits
        dropped = [sid for sid, s in self._pool.items() if s.subscription not in subs]
        for sid in dropped:
            self._retire(sid, None)
        parked = [sid for sid, s in self._quarantined.items() if s.subscription not in subs]
        for sid in parked:  # a quarantined split of a removed subscription is dropped like a pooled one
            del self._quarantined[sid]
        dropped.extend(parked)
        if dropped:
            self._audit.append(
                (
                    RecoveryDecision.DROPPED_REMOVED_SUBSCRIPTION,
                    None,
                    tuple(dropped),
                    cid,
                    "subscription removed",
                )
            )
        revocation: dict[int, list[str]] = {}
        for reader_id in sorted(self._owned):
            gone = [sid for sid in self._owned[reader_id] if registry[sid].subscription not in subs]
            for sid in gone:
                self._retire(sid, reader_id)
            if gone:
                revocation[reader_id] = gone
                dropped.extend(gone)
                self._audit.append(
                    (
                        RecoveryDecision.DROPPED_REMOVED_SUBSCRIPTION,
                        reader_id,
                        tuple(gone),
                        cid,
                        "subscription removed",
                    )
                )
        if revocation:
            self._context.revoke_splits(revocation)
        self._after_event()
        return dropped

    def add_reader(self, reader_id: int) -> None:
        """A reader registered in the context; classify what it reported (protocol rules 1.2-1.5).

        Called once per registration, after ``context.register_reader``.
        Before the first assignment round every report belongs to a **global
        restore**: with ``reassign_on_recovery`` the splits are pooled and kept
        in the enumerator's own state (protocol rule 1.4, scenario 1:
        REDISTRIBUTED_GLOBAL_RESTORE) and redistributed when the last expected
        reader registered; legacy readers keep them (KEPT_LEGACY). Afterwards
        a registration is a **partial failover**: a reported split already
        pending is IGNORED_ALREADY_PENDING, one owned by another reader
        IGNORED_STALE_REPORT, one owned by this reader goes back to the pool
        (RETURNED_PARTIAL_FAILOVER) and is reassigned (legacy: KEPT_LEGACY),
        unknown/removed/finished ones are dropped with their decision.
        """
        self._require_started("add_reader")
        info = self._context.registered_readers().get(reader_id)
        if info is None:
            raise ProtocolError(
                f"add_reader({reader_id}): reader {reader_id} is not registered in the context; "
                "register it first",
                reader_id=reader_id,
            )
        self._expected.add(reader_id)
        self._active.add(reader_id)
        if self._phase is EnumeratorPhase.AWAITING_READERS:
            self._accept_restore_reports(reader_id, info.reported_splits)
        else:
            self._accept_failover_reports(reader_id, info.reported_splits)
        self._after_event()

    def add_splits_back(self, splits: Iterable[Split], reader_id: int) -> None:
        """Splits assigned to a failed reader after its last completed checkpoint (``addSplitsBack``).

        Called by the framework after the reader failed (unregistered) and
        always before it registers again, with the context's
        ``splits_assigned_since_last_checkpoint`` (possibly empty: the call
        also tells the enumerator the reader is away). Each split owned by
        that reader is removed from the map as if never assigned and pooled
        (ADDED_BACK); pooled ones are IGNORED_ALREADY_PENDING, ones owned by
        another reader IGNORED_STALE_REPORT, finished or unsubscribed ones
        dropped.
        """
        self._require_started("add_splits_back")
        if reader_id in self._context.registered_readers():
            raise ProtocolError(
                f"add_splits_back for reader {reader_id}, which is registered: it is called after the "
                "reader failed and before it registers again",
                reader_id=reader_id,
            )
        self._active.discard(reader_id)
        cid = self._last_checkpoint_id
        mine = self._owned.get(reader_id, {})
        for split in splits:
            sid = split.split_id
            if self._drop_on_arrival(split, reader_id, "added back"):
                continue
            if sid in mine:
                del mine[sid]
                self._pool[sid] = self._splits[sid]
                self._audit.append((RecoveryDecision.ADDED_BACK, reader_id, sid, cid, ""))
            elif sid in self._pool:
                self._audit.append(
                    (RecoveryDecision.IGNORED_ALREADY_PENDING, reader_id, sid, cid, "added back")
                )
            elif sid in self._splits:
                self._audit.append(
                    (
                        RecoveryDecision.IGNORED_STALE_REPORT,
                        reader_id,
                        sid,
                        cid,
                        f"added back; owned by reader {self.owner_of(sid)}",
                    )
                )
            else:
                self._to_pool(split)
                self._backlog.track(split)
                self._audit.append(
                    (RecoveryDecision.ADDED_BACK, reader_id, sid, cid, "unknown to the enumerator")
                )
        self._after_event()

    def remove_reader(self, reader_id: int) -> list[str]:
        """A reader is gone for good (rescale down): its splits return to the pool. Returns their ids.

        Called after the context unregistered it. The reader is no longer
        expected, so assignment no longer waits for it.
        """
        self._require_started("remove_reader")
        if reader_id in self._context.registered_readers():
            raise ProtocolError(
                f"remove_reader({reader_id}): unregister the reader from the context first",
                reader_id=reader_id,
            )
        self._expected.discard(reader_id)
        self._active.discard(reader_id)
        owned = list(self._owned.pop(reader_id, {}))
        registry = self._splits
        self._pool.update((sid, registry[sid]) for sid in owned)
        if owned:
            self._audit.append(
                (
                    RecoveryDecision.ADDED_BACK,
                    reader_id,
                    tuple(owned),
                    self._last_checkpoint_id,
                    "reader removed",
                )
            )
        self._after_event()
        return owned

    def split_finished(self, reader_id: int, split_id: str) -> bool:
        """A bounded split reached its end; it is never assigned again. True the first time.

        Called by the driver when ``reader_id``'s region acknowledged the epoch that read
        the split to its end, after every acknowledged position was applied and before the
        checkpoint is completed (protocol rule 1.7); if that checkpoint aborts, the driver
        restores a new enumerator from the latest completed one, so the finish is undone
        with it. Repeated calls return False; a split owned by another reader (or not
        owned) is a ProtocolError.
        """
        self._require_started("split_finished")
        if split_id in self._finished:
            return False
        if split_id not in self._owned.get(reader_id, ()):
            current = self.owner_of(split_id)
            where = "not assigned" if current is None else f"owned by reader {current}"
            raise ProtocolError(
                f"split_finished({reader_id}, {split_id!r}): the split is {where}; "
                "only its owner can finish it",
                reader_id=reader_id,
                split_id=split_id,
            )
        identity = self._splits[split_id].identity if split_id in self._splits else ""
        self._retire(split_id, reader_id)
        self._finished.add(split_id)
        if identity:
            self._finished_identities[split_id] = identity
        self._audit.append((RecoveryDecision.FINISHED, reader_id, split_id, self._last_checkpoint_id, ""))
        self._after_event()
        return True

    def update_positions(self, splits: Iterable[Split]) -> int:
        """Record positions from acknowledged reader states; returns how many splits were known.

        Called by the driver with every acknowledged region's new positions, in one batch,
        before the finished splits and before the checkpoint is completed (protocol rule
        1.7; an aborted checkpoint discards this enumerator). Unknown or finished ids are
        ignored.
        """
        registry, pool = self._splits, self._pool
        updated = 0
        for split in splits:
            sid = split.split_id
            known = registry.get(sid)
            if known is None:
                continue
            updated += 1
            if known.position != split.position:
                if (split.end, split.backlog_end, split.subscription) == (
                    known.end,
                    known.backlog_end,
                    known.subscription,
                ):
                    moved = split  # the same split at its new position: no copy to build
                else:
                    moved = known.at(split.position)  # the enumerator's metadata wins
                registry[sid] = moved
                if sid in pool:
                    pool[sid] = moved
        return updated

    def reset_backlog(self, end_offsets: Mapping[str, int]) -> None:
        """Record new backlog boundaries (the end offsets now) for known unbounded splits (rule 4.1).

        The splits carry the new ``backlog_end`` from now on, also those a reader owns: the
        owner gets it through ``context.update_splits`` and reports "backlog finished" when
        it reaches the new boundary (protocol rule 4.1). Ids the
        enumerator does not know are an InvalidParameterError; bounded splits
        are not tracked and are skipped.
        """
        unknown = sorted(s for s in end_offsets if s not in self._splits)
        if unknown:
            raise InvalidParameterError(
                "end_offsets", unknown, "ids of splits the enumerator knows (pooled or owned)"
            )
        tracked: dict[str, int] = {}
        updates: dict[int, list[Split]] = {}
        for sid, end in end_offsets.items():
            split = self._splits[sid]
            if split.end is not None:
                continue
            marked = replace(split, backlog_end=end)
            self._splits[sid] = marked
            if sid in self._pool:
                self._pool[sid] = marked
            owner = self.owner_of(sid)
            if owner is not None:
                updates.setdefault(owner, []).append(marked)
            tracked[sid] = end
        self._backlog.reset(tracked)
        if updates:  # the owning readers read against the new boundary from now on
            self._context.update_splits(updates)

    def report_backlog_finished(self, split_id: str) -> bool:
        """A reader reached the split's backlog boundary; True only the first time (deduplicated)."""
        return self._backlog.report_finished(split_id)

    @property
    def quarantined(self) -> dict[str, Split]:
        """The parked splits, at the position their records end (a copy)."""
        return dict(self._quarantined)

    def quarantine(self, split_id: str, detail: str) -> bool:
        """Park a split whose reads keep failing: nobody reads it until :meth:`release` (rule 1.8).

        Its owner (if any) is told to stop reading it (``revoke_splits``); it leaves the
        pool; its position stays what the enumerator last recorded, which is where its
        records end in the sink. Audited (QUARANTINED, ``detail``: why). False when the
        split is unknown, finished or already parked.
        """
        self._require_started("quarantine")
        split = self._splits.get(split_id)
        if split is None or split_id in self._finished or split_id in self._quarantined:
            return False
        owner = self.owner_of(split_id)
        self._retire(split_id, owner)
        self._quarantined[split_id] = split
        self._audit.append((RecoveryDecision.QUARANTINED, owner, split_id, self._last_checkpoint_id, detail))
        if owner is not None:
            self._context.revoke_splits({owner: [split_id]})
        self._after_event()
        return True

    def release(self, split_id: str) -> Split:
        """Put a quarantined split back: it re-enters the pool at its position and is assigned (rule 1.8).

        InvalidParameterError naming the parked splits when ``split_id`` is not one of them.
        """
        self._require_started("release")
        split = self._quarantined.pop(split_id, None)
        if split is None:
            raise InvalidParameterError(
                "split",
                split_id,
                f"a quarantined split (quarantined now: {sorted(self._quarantined) or 'none'})",
            )
        self._splits[split_id] = split
        self._pool[split_id] = split
        if split.backlog_end is not None:
            self._backlog.track_all([split])
        self._audit.append(
            (RecoveryDecision.RELEASED, None, split_id, self._last_checkpoint_id, f"at {split.position}")
        )
        self._after_event()
        return split

    def drop(self, split_id: str, detail: str) -> Split:
        """Forget a live or quarantined split for good (``recover --drop``: its file is gone).

        Its owner (if any) is told to stop reading it (``revoke_splits``); its position stays
        where its records end in the sink. Audited (DROPPED_BY_OPERATOR, ``detail`` plus the
        position). InvalidParameterError when the split is neither live nor quarantined.
        """
        self._require_started("drop")
        owner: int | None = None
        split = self._quarantined.pop(split_id, None)
        if split is None:
            split = self._splits.get(split_id)
            if split is None:
                raise InvalidParameterError(
                    "split",
                    split_id,
                    "a live or quarantined split (quarantined now: "
                    f"{sorted(self._quarantined) or 'none'}; finished splits are never read again anyway)",
                )
            owner = self.owner_of(split_id)
            self._retire(split_id, owner)
        self._audit.append(
            (
                RecoveryDecision.DROPPED_BY_OPERATOR,
                owner,
                split_id,
                self._last_checkpoint_id,
                f"{detail}; at {split.position}",
            )
        )
        if owner is not None:
            self._context.revoke_splits({owner: [split_id]})
        self._after_event()
        return split

    # -- changed split data (protocol rule 1.9) ---------------------------------------------------

    def known_splits(self) -> list[Split]:
        """Every split the enumerator knows that is not finished: pooled, owned, parked, or still
        expected from a restore (with the snapshot's identity), in id order."""
        known = {**{sid: s for sid, (_r, s) in self._restore_expected.items()}, **self._quarantined}
        known.update(self._splits)
        return [known[sid] for sid in sorted(known)]

    @property
    def finished_identities(self) -> dict[str, str]:
        """Finished split id -> the identity it had when it finished (those with one; a copy)."""
        return dict(self._finished_identities)

    def apply_split_changes(self, changes: Iterable[SplitChange], policy: SplitChangePolicy) -> int:
        """Apply ``source.on_file_change`` to what a source's identity check found (rule 1.9).

        Called by the driver before each epoch's discovery, after
        :meth:`SupportsSplitIdentityCheck.check_splits`. Every decision is audited. Per change:

        1. IDENTIFIED: the same data under a new identity (touched, or none before: state of
           an older version) takes the one given; not audited.
        2. MOVED (any policy): the data is already read where it was. A finished split stays
           finished and its new id is finished too (DISCOVERED "at <end>": its records, none,
           begin at its end). A live split ends at its position and its new id goes on from
           there (DISCOVERED "at <position>"); its owner is told (revoked).
        3. A change of a live split of which nothing was read (at ``change.start``) whose
           replacement is the same id: taken as the source has it now (REFRESHED), any policy.
        4. GREW with ``APPEND``: a live split's end grows (its owner gets it through
           ``update_splits``); a finished one is read again from its old end
           (``change.start``). ``start == end`` only renews the identity (another range of
           the same file). EXTENDED.
        5. CHANGED or GREW with ``NEW_VERSION``: the split ends where it stands (finished,
           without identity) and ``change.replacement`` enters the pool (REPLACED, DISCOVERED).
           RECREATED (any policy: the old data is gone) does the same, the ended split keeping
           its identity (so the source still tells its id from the new data's).
        6. Otherwise (``FAIL``, or CHANGED with ``APPEND``): SourceError naming the split and
           what changed, before anything of the epoch is planned or written.

        Returns how many changes changed something. Only after start().
        """
        self._require_started("apply_split_changes")
        applied = 0
        cid = self._last_checkpoint_id
        for change in changes:
            sid = change.split_id
            live = self._splits.get(sid) or self._quarantined.get(sid)
            if live is None and sid in self._restore_expected:
                live = self._restore_expected[sid][1]
            finished = sid in self._finished
            if live is None and not finished:
                continue  # unknown here (dropped meanwhile): nothing to decide
            if change.kind is SplitChangeKind.IDENTIFIED:
                if live is not None:
                    self._update_live(replace(live, identity=change.identity))
                elif finished:
                    self._finished_identities[sid] = change.identity
                applied += 1
                continue
            if change.kind is SplitChangeKind.MOVED:
                applied += self._move(change, live)
                continue
            if change.kind is SplitChangeKind.RECREATED:
                self._replace(change, live, keep_identity=True)
                applied += 1
                continue
            if (
                live is not None
                and live.position == change.start
                and len(change.replacement) == 1
                and change.replacement[0].split_id == sid
            ):
                now = change.replacement[0]
                self._update_live(replace(live, end=now.end, identity=change.identity))
                self._audit.append(
                    (
                        RecoveryDecision.REFRESHED,
                        self.owner_of(sid),
                        sid,
                        cid,
                        f"{change.detail}; nothing read yet",
                    )
                )
                applied += 1
                continue
            if change.kind is SplitChangeKind.GREW and policy is SplitChangePolicy.APPEND:
                applied += self._extend(change, live)
                continue
            if policy is SplitChangePolicy.NEW_VERSION:
                self._replace(change, live)
                applied += 1
                continue
            hint = (
                "set source.on_file_change: append to read what is appended (log files), or new_version to "
                "read the file again as a new split"
                if change.kind is SplitChangeKind.GREW
                else "set source.on_file_change: new_version to read the new content from its start as a new "
                "split, or restore the file; files must not change once visible (write under a '.' or '_' "
                "name, then rename)"
            )
            raise SourceError(
                f"split {sid!r}: {change.detail}; source.on_file_change is {policy.value}: nothing of the "
                f"epoch is planned or committed. {hint}",
                split_id=sid,
                change=change.kind.value,
                policy=policy.value,
            )
        if applied:
            self._after_event()
        return applied

    def _update_live(self, split: Split) -> None:
        """Replace a live split's metadata (end, identity) wherever it is; its owner is told."""
        sid = split.split_id
        if sid in self._quarantined:
            self._quarantined[sid] = split
            return
        if sid in self._restore_expected:
            reader_id, _old = self._restore_expected[sid]
            self._restore_expected[sid] = (reader_id, split)
        if sid not in self._splits:
            return
        self._splits[sid] = split
        if sid in self._pool:
            self._pool[sid] = split
        owner = self.owner_of(sid)
        if owner is not None:
            self._context.update_splits({owner: [split]})

    def _end_live(self, sid: str, identity: str) -> None:
        """A live split ends where it stands: out of every place, finished (with ``identity`` if any)."""
        owner = self.owner_of(sid)
        self._retire(sid, owner)
        self._quarantined.pop(sid, None)
        self._restore_expected.pop(sid, None)
        if owner is not None:
            self._context.revoke_splits({owner: [sid]})
        self._finished.add(sid)
        if identity:
            self._finished_identities[sid] = identity
        else:
            self._finished_identities.pop(sid, None)

    def _enter(self, split: Split, detail: str) -> None:
        """A split the source has now enters the pool (DISCOVERED at its position)."""
        self._to_pool(split)
        if split.backlog_end is not None:
            self._backlog.track(split)
        self._audit.append(
            (RecoveryDecision.DISCOVERED, None, split.split_id, self._last_checkpoint_id, detail)
        )

    def _move(self, change: SplitChange, live: Split | None) -> int:
        new_id = change.moved_to
        if not new_id or new_id in self._splits or new_id in self._finished or new_id in self._quarantined:
            return 0
        cid = self._last_checkpoint_id
        sid = change.split_id
        if live is None:
            end = change.end if change.end is not None else change.start
            self._finished.add(new_id)
            self._finished_identities[new_id] = change.identity
            self._audit.append(
                (RecoveryDecision.DISCOVERED, None, new_id, cid, DISCOVERED_DETAIL.format(position=end))
            )
            self._audit.append(
                (
                    RecoveryDecision.MOVED,
                    None,
                    sid,
                    cid,
                    f"{change.detail}; finished: {new_id} is not read again",
                )
            )
            self._audit.append(
                (RecoveryDecision.FINISHED, None, new_id, cid, f"moved from {sid}, read as it")
            )
            return 1
        owner = self.owner_of(sid)
        self._end_live(sid, live.identity)
        moved = Split(new_id, live.subscription, live.position, live.end, live.backlog_end, change.identity)
        self._audit.append(
            (RecoveryDecision.MOVED, owner, sid, cid, f"{change.detail}; {new_id} goes on at {live.position}")
        )
        self._enter(moved, DISCOVERED_DETAIL.format(position=live.position))
        return 1

    def _extend(self, change: SplitChange, live: Split | None) -> int:
        cid = self._last_checkpoint_id
        sid = change.split_id
        end = change.end if change.end is not None else change.start
        if live is not None:
            self._update_live(replace(live, end=max(end, live.position), identity=change.identity))
            if end != live.end:
                self._audit.append(
                    (
                        RecoveryDecision.EXTENDED,
                        self.owner_of(sid),
                        sid,
                        cid,
                        f"{change.detail}; end {live.end} -> {end}",
                    )
                )
            return 1
        if end <= change.start:  # nothing new in this split (another range of the file grew)
            self._finished_identities[sid] = change.identity
            return 1
        self._finished.discard(sid)
        self._finished_identities.pop(sid, None)
        subscription = change.replacement[0].subscription if change.replacement else ""
        self._to_pool(Split(sid, subscription, change.start, end, None, change.identity))
        self._audit.append(
            (
                RecoveryDecision.EXTENDED,
                None,
                sid,
                cid,
                f"{change.detail}; finished at {change.start}, read again up to {end}",
            )
        )
        return 1

    def _replace(self, change: SplitChange, live: Split | None, *, keep_identity: bool = False) -> None:
        cid = self._last_checkpoint_id
        sid = change.split_id
        owner = self.owner_of(sid) if live is not None else None
        where = f"at {live.position}" if live is not None else "finished"
        if live is not None:
            self._end_live(sid, live.identity if keep_identity else "")
        elif not keep_identity:
            self._finished_identities.pop(sid, None)
        fresh = [
            s
            for s in change.replacement
            if s.split_id not in self._splits and s.split_id not in self._finished
        ]
        names = ", ".join(s.split_id for s in fresh) or "(already known)"
        self._audit.append(
            (
                RecoveryDecision.REPLACED,
                owner,
                sid,
                cid,
                f"{change.detail}; ended {where}, new version: {names}",
            )
        )
        for split in fresh:
            if split.end is not None and split.position >= split.end:
                self._finished.add(split.split_id)
                continue
            self._enter(split, DISCOVERED_DETAIL.format(position=split.position))

    def rebalance(self) -> int:
        """Apply the strategy's rebalance now (its weights changed); returns how many splits moved.

        Only while running, with deferred assignment and a balanced strategy (as after every
        event); moves are revoked and assigned through the context and audited (REBALANCED).
        """
        self._require_started("rebalance")
        candidates = self._candidates()
        if not candidates or not (self._reassign and self._strategy.balanced):
            return 0
        before = len(self._audit)
        self._rebalance(candidates)
        return sum(1 for a in self._audit.since(before) if a.decision is RecoveryDecision.REBALANCED)

    # -- checkpoints ----------------------------------------------------------------------------

    @property
    def checkpoint_allowed(self) -> bool:
        """False until the first assignment round: a restore waits for reader reports (protocol rule 1.4)."""
        return self._phase is EnumeratorPhase.RUNNING

    def snapshot(
        self, checkpoint_id: int, fallback: Mapping[int, Collection[str]] | None = None
    ) -> EnumeratorSnapshot:
        """The enumerator's state for checkpoint ``checkpoint_id`` (positions included).

        Called once per checkpoint, with strictly increasing ids. Refused
        (ProtocolError) while a restore still waits for reader reports.
        ``fallback`` maps each failed region/reader to the split ids in the
        older state it contributes to this checkpoint (protocol rule 2.4): splits the
        enumerator assigned to it after that state are not in it, so in this
        snapshot they are pooled (RETURNED_REGION_FALLBACK). The live
        ownership does not change: the reader keeps reading them.
        """
        if not self.checkpoint_allowed:
            raise ProtocolError(
                f"checkpoint {checkpoint_id} refused: the enumerator is {self._phase.value}; "
                f"readers {list(self.pending_readers)} have not registered and reported their splits yet",
                checkpoint_id=checkpoint_id,
                pending_readers=self.pending_readers,
            )
        if self._last_checkpoint_id is not None and checkpoint_id <= self._last_checkpoint_id:
            raise InvalidParameterError(
                "checkpoint_id",
                checkpoint_id,
                f"an id greater than the previous checkpoint id {self._last_checkpoint_id}",
            )
        fallback = fallback or {}
        unknown = sorted(r for r in fallback if r not in self._expected and r not in self._owned)
        if unknown:
            raise InvalidParameterError("fallback", unknown, f"reader ids among {sorted(self._expected)}")
        registry = self._splits
        pool = list(self._pool.values())
        assignments: dict[int, tuple[Split, ...]] = {}
        for reader_id in sorted(self._expected | set(self._owned)):
            owned = self._owned.get(reader_id, {})
            if reader_id in fallback:
                keep = set(fallback[reader_id])
                assignments[reader_id] = tuple(registry[s] for s in owned if s in keep)
                returned = [s for s in owned if s not in keep]
                if returned:
                    pool.extend(registry[s] for s in returned)
                    self._audit.append(
                        (
                            RecoveryDecision.RETURNED_REGION_FALLBACK,
                            reader_id,
                            tuple(returned),
                            checkpoint_id,
                            "assigned after the region's referenced state; pooled in this snapshot",
                        )
                    )
            else:
                assignments[reader_id] = tuple(registry[s] for s in owned)
        self._last_checkpoint_id = checkpoint_id
        return EnumeratorSnapshot(
            checkpoint_id=checkpoint_id,
            parallelism=self._context.parallelism,
            pool=tuple(pool),
            assignments=assignments,
            finished=frozenset(self._finished),
            finished_identities=dict(self._finished_identities),
            quarantined=tuple(sorted(self._quarantined.values())),
            subscriptions=self._subscriptions if self._subscriptions is not None else frozenset(),
            backlog=self._backlog.snapshot(),
            discovery=(
                dict(self._source.discovery_positions())
                if isinstance(self._source, SupportsDiscoveryPositions)
                else {}
            ),
        )

    # -- internals ------------------------------------------------------------------------------

    def _require_started(self, what: str) -> None:
        if self._phase is EnumeratorPhase.CREATED:
            raise ProtocolError(f"{what}() called before start()")

    def _subscribed(self, split: Split) -> bool:
        return self._subscriptions is None or split.subscription in self._subscriptions

    def _to_pool(self, split: Split) -> None:
        """Put a split (with this position) in the registry and the pool."""
        self._splits[split.split_id] = split
        self._pool[split.split_id] = split

    def _give(self, reader_id: int, split: Split) -> None:
        """Make ``reader_id`` own ``split`` (with this position); the caller removed it elsewhere."""
        self._splits[split.split_id] = split
        self._owned.setdefault(reader_id, {})[split.split_id] = None

    def _known_identity(self, split_id: str) -> str:
        """The identity known for ``split_id`` (live, parked, expected or finished); "" if none."""
        for place in (self._splits, self._quarantined):
            known = place.get(split_id)
            if known is not None and known.identity:
                return known.identity
        expected = self._restore_expected.get(split_id)
        if expected is not None and expected[1].identity:
            return expected[1].identity
        return self._finished_identities.get(split_id, "")

    def _identified(self, split: Split) -> Split:
        """``split`` with the identity the enumerator knows for it (reader states carry none)."""
        identity = self._known_identity(split.split_id)
        return replace(split, identity=identity) if identity else split

    def _retire(self, split_id: str, reader_id: int | None) -> None:
        """Remove a split from the registry, the pool and ``reader_id``'s set; stop backlog tracking."""
        self._splits.pop(split_id, None)
        self._pool.pop(split_id, None)
        if reader_id is not None:
            self._owned.get(reader_id, {}).pop(split_id, None)
        self._backlog.forget(split_id)

    def _drop_on_arrival(self, split: Split, reader_id: int | None, how: str) -> bool:
        """Drop a finished or unsubscribed split that reaches the enumerator; True when dropped."""
        sid = split.split_id
        cid = self._last_checkpoint_id
        if sid in self._finished:
            self._audit.append((RecoveryDecision.DROPPED_FINISHED, reader_id, sid, cid, how))
            return True
        if sid in self._quarantined:
            self._audit.append(
                (RecoveryDecision.QUARANTINED, reader_id, sid, cid, f"{how}; still quarantined")
            )
            return True
        if split.end is not None and split.position >= split.end:
            # A reader state at the split's end comes from a completed checkpoint: it is finished.
            identity = split.identity or self._known_identity(sid)
            self._retire(sid, self.owner_of(sid))
            self._finished.add(sid)
            if identity:
                self._finished_identities[sid] = identity
            self._audit.append((RecoveryDecision.DROPPED_FINISHED, reader_id, sid, cid, f"{how}; at its end"))
            return True
        if not self._subscribed(split):
            self._backlog.forget(sid)
            if self._phase is not EnumeratorPhase.RUNNING:
                if sid in self._dropped_in_round:
                    return True
                self._dropped_in_round.add(sid)
            self._audit.append(
                (
                    RecoveryDecision.DROPPED_REMOVED_SUBSCRIPTION,
                    reader_id,
                    sid,
                    cid,
                    f"{how}; subscription {split.subscription!r}",
                )
            )
            return True
        return False

    def _accept_restore_reports(self, reader_id: int, reported: Sequence[Split]) -> None:
        cid = self._last_checkpoint_id
        for split in reported:
            sid = split.split_id
            if not split.identity:  # a region's state keeps no identity: the enumerator's snapshot does
                split = self._identified(split)
            if self._drop_on_arrival(split, reader_id, "reported on restore"):
                continue
            self._backlog.track(split)
            prior = self._reporter.get(sid)
            if prior is not None and prior != reader_id:
                snapshot_owner = self._restore_expected.get(sid, (None, None))[0]
                if snapshot_owner != reader_id:
                    self._audit.append(
                        (
                            RecoveryDecision.IGNORED_STALE_REPORT,
                            reader_id,
                            sid,
                            cid,
                            f"also reported by reader {prior}",
                        )
                    )
                    continue
                self._audit.append(
                    (
                        RecoveryDecision.IGNORED_STALE_REPORT,
                        prior,
                        sid,
                        cid,
                        f"also reported by reader {reader_id}, its owner in the snapshot",
                    )
                )
                self._owned.get(prior, {}).pop(sid, None)
            self._reporter[sid] = reader_id
            if self._reassign:
                self._to_pool(split)  # the reader's restored position is authoritative
                self._audit.append(
                    (
                        RecoveryDecision.REDISTRIBUTED_GLOBAL_RESTORE,
                        reader_id,
                        sid,
                        cid,
                        "pooled until every reader registered",
                    )
                )
            else:
                self._pool.pop(sid, None)
                self._give(reader_id, split)
                self._audit.append(
                    (RecoveryDecision.KEPT_LEGACY, reader_id, sid, cid, "restored by the reader")
                )

    def _accept_failover_reports(self, reader_id: int, reported: Sequence[Split]) -> None:
        cid = self._last_checkpoint_id
        mine = self._owned.setdefault(reader_id, {})
        reported_ids: set[str] = set()
        for split in reported:
            sid = split.split_id
            reported_ids.add(sid)
            if not split.identity:
                split = self._identified(split)
            if self._drop_on_arrival(split, reader_id, "reported on failover"):
                continue
            if sid in mine:
                if self._reassign:
                    del mine[sid]
                    self._to_pool(split)  # the reader's restored position is authoritative
                    self._audit.append((RecoveryDecision.RETURNED_PARTIAL_FAILOVER, reader_id, sid, cid, ""))
                else:
                    self._give(reader_id, split)
                    self._audit.append((RecoveryDecision.KEPT_LEGACY, reader_id, sid, cid, ""))
            elif sid in self._pool:
                if self._reassign:
                    self._audit.append((RecoveryDecision.IGNORED_ALREADY_PENDING, reader_id, sid, cid, ""))
                else:
                    del self._pool[sid]
                    self._give(reader_id, split)
                    self._audit.append((RecoveryDecision.KEPT_LEGACY, reader_id, sid, cid, "was pending"))
            elif sid in self._splits:
                self._audit.append(
                    (
                        RecoveryDecision.IGNORED_STALE_REPORT,
                        reader_id,
                        sid,
                        cid,
                        f"owned by reader {self.owner_of(sid)}",
                    )
                )
            elif self._reassign:
                self._audit.append(
                    (
                        RecoveryDecision.DROPPED_UNKNOWN,
                        reader_id,
                        sid,
                        cid,
                        "reported on failover; never known",
                    )
                )
            else:
                self._give(reader_id, split)
                self._backlog.track(split)
                self._audit.append((RecoveryDecision.KEPT_LEGACY, reader_id, sid, cid, "unknown before"))
        # Owned splits the reader did not bring back: a deferred reader holds nothing until assigned,
        # a legacy one holds only what it restored. Either way they must return to the pool.
        missing = [sid for sid in mine if self._reassign or sid not in reported_ids]
        for sid in missing:
            del mine[sid]
            self._pool[sid] = self._splits[sid]
        if missing:
            self._audit.append(
                (
                    RecoveryDecision.RETURNED_PARTIAL_FAILOVER,
                    reader_id,
                    tuple(missing),
                    cid,
                    "owned but not reported",
                )
            )

    def _all_expected_active(self) -> bool:
        if len(self._active) < len(self._expected):
            return False
        registered = self._context.registered_readers()
        return all(r in self._active and r in registered for r in self._expected)

    def _finish_first_round(self) -> None:
        cid = self._last_checkpoint_id
        unreported = [
            (reader_id, split)
            for sid, (reader_id, split) in self._restore_expected.items()
            if sid not in self._reporter and sid not in self._splits
        ]
        for reader_id, split in unreported:
            if self._drop_on_arrival(split, reader_id, "in the snapshot, reported by no reader"):
                continue
            self._to_pool(split)
            self._audit.append(
                (
                    RecoveryDecision.REDISTRIBUTED_GLOBAL_RESTORE,
                    reader_id,
                    split.split_id,
                    cid,
                    f"owned by reader {reader_id} in checkpoint {self._restored_from}; reported by no reader",
                )
            )
        self._restore_expected.clear()
        self._reporter.clear()
        self._dropped_in_round.clear()
        self._phase = EnumeratorPhase.RUNNING

    def _candidates(self) -> list[int] | None:
        """Readers that may receive splits now, or None when assignment must wait."""
        if self._phase is not EnumeratorPhase.RUNNING:
            return None
        if self._reassign:
            return sorted(self._expected) if self._all_expected_active() else None
        registered = self._context.registered_readers()
        return sorted(r for r in self._expected if r in self._active and r in registered)

    def _after_event(self) -> None:
        if self._phase is EnumeratorPhase.AWAITING_READERS:
            if not self._all_expected_active():
                return
            self._finish_first_round()
        candidates = self._candidates()
        if not candidates:
            return
        self._assign_pool(candidates)
        if self._reassign and self._strategy.balanced:
            self._rebalance(candidates)

    def _assign_pool(self, candidates: list[int]) -> None:
        if not self._pool:
            return
        with _bulk(len(self._pool)):
            self._place_pool(candidates)

    def _place_pool(self, candidates: list[int]) -> None:
        owned_view = {r: self._owned.setdefault(r, {}) for r in candidates}
        splits = self._pool.values()
        placement = self._strategy.place(splits, owned_view, self._context.parallelism)
        placed_count = sum(len(v) for v in placement.by_reader.values())
        stray = sorted(r for r, v in placement.by_reader.items() if v and r not in owned_view)
        if stray or placed_count + len(placement.unplaced) != len(splits):
            raise ProtocolError(
                f"strategy {self._strategy.name} returned an invalid placement "
                f"({placed_count} placed + {len(placement.unplaced)} unplaced of {len(splits)}; "
                f"non-candidate readers {stray})"
            )
        cid = self._last_checkpoint_id
        assigned: dict[int, list[Split]] = {}
        for reader_id in sorted(placement.by_reader):
            batch = placement.by_reader[reader_id]
            if not batch:
                continue
            ids = tuple(map(_SPLIT_ID, batch))
            owned_view[reader_id].update(dict.fromkeys(ids))
            self._audit.append((RecoveryDecision.ASSIGNED, reader_id, ids, cid, ""))
            assigned[reader_id] = batch
        if placed_count == len(self._pool):
            self._pool.clear()
        else:
            for batch in assigned.values():
                for split in batch:
                    del self._pool[split.split_id]
        if assigned:
            self._context.assign_splits(assigned)

    def _rebalance(self, candidates: list[int]) -> None:
        """Apply the strategy's moves as one revocation and one assignment through the context.

        The strategy's moves are a sequence (each applies to the ownership the previous ones
        left), and a strategy may move a split more than once (the weighted one's greedy loop
        can take a split from reader 7 to 8, then from 8 to 0). The context gets every
        revocation before every assignment, which is only right when each split moves once:
        so the moves are composed into one net move per split, from its owner now to its last
        target (none when it comes back), and only those are applied, told and audited
        (protocol rule 1.1: a split is owned by exactly one reader, also in the readers' views).
        """
        owned_view = {r: self._owned.setdefault(r, {}) for r in candidates}
        moves = self._strategy.rebalance(owned_view, self._context.parallelism)
        if not moves:
            return
        at: dict[str, int] = {}  # split -> its owner after the moves so far
        net: dict[str, tuple[int, int]] = {}  # split -> (its owner now, its last target)
        for move in moves:
            sid = move.split_id
            holds = at[sid] == move.source if sid in at else sid in owned_view.get(move.source, ())
            if not holds or move.target not in owned_view:
                raise ProtocolError(
                    f"strategy {self._strategy.name} proposed an invalid move of split {sid} "
                    f"from reader {move.source} to reader {move.target}"
                )
            at[sid] = move.target
            net[sid] = (net[sid][0] if sid in net else move.source, move.target)
        cid = self._last_checkpoint_id
        revocation: dict[int, list[str]] = {}
        assignment: dict[int, list[Split]] = {}
        for sid, (source, target) in net.items():
            if source == target:  # moved away and back: it never left its reader
                continue
            del self._owned[source][sid]
            self._owned[target][sid] = None
            revocation.setdefault(source, []).append(sid)
            assignment.setdefault(target, []).append(self._splits[sid])
            self._audit.append((RecoveryDecision.REBALANCED, target, sid, cid, f"from reader {source}"))
        if revocation:
            self._context.revoke_splits(revocation)
            self._context.assign_splits(assignment)


# ---------------------------------------------------------------------------------------------
# Factory and framework steps


def enumerator_for(
    source: SplitSource,
    context: SplitEnumeratorContext,
    strategy: str | AssignmentStrategy = "round-robin",
    *,
    restored: EnumeratorSnapshot | None = None,
    enumerator_class: type[SplitEnumerator] | None = None,
    **strategy_options: object,
) -> SplitEnumerator:
    """The enumerator for ``source``: the only place the capability mix-in is inspected.

    ``enumerator_class`` (default :class:`SplitEnumerator`) lets tests and the
    simulator build a subclass through this same factory.

    ``reassign_on_recovery`` is True exactly when the source inherits
    :class:`SupportsSplitReassignmentOnRecovery`. ``strategy`` is a registry
    name (options go to its constructor) or an instance. With ``restored``
    the enumerator is restored from that snapshot (a global restore). The
    caller then calls ``start()``.
    """
    if isinstance(strategy, str):
        chosen = strategy_by_name(strategy, **strategy_options)
    else:
        if strategy_options:
            raise InvalidParameterError(
                "strategy_options", sorted(strategy_options), "none when a strategy instance is given"
            )
        chosen = strategy
    if isinstance(source, SupportsDiscoveryPositions):
        # the source's own discovery positions go back to the checkpoint's (or to none) with it
        source.restore_discovery_positions(None if restored is None else restored.discovery)
    enumerator = (enumerator_class or SplitEnumerator)(
        context,
        chosen,
        reassign_on_recovery=(
            isinstance(source, SupportsSplitReassignmentOnRecovery) and source.reassigns_on_recovery
        ),
        source=source,
        subscriptions=source.subscriptions(),
    )
    if restored is not None:
        enumerator.restore(restored)
    return enumerator


def fail_reader(
    enumerator: SplitEnumerator, context: RecordingEnumeratorContext, reader_id: int
) -> list[Split]:
    """The framework's steps when a reader fails: unregister, then ``add_splits_back``.

    Returns the splits added back (assigned since the reader's last completed
    checkpoint). The reader may later come back with :func:`restart_reader`.
    """
    since = context.unregister_reader(reader_id)
    enumerator.add_splits_back(since, reader_id)
    return since


def restart_reader(
    enumerator: SplitEnumerator,
    context: RecordingEnumeratorContext,
    reader_id: int,
    reported_splits: Iterable[Split] = (),
) -> ReaderInfo:
    """The framework's steps when a reader (re)starts: register with its restored splits, then add_reader."""
    info = context.register_reader(reader_id, reported_splits)
    enumerator.add_reader(reader_id)
    return info
