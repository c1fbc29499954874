"""The simulated exactly-once sink and the record ledger the invariants read.

A reader's output for one epoch is *staged*: a list of :data:`Run` values,
each a run of consecutive records ``(split_id, offset, next_offset)`` (records
``offset .. next_offset - 1`` of that split, read in this epoch). At checkpoint
completion the driver hands the whole staged buffer and the acknowledged
region ids to :meth:`SimulatedSink.commit`; only acknowledged regions' runs
become visible, once per checkpoint id (the Delta ``txnAppId``/``txnVersion``
rule). Failed regions' staged runs are dropped by the driver.

The ledger keeps every committed run; a run that starts exactly where the
split's previous run ended is merged into it (same coverage, so duplicates and
gaps stay visible to :func:`splitkeeper.core.invariants.check_sink_ranges`),
which keeps per-step checks proportional to the number of splits rather than
the number of records.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence

Run = tuple[str, int, int]
"""``(split_id, offset, next_offset)``: records ``offset .. next_offset - 1`` of one split."""


class SimulatedSink:
    """An in-memory exactly-once sink: commits acknowledged regions' staged runs, idempotent by checkpoint id.

    Called by the simulator only, once per completed checkpoint (and again
    with the same id when a commit is replayed). Subclasses in
    :mod:`splitkeeper.sim.broken` break one rule on purpose.
    """

    def __init__(self) -> None:
        self._ledger: dict[str, list[list[int]]] = {}
        self._committed_ids: set[int] = set()
        self._high: dict[str, int] = {}
        self._appends: dict[str, int] = {}
        self.records = 0
        self.commits = 0

    def commit(
        self, checkpoint_id: int, staged: Mapping[int, Sequence[Run]], acknowledged: Collection[int]
    ) -> int:
        """Make the acknowledged regions' staged runs visible; returns how many records were added.

        A checkpoint id already committed adds nothing (idempotent replay).
        """
        if checkpoint_id in self._committed_ids:
            return 0
        self._committed_ids.add(checkpoint_id)
        self.commits += 1
        return self._append_regions(staged, acknowledged)

    def _append_regions(self, staged: Mapping[int, Sequence[Run]], regions: Collection[int]) -> int:
        added = 0
        for region in sorted(regions):
            for run in staged.get(region, ()):
                added += self._append(run)
        return added

    def _append(self, run: Run) -> int:
        split_id, offset, next_offset = run
        spans = self._ledger.setdefault(split_id, [])
        if spans and spans[-1][1] == offset:
            spans[-1][1] = next_offset
        else:
            spans.append([offset, next_offset])
        if next_offset > self._high.get(split_id, -1):
            self._high[split_id] = next_offset
        count = next_offset - offset
        self.records += count
        self._appends[split_id] = self._appends.get(split_id, 0) + 1
        return count

    def runs(self) -> Iterator[Run]:
        """Every committed run (adjacent runs merged), for ``check_sink_ranges``."""
        for split_id, spans in self._ledger.items():
            for offset, next_offset in spans:
                yield (split_id, offset, next_offset)

    def spans(self, split_id: str) -> list[tuple[int, int]]:
        return [(a, b) for a, b in self._ledger.get(split_id, ())]

    def version(self, split_id: str) -> int:
        """A change counter for one split's ledger: how many runs were appended to it so far."""
        return self._appends.get(split_id, 0)

    def high_water(self, split_id: str) -> int | None:
        """One past the highest offset committed for ``split_id``; None when nothing is committed."""
        return self._high.get(split_id)

    def split_ids(self) -> list[str]:
        """Ids of the splits with committed records, in first-commit order."""
        return list(self._ledger)

    @property
    def committed_checkpoint_ids(self) -> frozenset[int]:
        return frozenset(self._committed_ids)
