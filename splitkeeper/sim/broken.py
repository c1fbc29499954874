"""Deliberately broken components: proof that the simulator catches what it claims to catch.

Each one breaks exactly one rule a correct component keeps; one of them is a
driver (:class:`PerRegionProgressDriver`) that breaks one of the driver's own
decisions, which is what the simulator exists to check. ``splitkeeper
simulate --inject-bug NAME`` runs with one of them; the tests assert that the
run reports the broken rule and that the shrunk scenario still reproduces it.
None of them is used by a real pipeline.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from splitkeeper.core.assignment import AssignmentStrategy
from splitkeeper.core.driver import EpochDriver
from splitkeeper.core.enumerator import RecordingEnumeratorContext, SplitEnumerator, enumerator_for
from splitkeeper.core.ports import RegionRun
from splitkeeper.core.source import SplitSource
from splitkeeper.core.types import EnumeratorSnapshot, Split
from splitkeeper.errors import InvalidParameterError
from splitkeeper.sim.simulator import Components
from splitkeeper.sim.sink import Run, SimulatedSink


class LeakySink(SimulatedSink):
    """Commits every region's staged records, failed regions' included (breaks protocol rule 2.5).

    A failed region falls back and re-reads what it staged, so its records
    reach the sink twice (``offset_duplicate``) or ahead of the checkpoint
    (``offset_unexpected``).
    """

    def commit(
        self, checkpoint_id: int, staged: Mapping[int, Sequence[Run]], acknowledged: Collection[int]
    ) -> int:
        return super().commit(checkpoint_id, staged, list(staged))


class NonIdempotentSink(SimulatedSink):
    """Applies a replayed commit of the same checkpoint id again (breaks the txnVersion rule)."""

    def commit(
        self, checkpoint_id: int, staged: Mapping[int, Sequence[Run]], acknowledged: Collection[int]
    ) -> int:
        self.commits += 1
        return self._append_regions(staged, acknowledged)


class SplitDroppingEnumerator(SplitEnumerator):
    """Loses one split each time splits are added back after a reader failure (breaks protocol rule 1.3).

    The last split handed to ``add_splits_back`` is forgotten instead of
    pooled: no reader owns it, the pool does not hold it, and its records stop.
    """

    def add_splits_back(self, splits: Iterable[Split], reader_id: int) -> None:
        given = list(splits)
        if not given:
            super().add_splits_back(given, reader_id)
            return
        *kept, victim = given
        super().add_splits_back(kept, reader_id)
        self._retire(victim.split_id, self.owner_of(victim.split_id))


def dropping_enumerator(
    source: SplitSource,
    context: RecordingEnumeratorContext,
    strategy: AssignmentStrategy,
    restored: EnumeratorSnapshot | None = None,
) -> SplitEnumerator:
    return enumerator_for(
        source, context, strategy, restored=restored, enumerator_class=SplitDroppingEnumerator
    )


class PerRegionProgressDriver(EpochDriver):
    """Applies acknowledged progress region by region (positions, then that region's finished splits).

    Breaks protocol rule 1.7: finishing a split may rebalance another split of a later
    region to a reader before that later region's new position is applied, so the split
    moves with an old position and its records are read twice (``offset_duplicate``).
    The real driver applies every position first, then the finished splits.
    """

    def _apply_progress(self, acked: Mapping[int, RegionRun]) -> None:
        enumerator, context = self._require_open()
        for region, run in acked.items():
            mine = context.reader_splits.get(region, {})
            moved = []
            for split_id, position in run.positions.items():
                if split_id in mine:
                    mine[split_id] = mine[split_id].at(position)
                    moved.append(mine[split_id])
            enumerator.update_positions(moved)
            for split in moved:
                if split.finished:
                    enumerator.split_finished(region, split.split_id)
                    mine.pop(split.split_id, None)


@dataclass(frozen=True, slots=True)
class Bug:
    """A named broken component and the rule kinds it is expected to break."""

    name: str
    description: str
    components: Components
    breaks: tuple[str, ...]


BUGS: dict[str, Bug] = {
    bug.name: bug
    for bug in (
        Bug(
            "leaky-sink",
            "the sink also commits failed regions' staged records",
            Components(sink=LeakySink),
            ("offset_duplicate", "offset_unexpected"),
        ),
        Bug(
            "non-idempotent-sink",
            "the sink applies a replayed commit of the same checkpoint id again",
            Components(sink=NonIdempotentSink),
            ("offset_duplicate",),
        ),
        Bug(
            "per-region-progress",
            "the driver applies acknowledged progress region by region instead of positions first",
            Components(driver=PerRegionProgressDriver),
            ("offset_duplicate",),
        ),
        Bug(
            "drop-split-on-add-back",
            "the enumerator forgets one split each time splits are added back",
            Components(enumerator=dropping_enumerator),
            ("not_owned",),
        ),
    )
}


def bug_by_name(name: str) -> Bug:
    bug = BUGS.get(name)
    if bug is None:
        raise InvalidParameterError("bug", name, "one of " + ", ".join(sorted(BUGS)))
    return bug
