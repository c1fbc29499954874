"""Value types of the protocol core: splits, split state, reader info, enums.

Everything here is immutable (except :class:`SplitState`, the reader-side
mutable view), picklable, and free of engine imports: these objects cross to
Spark executors and into Delta rows.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from splitkeeper.errors import InvalidParameterError


@dataclass(frozen=True, slots=True, order=True)
class Split:
    """One unit of source work: an id and a position. Immutable, picklable.

    ``position`` is the next offset to read, in the source's own unit (a Kafka offset, the byte
    offset of a line start in a file). ``end`` is the exclusive end of a bounded split, ``None`` for an
    unbounded one. ``backlog_end`` is the backlog boundary recorded by the
    enumerator at start/reset (protocol section 4); ``None`` means the split is not
    tracked for backlog (snapshot-only or bounded splits). ``subscription``
    names what the split belongs to (a topic, a file root); splits whose
    subscription is removed are dropped on restart. ``identity`` is what the
    source took of the split's data when it discovered it (a file's size, mtime
    and content hash): opaque to the core, persisted with the split in the
    enumerator state, compared by a source that
    :class:`~splitkeeper.core.source.SupportsSplitIdentityCheck` ("" = none).
    """

    split_id: str
    subscription: str = ""
    position: int = 0
    end: int | None = None
    backlog_end: int | None = None
    identity: str = ""

    def __post_init__(self) -> None:
        if not self.split_id:
            raise InvalidParameterError("split_id", self.split_id, "a non-empty string")
        if self.position < 0:
            raise InvalidParameterError(
                "position", self.position, "an offset >= 0", hint=f"split {self.split_id}"
            )
        if self.end is not None and self.end < self.position:
            raise InvalidParameterError(
                "end", self.end, f"an offset >= position {self.position}", hint=f"split {self.split_id}"
            )

    @property
    def bounded(self) -> bool:
        return self.end is not None

    @property
    def finished(self) -> bool:
        """A bounded split whose position reached its end."""
        return self.end is not None and self.position >= self.end

    def at(self, position: int) -> Split:
        """This split with another position (the snapshot form of a split state); itself when unchanged.

        Built with the constructor, not ``dataclasses.replace`` (several times slower): the
        driver and the enumerator call this for every split read, every epoch.
        """
        if position == self.position:
            return self
        return Split(self.split_id, self.subscription, position, self.end, self.backlog_end, self.identity)


@dataclass(slots=True)
class SplitState:
    """The mutable reader-side state of one split; converted back with :meth:`to_split`."""

    split: Split
    position: int

    @classmethod
    def of(cls, split: Split) -> SplitState:
        return cls(split=split, position=split.position)

    @property
    def finished(self) -> bool:
        return self.split.end is not None and self.position >= self.split.end

    def to_split(self) -> Split:
        return self.split.at(self.position)


@dataclass(frozen=True, slots=True)
class ReaderInfo:
    """What a reader tells the enumerator when it registers.

    ``reported_splits`` are the splits restored from the reader's own state
    (FLIP-537: ``ReaderInfo`` carries the initial split assignment). With
    deferred assignment the reader does not read them until the enumerator
    assigns.
    """

    reader_id: int
    reported_splits: tuple[Split, ...] = ()
    location: str = ""


class RecoveryDecision(enum.Enum):
    """The rule the enumerator applied to one split (the audit trail's vocabulary)."""

    ASSIGNED = "assigned"  # a pool split handed to a reader by the strategy
    DISCOVERED = "discovered"  # a new split entered the pool; detail "at <position>" (its start)
    REDISTRIBUTED_GLOBAL_RESTORE = "redistributed_global_restore"
    IGNORED_ALREADY_PENDING = "ignored_already_pending"
    IGNORED_STALE_REPORT = "ignored_stale_report"
    RETURNED_PARTIAL_FAILOVER = "returned_partial_failover"
    ADDED_BACK = "added_back"
    KEPT_LEGACY = "kept_legacy"
    DROPPED_REMOVED_SUBSCRIPTION = "dropped_removed_subscription"
    DROPPED_FINISHED = "dropped_finished"
    DROPPED_UNKNOWN = "dropped_unknown"
    FINISHED = "finished"
    RETURNED_REGION_FALLBACK = "returned_region_fallback"
    REBALANCED = "rebalanced"
    SKIPPED_LOST_RANGE = "skipped_lost_range"  # positions the source no longer had were skipped (retention)
    QUARANTINED = "quarantined"  # its reads failed too many epochs in a row: parked, read by nobody
    RELEASED = "released"  # an operator put a quarantined split back (recover --release)
    DROPPED_BY_OPERATOR = "dropped_by_operator"  # its file is gone; an operator dropped it (recover --drop)
    # operator checkpoints (core.operator): recover --rewind, offsets reset
    REWOUND = "rewound"  # the pipeline went back to an older checkpoint: the split is as it was there
    RESET_BY_OPERATOR = "reset_by_operator"  # its offset was set back: those offsets are read again
    SKIPPED_BY_OPERATOR = "skipped_by_operator"  # its offset was set forward: "offsets [a, b) ..." skipped
    # source.on_file_change (protocol rule 1.9): what became of a split whose data changed
    EXTENDED = "extended"  # growth past its end with the old data unchanged: the end grew (append)
    REPLACED = "replaced"  # its data was replaced: it ended; its new version is a new split (new_version)
    MOVED = "moved"  # its data appeared under another id (a moved file): the new id goes on from its position
    REFRESHED = "refreshed"  # nothing of it was read yet: it is taken as the source has it now


class SplitFailurePolicy(enum.Enum):
    """What happens to a split whose reads keep failing (protocol rule 1.8).

    ``STALL``: its region declines every epoch, and so falls back until the chain limit
    aborts checkpoints (the split blocks the pipeline until it is fixed; a bounded run stops
    after ``max_consecutive_aborts`` aborted epochs in a row). ``QUARANTINE`` (the default):
    after ``quarantine_after`` failed epochs in a row it is parked, and the other splits go
    on checkpointing globally. A read fails when its file cannot be planned (deleted,
    unreadable) or read (not UTF-8, a transform that raises).
    """

    STALL = "stall"
    QUARANTINE = "quarantine"


class SplitChangePolicy(enum.Enum):
    """What happens to a known split whose data changed under it (``source.on_file_change``, rule 1.9).

    ``FAIL``: planning stops with a SourceError naming the split and what changed; nothing
    of it is read or committed. ``NEW_VERSION``: the split ends where it stands and the
    changed data is read from its start as a new split (a new id). ``APPEND``: growth past
    the split's end with its old data unchanged is new data (the end grows, a finished split
    is read again from its old end); any other change fails.
    """

    FAIL = "fail"
    NEW_VERSION = "new_version"
    APPEND = "append"


#: ``detail`` of a DISCOVERED audit record: where the split started when it was discovered.
#: The restart checks parse it (:data:`DISCOVERED_DETAIL_PATTERN`) to know where a split's
#: records begin, since a source with retention no longer says so later.
DISCOVERED_DETAIL = "at {position}"
DISCOVERED_DETAIL_PATTERN = r"^at (\d+)$"


class CheckpointKind(enum.Enum):
    GLOBAL = "global"
    REGIONAL = "regional"
    ABORTED = "aborted"


class RegionOutcome(enum.Enum):
    ACK = "ack"
    DECLINE = "decline"
    TIMEOUT = "timeout"


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One recovery/assignment decision: which split, which reader, which rule, when."""

    split_id: str
    reader_id: int | None
    decision: RecoveryDecision
    checkpoint_id: int | None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Assignment:
    """An immutable view of who owns what: per-reader splits plus the unassigned pool."""

    readers: dict[int, tuple[Split, ...]] = field(default_factory=dict)
    pool: tuple[Split, ...] = ()

    def owner_of(self) -> dict[str, int | None]:
        owners: dict[str, int | None] = {s.split_id: None for s in self.pool}
        for reader_id, splits in self.readers.items():
            for s in splits:
                owners[s.split_id] = reader_id
        return owners

    def loads(self) -> dict[int, int]:
        return {r: len(s) for r, s in self.readers.items()}


@dataclass(frozen=True, slots=True)
class BacklogSnapshot:
    """Persisted backlog tracking (protocol section 4): boundaries per split and which are done."""

    boundaries: dict[str, int] = field(default_factory=dict)
    finished: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class EnumeratorSnapshot:
    """The enumerator's checkpointed state: ownership map *with positions*.

    ``assignments`` maps reader id to the splits it owns; ``pool`` holds the
    live splits no reader owns (reported-but-unassigned ones included: protocol
    rule 1.4, scenario 1). Positions here are the enumerator's view; the reader/region
    state in the same checkpoint carries the authoritative read positions of
    owned splits.
    """

    checkpoint_id: int
    parallelism: int
    pool: tuple[Split, ...] = ()
    assignments: dict[int, tuple[Split, ...]] = field(default_factory=dict)
    finished: frozenset[str] = frozenset()
    subscriptions: frozenset[str] = frozenset()
    backlog: BacklogSnapshot = field(default_factory=BacklogSnapshot)
    quarantined: tuple[Split, ...] = ()  # parked splits, at the position their records end in the sink
    # finished split id -> its identity when it finished (only those with one): a finished split's data
    # is still checked, so a change, an append or a move is seen after a restart too (rule 1.9)
    finished_identities: dict[str, str] = field(default_factory=dict)
    # the source's own discovery positions (a files source's event-topic offsets in notification mode:
    # :class:`~splitkeeper.core.source.SupportsDiscoveryPositions`); empty for the others and in state
    # written before they existed
    discovery: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RegionState:
    """One region's contribution to a checkpoint.

    ``ref_checkpoint_id`` is ``None`` when the region acknowledged this
    checkpoint, else the id of the completed checkpoint whose state the failed
    region contributes (FLIP-600 ``refCheckpointId``). ``operator_state`` is
    the region's list-style operator state (even-split or union redistribution
    on rescale). ``ref_depth`` is how many ref hops lead from this state to the
    checkpoint(s) that acknowledged its elements: 0 when acknowledged here,
    1 + the depth of the state fallen back to otherwise (a state redistributed
    on restore carries the deepest of the regions it was built from). Protocol rule 6.6
    bounds it by ``max_consecutive_failures``.
    """

    region_id: int
    splits: tuple[Split, ...] = ()
    operator_state: tuple[str, ...] = ()
    ref_checkpoint_id: int | None = None
    outcome: RegionOutcome = RegionOutcome.ACK
    ref_depth: int = 0


@dataclass(frozen=True, slots=True)
class CompletedCheckpoint:
    """A completed (global or regional) checkpoint, as the checkpoint store keeps it."""

    checkpoint_id: int
    kind: CheckpointKind
    parallelism: int
    regions: dict[int, RegionState] = field(default_factory=dict)
    enumerator: EnumeratorSnapshot | None = None
    consecutive_regional: int = 0
    processing_backlog: bool = False

    @property
    def ref_checkpoint_ids(self) -> frozenset[int]:
        return frozenset(
            r.ref_checkpoint_id for r in self.regions.values() if r.ref_checkpoint_id is not None
        )

    @property
    def failed_regions(self) -> tuple[int, ...]:
        return tuple(sorted(r for r, s in self.regions.items() if s.outcome is not RegionOutcome.ACK))
