"""Weighted balancing through the driver: measured throughput, reader capacities, order independence."""

from __future__ import annotations

import itertools

from splitkeeper.core.assignment import ThroughputMeter, WeightedStrategy
from splitkeeper.core.invariants import check_balance
from splitkeeper.core.types import Assignment, Split
from splitkeeper_tools.bench.balance import best_possible, discovery_orders, hot_partition_run


def test_a_hot_partition_lands_where_the_capacity_is_and_weighted_beats_least_loaded() -> None:
    hot = {0: 5.0}
    weighted = hot_partition_run("weighted", hot)
    least = hot_partition_run("least-loaded", hot)
    assert "events-3" in weighted["owners"]["0"]  # the hot partition moved to the 5x reader
    assert weighted["max_weighted_load_over_min"] <= 1.25  # the goal, reachable with capacity
    assert weighted["max_weighted_load_over_min"] == best_possible(hot)
    assert least["max_weighted_load_over_min"] > 5 * weighted["max_weighted_load_over_min"]
    assert weighted["rebalanced_splits"] >= 1 and weighted["last_checkpoint"] == "global"
    # the checkpoint records the measured weights, so the restart checks weigh loads as the driver did
    recorded = weighted["recorded_weights"]
    assert set(recorded) == {f"events-{p}" for p in range(8)}
    assert recorded["events-3"] == 10 * recorded["events-0"] > 0
    owned = Assignment(
        {int(r): tuple(Split(sid, "events", 0) for sid in ids) for r, ids in weighted["owners"].items()}
    )
    assert check_balance(owned, weights=recorded, capacities=hot) == []
    assert check_balance(owned, weights={}, capacities=hot) != []  # unit weights: out of bounds
    assert least["recorded_weights"] == {}  # other strategies record none


def test_with_equal_readers_weighted_reaches_the_best_assignment_there_is() -> None:
    weighted = hot_partition_run("weighted")
    least = hot_partition_run("least-loaded")
    assert weighted["max_weighted_load_over_min"] == best_possible({}) == 5.0  # hot partition alone on one
    assert least["max_weighted_load_over_min"] == 5.5


def test_the_order_splits_are_discovered_in_does_not_matter() -> None:
    orders = discovery_orders()
    assert orders["orders"] == 10 and orders["worst_ratio"] <= 10 / 9 + 1e-3  # 10 : 9, never 14 : 5


def test_rebalance_ends_within_one_split_of_fair_from_any_start() -> None:
    weights = {f"s{i}": w for i, w in enumerate([10.0, 1, 1, 1, 1, 1, 1, 1, 1, 1])}
    strategy = WeightedStrategy(weights=weights)
    for cut in range(len(weights) + 1):
        ids = list(weights)
        owned = {0: dict.fromkeys(ids[:cut]), 1: dict.fromkeys(ids[cut:])}
        for move in strategy.rebalance(owned, 2):
            del owned[move.source][move.split_id]
            owned[move.target][move.split_id] = None
        loads = sorted(sum(weights[s] for s in v) for v in owned.values())
        assert loads == [9.0, 10.0], (cut, loads)


def test_the_meter_measures_the_arrival_rate_of_each_split() -> None:
    meter = ThroughputMeter(smoothing=0.5)
    for second, (a, b) in enumerate(
        itertools.accumulate([(0, 0)] + [(10, 100)] * 4, lambda x, y: (x[0] + y[0], x[1] + y[1]))
    ):
        meter.observe("a", float(second), a)
        meter.observe("b", float(second), b)
    assert meter.rates() == {"a": 10.0, "b": 100.0}
    meter.forget(["b"])
    assert set(meter.rates()) == {"b"}
