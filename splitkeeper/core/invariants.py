"""The protocol section 6 invariants, as pure functions: the one place each rule is decided.

The simulator, the Spark runtime, ``splitkeeper validate`` and the Great
Expectations suites all call these; none of them re-implements a rule. Every
check returns a list of :class:`Violation` (empty when the rule holds) and
never raises on a violation; :func:`raise_if_violations` turns a list into an
:class:`~splitkeeper.errors.InvariantViolation` for callers that must stop.

The balance rules (:func:`count_spread`, :func:`weighted_deviations`) are also
what the balanced assignment strategies use as their stopping criterion, so
the strategies and the checks cannot disagree.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from splitkeeper.core.types import Assignment, EnumeratorSnapshot, Split
from splitkeeper.errors import InvariantViolation

#: Balanced count strategies keep every reader's split count within this of every other reader's.
COUNT_TOLERANCE = 1


class ViolationKind(enum.Enum):
    OWNED_MORE_THAN_ONCE = "owned_more_than_once"
    NOT_OWNED = "not_owned"  # a known live split is in neither the pool nor a reader: lost
    FINISHED_ASSIGNED = "finished_assigned"
    REMOVED_SUBSCRIPTION = "removed_subscription"
    UNBALANCED = "unbalanced"
    WEIGHT_UNBALANCED = "weight_unbalanced"
    REF_CHAIN_TOO_DEEP = "ref_chain_too_deep"
    REF_MISSING = "ref_missing"  # a checkpoint refers to one that is not kept: retention broke a chain
    REF_NOT_EARLIER = "ref_not_earlier"  # a checkpoint refers to itself or a later one
    OFFSET_DUPLICATE = "offset_duplicate"
    OFFSET_MISSING = "offset_missing"
    OFFSET_UNEXPECTED = "offset_unexpected"  # outside [start, committed) or for an unknown split
    CONTENT_MISMATCH = "content_mismatch"  # a finished split's committed values are not its data's


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: what kind, which splits (sorted ids), and a sentence saying how."""

    kind: ViolationKind
    split_ids: tuple[str, ...]
    detail: str

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}"


def raise_if_violations(violations: Iterable[Violation], context: str = "") -> None:
    """Raise InvariantViolation listing every violation; do nothing for an empty list."""
    found = list(violations)
    if not found:
        return
    prefix = f"{context}: " if context else ""
    lines = "; ".join(str(v) for v in found[:10])
    more = f" (and {len(found) - 10} more)" if len(found) > 10 else ""
    raise InvariantViolation(
        f"{prefix}{len(found)} invariant violation(s): {lines}{more}", violations=tuple(found)
    )


def _ids(ids: Iterable[str], limit: int = 20) -> str:
    shown = sorted(ids)
    text = ", ".join(shown[:limit])
    return text + (f", ... ({len(shown)} in all)" if len(shown) > limit else "")


def _owners_view(
    state: Assignment | EnumeratorSnapshot,
) -> tuple[Mapping[int, Iterable[Split]], Iterable[Split]]:
    if isinstance(state, EnumeratorSnapshot):
        return state.assignments, state.pool
    return state.readers, state.pool


# ---------------------------------------------------------------------------------------------
# Ownership (protocol rules 1.1, 6.1)


def check_ownership(
    state: Assignment | EnumeratorSnapshot, known_live: Collection[str] | None = None
) -> list[Violation]:
    """Every split appears once (pool or one reader); every known live split appears.

    ``known_live`` is the caller's independent list of splits that must exist
    (discovered, not finished, subscribed); without it only duplicates are
    checked.
    """
    readers, pool = _owners_view(state)
    places: dict[str, list[str]] = defaultdict(list)
    for split in pool:
        places[split.split_id].append("pool")
    for reader_id in sorted(readers):
        for split in readers[reader_id]:
            places[split.split_id].append(f"reader {reader_id}")
    violations = [
        Violation(
            ViolationKind.OWNED_MORE_THAN_ONCE,
            (split_id,),
            f"split {split_id} is owned {len(where)} times ({', '.join(where)})",
        )
        for split_id, where in sorted(places.items())
        if len(where) > 1
    ]
    if known_live is not None:
        missing = [s for s in known_live if s not in places]
        if missing:
            violations.append(
                Violation(
                    ViolationKind.NOT_OWNED,
                    tuple(sorted(missing)),
                    f"{len(missing)} live split(s) neither pooled nor owned: {_ids(missing)}",
                )
            )
    return violations


def check_finished_not_assigned(
    state: Assignment | EnumeratorSnapshot, finished: Collection[str] | None = None
) -> list[Violation]:
    """No finished split is pooled or owned. ``finished`` defaults to the snapshot's own set."""
    if finished is None:
        finished = state.finished if isinstance(state, EnumeratorSnapshot) else frozenset()
    finished_set = set(finished)
    readers, pool = _owners_view(state)
    bad = [s.split_id for s in pool if s.split_id in finished_set]
    for reader_id in readers:
        bad.extend(s.split_id for s in readers[reader_id] if s.split_id in finished_set)
    if not bad:
        return []
    return [
        Violation(
            ViolationKind.FINISHED_ASSIGNED,
            tuple(sorted(bad)),
            f"{len(bad)} finished split(s) still pooled or assigned: {_ids(bad)}",
        )
    ]


def check_subscriptions(
    state: Assignment | EnumeratorSnapshot, subscriptions: Collection[str]
) -> list[Violation]:
    """No pooled or owned split belongs to a subscription outside ``subscriptions``."""
    allowed = set(subscriptions)
    readers, pool = _owners_view(state)
    bad = [s.split_id for s in pool if s.subscription not in allowed]
    for reader_id in readers:
        bad.extend(s.split_id for s in readers[reader_id] if s.subscription not in allowed)
    if not bad:
        return []
    return [
        Violation(
            ViolationKind.REMOVED_SUBSCRIPTION,
            tuple(sorted(bad)),
            f"{len(bad)} split(s) of removed subscriptions survive "
            f"(subscribed: {sorted(allowed)}): {_ids(bad)}",
        )
    ]


# ---------------------------------------------------------------------------------------------
# Balance (protocol rules 1.6, 6.5)


def count_spread(loads: Mapping[int, int]) -> int:
    """max - min split count over the readers given (0 for no readers)."""
    if not loads:
        return 0
    values = loads.values()
    return max(values) - min(values)


def weighted_deviations(
    loads: Mapping[int, float], capacities: Mapping[int, float] | Callable[[int], float] | None = None
) -> dict[int, float]:
    """Per reader, weighted load minus its fair share.

    The fair share of reader ``r`` is ``total_weight * capacity(r) / total_capacity``
    over the readers given. Positive means over-loaded.
    """
    if not loads:
        return {}
    if capacities is None:
        caps = dict.fromkeys(loads, 1.0)
    elif callable(capacities):
        caps = {r: capacities(r) for r in loads}
    else:
        caps = {r: capacities.get(r, 1.0) for r in loads}
    total = sum(loads.values())
    total_capacity = sum(caps.values())
    return {r: loads[r] - total * caps[r] / total_capacity for r in loads}


def weighted_bound_tolerance(max_split_weight: float, total_weight: float) -> float:
    """How far from its fair share a reader's weighted load may be: one (largest) split."""
    return max_split_weight + 1e-9 * max(1.0, total_weight)


def check_balance(
    state: Assignment | EnumeratorSnapshot,
    *,
    readers: Collection[int] | None = None,
    weights: Mapping[str, float] | None = None,
    capacities: Mapping[int, float] | None = None,
) -> list[Violation]:
    """Balanced strategies: counts within COUNT_TOLERANCE, or weighted loads within one split of fair.

    ``readers`` lists the readers that must be counted even when they own
    nothing (default: the readers present in ``state``). Without ``weights``
    the count rule applies; with them (split id -> weight, default 1.0) each
    reader's weighted load must be within the largest split weight of its
    fair share given ``capacities`` (reader -> capacity, default 1.0).
    """
    owned, _pool = _owners_view(state)
    reader_ids = sorted(set(owned) | set(readers or ()))
    if not reader_ids:
        return []
    if weights is None:
        loads = {r: len(tuple(owned.get(r, ()))) for r in reader_ids}
        spread = count_spread(loads)
        if spread <= COUNT_TOLERANCE:
            return []
        hi = max(reader_ids, key=lambda r: (loads[r], -r))
        lo = min(reader_ids, key=lambda r: (loads[r], r))
        return [
            Violation(
                ViolationKind.UNBALANCED,
                (),
                f"split counts differ by {spread} (reader {hi} has {loads[hi]}, reader {lo} has "
                f"{loads[lo]}); balanced strategies keep them within {COUNT_TOLERANCE}",
            )
        ]
    wloads: dict[int, float] = {}
    max_weight = 0.0
    for r in reader_ids:
        total = 0.0
        for split in owned.get(r, ()):
            w = weights.get(split.split_id, 1.0)
            total += w
            max_weight = max(max_weight, w)
        wloads[r] = total
    deviations = weighted_deviations(wloads, capacities)
    tolerance = weighted_bound_tolerance(max_weight, sum(wloads.values()))
    return [
        Violation(
            ViolationKind.WEIGHT_UNBALANCED,
            (),
            f"reader {r} weighted load {wloads[r]:.6g} is {dev:+.6g} from its fair share; "
            f"allowed: within the largest split weight {max_weight:.6g}",
        )
        for r, dev in sorted(deviations.items())
        if abs(dev) > tolerance
    ]


# ---------------------------------------------------------------------------------------------
# Regional checkpoint ref chains (protocol rules 2.2, 2.7, 6.6)


def ref_chain_depths(refs: Mapping[int, Collection[int]]) -> dict[int, int]:
    """Depth of each checkpoint's ref chain: 0 for a global one, else 1 + the deepest ref.

    ``refs`` maps every kept checkpoint id to the ids its failed regions refer
    to. Refs to checkpoints missing from ``refs``, or not earlier, count as
    depth 0 here; :func:`check_ref_chains` reports them.
    """
    depths: dict[int, int] = {}
    for cid in sorted(refs):  # refs point to earlier ids, so ascending order sees them first
        valid = [r for r in refs[cid] if r < cid and r in depths]
        depths[cid] = 0 if not refs[cid] else 1 + max((depths[r] for r in valid), default=0)
    return depths


def check_ref_chains(
    refs: Mapping[int, Collection[int]],
    max_consecutive_failures: int,
    depths: Mapping[int, int] | None = None,
) -> list[Violation]:
    """Ref chains no deeper than ``max_consecutive_failures``, and never broken by retention.

    ``depths`` maps each checkpoint id to its depth as the checkpoint store defines it
    (``CheckpointStore.chain_depth``: the deepest ``RegionState.ref_depth``, i.e. how many
    times one region's state was fallen back to in a row). That is protocol rule 6.6's bound and
    what callers holding the checkpoints should pass. Without it the whole-checkpoint chain
    length (:func:`ref_chain_depths`) is bounded instead, which over-counts after an aborted
    forced global (a later regional checkpoint may refer to an older regional one through
    another region).
    """
    violations: list[Violation] = []
    for cid in sorted(refs):
        for ref in sorted(refs[cid]):
            if ref >= cid:
                violations.append(
                    Violation(
                        ViolationKind.REF_NOT_EARLIER,
                        (),
                        f"checkpoint {cid} refers to checkpoint {ref}; "
                        "refs must point to earlier checkpoints",
                    )
                )
            elif ref not in refs:
                violations.append(
                    Violation(
                        ViolationKind.REF_MISSING,
                        (),
                        f"checkpoint {cid} refers to checkpoint {ref}, which is not kept "
                        "(retention must never break a chain)",
                    )
                )
    measured = ref_chain_depths(refs) if depths is None else dict(depths)
    for cid, depth in sorted(measured.items()):
        if depth > max_consecutive_failures:
            violations.append(
                Violation(
                    ViolationKind.REF_CHAIN_TOO_DEEP,
                    (),
                    f"checkpoint {cid} has a ref chain of depth {depth}; "
                    f"max_consecutive_failures={max_consecutive_failures}",
                )
            )
    return violations


# ---------------------------------------------------------------------------------------------
# Sink offsets (protocol rule 6.4)


def _spans_text(spans: list[tuple[int, int]]) -> str:
    """Half-open spans [a, b), merged, shown as offsets: ``3`` or ``5-9`` (inclusive)."""
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    parts = [f"{a}" if b == a + 1 else f"{a}-{b - 1}" for a, b in merged]
    shown = parts[:8]
    return ", ".join(shown) + (f", ... ({len(parts)} ranges)" if len(parts) > 8 else "")


def check_sink_ranges(
    records: Iterable[tuple[str, int, int]],
    start_positions: Mapping[str, int],
    committed_positions: Mapping[str, int],
) -> list[Violation]:
    """Per split, the sink's records cover ``[start, committed)`` exactly once, and nothing else.

    ``records`` are ``(split_id, offset, next_offset)`` triples read from the
    sink: each record covers the source offsets ``[offset, next_offset)`` (one
    Kafka offset, or the byte range of a line in a file). ``committed_positions``
    are the next offsets to read per split in the latest completed checkpoint;
    ``start_positions`` where reading began (default 0). Offsets covered twice
    are OFFSET_DUPLICATE, uncovered ones OFFSET_MISSING, records (or parts)
    outside the range or of splits without a committed position
    OFFSET_UNEXPECTED. Splits in ``committed_positions`` with no records are
    checked too.
    """
    by_split: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for split_id, offset, next_offset in records:
        by_split[split_id].append((offset, next_offset))
    violations: list[Violation] = []
    for split_id in sorted(set(by_split) | set(committed_positions)):
        spans = sorted(by_split.get(split_id, ()))
        if split_id not in committed_positions:
            violations.append(
                Violation(
                    ViolationKind.OFFSET_UNEXPECTED,
                    (split_id,),
                    f"split {split_id}: {len(spans)} sink record(s) but no committed position",
                )
            )
            continue
        start = start_positions.get(split_id, 0)
        end = committed_positions[split_id]
        outside: list[tuple[int, int]] = []
        twice: list[tuple[int, int]] = []
        gaps: list[tuple[int, int]] = []
        covered_to = start
        for offset, next_offset in spans:
            if next_offset <= offset:
                outside.append((offset, offset + 1))
                continue
            if offset < start:
                outside.append((offset, min(next_offset, start)))
            if next_offset > end:
                outside.append((max(offset, end), next_offset))
            lo, hi = max(offset, start), min(next_offset, end)
            if lo >= hi:
                continue
            if lo < covered_to:
                twice.append((lo, min(hi, covered_to)))
            elif lo > covered_to:
                gaps.append((covered_to, lo))
            covered_to = max(covered_to, hi)
        if covered_to < end:
            gaps.append((covered_to, end))
        if twice:
            violations.append(
                Violation(
                    ViolationKind.OFFSET_DUPLICATE,
                    (split_id,),
                    f"split {split_id}: offsets written more than once: {_spans_text(twice)}",
                )
            )
        if outside:
            violations.append(
                Violation(
                    ViolationKind.OFFSET_UNEXPECTED,
                    (split_id,),
                    f"split {split_id}: offsets outside [{start}, {end}): {_spans_text(outside)}",
                )
            )
        if gaps:
            missing = sum(b - a for a, b in gaps)
            violations.append(
                Violation(
                    ViolationKind.OFFSET_MISSING,
                    (split_id,),
                    f"split {split_id}: {missing} offset(s) missing in [{start}, {end}): {_spans_text(gaps)}",
                )
            )
    return violations


def check_sink_offsets(
    records: Iterable[tuple[str, int]],
    start_positions: Mapping[str, int],
    committed_positions: Mapping[str, int],
) -> list[Violation]:
    """:func:`check_sink_ranges` for one offset per record (Kafka): ``(split_id, offset)`` pairs."""
    return check_sink_ranges(
        ((split_id, offset, offset + 1) for split_id, offset in records), start_positions, committed_positions
    )


# ---------------------------------------------------------------------------------------------
# All enumerator-state rules at once


def check_enumerator_state(
    state: Assignment | EnumeratorSnapshot,
    *,
    known_live: Collection[str] | None = None,
    finished: Collection[str] | None = None,
    subscriptions: Collection[str] | None = None,
    balanced: bool = False,
    readers: Collection[int] | None = None,
    weights: Mapping[str, float] | None = None,
    capacities: Mapping[int, float] | None = None,
) -> list[Violation]:
    """Ownership, finished, subscription and (when ``balanced``) balance rules on one state.

    For a snapshot, ``finished`` and ``subscriptions`` default to the
    snapshot's own sets (an empty subscription set means "not restricted").
    """
    violations = check_ownership(state, known_live)
    violations += check_finished_not_assigned(state, finished)
    if subscriptions is None and isinstance(state, EnumeratorSnapshot) and state.subscriptions:
        subscriptions = state.subscriptions
    if subscriptions is not None:
        violations += check_subscriptions(state, subscriptions)
    if balanced:
        violations += check_balance(state, readers=readers, weights=weights, capacities=capacities)
    return violations
