"""``splitkeeper-tools bench balance [--json]``: weighted balancing against a hot partition.

Eight Kafka-like partitions, one carrying ten times the traffic of the others, read by
four readers. The epoch driver runs with the simulator's in-memory adapters (no Spark, no
broker, a simulated clock), so the figures are the driver's own decisions: the weighted
strategy measures each partition's arrival rate over the epochs and rebalances when the
imbalance passes ``rebalance_threshold``. For each setup it reports the readers' loads
(records/s per unit of capacity) and ``max_weighted_load / min_weighted_load`` after the
run, for ``weighted`` and ``least-loaded``:

- equal readers: no assignment can do better than the hot partition alone on one reader
  (``lower_bound`` says how far below that the best split of the rest gets);
- one reader with five times the capacity (``weighted.capacities: {0: 5}``), where the hot
  partition belongs.

A second part discovers nine light splits and one heavy one in every order over two
readers and reports the worst ratio the weighted strategy ends at (the order of discovery
must not matter).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Mapping
from typing import Any

from splitkeeper.core.backlog import BacklogConfig
from splitkeeper.core.checkpoint import CheckpointConfig
from splitkeeper.core.defaults import REBALANCE_THRESHOLD
from splitkeeper.core.driver import DriverSettings, EpochDriver
from splitkeeper.core.enumerator import RecordingEnumeratorContext, enumerator_for, restart_reader
from splitkeeper.core.source import ReassignableStaticSplitSource
from splitkeeper.core.types import RecoveryDecision, Split
from splitkeeper.errors import InvalidParameterError
from splitkeeper.sim.simulator import ReassignableSimSource, SimClock, SimEpochSink, SimRegionRunner, SimState
from splitkeeper.sim.sink import SimulatedSink

PARTITIONS = 8
HOT_FACTOR = 10
PARALLELISM = 4
EPOCH_S = 10.0


def _loads(
    owners: Mapping[int, list[str]], rates: Mapping[str, float], capacities: Mapping[int, float]
) -> dict[int, float]:
    return {r: sum(rates[s] for s in ids) / capacities.get(r, 1.0) for r, ids in owners.items()}


def _ratio(loads: Mapping[int, float]) -> float:
    low = min(loads.values())
    return float("inf") if low == 0 else max(loads.values()) / low


def hot_partition_run(
    strategy: str,
    capacities: Mapping[int, float] | None = None,
    *,
    epochs: int = 12,
    threshold: float = REBALANCE_THRESHOLD,
) -> dict[str, Any]:
    """One run of the driver over the hot-partition source; the readers' loads at the end."""
    rates = {f"events-{p}": float(HOT_FACTOR if p == 3 else 1) for p in range(PARTITIONS)}
    source = ReassignableSimSource(subscriptions={"events"})
    source.add([Split(sid, "events", 0) for sid in rates])
    source.ends.update(dict.fromkeys(rates, 0))
    runner = SimRegionRunner()
    clock = SimClock()
    state = SimState()
    options: dict[str, Any] = {"capacities": dict(capacities or {})} if strategy == "weighted" else {}
    driver = EpochDriver(
        DriverSettings(
            pipeline="balance",
            parallelism=PARALLELISM,
            checkpoint=CheckpointConfig(),
            backlog=BacklogConfig(backlog_epoch_records=10_000, normal_epoch_records=10_000),
            strategy=strategy,
            strategy_options=options,
            rebalance_threshold=threshold,
        ),
        source,
        runner,
        SimEpochSink(SimulatedSink(), runner),
        state,
        clock,
    )
    driver.open()
    for _ in range(epochs):
        clock.sleep(EPOCH_S)
        for sid, rate in rates.items():
            source.ends[sid] += int(rate * EPOCH_S * 10)  # ten records per second per unit of rate
        report = driver.run_epoch()
    enumerator = driver.enumerator
    assert enumerator is not None
    moves = sum(1 for a in enumerator.audit if a.decision is RecoveryDecision.REBALANCED)
    owners = {r: enumerator.owned_split_ids(r) for r in range(PARALLELISM)}
    loads = _loads(owners, rates, capacities or {})
    return {
        "strategy": strategy,
        "capacities": {str(k): v for k, v in (capacities or {}).items()},
        "loads": {str(r): round(v, 3) for r, v in sorted(loads.items())},
        "owners": {str(r): sorted(v) for r, v in sorted(owners.items())},
        "max_weighted_load_over_min": round(_ratio(loads), 3),
        "rebalanced_splits": moves,
        "last_checkpoint": report.kind.value,
        # what the last checkpoint recorded for the restart checks (weighted only)
        "recorded_weights": {
            sid: round(w, 3) for d in state.decisions.values() for sid, w in d.split_weights
        },
    }


def best_possible(capacities: Mapping[int, float]) -> float:
    """The lowest max/min load ratio any assignment of the eight partitions to four readers reaches."""
    rates = [float(HOT_FACTOR if p == 3 else 1) for p in range(PARTITIONS)]
    best = float("inf")
    for owners in itertools.product(range(PARALLELISM), repeat=PARTITIONS):
        loads = [0.0] * PARALLELISM
        for p, r in enumerate(owners):
            loads[r] += rates[p]
        best = min(best, _ratio({r: v / capacities.get(r, 1.0) for r, v in enumerate(loads)}))
    return round(best, 3)


def discovery_orders(light: int = 9, heavy_weight: float = 10.0, readers: int = 2) -> dict[str, Any]:
    """Nine weight-1 splits and one weight-10 split discovered in every position over two readers."""
    ratios = []
    for position in range(light + 1):
        ids = [f"light-{i}" for i in range(light)]
        ids.insert(position, "heavy")
        weights = {s: (heavy_weight if s == "heavy" else 1.0) for s in ids}
        source = ReassignableStaticSplitSource("orders", (), subscriptions={"s"})
        context = RecordingEnumeratorContext(readers)
        enumerator = enumerator_for(source, context, "weighted", weights=weights)
        enumerator.start()
        for r in range(readers):
            restart_reader(enumerator, context, r, ())
        for sid in ids:  # one discovery per split, in this order
            enumerator.add_splits([Split(sid, "s", 0)])
        owners = {r: enumerator.owned_split_ids(r) for r in range(readers)}
        ratios.append(_ratio(_loads(owners, weights, {})))
    return {"orders": len(ratios), "worst_ratio": round(max(ratios), 3), "best_ratio": round(min(ratios), 3)}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epochs", type=int, default=12, help="epochs per run (default 12)")
    parser.add_argument(
        "--threshold", type=float, default=REBALANCE_THRESHOLD, help="weighted.rebalance_threshold"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    if args.epochs < 2:
        raise InvalidParameterError("--epochs", args.epochs, "an integer >= 2 (rates need two observations)")
    hot_capacity = {0: 5.0}
    result: dict[str, Any] = {
        "setup": f"{PARTITIONS} partitions, partition 3 at {HOT_FACTOR}x the traffic, P={PARALLELISM}",
        "equal_readers": {
            "weighted": hot_partition_run("weighted", epochs=args.epochs, threshold=args.threshold),
            "least-loaded": hot_partition_run("least-loaded", epochs=args.epochs),
            "best_possible": best_possible({}),
        },
        "one_reader_with_5x_capacity": {
            "weighted": hot_partition_run(
                "weighted", hot_capacity, epochs=args.epochs, threshold=args.threshold
            ),
            "least-loaded": hot_partition_run("least-loaded", hot_capacity, epochs=args.epochs),
            "best_possible": best_possible(hot_capacity),
        },
        "discovery_order": discovery_orders(),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    out = sys.stdout
    print(result["setup"], file=out)
    for setup in ("equal_readers", "one_reader_with_5x_capacity"):
        for strategy in ("weighted", "least-loaded"):
            r = result[setup][strategy]
            print(
                f"  {setup:<28} {strategy:<13} max/min load {r['max_weighted_load_over_min']:>6}  "
                f"loads {r['loads']}",
                file=out,
            )
    for setup in ("equal_readers", "one_reader_with_5x_capacity"):
        print(
            f"  {setup}: the best of every possible assignment is {result[setup]['best_possible']}", file=out
        )
    d = result["discovery_order"]
    print(
        f"  discovery order ({d['orders']} orders, 9 light + 1 heavy, 2 readers): worst {d['worst_ratio']}",
        file=out,
    )
    return 0
