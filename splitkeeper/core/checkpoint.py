"""Regional checkpoints (FLIP-600, protocol section 2): coordinator, store, ref chains, retention.

One checkpoint at a time goes through three steps, all driven by the runtime
(the driver process of the epoch job), never by the readers themselves:

1. :meth:`RegionalCheckpointCoordinator.trigger` opens a
   :class:`PendingCheckpoint` and decides whether it must be global.
2. Each region (one per reader by default) answers once through
   :meth:`PendingCheckpoint.acknowledge` or :meth:`PendingCheckpoint.decline`;
   :meth:`RegionalCheckpointCoordinator.expire` fails the silent ones.
3. :meth:`RegionalCheckpointCoordinator.complete` turns the outcomes into a
   GLOBAL, REGIONAL or ABORTED :class:`CheckpointResult` and adds the
   completed checkpoint to the :class:`CheckpointStore`.

Rules (``docs/protocol.md`` section 2 states them with the worked examples):

- A failed region contributes its *last good state*: the state it has in the
  latest completed checkpoint, or, after a restore, the state the restore
  gave it, with ``ref_checkpoint_id`` = that checkpoint's id. States are
  pre-merged, so the ref is metadata for retention and chain tracking.
- Tier 1: when ``consecutive_regional >= max_consecutive_failures`` the next
  checkpoint is forced global. Tier 2: a forced global checkpoint with any
  failure is ABORTED (not a job failure) and the counter resets to 0.
- The ref chain is bounded whole (the FLIP-600 thread: "the reference chain can
  only grow as deep as maxConsecutiveFailures"; protocol rules 2.2 and 6.6): a
  checkpoint's chain depth is 0 when it is global, else 1 + the deepest chain of
  a checkpoint it references (:meth:`CheckpointStore.chain_depth`). A regional
  checkpoint references the checkpoint its failed regions fall back to, so while
  that checkpoint's chain is ``max_consecutive_failures`` deep every checkpoint is
  forced global, the counter's tier-2 reset notwithstanding; only a global one
  that succeeds starts the chain afresh.
- A bounded job's final checkpoint is forced global (protocol rule 2.6); a pipeline
  whose regions are not independent checkpoints globally only (protocol rule 2.9).

No engine imports: this module is part of the protocol core.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from splitkeeper.core import defaults
from splitkeeper.core.invariants import ref_chain_depths
from splitkeeper.core.rescale import (
    Redistribution,
    RestoredRegion,
    reported_splits,
    restore_regions,
)
from splitkeeper.core.types import (
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    ReaderInfo,
    RegionOutcome,
    RegionState,
)
from splitkeeper.errors import CheckpointError, InvalidParameterError, ProtocolError

EnumeratorSnapshotFn = Callable[[Mapping[int, Collection[str]]], EnumeratorSnapshot]
"""Builds the enumerator snapshot for the checkpoint being completed.

Gets ``{failed region: split ids in the state that region falls back to}``
(empty for a global checkpoint) so the enumerator can correct its view for
the mixed state (protocol rule 2.4). Typically
``lambda fallback: enumerator.snapshot(pending.checkpoint_id, fallback=fallback)``.
"""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _regions_text(regions: Iterable[int]) -> str:
    listed = list(regions)
    return f"region {listed[0]}" if len(listed) == 1 else f"regions {listed}"


# --------------------------------------------------------------------------- config


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    """Regional checkpoint settings, validated on construction (protocol rules 2.2, 2.3, 2.9).

    ``max_consecutive_failures``: regional checkpoints allowed in a row before
    one is forced global; also the deepest a ref chain may grow. 0 means
    global checkpoints only. ``max_failure_ratio``: the largest share of
    regions that may fail for a checkpoint still to complete as regional
    (0.0 to 1.0). ``region_timeout_s``: how long a region may stay silent
    before it counts as failed. ``regions_independent``: False when a shuffle
    connects readers, which switches regional checkpoints off; ``dependence`` says
    what connects them (shown with the mode, e.g. the transform whose plan shuffles).
    """

    max_consecutive_failures: int = defaults.MAX_CONSECUTIVE_FAILURES
    max_failure_ratio: float = defaults.MAX_FAILURE_RATIO
    region_timeout_s: float = defaults.REGION_TIMEOUT_S
    regions_independent: bool = True
    dependence: str = ""

    def __post_init__(self) -> None:
        mcf = self.max_consecutive_failures
        if isinstance(mcf, bool) or not isinstance(mcf, int) or mcf < 0:
            raise InvalidParameterError("max_consecutive_failures", mcf, "an integer >= 0")
        ratio = self.max_failure_ratio
        if not _is_number(ratio) or not 0.0 <= ratio <= 1.0:
            raise InvalidParameterError("max_failure_ratio", ratio, "a number between 0 and 1")
        timeout = self.region_timeout_s
        if not _is_number(timeout) or timeout <= 0:
            raise InvalidParameterError("region_timeout_s", timeout, "a finite number of seconds > 0")
        if not isinstance(self.regions_independent, bool):
            raise InvalidParameterError("regions_independent", self.regions_independent, "True or False")
        if not isinstance(self.dependence, str):
            raise InvalidParameterError("dependence", self.dependence, "a sentence, or '' ")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> CheckpointConfig:
        """Build from a pipeline configuration section; unknown keys are rejected, not ignored."""
        known = [f.name for f in fields(cls)]
        for key in values:
            if key not in known:
                raise InvalidParameterError("checkpoint config key", key, f"one of {', '.join(known)}")
        return cls(**dict(values))


def check_full_snapshot_every(value: Any) -> None:
    """``full_snapshot_every`` (config: ``checkpoint.full_snapshot_every``): an integer >= 1
    (InvalidParameterError otherwise); the state store writes at most that many checkpoints'
    enumerator state per full snapshot, the others as deltas against it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidParameterError(
            "full_snapshot_every",
            value,
            "an integer >= 1: at most that many checkpoints share one full enumerator snapshot "
            "(1 writes a full snapshot at every checkpoint)",
        )


class CheckpointMode(enum.Enum):
    """What the coordinator can do with the current config and parallelism."""

    REGIONAL = "regional"  # regional checkpoints possible
    GLOBAL_ONLY = "global_only"  # every checkpoint is forced global; the reason says why


# --------------------------------------------------------------------------- store


class CheckpointStore:
    """Completed checkpoints by id, with ref chains and chain-safe retention (protocol rules 2.1, 2.7).

    This is the in-memory implementation of the contract. A persistent store
    subclasses it and overrides the four storage primitives (:meth:`ids`,
    :meth:`_load`, :meth:`_put`, :meth:`_delete`); the chain and retention
    rules stay here, so there is one place that decides them. Ids are added
    in strictly increasing order and every ref of an added checkpoint must
    already be in the store, so a stored chain is never broken.
    """

    def __init__(self) -> None:
        self._checkpoints: dict[int, CompletedCheckpoint] = {}

    # -- storage primitives (override in a persistent store) --

    def ids(self) -> list[int]:
        """Stored checkpoint ids, ascending."""
        return sorted(self._checkpoints)

    def _load(self, checkpoint_id: int) -> CompletedCheckpoint | None:
        return self._checkpoints.get(checkpoint_id)

    def _put(self, completed: CompletedCheckpoint) -> None:
        self._checkpoints[completed.checkpoint_id] = completed

    def _delete(self, checkpoint_id: int) -> None:
        del self._checkpoints[checkpoint_id]

    # -- contract --

    def add(self, completed: CompletedCheckpoint) -> None:
        """Store a completed (global or regional) checkpoint; the coordinator calls it once per checkpoint.

        Refuses (CheckpointError) what :meth:`check_can_add` refuses.
        """
        self.check_can_add(completed)
        self._put(completed)

    def check_can_add(self, completed: CompletedCheckpoint) -> None:
        """Raise unless :meth:`add` would accept ``completed``: not aborted, id above the latest, refs stored.

        The coordinator calls it before asking the enumerator for its snapshot,
        so a refused checkpoint leaves the enumerator untouched. No side effects.
        """
        if not isinstance(completed, CompletedCheckpoint):
            raise InvalidParameterError("completed", completed, "a CompletedCheckpoint")
        if completed.kind is CheckpointKind.ABORTED:
            raise CheckpointError(
                f"checkpoint {completed.checkpoint_id} was aborted; only completed checkpoints are stored",
                checkpoint_id=completed.checkpoint_id,
            )
        ids = self.ids()
        if ids and completed.checkpoint_id <= ids[-1]:
            raise CheckpointError(
                f"checkpoint {completed.checkpoint_id} cannot be added after checkpoint {ids[-1]}: "
                "ids must strictly increase",
                checkpoint_id=completed.checkpoint_id,
                latest=ids[-1],
            )
        missing = sorted(completed.ref_checkpoint_ids - set(ids))
        if missing:
            raise CheckpointError(
                f"checkpoint {completed.checkpoint_id} references checkpoints {missing} that are not in the "
                f"store (available: {ids}); adding it would break its ref chain",
                checkpoint_id=completed.checkpoint_id,
                missing=missing,
            )

    def get(self, checkpoint_id: int) -> CompletedCheckpoint:
        """The checkpoint with this id; CheckpointError naming the available ids if there is none."""
        found = self._load(checkpoint_id)
        if found is None:
            raise CheckpointError(
                f"checkpoint {checkpoint_id} is not in the store (available: {self.ids()})",
                checkpoint_id=checkpoint_id,
            )
        return found

    def __contains__(self, checkpoint_id: object) -> bool:
        return isinstance(checkpoint_id, int) and self._load(checkpoint_id) is not None

    def __len__(self) -> int:
        return len(self.ids())

    def latest(self) -> CompletedCheckpoint | None:
        """The newest completed checkpoint, global or regional; None when the store is empty."""
        ids = self.ids()
        return self.get(ids[-1]) if ids else None

    def latest_global(self) -> CompletedCheckpoint | None:
        """The newest GLOBAL checkpoint (the only kind independent of older state); None if there is none."""
        for checkpoint_id in reversed(self.ids()):
            checkpoint = self.get(checkpoint_id)
            if checkpoint.kind is CheckpointKind.GLOBAL:
                return checkpoint
        return None

    def ref_chain(self, checkpoint_id: int) -> list[int]:
        """``checkpoint_id`` and every checkpoint it references, directly or transitively, newest first.

        E.g. ``[102, 101, 100]`` for 102 (ref 101) -> 101 (ref 100) -> 100
        (global). These are the checkpoints that must be kept while
        ``checkpoint_id`` is kept.
        """
        seen: set[int] = set()
        todo = [checkpoint_id]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            todo.extend(self.get(current).ref_checkpoint_ids)
        return sorted(seen, reverse=True)

    def chain_depth(self, checkpoint_id: int) -> int:
        """How many ref hops this checkpoint's ref chain takes: 0 for a global one, else 1 + the
        deepest chain of a checkpoint it references (:func:`~splitkeeper.core.invariants.
        ref_chain_depths`). E.g. 2 for 102 (ref 101) -> 101 (ref 100) -> 100 (global).

        This is the quantity protocol rule 6.6 bounds by ``max_consecutive_failures`` (the
        FLIP-600 thread: "the reference chain can only grow as deep as maxConsecutiveFailures").
        ``RegionState.ref_depth`` counts one region's fallbacks in a row; it is never deeper.
        """
        chain = self.ref_chain(checkpoint_id)
        return ref_chain_depths({cid: self.get(cid).ref_checkpoint_ids for cid in chain})[checkpoint_id]

    def retain(self, keep_latest: int, *, pinned: Collection[int] = ()) -> list[int]:
        """Delete old checkpoints; return the deleted ids, ascending.

        Keeps the ``keep_latest`` newest checkpoints, the ``pinned`` ones (what
        a coordinator's fallback states refer to, see
        :attr:`RegionalCheckpointCoordinator.pinned_checkpoint_ids`), and every
        checkpoint any of those reference, transitively: retention never
        breaks a chain. May be called at any time, any number of times.
        """
        deleted = self.expired(keep_latest, pinned=pinned)
        for checkpoint_id in deleted:
            self._delete(checkpoint_id)
        return deleted

    def expired(self, keep_latest: int, *, pinned: Collection[int] = ()) -> list[int]:
        """The ids :meth:`retain` would delete, ascending; deletes nothing (the retention rule alone,
        for a store that adds rules of its own before it deletes)."""
        if isinstance(keep_latest, bool) or not isinstance(keep_latest, int) or keep_latest < 1:
            raise InvalidParameterError("keep_latest", keep_latest, "an integer >= 1")
        ids = self.ids()
        unknown = sorted(set(pinned) - set(ids))
        if unknown:
            raise CheckpointError(
                f"pinned checkpoints {unknown} are not in the store (available: {ids})", pinned=unknown
            )
        keep: set[int] = set()
        for root in [*ids[-keep_latest:], *pinned]:
            keep.update(self.ref_chain(root))
        return [checkpoint_id for checkpoint_id in ids if checkpoint_id not in keep]

    def forget(self, checkpoint_ids: Collection[int]) -> None:
        """Delete the checkpoints another store's retention deleted (the ones of ``checkpoint_ids``
        this store holds): a mirror of a persistent store follows its retention instead of deciding
        again. CheckpointError, deleting nothing, when a checkpoint kept here references one of them."""
        gone = {c for c in checkpoint_ids if c in self}
        broken = sorted(c for c in self.ids() if c not in gone and self.get(c).ref_checkpoint_ids & gone)
        if broken:
            raise CheckpointError(
                f"checkpoints {sorted(gone)} cannot be forgotten: kept checkpoints {broken} reference them",
                checkpoint_ids=sorted(gone),
                needed_by=broken,
            )
        for checkpoint_id in sorted(gone):
            self._delete(checkpoint_id)


# --------------------------------------------------------------------------- pending / result


class PendingStatus(enum.Enum):
    OPEN = "open"
    COMPLETED = "completed"
    ABORTED = "aborted"


class PendingCheckpoint:
    """A triggered checkpoint collecting one outcome per region.

    Created only by :meth:`RegionalCheckpointCoordinator.trigger`. The runtime
    calls :meth:`acknowledge` or :meth:`decline` exactly once per region,
    in any order; a second answer, an answer for an unknown region or an
    answer after the checkpoint closed raises ProtocolError.
    """

    def __init__(
        self,
        checkpoint_id: int,
        parallelism: int,
        triggered_at: float,
        deadline: float,
        *,
        final: bool,
        force_reason: str | None,
    ) -> None:
        self.checkpoint_id = checkpoint_id
        self.parallelism = parallelism
        self.triggered_at = triggered_at
        self.deadline = deadline
        self.final = final
        self.force_reason = force_reason
        self.status = PendingStatus.OPEN
        self._outcomes: dict[int, RegionOutcome] = {}
        self._states: dict[int, RegionState] = {}
        self._owners: dict[str, int] = {}  # split id -> the acknowledged region whose state holds it
        self._reasons: dict[int, str] = {}

    @property
    def forced_global(self) -> bool:
        """True when every region must acknowledge; any failure aborts the checkpoint."""
        return self.force_reason is not None

    @property
    def outcomes(self) -> dict[int, RegionOutcome]:
        return dict(sorted(self._outcomes.items()))

    @property
    def failure_reasons(self) -> dict[int, str]:
        """Why each failed region failed (decline reason or timeout)."""
        return dict(sorted(self._reasons.items()))

    @property
    def waiting_for(self) -> tuple[int, ...]:
        """Regions that have neither acknowledged nor declined (nor timed out)."""
        return tuple(r for r in range(self.parallelism) if r not in self._outcomes)

    @property
    def acked_states(self) -> dict[int, RegionState]:
        """The new state of each region that acknowledged so far."""
        return dict(sorted(self._states.items()))

    def _check_answer(self, region: int, verb: str) -> None:
        if self.status is not PendingStatus.OPEN:
            raise ProtocolError(
                f"checkpoint {self.checkpoint_id} is already {self.status.value}; "
                f"region {region} cannot {verb} it any more",
                checkpoint_id=self.checkpoint_id,
                region=region,
            )
        if isinstance(region, bool) or not isinstance(region, int) or not 0 <= region < self.parallelism:
            raise ProtocolError(
                f"region {region!r} is not a region of checkpoint {self.checkpoint_id} "
                f"(regions 0..{self.parallelism - 1})",
                checkpoint_id=self.checkpoint_id,
                region=region,
            )
        previous = self._outcomes.get(region)
        if previous is not None:
            done = {RegionOutcome.ACK: "acknowledged", RegionOutcome.DECLINE: "declined"}.get(
                previous, "timed out of"
            )
            raise ProtocolError(
                f"region {region} already {done} checkpoint {self.checkpoint_id}; "
                "each region acknowledges or declines once",
                checkpoint_id=self.checkpoint_id,
                region=region,
            )

    def acknowledge(self, region: int, state: RegionState) -> None:
        """Region ``region`` took its snapshot; ``state`` is its new state (splits, operator state)."""
        self._check_answer(region, "acknowledge")
        if not isinstance(state, RegionState):
            raise ProtocolError(f"region {region} acknowledged with {state!r}; expected a RegionState")
        if state.region_id != region:
            raise ProtocolError(
                f"region {region} acknowledged checkpoint {self.checkpoint_id} with the state of "
                f"region {state.region_id}",
                region=region,
            )
        if state.ref_checkpoint_id is not None or state.outcome is not RegionOutcome.ACK or state.ref_depth:
            raise ProtocolError(
                f"region {region} acknowledged with a fallback state (ref_checkpoint_id="
                f"{state.ref_checkpoint_id}, outcome={state.outcome.value}); an acknowledgement carries "
                "new state: ref_checkpoint_id=None, outcome=ACK, ref_depth=0",
                region=region,
            )
        self._check_split_ownership(region, state)
        self._outcomes[region] = RegionOutcome.ACK
        self._states[region] = state
        self._owners.update((split.split_id, region) for split in state.splits)

    def _check_split_ownership(self, region: int, state: RegionState) -> None:
        owners = self._owners  # kept as regions acknowledge: no pass over every acked state per answer
        seen: set[str] = set()
        for split in state.splits:
            if split.split_id in seen:
                raise ProtocolError(
                    f"region {region} acknowledged checkpoint {self.checkpoint_id} with split "
                    f"{split.split_id!r} twice; a split appears once in a reader's state",
                    region=region,
                    split_id=split.split_id,
                )
            seen.add(split.split_id)
            if split.split_id in owners:
                raise ProtocolError(
                    f"region {region} acknowledged checkpoint {self.checkpoint_id} with split "
                    f"{split.split_id!r}, which region {owners[split.split_id]} already acknowledged; "
                    "a split is owned by exactly one reader",
                    region=region,
                    split_id=split.split_id,
                )

    def decline(self, region: int, reason: str = "") -> None:
        """Region ``region`` could not take its snapshot; it will contribute its last good state."""
        self._check_answer(region, "decline")
        self._outcomes[region] = RegionOutcome.DECLINE
        self._reasons[region] = reason or "declined"

    def _time_out(self, region: int, reason: str) -> None:
        self._outcomes[region] = RegionOutcome.TIMEOUT
        self._reasons[region] = reason


@dataclass(frozen=True, slots=True)
class CheckpointResult:
    """What :meth:`RegionalCheckpointCoordinator.complete` (or ``abort``) decided.

    Side effects (sink commits, external offset commits) are allowed for the
    regions in ``notify_complete`` only (protocol rule 2.5); ``notify_partially_completed``
    are the failed regions of a regional checkpoint (their state was taken
    from an earlier checkpoint); ``notify_aborted`` lists every region when
    the checkpoint was aborted. ``completed`` is None when aborted.
    ``superseded_splits`` maps a failed region to the split ids dropped from
    its fallback state because an acknowledging region owns them now.
    """

    checkpoint_id: int
    kind: CheckpointKind
    completed: CompletedCheckpoint | None
    outcomes: dict[int, RegionOutcome]
    notify_complete: tuple[int, ...]
    notify_partially_completed: tuple[int, ...]
    notify_aborted: tuple[int, ...]
    consecutive_regional: int
    reason: str
    final: bool = False
    superseded_splits: dict[int, tuple[str, ...]] = field(default_factory=dict)

    @property
    def may_finish_job(self) -> bool:
        """A bounded job may finish only after its final checkpoint completed globally (protocol rule 2.6)."""
        return self.final and self.kind is CheckpointKind.GLOBAL


@dataclass(frozen=True, slots=True)
class RestoredCheckpoint:
    """What :meth:`RegionalCheckpointCoordinator.restore` set up: per new region, where it starts from.

    ``regions[i].splits`` are what reader ``i`` reports on registration
    (:meth:`reader_infos`); ``enumerator`` is the checkpoint's enumerator
    snapshot to restore the enumerator from.
    """

    checkpoint_id: int
    kind: CheckpointKind
    previous_parallelism: int
    parallelism: int
    redistribution: Redistribution
    regions: tuple[RestoredRegion, ...]
    consecutive_regional: int
    enumerator: EnumeratorSnapshot | None

    @property
    def rescaled(self) -> bool:
        return self.parallelism != self.previous_parallelism

    def reader_infos(self) -> list[ReaderInfo]:
        return reported_splits(self.regions)


@dataclass(frozen=True, slots=True)
class _LastGood:
    """The state a region falls back to, the checkpoint that holds it, and that state's depth there."""

    state: RegionState
    ref_checkpoint_id: int
    depth: int


# --------------------------------------------------------------------------- coordinator


class RegionalCheckpointCoordinator:
    """Decides global / regional / aborted for each checkpoint of one job (protocol section 2).

    Lives in the driver; one instance per running job, not thread-safe (the
    runtime drives it from one thread). Regions are ``0..parallelism-1``, one
    per reader. At most one checkpoint is pending at a time.
    """

    def __init__(self, config: CheckpointConfig, parallelism: int, store: CheckpointStore) -> None:
        if not isinstance(config, CheckpointConfig):
            raise InvalidParameterError("config", config, "a CheckpointConfig")
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
            raise InvalidParameterError("parallelism", parallelism, "an integer >= 1")
        if not isinstance(store, CheckpointStore):
            raise InvalidParameterError("store", store, "a CheckpointStore")
        self.config = config
        self.store = store
        self._parallelism = parallelism
        self._pending: PendingCheckpoint | None = None
        self._last_id = max(store.ids(), default=0)
        self._consecutive = 0
        self._last_good: dict[int, _LastGood] = {}
        # whole ref-chain depth (CheckpointStore.chain_depth) of the checkpoints the fallback states
        # live in: what a regional checkpoint would reference (kept so trigger() reads no store)
        self._chain_depths: dict[int, int] = {}

    # -- read-only views --

    @property
    def parallelism(self) -> int:
        return self._parallelism

    @property
    def consecutive_regional(self) -> int:
        """Regional checkpoints completed since the last global one (or the last aborted forced global)."""
        return self._consecutive

    @property
    def pending(self) -> PendingCheckpoint | None:
        return self._pending

    @property
    def mode(self) -> CheckpointMode:
        return self._mode()[0]

    @property
    def mode_reason(self) -> str:
        """One line the runtime prints at start: whether regional checkpoints are on, and why not."""
        return self._mode()[1]

    @property
    def pinned_checkpoint_ids(self) -> frozenset[int]:
        """Checkpoints the current fallback states live in; retention must keep them."""
        return frozenset(g.ref_checkpoint_id for g in self._last_good.values())

    def _chain_depth(self, checkpoint_id: int) -> int:
        depth = self._chain_depths.get(checkpoint_id)
        if depth is None:
            depth = self._chain_depths[checkpoint_id] = self.store.chain_depth(checkpoint_id)
        return depth

    def fallback_chain(self) -> tuple[int, int] | None:
        """``(checkpoint, its chain depth)`` of the deepest checkpoint a failed region would fall
        back to now; a regional checkpoint completed now would be one hop deeper. None before any
        checkpoint completed or was restored (nothing to fall back to)."""
        pinned = self.pinned_checkpoint_ids
        if not pinned:
            return None
        deepest = max(pinned, key=lambda cid: (self._chain_depth(cid), cid))
        return deepest, self._chain_depth(deepest)

    def allowed_failures(self) -> int:
        """How many regions may fail for a checkpoint to still complete as regional (ratio rule)."""
        ratio = self.config.max_failure_ratio
        return max(k for k in range(self._parallelism + 1) if k / self._parallelism <= ratio)

    def fallback_state(self, region: int) -> RegionState | None:
        """The state ``region`` would contribute if it failed the next checkpoint; None if it has none."""
        last = self._last_good.get(region)
        if last is None:
            return None
        return replace(
            last.state,
            region_id=region,
            ref_checkpoint_id=last.ref_checkpoint_id,
            outcome=RegionOutcome.DECLINE,
            ref_depth=last.depth + 1,
        )

    def _mode(self) -> tuple[CheckpointMode, str]:
        cfg, p = self.config, self._parallelism
        if not cfg.regions_independent:
            return CheckpointMode.GLOBAL_ONLY, (
                "global checkpoints only: regions are not independent "
                f"({cfg.dependence or 'a shuffle connects the readers'}), so a region cannot fall back alone"
            )
        if cfg.max_consecutive_failures == 0:
            return CheckpointMode.GLOBAL_ONLY, "global checkpoints only: max_consecutive_failures=0"
        allowed = self.allowed_failures()
        if allowed == 0:
            return CheckpointMode.GLOBAL_ONLY, (
                f"global checkpoints only: max_failure_ratio={cfg.max_failure_ratio} lets no region "
                f"fail at parallelism {p} (one region is {1 / p:.2f} of the job)"
            )
        return CheckpointMode.REGIONAL, (
            f"regional checkpoints on: up to {allowed} of {p} regions may fall back, "
            f"at most {cfg.max_consecutive_failures} regional checkpoints in a row"
        )

    # -- protocol --

    def trigger(
        self, checkpoint_id: int | None = None, *, final: bool = False, now: float
    ) -> PendingCheckpoint:
        """Open checkpoint ``checkpoint_id`` (default: the last id + 1) at time ``now`` (seconds).

        Ids strictly increase across triggers, restores and the store's
        contents. ``final=True`` marks the last checkpoint of a bounded job:
        it is forced global. Only one checkpoint may be pending.
        """
        if self._pending is not None:
            raise ProtocolError(
                f"checkpoint {self._pending.checkpoint_id} is still pending; complete() or abort() it "
                "before triggering another",
                pending=self._pending.checkpoint_id,
            )
        if not _is_number(now):
            raise InvalidParameterError("now", now, "a finite time in seconds")
        last = max(self._last_id, max(self.store.ids(), default=0))
        if checkpoint_id is None:
            checkpoint_id = last + 1
        elif isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int) or checkpoint_id <= last:
            raise InvalidParameterError(
                "checkpoint_id",
                checkpoint_id,
                f"an integer greater than {last}, the last checkpoint id (ids strictly increase)",
            )
        mode, mode_reason = self._mode()
        force_reason: str | None = None
        if mode is CheckpointMode.GLOBAL_ONLY:
            force_reason = mode_reason
        elif final:
            force_reason = "final checkpoint of a bounded job: it finishes only on a global checkpoint"
        elif self._consecutive >= self.config.max_consecutive_failures:
            force_reason = (
                f"{self._consecutive} consecutive regional checkpoints >= "
                f"max_consecutive_failures={self.config.max_consecutive_failures}"
            )
        elif (chain := self.fallback_chain()) is not None and chain[
            1
        ] >= self.config.max_consecutive_failures:
            force_reason = (
                f"the ref chain of checkpoint {chain[0]} is {chain[1]} deep = "
                f"max_consecutive_failures={self.config.max_consecutive_failures}: a regional checkpoint "
                "would reference it and go deeper (protocol rule 2.2; after an aborted forced global only "
                "a global checkpoint starts the chain afresh)"
            )
        pending = PendingCheckpoint(
            checkpoint_id,
            self._parallelism,
            float(now),
            float(now) + self.config.region_timeout_s,
            final=final,
            force_reason=force_reason,
        )
        self._last_id = checkpoint_id
        self._pending = pending
        return pending

    def _check_current(self, pending: PendingCheckpoint) -> None:
        if pending is not self._pending:
            state = pending.status.value if isinstance(pending, PendingCheckpoint) else "unknown"
            raise ProtocolError(
                f"checkpoint {getattr(pending, 'checkpoint_id', pending)!r} is not the pending checkpoint "
                f"of this coordinator (it is {state}; pending: "
                f"{self._pending.checkpoint_id if self._pending else None})"
            )

    def expire(self, pending: PendingCheckpoint, now: float) -> tuple[int, ...]:
        """Mark every region still silent at ``now`` >= the deadline as TIMEOUT (protocol rule 2.3).

        Returns the regions marked (empty before the deadline). May be called
        any number of times while the checkpoint is pending.
        """
        self._check_current(pending)
        if not _is_number(now):
            raise InvalidParameterError("now", now, "a finite time in seconds")
        if now < pending.deadline:
            return ()
        silent = pending.waiting_for
        for region in silent:
            pending._time_out(
                region,
                f"no acknowledgement or decline within region_timeout_s={self.config.region_timeout_s}",
            )
        return silent

    def complete(
        self,
        pending: PendingCheckpoint,
        enumerator_snapshot: EnumeratorSnapshotFn | None = None,
        *,
        processing_backlog: bool = False,
    ) -> CheckpointResult:
        """Decide and record the checkpoint once every region has an outcome.

        GLOBAL when all acknowledged; REGIONAL when some failed and the rules
        allow it; ABORTED otherwise (never a job failure). For GLOBAL and
        REGIONAL, ``enumerator_snapshot`` (if given) is called once with the
        failed regions' fallback split ids and its snapshot is stored with the
        checkpoint; then the checkpoint is added to the store. The store's
        checks run before the enumerator is asked, so a refused checkpoint
        never reaches the enumerator. If the snapshot callable or the store
        raises, the coordinator is unchanged and the checkpoint still pending.
        Called once per checkpoint (again only after such an error).
        """
        self._check_current(pending)
        if pending.waiting_for:
            raise ProtocolError(
                f"checkpoint {pending.checkpoint_id} cannot complete: "
                f"{_regions_text(pending.waiting_for)} neither acknowledged nor declined; wait for them, "
                f"or call expire(pending, now) once region_timeout_s={self.config.region_timeout_s} "
                "has passed",
                checkpoint_id=pending.checkpoint_id,
                waiting_for=pending.waiting_for,
            )
        outcomes = pending.outcomes
        failed = tuple(r for r, o in outcomes.items() if o is not RegionOutcome.ACK)
        if not failed:
            return self._record(pending, CheckpointKind.GLOBAL, {}, enumerator_snapshot, processing_backlog)
        failures = "; ".join(f"region {r} {outcomes[r].value} ({pending.failure_reasons[r]})" for r in failed)
        if pending.forced_global:
            self._consecutive = 0
            retry = " The bounded job must retry, not finish." if pending.final else ""
            return self._close_aborted(
                pending,
                f"forced global checkpoint {pending.checkpoint_id} ({pending.force_reason}) aborted: "
                f"{failures}. Not a job failure; the consecutive regional counter is reset to 0.{retry}",
            )
        refusal = self._regional_refusal(failed)
        if refusal:
            return self._close_aborted(
                pending, f"checkpoint {pending.checkpoint_id} aborted: {refusal}. Failed: {failures}"
            )
        # A split an acknowledging region now owns (the enumerator moved it there after a partial
        # failover) is dropped from a failed region's fallback: that claim is stale (protocol rule 1.3).
        acked_split_ids = {split.split_id for s in pending.acked_states.values() for split in s.splits}
        fallback: dict[int, RegionState] = {}
        superseded: dict[int, tuple[str, ...]] = {}
        for region in failed:
            state = self.fallback_state(region)
            assert state is not None  # _regional_refusal checked every failed region has one
            kept = tuple(split for split in state.splits if split.split_id not in acked_split_ids)
            if len(kept) != len(state.splits):
                superseded[region] = tuple(
                    split.split_id for split in state.splits if split.split_id in acked_split_ids
                )
            fallback[region] = replace(state, outcome=outcomes[region], splits=kept)
        return self._record(
            pending, CheckpointKind.REGIONAL, fallback, enumerator_snapshot, processing_backlog, superseded
        )

    def _regional_refusal(self, failed: tuple[int, ...]) -> str:
        cfg, p = self.config, self._parallelism
        if len(failed) > self.allowed_failures():
            return (
                f"{len(failed)} of {p} regions failed (ratio {len(failed) / p:.2f} > "
                f"max_failure_ratio={cfg.max_failure_ratio})"
            )
        missing = [r for r in failed if r not in self._last_good]
        if missing:
            return (
                f"{_regions_text(missing)} failed with no completed or restored state to fall back to "
                "(no checkpoint has completed yet)"
            )
        return ""

    def _record(
        self,
        pending: PendingCheckpoint,
        kind: CheckpointKind,
        fallback: dict[int, RegionState],
        enumerator_snapshot: EnumeratorSnapshotFn | None,
        processing_backlog: bool,
        superseded: dict[int, tuple[str, ...]] | None = None,
    ) -> CheckpointResult:
        superseded = superseded or {}
        acked = pending.acked_states
        regions: dict[int, RegionState] = {}
        for region in range(self._parallelism):
            new_state = acked.get(region)
            regions[region] = new_state if new_state is not None else fallback[region]
        consecutive = 0 if kind is CheckpointKind.GLOBAL else self._consecutive + 1
        completed = CompletedCheckpoint(
            checkpoint_id=pending.checkpoint_id,
            kind=kind,
            parallelism=self._parallelism,
            regions=regions,
            consecutive_regional=consecutive,
            processing_backlog=processing_backlog,
        )
        self.store.check_can_add(completed)  # before the enumerator snapshots anything
        snapshot: EnumeratorSnapshot | None = None
        if enumerator_snapshot is not None:
            snapshot = enumerator_snapshot(
                {r: tuple(split.split_id for split in s.splits) for r, s in fallback.items()}
            )
            if (
                not isinstance(snapshot, EnumeratorSnapshot)
                or snapshot.checkpoint_id != pending.checkpoint_id
            ):
                raise ProtocolError(
                    f"enumerator_snapshot returned {type(snapshot).__name__} for checkpoint "
                    f"{getattr(snapshot, 'checkpoint_id', None)}; expected an EnumeratorSnapshot of "
                    f"checkpoint {pending.checkpoint_id}",
                    checkpoint_id=pending.checkpoint_id,
                )
        completed = replace(completed, enumerator=snapshot)
        chain = 1 + max((self._chain_depth(r) for r in completed.ref_checkpoint_ids), default=-1)
        self.store.add(completed)
        # From here on nothing can fail: commit the coordinator's state.
        self._consecutive = consecutive
        self._last_good = {
            r: _LastGood(state=s, ref_checkpoint_id=completed.checkpoint_id, depth=s.ref_depth)
            for r, s in regions.items()
        }
        self._chain_depths = {completed.checkpoint_id: chain}  # every fallback now lives in it
        pending.status = PendingStatus.COMPLETED
        self._pending = None
        failed = tuple(sorted(fallback))
        if kind is CheckpointKind.GLOBAL:
            reason = f"checkpoint {completed.checkpoint_id} is global: all {len(acked)} regions acknowledged"
            if pending.force_reason is not None:
                reason += f" (forced: {pending.force_reason})"
        else:
            refs = ", ".join(f"region {r} -> {fallback[r].ref_checkpoint_id}" for r in failed)
            reason = (
                f"checkpoint {completed.checkpoint_id} is regional: {_regions_text(failed)} fell back "
                f"({refs}); {consecutive} consecutive regional of "
                f"max_consecutive_failures={self.config.max_consecutive_failures}"
            )
            if superseded:
                moved = ", ".join(f"region {r}: {list(ids)}" for r, ids in sorted(superseded.items()))
                reason += f"; splits now owned by an acknowledging region left the fallback ({moved})"
        return CheckpointResult(
            checkpoint_id=completed.checkpoint_id,
            kind=kind,
            completed=completed,
            outcomes=pending.outcomes,
            notify_complete=tuple(acked),
            notify_partially_completed=failed,
            notify_aborted=(),
            consecutive_regional=consecutive,
            reason=reason,
            final=pending.final,
            superseded_splits=superseded,
        )

    def _close_aborted(self, pending: PendingCheckpoint, reason: str) -> CheckpointResult:
        pending.status = PendingStatus.ABORTED
        self._pending = None
        return CheckpointResult(
            checkpoint_id=pending.checkpoint_id,
            kind=CheckpointKind.ABORTED,
            completed=None,
            outcomes=pending.outcomes,
            notify_complete=(),
            notify_partially_completed=(),
            notify_aborted=tuple(range(pending.parallelism)),
            consecutive_regional=self._consecutive,
            reason=reason,
            final=pending.final,
        )

    def abort(self, pending: PendingCheckpoint, reason: str) -> CheckpointResult:
        """Abort the pending checkpoint from outside (job failover, cancellation).

        The consecutive counter is unchanged: no global checkpoint was
        attempted to the end. Called at most once per checkpoint.
        """
        self._check_current(pending)
        return self._close_aborted(pending, f"checkpoint {pending.checkpoint_id} aborted: {reason}")

    def restore(
        self,
        checkpoint: CompletedCheckpoint,
        new_parallelism: int | None = None,
        redistribution: Redistribution = Redistribution.EVEN_SPLIT,
        *,
        consecutive_regional: int | None = None,
    ) -> RestoredCheckpoint:
        """Restore from a stored completed checkpoint, optionally at a new parallelism.

        Called by the runtime after a failover or for a rescale, with no
        checkpoint pending; may be called again (the later restore replaces
        the earlier one). ``new_parallelism=None`` keeps the checkpoint's.
        Operator state is redistributed by ``redistribution`` and splits
        even-split (see :mod:`splitkeeper.core.rescale`). The consecutive
        regional counter comes from the checkpoint's metadata. Until the
        first checkpoint after this restore completes, each region falls
        back to the state this restore gave it, with ``ref_checkpoint_id`` =
        the restored checkpoint's id (protocol rule 2.8: the redistributed assignment
        is retained until the first checkpoint at the new parallelism).
        ``consecutive_regional`` overrides the counter: the runtime passes the
        live value when it restores right after an aborted checkpoint, so the
        reset of the two-tier rule (an aborted forced global) is not undone.
        """
        if self._pending is not None:
            raise ProtocolError(
                f"cannot restore while checkpoint {self._pending.checkpoint_id} is pending; abort() it first",
                pending=self._pending.checkpoint_id,
            )
        if not isinstance(checkpoint, CompletedCheckpoint):
            raise InvalidParameterError("checkpoint", checkpoint, "a CompletedCheckpoint from the store")
        if checkpoint.checkpoint_id not in self.store:
            raise CheckpointError(
                f"checkpoint {checkpoint.checkpoint_id} is not in the store (available: {self.store.ids()}); "
                "restore from a stored checkpoint, so the regions' fallback states stay referenceable",
                checkpoint_id=checkpoint.checkpoint_id,
            )
        if not isinstance(redistribution, Redistribution):
            raise InvalidParameterError(
                "redistribution", redistribution, "Redistribution.EVEN_SPLIT or Redistribution.UNION"
            )
        regions = restore_regions(checkpoint, new_parallelism, redistribution)
        old = checkpoint.regions
        self._last_good = {
            r.region_id: _LastGood(
                state=RegionState(region_id=r.region_id, splits=r.splits, operator_state=r.operator_state),
                ref_checkpoint_id=checkpoint.checkpoint_id,
                depth=max((old[source].ref_depth for source in r.source_regions), default=0),
            )
            for r in regions
        }
        self._parallelism = len(regions)
        self._chain_depths = {checkpoint.checkpoint_id: self.store.chain_depth(checkpoint.checkpoint_id)}
        if consecutive_regional is None:
            consecutive_regional = checkpoint.consecutive_regional
        elif (
            isinstance(consecutive_regional, bool)
            or not isinstance(consecutive_regional, int)
            or (consecutive_regional < 0)
        ):
            raise InvalidParameterError("consecutive_regional", consecutive_regional, "an integer >= 0")
        self._consecutive = consecutive_regional
        self._last_id = max(self._last_id, checkpoint.checkpoint_id)
        return RestoredCheckpoint(
            checkpoint_id=checkpoint.checkpoint_id,
            kind=checkpoint.kind,
            previous_parallelism=checkpoint.parallelism,
            parallelism=len(regions),
            redistribution=redistribution,
            regions=tuple(regions),
            consecutive_regional=consecutive_regional,
            enumerator=checkpoint.enumerator,
        )

    def retain(self, keep_latest: int) -> list[int]:
        """``store.retain(keep_latest)`` that also keeps what the current fallback states refer to
        (a coordinator whose store is the only one; the driver's follows its state store: :meth:`forget`)."""
        return self.store.retain(keep_latest, pinned=self.pinned_checkpoint_ids)

    def forget(self, checkpoint_ids: Collection[int]) -> None:
        """Drop the checkpoints the pipeline's state store deleted by its retention (which kept
        :attr:`pinned_checkpoint_ids`) from this coordinator's store: retention decided once."""
        self.store.forget(checkpoint_ids)
