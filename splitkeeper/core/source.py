"""Source contracts: what a source offers the enumerator, and its optional capabilities.

Optional features are tiny mix-in classes (the Flink convention), never boolean
flags threaded through calls. A source opts in by inheriting the mix-in; the
enumerator factory (:func:`splitkeeper.core.enumerator.enumerator_for`) is the
only place that inspects them.

The driver-side connector contract (:class:`SourceConnector`, with planning) and
the executor-side :class:`RegionReader` are here too: engine-free, like
FLIP-27's ``Source``/``SourceReader`` interfaces. Implementations are the source kinds, one
package each (:mod:`splitkeeper.sources`); their inheritable contract tests are in
:mod:`splitkeeper.sources.contract`.
"""

from __future__ import annotations

import abc
import enum
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from splitkeeper.core.types import AuditRecord, RecoveryDecision, Split
from splitkeeper.errors import InvalidParameterError


class SplitSource(abc.ABC):
    """A partitioned source seen from the enumerator (the coordinator side).

    Called only by the enumerator, in the coordinator process, never on
    executors. Implementations must be deterministic: the same external state
    gives the same splits in the same order.
    """

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """A stable name for status output and state keys."""

    @abc.abstractmethod
    def discover_splits(self) -> Sequence[Split]:
        """Every split the source currently has, at its start position.

        Called by :meth:`SplitEnumerator.start` and on every periodic
        discovery; may be called any number of times. Returning splits the
        enumerator already knows is expected (it ignores them). Splits carry
        ``backlog_end`` when the source tracks backlog (protocol section 4).
        """

    @abc.abstractmethod
    def subscriptions(self) -> frozenset[str]:
        """What the pipeline is configured to read (topics, file roots).

        Splits whose ``subscription`` is not in this set are dropped by the
        enumerator, on discovery and on restart (protocol rule 1.5).
        """


class SupportsSplitReassignmentOnRecovery:
    """Mix-in: readers report their restored splits and wait to be assigned (FLIP-537).

    A source that inherits this opts into deferred assignment: on start, a
    reader registers with the splits restored from its state
    (``ReaderInfo.reported_splits``) but reads nothing until the enumerator
    assigns, and while it is pending its snapshot does not overwrite its last
    good state. The enumerator becomes the single owner of split placement and
    may redistribute on a global restore (protocol rules 1.2-1.3). Without it, readers
    keep their restored splits (legacy behaviour).

    A source with the capability may be configured without it (``source.reader_mode: legacy``):
    :attr:`reassigns_on_recovery` then answers False, and the factory ``enumerator_for`` (the one
    place that asks) builds a legacy enumerator.
    """

    __slots__ = ()

    @property
    def reassigns_on_recovery(self) -> bool:
        """Whether this source's readers wait to be assigned on recovery, as configured (default True)."""
        return True


@dataclass(frozen=True, slots=True)
class ExternalPosition:
    """A position a source keeps outside the checkpoint, tagged with the checkpoint it belongs to
    (``checkpoint_id`` None: set by someone else, e.g. a group's offset moved by hand)."""

    position: int
    checkpoint_id: int | None

    def __post_init__(self) -> None:
        if self.position < 0:
            raise InvalidParameterError("position", self.position, "an offset >= 0")


class ExternallyCheckpointedSource(abc.ABC):
    """Mix-in for sources that also keep their own position (protocol section 3).

    Kafka consumer-group offsets and Pravega reader groups are examples. The
    checkpoint's own positions remain the truth; the external copy is a
    courtesy for tools and is written only after a checkpoint completes.
    """

    @property
    def keeps_external_positions(self) -> bool:
        """Whether this instance has an external store to commit to and reconcile with.

        True by default. A source whose external store is optional in its
        configuration (Kafka without ``group_id``) answers False, and the runtime
        then neither commits nor reconciles: no empty store reported as disagreeing.
        """
        return True

    @abc.abstractmethod
    def commit_positions(self, checkpoint_id: int, positions: Mapping[str, int]) -> None:
        """Store ``positions`` externally, tagged with ``checkpoint_id``.

        Called by the runtime after checkpoint ``checkpoint_id`` completed, with
        the positions of acknowledged regions only (see
        :func:`splitkeeper.core.external.positions_to_commit`). May be called
        again with the same id after a crash (must be idempotent); never called
        for an aborted checkpoint.
        """

    @abc.abstractmethod
    def committed_positions(self) -> Mapping[str, ExternalPosition]:
        """The externally stored positions per split id, each with its checkpoint-id tag.

        Read on restore only to report disagreements
        (:func:`splitkeeper.core.external.reconcile_positions`); never used as
        the restore position.
        """


class StaticSplitSource(SplitSource):
    """An in-memory source with a fixed (but extendable) list of splits.

    Used by tests, the simulator and the benchmark. :meth:`add` models new
    partitions appearing; :meth:`set_subscriptions` models a configuration
    change between runs.
    """

    def __init__(self, name: str, splits: Iterable[Split] = (), subscriptions: Iterable[str] | None = None):
        if not name:
            raise InvalidParameterError("name", name, "a non-empty source name")
        self._name = name
        self._splits: list[Split] = list(splits)
        subs = {s.subscription for s in self._splits} if subscriptions is None else set(subscriptions)
        self._subscriptions = frozenset(subs)

    @property
    def name(self) -> str:
        return self._name

    def discover_splits(self) -> Sequence[Split]:
        return tuple(self._splits)

    def subscriptions(self) -> frozenset[str]:
        return self._subscriptions

    def add(self, splits: Iterable[Split]) -> None:
        """Make more splits discoverable (new partitions or files)."""
        self._splits.extend(splits)

    def set_subscriptions(self, subscriptions: Iterable[str]) -> None:
        self._subscriptions = frozenset(subscriptions)


class ReassignableStaticSplitSource(StaticSplitSource, SupportsSplitReassignmentOnRecovery):
    """A :class:`StaticSplitSource` whose readers use deferred assignment (FLIP-537)."""


# --------------------------------------------------------------------------- connector contract
#
# Two halves, like FLIP-27's enumerator/reader split: a SourceConnector lives on the driver
# (discovery, planning limits, identity) and a RegionReader crosses to the executors inside a
# region task. Positions are source offsets (Kafka offsets, byte offsets of lines in files):
# reading [start, end) yields records whose offsets lie in [start, end) in increasing order, each
# with offset < next_offset; when start and end are record boundaries (what plan_end returns)
# the first record starts at start and each next_offset is the next record's offset. The reader
# is deterministic, so a replay of a planned range yields the very same records.


class RecordMeta(NamedTuple):
    """Where a record came from and what travelled with it (a Kafka message's metadata).

    ``timestamp_ms``: the message's timestamp, milliseconds since the epoch (None when the
    source has none); ``headers``: (name, value) pairs in their order, a value may be None.
    """

    key: bytes | None
    topic: str
    partition: int
    timestamp_ms: int | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


class SourceRecord(NamedTuple):
    """One record read from a split: where it starts, where the next one starts, its value.

    ``meta``: the record's source metadata (None for a source without any, e.g. files);
    it lands in the sink's key, topic, partition, timestamp and headers columns.
    """

    offset: int
    next_offset: int
    value: bytes | None  # the record's bytes as the source holds them (None: a Kafka null value)
    meta: RecordMeta | None = None


class PlannedRange(NamedTuple):
    """One entry of an epoch plan for a region: read ``split`` from ``start`` to ``end``.

    A plain ``(split, start, end)`` tuple is accepted wherever a PlannedRange is.
    """

    split: Split
    start: int
    end: int


class RegionReader(abc.ABC):
    """Reads planned ranges of splits inside a region task, on an executor.

    Must be picklable (it is shipped to executors with the task closure) and
    stateless between calls: :meth:`read_range` may be called any number of
    times, in any order, from any process, for the same or different ranges.
    Implementations are small frozen dataclasses of plain fields.
    """

    @abc.abstractmethod
    def read_range(self, split: Split, start: int, end: int) -> Iterator[SourceRecord]:
        """Yield the records of ``split`` whose offset lies in ``[start, end)``, in order.

        Deterministic: the same ``(split, start, end)`` yields the same records
        every time. Raises :class:`~splitkeeper.errors.SourceError` (naming the
        split and what is wrong) when the split is missing or unreadable, or
        when ``start``/``end`` are outside the split; errors may surface on the
        call or while iterating.
        """


class SupportsWarmUp(abc.ABC):
    """Mix-in for a :class:`RegionReader`: get ready to read splits before their first range is planned.

    A long-lived reader slot (``readers: long_lived``) calls :meth:`warm_up` once, in its own
    process on an executor, when a continuous run opens
    (:meth:`~splitkeeper.core.ports.RegionRunner.prepare`), with the splits of the regions it is
    likely to serve; a reader that keeps clients between reads (:mod:`splitkeeper.clients`) opens
    one there and hands it back, so the run's first read finds it connected. Nothing is read and
    nothing is decided: a later read of any range works the same with or without it.
    """

    @abc.abstractmethod
    def warm_up(self, splits: Sequence[Split]) -> None:
        """Open what reading ``splits`` needs (a client, its connection, the splits' metadata).

        Best effort and bounded by the reader's own timeouts: it may raise (the caller logs it and
        the first read pays the set-up, or reports the error, as without it).
        """


class SourceConnector(SplitSource):
    """The driver-side view of a source: discovery, planning limits, identity.

    It is the core :class:`~splitkeeper.core.source.SplitSource` the enumerator
    discovers from (``name``, ``discover_splits``, ``subscriptions``), plus what
    the epoch planner and the region tasks need. Optional capabilities are the
    core mix-ins (``SupportsSplitReassignmentOnRecovery``,
    ``ExternallyCheckpointedSource``). Created once per driver run from the
    pipeline's ``source`` config and used from the driver thread only (it is not
    shipped to executors; :meth:`reader` is).
    """

    @property
    @abc.abstractmethod
    def bounded(self) -> bool:
        """True when every split is bounded, so a run can finish once all known splits are finished.

        New splits may still appear at later discoveries (files dropped later);
        a bounded run finishes only on a global checkpoint (protocol rule 2.6).
        """

    @abc.abstractmethod
    def discover_splits(self) -> list[Split]:
        """Return every split the source has now, at its initial position.

        Called by the driver at every epoch; may return splits the enumerator
        already knows or has finished: deduplication is the enumerator's
        business. Raises SourceError when the source itself is unreachable.
        """

    @abc.abstractmethod
    def subscriptions(self) -> frozenset[str]:
        """The subscriptions (topics, file roots) that exist now; splits of others are dropped on restart."""

    @abc.abstractmethod
    def available_end(self, split: Split) -> int:
        """How far a range of ``split`` may be planned now (exclusive); ``split.end`` for bounded splits."""

    @abc.abstractmethod
    def reader(self) -> RegionReader:
        """The picklable reader the region tasks use. Cheap; may be called every epoch."""

    @abc.abstractmethod
    def fingerprint(self) -> str:
        """A stable id of what is read (kind, location, split layout).

        Persisted in the ``pipeline`` state table; a state directory whose
        fingerprint differs belongs to another source and is refused.
        """

    def plan_end(self, split: Split, start: int, max_records: int) -> int:
        """The end of the range to plan for ``split`` from ``start`` with a budget of ``max_records``.

        Returns a record boundary in ``[start, available_end(split)]`` so that
        reading ``[start, end)`` ends exactly at ``end``. The default assumes one
        offset per record (Kafka). Called by the epoch planner on the driver.
        """
        return max(start, min(start + max_records, self.available_end(split)))

    def close(self) -> None:  # noqa: B027 - optional hook, default does nothing
        """Release driver-side resources (consumers, clients). Idempotent."""


# --------------------------------------------------------------------------- optional capabilities


class SupportsInitialDiscovery(abc.ABC):
    """Mix-in: the splits of a pipeline's first discovery start elsewhere than those found later.

    Kafka's ``source.starting`` (earliest, latest, timestamp, group) applies only
    to the splits of the *initial* discovery of a pipeline without a checkpoint;
    any split found later, including one missing from a restored checkpoint,
    starts at the earliest offset so nothing written before its discovery is
    skipped (FLIP-288). The connector cannot tell a restore from a fresh start,
    so the runtime says so.
    """

    @abc.abstractmethod
    def mark_initial_discovery_finished(self) -> None:
        """From now on, every newly discovered split starts at the source's earliest position.

        Called by the runtime on the driver when it restores a checkpoint, before
        the restored enumerator's first discovery; not called for a pipeline that
        starts without one (its first discovery is the initial one). May be
        called more than once (a later global restore calls it again): idempotent.
        """


class SupportsDiscoveryPositions(abc.ABC):
    """Mix-in: the source's discovery has positions of its own, checkpointed with the splits.

    A files source in notification mode (``source.discovery: notifications``) discovers files
    from an event topic: the offsets it read up to are in the same checkpoint as the splits those
    events announced (:attr:`~splitkeeper.core.types.EnumeratorSnapshot.discovery`), so discovery
    itself is restored with the state. The enumerator takes them at each snapshot
    (:meth:`discovery_positions`) and gives the restored ones back before its first discovery
    (:meth:`restore_discovery_positions`).
    """

    @abc.abstractmethod
    def discovery_positions(self) -> Mapping[str, int]:
        """The positions up to which discovery handed its splits over (taken at every snapshot)."""

    @abc.abstractmethod
    def restore_discovery_positions(self, positions: Mapping[str, int] | None) -> None:
        """Go on from ``positions`` (a checkpoint's; empty: a checkpoint without them, None: a start
        without a checkpoint). Called on the driver before the enumerator's first discovery, at
        every (global) restore and at a fresh start; the source forgets what it read since."""


class SupportsDiscoveryCounts(abc.ABC):
    """Mix-in: the source counts what its discovery did in this process, for the run's metrics.

    A files source in notification mode counts its full listings and the messages of its event
    topic that were not S3 events (skipped). The run's metrics read them at every write
    (:class:`~splitkeeper.app.metrics.PipelineMetrics`), and ``splitkeeper status`` shows the last
    run's. Counts of this process only: they start at 0 with each run, and a message read again
    after a restore counts again.
    """

    @abc.abstractmethod
    def discovery_counts(self) -> Mapping[str, int]:
        """What discovery did so far, by name (``listings``, ``skipped_events``); empty: nothing counted."""


#: How the ``detail`` of a SKIPPED_LOST_RANGE audit record begins: ``offsets [start, new_start)``.
#: :meth:`LostRange.from_audit` and the restart checks (Spark ``regexp_extract``) parse it.
LOST_RANGE_DETAIL_PATTERN = r"^offsets \[(\d+), (\d+)\)"
_LOST_RANGE_DETAIL = re.compile(LOST_RANGE_DETAIL_PATTERN)


@dataclass(frozen=True, slots=True)
class LostRange:
    """Offsets ``[start, new_start)`` of ``split_id`` that aged out before they were read.

    Produced only by :meth:`SupportsRetentionCheck.check_retention` when the
    source is configured to skip (``on_offset_out_of_range: skip``). The
    runtime records it in the audit trail (:meth:`audit_record`) and the
    restart checks accept exactly that gap in the sink for that split.
    """

    split_id: str
    start: int
    new_start: int

    @property
    def count(self) -> int:
        """How many offsets were lost."""
        return self.new_start - self.start

    @property
    def detail(self) -> str:
        return (
            f"offsets [{self.start}, {self.new_start}) of {self.split_id} aged out of retention "
            f"before they were read ({self.count} offsets lost; on_offset_out_of_range=skip)"
        )

    def audit_record(self, reader_id: int | None, checkpoint_id: int | None) -> AuditRecord:
        """The SKIPPED_LOST_RANGE audit record of this loss (``detail`` begins with the offsets)."""
        return AuditRecord(
            self.split_id, reader_id, RecoveryDecision.SKIPPED_LOST_RANGE, checkpoint_id, self.detail
        )

    @classmethod
    def from_audit(cls, record: AuditRecord) -> LostRange | None:
        """The loss a SKIPPED_LOST_RANGE record reports; None for any other record."""
        match = _LOST_RANGE_DETAIL.match(record.detail)
        if record.decision is not RecoveryDecision.SKIPPED_LOST_RANGE or match is None:
            return None
        return cls(record.split_id, int(match.group(1)), int(match.group(2)))


@dataclass(frozen=True, slots=True)
class RetentionCheck:
    """The answer of :meth:`SupportsRetentionCheck.check_retention`.

    ``ranges`` is the plan to persist: the given ranges in order, those that
    started below the log start offset moved to it (same record budget; a
    range may become empty when nothing is left). ``lost`` has one
    :class:`LostRange` per moved range (empty when nothing aged out).
    """

    ranges: tuple[PlannedRange, ...]
    lost: tuple[LostRange, ...] = ()


class SupportsRetentionCheck(abc.ABC):
    """Mix-in: the source's records can age out, and the planner must check before persisting a plan."""

    @abc.abstractmethod
    def check_retention(self, ranges: Iterable[PlannedRange | tuple[Split, int, int]]) -> RetentionCheck:
        """Check an epoch's planned ranges against what the source still holds.

        Called by the epoch planner on the driver, after the ranges of epoch N
        are computed and BEFORE the plan is persisted; not called for a replay
        of a persisted plan (its reader fails instead, and the next plan is
        checked again). May be called any number of times; has no side effect
        but a log line per lost range. Raises SourceError when a range aged
        out and the configuration says ``fail``.
        """


class SplitChangeKind(enum.Enum):
    """How a known split's data differs from its identity (what :class:`SplitChange` reports)."""

    GREW = "grew"  # more data past the split's end; the data up to the end is unchanged
    CHANGED = "changed"  # the data up to the end is not what was discovered (rewritten, shrunk)
    MOVED = "moved"  # gone from its place; the same data is under ``moved_to`` (a moved file)
    IDENTIFIED = "identified"  # the same data (or no identity before, older state): ``identity`` is taken
    # its place holds other data now and the old is gone (a Kafka topic deleted and re-created under
    # the same name): the split ends where it stands and ``replacement`` is read from its start, under
    # any policy (the old data cannot come back: there is nothing to wait for or to choose)
    RECREATED = "recreated"


@dataclass(frozen=True, slots=True)
class SplitChange:
    """One known split whose data is no longer what its identity says (rule 1.9).

    ``split_id``: the known split. ``identity``: the identity its data has now.
    ``start``: where the split begins in the source (its records start there).
    ``end``: GREW: the new end; CHANGED: where the data ends now (None: unknown).
    ``moved_to``: MOVED: the id the same data has now. ``replacement``: CHANGED: the
    split(s) the changed data is, at their start, with new ids (what ``new_version``
    reads); RECREATED: the split(s) of the new data (none when its place holds no data
    now, e.g. a re-created topic with fewer partitions). ``detail``: what changed, in
    words, naming the file or topic.
    """

    split_id: str
    kind: SplitChangeKind
    identity: str
    detail: str
    start: int = 0
    end: int | None = None
    moved_to: str = ""
    replacement: tuple[Split, ...] = field(default=())


class SupportsSplitIdentityCheck(abc.ABC):
    """Mix-in: the source can tell whether a known split's data is still what it discovered.

    Flink-style capability: a source whose splits carry an ``identity`` (a file's size,
    mtime and content hash) inherits this. The driver calls :meth:`check_splits` on the
    driver process before every discovery with the splits the enumerator knows; the core
    applies ``source.on_file_change`` to the answer (:meth:`SplitEnumerator.apply_split_changes`)
    and audits each decision. The source only observes: it decides nothing. When finished
    splits are checked is the core's decision (:meth:`EpochDriver.discover`): at the first
    discovery after a restore (so a restarted driver sees a change too) and then every
    ``source.recheck_finished_every`` epochs.
    """

    @abc.abstractmethod
    def check_splits(
        self, live: Sequence[Split], finished: Mapping[str, str], *, recheck_finished: bool = True
    ) -> list[SplitChange]:
        """The splits among ``live`` (pooled, owned, parked) and ``finished`` (id -> identity)
        whose data changed, grew or moved, in id order; nothing for unchanged ones.

        ``recheck_finished`` False: the data of finished splits need not be compared (the
        core's cadence, rule 1.9); the source may then do less (not look at them, list only
        what is new), and the :meth:`SplitSource.discover_splits` right after may leave out
        the splits of finished data it did not look at (the caller knows them). Live splits
        are always checked.

        May be called any number of times; has no side effect but learning the split layout
        of the known splits (so that :meth:`discover_splits` after it returns the known
        ids for files it has not seen in this process). A split whose data cannot be
        read now is not reported (its reader fails and ``on_split_failure`` applies).
        """
