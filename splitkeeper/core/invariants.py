"""The protocol section 6 invariants, as pure functions: the one place each rule is decided.

The simulator, the Spark runtime and the restart checks (``splitkeeper validate``,
:mod:`splitkeeper.quality.checks`) all call these; none of them re-implements a rule.
The restart checks build plain values from the state history's Arrow tables and a
per-split summary of the sink (:class:`SinkSplitSummary`), call these functions, and
hand the verdicts to the Great Expectations suites, which only report them. Every
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
    DEAD_LETTER_OVERLAP = "dead_letter_overlap"  # an offset both in the sink and in the dead-letter table
    FILTERED_OVERLAP = "filtered_overlap"  # an offset in a filtered range and in the sink or dead letters
    FOLD_MISMATCH = "fold_mismatch"  # an upsert sink's keyed table is not the fold of its change table


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: what kind, which splits (sorted ids), and a sentence saying how."""

    kind: ViolationKind
    split_ids: tuple[str, ...]
    detail: str
    reader_ids: tuple[int, ...] = ()  # the readers a balance rule names
    checkpoint_ids: tuple[int, ...] = ()  # the checkpoints a ref-chain rule names

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
    """(reader -> owned splits, the unowned live splits: the pool and, in a snapshot, the quarantined)."""
    if isinstance(state, EnumeratorSnapshot):
        return state.assignments, (*state.pool, *state.quarantined)
    return state.readers, state.pool


# ---------------------------------------------------------------------------------------------
# Ownership (protocol rules 1.1, 6.1)


def check_ownership(
    state: Assignment | EnumeratorSnapshot,
    known_live: Collection[str] | None = None,
    registered: Collection[int] | None = None,
) -> list[Violation]:
    """Every split appears once (pool, quarantine or one reader); every known live split appears.

    ``known_live`` is the caller's independent list of splits that must exist
    (discovered, not finished, subscribed); without it only duplicates are
    checked. ``registered``: the readers that exist; a split owned by another
    reader is read by nobody (NOT_OWNED). Without it every owner counts.
    """
    readers, pool = _owners_view(state)
    quarantined = {s.split_id for s in state.quarantined} if isinstance(state, EnumeratorSnapshot) else set()
    places: dict[str, list[str]] = defaultdict(list)
    for split in pool:
        places[split.split_id].append("quarantined" if split.split_id in quarantined else "pool")
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
    if registered is not None:
        allowed = set(registered)
        for reader_id in sorted(set(readers) - allowed):
            orphans = sorted({s.split_id for s in readers[reader_id]})
            if orphans:
                violations.append(
                    Violation(
                        ViolationKind.NOT_OWNED,
                        tuple(orphans),
                        f"{len(orphans)} split(s) owned by reader {reader_id}, which is not registered "
                        f"(readers: {sorted(allowed)}): {_ids(orphans)}",
                    )
                )
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


def check_reader_views(state: Assignment, reading: Mapping[int, Iterable[str]]) -> list[Violation]:
    """Rule 6.1's second half: each reader reads exactly the splits the enumerator says it owns.

    ``reading`` maps each reader to the ids of the splits it reads (the driver's reader views).
    A split its owner does not read is read by nobody (NOT_OWNED); a split a reader reads that
    the enumerator pools or gives another reader may be read twice (OWNED_MORE_THAN_ONCE).
    """
    owner = state.owner_of()
    unread: dict[int, list[str]] = {}
    stray: list[tuple[str, int, int | None]] = []
    reads: dict[int, set[str]] = {r: set(ids) for r, ids in reading.items()}
    for reader_id, splits in state.readers.items():
        mine = reads.get(reader_id, set())
        missing = [s.split_id for s in splits if s.split_id not in mine]
        if missing:
            unread[reader_id] = missing
    for reader_id, ids in sorted(reads.items()):
        for split_id in sorted(ids):
            placed = owner.get(split_id, -1)
            if placed != reader_id:
                stray.append((split_id, reader_id, placed))
    violations = [
        Violation(
            ViolationKind.NOT_OWNED,
            tuple(sorted(ids)),
            f"{len(ids)} split(s) owned by reader {reader_id} that reader {reader_id} does not read: "
            f"{_ids(ids)}",
            reader_ids=(reader_id,),
        )
        for reader_id, ids in sorted(unread.items())
    ]
    for split_id, reader_id, placed in stray:
        where = "the pool" if placed is None else ("no place" if placed == -1 else f"reader {placed}")
        violations.append(
            Violation(
                ViolationKind.OWNED_MORE_THAN_ONCE,
                (split_id,),
                f"split {split_id} is read by reader {reader_id}, but the enumerator places it in {where}",
                reader_ids=(reader_id,),
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
        over = tuple(r for r in reader_ids if loads[r] - loads[lo] > COUNT_TOLERANCE)
        return [
            Violation(
                ViolationKind.UNBALANCED,
                (),
                f"split counts differ by {spread} (reader {hi} has {loads[hi]}, reader {lo} has "
                f"{loads[lo]}); balanced strategies keep them within {COUNT_TOLERANCE}",
                reader_ids=over,
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
            reader_ids=(r,),
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


def _ref_violation(
    checkpoint_id: int, ref: int, kept: Collection[int], split_ids: tuple[str, ...] = (), where: str = ""
) -> Violation | None:
    """REF_NOT_EARLIER or REF_MISSING for one ref of checkpoint ``checkpoint_id``; None when sound."""
    if ref >= checkpoint_id:
        return Violation(
            ViolationKind.REF_NOT_EARLIER,
            split_ids,
            f"checkpoint {checkpoint_id}{where} refers to checkpoint {ref}; "
            "refs must point to earlier checkpoints",
            checkpoint_ids=(checkpoint_id,),
        )
    if ref not in kept:
        return Violation(
            ViolationKind.REF_MISSING,
            split_ids,
            f"checkpoint {checkpoint_id}{where} refers to checkpoint {ref}, which is not kept "
            "(retention must never break a chain)",
            checkpoint_ids=(checkpoint_id,),
        )
    return None


def _depth_violation(
    checkpoint_id: int,
    depth: int,
    max_consecutive_failures: int,
    split_ids: tuple[str, ...] = (),
    where: str = "",
) -> Violation | None:
    """REF_CHAIN_TOO_DEEP when ``depth`` exceeds ``max_consecutive_failures``, else None."""
    if depth <= max_consecutive_failures:
        return None
    return Violation(
        ViolationKind.REF_CHAIN_TOO_DEEP,
        split_ids,
        f"checkpoint {checkpoint_id}{where} has a ref chain of depth {depth}; "
        f"max_consecutive_failures={max_consecutive_failures}",
        checkpoint_ids=(checkpoint_id,),
    )


def check_ref_chains(
    refs: Mapping[int, Collection[int]],
    max_consecutive_failures: int,
    depths: Mapping[int, int] | None = None,
) -> list[Violation]:
    """Ref chains no deeper than ``max_consecutive_failures``, and never broken by retention.

    The bound is the whole checkpoint's chain (protocol rule 6.6; the FLIP-600 thread: "the
    reference chain can only grow as deep as maxConsecutiveFailures"): :func:`ref_chain_depths`
    of ``refs``, which is what ``CheckpointStore.chain_depth`` measures. ``depths`` (checkpoint
    id -> chain depth) stands in for it when the caller holds only part of a chain (the depths
    of its oldest checkpoints measured where the whole chain was known). Per region, with the
    region's splits named: :func:`check_region_ref`.
    """
    violations: list[Violation] = []
    for cid in sorted(refs):
        for ref in sorted(refs[cid]):
            found = _ref_violation(cid, ref, refs)
            if found is not None:
                violations.append(found)
    measured = ref_chain_depths(refs) if depths is None else dict(depths)
    for cid, depth in sorted(measured.items()):
        too_deep = _depth_violation(cid, depth, max_consecutive_failures)
        if too_deep is not None:
            violations.append(too_deep)
    return violations


def region_chain_depth(ref_checkpoint_id: int | None, depths: Mapping[int, int]) -> int:
    """The chain depth of one region's state: 0 when it acknowledged its checkpoint, else one hop
    more than the checkpoint it falls back to (``depths``: :func:`ref_chain_depths`)."""
    return 0 if ref_checkpoint_id is None else 1 + depths.get(ref_checkpoint_id, 0)


def check_region_ref(
    checkpoint_id: int,
    region_id: int,
    ref_checkpoint_id: int | None,
    chain_depth: int,
    kept: Collection[int],
    max_consecutive_failures: int,
    split_ids: Iterable[str] = (),
) -> list[Violation]:
    """Rule 6.6 for one region's state in checkpoint ``checkpoint_id``: the rules of
    :func:`check_ref_chains`, naming the region's splits.

    ``ref_checkpoint_id`` is None when the region acknowledged the checkpoint; ``chain_depth``
    the ref hops behind its state (:func:`region_chain_depth`); ``kept`` the ids of the
    checkpoints still kept.
    """
    ids = tuple(sorted(set(split_ids)))
    where = f" region {region_id}"
    found: list[Violation | None] = [
        _depth_violation(checkpoint_id, chain_depth, max_consecutive_failures, ids, where)
    ]
    if ref_checkpoint_id is not None:
        found.append(_ref_violation(checkpoint_id, ref_checkpoint_id, kept, ids, where))
    return [v for v in found if v is not None]


# ---------------------------------------------------------------------------------------------
# Sink offsets (protocol rule 6.4)

#: A half-open range of source offsets ``[start, end)``.
Span = tuple[int, int]


def _spans_text(spans: Iterable[Span]) -> str:
    """Half-open spans [a, b), merged, shown as offsets: ``3`` or ``5-9`` (inclusive)."""
    parts = [f"{a}" if b == a + 1 else f"{a}-{b - 1}" for a, b in merge_spans(spans)]
    shown = parts[:8]
    return ", ".join(shown) + (f", ... ({len(parts)} ranges)" if len(parts) > 8 else "")


def merge_spans(spans: Iterable[Span]) -> tuple[Span, ...]:
    """Non-empty spans merged where they overlap or touch, ascending."""
    merged: list[list[int]] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return tuple((a, b) for a, b in merged)


def _minus(spans: Iterable[Span], cut: Iterable[Span]) -> list[Span]:
    """The parts of ``spans`` outside every span of ``cut`` (both merged first)."""
    holes = merge_spans(cut)
    out: list[Span] = []
    for a, b in merge_spans(spans):
        lo = a
        for c, d in holes:
            if d <= lo or c >= b:
                continue
            if c > lo:
                out.append((lo, c))
            lo = max(lo, d)
        if lo < b:
            out.append((lo, b))
    return out


def _within(spans: Iterable[Span], lo: int, hi: int) -> list[Span]:
    return [(max(a, lo), min(b, hi)) for a, b in spans if min(b, hi) > max(a, lo)]


@dataclass(frozen=True, slots=True)
class SinkSplitSummary:
    """What the sink holds of one split, summarised: all rule 6.4 needs, however many records.

    ``islands``: the offsets the records cover, as merged spans (records that overlap or
    touch form one island). ``duplicates``: the offsets covered more than once (spans; a
    reader may pass only the first few). ``malformed``: offsets of records that end where
    or before they start (``next_offset <= offset``; not part of any island). Built from
    records by :func:`summarize_sink_records`, or by the restart checks in Spark SQL.

    With a dead-letter table (``errors.tolerance: all``) the summary is of the sink and the
    dead letters TOGETHER: ``records`` and ``islands`` count both, ``dead_letters`` how many
    of the records are dead letters, ``duplicates`` the offsets covered twice within one
    table, ``overlaps`` the offsets covered by both a sink record and a dead letter.

    With the ranges a Spark transform filtered out (the ``filtered_offsets`` table) the islands
    cover those too: ``filtered`` is how many ranges (not counted in ``records``),
    ``filtered_overlaps`` the offsets both in a filtered range and in a record or dead letter.
    """

    split_id: str
    records: int
    islands: tuple[Span, ...] = ()
    duplicates: tuple[Span, ...] = ()
    malformed: tuple[int, ...] = ()
    dead_letters: int = 0
    overlaps: tuple[Span, ...] = ()
    filtered: int = 0
    filtered_overlaps: tuple[Span, ...] = ()


def _covered_twice(spans: Iterable[Span]) -> list[Span]:
    """The parts of the (non-empty) ``spans`` that another of them covers too."""
    twice: list[Span] = []
    covered_to: int | None = None
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if covered_to is not None and a < covered_to:
            twice.append((a, min(b, covered_to)))
        covered_to = b if covered_to is None else max(covered_to, b)
    return twice


def summarize_sink_records(
    records: Iterable[tuple[str, int, int]],
    dead_letters: Iterable[tuple[str, int, int]] = (),
    filtered: Iterable[tuple[str, int, int]] = (),
) -> dict[str, SinkSplitSummary]:
    """Per split, the :class:`SinkSplitSummary` of ``(split_id, offset, next_offset)`` records of the
    sink and of the dead-letter table (``dead_letters``), together; ``filtered``: the
    ``(split_id, start_offset, end_offset)`` ranges a Spark transform dropped (``filtered_offsets``)."""
    by_split: dict[str, list[Span]] = defaultdict(list)
    dead_by_split: dict[str, list[Span]] = defaultdict(list)
    filtered_by_split: dict[str, list[Span]] = defaultdict(list)
    for split_id, offset, next_offset in records:
        by_split[split_id].append((offset, next_offset))
    for split_id, offset, next_offset in dead_letters:
        dead_by_split[split_id].append((offset, next_offset))
    for split_id, start, end in filtered:
        filtered_by_split[split_id].append((start, end))
    summaries: dict[str, SinkSplitSummary] = {}
    for split_id in set(by_split) | set(dead_by_split) | set(filtered_by_split):
        sink, dead = by_split.get(split_id, []), dead_by_split.get(split_id, [])
        dropped = filtered_by_split.get(split_id, [])
        spans = sink + dead
        malformed = tuple(sorted(a for a, b in spans + dropped if b <= a))
        twice = _covered_twice(sink) + _covered_twice(dead) + _covered_twice(dropped)
        both = [
            part for a, b in merge_spans(dead) for part in _within(merge_spans(sink), a, b)
        ]  # merged per table: what each covers, then where they meet
        kept = merge_spans(spans)
        filtered_both = [part for a, b in merge_spans(dropped) for part in _within(kept, a, b)]
        summaries[split_id] = SinkSplitSummary(
            split_id,
            len(spans),
            merge_spans(spans + dropped),
            merge_spans(twice),
            malformed,
            dead_letters=len(dead),
            overlaps=merge_spans(both),
            filtered=len(dropped),
            filtered_overlaps=merge_spans(filtered_both),
        )
    return summaries


@dataclass(frozen=True, slots=True)
class SinkSplitVerdict:
    """Rule 6.4 decided for one split (:func:`judge_sink_split`): what is wrong, by where it is.

    Among the records themselves: ``duplicates`` (offsets written twice), ``gaps`` (offsets
    missing between two records, other than a range reported lost), ``malformed`` (records
    ending where they start). Against the checkpoint: ``known`` (False: records of a split
    the checkpoint does not know), ``ends`` (offsets missing before the first record or after
    the last one, up to the committed position), ``outside`` (offsets written before the
    start, past the committed position, or inside a range reported lost).
    """

    split_id: str
    start: int
    end: int | None
    known: bool
    records: int
    duplicates: tuple[Span, ...] = ()
    gaps: tuple[Span, ...] = ()
    malformed: tuple[int, ...] = ()
    ends: tuple[Span, ...] = ()
    outside: tuple[Span, ...] = ()
    overlaps: tuple[Span, ...] = ()  # offsets both in the sink and in the dead-letter table
    filtered_overlaps: tuple[Span, ...] = ()  # offsets in a filtered range and in a record or dead letter

    @property
    def range_text(self) -> str:
        return f"[{self.start}, {'committed' if self.end is None else self.end})"

    def duplicate(self) -> Violation | None:
        if not self.duplicates:
            return None
        return Violation(
            ViolationKind.OFFSET_DUPLICATE,
            (self.split_id,),
            f"split {self.split_id}: offsets written more than once: {_spans_text(self.duplicates)}",
        )

    def overlap(self) -> Violation | None:
        """DEAD_LETTER_OVERLAP: offsets that are both a sink record and a dead letter (each record goes
        to exactly one of the two tables)."""
        if not self.overlaps:
            return None
        return Violation(
            ViolationKind.DEAD_LETTER_OVERLAP,
            (self.split_id,),
            f"split {self.split_id}: offsets both in the sink and in the dead-letter table: "
            f"{_spans_text(self.overlaps)}",
        )

    def filtered_overlap(self) -> Violation | None:
        """FILTERED_OVERLAP: offsets a Spark transform reported filtered out that are also a record or a
        dead letter (each offset is accounted once: sink, dead letters or filtered)."""
        if not self.filtered_overlaps:
            return None
        return Violation(
            ViolationKind.FILTERED_OVERLAP,
            (self.split_id,),
            f"split {self.split_id}: offsets both in a filtered range (filtered_offsets) and in the "
            f"records or dead letters: {_spans_text(self.filtered_overlaps)}",
        )

    def gap(self) -> Violation | None:
        """OFFSET_MISSING between two records (the per-record view of :meth:`missing`)."""
        if not self.gaps:
            return None
        return Violation(
            ViolationKind.OFFSET_MISSING,
            (self.split_id,),
            f"split {self.split_id}: {sum(b - a for a, b in self.gaps)} offset(s) missing between records "
            f"(not reported lost): {_spans_text(self.gaps)}",
        )

    def bad_record(self) -> Violation | None:
        """OFFSET_UNEXPECTED for records that end where they start."""
        if not self.malformed:
            return None
        return Violation(
            ViolationKind.OFFSET_UNEXPECTED,
            (self.split_id,),
            f"split {self.split_id}: {len(self.malformed)} record(s) with next_offset <= offset, at "
            f"{_spans_text((o, o + 1) for o in self.malformed)}",
        )

    def unexpected_end(self) -> Violation | None:
        """OFFSET_MISSING before the first record or after the last (the per-split view)."""
        if not self.ends:
            return None
        return Violation(
            ViolationKind.OFFSET_MISSING,
            (self.split_id,),
            f"split {self.split_id}: {sum(b - a for a, b in self.ends)} offset(s) missing in "
            f"{self.range_text} before the first or after the last record: {_spans_text(self.ends)}",
        )

    def unknown_or_outside(self) -> Violation | None:
        """OFFSET_UNEXPECTED for a split the checkpoint does not know, or offsets outside its range."""
        if not self.known:
            return Violation(
                ViolationKind.OFFSET_UNEXPECTED,
                (self.split_id,),
                f"split {self.split_id}: {self.records} sink record(s) but no committed position",
            )
        if not self.outside:
            return None
        return Violation(
            ViolationKind.OFFSET_UNEXPECTED,
            (self.split_id,),
            f"split {self.split_id}: offsets outside {self.range_text} (or inside a range reported lost): "
            f"{_spans_text(self.outside)}",
        )

    def violations(self) -> list[Violation]:
        """One violation per kind: OFFSET_DUPLICATE, DEAD_LETTER_OVERLAP, FILTERED_OVERLAP,
        OFFSET_UNEXPECTED, OFFSET_MISSING (in that order)."""
        found: list[Violation] = []
        for v in (self.duplicate(), self.overlap(), self.filtered_overlap()):
            if v is not None:
                found.append(v)
        if not self.known:
            unknown = self.unknown_or_outside()
            return [*found, *([unknown] if unknown is not None else [])]
        unexpected = [*self.outside, *((o, o + 1) for o in self.malformed)]
        if unexpected:
            found.append(
                Violation(
                    ViolationKind.OFFSET_UNEXPECTED,
                    (self.split_id,),
                    f"split {self.split_id}: offsets outside {self.range_text}: {_spans_text(unexpected)}",
                )
            )
        missing = [*self.gaps, *self.ends]
        if missing:
            found.append(
                Violation(
                    ViolationKind.OFFSET_MISSING,
                    (self.split_id,),
                    f"split {self.split_id}: {sum(b - a for a, b in missing)} offset(s) missing in "
                    f"{self.range_text}: {_spans_text(missing)}",
                )
            )
        return found


def judge_sink_split(
    summary: SinkSplitSummary,
    start: int,
    committed: int | None,
    *,
    known: bool = True,
    lost: Iterable[Span] = (),
) -> SinkSplitVerdict:
    """Rule 6.4 for one split: its records cover ``[start, committed)`` once, but for ``lost``.

    ``committed`` is the next offset to read in the checked checkpoint (None: not known, e.g.
    a finished split whose source end is not given, or one dropped with a recorded decision:
    the tail is not checked). ``lost`` are the ranges the audit trail reports skipped as lost
    (SKIPPED_LOST_RANGE): exactly those may be missing, and no record may be inside one.
    ``known`` False: the checkpoint does not know the split (only the records among themselves
    are judged then).
    """
    islands = merge_spans(summary.islands)
    skipped = merge_spans(lost)
    gaps: list[Span] = []
    ends: list[Span] = []
    outside: list[Span] = []
    if not known:
        between = [(b, c) for (_a, b), (c, _d) in zip(islands, islands[1:], strict=False)]
        gaps = _minus(between, skipped)
    else:
        hi = committed if committed is not None else max([start, *(b for _a, b in islands)])
        expected = [(start, hi)] if hi > start else []
        written_lost = [part for a, b in islands for part in _within(skipped, a, b)]
        outside = _minus(islands, expected) + _within(written_lost, start, hi)
        inside = _within(islands, start, hi)
        for gap in _minus(_minus(expected, islands), skipped):
            between_records = bool(inside) and inside[0][0] <= gap[0] and gap[1] <= inside[-1][1]
            (gaps if between_records else ends).append(gap)
    return SinkSplitVerdict(
        summary.split_id,
        start,
        committed,
        known,
        summary.records,
        duplicates=merge_spans(summary.duplicates),
        gaps=tuple(gaps),
        malformed=tuple(sorted(summary.malformed)),
        ends=tuple(ends),
        outside=merge_spans(outside),
        overlaps=merge_spans(summary.overlaps),
        filtered_overlaps=merge_spans(summary.filtered_overlaps),
    )


def check_sink_ranges(
    records: Iterable[tuple[str, int, int]],
    start_positions: Mapping[str, int],
    committed_positions: Mapping[str, int],
    lost: Mapping[str, Iterable[Span]] | None = None,
    dead_letters: Iterable[tuple[str, int, int]] = (),
    filtered: Iterable[tuple[str, int, int]] = (),
) -> list[Violation]:
    """Per split, the sink's records cover ``[start, committed)`` exactly once, and nothing else.

    ``records`` are ``(split_id, offset, next_offset)`` triples read from the
    sink: each record covers the source offsets ``[offset, next_offset)`` (one
    Kafka offset, or the byte range of a line in a file). ``committed_positions``
    are the next offsets to read per split in the latest completed checkpoint;
    ``start_positions`` where reading began (default 0); ``lost`` the ranges per
    split reported lost (the only gaps allowed). Offsets covered twice are
    OFFSET_DUPLICATE, uncovered ones OFFSET_MISSING, records (or parts) outside
    the range or of splits without a committed position OFFSET_UNEXPECTED.
    Splits in ``committed_positions`` with no records are checked too. The same
    rule on a summary: :func:`judge_sink_split`. With ``dead_letters`` (the dead-letter
    table's triples) the sink and the dead letters TOGETHER must cover the range once, and
    an offset in both is DEAD_LETTER_OVERLAP (a dead letter twice is OFFSET_DUPLICATE). With
    ``filtered`` (``(split_id, start_offset, end_offset)`` ranges a Spark transform dropped) those
    offsets are accounted too, and one also a record or dead letter is FILTERED_OVERLAP.
    """
    summaries = summarize_sink_records(records, dead_letters, filtered)
    violations: list[Violation] = []
    for split_id in sorted(set(summaries) | set(committed_positions)):
        summary = summaries.get(split_id, SinkSplitSummary(split_id, 0))
        verdict = judge_sink_split(
            summary,
            start_positions.get(split_id, 0),
            committed_positions.get(split_id),
            known=split_id in committed_positions,
            lost=(lost or {}).get(split_id, ()),
        )
        violations += verdict.violations()
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


def content_digest(values: Iterable[bytes | str | None]) -> tuple[int, str]:
    """(count, digest) of record values in offset order, as :func:`check_content` compares them:
    SHA-256 of the concatenated hex SHA-256 of each value's bytes (a string's UTF-8 bytes; a NULL
    value is ``null``). Byte-exact: any changed, dropped, added or reordered value changes it. The
    restart checks compute the same in Spark SQL (``sha2(concat_ws('', transform(values, sha2)))``).
    """
    import hashlib

    count = 0
    outer = hashlib.sha256()
    for value in values:
        count += 1
        if value is None:
            outer.update(b"null")
            continue
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        outer.update(hashlib.sha256(data).hexdigest().encode("ascii"))
    return count, outer.hexdigest()


def check_content(split_id: str, expected: tuple[int, str], found: tuple[int, str]) -> Violation | None:
    """CONTENT_MISMATCH when a finished split's committed values are not its data's.

    ``expected`` and ``found`` are :func:`content_digest` pairs (record count, digest of the values
    in offset order) of the source's data and of the sink's records together with the dead letters'
    raw values (sink ∪ dead letters reproduces the source, for raw and text sinks).
    """
    if expected == found:
        return None
    return Violation(
        ViolationKind.CONTENT_MISMATCH,
        (split_id,),
        f"split {split_id}: the sink and dead letters hold {found[0]} value(s) (digest {found[1][:12]}) "
        f"where the source has {expected[0]} (digest {expected[1][:12]})",
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
