"""The simulator's vocabulary: scenarios, events, and the seeded generator that writes them.

A :class:`Scenario` is everything a run depends on: the starting parallelism,
the splits the source has at start, and the list of events. All randomness
lives in :func:`generate_scenario`; the simulator itself draws no random
numbers, so replaying a scenario (or any sub-list of its events, which is how
shrinking works) is deterministic.

Events stay meaningful in any sub-sequence: reader and region numbers are
taken modulo the parallelism at the time the event runs, removing an already
removed subscription does nothing, and every discovered split carries its own
id.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field, replace

from splitkeeper.core.rescale import Redistribution
from splitkeeper.core.types import Split

#: Unbounded subscriptions (Kafka-like topics): their splits grow every epoch.
TOPICS: tuple[str, ...] = ("orders", "payments", "clicks")
#: The bounded subscription (a file drop): its splits have a fixed record count and finish.
FILES = "files"


class RegionFailure(enum.Enum):
    """How a region fails the checkpoint of an epoch."""

    CRASH = "crash"  # the reader crashes mid-read, before the checkpoint: it declines
    DECLINE = "decline"  # the reader read its ranges but could not snapshot
    TIMEOUT = "timeout"  # the region stays silent past region_timeout_s


@dataclass(frozen=True, slots=True)
class SplitSpec:
    """A split of the in-memory source: records ``[start, start + length)`` exist when it appears.

    A bounded split ends there; an unbounded one grows by the ``growth`` of
    every epoch.
    """

    split_id: str
    subscription: str
    start: int
    length: int
    bounded: bool

    def to_split(self) -> Split:
        end = self.start + self.length if self.bounded else None
        return Split(self.split_id, self.subscription, self.start, end)

    def describe(self) -> str:
        kind = "bounded" if self.bounded else "unbounded"
        return f"{self.split_id} ({kind}, records {self.start}..{self.start + self.length - 1})"


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Epoch:
    """One checkpoint attempt: source growth, discovery, read, checkpoint, sink commit.

    Every reader reads up to ``budget`` records per split (half of it for a
    reader that crashes); unbounded splits first grow by ``growth`` records.
    ``failures`` names the regions (modulo the parallelism) that fail the
    checkpoint and how; the others acknowledge. ``commit_retry`` replays the
    sink commit with the same checkpoint id (a driver that died after the
    commit and redid it): the sink must ignore the replay.
    """

    budget: int = 4
    growth: int = 2
    failures: tuple[tuple[int, RegionFailure], ...] = ()
    commit_retry: bool = False

    def describe(self) -> str:
        text = f"epoch(budget={self.budget}, growth={self.growth}"
        if self.failures:
            text += ", " + " ".join(f"r{r}={kind.value}" for r, kind in self.failures)
        if self.commit_retry:
            text += ", sink commit replayed"
        return text + ")"


@dataclass(frozen=True, slots=True)
class ReaderFailure:
    """Reader ``reader`` (modulo the parallelism) fails after the last checkpoint: a partial failover."""

    reader: int

    def describe(self) -> str:
        return f"reader {self.reader} fails after the last checkpoint"


@dataclass(frozen=True, slots=True)
class GlobalRestart:
    """The whole job restarts from the latest completed checkpoint (a global restore)."""

    def describe(self) -> str:
        return "global restart from the latest completed checkpoint"


@dataclass(frozen=True, slots=True)
class Rescale:
    """Restore the latest completed checkpoint at ``parallelism`` readers."""

    parallelism: int
    redistribution: Redistribution = Redistribution.EVEN_SPLIT

    def describe(self) -> str:
        return f"rescale to {self.parallelism} readers ({self.redistribution.value} operator state)"


@dataclass(frozen=True, slots=True)
class DiscoverSplits:
    """New splits appear in the source (new partitions, new files)."""

    splits: tuple[SplitSpec, ...]

    def describe(self) -> str:
        return "discover " + ", ".join(s.describe() for s in self.splits)


@dataclass(frozen=True, slots=True)
class RemoveSubscription:
    """The source stops subscribing to ``subscription``; the driver's next epoch or restore drops it."""

    subscription: str

    def describe(self) -> str:
        return f"unsubscribe {self.subscription!r}"


@dataclass(frozen=True, slots=True)
class CheckpointDuringRestore:
    """A global restore in which a checkpoint is requested after only some readers registered.

    ``registered_first`` readers (modulo the parallelism, so always fewer than
    all) register, then a checkpoint is triggered and every region
    acknowledges with its restored state; the enumerator must refuse to
    snapshot (protocol rule 1.4, scenario 2). Then the remaining readers register.
    """

    registered_first: int

    def describe(self) -> str:
        return f"global restart; checkpoint requested after {self.registered_first} reader(s) registered"


Event = (
    Epoch
    | ReaderFailure
    | GlobalRestart
    | Rescale
    | DiscoverSplits
    | RemoveSubscription
    | CheckpointDuringRestore
)


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything a simulation depends on; replaying it gives the same run."""

    parallelism: int
    initial_splits: tuple[SplitSpec, ...]
    events: tuple[Event, ...] = field(default_factory=tuple)

    def all_specs(self) -> list[SplitSpec]:
        """Every split the scenario ever makes discoverable, initial ones first."""
        specs = list(self.initial_splits)
        for event in self.events:
            if isinstance(event, DiscoverSplits):
                specs.extend(event.splits)
        return specs

    def normalized(self) -> Scenario:
        """The same run with reader and region numbers as the simulator reads them (modulo parallelism).

        Replaying the result gives the same run; it only reads better (``r0``,
        not ``r4``, at two readers).
        """
        p = self.parallelism
        out: list[Event] = []
        for event in self.events:
            if isinstance(event, Epoch):
                seen: dict[int, RegionFailure] = {}
                for region, kind in event.failures:
                    seen.setdefault(region % p, kind)
                out.append(replace(event, failures=tuple(sorted(seen.items(), key=lambda rk: rk[0]))))
            elif isinstance(event, ReaderFailure):
                out.append(ReaderFailure(event.reader % p))
            elif isinstance(event, CheckpointDuringRestore):
                out.append(CheckpointDuringRestore(event.registered_first % p))
            else:
                if isinstance(event, Rescale):
                    p = event.parallelism
                out.append(event)
        return replace(self, events=tuple(out))

    def describe(self) -> list[str]:
        """One line per element: the start, then each event numbered from 1 (the step it runs at)."""
        splits = ", ".join(s.describe() for s in self.initial_splits) or "none"
        lines = [f"start: {self.parallelism} reader(s), {len(self.initial_splits)} split(s): {splits}"]
        lines += [f"step {i}: {e.describe()}" for i, e in enumerate(self.events, start=1)]
        return lines


# --------------------------------------------------------------------------- generator


@dataclass(frozen=True, slots=True)
class EventMix:
    """Relative weights of the events the generator draws.

    With probability ``failure_rate`` a step is a fault, drawn by the
    ``fault_*`` weights; otherwise it is an epoch without failures or, with
    ``discover_weight`` against ``epoch_weight``, new splits.
    """

    fault_epoch_failures: int = 35
    fault_reader_failure: int = 20
    fault_global_restart: int = 8
    fault_rescale: int = 15
    fault_checkpoint_during_restore: int = 10
    fault_remove_subscription: int = 2
    epoch_weight: int = 90
    discover_weight: int = 8
    commit_retry_probability: float = 0.05
    bounded_fraction: float = 0.25
    max_budget: int = 8
    max_growth: int = 4


class _SplitNamer:
    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def spec(self, rng: random.Random, subscription: str) -> SplitSpec:
        n = self._next.get(subscription, 0)
        self._next[subscription] = n + 1
        bounded = subscription == FILES
        start = 0 if bounded or rng.random() < 0.7 else rng.randint(1, 20)
        length = rng.randint(0, 24) if bounded else rng.randint(0, 40)
        return SplitSpec(f"{subscription}-{n}", subscription, start, length, bounded)


def _subscription_for(rng: random.Random, subscribed: list[str], mix: EventMix) -> str:
    if FILES in subscribed and (len(subscribed) == 1 or rng.random() < mix.bounded_fraction):
        return FILES
    topics = [s for s in subscribed if s != FILES]
    return rng.choice(topics) if topics else FILES


def generate_scenario(
    parallelism: int,
    splits: int,
    steps: int,
    failure_rate: float,
    seed: int,
    *,
    mix: EventMix | None = None,
    max_parallelism: int | None = None,
) -> Scenario:
    """A random scenario from ``random.Random(seed)``: same arguments, same scenario.

    ``splits`` initial splits (a ``bounded_fraction`` of them bounded files),
    ``steps`` events. Rescales pick a parallelism in
    ``1..max_parallelism`` (default ``2 * parallelism``). Callers validate
    the arguments (see :class:`splitkeeper.sim.simulator.SimConfig`).
    """
    mix = mix or EventMix()
    rng = random.Random(seed)
    namer = _SplitNamer()
    subscribed = [*TOPICS, FILES]
    initial = tuple(namer.spec(rng, _subscription_for(rng, subscribed, mix)) for _ in range(splits))
    top = max(2, max_parallelism or 2 * parallelism)
    p = parallelism
    faults: list[tuple[str, int]] = [
        ("epoch_failures", mix.fault_epoch_failures),
        ("reader_failure", mix.fault_reader_failure),
        ("global_restart", mix.fault_global_restart),
        ("rescale", mix.fault_rescale),
        ("checkpoint_during_restore", mix.fault_checkpoint_during_restore),
        ("remove_subscription", mix.fault_remove_subscription),
    ]
    events: list[Event] = []
    for _ in range(steps):
        if rng.random() < failure_rate:
            kind = rng.choices([k for k, _ in faults], weights=[w for _, w in faults])[0]
            if kind == "remove_subscription" and len(subscribed) <= 2:
                kind = "epoch_failures"
            if kind == "epoch_failures":
                count = 1 if rng.random() < 0.6 else rng.randint(1, p)
                regions = sorted(rng.sample(range(p), min(count, p)))
                failures = tuple((r, rng.choice(list(RegionFailure))) for r in regions)
                events.append(_epoch(rng, mix, failures))
            elif kind == "reader_failure":
                events.append(ReaderFailure(rng.randrange(p)))
            elif kind == "global_restart":
                events.append(GlobalRestart())
            elif kind == "rescale":
                choices = [n for n in range(1, top + 1) if n != p]
                p = rng.choice(choices)
                events.append(Rescale(p, rng.choice(list(Redistribution))))
            elif kind == "checkpoint_during_restore":
                events.append(CheckpointDuringRestore(rng.randrange(p)))
            else:
                gone = rng.choice(subscribed)
                subscribed.remove(gone)
                events.append(RemoveSubscription(gone))
        elif rng.random() * (mix.epoch_weight + mix.discover_weight) < mix.discover_weight:
            count = rng.randint(1, 3)
            events.append(
                DiscoverSplits(
                    tuple(namer.spec(rng, _subscription_for(rng, subscribed, mix)) for _ in range(count))
                )
            )
        else:
            events.append(_epoch(rng, mix, ()))
    return Scenario(parallelism, initial, tuple(events))


def _epoch(rng: random.Random, mix: EventMix, failures: tuple[tuple[int, RegionFailure], ...]) -> Epoch:
    return Epoch(
        budget=rng.randint(1, mix.max_budget),
        growth=rng.randint(0, mix.max_growth),
        failures=failures,
        commit_retry=rng.random() < mix.commit_retry_probability,
    )


def epochs(count: int, budget: int = 4, growth: int = 2) -> list[Epoch]:
    """``count`` failure-free epochs (a helper for hand-written scenarios)."""
    return [Epoch(budget=budget, growth=growth) for _ in range(count)]


def specs(
    count: int, *, subscription: str = TOPICS[0], length: int = 10, bounded: bool = False, first: int = 0
) -> tuple[SplitSpec, ...]:
    """``count`` splits ``<subscription>-<first>..`` of ``length`` records (for hand-written scenarios)."""
    return tuple(
        SplitSpec(f"{subscription}-{i}", subscription, 0, length, bounded)
        for i in range(first, first + count)
    )
