"""Source contracts: what a source offers the enumerator, and its optional capabilities.

Optional features are tiny mix-in classes (the Flink convention), never boolean
flags threaded through calls. A source opts in by inheriting the mix-in; the
enumerator factory (:func:`splitkeeper.core.enumerator.enumerator_for`) is the
only place that inspects them.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from splitkeeper.core.types import Split
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
        ``backlog_end`` when the source tracks backlog (DESIGN 4).
        """

    @abc.abstractmethod
    def subscriptions(self) -> frozenset[str]:
        """What the pipeline is configured to read (topics, file roots).

        Splits whose ``subscription`` is not in this set are dropped by the
        enumerator, on discovery and on restart (DESIGN 1.5).
        """


class SupportsSplitReassignmentOnRecovery:
    """Mix-in: readers report their restored splits and wait to be assigned (FLIP-537).

    A source that inherits this opts into deferred assignment: on start, a
    reader registers with the splits restored from its state
    (``ReaderInfo.reported_splits``) but reads nothing until the enumerator
    assigns, and while it is pending its snapshot does not overwrite its last
    good state. The enumerator becomes the single owner of split placement and
    may redistribute on a global restore (DESIGN 1.2-1.3). Without it, readers
    keep their restored splits (legacy behaviour).
    """

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class ExternalPosition:
    """A position a source keeps outside the checkpoint, tagged with the checkpoint it belongs to."""

    position: int
    checkpoint_id: int

    def __post_init__(self) -> None:
        if self.position < 0:
            raise InvalidParameterError("position", self.position, "an offset >= 0")


class ExternallyCheckpointedSource(abc.ABC):
    """Mix-in for sources that also keep their own position (DESIGN 3).

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
