"""Assignment strategies: the legacy hash skew (FLINK-31762), balanced placement, sticky rebalance."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitkeeper.core.assignment import (
    STRATEGIES,
    LeastLoadedStrategy,
    LegacyHashStrategy,
    RoundRobinStrategy,
    WeightedStrategy,
    count_rebalance_moves,
    java_string_hash,
    legacy_hash_owner,
    strategy_by_name,
    topic_partition,
    water_fill,
)
from splitkeeper.core.invariants import check_balance, count_spread
from splitkeeper.core.types import Assignment, Split
from splitkeeper.errors import InvalidParameterError


def kafka_splits(topics: list[str], partitions: int) -> list[Split]:
    return [Split(f"{t}-{p}", t) for t in topics for p in range(partitions)]


def empty_readers(parallelism: int) -> dict[int, dict[str, None]]:
    return {r: {} for r in range(parallelism)}


def counts(placement_by_reader: dict[int, list[Split]], parallelism: int) -> list[int]:
    return [len(placement_by_reader.get(r, [])) for r in range(parallelism)]


def test_java_string_hash_matches_java():
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("") == 0
    assert java_string_hash("polygenelubricants") == -(2**31)  # wraps to Integer.MIN_VALUE
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00  # UTF-16 surrogate pair


def test_two_topics_of_four_partitions_at_parallelism_8_legacy_hash_skews_balanced_ones_do_not():
    splits = kafka_splits(["orders", "payments"], 4)
    legacy = LegacyHashStrategy().place(splits, empty_readers(8), 8)
    legacy_counts = counts(legacy.by_reader, 8)
    assert legacy_counts == [0, 0, 0, 2, 2, 2, 2, 0]  # FLINK-31762: both topics start at reader 3
    assert max(legacy_counts) > 1
    for name in ("round-robin", "least-loaded", "weighted"):
        placement = strategy_by_name(name).place(splits, empty_readers(8), 8)
        assert counts(placement.by_reader, 8) == [1] * 8, name


def test_legacy_hash_owner_formula_and_waiting_for_an_absent_owner():
    start = ((java_string_hash("orders") * 31) & 0x7FFFFFFF) % 8
    assert [legacy_hash_owner("orders", p, 8) for p in range(3)] == [start, (start + 1) % 8, (start + 2) % 8]
    readers: dict[int, dict[str, None]] = {r: {} for r in (0, 1, 2)}  # owner 3 absent: its split waits
    placement = LegacyHashStrategy().place([Split("orders-0", "orders")], readers, 8)
    assert placement.by_reader == {} and [x.split_id for x in placement.unplaced] == ["orders-0"]


def test_topic_partition_parses_kafka_style_ids():
    assert topic_partition(Split("orders-12", "orders")) == ("orders", 12)
    assert topic_partition(Split("my-topic-3")) == ("my-topic", 3)
    assert topic_partition(Split("file.csv", "files")) == ("files", 0)
    # a partition of a re-created topic (issue 36): the id's suffix names the topic's id, not the partition
    assert topic_partition(Split("my-topic-3#v0123456789ab", "my-topic")) == ("my-topic", 3)


def test_round_robin_deals_sorted_ids_from_the_least_loaded_reader():
    owned = {0: {"x-1": None, "x-2": None}, 1: {}, 2: {"x-3": None}}
    splits = [Split(f"s-{n}") for n in (5, 1, 4, 2, 3)]
    placement = RoundRobinStrategy().place(splits, owned, 3)
    got = {r: [x.split_id for x in v] for r, v in placement.by_reader.items()}
    # water-filling gives reader 1 (load 0) three and reader 2 (load 1) two; dealt round-robin, reader 1 first
    assert got == {1: ["s-1", "s-3", "s-5"], 2: ["s-2", "s-4"]}
    final = {r: len(owned[r]) + len(got.get(r, [])) for r in owned}
    assert final == {0: 2, 1: 3, 2: 3}


def test_round_robin_on_equal_loads_is_plain_round_robin():
    splits = [Split(f"s-{n:02d}") for n in range(7)]
    placement = RoundRobinStrategy().place(splits, empty_readers(3), 3)
    got = {r: [x.split_id for x in v] for r, v in placement.by_reader.items()}
    assert got == {0: ["s-00", "s-03", "s-06"], 1: ["s-01", "s-04"], 2: ["s-02", "s-05"]}


def test_least_loaded_takes_splits_in_given_order_ties_to_the_lower_id():
    owned = {0: {"a": None}, 1: {}, 2: {}}
    placement = LeastLoadedStrategy().place([Split("z"), Split("y"), Split("x")], owned, 3)
    # z -> 1 (load 0), y -> 2 (load 0, higher id), then all have 1: x -> 0 (lowest id)
    assert {r: [x.split_id for x in v] for r, v in placement.by_reader.items()} == {
        1: ["z"],
        2: ["y"],
        0: ["x"],
    }


def test_water_fill_raises_the_lowest_readers_first():
    assert water_fill([(0, 0), (1, 3), (2, 5)], 4) == [(0, 4)]
    assert water_fill([(0, 0), (1, 3), (2, 5)], 6) == [(0, 5), (1, 1)]  # ends 5, 4, 5
    assert water_fill([(0, 1), (1, 1)], 3) == [(0, 2), (1, 1)]
    assert water_fill([(0, 1)], 0) == []


@settings(max_examples=200, deadline=None)
@given(loads=st.lists(st.integers(0, 20), min_size=1, max_size=12), k=st.integers(0, 60))
def test_water_fill_ends_within_one_among_receivers_and_never_above_the_others(loads: list[int], k: int):
    ordered = sorted(enumerate(loads), key=lambda rl: (rl[1], rl[0]))
    gives = dict(water_fill(ordered, k))
    assert sum(gives.values()) == k
    final = {r: load + gives.get(r, 0) for r, load in enumerate(loads)}
    receivers = [final[r] for r in gives]
    if receivers:
        assert max(receivers) - min(receivers) <= 1
        assert all(final[r] >= max(receivers) - 1 for r in final if r not in gives)
    sequence = [g for _, g in water_fill(ordered, k)]
    assert sequence == sorted(sequence, reverse=True)


@settings(max_examples=200, deadline=None)
@given(
    loads=st.lists(st.integers(0, 15), min_size=1, max_size=10),
    new=st.integers(0, 40),
    name=st.sampled_from(["round-robin", "least-loaded"]),
)
def test_count_balanced_place_then_rebalance_ends_within_one_with_fewest_moves(loads, new, name):
    owned = {r: {f"r{r}-{i}": None for i in range(n)} for r, n in enumerate(loads)}
    strategy = strategy_by_name(name)
    placement = strategy.place([Split(f"new-{i:03d}") for i in range(new)], owned, len(loads))
    for r, batch in placement.by_reader.items():
        owned[r].update(dict.fromkeys(x.split_id for x in batch))
    before = {r: len(v) for r, v in owned.items()}
    moves = count_rebalance_moves(owned)
    for m in moves:
        del owned[m.source][m.split_id]
        owned[m.target][m.split_id] = None
    after = {r: len(v) for r, v in owned.items()}
    assert count_spread(after) <= 1
    total, n = sum(before.values()), len(before)
    q, rem = divmod(total, n)
    # fewest moves: the excess above the best-possible targets (q+1 slots to the fullest readers)
    by_load = sorted(before, key=lambda r: (-before[r], r))
    target = {r: q + (1 if i < rem else 0) for i, r in enumerate(by_load)}
    assert len(moves) == sum(max(0, before[r] - target[r]) for r in before)
    assert not moves or count_spread(before) > 1  # balanced input: nothing moves (sticky)


def test_rebalance_moves_the_most_recently_assigned_splits_of_the_fullest_reader():
    owned = {0: {"old": None, "mid": None, "new": None}, 1: {}}
    moves = count_rebalance_moves(owned)
    assert [(m.split_id, m.source, m.target) for m in moves] == [("new", 0, 1)]


@settings(max_examples=150, deadline=None)
@given(
    weights=st.lists(st.floats(0.1, 10.0, allow_nan=False), min_size=1, max_size=30),
    capacities=st.lists(st.floats(0.5, 4.0, allow_nan=False), min_size=1, max_size=6),
    preload=st.integers(0, 10),
)
def test_weighted_place_and_rebalance_keep_each_reader_within_one_split_weight_of_fair(
    weights: list[float], capacities: list[float], preload: int
):
    ids = [f"s{i:02d}" for i in range(len(weights))]
    weight_of = dict(zip(ids, weights, strict=True))
    caps = dict(enumerate(capacities))
    strategy = WeightedStrategy(weights=weight_of, capacities=caps)
    owned: dict[int, dict[str, None]] = {r: {} for r in caps}
    owned[0].update(dict.fromkeys(ids[:preload]))  # a skewed start: reader 0 already owns some
    placement = strategy.place([Split(i) for i in ids[preload:]], owned, len(caps))
    for r, batch in placement.by_reader.items():
        owned[r].update(dict.fromkeys(x.split_id for x in batch))
    for m in strategy.rebalance(owned, len(caps)):
        del owned[m.source][m.split_id]
        owned[m.target][m.split_id] = None
    state = Assignment(readers={r: tuple(Split(i) for i in v) for r, v in owned.items()})
    assert check_balance(state, weights=weight_of, capacities=caps) == []
    assert sorted(i for v in owned.values() for i in v) == ids


def test_unknown_strategy_and_bad_options_and_parallelism_are_rejected():
    with pytest.raises(
        InvalidParameterError, match=r"strategy='hash' is not allowed: one of least-loaded, legacy-hash"
    ):
        strategy_by_name("hash")
    with pytest.raises(InvalidParameterError, match=r"strategy options=\['speed'\]"):
        strategy_by_name("round-robin", speed=3)
    with pytest.raises(InvalidParameterError, match=r"weights\['a'\]=0 is not allowed: a weight > 0"):
        WeightedStrategy(weights={"a": 0})
    with pytest.raises(InvalidParameterError, match=r"capacities\[1\]=-2 is not allowed"):
        WeightedStrategy(capacities={1: -2})
    for name in STRATEGIES:
        with pytest.raises(InvalidParameterError, match=r"parallelism=0 is not allowed: an integer >= 1"):
            strategy_by_name(name).place([], {}, 0)


def test_registry_lists_the_four_strategies_and_which_are_balanced():
    assert {name: factory().balanced for name, factory in STRATEGIES.items()} == {
        "legacy-hash": False,
        "round-robin": True,
        "least-loaded": True,
        "weighted": True,
    }
    # the hash strategy never balances: the same topic at the same P always lands the same way
    skew = Counter(legacy_hash_owner(t, p, 8) for t in ("orders", "payments") for p in range(4))
    assert max(skew.values()) == 2
