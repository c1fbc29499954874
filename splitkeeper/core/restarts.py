"""The in-run restart proof: protocol section 6 at every restore inside a run, before reading on.

DESIGN's promise is that every restart is proven. The restart checks of ``splitkeeper
validate`` prove the latest checkpoint and the sink after a run; this module proves each
restore *where it happens*, with the same pure functions of :mod:`splitkeeper.core.invariants`
the simulator uses, so that a run never reads on from a state that breaks a rule.

Contract (``docs/protocol.md`` section 6, "in-run checks"):

1. Who calls it, when: :class:`~splitkeeper.core.driver.EpochDriver`, in the driver process,
   right after each restore and before the next epoch plans: a global restore (open, after an
   aborted epoch, an explicit restore), a rescale (a global restore at another parallelism), a
   partial failover (one or more readers restarted from their last good state, rule 1.3), and
   a region's fallback (the failed regions of a regional checkpoint re-registering with the
   state they fell back to). A global restore whose readers have not all registered yet is
   proven when the last one registers (rule 1.4: assignment waits for it). A fresh start
   restores nothing and is not a restart.
2. What it checks (:data:`IN_RUN_RULES`): 6.1 (every split that must be live is placed once:
   pooled, quarantined or owned by one registered reader, and each reader reads exactly what the
   enumerator says it owns), 6.2, 6.3, 6.5 (balanced strategies with deferred assignment, once
   every reader is registered) and 6.6 (the chains of the checkpoints the run refers to). Not
   6.4: the sink is the validate task's (it scans it with Spark).
3. Which splits must be live: every split of the restored checkpoint (its regions' states, its
   enumerator's pool, owners and quarantine), or, for a failover, every split placed before it;
   a split may leave only with a recorded decision (:data:`DEPARTURES`, in the audit trail
   since the restore began). Splits discovered meanwhile may be there too.
4. Verdict: a :class:`RestartCheck` (which restore, which rules, passed or the violations).
   The driver records every one (the state store keeps them, the hooks count them) and stops
   the run with :class:`RestartCheckError` (``[STATE_ERROR]``) naming the rule, the split and
   the checkpoint when one failed: nothing is read from a state that is not proven.
5. Cost: linear in the splits of the restored state, once per restore; an epoch without a
   restore checks nothing.

No engine imports: this module is part of the protocol core.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from splitkeeper.core.assignment import WeightedStrategy
from splitkeeper.core.enumerator import SplitEnumerator
from splitkeeper.core.invariants import (
    Violation,
    ViolationKind,
    check_balance,
    check_finished_not_assigned,
    check_ownership,
    check_reader_views,
    check_ref_chains,
    check_subscriptions,
)
from splitkeeper.core.types import Assignment, CompletedCheckpoint, RecoveryDecision
from splitkeeper.errors import StateError

#: The protocol rules an in-run check decides (section 6 but 6.4, the sink's).
IN_RUN_RULES = ("6.1", "6.2", "6.3", "6.5", "6.6")
#: The rule each violation kind belongs to.
RULE_OF: dict[ViolationKind, str] = {
    ViolationKind.OWNED_MORE_THAN_ONCE: "6.1",
    ViolationKind.NOT_OWNED: "6.1",
    ViolationKind.FINISHED_ASSIGNED: "6.2",
    ViolationKind.REMOVED_SUBSCRIPTION: "6.3",
    ViolationKind.UNBALANCED: "6.5",
    ViolationKind.WEIGHT_UNBALANCED: "6.5",
    ViolationKind.REF_CHAIN_TOO_DEEP: "6.6",
    ViolationKind.REF_MISSING: "6.6",
    ViolationKind.REF_NOT_EARLIER: "6.6",
}
#: The audit decisions with which a split leaves the live set (all others keep it live).
DEPARTURES = frozenset(
    {
        RecoveryDecision.DROPPED_REMOVED_SUBSCRIPTION,
        RecoveryDecision.DROPPED_FINISHED,
        RecoveryDecision.DROPPED_UNKNOWN,
        RecoveryDecision.DROPPED_BY_OPERATOR,
        RecoveryDecision.FINISHED,
        RecoveryDecision.REPLACED,
        RecoveryDecision.MOVED,
    }
)


class RestoreKind(enum.Enum):
    """Which restore inside a run an in-run check proves."""

    GLOBAL_RESTORE = "global_restore"  # every reader restarts from a checkpoint (open, abort, explicit)
    RESCALE = "rescale"  # a global restore at another parallelism (rule 2.8)
    PARTIAL_FAILOVER = "partial_failover"  # named readers restart from their last good state (rule 1.3)
    REGION_FALLBACK = "region_fallback"  # a regional checkpoint's failed regions re-register (rule 2.1)

    @property
    def words(self) -> str:
        return self.value.replace("_", " ")


@dataclass(frozen=True, slots=True)
class RestartCheck:
    """One in-run check: which restore, of which checkpoint's state, which readers, which rules, verdict.

    ``checkpoint_id``: the checkpoint whose state was restored (a failover: the checkpoint the
    readers' last good states live in; None: no checkpoint yet). ``epoch``: the epoch that reads
    next. ``notes``: what the restore reported without it being a violation (an external position
    that disagreed with the checkpoint, protocol rule 3.3).
    """

    restore: RestoreKind
    checkpoint_id: int | None
    epoch: int
    readers: tuple[int, ...]
    rules: tuple[str, ...]
    violations: tuple[Violation, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.violations

    @property
    def verdict(self) -> str:
        return "passed" if self.passed else "failed"

    @property
    def failed_rules(self) -> tuple[str, ...]:
        return tuple(sorted({RULE_OF[v.kind] for v in self.violations}))

    def line(self) -> str:
        """One sentence: ``global restore of checkpoint 7 (readers 0-3), before epoch 8: rules 6.1, ...
        passed``; a failure names the first violations."""
        what = self.restore.words
        origin = "no checkpoint" if self.checkpoint_id is None else f"checkpoint {self.checkpoint_id}"
        readers = _readers_text(self.readers)
        head = f"{what} of {origin} ({readers}), before epoch {self.epoch}: rules {', '.join(self.rules)}"
        if self.passed:
            return f"{head} passed" + (f" (noted: {'; '.join(self.notes)})" if self.notes else "")
        shown = "; ".join(f"rule {RULE_OF[v.kind]} {v}" for v in self.violations[:3])
        more = f" (and {len(self.violations) - 3} more)" if len(self.violations) > 3 else ""
        return f"{head}: FAILED: {shown}{more}"


class RestartCheckError(StateError):
    """An in-run restart check failed: the restored state breaks a protocol section 6 rule. The run
    stops before anything is read from it. The code stays STATE_ERROR; ``params`` hold the
    :class:`RestartCheck` (``check``), the rule, the split ids and the checkpoint."""


def restart_check_error(check: RestartCheck, pipeline: str) -> RestartCheckError:
    """The error a failed ``check`` stops the run with: the rule, the splits, the checkpoint, what to do."""
    first = check.violations[0]
    origin = "no checkpoint" if check.checkpoint_id is None else f"checkpoint {check.checkpoint_id}"
    splits = ", ".join(first.split_ids[:10]) or "none named"
    message = (
        f"pipeline {pipeline!r}: the {check.restore.words} of {origin} is not proven: protocol rule "
        f"{RULE_OF[first.kind]} ({first.kind.value}) fails for split(s) {splits}: {first.detail}"
    )
    if len(check.violations) > 1:
        message += f" (and {len(check.violations) - 1} more violation(s): " + "; ".join(
            str(v) for v in check.violations[1:4]
        )
        message += ")"
    message += (
        ". The run stopped before reading anything from this state; nothing after "
        f"{origin} was committed by it. 'splitkeeper validate' shows the restart checks of the "
        "latest checkpoint, and 'splitkeeper recover --checkpoint N --rewind' goes back to an "
        "earlier checkpoint that passes them"
    )
    return RestartCheckError(
        message,
        check=check,
        rule=RULE_OF[first.kind],
        kind=first.kind.value,
        split_ids=first.split_ids,
        checkpoint_id=check.checkpoint_id,
        checkpoint_ids=first.checkpoint_ids,
    )


def _readers_text(readers: Sequence[int]) -> str:
    if not readers:
        return "no reader"
    ids = sorted(readers)
    if len(ids) == 1:
        return f"reader {ids[0]}"
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"readers {ids[0]}-{ids[-1]}"
    return "readers " + ", ".join(map(str, ids))


# --------------------------------------------------------------------------- what must be live


def checkpoint_split_ids(checkpoint: CompletedCheckpoint) -> set[str]:
    """Every split a restore of ``checkpoint`` starts from: its regions' states and its enumerator
    snapshot's pool, owners and quarantine (finished ones are not live and are not listed there)."""
    ids = {split.split_id for state in checkpoint.regions.values() for split in state.splits}
    snapshot = checkpoint.enumerator
    if snapshot is not None:
        ids.update(s.split_id for s in snapshot.pool)
        ids.update(s.split_id for s in snapshot.quarantined)
        for splits in snapshot.assignments.values():
            ids.update(s.split_id for s in splits)
    return ids


def placed_split_ids(enumerator: SplitEnumerator) -> set[str]:
    """Every split the enumerator places now: pooled, owned or quarantined."""
    return set(enumerator.owners()) | set(enumerator.quarantined)


# --------------------------------------------------------------------------- the check


def check_restart(
    restore: RestoreKind,
    enumerator: SplitEnumerator,
    reading: Mapping[int, Iterable[str]],
    *,
    must_be_live: Collection[str],
    audit_mark: int,
    checkpoint_id: int | None,
    epoch: int,
    readers: Sequence[int],
    refs: Mapping[int, Collection[int]],
    max_consecutive_failures: int,
    notes: Sequence[str] = (),
) -> RestartCheck:
    """Protocol section 6 (but 6.4) on the state a restore left (see the module doc).

    ``reading``: per reader, the ids of the splits it reads now (the driver's reader views).
    ``must_be_live``: the splits that were live before the restore (rule 3 of the module doc);
    those the audit trail records leaving since index ``audit_mark`` are let go. ``refs``: the
    checkpoints the run refers to (the restored one's chain and those completed since), each
    with the ids its regions fall back to.
    """
    parallelism = enumerator.context.parallelism
    ownership = enumerator.assignment()
    quarantined = tuple(enumerator.quarantined.values())
    placed = Assignment(readers=ownership.readers, pool=(*ownership.pool, *quarantined))
    departed = enumerator.departed_since(audit_mark, DEPARTURES)
    live = [sid for sid in must_be_live if sid not in departed]
    registered = range(parallelism)
    found: list[Violation] = check_ownership(placed, live, registered)
    found += check_reader_views(ownership, reading)
    found += check_finished_not_assigned(ownership, enumerator.finished_split_ids)
    if enumerator.subscriptions is not None:
        found += check_subscriptions(ownership, enumerator.subscriptions)
    strategy = enumerator.strategy
    if strategy.balanced and enumerator.reassign_on_recovery and not enumerator.pending_readers:
        if isinstance(strategy, WeightedStrategy):
            found += check_balance(
                ownership,
                readers=registered,
                weights={
                    s.split_id: strategy.weight(s.split_id) for ss in ownership.readers.values() for s in ss
                },
                capacities={r: strategy.capacity(r) for r in registered},
            )
        else:
            found += check_balance(ownership, readers=registered)
    found += check_ref_chains(refs, max_consecutive_failures)
    return RestartCheck(
        restore=restore,
        checkpoint_id=checkpoint_id,
        epoch=epoch,
        readers=tuple(sorted(readers)),
        rules=IN_RUN_RULES,
        violations=tuple(found),
        notes=tuple(notes),
    )
