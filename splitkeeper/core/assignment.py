"""Pluggable split assignment strategies (protocol rule 1.6).

A strategy is stateless and deterministic: given the splits to place and what
each candidate reader owns now, it says which reader gets which split. It
never moves a split a reader already owns (sticky); only :meth:`rebalance`
proposes moves, and only as many as the balance rule needs. The enumerator
calls both; nothing else places splits.

- ``legacy-hash``: the Kafka connector's fixed owner
  ``((javaHash(topic) * 31) & 0x7FFFFFFF) % P + partition) % P``; kept to show
  its skew (FLINK-31762). Not balanced.
- ``round-robin``: splits sorted by id, dealt round-robin starting from the
  least-loaded reader, filling the lowest readers first (water-filling).
- ``least-loaded``: each split, in the given order, to the reader with the
  fewest splits (a heap).
- ``weighted``: per-split weight (throughput), per-reader capacity; the
  heaviest split first to the reader with the lowest load/capacity.

Balance rules themselves live in :mod:`splitkeeper.core.invariants`.
"""

from __future__ import annotations

import abc
import heapq
import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, ClassVar

from splitkeeper.core.invariants import COUNT_TOLERANCE, weighted_deviations
from splitkeeper.core.types import Split
from splitkeeper.errors import InvalidParameterError

_split_id = attrgetter("split_id")

#: What each candidate reader owns now: reader id -> the ids of its splits, oldest assignment first.
OwnedView = Mapping[int, Collection[str]]


@dataclass(slots=True)
class Placement:
    """A strategy's answer: splits per reader, plus splits it could not place now."""

    by_reader: dict[int, list[Split]] = field(default_factory=dict)
    unplaced: list[Split] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Move:
    """Take split ``split_id`` from reader ``source`` and give it to reader ``target`` (a rebalance step)."""

    split_id: str
    source: int
    target: int


def validate_parallelism(parallelism: Any, name: str = "parallelism", or_else: str = "") -> int:
    """``parallelism`` if it is an int >= 1, else InvalidParameterError naming ``name`` (the one
    lower-bound check of a parallelism; ``or_else`` is added to what is allowed, e.g. ", or None to
    keep it"). The top, :data:`splitkeeper.config.limits.MAX_PARALLELISM`, is the config's."""
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
        raise InvalidParameterError(name, parallelism, f"an integer >= 1{or_else}")
    return parallelism


class AssignmentStrategy(abc.ABC):
    """How pooled splits are placed on readers.

    ``balanced`` strategies promise the balance invariant after every event
    once all expected readers are registered: with deferred assignment
    (``reassign_on_recovery``) the enumerator calls :meth:`rebalance` after
    each event. Legacy readers own what they restored, so nothing is moved.
    """

    name: ClassVar[str]
    balanced: ClassVar[bool] = False

    @abc.abstractmethod
    def place(self, splits: Collection[Split], owned: OwnedView, parallelism: int) -> Placement:
        """Place ``splits`` (all unowned) on the readers in ``owned``.

        ``splits`` is a read-only view (e.g. the pool's values): iterate or
        sort it, do not keep it. ``owned`` holds exactly the candidate readers
        (registered and expected), each with the ids of the splits it owns now,
        oldest assignment first; ``parallelism`` is the job's reader count.
        Must not mutate its arguments. Deterministic: same input, same output.
        Splits that cannot be placed now go to ``unplaced`` and stay in the pool.
        """

    def rebalance(self, owned: OwnedView, parallelism: int) -> list[Move]:
        """Moves needed to restore this strategy's balance rule; none by default.

        Called by the enumerator after every event once every expected reader
        is registered. Must propose the fewest moves it can (sticky). The moves
        are a sequence (each applies to the ownership the ones before it left);
        the enumerator applies one net move per split.
        """
        return []

    def describe(self) -> str:
        return self.name


# ---------------------------------------------------------------------------------------------
# legacy-hash (Kafka connector owner, FLINK-31762)


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()`` (UTF-16 code units, 32-bit signed wrap-around)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


_TRAILING_INT = re.compile(r"^(.*)-(\d+)(?:#v[0-9a-f]+)?$")


def topic_partition(split: Split) -> tuple[str, int]:
    """The (topic, partition) of a Kafka-style split.

    The topic is ``split.subscription`` (or the id's prefix when empty) and
    the partition the integer after the last ``-`` of the split id (Kafka's
    ``TopicPartition.toString()`` form, e.g. ``orders-3``, or ``orders-3#v<hex>`` for a
    partition of a re-created topic). Splits without a
    trailing integer use partition 0 with the whole id as topic.
    """
    match = _TRAILING_INT.match(split.split_id)
    if match is None:
        return (split.subscription or split.split_id, 0)
    return (split.subscription or match.group(1), int(match.group(2)))


def legacy_hash_owner(topic: str, partition: int, parallelism: int) -> int:
    """The Flink Kafka enumerator's owner of a partition: ``((hash*31 & 0x7FFFFFFF) % P + p) % P``."""
    validate_parallelism(parallelism)
    start_index = ((java_string_hash(topic) * 31) & 0x7FFFFFFF) % parallelism
    return (start_index + partition) % parallelism


class LegacyHashStrategy(AssignmentStrategy):
    """Each split goes to its fixed hash owner; it waits in the pool while that owner is absent."""

    name = "legacy-hash"
    balanced = False

    def place(self, splits: Collection[Split], owned: OwnedView, parallelism: int) -> Placement:
        validate_parallelism(parallelism)
        placement = Placement()
        for split in splits:
            topic, partition = topic_partition(split)
            owner = legacy_hash_owner(topic, partition, parallelism)
            if owner in owned:
                placement.by_reader.setdefault(owner, []).append(split)
            else:
                placement.unplaced.append(split)
        return placement


# ---------------------------------------------------------------------------------------------
# Count-balanced strategies


def water_fill(loads: Sequence[tuple[int, int]], k: int) -> list[tuple[int, int]]:
    """How many of ``k`` new splits each reader gets so the lowest readers are filled first.

    ``loads`` are ``(reader, current count)`` pairs sorted by ``(count, reader)``.
    Returns ``(reader, extra)`` pairs with ``extra > 0``, in that same order,
    with ``extra`` non-increasing along the order. The result's counts are
    within 1 of each other among the readers that receive splits and never
    above any reader that does not.
    """
    n = len(loads)
    if k <= 0 or n == 0:
        return []
    prefix = 0
    for m in range(1, n + 1):
        prefix += loads[m - 1][1]
        total = k + prefix
        level, extra = divmod(total, m)
        if m == n or level <= loads[m][1]:
            out = []
            for i in range(m):
                reader, load = loads[i]
                give = level - load + (1 if i < extra else 0)
                if give > 0:
                    out.append((reader, give))
            return out
    raise AssertionError("unreachable")  # pragma: no cover


def _sorted_loads(owned: OwnedView) -> list[tuple[int, int]]:
    return sorted(((r, len(s)) for r, s in owned.items()), key=lambda rl: (rl[1], rl[0]))


def count_rebalance_moves(owned: OwnedView) -> list[Move]:
    """The fewest moves that bring split counts within COUNT_TOLERANCE.

    Final counts are ``q`` or ``q + 1``; the ``q + 1`` slots go to the readers
    that own most now (ties: lower id), so only true excess moves. A donor
    gives up its most recently assigned splits (``owned`` lists oldest first).
    """
    if len(owned) < 2:
        return []
    counts = {r: len(s) for r, s in owned.items()}
    if max(counts.values()) - min(counts.values()) <= COUNT_TOLERANCE:
        return []
    total = sum(counts.values())
    q, rem = divmod(total, len(counts))
    by_load = sorted(counts, key=lambda r: (-counts[r], r))
    target = {r: q + (1 if i < rem else 0) for i, r in enumerate(by_load)}
    donors: list[tuple[int, str]] = []
    for r in sorted(counts):
        excess = counts[r] - target[r]
        if excess > 0:
            newest_first = list(owned[r])[::-1]
            donors.extend((r, split_id) for split_id in newest_first[:excess])
    moves: list[Move] = []
    it = iter(donors)
    for r in sorted(counts, key=lambda r: (counts[r], r)):
        for _ in range(target[r] - counts[r]):
            source, split_id = next(it)
            moves.append(Move(split_id, source, r))
    return moves


class _CountBalanced(AssignmentStrategy):
    balanced = True

    def rebalance(self, owned: OwnedView, parallelism: int) -> list[Move]:
        return count_rebalance_moves(owned)


class RoundRobinStrategy(_CountBalanced):
    """Sorted split ids dealt round-robin from the least-loaded reader, lowest readers filled first."""

    name = "round-robin"

    def place(self, splits: Collection[Split], owned: OwnedView, parallelism: int) -> Placement:
        validate_parallelism(parallelism)
        if not owned:
            return Placement(unplaced=list(splits))
        ordered = sorted(splits, key=_split_id)
        gives = water_fill(_sorted_loads(owned), len(ordered))
        # Deal in rounds: in round j every reader with give > j takes one split, in order.
        # ``give`` is non-increasing along the order, so round j's takers are a prefix; rounds
        # with the same prefix length form a block that each reader reads with one slice.
        by_reader: dict[int, list[Split]] = {r: [] for r, _ in gives}
        readers = [r for r, _ in gives]
        counts = [g for _, g in gives]
        offset = 0
        done_rounds = 0
        n_active = len(readers)
        while n_active > 0:
            last_round = counts[n_active - 1]  # rounds this prefix stays the same length
            rounds = last_round - done_rounds
            span = rounds * n_active
            for k in range(n_active):
                by_reader[readers[k]].extend(ordered[offset + k : offset + span : n_active])
            offset += span
            done_rounds = last_round
            while n_active > 0 and counts[n_active - 1] <= done_rounds:
                n_active -= 1
        return Placement(by_reader=by_reader)


class LeastLoadedStrategy(_CountBalanced):
    """Each split, in the given order, to the reader owning fewest splits (ties: lower id)."""

    name = "least-loaded"

    def place(self, splits: Collection[Split], owned: OwnedView, parallelism: int) -> Placement:
        validate_parallelism(parallelism)
        if not owned:
            return Placement(unplaced=list(splits))
        heap = [(len(s), r) for r, s in owned.items()]
        heapq.heapify(heap)
        by_reader: dict[int, list[Split]] = {}
        for split in splits:
            load, reader = heapq.heappop(heap)
            by_reader.setdefault(reader, []).append(split)
            heapq.heappush(heap, (load + 1, reader))
        return Placement(by_reader=by_reader)


# ---------------------------------------------------------------------------------------------
# Weighted


class WeightedStrategy(AssignmentStrategy):
    """Per-split weight (measured throughput), per-reader capacity (protocol rule 1.6).

    :meth:`place` puts the heaviest split first on the reader with the lowest
    ``weighted load / capacity``. :meth:`rebalance` moves splits from the most over- to the
    most under-loaded reader while a split fits between them, so the result does not depend
    on the order splits were discovered in, and every reader ends within one split of its
    fair share (the bound ``core.invariants`` checks). Weights
    may change between events: the driver feeds measured throughput when the imbalance
    under the new weights passes its threshold; a split without a weight counts
    ``default_weight``.
    """

    name = "weighted"
    balanced = True

    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        capacities: Mapping[int, float] | None = None,
        default_weight: float = 1.0,
        default_capacity: float = 1.0,
    ) -> None:
        for key, value in (weights or {}).items():
            if not value > 0:
                raise InvalidParameterError(f"weights[{key!r}]", value, "a weight > 0")
        for reader_id, capacity in (capacities or {}).items():
            if not capacity > 0:
                raise InvalidParameterError(f"capacities[{reader_id!r}]", capacity, "a capacity > 0")
        if not default_weight > 0:
            raise InvalidParameterError("default_weight", default_weight, "a weight > 0")
        if not default_capacity > 0:
            raise InvalidParameterError("default_capacity", default_capacity, "a capacity > 0")
        self.weights = dict(weights or {})
        self.capacities = dict(capacities or {})
        self.default_weight = float(default_weight)
        self.default_capacity = float(default_capacity)

    def weight(self, split_id: str) -> float:
        return self.weights.get(split_id, self.default_weight)

    def capacity(self, reader_id: int) -> float:
        return self.capacities.get(reader_id, self.default_capacity)

    def set_weights(self, weights: Mapping[str, float], default_weight: float | None = None) -> None:
        """Replace the split weights (measured throughput); ``default_weight`` for splits without one."""
        for key, value in weights.items():
            if not value > 0:
                raise InvalidParameterError(f"weights[{key!r}]", value, "a weight > 0")
        self.weights = dict(weights)
        if default_weight is not None:
            if not default_weight > 0:
                raise InvalidParameterError("default_weight", default_weight, "a weight > 0")
            self.default_weight = float(default_weight)

    def _load(self, split_ids: Collection[str]) -> float:
        return sum(self.weight(s) for s in split_ids)

    def imbalance(self, owned: OwnedView, weights: Mapping[str, float] | None = None) -> float:
        """max / min of ``weighted load / capacity`` over the readers (inf when one idles and another not).

        ``weights`` measures with other weights than the strategy's own (default: its own).
        """
        weigh = self.weight if weights is None else (lambda s: weights.get(s, self.default_weight))
        normalised = [sum(weigh(s) for s in ids) / self.capacity(r) for r, ids in owned.items()]
        if not normalised or max(normalised) == 0:
            return 1.0
        low = min(normalised)
        return math.inf if low == 0 else max(normalised) / low

    def place(self, splits: Collection[Split], owned: OwnedView, parallelism: int) -> Placement:
        validate_parallelism(parallelism)
        if not owned:
            return Placement(unplaced=list(splits))
        loads = {r: self._load(s) for r, s in owned.items()}
        heap = [(loads[r] / self.capacity(r), r) for r in owned]
        heapq.heapify(heap)
        by_reader: dict[int, list[Split]] = {}
        for split in sorted(splits, key=lambda s: (-self.weight(s.split_id), s.split_id)):
            _, reader = heapq.heappop(heap)
            by_reader.setdefault(reader, []).append(split)
            loads[reader] += self.weight(split.split_id)
            heapq.heappush(heap, (loads[reader] / self.capacity(reader), reader))
        return Placement(by_reader=by_reader)

    def rebalance(self, owned: OwnedView, parallelism: int) -> list[Move]:
        """Moves from the most over- to the most under-loaded reader while one lowers the imbalance.

        Deviations are weighted load minus fair share (``total * capacity / total capacity``).
        Each move carries the heaviest split of the most over-loaded reader that does not
        overshoot (``weight < excess + deficit``), so the sum of squared deviations strictly
        falls and the loop ends. It ends only when no split fits; then the most over-loaded
        reader is within its lightest split of its fair share and every reader within the
        largest split weight (the bound ``core.invariants`` checks), whatever order the splits
        were discovered in. Nothing moves when nothing fits (sticky).
        """
        if len(owned) < 2:
            return []
        members = {r: dict.fromkeys(s) for r, s in owned.items()}
        loads = {r: self._load(s) for r, s in members.items()}
        count = sum(len(m) for m in members.values())
        if not count:
            return []
        moves: list[Move] = []
        for _ in range(count * len(members) + 1):
            dev = weighted_deviations(loads, self.capacity)
            over = max(dev, key=lambda r: (dev[r], -r))
            under = min(dev, key=lambda r: (dev[r], r))
            room = dev[over] - dev[under]
            candidates = [s for s in members[over] if self.weight(s) < room * (1 - 1e-12)]
            if not candidates:
                break
            split_id = max(candidates, key=lambda s: (self.weight(s), s))
            del members[over][split_id]
            members[under][split_id] = None
            loads[over] -= self.weight(split_id)
            loads[under] += self.weight(split_id)
            moves.append(Move(split_id, over, under))
        return moves

    def describe(self) -> str:
        return f"weighted ({len(self.weights)} split weights, {len(self.capacities)} reader capacities)"


class ThroughputMeter:
    """Per-split throughput (records per second) measured from how fast each split's end grows.

    The driver calls :meth:`observe` with every live unbounded split's available end at
    each epoch; :meth:`rates` is an exponentially weighted average of the growth rate
    (``smoothing`` is the weight of the newest observation). Bounded splits have no
    arrival rate and are not observed. Engine-free and deterministic (the clock is given).
    """

    def __init__(self, smoothing: float = 0.5, floor: float = 1e-3) -> None:
        if not 0 < smoothing <= 1:
            raise InvalidParameterError("smoothing", smoothing, "a number in (0, 1]")
        self.smoothing = float(smoothing)
        self.floor = float(floor)
        self._last: dict[str, tuple[float, int]] = {}
        self._rates: dict[str, float] = {}

    def observe(self, split_id: str, now: float, end: int) -> None:
        previous = self._last.get(split_id)
        self._last[split_id] = (now, end)
        if previous is None or now <= previous[0]:
            return
        rate = max(0.0, (end - previous[1]) / (now - previous[0]))
        old = self._rates.get(split_id)
        self._rates[split_id] = rate if old is None else old + self.smoothing * (rate - old)

    def forget(self, keep: Collection[str]) -> None:
        """Drop the splits not in ``keep`` (finished, dropped)."""
        for split_id in [s for s in self._last if s not in keep]:
            self._last.pop(split_id, None)
            self._rates.pop(split_id, None)

    def rates(self) -> dict[str, float]:
        """Split id -> records/s (at least ``floor``, so an idle split still weighs something)."""
        return {s: max(self.floor, r) for s, r in self._rates.items()}


# ---------------------------------------------------------------------------------------------
# Registry

STRATEGIES: dict[str, Callable[..., AssignmentStrategy]] = {
    LegacyHashStrategy.name: LegacyHashStrategy,
    RoundRobinStrategy.name: RoundRobinStrategy,
    LeastLoadedStrategy.name: LeastLoadedStrategy,
    WeightedStrategy.name: WeightedStrategy,
}


def strategy_by_name(name: str, **options: Any) -> AssignmentStrategy:
    """A new strategy by its registry name; ``options`` go to its constructor (weights, ...)."""
    factory = STRATEGIES.get(name)
    if factory is None:
        raise InvalidParameterError("strategy", name, "one of " + ", ".join(sorted(STRATEGIES)))
    try:
        return factory(**options)
    except TypeError as err:
        raise InvalidParameterError(
            "strategy options", sorted(options), f"options accepted by the {name} strategy"
        ) from err
