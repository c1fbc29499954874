"""Contract tests every source implementation inherits (the Flink connector-testing habit).

Usage, in a test module::

    class TestMySourceContract(SourceContractTests):
        def make_source(self, tmp_path):
            ...  # a connector over data that is already there
            return connector

``make_source`` must return a connector whose discovery yields at least one
split with at least three records readable up to ``available_end`` (several
splits, one of them empty, make the several-ranges test say more). The tests
use only the public contract of :mod:`splitkeeper.core.source` (and of
:mod:`splitkeeper.records.columnar` for a reader that reads columns); they
need pytest (its ``tmp_path`` fixture) but nothing else.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from splitkeeper.core.source import SourceConnector, SourceRecord
from splitkeeper.core.types import Split
from splitkeeper.records.columnar import SupportsColumnarRead


def read_planned(source: SourceConnector, split: Split, budget: int) -> list[list[SourceRecord]]:
    """Read ``split`` from its position to ``available_end`` in ranges planned with ``budget``."""
    reader = source.reader()
    start, limit = split.position, source.available_end(split)
    ranges: list[list[SourceRecord]] = []
    while start < limit:
        end = source.plan_end(split, start, budget)
        if not start < end <= limit:
            raise AssertionError(
                f"plan_end({split.split_id}, {start}, {budget}) = {end} is outside ({start}, {limit}]"
            )
        ranges.append(list(reader.read_range(split, start, end)))
        start = end
    return ranges


class SourceContractTests:
    """Behaviour every :class:`SourceConnector` / :class:`RegionReader` pair must show."""

    def make_source(self, tmp_path: Path) -> SourceConnector:
        raise NotImplementedError

    def _readable_split(self, source: SourceConnector) -> Split:
        splits = [s for s in source.discover_splits() if source.available_end(s) > s.position]
        if not splits:
            raise AssertionError("make_source must provide a split with records")
        return max(splits, key=lambda s: source.available_end(s) - s.position)

    def test_discovery_is_repeatable_and_ids_are_unique(self, tmp_path: Path) -> None:
        source = self.make_source(tmp_path)
        first = source.discover_splits()
        ids = [s.split_id for s in first]
        assert len(ids) == len(set(ids))
        assert sorted(ids) == sorted(s.split_id for s in source.discover_splits())

    def test_every_split_belongs_to_a_current_subscription(self, tmp_path: Path) -> None:
        source = self.make_source(tmp_path)
        subscriptions = source.subscriptions()
        assert all(s.subscription in subscriptions for s in source.discover_splits())

    def test_fingerprint_is_stable_for_the_same_source(self, tmp_path: Path) -> None:
        source = self.make_source(tmp_path)
        assert source.fingerprint() == source.fingerprint()
        assert source.fingerprint()

    def test_reader_survives_pickling_and_reads_the_same(self, tmp_path: Path) -> None:
        source = self.make_source(tmp_path)
        split = self._readable_split(source)
        end = source.available_end(split)
        reader = source.reader()
        shipped: Any = pickle.loads(pickle.dumps(reader))
        assert list(shipped.read_range(split, split.position, end)) == list(
            reader.read_range(split, split.position, end)
        )

    def test_replaying_a_planned_range_yields_the_same_records(self, tmp_path: Path) -> None:
        source = self.make_source(tmp_path)
        split = self._readable_split(source)
        end = source.plan_end(split, split.position, 2)
        first = list(source.reader().read_range(split, split.position, end))
        again = list(source.reader().read_range(split, split.position, end))
        assert first and first == again

    def test_planned_ranges_chain_into_contiguous_offsets(self, tmp_path: Path) -> None:
        source = self.make_source(tmp_path)
        split = self._readable_split(source)
        whole = list(source.reader().read_range(split, split.position, source.available_end(split)))
        ranges = read_planned(source, split, budget=1)
        chained = [r for rng in ranges for r in rng]
        assert chained == whole
        assert len(ranges) >= 2
        assert chained[0].offset == split.position
        for before, after in zip(chained, chained[1:], strict=False):
            assert before.next_offset == after.offset
        for rng, nxt in zip(ranges, ranges[1:], strict=False):
            if rng and nxt:
                assert rng[-1].next_offset == nxt[0].offset

    def test_an_empty_range_yields_nothing(self, tmp_path: Path) -> None:
        source = self.make_source(tmp_path)
        split = self._readable_split(source)
        assert list(source.reader().read_range(split, split.position, split.position)) == []

    def test_reading_several_ranges_at_once_equals_reading_each(self, tmp_path: Path) -> None:
        """``read_ranges_columns`` over every split (one range ending mid-split, one ending at the
        end, empty ones) returns, range by range, exactly the records ``read_range`` yields."""
        source = self.make_source(tmp_path)
        reader = source.reader()
        if not isinstance(reader, SupportsColumnarRead):
            return  # the region task reads such a reader range by range (read_range)
        readable = self._readable_split(source)
        ranges: list[tuple[Split, int, int]] = []
        for split in source.discover_splits():
            start, end = split.position, source.available_end(split)
            if split.split_id == readable.split_id:
                end = source.plan_end(split, start, 2)  # a range that ends before the split's end
            elif ranges and len(ranges) % 2 == 0:
                end = start  # an empty range among the others
            ranges.append((split, start, end))
        together = list(reader.read_ranges_columns(ranges))
        assert len(together) == len(ranges)
        for (split, start, end), columns in zip(ranges, together, strict=True):
            assert list(columns.records()) == list(reader.read_range(split, start, end)), split.split_id
        assert any(len(columns.offsets) for columns in together)
